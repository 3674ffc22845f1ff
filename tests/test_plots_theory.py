"""Figures of the introduction and the theory chapters: what they draw, and that no text is cut."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

import moesd  # noqa: E402
from moesd.plots import diagrams, theory  # noqa: E402
from moesd.engine.exact import goodness_of_fit  # noqa: E402
from moesd.theory.experts import uniform_routing  # noqa: E402
from moesd.theory.roofline import HARDWARE  # noqa: E402


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def _texts(figure):
    """The texts a figure function wrote: axes texts (box labels, annotations), titles and figure texts."""
    texts = list(figure.texts)
    for ax in figure.axes:
        texts += list(ax.texts) + [ax.title, ax.xaxis.label, ax.yaxis.label]
    return [t for t in texts if t.get_text().strip() and t.get_visible()]


def assert_no_text_cut(figure):
    """Every text the function wrote lies inside the figure canvas (outside it, a saved figure cuts it)."""
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    canvas = figure.bbox
    for text in _texts(figure):
        box = text.get_window_extent(renderer)
        assert canvas.x0 - 1 <= box.x0 and box.x1 <= canvas.x1 + 1, f"text {text.get_text()!r} leaves the canvas"
        assert canvas.y0 - 1 <= box.y0 and box.y1 <= canvas.y1 + 1, f"text {text.get_text()!r} leaves the canvas"


def test_uniform_routing_picks_k_distinct_experts():
    routes = uniform_routing(50, E=16, K=3, seed=1)
    assert routes.shape == (50, 3)
    assert all(len(set(row)) == 3 for row in routes)
    assert routes.min() >= 0 and routes.max() < 16
    assert np.array_equal(routes, uniform_routing(50, E=16, K=3, seed=1))


def test_uniform_routing_activates_what_eq8_expects():
    draws = [len(np.unique(uniform_routing(9, E=16, K=2, seed=s))) for s in range(400)]
    expected = moesd.expected_active_experts(9, 16, 2)
    assert abs(np.mean(draws) - expected) < 4 * np.std(draws) / np.sqrt(len(draws))


@pytest.mark.parametrize("gamma, accepted", [(1, 0), (4, 2), (4, 4), (8, 3)])
def test_sd_timeline_draws_every_stage_and_cuts_no_text(gamma, accepted):
    figure = diagrams.sd_round_timeline(gamma=gamma, accepted=accepted)
    texts = " ".join(t.get_text() for t in _texts(figure))
    for i in range(1, gamma + 1):
        assert f"$d_{i}$" in texts
    assert ("bonus" in texts) == (accepted == gamma)
    assert f"{accepted + 1} of {gamma + 1} possible tokens" in texts
    assert_no_text_cut(figure)


def test_sd_timeline_refuses_more_accepted_than_drafted():
    with pytest.raises(ValueError, match="accepted"):
        diagrams.sd_round_timeline(gamma=2, accepted=3)


def test_routing_diagram_counts_match_its_draw_and_cut_no_text():
    figure = diagrams.routing_diagram(batch_size=3, gamma=2, E=16, K=2, seed=0)
    verify = uniform_routing(9, 16, 2, seed=0)
    decode = verify.reshape(3, 3, 2)[:, 0, :]
    titles = [ax.get_title() for ax in figure.axes]
    assert f"{len(np.unique(decode))} of 16 experts loaded" in titles[0]
    assert f"{len(np.unique(verify))} of 16 experts loaded" in titles[1]
    assert_no_text_cut(figure)


def test_rooflines_mark_each_ridge_point():
    records = [HARDWARE[name] for name in ("A800", "H800")]
    figure = theory.rooflines(records)
    ax = figure.axes[0]
    dots = [line for line in ax.get_lines() if line.get_marker() == "o"]
    assert [float(d.get_xdata()[0]) for d in dots] == pytest.approx([hw.ridge_point for hw in records])
    labels = ax.get_legend_handles_labels()[1]
    assert labels == [f"{hw.name}: RP {hw.ridge_point:.0f}" for hw in records]


def test_intensity_figure_puts_every_ridge_point_in_the_legend():
    tokens = np.array([1, 10, 100])
    figure = theory.intensity_against_tokens(tokens, tokens, tokens / 2, {"A800": 153.0, "H200": 206.0})
    labels = figure.axes[0].get_legend_handles_labels()[1]
    assert len(labels) == 4 and any("A800" in label for label in labels) and any("H200" in label for label in labels)


@pytest.mark.parametrize("make, lines", [
    (lambda: theory.sigma_curves(gammas=(1, 2, 4)), 3),
    (lambda: theory.appendix_b_f(token_counts=(2, 4)), 3),
    (lambda: theory.tokens_per_expert_asymptotes(rho=0.125), 4),
    (lambda: theory.threshold_against_k(E=64, K=np.arange(1, 9)), 2),
])
def test_theory_figures_draw_one_line_per_series_with_latex_labels(make, lines):
    figure = make()
    ax = figure.axes[0]
    assert len(ax.get_lines()) == lines
    assert "gamma" not in ax.get_xlabel().replace("\\gamma", "")


def test_sigma_curves_follow_eq5():
    """Eq. 5 by hand at alpha = 0.5: (1 - 0.5^(g+1)) / ((1 - 0.5)(g + 1)) = 0.75, 0.5833, 0.3875 for g = 1, 2, 4;
    every curve runs from 1 / (g + 1) at alpha = 0 to 1 at alpha = 1."""
    ax = theory.sigma_curves(gammas=(1, 2, 4)).axes[0]
    for line, gamma, at_half in zip(ax.get_lines(), (1, 2, 4), (0.75, 7 / 12, 0.3875)):
        alpha, sigma = (np.asarray(values, dtype=float) for values in line.get_data())
        assert sigma[0] == pytest.approx(1 / (gamma + 1), rel=1e-3) and sigma[-1] == pytest.approx(1, rel=1e-3)
        assert np.interp(0.5, alpha, sigma) == pytest.approx(at_half, rel=1e-3)


def test_speedup_against_efficiency_starts_where_sd_cannot_win():
    """With free drafting, a verification costing gamma + 1 decode steps (efficiency 1 / (gamma + 1)) leaves
    sigma (gamma + 1) / (gamma + 1) = sigma, below 1; at efficiency 1 the speedup is sigma (gamma + 1)."""
    ax = theory.speedup_against_efficiency(0.9, 4, draft_costs=(0.0,)).axes[0]
    efficiency, speedup = (np.asarray(values, dtype=float) for values in ax.get_lines()[0].get_data())
    assert efficiency[0] == pytest.approx(1 / 5) and speedup[0] == pytest.approx(0.9)
    assert efficiency[-1] == pytest.approx(1) and speedup[-1] == pytest.approx(4.5)


def test_efficiency_bounds_plots_every_row():
    tables = pd.DataFrame({"device": ["A", "A", "B"], "table": [1, 1, 2], "gamma": [2, 3, 2],
                           "min target efficiency": [0.6, 0.5, 0.7]})
    ax = theory.efficiency_bounds(tables).axes[0]
    points = np.concatenate([c.get_offsets() for c in ax.collections])
    assert sorted(points[:, 1]) == [0.5, 0.6, 0.7]
    marks = ax.get_lines()[0]  # the efficiency of a verification costing gamma + 1 decode steps
    assert list(marks.get_xdata()) == [2, 3] and np.allclose(marks.get_ydata(), [1 / 3, 1 / 4])


def test_goodness_of_fit_of_exact_and_wrong_samples():
    probabilities = np.array([0.5, 0.25, 0.125, 0.125])
    exact = np.repeat(np.arange(4), (probabilities * 800).astype(int))  # counts exactly as expected
    fit = goodness_of_fit(exact, probabilities)
    assert fit["samples"] == 800 and fit["dof"] == 3
    assert fit["chi_square"] == pytest.approx(0) and fit["p_value"] == pytest.approx(1)
    assert fit["total_variation"] == pytest.approx(0)
    wrong = np.repeat(np.arange(4), 200)  # uniform counts against a skewed distribution
    fit = goodness_of_fit(wrong, probabilities)
    assert fit["p_value"] < 1e-6
    assert fit["total_variation"] == pytest.approx(0.25)  # |0.25 - 0.5| + |0.25 - 0.25| + 2 |0.25 - 0.125|, halved


def test_goodness_of_fit_pools_rare_cells():
    """Cells expecting fewer than five tokens are pooled into one: here the last three, so two cells remain."""
    probabilities = np.array([0.97, 0.01, 0.01, 0.01])
    samples = np.r_[np.zeros(97, int), [1, 2, 3]]
    fit = goodness_of_fit(samples, probabilities)
    assert fit["dof"] == 1 and fit["p_value"] == pytest.approx(1)


@pytest.mark.parametrize("samples, probabilities", [([], [0.5, 0.5]), ([0, 2], [0.5, 0.5]), ([-1], [1.0])])
def test_goodness_of_fit_refuses_bad_samples(samples, probabilities):
    with pytest.raises(ValueError, match="samples"):
        goodness_of_fit(np.array(samples, dtype=int), probabilities)
