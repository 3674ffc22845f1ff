"""The predictor (:func:`moesd.predictor.forward.step_time`) fitted to a measured forward study: the physical counterpart of Algorithm 1.

:func:`calibrate` fits the few efficiency and overhead parameters (:class:`moesd.predictor.kernels.Efficiency`) to the
``T(B, s)`` of a ``moesd sweep forward`` and reports the error on held-out batch sizes;
the shapes and the roofline of that sweep are read from its sidecar
(:func:`moesd.measure.analysis.measured_shapes`, :func:`moesd.measure.analysis.measured_device`). scipy is
imported inside :func:`calibrate` only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from moesd._checks import UsageError
from moesd.measure.analysis import measured_device, measured_shapes
from moesd.predictor.forward import step_time
from moesd.predictor.kernels import Efficiency
from moesd.predictor.models import resolve_model
from moesd.theory.roofline import hardware_record


@dataclass(frozen=True)
class Calibration:
    """Result of :func:`calibrate`.

    Attributes
    ----------
    efficiency : Efficiency
        The fitted parameters (the others at their defaults).
    fitted : dict
        Name to value of each fitted parameter.
    train_batch_sizes, held_out_batch_sizes : tuple of int
        Batch sizes fitted and held out.
    train_mape, held_out_mape : float
        Mean absolute percentage error of ``T(B, s)`` on each set (percent).
    table : pandas.DataFrame
        ``batch_size``, ``tokens``, ``measured``, ``predicted`` (seconds, medians over repeats) and
        ``held_out``.
    """

    efficiency: Efficiency
    fitted: dict
    train_batch_sizes: tuple
    held_out_batch_sizes: tuple
    train_mape: float
    held_out_mape: float
    table: pd.DataFrame


CALIBRATED = ("bandwidth_fraction", "flops_fraction", "step_seconds")
"""The parameters :func:`calibrate` fits by default. ``kernel_seconds`` is left out: one model's kernels
do not change in number with the batch, so their cost and ``step_seconds`` are one constant to a fit."""


def calibrate(forward_frame: pd.DataFrame, model, hardware, *, role="target", dtype="fp32",
              held_out_batch_sizes=None, parameters=None, tp=1, cuda_graphs=True,
              grouped_experts=False) -> Calibration:
    """Fit :class:`Efficiency` to a measured forward study and report the error on held-out batch sizes.

    Least squares on the log of the median time of every ``(batch_size, tokens)`` of the fitted batch
    sizes (relative errors weigh small and large steps alike), with scipy's bounded trust-region
    solver. This is the physical, identifiable counterpart of Algorithm 1: three or four parameters with
    units, fitted to ``T_T(B, s)`` itself rather than to a ratio of times.

    Parameters
    ----------
    forward_frame : pandas.DataFrame
        Rows of a forward study (``moesd sweep forward``): ``role``, ``batch_size``, ``tokens``,
        ``context``, ``seconds``.
    model : str, ModelSpec or Architecture
        The measured model's shape (for a scaled sweep, ``spec.architecture(layers, width=...)``).
    hardware : str or Hardware
        The measuring device, e.g. :func:`moesd.measure.analysis.measured_device` of the sweep's sidecar.
    role : {"target", "draft"}
        Which model's rows to fit.
    dtype : str, default "fp32"
        The sweep's weight dtype.
    held_out_batch_sizes : sequence of int, optional
        Batch sizes kept out of the fit (default: every third measured batch size, from the second).
    parameters : sequence of str, optional
        Fields of :class:`Efficiency` to fit (default :data:`CALIBRATED`, and ``expert_seconds``
        when experts run one by one; never for a dense model).
    tp, cuda_graphs, grouped_experts
        As in :func:`step_time` (the project's CPU sweeps run Hugging Face's eager expert loop).

    Returns
    -------
    Calibration
    """
    from scipy.optimize import least_squares

    if parameters is None:
        parameters = CALIBRATED + (() if grouped_experts else ("expert_seconds",))
    for name in parameters:
        if name not in ("bandwidth_fraction", "flops_fraction", "kernel_seconds", "launch_seconds",
                        "step_seconds", "expert_seconds"):
            raise UsageError(f"parameters: {name!r} is not a field of Efficiency", "parameters")
    needed = {"role", "batch_size", "tokens", "context", "seconds"}
    if not needed <= set(forward_frame.columns):
        raise UsageError(f"forward_frame lacks column(s) {', '.join(sorted(needed - set(forward_frame.columns)))}", "forward_frame")
    rows = forward_frame[forward_frame["role"] == role]
    if rows.empty:
        raise UsageError(f"role: no rows of role {role!r} in forward_frame", "role")
    table = rows.groupby(["batch_size", "tokens", "context"], as_index=False)["seconds"].median()
    table = table.rename(columns={"seconds": "measured"})
    batch_sizes = np.sort(table["batch_size"].unique())
    if held_out_batch_sizes is None:
        held_out_batch_sizes = batch_sizes[1::3]
    held_out = set(int(b) for b in held_out_batch_sizes)
    if not held_out <= set(int(b) for b in batch_sizes) or len(held_out) >= len(batch_sizes):
        raise UsageError("held_out_batch_sizes must be measured batch sizes, leaving some to fit", "held_out_batch_sizes")
    table["held_out"] = table["batch_size"].isin(held_out)
    arch, hardware = resolve_model(model), hardware_record(hardware)
    parameters = tuple(p for p in parameters if p != "expert_seconds" or arch.num_experts)  # dense: no experts
    start = Efficiency(bandwidth_fraction=hardware.bandwidth_fraction, flops_fraction=hardware.flops_fraction,
                       expert_seconds=1e-4 if "expert_seconds" in parameters else None)
    bounds = {"bandwidth_fraction": (1e-3, 10.0), "flops_fraction": (1e-3, 10.0), "kernel_seconds": (0.0, 1e-2),
              "launch_seconds": (0.0, 1e-2), "step_seconds": (0.0, 10.0), "expert_seconds": (0.0, 1e-1)}
    scale = {"bandwidth_fraction": 1.0, "flops_fraction": 1.0, "kernel_seconds": 1e-5, "launch_seconds": 1e-5,
             "step_seconds": 1e-3, "expert_seconds": 1e-4}

    def efficiency_of(x) -> Efficiency:
        return dataclasses.replace(start, **{n: float(v) * scale[n] for n, v in zip(parameters, x)})

    def predict(eff, subset):
        return step_time(arch, hardware, subset["tokens"].to_numpy(), subset["batch_size"].to_numpy(),
                         subset["context"].to_numpy(), tp=tp, dtype=dtype, cuda_graphs=cuda_graphs,
                         efficiency=eff, grouped_experts=grouped_experts).total

    train = table[~table["held_out"]]
    x0 = [max(getattr(start, n), bounds[n][0]) / scale[n] + (1e-3 if getattr(start, n) == 0 else 0)
          for n in parameters]
    result = least_squares(lambda x: np.log(predict(efficiency_of(x), train)) - np.log(train["measured"]),
                           x0, bounds=([bounds[n][0] / scale[n] for n in parameters],
                                       [bounds[n][1] / scale[n] for n in parameters]), method="trf")
    efficiency = efficiency_of(result.x)
    table["predicted"] = predict(efficiency, table)
    error = 100 * np.abs(table["predicted"] / table["measured"] - 1)
    return Calibration(
        efficiency=efficiency, fitted={n: getattr(efficiency, n) for n in parameters},
        train_batch_sizes=tuple(int(b) for b in batch_sizes if b not in held_out),
        held_out_batch_sizes=tuple(sorted(held_out)),
        train_mape=float(error[~table["held_out"]].mean()), held_out_mape=float(error[table["held_out"]].mean()),
        table=table[["batch_size", "tokens", "context", "measured", "predicted", "held_out"]])


def predicted_forward_study(forward_frame: pd.DataFrame, sidecar: dict, role: str = "target") -> pd.DataFrame:
    """The predictor against a measured forward study, with nothing fitted: :func:`step_time` per point.

    The model is the sweep's shape (:func:`~moesd.measure.analysis.measured_shapes`), the device its measured
    roofline (:func:`~moesd.measure.analysis.measured_device`), the engine what the sweep ran (CUDA graph replays or eager launches,
    grouped expert GEMMs on CUDA or Hugging Face's expert loop), with :class:`Efficiency`'s defaults.

    Parameters
    ----------
    forward_frame : pandas.DataFrame
        A forward study's rows (``role``, ``batch_size``, ``tokens``, ``context``, ``seconds``).
    sidecar : dict
        Its sidecar.
    role : {"target", "draft"}

    Returns
    -------
    pandas.DataFrame
        ``batch_size``, ``tokens``, ``measured`` and ``predicted`` (seconds; measured: the median over
        repeats) and ``ratio`` (predicted / measured).
    """
    settings = sidecar.get("settings", {})
    rows = forward_frame[forward_frame["role"] == role]
    if rows.empty:
        raise UsageError(f"role: no rows of role {role!r} in forward_frame", "role")
    table = rows.groupby(["batch_size", "tokens", "context"], as_index=False)["seconds"].median()
    target, draft = measured_shapes(sidecar)
    dtype = {"float32": "fp32", "bfloat16": "bf16", "float16": "bf16"}[settings.get("dtype", "float32")]
    predicted = step_time(target if role == "target" else draft, measured_device(sidecar),
                          table["tokens"].to_numpy(), table["batch_size"].to_numpy(), table["context"].to_numpy(),
                          dtype=dtype, cuda_graphs=bool(settings.get("cuda_graphs")),
                          grouped_experts=sidecar.get("experts_implementation") == "grouped_mm").total
    return pd.DataFrame({"batch_size": table["batch_size"], "tokens": table["tokens"], "measured": table["seconds"],
                         "predicted": predicted, "ratio": predicted / table["seconds"].to_numpy()})
