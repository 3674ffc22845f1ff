"""Verdicts on the paper's measured claims, computed from this project's measurements.

One function per claim (Figs. 2-6 and Table 3 of the paper). Each returns a :class:`Verdict`: the
status, the numbers behind it (a DataFrame), its parts that do not hold with the smallest effect
the study could have detected for each, and one sentence that states it with those numbers, for a
chapter to print. :func:`scorecard` runs every claim on one device folder of ``data/measurements/``.

A claim is made of parts (a rise, a fall, an ordering...). Each part is shown by the data, or
:data:`CONTRADICTED` by them (its opposite is beyond noise), or :data:`NOT_SHOWN` (within noise
either way), or not measurable. The claim :data:`HOLDS` when every part is shown, **does not hold**
(:data:`FAILS`) when some part is contradicted, is :data:`INCONCLUSIVE` when no part is contradicted
and some part is within noise (then the *smallest detectable effect* of that part, the size the
effect would have needed to count, says what the study could have shown), and is
:data:`UNMEASURABLE` when a part lacks the data. The inconclusive status and the detectable effects
were added on 2026-11-26, before the studies at real widths were measured; the criteria that decide
each part did not change.

The criteria were written before the re-measured data existed, and no threshold was chosen by
looking at measured data. Every threshold is a multiple of the measurement noise, estimated as
follows (the *noise model*, shared by all claims).

Curves and their noise
----------------------
A curve is one quantity (speedup, target efficiency) against batch size B: the **mean over repeats**
at each B (the paper averages its runs the same way). Its standard error at B is

* ``s / sqrt(n_B)`` when every B has at least two repeats, where ``s`` is the pooled standard
  deviation of the repeats about their B's mean (all B together) and ``n_B`` the repeats at B. A
  repeat that strays (a straggler, a busy machine) widens ``s``: more of a curve's wiggle then
  counts as noise, and a shape must be larger to count;
* otherwise (one repeat) the **neighbour scatter**: each interior point is compared with the
  straight line through its two neighbours (in B, so a non-uniform grid is handled), and the
  pseudo-residuals ``(y_line - y_i) / sqrt(1 + a**2 + b**2)`` (``a``, ``b`` the interpolation
  weights) have the noise's standard deviation when the curve is locally straight (Gasser, Sroka
  and Jennen-Steinmetz, Biometrika 73, 1986). Their robust scale ``1.4826 * median |.|`` ignores
  the few points where the curve really bends. With one repeat, drifts that move neighbouring
  points together are invisible to this estimate: the sentence says which estimate was used.

Two points of curves differ *beyond noise* when their difference exceeds ``NOISE_Z`` standard
errors of that difference, ``NOISE_Z * sqrt(se_i**2 + se_j**2)`` (the *margin*). ``NOISE_Z = 3`` was
fixed by simulation on synthetic curves before any new data existed (``tests/test_verdicts.py``
repeats a smaller version of it). With the paper's 19 batch sizes, Gaussian noise and 1, 2, 3 or 5
repeats, a flat curve passed the end-point test of :func:`rises_then_falls` (rise and fall beyond
noise) by chance in under 2 % of draws (the peak is the largest of 19 noisy points, so the margin
must cover that selection: at 2 standard errors 6-8 % of flat curves passed). Its unimodality test
(no reversal beyond noise), added later without changing ``NOISE_Z``, lowers that to 1.2 % or less
(1000 draws each; 2-3 % at 2 standard errors), while a hump 10 noise standard deviations high still
passes in 98 % of 300 draws with one repeat and in all of them with two or more. A curve that truly
falls (a straight fall, or flat up to B = 16 and falling after) is called non-monotone by
:func:`falls_monotonically` in at most 5.5 % of draws (the flat-then-falling curve with one repeat;
2.3 % or less with three or more repeats; at 2.5 standard errors it is 8-13 %).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

HOLDS = "holds"
FAILS = "does not hold"
INCONCLUSIVE = "inconclusive"
"""No part of the claim is contradicted by the data, and some part is within noise: the study could not tell."""
UNMEASURABLE = "not measurable here"
STATUSES = (HOLDS, FAILS, INCONCLUSIVE, UNMEASURABLE)
CONTRADICTED = "contradicted by the data"
"""A part of a claim whose opposite the data show (a reversal beyond noise, a fall from the smallest B where the
claim says rise, a spread larger than the shape)."""
NOT_SHOWN = "not shown beyond noise"
"""A part of a claim the data neither show nor contradict: the effect, if there, is within the noise margin."""

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

NOISE_Z = 3.0
"""Standard errors of a difference that make it *beyond noise* (see the module docstring)."""
MIN_BATCH_SIZES = 5
"""Fewest batch sizes a curve needs: a peak with points on both sides, and three pseudo-residuals
for the neighbour scatter when there is only one repeat."""


@dataclass(frozen=True)
class Verdict:
    """A claim's status, the numbers behind it and a sentence that states it.

    Attributes
    ----------
    claim : str
        Which claim (``"Fig. 2"``, ..., ``"Table 3"``).
    status : str
        :data:`HOLDS`, :data:`FAILS`, :data:`INCONCLUSIVE` or :data:`UNMEASURABLE`.
    numbers : pandas.DataFrame
        One row per curve (or per sample for Table 3) with the quantities the criterion compares.
    sentence : str
        The verdict in one sentence, with its numbers.
    summary : str
        The verdict in one short line: the status, and which parts of the claim are
        :data:`CONTRADICTED` and which :data:`NOT_SHOWN`, where (e.g. at which gamma), with the
        smallest detectable effect of the parts not shown.
    parts : pandas.DataFrame
        One row per part that does not hold, where: ``outcome`` (:data:`CONTRADICTED`,
        :data:`NOT_SHOWN` or :data:`UNMEASURABLE`), ``part``, ``where``, ``detectable`` (for a part not
        shown: the smallest effect the study could have shown, in ``unit``; else NaN) and ``unit``.
    """

    claim: str
    status: str
    numbers: pd.DataFrame
    sentence: str
    summary: str
    parts: pd.DataFrame = None


@dataclass(frozen=True)
class Curve:
    """A quantity against batch size: means over repeats and their standard errors.

    Attributes
    ----------
    batch_size : numpy.ndarray
        Sorted batch sizes (sequences).
    value : numpy.ndarray
        Mean over repeats at each batch size (the quantity's unit: a speedup or an efficiency).
    se : numpy.ndarray
        Standard error of each mean (same unit).
    noise : str
        Which noise estimate ``se`` comes from, in words.
    """

    batch_size: np.ndarray
    value: np.ndarray
    se: np.ndarray
    noise: str

    def margin(self, i, j) -> np.ndarray:
        """Smallest difference between points ``i`` and ``j`` that is beyond noise."""
        return NOISE_Z * np.sqrt(self.se[i] ** 2 + self.se[j] ** 2)

    @property
    def peak_index(self) -> int:
        return int(np.argmax(self.value))


def neighbour_scatter(batch_size, value) -> float:
    """Noise standard deviation of a single-repeat curve from its neighbour-to-neighbour scatter.

    Gasser-Sroka-Jennen-Steinmetz pseudo-residuals on the (possibly non-uniform) batch-size grid,
    scaled robustly (``1.4826 * median |residual|``); NaN with fewer than three interior points.
    """
    x, y = np.asarray(batch_size, dtype=float), np.asarray(value, dtype=float)
    if len(x) < 5:
        return float("nan")
    a = (x[2:] - x[1:-1]) / (x[2:] - x[:-2])
    b = 1 - a
    residuals = (a * y[:-2] + b * y[2:] - y[1:-1]) / np.sqrt(1 + a ** 2 + b ** 2)
    return float(1.4826 * np.median(np.abs(residuals)))


def curve(rows: pd.DataFrame, column: str) -> Curve:
    """The curve of ``column`` against ``batch_size`` over the repeats in ``rows``.

    Parameters
    ----------
    rows : pandas.DataFrame
        Rows of one curve (one gamma, one K, ...): columns ``batch_size`` and ``column``, one row
        per repeat.
    column : str
        The quantity (``"speedup"``, ``"target_efficiency"``, ...).
    """
    rows = rows.dropna(subset=[column])
    groups = rows.groupby("batch_size")[column]
    mean, count = groups.mean(), groups.count()
    x, y, n = mean.index.to_numpy(float), mean.to_numpy(float), count.to_numpy(float)
    if len(n) and (n >= 2).all():
        deviations = rows[column] - groups.transform("mean")
        s = math.sqrt(float((deviations ** 2).sum()) / float((n - 1).sum()))
        low, high = int(n.min()), int(n.max())
        repeats = f"{low}" if low == high else f"{low}-{high}"
        return Curve(x, y, s / np.sqrt(n), f"repeats ({repeats} per batch size)")
    return Curve(x, y, np.full(len(x), neighbour_scatter(x, y)), "neighbour scatter (1 repeat)")


def rises_then_falls(c: Curve) -> dict:
    """Whether a curve rises to an interior peak and falls after it, each beyond noise, with no reversal.

    The peak is the largest mean. The *rise* is peak minus the value at the smallest batch size,
    the *fall* peak minus the value at the largest; each must exceed its margin. A peak at either
    end has a rise or fall of zero and fails. The curve must also be unimodal within noise (the
    pairwise test of :func:`falls_monotonically`, mirrored): up to the peak no later point lies below
    an earlier one by more than their margin, and from the peak on no later point lies above an
    earlier one by more than their margin. A U or a sawtooth whose ends lie below its largest point
    then fails on its *reversal* (the largest such difference, reported with its batch sizes).
    """
    first, last, peak = 0, len(c.value) - 1, c.peak_index
    rise, fall = c.value[peak] - c.value[first], c.value[peak] - c.value[last]
    rise_margin, fall_margin = float(c.margin(first, peak)), float(c.margin(peak, last))
    i, j = np.triu_indices(len(c.value), k=1)
    size = np.where(j <= peak, c.value[i] - c.value[j], np.where(i >= peak, c.value[j] - c.value[i], -np.inf))
    worst = int(np.argmax(size - c.margin(i, j)))
    unimodal = bool(size[worst] - c.margin(i[worst], j[worst]) <= 0)
    return {"first": float(c.value[first]), "peak_batch_size": float(c.batch_size[peak]),
            "peak": float(c.value[peak]), "last": float(c.value[last]), "rise": float(rise),
            "fall": float(fall), "rise_margin": rise_margin, "fall_margin": fall_margin,
            "largest_reversal": float(max(size[worst], 0.0)),
            "largest_reversal_from": float(c.batch_size[i[worst]]),
            "largest_reversal_to": float(c.batch_size[j[worst]]), "unimodal": unimodal,
            "rises_then_falls": bool(rise > rise_margin and fall > fall_margin and unimodal)}


def falls_monotonically(c: Curve) -> dict:
    """Whether a curve falls from its smallest to its largest batch size with no rise beyond noise.

    Noise-sized bumps are allowed: no later point may exceed an earlier one by more than their
    margin (every pair, not only neighbours, so a slow climb over several points counts too), and
    the value at the largest batch size must lie below the value at the smallest by more than
    their margin.
    """
    i, j = np.triu_indices(len(c.value), k=1)
    excess = c.value[j] - c.value[i] - c.margin(i, j)
    worst = int(np.argmax(excess))
    fall = c.value[0] - c.value[-1]
    fall_margin = float(c.margin(0, len(c.value) - 1))
    return {"first": float(c.value[0]), "last": float(c.value[-1]), "fall": float(fall),
            "fall_margin": fall_margin, "largest_rise": float(c.value[j[worst]] - c.value[i[worst]]),
            "largest_rise_from": float(c.batch_size[i[worst]]),
            "largest_rise_to": float(c.batch_size[j[worst]]), "rises_beyond_noise": bool(excess[worst] > 0),
            "falls_monotonically": bool(excess[worst] <= 0 and fall > fall_margin)}


def peak_region(c: Curve) -> tuple[float, float]:
    """Smallest and largest batch size whose value is within noise of the peak."""
    peak = c.peak_index
    near = c.value >= c.value[peak] - c.margin(np.arange(len(c.value)), peak)
    return float(c.batch_size[near].min()), float(c.batch_size[near].max())


def width_above(c: Curve, level) -> float:
    """Width (in batch sizes, ``B_hi - B_lo``) of the run of points around the peak at or above ``level``.

    ``level`` is a number or one number per point; 0 when the peak itself is below it.
    """
    above = c.value >= np.broadcast_to(level, c.value.shape)
    lo = hi = c.peak_index
    if not above[lo]:
        return 0.0
    while lo > 0 and above[lo - 1]:
        lo -= 1
    while hi < len(above) - 1 and above[hi + 1]:
        hi += 1
    return float(c.batch_size[hi] - c.batch_size[lo])


def half_power_width(c: Curve) -> tuple[float, float, float]:
    """Width of the range with value >= x/sqrt(2) (x the peak), and its noise interval.

    Returns ``(width, narrowest, widest)``: the width at the level ``x/sqrt(2)``, at that level
    raised by the noise of comparing a point with ``x/sqrt(2)`` (``NOISE_Z * sqrt(se_B**2 +
    se_peak**2 / 2)``) and at that level lowered by it. When the range at the lowered level reaches
    the largest batch size measured, the true range may go on beyond it: ``widest`` is then infinite.
    """
    level = c.value[c.peak_index] / math.sqrt(2)
    noise = NOISE_Z * np.sqrt(c.se ** 2 + c.se[c.peak_index] ** 2 / 2)
    widest = width_above(c, level - noise)
    if (c.value[c.peak_index:] >= level - noise[c.peak_index:]).all():
        widest = math.inf
    return width_above(c, level), width_above(c, level + noise), widest


def reverses_beyond_noise(intervals) -> bool:
    """Whether a quantity known up to an interval shrinks beyond noise at some step of a sequence.

    ``intervals`` are ``(low, high)`` pairs in order (densest K first); a step reverses when an
    interval's ``high`` lies below the previous one's ``low``.
    """
    return any(after[1] < before[0] for before, after in zip(intervals, intervals[1:]))


def grows_beyond_noise(intervals) -> bool:
    """Whether a quantity known up to an interval grows along a sequence, allowing noise.

    ``intervals`` are ``(low, high)`` pairs in order (densest K first). It grows when no step
    :func:`reverses_beyond_noise` and the last interval lies wholly above the first (the overall
    growth is beyond noise).
    """
    return bool(not reverses_beyond_noise(intervals) and intervals[-1][0] > intervals[0][1])


def growth_status(intervals) -> tuple[str, str | None]:
    """Status of "grows along the sequence" for intervals, and the outcome of a part that does not hold.

    :data:`FAILS` (:data:`CONTRADICTED`) on a reversal beyond noise; else :data:`UNMEASURABLE` when the
    first interval has no upper bound (a range that may reach past the largest batch size measured
    cannot be shown narrower than another); else :data:`HOLDS` when :func:`grows_beyond_noise`, and
    :data:`INCONCLUSIVE` (:data:`NOT_SHOWN`) when the overall growth is within noise.
    """
    if reverses_beyond_noise(intervals):
        return FAILS, CONTRADICTED
    if math.isinf(intervals[0][1]):
        return UNMEASURABLE, UNMEASURABLE
    return (HOLDS, None) if grows_beyond_noise(intervals) else (INCONCLUSIVE, NOT_SHOWN)


def growth_detectable(intervals) -> float:
    """The smallest growth from the first to the last interval that :func:`grows_beyond_noise` could show.

    The last interval must lie wholly above the first: a true growth of the centres must exceed the
    first interval's upper half-width plus the last one's lower half-width, taken here as half of
    each interval's width (the same unit as the intervals).
    """
    (first_low, first_high), (last_low, last_high) = intervals[0], intervals[-1]
    return float((first_high - first_low) / 2 + (last_high - last_low) / 2)


def combine(statuses) -> str:
    """A claim made of parts: fails if any part fails, else inconclusive if any part is, else unmeasurable if any
    part is, else holds."""
    statuses = list(statuses)
    for status in (FAILS, INCONCLUSIVE):
        if status in statuses:
            return status
    if UNMEASURABLE in statuses or not statuses:
        return UNMEASURABLE
    return HOLDS


def status_of(outcomes) -> str:
    """The status of a row of parts from their outcomes (None for a part shown by the data)."""
    outcomes = list(outcomes)
    if CONTRADICTED in outcomes:
        return FAILS
    if NOT_SHOWN in outcomes:
        return INCONCLUSIVE
    if UNMEASURABLE in outcomes:
        return UNMEASURABLE
    return HOLDS


def _fmt(x, whole: bool = False) -> str:
    """A number for a sentence: two decimals, or whole (batch sizes and widths in batch sizes)."""
    return f"{x:.0f}" if whole else f"{x:.2f}"


PART_COLUMNS = ("outcome", "part", "where", "detectable", "unit")
"""Columns of :attr:`Verdict.parts`."""


def _verdict(claim: str, statement: str, status: str, numbers, details: str, notes=()) -> Verdict:
    """A Verdict whose sentence reads ``claim (statement): status - details.``

    ``notes`` are ``(outcome, part, where)`` or ``(outcome, part, where, detectable, unit)`` tuples for the
    parts that do not hold (outcome :data:`CONTRADICTED`, :data:`NOT_SHOWN` or :data:`UNMEASURABLE`;
    ``detectable`` the smallest effect a part not shown needed, in ``unit``); the summary lists them,
    grouped by part, contradicted parts first (places that all read ``gamma = g`` are listed as
    ``gamma = 2, 3``), with the range of the detectable effects of the parts not shown. Without notes
    the summary is the status, with ``details`` when the claim does not hold.
    """
    numbers = numbers if isinstance(numbers, pd.DataFrame) else pd.DataFrame(numbers)
    parts = pd.DataFrame([(*note, *(None, "")[len(note) - 3:]) for note in notes], columns=list(PART_COLUMNS))
    parts["detectable"] = parts["detectable"].astype(float)
    grouped = {}
    for note in parts.itertuples(index=False):
        grouped.setdefault((note.outcome, note.part), []).append(note)
    order = (CONTRADICTED, NOT_SHOWN, UNMEASURABLE)

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
    phrases = [f"{part} {outcome} ({places(group)})"
               for (outcome, part), group in sorted(grouped.items(), key=lambda item: order.index(item[0][0]))]
    summary = (f"{status}: {'; '.join(phrases)}" if phrases else status if status == HOLDS
               else f"{status}: {details}")
    return Verdict(claim, status, numbers, f"{claim} ({statement}): {status} - {details}.", summary, parts)


def _shape_outcome(shape: dict, c: Curve) -> str | None:
    """Outcome of a rise then fall (:func:`rises_then_falls` of ``c``) that does not hold.

    :data:`CONTRADICTED` for a reversal beyond noise, or for a curve whose peak region
    (:func:`peak_region`) is its first or its last batch size alone: every other point lies below
    that end beyond noise, so the curve falls from its first point where the claim says it rises
    (or rises to its last where the claim says it falls), and no rise (fall) smaller than the noise
    can hide between them. Else :data:`NOT_SHOWN`: the rise or the fall is within noise.
    """
    if shape["rises_then_falls"]:
        return None
    low, high = peak_region(c)
    only_an_end = low == high and low in (c.batch_size[0], c.batch_size[-1])
    return CONTRADICTED if not shape["unimodal"] or only_an_end else NOT_SHOWN


def _shape_detectable(shape: dict) -> float:
    """The smallest rise or fall a curve that does not show a rise then fall needed: the margin of its
    rise or fall within noise (the larger, when both are)."""
    margins = [margin for size, margin in ((shape["rise"], shape["rise_margin"]), (shape["fall"], shape["fall_margin"]))
               if size <= margin]
    return float(max(margins)) if margins else float("nan")


def _fall_outcome(fall: dict) -> str | None:
    """:data:`CONTRADICTED` for a rise beyond noise, :data:`NOT_SHOWN` for an overall fall within it."""
    return CONTRADICTED if fall["rises_beyond_noise"] else None if fall["falls_monotonically"] else NOT_SHOWN


def _from_batch_size(frame: pd.DataFrame | None, smallest) -> pd.DataFrame | None:
    """The rows of a study with ``batch_size >= smallest`` (all rows when ``smallest`` is None)."""
    return frame if frame is None or smallest is None else frame[frame["batch_size"] >= smallest]


def _judged_from(statement: str, smallest) -> str:
    """A claim's statement, with the smallest batch size judged when not all are."""
    return statement if smallest is None else f"{statement}; judged from B = {_fmt(smallest, whole=True)}"


def _span(values, whole: bool = False) -> str:
    """``a`` or ``a-b`` (``a to b`` if negative): the range of some numbers, for a sentence."""
    low, high = _fmt(min(values), whole), _fmt(max(values), whole)
    return low if low == high else f"{low}-{high}" if min(values) >= 0 else f"{low} to {high}"


def _shape_phrase(shape: dict) -> str:
    reversal = ("" if shape["unimodal"] else
                f"; reversal {_fmt(shape['largest_reversal'])} beyond noise from B = "
                f"{_fmt(shape['largest_reversal_from'], whole=True)} to {_fmt(shape['largest_reversal_to'], whole=True)}")
    return (f"{_fmt(shape['first'])} at the smallest B, {_fmt(shape['peak'])} at B = "
            f"{_fmt(shape['peak_batch_size'], whole=True)}, {_fmt(shape['last'])} at the largest B "
            f"(rise {_fmt(shape['rise'])}, fall {_fmt(shape['fall'])}; noise margins "
            f"{_fmt(shape['rise_margin'])}, {_fmt(shape['fall_margin'])}{reversal})")


def _shapes_phrase(rows, prefix: str = "") -> str:
    """The rise-then-fall numbers of several passing curves at once (``prefix`` names their columns)."""
    def values(key):
        return [row[prefix + key] for row in rows]
    margins = values("rise_margin") + values("fall_margin")
    return (f"{_span(values('first'))} at the smallest B, {_span(values('peak'))} at B = "
            f"{_span(values('peak_batch_size'), whole=True)}, {_span(values('last'))} at the largest B (rise "
            f"{_span(values('rise'))}, fall {_span(values('fall'))}; noise margins at most {_fmt(max(margins))})")


def _fall_phrase(fall: dict) -> str:
    bump = (f"largest rise {_fmt(fall['largest_rise'])} from B = {_fmt(fall['largest_rise_from'], whole=True)} to "
            f"{_fmt(fall['largest_rise_to'], whole=True)}" if fall["largest_rise"] > 0 else "no rise anywhere")
    return (f"{_fmt(fall['first'])} -> {_fmt(fall['last'])} (fall {_fmt(fall['fall'])}, margin "
            f"{_fmt(fall['fall_margin'])}; {bump})")


def _noise_phrase(rows, key: str = "noise") -> str:
    noise = sorted({row[key] for row in rows if key in row})
    return f"noise from {', '.join(noise)}" if noise else ""


def _join(*phrases) -> str:
    return "; ".join(p for p in phrases if p)


def tracks(leader: Curve, follower: Curve) -> dict:
    """Whether ``follower`` tracks ``leader`` over batch size.

    Both conditions must hold: the rank correlation (Spearman) of the two curves' means over their
    common batch sizes is positive at the one-sided 5 % level (a permutation-free t approximation,
    ``scipy.stats.spearmanr``), and their peak regions (:func:`peak_region`) overlap, so they peak
    at batch sizes that noise cannot tell apart. Rank correlation alone would pass a follower that
    only falls (both curves fall over most of the grid); overlapping peaks alone would pass a flat
    follower (its peak region is the whole grid).
    """
    from scipy.stats import spearmanr

    common = np.intersect1d(leader.batch_size, follower.batch_size)
    a = leader.value[np.isin(leader.batch_size, common)]
    b = follower.value[np.isin(follower.batch_size, common)]
    result = spearmanr(a, b, alternative="greater")
    correlation, p_value = float(result.statistic), float(result.pvalue)
    (lead_lo, lead_hi), (follow_lo, follow_hi) = peak_region(leader), peak_region(follower)
    overlap = lead_lo <= follow_hi and follow_lo <= lead_hi
    return {"rank_correlation": correlation, "p_value": p_value,
            "detectable_correlation": spearman_detectable(len(common)), "follower_peak_low": follow_lo,
            "follower_peak_high": follow_hi, "leader_peak_low": lead_lo, "leader_peak_high": lead_hi,
            "tracks": bool(p_value < 0.05 and overlap)}


def spearman_detectable(points: int, level: float = 0.05) -> float:
    """The smallest rank correlation of ``points`` pairs that the one-sided test of :func:`tracks` calls positive.

    Inverts scipy's t approximation, ``t = r sqrt((n - 2) / (1 - r^2))``, at the ``level`` quantile.
    """
    from scipy.stats import t as student

    if points < 3:
        return float("nan")
    critical = float(student.ppf(1 - level, points - 2))
    return critical / math.sqrt(points - 2 + critical ** 2)


def _tracks_outcome(track: dict) -> str | None:
    """:data:`CONTRADICTED` for peak regions apart, :data:`NOT_SHOWN` for a rank correlation within chance."""
    if not (track["follower_peak_low"] <= track["leader_peak_high"]
            and track["leader_peak_low"] <= track["follower_peak_high"]):
        return CONTRADICTED
    return None if track["tracks"] else NOT_SHOWN


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
    claim, statement = "Fig. 2", _judged_from(CLAIMS["Fig. 2"], from_batch_size)
    e2e = _from_batch_size(e2e, from_batch_size)
    if e2e is None or e2e.empty:
        return _verdict(claim, statement, UNMEASURABLE, [], "no complete e2e study on this device")
    rows, phrases, notes = [], [], []
    for gamma, group in e2e.groupby("gamma"):
        speed, efficiency = curve(group, "speedup"), curve(group, "target_efficiency")
        where = f"gamma = {gamma}"
        if min(len(speed.batch_size), len(efficiency.batch_size)) < MIN_BATCH_SIZES:
            rows.append({"gamma": gamma, "status": UNMEASURABLE})
            phrases.append(f"gamma = {gamma} has fewer than {MIN_BATCH_SIZES} batch sizes")
            notes.append((UNMEASURABLE, "the curves", where))
            continue
        shape, efficiency_shape = rises_then_falls(speed), rises_then_falls(efficiency)
        track = tracks(speed, efficiency)
        parts = ((_shape_outcome(shape, speed), "the speedup's rise then fall", _shape_detectable(shape), ""),
                 (_shape_outcome(efficiency_shape, efficiency), "the efficiency's rise then fall",
                  _shape_detectable(efficiency_shape), ""),
                 (_tracks_outcome(track), "the efficiency tracking the speedup", track["detectable_correlation"],
                  "rank correlation"))
        status = status_of(outcome for outcome, *_ in parts)
        rows.append({"gamma": gamma, "status": status, **shape,
                     **{f"efficiency_{k}": value for k, value in efficiency_shape.items()}, **track,
                     "noise": speed.noise})
        notes += [(outcome, part, where, detectable if outcome == NOT_SHOWN else None, unit)
                  for outcome, part, detectable, unit in parts if outcome]
        if status != HOLDS:
            phrases.append(f"gamma = {gamma}: the speedup is {_shape_phrase(shape)}, "
                           f"{'rising then falling' if shape['rises_then_falls'] else 'not rising then falling'}; "
                           f"target efficiency is {_shape_phrase(efficiency_shape)}, "
                           f"{'rising then falling' if efficiency_shape['rises_then_falls'] else 'not rising then falling'}"
                           f", peaks within B = "
                           f"{_span([track['follower_peak_low'], track['follower_peak_high']], whole=True)}, "
                           f"rank correlation {track['rank_correlation']:.2f} "
                           f"({'tracks' if track['tracks'] else 'does not track'})")
    held = [row for row in rows if row["status"] == HOLDS]
    if held:
        phrases.insert(0, f"at gamma = {', '.join(str(r['gamma']) for r in held)} the speedup is "
                          f"{_shapes_phrase(held)}, target efficiency is {_shapes_phrase(held, 'efficiency_')}, "
                          f"peaking within B = "
                          f"{_span([r[k] for r in held for k in ('follower_peak_low', 'follower_peak_high')], True)}"
                          f", rank correlation "
                          f"{_span([r['rank_correlation'] for r in held])} with the speedup")
    status = combine(r["status"] for r in rows)
    return _verdict(claim, statement, status, rows, _join(*phrases, _noise_phrase(rows)), notes)


def forward_efficiency(forward: pd.DataFrame, gamma: int) -> pd.DataFrame:
    """Target efficiency ``T_T(B, 1) / T_T(B, gamma + 1)`` per run and batch size, from a forward study.

    The verification pass scores ``gamma + 1`` positions per sequence (as in
    :func:`moesd.measure.studies.forward_target_efficiency`); the ratio is taken within each run, so
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
    claim, statement = "Fig. 3", _judged_from(CLAIMS["Fig. 3"], from_batch_size)
    forward, dense_forward = _from_batch_size(forward, from_batch_size), _from_batch_size(dense_forward, from_batch_size)
    if forward is None or dense_forward is None or forward.empty or dense_forward.empty:
        missing = " and ".join(name for name, frame in (("forward", forward), ("dense_forward", dense_forward))
                               if frame is None or frame.empty)
        return _verdict(claim, statement, UNMEASURABLE, [], f"no complete {missing} study on this device")
    rows, phrases, notes = [], [], []
    for gamma in gammas:
        moe, dense = forward_efficiency(forward, gamma), forward_efficiency(dense_forward, gamma)
        if moe.empty or dense.empty:
            continue
        moe_curve, dense_curve = curve(moe, "efficiency"), curve(dense, "efficiency")
        if min(len(moe_curve.batch_size), len(dense_curve.batch_size)) < MIN_BATCH_SIZES:
            rows.append({"gamma": gamma, "status": UNMEASURABLE})
            phrases.append(f"gamma = {gamma} has fewer than {MIN_BATCH_SIZES} batch sizes")
            notes.append((UNMEASURABLE, "the curves", f"gamma = {gamma}"))
            continue
        shape, fall = rises_then_falls(moe_curve), falls_monotonically(dense_curve)
        parts = ((_shape_outcome(shape, moe_curve), "the MoE efficiency's rise then fall", _shape_detectable(shape)),
                 (_fall_outcome(fall), "the dense efficiency's fall", fall["fall_margin"]))
        notes += [(outcome, part, f"gamma = {gamma}", detectable if outcome == NOT_SHOWN else None, "")
                  for outcome, part, detectable in parts if outcome]
        status = status_of(outcome for outcome, *_ in parts)
        rows.append({"gamma": gamma, "status": status, **{f"moe_{k}": v for k, v in shape.items()},
                     **{f"dense_{k}": v for k, v in fall.items()}, "noise": moe_curve.noise,
                     "dense_noise": dense_curve.noise})
        if status != HOLDS:
            phrases.append(f"gamma = {gamma}: MoE {_shape_phrase(shape)}, "
                           f"{'rising then falling' if shape['rises_then_falls'] else 'not rising then falling'}; "
                           f"dense {_fall_phrase(fall)}, "
                           f"{'falling' if fall['falls_monotonically'] else 'not falling monotonically'}")
    if not rows:
        return _verdict(claim, statement, UNMEASURABLE, [],
                        f"the forward studies share no pass of gamma + 1 tokens for gamma in {list(gammas)}")
    held = [row for row in rows if row["status"] == HOLDS]
    if held:
        phrases.insert(0, f"at gamma = {', '.join(str(r['gamma']) for r in held)} the MoE efficiency is "
                          f"{_shapes_phrase(held, 'moe_')}, and the dense model's falls from "
                          f"{_span([r['dense_first'] for r in held])} to {_span([r['dense_last'] for r in held])} "
                          f"with no rise beyond noise")
    return _verdict(claim, statement, combine(r["status"] for r in rows), rows,
                    _join(*phrases, _noise_phrase(rows)), notes)


def sparser_peaks_later_and_wider(sparsity: pd.DataFrame | None, monotone_ks=(1, 2), from_batch_size=None) -> Verdict:
    """Fig. 4: as K falls, the peak batch size grows and the range above x/sqrt(2) widens; K = 1, 2 only fall.

    Input: the sparsity study (columns ``batch_size``, ``gamma``, ``num_experts_per_tok`` (K),
    ``speedup``; often one repeat, so the noise is the neighbour scatter). The paper plots speedups
    rescaled by ``sigma_{K=8} / sigma_K`` (:func:`moesd.model.fit.sigma_adjusted_speedup`); that factor is
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
    statement = _judged_from(CLAIMS[claim].replace("1, 2", ", ".join(map(str, monotone_ks))), from_batch_size)
    sparsity = _from_batch_size(sparsity, from_batch_size)
    if sparsity is None or sparsity.empty:
        return _verdict(claim, statement, UNMEASURABLE, [], "no complete sparsity study on this device")
    rows, statuses, phrases, notes = [], [], [], []
    for gamma, group in sparsity.groupby("gamma"):
        curves = {int(k): curve(rows_k, "speedup") for k, rows_k in group.groupby("num_experts_per_tok")}
        curves = {k: c for k, c in curves.items() if len(c.batch_size) >= MIN_BATCH_SIZES}
        gamma_rows, status, phrase, gamma_notes = _sparsity_at_gamma(curves, monotone_ks)
        rows += [{"gamma": gamma, **row} for row in gamma_rows]
        statuses.append(status)
        phrases.append(f"gamma = {gamma}: {phrase}")
        notes += [(outcome, part, f"gamma = {gamma}", *rest) for outcome, part, *rest in gamma_notes]
    return _verdict(claim, statement, combine(statuses), rows, _join(*phrases, _noise_phrase(rows)), notes)


def _sparsity_at_gamma(curves: dict, monotone_ks) -> tuple[list, str, str, list]:
    """Rows, status, phrase and summary notes of :func:`sparser_peaks_later_and_wider` for one gamma's K -> Curve.

    Notes are ``(outcome, part, detectable, unit)`` tuples: the caller names the gamma.
    """
    rows, parts, phrases, notes = [], [], [], []
    for k in monotone_ks:
        if k not in curves:
            parts.append(UNMEASURABLE)
            phrases.append(f"no K = {k} curve of {MIN_BATCH_SIZES}+ batch sizes")
            notes.append((UNMEASURABLE, f"K = {k}'s monotone fall", None, ""))
            continue
        fall = falls_monotonically(curves[k])
        parts.append(status_of([_fall_outcome(fall)]))
        if _fall_outcome(fall):
            notes.append((_fall_outcome(fall), f"K = {k}'s monotone fall",
                          fall["fall_margin"] if _fall_outcome(fall) == NOT_SHOWN else None, ""))
        rows.append({"K": k, "role": "monotone", **fall, "noise": curves[k].noise})
        phrases.append(f"K = {k} {_fall_phrase(fall)} "
                       f"{'falls monotonically' if fall['falls_monotonically'] else 'does not fall monotonically'}")
    shaped = sorted((k for k in curves if k not in monotone_ks), reverse=True)
    if len(shaped) < 2:
        parts.append(UNMEASURABLE)
        phrases.append(f"fewer than two K outside {list(monotone_ks)}")
        notes.append((UNMEASURABLE, "the peak and range ordering", None, ""))
        return rows, combine(parts), ", ".join(phrases), notes
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
    listing = ", ".join(f"K = {k} peak within B = {_span(p, whole=True)}, width {_span(w, whole=True)}"
                        for k, p, w in zip(shaped, peaks, widths)).replace("-inf", " or more")
    widening = {HOLDS: "widens beyond noise", FAILS: "narrows beyond noise", INCONCLUSIVE: "does not widen beyond noise",
                UNMEASURABLE: f"cannot be shown wider (the K = {shaped[0]} range may reach past the largest B)"}
    phrases.append(f"{listing}: the peak {'moves' if later == HOLDS else 'does not move'} to larger B beyond noise "
                   f"and the range {widening[wider]} as K falls")
    return rows, combine(parts), ", ".join(phrases), notes


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
        return _verdict(claim, statement, UNMEASURABLE, [], "no complete settings study on this device")
    if settings["setting"].nunique() < 2:
        return _verdict(claim, statement, UNMEASURABLE, [], "fewer than two settings")
    rows, phrases, notes = [], [], []
    for (setting, gamma), group in settings.groupby(["setting", "gamma"]):
        c = curve(group, "speedup")
        runs = group.groupby("batch_size")["speedup"]
        where = f"{setting}, gamma = {gamma}" if settings["gamma"].nunique() > 1 else str(setting)
        if len(c.batch_size) < MIN_BATCH_SIZES or (runs.count() < 2).any():
            rows.append({"setting": setting, "gamma": gamma, "status": UNMEASURABLE})
            phrases.append(f"{where}: fewer than {MIN_BATCH_SIZES} batch sizes or than two runs")
            notes.append((UNMEASURABLE, "the curve", where))
            continue
        shape = rises_then_falls(c)
        spread = float((runs.max() - runs.min()).median())
        shown = [size for size, margin in ((shape["rise"], shape["rise_margin"]), (shape["fall"], shape["fall_margin"]))
                 if size > margin]
        small = spread < min(shown) if shown else None
        parts = ((_shape_outcome(shape, c), "the rise then fall", _shape_detectable(shape)),
                 (CONTRADICTED if small is False else None, "the small run-to-run spread", None))
        notes += [(outcome, part, where, detectable if outcome == NOT_SHOWN else None, "")
                  for outcome, part, detectable in parts if outcome]
        status = status_of(outcome for outcome, *_ in parts)
        rows.append({"setting": setting, "gamma": gamma, "status": status, **shape, "run_range": spread,
                     "runs": int(runs.count().min()), "small_spread": small, "noise": c.noise})
        if status != HOLDS:
            phrases.append(f"{setting}, gamma = {gamma}: {_shape_phrase(shape)}, typical run range {_fmt(spread)}")
    status = combine(r["status"] for r in rows)
    held = [r for r in rows if r["status"] == HOLDS]
    if held:
        frame = pd.DataFrame(held)
        phrases.insert(0, f"{len(held)} of {len(rows)} (setting, gamma) curves rise then fall with small spread "
                          f"(peaks at B = {_span(frame['peak_batch_size'], whole=True)}, "
                          f"smallest rise {_fmt(frame['rise'].min())}, "
                          f"smallest fall {_fmt(frame['fall'].min())}, largest typical run range "
                          f"{_fmt(frame['run_range'].max())})")
    return _verdict(claim, statement, status, rows, _join(*phrases, _noise_phrase(rows)), notes)


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
    statement = _judged_from(CLAIMS[claim].replace("16", _fmt(beyond, whole=True)), from_batch_size)
    e2e, dense = _from_batch_size(e2e, from_batch_size), _from_batch_size(dense, from_batch_size)
    if e2e is None or dense is None or e2e.empty or dense.empty:
        missing = " and ".join(n for n, f in (("e2e", e2e), ("dense", dense)) if f is None or f.empty)
        return _verdict(claim, statement, UNMEASURABLE, [], f"no complete {missing} study on this device")
    rows, phrases, notes = [], [], []
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
            phrases.append(f"gamma = {gamma}: fewer than three common batch sizes above {_fmt(beyond, whole=True)} "
                           f"or {MIN_BATCH_SIZES} dense batch sizes")
            notes.append((UNMEASURABLE, "the comparison", where))
            continue
        below = int((difference[late] < -margin[late]).sum())
        above = int((difference[late] > margin[late]).sum())
        staying = np.flatnonzero(np.minimum.accumulate((difference > 0)[::-1])[::-1])
        crossover = float(common[staying[0]]) if len(staying) else float("nan")
        fall = falls_monotonically(den)
        is_above = below == 0 and above > late.sum() / 2
        above_outcome = CONTRADICTED if below else None if is_above else NOT_SHOWN
        status = status_of([above_outcome, _fall_outcome(fall)])
        rows.append({"gamma": gamma, "status": status, "batch_sizes": int(late.sum()), "above": above,
                     "below": below, "median_difference": float(np.median(difference[late])),
                     "median_margin": float(np.median(margin[late])), "crossover": crossover,
                     **{f"dense_{k}": value for k, value in fall.items()},
                     "moe_noise": moe.noise, "dense_noise": den.noise})
        notes += [(outcome, part, where, detectable if outcome == NOT_SHOWN else None, "")
                  for outcome, part, detectable in (
                      (above_outcome, "the MoE above the dense pair", float(np.median(margin[late]))),
                      (_fall_outcome(fall), "the dense speedup's fall", fall["fall_margin"])) if outcome]
        phrases.append(f"gamma = {gamma}: above beyond noise at {above} and below at {below} of {int(late.sum())} "
                       f"batch sizes (median difference {_fmt(np.median(difference[late]))}, median margin "
                       f"{_fmt(np.median(margin[late]))}), MoE above from B = "
                       f"{_fmt(crossover, whole=True) if np.isfinite(crossover) else 'nowhere'}; the dense speedup "
                       f"{_fall_phrase(fall)} "
                       f"{'falls monotonically' if fall['falls_monotonically'] else 'does not fall monotonically'}")
    if not rows:
        return _verdict(claim, statement, UNMEASURABLE, [], "the e2e and dense studies share no gamma")
    noise = _join(_noise_phrase(rows, "moe_noise").replace("noise", "MoE noise", 1),
                  _noise_phrase(rows, "dense_noise").replace("noise", "dense noise", 1))
    return _verdict(claim, statement, combine(r["status"] for r in rows), rows, _join(*phrases, noise), notes)


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

    Input: :func:`moesd.model.fit.robustness_study` (one row per stride: ``m``, ``mse`` over every
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
        return _verdict(claim, statement, UNMEASURABLE, [], "no robustness study given")
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
        return _verdict(claim, statement, UNMEASURABLE, table,
                        f"{len(poor)} poorly and {len(well)} well covering samples with m > {parameters}")
    worst = used.loc[used["mse"].idxmax()]
    scatter = 1.4826 * float((well["mse"] - well["mse"].median()).abs().median())
    excess = float(poor["mse"].median() - well["mse"].median())
    parts = ((None if worst["poor"] else CONTRADICTED, "the worst fit covering poorly", None),
             (None if excess > NOISE_Z * scatter else NOT_SHOWN, "the poorly covering samples' larger error",
              NOISE_Z * scatter))
    status = status_of(outcome for outcome, *_ in parts)
    notes = [(outcome, part, f"m > {parameters}", detectable if outcome == NOT_SHOWN else None, "MSE")
             for outcome, part, detectable in parts if outcome]
    details = (f"the worst fit (m = {int(worst['m'])}, MSE {worst['mse']:.3g}) leaves out {int(worst['gap'])} "
               f"consecutive batch sizes ({'poor' if worst['poor'] else 'even'} coverage); poorly covering samples "
               f"(m = {', '.join(str(int(m)) for m in poor['m'])}) have median MSE {poor['mse'].median():.3g} against "
               f"{well['mse'].median():.3g} for the {len(well)} well covering ones (scatter {scatter:.3g}, "
               f"excess {excess / scatter if scatter else float('inf'):.1f} scatters)")
    return _verdict(claim, statement, status, table, details, notes)


STUDIES = ("e2e", "forward", "dense", "dense_forward", "sparsity", "settings")
"""The result files the claims read from a device folder."""


def robustness_for(sparsity: pd.DataFrame, sidecar: dict, **fit_options) -> pd.DataFrame:
    """Appendix C.3's robustness study of a device's sparsity study, with that device's ridge point.

    E comes from the target named in the sidecar (:func:`moesd.zoo.get_model`), the ridge point from
    the sidecar's measured roofline, in tokens (:func:`moesd.measure.studies.ridge_tokens_for`). A point
    measured in several repeats is first averaged over them (:func:`moesd.model.fit.mean_over_repeats`; the
    paper's points are means over runs too). Unless ``fit_options`` name the samples, a study of the
    paper's 228 points takes its strides (:data:`moesd.model.fit.PAPER_STRIDES`) and any other design a
    spread sample of every size from the model's 10 parameters to all points (``sizes``), as the
    Fitting robustness chapter does.

    Raises
    ------
    ValueError
        If the sidecar holds no measured roofline or names no known MoE target, or the study has
        too few rows for a fit.
    """
    from moesd.model.fit import from_sweep, robustness_study
    from moesd.measure.studies import ridge_tokens_for
    from moesd.zoo import get_model

    target = sidecar.get("settings", {}).get("target")
    try:
        num_experts = get_model(str(target)).num_experts
    except KeyError as error:
        raise ValueError(f"the sidecar's target {target!r} is not a known model") from error
    if not num_experts:
        raise ValueError(f"the sidecar's target {target!r} is not an MoE")
    from moesd.model.fit import PARAMETERS, mean_over_repeats

    if "run" in sparsity and sparsity["run"].nunique() > 1:
        sparsity = mean_over_repeats(sparsity)
    frame = from_sweep(sparsity, num_experts)
    if "strides" not in fit_options and "sizes" not in fit_options and len(frame) != 228:
        fit_options["sizes"] = range(len(PARAMETERS), len(frame) + 1)
    return robustness_study(frame, ridge_tokens_for(sidecar), **fit_options)


def load_studies(device: str) -> tuple[dict, dict]:
    """The claims' complete result files on one device: (study -> frame, study -> sidecar).

    Missing files and files whose sidecar says the sweep did not finish (``complete: false``) are left
    out: a study stopped part-way has fewer points than its design, and the claims judge designs.
    """
    from moesd.measure.studies import load

    frames, sidecars = {}, {}
    for study in STUDIES:
        try:
            frame, sidecar = load(study, device)
        except FileNotFoundError:
            continue
        if sidecar.get("complete"):
            frames[study], sidecars[study] = frame, sidecar
    return frames, sidecars


def verdicts(frames: dict, robustness: pd.DataFrame | None = None, robustness_note: str | None = None) -> list:
    """Every claim's :class:`Verdict` from a dict of study frames (keys of :data:`STUDIES`; any may be missing).

    ``robustness`` is the Table 3 input (:func:`moesd.model.fit.robustness_study`); without it, Table 3 is
    not measurable, for the reason ``robustness_note`` (default: no robustness study).
    """
    table3 = poor_coverage_worst_fits(robustness)
    if robustness is None and robustness_note:
        table3 = _verdict("Table 3", CLAIMS["Table 3"], UNMEASURABLE, [], robustness_note)
    return [speedup_rises_then_falls(frames.get("e2e")),
            efficiency_moe_rises_dense_falls(frames.get("forward"), frames.get("dense_forward")),
            sparser_peaks_later_and_wider(frames.get("sparsity")),
            shape_holds_across_settings(frames.get("settings")),
            moe_above_dense(frames.get("e2e"), frames.get("dense")),
            table3]


def scorecard(device: str, robustness: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per claim for a device folder of ``data/measurements/``: claim, status, summary, sentence, measured_with.

    Missing result files make their claims "not measurable here". Table 3 uses ``robustness`` when
    given (an empty frame skips it), else fits the device's sparsity study (:func:`robustness_for`,
    21 fits, seconds); a sidecar without a measured roofline makes it not measurable, and says so.
    """
    frames, sidecars = load_studies(device)
    note = None if "sparsity" in frames else "no complete sparsity study on this device"
    if robustness is None and "sparsity" in frames:
        try:
            robustness = robustness_for(frames["sparsity"], sidecars["sparsity"])
        except ValueError as error:
            note = f"the robustness study cannot be fitted: {error}"
    basis = measured_with(sidecars)
    rows = [{"device": device, "claim": v.claim, "status": v.status, "summary": v.summary, "sentence": v.sentence,
             "measured_with": basis}
            for v in verdicts(frames, robustness, note)]
    return pd.DataFrame(rows)


def measured_with(sidecars: dict) -> str:
    """What a device folder's studies ran on, from their sidecars: e.g. ``"random weights, synthetic acceptance"``.

    One entry per distinct combination of weights and acceptance (forward studies have none), joined by
    ``"; "``; a sidecar without the weights says ``"weights not recorded"``.
    """
    kinds = set()
    for sidecar in sidecars.values():
        kind = f"{sidecar['weights']} weights" if sidecar.get("weights") else "weights not recorded"
        mode = (sidecar.get("acceptance") or {}).get("mode", "none")
        kinds.add(kind if mode == "none" else f"{kind}, {mode} acceptance")
    return "; ".join(sorted(kinds)) or "no study"


def devices() -> list[str]:
    """Device folders of ``data/measurements/`` (each gets a scorecard)."""
    from moesd.measure.studies import measurements_dir

    return sorted(path.name for path in measurements_dir().iterdir() if path.is_dir())
