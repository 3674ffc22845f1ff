"""Routing under control in a sweep: uniform routing obeys Eq. 8, model routing is left alone, K set in place."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from moesd._checks import UsageError  # noqa: E402
from moesd.routing.capture import RoutingRecorder  # noqa: E402
from moesd.theory.experts import expected_active_experts  # noqa: E402
from moesd.measure.router_control import RoutingControl, distinct_experts, num_experts, set_top_k  # noqa: E402
from moesd.measure.sweeps import SweepConfig  # noqa: E402
from moesd.zoo import get_model  # noqa: E402

TINY = dict(num_layers=2, width=1 / 32, seed=0)


@pytest.fixture(scope="module")
def moe():
    return get_model("qwen2-57b-a14b").random_model(**TINY)


def _ids(batch, tokens, vocab=512, seed=0):
    return torch.randint(1, vocab, (batch, tokens), generator=torch.Generator().manual_seed(seed))


def test_distinct_experts_counts_per_layer_and_averages_over_layers():
    layer_a = torch.tensor([[0, 1], [1, 2]])  # experts 0, 1, 2
    layer_b = torch.tensor([[5, 5], [5, 5]])  # expert 5 only
    assert distinct_experts([layer_a, layer_b], 8) == pytest.approx((3 + 1) / 2)
    assert distinct_experts([torch.arange(8).reshape(4, 2)], 8) == 8


def test_uniform_routing_activates_what_eq8_expects(moe):
    """Measured N(t) under uniform routing against Eq. 8, over t from one token to nearly all experts."""
    experts, top_k = num_experts(moe), moe.config.num_experts_per_tok
    torch.manual_seed(1)
    with torch.no_grad(), RoutingControl(moe, "uniform", keep=40) as control:
        for batch, tokens in ((1, 1), (4, 1), (4, 4), (16, 5)):
            for seed in range(40):
                moe(input_ids=_ids(batch, tokens, moe.config.vocab_size, seed))
            t = batch * tokens
            measured = control.mean_distinct()
            # 40 forwards x 2 layers: the standard error is below 1 % of N here
            assert measured == pytest.approx(float(expected_active_experts(t, experts, top_k)), rel=0.03)
            for forward in control.forwards:  # each token: K distinct experts
                for ids in forward:
                    assert ids.shape == (t, top_k)
                    assert all(len(set(row.tolist())) == top_k for row in ids)


def test_uniform_routing_replaces_the_choice_and_gives_equal_weights(moe):
    """What the experts receive under uniform routing: the recorded ids, and weights 1/K."""
    ids = _ids(2, 3, moe.config.vocab_size)
    received = []
    experts = moe.model.layers[1].mlp.experts
    handle = experts.register_forward_pre_hook(lambda module, args: received.append(args[1:3]))
    with torch.no_grad():
        own = moe(input_ids=ids).logits
        with RoutingControl(moe, "uniform") as control:
            uniform = moe(input_ids=ids).logits
    handle.remove()
    (own_ids, own_weights), (uniform_ids, uniform_weights) = received
    top_k = moe.config.num_experts_per_tok
    assert torch.equal(uniform_ids, control.forwards[-1][-1]) and not torch.equal(uniform_ids, own_ids)
    assert torch.equal(uniform_weights, torch.full_like(own_weights, 1 / top_k))
    assert not torch.allclose(own, uniform)


def test_model_routing_records_the_routers_own_choice(moe):
    ids = _ids(3, 4, moe.config.vocab_size)
    with torch.no_grad(), RoutingRecorder(moe) as recorder, RoutingControl(moe, "model") as control:
        logits = moe(input_ids=ids).logits
    with torch.no_grad():
        assert torch.equal(logits, moe(input_ids=ids).logits)  # the forward is unchanged
    recorded = [recorder.calls[0][index] for index in sorted(recorder.calls[0])]
    assert all(torch.equal(a, b) for a, b in zip(recorded, control.forwards[-1]))


def test_setting_k_in_place_gives_the_model_built_with_that_k(moe):
    spec = get_model("qwen2-57b-a14b")
    ids = _ids(2, 5, moe.config.vocab_size)
    for top_k in (1, 4, 2):
        set_top_k(moe, top_k)
        fresh = spec.random_model(top_k=top_k, **TINY)
        assert fresh.config.num_experts_per_tok == moe.config.num_experts_per_tok == top_k
        with torch.no_grad():
            torch.testing.assert_close(moe(input_ids=ids).logits, fresh(input_ids=ids).logits, rtol=0, atol=0)
    set_top_k(moe, spec.top_k)


@pytest.mark.parametrize("top_k", [0, 65, 2.5, True])
def test_set_top_k_refuses_a_k_outside_one_to_e(moe, top_k):
    with pytest.raises(ValueError, match=r"top_k must be a whole number in \[1, 64\]"):
        set_top_k(moe, top_k)


def _trace(tokens=50, layers=3, experts=64, top_k=8, seed=3):
    from moesd.routing.traces import RoutingTrace

    rng = np.random.default_rng(seed)
    ids = np.stack([[rng.choice(experts, top_k, replace=False) for _ in range(layers)] for _ in range(tokens)])
    return RoutingTrace(ids, experts)


def test_trace_routing_replays_the_trace_row_by_row(moe):
    """Each forward takes the trace's next B s rows (wrapping); model layer i replays trace layer i mod layers."""
    trace = _trace()
    with torch.no_grad(), RoutingControl(moe, "trace", keep=5, trace=trace) as control:
        for tokens in (4, 30, 30):  # the third forward wraps around the 50 rows
            moe(input_ids=_ids(2, tokens // 2, moe.config.vocab_size))
    starts = [0, 4, 34]
    for forward, start, tokens in zip(control.forwards, starts, (4, 30, 30)):
        rows = (start + np.arange(tokens)) % 50
        for layer, ids in enumerate(forward):
            model_layer = sorted(control.routers)[layer]
            assert np.array_equal(ids.numpy(), np.asarray(trace.experts)[rows, model_layer % 3])


def test_trace_routing_refuses_a_trace_of_another_shape(moe):
    with pytest.raises(ValueError, match=r"the trace routes E = 64, K = 4; the model has E = 64, K = 8"):
        RoutingControl(moe, "trace", trace=_trace(top_k=4))
    with pytest.raises(ValueError, match="routing 'trace' needs one"):
        RoutingControl(moe, "trace")


@pytest.mark.parametrize("routing, keep, message", [("popular", 1, "routing must be one of uniform, model, trace"),
                                                    ("uniform", 0, "keep must be a whole number >= 1")])
def test_routing_control_refuses_bad_settings(moe, routing, keep, message):
    with pytest.raises(ValueError, match=message):
        RoutingControl(moe, routing, keep)


def test_routing_control_refuses_a_dense_model():
    dense = get_model("qwen2-0.5b").random_model(num_layers=1, width=1 / 8)
    with pytest.raises(ValueError, match="routing capture supports"):
        RoutingControl(dense, "uniform")


def test_sweep_settings_default_and_refuse_routing():
    base = dict(target="qwen2-57b-a14b", draft="qwen2-0.5b", layers=1, draft_layers=1, width=1 / 32)
    assert SweepConfig("forward", **base).routing == "uniform"
    assert SweepConfig("forward", **base, routing="model").settings()["routing"] == "model"
    assert SweepConfig("dense_forward", target="opt-30b", draft="opt-350m").routing is None
    with pytest.raises(UsageError, match="routing applies to MoE targets; opt-30b is dense"):
        SweepConfig("dense_forward", target="opt-30b", draft="opt-350m", routing="uniform")
    with pytest.raises(UsageError, match="routing must be one of uniform, model, trace"):
        SweepConfig("forward", **base, routing="popular")
    with pytest.raises(UsageError, match="routing_trace names the trace that routing 'trace' replays"):
        SweepConfig("forward", **base, routing="trace")
    with pytest.raises(UsageError, match="is not a file"):
        SweepConfig("forward", **base, routing="trace", routing_trace="/nonexistent.npz")
    pretrained = dict(target="qwen2-57b-a14b", draft="qwen2-0.5b", weights="pretrained")
    assert SweepConfig("e2e", **pretrained).routing == "model"
    with pytest.raises(UsageError, match="uniform routing draws the target's experts at random"):
        SweepConfig("e2e", **pretrained, routing="uniform", sigma="real")
    assert np.isclose(SweepConfig("e2e", **pretrained, routing="uniform", sigma={2: 0.9, 3: 0.9, 4: 0.9})
                      .sigma[2], 0.9)


def test_a_sweep_refuses_a_trace_of_another_shape_before_any_model(tmp_path):
    base = dict(target="qwen2-57b-a14b", draft="qwen2-0.5b", layers=1, draft_layers=1, width=1 / 32)
    right, wrong = _trace().save(tmp_path / "right.npz"), _trace(top_k=4).save(tmp_path / "wrong.npz")
    assert SweepConfig("forward", **base, routing="trace", routing_trace=str(right)).routing == "trace"
    with pytest.raises(UsageError, match=r"routing_trace routes E = 64, K = 4; the sweep's qwen2-57b-a14b has E = 64 "
                                         r"and K = 8"):
        SweepConfig("forward", **base, routing="trace", routing_trace=str(wrong))
    assert SweepConfig("forward", **base, routing="trace", routing_trace=str(wrong), top_ks=(4,)).top_ks == (4,)
    (tmp_path / "junk.npz").write_text("not a trace")
    with pytest.raises(UsageError, match="is not a routing trace"):
        SweepConfig("forward", **base, routing="trace", routing_trace=str(tmp_path / "junk.npz"))
