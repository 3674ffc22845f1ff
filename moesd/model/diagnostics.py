"""How good a fit of Algorithm 1 is (Appendix C.3 and beyond): held-back errors, robustness, residuals, variants.

:func:`held_out_errors` judges a fit on the rows it was not fitted on; :func:`robustness_study` is
Appendix C.3's fit per stride sample (or per fractional-stride sample size) with its errors and the batch
sizes each sample covers; :func:`residual_table` gives the residuals against B for each K and gamma;
:func:`model_variant_errors` / :func:`best_model_variant` judge Algorithm 1's ``B gamma`` verified tokens
against ``B (gamma + 1)``, in both denominators, on held-back points; :func:`compare_stage_times` sets the
fitted draft and rejection terms beside measured stage times (as ratios to a decode step: absolute times
are not identifiable from speedups, see :mod:`moesd.model.fit`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from moesd._checks import UsageError, as_array
from moesd.model.algorithm1 import VARIANTS, VERIFY_TOKENS, SpeedupInputs, denominator_weights, stage_times
from moesd.model.fit import FitResult, fit_speedup_model
from moesd.model.measurements import COLUMNS, measurement_array, speedup_inputs
from moesd.model.samples import PAPER_STRIDES

__all__ = ["held_out_errors", "robustness_study", "residual_table", "STAGE_COLUMNS", "compare_stage_times",
           "model_variant_errors", "best_model_variant"]


def _held_back(result: FitResult, frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Which rows of ``frame`` the fit did not use (found by index label), and the frame's checked values."""
    if not isinstance(result, FitResult):
        raise UsageError(f"result must be a FitResult, got {type(result).__name__}", "result")
    array = measurement_array(frame)
    if not frame.index.is_unique:
        raise UsageError("frame's index must be unique (held-back rows are found by label)", "frame")
    positions = frame.index.get_indexer(result.fitted.index)
    if (positions < 0).any():
        raise UsageError("frame lacks rows the fit used: pass the frame the result was fitted on", "frame")
    if not np.array_equal(array[positions], result.fitted[list(COLUMNS)].to_numpy(dtype=float)):
        raise UsageError("frame's rows differ from those the fit used: pass the frame the result was fitted on", "frame")
    held = np.ones(len(frame), dtype=bool)
    held[positions] = False
    return held, array


def held_out_errors(result: FitResult, frame: pd.DataFrame) -> dict:
    """Errors of a fit's predicted speedup on the rows of ``frame`` it was not fitted on.

    ``frame`` must be the frame given to :func:`fit_speedup_model`: the fitted rows are found by their
    index labels.

    Returns
    -------
    dict
        ``points``, ``mse``, ``mape`` (percent) and ``max_abs_error`` on the held-back rows, and
        ``mse_all`` over every row.
    """
    held, array = _held_back(result, frame)
    return _errors(result, speedup_inputs(frame, result.rp, result.verify_tokens, array), array[:, 5], held)


def _errors(result: FitResult, inputs: SpeedupInputs, measured: np.ndarray, held: np.ndarray) -> dict:
    """:func:`held_out_errors` from the inputs of every row, their measured speedups and the held-back mask."""
    all_error = inputs._speedup(result.parameters.vector(), result.variant) - measured
    error = all_error[held]
    points = int(held.sum())
    return {"points": points, "mse": float(np.mean(error ** 2)) if points else float("nan"),
            "mape": float(100 * np.mean(np.abs(error) / measured[held])) if points else float("nan"),
            "max_abs_error": float(np.max(np.abs(error))) if points else float("nan"),
            "mse_all": float(np.mean(all_error ** 2))}


def robustness_study(frame: pd.DataFrame, rp: float, strides=PAPER_STRIDES, sizes=None, **fit_options) -> pd.DataFrame:
    """Appendix C.3: a fit per sample, with its m, errors and the batch sizes the sample covers.

    The samples are :func:`moesd.model.samples.stride_sample` ``(frame, stride)`` for each of ``strides`` (the paper's
    design: 228 measurements, strides 25 ... 1), or, with ``sizes``, :func:`moesd.model.samples.spread_sample`
    ``(frame, m)`` for each ``m`` in ``sizes`` (a fractional stride ``n / m``: samples of every size for
    a design of other than 228 points, where whole strides give few sizes).

    Returns
    -------
    pandas.DataFrame
        One row per sample: ``stride`` (``n / m`` for a spread sample), ``m``, ``mse`` (over every
        measurement, as Table 3), ``mse_fitted``, held-back ``mape`` and ``max_abs_error``,
        ``fit_seconds``, ``solver`` (see :data:`moesd.model.fit.SOLVERS`), ``status`` (of the last trf run: > 0
        converged), ``nfev`` (residual evaluations), ``on_bounds`` (parameters on a bound, as a string),
        ``batch_sizes`` (sorted, as a string), ``points`` (its ``K/gamma/B`` points, as a string) and ``result``
        (the :class:`FitResult`).
    """
    array = measurement_array(frame)
    for name in ("stride", "m", "begin"):
        if name in fit_options:
            raise UsageError(f"robustness_study sets {name} itself", name)
    samples = ([{"stride": stride} for stride in strides] if sizes is None
               else [{"m": int(as_array("sizes", m, low=1, whole=True))} for m in sizes])
    everything = None  # the inputs of every row, for the errors of every fit
    rows = []
    for sample in samples:
        result = fit_speedup_model(frame, rp, **sample, **fit_options)
        if everything is None:
            everything = speedup_inputs(frame, result.rp, result.verify_tokens, array)
        held = _errors(result, everything, array[:, 5], ~frame.index.isin(result.fitted.index))
        stride = sample.get("stride", len(frame) / len(result.fitted))
        rows.append({"stride": stride, "m": len(result.fitted), "mse": held["mse_all"], "mse_fitted": result.mse,
                     "mape": held["mape"], "max_abs_error": held["max_abs_error"],
                     "fit_seconds": result.fit_seconds, "solver": result.solver, "status": result.status,
                     "nfev": result.nfev,
                     "on_bounds": " ".join(f"{name} ({side})" for name, side in result.on_bounds().items()),
                     "batch_sizes": " ".join(str(int(b)) for b in sorted(result.fitted["B"].unique())),
                     "points": " ".join(f"{k:g}/{g:g}/{b:g}" for k, g, b in
                                        result.fitted[["K", "gamma", "B"]].itertuples(index=False)),
                     "result": result})
    return pd.DataFrame(rows)


def residual_table(result: FitResult, frame: pd.DataFrame) -> pd.DataFrame:
    """Predicted against measured speedup for every row of ``frame``, tidy, for residuals against B per K, gamma.

    Returns
    -------
    pandas.DataFrame
        Columns ``K``, ``gamma``, ``B``, ``measured``, ``predicted``, ``residual`` (predicted minus
        measured), ``relative_residual`` (over measured) and ``fitted`` (whether the fit used the row),
        sorted by K, gamma, B, with ``frame``'s index.
    """
    held, array = _held_back(result, frame)
    predicted = speedup_inputs(frame, result.rp, result.verify_tokens, array).speedup(result.parameters, result.variant)
    measured = array[:, 5]
    table = pd.DataFrame({"K": frame["K"], "gamma": frame["gamma"], "B": frame["B"], "measured": measured,
                          "predicted": predicted, "residual": predicted - measured,
                          "relative_residual": (predicted - measured) / measured, "fitted": ~held},
                         index=frame.index)
    return table.sort_values(["K", "gamma", "B"], kind="stable")


STAGE_COLUMNS = ("t_draft", "t_reject", "t_target_1")
"""Measured stage times a result file holds per point (seconds): one draft forward of one token per
sequence, rejection sampling per round, one target decode step (``moesd.measure.bench``)."""


def compare_stage_times(result: FitResult, measured: pd.DataFrame, num_experts: int | None = None) -> pd.DataFrame:
    """The fitted draft and rejection terms against measured stage times, as ratios to a decode step.

    Absolute times are not identifiable from speedups (see the module docstring), so the comparison
    is of ``draft_time / ar_time`` with ``t_draft / t_target_1`` and ``reject_time / ar_time`` with
    ``t_reject / t_target_1`` (and, when ``t_target_gamma`` is there, ``verify_time / ar_time`` with
    ``t_target_gamma / t_target_1``; :mod:`moesd.engine.sd` verifies ``gamma + 1`` positions, the fitted term
    the fit's ``verify_tokens``). The round's cost outside the verification is compared too
    (``overhead``): a speedup fit sees the draft and rejection terms only through it, and can trade one
    for the other. Fitted, it is the fit's denominator less ``verify_time``, per ``result.variant``:
    ``gamma draft + reject`` for ``"eq4"``, ``draft + ar + reject`` for ``"printed"`` (line 11 of
    Algorithm 1 as printed, see :func:`moesd.model.algorithm1.compute_speedup`). Measured, it is what a
    round costs outside the verification, ``gamma t_draft + t_reject``, whatever the variant: the
    quantity either variant's overhead stands for, since a fit that reproduces the measured speedups
    (``sigma (gamma + 1) t_target_1 / (gamma t_draft + t_target_gamma + t_reject)``, Eq. 4) with the
    right ``verify_time`` must have it.

    Parameters
    ----------
    result : FitResult
    measured : pandas.DataFrame
        One row per point: ``B``, ``gamma``, ``K``, ``E`` (or a result file's ``batch_size``,
        ``num_experts_per_tok``) and :data:`STAGE_COLUMNS` in seconds, e.g. the rows of an e2e or
        sparsity result file.
    num_experts : int, optional
        E, when ``measured`` has no ``E`` column.

    Returns
    -------
    pandas.DataFrame
        ``B``, ``gamma``, ``K`` and, for each of ``draft``, ``reject``, ``overhead`` (and ``verify``),
        ``<stage>_fitted`` and ``<stage>_measured`` (dimensionless ratios to the decode step:
        ``ar_time`` fitted, ``t_target_1`` measured).
    """
    if not isinstance(result, FitResult):
        raise UsageError(f"result must be a FitResult, got {type(result).__name__}", "result")
    frame = measured.rename(columns={"batch_size": "B", "num_experts_per_tok": "K"})
    if "E" not in frame.columns:
        if num_experts is None:
            raise UsageError("measured has no E column: pass num_experts", "measured")
        frame = frame.assign(E=float(as_array("num_experts", num_experts, low=1, whole=True)))
    missing = [column for column in ("B", "gamma", "K", *STAGE_COLUMNS) if column not in frame.columns]
    if missing:
        raise UsageError(f"measured lacks the column(s) {', '.join(missing)}", "measured")
    for column in STAGE_COLUMNS + (("t_target_gamma",) if "t_target_gamma" in frame.columns else ()):
        as_array(column, frame[column], low=0, low_open=column != "t_reject")
    times = stage_times(result.parameters, frame["B"].to_numpy(float), frame["gamma"].to_numpy(float),
                        frame["K"].to_numpy(float), frame["E"].to_numpy(float), result.rp, result.verify_tokens)
    draft_weight, ar_weight = denominator_weights(result.variant, frame["gamma"].to_numpy(float))
    overhead = draft_weight * times["draft"] + ar_weight * times["ar"] + times["reject"]  # the denominator less verify
    table = pd.DataFrame({"B": frame["B"], "gamma": frame["gamma"], "K": frame["K"],
                          "draft_fitted": times["draft"] / times["ar"],
                          "draft_measured": frame["t_draft"] / frame["t_target_1"],
                          "reject_fitted": times["reject"] / times["ar"],
                          "reject_measured": frame["t_reject"] / frame["t_target_1"],
                          "overhead_fitted": overhead / times["ar"],
                          "overhead_measured": (frame["gamma"] * frame["t_draft"] + frame["t_reject"])
                          / frame["t_target_1"]}, index=frame.index)
    if "t_target_gamma" in frame.columns:
        table["verify_fitted"] = times["verify"] / times["ar"]
        table["verify_measured"] = frame["t_target_gamma"] / frame["t_target_1"]
    return table


def model_variant_errors(frame: pd.DataFrame, rp: float, stride: int | None = 11, begins=None, m: int | None = None,
                         **fit_options) -> pd.DataFrame:
    """Held-back errors of the four model variants: verified tokens (``B gamma``, ``B (gamma + 1)``) x denominator.

    Each variant is fitted to ``moesd.model.samples.stride_sample(frame, stride, begin)`` for every ``begin`` (default
    ``0 ... stride - 1``: every row is held back in all folds but one), or, with ``m`` (and
    ``stride=None``), to ``moesd.model.samples.spread_sample(frame, m, begin)`` for every ``begin`` below ``n / m``
    (default: all of them), and judged on the rows held back.

    Returns
    -------
    pandas.DataFrame
        One row per (``verify_tokens``, ``variant``): ``folds``, mean held-back ``mse`` and ``mape`` (%)
        over the folds, their worst fold (``worst_mse``), ``wins`` (folds in which the variant had the
        lowest held-back MSE), the mean ``mse_fitted`` and ``on_bounds`` of the first fold's fit.
    """
    for name in ("variant", "verify_tokens", "begin"):
        if name in fit_options:
            raise UsageError(f"model_variant_errors sets {name} itself", name)
    if (stride is None) == (m is None):
        raise UsageError("give either stride or m (with stride=None)", "stride")
    if m is not None:
        m = int(as_array("m", m, low=1, whole=True))
        sample = {"m": m}
        default = range(-(-len(frame) // m))  # every begin below n / m
    else:
        sample = {"stride": stride}
        default = range(int(as_array("stride", stride, low=1, whole=True)))
    begins = default if begins is None else list(begins)
    if not len(begins):
        raise UsageError("begins must name at least one fold", "begins")
    folds = []
    for verify_tokens in VERIFY_TOKENS:
        for variant in VARIANTS[::-1]:
            for begin in begins:
                result = fit_speedup_model(frame, rp, variant=variant, begin=begin, verify_tokens=verify_tokens,
                                           **sample, **fit_options)
                held = held_out_errors(result, frame)
                folds.append({"verify_tokens": verify_tokens, "variant": variant, "begin": begin,
                              "mse": held["mse"], "mape": held["mape"], "mse_fitted": result.mse,
                              "on_bounds": " ".join(result.on_bounds()) if begin == begins[0] else None})
    folds = pd.DataFrame(folds)
    best = folds.loc[folds.groupby("begin")["mse"].idxmin(), ["verify_tokens", "variant"]].value_counts()
    table = folds.groupby(["verify_tokens", "variant"], sort=False).agg(
        folds=("mse", "size"), mse=("mse", "mean"), mape=("mape", "mean"), worst_mse=("mse", "max"),
        mse_fitted=("mse_fitted", "mean"), on_bounds=("on_bounds", "first"))
    table["wins"] = [int(best.get(key, 0)) for key in table.index]
    return table


def best_model_variant(errors: pd.DataFrame, metric: str = "mse") -> dict:
    """The variant of :func:`model_variant_errors` that predicts held-back points best by ``metric``.

    Returns
    -------
    dict
        ``verify_tokens``, ``variant``, ``metric``, its ``value`` and ``runner_up_value`` (next best).
    """
    if metric not in ("mse", "mape", "worst_mse"):
        raise UsageError(f"metric must be mse, mape or worst_mse, got {metric!r}", "metric")
    if not isinstance(errors, pd.DataFrame) or metric not in errors.columns or errors.empty:
        raise UsageError(f"errors must be the table of model_variant_errors (with a {metric} column)", "errors")
    ranked = errors[metric].sort_values(kind="stable")
    (verify_tokens, variant), value = ranked.index[0], float(ranked.iloc[0])
    return {"verify_tokens": verify_tokens, "variant": variant, "metric": metric, "value": value,
            "runner_up_value": float(ranked.iloc[1]) if len(ranked) > 1 else float("nan")}


def rms(values) -> float:
    """Root mean square of some values (residuals, standard errors), in their unit."""
    return float((np.asarray(values, dtype=float) ** 2).mean() ** 0.5)


def fitted_stage_times(result: FitResult, points: pd.DataFrame, num_experts: int, rp: float) -> dict:
    """A fit's Algorithm 1 stage times (seconds, :func:`~moesd.model.algorithm1.stage_times`) at measured points.

    Parameters
    ----------
    result : FitResult
    points : pandas.DataFrame
        A result file's rows: ``batch_size``, ``gamma``, ``num_experts_per_tok``.
    num_experts : int
        E of the target.
    rp : float
        The ridge point in tokens the fit used.
    """
    return stage_times(result.parameters, points["batch_size"].to_numpy(float), points["gamma"].to_numpy(float),
                       points["num_experts_per_tok"].to_numpy(float), float(num_experts), rp)


def decode_step_ratio(result: FitResult, points: pd.DataFrame, num_experts: int, rp: float) -> np.ndarray:
    """Measured over fitted decode step (``t_target_1 / ar_time``) at each of ``points`` (as
    :func:`fitted_stage_times` takes them): how far a speedup fit's absolute scale lies from the measured one."""
    return points["t_target_1"].to_numpy() / fitted_stage_times(result, points, num_experts, rp)["ar"]
