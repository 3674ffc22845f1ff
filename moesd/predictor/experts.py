"""Routed experts in a forward pass (beyond the paper): how many a pass activates and what they cost.

:func:`experts_per_token` checks a pass's routing arguments; :func:`moe_layers_time` prices the router, shared and
routed experts of every MoE layer for :func:`moesd.predictor.forward.step_time`. Routed experts load the ``N(t)``
experts that ``t = B s`` tokens activate (Eq. 8, a measured popularity, or a
:class:`~moesd.routing.traces.RoutingTrace` whose consecutive tokens' correlation is kept, through
:func:`moesd.routing.loads.activated_experts`) and give each ``t K / N`` tokens (Eq. 10).
:func:`zipf_popularity` is an illustrative skewed popularity to route with.

Pure numpy; no torch.
"""

from __future__ import annotations

import numpy as np

from moesd._checks import UsageError, as_array
from moesd.architecture import Architecture
from moesd.predictor.kernels import KERNELS, Efficiency, grouped_gemm_roofline, per_expert_seconds
from moesd.predictor.layout import DTYPE_BYTES, activation_bytes, ffn_dtype, kept_dtype
from moesd.routing.loads import activated_experts
from moesd.routing.traces import RoutingTrace
from moesd.theory.experts import expected_active_experts, most_loaded_share
from moesd.theory.roofline import Hardware

__all__ = ["TRACE_ROUTING_MODELS", "experts_per_token", "moe_layers_time", "zipf_popularity"]

TRACE_ROUTING_MODELS = ("windows", "popularity")
"""How :func:`moesd.predictor.forward.step_time` reads a :class:`~moesd.routing.traces.RoutingTrace` (see
:mod:`moesd.routing.loads`)."""


def _active_experts(arch: Architecture, B: np.ndarray, s: np.ndarray, top_k: np.ndarray, routing,
                    routing_model: str) -> np.ndarray:
    """Expected activated experts per MoE layer for ``B`` sequences x ``s`` tokens: shape ``(layers or 1, *B.shape)``.

    A trace or a popularity vector is read by :func:`moesd.routing.loads.activated_experts` (its
    ``"windows"`` or ``"popularity"`` model); uniform routing is Eq. 8
    (:func:`moesd.theory.experts.expected_active_experts`) at each point's own ``K``, which may vary over a
    grid (``top_k``), where ``activated_experts``'s ``"uniform"`` takes one ``K`` from its source; a
    function of the token count is called as it is.
    """
    E = arch.num_experts
    tokens = B * s
    if routing is None:
        return expected_active_experts(tokens, E, top_k)[None]
    if isinstance(routing, RoutingTrace):
        if routing.num_experts != E:
            raise UsageError(f"routing: the trace has E = {routing.num_experts} experts, {arch.name} has {E}", "routing")
        per_layer = activated_experts(routing, B, s, model=routing_model)  # (*B.shape, trace layers)
        if np.isnan(per_layer).any():
            raise UsageError(f"routing: some layer of the trace has no run of {int(s.max())} consecutive tokens of "
                             "one sequence (select its decode tokens, or use shorter drafts)", "routing")
        return np.moveaxis(per_layer, -1, 0)
    if callable(routing):
        active = np.asarray(routing(tokens), dtype=float)
        if active.shape not in ((), tokens.shape, (arch.moe_layers, *tokens.shape)):
            raise UsageError(f"routing(tokens) must return an array of shape {tokens.shape} (or one per MoE "
                             f"layer), got {active.shape}", "routing")
        if (active < 0).any() or (active > E).any() or np.isnan(active).any():
            raise UsageError(f"routing(tokens) must return expected activated experts in [0, {E}]", "routing")
        active = np.broadcast_to(active, np.broadcast_shapes(active.shape, tokens.shape))
        return active if active.ndim > tokens.ndim else active[None]
    p = as_array("routing", routing, low=0, high=1)
    if p.ndim not in (1, 2) or p.shape[-1] != E or (p.ndim == 2 and p.shape[0] not in (1, arch.moe_layers)):
        raise UsageError(f"routing must be a popularity vector of shape ({E},) or ({arch.moe_layers}, {E}) "
                         f"for {arch.name}, got shape {p.shape}", "routing")
    unique, inverse = np.unique(tokens, return_inverse=True)  # each token count once
    per_layer = activated_experts(p, unique, model="popularity")  # (unique, layers)
    return np.moveaxis(per_layer[inverse.reshape(tokens.shape)], -1, 0)


def zipf_popularity(num_experts, top_k, exponent=1.0) -> np.ndarray:
    """An illustrative skewed expert popularity: ``p_i`` proportional to ``i ** -exponent``, summing to ``K``.

    Probabilities above 1 (an expert cannot be chosen twice by one token) are capped at 1 and the rest
    rescaled until the vector sums to ``top_k``. A stand-in for a measured popularity
    (:class:`moesd.routing.traces.RoutingTrace`), not a property of any real model.

    Returns
    -------
    numpy.ndarray
        Shape ``(num_experts,)``, each in (0, 1], summing to ``top_k``.
    """
    E = int(as_array("num_experts", num_experts, low=1, whole=True))
    K = int(as_array("top_k", top_k, low=1, high=E, whole=True))
    exponent = float(as_array("exponent", exponent, low=0))
    p = np.arange(1, E + 1, dtype=float) ** -exponent
    capped = np.zeros(E, dtype=bool)
    for _ in range(E):
        free = K - capped.sum()
        p = np.where(capped, 1.0, p / p[~capped].sum() * free)
        if (p[~capped] <= 1.0).all():
            break
        capped |= p > 1.0
    return p


def _routing_top_k(arch: Architecture, routing, top_k):
    """Experts per token: ``top_k`` if given, a trace's or a popularity vector's (its sum), else the model's."""
    if top_k is not None:
        if routing is not None and not callable(routing):
            raise UsageError("top_k: a popularity vector or trace (routing) already sets experts per token", "top_k")
        return as_array("top_k", top_k, low=1, high=arch.num_experts, whole=True)
    if isinstance(routing, RoutingTrace):
        return np.asarray(float(routing.top_k))
    if routing is not None and not callable(routing):
        p = np.asarray(routing, dtype=float)
        return np.asarray(float(np.round(p.reshape(-1, p.shape[-1]).sum(axis=-1).mean())))
    return np.asarray(float(arch.top_k))


def _routed_experts(arch: Architecture, hardware: Hardware, active, tokens, K, tp: int, ep: int, dtype: str,
                    efficiency: Efficiency, grouped_kernel_seconds, cuda_graphs: bool):
    """Seconds, bytes and FLOPs per GPU of the routed experts of every MoE layer.

    ``active`` holds the activated experts ``N`` per traced layer (or one row for all); each gets
    ``tokens K / N`` tokens. Grouped GEMMs (``grouped_kernel_seconds``, the cost of one kernel) add a fixed
    number of kernels per layer; an eager loop (None) a fixed cost per activated expert.
    """
    d, w_bytes, a_bytes = arch.hidden_size, DTYPE_BYTES[dtype], activation_bytes(dtype)
    layer_weight = arch.moe_layers / active.shape[0]
    width = arch.expert_intermediate / (tp // ep)
    local = most_loaded_share(active, arch.num_experts, ep)  # the step waits for the most loaded GPU
    per_expert = tokens * K / np.maximum(active, 1e-12)
    above = efficiency.expert_tile_rows_above
    tile = efficiency.expert_tile_rows if above is None else np.where(tokens > arch.num_experts, above,
                                                                      efficiency.expert_tile_rows)
    gemm_seconds = sum(grouped_gemm_roofline(hardware, local, per_expert, i, o, dtype, efficiency, tile)
                       for i, o in ((d, 2 * width), (width, d)))
    fixed = ((2 + KERNELS["routed"]) * grouped_kernel_seconds if grouped_kernel_seconds is not None
             else np.ceil(local) * per_expert_seconds(efficiency, cuda_graphs))
    seconds = layer_weight * (gemm_seconds + fixed).sum(axis=0)
    # activations read and written by the two products: d in, 2 width out; width in, d out
    traffic = layer_weight * (local * 3 * d * width * w_bytes + tokens * K / ep * (2 * d + 3 * width) * a_bytes).sum(axis=0)
    return seconds, traffic, arch.moe_layers * 2.0 * tokens * K / ep * 3 * d * width


def experts_per_token(arch: Architecture, routing, top_k, routing_model: str) -> np.ndarray:
    """Check :func:`step_time`'s routing arguments; the experts per token ``K`` they give (0 for a dense model)."""
    if routing is not None and not arch.num_experts:
        raise UsageError(f"routing: {arch.name} is dense", "routing")
    if top_k is not None and not arch.num_experts:
        raise UsageError(f"top_k: {arch.name} is dense", "top_k")
    if routing_model not in TRACE_ROUTING_MODELS:
        raise UsageError(f"routing_model must be one of {TRACE_ROUTING_MODELS}, got {routing_model!r}", "routing_model")
    return _routing_top_k(arch, routing, top_k) if arch.num_experts else np.asarray(0.0)


def moe_layers_time(arch: Architecture, hardware: Hardware, gemm, split: int, dtype: str, B, s, K, tp: int, ep: int,
                efficiency: Efficiency, routing, routing_model: str, grouped_kernel_seconds, cuda_graphs: bool) -> dict:
    """Seconds, bytes and FLOPs per GPU of the MoE layers' router, shared experts and routed experts.

    ``gemm`` prices a dense product over one GPU's tokens (:func:`step_time`'s); the router runs on every
    GPU, the shared experts are split over ``split`` GPUs, the routed experts over ``tp`` (``ep`` of them
    dealing whole experts).
    """
    d = arch.hidden_size
    parts = {"router": gemm(arch.router_params, KERNELS["router"], arch.moe_layers, d, kept_dtype(dtype))}
    if arch.shared_params:
        kernels = KERNELS["shared"] + (KERNELS["shared_gate"] if arch.model_type in ("qwen2_moe", "qwen3_next") else 0)
        parts["shared_experts"] = gemm(arch.shared_params / split, kernels + KERNELS["moe_norm"], arch.moe_layers,
                                       2 * d, ffn_dtype(dtype))
    active = _active_experts(arch, B, s, K, routing, routing_model)  # (layers or 1, ...)
    parts["routed_experts"] = _routed_experts(arch, hardware, active, s * B, K, tp, ep, dtype, efficiency,
                                              grouped_kernel_seconds, cuda_graphs)
    return parts
