"""Routing capture on tiny random-weight models of every supported architecture."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from moesd.routing.capture import RoutingRecorder, capture_generate, moe_layers  # noqa: E402

COMMON = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
              eos_token_id=None, pad_token_id=0)
MLA = dict(num_key_value_heads=4, moe_intermediate_size=16, n_shared_experts=1, first_k_dense_replace=1,
           kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8)
ARCHITECTURES = {
    "mixtral": dict(num_local_experts=8, num_experts_per_tok=2),
    "qwen2_moe": dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
                      shared_expert_intermediate_size=24, mlp_only_layers=[0]),
    "qwen3_moe": dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16, head_dim=8),
    "deepseek_v2": dict(MLA, n_routed_experts=8, num_experts_per_tok=2, q_lora_rank=None,
                        n_group=1, topk_group=1, topk_method="greedy"),
    "deepseek_v3": dict(MLA, n_routed_experts=8, num_experts_per_tok=2, q_lora_rank=16,
                        n_group=4, topk_group=2),
    "olmoe": dict(num_experts=8, num_experts_per_tok=2),
}
DENSE_FIRST_LAYER = {"qwen2_moe", "deepseek_v2", "deepseek_v3"}


def tiny_model(model_type):
    config = transformers.AutoConfig.for_model(model_type, **{**COMMON, **ARCHITECTURES[model_type]})
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    if model_type == "deepseek_v3":  # a non-zero bias makes grouped routing differ from top-K
        for router in moe_layers(model).values():
            router.e_score_correction_bias.copy_(torch.randn_like(router.e_score_correction_bias))
    return model


def left_padded(lengths, seed=0):
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.randint(1, COMMON["vocab_size"], (len(lengths), width), generator=generator)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, length in enumerate(lengths):
        mask[row, width - length:] = 1
    return ids.masked_fill(mask == 0, COMMON["pad_token_id"]), mask


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_captured_ids_are_what_the_experts_receive(model_type):
    model = tiny_model(model_type)
    received = {}
    handles = [layer.mlp.experts.register_forward_pre_hook(
        lambda module, args, index=index: received.setdefault(index, []).append(args[1].clone()))
        for index, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "gate")]
    ids, mask = left_padded([5, 3, 7])
    with RoutingRecorder(model) as recorder, torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    for handle in handles:
        handle.remove()
    assert len(recorder.calls) == 1
    expected_layers = [1, 2] if model_type in DENSE_FIRST_LAYER else [0, 1, 2]
    assert sorted(recorder.calls[0]) == sorted(received) == expected_layers
    for index in expected_layers:
        assert torch.equal(recorder.calls[0][index], received[index][0].to(torch.int64))


def test_deepseek_v3_routing_is_not_topk_of_logits():
    model = tiny_model("deepseek_v3")
    logits = {}
    router = moe_layers(model)[1]
    def keep_logits(module, args, output):  # returns None: the output is left unchanged
        logits["x"] = output[0]

    handle = router.register_forward_hook(keep_logits)
    ids, mask = left_padded([9, 9])
    with RoutingRecorder(model) as recorder, torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    handle.remove()
    naive = torch.topk(logits["x"], 2, dim=-1).indices.sort(dim=-1).values
    captured = recorder.calls[0][1].sort(dim=-1).values
    assert not torch.equal(naive, captured)


@pytest.mark.parametrize("model_type", ["mixtral", "deepseek_v2"])
def test_generate_trace_skips_padding_and_keys_real_layers(model_type):
    model = tiny_model(model_type)
    lengths, new = [4, 6, 2], 5
    ids, mask = left_padded(lengths, seed=1)
    trace, sequences = capture_generate(model, ids, mask, max_new_tokens=new, sequence_ids=[10, 11, 12],
                                        meta={"model_id": "tiny"})
    assert trace.num_experts == 8 and trace.top_k == 2 and trace.meta["model_id"] == "tiny"
    assert trace.layers.tolist() == ([1, 2] if model_type in DENSE_FIRST_LAYER else [0, 1, 2])
    prefill = trace.phase == "prefill"
    assert prefill.sum() == sum(lengths)
    assert (trace.phase[~prefill] == "decode").sum() == len(lengths) * (new - 1)
    for sequence, length in zip([10, 11, 12], lengths):
        positions = np.sort(trace.position[trace.sequence == sequence])
        assert positions.tolist() == list(range(length + new - 1))
    assert sequences.shape == (3, ids.shape[1] + new)


def test_finished_sequences_are_dropped():
    model = tiny_model("olmoe")
    ids, mask = left_padded([3, 3], seed=2)
    with torch.no_grad():
        first = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=1, do_sample=False)
    model.generation_config.eos_token_id = int(first[0, -1])  # row 0 stops after one token
    trace, sequences = capture_generate(model, ids, mask, max_new_tokens=4)
    assert int(sequences[0, 3]) == model.generation_config.eos_token_id
    decode = trace.phase == "decode"
    assert set(trace.sequence[decode].tolist()) <= {1}


def test_unsupported_model_is_refused():
    config = transformers.AutoConfig.for_model("llama", **COMMON)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with pytest.raises(ValueError, match="routing capture supports .* this model is 'llama'"):
        RoutingRecorder(model)


PROMPTS = Path(__file__).parent / "data" / "prompts"


def test_cli_traces_a_local_model(tmp_path):
    """`moesd trace` on a saved tiny model with a character-level tokenizer and the committed prompts."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    from moesd.cli import main
    from moesd.routing.traces import RoutingTrace

    characters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,?$%'-+*/=()"
    vocab = {"<pad>": 0, "<unk>": 1, **{c: i + 2 for i, c in enumerate(characters)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>",
                                                unk_token="<unk>")
    folder = tmp_path / "tiny-qwen2-moe"
    tiny_model("qwen2_moe").save_pretrained(folder)
    fast.save_pretrained(folder)
    out = tmp_path / "traces" / "tiny.npz"
    arguments = ["trace", "--model", str(folder), "--prompts", "gsm8k", "--prompt-source", str(PROMPTS / "gsm8k"),
                 "--num-prompts", "3", "--batch-size", "2", "--max-new-tokens", "3", "--device", "cpu",
                 "--out", str(out)]
    assert main(arguments) == 0
    trace = RoutingTrace.load(out)
    assert sorted(set(trace.sequence.tolist())) == [0, 1, 2]
    assert trace.meta["dataset"] == "gsm8k" and trace.meta["prompt_ids"] == ["gsm8k/0", "gsm8k/1", "gsm8k/2"]
    assert (trace.phase == "decode").sum() == 3 * 2 and trace.layers.tolist() == [1, 2]
    with pytest.raises(SystemExit):
        main(arguments)  # refuses to overwrite


@pytest.mark.parametrize("change, message", [
    (["--num-prompts", "0"], "--num-prompts must be >= 1, got 0"),
    (["--num-prompts", "-1"], "--num-prompts must be >= 1, got -1"),
    (["--batch-size", "0"], "--batch-size must be >= 1, got 0"),
    (["--dtype", "bogus"], "argument --dtype: invalid choice: 'bogus'"),
    (["--device", "nonsense"], "--device 'nonsense' is not a torch device"),
    (["--random-weights", "--device", "cpu"], "--dtype and --device apply only without --random-weights"),
])
def test_cli_refuses_bad_trace_arguments_before_any_work(tmp_path, capsys, change, message):
    """The model folder does not exist: an error about the argument shows nothing was loaded first."""
    from moesd.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["trace", "--model", str(tmp_path / "no-model"), "--prompts", "gsm8k", "--prompt-source",
              str(PROMPTS / "gsm8k"), "--out", str(tmp_path / "x.npz"), *change])
    assert exit_.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert message in error
    assert not (tmp_path / "x.npz").exists()


def test_trace_prompts_refuses_an_unknown_dtype(tmp_path):
    from moesd.routing.capture import trace_prompts

    with pytest.raises(ValueError, match="dtype must be 'auto' or a torch dtype name"):
        trace_prompts(str(tmp_path / "no-model"), None, 1, 1, dtype="bogus")


def test_random_model_trace_labels_its_weights():
    import pandas as pd

    from moesd.routing.capture import trace_random_model

    prompts = pd.DataFrame({"id": ["a", "b", "c"], "prompt": ["def f(x):", "Hi", "é 1+1"]})
    trace = trace_random_model("olmoe-1b-7b", prompts, batch_size=2, max_new_tokens=3, num_layers=2,
                               width=1 / 32, dataset="toy")
    prompt_bytes = [len(p.encode("utf-8")) for p in prompts["prompt"]]
    assert (trace.phase == "prefill").sum() == sum(prompt_bytes)
    assert (trace.phase == "decode").sum() == 3 * 2  # the first generated token comes from prefill
    assert trace.num_experts == 64 and trace.top_k == 8 and trace.layers.tolist() == [0, 1]
    assert trace.meta["weights"].startswith("random (seed 0) with the shape of allenai/OLMoE-1B-7B-0924")
    assert trace.meta["tokenizer"] == "UTF-8 bytes" and trace.meta["prompt_ids"] == ["a", "b", "c"]
    for sequence, length in enumerate(prompt_bytes):
        positions = trace.position[trace.sequence == sequence]
        assert sorted(positions.tolist()) == list(range(length + 2))


def test_one_new_token_traces_only_the_prefill():
    """max_new_tokens = 1: generate runs the prefill alone (its logits give the one new token)."""
    import pandas as pd

    from moesd.routing.capture import trace_random_model

    prompts = pd.DataFrame({"id": ["a", "b"], "prompt": ["Hi", "def f"]})
    trace = trace_random_model("olmoe-1b-7b", prompts, batch_size=2, max_new_tokens=1, num_layers=1, width=1 / 32)
    assert (trace.phase == "prefill").sum() == 2 + 5 and (trace.phase == "decode").sum() == 0


def test_cli_random_weights_needs_a_known_architecture(tmp_path, capsys):
    from moesd.cli import main

    with pytest.raises(SystemExit):
        main(["trace", "--model", "not-a-model", "--random-weights", "--prompts", "gsm8k",
              "--prompt-source", str(tmp_path), "--out", str(tmp_path / "x.npz")])
    assert "unknown model 'not-a-model'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["trace", "--model", "x", "--width", "0.5", "--prompts", "gsm8k", "--out", str(tmp_path / "x.npz")])
    assert "only with --random-weights" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_trace_through_vllm_without_vllm_says_how_to_get_it(tmp_path, capsys):
    from moesd.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["trace", "--engine", "vllm", "--model", "qwen3-30b-a3b", "--random-weights", "--prompts", "gsm8k",
              "--prompt-source", str(PROMPTS / "gsm8k"), "--out", str(tmp_path / "x.npz")])
    assert stop.value.code == 2 and "`make vllm` builds .venv-vllm" in capsys.readouterr().err
    assert not (tmp_path / "x.npz").exists()
