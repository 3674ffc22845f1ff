"""How a model lies on its GPUs: weight dtypes, model and hardware records, parallel sizes, weights per GPU.

The layout half of the whole-model performance model (beyond the paper): :func:`resolve_model` and
:func:`hardware_record` turn names into :class:`~moesd.zoo.Architecture` and
:class:`~moesd.theory.roofline.Hardware` records; :data:`DTYPE_BYTES` and :func:`check_dtype` name the weight
dtypes (fp8 checkpoints keep the router, embeddings, LM head and norms in bf16: :func:`kept_dtype`);
:func:`tensor_parallel_sizes` and :func:`check_parallelism` say which tensor- and expert-parallel sizes a
model takes on a node or on whole nodes; :func:`attention_per_gpu` and :func:`weights_per_gpu` split the weights over ``tp``
GPUs as :func:`moesd.predictor.forward.step_time` prices them; :func:`one_layer_draft` builds an MTP-sized draft.
Memory with the KV cache is :func:`moesd.predictor.predict.memory_per_gpu`.

Pure numpy; no torch.
"""

from __future__ import annotations


import numpy as np

from moesd._checks import UsageError, as_array
from moesd.theory.roofline import Hardware, hardware_record
from moesd.architecture import Architecture
from moesd.predictor.models import resolve_model

__all__ = ["DTYPE_BYTES", "KV_DTYPES", "check_dtype", "check_kv_dtype", "attention_dtype", "ffn_dtype", "kept_dtype",
           "activation_bytes", "attention_per_gpu", "all_attention_per_gpu", "kv_cache_bytes", "weights_per_gpu", "check_parallelism",
           "tensor_parallel_sizes"]

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp8": 1, "mxfp8": 1 + 1 / 32, "w4a8": 0.5 + 2 / 128, "w4a16": 0.5 + 2 / 128,
               "mxfp4": 0.5 + 1 / 32, "nvfp4": 0.5 + 1 / 16}
"""Bytes per weight of each supported weight dtype, block scales included: MXFP8 (OCP Microscaling Formats v1.0),
8-bit floats with an 8-bit power-of-two scale per 32, multiplied as fp8; W4A8, 4-bit integers with a bf16
scale per 128 weights, multiplied as fp8; W4A16 (GPTQ- and AWQ-style weight-only int4), 4-bit integers with a bf16
scale per 128 weights, dequantised and multiplied at the bf16 rate (as the Marlin kernels, github.com/IST-DASLab/marlin,
multiply FP16 activations by INT4 weights); MXFP4 (OCP microscaling), 4-bit floats with an 8-bit scale per 32;
NVFP4, 4-bit floats with an fp8 scale per 16."""
_OTHER_WEIGHTS = {"w4a8": ("fp8", "fp8"), "mxfp4": ("bf16", "bf16"), "nvfp4": ("bf16", "nvfp4")}  # else dtype itself
"""The 4-bit dtypes quantise the routed experts; ``(attention, other FFNs)`` keep these dtypes: DeepSeek-R1's
W4AFP8 checkpoint keeps the rest in fp8, gpt-oss's MXFP4 checkpoint keeps attention in bf16 (it has no other
FFNs), and DeepSeek-R1's NVFP4 deployment on B200 keeps attention in bf16 and its dense and shared FFNs in
NVFP4 (TensorRT-LLM tech blog 1). MXFP8 and W4A16 quantise every projection alike (attention and FFNs; router,
embeddings, LM head and norms stay bf16, :func:`kept_dtype`)."""

KV_DTYPES = {"bf16": 2, "fp8": 1, "fp32": 4}
"""Bytes per KV-cache value of each KV-cache dtype (``kv_dtype``); an fp8 cache's per-tensor scales are not counted.
Default: the activations' (:func:`activation_bytes`)."""


_DTYPE_ALIASES = {"float32": "fp32", "bfloat16": "bf16", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8"}
"""torch's names of the weight dtypes (as sweep sidecars record them)."""


def check_dtype(dtype: str, argument: str = "dtype") -> str:
    """``dtype`` as a key of :data:`DTYPE_BYTES`, torch's names (``float32``, ``bfloat16``, ``float8_e4m3fn``) accepted.

    Raises
    ------
    UsageError
        For any other dtype, naming ``argument``.
    """
    dtype = _DTYPE_ALIASES.get(dtype, dtype)
    if dtype not in DTYPE_BYTES:
        raise UsageError(f"dtype must be one of {', '.join(DTYPE_BYTES)} (or torch's names "
                         f"{', '.join(_DTYPE_ALIASES)}), got {dtype!r}", argument)
    return dtype


def check_kv_dtype(kv_dtype, dtype: str, argument: str = "kv_dtype") -> str:
    """The KV-cache dtype, a key of :data:`KV_DTYPES` (torch's names accepted); None gives the activations' under
    weights of ``dtype`` (fp32 for fp32 weights, else bf16)."""
    if kv_dtype is None:
        return "fp32" if dtype == "fp32" else "bf16"
    kv_dtype = _DTYPE_ALIASES.get(kv_dtype, kv_dtype)
    if kv_dtype not in KV_DTYPES:
        raise UsageError(f"kv_dtype must be one of {', '.join(KV_DTYPES)}, got {kv_dtype!r}", argument)
    return kv_dtype


def attention_dtype(dtype: str) -> str:
    """The dtype of the attention projections under weight dtype ``dtype``."""
    return _OTHER_WEIGHTS.get(dtype, (dtype, dtype))[0]


def ffn_dtype(dtype: str) -> str:
    """The dtype of the FFNs besides the routed experts (shared experts, dense FFNs) under ``dtype``."""
    return _OTHER_WEIGHTS.get(dtype, (dtype, dtype))[1]


def kept_dtype(dtype: str) -> str:
    """The dtype of the router, embeddings, LM head and norms: bf16 under fp8 and the 4-bit dtypes (as their
    checkpoints keep them), else ``dtype``."""
    return "fp32" if dtype == "fp32" else "bf16"


def activation_bytes(dtype: str) -> int:
    """Bytes per activation and KV-cache value: fp32 models keep fp32 activations, the others bf16."""
    return 4 if dtype == "fp32" else 2


def attention_per_gpu(arch: Architecture, tp: int) -> tuple[float, float]:
    """Attention projection weights one of ``tp`` GPUs holds per layer, and the share of KV heads it keeps.

    Heads are split over the GPUs, KV heads replicated below one per GPU, MLA's latent projections
    replicated on every GPU.
    """
    if not arch.num_kv_heads:  # Medusa heads, the n-gram drafter: no attention
        return 0.0, 1.0
    if arch.attention == "gqa":
        kv_share = np.ceil(arch.num_kv_heads / tp) / arch.num_kv_heads
        return (arch.q_params + arch.o_params) / tp + arch.kv_params * kv_share, kv_share
    replicated = arch.replicated_attention_params
    return (arch.attention_params - replicated) / tp + replicated, 1.0


def all_attention_per_gpu(arch: Architecture, tp: int) -> float:
    """Attention weights one of ``tp`` GPUs holds over all layers: softmax-attention layers as
    :func:`attention_per_gpu` splits them; linear-attention layers and a sparse-attention indexer split over the
    GPUs like the heads they serve."""
    per_layer, _ = attention_per_gpu(arch, tp)
    return (arch.full_layers * per_layer
            + (arch.linear_layers * arch.linear_params + arch.num_layers * arch.index_params) / tp)


def kv_cache_bytes(arch: Architecture, sequences, context, split: int, dtype: str, kv_dtype=None):
    """Bytes of cache one GPU holds for ``sequences`` sequences of ``context`` tokens, its share of the KV heads of
    ``split`` GPUs (:func:`attention_per_gpu`): the KV cache (a window's worth in sliding-window and chunked
    layers), DeepSeek Sparse Attention's fp8 index keys with an fp32 scale per 128, and the recurrent state of each
    linear-attention layer (in the activations' dtype)."""
    _, kv_share = attention_per_gpu(arch, split)
    value = KV_DTYPES[check_kv_dtype(kv_dtype, dtype)]
    windowed, full = arch.sliding_layers, arch.full_layers - arch.sliding_layers
    keys = full * context + windowed * np.minimum(context, arch.sliding_window or 0)
    cache = sequences * keys * arch.kv_values_per_token * kv_share * value
    if arch.index_topk:
        index = arch.index_values_per_token
        cache = cache + sequences * arch.num_layers * context * (index + 4 * index / 128)
    if arch.linear_layers:
        cache = cache + sequences * arch.linear_layers * arch.linear_state_values / split * activation_bytes(dtype)
    return cache


def weights_per_gpu(model, dtype="bf16", tp=1, dp_attention=False) -> float:
    """Bytes of weights each of ``tp`` GPUs holds, split as :func:`moesd.predictor.forward.step_time` splits them.

    Split over the GPUs: attention heads, shared and routed experts (expert parallelism deals whole
    experts, the same bytes per GPU), dense FFNs, the vocabulary of the embedding and the LM head.
    On every GPU: KV heads below one per GPU, MLA's latent projections, the routers and the norms.
    With ``dtype="fp8"`` the router, embeddings, LM head and norms stay bf16. With ``dp_attention`` only
    the routed experts are split (``E / tp`` whole experts per GPU); every GPU holds all the other weights. A head's
    ``borrowed_params`` (the target's embedding and LM head it reads) are the target's, not held again.
    """
    arch = resolve_model(model)
    dtype = check_dtype(dtype)
    tp = int(as_array("tp", tp, low=1, whole=True))
    split_over = 1 if dp_attention else tp  # the GPUs the weights besides the routed experts are split over
    attention = all_attention_per_gpu(arch, split_over) + arch.fuse_params / split_over
    routed = arch.moe_layers * arch.num_experts * arch.expert_params / tp
    ffns = (arch.moe_layers * arch.shared_params + arch.dense_layers * arch.dense_ffn_params) / split_over
    vocabulary = (arch.embedding_params + (0 if arch.tied_embeddings else arch.head_params)) / split_over
    kept = arch.moe_layers * arch.router_params + vocabulary + arch.num_layers * arch.norm_params \
        + arch.final_norm_params - arch.borrowed_params / split_over
    return (routed * DTYPE_BYTES[dtype] + attention * DTYPE_BYTES[attention_dtype(dtype)]
            + ffns * DTYPE_BYTES[ffn_dtype(dtype)] + kept * DTYPE_BYTES[kept_dtype(dtype)])


def check_parallelism(arch: Architecture, hardware: Hardware, tp, ep, dp_attention=False) -> tuple[int, int]:
    """Checked tensor- and expert-parallel sizes of ``arch`` on ``hardware``: ``(tp, ep)`` as ints.

    ``tp`` must be one of :func:`tensor_parallel_sizes` (the ValueError says which rule fails and lists
    those that fit); ``ep`` must divide ``tp`` and the routed experts. With ``dp_attention`` the routed
    experts are dealt over all ``tp`` GPUs: ``ep`` is 1 (the default) or ``tp``, and ``tp`` is returned as ``ep``.
    """
    tp = int(as_array("tp", tp, low=1, whole=True))
    ep = int(as_array("ep", ep, low=1, whole=True))
    if dp_attention:
        if not arch.num_experts:
            raise UsageError(f"dp_attention: {arch.name} is dense, it has no experts to deal over the GPUs", "dp_attention")
        if ep not in (1, tp):
            raise UsageError(f"ep: with dp_attention the routed experts are dealt over all tp GPUs (ep = tp = {tp}), "
                             f"got {ep}", "ep")
        ep = tp
    if tp % ep:
        raise UsageError(f"ep must divide tp, got ep={ep}, tp={tp}", "ep")
    if ep > 1 and not dp_attention and (not arch.num_experts or arch.num_experts % ep):
        raise UsageError(f"ep must divide the routed experts of {arch.name} ({arch.num_experts}), got {ep}", "ep")
    sizes = tensor_parallel_sizes(arch, hardware, dp_attention)
    if tp not in sizes:  # one rule, tensor_parallel_sizes's; _refuse_tp only says which part fails
        _refuse_tp(arch, hardware, tp, ", ".join(map(str, sizes)), dp_attention)
    return tp, ep


def _refuse_tp(arch: Architecture, hardware: Hardware, tp: int, valid: str, dp_attention: bool):
    """Raise the ValueError that says why :func:`tensor_parallel_sizes` omits ``tp`` (``valid`` lists those it has)."""
    per_node, nodes = hardware.gpus_per_node, hardware.max_nodes
    if not hardware.interconnect_bandwidth:
        raise UsageError(f"tp: hardware {hardware.name} has no interconnect on record, so tp must be 1", "tp")
    if tp > per_node and not hardware.internode_bandwidth:
        raise UsageError(f"tp must be at most {per_node}, the GPUs one {hardware.name} node joins (no inter-node "
                         f"network is on record, so tensor parallelism across nodes is not modelled): one of {valid} "
                         f"for {arch.name}, got {tp}", "tp")
    if tp > per_node * nodes:
        raise UsageError(f"tp must be at most {per_node * nodes}, {nodes} nodes of {per_node} {hardware.name} GPUs "
                         f"(larger groups are not modelled): one of {valid} for {arch.name}, got {tp}", "tp")
    if tp > per_node and tp % per_node:
        raise UsageError(f"tp must be a multiple of {per_node} beyond one node, whole nodes of {per_node} "
                         f"{hardware.name} GPUs (a group over part of a node is not modelled): one of {valid} for "
                         f"{arch.name}, got {tp}", "tp")
    if dp_attention:
        raise UsageError(f"tp must divide the routed experts of {arch.name} ({arch.num_experts}) with dp_attention "
                         f"(each GPU holds whole experts), got {tp}; on {hardware.name}: {valid}", "tp")
    if arch.num_heads % tp:
        raise UsageError(f"tp must divide the attention heads of {arch.name} ({arch.num_heads}), got {tp}; "
                         f"on {hardware.name}: {valid}", "tp")
    raise UsageError(f"tp must divide, or be a multiple of, the KV heads of {arch.name} ({arch.num_kv_heads}), "
                     f"got {tp}; on {hardware.name}: {valid}", "tp")


def tensor_parallel_sizes(model, hardware, dp_attention=False) -> list[int]:
    """The tensor-parallel sizes :func:`moesd.predictor.forward.step_time` accepts for ``model`` on ``hardware``.

    Groups within one node (up to ``Hardware.gpus_per_node``; 1 without an interconnect) and, where the
    record has an inter-node network (``Hardware.internode_bandwidth``), whole nodes up to
    ``Hardware.max_nodes`` of them; of those, the sizes that divide the attention heads and divide, or are
    a multiple of, the KV heads, or with ``dp_attention`` (attention data-parallel, experts dealt over the
    group) the sizes that divide the routed experts.

    Returns
    -------
    list of int
        GPUs per tensor-parallel group, ascending (1 always among them).
    """
    arch, hardware = resolve_model(model), hardware_record(hardware)
    per_node = hardware.gpus_per_node if hardware.interconnect_bandwidth else 1
    nodes = hardware.max_nodes
    groups = [*range(1, per_node + 1), *range(2 * per_node, per_node * nodes + 1, per_node)]
    if dp_attention:
        return [tp for tp in groups if tp == 1 or (arch.num_experts and not arch.num_experts % tp)]
    return [tp for tp in groups
            if not arch.num_heads % tp and not (arch.num_kv_heads % tp and tp % arch.num_kv_heads)]
