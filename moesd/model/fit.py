"""Fitting Algorithm 1 to measured speedups (Appendix C), its robustness study and its diagnostics.

The forward model (``ComputeSpeedup``, stage times, bounds) lives in :mod:`moesd.model.algorithm1`; its
names are importable from here too. :func:`fit_speedup_model` runs ``least_squares`` (trust region
reflective, as the paper) with the model's analytic Jacobian on inputs precomputed once
(:class:`moesd.model.algorithm1.SpeedupInputs`). Where trf crawls along a flat valley of the MSE, L-BFGS-B
carries it to the valley's floor and trf finishes from there (:func:`_minimise`).

Speedup is a ratio of times: multiplying the eight time-like parameters by one constant changes no
prediction. Only bounds (Appendix C.2: parameter volumes over memory bandwidth) fix that scale. When
the bounds leave it free, the optimum is a ray of equally good points and where the solver ends on it
depends on its path; the fit then reports the point with ``bias`` at its start value, unless that
would move a parameter across a bound (``k1`` near its floor of 1e-12, say), where it reports the
solver's point.
:meth:`FitResult.relative_params` reports the time-like parameters over ``bias``, which is
identifiable. :func:`fit_stage_times` fits the same stage-time model to measured stage times
instead, where the scale is identifiable.

Diagnostics: :meth:`FitResult.on_bounds` (parameters that end on a bound), :func:`residual_table`
(residuals against B for each K and gamma), :func:`compare_stage_times` (fitted draft and rejection
terms against measured stage times) and :func:`model_variant_errors` / :func:`best_model_variant`
(Algorithm 1's ``B gamma`` verified tokens against ``B (gamma + 1)``, in both denominators, judged on
held-back points).

Samples: :func:`stride_sample` is the paper's ``df[begin::stride]``; :func:`spread_sample` takes ``m``
rows at a fractional stride, for a design of other than the paper's 228 points, where whole strides give
few sample sizes (:func:`robustness_study` with ``sizes``). :func:`mean_over_repeats` turns a result file
measured in several repeats into one point per batch size, gamma and K, as the paper averages its runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.optimize import Bounds, OptimizeResult, least_squares, minimize

from moesd._checks import as_array
from moesd.model.algorithm1 import (PARAMETERS, TIME_PARAMETERS, VARIANTS, VERIFY_TOKENS, SpeedupInputs,
                                 SpeedupParams, as_params, compute_speedup, parameter_bounds, stage_times,
                                 target_time)

__all__ = ["PARAMETERS", "TIME_PARAMETERS", "VARIANTS", "VERIFY_TOKENS", "PAPER_STRIDES", "COLUMNS", "SOLVERS",
           "SpeedupParams", "SpeedupInputs", "as_params", "compute_speedup", "stage_times", "target_time",
           "parameter_bounds", "from_sweep", "mean_over_repeats", "sigma_adjusted_speedup", "check_measurements",
           "FitResult", "stride_sample", "spread_sample", "stride_coverage", "PAPER_CURVES", "fit_speedup_model",
           "held_out_errors", "robustness_study", "residual_table",
           "STAGE_COLUMNS", "compare_stage_times", "model_variant_errors", "best_model_variant", "StageTimeFit",
           "fit_stage_times"]

PAPER_STRIDES = (25, 22, 20, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1)
"""The 21 strides of Appendix C.3 (m = 10 ... 228 of 228 measurements, Table 3)."""
PAPER_CURVES = 12
"""(K, gamma) curves of the paper's sparsity study: 6 values of K x 2 of gamma, each over 19 batch sizes
(Appendix C.2: 228 measurements)."""
COLUMNS = ("B", "gamma", "K", "E", "sigma", "speedup")
"""Columns of a fitting frame: batch size, draft length, experts per token, experts per layer,
sigma (Eq. 5) and measured speedup."""
TOLERANCE = 1e-12
"""``ftol``, ``xtol`` and ``gtol`` of ``least_squares``: tight enough that the optimum, not the stopping
rule, sets every printed digit (the analytic Jacobian makes that cheap)."""
TRF_EVALUATIONS = 100
"""Residual evaluations trf gets before :func:`_minimise` hands a fit that is still moving to L-BFGS-B.

On the 1/8-width float32 CPU sparsity study (``cpu-dispatch/``, 228 points) trf alone finishes most fits
in 47-122 evaluations and crawls for 160-6500 on the others; the robustness study hands 9 of its 21 Eq. 4
fits and 2 of its 21 printed-denominator fits to L-BFGS-B."""
VALLEY_EVALUATIONS = 2000
"""The most evaluations L-BFGS-B gets in :func:`_minimise` (it needs 6-151 on the ``cpu-dispatch/`` data)."""
SOLVERS = ("trf", "trf, L-BFGS-B, trf")
"""What :func:`_minimise` ran: trf alone, or trf, then L-BFGS-B along a flat valley, then trf again."""


def from_sweep(rows: pd.DataFrame, num_experts: int) -> pd.DataFrame:
    """The fitting frame (columns :data:`COLUMNS`) of an e2e or sparsity result file of :mod:`moesd.measure.bench`."""
    missing = [c for c in ("batch_size", "gamma", "num_experts_per_tok", "sigma", "speedup") if c not in rows]
    if missing:
        raise ValueError(f"rows lack the column(s) {', '.join(missing)} of an e2e or sparsity result file")
    num_experts = int(as_array("num_experts", num_experts, low=1, whole=True))
    return pd.DataFrame({"B": rows["batch_size"], "gamma": rows["gamma"], "K": rows["num_experts_per_tok"],
                         "E": num_experts, "sigma": rows["sigma"], "speedup": rows["speedup"]})


def mean_over_repeats(rows: pd.DataFrame, errors=("speedup",)) -> pd.DataFrame:
    """One row per point of a result file measured in several repeats: each numeric column's mean over them.

    A point is a (``batch_size``, ``gamma``, ``num_experts_per_tok``) of an e2e-type result file of
    :mod:`moesd.measure.bench`; the paper's points are likewise means over runs (the last 5 of 10, Sec. 4).
    Speedups and sigma are averaged as measured (the mean of the repeats' ratios), stage times in
    seconds likewise; ``run`` and ``seed`` are dropped.

    Parameters
    ----------
    rows : pandas.DataFrame
        The rows of a result file, one per repeat and point.
    errors : sequence of str
        Columns whose standard error of the mean is added as ``<column>_se`` (the sample standard
        deviation over the repeats over the square root of their number; NaN for a single repeat).

    Returns
    -------
    pandas.DataFrame
        The point's columns, the mean of every other numeric column, the ``<column>_se`` of ``errors``
        and ``runs`` (the repeats averaged), sorted by the point's columns, with a fresh index.
    """
    if not isinstance(rows, pd.DataFrame):
        raise ValueError(f"rows must be a pandas DataFrame, got {type(rows).__name__}")
    missing = [c for c in ("batch_size", "gamma", *errors) if c not in rows]
    if missing:
        raise ValueError(f"rows lack the column(s) {', '.join(missing)} of an e2e-type result file")
    keys = [c for c in ("batch_size", "gamma", "num_experts_per_tok") if c in rows]
    numeric = [c for c in rows.select_dtypes("number").columns if c not in (*keys, "run", "seed")]
    groups = rows.groupby(keys, dropna=False)
    table = groups[numeric].mean()
    table["runs"] = groups.size()
    for column in errors:
        table[f"{column}_se"] = groups[column].std(ddof=1) / np.sqrt(table["runs"])
    return table.reset_index()


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
    _measurement_array(frame)
    return frame


def _measurement_array(frame: pd.DataFrame) -> np.ndarray:
    """The checked :data:`COLUMNS` of a frame of measurements as a float array, one row per measurement."""
    if not isinstance(frame, pd.DataFrame):
        raise ValueError(f"measurements must be a pandas DataFrame, got {type(frame).__name__}")
    missing = [column for column in COLUMNS if column not in frame.columns]
    if missing:
        raise ValueError(f"measurements lack the column(s) {', '.join(missing)}")
    values = frame[list(COLUMNS)]
    if not all(pd.api.types.is_numeric_dtype(dtype) for dtype in values.dtypes):
        for column in COLUMNS:
            numbers = pd.to_numeric(values[column], errors="coerce")
            text = numbers.isna() & values[column].notna()
            if text.any():
                label = text.idxmax()
                raise ValueError(f"measurements column {column} holds {values[column][label]!r} (row {label}), "
                                 "not a number")
        values = values.apply(pd.to_numeric)
    array = values.to_numpy(dtype=float)
    if np.isnan(array).any():
        bad = [column for column, nan in zip(COLUMNS, np.isnan(array).any(axis=0)) if nan]
        raise ValueError(f"measurements have NaN in {', '.join(bad)}")
    B, gamma, K, E, sigma, speedup = array.T
    if (B < 1).any() or (gamma < 1).any():
        raise ValueError("B and gamma must be >= 1")
    if ((K < 1) | (K > E)).any():
        raise ValueError("K must be in [1, E]")
    if ((sigma < 1 / (gamma + 1) - 1e-9) | (sigma > 1)).any():
        raise ValueError("sigma must be in [1/(gamma+1), 1] (Eq. 5)")
    if (speedup <= 0).any():
        raise ValueError("speedup must be > 0")
    return array


def _inputs(frame: pd.DataFrame, rp: float, verify_tokens, array: np.ndarray | None = None) -> SpeedupInputs:
    """:class:`SpeedupInputs` of the rows of a fitting frame (or of its :func:`_measurement_array`)."""
    if array is None:
        array = frame[list(COLUMNS[:5])].to_numpy(dtype=float)
    return SpeedupInputs.build(*array[:, :5].T, rp, verify_tokens)


@dataclass
class FitResult:
    """A fitted speedup model.

    Attributes
    ----------
    parameters : SpeedupParams
        The ten fitted parameters. When the bounds leave the time scale free, every scale fits equally
        well and the time-like ones are reported with ``bias`` at its start value (when that point is
        within the bounds; else as the solver ended).
    variant : str
        The denominator fitted (``"eq4"`` or ``"printed"``).
    rp : float
        Ridge point in tokens used in G (its transition is at ``lam * rp`` tokens).
    mse : float
        Mean squared error of the predicted speedup on the points fitted.
    residuals : numpy.ndarray
        Predicted minus measured speedup on the points fitted.
    fit_seconds : float
        Wall time of the optimisation (seconds).
    fitted : pandas.DataFrame
        The measurements used, with the index labels of the frame they came from.
    verify_tokens : str
        ``"gamma"`` (Algorithm 1's ``B gamma`` verified tokens) or ``"gamma+1"`` (vLLM's, moesd.measure.sd's).
    lower, upper : numpy.ndarray
        The bounds, in :data:`PARAMETERS` order.
    status, message
        The exit status of the last ``least_squares`` run (> 0: its convergence tests passed; 0: it
        stopped at its evaluation limit) and its message.
    nfev, njev
        Residual and Jacobian evaluations of the whole fit (every stage of :attr:`solver`).
    solver : str
        One of :data:`SOLVERS`: what :func:`_minimise` ran.
    """

    parameters: SpeedupParams
    variant: str
    rp: float
    mse: float
    residuals: np.ndarray = field(repr=False)
    fit_seconds: float
    fitted: pd.DataFrame = field(repr=False)
    verify_tokens: str
    lower: np.ndarray = field(repr=False)
    upper: np.ndarray = field(repr=False)
    status: int
    message: str
    nfev: int
    njev: int
    solver: str = SOLVERS[0]

    @property
    def params(self) -> dict:
        """The ten fitted parameters as a ``{name: value}`` dict."""
        return self.parameters.as_dict()

    def predict(self, frame: pd.DataFrame) -> np.ndarray:
        """Predicted speedups of the rows of ``frame`` (columns B, gamma, K, E, sigma)."""
        missing = [column for column in COLUMNS[:5] if column not in frame.columns]
        if missing:
            raise ValueError(f"frame lacks the column(s) {', '.join(missing)}")
        return _inputs(frame, self.rp, self.verify_tokens).speedup(self.parameters, self.variant)

    def relative_params(self) -> dict:
        """The identifiable form: time-like parameters over ``bias``, with ``lam`` and ``s``."""
        return self.parameters.relative().as_dict()

    def on_bounds(self, tolerance: float = 1e-6) -> dict:
        """Parameters that ended on (within ``tolerance`` of) a bound: ``{name: "lower" or "upper"}``.

        The distance is relative: to the largest time-like parameter for those, to the bound's size
        (at least 1) for ``lam`` and ``s``.
        """
        tolerance = float(as_array("tolerance", tolerance, low=0))
        values = self.parameters.vector()
        scale = np.r_[np.full(len(TIME_PARAMETERS), np.max(values[:len(TIME_PARAMETERS)])),
                      np.maximum(1.0, np.abs(self.upper[len(TIME_PARAMETERS):]))]
        found = {}
        for index, name in enumerate(PARAMETERS):
            if values[index] - self.lower[index] <= tolerance * scale[index]:
                found[name] = "lower"
            elif self.upper[index] - values[index] <= tolerance * scale[index]:
                found[name] = "upper"
        return found


def stride_sample(frame: pd.DataFrame, stride: int, begin: int = 0) -> pd.DataFrame:
    """Rows ``begin::stride`` of the measurements sorted by K, gamma, B (Appendix C.2's ``df[::11]``).

    The rows keep their index labels, so the rows not sampled can be found again.
    """
    stride = int(as_array("stride", stride, low=1, whole=True))
    begin = int(as_array("begin", begin, low=0, whole=True))
    ordered = frame.sort_values(["K", "gamma", "B"], kind="stable")
    return ordered.iloc[begin::stride]


def spread_sample(frame: pd.DataFrame, m: int, begin: int = 0) -> pd.DataFrame:
    """``m`` rows spread evenly over the measurements sorted by K, gamma, B: a fractional stride ``n / m``.

    Row ``begin + floor(i n / m)`` for ``i = 0 ... m - 1`` of the ``n`` sorted rows. Where ``n / m`` is a
    whole number this is :func:`stride_sample` with that stride (Appendix C.2's ``df[begin::stride]``);
    in between, it keeps the paper's rule (every so many rows of the sorted table) for sample sizes
    that no whole stride gives, as a design of other than 228 points needs.

    Parameters
    ----------
    frame : pandas.DataFrame
        Measurements with columns ``K``, ``gamma``, ``B``.
    m : int
        Rows in the sample, 1 to ``n``.
    begin : int
        Offset of the first row, ``0 <= begin < n / m``.

    Returns
    -------
    pandas.DataFrame
        The rows, with their index labels (so the rows not sampled can be found again).
    """
    ordered = frame.sort_values(["K", "gamma", "B"], kind="stable")
    n = len(ordered)
    m = int(as_array("m", m, low=1, high=max(n, 1), whole=True))
    begin = int(as_array("begin", begin, low=0, whole=True))
    if begin * m >= n:
        raise ValueError(f"begin must lie below n / m = {n} / {m}, got {begin}")
    return ordered.iloc[begin + (np.arange(m) * n) // m]


def stride_coverage(batch_sizes, curves: int, strides=PAPER_STRIDES) -> pd.Series:
    """The batch sizes each stride sample covers in a design of ``curves`` curves over ``batch_sizes``.

    The design's rows sorted by K, gamma, B (as :func:`stride_sample` sorts them) run through the batch
    sizes once per curve, so row ``i`` has batch size ``batch_sizes[i % len(batch_sizes)]``. For the
    paper's design (:data:`PAPER_CURVES` curves over its 19 batch sizes, :data:`PAPER_STRIDES`) this is
    Table 3's "B covered" column.

    Returns
    -------
    pandas.Series
        Indexed by stride: the batch sizes covered, sorted and space-separated (as the ``batch_sizes``
        column of :func:`robustness_study`).
    """
    grid = np.sort(as_array("batch_sizes", batch_sizes, low=1, whole=True))
    if grid.size == 0:
        raise ValueError("batch_sizes must name at least one batch size")
    curves = int(as_array("curves", curves, low=1, whole=True))
    rows = np.tile(grid, curves)
    covered = {}
    for stride in strides:
        stride = int(as_array("stride", stride, low=1, whole=True))
        covered[stride] = " ".join(str(int(b)) for b in np.unique(rows[::stride]))
    return pd.Series(covered, name="batch_sizes").rename_axis("stride")


def _initial_guess(bias: float, lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """A start inside the bounds: the other time-like parameters as fractions of ``bias``."""
    x0 = np.array([bias, bias * 1e-3, bias / 64, bias * 1e-2, bias / 30, bias * 1e-4,
                   bias * 1e-3, bias * 1e-5, 0.6, 1.01])
    return np.clip(x0, lower, upper)


def _scale_is_free(lower: np.ndarray, upper: np.ndarray) -> bool:
    """Whether the bounds leave the common scale of the time-like parameters undetermined."""
    times = slice(0, len(TIME_PARAMETERS))
    return bool(np.all(lower[times] <= 1e-12) and np.all(np.isinf(upper[times])))


def _minimise(residual, jacobian, residual_and_jacobian, start: np.ndarray, lower: np.ndarray,
              upper: np.ndarray) -> tuple[OptimizeResult, str, int, int]:
    """Minimise half the sum of squared residuals within the bounds; trf, helped along flat valleys.

    trf (``least_squares(method="trf")``, the paper's solver) converges within 100 evaluations on most
    samples. On some it enters a flat, curved valley of the MSE (``s`` climbing to its bound while
    ``k3`` falls, the cost changing by 1e-7 relative per step), where its Gauss-Newton steps stay
    short and it needs hundreds or thousands of evaluations, or stops at its limit of 1000 unconverged.
    After :data:`TRF_EVALUATIONS` evaluations without convergence, L-BFGS-B (whose curvature estimate
    follows the valley) continues from trf's point on variables scaled by the Jacobian's column norms,
    and trf restarts where it stops: the result passes trf's own convergence tests (status > 0), at a
    cost within 1e-8 relative of what trf alone reaches when it converges at all.
    ``residual_and_jacobian`` returns both at one point (what L-BFGS-B asks for).

    Returns
    -------
    solution : scipy.optimize.OptimizeResult
        The last trf run (its ``x`` and ``status``); after L-BFGS-B its ``message`` also says where the
        first trf run and L-BFGS-B stopped.
    solver : str
        One of :data:`SOLVERS`.
    nfev, njev : int
        Residual and Jacobian evaluations of all stages.
    """
    options = dict(jac=jacobian, bounds=(lower, upper), method="trf", x_scale="jac", ftol=TOLERANCE,
                   xtol=TOLERANCE, gtol=TOLERANCE)
    solution = least_squares(residual, start, max_nfev=TRF_EVALUATIONS, **options)
    if solution.status != 0:
        return solution, SOLVERS[0], int(solution.nfev), int(solution.njev)
    norms = np.linalg.norm(jacobian(solution.x), axis=0)
    scale = np.divide(1.0, norms, out=np.ones_like(norms), where=np.isfinite(norms) & (norms > 0))

    def cost_and_gradient(scaled):
        error, derivatives = residual_and_jacobian(scaled * scale)
        return 0.5 * error @ error, (derivatives.T @ error) * scale

    valley = minimize(cost_and_gradient, solution.x / scale, jac=True, method="L-BFGS-B",
                      bounds=Bounds(lower / scale, upper / scale),
                      options={"ftol": np.finfo(float).eps, "gtol": TOLERANCE, "maxcor": 20,
                               "maxfun": VALLEY_EVALUATIONS, "maxiter": VALLEY_EVALUATIONS})
    final = least_squares(residual, np.clip(valley.x * scale, lower, upper), **options)
    final.message = (f"{final.message} (trf stopped after {solution.nfev} evaluations; L-BFGS-B after "
                     f"{valley.nfev}: {valley.message})")
    return (final, SOLVERS[1], int(solution.nfev + valley.nfev + final.nfev),
            int(solution.njev + 1 + valley.nfev + final.njev))


def fit_speedup_model(frame: pd.DataFrame, rp: float, model=None, hardware=None, variant: str = "eq4",
                      stride: int | None = None, x0=None, begin: int = 0, draft=None,
                      bytes_per_parameter: float = 2.0, t_reject: float | None = None,
                      verify_tokens: str = "gamma", bounds=None, m: int | None = None) -> FitResult:
    """Fit Algorithm 1 to measured speedups with ``least_squares(method="trf")`` and Appendix C.2's bounds.

    Parameters
    ----------
    frame : pandas.DataFrame
        Measurements with columns ``B``, ``gamma``, ``K``, ``E``, ``sigma``, ``speedup`` and a unique index.
    rp : float
        Ridge point of the hardware measured, in tokens (> 0): G turns linear at ``lam * rp`` tokens. From
        a result file, :func:`moesd.measure.studies.ridge_tokens_for` of its sidecar; for bf16 weights it
        equals the ridge point in FLOP/byte, for float32 twice that.
    model, hardware, draft, bytes_per_parameter, t_reject
        Passed to :func:`parameter_bounds`.
    variant : {"eq4", "printed"}
        The denominator (see :func:`compute_speedup`).
    stride : int, optional
        Fit only :func:`stride_sample` ``(frame, stride, begin)`` (default: every row).
    x0 : SpeedupParams, dict or sequence, optional
        Starting parameters (default: a start derived from the bounds), clipped into the bounds.
    begin : int
        First row of the stride or spread sample (only with ``stride`` or ``m``).
    verify_tokens : {"gamma", "gamma+1"}
        Tokens per sequence in the verification forward: Algorithm 1's ``gamma`` or vLLM's ``gamma + 1``.
    bounds : (numpy.ndarray, numpy.ndarray), optional
        ``(lower, upper)`` in :data:`PARAMETERS` order, as :func:`parameter_bounds` returns them (for a
        result file: :func:`moesd.measure.studies.appendix_c2_bounds`), instead of ``model``, ``hardware``,
        ``draft``, ``bytes_per_parameter`` and ``t_reject``.
    m : int, optional
        Fit only :func:`spread_sample` ``(frame, m, begin)``: ``m`` rows at a fractional stride (not
        with ``stride``).

    Returns
    -------
    FitResult
    """
    check_measurements(frame)
    if bounds is not None and (model is not None or hardware is not None or draft is not None
                               or t_reject is not None):
        raise ValueError("give either bounds or model, hardware, draft and t_reject, not both")
    rp = float(as_array("rp", rp, low=0, low_open=True))
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    if verify_tokens not in VERIFY_TOKENS:
        raise ValueError(f"verify_tokens must be one of {', '.join(VERIFY_TOKENS)}, got {verify_tokens!r}")
    if not frame.index.is_unique:
        raise ValueError("the measurements' index must be unique (held-back rows are found by label); "
                         "use frame.reset_index(drop=True)")
    if stride is not None and m is not None:
        raise ValueError("give either stride or m, not both")
    if stride is not None:
        data = stride_sample(frame, stride, begin)
    elif m is not None:
        data = spread_sample(frame, m, begin)
    else:
        if begin != 0:
            raise ValueError(f"begin applies only with a stride or m, got begin = {begin!r}")
        data = frame
    if len(data) < len(PARAMETERS):
        raise ValueError(f"{len(data)} measurements cannot determine {len(PARAMETERS)} parameters")
    if bounds is None:
        lower, upper = parameter_bounds(model, hardware, draft, bytes_per_parameter, t_reject)
    else:
        lower, upper = (np.array(side, dtype=float) for side in bounds)
        if lower.shape != (len(PARAMETERS),) or upper.shape != lower.shape or (lower > upper).any():
            raise ValueError(f"bounds must be two arrays of {len(PARAMETERS)} numbers with lower <= upper")
    if x0 is None:
        bias = np.sqrt(lower[0] * upper[0]) if 0 < lower[0] and np.isfinite(upper[0]) else 1.0
        start = _initial_guess(bias, lower, upper)
    else:
        start = np.clip(as_params(x0).vector(), lower, upper)
    inputs = _inputs(data, rp, verify_tokens)
    tokens = inputs._growth_tokens  # stacked once: the token counts G is evaluated at never change
    measured = data["speedup"].to_numpy(dtype=float)

    def residual(p):
        return inputs._speedup(p, variant, tokens) - measured

    def jacobian(p):
        return inputs._jacobian(p, variant, tokens)

    def residual_and_jacobian(p):
        speedup, derivatives = inputs._speedup_and_jacobian(p, variant, tokens)
        return speedup - measured, derivatives

    tick = time.perf_counter()
    solution, solver, nfev, njev = _minimise(residual, jacobian, residual_and_jacobian, start, lower, upper)
    seconds = time.perf_counter() - tick
    values = solution.x
    if _scale_is_free(lower, upper) and values[0] > 0 and start[0] > 0:
        # Every point of the ray through the optimum fits equally: report the one with bias at its start,
        # if it is within the bounds (clipping it back would move it off the optimum).
        scaled = values.copy()
        scaled[:len(TIME_PARAMETERS)] *= start[0] / values[0]
        scaled[0] = start[0]
        if np.all(scaled >= lower) and np.all(scaled <= upper):
            values = scaled
    residuals = residual(values)
    return FitResult(SpeedupParams.from_vector(values), variant, rp, float(np.mean(residuals ** 2)), residuals,
                     seconds, data, verify_tokens, lower, upper, int(solution.status), str(solution.message),
                     nfev, njev, solver)


def _held_back(result: FitResult, frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Which rows of ``frame`` the fit did not use (found by index label), and the frame's checked values."""
    if not isinstance(result, FitResult):
        raise ValueError(f"result must be a FitResult, got {type(result).__name__}")
    array = _measurement_array(frame)
    if not frame.index.is_unique:
        raise ValueError("frame's index must be unique (held-back rows are found by label)")
    positions = frame.index.get_indexer(result.fitted.index)
    if (positions < 0).any():
        raise ValueError("frame lacks rows the fit used: pass the frame the result was fitted on")
    if not np.array_equal(array[positions], result.fitted[list(COLUMNS)].to_numpy(dtype=float)):
        raise ValueError("frame's rows differ from those the fit used: pass the frame the result was fitted on")
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
    return _errors(result, _inputs(frame, result.rp, result.verify_tokens, array), array[:, 5], held)


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

    The samples are :func:`stride_sample` ``(frame, stride)`` for each of ``strides`` (the paper's
    design: 228 measurements, strides 25 ... 1), or, with ``sizes``, :func:`spread_sample`
    ``(frame, m)`` for each ``m`` in ``sizes`` (a fractional stride ``n / m``: samples of every size for
    a design of other than 228 points, where whole strides give few sizes).

    Returns
    -------
    pandas.DataFrame
        One row per sample: ``stride`` (``n / m`` for a spread sample), ``m``, ``mse`` (over every
        measurement, as Table 3), ``mse_fitted``, held-back ``mape`` and ``max_abs_error``,
        ``fit_seconds``, ``solver`` (see :data:`SOLVERS`), ``status`` (of the last trf run: > 0
        converged), ``nfev`` (residual evaluations), ``on_bounds`` (parameters on a bound, as a string),
        ``batch_sizes`` (sorted, as a string) and ``result`` (the :class:`FitResult`).
    """
    array = _measurement_array(frame)
    for name in ("stride", "m", "begin"):
        if name in fit_options:
            raise ValueError(f"robustness_study sets {name} itself")
    samples = ([{"stride": stride} for stride in strides] if sizes is None
               else [{"m": int(as_array("sizes", m, low=1, whole=True))} for m in sizes])
    everything = None  # the inputs of every row, for the errors of every fit
    rows = []
    for sample in samples:
        result = fit_speedup_model(frame, rp, **sample, **fit_options)
        if everything is None:
            everything = _inputs(frame, result.rp, result.verify_tokens, array)
        held = _errors(result, everything, array[:, 5], ~frame.index.isin(result.fitted.index))
        stride = sample.get("stride", len(frame) / len(result.fitted))
        rows.append({"stride": stride, "m": len(result.fitted), "mse": held["mse_all"], "mse_fitted": result.mse,
                     "mape": held["mape"], "max_abs_error": held["max_abs_error"],
                     "fit_seconds": result.fit_seconds, "solver": result.solver, "status": result.status,
                     "nfev": result.nfev,
                     "on_bounds": " ".join(f"{name} ({side})" for name, side in result.on_bounds().items()),
                     "batch_sizes": " ".join(str(int(b)) for b in sorted(result.fitted["B"].unique())),
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
    predicted = _inputs(frame, result.rp, result.verify_tokens, array).speedup(result.parameters, result.variant)
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
    ``t_target_gamma / t_target_1``; :mod:`moesd.measure.sd` verifies ``gamma + 1`` positions, the fitted term
    the fit's ``verify_tokens``). The round's cost outside the verification, ``gamma draft + reject``
    (Eq. 4's denominator less ``verify``), is compared too (``overhead``): a speedup fit sees the draft
    and rejection terms only through it, and can trade one for the other.

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
        ``<stage>_fitted`` and ``<stage>_measured`` (dimensionless ratios to the decode step).
    """
    if not isinstance(result, FitResult):
        raise ValueError(f"result must be a FitResult, got {type(result).__name__}")
    frame = measured.rename(columns={"batch_size": "B", "num_experts_per_tok": "K"})
    if "E" not in frame.columns:
        if num_experts is None:
            raise ValueError("measured has no E column: pass num_experts")
        frame = frame.assign(E=float(as_array("num_experts", num_experts, low=1, whole=True)))
    missing = [column for column in ("B", "gamma", "K", *STAGE_COLUMNS) if column not in frame.columns]
    if missing:
        raise ValueError(f"measured lacks the column(s) {', '.join(missing)}")
    for column in STAGE_COLUMNS + (("t_target_gamma",) if "t_target_gamma" in frame.columns else ()):
        as_array(column, frame[column], low=0, low_open=column != "t_reject")
    times = stage_times(result.parameters, frame["B"].to_numpy(float), frame["gamma"].to_numpy(float),
                        frame["K"].to_numpy(float), frame["E"].to_numpy(float), result.rp, result.verify_tokens)
    table = pd.DataFrame({"B": frame["B"], "gamma": frame["gamma"], "K": frame["K"],
                          "draft_fitted": times["draft"] / times["ar"],
                          "draft_measured": frame["t_draft"] / frame["t_target_1"],
                          "reject_fitted": times["reject"] / times["ar"],
                          "reject_measured": frame["t_reject"] / frame["t_target_1"],
                          "overhead_fitted": (frame["gamma"] * times["draft"] + times["reject"]) / times["ar"],
                          "overhead_measured": (frame["gamma"] * frame["t_draft"] + frame["t_reject"])
                          / frame["t_target_1"]}, index=frame.index)
    if "t_target_gamma" in frame.columns:
        table["verify_fitted"] = times["verify"] / times["ar"]
        table["verify_measured"] = frame["t_target_gamma"] / frame["t_target_1"]
    return table


def model_variant_errors(frame: pd.DataFrame, rp: float, stride: int | None = 11, begins=None, m: int | None = None,
                         **fit_options) -> pd.DataFrame:
    """Held-back errors of the four model variants: verified tokens (``B gamma``, ``B (gamma + 1)``) x denominator.

    Each variant is fitted to ``stride_sample(frame, stride, begin)`` for every ``begin`` (default
    ``0 ... stride - 1``: every row is held back in all folds but one), or, with ``m`` (and
    ``stride=None``), to ``spread_sample(frame, m, begin)`` for every ``begin`` below ``n / m``
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
            raise ValueError(f"model_variant_errors sets {name} itself")
    if (stride is None) == (m is None):
        raise ValueError("give either stride or m (with stride=None)")
    if m is not None:
        m = int(as_array("m", m, low=1, whole=True))
        sample = {"m": m}
        default = range(-(-len(frame) // m))  # every begin below n / m
    else:
        sample = {"stride": stride}
        default = range(int(as_array("stride", stride, low=1, whole=True)))
    begins = default if begins is None else list(begins)
    if not len(begins):
        raise ValueError("begins must name at least one fold")
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
        raise ValueError(f"metric must be mse, mape or worst_mse, got {metric!r}")
    if not isinstance(errors, pd.DataFrame) or metric not in errors.columns or errors.empty:
        raise ValueError(f"errors must be the table of model_variant_errors (with a {metric} column)")
    ranked = errors[metric].sort_values(kind="stable")
    (verify_tokens, variant), value = ranked.index[0], float(ranked.iloc[0])
    return {"verify_tokens": verify_tokens, "variant": variant, "metric": metric, "value": value,
            "runner_up_value": float(ranked.iloc[1]) if len(ranked) > 1 else float("nan")}


@dataclass
class StageTimeFit:
    """Algorithm 1's stage-time model fitted to measured stage times (identifiable scale)."""

    params: dict
    rp: float
    relative_rms: float
    fit_seconds: float

    def predict_speedup(self, frame: pd.DataFrame, verify_tokens=None) -> np.ndarray:
        """Speedups of the rows of ``frame`` from the fitted stage times (Eq. 4's denominator).

        ``verify_tokens`` as in :func:`compute_speedup`; pass ``"gamma+1"`` (or ``frame["gamma"] + 1``)
        for the times of an engine that verifies gamma + 1 positions, as the forward study measured them.
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
        Ridge point in tokens (see :func:`fit_speedup_model`).

    Returns
    -------
    StageTimeFit
        Residuals are relative (times span orders of magnitude); ``relative_rms`` is their RMS.
    """
    for name, table, columns in (("target", target, ("tokens", "seconds")), ("draft", draft, ("B", "seconds")),
                                 ("reject", reject, ("B", "seconds"))):
        missing = [column for column in columns if column not in table.columns]
        if missing:
            raise ValueError(f"{name} lacks the column(s) {', '.join(missing)}")
        as_array(f"{name} seconds", table["seconds"], low=0, low_open=True)
    rp = float(as_array("rp", rp, low=0, low_open=True))
    lower, upper = parameter_bounds()
    x0 = _initial_guess(float(np.median(target["seconds"])), lower, upper)
    t_tokens, t_seconds = target["tokens"].to_numpy(float), target["seconds"].to_numpy(float)
    d_batch, d_seconds = draft["B"].to_numpy(float), draft["seconds"].to_numpy(float)
    r_batch, r_seconds = reject["B"].to_numpy(float), reject["seconds"].to_numpy(float)
    as_array("target tokens", t_tokens, low=1)
    as_array("draft B", d_batch, low=1)
    as_array("reject B", r_batch, low=1)
    forward = SpeedupInputs.build(t_tokens, 1, K, E, 1.0, rp)  # its ar time: a pass of `tokens` tokens
    draft_inputs = SpeedupInputs.build(d_batch, 1, 1, 1, 1.0, rp)

    def residual(p):
        p = np.asarray(p, dtype=float)
        return np.concatenate([
            forward.stage_times(p)["ar"] / t_seconds - 1,
            draft_inputs.stage_times(p)["draft"] / d_seconds - 1,
            (p[6] + p[7] * r_batch) / r_seconds - 1])

    tick = time.perf_counter()
    solution = least_squares(residual, x0, bounds=(lower, upper), method="trf", x_scale="jac")
    seconds = time.perf_counter() - tick
    return StageTimeFit(SpeedupParams.from_vector(solution.x).as_dict(), rp,
                        float(np.sqrt(np.mean(residual(solution.x) ** 2))), seconds)
