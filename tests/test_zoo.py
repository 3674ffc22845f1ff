"""Model records: parameter counts of the real configs, scaled shapes, and building models."""

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from moesd.paper_tables import paper_table  # noqa: E402
from moesd.predictor.layout import resolve_model  # noqa: E402
from moesd.zoo import DRAFT_HEADS, MODELS, get_model  # noqa: E402

PAPER_MODELS = paper_table("models")


@pytest.mark.parametrize("row", PAPER_MODELS.to_dict("records"), ids=PAPER_MODELS["model"].tolist())
def test_total_parameters_match_the_model_cards(row):
    spec = get_model(row["hub_id"])
    assert spec.weight_counts()["total"] == pytest.approx(row["total_params"], rel=0.06)  # names round: OPT-350m has 331M
    if row["num_experts"] == row["num_experts"]:  # MoE rows
        assert spec.num_experts == row["num_experts"] and spec.top_k == row["num_experts_per_tok"]
    # every shape field the table copies from the model's config.json (OPT names them differently)
    config = spec.config_dict()
    aliases = {"opt": {"hidden_size": "hidden_size", "intermediate_size": "ffn_dim", "num_hidden_layers":
                       "num_hidden_layers", "num_attention_heads": "num_attention_heads", "vocab_size": "vocab_size"}}
    fields = aliases.get(spec.model_type, {f: f for f in ("hidden_size", "moe_intermediate_size", "intermediate_size",
                                                          "num_hidden_layers", "num_attention_heads",
                                                          "num_key_value_heads", "vocab_size")})
    for column, key in fields.items():
        if row[column] == row[column] and key in config:
            assert config[key] == row[column], (row["model"], column)
    checked = [column for column, key in fields.items() if row[column] == row[column] and key in config]
    assert {"hidden_size", "num_hidden_layers", "vocab_size"} <= set(checked), (row["model"], checked)


#: Total and activated parameters as the model cards state them (independent of this code), and whether the
#: card's activated count leaves out the input embedding (a lookup, not a matrix product).
CARDS = {
    "qwen2-57b-a14b": (57e9, 14e9, False, "Qwen2-57B-A14B model card: 57B total, 14B activated"),
    "mixtral-8x7b": (46.7e9, 12.9e9, False, "Mistral AI, Mixtral of experts: 46.7B total, 12.9B per token"),
    "qwen1.5-moe-a2.7b": (14.3e9, 2.7e9, False, "Qwen1.5-MoE-A2.7B model card: 14.3B total, 2.7B activated"),
    "deepseek-v2-lite": (15.7e9, 2.4e9, True, "DeepSeek-V2-Lite model card: 15.7B total, 2.4B activated"),
    "olmoe-1b-7b": (6.9e9, 1.3e9, False, "OLMoE paper: 6.9B total, 1.3B active"),
    "qwen3-30b-a3b": (30.5e9, 3.3e9, False, "Qwen3-30B-A3B model card: 30.5B total, 3.3B activated"),
    "qwen3-235b-a22b": (235e9, 22e9, False, "Qwen3-235B-A22B model card: 235B total, 22B activated"),
    "deepseek-v3": (671e9, 36.6e9, True, "DeepSeek-V3 README_WEIGHTS: 671B main model, 36.6B activated "
                    "including the 0.9B output head"),
    "kimi-k2": (1e12, 32e9, False, "Kimi-K2-Instruct model card: 1T total, 32B activated"),
    "gpt-oss-120b": (116.83e9, 5.13e9, True, "gpt-oss model card: 116.83B total, 5.13B active per token"),
    "mixtral-8x22b": (141e9, 39e9, False, "Mistral AI, Mixtral 8x22B: 141B total, 39B active"),
    "qwen3-0.6b": (0.6e9, 0.6e9, False, "Qwen3-0.6B model card: 0.6B parameters, dense"),
    "deepseek-r1": (671e9, 37e9, True, "DeepSeek-R1 model card: 671B total, 37B activated"),
    "deepseek-v3.1": (671e9, 37e9, True, "DeepSeek-V3.1 model card: 671B total, 37B activated"),
    "glm-4.5": (355e9, 32e9, True, "GLM-4.5 model card: 355B total, 32B active"),
    "minimax-m1": (456e9, 45.9e9, True, "MiniMax-M1 README: 456B total, 45.9B activated per token"),
    "minimax-m2": (230e9, 10e9, True, "MiniMax-M2 model card: 230B total, 10B active"),
    "qwen3-coder-480b-a35b": (480e9, 35e9, False, "Qwen3-Coder-480B-A35B-Instruct model card: 480B total, 35B "
                              "activated"),
    "llama-4-scout": (109e9, 17e9, False, "Llama 4 model card: Scout 109B total, 17B active"),
    "llama-4-maverick": (400e9, 17e9, False, "Llama 4 model card: Maverick 400B total, 17B active"),
    "gpt-oss-20b": (20.91e9, 3.61e9, True, "gpt-oss model card: 20.91B total, 3.61B active per token"),
}


def test_qwen3_next_has_the_cards_total_and_its_rounded_active_count():
    """Qwen3-Next-80B-A3B's card: 80B total, 'only 3B active'; counted, 3.56B active without the embedding (3.25B
    without the LM head too): the card rounds to its name's A3B, so only the total is held to 5 %."""
    counts = get_model("qwen3-next-80b-a3b").weight_counts()
    assert counts["total"] == pytest.approx(80e9, rel=0.05)
    assert 3e9 < counts["active"] - counts["embeddings"] - counts["lm_head"] < 3.5e9


@pytest.mark.parametrize("name", sorted(CARDS))
def test_total_and_active_parameters_match_the_model_cards(name):
    """Cards round to two or three digits ("A14B"): 5 % is the tolerance of their rounding."""
    total, active, without_embedding, _ = CARDS[name]
    counts = get_model(name).weight_counts()
    assert counts["total"] == pytest.approx(total, rel=0.05)
    assert counts["active"] - (counts["embeddings"] if without_embedding else 0) == pytest.approx(active, rel=0.05)


def test_one_expert_of_qwen2_57b_by_hand():
    """SwiGLU expert: gate and up (3584 -> 2560) and down (2560 -> 3584), no biases."""
    arch = get_model("qwen2-57b-a14b").architecture()
    assert arch.expert_params == 3 * 3584 * 2560 == 27_525_120
    assert arch.weight_counts()["routed_experts"] == 28 * 64 * 27_525_120
    assert arch.shared_params == 3 * 3584 * 20480 + 3584  # the shared expert and its sigmoid gate
    deepseek = get_model("deepseek-v3").architecture()
    assert (deepseek.moe_layers, deepseek.dense_layers) == (58, 3)
    assert deepseek.kv_values_per_token == 512 + 64  # MLA caches the latent and the rotary key


@pytest.mark.parametrize("name", sorted(MODELS))
def test_analytic_counts_equal_the_meta_device_model(name):
    """Per component and in total, truncated to a few layers (dense and MoE ones) and scaled down."""
    spec = MODELS[name]
    for layers, width in ((min(spec.num_layers, 4), 1.0), (min(spec.num_layers, 2), 1 / 16)):
        meta, analytic = spec.parameter_counts(layers, width=width), spec.weight_counts(layers, width=width)
        assert {k: analytic[k] for k in meta} == meta


def test_draft_heads_name_a_target_of_the_zoo_of_their_width():
    """An MTP module and an EAGLE-3 head draft from their own target's hidden states: the zoo says which target."""
    heads = {name: spec.head_of for name, spec in MODELS.items() if spec.head_of is not None}
    heads.update({name: head.target for name, head in DRAFT_HEADS.items()})
    assert heads["deepseek-v3-mtp"] == "deepseek-v3" and heads["qwen3-30b-a3b-eagle3"] == "qwen3-30b-a3b"
    for name, target in heads.items():
        assert MODELS[target].head_of is None, name  # a head of a head serves nothing
        assert resolve_model(name).hidden_size == MODELS[target].config["hidden_size"], name


def test_a_record_without_a_config_class_serves_predict_only():
    spec = dataclasses.replace(get_model("qwen2-0.5b"), name="future", model_type="qwen9")
    with pytest.raises(ValueError, match="no config class for model_type 'qwen9'"):
        spec.hf_config()
    with pytest.raises(ValueError, match="no config class"):
        spec.random_model(num_layers=1, width=1 / 32)


@pytest.mark.parametrize("name", ["qwen2-57b-a14b", "mixtral-8x7b", "olmoe-1b-7b", "qwen3-30b-a3b", "opt-30b"])
def test_scaling_keeps_the_expert_share(name):
    spec = get_model(name)
    full, small = spec.parameter_counts(), spec.parameter_counts(num_layers=4, width=1 / 8)
    assert small["total"] < full["total"] / 100
    assert small["experts"] / small["total"] == pytest.approx(full["experts"] / full["total"], abs=0.01)


def test_changed_top_k_changes_active_not_total():
    spec = get_model("qwen2-57b-a14b")
    counts = {k: spec.parameter_counts(num_layers=2, top_k=k, width=1 / 16) for k in (1, 8, 64)}
    assert len({c["total"] for c in counts.values()}) == 1
    assert counts[1]["active"] < counts[8]["active"] < counts[64]["active"] == counts[64]["total"]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_scaled_random_model_runs(name):
    spec = MODELS[name]
    # at least two layers, and one of softmax attention (a cache of linear-attention layers only has no length)
    layers = next(n for n in range(min(2, spec.num_layers), spec.num_layers + 1) if spec.architecture(n).full_layers)
    model = spec.random_model(num_layers=layers, width=1 / 32)
    config = model.config
    assert config.num_hidden_layers == layers and config.vocab_size >= 256
    if spec.is_moe:
        assert config.num_experts_per_tok == spec.top_k
        assert config._experts_implementation == "eager"
    ids = torch.randint(1, config.vocab_size, (2, 5))
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (2, 5, config.vocab_size) and torch.isfinite(logits).all()


def test_same_seed_same_weights():
    spec = get_model("olmoe-1b-7b")
    a, b = (spec.random_model(num_layers=1, width=1 / 32, seed=3) for _ in range(2))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_layers=0), "num_layers"), (dict(num_layers=29), "num_layers"), (dict(top_k=0), "top_k"),
    (dict(top_k=65), "top_k"), (dict(width=0), "width"), (dict(width=1.5), "width")])
def test_bad_changes_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        get_model("qwen2-57b-a14b").config_dict(**kwargs)


def test_dense_models_have_no_top_k_and_unknown_names_fail():
    with pytest.raises(ValueError, match="dense"):
        get_model("opt-30b").config_dict(top_k=2)
    with pytest.raises(KeyError, match="unknown model"):
        get_model("gpt-5")


def test_models_are_found_by_name_or_hub_id_in_any_case():
    spec = get_model("qwen2-57b-a14b")
    assert get_model("Qwen2-57B-A14B") is spec and get_model(spec.hub_id.upper()) is spec
    with pytest.raises(KeyError, match="unknown model 'qwen2-57b'"):
        get_model("qwen2-57b")


def test_a_cut_that_keeps_only_dense_layers_is_refused():
    """DeepSeek-V3's first 3 layers are dense: a routing trace keeps at least 4; Mixtral routes in every layer."""
    deepseek = get_model("deepseek-v3")
    deepseek.check_routed_layers(4)
    deepseek.check_routed_layers(None)
    get_model("mixtral-8x7b").check_routed_layers(1)
    with pytest.raises(ValueError, match=r"num_layers 3 keeps only dense layers .* give num_layers >= 4"):
        deepseek.check_routed_layers(3)
    with pytest.raises(ValueError, match="opt-30b is dense"):
        get_model("opt-30b").check_routed_layers(2)
