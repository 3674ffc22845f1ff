"""Figures of the chapters *Sparsity and the fitted model* and *More settings*: what they draw is the data."""

import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from moesd.plots.more_settings import moe_vs_dense, settings_runs  # noqa: E402
from moesd.plots.sparsity_and_model import boxes_overlap, sparsity_panels, speedup_model_diagram  # noqa: E402

BATCH = np.array([1, 2, 4, 8, 16, 32, 64])


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def _sparsity_frame():
    rows = []
    for gamma in (2, 4):
        for k in (1, 4, 16):
            speedup = 1 + gamma * np.exp(-((np.log2(BATCH) - np.log2(k)) ** 2) / 4)
            rows += [{"B": b, "gamma": gamma, "K": k, "speedup": s} for b, s in zip(BATCH, speedup)]
    return pd.DataFrame(rows)


def test_diagram_has_no_overlapping_or_cut_boxes():
    assert boxes_overlap(speedup_model_diagram()) == []


def test_boxes_overlap_finds_overlaps_and_boxes_past_the_canvas():
    figure, ax = plt.subplots(figsize=(3, 2))
    for x, y in ((0.5, 0.5), (0.52, 0.5), (1.4, 0.5)):
        ax.text(x, y, "a box", transform=ax.transAxes, bbox=dict(boxstyle="round"))
    problems = boxes_overlap(figure)
    assert ("a box", "a box") in problems and ("a box", "canvas") in problems


def test_sparsity_panels_one_panel_per_k_and_gamma_with_the_half_power_level():
    frame = _sparsity_frame()
    figure = sparsity_panels(frame, predicted=frame["speedup"] * 1.01)
    axes = np.array(figure.axes).reshape(2, 3)
    for (row, gamma), (column, k) in ((r, c) for r in enumerate((2, 4)) for c in enumerate((1, 4, 16))):
        ax = axes[row][column]
        part = frame[(frame["gamma"] == gamma) & (frame["K"] == k)]
        level = part["speedup"].max() / math.sqrt(2)
        dashed = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
        assert len(dashed) == 1 and dashed[0].get_ydata()[0] == pytest.approx(level)
        assert any(t.get_text() == r"$x/\sqrt{2}$" for t in ax.texts)
        span = ax.patches[0]  # axvspan: a Rectangle in data x
        above = part["B"][part["speedup"] >= level]  # one run around the peak: the curves are unimodal
        assert (span.get_x(), span.get_x() + span.get_width()) == pytest.approx((above.min(), above.max()))
        points = [line for line in ax.get_lines() if line.get_marker() == "o"][0]
        np.testing.assert_allclose(points.get_ydata(), part.sort_values("B")["speedup"])


def test_shaded_range_is_the_run_around_the_peak_not_every_point_above():
    frame = pd.DataFrame({"B": BATCH, "gamma": 2, "K": 8, "speedup": [1.0, 3.0, 2.9, 1.0, 1.0, 2.5, 1.0]})
    span = sparsity_panels(frame).axes[0].patches[0]
    assert (span.get_x(), span.get_x() + span.get_width()) == (2, 4)  # B = 32 is above x/sqrt(2) but apart


def _e2e(runs, shift=0.0):
    rows = [{"run": r, "batch_size": b, "gamma": g, "speedup": 1 + shift + 0.1 * r + g / (1 + b / 16)}
            for r in range(runs) for g in (2, 4) for b in BATCH]
    return pd.DataFrame(rows)


def test_settings_runs_draws_every_run_and_their_mean():
    frame = pd.concat([_e2e(5).assign(dataset=d, temperature=t, setting=f"{d} T={t:g}", sigma_target=0.9)
                       for d in ("humaneval", "mtbench") for t in (0.0, 1.0)])
    figure = settings_runs(frame, {"humaneval T=0": 2.0})
    assert len(figure.axes) == 4
    ax = figure.axes[0]
    thin = [line for line in ax.get_lines() if line.get_linewidth() < 1]
    assert len(thin) == 5 * 2  # five runs for each of two gammas
    mean = [line for line in ax.get_lines() if line.get_marker() == "o"][0]
    expected = frame[(frame["setting"] == "humaneval T=0") & (frame["gamma"] == 2)].groupby("batch_size")["speedup"]
    np.testing.assert_allclose(mean.get_ydata(), expected.mean())
    assert any(line.get_linestyle() == ":" for line in ax.get_lines())


def test_moe_vs_dense_circles_the_flagged_rows():
    moe, dense = _e2e(2), _e2e(3, shift=-0.5)
    flagged = dense[(dense["batch_size"] == 2) & (dense["run"] == 0)]
    figure = moe_vs_dense(moe, dense, flagged)
    circled = [line for ax in figure.axes for line in ax.get_lines() if line.get_markersize() == 9]
    assert sum(len(line.get_xdata()) for line in circled) == len(flagged)
