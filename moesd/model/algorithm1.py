"""Algorithm 1's forward model of SD speedup (the paper's ``ComputeSpeedup``, Appendix C).

Stage times are built from the expected activated experts N(t) (Eq. 8), the tokens per expert
``t K / N(t)`` (Eq. 10) and the roofline growth ``G(t) = G(t; lam RP, s)`` (Eq. 11), where ``RP`` (the
argument ``rp``) is the ridge point in tokens: the tokens at which a GEMM reaches the hardware's
ridge point in FLOP/byte (equal to it for bf16 weights, as in the paper; twice it for float32; see
:func:`moesd.measure.analysis.ridge_tokens_for`):

* ``ar_time     = bias + k1 G(B) + k2 N(B) + k3 G(B K / N(B))``
* ``verify_time = bias + k1 G(B w) + k2 N(B w) + k3 G(B w K / N(B w))``, ``w = gamma`` as Algorithm 1
  writes it, or ``w = gamma + 1`` as vLLM and :mod:`moesd.engine.sd` verify
* ``draft_time  = draft_bias + draft_k G(B)``,  ``reject_time = reject_bias + reject_k B``

and the speedup is ``sigma (gamma + 1) ar_time / denominator``. Line 11 of the paper prints
``draft + ar + verify + reject`` as the denominator (``variant="printed"``); Eq. 4 implies
``gamma draft + verify + reject`` (``variant="eq4"``).

Speedup is a ratio of times: multiplying the eight time-like parameters by one constant changes no
prediction. Only bounds (Appendix C.2: parameter volumes over memory bandwidth) fix that scale.

:class:`SpeedupInputs` holds everything that does not depend on the parameters (N, tokens per
expert), computed once, and evaluates the speedup with its analytic Jacobian, which is what the fit
in :mod:`moesd.model.fit` calls many times. This module is pure numpy; the bounds of
Appendix C.2 that the fit keeps the parameters within are in :mod:`moesd.model.bounds`.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass, fields

import numpy as np

from moesd._checks import UsageError, as_array
from moesd.theory.experts import expected_active_experts
from moesd.theory.growth import G, unchecked_G

PARAMETERS = ("bias", "k1", "k2", "k3", "draft_bias", "draft_k", "reject_bias", "reject_k", "lam", "s")
"""Algorithm 1's ten parameters, in its order (the order of :meth:`SpeedupParams.vector`)."""
TIME_PARAMETERS = PARAMETERS[:8]
"""The parameters in seconds (or seconds per unit of G, expert or sequence): one common scale."""
VARIANTS = ("printed", "eq4")
"""Denominators of the speedup: as line 11 of Algorithm 1 prints it, or as Eq. 4 implies."""
VERIFY_TOKENS = ("gamma", "gamma+1")
"""Named choices of the tokens per sequence in the verification forward."""


@dataclass(frozen=True)
class SpeedupParams:
    """Algorithm 1's ten parameters, by name.

    Attributes
    ----------
    bias : float
        Seconds: fixed time of a target forward (loading the non-expert weights).
    k1 : float
        Seconds per unit of G: growth of the dense parts' time with the tokens in the forward.
    k2 : float
        Seconds per activated expert: loading one expert (of every MoE layer).
    k3 : float
        Seconds per unit of G: growth of the experts' time with the tokens per expert.
    draft_bias : float
        Seconds: fixed time of one draft forward.
    draft_k : float
        Seconds per unit of G: growth of the draft forward's time with the batch size.
    reject_bias : float
        Seconds: fixed time of rejection sampling per round.
    reject_k : float
        Seconds per sequence: rejection sampling's cost per sequence of the batch.
    lam : float
        Dimensionless (> 0; the paper bounds it to [0.2, 1]): empirical over theoretical ridge point,
        G turns from exponential to linear at ``lam * RP`` tokens.
    s : float
        Dimensionless (>= 1; the paper bounds it to [1, 2]): base of G, its growth per token below
        the transition.
    """

    bias: float
    k1: float
    k2: float
    k3: float
    draft_bias: float
    draft_k: float
    reject_bias: float
    reject_k: float
    lam: float
    s: float

    def __post_init__(self):
        for name in TIME_PARAMETERS:
            value = getattr(self, name)
            if not np.isfinite(value) or value < 0:
                raise UsageError(f"{name} must be a finite time >= 0 (seconds), got {value!r}", name)
        if not np.isfinite(self.lam) or self.lam <= 0:
            raise UsageError(f"lam must be a finite number > 0, got {self.lam!r}", "lam")
        if not np.isfinite(self.s) or self.s < 1:
            raise UsageError(f"s must be a finite number >= 1, got {self.s!r}", "s")

    @classmethod
    def from_vector(cls, vector) -> "SpeedupParams":
        """The parameters from ten numbers in :data:`PARAMETERS` order."""
        vector = np.asarray(vector, dtype=float)
        if vector.shape != (len(PARAMETERS),):
            raise UsageError(f"params must hold {len(PARAMETERS)} values ({', '.join(PARAMETERS)}), got shape "
                             f"{vector.shape}", "params")
        return cls(*map(float, vector))

    def vector(self) -> np.ndarray:
        """The ten values in :data:`PARAMETERS` order (what the optimiser moves)."""
        return np.array(astuple(self), dtype=float)

    def as_dict(self) -> dict:
        """The parameters as a ``{name: value}`` dict in :data:`PARAMETERS` order."""
        return {field.name: getattr(self, field.name) for field in fields(self)}

    def relative(self) -> "SpeedupParams":
        """The identifiable form: time-like parameters divided by ``bias`` (``bias`` becomes 1)."""
        if self.bias <= 0:
            raise UsageError("relative parameters need bias > 0", "relative")
        values = self.vector()
        values[:len(TIME_PARAMETERS)] /= self.bias
        return SpeedupParams.from_vector(values)


def as_params(params) -> SpeedupParams:
    """``params`` as :class:`SpeedupParams`: one already, a dict by name, or ten numbers in order."""
    if isinstance(params, SpeedupParams):
        return params
    if isinstance(params, dict):
        missing = [name for name in PARAMETERS if name not in params]
        if missing:
            raise UsageError(f"params lacks {', '.join(missing)}", "params")
        return SpeedupParams(**{name: float(params[name]) for name in PARAMETERS})
    try:
        vector = np.asarray(params, dtype=float)
    except (TypeError, ValueError):
        raise UsageError(f"params must be SpeedupParams, a dict or {len(PARAMETERS)} numbers, got {params!r}", "params") \
            from None
    return SpeedupParams.from_vector(vector)


def _verify_width(gamma: np.ndarray, verify_tokens) -> np.ndarray:
    """Tokens per sequence in the verification forward."""
    if verify_tokens is None or (isinstance(verify_tokens, str) and verify_tokens == "gamma"):
        return gamma
    if isinstance(verify_tokens, str):
        if verify_tokens != "gamma+1":
            raise UsageError(f"verify_tokens must be {' or '.join(VERIFY_TOKENS)} or numbers >= 1, "
                             f"got {verify_tokens!r}", "verify_tokens")
        return gamma + 1
    return as_array("verify_tokens", verify_tokens, low=1)


@dataclass(frozen=True)
class SpeedupInputs:
    """The parameter-free part of ``ComputeSpeedup`` for a set of points, computed once.

    Build it with :meth:`build` (which checks every input); then :meth:`speedup`,
    :meth:`stage_times` and :meth:`jacobian` evaluate the model for any parameters. Arrays of the
    two target forwards are stacked: index 0 is the decode step (``ar``), 1 the verification.

    Attributes
    ----------
    batch : numpy.ndarray
        Batch size B (sequences).
    gamma : numpy.ndarray
        Draft length (tokens per round).
    acceptance : numpy.ndarray
        ``sigma (gamma + 1)``: tokens emitted per round over the target steps it replaces.
    tokens : numpy.ndarray
        Tokens in the decode and the verification forward: ``B`` and ``B gamma`` (or ``B (gamma + 1)``).
    experts : numpy.ndarray
        Expected activated experts N (Eq. 8) in those forwards.
    per_expert : numpy.ndarray
        Tokens per activated expert ``tokens K / N`` (Eq. 10) in those forwards.
    rp : float
        Ridge point of the hardware measured, in tokens (G's transition is at ``lam * rp`` tokens).
    """

    batch: np.ndarray
    gamma: np.ndarray
    acceptance: np.ndarray
    tokens: np.ndarray
    experts: np.ndarray
    per_expert: np.ndarray
    rp: float

    @classmethod
    def build(cls, B, gamma, K, E, sigma, rp, verify_tokens=None) -> "SpeedupInputs":
        """Check the inputs of ``ComputeSpeedup`` and precompute N and tokens per expert.

        Parameters
        ----------
        B, gamma, K, E, sigma, rp, verify_tokens
            As in :func:`compute_speedup`.
        """
        B = as_array("B", B, low=1)
        gamma = as_array("gamma", gamma, low=1, whole=True)
        E = as_array("E", E, low=1, whole=True)
        K = as_array("K", K, low=1, whole=True)
        sigma = as_array("sigma", sigma, high=1)
        rp = float(as_array("rp", rp, low=0, low_open=True))
        if not np.isfinite(rp):
            raise UsageError(f"rp must be finite, got {rp!r}", "rp")
        B, gamma, K, E, sigma = np.broadcast_arrays(B, gamma, K, E, sigma)
        if (K > E).any():
            raise UsageError(f"K must be <= E, got K = {K[K > E].flat[0]:g} with E = {E[K > E].flat[0]:g}", "K")
        too_low = sigma < 1 / (gamma + 1) - 1e-9
        if too_low.any():
            raise UsageError(f"sigma must be in [1/(gamma+1), 1] (Eq. 5), got {sigma[too_low].flat[0]!r} with "
                             f"gamma = {gamma[too_low].flat[0]:g}", "sigma")
        tokens = np.stack([B, B * _verify_width(gamma, verify_tokens)])
        experts = expected_active_experts(tokens, E, K)
        return cls(B, gamma, sigma * (gamma + 1), tokens, experts, tokens * K / experts, rp)

    @property
    def _growth_tokens(self) -> np.ndarray:
        """Where G is evaluated, stacked: tokens of the two forwards, then tokens per expert in each."""
        return np.concatenate([self.tokens, self.per_expert])

    def _times(self, p: np.ndarray, growth: np.ndarray):
        """Target times (decode, verify), draft and reject times for parameters ``p`` and G at the stacked tokens."""
        bias, k1, k2, k3, draft_bias, draft_k, reject_bias, reject_k, _, _ = p.tolist()
        target = bias + k1 * growth[:2] + k2 * self.experts + k3 * growth[2:]
        return target, draft_bias + draft_k * growth[0], reject_bias + reject_k * self.batch

    def stage_times(self, params) -> dict:
        """The four stage times ``ar``, ``verify``, ``draft`` and ``reject`` (seconds, the parameters' scale)."""
        p = as_params(params).vector()
        target, draft, reject = self._times(p, unchecked_G(self._growth_tokens, p[8] * self.rp, p[9]))
        return {"ar": target[0], "verify": target[1], "draft": draft, "reject": reject}

    def _weights(self, variant: str):
        """Weights of the draft and ar times in the denominator (verify and reject have weight 1)."""
        return denominator_weights(variant, self.gamma)

    def speedup(self, params, variant: str = "eq4") -> np.ndarray:
        """Predicted speedups (dimensionless)."""
        return self._speedup(as_params(params).vector(), variant)

    def _speedup(self, p: np.ndarray, variant: str, tokens: np.ndarray | None = None) -> np.ndarray:
        draft_weight, ar_weight = self._weights(variant)
        tokens = self._growth_tokens if tokens is None else tokens
        lam, s = p[8:].tolist()
        target, draft, reject = self._times(p, unchecked_G(tokens, lam * self.rp, s))
        denominator = draft_weight * draft + ar_weight * target[0] + target[1] + reject
        return self.acceptance * target[0] / denominator

    def jacobian(self, params, variant: str = "eq4") -> np.ndarray:
        """Derivatives of the speedups in the ten parameters: shape (points, 10), :data:`PARAMETERS` order.

        With ``S = a ar / den`` and ``den = w_d draft + w_a ar + verify + reject``:
        ``dS = ((a - S w_a) d(ar) - S (d(verify) + w_d d(draft) + d(reject))) / den``. The times are
        linear in the eight time-like parameters; ``lam`` and ``s`` enter through G (see :func:`moesd.theory.growth.unchecked_G`).
        """
        if self.batch.ndim != 1:
            raise UsageError(f"the Jacobian needs one-dimensional inputs (points), got shape {self.batch.shape}", "inputs")
        return self._jacobian(as_params(params).vector(), variant)

    def _jacobian(self, p: np.ndarray, variant: str, tokens: np.ndarray | None = None) -> np.ndarray:
        return self._speedup_and_jacobian(p, variant, tokens)[1]

    def _speedup_and_jacobian(self, p: np.ndarray, variant: str,
                              tokens: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The speedups and their Jacobian from one evaluation of G and the stage times."""
        draft_weight, ar_weight = self._weights(variant)
        tokens = self._growth_tokens if tokens is None else tokens
        lam, s = p[8:].tolist()
        growth, d_transition, d_s = unchecked_G(tokens, lam * self.rp, s, derivatives=True)
        target, draft, reject = self._times(p, growth)
        denominator = draft_weight * draft + ar_weight * target[0] + target[1] + reject
        on_ar = self.acceptance / denominator  # dS/d(ar) through the numerator
        on_denominator = on_ar * target[0] / denominator  # S / den
        on_ar = on_ar - on_denominator * ar_weight
        on_draft = on_denominator * draft_weight
        jacobian = np.empty((len(PARAMETERS), self.batch.size))
        # bias, k1, k2, k3: d(ar) = (1, G(B), N(B), G(T_ar)), d(verify) likewise at the verify tokens.
        jacobian[0] = on_ar - on_denominator
        jacobian[1:4:2] = on_ar * growth[0:3:2] - on_denominator * growth[1:4:2]
        jacobian[2] = on_ar * self.experts[0] - on_denominator * self.experts[1]
        jacobian[4] = -on_draft
        jacobian[5] = -on_draft * growth[0]
        jacobian[6] = -on_denominator
        jacobian[7] = -on_denominator * self.batch
        # lam (through the transition lam RP) and s act through G at the four stacked token counts:
        # dS = (on_ar k1 - on_draft draft_k) dG(B) - on_den k1 dG(B w) + k3 (on_ar dG(T_ar) - on_den dG(T_verify)).
        k1, k3, draft_k = p[[1, 3, 5]].tolist()
        weights = np.empty_like(d_s)
        weights[0] = k1 * on_ar - draft_k * on_draft
        weights[1] = -k1 * on_denominator
        weights[2] = k3 * on_ar
        weights[3] = -k3 * on_denominator
        jacobian[8] = self.rp * (weights * d_transition).sum(axis=0)
        jacobian[9] = (weights * d_s).sum(axis=0)
        return on_denominator * denominator, jacobian.T


def target_time(params, tokens, K, E, rp):
    """Algorithm 1's target forward time for ``tokens`` tokens (its ar_time and verify_time).

    Parameters
    ----------
    params : SpeedupParams, dict or sequence of 10 floats
        See :data:`PARAMETERS`.
    tokens : array_like
        Tokens in the forward pass (B for a decode step, B gamma for verification), >= 1.
    K, E : array_like
        Experts per token and routed experts per layer (whole numbers, 1 <= K <= E).
    rp : float
        Ridge point of the hardware in tokens (> 0); the transition of G is at ``lam * rp`` tokens.

    Returns
    -------
    numpy.ndarray
        Seconds (in the scale of the time-like parameters).
    """
    p = as_params(params)
    tokens = as_array("tokens", tokens, low=1)
    rp = float(as_array("rp", rp, low=0, low_open=True))
    active = expected_active_experts(tokens, E, K)  # checks E and K
    per_expert = tokens * np.asarray(K, dtype=float) / active
    lam_rp = p.lam * rp
    return p.bias + p.k1 * G(tokens, lam_rp, p.s) + p.k2 * active + p.k3 * G(per_expert, lam_rp, p.s)


def stage_times(params, B, gamma, K, E, rp, verify_tokens=None) -> dict:
    """Algorithm 1's four stage times: ``ar``, ``verify``, ``draft`` and ``reject`` (seconds).

    Parameters
    ----------
    params : SpeedupParams, dict or sequence of 10 floats
    B, gamma, K, E, rp, verify_tokens
        As in :func:`compute_speedup` (no sigma: the times do not depend on it).

    Returns
    -------
    dict
        ``{"ar", "verify", "draft", "reject"}``: arrays of seconds, in the parameters' scale.
    """
    inputs = SpeedupInputs.build(B, gamma, K, E, 1.0, rp, verify_tokens)
    return inputs.stage_times(params)


def compute_speedup(params, B, gamma, K, E, sigma, rp, variant: str = "eq4", verify_tokens=None):
    """Algorithm 1's ``ComputeSpeedup``, vectorised over measurements.

    Parameters
    ----------
    params : SpeedupParams, dict or sequence of 10 floats
        See :class:`SpeedupParams`.
    B : array_like
        Batch size (sequences, >= 1).
    gamma : array_like
        Draft length (whole number >= 1).
    K, E : array_like
        Experts per token and routed experts per layer (whole numbers, 1 <= K <= E).
    sigma : array_like
        Measured sigma (Eq. 5), in [1/(gamma+1), 1].
    rp : float
        Ridge point in tokens (> 0): ``RP b / 2`` for a ridge point RP in FLOP/byte and weights of ``b``
        bytes (:func:`moesd.measure.analysis.ridge_tokens_for`), RP itself for bf16 as in the paper.
    variant : {"eq4", "printed"}
        The denominator: ``gamma draft + verify + reject`` (Eq. 4) or, as line 11 prints it,
        ``draft + ar + verify + reject``.
    verify_tokens : {"gamma", "gamma+1"} or array_like, optional
        Tokens per sequence in the verification forward: ``gamma`` as Algorithm 1 writes it (default)
        or ``gamma + 1`` as vLLM and :mod:`moesd.engine.sd` verify (or any numbers >= 1).

    Returns
    -------
    numpy.ndarray
        Predicted speedups, in the broadcast shape of the inputs.
    """
    if variant not in VARIANTS:
        raise UsageError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}", "variant")
    return SpeedupInputs.build(B, gamma, K, E, sigma, rp, verify_tokens).speedup(params, variant)


def printed_variant_ceiling(sigma, gamma):
    """The largest speedup line 11's printed denominator can give: ``sigma (gamma + 1) / 2``.

    With ``variant="printed"`` the denominator ``draft + ar + verify + reject`` holds ``ar`` and
    ``verify``, and ``verify >= ar`` for every parameter set: the verification forward carries at least
    as many tokens (``B gamma >= B``), and ``G``, ``N`` and the tokens per expert all grow with the
    tokens. So ``sigma (gamma + 1) ar / denominator <= sigma (gamma + 1) / 2``, whatever the fit. A
    measured speedup above it cannot be reproduced by that variant.

    Parameters
    ----------
    sigma : array_like
        sigma of Eq. 5, in [1/(gamma+1), 1].
    gamma : array_like
        Draft length (whole number >= 1).

    Returns
    -------
    numpy.ndarray or float
        The ceiling (dimensionless).
    """
    gamma = as_array("gamma", gamma, low=1, whole=True)
    sigma = as_array("sigma", sigma, low=0, low_open=True, high=1)
    return sigma * (gamma + 1) / 2


def denominator_weights(variant: str, gamma):
    """The weights of the draft and ar times in a variant's denominator, verify and reject weighing 1:
    ``(gamma, 0)`` for Eq. 4, ``(1, 1)`` for line 11 of Algorithm 1 as printed."""
    if variant == "eq4":
        return gamma, 0.0
    if variant == "printed":
        return 1.0, 1.0
    raise UsageError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}", "variant")
