"""The vLLM engine (moesd.measure.vllm_engine): counters against emitted tokens, 100 % acceptance with the target as its
own draft, greedy acceptance equal to the Hugging Face engine's on the same models and prompts, and a tiny sweep
that writes a valid result file with the Hugging Face engine's columns.

Tests that run vLLM carry the `vllm` mark: `make vllm` builds .venv-vllm and `make test-vllm` runs this whole file
there; `make test` (the project's venv, no vLLM) runs the checks that need no vLLM and deselects the marked ones.
Run by hand without vLLM, a marked test is skipped and says why.
"""

import gc
import importlib.util
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from moesd.measure import studies as measurements  # noqa: E402
from moesd.measure.bench import run_sweep, time_speculative  # noqa: E402
from moesd.measure.protocol import random_ids  # noqa: E402
from moesd.measure.sweeps import SweepConfig  # noqa: E402
from moesd.engine.sd import SpeculativeDecoder  # noqa: E402
from moesd.theory.speedup import sigma as eq5  # noqa: E402
from moesd.engine.vllm import save_model  # noqa: E402
from moesd.measure.vllm_engine import UNMEASURED_COLUMNS, check_config, synthetic_acceptance_rates, tiny_models  # noqa: E402

def needs_vllm(test):
    """Mark a test that runs vLLM (deselected by make test) and skip it, saying why, where vLLM is missing."""
    skip = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                              reason="vllm is not installed here: `make vllm` builds .venv-vllm with it and "
                                     "`make test-vllm` runs these tests there")
    return pytest.mark.vllm(skip(test))

ROUNDS, WARMUP = 8, 1
PROMPTS = Path(__file__).parent / "data" / "prompts"


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.947, 1.0])
@pytest.mark.parametrize("gamma", [1, 2, 4, 7])
def test_synthetic_rates_give_eq5_sigma(alpha, gamma):
    """The mean accepted prefix is the sum of vLLM's per-position rates; with it sigma is Eq. 5's."""
    rates = synthetic_acceptance_rates(alpha, gamma)
    assert len(rates) == gamma and all(a >= b for a, b in zip(rates, rates[1:]))
    assert (1 + sum(rates)) / (gamma + 1) == pytest.approx(float(eq5(alpha, gamma)))


@pytest.mark.parametrize("alpha, gamma", [(-0.1, 2), (1.5, 2), (0.5, 0), (0.5, 2.5)])
def test_synthetic_rates_refuse_bad_input(alpha, gamma):
    with pytest.raises(ValueError):
        synthetic_acceptance_rates(alpha, gamma)


def test_synthetic_acceptance_on_cpu_is_refused_before_any_work(tmp_path):
    config = SweepConfig(study="e2e", target="qwen3-30b-a3b", draft="qwen3-0.6b", layers=1, draft_layers=1,
                         width=1 / 16, batch_sizes=(1,), gammas=(2,), sigma={2: 0.9}, routing="model")
    with pytest.raises(ValueError, match="not available with vLLM on a CPU"):
        check_config(config)
    with pytest.raises(ValueError, match="the vLLM engine routes with the model's own router, not 'uniform'"):
        check_config(SweepConfig(**{**config.settings(), "sigma": {2: 0.9}, "routing": "uniform",
                                    "batch_sizes": (1,), "gammas": (2,)}))
    for study in ("forward", "settings"):
        with pytest.raises(ValueError, match="not " + study):
            check_config(SweepConfig(study=study, target="qwen3-30b-a3b", draft="qwen3-0.6b", gammas=(4,)))


def test_tiny_draft_agrees_with_target_on_some_tokens():
    """The tiny pair has real acceptance strictly between none and all (the HF engine, greedy)."""
    target, draft = tiny_models()
    ids = random_ids(4, 16, target.config.vocab_size, 0, "cpu")
    window = time_speculative(SpeculativeDecoder(target, draft, 2), ids, ROUNDS, WARMUP)
    assert 0 < window.accepted < window.drafted


def _recorded(passes, layers=(0,), num_experts=4):
    """A VllmRoutingRecorder holding hand-made passes: (requests, rows, start, input ids, experts of layer 0)."""
    from moesd.routing.vllm_capture import VllmRoutingRecorder, _Pass

    recorder = VllmRoutingRecorder(llm=None)
    recorder.layers, recorder.num_experts = list(layers), num_experts
    for requests, rows, start, ids, experts in passes:
        recorder.passes.append(_Pass(requests, np.array(rows), np.array(start), np.array(ids),
                                     {layer: np.array(experts) for layer in layers}))
    return recorder


def test_rows_are_labelled_by_the_final_sequences():
    """Prompt [5, 6], output [7, 8, 9]: a prefill pass; a verification feeding 7 (the last emitted token), 8 (an
    accepted draft), 4 (a rejected draft) and 1 (a draft after it); then a pass feeding 9, the token that replaced
    the rejected draft at position 4. Request ids carry the suffix vLLM appends inside the engine."""
    experts = [[0, 1]] * 2
    recorder = _recorded([(["r-a1"], [2], [0], [5, 6], experts),
                          (["r-a1"], [4], [2], [7, 8, 4, 1], [[0, 1], [1, 2], [2, 3], [3, 0]]),
                          (["r-a1"], [1], [4], [9], [[0, 2]])])
    trace = recorder.trace({"r": [5, 6, 7, 8, 9]}, {"r": 2})
    assert trace.phase.tolist() == ["prefill", "prefill", "decode", "decode", "rejected", "rejected", "decode"]
    assert trace.position.tolist() == [0, 1, 2, 3, 4, 5, 4] and trace.call.tolist() == [0, 0, 1, 1, 1, 1, 2]


def test_a_recomputed_request_stops_the_capture():
    """vLLM recomputes a preempted request from position 0: its rows would be counted twice."""
    experts = [[0, 1]] * 2
    recorder = _recorded([(["r"], [2], [0], [5, 6], experts), (["r"], [1], [2], [7], experts[:1]),
                          (["r"], [2], [0], [5, 6], experts)])
    with pytest.raises(RuntimeError, match="preempted"):
        recorder.trace({"r": [5, 6, 7, 8]}, {"r": 2})


def test_a_layer_that_routed_fewer_rows_than_fed_is_an_error():
    recorder = _recorded([(["r"], [3], [0], [5, 6, 7], [[0, 1]] * 2)])
    with pytest.raises(RuntimeError, match="routed fewer"):
        recorder.trace({"r": [5, 6, 7, 8]}, {"r": 3})


# ---- vLLM itself -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """The tiny target and draft saved with a word-level tokenizer, and the Hugging Face models."""
    root = tmp_path_factory.mktemp("tiny")
    target, draft = tiny_models()
    return {"target": str(save_model(target, root / "target")), "draft": str(save_model(draft, root / "draft")),
            "models": (target, draft)}


def _config(folders, **changes):
    settings = dict(study="e2e", target="qwen3-30b-a3b", draft="qwen3-0.6b", weights="pretrained",
                    target_path=folders["target"], draft_path=folders["draft"], sigma="real",
                    batch_sizes=(1, 4), gammas=(2,), context=16, rounds=ROUNDS, warmup_rounds=WARMUP, repeats=1,
                    warmup=1)
    return SweepConfig(**{**settings, **changes})


@pytest.fixture(scope="module")
def engines(folders):
    """vLLM engines of the tiny target, built on first use: ``"ar"``, ``"draft"`` (SD with the dense draft, gamma
    2), ``"same"`` (SD with the target as its own draft, gamma 3), and for routing capture (eager, in this
    process) ``"trace-ar"`` and ``"trace-draft"`` (SD with the dense draft, gamma 3). One at a time: vLLM keeps one set of
    metrics per process, so a new engine replaces the previous one's counters."""
    from moesd.routing.vllm_capture import make_tracing_llm
    from moesd.measure.vllm_engine import make_llm

    config, held = _config(folders), {}

    def engine(kind):
        if kind not in held:
            held.clear()
            gc.collect()
            draft, gamma = {"ar": (None, None), "draft": (folders["draft"], 2), "same": (folders["target"], 3),
                            "trace-ar": (None, None), "trace-draft": (folders["draft"], 3)}[kind]
            if kind.startswith("trace"):
                held[kind] = make_tracing_llm(folders["target"], draft=draft, gamma=gamma, dtype="float32")
            else:
                held[kind] = make_llm(folders["target"], config, draft=draft, gamma=gamma)
        return held[kind]

    yield engine
    held.clear()
    gc.collect()


def _prompts(folders, batch, seed=0):
    return random_ids(batch, 16, folders["models"][0].config.vocab_size, seed, "cpu")


@needs_vllm
def test_target_as_its_own_draft_accepts_everything(folders, engines):
    from moesd.measure.vllm_engine import time_window

    window = time_window(engines("same"), _prompts(folders, 3).tolist(), ROUNDS, WARMUP, 3)
    assert window.drafts == 3 * ROUNDS and window.draft_tokens == 3 * window.drafts
    assert window.accepted == window.draft_tokens and window.sigma == 1.0
    assert window.emitted == 3 * ROUNDS * 4


@needs_vllm
def test_counters_match_emitted_tokens_and_the_hf_engine(folders, engines):
    """Greedy acceptance is a property of the models and prompts: vLLM's counters over the window equal the
    accepted tokens of moesd's own engine (moesd.engine.sd) on the same models, prompts and rounds."""
    from moesd.measure.vllm_engine import time_window

    target, draft = folders["models"]
    for batch, seed in ((1, 0), (4, 1)):
        ids = _prompts(folders, batch, seed)
        window = time_window(engines("draft"), ids.tolist(), ROUNDS, WARMUP, 2)
        reference = time_speculative(SpeculativeDecoder(target, draft, 2), ids, ROUNDS, WARMUP)
        assert window.emitted == window.accepted + window.drafts  # counted twice, independently
        assert 0 < window.accepted < window.draft_tokens
        assert (window.drafts, window.accepted) == (reference.sequence_rounds, reference.accepted)


@needs_vllm
def test_ar_window_emits_one_token_per_request_and_step(folders, engines):
    from moesd.measure.vllm_engine import time_window

    window = time_window(engines("ar"), _prompts(folders, 4).tolist(), ROUNDS, WARMUP)
    assert window.emitted == 4 * ROUNDS and window.drafts == window.accepted == 0 and window.seconds > 0


@needs_vllm
def test_tiny_sweep_writes_a_valid_result_file_with_the_hf_columns(folders, tmp_path):
    from moesd.measure.vllm_engine import run_sweep as run_vllm_sweep

    config = _config(folders)
    path = run_vllm_sweep(config, tmp_path / "vllm", progress=False)
    hf = pd.read_csv(run_sweep(config, tmp_path / "hf", progress=False))
    rows, sidecar = measurements.load("e2e", "vllm", tmp_path)  # checks every row; warns on a violation
    assert list(rows.columns) == list(hf.columns) and len(rows) == len(hf) == 2
    assert sidecar["engine"] == "vllm" and sidecar["complete"] and sidecar["vllm"]
    assert rows[list(UNMEASURED_COLUMNS)].isna().all().all()
    assert (rows[["t_ar", "t_sd", "speedup"]] > 0).all().all()
    merged = rows.merge(hf, on=["batch_size", "gamma"], suffixes=("", "_hf"))
    np.testing.assert_allclose(merged["sigma"], merged["sigma_hf"])  # same models, prompts and rounds
    assert json.loads(path.with_suffix(".json").read_text())["settings"] == config.settings()
    with pytest.raises(FileExistsError):
        run_vllm_sweep(config, tmp_path / "vllm", progress=False)


# ---- Routing capture through vLLM ------------------------------------------------------------------

def _ragged_prompts(folders, lengths=(5, 7, 9, 6)):
    rng = np.random.default_rng(0)
    return [rng.integers(1, folders["models"][0].config.vocab_size - 1, size=n).tolist() for n in lengths]


def _hf_routing(target, prompts, new_tokens):
    """moesd.routing.capture's routing of greedy generate on the left-padded prompts: {(sequence, position): sorted ids}."""
    from moesd.routing.capture import capture_generate

    width = max(map(len, prompts))
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    trace, _ = capture_generate(target, ids, mask, new_tokens)
    return _by_token(trace)


def _by_token(trace):
    return {(int(s), int(p)): np.sort(e, axis=-1) for s, p, e in zip(trace.sequence, trace.position, trace.experts)}


@needs_vllm
def test_vllm_routing_equals_the_hf_capture(folders, engines):
    """The same model and prompts route every token, prompt and output, to the same experts in vLLM and in HF."""
    from moesd.routing.vllm_capture import capture_vllm

    prompts = _ragged_prompts(folders)
    trace = capture_vllm(engines("trace-ar"), prompts, 12, batch_size=3, ignore_eos=True, progress=False)
    vllm, hf = _by_token(trace), _hf_routing(folders["models"][0], prompts, 12)
    assert set(vllm) == set(hf) and len(vllm) == trace.num_tokens == sum(map(len, prompts)) + 4 * 11
    assert all(np.array_equal(vllm[key], hf[key]) for key in hf)
    assert trace.layers.tolist() == [0, 1] and trace.num_experts == 128 and trace.top_k == 8
    assert set(trace.phase) == {"prefill", "decode"} and (trace.phase == "prefill").sum() == sum(map(len, prompts))
    assert np.unique(trace.call).size == 2 * 12  # two batches (3 + 1 requests) of one prefill and 11 decode steps


@needs_vllm
def test_vllm_sd_routing_keeps_rejected_drafts_apart(folders, engines):
    """With a draft, the rows of the sequences' own tokens still equal the HF capture; the rows of rejected draft
    tokens are apart, bounded by vLLM's counters, and refused by sequence statistics until dropped."""
    from moesd.routing.traces import without_rejected
    from moesd.routing.unions import window_union
    from moesd.routing.vllm_capture import capture_vllm

    prompts = _ragged_prompts(folders)
    trace = capture_vllm(engines("trace-draft"), prompts, 12, batch_size=4, ignore_eos=True, progress=False)
    own = without_rejected(trace)
    vllm, hf = _by_token(own), _hf_routing(folders["models"][0], prompts, 12)
    assert len(vllm) == own.num_tokens and set(hf) <= set(vllm)
    assert all(np.array_equal(vllm[key], hf[key]) for key in hf)
    # The only own rows HF lacks: the last output token, which SD can verify as an accepted draft.
    assert {p - len(prompts[s]) for s, p in set(vllm) - set(hf)} <= {11}
    counts = trace.meta["spec_decode"]
    rejected = trace.phase == "rejected"
    lengths = np.array([len(p) + 12 for p in prompts])[trace.sequence]
    beyond = rejected & (trace.position >= lengths)  # verified drafts past the token budget
    # Each draft token vLLM rejected is a rejected row; rows past the budget may also hold drafts it accepted.
    assert 0 < (rejected & ~beyond).sum() <= counts["draft_tokens"] - counts["accepted"] <= rejected.sum()
    with pytest.raises(ValueError, match="without_rejected"):
        window_union(trace, 2)
    assert (window_union(own, 2)["union"] >= trace.top_k).all()


@needs_vllm
def test_moesd_trace_cli_through_vllm(tmp_path):
    """`moesd trace --engine vllm --random-weights` writes a trace whose metadata names the engine."""
    from moesd.cli import main
    from moesd.routing.traces import RoutingTrace

    out = tmp_path / "vllm.npz"
    arguments = ["trace", "--engine", "vllm", "--random-weights", "--model", "qwen3-30b-a3b", "--layers", "1",
                 "--width", "0.25", "--prompts", "gsm8k", "--prompt-source", str(PROMPTS / "gsm8k"),
                 "--num-prompts", "3", "--batch-size", "2", "--max-new-tokens", "4", "--out"]
    with pytest.raises(SystemExit, match="2"):  # heads of width 8: refused by name, not by a kernel's crash
        main([*arguments, str(tmp_path / "narrow.npz"), "--width", "0.0625"])
    assert main([*arguments, str(out)]) == 0
    trace = RoutingTrace.load(out)
    assert trace.meta["engine"] == "vllm" and trace.meta["prompt_ids"] == ["gsm8k/0", "gsm8k/1", "gsm8k/2"]
    assert sorted(set(trace.sequence.tolist())) == [0, 1, 2] and (trace.phase == "decode").sum() == 3 * 3
    assert trace.layers.tolist() == [0] and trace.num_experts == 128 and trace.top_k == 8
