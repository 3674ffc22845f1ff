"""The verdicts on the paper's claims in words: the statement judged, each reading's summary and sentence, the plain
sentence of a :class:`~moesd.paper.criteria.Verdict`, and a scorecard's words.
"""

from __future__ import annotations

import pandas as pd

from moesd.narration.details import details
from moesd.narration.phrases import judged_from, number, parts_phrase, span
from moesd.paper.criteria import CLAIMS, FAILS, FLUCTUATION_TOLERANCE, HOLDS, PARTLY_HOLDS, UNTESTABLE, Reading, Verdict


def statement(verdict: Verdict) -> str:
    """The claim as it was judged: its one-line statement with the verdict's options (Fig. 4's K that only fall,
    Fig. 6's batch size, the smallest batch size judged)."""
    options = verdict.options
    text = CLAIMS[verdict.claim].statement
    if verdict.claim == "Fig. 4" and "monotone_ks" in options:
        ks = options["monotone_ks"]
        text = text.replace("K = 1, 2 fall", f"K = {', '.join(map(str, ks))} {'falls' if len(ks) == 1 else 'fall'}")
    if verdict.claim == "Fig. 6" and "beyond" in options:
        text = text.replace("B > 16", f"B > {number(options['beyond'], whole=True)}")
    return judged_from(text, options.get("from_batch_size"))


def _reading(verdict: Verdict, reading: str) -> Reading:
    if reading not in ("material", "strict"):
        raise ValueError(f"reading must be 'material' or 'strict', not {reading!r}")
    return getattr(verdict, reading)


def summary(verdict: Verdict, reading: str = "material") -> str:
    """One line: a reading's status and the parts that are not shown, where (``reading``: ``"material"`` or
    ``"strict"``)."""
    chosen = _reading(verdict, reading)
    phrase = parts_phrase(chosen.parts)
    if phrase:
        return f"{chosen.status}: {phrase}"
    return chosen.status if chosen.status == HOLDS else f"{chosen.status}: {details(verdict)}"


def sentence(verdict: Verdict, reading: str = "material") -> str:
    """A reading in one sentence with its numbers: ``claim (statement): status - details.``."""
    return f"{verdict.claim} ({statement(verdict)}): {_reading(verdict, reading).status} - {details(verdict)}."


def worded(card: pd.DataFrame) -> pd.DataFrame:
    """A scorecard (:func:`moesd.paper.scorecard.scorecard`) with its verdicts' words as columns: ``summary`` and
    ``sentence`` (the material reading), ``strict_summary``, ``plain``."""
    verdicts = card["verdict"]
    return card.assign(summary=[summary(v) for v in verdicts], strict_summary=[summary(v, "strict") for v in verdicts],
                       plain=[plain(v) for v in verdicts], sentence=[sentence(v) for v in verdicts])


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


def plain(verdict: Verdict) -> str:
    """One sentence a student reads: the material status in the paper's terms, what the data show, and where the
    strict reading differs and why (the parts themselves are in the readings' summaries)."""
    claim, material, strict = verdict.claim, verdict.material, verdict.strict
    if material.status == UNTESTABLE and strict.status == UNTESTABLE:
        return f"{claim} is not testable here: {details(verdict)}."
    shows = _PLAIN.get(claim, lambda verdict: "")(verdict)
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


def _plain_fig2(verdict: Verdict) -> str:
    numbers = verdict.numbers
    row = _last_judged(numbers, "first")
    if row is None:
        return ""
    return (f"at gamma = {row['gamma']} the speedup rises from {number(row['first'])} to {number(row['peak'])} "
            f"(B = {number(row['peak_batch_size'], True)}) and falls to {number(row['last'])}, target efficiency "
            f"tracking it (rank correlation {row['rank_correlation']:.2f})")


def _plain_fig3(verdict: Verdict) -> str:
    numbers = verdict.numbers
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


def _plain_fig4(verdict: Verdict) -> str:
    numbers, material = verdict.numbers, verdict.material
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
                 f"{span(falls['attention_context'] / 1e3, whole=True)} thousand tokens of context here, against the "
                 f"{number(falls['study_context'].max(), True)} tokens measured")
    return text


def _plain_fig5(verdict: Verdict) -> str:
    numbers = verdict.numbers
    if "normalised_rises_then_falls" not in numbers:
        return ""
    judged = numbers[numbers["normalised_rises_then_falls"].notna()]
    return (f"{int(judged['normalised_rises_then_falls'].astype(bool).sum())} of {len(judged)} settings' "
            f"acceptance-normalised speedups rise then fall, with typical run ranges of "
            f"{span(judged['normalised_run_range'])} against rises of {span(judged['normalised_rise'])}")


def _plain_fig6(verdict: Verdict) -> str:
    numbers = verdict.numbers
    row = _last_judged(numbers, "normalised_above")
    if row is None:
        return ""
    beyond = number(verdict.options["beyond"], whole=True)
    return (f"at gamma = {row['gamma']} the MoE's acceptance-normalised speedup is above the dense pair's beyond "
            f"noise at {int(row['normalised_above'])} of the {int(row['normalised_batch_sizes'])} batch sizes past "
            f"{beyond} and below it at {int(row['normalised_below'])}, while the dense pair's falls from "
            f"{number(row['normalised_dense_first'])} to {number(row['normalised_dense_last'])}")


def _plain_table3(verdict: Verdict) -> str:
    numbers = verdict.numbers
    if "coverage" not in numbers or "median_coverage" not in numbers.attrs:
        return ""
    judged = numbers[numbers["judged"]]
    worst = judged.loc[judged["mse"].idxmax()]
    return (f"the worst fit (m = {int(worst['m'])}) covers {number(worst['coverage'])} of its curves' batch-size "
            f"ranges against a median of {number(numbers.attrs['median_coverage'])}, and coverage and error have a "
            f"rank correlation of {numbers.attrs['coverage_correlation']:.2f}")


_PLAIN = {"Fig. 2": _plain_fig2, "Fig. 3": _plain_fig3, "Fig. 4": _plain_fig4, "Fig. 5": _plain_fig5,
          "Fig. 6": _plain_fig6, "Table 3": _plain_table3}
