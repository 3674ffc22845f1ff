"""A forward study routed by a trained router's popularity beside the uniform one: prediction and comparison.

* :func:`predicted_efficiency`: the predictor (:func:`moesd.predictor.forward.step_time`) calibrated on the
  *uniform* forward study (:func:`moesd.model.calibrate.calibrate`, nothing fitted to the popularity-routed
  one), then run with uniform routing and with a popularity: the target efficiency each routing should give.
* :func:`compare_routings`: the two measured studies' target efficiency ``T(B, 1) / T(B, gamma + 1)`` per
  batch size (mean over repeats, each repeat's ratio taken within the repeat), their difference with its
  standard error, and the change of the peak.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from moesd.paper.curves import NOISE_Z


def efficiency_by_repeat(forward: pd.DataFrame, gamma: int, role: str = "target") -> pd.DataFrame:
    """``T(B, 1) / T(B, gamma + 1)`` of each repeat (``run``) and batch size: columns ``batch_size``, ``run``, ``efficiency``."""
    passes = forward[forward["role"] == role].pivot_table(index=["run", "batch_size"], columns="tokens",
                                                           values="seconds")
    if 1 not in passes.columns or gamma + 1 not in passes.columns:
        raise ValueError(f"the forward study has no {role} pass of 1 and {gamma + 1} tokens per sequence")
    return (passes[1] / passes[gamma + 1]).dropna().rename("efficiency").reset_index()


def efficiency_summary(forward: pd.DataFrame, gamma: int) -> pd.DataFrame:
    """Mean target efficiency over repeats per batch size with its standard error: ``batch_size``, ``mean``, ``se``, ``runs``."""
    groups = efficiency_by_repeat(forward, gamma).groupby("batch_size")["efficiency"]
    summary = pd.DataFrame({"mean": groups.mean(), "se": groups.std(ddof=1) / np.sqrt(groups.count()),
                            "runs": groups.count()})
    return summary.reset_index()


@dataclass(frozen=True)
class RoutingComparison:
    """Two forward studies' target efficiency at one ``gamma``: uniform against popularity routing.

    Attributes
    ----------
    gamma : int
    table : pandas.DataFrame
        Per ``batch_size``: ``uniform``, ``uniform_se``, ``popularity``, ``popularity_se``, ``difference``
        (popularity - uniform), ``difference_se`` and ``beyond_noise`` (``|difference| > NOISE_Z`` standard errors).
    uniform_peak, popularity_peak : dict
        ``batch_size``, ``value`` and ``se`` of each curve's largest mean.
    peak_change, peak_change_se : float
        ``popularity_peak["value"] - uniform_peak["value"]`` and its standard error.
    """

    gamma: int
    table: pd.DataFrame
    uniform_peak: dict
    popularity_peak: dict
    peak_change: float
    peak_change_se: float


def _peak(summary: pd.DataFrame) -> dict:
    row = summary.loc[summary["mean"].idxmax()]
    return {"batch_size": int(row["batch_size"]), "value": float(row["mean"]), "se": float(row["se"])}


def compare_routings(uniform: pd.DataFrame, popularity: pd.DataFrame, gamma: int = 4) -> RoutingComparison:
    """Compare the target efficiency of a uniform and a popularity-routed forward study of the same design.

    Parameters
    ----------
    uniform, popularity : pandas.DataFrame
        The two forward studies' rows (``run``, ``role``, ``batch_size``, ``tokens``, ``seconds``).
    gamma : int
        Draft length (passes of ``gamma + 1`` tokens per sequence).

    Returns
    -------
    RoutingComparison
    """
    a, b = efficiency_summary(uniform, gamma), efficiency_summary(popularity, gamma)
    table = a.merge(b, on="batch_size", suffixes=("_u", "_p"))
    table = pd.DataFrame({"batch_size": table["batch_size"], "uniform": table["mean_u"], "uniform_se": table["se_u"],
                          "popularity": table["mean_p"], "popularity_se": table["se_p"]})
    table["difference"] = table["popularity"] - table["uniform"]
    table["difference_se"] = np.hypot(table["uniform_se"], table["popularity_se"])
    table["beyond_noise"] = table["difference"].abs() > NOISE_Z * table["difference_se"]
    peak_a, peak_b = _peak(a), _peak(b)
    return RoutingComparison(gamma=int(gamma), table=table, uniform_peak=peak_a, popularity_peak=peak_b,
                             peak_change=peak_b["value"] - peak_a["value"],
                             peak_change_se=float(np.hypot(peak_a["se"], peak_b["se"])))


def mean_difference(comparison: RoutingComparison, low: int, high: int) -> tuple[float, float]:
    """Mean of popularity - uniform over the batch sizes in ``[low, high]``, and its standard error.

    The batch sizes' differences are independent measurements (different passes), so the standard error of their
    mean is ``sqrt(sum se_B^2) / n``.
    """
    rows = comparison.table[(comparison.table["batch_size"] >= low) & (comparison.table["batch_size"] <= high)]
    if rows.empty:
        raise ValueError(f"no batch size of the comparison lies in [{low}, {high}]")
    return float(rows["difference"].mean()), float(np.sqrt((rows["difference_se"] ** 2).sum()) / len(rows))


def predicted_efficiency(forward: pd.DataFrame, sidecar: dict, popularity, gammas=(2, 3, 4)) -> pd.DataFrame:
    """Target efficiency the predictor calibrated on a uniform forward study gives under uniform and popularity routing.

    The predictor's efficiencies (:func:`moesd.model.calibrate.calibrate`, the eager expert loop of the CPU
    sweeps) are fitted to the *uniform* study's target rows; the same calibrated model then prices every
    ``(B, s)`` with Eq. 8's experts and with ``sum_e 1 - (1 - p_e)^(B s)`` of ``popularity``.

    Parameters
    ----------
    forward : pandas.DataFrame
        The uniform forward study's rows.
    sidecar : dict
        Its sidecar (shapes and measured roofline).
    popularity : array_like, shape (E,) or (MoE layers, E)
        The popularity the other study routes with (:func:`moesd.routing.sources.popularity` mapped onto the
        study's layers).
    gammas : sequence of int

    Returns
    -------
    pandas.DataFrame
        ``batch_size``, ``gamma``, ``uniform``, ``popularity`` (predicted efficiencies), ``difference``.
    """
    from moesd.measure.analysis import measured_device, measured_shapes
    from moesd.model.calibrate import calibrate
    from moesd.predictor.forward import step_time

    target = measured_shapes(sidecar)[0]
    hardware = measured_device(sidecar)
    dtype = {"float32": "fp32", "bfloat16": "bf16", "float16": "bf16"}[sidecar["settings"]["dtype"]]
    fitted = calibrate(forward, target, hardware, dtype=dtype, cuda_graphs=False, grouped_experts=False)
    batch = np.asarray(sorted(forward["batch_size"].unique()))
    context = int(forward["context"].iloc[0])

    def seconds(tokens, routing):
        return step_time(target, hardware, tokens, batch, context, dtype=dtype, cuda_graphs=False,
                         grouped_experts=False, efficiency=fitted.efficiency, routing=routing).total

    rows = []
    for gamma in gammas:
        uniform = seconds(1, None) / seconds(gamma + 1, None)
        popular = seconds(1, popularity) / seconds(gamma + 1, popularity)
        rows.append(pd.DataFrame({"batch_size": batch, "gamma": gamma, "uniform": uniform, "popularity": popular,
                                  "difference": popular - uniform}))
    return pd.concat(rows, ignore_index=True)


def predicted_peak_change(prediction: pd.DataFrame) -> float:
    """The change of the peak target efficiency from uniform to popularity routing in a
    :func:`predicted_efficiency` table (of one gamma): the popularity peak less the uniform one."""
    return float(prediction["popularity"].max() - prediction["uniform"].max())
