"""The details of each claim's sentence: what the numbers of Figs. 2-6 and Table 3 say, and what is missing
where a claim cannot be judged.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from moesd.narration.phrases import fall_phrase, join, noise_phrase, number, shape_phrase, shapes_phrase, span
from moesd.paper.criteria import (FEWER_THAN_TWO_SETTINGS, HOLDS, NO_COMMON_GAMMA, NO_COMMON_PASS, NO_ROBUSTNESS,
                                  NO_STUDY, NOT_FITTED, Verdict)
from moesd.paper.curves import MIN_BATCH_SIZES


def details(verdict: Verdict) -> str:
    """The details of a verdict's sentences: what its numbers say, or why the claim cannot be judged.

    Raises
    ------
    ValueError
        For a claim that is not one of :data:`moesd.paper.criteria.CLAIMS`.
    """
    if verdict.reason is not None:
        return reason_phrase(verdict.reason, verdict.options)
    options, rows = verdict.options, records(verdict.numbers)
    writers = {"Fig. 2": lambda: fig2_details(rows, MIN_BATCH_SIZES),
               "Fig. 3": lambda: fig3_details(rows, MIN_BATCH_SIZES),
               "Fig. 4": lambda: fig4_details(rows, options["monotone_ks"], MIN_BATCH_SIZES),
               "Fig. 5": lambda: fig5_details(rows, MIN_BATCH_SIZES, options["one_gamma"]),
               "Fig. 6": lambda: fig6_details(rows, options["beyond"], MIN_BATCH_SIZES),
               "Table 3": lambda: table3_details(verdict.numbers, options["parameters"])}
    if verdict.claim not in writers:
        raise ValueError(f"no details for the claim {verdict.claim!r} (known: {', '.join(writers)})")
    return writers[verdict.claim]()


def records(numbers: pd.DataFrame) -> list:
    """A verdict's numbers as rows (dicts), every column kept: a value the verdict computed as NaN (a rank
    correlation of a flat curve) stays NaN, and :func:`has` tells a row that was never judged."""
    return numbers.to_dict("records")


def has(row: dict, key: str) -> bool:
    """Whether ``row`` holds a value for ``key``: a gamma too short to judge has no ``first`` (NaN in the frame)."""
    value = row.get(key)
    return value is not None and not (np.ndim(value) == 0 and pd.isna(value))


def reason_phrase(reason: str, options: dict) -> str:
    """Why a claim cannot be judged, from its reason code (:data:`moesd.paper.criteria.REASONS`) and options."""
    if reason == NO_STUDY:
        return no_study(*options["studies"])
    if reason == NO_COMMON_PASS:
        return no_common_pass(options["gammas"])
    if reason == NOT_FITTED:
        return f"the robustness study cannot be fitted: {options['error']}"
    return {NO_COMMON_GAMMA: "the e2e and dense studies share no gamma", NO_ROBUSTNESS: "no robustness study given",
            FEWER_THAN_TWO_SETTINGS: "fewer than two settings"}[reason]


def _keys(row: dict, prefix: str) -> dict:
    """The entries of ``row`` whose names start with ``prefix``, with the prefix taken off."""
    return {key[len(prefix):]: value for key, value in row.items() if key.startswith(prefix)}


def no_study(*names) -> str:
    return f"no complete {' and '.join(names)} study on this device"


def _few(row: dict, minimum: int) -> str:
    return f"gamma = {row['gamma']} has fewer than {minimum} batch sizes"


def _which(flag: bool, yes: str, no: str) -> str:
    return yes if flag else no


def fig2_details(rows: list, minimum: int) -> str:
    """The details of Fig. 2's verdict from its rows (:func:`moesd.paper.verdicts.speedup_rises_then_falls`)."""
    phrases = []
    for row in rows:
        if not has(row, "first"):
            phrases.append(_few(row, minimum))
        elif row["status"] != HOLDS:
            efficiency = _keys(row, "efficiency_")
            phrases.append(f"gamma = {row['gamma']}: the speedup is {shape_phrase(row)}, "
                           f"{_which(row['rises_then_falls'], 'rising then falling', 'not rising then falling')}; "
                           f"target efficiency is {shape_phrase(efficiency)}, "
                           f"{_which(efficiency['rises_then_falls'], 'rising then falling', 'not rising then falling')}"
                           f", peaks within B = "
                           f"{span([row['follower_peak_low'], row['follower_peak_high']], whole=True)}, "
                           f"rank correlation {row['rank_correlation']:.2f} "
                           f"({_which(row['tracks'], 'tracks', 'does not track')})")
    held = [row for row in rows if row["status"] == HOLDS]
    if held:
        phrases.insert(0, f"at gamma = {', '.join(str(r['gamma']) for r in held)} the speedup is "
                          f"{shapes_phrase(held)}, target efficiency is {shapes_phrase(held, 'efficiency_')}, "
                          f"peaking within B = "
                          f"{span([r[k] for r in held for k in ('follower_peak_low', 'follower_peak_high')], True)}"
                          f", rank correlation {span([r['rank_correlation'] for r in held])} with the speedup")
    return join(*phrases, noise_phrase(rows))


def fig3_details(rows: list, minimum: int) -> str:
    """The details of Fig. 3's verdict (:func:`moesd.paper.verdicts.efficiency_moe_rises_dense_falls`)."""
    phrases = []
    for row in rows:
        if not has(row, "moe_first"):
            phrases.append(_few(row, minimum))
        elif row["status"] != HOLDS:
            shape, fall = _keys(row, "moe_"), _keys(row, "dense_")
            phrases.append(f"gamma = {row['gamma']}: MoE {shape_phrase(shape)}, "
                           f"{_which(shape['rises_then_falls'], 'rising then falling', 'not rising then falling')}; "
                           f"dense {fall_phrase(fall)}, "
                           f"{_which(fall['falls_monotonically'], 'falling', 'not falling monotonically')}")
    held = [row for row in rows if row["status"] == HOLDS]
    if held:
        phrases.insert(0, f"at gamma = {', '.join(str(r['gamma']) for r in held)} the MoE efficiency is "
                          f"{shapes_phrase(held, 'moe_')}, and the dense model's falls from "
                          f"{span([r['dense_first'] for r in held])} to {span([r['dense_last'] for r in held])} "
                          f"with no rise beyond noise")
    return join(*phrases, noise_phrase(rows))


def no_common_pass(gammas) -> str:
    return f"the forward studies share no pass of gamma + 1 tokens for gamma in {list(gammas)}"


def fig4_details(rows: list, monotone_ks, minimum: int) -> str:
    """Fig. 4's details from its rows (:func:`moesd.paper.sparsity_verdicts.sparser_peaks_later_and_wider`): per
    gamma, the falls of ``monotone_ks`` and each K's peak region and range above x/sqrt(2)."""
    phrases = []
    for gamma in dict.fromkeys(row["gamma"] for row in rows):
        here = [row for row in rows if row["gamma"] == gamma]
        falls = []
        for k in monotone_ks:
            row = next((r for r in here if r["K"] == k), None)
            falls.append(f"no K = {k} curve of {minimum}+ batch sizes" if row is None else
                         f"K = {k} {fall_phrase(row)} " + _which(row["falls_monotonically"], "falls monotonically",
                                                                  "does not fall monotonically"))
        listing = ", ".join(f"K = {r['K']} peak within B = {span([r['peak_low'], r['peak_high']], whole=True)}, "
                            f"width {span([r['width_low'], r['width_high']], whole=True)}"
                            for r in here).replace("-inf", " or more")
        phrases.append(f"gamma = {gamma}: " + ", ".join([*falls, listing]))
    return join(*phrases, noise_phrase(rows))


def fig5_details(rows: list, minimum: int, one_gamma: bool) -> str:
    """The details of Fig. 5's verdict (:func:`moesd.paper.verdicts.shape_holds_across_settings`)."""
    phrases = []
    for row in rows:
        if not has(row, "first"):
            where = str(row["setting"]) if one_gamma else f"{row['setting']}, gamma = {row['gamma']}"
            phrases.append(f"{where}: fewer than {minimum} batch sizes or than two runs")
        elif row["status"] != HOLDS:
            phrases.append(f"{row['setting']}, gamma = {row['gamma']}: {shape_phrase(row)}, typical run range "
                           f"{number(row['run_range'])}")
    held = [r for r in rows if r["status"] == HOLDS]
    if held:
        frame = pd.DataFrame(held)
        phrases.insert(0, f"{len(held)} of {len(rows)} (setting, gamma) curves rise then fall with small spread "
                          f"(peaks at B = {span(frame['peak_batch_size'], whole=True)}, "
                          f"smallest rise {number(frame['rise'].min())}, "
                          f"smallest fall {number(frame['fall'].min())}, largest typical run range "
                          f"{number(frame['run_range'].max())})")
    return join(*phrases, noise_phrase(rows))


def fig6_details(rows: list, beyond: float, minimum: int) -> str:
    """The details of Fig. 6's verdict (:func:`moesd.paper.verdicts.moe_above_dense`)."""
    phrases = []
    for row in rows:
        if not has(row, "above"):
            phrases.append(f"gamma = {row['gamma']}: fewer than three common batch sizes above "
                           f"{number(beyond, whole=True)} or {minimum} dense batch sizes")
            continue
        crossover = row["crossover"]
        fall = _keys(row, "dense_")
        phrases.append(f"gamma = {row['gamma']}: above beyond noise at {int(row['above'])} and below at "
                       f"{int(row['below'])} of {int(row['batch_sizes'])} batch sizes (median difference "
                       f"{number(row['median_difference'])}, median margin {number(row['median_margin'])}), "
                       f"MoE above from B = "
                       f"{number(crossover, whole=True) if np.isfinite(crossover) else 'nowhere'}; the dense speedup "
                       f"{fall_phrase(fall)} "
                       f"{_which(fall['falls_monotonically'], 'falls monotonically', 'does not fall monotonically')}")
    noise = join(noise_phrase(rows, "moe_noise").replace("noise", "MoE noise", 1),
                 noise_phrase(rows, "dense_noise").replace("noise", "dense noise", 1))
    return join(*phrases, noise)


def table3_details(table: pd.DataFrame, parameters: int) -> str:
    """The details of Table 3's verdict (:func:`moesd.paper.sparsity_verdicts.poor_coverage_worst_fits`) from its
    table: the worst fit's row, the poorly covering samples' m, both medians of the MSE, the well covering count,
    their scatter and the excess (in ``table.attrs``); or how few samples there were."""
    used = table[table["judged"]]
    poor, well = used[used["poor"]], used[~used["poor"]]
    if "pooled_scatter" not in table.attrs:
        return f"{len(poor)} poorly and {len(well)} well covering samples with m > {parameters}"
    worst = used.loc[used["mse"].idxmax()]
    scatter, excess = table.attrs["pooled_scatter"], table.attrs["pooled_excess"]
    return (f"the worst fit (m = {int(worst['m'])}, MSE {worst['mse']:.3g}) leaves out {int(worst['gap'])} "
            f"consecutive batch sizes ({'poor' if worst['poor'] else 'even'} coverage); poorly covering samples "
            f"(m = {', '.join(str(int(m)) for m in poor['m'])}) have median MSE {poor['mse'].median():.3g} against "
            f"{well['mse'].median():.3g} for the {len(well)} well covering ones (scatter {scatter:.3g}, "
            f"excess {excess / scatter if scatter else float('inf'):.1f} scatters)")
