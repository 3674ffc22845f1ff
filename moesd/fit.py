"""The paper's fitted model of SD speedup (Algorithm 1, Appendix C) and its robustness study.

``compute_speedup`` is Algorithm 1's ``ComputeSpeedup``: stage times built from the expected
activated experts N(t) (Eq. 8), tokens per expert (Eq. 10) and the roofline growth G (Eq. 11),

* ``ar_time     = bias + k1 G(B) + k2 N(B) + k3 G(B K / N(B))``
* ``verify_time = bias + k1 G(B gamma) + k2 N(B gamma) + k3 G(B gamma K / N(B gamma))``
* ``draft_time  = draft_bias + draft_k G(B)``,  ``reject_time = reject_bias + reject_k B``

with ``G(t) = G(t; lam RP, s)``, and the speedup ``sigma (gamma + 1) ar_time / denominator``. Line 11
of the paper prints ``draft + ar + verify + reject`` as the denominator (``variant="printed"``); Eq. 4
implies ``gamma draft + verify + reject`` (``variant="eq4"``). Both are implemented and fitted.

Speedup is a ratio of times: multiplying the eight time-like parameters by one constant changes no
prediction. Only the bounds (Appendix C.2: parameter volumes over memory bandwidth) fix that scale, so
:meth:`FitResult.relative_params` reports them divided by ``bias``, which is identifiable.
:func:`fit_stage_times` fits the same stage-time model to measured stage times instead, where the
scale is identifiable.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from moesd._checks import as_array
from moesd.experts import expected_active_experts
from moesd.roofline import HARDWARE, G

PARAMETERS = ("bias", "k1", "k2", "k3", "draft_bias", "draft_k", "reject_bias", "reject_k", "lam", "s")
"""Algorithm 1's ten parameters, in its order."""
TIME_PARAMETERS = PARAMETERS[:8]
"""The parameters in seconds (or seconds per unit of G, expert or token): one common scale."""
VARIANTS = ("printed", "eq4")
PAPER_STRIDES = (25, 22, 20, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1)
"""The 21 strides of Appendix C.3 (m = 10 ... 228 of 228 measurements, Table 3)."""
COLUMNS = ("B", "gamma", "K", "E", "sigma", "speedup")


def _vector(params) -> np.ndarray:
    if isinstance(params, dict):
        missing = [name for name in PARAMETERS if name not in params]
        if missing:
            raise ValueError(f"params lacks {', '.join(missing)}")
        return np.array([params[name] for name in PARAMETERS], dtype=float)
    vector = np.asarray(params, dtype=float)
    if vector.shape != (len(PARAMETERS),):
        raise ValueError(f"params must hold {len(PARAMETERS)} values ({', '.join(PARAMETERS)}), got shape "
                         f"{vector.shape}")
    return vector


def target_time(params, tokens, K, E, rp):
    """Algorithm 1's target forward time for ``tokens`` tokens (its ar_time and verify_time).

    Parameters
    ----------
    params : dict or sequence of 10 floats
        See :data:`PARAMETERS`.
    tokens : array_like
        Tokens in the forward pass (B for a decode step, B gamma for verification).
    K, E : array_like
        Experts per token and routed experts per layer.
    rp : float
        Ridge point of the hardware (FLOP/byte); the transition of G is at ``lam * rp`` tokens.

    Returns
    -------
    numpy.ndarray
        Seconds (in the scale of the time-like parameters).
    """
    bias, k1, k2, k3, _, _, _, _, lam, s = _vector(params)
    tokens = as_array("tokens", tokens, low=1)
    active = expected_active_experts(tokens, E, K)
    per_expert = tokens * np.asarray(K, dtype=float) / active
    return bias + k1 * G(tokens, lam * rp, s) + k2 * active + k3 * G(per_expert, lam * rp, s)


def stage_times(params, B, gamma, K, E, rp, verify_tokens=None) -> dict:
    """Algorithm 1's four stage times: ``ar``, ``verify``, ``draft`` and ``reject`` (seconds).

    ``verify_tokens`` is the number of tokens per sequence the verification forward scores: ``gamma``
    as Algorithm 1 writes it (default), or ``gamma + 1`` as vLLM and :mod:`moesd.sd` do.
    """
    p = _vector(params)
    B = as_array("B", B, low=1)
    gamma = as_array("gamma", gamma, low=1, whole=True)
    width = gamma if verify_tokens is None else as_array("verify_tokens", verify_tokens, low=1)
    lam_rp = p[8] * rp
    return {"ar": target_time(p, B, K, E, rp), "verify": target_time(p, B * width, K, E, rp),
            "draft": p[4] + p[5] * G(B, lam_rp, p[9]), "reject": p[6] + p[7] * B}


def compute_speedup(params, B, gamma, K, E, sigma, rp, variant: str = "eq4", verify_tokens=None):
    """Algorithm 1's ``ComputeSpeedup``, vectorised over measurements.

    Parameters
    ----------
    params : dict or sequence of 10 floats
        See :data:`PARAMETERS`.
    B, gamma, K, E : array_like
        Batch size, draft length, experts per token, routed experts per layer.
    sigma : array_like
        Measured sigma (Eq. 5).
    rp : float
        Ridge point (FLOP/byte).
    variant : {"eq4", "printed"}
        The denominator: ``gamma draft + verify + reject`` (Eq. 4) or, as line 11 prints it,
        ``draft + ar + verify + reject``.
    verify_tokens : array_like, optional
        Tokens per sequence in the verification forward: ``gamma`` as Algorithm 1 writes it (default)
        or ``gamma + 1`` as vLLM and :mod:`moesd.sd` verify.

    Returns
    -------
    numpy.ndarray
        Predicted speedups.
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    times = stage_times(params, B, gamma, K, E, rp, verify_tokens)
    gamma = np.asarray(gamma, dtype=float)
    if variant == "printed":
        denominator = times["draft"] + times["ar"] + times["verify"] + times["reject"]
    else:
        denominator = gamma * times["draft"] + times["verify"] + times["reject"]
    return np.asarray(sigma, dtype=float) * (gamma + 1) * times["ar"] / denominator


def parameter_bounds(model=None, hardware=None, draft=None, bytes_per_parameter: float = 2.0,
                     t_reject: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Bounds of Appendix C.2 as (lower, upper) arrays in :data:`PARAMETERS` order.

    With a target ``model`` (a :class:`moesd.zoo.ModelSpec`), a ``draft`` and ``hardware`` (a
    :class:`moesd.roofline.Hardware` or its name), ``bias``, ``k2`` and ``draft_bias`` lie between
    the time to read their parameters at peak bandwidth (dense part, one expert of every MoE layer,
    the draft) and 5 times that. ``t_reject`` (the largest measured rejection time) caps
    ``reject_bias`` and ``reject_k``. Without them those bounds are [0, inf). ``lam`` is in
    [0.2, 1] and ``s`` in [1, 2] always; ``k1`` is kept above 0 (G's growth would vanish).
    """
    lower = np.array([0, 1e-12, 0, 0, 0, 0, 0, 0, 0.2, 1.0])
    upper = np.array([np.inf] * 8 + [1.0, 2.0])
    if model is not None and hardware is not None:
        hw = HARDWARE[hardware] if isinstance(hardware, str) else hardware
        counts = model.parameter_counts()
        seconds = bytes_per_parameter / hw.memory_bandwidth
        lower[0] = counts["dense"] * seconds
        lower[2] = counts["experts"] / model.num_experts * seconds
        if draft is not None:
            lower[4] = draft.parameter_counts()["total"] * seconds
        for index in (0, 2, 4):
            upper[index] = 5 * lower[index] if lower[index] > 0 else np.inf
    if t_reject is not None:
        upper[6] = upper[7] = float(t_reject)
    return lower, upper


def from_sweep(rows: pd.DataFrame, num_experts: int) -> pd.DataFrame:
    """The fitting frame (columns :data:`COLUMNS`) of an e2e or sparsity result file of :mod:`moesd.bench`."""
    return pd.DataFrame({"B": rows["batch_size"], "gamma": rows["gamma"], "K": rows["num_experts_per_tok"],
                         "E": num_experts, "sigma": rows["sigma"], "speedup": rows["speedup"]})


def sigma_adjusted_speedup(frame: pd.DataFrame, reference_k: int = 8) -> pd.Series:
    """Speedups rescaled by ``sigma_{K=reference_k} / sigma_K`` (Sec. 4.2 of the paper).

    Editing K without retraining changes acceptance; the paper compares K by rescaling each run with
    the mean sigma of its (K, gamma) group against that of ``K = reference_k`` at the same gamma.
    """
    group_sigma = frame.groupby(["K", "gamma"])["sigma"].transform("mean")
    reference = frame[frame["K"] == reference_k]
    if reference.empty:
        raise ValueError(f"no measurement with K = {reference_k} to rescale against")
    reference_sigma = frame["gamma"].map(reference.groupby("gamma")["sigma"].mean())
    return frame["speedup"] * reference_sigma / group_sigma


def check_measurements(frame: pd.DataFrame) -> pd.DataFrame:
    """Validate a frame of measurements (columns :data:`COLUMNS`), raising ValueError on bad rows."""
    missing = [column for column in COLUMNS if column not in frame.columns]
    if missing:
        raise ValueError(f"measurements lack the column(s) {', '.join(missing)}")
    values = frame[list(COLUMNS)]
    if values.isna().any().any():
        bad = values.columns[values.isna().any()].tolist()
        raise ValueError(f"measurements have NaN in {', '.join(bad)}")
    if (values["B"] < 1).any() or (values["gamma"] < 1).any():
        raise ValueError("B and gamma must be >= 1")
    if ((values["K"] < 1) | (values["K"] > values["E"])).any():
        raise ValueError("K must be in [1, E]")
    low = 1 / (values["gamma"] + 1)
    if ((values["sigma"] < low - 1e-9) | (values["sigma"] > 1)).any():
        raise ValueError("sigma must be in [1/(gamma+1), 1] (Eq. 5)")
    if (values["speedup"] <= 0).any():
        raise ValueError("speedup must be > 0")
    return frame


@dataclass
class FitResult:
    """A fitted speedup model.

    Attributes
    ----------
    params : dict
        The ten fitted parameters by name (time-like ones in the scale the bounds fixed).
    variant : str
    rp : float
    mse : float
        Mean squared error of the predicted speedup on the points fitted.
    residuals : numpy.ndarray
        Predicted minus measured speedup on the points fitted.
    fit_seconds : float
        Wall time of the optimisation.
    fitted : pandas.DataFrame
        The measurements used.
    """

    params: dict
    variant: str
    rp: float
    mse: float
    residuals: np.ndarray = field(repr=False)
    fit_seconds: float = 0.0
    fitted: pd.DataFrame = field(default=None, repr=False)

    def predict(self, frame: pd.DataFrame) -> np.ndarray:
        """Predicted speedups of the rows of ``frame`` (columns B, gamma, K, E, sigma)."""
        return compute_speedup(self.params, frame["B"], frame["gamma"], frame["K"], frame["E"],
                               frame["sigma"], self.rp, self.variant)

    def relative_params(self) -> dict:
        """The identifiable form: time-like parameters over ``bias``, with ``lam`` and ``s``."""
        return {name: (self.params[name] / self.params["bias"] if name in TIME_PARAMETERS else self.params[name])
                for name in PARAMETERS}


def stride_sample(frame: pd.DataFrame, stride: int, begin: int = 0) -> pd.DataFrame:
    """Rows ``begin::stride`` of the measurements sorted by K, gamma, B (Appendix C.2's ``df[::11]``)."""
    if int(stride) != stride or stride < 1:
        raise ValueError(f"stride must be a whole number >= 1, got {stride!r}")
    ordered = frame.sort_values(["K", "gamma", "B"], kind="stable").reset_index(drop=True)
    return ordered.iloc[begin::int(stride)]


def _initial_guess(bias: float, lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """A start inside the bounds: the other time-like parameters as fractions of ``bias``."""
    x0 = np.array([bias, bias * 1e-3, bias / 64, bias * 1e-2, bias / 30, bias * 1e-4,
                   bias * 1e-3, bias * 1e-5, 0.6, 1.01])
    return np.clip(x0, lower, upper)


def fit_speedup_model(frame: pd.DataFrame, rp: float, model=None, hardware=None, variant: str = "eq4",
                      stride: int | None = None, x0=None, begin: int = 0, draft=None,
                      bytes_per_parameter: float = 2.0, t_reject: float | None = None) -> FitResult:
    """Fit Algorithm 1 to measured speedups with ``least_squares(method="trf")`` and Appendix C.2's bounds.

    Parameters
    ----------
    frame : pandas.DataFrame
        Measurements with columns ``B``, ``gamma``, ``K``, ``E``, ``sigma``, ``speedup``.
    rp : float
        Ridge point (FLOP/byte) of the hardware measured.
    model, hardware, draft, bytes_per_parameter, t_reject
        Passed to :func:`parameter_bounds`.
    variant : {"eq4", "printed"}
    stride : int, optional
        Fit only :func:`stride_sample` ``(frame, stride, begin)`` (default: every row).
    x0 : dict or sequence, optional
        Starting parameters (default: a start derived from the bounds).

    Returns
    -------
    FitResult
    """
    check_measurements(frame)
    rp = float(as_array("rp", rp, low=0, low_open=True))
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    data = stride_sample(frame, stride, begin) if stride else frame
    if len(data) < len(PARAMETERS):
        raise ValueError(f"{len(data)} measurements cannot determine {len(PARAMETERS)} parameters")
    lower, upper = parameter_bounds(model, hardware, draft, bytes_per_parameter, t_reject)
    if x0 is None:
        bias = np.sqrt(lower[0] * upper[0]) if 0 < lower[0] and np.isfinite(upper[0]) else 1.0
        start = _initial_guess(bias, lower, upper)
    else:
        start = np.clip(_vector(x0), lower, upper)
    columns = [data[c].to_numpy(dtype=float) for c in ("B", "gamma", "K", "E", "sigma")]
    measured = data["speedup"].to_numpy(dtype=float)

    def residual(p):
        return compute_speedup(p, *columns, rp, variant) - measured

    tick = time.perf_counter()
    solution = least_squares(residual, start, bounds=(lower, upper), method="trf", x_scale="jac")
    seconds = time.perf_counter() - tick
    residuals = residual(solution.x)
    return FitResult(dict(zip(PARAMETERS, solution.x.tolist())), variant, rp, float(np.mean(residuals ** 2)),
                     residuals, seconds, data)


def held_out_errors(result: FitResult, frame: pd.DataFrame) -> dict:
    """Errors of a fit's predicted speedup on the rows of ``frame`` it was not fitted on.

    Returns
    -------
    dict
        ``points``, ``mse``, ``mape`` (percent) and ``max_abs_error`` on the held-back rows, and
        ``mse_all`` over every row.
    """
    used = result.fitted[list(COLUMNS)].round(12).apply(tuple, axis=1)
    rows = frame[list(COLUMNS)].round(12).apply(tuple, axis=1)
    held = frame[~rows.isin(set(used))]
    error = result.predict(held) - held["speedup"].to_numpy()
    all_error = result.predict(frame) - frame["speedup"].to_numpy()
    return {"points": len(held), "mse": float(np.mean(error ** 2)) if len(held) else float("nan"),
            "mape": float(100 * np.mean(np.abs(error) / held["speedup"])) if len(held) else float("nan"),
            "max_abs_error": float(np.max(np.abs(error))) if len(held) else float("nan"),
            "mse_all": float(np.mean(all_error ** 2))}


def robustness_study(frame: pd.DataFrame, rp: float, strides=PAPER_STRIDES, **fit_options) -> pd.DataFrame:
    """Appendix C.3: a fit per stride, with its m, errors and the batch sizes its sample covers.

    Returns
    -------
    pandas.DataFrame
        One row per stride: ``stride``, ``m``, ``mse`` (over every measurement, as Table 3),
        ``mse_fitted``, held-back ``mape`` and ``max_abs_error``, ``fit_seconds``,
        ``batch_sizes`` (sorted, as a string) and ``result`` (the :class:`FitResult`).
    """
    rows = []
    for stride in strides:
        result = fit_speedup_model(frame, rp, stride=stride, **fit_options)
        held = held_out_errors(result, frame)
        rows.append({"stride": stride, "m": len(result.fitted), "mse": held["mse_all"], "mse_fitted": result.mse,
                     "mape": held["mape"], "max_abs_error": held["max_abs_error"],
                     "fit_seconds": result.fit_seconds,
                     "batch_sizes": " ".join(str(int(b)) for b in sorted(result.fitted["B"].unique())),
                     "result": result})
    return pd.DataFrame(rows)


@dataclass
class StageTimeFit:
    """Algorithm 1's stage-time model fitted to measured stage times (identifiable scale)."""

    params: dict
    rp: float
    relative_rms: float
    fit_seconds: float

    def predict_speedup(self, frame: pd.DataFrame, verify_tokens=None) -> np.ndarray:
        """Speedups of the rows of ``frame`` from the fitted stage times (Eq. 4's denominator).

        ``verify_tokens`` as in :func:`compute_speedup`; pass ``frame["gamma"] + 1`` for the times of an
        engine that verifies gamma + 1 positions, as the forward study measured them.
        """
        return compute_speedup(self.params, frame["B"], frame["gamma"], frame["K"], frame["E"], frame["sigma"],
                               self.rp, "eq4", verify_tokens)


def fit_stage_times(target: pd.DataFrame, draft: pd.DataFrame, reject: pd.DataFrame, K: int, E: int,
                    rp: float) -> StageTimeFit:
    """Fit the ten parameters to stage times instead of speedups.

    Parameters
    ----------
    target : pandas.DataFrame
        Target forward times: columns ``tokens`` (tokens in the pass, B s) and ``seconds``.
    draft : pandas.DataFrame
        Draft forward times with one token per sequence: columns ``B`` and ``seconds``.
    reject : pandas.DataFrame
        Rejection times per round: columns ``B`` and ``seconds``.
    K, E : int
        Experts per token and per layer of the target.
    rp : float
        Ridge point (FLOP/byte).

    Returns
    -------
    StageTimeFit
        Residuals are relative (times span orders of magnitude); ``relative_rms`` is their RMS.
    """
    lower, upper = parameter_bounds()
    x0 = _initial_guess(float(np.median(target["seconds"])), lower, upper)
    t_tokens, t_seconds = target["tokens"].to_numpy(float), target["seconds"].to_numpy(float)
    d_batch, d_seconds = draft["B"].to_numpy(float), draft["seconds"].to_numpy(float)
    r_batch, r_seconds = reject["B"].to_numpy(float), reject["seconds"].to_numpy(float)

    def residual(p):
        lam_rp = p[8] * rp
        return np.concatenate([
            target_time(p, t_tokens, K, E, rp) / t_seconds - 1,
            (p[4] + p[5] * G(d_batch, lam_rp, p[9])) / d_seconds - 1,
            (p[6] + p[7] * r_batch) / r_seconds - 1])

    tick = time.perf_counter()
    solution = least_squares(residual, x0, bounds=(lower, upper), method="trf", x_scale="jac")
    seconds = time.perf_counter() - tick
    return StageTimeFit(dict(zip(PARAMETERS, solution.x.tolist())), float(rp),
                        float(np.sqrt(np.mean(residual(solution.x) ** 2))), seconds)
