"""Fitting Algorithm 1 to measured speedups (Appendix C): the fit itself.

The forward model (``ComputeSpeedup``, stage times, bounds) lives in :mod:`moesd.model.algorithm1`, the
fitting frame in :mod:`moesd.model.measurements`, its samples in :mod:`moesd.model.samples`, and what
judges a fit (held-back errors, the robustness study, residuals, model variants, stage times) in
:mod:`moesd.model.diagnostics`. :func:`fit_speedup_model` runs ``least_squares`` (trust region
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
identifiable; :meth:`FitResult.on_bounds` the parameters that end on a bound.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.optimize import Bounds, OptimizeResult, least_squares, minimize

from moesd._checks import UsageError, as_array
from moesd.model.algorithm1 import PARAMETERS, TIME_PARAMETERS, VARIANTS, VERIFY_TOKENS, SpeedupParams, as_params
from moesd.model.bounds import parameter_bounds
from moesd.model.measurements import COLUMNS, check_measurements, speedup_inputs
from moesd.model.samples import spread_sample, stride_sample

__all__ = ["TOLERANCE", "TRF_EVALUATIONS", "VALLEY_EVALUATIONS", "SOLVERS", "FitResult", "initial_guess",
           "fit_speedup_model"]

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
        ``"gamma"`` (Algorithm 1's ``B gamma`` verified tokens) or ``"gamma+1"`` (vLLM's, moesd.engine.sd's).
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
            raise UsageError(f"frame lacks the column(s) {', '.join(missing)}", "frame")
        return speedup_inputs(frame, self.rp, self.verify_tokens).speedup(self.parameters, self.variant)

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


def initial_guess(bias: float, lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """The fit's default start: ``bias`` and the other time-like parameters as fixed fractions of it, in the bounds.

    Parameters
    ----------
    bias : float
        Start of ``bias`` (seconds); the other seven time-like parameters start at fixed fractions of
        it, ``lam`` at 0.6 and ``s`` at 1.01.
    lower, upper : numpy.ndarray
        Bounds in :data:`~moesd.model.algorithm1.PARAMETERS` order (as
        :func:`~moesd.model.bounds.parameter_bounds` returns them).

    Returns
    -------
    numpy.ndarray
        The ten starting parameters, clipped into the bounds.
    """
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
                      verify_tokens: str = "gamma", bounds=None, m: int | None = None, tp: int = 1,
                      draft_tp: int = 1) -> FitResult:
    """Fit Algorithm 1 to measured speedups with ``least_squares(method="trf")`` and Appendix C.2's bounds.

    Parameters
    ----------
    frame : pandas.DataFrame
        Measurements with columns ``B``, ``gamma``, ``K``, ``E``, ``sigma``, ``speedup`` and a unique index.
    rp : float
        Ridge point of the hardware measured, in tokens (> 0): G turns linear at ``lam * rp`` tokens. From
        a result file, :func:`moesd.measure.analysis.ridge_tokens_for` of its sidecar; for bf16 weights it
        equals the ridge point in FLOP/byte, for float32 twice that.
    model, hardware, draft, bytes_per_parameter, t_reject, tp, draft_tp
        Passed to :func:`parameter_bounds`: ``tp`` and ``draft_tp`` are the tensor-parallel GPUs of the
        target and of the draft (default 1), each reading its share of the weights.
    variant : {"eq4", "printed"}
        The denominator (see :func:`moesd.model.algorithm1.compute_speedup`).
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
        result file: :func:`moesd.model.bounds.appendix_c2_bounds`), instead of ``model``, ``hardware``,
        ``draft``, ``bytes_per_parameter``, ``t_reject``, ``tp`` and ``draft_tp``.
    m : int, optional
        Fit only :func:`spread_sample` ``(frame, m, begin)``: ``m`` rows at a fractional stride (not
        with ``stride``).

    Returns
    -------
    FitResult
    """
    check_measurements(frame)
    if bounds is not None and (model is not None or hardware is not None or draft is not None
                               or t_reject is not None or (tp, draft_tp) != (1, 1)):
        raise UsageError("give either bounds or model, hardware, draft, t_reject, tp and draft_tp, not both", "bounds")
    rp = float(as_array("rp", rp, low=0, low_open=True))
    if variant not in VARIANTS:
        raise UsageError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}", "variant")
    if verify_tokens not in VERIFY_TOKENS:
        raise UsageError(f"verify_tokens must be one of {', '.join(VERIFY_TOKENS)}, got {verify_tokens!r}", "verify_tokens")
    if not frame.index.is_unique:
        raise UsageError("the measurements' index must be unique (held-back rows are found by label); "
                         "use frame.reset_index(drop=True)", "frame")
    if stride is not None and m is not None:
        raise UsageError("give either stride or m, not both", "stride")
    if stride is not None:
        data = stride_sample(frame, stride, begin)
    elif m is not None:
        data = spread_sample(frame, m, begin)
    else:
        if begin != 0:
            raise UsageError(f"begin applies only with a stride or m, got begin = {begin!r}", "begin")
        data = frame
    if len(data) < len(PARAMETERS):
        raise UsageError(f"{len(data)} measurements cannot determine {len(PARAMETERS)} parameters", "frame")
    if bounds is None:
        lower, upper = parameter_bounds(model, hardware, draft, bytes_per_parameter, t_reject, tp=tp,
                                        draft_tp=draft_tp)
    else:
        lower, upper = (np.array(side, dtype=float) for side in bounds)
        if lower.shape != (len(PARAMETERS),) or upper.shape != lower.shape or (lower > upper).any():
            raise UsageError(f"bounds must be two arrays of {len(PARAMETERS)} numbers with lower <= upper", "bounds")
    if x0 is None:
        bias = np.sqrt(lower[0] * upper[0]) if 0 < lower[0] and np.isfinite(upper[0]) else 1.0
        start = initial_guess(bias, lower, upper)
    else:
        start = np.clip(as_params(x0).vector(), lower, upper)
    inputs = speedup_inputs(data, rp, verify_tokens)
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
