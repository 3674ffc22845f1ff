"""The cost of single kernels: achieved efficiency, rates, fixed costs, grouped expert GEMMs and rejection sampling.

Every kernel of the whole-model performance model (beyond the paper) is a roofline, ``max(bytes /
bandwidth, FLOPs / peak)`` at the achieved fractions of the data-sheet peaks (:func:`achieved_rates`),
plus a fixed cost per kernel (:func:`per_kernel_seconds`; :data:`KERNELS` counts them per block).
:class:`Efficiency` holds what real kernels and engines achieve; :func:`expert_gemm_time` prices one
grouped GEMM of routed experts and :func:`rejection_time` rejection sampling. The forward pass built from
them is :func:`moesd.predictor.forward.step_time`.

Pure numpy; no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moesd._checks import UsageError, as_array
from moesd.predictor.layout import DTYPE_BYTES, activation_bytes, check_dtype
from moesd.theory.roofline import Hardware, hardware_record

__all__ = ["KERNELS", "Efficiency", "tensor_peak", "achieved_rates", "per_kernel_seconds", "per_expert_seconds",
           "expert_gemm_time", "grouped_gemm_roofline", "rejection_time", "SAMPLING_PASSES", "sampling_time"]

#: Kernels per block as inference engines fuse them, each adding ``Efficiency.kernel_seconds``: GQA attention
#: (input norm, fused QKV GEMM, rotary embedding and cache write, attention, output GEMM), MLA (also the two
#: latent projections and their norms), router (GEMM, top-k), routed experts besides their two grouped GEMMs
#: (permute, activation, unpermute; per expert in an eager loop: gather, activation, weighting, scatter),
#: shared experts (two GEMMs and the activation; Qwen's sigmoid gate adds two), the post-attention norm of an
#: MoE layer, a dense FFN with its norm, the LM head (final norm, GEMM, two sampling kernels), rejection; a
#: linear-attention layer (input norm, input projections, short convolution, the recurrence, gated norm, output
#: projection) and a sparse-attention indexer (its projections and the top-k selection), counted the same way.
KERNELS = {"gqa": 5, "mla": 9, "router": 2, "routed": 3, "routed_per_expert": 4, "shared": 3,
           "shared_gate": 2, "dense_ffn": 4, "moe_norm": 1, "head": 4, "reject": 3, "linear": 6, "index": 3}


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
    expert_tile_rows : int
        Rows a grouped-GEMM kernel pads each expert's tokens to (its tile, ``BLOCK_M``): an expert with
        ``t`` tokens costs the FLOPs of ``ceil(t / tile) x tile`` rows. Default 1: no padding. Applied to the
        mean tokens per expert (``t K / N``), an approximation: the tokens of single experts scatter around
        the mean, and a tile boundary inside that scatter is priced as a step.
    expert_tile_rows_above : int or None
        The tile when a pass's tokens exceed the routed experts (Triton fused_moe's default configuration
        switches there); None: ``expert_tile_rows`` throughout.
    expert_flops_fraction : float or None
        Achieved fraction of the tensor peak in the routed experts' grouped GEMMs, which reach less
        than a large dense GEMM at tens of tokens per expert; None: ``flops_fraction``'s.
    attention_bandwidth_fraction, attention_flops_fraction : float or None
        Achieved fractions of the data-sheet bandwidth and tensor peak in the decode attention kernel
        over the KV cache (the ``gamma + 1`` queries of a verification share one read of the cache);
        None: ``bandwidth_fraction`` and ``flops_fraction``'s.
    """

    bandwidth_fraction: float | None = None
    flops_fraction: float | None = None
    kernel_seconds: float = 2e-6
    launch_seconds: float = 5e-6
    step_seconds: float = 0.0
    expert_seconds: float | None = None
    expert_tile_rows: int = 1
    expert_tile_rows_above: int | None = None
    expert_flops_fraction: float | None = None
    attention_bandwidth_fraction: float | None = None
    attention_flops_fraction: float | None = None

    def __post_init__(self):
        for name in ("expert_tile_rows", "expert_tile_rows_above"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, np.integer)) and 1 <= value <= 4096):
                raise UsageError(f"{name} must be a whole number in [1, 4096], got {value!r}", name)
        for name in ("bandwidth_fraction", "flops_fraction", "expert_flops_fraction", "attention_bandwidth_fraction",
                     "attention_flops_fraction"):
            value = getattr(self, name)
            if value is not None and not 0 < value <= 10:
                raise UsageError(f"{name} must be in (0, 10], got {value!r}", name)
        for name in ("kernel_seconds", "launch_seconds", "step_seconds", "expert_seconds"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise UsageError(f"{name} must be >= 0, got {value!r}", name)


def tensor_peak(hardware: Hardware, dtype: str) -> float:
    """The data sheet's tensor throughput of ``hardware`` for weights of ``dtype`` (FLOP/s).

    fp8, MXFP8 and W4A8 run at the fp8 peak, MXFP4 and NVFP4 at the fp4 peak, each at the bf16 peak on devices
    without those tensor cores; W4A16 (weight-only) at the bf16 peak; fp32 at the fp32 peak (a UsageError where the
    record has none).
    """
    dtype = check_dtype(dtype)
    if dtype == "fp32":
        if hardware.fp32_flops is None:
            raise UsageError(f"dtype 'fp32': hardware {hardware.name} has no fp32 peak on record", "dtype")
        return hardware.fp32_flops
    if dtype in ("fp8", "mxfp8", "w4a8"):
        return hardware.fp8_flops or hardware.peak_flops  # no fp8 tensor cores: multiplied at bf16 rate
    if dtype in ("mxfp4", "nvfp4"):
        return hardware.fp4_flops or hardware.peak_flops  # no fp4 tensor cores: dequantised to bf16
    return hardware.peak_flops


def achieved_rates(hardware: Hardware, dtype: str, efficiency: Efficiency) -> tuple[float, float]:
    """Achieved memory bandwidth and tensor throughput of ``hardware`` for weights of ``dtype``.

    Parameters
    ----------
    hardware : Hardware
        The device record.
    dtype : {"bf16", "fp8", "fp32", "w4a8", "mxfp4", "nvfp4"}
        Weight dtype (torch's names accepted); its peak is :func:`tensor_peak`'s.
    efficiency : Efficiency
        Achieved fractions (None takes the hardware record's).

    Returns
    -------
    tuple of float
        ``(bytes/s, FLOP/s)``.
    """
    bandwidth = efficiency.bandwidth_fraction or hardware.bandwidth_fraction
    flops = efficiency.flops_fraction or hardware.flops_fraction
    return hardware.memory_bandwidth * bandwidth, tensor_peak(hardware, dtype) * flops


def per_kernel_seconds(efficiency: Efficiency, cuda_graphs: bool) -> float:
    """Fixed cost of one kernel in seconds: ``Efficiency.kernel_seconds``, plus ``launch_seconds`` without CUDA graphs."""
    return efficiency.kernel_seconds + (0.0 if cuda_graphs else efficiency.launch_seconds)


def per_expert_seconds(efficiency: Efficiency, cuda_graphs: bool) -> float:
    """Fixed cost of one activated expert run on its own (an eager loop), in seconds.

    ``Efficiency.expert_seconds`` when set; else six kernels' worth of :func:`per_kernel_seconds` (the
    expert's two products and ``KERNELS["routed_per_expert"]``).
    """
    if efficiency.expert_seconds is not None:
        return efficiency.expert_seconds
    return (2 + KERNELS["routed_per_expert"]) * per_kernel_seconds(efficiency, cuda_graphs)


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
    hardware = hardware_record(hardware)
    efficiency = efficiency or Efficiency()
    dtype = check_dtype(dtype)
    experts = as_array("experts", experts, low=0)
    tokens = as_array("tokens_per_expert", tokens_per_expert, low=0)
    in_features = as_array("in_features", in_features, low=1, whole=True)
    out_features = as_array("out_features", out_features, low=1, whole=True)
    fixed = per_kernel_seconds(efficiency, cuda_graphs) * (1.0 if grouped else np.ceil(experts))
    return grouped_gemm_roofline(hardware, experts, tokens, in_features, out_features, dtype, efficiency) + fixed


def grouped_gemm_roofline(hardware, experts, tokens, in_features, out_features, dtype, efficiency, tile_rows=None):
    """The roofline part of :func:`expert_gemm_time` in seconds, without its fixed cost or input checks.

    Widths may be fractional (an expert's intermediate size split over tensor-parallel GPUs); ``experts``
    and ``tokens`` (tokens per expert) broadcast; ``dtype`` must already be a key of
    :data:`~moesd.predictor.layout.DTYPE_BYTES`; ``tile_rows`` (broadcast with them) replaces
    ``efficiency.expert_tile_rows``.
    """
    bandwidth, flops_rate = achieved_rates(hardware, dtype, efficiency)
    if efficiency.expert_flops_fraction is not None:
        flops_rate = tensor_peak(hardware, dtype) * efficiency.expert_flops_fraction
    tile = np.asarray(efficiency.expert_tile_rows if tile_rows is None else tile_rows)
    rows = np.ceil(np.asarray(tokens) / tile - 1e-9) * tile if (tile > 1).any() else tokens  # padded to whole tiles
    weights = experts * in_features * out_features * DTYPE_BYTES[dtype]
    activations = experts * tokens * (in_features + out_features) * activation_bytes(dtype)
    flops = 2.0 * experts * rows * in_features * out_features
    return np.maximum((weights + activations) / bandwidth, flops / flops_rate)


def rejection_time(hardware, batch_size, gamma, vocab_size, efficiency: Efficiency | None = None,
                   cuda_graphs=True, verified=None):
    """Seconds of rejection sampling: reading the target's and the draft's probabilities of a round.

    A memory-bound pass over fp32 probabilities plus ``KERNELS["reject"]`` kernels: per sequence the
    target's ``gamma + 1`` distributions (the ``gamma`` drafted positions and the bonus token's) and the
    draft's ``gamma`` (one per drafted token), ``batch_size x (2 gamma + 1) x vocab_size`` values of 4
    bytes, at the achieved memory bandwidth (:func:`achieved_rates`). A tree that verifies ``verified`` tokens
    per sequence reads the target's distribution at each and the draft's at each drafted one:
    ``batch_size x (2 verified - 1) x vocab_size`` values.

    Parameters
    ----------
    hardware : Hardware or str
        The device, or its name in :data:`moesd.theory.roofline.HARDWARE`.
    batch_size : array_like
        Sequences B (whole number >= 1).
    gamma : array_like
        Draft length (whole number >= 1).
    vocab_size : array_like
        Vocabulary V of the distributions (whole number >= 1).
    efficiency : Efficiency, optional
        Achieved fractions and the fixed cost per kernel (default :class:`Efficiency`).
    cuda_graphs : bool, default True
        Whether the kernels launch from a CUDA graph (else each adds ``Efficiency.launch_seconds``).
    verified : int, optional
        Tokens a tree verifies per sequence, the last verified one included (default: a chain's ``gamma + 1``).

    Returns
    -------
    numpy.ndarray or float
        Seconds, broadcast over the arguments.
    """
    hardware = hardware_record(hardware)
    efficiency = efficiency or Efficiency()
    B = as_array("batch_size", batch_size, low=1, whole=True)
    gamma = as_array("gamma", gamma, low=1, whole=True)
    vocab_size = as_array("vocab_size", vocab_size, low=1, whole=True)
    bandwidth, _ = achieved_rates(hardware, "bf16", efficiency)
    verified = gamma + 1 if verified is None else as_array("verified", verified, low=2, whole=True)
    values = B * (2 * verified - 1) * vocab_size  # the target's distribution at each verified token, the draft's at each drafted
    return values * 4 / bandwidth + KERNELS["reject"] * per_kernel_seconds(efficiency, cuda_graphs)


SAMPLING_PASSES = {"greedy": 1, "sample": 5, "draft_probs": 1}
"""Passes over one fp32 distribution of the vocabulary per position, as vLLM's samplers run them
(``vllm/v1/sample/rejection_sampler.py``): greedy verification reads the target's logits once (an argmax, then
``rejection_greedy_sample_kernel`` compares token ids); sampling at a temperature above 0 reads and writes them to
divide by the temperature, reads and writes them again for the softmax, and reads the probabilities once more to
draw (``rejection_random_sample_kernel`` and ``sample_recovered_tokens_kernel`` over every drafted position, the
bonus token's draw over the last): 5; a separate draft model's probabilities at a drafted position add one read
(draft heads and the n-gram drafter propose greedily, and vLLM then treats their distribution as one-hot,
``NO_DRAFT_PROBS``)."""


def sampling_time(hardware, batch_size, positions, vocab_size, temperature, drafted=0, draft_probs=False,
                  efficiency: Efficiency | None = None, cuda_graphs=True):
    """Seconds of the sampling kernels over ``positions`` distributions of ``vocab_size`` tokens per sequence.

    At ``temperature`` 0, one pass per position (:data:`SAMPLING_PASSES`: an argmax) and two kernels; above 0, five
    passes per position, one more at each of ``drafted`` positions where the draft's own probabilities are read
    (``draft_probs``), and five kernels (temperature, softmax, rejection, recovered tokens, bonus). Memory-bound:
    ``batch_size x passes x vocab_size`` fp32 values at the achieved bandwidth (:func:`achieved_rates`), plus the
    kernels' fixed cost. The plain step samples one position; a round's verification ``verified`` positions with
    ``verified - 1`` drafted.
    """
    hardware = hardware_record(hardware)
    efficiency = efficiency or Efficiency()
    B = as_array("batch_size", batch_size, low=1, whole=True)
    positions = as_array("positions", positions, low=1, whole=True)
    temperature = float(as_array("temperature", temperature, low=0))
    bandwidth, _ = achieved_rates(hardware, "bf16", efficiency)
    if temperature == 0:
        passes, kernels = SAMPLING_PASSES["greedy"] * positions, 2
    else:
        passes = SAMPLING_PASSES["sample"] * positions + (SAMPLING_PASSES["draft_probs"] * drafted if draft_probs else 0)
        kernels = 5
    return B * passes * vocab_size * 4 / bandwidth + kernels * per_kernel_seconds(efficiency, cuda_graphs)
