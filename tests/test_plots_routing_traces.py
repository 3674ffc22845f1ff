"""The Routing traces chapter: its synthetic correlated trace (correlation set by ``reuse``, popularity
uniform) and its multi-trace figures, one full-width panel per trace."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from moesd.theory.experts import expected_active_experts  # noqa: E402
from moesd.plots.routing_traces import activation_curves, label, verification_load  # noqa: E402
from moesd.routing.traces import correlated_trace  # noqa: E402
from moesd.routing.unions import adjacent_overlap, popularity  # noqa: E402


def test_shape_sequences_and_distinct_experts():
    trace = correlated_trace(sequences=7, length=5, num_experts=16, top_k=3, reuse=0.5, seed=2)
    assert trace.experts.shape == (35, 1, 3) and trace.num_experts == 16 and trace.top_k == 3
    assert list(trace.sequence[:6]) == [0, 0, 0, 0, 0, 1] and list(trace.position[:6]) == [0, 1, 2, 3, 4, 0]
    assert all(len(set(row)) == 3 for row in trace.experts[:, 0])  # RoutingTrace refuses repeats too
    assert label("synthetic", trace).endswith("(synthetic)")


def test_full_reuse_keeps_each_sequences_experts():
    trace = correlated_trace(sequences=20, length=8, num_experts=32, top_k=4, reuse=1.0)
    experts = np.sort(trace.experts[:, 0], axis=1).reshape(20, 8, 4)
    assert (experts == experts[:, :1]).all()
    assert adjacent_overlap(trace)["overlap"].iloc[0] == pytest.approx(1)


@pytest.mark.parametrize("reuse", [0.0, 0.3, 0.7])
def test_overlap_follows_reuse(reuse):
    """A token keeps each of the K experts before it with probability reuse and fills the rest from the E - kept
    other experts, which hold the K - kept dropped ones: the expected share is reuse + (1 - reuse)(K/E)-ish,
    exactly K/E at reuse = 0 (uniform, independent) and rising with reuse."""
    E, K = 32, 4
    trace = correlated_trace(sequences=400, length=20, num_experts=E, top_k=K, reuse=reuse, seed=1)
    overlap = adjacent_overlap(trace)["overlap"].iloc[0]
    assert reuse <= overlap + 0.02
    if reuse == 0:
        assert overlap == pytest.approx(K / E, abs=0.01)
    assert overlap <= reuse + (1 - reuse) * K / E + 0.02


@pytest.mark.parametrize("reuse", [0.0, 0.8])
def test_popularity_stays_uniform(reuse):
    """At reuse 0.8 a sequence keeps an expert for about five tokens, so its tokens are few independent draws: 4000
    sequences put the standard error of each share near 0.004, and the bound below is about five of them."""
    E, K = 16, 2
    trace = correlated_trace(sequences=4000, length=16, num_experts=E, top_k=K, reuse=reuse, seed=3)
    shares = popularity(trace)["probability"].to_numpy()
    assert shares.sum() == pytest.approx(K)
    assert np.abs(shares - K / E).max() < 0.02


def test_no_reuse_activates_what_eq8_expects():
    trace = correlated_trace(sequences=2000, length=4, num_experts=16, top_k=2, reuse=0.0, seed=4)
    windows = trace.experts[:, 0].reshape(2000, 4, 2)
    distinct = np.array([len(np.unique(w)) for w in windows])
    assert distinct.mean() == pytest.approx(expected_active_experts(4, 16, 2), abs=4 * distinct.std() / np.sqrt(2000))


@pytest.mark.parametrize("kwargs", [dict(reuse=1.5), dict(reuse=-0.1), dict(top_k=0), dict(top_k=17),
                                    dict(sequences=0), dict(length=0)])
def test_bad_arguments_raise(kwargs):
    arguments = dict(sequences=2, length=3, num_experts=16, top_k=2, reuse=0.5) | kwargs
    with pytest.raises(ValueError):
        correlated_trace(**arguments)


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def _stacked(figure, panels):
    """The figure's panels are one column, each as wide as the figure allows, top to bottom in order."""
    axes = figure.axes
    assert len(axes) == panels
    boxes = [ax.get_position() for ax in axes]
    assert all(box.width > 0.7 for box in boxes)
    assert all(upper.y0 > lower.y1 for upper, lower in zip(boxes, boxes[1:]))
    figure.canvas.draw()
    canvas = figure.bbox
    renderer = figure.canvas.get_renderer()
    for ax in axes:
        for text in [ax.title, ax.xaxis.label, ax.yaxis.label]:
            box = text.get_window_extent(renderer)
            assert canvas.x0 - 1 <= box.x0 and box.x1 <= canvas.x1 + 1, f"{text.get_text()!r} leaves the canvas"


def test_activation_curves_stack_one_panel_per_trace():
    traces = {f"reuse {r}": correlated_trace(30, 16, 16, 2, r, seed=5) for r in (0.0, 0.9)}
    _stacked(activation_curves(traces, token_counts=(1, 2, 4)), panels=2)


def test_verification_load_stacks_one_panel_per_trace():
    traces = {f"reuse {r}": correlated_trace(30, 16, 16, 2, r, seed=5) for r in (0.0, 0.9)}
    predictions = pd.DataFrame([{"trace": name, "B": b, "w": w, "measured": 1.0, "windows": 1.0, "uniform": 1.0}
                                for name in traces for b in (1, 2) for w in (1, 3)])
    figure = verification_load(predictions, traces)
    _stacked(figure, panels=2)
    assert figure.axes[0].get_legend() is not None and figure.axes[1].get_legend() is None
