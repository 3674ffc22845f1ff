"""The material reading of the verdicts (moesd.paper.criteria): synthetic curves built to pass and to fail it, set
beside the strict reading, and the rules it rests on (the tolerance, acceptance normalisation, the context K = 1, 2's
fall needs, coverage per curve, the regime of a study)."""

import numpy as np
import pandas as pd
import pytest

from moesd.model.samples import stride_sample
from moesd.paper import criteria as cr
from moesd import narration
from moesd.paper import curves as cu
from moesd.paper import sparsity_verdicts as sv
from moesd.paper import verdicts as v
from test_verdicts import GRID, e2e_study, falling, forward_study, hump, paper_robustness, piecewise, sweep

TOLERANCE = cr.FLUCTUATION_TOLERANCE

RISE_FALL = {1: 0.55, 28: 0.95, 100: 0.80}
"""A rise then fall of an MoE's target efficiency: a rise of 0.40 and a fall of 0.15."""


def with_dip(points: dict, dip: float) -> dict:
    """``points`` with the value at B = 2 lowered below the value at B = 1 by ``dip``."""
    return {1: points[1], 2: points[1] - dip, **{b: y for b, y in points.items() if b > 1}}


def one_curve(points, runs=5, noise=0.002):
    return cu.curve(sweep({"y": piecewise(points)}, runs=runs, noise=noise), "y")


@pytest.mark.parametrize("dip, material", [(0.03, True), (0.08, True), (0.15, False)])
def test_a_dip_counts_only_beyond_its_share_of_the_rise(dip, material):
    c = one_curve(with_dip(RISE_FALL, dip))
    strict, tolerant = cu.rises_then_falls(c), cu.rises_then_falls(c, TOLERANCE)
    assert not strict["rises_then_falls"] and strict["largest_reversal_from"] == 1
    assert tolerant["rises_then_falls"] == material
    assert strict["largest_reversal_share"] == pytest.approx(dip / (0.95 - 0.55), rel=0.15)  # of the rise


def test_tile_bumps_on_a_fall_count_only_beyond_the_tolerance():
    sawtooth = {1: 1.0, 24: 0.78, 28: 0.83, 48: 0.62, 52: 0.66, 100: 0.45}  # bumps of 0.04-0.05 on a fall of 0.55
    c = one_curve(sawtooth)
    assert cu.falls_monotonically(c, TOLERANCE)["falls_monotonically"]
    strict = cu.falls_monotonically(c)
    assert not strict["falls_monotonically"] and strict["largest_rise_share"] < TOLERANCE
    steep = one_curve({1: 1.0, 24: 0.6, 40: 0.85, 100: 0.45})  # a rise of 0.25 on a fall of 0.55
    assert not cu.falls_monotonically(steep, TOLERANCE)["falls_monotonically"]


# --- Fig. 3, both readings --------------------------------------------------------------------------------


DENSE = {1: 0.99, 8: 0.85, 36: 0.62, 40: 0.67, 100: 0.44}
"""A dense efficiency falling by 0.55 with a 0.05 tile bump between B = 36 and 40."""


@pytest.mark.parametrize("moe, material, strict", [
    (with_dip(RISE_FALL, 0.03), cr.HOLDS, cr.FAILS),          # the shape, with a sub-tolerance dip and bump
    # (strictly, the dense model's tile bump of 0.05 fails every row)
    ({1: 0.9, 100: 0.9}, cr.INCONCLUSIVE, cr.FAILS),           # flat: no rise, no fall beyond noise
    ({1: 0.95, 8: 0.8, 100: 0.5}, cr.PARTLY_HOLDS, cr.FAILS),  # a monotone fall: the MoE's rise contradicted
    (DENSE, cr.PARTLY_HOLDS, cr.FAILS),                        # a curve copied from the dense model
])
def test_fig3_material_against_strict(moe, material, strict):
    verdict = v.efficiency_moe_rises_dense_falls(forward_study(piecewise(moe)), forward_study(piecewise(DENSE)))
    assert (verdict.status, verdict.strict.status) == (material, strict)
    assert verdict.numbers["dense_material_falls_monotonically"].all()  # the tile bump is below the tolerance


def test_fig3_within_noise_is_inconclusive_with_what_it_could_have_shown():
    small = {1: 0.90, 28: 0.92, 100: 0.905}  # a hump of 0.02 in noise of 0.05
    verdict = v.efficiency_moe_rises_dense_falls(forward_study(piecewise(small), noise=0.05),
                                                 forward_study(piecewise(DENSE)))
    parts = verdict.parts[verdict.parts["outcome"] == cr.NOT_SHOWN]
    assert verdict.status == cr.INCONCLUSIVE and (parts["detectable"] > 0.02).all()


def test_fig3_sets_eq8_bytes_beside_the_dip():
    """Qwen2-57B-A14B's shared expert is as wide as eight routed experts: bytes alone predict the efficiency falls
    from B = 1 to 2 at gamma = 2 (the verification of 3 tokens at B = 1 activates 21 experts, at B = 2 35)."""
    sidecar = {"settings": {"target": "qwen2-57b-a14b", "draft": "qwen2-0.5b", "layers": 28, "draft_layers": 24,
                            "width": 1.0, "vocab_size": 151646, "dtype": "bfloat16", "context": 64}}
    grid = np.array([1, 2, 4, 8, 16, 28, 48, 100], dtype=float)
    predicted = v.memory_bound_efficiency(sidecar, [1, 2], 2)
    assert predicted[1] < predicted[0] and 0.4 < predicted[1] < 0.7
    moe = forward_study(piecewise(with_dip(RISE_FALL, 0.03)), grid=grid)
    verdict = v.efficiency_moe_rises_dense_falls(moe, forward_study(piecewise(DENSE), grid=grid), sidecar=sidecar)
    row = verdict.numbers.set_index("gamma").loc[2]
    assert row[["predicted_first", "predicted_second"]].tolist() == pytest.approx(predicted.tolist())
    assert "Eq. 8" in narration.plain(verdict)  # the plain sentence sets the dip beside the bytes' prediction


# --- Fig. 2, 5, 6 -----------------------------------------------------------------------------------------------


def test_fig2_tolerates_a_dip_below_the_tolerance():
    speedup = piecewise(with_dip({1: 1.7, 24: 3.2, 100: 2.7}, 0.05))
    efficiency = piecewise(with_dip({1: 0.55, 24: 0.95, 100: 0.8}, 0.02))
    verdict = v.speedup_rises_then_falls(e2e_study(speedup, efficiency, noise=0.002))
    assert verdict.status == cr.HOLDS and verdict.strict.status == cr.FAILS
    assert (verdict.numbers["material_status"] == cr.HOLDS).all()


def test_fig5_normalises_acceptance_out():
    """Settings that differ only in acceptance, with each run at an acceptance of its own: as measured, the runs'
    spread exceeds the shape; normalised, every setting shows the same rise then fall."""
    systemic = piecewise({1: 0.45, 24: 0.75, 100: 0.6})  # speedup / (sigma (gamma + 1))
    rng = np.random.default_rng(3)
    parts = []
    for index, setting in enumerate(("humaneval T=0", "humaneval T=1", "mtbench T=0", "mtbench T=1")):
        for run in range(5):
            sigma = 0.9 - 0.1 * index + rng.normal(0, 0.08)  # a seed per run moves its acceptance
            rows = pd.DataFrame({"batch_size": GRID[::3], "run": run, "gamma": 4, "setting": setting, "sigma": sigma})
            rows["speedup"] = systemic(rows["batch_size"]) * sigma * 5 * (1 + rng.normal(0, 0.003, len(rows)))
            parts.append(rows)
    verdict = v.shape_holds_across_settings(pd.concat(parts, ignore_index=True))
    assert verdict.strict.status == cr.FAILS and not verdict.numbers["small_spread"].all()
    assert verdict.status == cr.HOLDS and verdict.numbers["normalised_rises_then_falls"].all()


def test_fig6_material_tolerates_a_small_early_rise_of_the_dense_pair():
    moe = e2e_study(lambda b: hump(b, 24), lambda b: hump(b, 24), noise=0.003)
    dense = e2e_study(piecewise({1: 2.0, 8: 2.1, 100: 1.0}), falling, noise=0.003)  # +5 % then halving
    verdict = v.moe_above_dense(moe, dense)
    assert verdict.strict.status == cr.FAILS and verdict.status == cr.HOLDS
    rising = e2e_study(piecewise({1: 1.2, 8: 1.9, 100: 1.0}), falling, noise=0.003)  # a rise as large as the fall
    assert v.moe_above_dense(moe, rising).status == cr.PARTLY_HOLDS


# --- Fig. 4 -------------------------------------------------------------------------------------------------------


def sparsity(peaks: dict, context: int = 64, gammas=(2, 4)) -> pd.DataFrame:
    """Curves K -> a function of B, one repeat each, at one context."""
    return pd.concat([sweep({"speedup": shape}, 1, 0.01, seed=k + g, gamma=g, num_experts_per_tok=k, context=context)
                      for g in gammas for k, shape in peaks.items()], ignore_index=True)


SIDECAR = {"settings": {"target": "qwen2-57b-a14b", "dtype": "bfloat16"}}
THEORY = {1: lambda b: 1.0 + 0.008 * b, 2: lambda b: hump(b, 80), 4: lambda b: hump(b, 48), 8: lambda b: hump(b, 12)}
"""K = 1, 2 rising towards their T_thres as the paper's theory predicts, K = 4, 8 peaking earlier."""


def test_fig4_short_context_keeps_k1_k2_in_the_ordering():
    verdict = sv.sparser_peaks_later_and_wider(sparsity(THEORY), sidecar=SIDECAR)
    parts = verdict.parts.set_index(["part", "where"])["outcome"]
    assert parts[("the later peak", "gamma = 2")] == cr.SHOWN
    assert parts[("K = 1's monotone fall", "gamma = 2")] == cr.UNTESTABLE
    assert parts[("the wider range", "gamma = 2")] == cr.SHOWN
    assert verdict.status == cr.PARTLY_HOLDS and verdict.strict.status == cr.FAILS  # strictly K = 1, 2 must fall
    falls = verdict.numbers[verdict.numbers["role"] == "monotone"]
    assert (falls["attention_context"] > 1e4).all() and (falls["study_context"] == 64).all()


def test_fig4_wider_range_is_untestable_where_the_densest_range_may_reach_past_the_grid():
    broad = {k: (lambda b, p=p: hump(b, p, 1.4, 0.3)) for k, p in {4: 48, 8: 24}.items()}
    verdict = sv.sparser_peaks_later_and_wider(sparsity(broad), sidecar=SIDECAR)
    assert set(verdict.parts.loc[verdict.parts["part"] == "the wider range", "outcome"]) == {cr.UNTESTABLE}


def test_fig4_attention_dominated_context_tests_the_fall_and_carves_k1_k2_out():
    paper = {1: lambda b: falling(b, 1.8, 0.006), 2: lambda b: falling(b, 1.7, 0.005), **{k: THEORY[k] for k in (4, 8)}}
    verdict = sv.sparser_peaks_later_and_wider(sparsity(paper, context=200_000), sidecar=SIDECAR)
    parts = verdict.parts.set_index(["part", "where"])["outcome"]
    assert parts[("K = 1's monotone fall", "gamma = 4")] == cr.SHOWN
    assert parts[("the later peak", "gamma = 4")] == cr.SHOWN
    short = sv.sparser_peaks_later_and_wider(sparsity(paper), sidecar=SIDECAR)  # the same curves at 64 tokens
    assert short.parts.set_index(["part", "where"])["outcome"][("the later peak", "gamma = 4")] == cr.CONTRADICTED


def test_attention_dominated_context_is_where_attention_reads_half_the_step():
    from moesd.predictor.forward import step_time
    from moesd.measure.regime import attention_dominated_context

    contexts = [attention_dominated_context("qwen2-57b-a14b", b, 1) for b in (1, 8, 32, 100)]
    assert np.all(np.diff(contexts) < 0)  # a larger batch reads more KV cache per step
    step = step_time("qwen2-57b-a14b", "H200", 1, 32, context=round(contexts[2]), top_k=1).bytes
    attention = float(step["attention"] + step["kv_cache"])
    assert attention == pytest.approx(sum(float(x) for x in step.values()) - attention, rel=1e-4)
    with pytest.raises(ValueError, match="dtype"):
        attention_dominated_context("qwen2-57b-a14b", 1, 1, "int3")


# --- Table 3 --------------------------------------------------------------------------------------------------------


DESIGN = pd.DataFrame([{"K": k, "gamma": g, "B": b} for k in (1, 2, 4, 8, 16, 32) for g in (2, 4) for b in GRID])


def with_points(table: pd.DataFrame) -> pd.DataFrame:
    """The paper's Table 3 with each sample's K/gamma/B points rebuilt by stride sampling its 228-run design."""
    return table.assign(points=[" ".join(f"{r.K:g}/{r.gamma:g}/{r.B:g}" for r in stride_sample(DESIGN, s).itertuples())
                                for s in table["stride"]])


def test_curve_coverage():
    one_curve_only = pd.DataFrame({"K": [8, 8], "gamma": [2, 2], "B": [1.0, 100.0]})
    assert sv.curve_coverage(one_curve_only, DESIGN) == pytest.approx(1 / 12)
    assert sv.curve_coverage(DESIGN, DESIGN) == 1
    to_48 = DESIGN[DESIGN["B"] <= 48]
    assert sv.curve_coverage(to_48, DESIGN) == pytest.approx((GRID <= 48).mean())
    parsed = sv.parse_points("8/2/1 4/4/100")
    assert parsed.to_dict("list") == {"K": [8.0, 4.0], "gamma": [2.0, 4.0], "B": [1.0, 100.0]}


def test_table3_per_curve_on_the_papers_table_and_against_it():
    table = with_points(paper_robustness())
    verdict = sv.poor_coverage_worst_fits(table)
    assert verdict.numbers.loc[verdict.numbers["m"] == 12, "coverage"].iloc[0] < verdict.numbers.attrs["median_coverage"]
    assert verdict.status == cr.HOLDS and verdict.numbers.attrs["coverage_p_value"] < 0.05
    # the worst fit given to the best covering sample contradicts the claim's first part
    flipped = table.assign(mse=np.where(table["m"] == 228, 9.0, table["mse"]))
    assert sv.poor_coverage_worst_fits(flipped).parts.set_index("part").loc[
        "the worst fit covering poorly", "outcome"] == cr.CONTRADICTED
    assert sv.poor_coverage_worst_fits(table.drop(columns="points")).status == cr.UNTESTABLE


# --- the regime of a study -------------------------------------------------------------------------------------------


def test_study_regime_takes_the_products_share_where_the_regime_check_measured_it():
    from moesd.measure.regime import IN_REGIME_SHARE, RegimeCheck, study_regime

    sidecar = {"streaming_share": {"share": 0.25}, "settings": {"target": "qwen2-57b-a14b", "dtype": "bfloat16"}}
    rows = pd.DataFrame()
    assert not study_regime(rows, sidecar).in_regime  # a quarter of the step at STREAM, nothing else known
    steps = pd.DataFrame([{"model": "qwen2-57b-a14b", "dtype": "bfloat16", "products_share": 1.03}])
    check = RegimeCheck(pd.DataFrame(), pd.DataFrame(), steps, {})
    regime = study_regime(rows, sidecar, check)
    assert regime.in_regime and regime.weight_share == 1.0 and regime.streaming_share == 0.25
    other = {**sidecar, "settings": {"target": "qwen2-57b-a14b", "dtype": "float32"}}
    assert not study_regime(rows, other, check).in_regime  # the check timed another dtype
    assert study_regime(rows, {"streaming_share": {"share": IN_REGIME_SHARE}}).in_regime


def test_stride_points_rebuild_the_papers_samples_curve_by_curve():
    from moesd.model.samples import PAPER_CURVES, stride_coverage, stride_points

    points = stride_points(GRID, PAPER_CURVES)
    coverage = stride_coverage(GRID, PAPER_CURVES)
    for stride in (25, 20, 18, 1):
        sample = sv.parse_points(points[stride])
        assert " ".join(f"{b:g}" for b in sorted(sample["B"].unique())) == coverage[stride]
        assert len(sample) == -(-len(GRID) * PAPER_CURVES // stride)
    # m = 12 (stride 20): one point on each curve, all at B <= 40: the per-curve ranges are single points
    twelve = sv.parse_points(points[20])
    assert twelve.groupby("K").size().eq(1).all() and twelve["B"].max() == 40


def test_eq8_bytes_make_k1_dip_then_rise_below_its_threshold():
    """With a shared expert as wide as eight routed experts, bytes alone make K = 1's efficiency fall while a decode
    step's few new experts are outweighed by the shared one, then rise towards T_thres (191)."""
    sidecar = {"settings": {"target": "qwen2-57b-a14b", "draft": "qwen2-0.5b", "layers": 28, "draft_layers": 24,
                            "width": 1.0, "vocab_size": 151646, "dtype": "bfloat16", "context": 64}}
    k1 = v.memory_bound_efficiency(sidecar, [1, 8, 100], 4, top_k=1)
    assert k1[1] < k1[0] and k1[2] > k1[1] and (k1 <= 1).all()
    k8 = v.memory_bound_efficiency(sidecar, [1, 8, 100], 4)
    assert k8[0] < k8[1]  # K = 8 rises from B = 1: its verification adds far more experts


def test_table3_tests_gives_each_reading_its_numbers():
    from scipy.stats import mannwhitneyu

    table = with_points(paper_robustness())
    per_curve, pooled = sv.poor_coverage_worst_fits(table), sv.poor_coverage_worst_fits(paper_robustness())
    rows = sv.table3_tests({"per curve": per_curve, "pooled only": pooled}).set_index("study")
    first = rows.loc["per curve"]
    assert first["worst m"] == 12  # the paper's worst fit
    assert first["worst coverage"] < first["median coverage"] == per_curve.numbers.attrs["median_coverage"]
    assert first["rank correlation"] < 0 and first["rank p"] < 0.05
    judged = per_curve.numbers[per_curve.numbers["judged"]]
    poor, well = judged.loc[judged["poor"], "mse"], judged.loc[~judged["poor"], "mse"]
    scatter = 1.4826 * (well - well.median()).abs().median()
    assert first["excess / scatter"] == pytest.approx((poor.median() - well.median()) / scatter)
    assert first["Mann-Whitney p"] == pytest.approx(mannwhitneyu(poor, well, alternative="greater").pvalue)
    assert np.isnan(rows.loc["pooled only", ["worst coverage", "rank correlation", "rank p"]].astype(float)).all()
    even = sv.poor_coverage_worst_fits(paper_robustness().query("m >= 19"))  # no poorly covering sample
    assert np.isnan(sv.table3_tests({"even": even}).loc[0, ["excess / scatter", "Mann-Whitney p"]].astype(float)).all()
