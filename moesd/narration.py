"""Every sentence the package writes about a result: the verdicts on the paper's claims and the
predictor's recommendation.

The criteria (:mod:`moesd.paper.criteria`), the claims (:mod:`moesd.paper.verdicts`) and the
recommendation (:mod:`moesd.predictor.recommend`) compute statuses, numbers and parts; the words are
written here only: numbers for prose, the phrases of each shape, the summary and sentence of a
:class:`~moesd.paper.criteria.Verdict` built from its typed parts, and the report ``moesd predict``
prints. A wording change touches this module alone, and tests assert fields, not sentences.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from moesd.paper.criteria import (CONTRADICTED, DETAIL, FAILS, FLUCTUATION_TOLERANCE, HOLDS, NOT_SHOWN,
                                  PARTLY_HOLDS,
                                  PART_COLUMNS, SHOWN, UNTESTABLE, Reading, Verdict)


def number(x, whole: bool = False) -> str:
    """A number for a sentence: two decimals, or whole (batch sizes and widths in batch sizes)."""
    return f"{x:.0f}" if whole else f"{x:.2f}"


def span(values, whole: bool = False) -> str:
    """``a`` or ``a-b`` (``a to b`` if negative): the range of some numbers, for a sentence."""
    low, high = number(min(values), whole), number(max(values), whole)
    return low if low == high else f"{low}-{high}" if min(values) >= 0 else f"{low} to {high}"


def judged_from(statement: str, smallest) -> str:
    """A claim's statement, with the smallest batch size judged when not all are."""
    return statement if smallest is None else f"{statement}; judged from B = {number(smallest, whole=True)}"


def shape_phrase(shape: dict) -> str:
    reversal = ("" if shape["unimodal"] else
                f"; reversal {number(shape['largest_reversal'])} beyond noise from B = "
                f"{number(shape['largest_reversal_from'], whole=True)} to {number(shape['largest_reversal_to'], whole=True)}")
    return (f"{number(shape['first'])} at the smallest B, {number(shape['peak'])} at B = "
            f"{number(shape['peak_batch_size'], whole=True)}, {number(shape['last'])} at the largest B "
            f"(rise {number(shape['rise'])}, fall {number(shape['fall'])}; noise margins "
            f"{number(shape['rise_margin'])}, {number(shape['fall_margin'])}{reversal})")


def shapes_phrase(rows, prefix: str = "") -> str:
    """The rise-then-fall numbers of several passing curves at once (``prefix`` names their columns)."""
    def values(key):
        return [row[prefix + key] for row in rows]
    margins = values("rise_margin") + values("fall_margin")
    return (f"{span(values('first'))} at the smallest B, {span(values('peak'))} at B = "
            f"{span(values('peak_batch_size'), whole=True)}, {span(values('last'))} at the largest B (rise "
            f"{span(values('rise'))}, fall {span(values('fall'))}; noise margins at most {number(max(margins))})")


def fall_phrase(fall: dict) -> str:
    bump = (f"largest rise {number(fall['largest_rise'])} from B = {number(fall['largest_rise_from'], whole=True)} to "
            f"{number(fall['largest_rise_to'], whole=True)}" if fall["largest_rise"] > 0 else "no rise anywhere")
    return (f"{number(fall['first'])} -> {number(fall['last'])} (fall {number(fall['fall'])}, margin "
            f"{number(fall['fall_margin'])}; {bump})")


def noise_phrase(rows, key: str = "noise") -> str:
    noise = sorted({row[key] for row in rows if key in row})
    return f"noise from {', '.join(noise)}" if noise else ""


def join(*phrases) -> str:
    return "; ".join(p for p in phrases if p)


def _parts_frame(notes) -> pd.DataFrame:
    parts = pd.DataFrame(list(notes), columns=list(PART_COLUMNS))
    parts["detectable"] = parts["detectable"].astype(float)
    return parts


def parts_phrase(parts: pd.DataFrame) -> str:
    """The parts of a reading that are not shown, grouped by part and outcome (contradicted first), with where and
    the range of the detectable effects of the parts within noise; details marked as such."""
    grouped = {}
    for part in parts[parts["outcome"] != SHOWN].itertuples(index=False):
        grouped.setdefault((part.outcome, part.part, part.role), []).append(part)
    order = (CONTRADICTED, NOT_SHOWN, UNTESTABLE)

    def places(group):
        wheres, prefix = [str(n.where) for n in group], "gamma = "
        text = (prefix + ", ".join(w[len(prefix):] for w in wheres)
                if all(w.startswith(prefix) and "," not in w for w in wheres) else "; ".join(wheres))
        sizes = [n.detectable for n in group if np.isfinite(n.detectable)]
        if sizes:
            unit = group[0].unit
            low, high = (f"{x:.0f}" if unit == "B" else f"{x:.2g}" for x in (min(sizes), max(sizes)))
            text += f"; detectable from {low if low == high else f'{low}-{high}'}{' ' + unit if unit else ''}"
        return text
    return "; ".join(f"{part}{' (a detail)' if role == DETAIL else ''} {outcome} ({places(group)})"
                     for (outcome, part, role), group in
                     sorted(grouped.items(), key=lambda item: (item[0][2] == DETAIL, order.index(item[0][0]))))


def reading(claim: str, statement: str, status: str, notes, details: str) -> Reading:
    """One :class:`Reading`: its parts, a summary (the status and the parts not shown) and a sentence
    ``claim (statement): status - details.``."""
    parts = _parts_frame(notes)
    phrase = parts_phrase(parts)
    summary = f"{status}: {phrase}" if phrase else status if status == HOLDS else f"{status}: {details}"
    return Reading(status, parts, summary, f"{claim} ({statement}): {status} - {details}.")


def verdict(claim: str, statement: str, statuses: dict, numbers, notes: dict, details: str) -> Verdict:
    """A :class:`Verdict` from both readings' statuses and notes (``(outcome, part, where, detectable, unit, role)``
    tuples), its numbers (rows) and the details of its sentences; the plain sentence from :func:`plain_reading`."""
    numbers = numbers if isinstance(numbers, pd.DataFrame) else pd.DataFrame(numbers)
    material = reading(claim, statement, statuses["material"], notes["material"], details)
    strict = reading(claim, statement, statuses["strict"], notes["strict"], details)
    return Verdict(claim, material, strict, numbers, plain_reading(claim, material, strict, numbers, details))


TOLERANCE_PHRASE = f"a quarter of the move it interrupts (FLUCTUATION_TOLERANCE = {FLUCTUATION_TOLERANCE:g})"

WHY_READINGS_DIFFER = {
    "Fig. 2": "on reversals smaller than the tolerance",
    "Fig. 3": "on dips and bumps smaller than the tolerance",
    "Fig. 4": "because it requires K = 1, 2 to fall at any context and leaves them out of the ordering",
    "Fig. 5": "on the run-to-run spread of the speedups as measured, whose runs differ in acceptance",
    "Fig. 6": "on the dense curve's early rise and the pairs' different acceptance",
    "Table 3": "with coverage pooled over the curves",
}
"""Why a claim's strict reading can differ from its material one, for the plain sentence."""


def status_verb(status: str) -> str:
    """A status as the verb of a sentence: ``holds``, ``partly holds``, ``does not hold``, ``is inconclusive``,
    ``is not testable here``."""
    return status if status in (HOLDS, PARTLY_HOLDS, FAILS) else f"is {status}"


def plain_reading(claim: str, material: Reading, strict: Reading, numbers: pd.DataFrame, details: str) -> str:
    """One sentence a student reads: the material status in the paper's terms, what the data show, and where the
    strict reading differs and why (the parts themselves are in the readings' summaries)."""
    if material.status == UNTESTABLE and strict.status == UNTESTABLE:
        return f"{claim} is not testable here: {details}."
    shows = _PLAIN.get(claim, lambda numbers, material: "")(numbers, material)
    text = f"{claim} {status_verb(material.status)} as the paper states it" + (f": {shows}" if shows else "")
    if strict.status != material.status:
        text += f"; read strictly it {status_verb(strict.status)}, {WHY_READINGS_DIFFER[claim]}"
    return text + "."


def _outcome(material: Reading, part: str) -> set:
    return set(material.parts.loc[material.parts["part"] == part, "outcome"])


def _last_judged(numbers: pd.DataFrame, key: str) -> dict | None:
    """The row of the largest gamma (or the last row) that has ``key``."""
    if key not in numbers:
        return None
    rows = numbers[numbers[key].notna()]
    return None if rows.empty else rows.iloc[-1].to_dict()


def _plain_fig2(numbers, material) -> str:
    row = _last_judged(numbers, "first")
    if row is None:
        return ""
    return (f"at gamma = {row['gamma']} the speedup rises from {number(row['first'])} to {number(row['peak'])} "
            f"(B = {number(row['peak_batch_size'], True)}) and falls to {number(row['last'])}, target efficiency "
            f"tracking it (rank correlation {row['rank_correlation']:.2f})")


def _plain_fig3(numbers, material) -> str:
    row = _last_judged(numbers, "moe_first")
    if row is None:
        return ""
    text = (f"at gamma = {row['gamma']} the MoE's efficiency goes {number(row['moe_first'])} -> "
            f"{number(row['moe_peak'])} (B = {number(row['moe_peak_batch_size'], True)}) -> {number(row['moe_last'])} "
            f"while the dense model's goes {number(row['dense_first'])} -> {number(row['dense_last'])}")
    judged = numbers[numbers["moe_first"].notna()]
    dips = judged[~judged["moe_unimodal"].astype(bool)]
    if len(dips):
        dip = dips.loc[dips["moe_largest_reversal"].idxmax()]
        text += (f"; the MoE's dip of {dip['moe_largest_reversal']:.3f} from B = "
                 f"{number(dip['moe_largest_reversal_from'], True)} to {number(dip['moe_largest_reversal_to'], True)} "
                 f"(gamma = {dip['gamma']}) is {number(dip['moe_largest_reversal_share'])} of the move it interrupts")
        if dip["moe_largest_reversal_from"] == dip["first_batch_size"] and "predicted_first" in judged:
            predicted = dip["predicted_first"] - dip["predicted_second"]
            text += (f", and where a step is its bytes Eq. 8 predicts {'a dip' if predicted > 0 else 'no dip'} there "
                     f"({dip['predicted_first']:.3f} -> {dip['predicted_second']:.3f})")
    bumps = judged[judged["dense_rises_beyond_noise"].astype(bool)]
    if len(bumps):
        bump = bumps.loc[bumps["dense_largest_rise"].idxmax()]
        text += (f"; the dense curve's largest bump, {bump['dense_largest_rise']:.3f} from B = "
                 f"{number(bump['dense_largest_rise_from'], True)} to {number(bump['dense_largest_rise_to'], True)}, "
                 f"is {number(bump['dense_largest_rise_share'])} of its fall")
    return text


def _plain_fig4(numbers, material) -> str:
    if "role" not in numbers:
        return ""
    gamma = numbers["gamma"].max()
    rows = numbers[numbers["gamma"] == gamma]
    text = (f"at gamma = {gamma} the peaks lie at B = "
            + ", ".join(f"{number(r.peak_batch_size, True)} (K = {r.K})" for r in rows.itertuples()))
    if _outcome(material, "the wider range") == {UNTESTABLE}:
        text += f"; whether the range widens cannot be seen on a grid that ends at B = {number(rows['largest_batch_size'].max(), True)}"
    falls = rows[rows["role"] == "monotone"]
    if len(falls) and "attention_context" in falls and falls["attention_context"].notna().all():
        rising = falls[falls["fall"] < -falls["fall_margin"]]
        ks = ", ".join(str(k) for k in sorted(falls["K"]))
        if len(rising):
            text += (f"; K = {', '.join(str(k) for k in sorted(rising['K']))} rise, as the paper's theory predicts "
                     f"below their T_thres")
        text += (f"; the paper explains K = {ks}'s fall by attention dominating a step, which by bytes needs "
                 f"{span(falls['attention_context'] / 1e3, whole=True)} thousand tokens of context here, against "
                 f"{number(falls['study_context'].max(), True)} measured")
    return text


def _plain_fig5(numbers, material) -> str:
    if "normalised_rises_then_falls" not in numbers:
        return ""
    judged = numbers[numbers["normalised_rises_then_falls"].notna()]
    return (f"{int(judged['normalised_rises_then_falls'].astype(bool).sum())} of {len(judged)} settings' "
            f"acceptance-normalised speedups rise then fall, with typical run ranges of "
            f"{span(judged['normalised_run_range'])} against rises of {span(judged['normalised_rise'])}")


def _plain_fig6(numbers, material) -> str:
    row = _last_judged(numbers, "normalised_above")
    if row is None:
        return ""
    return (f"at gamma = {row['gamma']} the MoE's acceptance-normalised speedup is above the dense pair's beyond "
            f"noise at {row['normalised_above']} of the {row['normalised_batch_sizes']} batch sizes past 16 and below it "
            f"at {row['normalised_below']}, while the dense pair's falls from {number(row['normalised_dense_first'])} "
            f"to {number(row['normalised_dense_last'])}")


def _plain_table3(numbers, material) -> str:
    if "coverage" not in numbers or "median_coverage" not in numbers.attrs:
        return ""
    judged = numbers[numbers["judged"]]
    worst = judged.loc[judged["mse"].idxmax()]
    return (f"the worst fit (m = {int(worst['m'])}) covers {number(worst['coverage'])} of its curves' batch-size "
            f"ranges against a median of {number(numbers.attrs['median_coverage'])}, and coverage and error have a "
            f"rank correlation of {numbers.attrs['coverage_correlation']:.2f}")


_PLAIN = {"Fig. 2": _plain_fig2, "Fig. 3": _plain_fig3, "Fig. 4": _plain_fig4, "Fig. 5": _plain_fig5,
          "Fig. 6": _plain_fig6, "Table 3": _plain_table3}


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
        if "first" not in row:
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
        if "moe_first" not in row:
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
        if "first" not in row:
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


FEWER_THAN_TWO_SETTINGS = "fewer than two settings"


def fig6_details(rows: list, beyond: float, minimum: int) -> str:
    """The details of Fig. 6's verdict (:func:`moesd.paper.verdicts.moe_above_dense`)."""
    phrases = []
    for row in rows:
        if "above" not in row:
            phrases.append(f"gamma = {row['gamma']}: fewer than three common batch sizes above "
                           f"{number(beyond, whole=True)} or {minimum} dense batch sizes")
            continue
        crossover = row["crossover"]
        fall = _keys(row, "dense_")
        phrases.append(f"gamma = {row['gamma']}: above beyond noise at {row['above']} and below at {row['below']} of "
                       f"{row['batch_sizes']} batch sizes (median difference {number(row['median_difference'])}, "
                       f"median margin {number(row['median_margin'])}), MoE above from B = "
                       f"{number(crossover, whole=True) if np.isfinite(crossover) else 'nowhere'}; the dense speedup "
                       f"{fall_phrase(fall)} "
                       f"{_which(fall['falls_monotonically'], 'falls monotonically', 'does not fall monotonically')}")
    noise = join(noise_phrase(rows, "moe_noise").replace("noise", "MoE noise", 1),
                 noise_phrase(rows, "dense_noise").replace("noise", "dense noise", 1))
    return join(*phrases, noise)


NO_COMMON_GAMMA = "the e2e and dense studies share no gamma"
NO_ROBUSTNESS = "no robustness study given"


def table3_too_few(poor: int, well: int, parameters: int) -> str:
    return f"{poor} poorly and {well} well covering samples with m > {parameters}"


def table3_details(worst, poor_m, poor_mse: float, well_mse: float, well: int, scatter: float, excess: float) -> str:
    """The details of Table 3's verdict (:func:`moesd.paper.verdicts.poor_coverage_worst_fits`): the worst
    fit's row, the poorly covering samples' m, both medians of the MSE, the well covering count, their scatter
    and the excess."""
    return (f"the worst fit (m = {int(worst['m'])}, MSE {worst['mse']:.3g}) leaves out {int(worst['gap'])} "
            f"consecutive batch sizes ({'poor' if worst['poor'] else 'even'} coverage); poorly covering samples "
            f"(m = {', '.join(str(int(m)) for m in poor_m)}) have median MSE {poor_mse:.3g} against "
            f"{well_mse:.3g} for the {well} well covering ones (scatter {scatter:.3g}, "
            f"excess {excess / scatter if scatter else float('inf'):.1f} scatters)")


# ---- The predictor's recommendation (moesd predict) -----------------------------------------------

def batch_runs(chosen, sizes) -> str:
    """The batch sizes ``chosen`` out of ``sizes`` as unbroken runs: ``B = 1, 4-256``."""
    sizes = np.asarray(sizes)
    inside = np.isin(sizes, np.asarray(chosen))
    starts = np.flatnonzero(inside & ~np.r_[False, inside[:-1]])
    ends = np.flatnonzero(inside & ~np.r_[inside[1:], False])
    return "B = " + ", ".join(f"{sizes[a]}" if a == b else f"{sizes[a]}-{sizes[b]}" for a, b in zip(starts, ends))


def where_sd_pays(advice, margin: float) -> str:
    """Where SD is on, marginal or off at one acceptance value (a :class:`moesd.predictor.recommend.Advice`),
    and whether the host cost decides it; not judged where nothing fits."""
    sizes = advice.best["batch_size"].to_numpy()
    if not advice.judged:
        return "not judged: nothing fits (the speedups below assume a batch size did)"
    if not len(advice.on) and not len(advice.marginal):
        text = "SD's error band reaches 1 or below at every one of these batch sizes: leave it off"
    else:
        parts = [f"SD pays (the best speedup's error band above {1 + margin:g}) at {len(advice.on)} of {len(sizes)} "
                 "batch sizes"
                 + (f", {batch_runs(advice.on, sizes)}" if len(advice.on) else "")]
        if len(advice.marginal):
            parts.append(f"marginal (the band's low end 1-{1 + margin:g}) at {batch_runs(advice.marginal, sizes)}")
        text = "; ".join(parts)
    if advice.host_decides:
        text += (f" (this depends on the host cost: at --host-ms {advice.other_host_ms:.2g} SD is on at "
                 + (batch_runs(advice.on_at_other_host, sizes) if len(advice.on_at_other_host) else "no batch size")
                 + ")")
    return text


def _thinned(best: pd.DataFrame) -> pd.DataFrame:
    """A readable table: the powers of two and the ends, when there are more than 24 rows."""
    if len(best) <= 24:
        return best
    keep = {int(b) for b in best["batch_size"] if b & (b - 1) == 0} | {int(best["batch_size"].iloc[0]),
                                                                       int(best["batch_size"].iloc[-1])}
    return best[best["batch_size"].isin(keep)]


def acceptance_label(advice, length: str | None = None) -> str:
    """``alpha = 0.8``: the acceptance value of an advice; with ``length`` (``--acceptance-length``'s ``L@g``)
    the first draft position's alpha it gave."""
    if length is None:
        return f"{advice.column} = {advice.value:g}"
    return f"alpha = {advice.value:.3f} (the first draft position's, from --acceptance-length {length})"


def peak_edge_phrase(advice) -> str:
    """Where the peak lies at an end of the batch sizes asked for, and which way to look further."""
    if advice.peak_edge is None:
        return ""
    return (f" (at the {advice.peak_edge} batch size asked; try "
            f"{'larger' if advice.peak_edge == 'largest' else 'smaller'} --batch)")


def advice_report(advice, margin: float, length: str | None = None) -> str:
    """One acceptance value's headline and table of the best gamma per batch size (``length``: as
    :func:`acceptance_label` takes it)."""
    shown = _thinned(advice.best)
    table = shown.assign(t_target_1=shown["t_target_1"] * 1e3, t_target_gamma=shown["t_target_gamma"] * 1e3,
                         t_draft=shown["t_draft"] * 1e3)[
        ["batch_size", "gamma", "speedup", "speedup_low", "speedup_high", "sd", "target_efficiency", "draft_term",
         "t_target_1", "t_target_gamma", "t_draft"]].rename(columns={
            "gamma": "best gamma", "speedup_low": "band low", "speedup_high": "band high", "sd": "SD",
            "t_target_1": "T_T(B,1) ms", "t_target_gamma": "T_T(B,g+1) ms", "t_draft": "T_D(B,1) ms"})
    band = (", the paper's x / sqrt(2) band (>= peak / sqrt(2) and > 1) "
            + (f"B = {advice.band[0]}" if advice.band[0] == advice.band[1] else f"B = {advice.band[0]}-{advice.band[1]}")
            if advice.band else "")
    return (f"\n{acceptance_label(advice, length)}: {where_sd_pays(advice, margin)}; peak speedup {advice.peak:.2f}x "
            f"at B = {advice.peak_batch_size}{peak_edge_phrase(advice)}{band}"
            + (" (rows shown: powers of two and the ends)" if len(shown) < len(advice.best) else "") + "\n"
            + table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))



def routing_source_line(name: str) -> str:
    """The line ``moesd predict`` prints for ``--routing-source``: whose routing prices the experts, under what licence."""
    from moesd.routing import sources

    info = sources.info(name)
    return (f"routing: the experts of each MoE layer are priced under {name}'s per-layer popularity ({info.checkpoint}, "
            f"{info.licence}; recorded layers mapped onto the target's in turn), tokens drawn independently; default "
            "uniform routing (Eq. 8)")

def predict_setup(setup, target: str, draft: str, other_host_ms: float) -> str:
    """The first line of ``moesd predict``: the deployment (a :class:`moesd.predictor.setup.Setup`, its models as
    ``target`` and ``draft`` name them) and what the model prices (the draft's dtype, a tree's candidates and verified
    tokens, the KV cache's dtype, the sampling temperature where not the defaults; the nodes a ``tp`` beyond one node
    spans)."""
    hardware, tp = setup.hardware, setup.tp
    nodes = (f"; --tp {tp} spans {-(-tp // hardware.gpus_per_node)} nodes of {hardware.gpus_per_node} "
             f"{hardware.name} joined by their network" if tp > hardware.gpus_per_node else "")
    parallel = f"ep {setup.ep}" + (", attention data-parallel" if setup.dp_attention else "")
    drafting = ", ".join(part for part in [
        f"{setup.draft_dtype} weights" if setup.draft_dtype not in (None, setup.dtype) else "",
        f"{setup.draft_topk} candidates per position" if setup.draft_topk != 1 else "",
        f"{setup.tree_tokens} tokens verified per sequence" if setup.tree_tokens is not None else ""] if part)
    where = ("(no GPU pass: the drafts are looked up in the context)" if setup.drafting == "free"
             else f"on {setup.draft_gpus} GPU(s)")
    extras = "".join([f", {setup.kv_dtype} KV cache" if setup.kv_dtype else "",
                      f", sampling at temperature {setup.temperature:g}" if setup.temperature else
                      (", greedy verification" if setup.temperature == 0 else "")])
    line = (f"{target} on {tp} x {hardware.name} ({parallel}), draft {draft} {where}"
            + (f" ({drafting})" if drafting else "")
            + f", {setup.dtype}{extras}, context {setup.context} tokens{nodes}; speedup of Eq. 4 predicted by "
            "moesd.predictor.predict ")
    step_ms = None if setup.step_seconds is None else setup.step_seconds * 1e3
    if setup.engine is not None or step_ms is not None:
        return line + ("(roofline at achieved fractions of data-sheet peaks"
                       + (f", {setup.engine.name}'s profile" if setup.engine is not None else "")
                       + (f", a fixed cost per forward pass that makes the plain step at B = {setup.step_batch_size} "
                          f"your measured {step_ms:g} ms" if step_ms is not None else "")
                       + (f", the round at gamma {setup.sd_step_gamma} your measured "
                          f"{setup.sd_step_seconds * 1e3:g} ms" if setup.sd_step_seconds is not None else "") + ")")
    host_ms = setup.host_seconds * 1e3
    return (line + f"(roofline at achieved fractions of data-sheet peaks, host cost {host_ms:g} ms per forward pass"
            + (f"; for a serving engine give --engine-profile and --step-ms, or --host-ms a host cost per forward "
               f"pass, e.g. {other_host_ms:.2g} ms from vLLM v0's own profile, moesd.paper.predictor_check"
               if host_ms == 0 else "") + ")")


def band_line(recommendation, margin: float) -> str:
    """What the error band is (:class:`moesd.predictor.band.ErrorBand`) and how the SD calls use it."""
    band = recommendation.band
    how = {"device": "the GPUs' work only", "profile": "an engine profile without a measured step",
           "anchored": "an engine profile and a measured plain step"}[band.variant]
    return (f"error band: published speedups have come out at {band.low:.2f}x to {band.high:.2f}x of predictions "
            f"made as this one is ({how}; the range over the {band.points} points of {band.sources} sources in "
            f"data/engines/published_speedups.csv, which held for {band.loso_covered} of them when each source was "
            f"left out of the calibration); SD is on only where the band's low end exceeds {1 + margin:g}")


def engine_range(engine: str, recommendation, length: str | None = None) -> str:
    """The sensitivity line: where SD is on at both ends of an engine profile's published cost ranges (``length``:
    as :func:`acceptance_label` takes it); the constants' spread, not the model's error (that is the band)."""
    sizes = recommendation.judged
    lines = [f"\nsensitivity to {engine}'s published cost ranges (moesd.predictor.engine.ENGINES; the constants' "
             "spread, not the model's error):"]
    for advice, low, high in zip(recommendation.advice, *(recommendation.engine_ends[e] for e in ("low", "high"))):
        runs = [batch_runs(on, sizes) if len(on) else "no batch size" for on in (low, high)]
        lines.append(f"  {acceptance_label(advice, length)}: SD is on at {runs[0]} with the costs that favour it, "
                     f"at {runs[1]} with those that disfavour it")
    return "\n".join(lines)


STEP_NOTE = ("note: a measured plain step (--step-ms, at --step-batch sequences) makes the prediction clearly more "
             "accurate against published engine measurements: the book's chapter \"Where SD pays\", section "
             "\"Against serving engines\", scores the profile with and without one")
"""What ``moesd predict --engine-profile`` without ``--step-ms`` notes."""


def predict_notes(recommendation, setup) -> list:
    """Notes on the draft (an EAGLE-3 head's own vocabulary; a head priced on GPUs of its own; the n-gram drafter's
    zero draft cost), on sampling at a temperature, and :data:`STEP_NOTE` for an engine profile without a measured
    step."""
    notes = [STEP_NOTE] if setup.engine is not None and setup.step_seconds is None else []
    if setup.temperature:
        notes.append("note: at a temperature above 0 give the acceptance measured at that temperature (rejection "
                     "sampling accepts fewer drafts than greedy verification); the plain step and the round pay "
                     "the sampling kernels over the vocabulary (moesd.predictor.kernels.sampling_time)")
    if setup.drafting == "free":
        notes.append("note: the n-gram drafter looks its drafts up in the context on the host: its draft cost is "
                     "priced at zero, and its acceptance is the text's (give the one measured on your workload)")
    if not recommendation.draft_head:
        return notes
    target_vocab, draft_vocab = recommendation.vocabularies
    parts = []
    if draft_vocab != target_vocab:
        parts.append(f"the draft is an EAGLE-3 head; its {draft_vocab}-token vocabulary maps onto the target's "
                     f"{target_vocab} tokens")
    if setup.drafting != "free" and setup.draft_gpus < setup.tp:
        parts.append(f"engines run a draft head on the target's GPUs: --draft-tp {setup.tp} prices that, --draft-tp "
                     f"{setup.draft_gpus} prices it on {setup.draft_gpus} GPU(s) of its own")
    return ([f"note: {'; '.join(parts)}"] if parts else []) + notes


def memory_lines(recommendation, batch_sizes) -> list:
    """What does not fit, with the changes that make more of ``batch_sizes`` fit
    (:class:`moesd.predictor.recommend.Shortfall`), and which batch sizes the advice covers."""
    batch = np.asarray(batch_sizes)
    hardware = recommendation.hardware
    lines = []
    for short in recommendation.shortfalls:
        flag, dtype = ("--tp", "--dtype") if short.role == "target" else ("--draft-tp", "--draft-dtype")
        remedies = ([f"{flag} {' or '.join(map(str, short.more_gpus))}"] if short.more_gpus else []) \
            + ([f"--dp-attention at --tp {' or '.join(map(str, short.dp_attention_gpus))}"]
               if short.dp_attention_gpus else []) \
            + ([f"{dtype} {' or '.join(short.smaller_dtypes)}"] if short.smaller_dtypes else []) \
            + (["a shorter --context"] if short.shorter_context else [])
        lines.append(f"does not fit: the {short.role}'s weights and KV cache"
                     + (" (with the draft head's on the same GPUs)" if short.holds_draft else "")
                     + f" need {short.largest_bytes / 1e9:.0f} GB per GPU at B = {batch.max()}"
                     + (f" ({short.smallest_bytes / 1e9:.0f} GB at B = {batch.min()})" if len(batch) > 1 else "")
                     + f" on {short.gpus} GPU(s); one {hardware.name} holds {short.capacity_bytes / 1e9:.0f} GB"
                     + (f" (try {'; '.join(remedies)})." if remedies else
                        "; no other GPU count, dtype or context moesd prices makes more of them fit."))
    fits = recommendation.fits
    if not fits.all():
        lines.append(f"Only B <= {batch[fits].max()} fits ({fits.sum()} of {len(batch)} batch sizes; activations and "
                     "the engine's workspace not counted); the summary below covers those." if fits.any()
                     else "No batch size fits; the numbers below assume one did.")
    return lines


def sd_legend(margin: float) -> str:
    """The last paragraph of ``moesd predict``: what on, marginal and off mean and what the table's terms are."""
    return (f"\nSD: on where the low end of the best gamma's error band (band low) exceeds {1 + margin:g}, marginal "
            f"where it exceeds 1 by less (a margin of {100 * margin:g} %), else off: off unless the band is above 1. "
            "draft_term: gamma T_D(B,1) / T_T(B,1), the draft's "
            "share of Eq. 4's denominator; target_efficiency: T_T(B,1) / T_T(B,gamma+1), where T_T(B,g+1) is the "
            "verification pass (of a tree's verified tokens for a tree).")


# ---- Trained routing: Fig. 1 judged on trained routers, popularity-routed studies ------------------

_UNTESTABLE = {
    "windows": "measured windows of consecutive tokens (too few sequences)",
    "batches": "batches of sequences (too few sequences per layer)",
    "decode": "decoding: every source routed given text in one pass (a prefill), none generated tokens",
    "paper_models": "the paper's own routers (DeepSeek-V2-Lite-Chat, Qwen1.5-MoE-Chat): no open data of them here",
}


def fig1_summary(judgement) -> str:
    """One line: the Fig. 1 claim's status on trained routers under both readings."""
    return (f"Fig. 1 on trained routers: {judgement.status} (material reading: within "
            f"{100 * (1 - judgement.tolerance):.0f} % of Eq. 8); {judgement.strict_status} (strict: beyond noise)")


def fig1_sentence(judgement) -> str:
    """What the judgement says per part, in words: the skew per model, the windows, and what was not testable."""
    parts = judgement.parts
    skew = parts[(parts["part"] == "skew") & (parts["scope"] != "all")]
    models = "; ".join(f"{row.scope}: {row.material} (worst {number(row.worst_ratio)} of Eq. 8, {row.where})"
                       for row in skew.itertuples())
    windows = parts[parts["part"] == "windows"].iloc[0]
    window_text = (f"windows of consecutive tokens: {windows['material']} (worst {number(windows['worst_ratio'])} of "
                   f"Eq. 8, {windows['where']})" if windows["material"] != UNTESTABLE else "")
    untestable = "; ".join(_UNTESTABLE.get(part, part) for part, _ in judgement.untestable)
    return join(f"Skew alone, per model: {models}", window_text, f"Not testable here: {untestable}")


def popularity_peak_sentence(comparison, predicted_change: float) -> str:
    """The measured change of the target-efficiency peak under popularity routing, its noise, and the prediction."""
    within = abs(comparison.peak_change) <= 3 * comparison.peak_change_se
    return (f"Under popularity routing the peak moved from {number(comparison.uniform_peak['value'])} at B = "
            f"{comparison.uniform_peak['batch_size']} to {number(comparison.popularity_peak['value'])} at B = "
            f"{comparison.popularity_peak['batch_size']}: a change of {comparison.peak_change:+.3f} "
            f"(standard error {comparison.peak_change_se:.3f}, {'within' if within else 'beyond'} three standard "
            f"errors), against {predicted_change:+.3f} predicted")
