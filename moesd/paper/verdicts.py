"""Verdicts on the paper's measured claims, computed from this project's measurements.

One function per claim (Figs. 2-6 and Table 3 of the paper). Each returns a :class:`Verdict`: the
status, the numbers behind it (a DataFrame), its parts that do not hold with the smallest effect
the study could have detected for each, and one sentence that states it with those numbers, for a
chapter to print. :func:`moesd.paper.scorecard.scorecard` runs every claim on one device folder of ``data/measurements/``.

A claim is made of parts (a rise, a fall, an ordering...). Each part is shown by the data, or
:data:`CONTRADICTED` by them (its opposite is beyond noise), or :data:`NOT_SHOWN` (within noise
either way), or not measurable. The claim :data:`HOLDS` when every part is shown, **does not hold**
(:data:`FAILS`) when some part is contradicted, is :data:`INCONCLUSIVE` when no part is contradicted
and some part is within noise (then the *smallest detectable effect* of that part, the size the
effect would have needed to count, says what the study could have shown), and is
:data:`UNMEASURABLE` when a part lacks the data. The inconclusive status and the detectable effects
were added on 2026-11-26, before the studies at real widths were measured; the criteria that decide
each part did not change.

The noise model and the criteria's building blocks live in :mod:`moesd.paper.criteria`, the sentences in
:mod:`moesd.narration`, and the scorecard of a device folder in :mod:`moesd.paper.scorecard`.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from moesd.paper.criteria import (CONTRADICTED, MIN_BATCH_SIZES, NOISE_Z, NOT_SHOWN,
                                   UNMEASURABLE, Verdict, combine, curve, fall_outcome, falls_monotonically,
                                   growth_detectable, growth_status, half_power_width, peak_region, rises_then_falls,
                                   shape_detectable, shape_outcome, status_of, tracks, tracks_outcome)
from moesd.narration import (FEWER_THAN_TWO_SETTINGS, NO_COMMON_GAMMA, NO_ROBUSTNESS, fig2_details, fig3_details,
                                   fig4_details, fig4_gamma, fig5_details, fig6_details, judged_from, no_common_pass,
                                   no_study, number, table3_details, table3_too_few, verdict)

CLAIMS = {
    "Fig. 2": "the MoE speedup rises then falls with B, and target efficiency tracks that shape",
    "Fig. 3": "MoE target efficiency rises then falls with B, the dense model's only falls",
    "Fig. 4": ("as K falls the peak batch size grows and the range with speedup >= x/sqrt(2) widens; "
               "K = 1, 2 fall monotonically"),
    "Fig. 5": "the rise-then-fall holds in every setting, with small run-to-run spread",
    "Fig. 6": "the MoE's SD speedup is above the dense pair's for B > 16, and the dense pair's only falls",
    "Table 3": "the worst fits are those whose samples cover the batch sizes poorly",
}
"""The paper's claims this module judges, by figure or table, as one statement each."""


def _from_batch_size(frame: pd.DataFrame | None, smallest) -> pd.DataFrame | None:
    """The rows of a study with ``batch_size >= smallest`` (all rows when ``smallest`` is None)."""
    return frame if frame is None or smallest is None else frame[frame["batch_size"] >= smallest]


def speedup_rises_then_falls(e2e: pd.DataFrame | None, from_batch_size=None) -> Verdict:
    """Fig. 2: the MoE SD speedup rises then falls with batch size, and target efficiency tracks that shape.

    Criterion, for every gamma of the e2e study (columns ``batch_size``, ``gamma``, ``run``,
    ``speedup``, ``target_efficiency``; one row per point and repeat), over the batch sizes from
    ``from_batch_size`` on (default: all):

    * the speedup curve :func:`rises_then_falls`: its peak is interior, both the rise from the
      smallest batch size and the fall to the largest exceed the noise margin, and no reversal
      exceeds it;
    * the target-efficiency curve (the same runs' ``target_efficiency``: a decode step's time over
      the verification pass's) rises then falls in the same sense (the paper: it "tracks this
      shape"; columns ``efficiency_*``), and
    * it :func:`tracks` the speedup: positive rank correlation at the 5 % level and peak regions
      that overlap. (A follower flat up to its peak and falling after it would pass this last part
      alone.)

    Holds when all hold at every gamma; not measurable without the study or with fewer than
    :data:`MIN_BATCH_SIZES` batch sizes at some gamma.
    """
    claim, statement = "Fig. 2", judged_from(CLAIMS["Fig. 2"], from_batch_size)
    e2e = _from_batch_size(e2e, from_batch_size)
    if e2e is None or e2e.empty:
        return verdict(claim, statement, UNMEASURABLE, [], no_study("e2e"))
    rows, notes = [], []
    for gamma, group in e2e.groupby("gamma"):
        speed, efficiency = curve(group, "speedup"), curve(group, "target_efficiency")
        where = f"gamma = {gamma}"
        if min(len(speed.batch_size), len(efficiency.batch_size)) < MIN_BATCH_SIZES:
            rows.append({"gamma": gamma, "status": UNMEASURABLE})
            notes.append((UNMEASURABLE, "the curves", where))
            continue
        shape, efficiency_shape = rises_then_falls(speed), rises_then_falls(efficiency)
        track = tracks(speed, efficiency)
        parts = ((shape_outcome(shape, speed), "the speedup's rise then fall", shape_detectable(shape), ""),
                 (shape_outcome(efficiency_shape, efficiency), "the efficiency's rise then fall",
                  shape_detectable(efficiency_shape), ""),
                 (tracks_outcome(track), "the efficiency tracking the speedup", track["detectable_correlation"],
                  "rank correlation"))
        status = status_of(outcome for outcome, *_ in parts)
        rows.append({"gamma": gamma, "status": status, **shape,
                     **{f"efficiency_{k}": value for k, value in efficiency_shape.items()}, **track,
                     "noise": speed.noise})
        notes += [(outcome, part, where, detectable if outcome == NOT_SHOWN else None, unit)
                  for outcome, part, detectable, unit in parts if outcome]
    status = combine(r["status"] for r in rows)
    return verdict(claim, statement, status, rows, fig2_details(rows, MIN_BATCH_SIZES), notes)


def forward_efficiency(forward: pd.DataFrame, gamma: int) -> pd.DataFrame:
    """Target efficiency ``T_T(B, 1) / T_T(B, gamma + 1)`` per run and batch size, from a forward study.

    The verification pass scores ``gamma + 1`` positions per sequence (as in
    :func:`moesd.measure.analysis.forward_target_efficiency`); the ratio is taken within each run, so
    the runs are the repeats of the curve. Columns ``run``, ``batch_size``, ``efficiency``; empty
    when the study has no pass of 1 or of ``gamma + 1`` tokens per sequence.
    """
    target = forward[forward["role"] == "target"]
    seconds = target.groupby(["run", "batch_size", "tokens"])["seconds"].median().unstack("tokens")
    if 1 not in seconds.columns or gamma + 1 not in seconds.columns:
        return pd.DataFrame(columns=["run", "batch_size", "efficiency"])
    return (seconds[1] / seconds[gamma + 1]).rename("efficiency").dropna().reset_index()


def efficiency_moe_rises_dense_falls(forward: pd.DataFrame | None, dense_forward: pd.DataFrame | None,
                                     gammas=(2, 3, 4), from_batch_size=None) -> Verdict:
    """Fig. 3: MoE target efficiency rises then falls with batch size; the dense model's only falls.

    Criterion, for every gamma in ``gammas`` that both forward studies can give (a pass of
    ``gamma + 1`` tokens per sequence), with the efficiency ``T_T(B, 1) / T_T(B, gamma + 1)`` of each
    run (:func:`forward_efficiency`) as the repeats, over the batch sizes from ``from_batch_size`` on
    (default: all) for both models:

    * the MoE curve :func:`rises_then_falls` (interior peak, rise and fall each beyond noise, no
      reversal beyond noise);
    * the dense curve :func:`falls_monotonically` (no later point above an earlier one beyond
      noise, and an overall fall beyond noise). A dense curve that stays flat within noise fails:
      the claim is that it falls.

    Holds when both hold at every such gamma; not measurable without either study, with no common
    gamma, or with fewer than :data:`MIN_BATCH_SIZES` batch sizes.
    """
    claim, statement = "Fig. 3", judged_from(CLAIMS["Fig. 3"], from_batch_size)
    forward, dense_forward = _from_batch_size(forward, from_batch_size), _from_batch_size(dense_forward, from_batch_size)
    if forward is None or dense_forward is None or forward.empty or dense_forward.empty:
        missing = " and ".join(name for name, frame in (("forward", forward), ("dense_forward", dense_forward))
                               if frame is None or frame.empty)
        return verdict(claim, statement, UNMEASURABLE, [], no_study(missing))
    rows, notes = [], []
    for gamma in gammas:
        moe, dense = forward_efficiency(forward, gamma), forward_efficiency(dense_forward, gamma)
        if moe.empty or dense.empty:
            continue
        moe_curve, dense_curve = curve(moe, "efficiency"), curve(dense, "efficiency")
        if min(len(moe_curve.batch_size), len(dense_curve.batch_size)) < MIN_BATCH_SIZES:
            rows.append({"gamma": gamma, "status": UNMEASURABLE})
            notes.append((UNMEASURABLE, "the curves", f"gamma = {gamma}"))
            continue
        shape, fall = rises_then_falls(moe_curve), falls_monotonically(dense_curve)
        parts = ((shape_outcome(shape, moe_curve), "the MoE efficiency's rise then fall", shape_detectable(shape)),
                 (fall_outcome(fall), "the dense efficiency's fall", fall["fall_margin"]))
        notes += [(outcome, part, f"gamma = {gamma}", detectable if outcome == NOT_SHOWN else None, "")
                  for outcome, part, detectable in parts if outcome]
        status = status_of(outcome for outcome, *_ in parts)
        rows.append({"gamma": gamma, "status": status, **{f"moe_{k}": v for k, v in shape.items()},
                     **{f"dense_{k}": v for k, v in fall.items()}, "noise": moe_curve.noise,
                     "dense_noise": dense_curve.noise})
    if not rows:
        return verdict(claim, statement, UNMEASURABLE, [], no_common_pass(gammas))
    return verdict(claim, statement, combine(r["status"] for r in rows), rows, fig3_details(rows, MIN_BATCH_SIZES),
                   notes)


def sparser_peaks_later_and_wider(sparsity: pd.DataFrame | None, monotone_ks=(1, 2), from_batch_size=None) -> Verdict:
    """Fig. 4: as K falls, the peak batch size grows and the range above x/sqrt(2) widens; K = 1, 2 only fall.

    Input: the sparsity study (columns ``batch_size``, ``gamma``, ``num_experts_per_tok`` (K),
    ``speedup``; often one repeat, so the noise is the neighbour scatter). The paper plots speedups
    rescaled by ``sigma_{K=8} / sigma_K`` (:func:`moesd.model.measurements.sigma_adjusted_speedup`); that factor is
    one constant per (K, gamma) curve, and every quantity below (peak position, the range relative
    to the curve's own peak x, margins) is unchanged when a curve is scaled, so the raw speedup gives
    the same verdict and needs no K = 8 run.

    Criterion, for every gamma, over the batch sizes from ``from_batch_size`` on (default: all):

    * each K in ``monotone_ks`` (the paper's K = 1, 2, attention-dominated by Amdahl's law)
      :func:`falls_monotonically`;
    * over the other K ("shaped" K, at least two), ordered from densest to sparsest, the peak
      region (:func:`peak_region`: batch sizes within noise of the peak) :func:`grows_beyond_noise`:
      no step to a sparser K moves it wholly below the denser K's, and the sparsest K's lies wholly
      above the densest K's;
    * over the same K, the width of the range with speedup >= x/sqrt(2) (x the peak of that K and
      gamma; :func:`half_power_width`, in batch sizes, with its noise interval from raising and
      lowering the level by the noise) grows beyond noise in the same sense (:func:`growth_status`).
      A range that may reach beyond the largest batch size measured has no upper bound
      (``width_high`` infinite): it cannot be shown narrower than another, so when the densest K's
      range has none, the width part is not measurable, unless a step reverses beyond noise.

    Holds when every part holds at every gamma; does not hold when any measurable part fails; not
    measurable when a part lacks data (no study, a K of ``monotone_ks`` missing, fewer than two
    shaped K, fewer than :data:`MIN_BATCH_SIZES` batch sizes for a curve, or the densest K's range
    above x/sqrt(2) unbounded as above).
    """
    claim = "Fig. 4"
    statement = judged_from(CLAIMS[claim].replace("1, 2", ", ".join(map(str, monotone_ks))), from_batch_size)
    sparsity = _from_batch_size(sparsity, from_batch_size)
    if sparsity is None or sparsity.empty:
        return verdict(claim, statement, UNMEASURABLE, [], no_study("sparsity"))
    rows, statuses, phrases, notes = [], [], {}, []
    for gamma, group in sparsity.groupby("gamma"):
        curves = {int(k): curve(rows_k, "speedup") for k, rows_k in group.groupby("num_experts_per_tok")}
        curves = {k: c for k, c in curves.items() if len(c.batch_size) >= MIN_BATCH_SIZES}
        gamma_rows, status, phrase, gamma_notes = _sparsity_at_gamma(curves, monotone_ks)
        rows += [{"gamma": gamma, **row} for row in gamma_rows]
        statuses.append(status)
        phrases[gamma] = phrase
        notes += [(outcome, part, f"gamma = {gamma}", *rest) for outcome, part, *rest in gamma_notes]
    return verdict(claim, statement, combine(statuses), rows, fig4_details(phrases, rows), notes)


def _sparsity_at_gamma(curves: dict, monotone_ks) -> tuple[list, str, str, list]:
    """Rows, status, phrase and summary notes of :func:`sparser_peaks_later_and_wider` for one gamma's K -> Curve.

    Notes are ``(outcome, part, detectable, unit)`` tuples: the caller names the gamma.
    """
    rows, parts, notes = [], [], []
    for k in monotone_ks:
        if k not in curves:
            parts.append(UNMEASURABLE)
            notes.append((UNMEASURABLE, f"K = {k}'s monotone fall", None, ""))
            continue
        fall = falls_monotonically(curves[k])
        parts.append(status_of([fall_outcome(fall)]))
        if fall_outcome(fall):
            notes.append((fall_outcome(fall), f"K = {k}'s monotone fall",
                          fall["fall_margin"] if fall_outcome(fall) == NOT_SHOWN else None, ""))
        rows.append({"K": k, "role": "monotone", **fall, "noise": curves[k].noise})
    shaped = sorted((k for k in curves if k not in monotone_ks), reverse=True)
    if len(shaped) < 2:
        parts.append(UNMEASURABLE)
        notes.append((UNMEASURABLE, "the peak and range ordering", None, ""))
        return rows, combine(parts), fig4_gamma(rows, monotone_ks, MIN_BATCH_SIZES), notes
    peaks, widths = [], []
    for k in shaped:
        c = curves[k]
        low, high = peak_region(c)
        width, narrowest, widest = half_power_width(c)
        peaks.append((low, high))
        widths.append((narrowest, widest))
        level = c.value[c.peak_index] / math.sqrt(2)
        rows.append({"K": k, "role": "shaped", "peak_batch_size": float(c.batch_size[c.peak_index]),
                     "peak": float(c.value[c.peak_index]), "peak_low": low, "peak_high": high, "width": width,
                     "width_low": narrowest, "width_high": widest,
                     "reaches_largest_B": bool((c.value[c.peak_index:] >= level).all()), "noise": c.noise})
    (later, later_outcome), (wider, wider_outcome) = growth_status(peaks), growth_status(widths)
    parts += [later, wider]
    notes += [(outcome, part, detectable if outcome == NOT_SHOWN else None, "B")
              for outcome, part, detectable in ((later_outcome, "the later peak", growth_detectable(peaks)),
                                                (wider_outcome, "the wider range", growth_detectable(widths)))
              if outcome]
    return rows, combine(parts), fig4_gamma(rows, monotone_ks, MIN_BATCH_SIZES, later, wider), notes


def shape_holds_across_settings(settings: pd.DataFrame | None) -> Verdict:
    """Fig. 5: the rise-then-fall holds in every setting, with small run-to-run spread.

    Input: the settings study (the e2e columns plus ``setting``, e.g. "humaneval, T=0", emulated by
    synthetic sigma; several runs). Criterion, for every (setting, gamma):

    * the speedup curve (mean over runs) :func:`rises_then_falls`, the noise from the runs;
    * the spread is small: the run-to-run range (largest minus smallest run) at a batch size,
      typically (the median over batch sizes), is below every part of the shape (the rise, the fall)
      that exceeds its noise margin. Then a single run's deviation cannot typically undo what the
      mean shows: each run on its own shows it, which is what the paper's "tiny run-to-run variance"
      lets a reader see in its Fig. 5. A part within noise is not compared: it is smaller than the
      noise, and so than a typical range of a few runs, and the first bullet already reports it as
      not shown; a curve with no rise (peak at the smallest B) would otherwise fail the spread
      against a rise of zero however tight its runs. With no part beyond noise the spread is not
      judged (``small_spread`` None), and the curve fails on its shape.

    Holds when both hold for every setting and gamma; not measurable without the study, with fewer
    than two settings (nothing to hold *across*), fewer than two runs at every batch size (no
    spread), or fewer than :data:`MIN_BATCH_SIZES` batch sizes.
    """
    claim, statement = "Fig. 5", CLAIMS["Fig. 5"]
    if settings is None or settings.empty:
        return verdict(claim, statement, UNMEASURABLE, [], no_study("settings"))
    if settings["setting"].nunique() < 2:
        return verdict(claim, statement, UNMEASURABLE, [], FEWER_THAN_TWO_SETTINGS)
    rows, notes = [], []
    for (setting, gamma), group in settings.groupby(["setting", "gamma"]):
        c = curve(group, "speedup")
        runs = group.groupby("batch_size")["speedup"]
        where = f"{setting}, gamma = {gamma}" if settings["gamma"].nunique() > 1 else str(setting)
        if len(c.batch_size) < MIN_BATCH_SIZES or (runs.count() < 2).any():
            rows.append({"setting": setting, "gamma": gamma, "status": UNMEASURABLE})
            notes.append((UNMEASURABLE, "the curve", where))
            continue
        shape = rises_then_falls(c)
        spread = float((runs.max() - runs.min()).median())
        shown = [size for size, margin in ((shape["rise"], shape["rise_margin"]), (shape["fall"], shape["fall_margin"]))
                 if size > margin]
        small = spread < min(shown) if shown else None
        parts = ((shape_outcome(shape, c), "the rise then fall", shape_detectable(shape)),
                 (CONTRADICTED if small is False else None, "the small run-to-run spread", None))
        notes += [(outcome, part, where, detectable if outcome == NOT_SHOWN else None, "")
                  for outcome, part, detectable in parts if outcome]
        status = status_of(outcome for outcome, *_ in parts)
        rows.append({"setting": setting, "gamma": gamma, "status": status, **shape, "run_range": spread,
                     "runs": int(runs.count().min()), "small_spread": small, "noise": c.noise})
    status = combine(r["status"] for r in rows)
    details = fig5_details(rows, MIN_BATCH_SIZES, one_gamma=settings["gamma"].nunique() == 1)
    return verdict(claim, statement, status, rows, details, notes)


def moe_above_dense(e2e: pd.DataFrame | None, dense: pd.DataFrame | None, beyond: float = 16,
                    from_batch_size=None) -> Verdict:
    """Fig. 6: the MoE's SD speedup is above the dense pair's when the batch size exceeds ``beyond``, and the
    dense pair's speedup only falls.

    Input: the e2e (MoE) and dense studies (``batch_size``, ``gamma``, ``run``, ``speedup``), over the
    batch sizes from ``from_batch_size`` on (default: all). Criterion, for every gamma both studies
    measured:

    * over their common batch sizes B > ``beyond`` (the paper: "when batch size exceeds 16"), with the
      difference of the two curves' means and its margin ``NOISE_Z * sqrt(se_moe**2 + se_dense**2)``:
      at no such B is the MoE below the dense pair beyond noise (difference >= -margin), and at more
      than half of them the MoE is above beyond noise (difference > margin);
    * the dense pair's speedup curve :func:`falls_monotonically` (the paper's Fig. 6: "dense keeps
      falling"; columns ``dense_*``).

    The crossover (the smallest common B from which the MoE stays above the dense pair) is reported,
    not judged. Holds when all hold at every common gamma; not measurable without either study, with
    no common gamma, with fewer than three common batch sizes beyond ``beyond`` or fewer than
    :data:`MIN_BATCH_SIZES` dense batch sizes.
    """
    claim = "Fig. 6"
    statement = judged_from(CLAIMS[claim].replace("16", number(beyond, whole=True)), from_batch_size)
    e2e, dense = _from_batch_size(e2e, from_batch_size), _from_batch_size(dense, from_batch_size)
    if e2e is None or dense is None or e2e.empty or dense.empty:
        missing = " and ".join(n for n, f in (("e2e", e2e), ("dense", dense)) if f is None or f.empty)
        return verdict(claim, statement, UNMEASURABLE, [], no_study(missing))
    rows, notes = [], []
    for gamma in sorted(set(e2e["gamma"]) & set(dense["gamma"])):
        moe, den = curve(e2e[e2e["gamma"] == gamma], "speedup"), curve(dense[dense["gamma"] == gamma], "speedup")
        common = np.intersect1d(moe.batch_size, den.batch_size)
        i, j = np.searchsorted(moe.batch_size, common), np.searchsorted(den.batch_size, common)
        difference = moe.value[i] - den.value[j]
        margin = NOISE_Z * np.sqrt(moe.se[i] ** 2 + den.se[j] ** 2)
        late = common > beyond
        where = f"gamma = {gamma}"
        if late.sum() < 3 or len(den.batch_size) < MIN_BATCH_SIZES:
            rows.append({"gamma": gamma, "status": UNMEASURABLE})
            notes.append((UNMEASURABLE, "the comparison", where))
            continue
        below = int((difference[late] < -margin[late]).sum())
        above = int((difference[late] > margin[late]).sum())
        staying = np.flatnonzero(np.minimum.accumulate((difference > 0)[::-1])[::-1])
        crossover = float(common[staying[0]]) if len(staying) else float("nan")
        fall = falls_monotonically(den)
        is_above = below == 0 and above > late.sum() / 2
        above_outcome = CONTRADICTED if below else None if is_above else NOT_SHOWN
        status = status_of([above_outcome, fall_outcome(fall)])
        rows.append({"gamma": gamma, "status": status, "batch_sizes": int(late.sum()), "above": above,
                     "below": below, "median_difference": float(np.median(difference[late])),
                     "median_margin": float(np.median(margin[late])), "crossover": crossover,
                     **{f"dense_{k}": value for k, value in fall.items()},
                     "moe_noise": moe.noise, "dense_noise": den.noise})
        notes += [(outcome, part, where, detectable if outcome == NOT_SHOWN else None, "")
                  for outcome, part, detectable in (
                      (above_outcome, "the MoE above the dense pair", float(np.median(margin[late]))),
                      (fall_outcome(fall), "the dense speedup's fall", fall["fall_margin"])) if outcome]
    if not rows:
        return verdict(claim, statement, UNMEASURABLE, [], NO_COMMON_GAMMA)
    return verdict(claim, statement, combine(r["status"] for r in rows), rows,
                   fig6_details(rows, beyond, MIN_BATCH_SIZES), notes)


def longest_missing_run(sample, grid) -> int:
    """Longest run of consecutive grid batch sizes absent from ``sample`` (ends included)."""
    present = np.isin(np.asarray(grid, dtype=float), np.asarray(sample, dtype=float))
    longest = run = 0
    for here in present:
        run = 0 if here else run + 1
        longest = max(longest, run)
    return longest


def poor_coverage_worst_fits(robustness: pd.DataFrame | None, batch_sizes=None, parameters: int = 10) -> Verdict:
    """Table 3: the worst fits of Algorithm 1 are those whose samples cover the batch sizes poorly.

    Input: :func:`moesd.model.diagnostics.robustness_study` (one row per stride: ``m``, ``mse`` over every
    measurement, ``batch_sizes`` of the sample as a space-separated string). ``batch_sizes`` is the
    study's grid (default: every batch size any sample holds).

    A sample's *gap* is its longest run of consecutive grid batch sizes left out
    (:func:`longest_missing_run`; the paper's m = 12 leaves out the 7 above 40, m = 13 the 6 from 2
    to 20). It covers *poorly* when that gap is longer than an even spread of as many points would
    leave, ``ceil((n - k) / (k - 1))`` with ``n`` grid batch sizes and ``k = min(m, n)``. Only samples
    with more points than the model's ``parameters`` count (the paper puts m = 10's error down to
    too few points). Criterion:

    * the worst fit (largest MSE) covers poorly, and
    * the poorly covering samples' median MSE exceeds the well covering samples' median MSE by more
      than ``NOISE_Z`` times the scatter of the well covering samples' MSEs (``1.4826 * MAD``: how
      much the MSE moves between well covering samples, the noise of this comparison).

    Not measurable with fewer than one poorly and three well covering samples. The criterion was
    written from the paper's words (App. C.3); the paper's own Table 3, with each sample's batch
    sizes rebuilt by stride sampling its 228-run design, passes it (``tests/test_verdicts.py``).
    """
    claim, statement = "Table 3", CLAIMS["Table 3"]
    if robustness is None or robustness.empty:
        return verdict(claim, statement, UNMEASURABLE, [], NO_ROBUSTNESS)
    samples = [np.array(str(s).split(), dtype=float) for s in robustness["batch_sizes"]]
    grid = np.unique(np.concatenate(samples) if batch_sizes is None else np.asarray(batch_sizes, dtype=float))
    table = robustness[["stride", "m", "mse"]].copy()
    table["gap"] = [longest_missing_run(s, grid) for s in samples]
    k = np.minimum(table["m"], len(grid))
    table["even_gap"] = np.ceil((len(grid) - k) / np.maximum(k - 1, 1)).astype(int)
    table["poor"] = table["gap"] > table["even_gap"]
    table["judged"] = table["m"] > parameters
    used = table[table["judged"]]
    poor, well = used[used["poor"]], used[~used["poor"]]
    if len(poor) < 1 or len(well) < 3:
        return verdict(claim, statement, UNMEASURABLE, table, table3_too_few(len(poor), len(well), parameters))
    worst = used.loc[used["mse"].idxmax()]
    scatter = 1.4826 * float((well["mse"] - well["mse"].median()).abs().median())
    excess = float(poor["mse"].median() - well["mse"].median())
    parts = ((None if worst["poor"] else CONTRADICTED, "the worst fit covering poorly", None),
             (None if excess > NOISE_Z * scatter else NOT_SHOWN, "the poorly covering samples' larger error",
              NOISE_Z * scatter))
    status = status_of(outcome for outcome, *_ in parts)
    notes = [(outcome, part, f"m > {parameters}", detectable if outcome == NOT_SHOWN else None, "MSE")
             for outcome, part, detectable in parts if outcome]
    details = table3_details(worst, poor["m"], poor["mse"].median(), well["mse"].median(), len(well), scatter, excess)
    return verdict(claim, statement, status, table, details, notes)
