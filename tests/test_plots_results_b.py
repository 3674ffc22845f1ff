"""Figures of the chapters *Sparsity and the fitted model* and *More settings*: what they draw is the data."""

import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from moesd.measure.analysis import eq4_terms
from moesd.measure.analysis import rise_split  # noqa: E402
from moesd.plots.more_settings import denominator_terms, moe_vs_dense, settings_runs  # noqa: E402
from moesd.plots.sparsity_and_model import sparsity_panels, speedup_model_diagram  # noqa: E402

BATCH = np.array([1, 2, 4, 8, 16, 32, 64])


def boxes_overlap(figure: plt.Figure) -> list[tuple[str, str]]:
    """Pairs of text boxes of a figure's first axes whose drawn extents overlap, and boxes cut by the canvas.

    Returns a list of ``(text_a, text_b)`` pairs (``text_b`` is ``"canvas"`` for a box reaching past
    the figure's edge); empty for a clean diagram.
    """
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    canvas = figure.bbox
    boxes = [(t.get_text(), t.get_bbox_patch().get_window_extent(renderer))
             for t in figure.axes[0].texts if t.get_bbox_patch() is not None]
    problems = [(text, "canvas") for text, box in boxes
                if box.x0 < canvas.x0 or box.y0 < canvas.y0 or box.x1 > canvas.x1 or box.y1 > canvas.y1]
    for i, (text_a, a) in enumerate(boxes):
        problems += [(text_a, text_b) for text_b, b in boxes[i + 1:] if a.overlaps(b)]
    return problems


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


def test_sparsity_panels_draw_the_repeats_under_their_means_on_a_log_axis():
    means = _sparsity_frame()
    repeats = pd.concat([means.assign(speedup=means["speedup"] + shift) for shift in (-0.1, 0.0, 0.1)])
    figure = sparsity_panels(means, repeats=repeats, measured="mean of 3 repeats")
    ax = np.array(figure.axes).reshape(2, 3)[1][2]  # gamma = 4, K = 16
    single = [line for line in ax.get_lines() if line.get_marker() == "."]
    assert len(single) == 1 and len(single[0].get_xdata()) == 3 * len(BATCH)
    mean = [line for line in ax.get_lines() if line.get_marker() == "o"][0]
    expected = repeats[(repeats["gamma"] == 4) & (repeats["K"] == 16)].groupby("B")["speedup"].mean()
    np.testing.assert_allclose(mean.get_ydata(), expected.to_numpy())
    assert ax.get_xscale() == "log"
    labels = [text.get_text() for text in figure.legends[0].get_texts()]
    assert "mean of 3 repeats" in labels and "single repeats" in labels


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


def _timed(batch_sizes=(1, 8, 24, 100), runs=3):
    """An e2e-type study whose verification gets cheaper up to B = 24 while the draft's cost stays fixed."""
    rows = []
    for setting, sigma in (("a", 0.9), ("b", 0.5)):
        for run in range(runs):
            for b in batch_sizes:
                t1 = 0.1 * (1 + b / 50)
                verify = {1: 2.0, 8: 1.5, 24: 1.2, 100: 2.5}[b] * t1
                t_draft, t_reject = 0.01, 0.001
                speedup = sigma * 5 / (verify / t1 + 4 * t_draft / t1 + t_reject / t1)
                rows.append({"setting": setting, "run": run, "batch_size": b, "gamma": 4, "sigma": sigma,
                             "t_target_1": t1, "t_target_gamma": verify, "t_draft": t_draft,
                             "t_reject": t_reject, "speedup": speedup})
    return pd.DataFrame(rows)


def test_eq4_terms_recombine_to_the_speedup_and_sum_to_the_denominator():
    study = _timed()
    terms = eq4_terms(study, by=["setting", "batch_size"], step="t_target_1")
    assert list(terms.index.names) == ["setting", "batch_size"]
    np.testing.assert_allclose(terms["recombined"], terms["speedup"])
    np.testing.assert_allclose(terms["denominator"], terms["verify"] + terms["draft"] + terms["reject"])
    np.testing.assert_allclose(terms["tokens_per_round"], [4.5] * 4 + [2.5] * 4)
    assert (terms["rows"] == 3).all()
    pooled = eq4_terms(study, by=["batch_size"], step="t_target_1")
    assert list(pooled.index) == [1, 8, 24, 100] and (pooled["rows"] == 6).all()


def test_rise_split_shares_sum_to_one_and_name_the_term_that_fell():
    split = rise_split(eq4_terms(_timed(), by=["setting", "batch_size"], step="t_target_1"))
    assert list(split.index) == ["a", "b"]
    assert (split["first_batch_size"] == 1).all() and (split["peak_batch_size"] == 24).all()
    shares = split[["verify_share", "draft_share", "reject_share"]]
    np.testing.assert_allclose(shares.sum(axis=1), 1.0)
    assert (split["verify_share"] > 0.5).all()  # only verification got cheaper, in decode steps
    assert (split["draft_share"] > 0).all()  # a fixed draft time is fewer decode steps at larger B
    np.testing.assert_allclose(split["yield_change"], 0.0, atol=1e-12)
    assert split["speedup_peak"].gt(split["speedup_first"]).all()
    pooled = rise_split(eq4_terms(_timed(), by=["batch_size"], step="t_target_1"))
    assert list(pooled.index) == ["all"] and pooled.loc["all", "peak_batch_size"] == 24


def test_denominator_terms_stacks_the_three_terms_to_their_sum():
    terms = eq4_terms(_timed(), by=["batch_size"], step="t_target_1")
    figure = denominator_terms(terms)
    ax = figure.axes[0]
    assert len(ax.collections) == 3  # verification, draft, rejection
    dots = [line for line in ax.get_lines() if line.get_marker() == "o"][0]
    np.testing.assert_allclose(dots.get_ydata(), terms["denominator"])
    top = ax.collections[-1].get_paths()[0].vertices[:, 1].max()
    assert top == pytest.approx(terms["denominator"].max())


def test_stage_time_ratios_clip_a_vanishing_fitted_term_below_the_axis():
    from moesd.plots.fitting_robustness import stage_time_ratios

    rows = [{"B": b, "gamma": 4, "K": k, "draft_fitted": 1e-30, "draft_measured": 0.05 + 0.001 * b,
             "verify_fitted": 1.5, "verify_measured": 1.6, "reject_fitted": 0.3, "reject_measured": 0.01,
             "overhead_fitted": 0.3, "overhead_measured": 0.21} for b in BATCH for k in (1, 8)]
    figure = stage_time_ratios(pd.DataFrame(rows), gamma=4)
    draft, verify, reject, overhead = figure.axes[:4]
    assert [ax.get_yscale() for ax in (draft, verify, reject, overhead)] == ["log", "linear", "log", "log"]
    assert draft.get_ylim()[0] == pytest.approx(0.0051) and draft.get_xscale() == "log"
    assert any("below the axis" in text.get_text() for text in draft.texts)
    assert not any("below the axis" in text.get_text() for text in overhead.texts)
