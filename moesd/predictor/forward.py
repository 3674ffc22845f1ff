"""The time of one forward pass of a whole model on its GPUs (beyond the paper): :func:`step_time`.

Seconds of one forward pass of ``B`` sequences with ``s`` new tokens each, summed over the model's
components (:data:`COMPONENTS`). Every weight matrix is a roofline at the achieved fractions of the
data-sheet peaks plus a fixed cost per kernel (:mod:`moesd.predictor.kernels`). Routed experts load the
``N(t)`` experts that ``t = B s`` tokens activate (Eq. 8, a measured popularity, or a
:class:`~moesd.routing.traces.RoutingTrace` whose consecutive tokens' correlation is kept, through
:func:`moesd.routing.loads.activated_experts`) and give each ``t K / N`` tokens (Eq. 10); attention reads
the KV cache of ``context`` tokens per sequence; tensor parallelism (TP) splits weights and FLOPs
(:mod:`moesd.predictor.layout`) and adds two all-reduces per layer priced by the interconnect (hierarchically,
through each GPU's network adapter, across nodes); expert parallelism (EP) splits the experts; DP-attention
runs the rest data-parallel and trades the all-reduces for two all-to-alls per MoE layer. The routed experts are
:mod:`moesd.predictor.experts`' (with :func:`zipf_popularity`, an illustrative skewed popularity to route with), the
collectives :mod:`moesd.predictor.collectives`'.

The speedup built from these steps is :func:`moesd.predictor.predict.predict_sd`; the model fitted to a
measured forward study is :mod:`moesd.model.calibrate`.

Pure numpy; no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from moesd._checks import as_array
from moesd.predictor.collectives import all_to_alls, collectives
from moesd.predictor.experts import TRACE_ROUTING_MODELS, experts_per_token, moe_layers_time, zipf_popularity
from moesd.predictor.kernels import KERNELS, Efficiency, achieved_rates, per_kernel_seconds, tensor_peak
from moesd.predictor.layout import (DTYPE_BYTES, KV_DTYPES, activation_bytes, attention_dtype, attention_per_gpu,
                                    check_dtype, check_kv_dtype, check_parallelism, ffn_dtype, kept_dtype)
from moesd.predictor.models import resolve_model
from moesd.theory.roofline import Hardware, hardware_record
from moesd.architecture import Architecture

__all__ = ["TRACE_ROUTING_MODELS", "COMPONENTS", "StepTime", "step_time", "zipf_popularity"]

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

    def table(self) -> pd.DataFrame:
        """:meth:`frame` in the units a reader compares: ``ms``, ``GB per GPU`` and ``GFLOP per GPU``."""
        frame = self.frame()
        return pd.DataFrame({"ms": 1e3 * frame["seconds"], "GB per GPU": frame["bytes"] / 1e9,
                             "GFLOP per GPU": frame["flops"] / 1e9})


def _kv_cache(arch: Architecture, B, tokens, context, kv_share: float, tp: int, value_bytes: float, state_bytes: int,
              bandwidth: float, flops_rate: float):
    """Seconds, bytes and FLOPs per GPU of attention over the KV cache of ``context`` tokens per sequence.

    The cache is read once per sequence, whatever its number of new tokens (sliding-window and chunked layers read
    at most their window, a sparse-attention layer the keys its queries select); ``kv_share`` is the share of KV
    heads one GPU keeps (:func:`attention_per_gpu`), ``value_bytes`` the bytes per cached value (the KV-cache
    dtype's), ``bandwidth`` and ``flops_rate`` the achieved bytes/s and FLOP/s. DeepSeek Sparse Attention's
    indexer reads its fp8 key cache of every cached token (with an fp32 scale per 128 values, as
    deepseek-ai/DeepSeek-V3.2-Exp inference/model.py keeps it) and scores each against every new token; attention
    then reads the ``index_topk`` keys each new token selects. A linear-attention layer reads and writes its
    recurrent state (``state_bytes`` per value) once per sequence, about three multiply-adds per state value and
    token.
    """
    s = tokens / B
    windowed, full = arch.sliding_layers, arch.full_layers - arch.sliding_layers
    read = context if not arch.index_topk else np.minimum(context, s * arch.index_topk)
    attended = context if not arch.index_topk else np.minimum(context, arch.index_topk)
    window = np.minimum(context, arch.sliding_window or 0)
    kv_bytes = B * (full * read + windowed * window) * arch.kv_values_per_token * kv_share * value_bytes
    kv_flops = tokens * (full * attended + windowed * window) * arch.attention_flops_per_key / tp
    if arch.index_topk:
        index = arch.index_values_per_token
        kv_bytes = kv_bytes + B * arch.num_layers * context * (index + 4 * index / 128)
        kv_flops = kv_flops + tokens * arch.num_layers * context * arch.index_flops_per_key / tp
    if arch.linear_layers:
        kv_bytes = kv_bytes + 2 * B * arch.linear_layers * arch.linear_state_values / tp * state_bytes
        kv_flops = kv_flops + tokens * arch.linear_layers * 6 * arch.linear_state_values / tp
    return np.maximum(kv_bytes / bandwidth, kv_flops / flops_rate), kv_bytes, kv_flops


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
              grouped_experts=True, routing_model="windows", dp_attention=False, kv_dtype=None) -> StepTime:
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
    and attention over the (bf16) KV cache runs at the bf16 rate. A draft head's fusing projection
    (``Architecture.fuse_params``) is one more product per pass.
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
        (:func:`~moesd.predictor.layout.attention_dtype` and :func:`~moesd.predictor.layout.ffn_dtype` give
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
    kv_dtype : {"bf16", "fp8", "fp32"}, optional
        The KV cache's dtype (:data:`~moesd.predictor.layout.KV_DTYPES`; default: the activations', bf16 or fp32):
        an fp8 cache halves the bytes its reads move; attention still multiplies at the bf16 rate.

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
    K = experts_per_token(arch, routing, top_k, routing_model)
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
    # no attention (Medusa heads): no kernels; a head's fusing projection (an MTP module's eh_proj): one product
    attention = gemm(attention_params, KERNELS[arch.attention] if arch.num_kv_heads else 0, arch.full_layers, 2 * d,
                     attention_dtype(dtype))
    if arch.fuse_params:
        fuse = gemm(arch.fuse_params / split, 1, 1, 3 * d, attention_dtype(dtype))
        attention = tuple(a + b for a, b in zip(attention, fuse))
    if arch.linear_layers or arch.index_params:  # linear-attention layers; a sparse-attention indexer
        linear = gemm(arch.linear_params / split, KERNELS["linear"], arch.linear_layers, 2 * d, attention_dtype(dtype))
        index = gemm(arch.index_params / split, KERNELS["index"], arch.num_layers, d, attention_dtype(dtype))
        attention = tuple(a + b + c for a, b, c in zip(attention, linear, index))
    seconds["attention"], traffic["attention"], flops["attention"] = attention

    value_bytes = KV_DTYPES[check_kv_dtype(kv_dtype, dtype)]
    seconds["kv_cache"], traffic["kv_cache"], flops["kv_cache"] = _kv_cache(
        arch, seqs, local, context, kv_share, split, value_bytes, a_bytes, *_attention_rates(
            hardware, efficiency, bandwidth, kept_rate, kept))

    zero = np.zeros_like(tokens)
    for name in ("router", "shared_experts", "routed_experts", "dense_ffn"):
        seconds[name], traffic[name], flops[name] = zero, zero, zero
    if arch.moe_layers:
        moe = moe_layers_time(arch, hardware, gemm, split, dtype, B, s, K, tp, ep, efficiency, routing, routing_model,
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
        all_to_alls(arch, hardware, local, K, tp, a_bytes, latency) if dp_attention
        else collectives(arch, hardware, tokens, tp, a_bytes, latency))
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
