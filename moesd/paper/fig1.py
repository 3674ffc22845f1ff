"""Fig. 1a/1b judged on trained routers: the criterion, stated (and committed) before its result on the data.

The claim
---------
Eqs. 6-8 assume that each token picks ``K`` of ``E`` experts uniformly and independently, "justified by
load-balancing auxiliary losses", so that ``t`` tokens activate ``N(t) = E (1 - (1 - K/E)^t)`` distinct experts
(Eq. 8). Fig. 1a/1b set measured activated experts of two trained MoEs (DeepSeek-V2-Lite-Chat, Qwen1.5-MoE-Chat)
on several datasets beside Eq. 8's curve as its validation. Read as the paper states it, the claim is: **a
trained, load-balanced router activates as many distinct experts for t tokens as Eq. 8 says, on any text**. The
datasets, the axes' exact ranges and the way tokens were grouped are details the paper does not print.

The parts, and what the shipped data (``moesd.routing.sources``) can show of each
-------------------------------------------------------------------------------
``skew`` (per-layer expert counts of trained routers):
    the experts ``t`` *independent* tokens activate with each layer's measured popularity ``p_e``,
    ``N_pop(t) = sum_e 1 - (1 - p_e)^t`` (:func:`moesd.theory.experts.expected_active_experts_from_popularity`),
    against Eq. 8, for ``t = 1 ... 256`` (:data:`TOKENS`), per model, domain and layer. Skew alone can only lower
    N (Eq. 8 is the maximum for a given K), so the question is by how much.

    * *material reading*: a layer follows Eq. 8 if ``N_pop(t) / N(t) >= TOLERANCE`` at every ``t``.
      ``TOLERANCE = 0.95`` is the paper's own: Eq. 9 calls 95 % of the experts "almost all", so a shortfall below
      5 % is under the resolution its argument works at.
    * *strict reading*: a layer departs from Eq. 8 if at some ``t`` the shortfall ``N(t) - N_pop(t)`` exceeds
      ``NOISE_Z`` (3, the verdicts' margin) standard errors of ``N_pop(t)``, the sampling error of the counts with
      tokens taken as independent (the counts keep no order: correlated text makes the true error larger), and
      more than float rounding (1e-9 of N).
    * a model's part *holds* if every (domain, layer) of it follows Eq. 8, *does not hold* if none does, and
      *partly holds* otherwise; the same over all models for the part.

``windows`` (per-token sequences, token order kept):
    measured distinct experts over sliding windows of ``t`` consecutive tokens of one sequence, ``t`` in
    :data:`WINDOW_TOKENS` (8 and 32; a sequence counts at ``t`` if it has ``t`` tokens), mean over the sequence's
    windows, against Eq. 8 (and, as a detail, against ``N_pop(t)`` of the sequence's layer: what correlation adds).
    Needs at least ``MIN_SEQUENCES`` (5) sequences at a ``t``: the fewest with which the one-sided sign test below
    can reach its level ``SIGN_LEVEL`` (0.05; ``0.5^5 = 0.031``).

    * *material*: holds if the median over sequences of measured / Eq. 8 is at least ``TOLERANCE``, at every ``t``.
    * *strict*: departs if, at some ``t``, the sign test (sequences below Eq. 8 against a fair coin) gives
      ``p < SIGN_LEVEL``.

``batches`` (``B`` sequences x ``w`` tokens, one forward's worth): needs ``MIN_SEQUENCES`` sequences per layer to
    draw batches from; otherwise *not testable here*. Where testable, judged per token count ``B w`` over the
    layers (each layer's mean over sampled batches) as ``windows`` is over sequences.

``decode`` (tokens generated while decoding, what speculative decoding verifies): every shipped source is a
    prefill (teacher-forced or encoder passes over given text): *not testable here*.

``paper_models`` (DeepSeek-V2-Lite-Chat, Qwen1.5-MoE-Chat themselves): *not testable here* unless a source
    records one of :data:`PAPER_CHECKPOINTS`; the judgement is then of other trained routers.

The status of the claim on these data combines the testable parts (``skew``, ``windows``, ``batches`` where
testable): *holds* if all hold, *does not hold* if all fail, *partly holds* otherwise; *not measurable here*
without a testable part. The parts not testable are returned beside it (:attr:`Fig1Judgement.untestable`).
Sentences about the result live in :mod:`moesd.narration`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from moesd.paper.criteria import FAILS, HOLDS, PARTLY_HOLDS, UNTESTABLE
from moesd.routing import activation, sources
from moesd.paper.curves import NOISE_Z

PARTLY = PARTLY_HOLDS
"""Some layers or sequences follow Eq. 8 and some do not (:data:`moesd.paper.criteria.PARTLY_HOLDS`)."""

TOLERANCE = 0.95
"""Material reading: N / N_Eq8 at or above this follows Eq. 8 (the paper's tau of Eq. 9, "almost all")."""

TOKENS = np.arange(1, 257)
"""Token counts t the skew part is judged over."""

REPORT_TOKENS = (8, 32, 128)
"""Token counts whose ratios :attr:`Fig1Judgement.layers` reports."""

WINDOW_TOKENS = (8, 32)
"""Window lengths t the windows part is judged at."""

MIN_SEQUENCES = 5
"""Fewest sequences a sequence-based part needs: the one-sided sign test reaches SIGN_LEVEL from 5 on."""

SIGN_LEVEL = 0.05
"""Level of the one-sided sign test of the windows part's strict reading."""

PAPER_CHECKPOINTS = ("deepseek-ai/DeepSeek-V2-Lite-Chat", "Qwen/Qwen1.5-MoE-A2.7B-Chat")
"""The routers of Fig. 1a and 1b."""

PARTS = ("skew", "windows", "batches", "decode", "paper_models")


@dataclass(frozen=True)
class Fig1Judgement:
    """The Fig. 1 claim judged on trained-routing data.

    Attributes
    ----------
    status, strict_status : str
        The claim on these data under the material and the strict reading: :data:`HOLDS`, :data:`PARTLY`,
        :data:`FAILS` or :data:`UNTESTABLE`.
    parts : pandas.DataFrame
        One row per part and scope (``part``, ``scope``: a model, ``"all"`` or ``"sequences"``): ``material``,
        ``strict`` (outcomes), ``worst_ratio`` (smallest N / N_Eq8 judged), ``where`` (its domain, layer and t or
        sequence), ``count`` (layers or sequences judged), ``reason`` (why not testable).
    layers : pandas.DataFrame
        Per (model, domain, layer): ``min_ratio``, ``t_at_min``, ``ratio_<t>`` at :data:`REPORT_TOKENS`,
        ``follows`` (material), ``beyond_noise`` (strict shortfall).
    sequences : pandas.DataFrame or None
        Per (sequence, t) judged: ``layer``, ``ratio`` (measured / Eq. 8), ``ratio_popularity`` (measured / N_pop).
    untestable : tuple of (str, str)
        ``(part, reason)`` for each part these data cannot show.
    tolerance : float
        :data:`TOLERANCE`.
    """

    status: str
    strict_status: str
    parts: pd.DataFrame
    layers: pd.DataFrame
    sequences: pd.DataFrame | None
    untestable: tuple
    tolerance: float = TOLERANCE


def combine(outcomes) -> str:
    """:data:`HOLDS` if every outcome holds, :data:`FAILS` if every one fails, :data:`PARTLY` otherwise."""
    outcomes = [o for o in outcomes if o != UNTESTABLE]
    if not outcomes:
        return UNTESTABLE
    if all(o == HOLDS for o in outcomes):
        return HOLDS
    return FAILS if all(o == FAILS for o in outcomes) else PARTLY


def _share_outcome(flags) -> str:
    """HOLDS if every flag is true, FAILS if none is, PARTLY otherwise."""
    flags = list(flags)
    return HOLDS if all(flags) else FAILS if not any(flags) else PARTLY


def sign_test(below: int, n: int) -> float:
    """One-sided sign test: the chance of at least ``below`` of ``n`` fair-coin outcomes landing below."""
    return sum(math.comb(n, i) for i in range(int(below), int(n) + 1)) / 2.0 ** n


def _judge_layers(curves: pd.DataFrame) -> pd.DataFrame:
    """Per (model, domain, layer): the smallest N_pop / N_Eq8 over t, ratios at REPORT_TOKENS, both readings."""
    rows = []
    for (model, domain, layer), group in curves.groupby(["model", "domain", "layer"], sort=False):
        group = group.sort_values("t")
        ratio = (group["popularity"] / group["uniform"]).to_numpy()
        worst = int(np.argmin(ratio))
        shortfall = (group["uniform"] - group["popularity"]).to_numpy()
        at = dict(zip(group["t"].to_numpy(), ratio))
        rows.append({"model": model, "domain": domain, "layer": layer, "min_ratio": float(ratio[worst]),
                     "t_at_min": int(group["t"].iloc[worst]),
                     **{f"ratio_{t}": float(at.get(t, np.nan)) for t in REPORT_TOKENS},
                     "follows": bool(ratio.min() >= TOLERANCE),
                     "beyond_noise": bool((shortfall > np.maximum(NOISE_Z * group["popularity_se"].to_numpy(),
                                                                  1e-9 * group["uniform"].to_numpy())).any())})
    return pd.DataFrame(rows)


def _skew_parts(layers: pd.DataFrame) -> list[dict]:
    """The skew part per model and over all models."""
    rows = []
    for scope, group in list(layers.groupby("model", sort=False)) + [("all", layers)]:
        worst = group.loc[group["min_ratio"].idxmin()]
        rows.append({"part": "skew", "scope": scope, "material": _share_outcome(group["follows"]),
                     "strict": _share_outcome(~group["beyond_noise"]), "worst_ratio": float(worst["min_ratio"]),
                     "where": f"{worst['model']}/{worst['domain']} layer {worst['layer']}, t = {worst['t_at_min']}",
                     "count": len(group), "reason": None})
    return rows


def _sample_part(part: str, frame: pd.DataFrame | None, unit: str, key: str, need: int) -> tuple[dict, pd.DataFrame | None]:
    """A part judged on samples (sequences, or layers of sampled batches): per ``key``, the median of measured /
    Eq. 8 over the ``unit`` samples (material) and the one-sided sign test of samples below Eq. 8 (strict)."""
    if frame is None or frame.empty:
        return _untestable(part, f"no {unit} data"), None
    frame = frame.assign(ratio=frame["measured"] / frame["uniform"],
                         ratio_popularity=frame["measured"] / frame["popularity"])
    if frame.groupby(key)[unit].nunique().min() < need:
        return _untestable(part, f"fewer than {need} {unit}s at some {key}"), frame
    medians = frame.groupby(key)["ratio"].median()
    tests = [sign_test(int((g["ratio"] < 1).sum()), len(g)) for _, g in frame.groupby(key)]
    worst = frame.loc[frame["ratio"].idxmin()]
    row = {"part": part, "scope": f"{unit}s", "material": HOLDS if (medians >= TOLERANCE).all() else FAILS,
           "strict": FAILS if min(tests) < SIGN_LEVEL else HOLDS, "worst_ratio": float(worst["ratio"]),
           "where": f"{unit} {int(worst[unit])} (layer {int(worst['layer'])}), {key} = {int(worst[key])}",
           "count": int(frame[unit].nunique()), "reason": None}
    return row, frame


def _untestable(part: str, reason: str, scope: str = "all") -> dict:
    return {"part": part, "scope": scope, "material": UNTESTABLE, "strict": UNTESTABLE, "worst_ratio": np.nan,
            "where": None, "count": 0, "reason": reason}


def judge_fig1(curves: pd.DataFrame, windows: pd.DataFrame | None = None, sequences_per_layer: int | None = None,
               batches: pd.DataFrame | None = None, checkpoints=(), decode: bool = False) -> Fig1Judgement:
    """Judge the Fig. 1a/1b claim on trained-routing data (criteria in the module docstring).

    Parameters
    ----------
    curves : pandas.DataFrame
        Columns ``model``, ``domain``, ``layer``, ``t``, ``uniform`` (Eq. 8), ``popularity`` (``N_pop``) and
        ``popularity_se`` (its standard error), over :data:`TOKENS`.
    windows : pandas.DataFrame, optional
        Columns ``sequence``, ``layer``, ``t``, ``measured`` (mean distinct experts over the sequence's windows
        of ``t`` tokens), ``uniform``, ``popularity`` (of the sequence's layer).
    sequences_per_layer : int, optional
        The fewest sequences any layer has (batches of sequences need :data:`MIN_SEQUENCES`).
    batches : pandas.DataFrame, optional
        Columns ``layer``, ``tokens`` (``B w``), ``measured`` (mean distinct experts of sampled batches of ``B``
        sequences x ``w`` tokens), ``uniform``, ``popularity``: judged per ``tokens`` over layers, as windows are
        over sequences, where every layer has :data:`MIN_SEQUENCES` sequences.
    checkpoints : iterable of str
        The checkpoints the data recorded (the paper's own are :data:`PAPER_CHECKPOINTS`).
    decode : bool
        Whether any data routed tokens generated while decoding.

    Returns
    -------
    Fig1Judgement
    """
    missing = {"model", "domain", "layer", "t", "uniform", "popularity", "popularity_se"} - set(curves)
    if missing:
        raise ValueError(f"curves lacks the columns {sorted(missing)}")
    layers = _judge_layers(curves)
    parts = _skew_parts(layers)
    windows = None if windows is None else windows[windows["t"].isin(WINDOW_TOKENS)]
    window_row, sequences = _sample_part("windows", windows, "sequence", "t", MIN_SEQUENCES)
    parts.append(window_row)
    if not sequences_per_layer or sequences_per_layer < MIN_SEQUENCES:
        parts.append(_untestable("batches", f"fewer than {MIN_SEQUENCES} sequences per layer"))
    else:
        parts.append(_sample_part("batches", batches, "layer", "tokens", MIN_SEQUENCES)[0])
    if not decode:
        parts.append(_untestable("decode", "every source routed given text (prefill), none decoded"))
    if not set(checkpoints) & set(PAPER_CHECKPOINTS):
        parts.append(_untestable("paper_models", "no source records DeepSeek-V2-Lite-Chat or Qwen1.5-MoE-Chat"))
    parts = pd.DataFrame(parts)
    judged = parts[(parts["scope"] != "all") | (parts["part"] != "skew")]  # the per-model skew rows, not their sum
    judged = judged[judged["part"].isin(("skew", "windows", "batches"))]
    untestable = tuple((row.part, row.reason) for row in parts.itertuples() if row.material == UNTESTABLE)
    return Fig1Judgement(status=combine(judged["material"]), strict_status=combine(judged["strict"]), parts=parts,
                         layers=layers, sequences=sequences, untestable=untestable)


def fig1_inputs() -> dict:
    """The shipped trained-routing data as the keyword arguments of :func:`judge_fig1`.

    Curves of every count source over :data:`moesd.routing.activation.TOKENS`; windows of the sources with per-token sequences
    (Switch-base-128) at the criterion's window lengths; the fewest sequences any of their layers has; the
    checkpoints recorded. No source decoded.
    """
    traces = sources.token_traces("specmoe-switch")
    windows = activation.window_activation(traces, "switch-base-128/mixed", WINDOW_TOKENS)
    return {"curves": activation.popularity_curves(), "windows": windows,
            "sequences_per_layer": min(len(np.unique(trace.sequence)) for trace in traces.values()),
            "checkpoints": tuple(sorted({sources.info(name).checkpoint for name in sources.names()})),
            "decode": False}
