"""Verdicts on the paper's claims of the sparsity study: Fig. 4 (sparser peaks later and wider) and Table 3 (the
worst fits cover the batch sizes poorly).

As :mod:`moesd.paper.verdicts`: one function per claim, both readings of :mod:`moesd.paper.criteria`, a
:class:`~moesd.paper.criteria.Verdict` with the numbers, which :mod:`moesd.narration` words.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from moesd.paper.criteria import (CLAIM, CONTRADICTED, NO_ROBUSTNESS, NO_STUDY, NOT_SHOWN, SHOWN, UNTESTABLE,
                                  Verdict, fall_outcome, growth_outcome)
from moesd.paper.curves import (MIN_BATCH_SIZES, NOISE_Z, curve, falls_monotonically, growth_detectable,
                                half_power_width, peak_region, spearman_detectable)
from moesd.paper.verdicts import READINGS, judged, new_notes, note, rows_from, untestable


def attention_context(sidecar: dict | None, top_k: int, batch_size: int) -> float:
    """The context from which attention dominates a decode step of the sidecar's target at ``top_k`` and ``batch_size``.

    The paper puts K = 1, 2's monotone fall down to the model becoming attention-dominated (Amdahl). A study can
    test that explanation only where attention (its projections and the KV cache it reads) is at least half of what
    a step reads: :func:`moesd.measure.regime.attention_dominated_context` of the full-depth target (the paper's
    model, whatever depth a sweep cut it to). NaN without a sidecar naming a known target.
    """
    from moesd.measure.regime import attention_dominated_context

    target = (sidecar or {}).get("settings", {}).get("target")
    dtype = (sidecar or {}).get("settings", {}).get("dtype", "bfloat16")
    try:
        return attention_dominated_context(target, batch_size, top_k, dtype)
    except (KeyError, ValueError, TypeError):
        return float("nan")


def sparser_peaks_later_and_wider(sparsity: pd.DataFrame | None, monotone_ks=(1, 2), from_batch_size=None,
                                  sidecar: dict | None = None) -> Verdict:
    """Fig. 4: as K falls the peak batch size grows and the range above x/sqrt(2) widens; K = 1, 2 only fall.

    Input: the sparsity study (``batch_size``, ``gamma``, ``num_experts_per_tok`` (K), ``speedup``, ``context``),
    from ``from_batch_size`` on. The paper plots speedups rescaled by ``sigma_{K=8} / sigma_K``, one constant per
    (K, gamma) curve; every quantity below (peak position, the range relative to the curve's own peak x, margins
    relative to the noise) is unchanged when a curve is scaled, so the raw speedup gives the same verdict.

    Per gamma, with K ordered from densest to sparsest:

    * **the later peak**: the peak regions (:func:`~moesd.paper.curves.peak_region`) grow beyond noise
      (:func:`~moesd.paper.criteria.growth_outcome`) over the K outside ``monotone_ks`` (strict) or over every K
      measured (material), but for a K of ``monotone_ks`` whose fall is tested below: where attention dominates,
      the paper carves K = 1, 2 out of its sparsity argument (Amdahl), and elsewhere its theory puts their peaks
      latest (at their T_thres);
    * **the wider range**: the width with speedup >= x/sqrt(2) (:func:`~moesd.paper.curves.half_power_width`, with
      its noise interval) grows the same way; not testable where the densest K's range may reach past the largest
      batch size measured (the grid ends before the range does);
    * **K = 1, 2's fall**: strict, each K in ``monotone_ks``
      :func:`~moesd.paper.curves.falls_monotonically`; material, the paper's explanation of that fall (attention
      dominating the step) needs a context of :func:`attention_context` tokens at the study's largest batch size:
      the part is tested (with the tolerance) only where the study's ``context`` reaches it, and is not testable
      here otherwise, with both contexts in the numbers (``attention_context``, ``study_context``).
    """

    claim = "Fig. 4"
    options = {"monotone_ks": tuple(monotone_ks), "from_batch_size": from_batch_size}
    sparsity = rows_from(sparsity, from_batch_size)
    if sparsity is None or sparsity.empty:
        return untestable(claim, NO_STUDY, studies=("sparsity",), **options)
    rows, notes = [], new_notes()
    context = float(sparsity["context"].max()) if "context" in sparsity else float("nan")
    for gamma, group in sparsity.groupby("gamma"):
        curves = {int(k): curve(rows_k, "speedup") for k, rows_k in group.groupby("num_experts_per_tok")}
        curves = {k: c for k, c in sorted(curves.items(), reverse=True) if len(c.batch_size) >= MIN_BATCH_SIZES}
        where = f"gamma = {gamma}"
        rows += [{"gamma": gamma, "where": where, **row} for row in _curve_rows(curves, monotone_ks)]
        carved_out = []
        for k in monotone_ks:
            notes["strict"].append(_strict_fall(curves.get(k), k, where))
            notes["material"].append(_material_fall(curves.get(k), k, where, rows, context, sidecar))
            if notes["material"][-1][0] != UNTESTABLE:
                carved_out.append(k)
        shaped = {k: c for k, c in curves.items() if k not in monotone_ks}
        ordered = {k: c for k, c in curves.items() if k not in carved_out}
        for reading, chosen in (("strict", shaped), ("material", ordered)):
            notes[reading] += _ordering_notes(chosen, where)
    return judged(claim, rows, notes, **options)


def _curve_rows(curves: dict, monotone_ks) -> list:
    """One numbers row per K: its peak region, its range above x/sqrt(2) and, for ``monotone_ks``, its fall."""
    rows = []
    for k, c in curves.items():
        low, high = peak_region(c)
        width, narrowest, widest = half_power_width(c)
        level = c.value[c.peak_index] / math.sqrt(2)
        row = {"K": k, "role": "monotone" if k in monotone_ks else "shaped",
               "peak_batch_size": float(c.batch_size[c.peak_index]), "peak": float(c.value[c.peak_index]),
               "peak_low": low, "peak_high": high, "width": width, "width_low": narrowest, "width_high": widest,
               "reaches_largest_B": bool((c.value[c.peak_index:] >= level).all()), "noise": c.noise,
               "largest_batch_size": float(c.batch_size[-1])}
        if k in monotone_ks:
            row.update(falls_monotonically(c))
            row.update({f"material_{key}": value for key, value in falls_monotonically(c, READINGS["material"]).items()
                        if key in ("falls_monotonically", "rises_beyond_noise")})
        rows.append(row)
    return rows


def _strict_fall(c, k: int, where: str) -> tuple:
    if c is None:
        return note(UNTESTABLE, f"K = {k}'s monotone fall", where)
    fall = falls_monotonically(c)
    return note(fall_outcome(fall), f"K = {k}'s monotone fall", where, fall["fall_margin"])


def _material_fall(c, k: int, where: str, rows: list, context: float, sidecar) -> tuple:
    """K's fall, tested only where the study's context makes attention dominate (see the caller)."""
    if c is None:
        return note(UNTESTABLE, f"K = {k}'s monotone fall", where)
    needed = attention_context(sidecar, k, int(c.batch_size[-1]))
    row = next(r for r in rows if r["where"] == where and r["K"] == k)
    row.update(attention_context=needed, study_context=context)
    if not context >= needed:  # NaN (no model, no context) is untestable too
        return note(UNTESTABLE, f"K = {k}'s monotone fall", where)
    fall = falls_monotonically(c, READINGS["material"])
    return note(fall_outcome(fall), f"K = {k}'s monotone fall", where, fall["fall_margin"])


def _ordering_notes(curves: dict, where: str) -> list:
    """The later peak and the wider range over ``curves`` (K -> Curve, densest first)."""
    if len(curves) < 2:
        return [note(UNTESTABLE, "the peak and range ordering", where)]
    peaks = [peak_region(c) for c in curves.values()]
    widths = [half_power_width(c)[1:] for c in curves.values()]
    return [note(growth_outcome(peaks), "the later peak", where, growth_detectable(peaks), "B"),
            note(growth_outcome(widths), "the wider range", where, growth_detectable(widths), "B")]


# ---- Table 3 -----------------------------------------------------------------------------------------


def longest_missing_run(sample, grid) -> int:
    """Longest run of consecutive grid batch sizes absent from ``sample`` (ends included)."""
    present = np.isin(np.asarray(grid, dtype=float), np.asarray(sample, dtype=float))
    longest = run = 0
    for here in present:
        run = 0 if here else run + 1
        longest = max(longest, run)
    return longest


def parse_points(text: str) -> pd.DataFrame:
    """A sample's measured points from a robustness row's ``points`` string (``"K/gamma/B ..."``): K, gamma, B."""
    values = [tuple(float(x) for x in point.split("/")) for point in str(text).split()]
    return pd.DataFrame(values, columns=["K", "gamma", "B"])


def curve_coverage(points: pd.DataFrame, design: pd.DataFrame) -> float:
    """How evenly a sample covers the batch sizes of each curve of a design, in [0, 1].

    For each (K, gamma) curve of ``design`` (columns K, gamma, B), the share of its batch sizes that lie within
    the range ``[min B, max B]`` the sample measures on that curve (0 when the sample has no point on it); the
    mean over curves. A sample that stops at B = 48 on every curve of a grid to 100 covers each curve's range
    to 48 only, however many points it has.
    """
    shares = []
    for (k, gamma), grid in design.groupby(["K", "gamma"])["B"]:
        sampled = points.loc[(points["K"] == k) & (points["gamma"] == gamma), "B"]
        grid = np.unique(grid.to_numpy(float))
        inside = (grid >= sampled.min()) & (grid <= sampled.max()) if len(sampled) else np.zeros(len(grid), bool)
        shares.append(inside.mean())
    return float(np.mean(shares))


def poor_coverage_worst_fits(robustness: pd.DataFrame | None, batch_sizes=None, parameters: int = 10,
                             design: pd.DataFrame | None = None) -> Verdict:
    """Table 3: the worst fits of Algorithm 1 are those whose samples cover the batch sizes poorly.

    Input: :func:`moesd.model.diagnostics.robustness_study` (one row per sample: ``m``, ``mse`` over every
    measurement, ``batch_sizes`` of the sample as a space-separated string, and ``points``, its ``K/gamma/B``
    points). Only samples with more points than the model's ``parameters`` are judged (the paper puts m = 10's
    error down to too few points).

    * **strict** (coverage pooled over curves): a sample's *gap* is its longest run of consecutive grid batch sizes
      left out (:func:`longest_missing_run`; ``batch_sizes`` the grid, default every batch size any sample holds);
      it covers *poorly* when that gap is longer than an even spread of as many points would leave,
      ``ceil((n - k) / (k - 1))`` with ``n`` grid batch sizes and ``k = min(m, n)``. The worst fit (largest MSE)
      covers poorly, and the poorly covering samples' median MSE exceeds the others' by more than ``NOISE_Z`` times
      the scatter of the others' MSEs (``1.4826 * MAD``). Not testable with fewer than one poorly and three well
      covering samples.
    * **material** (coverage per curve, :func:`curve_coverage` over ``design``, default the union of the samples'
      points): the worst fit's coverage lies below the median coverage of the judged samples (above it
      contradicts), and coverage and MSE are negatively rank-correlated at the one-sided 5 % level (positively at
      that level contradicts). Not testable without ``points`` or with fewer than five judged samples.
    """

    claim = "Table 3"
    if robustness is None or robustness.empty:
        return untestable(claim, NO_ROBUSTNESS, parameters=parameters)
    table = _pooled_coverage(robustness, batch_sizes, parameters)
    notes = new_notes()
    used = table[table["judged"]]
    poor, well = used[used["poor"]], used[~used["poor"]]
    where = f"m > {parameters}"
    if len(poor) < 1 or len(well) < 3:
        notes["strict"].append(note(UNTESTABLE, "the pooled coverage comparison", where))
    else:
        worst = used.loc[used["mse"].idxmax()]
        scatter = 1.4826 * float((well["mse"] - well["mse"].median()).abs().median())
        excess = float(poor["mse"].median() - well["mse"].median())
        table.attrs.update(pooled_scatter=scatter, pooled_excess=excess)
        notes["strict"] += [note(SHOWN if worst["poor"] else CONTRADICTED, "the worst fit covering poorly", where),
                            note(SHOWN if excess > NOISE_Z * scatter else NOT_SHOWN,
                                 "the poorly covering samples' larger error", where, NOISE_Z * scatter, "MSE")]
    notes["material"] += _per_curve_notes(table, robustness, design, where)
    return judged(claim, table, notes, parameters=parameters)


def _pooled_coverage(robustness: pd.DataFrame, batch_sizes, parameters: int) -> pd.DataFrame:
    """The strict reading's table: stride, m, mse, gap, even_gap, poor, judged."""
    samples = [np.array(str(s).split(), dtype=float) for s in robustness["batch_sizes"]]
    grid = np.unique(np.concatenate(samples) if batch_sizes is None else np.asarray(batch_sizes, dtype=float))
    table = robustness[["stride", "m", "mse"]].copy()
    table["gap"] = [longest_missing_run(s, grid) for s in samples]
    k = np.minimum(table["m"], len(grid))
    table["even_gap"] = np.ceil((len(grid) - k) / np.maximum(k - 1, 1)).astype(int)
    table["poor"] = table["gap"] > table["even_gap"]
    table["judged"] = table["m"] > parameters
    return table


def _per_curve_notes(table: pd.DataFrame, robustness: pd.DataFrame, design, where: str) -> list:
    """The material reading's parts; adds the ``coverage`` column to ``table``."""
    from scipy.stats import spearmanr

    if "points" not in robustness:
        return [note(UNTESTABLE, "the per-curve coverage comparison", where)]
    samples = [parse_points(text) for text in robustness["points"]]
    design = pd.concat(samples).drop_duplicates() if design is None else design
    table["coverage"] = [curve_coverage(sample, design) for sample in samples]
    used = table[table["judged"]]
    if len(used) < 5:
        return [note(UNTESTABLE, "the per-curve coverage comparison", where)]
    worst = used.loc[used["mse"].idxmax()]
    median = float(used["coverage"].median())
    worst_outcome = SHOWN if worst["coverage"] < median else CONTRADICTED if worst["coverage"] > median else NOT_SHOWN
    less = spearmanr(used["coverage"], used["mse"], alternative="less")
    greater = spearmanr(used["coverage"], used["mse"], alternative="greater")
    table.attrs.update(coverage_correlation=float(less.statistic), coverage_p_value=float(less.pvalue),
                       median_coverage=median)
    error_outcome = SHOWN if less.pvalue < 0.05 else CONTRADICTED if greater.pvalue < 0.05 else NOT_SHOWN
    return [note(worst_outcome, "the worst fit covering poorly", where, role=CLAIM),
            note(error_outcome, "the poorly covering samples' larger error", where,
                 spearman_detectable(len(used)), "rank correlation", role=CLAIM)]


def table3_tests(verdicts) -> pd.DataFrame:
    """The numbers behind Table 3's verdicts (:func:`poor_coverage_worst_fits`), one row per study.

    Parameters
    ----------
    verdicts : mapping of str to Verdict
        A label per study (``"this CPU"``, ``"paper"``...) and its Table 3 verdict.

    Returns
    -------
    pandas.DataFrame
        One row per study: ``study``; ``worst m`` (the judged sample of largest MSE); the per-curve reading's
        ``worst coverage`` (that sample's share of its curves' batch-size ranges), ``median coverage`` (of the judged
        samples), ``rank correlation`` of coverage with MSE and its one-sided ``rank p``; the pooled reading's
        ``excess / scatter`` (as the verdict computed it: the poorly covering samples' median MSE over the
        others', in units of the others' scatter, ``1.4826 * MAD``; the claim needs more than ``NOISE_Z``) and ``Mann-Whitney p`` (one-sided: the
        poorly covering MSEs rank above the others). NaN where a study has no such number (no per-curve
        coverage, fewer than one poorly or three evenly covering samples).
    """
    from scipy.stats import mannwhitneyu

    rows = []
    for label, verdict in verdicts.items():
        numbers = verdict.numbers
        judged_rows = numbers[numbers["judged"]]
        worst = judged_rows.loc[judged_rows["mse"].idxmax()]
        poor, well = judged_rows.loc[judged_rows["poor"], "mse"], judged_rows.loc[~judged_rows["poor"], "mse"]
        excess = p_value = math.nan
        if "pooled_scatter" in numbers.attrs:
            scatter = numbers.attrs["pooled_scatter"]
            excess = numbers.attrs["pooled_excess"] / scatter if scatter > 0 else math.inf
            p_value = float(mannwhitneyu(poor, well, alternative="greater").pvalue)
        rows.append({"study": label, "worst m": int(worst["m"]),
                     "worst coverage": float(worst["coverage"]) if "coverage" in numbers else math.nan,
                     "median coverage": numbers.attrs.get("median_coverage", math.nan),
                     "rank correlation": numbers.attrs.get("coverage_correlation", math.nan),
                     "rank p": numbers.attrs.get("coverage_p_value", math.nan),
                     "excess / scatter": excess, "Mann-Whitney p": p_value})
    return pd.DataFrame(rows)
