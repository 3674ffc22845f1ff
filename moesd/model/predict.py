"""A whole-model performance model of autoregressive and speculative decoding (beyond the paper).

The paper fits Algorithm 1 to measurements; this module predicts the same quantities from first
principles, for any :class:`moesd.zoo.ModelSpec` on any :class:`moesd.theory.roofline.Hardware`:

* :func:`step_time`: seconds of one forward pass of ``B`` sequences with ``s`` new tokens each, summed
  over the model's components. Every weight matrix is a roofline, ``max(bytes / bandwidth, FLOPs /
  peak)`` at the achieved fractions of the data-sheet peaks, plus a fixed cost per kernel. Routed
  experts load the ``N(t)`` experts that ``t = B s`` tokens activate (Eq. 8, a measured popularity, or
  a :class:`~moesd.routing.traces.RoutingTrace` whose consecutive tokens' correlation is kept) and give each
  ``t K / N`` tokens (Eq. 10); attention reads the KV cache of ``context`` tokens per
  sequence; tensor parallelism (TP) splits weights and FLOPs and adds two all-reduces per layer priced
  by the interconnect; expert parallelism (EP) splits the experts.
* :func:`predict_sd`: ``T_T(B, 1)``, ``T_T(B, gamma + 1)``, ``T_D(B, 1)`` and the rejection step, and
  from them target efficiency and the speedup of Eq. 4 with its decomposition, over a grid of batch
  sizes, draft lengths, acceptance and contexts. The draft runs on GPUs of its own, as in the paper.

The model checked against the paper's Tables 1-2 lives in :mod:`moesd.paper.predictor_check`, and fitted to a
measured forward study in :mod:`moesd.model.calibrate`.

Pure numpy; no torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from moesd._checks import as_array
from moesd.theory.experts import expected_active_experts, expected_active_experts_from_popularity, most_loaded_share
from moesd.theory.roofline import HARDWARE, Hardware
from moesd.theory.speedup import sigma as emitted_fraction
from moesd.theory.speedup import speedup_terms
from moesd.routing.traces import RoutingTrace
from moesd.zoo import MODELS, Architecture, ModelSpec, get_model

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp8": 1}
"""Bytes per weight of each supported weight dtype."""

PAPER_BATCH_SIZES = (1, 2, 4, *range(8, 61, 4), 80, 100)
"""The paper's batch sizes (Sec. 7): 19 values from 1 to 100; ``moesd.measure.sweeps.BATCH_SIZES`` is this tuple."""

TRACE_ROUTING_MODELS = ("windows", "popularity")
"""How :func:`step_time` reads a :class:`~moesd.routing.traces.RoutingTrace` (see :mod:`moesd.routing.loads`)."""

#: Kernels per block as inference engines fuse them, each adding ``Efficiency.kernel_seconds``: GQA attention
#: (input norm, fused QKV GEMM, rotary embedding and cache write, attention, output GEMM), MLA (also the two
#: latent projections and their norms), router (GEMM, top-k), routed experts besides their two grouped GEMMs
#: (permute, activation, unpermute; per expert in an eager loop: gather, activation, weighting, scatter),
#: shared experts (two GEMMs and the activation; Qwen's sigmoid gate adds two), the post-attention norm of an
#: MoE layer, a dense FFN with its norm, the LM head (final norm, GEMM, two sampling kernels), rejection.
_KERNELS = {"gqa": 5, "mla": 9, "router": 2, "routed": 3, "routed_per_expert": 4, "shared": 3,
            "shared_gate": 2, "dense_ffn": 4, "moe_norm": 1, "head": 4, "reject": 3}

COMPONENTS = ("attention", "kv_cache", "router", "shared_experts", "routed_experts", "dense_ffn", "lm_head",
              "communication", "fixed")
"""The parts of a forward pass that :func:`step_time` times."""


@dataclass(frozen=True)
class Efficiency:
    """What real kernels and engines achieve beyond the data-sheet roofline.

    Attributes
    ----------
    bandwidth_fraction, flops_fraction : float or None
        Achieved fractions of the device's memory bandwidth and tensor peak; None takes the
        hardware record's (measured by public microbenchmarks, cited there).
    kernel_seconds : float
        Fixed cost of one kernel (launch gap, ramp-up and tail), seconds. Default 2 us, an assumed
        order of magnitude: NVIDIA's "Getting Started with CUDA Graphs" blog (2019) times short
        kernels at 3.4 us each when launched from a graph (3.8 us from a stream) for about 2.9 us of
        work. One model's kernel count does not change with the batch, so a fit of one model puts
        this cost into ``step_seconds``.
    launch_seconds : float
        Extra host cost of one kernel launched without CUDA graphs, seconds (assumed 5 us).
    expert_seconds : float or None
        Fixed cost of one activated expert when experts run one by one (an eager loop: gather, two
        products, activation, weighting, scatter), seconds; None: six kernels' worth.
    step_seconds : float
        Fixed cost of one forward pass outside the kernels (scheduling, input preparation, sampling
        in the serving engine), seconds. Default 0: the model times the device's work only.
    """

    bandwidth_fraction: float | None = None
    flops_fraction: float | None = None
    kernel_seconds: float = 2e-6
    launch_seconds: float = 5e-6
    step_seconds: float = 0.0
    expert_seconds: float | None = None

    def __post_init__(self):
        for name in ("bandwidth_fraction", "flops_fraction"):
            value = getattr(self, name)
            if value is not None and not 0 < value <= 10:
                raise ValueError(f"{name} must be in (0, 10], got {value!r}")
        for name in ("kernel_seconds", "launch_seconds", "step_seconds", "expert_seconds"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ValueError(f"{name} must be >= 0, got {value!r}")


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


def resolve_model(model) -> Architecture:
    """An :class:`~moesd.zoo.Architecture` from a :mod:`moesd.zoo` name, a ``ModelSpec`` or itself."""
    if isinstance(model, Architecture):
        return model
    if isinstance(model, ModelSpec):
        return model.architecture()
    if isinstance(model, str):
        try:
            return get_model(model).architecture()
        except KeyError:
            raise ValueError(f"model must be a moesd.zoo name ({', '.join(MODELS)}), got {model!r}") from None
    raise ValueError(f"model must be a moesd.zoo name, ModelSpec or Architecture, got {type(model).__name__}")


def resolve_hardware(hardware) -> Hardware:
    """A :class:`~moesd.theory.roofline.Hardware` record from its :data:`~moesd.theory.roofline.HARDWARE` name or itself."""
    if isinstance(hardware, Hardware):
        return hardware
    names = {name.lower(): name for name in HARDWARE}
    if isinstance(hardware, str) and hardware.lower() in names:
        return HARDWARE[names[hardware.lower()]]
    raise ValueError(f"hardware must be one of {sorted(HARDWARE)} or a Hardware record, got {hardware!r}")


def one_layer_draft(model) -> Architecture:
    """A draft of one decoder layer of the target's own shape, routed experts included, sharing its vocabulary.

    The size of a multi-token-prediction module (DeepSeek-V3's is one such layer) or of a one-layer
    EAGLE-style head with the target's FFN; for a cost estimate only (its acceptance is not modelled).
    """
    arch = resolve_model(model)
    return dataclasses.replace(arch, name=f"{arch.name} (one-layer draft)", num_layers=1,
                               moe_layers=1 if arch.moe_layers else 0,
                               sliding_layers=min(arch.sliding_layers, 0))


def _attention_per_gpu(arch: Architecture, tp: int) -> tuple[float, float]:
    """Attention projection weights one of ``tp`` GPUs holds per layer, and the share of KV heads it keeps.

    Heads are split over the GPUs, KV heads replicated below one per GPU, MLA's latent projections
    replicated on every GPU.
    """
    if arch.attention == "gqa":
        kv_share = np.ceil(arch.num_kv_heads / tp) / arch.num_kv_heads
        return (arch.q_params + arch.o_params) / tp + arch.kv_params * kv_share, kv_share
    replicated = arch.replicated_attention_params
    return (arch.attention_params - replicated) / tp + replicated, 1.0


def _kept_dtype(dtype: str) -> str:
    """The dtype of the router, embeddings, LM head and norms: bf16 under fp8 (as fp8 checkpoints keep them)."""
    return "bf16" if dtype == "fp8" else dtype


def weights_per_gpu(model, dtype="bf16", tp=1) -> float:
    """Bytes of weights each of ``tp`` GPUs holds, split as :func:`step_time` splits them.

    Split over the GPUs: attention heads, shared and routed experts (expert parallelism deals whole
    experts, the same bytes per GPU), dense FFNs, the vocabulary of the embedding and the LM head.
    On every GPU: KV heads below one per GPU, MLA's latent projections, the routers and the norms.
    With ``dtype="fp8"`` the router, embeddings, LM head and norms stay bf16.
    """
    arch = resolve_model(model)
    dtype = _check_dtype(dtype)
    tp = int(as_array("tp", tp, low=1, whole=True))
    attention, _ = _attention_per_gpu(arch, tp)
    split = (arch.moe_layers * (arch.shared_params + arch.num_experts * arch.expert_params)
             + arch.dense_layers * arch.dense_ffn_params) / tp
    vocabulary = (arch.embedding_params + (0 if arch.tied_embeddings else arch.head_params)) / tp
    kept = arch.moe_layers * arch.router_params + vocabulary + arch.num_layers * arch.norm_params \
        + arch.final_norm_params
    return ((arch.num_layers * attention + split) * DTYPE_BYTES[dtype]
            + kept * DTYPE_BYTES[_kept_dtype(dtype)])


def memory_per_gpu(model, hardware, batch_size, context, tp=1, ep=1, dtype="bf16") -> np.ndarray:
    """Bytes each of the target's ``tp`` GPUs holds: its weights (:func:`weights_per_gpu`) and KV cache.

    The cache holds ``context`` tokens for each of ``batch_size`` sequences, what a decode step of
    :func:`step_time` reads from it (KV heads split over the GPUs as there; bf16 values, fp32 for fp32 weights).
    Activations, the serving engine's workspace and fragmentation are not counted: a setup above
    the GPU's memory does not fit, one just below may not either.

    Returns
    -------
    numpy.ndarray
        Bytes, broadcast over ``batch_size`` and ``context``.
    """
    step = step_time(model, hardware, 1, batch_size, context, tp=tp, ep=ep, dtype=dtype)
    return weights_per_gpu(model, dtype, tp) + step.bytes["kv_cache"]


def memory_fit(target, draft, hardware, batch_size, context, tp=1, draft_tp=1, ep=1, dtype="bf16",
               draft_dtype=None, shared=False) -> pd.DataFrame:
    """Whether target and draft fit their GPUs' memory at each batch size.

    The target's weights and KV cache on each of its ``tp`` GPUs, and the draft's on each of its
    ``draft_tp`` GPUs (:func:`memory_per_gpu`), against ``hardware.memory_bytes``: on GPUs of its own, as
    :func:`predict_sd` places it, or with ``shared`` on the target's, whose memory the two then share.
    Activations and the serving engine's workspace are not counted, so a setup that fits here may
    still not fit.

    Parameters
    ----------
    target, draft : str, ModelSpec or Architecture
        The models.
    hardware : str or Hardware
        The GPU of both.
    batch_size : array_like
        Sequences ``B`` (>= 1).
    context : array_like
        Tokens in each sequence's KV cache (>= 0), broadcast against ``batch_size``.
    tp, draft_tp, ep : int
        GPUs of the target, of the draft, and the target's expert-parallel degree.
    dtype, draft_dtype : str
        Weight dtypes (the draft's defaults to ``dtype``).
    shared : bool, default False
        The draft on the target's GPUs (``draft_tp`` must equal ``tp``), as serving engines run an MTP
        head or a small draft.

    Returns
    -------
    pandas.DataFrame
        One row per broadcast ``(batch_size, context)``: ``target_bytes`` and ``draft_bytes`` per GPU
        (bytes) and ``fits``: each at most the GPU's memory, or with ``shared`` their sum.
    """
    hardware = resolve_hardware(hardware)
    if shared and draft_tp != tp:
        raise ValueError(f"draft_tp must equal tp for a draft on the target's GPUs (shared), got {draft_tp} and {tp}")
    B, context = np.broadcast_arrays(as_array("batch_size", batch_size, low=1, whole=True),
                                     as_array("context", context, low=0, whole=True))
    held = {"target_bytes": memory_per_gpu(target, hardware, B, context, tp, ep, dtype),
            "draft_bytes": memory_per_gpu(draft, hardware, B, context, draft_tp, 1,
                                          dtype if draft_dtype is None else draft_dtype)}
    capacity = hardware.memory_bytes
    fits = (held["target_bytes"] + held["draft_bytes"] <= capacity if shared
            else (held["target_bytes"] <= capacity) & (held["draft_bytes"] <= capacity))
    return pd.DataFrame({"batch_size": B.ravel(), "context": context.ravel(),
                         **{name: np.ravel(value) for name, value in held.items()}, "fits": np.ravel(fits)}
                        ).astype({"batch_size": int, "context": int})


_DTYPE_ALIASES = {"float32": "fp32", "bfloat16": "bf16", "float8_e4m3fn": "fp8"}
"""torch's names of the weight dtypes (as sweep sidecars record them)."""


def _check_dtype(dtype: str) -> str:
    """``dtype`` as a key of :data:`DTYPE_BYTES` (torch's names accepted); ValueError otherwise."""
    dtype = _DTYPE_ALIASES.get(dtype, dtype)
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    return dtype


def _rates(hardware: Hardware, dtype: str, efficiency: Efficiency) -> tuple[float, float]:
    """Achieved bytes/s and FLOP/s of ``hardware`` for weights of ``dtype``."""
    dtype = _check_dtype(dtype)
    if dtype == "fp32":
        if hardware.fp32_flops is None:
            raise ValueError(f"dtype 'fp32': hardware {hardware.name} has no fp32 peak on record")
        peak = hardware.fp32_flops
    elif dtype == "fp8":
        peak = hardware.fp8_flops or hardware.peak_flops  # no fp8 tensor cores: multiplied at bf16 rate
    else:
        peak = hardware.peak_flops
    bandwidth = efficiency.bandwidth_fraction or hardware.bandwidth_fraction
    flops = efficiency.flops_fraction or hardware.flops_fraction
    return hardware.memory_bandwidth * bandwidth, peak * flops


def _activation_bytes(dtype: str) -> int:
    """Bytes per activation and KV-cache value: fp32 models keep fp32 activations, the others bf16."""
    return 4 if dtype == "fp32" else 2


def _per_kernel(efficiency: Efficiency, cuda_graphs: bool) -> float:
    return efficiency.kernel_seconds + (0.0 if cuda_graphs else efficiency.launch_seconds)


def _per_expert(efficiency: Efficiency, cuda_graphs: bool) -> float:
    """Fixed cost of one activated expert run on its own (an eager loop)."""
    if efficiency.expert_seconds is not None:
        return efficiency.expert_seconds
    return (2 + _KERNELS["routed_per_expert"]) * _per_kernel(efficiency, cuda_graphs)


def expert_gemm_time(hardware, experts, tokens_per_expert, in_features, out_features, dtype="bf16",
                     efficiency: Efficiency | None = None, grouped=True, cuda_graphs=True):
    """Seconds of one grouped GEMM: ``experts`` experts each multiply ``tokens_per_expert`` tokens.

    A roofline of the weights (``experts x in x out`` values) and the activations read and written,
    against ``experts x tokens x 2 in out`` FLOPs, at the achieved fractions of the device's peaks,
    plus a fixed cost per kernel.

    Parameters
    ----------
    hardware : Hardware or str
        The device (a :data:`~moesd.theory.roofline.HARDWARE` name or a record).
    experts : array_like
        Experts whose weights are loaded (>= 0; real values allowed, e.g. an expected ``N(t)``).
    tokens_per_expert : array_like
        Tokens each of them multiplies (>= 0), e.g. ``T_exp`` of Eq. 10.
    in_features, out_features : int
        Shape of one expert's weight matrix.
    dtype : {"bf16", "fp8", "fp32"}
        Weight dtype (2, 1 or 4 bytes per weight); activations are bf16 (fp32 for fp32).
    efficiency : Efficiency, optional
        Achieved fractions and fixed costs (default :class:`Efficiency`).
    grouped : bool, default True
        One kernel for all experts (a grouped GEMM); False: one kernel per expert (an eager loop).
    cuda_graphs : bool, default True
        Whether kernels launch from a CUDA graph (else each adds ``Efficiency.launch_seconds``).

    Returns
    -------
    numpy.ndarray or float
        Seconds.
    """
    hardware = resolve_hardware(hardware)
    efficiency = efficiency or Efficiency()
    dtype = _check_dtype(dtype)
    experts = as_array("experts", experts, low=0)
    tokens = as_array("tokens_per_expert", tokens_per_expert, low=0)
    in_features = as_array("in_features", in_features, low=1, whole=True)
    out_features = as_array("out_features", out_features, low=1, whole=True)
    fixed = _per_kernel(efficiency, cuda_graphs) * (1.0 if grouped else np.ceil(experts))
    return _grouped_gemm_time(hardware, experts, tokens, in_features, out_features, dtype, efficiency) + fixed


def _grouped_gemm_time(hardware, experts, tokens, in_features, out_features, dtype, efficiency):
    """The roofline part of :func:`expert_gemm_time`, unchecked (widths may be fractional under TP)."""
    bandwidth, flops_rate = _rates(hardware, dtype, efficiency)
    weights = experts * in_features * out_features * DTYPE_BYTES[dtype]
    activations = experts * tokens * (in_features + out_features) * _activation_bytes(dtype)
    flops = 2.0 * experts * tokens * in_features * out_features
    return np.maximum((weights + activations) / bandwidth, flops / flops_rate)


def _active_experts(arch: Architecture, B: np.ndarray, s: np.ndarray, top_k: np.ndarray, routing,
                    routing_model: str) -> np.ndarray:
    """Expected activated experts per MoE layer for ``B`` sequences x ``s`` tokens: shape ``(layers or 1, *B.shape)``."""
    E = arch.num_experts
    tokens = B * s
    if routing is None:
        return expected_active_experts(tokens, E, top_k)[None]
    if isinstance(routing, RoutingTrace):
        from moesd.routing.loads import activated_experts

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
    p = p.reshape(-1, E)
    unique, inverse = np.unique(tokens, return_inverse=True)
    per_layer = expected_active_experts_from_popularity(unique[:, None], p[None, :, :])  # (unique, layers)
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


def _parallelism(arch: Architecture, hardware: Hardware, tp, ep) -> tuple[int, int]:
    """Checked tensor- and expert-parallel sizes."""
    tp = int(as_array("tp", tp, low=1, whole=True))
    ep = int(as_array("ep", ep, low=1, whole=True))
    if tp % ep:
        raise ValueError(f"ep must divide tp, got ep={ep}, tp={tp}")
    if ep > 1 and (not arch.num_experts or arch.num_experts % ep):
        raise ValueError(f"ep must divide the routed experts of {arch.name} ({arch.num_experts}), got {ep}")
    sizes = tensor_parallel_sizes(arch, hardware)
    if tp not in sizes:  # one rule, tensor_parallel_sizes's; the checks below only say which part fails
        valid = ", ".join(map(str, sizes))
        if not hardware.interconnect_bandwidth:
            raise ValueError(f"tp: hardware {hardware.name} has no interconnect on record, so tp must be 1")
        if tp > hardware.gpus_per_node:
            raise ValueError(f"tp must be at most {hardware.gpus_per_node}, the GPUs one {hardware.name} node joins "
                             f"(tensor parallelism across nodes is not modelled): one of {valid} for {arch.name}, "
                             f"got {tp}")
        if arch.num_heads % tp:
            raise ValueError(f"tp must divide the attention heads of {arch.name} ({arch.num_heads}), got {tp}; "
                             f"on {hardware.name}: {valid}")
        raise ValueError(f"tp must divide, or be a multiple of, the KV heads of {arch.name} ({arch.num_kv_heads}), "
                         f"got {tp}; on {hardware.name}: {valid}")
    return tp, ep


def tensor_parallel_sizes(model, hardware) -> list[int]:
    """The tensor-parallel sizes :func:`step_time` accepts for ``model`` on ``hardware``.

    Those up to the GPUs one node joins (``Hardware.gpus_per_node``; 1 without an interconnect) that
    divide the attention heads and divide, or are a multiple of, the KV heads.

    Returns
    -------
    list of int
        GPUs per tensor-parallel group, ascending (1 always among them).
    """
    arch, hardware = resolve_model(model), resolve_hardware(hardware)
    most = hardware.gpus_per_node if hardware.interconnect_bandwidth else 1
    return [tp for tp in range(1, most + 1)
            if not arch.num_heads % tp and not (arch.num_kv_heads % tp and tp % arch.num_kv_heads)]


def _routed_experts(arch: Architecture, hardware: Hardware, active, tokens, K, tp: int, ep: int, dtype: str,
                    efficiency: Efficiency, grouped_kernel_seconds, cuda_graphs: bool):
    """Seconds, bytes and FLOPs per GPU of the routed experts of every MoE layer.

    ``active`` holds the activated experts ``N`` per traced layer (or one row for all); each gets
    ``tokens K / N`` tokens. Grouped GEMMs (``grouped_kernel_seconds``, the cost of one kernel) add a fixed
    number of kernels per layer; an eager loop (None) a fixed cost per activated expert.
    """
    d, w_bytes, a_bytes = arch.hidden_size, DTYPE_BYTES[dtype], _activation_bytes(dtype)
    layer_weight = arch.moe_layers / active.shape[0]
    width = arch.expert_intermediate / (tp // ep)
    local = most_loaded_share(active, arch.num_experts, ep)  # the step waits for the most loaded GPU
    per_expert = tokens * K / np.maximum(active, 1e-12)
    gemm_seconds = sum(_grouped_gemm_time(hardware, local, per_expert, i, o, dtype, efficiency)
                       for i, o in ((d, 2 * width), (width, d)))
    fixed = ((2 + _KERNELS["routed"]) * grouped_kernel_seconds if grouped_kernel_seconds is not None
             else np.ceil(local) * _per_expert(efficiency, cuda_graphs))
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


def _collectives(arch: Architecture, hardware: Hardware, tokens, tp: int, a_bytes: int):
    """Seconds and bytes of tensor parallelism's collectives: an all-reduce of the hidden states after the
    (vocabulary-split) embedding and two per layer (ring), and a gather of the logits; none on one GPU."""
    if tp == 1:
        zero = np.zeros_like(tokens)
        return zero, zero
    one_way = _link_bandwidth(hardware, tp)
    ring = 2 * (tp - 1) / tp
    all_reduces = 2 * arch.num_layers + 1
    all_reduce = hardware.interconnect_latency + ring * tokens * arch.hidden_size * a_bytes / one_way
    gather = hardware.interconnect_latency + (tp - 1) / tp * tokens * arch.vocab_size * a_bytes / one_way
    return (all_reduces * all_reduce + gather, all_reduces * ring * tokens * arch.hidden_size * a_bytes)


def step_time(model, hardware, tokens_per_sequence, batch_size, context=0, tp=1, ep=1, dtype="bf16",
              routing=None, cuda_graphs=True, top_k=None, efficiency: Efficiency | None = None,
              grouped_experts=True, routing_model="windows") -> StepTime:
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
        Tensor-parallel GPUs and the expert-parallel degree (``ep`` divides ``tp``).
    dtype : {"bf16", "fp8", "fp32"}
        Weight dtype.
    routing : array_like, callable or RoutingTrace, optional
        Expert popularity, shape ``(E,)`` or ``(moe_layers, E)``, each row summing to ``K`` (uses
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

    Returns
    -------
    StepTime
        Seconds, bytes and FLOPs per component; ``.total`` is the forward pass in seconds.
    """
    arch = resolve_model(model)
    hardware = resolve_hardware(hardware)
    efficiency = efficiency or Efficiency()
    dtype = _check_dtype(dtype)
    s = as_array("tokens_per_sequence", tokens_per_sequence, low=1, whole=True)
    B = as_array("batch_size", batch_size, low=1, whole=True)
    context = as_array("context", context, low=0, whole=True)
    tp, ep = _parallelism(arch, hardware, tp, ep)
    if routing is not None and not arch.num_experts:
        raise ValueError(f"routing: {arch.name} is dense")
    if top_k is not None and not arch.num_experts:
        raise ValueError(f"top_k: {arch.name} is dense")
    if routing_model not in TRACE_ROUTING_MODELS:
        raise ValueError(f"routing_model must be one of {TRACE_ROUTING_MODELS}, got {routing_model!r}")
    K = _routing_top_k(arch, routing, top_k) if arch.num_experts else np.asarray(0.0)
    s, B, context, K = np.broadcast_arrays(s, B, context, K)
    tokens = s * B
    bandwidth, flops_rate = _rates(hardware, dtype, efficiency)
    w_bytes, a_bytes = DTYPE_BYTES[dtype], _activation_bytes(dtype)
    # fp8 checkpoints (DeepSeek-V3's, vLLM's fp8 quantisation) keep the router, the embeddings, the LM head
    # and the norms in bf16, and attention over the bf16 KV cache runs at the bf16 rate
    kept_dtype = _kept_dtype(dtype)
    kept_bytes, kept_rate = DTYPE_BYTES[kept_dtype], _rates(hardware, kept_dtype, efficiency)[1]
    per_kernel = _per_kernel(efficiency, cuda_graphs)
    d = arch.hidden_size

    def gemm(params, kernels, layers, in_out, bytes_per_weight=w_bytes, rate=flops_rate):
        """Roofline of ``layers`` matrix products of ``params`` weights per GPU over all tokens."""
        weight_bytes = params * bytes_per_weight
        activation = tokens * in_out * a_bytes
        flops = 2.0 * params * tokens
        seconds = np.maximum((weight_bytes + activation) / bandwidth, flops / rate) + kernels * per_kernel
        return layers * seconds, layers * (weight_bytes + activation), layers * flops

    seconds, traffic, flops = {}, {}, {}

    attention_params, kv_share = _attention_per_gpu(arch, tp)
    seconds["attention"], traffic["attention"], flops["attention"] = gemm(
        attention_params, _KERNELS[arch.attention], arch.num_layers, 2 * d)

    # Attention over the KV cache: read once per sequence, whatever its number of new tokens.
    layers_full = arch.num_layers - arch.sliding_layers
    keys = layers_full * context + arch.sliding_layers * np.minimum(context, arch.sliding_window or 0)
    kv_bytes = B * keys * arch.kv_values_per_token * kv_share * a_bytes
    kv_flops = tokens * keys * arch.attention_flops_per_key / tp
    traffic["kv_cache"], flops["kv_cache"] = kv_bytes, kv_flops
    seconds["kv_cache"] = np.maximum(kv_bytes / bandwidth, kv_flops / kept_rate)

    # Mixture-of-experts layers.
    zero = np.zeros_like(tokens)
    for name in ("router", "shared_experts", "routed_experts"):
        seconds[name], traffic[name], flops[name] = zero, zero, zero
    if arch.moe_layers:
        seconds["router"], traffic["router"], flops["router"] = gemm(
            arch.router_params, _KERNELS["router"], arch.moe_layers, d, kept_bytes, kept_rate)  # on every GPU
        if arch.shared_params:
            kernels = _KERNELS["shared"] + (_KERNELS["shared_gate"] if arch.model_type == "qwen2_moe" else 0)
            seconds["shared_experts"], traffic["shared_experts"], flops["shared_experts"] = gemm(
                arch.shared_params / tp, kernels + _KERNELS["moe_norm"], arch.moe_layers, 2 * d)
        active = _active_experts(arch, B, s, K, routing, routing_model)  # (layers or 1, ...)
        seconds["routed_experts"], traffic["routed_experts"], flops["routed_experts"] = _routed_experts(
            arch, hardware, active, tokens, K, tp, ep, dtype, efficiency, per_kernel if grouped_experts
            else None, cuda_graphs)

    seconds["dense_ffn"], traffic["dense_ffn"], flops["dense_ffn"] = (zero, zero, zero)
    if arch.dense_layers:
        seconds["dense_ffn"], traffic["dense_ffn"], flops["dense_ffn"] = gemm(
            arch.dense_ffn_params / tp, _KERNELS["dense_ffn"], arch.dense_layers, 2 * d)

    # LM head over every new token (vocabulary split over tp).
    seconds["lm_head"], traffic["lm_head"], flops["lm_head"] = gemm(
        arch.head_params / tp, _KERNELS["head"], 1, d + arch.vocab_size / tp, kept_bytes, kept_rate)

    seconds["communication"], traffic["communication"] = _collectives(arch, hardware, tokens, tp, a_bytes)
    flops["communication"] = zero

    # Per pass: the engine's own step, the embedding lookup and the norms' weights.
    norms = (arch.num_layers * arch.norm_params + arch.final_norm_params) * kept_bytes
    traffic["fixed"] = norms + tokens * d * a_bytes
    seconds["fixed"] = efficiency.step_seconds + traffic["fixed"] / bandwidth + per_kernel
    flops["fixed"] = zero
    broadcast = {k: np.broadcast_to(v, tokens.shape) * 1.0 for k, v in seconds.items()}
    return StepTime(seconds={k: broadcast[k] for k in COMPONENTS},
                    bytes={k: np.broadcast_to(traffic[k], tokens.shape) * 1.0 for k in COMPONENTS},
                    flops={k: np.broadcast_to(flops[k], tokens.shape) * 1.0 for k in COMPONENTS})


def rejection_time(hardware, batch_size, gamma, vocab_size, efficiency: Efficiency | None = None,
                   cuda_graphs=True):
    """Seconds of rejection sampling: reading target and draft probabilities of ``B (gamma + 1)`` positions.

    A memory-bound pass over two fp32 tensors of ``batch_size x (gamma + 1) x vocab_size`` values plus a
    few kernels. Returns seconds (broadcast over the arguments).
    """
    hardware = resolve_hardware(hardware)
    efficiency = efficiency or Efficiency()
    B = as_array("batch_size", batch_size, low=1, whole=True)
    gamma = as_array("gamma", gamma, low=1, whole=True)
    vocab_size = as_array("vocab_size", vocab_size, low=1, whole=True)
    bandwidth, _ = _rates(hardware, "bf16", efficiency)
    return 2 * B * (gamma + 1) * vocab_size * 4 / bandwidth + _KERNELS["reject"] * _per_kernel(efficiency, cuda_graphs)


def _grid(**arrays) -> dict:
    """Every combination of the 1-D arguments, flattened (the first argument varies slowest)."""
    names = list(arrays)
    mesh = np.meshgrid(*(np.atleast_1d(arrays[n]).ravel() for n in names), indexing="ij")
    return {n: m.ravel() for n, m in zip(names, mesh)}


def predict_sd(target, draft, hardware, batch_size, gamma, sigma=None, tp=1, draft_tp=1, context=512, *, alpha=None,
               ep=1, top_k=None, dtype="bf16", draft_dtype=None, draft_hardware=None, routing=None,
               routing_model="windows", verify_tokens="gamma+1", efficiency: Efficiency | None = None,
               draft_efficiency: Efficiency | None = None, cuda_graphs=True, grouped_experts=True) -> pd.DataFrame:
    """Predicted speculative-decoding speedup (Eq. 4) and its terms over a grid of settings.

    The target verifies on ``tp`` GPUs; the draft proposes on ``draft_tp`` GPUs of its own (the paper's
    setup: the draft stays on one GPU). A round costs ``gamma T_D(B, 1) + T_T(B, gamma + 1) + T_reject``;
    the verification pass scores ``gamma + 1`` positions per sequence (the drafts and the bonus token,
    as vLLM and :mod:`moesd.measure.sd` do; ``verify_tokens="gamma"`` scores ``gamma``, as Algorithm 1 writes).

    Parameters
    ----------
    target, draft : str, ModelSpec or Architecture
        The models (:data:`moesd.zoo.MODELS` names such as ``"qwen2-57b-a14b"``, or records).
    hardware : str or Hardware
        The target's GPUs (and the draft's, unless ``draft_hardware``), e.g. ``"H800"``.
    batch_size, gamma, sigma : array_like
        Batch sizes ``B``, draft lengths and emitted fractions ``sigma`` (Eq. 5; each in
        ``[1 / (gamma + 1), 1]``). Every combination is a row.
    alpha : array_like, optional
        Per-token acceptance probabilities instead of ``sigma``: each row then has
        ``sigma = sigma(alpha, gamma)`` of Eq. 5, so longer drafts emit a smaller fraction.
    tp, draft_tp : int
        GPUs of the target and of the draft.
    context : array_like, default 512
        Tokens in each sequence's KV cache (prompt and generated so far).
    ep, top_k, dtype, routing, routing_model, cuda_graphs, grouped_experts, efficiency
        As in :func:`step_time` (the target's); ``top_k`` may be an array (a grid axis). A
        :class:`~moesd.routing.traces.RoutingTrace` as ``routing`` gives ``N(B)`` of the decode step and
        ``N(B (gamma + 1))`` of verification from the measured routing (its consecutive tokens'
        correlation kept with ``routing_model="windows"``), so real routing reaches the speedup.
    draft_dtype : str, optional
        The draft's weight dtype (default ``dtype``).
    draft_hardware : str or Hardware, optional
        The draft's GPU when it differs from the target's.
    draft_efficiency : Efficiency, optional
        The draft's efficiency and overheads (default ``efficiency``).
    verify_tokens : {"gamma+1", "gamma"}
        Positions per sequence in the verification pass.

    Returns
    -------
    pandas.DataFrame
        One row per combination: ``batch_size``, ``gamma``, ``sigma``, ``context`` (and
        ``num_experts_per_tok`` when ``top_k`` is given); the times ``t_target_1``, ``t_target_gamma``
        (the verification pass), ``t_draft`` (one proposal step), ``t_reject`` (seconds); the Eq. 4
        terms ``tokens_per_round = sigma (gamma + 1)``, ``verify_term = 1 / target efficiency``,
        ``draft_term = gamma t_draft / t_target_1``, ``reject_term = t_reject / t_target_1``; and
        ``target_efficiency`` and ``speedup = tokens_per_round / (verify_term + draft_term + reject_term)``.
    """
    if verify_tokens not in ("gamma+1", "gamma"):
        raise ValueError(f"verify_tokens must be 'gamma+1' or 'gamma', got {verify_tokens!r}")
    target_arch, draft_arch = resolve_model(target), resolve_model(draft)
    hardware = resolve_hardware(hardware)
    draft_hardware = resolve_hardware(draft_hardware) if draft_hardware is not None else hardware
    draft_dtype = dtype if draft_dtype is None else draft_dtype
    if (sigma is None) == (alpha is None):
        raise ValueError("sigma: give either sigma or alpha (not both)")
    axes = dict(batch_size=as_array("batch_size", batch_size, low=1, whole=True),
                gamma=as_array("gamma", gamma, low=1, whole=True))
    if alpha is None:
        axes["sigma"] = as_array("sigma", sigma, low=0, high=1, low_open=True)
    else:
        axes["alpha"] = as_array("alpha", alpha, low=0, high=1)
    axes["context"] = as_array("context", context, low=0, whole=True)
    if top_k is not None:
        axes["num_experts_per_tok"] = as_array("top_k", top_k, low=1, whole=True)
    grid = _grid(**axes)
    if alpha is not None:
        grid = {**grid, "sigma": emitted_fraction(grid["alpha"], grid["gamma"])}
    k = grid.get("num_experts_per_tok")
    common = dict(routing=routing, routing_model=routing_model, cuda_graphs=cuda_graphs, efficiency=efficiency,
                  grouped_experts=grouped_experts)
    verify = grid["gamma"] + (1 if verify_tokens == "gamma+1" else 0)
    # Time each distinct (B, s, context, K) once: sigma does not change a step.
    key = np.stack([grid["batch_size"], grid["context"], k if k is not None else np.zeros_like(grid["gamma"])])
    unique, inverse = np.unique(key, axis=1, return_inverse=True)
    inverse = inverse.ravel()
    kk = unique[2] if k is not None else None
    t1 = step_time(target_arch, hardware, 1, unique[0], unique[1], tp, ep, dtype, top_k=kk, **common).total
    try:
        draft_step = step_time(draft_arch, draft_hardware, 1, unique[0], unique[1], draft_tp, 1, draft_dtype,
                               cuda_graphs=cuda_graphs, efficiency=draft_efficiency or efficiency,
                               grouped_experts=grouped_experts).total
    except ValueError as error:  # the draft's parallelism is draft_tp's
        message = str(error)
        raise ValueError("draft_" + message if message.startswith("tp") else message) from None
    t_verify = step_time(target_arch, hardware, verify, grid["batch_size"], grid["context"], tp, ep, dtype,
                         top_k=k, **common).total
    t_reject = rejection_time(hardware, grid["batch_size"], grid["gamma"], target_arch.vocab_size, efficiency,
                              cuda_graphs)
    terms = speedup_terms(grid["sigma"], grid["gamma"], t1[inverse], t_verify, draft_step[inverse], t_reject)
    return pd.DataFrame({
        **{name: values for name, values in grid.items()},
        "t_target_1": t1[inverse], "t_target_gamma": t_verify, "t_draft": draft_step[inverse],
        "t_reject": t_reject, "tokens_per_round": terms.tokens_per_round, "verify_term": terms.verify,
        "draft_term": terms.draft, "reject_term": terms.reject, "target_efficiency": 1.0 / terms.verify,
        "speedup": terms.speedup,
    }).astype({"batch_size": int, "gamma": int, "context": int})


def best_gamma(frame: pd.DataFrame, by=("batch_size",)) -> pd.DataFrame:
    """The row of highest speedup per group of ``by`` (default: per batch size) of a :func:`predict_sd` frame."""
    by = list(by)
    missing = [c for c in [*by, "speedup"] if c not in frame.columns]
    if missing:
        raise ValueError(f"frame lacks column(s) {', '.join(missing)}; pass a predict_sd frame")
    return frame.loc[frame.groupby(by)["speedup"].idxmax()].reset_index(drop=True)


def batch_range(frame: pd.DataFrame, fraction=2 ** -0.5) -> tuple[int | None, int | None, float, int]:
    """The run of batch sizes around the peak where the best speedup over gamma stays at or above ``fraction``
    of its peak (the paper's x / sqrt(2) band) and above 1 (SD pays).

    The run is unbroken over the frame's batch sizes: it ends at the first batch size on either side of
    the peak that falls below, even if a farther one rises above again.

    Returns
    -------
    tuple
        ``(lowest B, highest B, peak speedup, B of the peak)`` over the frame's batch sizes; the two ends
        are None when the peak speedup is at most 1 (SD pays nowhere, so there is no band).
    """
    best = best_gamma(frame)
    speedup = best["speedup"].to_numpy()
    at = int(speedup.argmax())
    peak = float(speedup[at])
    sizes = best["batch_size"]
    if peak <= 1:
        return None, None, peak, int(sizes.iloc[at])
    below = np.flatnonzero((speedup < fraction * peak) | (speedup <= 1))
    low = below[below < at].max() + 1 if (below < at).any() else 0
    high = below[below > at].min() - 1 if (below > at).any() else len(best) - 1
    return int(sizes.iloc[low]), int(sizes.iloc[high]), peak, int(sizes.iloc[at])
