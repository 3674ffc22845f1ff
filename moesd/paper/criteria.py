"""The criteria of the verdicts: each measured claim of the paper as the paper states it, its parts, and two readings.

Written and committed on 2026-12-06 before any verdict was re-run under them (the statuses these criteria give the
shipped data were not looked at while writing them). The noise model and the shape tests they use are in
:mod:`moesd.paper.curves`; the claims are judged in :mod:`moesd.paper.verdicts`; a verdict holds statuses,
parts, numbers and reason codes, and :mod:`moesd.narration` words it.

Two readings
------------
Every claim is judged twice, on the same numbers:

* the **strict** reading (the project's criteria until 2026-12-05): every part of :data:`CLAIMS` is required, and
  any departure beyond run-to-run noise (``NOISE_Z`` standard errors) counts against the claim: a reversal of a
  rise, a bump on a fall, a curve of another acceptance;
* the **material** reading, the claim as the paper states it: only the parts the paper asserts as its finding
  decide (role :data:`CLAIM`; parts the paper reports about its own runs are :data:`DETAIL`), curves about the
  systemic side are compared with acceptance normalised out where the claim is about the systemic side
  (Figs. 5, 6), and a local fluctuation counts only where it exceeds both its noise margin and
  :data:`FLUCTUATION_TOLERANCE` of the move it interrupts.

The tolerance comes from the paper's own standard. Its Appendix A.1 (Fig. 5, panel c) calls a curve with local
ups and downs a "sawtooth" *decline*, attributing the teeth to GPU tile "quantization effects" (NVIDIA's matrix
multiplication guide): a curve is described by its dominant move, and a tooth smaller than the move does not
change the description. We take "smaller" as under a quarter of the move it interrupts (the rise for a reversal
before a peak, the fall for a bump on a falling curve, each measured on the curve itself), a fraction fixed here
without reference to any measured curve; the numbers table reports each curve's largest counter-move as a share
of its move, so a reader can see how far each verdict lies from the tolerance and apply another.

Statuses
--------
A reading's status comes from its parts, each :data:`SHOWN` by the data, :data:`CONTRADICTED` (its opposite is
beyond the reading's threshold), :data:`NOT_SHOWN` (within noise either way; the smallest effect the study could
have shown is reported) or :data:`UNTESTABLE` (the data cannot speak to it here, with the reason in numbers).

* strict: :data:`FAILS` if any part is contradicted, else :data:`INCONCLUSIVE` if any is not shown, else
  :data:`UNTESTABLE` if any is untestable, else :data:`HOLDS` (:func:`strict_status`);
* material, over the :data:`CLAIM` parts: :data:`HOLDS` when every one is shown; :data:`FAILS` when some are
  contradicted and none is shown; :data:`PARTLY_HOLDS` when some are shown and the others contradicted or not
  testable here; :data:`INCONCLUSIVE` when none is contradicted and some is within noise; :data:`UNTESTABLE`
  when none can be tested (:func:`material_status`).

Which studies are judged on the first page is a rule about the measurement's regime, not about the claim:
:func:`moesd.measure.regime.in_regime`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from moesd.paper.curves import Curve, peak_region

HOLDS = "holds"
PARTLY_HOLDS = "partly holds"
FAILS = "does not hold"
INCONCLUSIVE = "inconclusive"
"""No part of the claim is contradicted by the data, and some part is within noise: the study could not tell."""
UNTESTABLE = "not testable here"
"""The data cannot speak to the claim (or part) here: a study is missing, stopped part-way, or outside the regime
or the range the claim is about; the reason says what would make it testable."""
STATUSES = (HOLDS, PARTLY_HOLDS, FAILS, INCONCLUSIVE, UNTESTABLE)

SHOWN = "shown"
"""A part the data show beyond the reading's threshold."""
CONTRADICTED = "contradicted by the data"
"""A part whose opposite the data show (a reversal beyond the threshold, a fall from the smallest B where the
claim says rise, a spread larger than the shape)."""
NOT_SHOWN = "not shown beyond noise"
"""A part the data neither show nor contradict: the effect, if there, is within the noise margin."""
OUTCOMES = (SHOWN, CONTRADICTED, NOT_SHOWN, UNTESTABLE)

CLAIM = "claim"
"""A part the paper asserts as its finding: it decides the material reading."""
DETAIL = "detail"
"""A part the paper reports about its own runs (their spread, a local feature): judged, shown, not deciding the
material reading."""

FLUCTUATION_TOLERANCE = 0.25
"""Share of the move it interrupts that a counter-move must exceed to count in the material reading (the module
docstring gives the rationale)."""

PART_COLUMNS = ("outcome", "part", "where", "detectable", "unit", "role")
"""Columns of :attr:`Reading.parts`."""


@dataclass(frozen=True)
class Claim:
    """One claim of the paper, as the paper states it, and how each reading judges it.

    Attributes
    ----------
    name : str
        ``"Fig. 2"`` ... ``"Table 3"``.
    statement : str
        The claim in one line (what the verdict's sentence names).
    paper : str
        What the paper says, from the digest ``paper/MOESD.md`` (its sections named; quotation marks only where the
        digest quotes the paper).
    claim_parts, detail_parts : tuple of str
        The parts that decide the material reading, and those reported beside it.
    material, strict : str
        How each reading judges the parts.
    """

    name: str
    statement: str
    paper: str
    claim_parts: tuple
    detail_parts: tuple
    material: str
    strict: str


CLAIMS = {claim.name: claim for claim in (
    Claim("Fig. 2", "the MoE speedup rises then falls with B, and target efficiency tracks that shape",
          'Fig. 2 (digest Secs. 6 and 8): the SD speedup against batch size rises then falls (expert-loading '
          'saturation, then compute-boundness), and target efficiency tracks this shape; the acceptance rate '
          '"merely fluctuates within a small range".',
          ("the speedup's rise then fall", "the efficiency's rise then fall", "the efficiency tracking the speedup"),
          (),
          "per gamma: each curve rises to an interior peak and falls, rise and fall beyond noise, no reversal beyond "
          "noise and the tolerance; efficiency and speedup rank-correlated with overlapping peak regions",
          "the same with every reversal beyond noise counted"),
    Claim("Fig. 3", "MoE target efficiency rises then falls with B, the dense model's only falls",
          'Fig. 3 (digest Secs. 1 and 6; target efficiency, Qwen2-57B-A14B against OPT-30b): for the MoE the curve '
          'first rises, then falls; for dense models it falls monotonically (the paper\'s contribution 1).',
          ("the MoE efficiency's rise then fall", "the dense efficiency's fall"), (),
          "per gamma: the MoE curve rises then falls, the dense curve falls overall beyond noise, counter-moves "
          "counted only beyond noise and the tolerance",
          "the same with every counter-move beyond noise counted"),
    Claim("Fig. 4", "as K falls the peak batch size grows and the range with speedup >= x/sqrt(2) widens; "
          "K = 1, 2 fall monotonically",
          'Fig. 4 (digest Secs. 6 and 8; Qwen2-57B-A14B with K edited): smaller rho gives a larger peak batch size and '
          'a wider range with speedup >= x/sqrt(2); K = 1, 2 are monotone decreasing, which the authors attribute '
          'to Amdahl: the model becomes attention-dominated (the caveat of Sec. 3.2: if attention dominates, '
          'Amdahl\'s law limits the effect of sparsity).',
          ("the later peak", "the wider range", "K = 1, 2's fall"), (),
          "per gamma: the peak regions grow as K falls over every K measured (K = 1, 2 included); the range above "
          "x/sqrt(2) widens (not testable where the densest K's range reaches past the largest B measured); "
          "K = 1, 2's fall is testable only where the study's context makes attention dominate the step "
          "(moesd.paper.verdicts.attention_dominated_context), as the paper's explanation requires",
          "K = 1, 2 fall monotonically (any rise beyond noise counts); the other K's peak regions grow and their "
          "ranges widen"),
    Claim("Fig. 5", "the rise-then-fall holds in every setting, with small run-to-run spread",
          'Fig. 5 (digest Sec. 6; datasets x temperatures, five runs and their mean): the rise-then-fall holds '
          'everywhere; run-to-run variance is tiny (fixed seed); panel (c) shows a "sawtooth" decline attributed '
          'to GPU tile "quantization effects".',
          ("the rise then fall",), ("the small run-to-run spread",),
          "on the acceptance-normalised speedup speedup / (sigma (gamma + 1)) of each run (the settings differ in "
          "acceptance; the claim is that the systemic shape survives them): each setting's curve rises then falls, "
          "counter-moves counted beyond noise and the tolerance; the spread is reported as a detail",
          "on the speedup as measured, each setting rises then falls with no reversal beyond noise, and the "
          "typical run range is below each part of the shape beyond noise"),
    Claim("Fig. 6", "the MoE's SD speedup is above the dense pair's for B > 16, and the dense pair's only falls",
          'Fig. 6 (digest Sec. 6; end-to-end speedup, MoE against dense): the MoE rises then falls, dense keeps '
          'falling; the MoE\'s advantage is clearer "when batch size exceeds 16".',
          ("the MoE above the dense pair", "the dense speedup's fall"), (),
          "on acceptance-normalised speedups (the MoE and dense pairs run at different acceptance; the claim is "
          "about the systemic side): the MoE above the dense pair beyond noise at most batch sizes past 16 and "
          "below it at none; the dense curve falls overall, counter-moves counted beyond noise and the tolerance",
          "on speedups as measured, every counter-move of the dense curve beyond noise counted"),
    Claim("Table 3", "the worst fits are those whose samples cover the batch sizes poorly",
          'Table 3 (digest Sec. 4, App. C.3): the fit is good except for m = 10 (too few points), m = 12 (no B > 40) '
          'and m = 13 (no B in 1-24); advice: prefer uniform coverage of batch sizes over more points.',
          ("the worst fit covering poorly", "the poorly covering samples' larger error"), (),
          "coverage per curve: a sample's coverage is the mean over the design's (K, gamma) curves of the share of "
          "the curve's batch sizes inside the range the sample measures on it; among samples of more points than "
          "the model's parameters, the worst fit's coverage lies below the median coverage, and coverage and MSE "
          "are negatively rank-correlated (one-sided 5 %)",
          "coverage pooled over curves: the worst fit's sample leaves out a longer run of batch sizes than an even "
          "spread would, and poorly covering samples' median MSE exceeds the others' by more than the noise"),
)}
"""The paper's measured claims and their criteria, by figure or table."""


@dataclass(frozen=True)
class Reading:
    """One reading of a claim: its status and the parts that decided it (:mod:`moesd.narration` words it).

    Attributes
    ----------
    status : str
        One of :data:`STATUSES`.
    parts : pandas.DataFrame
        One row per part and place (:data:`PART_COLUMNS`): ``outcome`` (:data:`OUTCOMES`), ``part``, ``where``
        (e.g. ``gamma = 4``), ``detectable`` (for a part not shown: the smallest effect the study could have
        shown, in ``unit``; else NaN), ``unit`` and ``role`` (:data:`CLAIM` or :data:`DETAIL`).
    """

    status: str
    parts: pd.DataFrame

    @classmethod
    def from_notes(cls, status: str, notes) -> Reading:
        """A reading of ``status`` from its part notes, ``(outcome, part, where, detectable, unit, role)`` tuples."""
        parts = pd.DataFrame(list(notes), columns=list(PART_COLUMNS))
        parts["detectable"] = parts["detectable"].astype(float)
        return cls(status, parts)


NO_STUDY = "no study"
"""Reason code: a study the claim reads is missing or stopped part-way (``options["studies"]`` names them)."""
NO_COMMON_PASS = "no common pass"
"""Reason code: the forward studies share no pass of ``gamma + 1`` tokens (``options["gammas"]``)."""
NO_COMMON_GAMMA = "no common gamma"
"""Reason code: the e2e and dense studies share no gamma."""
FEWER_THAN_TWO_SETTINGS = "fewer than two settings"
"""Reason code: a settings study of one setting has nothing to hold across."""
NO_ROBUSTNESS = "no robustness study"
"""Reason code: Table 3 was given no robustness study."""
NOT_FITTED = "not fitted"
"""Reason code: the robustness study cannot be fitted (``options["error"]`` says why)."""
REASONS = (NO_STUDY, NO_COMMON_PASS, NO_COMMON_GAMMA, FEWER_THAN_TWO_SETTINGS, NO_ROBUSTNESS, NOT_FITTED)
"""Why a whole claim is not testable: the codes of :attr:`Verdict.reason`."""


@dataclass(frozen=True)
class Verdict:
    """A claim judged on one set of studies: the material reading leads, the strict one stands beside it.

    A verdict holds statuses, parts and numbers; its sentences are written by :mod:`moesd.narration`
    (``narration.plain(verdict)``, ``narration.summary(verdict)``, ``narration.sentence(verdict)``).

    Attributes
    ----------
    claim : str
        Which claim (a key of :data:`CLAIMS`).
    material, strict : Reading
    numbers : pandas.DataFrame
        One row per curve (or sample) with the quantities both readings compare.
    options : dict
        The options the claim was judged with, as its function stores them: ``from_batch_size`` (the smallest
        batch size judged; None for all), ``monotone_ks`` (Fig. 4), ``beyond`` (Fig. 6), ``one_gamma`` (Fig. 5),
        ``parameters`` (Table 3), and the arguments of :attr:`reason` (``studies``, ``gammas``, ``error``).
    reason : str or None
        For a claim not testable as a whole, why (one of :data:`REASONS`); else None.
    """

    claim: str
    material: Reading
    strict: Reading
    numbers: pd.DataFrame
    options: dict = field(default_factory=dict)
    reason: str | None = None

    @property
    def status(self) -> str:
        """The material reading's status."""
        return self.material.status

    @property
    def parts(self) -> pd.DataFrame:
        return self.material.parts

    def parts_table(self) -> pd.DataFrame:
        """Both readings' outcomes side by side, one row per part and place: ``part``, ``where``, ``role`` (in the
        material reading), ``material``, ``strict`` (outcomes; empty where a reading has no such part) and
        ``detectable`` (the smallest effect a part within noise needed in the material reading, else the strict
        one's), ``unit``."""
        key = ["part", "where"]
        material = self.material.parts.rename(columns={"outcome": "material"})
        strict = self.strict.parts.rename(columns={"outcome": "strict", "detectable": "strict_detectable",
                                                   "unit": "strict_unit", "role": "strict_role"})
        table = material.merge(strict, on=key, how="outer")
        table["role"] = table["role"].fillna(table["strict_role"])
        table["detectable"] = table["detectable"].fillna(table["strict_detectable"])
        table["unit"] = table["unit"].fillna(table["strict_unit"])
        return table[["part", "where", "role", "material", "strict", "detectable", "unit"]].fillna(
            {"material": "", "strict": ""})


def strict_status(outcomes) -> str:
    """The strict reading's status from all its parts' outcomes."""
    outcomes = list(outcomes)
    for outcome, status in ((CONTRADICTED, FAILS), (NOT_SHOWN, INCONCLUSIVE), (UNTESTABLE, UNTESTABLE)):
        if outcome in outcomes:
            return status
    return HOLDS if outcomes else UNTESTABLE


def material_status(outcomes) -> str:
    """The material reading's status from its :data:`CLAIM` parts' outcomes."""
    outcomes = set(outcomes)
    shown = SHOWN in outcomes
    if CONTRADICTED in outcomes:
        return PARTLY_HOLDS if shown else FAILS
    if NOT_SHOWN in outcomes:
        return INCONCLUSIVE
    if UNTESTABLE in outcomes or not outcomes:
        return PARTLY_HOLDS if shown else UNTESTABLE
    return HOLDS


def shape_outcome(shape: dict, c: Curve) -> str:
    """Outcome of a rise then fall (:func:`moesd.paper.curves.rises_then_falls` of ``c``).

    :data:`SHOWN` when it rises then falls. :data:`CONTRADICTED` for a reversal that counts, or for a curve whose
    peak region (:func:`moesd.paper.curves.peak_region`) is its first or its last batch size alone: every other
    point lies below that end beyond noise, so the curve falls from its first point where the claim says it rises
    (or rises to its last where the claim says it falls), and no rise (fall) smaller than the noise can hide
    between them. Else :data:`NOT_SHOWN`: the rise or the fall is within noise.
    """
    if shape["rises_then_falls"]:
        return SHOWN
    low, high = peak_region(c)
    only_an_end = low == high and low in (c.batch_size[0], c.batch_size[-1])
    return CONTRADICTED if not shape["unimodal"] or only_an_end else NOT_SHOWN


def shape_detectable(shape: dict) -> float:
    """The smallest rise or fall a curve that does not show a rise then fall needed: the margin of its
    rise or fall within noise (the larger, when both are)."""
    margins = [margin for size, margin in ((shape["rise"], shape["rise_margin"]), (shape["fall"], shape["fall_margin"]))
               if size <= margin]
    return float(max(margins)) if margins else float("nan")


def fall_outcome(fall: dict) -> str:
    """:data:`CONTRADICTED` for a rise that counts, :data:`NOT_SHOWN` for an overall fall within noise."""
    return CONTRADICTED if fall["rises_beyond_noise"] else SHOWN if fall["falls_monotonically"] else NOT_SHOWN


def tracks_outcome(track: dict) -> str:
    """:data:`CONTRADICTED` for peak regions apart, :data:`NOT_SHOWN` for a rank correlation within chance."""
    if not (track["follower_peak_low"] <= track["leader_peak_high"]
            and track["leader_peak_low"] <= track["follower_peak_high"]):
        return CONTRADICTED
    return SHOWN if track["tracks"] else NOT_SHOWN


def growth_outcome(intervals) -> str:
    """Outcome of "grows along the sequence" for ``(low, high)`` intervals (densest K first).

    :data:`CONTRADICTED` on a step that shrinks beyond noise (:func:`moesd.paper.curves.reverses_beyond_noise`);
    else :data:`UNTESTABLE` when the first interval has no upper bound (a range that may reach past the largest
    batch size measured cannot be shown narrower than another); else :data:`SHOWN` when it grows beyond noise
    (:func:`moesd.paper.curves.grows_beyond_noise`), :data:`NOT_SHOWN` when the overall growth is within noise.
    """
    import math

    from moesd.paper.curves import grows_beyond_noise, reverses_beyond_noise

    if reverses_beyond_noise(intervals):
        return CONTRADICTED
    if math.isinf(intervals[0][1]):
        return UNTESTABLE
    return SHOWN if grows_beyond_noise(intervals) else NOT_SHOWN
