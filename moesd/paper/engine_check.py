"""The predictor against serving engines' published SD speedups (beyond the paper).

``data/engines/published_speedups.csv`` holds speedups of speculative decoding on MoE targets that engine
teams and users published (one row per point, with its source, link and the quoted line), with the mean
acceptance length of the same or a cited setup and the plain decoding step the source reports; chains of
drafts and trees (``draft_topk`` candidates per position, ``verify_tokens`` scored per sequence) alike. Nothing
here is fitted to the speedups: :func:`check_engines` predicts each point with
:func:`moesd.predictor.predict.predict_sd` in several variants, from the GPUs' work alone (the predictor
before engine profiles) to the engine's profile with the measured plain step, and with each engine term
left out in turn, and scores each variant by its mean absolute percentage error (MAPE), whether it gets
the sign of "SD pays" (speedup > 1) right, and whether it gets the direction of each source's trend over
batch size right. :func:`error_band` turns the residuals into the predictor's error band per variant, with its
leave-one-source-out coverage; :func:`write_error_band` writes it where :mod:`moesd.predictor.band` reads it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from moesd.predictor.engine import Cost, engine_profile
from moesd.predictor.predict import predict_sd
from moesd.predictor.setup import Setup
from moesd.paper_tables import DATA_DIR

__all__ = ["VARIANTS", "BAND_VARIANTS", "published_speedups", "point_setup", "EngineCheck", "check_engines",
           "error_band", "write_error_band"]

_NONE = Cost(0.0, 0.0, 0.0, "left out")
_SETUP = ["source", "model", "draft", "hardware", "tp", "gamma", "draft_topk", "verify_tokens"]
"""The columns one setup shares across batch sizes (a trend is judged within one setup)."""

VARIANTS = {
    "device": "the GPUs' work only (the predictor before engine profiles)",
    "profile": "the engine's profile, without a measured plain step",
    "anchored": "the engine's profile and the source's measured plain step at batch size 1",
    "anchored, no exposed host": "anchored, the host time SD rounds expose left out",
    "anchored, no extend pass": "anchored, the draft head's extend pass left out",
    "anchored, no tiles": "anchored, grouped-GEMM tiles and their FLOP fraction left out",
    "anchored, no attention kernel": "anchored, the attention kernel's own fractions (FlashMLA's) left out",
}
"""The variants :func:`check_engines` scores, and what each holds."""


def published_speedups() -> pd.DataFrame:
    """The published points (``data/engines/published_speedups.csv``), one row each.

    Besides the setup (model, draft, GPUs, engine, dtypes, ``gamma``, ``draft_topk``, ``verify_tokens``,
    ``batch_size``, ``context``), each row holds the published ``speedup``; the two measurements it is the
    ratio of as published, ``published_baseline`` and ``published_sd`` in ``published_unit`` (a throughput,
    ``tok/s`` total, per user or per rank, or a latency, ``ms per request``; the baseline is empty where the
    source gives only the speedup); the mean ``acceptance_length`` (tokens per round, the bonus token
    included) and the plain step ``baseline_step_ms`` at ``baseline_batch_size``, each with where it is
    from; and the ``url`` and ``quote`` of the source.
    """
    return pd.read_csv(DATA_DIR / "engines" / "published_speedups.csv")


_LEFT_OUT = {
    "anchored, no exposed host": dict(exposed_host_seconds=_NONE),
    "anchored, no extend pass": dict(draft_extend=False),
    "anchored, no tiles": dict(expert_tile_rows={}, expert_flops_fraction={}),
    "anchored, no attention kernel": dict(attention_fractions={}),
}
"""The engine term each ablation of :data:`VARIANTS` leaves out, as :class:`EngineProfile` fields."""


def _profile(name: str, variant: str):
    return dataclasses.replace(engine_profile(name), **_LEFT_OUT.get(variant, {}))


def point_setup(point, variant: str = "anchored") -> Setup:
    """The :class:`~moesd.predictor.setup.Setup` of one published point (a row of :func:`published_speedups`) as the
    variant ``variant`` of :data:`VARIANTS` prices it: the draft on the target's GPUs, the engine's profile unless
    ``"device"``, the source's plain step unless ``"device"`` or ``"profile"``."""
    options = dict(tp=point.tp, draft_tp=point.tp, ep=point.ep, context=point.context, dtype=point.dtype,
                   draft_dtype=point.draft_dtype, draft_topk=point.draft_topk, verify_tokens=point.verify_tokens,
                   dp_attention=bool(point.dp_attention))
    if variant != "device":
        options["engine"] = _profile(point.engine, variant)
    if variant.startswith("anchored"):
        options.update(step_seconds=point.baseline_step_ms * 1e-3, step_batch_size=point.baseline_batch_size)
    return Setup(point.model, point.draft, point.hardware, **options)


def _predict(point, variant: str) -> float:
    # Eq. 4's tokens per round are the published acceptance length, chain or tree alike
    sigma = point.acceptance_length / (point.gamma + 1)
    frame = predict_sd(point_setup(point, variant), point.batch_size, point.gamma, sigma)
    return float(frame["speedup"].iloc[0])


@dataclass(frozen=True)
class EngineCheck:
    """Predictions of the published points and their scores.

    Attributes
    ----------
    points : pandas.DataFrame
        The published points with one column of predicted speedup per variant (:data:`VARIANTS`) and
        ``error``, the anchored prediction's relative error (``anchored / speedup - 1``).
    scores : pandas.DataFrame
        One row per variant: ``mape`` (mean absolute percentage error of the speedup, %), ``signs_right``
        and ``points`` (points where predicted and published speedup fall on the same side of 1, of all),
        ``trends_right`` and ``trends`` (setups published at several batch sizes whose speedup changes from
        the smallest to the largest batch size in the published direction, of all such setups).
    by_source : pandas.DataFrame
        The MAPE (%) of each variant (columns) over each source's points (rows).
    wrong_sign : list of str
        The points where the anchored prediction and the publication fall on opposite sides of 1.
    gamma_peaks : pandas.DataFrame
        One row per source, GPU and batch size published at several draft lengths (one candidate per position):
        ``published`` and ``anchored``, the draft length of the highest speedup in each.
    """

    points: pd.DataFrame
    scores: pd.DataFrame
    by_source: pd.DataFrame
    wrong_sign: list
    gamma_peaks: pd.DataFrame


def check_engines(points: pd.DataFrame | None = None) -> EngineCheck:
    """Predict every published point in every variant of :data:`VARIANTS` and score each variant."""
    points = published_speedups() if points is None else points.copy()
    rows = list(points.itertuples(index=False))
    for variant in VARIANTS:
        points[variant] = [_predict(point, variant) for point in rows]
    errors = pd.DataFrame({variant: (points[variant] / points["speedup"] - 1).abs() * 100 for variant in VARIANTS})
    scores = []
    for variant in VARIANTS:
        predicted, published = points[variant].to_numpy(), points["speedup"].to_numpy()
        trends = [np.sign(np.diff(group.sort_values("batch_size")[[variant, "speedup"]].iloc[[0, -1]].to_numpy(),
                                  axis=0)) for _, group in points.groupby(_SETUP) if group.batch_size.nunique() > 1]
        scores.append({"variant": variant, "mape": float(errors[variant].mean()),
                       "signs_right": int(((predicted > 1) == (published > 1)).sum()), "points": len(points),
                       "trends_right": sum(int(t[0, 0] == t[0, 1]) for t in trends), "trends": len(trends)})
    by_source = errors.groupby(points["source"], sort=False).mean()
    points["error"] = points["anchored"] / points["speedup"] - 1
    wrong = points.loc[(points["anchored"] > 1) != (points["speedup"] > 1), "point"].tolist()
    chains = points[points["draft_topk"] == 1].groupby(["source", "hardware", "batch_size"], sort=False)
    peaks = pd.DataFrame([(*setup, int(group.loc[group["speedup"].idxmax(), "gamma"]),
                           int(group.loc[group["anchored"].idxmax(), "gamma"]))
                          for setup, group in chains if group["gamma"].nunique() > 1],
                         columns=["source", "hardware", "batch_size", "published", "anchored"])
    return EngineCheck(points, pd.DataFrame(scores), by_source, wrong, peaks)


BAND_VARIANTS = ("device", "profile", "anchored")
"""The variants a prediction is made in, each with its own error band: without an engine profile, with one, and with
one and a measured plain step (:func:`moesd.predictor.band.band_variant`)."""


def error_band(check: EngineCheck | None = None) -> pd.DataFrame:
    """The error band of each of :data:`BAND_VARIANTS`, calibrated on the published points, and its coverage when
    each source is left out.

    The band is the range of ``published / predicted`` over the points: a prediction ``s`` stands for a speedup in
    ``[low s, high s]``. Nothing is fitted to a point it is checked against: leaving each source out in turn, the
    band of the other sources' points is checked on the left-out source's points (``loso_covered`` of ``points``
    fall inside), the honest measure of how often the band holds for a deployment the table has not seen.

    Returns
    -------
    pandas.DataFrame
        One row per variant: ``variant``, ``low`` and ``high`` (the factors, over all points), ``points``,
        ``sources``, ``loso_covered`` (points inside the band of the other sources) and ``loso_coverage``
        (their fraction).
    """
    check = check or check_engines()
    points = check.points
    rows = []
    for variant in BAND_VARIANTS:
        ratio = np.log(points["speedup"] / points[variant])
        covered = 0
        for source in points["source"].unique():
            out = (points["source"] == source).to_numpy()
            inside = (ratio[out] >= ratio[~out].min()) & (ratio[out] <= ratio[~out].max())
            covered += int(inside.sum())
        rows.append({"variant": variant, "low": float(np.exp(ratio.min())), "high": float(np.exp(ratio.max())),
                     "points": len(points), "sources": int(points["source"].nunique()), "loso_covered": covered,
                     "loso_coverage": covered / len(points)})
    return pd.DataFrame(rows)


def write_error_band(path=None) -> Path:
    """Write :func:`error_band` to the predictor's data table (default ``moesd/records/error_band.csv``), which
    :mod:`moesd.predictor.band` reads; run it after the validation table or the predictor changes."""
    from moesd.predictor.band import BAND_TABLE

    path = Path(path) if path is not None else BAND_TABLE
    error_band().to_csv(path, index=False, float_format="%.6g")
    return path
