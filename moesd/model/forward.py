"""The time of one forward pass of a whole model on its GPUs (beyond the paper): :func:`step_time`.

Seconds of one forward pass of ``B`` sequences with ``s`` new tokens each, summed over the model's
components (:data:`COMPONENTS`). Every weight matrix is a roofline at the achieved fractions of the
data-sheet peaks plus a fixed cost per kernel (:mod:`moesd.model.kernels`). Routed experts load the
``N(t)`` experts that ``t = B s`` tokens activate (Eq. 8, a measured popularity, or a
:class:`~moesd.routing.traces.RoutingTrace` whose consecutive tokens' correlation is kept, through
:func:`moesd.routing.loads.activated_experts`) and give each ``t K / N`` tokens (Eq. 10); attention reads
the KV cache of ``context`` tokens per sequence; tensor parallelism (TP) splits weights and FLOPs
(:mod:`moesd.model.layout`) and adds two all-reduces per layer priced by the interconnect (hierarchically,
through each GPU's network adapter, across nodes); expert parallelism (EP) splits the experts; DP-attention
runs the rest data-parallel and trades the all-reduces for two all-to-alls per MoE layer. :func:`zipf_popularity` is an illustrative skewed popularity to
route with.

The speedup built from these steps is :func:`moesd.model.predict.predict_sd`; the model fitted to a
measured forward study is :mod:`moesd.model.calibrate`.

Pure numpy; no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from moesd._checks import as_array
from moesd.model.kernels import (KERNELS, Efficiency, achieved_rates, grouped_gemm_roofline, per_expert_seconds,
                                 per_kernel_seconds, tensor_peak)
from moesd.model.layout import (DTYPE_BYTES, activation_bytes, attention_dtype, attention_per_gpu, check_dtype,
                                check_parallelism, ffn_dtype, kept_dtype, resolve_model)
from moesd.routing.loads import activated_experts
from moesd.routing.traces import RoutingTrace
from moesd.theory.experts import expected_active_experts, most_loaded_share
from moesd.theory.roofline import Hardware, hardware_record
from moesd.architecture import Architecture

__all__ = ["TRACE_ROUTING_MODELS", "COMPONENTS", "StepTime", "step_time", "zipf_popularity"]

TRACE_ROUTING_MODELS = ("windows", "popularity")
"""How :func:`step_time` reads a :class:`~moesd.routing.traces.RoutingTrace` (see :mod:`moesd.routing.loads`)."""
COMPONENTS = ("attention", "kv_cache", "router", "shared_experts", "routed_experts", "dense_ffn", "lm_head",
              "communication", "fixed")
"""The parts of a forward pass that :func:`step_time` times."""


@dataclass(frozen=True)
class StepTime:
    """One forward pass, per component (see :data:`COMPONENTS`).

    Attributes
    ----------
    seconds, bytes, flops : dict of str to numpy.ndarray
        Time (s), memory traffic per GPU (bytes) and FLOPs per GPU of each component, broadcast over
        the array arguments of :func:`step_time`.
    """

    seconds: dict
    bytes: dict
    flops: dict

    @property
    def total(self) -> np.ndarray:
        """Seconds of the whole forward pass."""
        return sum(self.seconds.values())

    def frame(self) -> pd.DataFrame:
        """The breakdown as a table (one row per component; arguments must be scalars)."""
        return pd.DataFrame({"seconds": {k: float(v) for k, v in self.seconds.items()},
                             "bytes": {k: float(v) for k, v in self.bytes.items()},
                             "flops": {k: float(v) for k, v in self.flops.items()}})


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
            raise ValueError(f"routing: the trace has E = {routing.num_experts} experts, {arch.name} has {E}")
        per_layer = activated_experts(routing, B, s, model=routing_model)  # (*B.shape, trace layers)
        if np.isnan(per_layer).any():
            raise ValueError(f"routing: some layer of the trace has no run of {int(s.max())} consecutive tokens of "
                             "one sequence (select its decode tokens, or use shorter drafts)")
        return np.moveaxis(per_layer, -1, 0)
    if callable(routing):
        active = np.asarray(routing(tokens), dtype=float)
        if active.shape not in ((), tokens.shape, (arch.moe_layers, *tokens.shape)):
            raise ValueError(f"routing(tokens) must return an array of shape {tokens.shape} (or one per MoE "
                             f"layer), got {active.shape}")
        if (active < 0).any() or (active > E).any() or np.isnan(active).any():
            raise ValueError(f"routing(tokens) must return expected activated experts in [0, {E}]")
        active = np.broadcast_to(active, np.broadcast_shapes(active.shape, tokens.shape))
        return active if active.ndim > tokens.ndim else active[None]
    p = as_array("routing", routing, low=0, high=1)
    if p.ndim not in (1, 2) or p.shape[-1] != E or (p.ndim == 2 and p.shape[0] not in (1, arch.moe_layers)):
        raise ValueError(f"routing must be a popularity vector of shape ({E},) or ({arch.moe_layers}, {E}) "
                         f"for {arch.name}, got shape {p.shape}")
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
            raise ValueError("top_k: a popularity vector or trace (routing) already sets experts per token")
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


def _link_bandwidth(hardware: Hardware, tp: int) -> float:
    """One direction's bandwidth of a GPU in a tensor-parallel group of ``tp`` (bytes/s): half the data
    sheet's two-way figure, of which a full mesh (``interconnect_peers``) gives the group ``tp - 1`` links."""
    bandwidth = hardware.interconnect_bandwidth / 2
    if hardware.interconnect_peers:
        bandwidth *= min(tp - 1, hardware.interconnect_peers) / hardware.interconnect_peers
    return bandwidth


def _collectives(arch: Architecture, hardware: Hardware, tokens, tp: int, a_bytes: int, latency: float):
    """Seconds and bytes per GPU of tensor parallelism's collectives: an all-reduce of the hidden states after the
    (vocabulary-split) embedding and two per layer, and a gather of the logits; none on one GPU.

    Within one node (``tp <= g``, ``g = Hardware.gpus_per_node``) a ring all-reduce of ``M = tokens d a_bytes``
    bytes takes ``latency + 2 (tp - 1) / tp M / b`` and the gather of the logits
    ``latency + (tp - 1) / tp tokens V a_bytes / b``, ``b`` one direction of a GPU's link (:func:`_link_bandwidth`).
    Over ``n = tp / g`` nodes the all-reduce is hierarchical: the node's reduce-scatter and all-gather (the
    in-node all-reduce of ``g`` GPUs), and between them an all-reduce (ring) of each GPU's shard ``M / g`` with
    its peers on the other nodes through its own network adapter (``b_net = Hardware.internode_bandwidth`` one
    way, ``L_net = Hardware.internode_latency``)::

        latency + 2 (g - 1) / g M / b + L_net + 2 (n - 1) / n M / (g b_net)

    and the gather of the logits gathers each GPU's share ``S = tokens V a_bytes / tp`` from its peers on the
    other nodes, then the node's ``n S`` per GPU over the node's link:
    ``L_net + (n - 1) S / b_net + latency + (g - 1) / g tokens V a_bytes / b``.
    """
    if tp == 1:
        zero = np.zeros_like(tokens)
        return zero, zero
    per_node = min(tp, hardware.gpus_per_node)
    nodes = tp // per_node
    one_way = _link_bandwidth(hardware, per_node)
    ring = 2 * (per_node - 1) / per_node
    all_reduces = 2 * arch.num_layers + 1
    all_reduce = latency + ring * tokens * arch.hidden_size * a_bytes / one_way
    gather = latency + (per_node - 1) / per_node * tokens * arch.vocab_size * a_bytes / one_way
    traffic = all_reduces * ring * tokens * arch.hidden_size * a_bytes
    if nodes > 1:
        shard = 2 * (nodes - 1) / nodes * tokens * arch.hidden_size * a_bytes / per_node
        all_reduce = all_reduce + hardware.internode_latency + shard / hardware.internode_bandwidth
        gather = gather + hardware.internode_latency + (nodes - 1) / tp * tokens * arch.vocab_size * a_bytes \
            / hardware.internode_bandwidth
        traffic = traffic + all_reduces * shard
    return all_reduces * all_reduce + gather, traffic


def _all_to_alls(arch: Architecture, hardware: Hardware, local_tokens, K, tp: int, a_bytes: int, latency: float):
    """Seconds and bytes per GPU of expert parallelism's all-to-alls under DP-attention: in every MoE layer a
    dispatch of each of a GPU's ``local_tokens`` hidden states to the GPUs of its ``K`` experts, and a combine
    that brings them back; none on one GPU.

    A GPU sends ``C = local_tokens K d a_bytes`` bytes (one copy per token and expert, as DeepEP's low-latency
    kernels send them), of which uniform routing keeps ``C / tp`` on the GPU itself. Within one node (``tp <= g``)
    one all-to-all takes ``latency + (tp - 1) / tp C / b`` (``b``: one direction of the node's link,
    :func:`_link_bandwidth`); across ``tp / g`` nodes the share ``(g - 1) / tp`` goes over the node's link and
    ``(tp - g) / tp`` through the GPU's network adapter at the same time:
    ``L_net + max((g - 1) / tp C / b, (tp - g) / tp C / b_net)``. Both directions carry activations
    (``a_bytes``; DeepEP's fp8 dispatch, which halves the first, is not modelled). The latencies are the
    records' all-reduce latencies (assumed; DeepEP's README and its PR #173 time one dispatch of 128 tokens
    of 7168 values to top-8 experts at 37 us on eight NVLink H20s and 118 us on 16 H800s over 400 Gb/s
    RDMA, mostly bandwidth).
    """
    if tp == 1:
        zero = np.zeros_like(local_tokens)
        return zero, zero
    per_node = min(tp, hardware.gpus_per_node)
    copies = local_tokens * K * arch.hidden_size * a_bytes
    in_node, across = (per_node - 1) / tp * copies, (tp - per_node) / tp * copies
    one_way = _link_bandwidth(hardware, per_node)
    seconds = (latency + in_node / one_way if tp == per_node else hardware.internode_latency
               + np.maximum(in_node / one_way, across / hardware.internode_bandwidth))
    return 2 * arch.moe_layers * seconds, 2 * arch.moe_layers * (in_node + across)


def _experts_per_token(arch: Architecture, routing, top_k, routing_model: str) -> np.ndarray:
    """Check :func:`step_time`'s routing arguments; the experts per token ``K`` they give (0 for a dense model)."""
    if routing is not None and not arch.num_experts:
        raise ValueError(f"routing: {arch.name} is dense")
    if top_k is not None and not arch.num_experts:
        raise ValueError(f"top_k: {arch.name} is dense")
    if routing_model not in TRACE_ROUTING_MODELS:
        raise ValueError(f"routing_model must be one of {TRACE_ROUTING_MODELS}, got {routing_model!r}")
    return _routing_top_k(arch, routing, top_k) if arch.num_experts else np.asarray(0.0)


def _kv_cache(arch: Architecture, B, tokens, context, kv_share: float, tp: int, a_bytes: int, bandwidth: float,
              flops_rate: float):
    """Seconds, bytes and FLOPs per GPU of attention over the KV cache of ``context`` tokens per sequence.

    The cache is read once per sequence, whatever its number of new tokens (sliding-window layers read at
    most their window); ``kv_share`` is the share of KV heads one GPU keeps (:func:`attention_per_gpu`),
    ``a_bytes`` the bytes per cached value, ``bandwidth`` and ``flops_rate`` the achieved bytes/s and
    FLOP/s.
    """
    layers_full = arch.num_layers - arch.sliding_layers
    keys = layers_full * context + arch.sliding_layers * np.minimum(context, arch.sliding_window or 0)
    kv_bytes = B * keys * arch.kv_values_per_token * kv_share * a_bytes
    kv_flops = tokens * keys * arch.attention_flops_per_key / tp
    return np.maximum(kv_bytes / bandwidth, kv_flops / flops_rate), kv_bytes, kv_flops


def _moe_layers(arch: Architecture, hardware: Hardware, gemm, split: int, dtype: str, B, s, K, tp: int, ep: int,
                efficiency: Efficiency, routing, routing_model: str, grouped_kernel_seconds, cuda_graphs: bool) -> dict:
    """Seconds, bytes and FLOPs per GPU of the MoE layers' router, shared experts and routed experts.

    ``gemm`` prices a dense product over one GPU's tokens (:func:`step_time`'s); the router runs on every
    GPU, the shared experts are split over ``split`` GPUs, the routed experts over ``tp`` (``ep`` of them
    dealing whole experts).
    """
    d = arch.hidden_size
    parts = {"router": gemm(arch.router_params, KERNELS["router"], arch.moe_layers, d, kept_dtype(dtype))}
    if arch.shared_params:
        kernels = KERNELS["shared"] + (KERNELS["shared_gate"] if arch.model_type == "qwen2_moe" else 0)
        parts["shared_experts"] = gemm(arch.shared_params / split, kernels + KERNELS["moe_norm"], arch.moe_layers,
                                       2 * d, ffn_dtype(dtype))
    active = _active_experts(arch, B, s, K, routing, routing_model)  # (layers or 1, ...)
    parts["routed_experts"] = _routed_experts(arch, hardware, active, s * B, K, tp, ep, dtype, efficiency,
                                              grouped_kernel_seconds, cuda_graphs)
    return parts


def _attention_rates(hardware: Hardware, efficiency: Efficiency, bandwidth: float, flops_rate: float,
                     dtype: str) -> tuple[float, float]:
    """Bytes/s and FLOP/s of the decode attention kernel: ``Efficiency.attention_*_fraction`` of the data sheet's
    bandwidth and ``dtype``'s tensor peak where set, else the achieved rates given."""
    if efficiency.attention_bandwidth_fraction is not None:
        bandwidth = hardware.memory_bandwidth * efficiency.attention_bandwidth_fraction
    if efficiency.attention_flops_fraction is not None:
        flops_rate = tensor_peak(hardware, dtype) * efficiency.attention_flops_fraction
    return bandwidth, flops_rate


def step_time(model, hardware, tokens_per_sequence, batch_size, context=0, tp=1, ep=1, dtype="bf16",
              routing=None, cuda_graphs=True, top_k=None, efficiency: Efficiency | None = None,
              grouped_experts=True, routing_model="windows", dp_attention=False) -> StepTime:
    """Seconds of one forward pass of ``batch_size`` sequences with ``tokens_per_sequence`` new tokens.

    Summed per layer over the attention projections (GQA or MLA), the KV-cache reads of ``context``
    cached tokens per sequence, the router, shared experts, routed experts (``N(t)`` activated experts
    for ``t = B s`` tokens, each with ``t K / N`` tokens), the dense FFNs of dense layers, and the LM head
    (logits for every new token). Each is a roofline at the achieved fractions of the data-sheet
    peaks plus a fixed cost per kernel; see :class:`Efficiency`.

    With ``tp`` GPUs the attention heads, FFN widths and vocabulary are split (KV heads are replicated
    when fewer than ``tp``; MLA's latent projections and cache are replicated), and every layer adds
    two all-reduces of the hidden states (after attention and after the FFN), priced as
    ``latency + 2 (tp - 1) / tp x bytes / (one-way link bandwidth)``, plus one after the embedding and
    one gather of the logits; a full mesh of links (``Hardware.interconnect_peers``) gives a group of
    ``tp`` GPUs ``tp - 1`` of its links. With ``dtype="fp8"`` the router, LM head and norms stay bf16
    and attention over the (bf16) KV cache runs at the bf16 rate.
    With ``ep`` > 1 the routed experts are dealt to ``ep`` of the ``tp`` GPUs (each keeps ``E / ep`` whole
    experts, widths split ``tp / ep`` ways), and the step waits for the GPU that loads the most activated
    experts: :func:`moesd.theory.experts.most_loaded_share` of ``N`` (above ``N / ep`` at small batches).
    Beyond one node (``tp`` a multiple of ``Hardware.gpus_per_node``) the all-reduces are hierarchical, with
    each GPU's shard reduced across nodes through its network adapter (:func:`_collectives`).
    With ``dp_attention`` (SGLang's ``--enable-dp-attention`` with expert parallelism, DeepSeek-style) each
    of the ``tp`` GPUs runs attention, the dense FFNs, the shared experts and the LM head, unsplit, on
    ``ceil(B / tp)`` of the sequences (the step waits for the fullest), and the routed experts are dealt
    over all ``tp`` GPUs (``ep = tp``, ``E / tp`` whole experts each, the most loaded GPU as above); instead
    of the all-reduces every MoE layer dispatches its tokens to their experts' GPUs and combines them back
    (:func:`_all_to_alls`). On one GPU it is the plain step.

    Parameters
    ----------
    model : str, ModelSpec or Architecture
        The model (a :data:`moesd.zoo.MODELS` name, a record, or a scaled ``Architecture``).
    hardware : str or Hardware
        The device (one of ``tp`` identical GPUs).
    tokens_per_sequence : array_like
        New tokens per sequence ``s`` (>= 1): 1 for a decode step, ``gamma + 1`` for verification.
    batch_size : array_like
        Sequences ``B`` (>= 1).
    context : array_like, default 0
        Tokens already in each sequence's KV cache (>= 0).
    tp, ep : int, default 1
        Tensor-parallel GPUs (with ``dp_attention``: the data- and expert-parallel GPUs) and the
        expert-parallel degree (``ep`` divides ``tp``; with ``dp_attention`` 1 or ``tp``, taken as ``tp``).
    dtype : {"bf16", "fp8", "fp32", "w4a8", "mxfp4", "nvfp4"}
        Weight dtype; the 4-bit ones quantise the routed experts only
        (:func:`~moesd.model.layout.attention_dtype` and :func:`~moesd.model.layout.ffn_dtype` give
        the other weights').
    routing : array_like, callable, RoutingTrace or str, optional
        The name of a shipped trained router (:func:`moesd.routing.sources.names`, e.g. ``"olmoe/c4"``: its
        per-layer popularity, MoE layer ``i`` taking recorded layer ``i mod n``); expert popularity, shape
        ``(E,)`` or ``(moe_layers, E)``, each row summing to ``K`` (uses
        :func:`moesd.theory.experts.expected_active_experts_from_popularity`); a function of the token
        count returning ``N(tokens)``; or a :class:`~moesd.routing.traces.RoutingTrace` of the model's routing
        (its ``E``; its ``K`` replaces the model's), read as ``routing_model`` says through
        :func:`moesd.routing.loads.activated_experts`. A trace of some layers stands for every MoE layer by
        their mean. Default: uniform routing, Eq. 8.
    cuda_graphs : bool, default True
        Whether the engine replays CUDA graphs (else every kernel adds a launch cost).
    top_k : array_like, optional
        Experts per token ``K`` instead of the model's (the paper's sparsity sweep).
    efficiency : Efficiency, optional
        Achieved fractions and overheads (default :class:`Efficiency`).
    grouped_experts : bool, default True
        Routed experts run as grouped GEMMs (vLLM, SGLang); False: one matrix product per activated
        expert (Hugging Face's eager loop).
    routing_model : {"windows", "popularity"}, default "windows"
        How a trace gives ``N``: ``"windows"``, sequences independent and each sequence's ``s``
        consecutive tokens activating expert ``e`` with the chance measured on the trace's runs of
        ``s`` tokens (the correlation of a verification's drafts kept); ``"popularity"``, every token
        independent with the measured expert shares. Pass a trace of decode tokens
        (``trace.select(trace.phase == "decode")``): verification runs over generated tokens.

    dp_attention : bool, default False
        Attention and the other weights besides the routed experts data-parallel over the ``tp`` GPUs, the
        routed experts expert-parallel over them (MoE models only).

    Returns
    -------
    StepTime
        Seconds, bytes and FLOPs per component; ``.total`` is the forward pass in seconds.
    """
    arch = resolve_model(model)
    if isinstance(routing, str):  # a shipped trained router by name, mapped onto the model's MoE layers
        from moesd.routing.sources import popularity

        routing = popularity(routing, max(arch.moe_layers, 1))
    hardware = hardware_record(hardware)
    efficiency = efficiency or Efficiency()
    dtype = check_dtype(dtype)
    s = as_array("tokens_per_sequence", tokens_per_sequence, low=1, whole=True)
    B = as_array("batch_size", batch_size, low=1, whole=True)
    context = as_array("context", context, low=0, whole=True)
    tp, ep = check_parallelism(arch, hardware, tp, ep, dp_attention)
    K = _experts_per_token(arch, routing, top_k, routing_model)
    s, B, context, K = np.broadcast_arrays(s, B, context, K)
    tokens = s * B
    # the GPUs the weights besides the routed experts are split over, and one GPU's sequences and tokens
    split, seqs = (1, -(-B // tp)) if dp_attention else (tp, B)
    local = s * seqs
    a_bytes = activation_bytes(dtype)
    # fp8 checkpoints (DeepSeek-V3's, vLLM's fp8 quantisation) keep the router, the embeddings, the LM head
    # and the norms in bf16, and attention over the bf16 KV cache runs at the bf16 rate
    kept = kept_dtype(dtype)
    bandwidth, kept_rate = achieved_rates(hardware, kept, efficiency)
    per_kernel = per_kernel_seconds(efficiency, cuda_graphs)
    d = arch.hidden_size

    def gemm(params, kernels, layers, in_out, weights_dtype):
        """Roofline of ``layers`` matrix products of ``params`` weights per GPU over the GPU's tokens."""
        weight_bytes = params * DTYPE_BYTES[weights_dtype]
        activation = local * in_out * a_bytes
        flops = 2.0 * params * local
        rate = achieved_rates(hardware, weights_dtype, efficiency)[1]
        seconds = np.maximum((weight_bytes + activation) / bandwidth, flops / rate) + kernels * per_kernel
        return layers * seconds, layers * (weight_bytes + activation), layers * flops

    seconds, traffic, flops = {}, {}, {}

    attention_params, kv_share = attention_per_gpu(arch, split)
    seconds["attention"], traffic["attention"], flops["attention"] = gemm(
        attention_params, KERNELS[arch.attention], arch.num_layers, 2 * d, attention_dtype(dtype))

    seconds["kv_cache"], traffic["kv_cache"], flops["kv_cache"] = _kv_cache(
        arch, seqs, local, context, kv_share, split, a_bytes, *_attention_rates(
            hardware, efficiency, bandwidth, kept_rate, kept))

    zero = np.zeros_like(tokens)
    for name in ("router", "shared_experts", "routed_experts", "dense_ffn"):
        seconds[name], traffic[name], flops[name] = zero, zero, zero
    if arch.moe_layers:
        moe = _moe_layers(arch, hardware, gemm, split, dtype, B, s, K, tp, ep, efficiency, routing, routing_model,
                          per_kernel if grouped_experts else None, cuda_graphs)
        for name, (time, moved, work) in moe.items():
            seconds[name], traffic[name], flops[name] = time, moved, work
    if arch.dense_layers:
        seconds["dense_ffn"], traffic["dense_ffn"], flops["dense_ffn"] = gemm(
            arch.dense_ffn_params / split, KERNELS["dense_ffn"], arch.dense_layers, 2 * d, ffn_dtype(dtype))

    # LM head over every new token (vocabulary split over tp, unless dp_attention).
    seconds["lm_head"], traffic["lm_head"], flops["lm_head"] = gemm(
        arch.head_params / split, KERNELS["head"], 1, d + arch.vocab_size / split, kept)

    latency = hardware.interconnect_latency
    seconds["communication"], traffic["communication"] = (
        _all_to_alls(arch, hardware, local, K, tp, a_bytes, latency) if dp_attention
        else _collectives(arch, hardware, tokens, tp, a_bytes, latency))
    flops["communication"] = zero

    # Per pass: the engine's own step, the embedding lookup and the norms' weights.
    norms = (arch.num_layers * arch.norm_params + arch.final_norm_params) * DTYPE_BYTES[kept]
    traffic["fixed"] = norms + local * d * a_bytes
    seconds["fixed"] = efficiency.step_seconds + traffic["fixed"] / bandwidth + per_kernel
    flops["fixed"] = zero
    broadcast = {k: np.broadcast_to(v, tokens.shape) * 1.0 for k, v in seconds.items()}
    return StepTime(seconds={k: broadcast[k] for k in COMPONENTS},
                    bytes={k: np.broadcast_to(traffic[k], tokens.shape) * 1.0 for k in COMPONENTS},
                    flops={k: np.broadcast_to(flops[k], tokens.shape) * 1.0 for k in COMPONENTS})
