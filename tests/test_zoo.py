"""Model records: parameter counts of the real configs, scaled shapes, and building models."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from moesd.paper import paper_table  # noqa: E402
from moesd.zoo import MODELS, get_model  # noqa: E402

PAPER_MODELS = paper_table("models")


@pytest.mark.parametrize("row", PAPER_MODELS.to_dict("records"), ids=PAPER_MODELS["model"].tolist())
def test_total_parameters_match_the_model_cards(row):
    spec = get_model(row["hub_id"])
    assert spec.parameter_counts()["total"] == pytest.approx(row["total_params"], rel=0.06)  # names round: OPT-350m has 331M
    if row["num_experts"] == row["num_experts"]:  # MoE rows
        assert spec.num_experts == row["num_experts"] and spec.top_k == row["num_experts_per_tok"]


@pytest.mark.parametrize("name, active", [("qwen2-57b-a14b", 14.25e9), ("mixtral-8x7b", 12.88e9),
                                          ("qwen1.5-moe-a2.7b", 2.69e9), ("qwen3-30b-a3b", 3.35e9)])
def test_active_parameters(name, active):
    assert get_model(name).parameter_counts()["active"] == pytest.approx(active, rel=0.01)


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
    model = spec.random_model(num_layers=2, width=1 / 32)
    config = model.config
    assert config.num_hidden_layers == 2 and config.vocab_size >= 256
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
