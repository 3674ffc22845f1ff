"""Verdicts on the paper's measured claims of the end-to-end and forward studies (Figs. 2, 3, 5, 6).

One function per claim. Each judges its claim under both readings of :mod:`moesd.paper.criteria` (the material
one, the claim as the paper states it, leads; the strict one stands beside it) and returns a
:class:`~moesd.paper.criteria.Verdict`: both readings' statuses and parts, the numbers behind them (one row per
curve), the options it was judged with and, where it cannot be judged, a reason code; :mod:`moesd.narration`
words it. Fig. 4 and Table 3, judged on the sparsity study, are in
:mod:`moesd.paper.sparsity_verdicts`; :func:`moesd.paper.scorecard.scorecard` runs them all on a device folder.
The noise model and shape tests are in :mod:`moesd.paper.curves`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from moesd.paper.criteria import (CLAIM, CONTRADICTED, DETAIL, FEWER_THAN_TWO_SETTINGS, FLUCTUATION_TOLERANCE,
                                  NO_COMMON_GAMMA, NO_COMMON_PASS, NO_STUDY, NOT_SHOWN, SHOWN, UNTESTABLE, Reading,
                                  Verdict, fall_outcome, material_status, shape_detectable, shape_outcome,
                                  strict_status, tracks_outcome)
from moesd.paper.curves import MIN_BATCH_SIZES, NOISE_Z, curve, falls_monotonically, rises_then_falls, tracks

READINGS = {"strict": 0.0, "material": FLUCTUATION_TOLERANCE}
"""Each reading and the tolerance its shape tests take (:mod:`moesd.paper.criteria`)."""


def new_notes() -> dict:
    """Empty lists of part notes per reading: ``(outcome, part, where, detectable, unit, role)`` tuples."""
    return {reading: [] for reading in READINGS}


def note(outcome, part, where, detectable=None, unit="", role=CLAIM) -> tuple:
    """One part's note; ``detectable`` is kept for a part within noise only."""
    return (outcome, part, where, detectable if outcome == NOT_SHOWN else None, unit, role)


def judged(claim: str, numbers, notes: dict, **options) -> Verdict:
    """A :class:`Verdict` from both readings' notes, with statuses from :mod:`moesd.paper.criteria`.

    ``numbers`` is a list of rows (dicts), each with the ``where`` its notes name (e.g. ``gamma = 4``); each row
    gains the ``status`` and ``material_status`` of its own notes. A DataFrame is kept as it is. ``options`` are
    how the claim was judged (:attr:`~moesd.paper.criteria.Verdict.options`).
    """

    statuses = {"strict": strict_status(n[0] for n in notes["strict"]),
                "material": material_status(n[0] for n in notes["material"] if n[5] == CLAIM)}
    if isinstance(numbers, list):
        numbers = pd.DataFrame([{**row,
                                 "status": strict_status(n[0] for n in notes["strict"] if n[2] == row.get("where")),
                                 "material_status": material_status(n[0] for n in notes["material"]
                                                                    if n[2] == row.get("where") and n[5] == CLAIM)}
                                for row in numbers])
    return Verdict(claim, Reading.from_notes(statuses["material"], notes["material"]),
                   Reading.from_notes(statuses["strict"], notes["strict"]), numbers, options)


def untestable(claim: str, reason: str, **options) -> Verdict:
    """A claim the data cannot speak to, for ``reason`` (one of :data:`~moesd.paper.criteria.REASONS`), with its
    arguments and the options it was to be judged with in ``options``."""

    empty = Reading.from_notes(UNTESTABLE, [])
    return Verdict(claim, empty, empty, pd.DataFrame(), options, reason)


def rows_from(frame: pd.DataFrame | None, smallest) -> pd.DataFrame | None:
    """The rows of a study with ``batch_size >= smallest`` (all rows when ``smallest`` is None)."""
    return frame if frame is None or smallest is None else frame[frame["batch_size"] >= smallest]


def _missing(**frames) -> tuple:
    """The names of the studies among ``frames`` that are absent or empty."""
    return tuple(name for name, frame in frames.items() if frame is None or frame.empty)


def _shape_fields(shape: dict, prefix: str = "", reading: str = "strict") -> dict:
    """A shape test's fields for a numbers row: all of the strict test's, the material test's verdict fields."""
    if reading == "strict":
        return {prefix + key: value for key, value in shape.items()}
    return {f"{prefix}material_{key}": shape[key] for key in ("unimodal", "rises_then_falls", "largest_reversal",
                                                              "largest_reversal_from", "largest_reversal_to")
            if key in shape}


def speedup_rises_then_falls(e2e: pd.DataFrame | None, from_batch_size=None) -> Verdict:
    """Fig. 2: the MoE SD speedup rises then falls with batch size, and target efficiency tracks that shape.

    Input: the e2e study (``batch_size``, ``gamma``, ``run``, ``speedup``, ``target_efficiency``; one row per point
    and repeat), from ``from_batch_size`` on (default: all). Per gamma, both readings ask:

    * the speedup curve :func:`~moesd.paper.curves.rises_then_falls` (interior peak, rise and fall beyond noise,
      no reversal that counts: beyond noise in the strict reading, beyond noise and the tolerance in the
      material one);
    * the target-efficiency curve of the same runs rises then falls in the same sense (columns
      ``efficiency_*``), and
    * it :func:`~moesd.paper.curves.tracks` the speedup: positive rank correlation at the 5 % level and peak
      regions that overlap.

    Not testable without the study or with fewer than ``MIN_BATCH_SIZES`` batch sizes at some gamma.
    """

    e2e = rows_from(e2e, from_batch_size)
    if e2e is None or e2e.empty:
        return untestable("Fig. 2", NO_STUDY, studies=("e2e",), from_batch_size=from_batch_size)
    rows, notes = [], new_notes()
    for gamma, group in e2e.groupby("gamma"):
        speed, efficiency = curve(group, "speedup"), curve(group, "target_efficiency")
        where = f"gamma = {gamma}"
        if min(len(speed.batch_size), len(efficiency.batch_size)) < MIN_BATCH_SIZES:
            rows.append({"gamma": gamma, "where": where})
            for reading in READINGS:
                notes[reading].append(note(UNTESTABLE, "the curves", where))
            continue
        track = tracks(speed, efficiency)
        row = {"gamma": gamma, "where": where, **track, "noise": speed.noise}
        for reading, tolerance in READINGS.items():
            shape, efficiency_shape = rises_then_falls(speed, tolerance), rises_then_falls(efficiency, tolerance)
            row.update({**_shape_fields(shape, "", reading), **_shape_fields(efficiency_shape, "efficiency_", reading)})
            notes[reading] += [
                note(shape_outcome(shape, speed), "the speedup's rise then fall", where, shape_detectable(shape)),
                note(shape_outcome(efficiency_shape, efficiency), "the efficiency's rise then fall", where,
                     shape_detectable(efficiency_shape)),
                note(tracks_outcome(track), "the efficiency tracking the speedup", where,
                     track["detectable_correlation"], "rank correlation")]
        rows.append(row)
    return judged("Fig. 2", rows, notes, from_batch_size=from_batch_size)


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


def memory_bound_efficiency(sidecar: dict, batch_sizes, gamma: int, top_k: int | None = None) -> np.ndarray:
    """What Eq. 8 predicts for a forward study's target efficiency where a step is its bytes: bytes of a decode step
    over bytes of a verification pass, ``bytes(B, 1) / bytes(B, gamma + 1)``.

    The bytes (:func:`moesd.measure.regime.step_bytes`: the weights a pass uses with Eq. 8's expected activated
    experts, its KV cache) are those of the sidecar's model as the sweep built it; a step that only reads its bytes
    has this efficiency (``top_k``: the K of the passes, default the checkpoint's). For Qwen2-57B-A14B, whose shared
    expert is as wide as eight routed experts, the ratio can fall from B = 1 to 2 before it rises.
    """
    from moesd.measure.regime import step_bytes

    return np.array([step_bytes(sidecar, int(b), 1, top_k) / step_bytes(sidecar, int(b), gamma + 1, top_k)
                     for b in batch_sizes])


def efficiency_moe_rises_dense_falls(forward: pd.DataFrame | None, dense_forward: pd.DataFrame | None,
                                     gammas=(2, 3, 4), from_batch_size=None, sidecar: dict | None = None) -> Verdict:
    """Fig. 3: MoE target efficiency rises then falls with batch size; the dense model's only falls.

    Per gamma in ``gammas`` that both forward studies can give (a pass of ``gamma + 1`` tokens per sequence), with
    the efficiency of each run (:func:`forward_efficiency`) as the repeats, from ``from_batch_size`` on (default
    all), both readings ask:

    * the MoE curve :func:`~moesd.paper.curves.rises_then_falls`;
    * the dense curve :func:`~moesd.paper.curves.falls_monotonically` (an overall fall beyond noise and no rise
      that counts). A dense curve that stays flat within noise is not shown: the claim is that it falls.

    With the MoE study's ``sidecar``, the numbers add Eq. 8's memory-bound efficiency at the two smallest batch
    sizes (:func:`memory_bound_efficiency`: ``predicted_first``, ``predicted_second``), so a dip there can be set
    beside what the bytes predict. Not testable without either study, with no common gamma, or with fewer than
    ``MIN_BATCH_SIZES`` batch sizes.
    """

    forward, dense_forward = (rows_from(forward, from_batch_size),
                              rows_from(dense_forward, from_batch_size))
    missing = _missing(forward=forward, dense_forward=dense_forward)
    if missing:
        return untestable("Fig. 3", NO_STUDY, studies=missing, from_batch_size=from_batch_size)
    rows, notes = [], new_notes()
    for gamma in gammas:
        moe, dense = forward_efficiency(forward, gamma), forward_efficiency(dense_forward, gamma)
        if moe.empty or dense.empty:
            continue
        moe_curve, dense_curve = curve(moe, "efficiency"), curve(dense, "efficiency")
        where = f"gamma = {gamma}"
        if min(len(moe_curve.batch_size), len(dense_curve.batch_size)) < MIN_BATCH_SIZES:
            rows.append({"gamma": gamma, "where": where})
            for reading in READINGS:
                notes[reading].append(note(UNTESTABLE, "the curves", where))
            continue
        row = {"gamma": gamma, "where": where, "first_batch_size": float(moe_curve.batch_size[0]),
               "noise": moe_curve.noise, "dense_noise": dense_curve.noise}
        if sidecar is not None:
            first, second = memory_bound_efficiency(sidecar, moe_curve.batch_size[:2], gamma)
            row.update(predicted_first=float(first), predicted_second=float(second))
        for reading, tolerance in READINGS.items():
            shape, fall = rises_then_falls(moe_curve, tolerance), falls_monotonically(dense_curve, tolerance)
            row.update({**_shape_fields(shape, "moe_", reading), **_fall_fields(fall, "dense_", reading)})
            notes[reading] += [note(shape_outcome(shape, moe_curve), "the MoE efficiency's rise then fall", where,
                                    shape_detectable(shape)),
                               note(fall_outcome(fall), "the dense efficiency's fall", where, fall["fall_margin"])]
        rows.append(row)
    if not rows:
        return untestable("Fig. 3", NO_COMMON_PASS, gammas=tuple(gammas), from_batch_size=from_batch_size)
    return judged("Fig. 3", rows, notes, from_batch_size=from_batch_size)


def _fall_fields(fall: dict, prefix: str, reading: str) -> dict:
    """A fall test's fields for a numbers row: all of the strict test's, the material test's verdict fields."""
    if reading == "strict":
        return {prefix + key: value for key, value in fall.items()}
    return {f"{prefix}material_{key}": fall[key] for key in ("falls_monotonically", "rises_beyond_noise",
                                                             "largest_rise", "largest_rise_from", "largest_rise_to")}


def normalised_speedup(rows: pd.DataFrame) -> pd.Series:
    """Speedup over what acceptance alone would give, ``speedup / (sigma (gamma + 1))``, per row.

    ``sigma (gamma + 1)`` is the tokens a round emits (Eq. 5); dividing by it leaves Eq. 4's systemic part, the
    time of one AR step over the time of one SD round: the quantity the settings and the MoE-against-dense
    comparisons are about once acceptance differs between them.
    """
    return rows["speedup"] / (rows["sigma"] * (rows["gamma"] + 1))


def shape_holds_across_settings(settings: pd.DataFrame | None) -> Verdict:
    """Fig. 5: the rise-then-fall holds in every setting, with small run-to-run spread.

    Input: the settings study (the e2e columns plus ``setting``, e.g. "humaneval, T=0"; several runs). Per
    (setting, gamma):

    * **strict**: the speedup curve (mean over runs) :func:`~moesd.paper.curves.rises_then_falls`, and the spread
      is small: the run-to-run range (largest minus smallest run) at a batch size, typically (the median over
      batch sizes), is below every part of the shape (the rise, the fall) that exceeds its noise margin. A part
      within noise is not compared (a curve with no rise would otherwise fail the spread against a rise of zero
      however tight its runs); with no part beyond noise the spread is not judged.
    * **material**: the same on the acceptance-normalised speedup (:func:`normalised_speedup`; the settings differ
      in acceptance, and per-run acceptance seeds, which the paper fixed, move whole runs), reversals counted
      beyond noise and the tolerance; the spread is a :data:`~moesd.paper.criteria.DETAIL`.

    Not testable without the study, with fewer than two settings (nothing to hold *across*), fewer than two runs
    at every batch size (no spread), or fewer than ``MIN_BATCH_SIZES`` batch sizes.
    """

    if settings is None or settings.empty:
        return untestable("Fig. 5", NO_STUDY, studies=("settings",))
    if settings["setting"].nunique() < 2:
        return untestable("Fig. 5", FEWER_THAN_TWO_SETTINGS)
    settings = settings.assign(normalised_speedup=normalised_speedup(settings))
    rows, notes = [], new_notes()
    for (setting, gamma), group in settings.groupby(["setting", "gamma"]):
        where = f"{setting}, gamma = {gamma}" if settings["gamma"].nunique() > 1 else str(setting)
        if group["batch_size"].nunique() < MIN_BATCH_SIZES or (group.groupby("batch_size")["run"].count() < 2).any():
            rows.append({"setting": setting, "gamma": gamma, "where": where})
            for reading in READINGS:
                notes[reading].append(note(UNTESTABLE, "the curve", where))
            continue
        row = {"setting": setting, "gamma": gamma, "where": where, "runs": int(group.groupby("batch_size")["run"].count().min())}
        for reading, column in (("strict", "speedup"), ("material", "normalised_speedup")):
            c = curve(group, column)
            shape = rises_then_falls(c, READINGS[reading])
            runs = group.groupby("batch_size")[column]
            spread = float((runs.max() - runs.min()).median())
            shown = [size for size, margin in ((shape["rise"], shape["rise_margin"]),
                                               (shape["fall"], shape["fall_margin"])) if size > margin]
            small = spread < min(shown) if shown else None
            prefix = "" if reading == "strict" else "normalised_"
            row.update({f"{prefix}{key}": value for key, value in shape.items()})
            row.update({f"{prefix}run_range": spread, f"{prefix}small_spread": small, f"{prefix}noise": c.noise})
            spread_role = CLAIM if reading == "strict" else DETAIL
            notes[reading] += [note(shape_outcome(shape, c), "the rise then fall", where, shape_detectable(shape)),
                               note(CONTRADICTED if small is False else SHOWN, "the small run-to-run spread", where,
                                    role=spread_role)]
        rows.append(row)
    return judged("Fig. 5", rows, notes, one_gamma=bool(settings["gamma"].nunique() == 1))


def moe_above_dense(e2e: pd.DataFrame | None, dense: pd.DataFrame | None, beyond: float = 16,
                    from_batch_size=None) -> Verdict:
    """Fig. 6: the MoE's SD speedup is above the dense pair's when the batch size exceeds ``beyond``, and the
    dense pair's speedup only falls.

    Input: the e2e (MoE) and dense studies (``batch_size``, ``gamma``, ``run``, ``speedup``, ``sigma``), from
    ``from_batch_size`` on (default all). Per gamma both studies measured, on the speedup as measured (strict)
    or acceptance-normalised (:func:`normalised_speedup`, material):

    * over their common batch sizes B > ``beyond`` (the paper: "when batch size exceeds 16"), with the difference
      of the two curves' means and its margin ``NOISE_Z * sqrt(se_moe**2 + se_dense**2)``: at no such B is the
      MoE below the dense pair beyond noise, and at more than half of them it is above beyond noise;
    * the dense pair's curve :func:`~moesd.paper.curves.falls_monotonically` (columns ``dense_*``).

    The crossover (the smallest common B from which the MoE stays above) is reported, not judged. Not testable
    without either study, with no common gamma, with fewer than three common batch sizes beyond ``beyond`` or
    fewer than ``MIN_BATCH_SIZES`` dense batch sizes.
    """

    options = {"beyond": beyond, "from_batch_size": from_batch_size}
    e2e, dense = rows_from(e2e, from_batch_size), rows_from(dense, from_batch_size)
    missing = _missing(e2e=e2e, dense=dense)
    if missing:
        return untestable("Fig. 6", NO_STUDY, studies=missing, **options)
    rows, notes = [], new_notes()
    for gamma in sorted(set(e2e["gamma"]) & set(dense["gamma"])):
        where = f"gamma = {gamma}"
        row = {"gamma": gamma, "where": where}
        for reading in READINGS:
            moe_rows, dense_rows = e2e[e2e["gamma"] == gamma], dense[dense["gamma"] == gamma]
            column = "speedup"
            if reading == "material":
                moe_rows = moe_rows.assign(normalised=normalised_speedup(moe_rows))
                dense_rows = dense_rows.assign(normalised=normalised_speedup(dense_rows))
                column = "normalised"
            comparison = _above(curve(moe_rows, column), curve(dense_rows, column), beyond, READINGS[reading])
            if comparison is None:
                notes[reading].append(note(UNTESTABLE, "the comparison", where))
                continue
            above_outcome, fall, fields = comparison
            prefix = "" if reading == "strict" else "normalised_"
            row.update({prefix + key: value for key, value in fields.items()})
            row.update({f"{prefix}dense_{key}": value for key, value in fall.items()})
            notes[reading] += [note(above_outcome, "the MoE above the dense pair", where, fields["median_margin"]),
                               note(fall_outcome(fall), "the dense speedup's fall", where, fall["fall_margin"])]
        rows.append(row)
    if not rows:
        return untestable("Fig. 6", NO_COMMON_GAMMA, **options)
    return judged("Fig. 6", rows, notes, **options)


def _above(moe, dense, beyond: float, tolerance: float):
    """Fig. 6's comparison of two curves past ``beyond``: (outcome of "above", the dense fall, fields) or None."""
    common = np.intersect1d(moe.batch_size, dense.batch_size)
    i, j = np.searchsorted(moe.batch_size, common), np.searchsorted(dense.batch_size, common)
    difference = moe.value[i] - dense.value[j]
    margin = NOISE_Z * np.sqrt(moe.se[i] ** 2 + dense.se[j] ** 2)
    late = common > beyond
    if late.sum() < 3 or len(dense.batch_size) < MIN_BATCH_SIZES:
        return None
    below = int((difference[late] < -margin[late]).sum())
    above = int((difference[late] > margin[late]).sum())
    staying = np.flatnonzero(np.minimum.accumulate((difference > 0)[::-1])[::-1])
    outcome = CONTRADICTED if below else SHOWN if above > late.sum() / 2 else NOT_SHOWN
    fields = {"batch_sizes": int(late.sum()), "above": above, "below": below,
              "median_difference": float(np.median(difference[late])), "median_margin": float(np.median(margin[late])),
              "crossover": float(common[staying[0]]) if len(staying) else float("nan"),
              "moe_noise": moe.noise, "dense_noise": dense.noise}
    return outcome, falls_monotonically(dense, tolerance), fields
