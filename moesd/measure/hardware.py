"""The measured roofline of the machine that measures, and where a decode step's time goes.

Data sheets give the peak FLOP/s and bandwidth of accelerators (:data:`moesd.theory.roofline.HARDWARE`);
a sweep needs those of the device it ran on, in its dtype and thread count, for the ridge point of
Eq. 1. :func:`measure_roofline` measures them the way STREAM and a GEMM sweep do:

* streaming bandwidth: ``copy`` (``a = b``) and ``triad`` (``a = b + s c``) over arrays well beyond
  the last-level cache, bytes counted as STREAM counts them (2 and 3 arrays per pass), the best of
  several repeats;
* GEMM FLOP/s against the tokens ``M`` of ``torch.nn.functional.linear`` with a weight of a real
  expert's shape stored as ``nn.Linear`` stores it (Qwen2-57B-A14B's gate projection by default),
  rotating over enough weight copies that every call reads its weight from memory, as a decode step
  does; achieved FLOP/s = ``2 M N K / seconds``, the peak is the best achieved over ``M``.

The result is a :class:`RooflineMeasurement`: the two curves and a
:class:`~moesd.theory.roofline.Hardware` record whose ridge point is that of this machine in this dtype.
Every sweep stores both in its sidecar (``moesd.measure.bench.environment``).

:func:`decode_step_breakdown` splits a measured decode step of a scaled model into weight
streaming (bytes / measured bandwidth), per-expert dispatch and the rest of the call overhead
(both measured on the same architecture at its narrowest width, where weights are negligible),
and compute (FLOPs / GEMM FLOP/s measured at the step's tokens per matrix with the weight in
cache). :func:`study_seconds` turns step times into the duration of a steady-state e2e study.

torch is imported inside the functions that measure; the records and arithmetic need only numpy
and pandas.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import itertools
import math
import os
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from moesd._checks import as_array
from moesd.theory.experts import expected_active_experts, tokens_per_expert
from moesd.theory.roofline import Hardware

STREAM_ARRAYS = {"copy": 2, "triad": 3}
"""Arrays a STREAM kernel reads or writes once per element: copy ``a = b``, triad ``a = b + s c``."""

GEMM_TOKENS = tuple(2 ** i for i in range(12))
"""Default tokens M of the GEMM sweep on a CPU: 1, 2, 4, ..., 2048 (on CUDA up to 16384, where a
GPU's tensor cores need more tokens to reach their peak)."""

DTYPES = ("float32", "bfloat16", "float16")
"""The GEMM types the ``moesd hardware --measure`` command offers."""

OVERHEAD_WIDTH = 1 / 256
"""Width factor of the overhead model: every width of a :mod:`moesd.zoo` shape at its floor
(hidden size two per attention head), so weights and FLOPs are negligible and a step is call overhead."""

_MIB = 2 ** 20


# ---------------------------------------------------------------------------------------------
# Counting


def stream_bytes(kernel: str, array_bytes):
    """Bytes one pass of a STREAM kernel moves, as STREAM counts them.

    Parameters
    ----------
    kernel : str
        ``"copy"`` (reads one array, writes one: 2 arrays) or ``"triad"`` (reads two, writes one: 3).
    array_bytes : array_like
        Bytes of one array (>= 0).

    Returns
    -------
    numpy.ndarray or float
        Bytes counted (write-allocate traffic is not counted, as in STREAM).
    """
    if kernel not in STREAM_ARRAYS:
        raise ValueError(f"kernel must be one of {', '.join(STREAM_ARRAYS)}, got {kernel!r}")
    return STREAM_ARRAYS[kernel] * as_array("array_bytes", array_bytes, low=0)


def gemm_flops(tokens, in_features, out_features):
    """FLOPs of ``linear(x, W)`` for ``tokens`` rows of ``x`` and ``W`` of ``out x in``: ``2 M N K``.

    Parameters
    ----------
    tokens : array_like
        Rows M of the activations (>= 0).
    in_features, out_features : array_like
        K and N of the weight (>= 1, whole).

    Returns
    -------
    numpy.ndarray or float
        Floating-point operations, two per multiply-add.
    """
    tokens = as_array("tokens", tokens, low=0)
    in_features = as_array("in_features", in_features, low=1, whole=True)
    out_features = as_array("out_features", out_features, low=1, whole=True)
    return 2.0 * tokens * in_features * out_features


# ---------------------------------------------------------------------------------------------
# The machine


def cpu_name() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` (or :func:`platform.processor`)."""
    cpuinfo = Path("/proc/cpuinfo")
    for line in cpuinfo.read_text().splitlines() if cpuinfo.exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "cpu"


def last_level_cache_bytes(device: str = "cpu") -> int | None:
    """Bytes of the largest cache: the CPU's last level (sysfs) or the GPU's L2; ``None`` if unknown."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return getattr(torch.cuda.get_device_properties(device), "L2_cache_size", None)
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip()
        units = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30}
        sizes.append(int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text))
    return max(sizes) if sizes else None


def device_memory_bytes(device: str = "cpu") -> float:
    """Memory of the device in bytes: the GPU's, or the host's physical memory from the OS."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def _check_device(device: str):
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}") from error
    if parsed.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for, but torch sees no CUDA device here")
    return parsed


def _check_statistic(statistic: str) -> str:
    if statistic not in ("median", "best"):
        raise ValueError(f"statistic must be 'median' or 'best', got {statistic!r}")
    return statistic


def _check_dtype(dtype: str):
    import torch

    value = getattr(torch, dtype, None) if isinstance(dtype, str) else None
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise ValueError(f"dtype must be a torch floating-point type such as {', '.join(DTYPES)}, got {dtype!r}")
    return value


@contextlib.contextmanager
def _threads(threads: int | None):
    """Run the block with ``threads`` torch threads (``None``: as they are), then restore."""
    import torch

    before = torch.get_num_threads()
    if threads is not None:
        if int(threads) != threads or threads < 1:
            raise ValueError(f"threads must be a whole number >= 1, got {threads!r}")
        torch.set_num_threads(int(threads))
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


CLOCKS = ("wall", "cpu")
"""How a CPU call is timed: the wall clock, or the calling thread's CPU time (one torch thread only)."""


def _check_clock(clock: str, device) -> str:
    import torch

    if clock not in CLOCKS:
        raise ValueError(f"clock must be 'wall' or 'cpu', got {clock!r}")
    if clock == "cpu" and (torch.device(device).type != "cpu" or torch.get_num_threads() != 1):
        raise ValueError("clock='cpu' (the calling thread's CPU time) needs device 'cpu' and one torch thread, "
                         f"got {device!r} with {torch.get_num_threads()} threads")
    return clock


def _time_calls(function, calls: int, device, after=None, clock: str = "wall") -> list[float]:
    """Seconds of each of ``calls`` calls of ``function()`` after one untimed call.

    CUDA events on a GPU; on a CPU the wall clock or (``clock="cpu"``) the calling thread's CPU time,
    which leaves out the time a shared machine keeps the thread waiting. ``after()``, if given, runs
    untimed after every call.
    """
    import torch

    read = time.thread_time if _check_clock(clock, device) == "cpu" else time.perf_counter
    after = after or (lambda: None)
    function()
    after()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        events = []
        for _ in range(calls):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            function()
            end.record()
            events.append((start, end))
            after()
        torch.cuda.synchronize(device)
        return [start.elapsed_time(end) / 1e3 for start, end in events]
    seconds = []
    for _ in range(calls):
        tick = read()
        function()
        seconds.append(read() - tick)
        after()
    return seconds


# ---------------------------------------------------------------------------------------------
# Measuring


def streaming_bandwidth(device: str = "cpu", array_bytes: int | None = None, repeats: int = 5,
                        clock: str = "wall") -> pd.DataFrame:
    """STREAM copy and triad bandwidth of a device.

    Parameters
    ----------
    device : str
        ``"cpu"`` or ``"cuda"``.
    array_bytes : int, optional
        Bytes of each array (float32 elements; the element type does not change the bytes moved).
        Default: four times the last-level cache and at least 128 MiB, as STREAM asks.
    repeats : int, default 5
        Timed passes per kernel, after one untimed pass.
    clock : str, default "wall"
        ``"cpu"``: the thread's CPU time (one torch thread on a shared CPU; see :data:`CLOCKS`).

    Returns
    -------
    pandas.DataFrame
        One row per kernel: ``kernel``, ``array_bytes``, ``bytes_counted`` (per pass),
        ``best_seconds``, ``median_seconds``, ``bandwidth`` (best, bytes/s) and ``median_bandwidth``.
    """
    import torch

    device = _check_device(device)
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if array_bytes is None:
        array_bytes = max(4 * (last_level_cache_bytes(device) or 0), 128 * _MIB)
    elements = int(array_bytes) // 4
    if elements < 1:
        raise ValueError(f"array_bytes must be >= 4, got {array_bytes}")
    a = torch.empty(elements, dtype=torch.float32, device=device).fill_(0.0)
    b = torch.empty_like(a).fill_(1.0)
    c = torch.empty_like(a).fill_(2.0)
    kernels = {"copy": lambda: a.copy_(b), "triad": lambda: torch.add(b, c, alpha=3.0, out=a)}
    rows = []
    for kernel, function in kernels.items():
        seconds = _time_calls(function, repeats, device, clock=clock)
        counted = float(stream_bytes(kernel, elements * 4))
        best, median = min(seconds), statistics.median(seconds)
        rows.append({"kernel": kernel, "array_bytes": elements * 4, "bytes_counted": counted,
                     "best_seconds": best, "median_seconds": median, "bandwidth": counted / best,
                     "median_bandwidth": counted / median})
    return pd.DataFrame(rows)


def gemm_curve(tokens=GEMM_TOKENS, in_features: int = 3584, out_features: int = 2560, device: str = "cpu",
               dtype: str = "float32", repeats: int = 3, from_memory: bool = True, seed: int = 0,
               clock: str = "wall") -> pd.DataFrame:
    """Achieved FLOP/s of ``torch.nn.functional.linear`` against the tokens ``M``.

    Parameters
    ----------
    tokens : sequence of int
        Rows M of the activations.
    in_features, out_features : int
        K and N of the weight, stored ``N x K`` as ``nn.Linear`` stores it (default: one
        Qwen2-57B-A14B expert's gate projection, 3584 -> 2560).
    device, dtype : str
        Where and in which type.
    repeats : int, default 3
        Timed calls per M, after one untimed call.
    from_memory : bool, default True
        Rotate over enough weight copies (together four times the last-level cache) that every
        call reads its weight from memory, as a decode step does; ``False`` reuses one weight, which
        then sits in cache when it fits (the arithmetic and call cost alone).
    seed : int
        Seed of the random values.
    clock : str, default "wall"
        As in :func:`streaming_bandwidth`.

    Returns
    -------
    pandas.DataFrame
        One row per M: ``tokens``, ``in_features``, ``out_features``, ``flops``,
        ``arithmetic_intensity`` (FLOPs per byte of weight, input and output), ``best_seconds``,
        ``median_seconds``, ``flop_per_s`` (best), ``median_flop_per_s`` and ``weight_bandwidth``
        (weight bytes per best second: the rate at which the product reads its weight).
    """
    import torch

    device, torch_dtype = _check_device(device), _check_dtype(dtype)
    tokens = [int(m) for m in as_array("tokens", list(tokens), low=1, whole=True).ravel()]
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    flops = gemm_flops(tokens, in_features, out_features)
    value_bytes = torch.tensor([], dtype=torch_dtype).element_size()
    weight_bytes = in_features * out_features * value_bytes
    copies = max(1, math.ceil(4 * (last_level_cache_bytes(device) or 0) / weight_bytes)) if from_memory else 1
    generator = torch.Generator(device=device).manual_seed(seed)
    size = out_features * in_features
    weights = torch.empty(copies * size, dtype=torch_dtype, device=device).uniform_(-1, 1, generator=generator)

    calls = itertools.count()

    def weight():  # the next copy in turn (the least recently read), stored as nn.Linear stores it
        i = next(calls) % copies
        return weights[i * size:(i + 1) * size].view(out_features, in_features)

    rows = []
    with torch.no_grad():
        for m, flop in zip(tokens, flops):
            x = torch.empty(m, in_features, dtype=torch_dtype, device=device).uniform_(-1, 1, generator=generator)
            seconds = _time_calls(lambda: torch.nn.functional.linear(x, weight()), repeats, device, clock=clock)
            best, median = min(seconds), statistics.median(seconds)
            moved = weight_bytes + value_bytes * m * (in_features + out_features)
            rows.append({"tokens": m, "in_features": in_features, "out_features": out_features,
                         "flops": float(flop), "arithmetic_intensity": flop / moved, "best_seconds": best,
                         "median_seconds": median, "flop_per_s": flop / best, "median_flop_per_s": flop / median,
                         "weight_bandwidth": weight_bytes / best})
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class RooflineMeasurement:
    """A measured roofline: the Hardware record, the curves behind it and how they were taken.

    Attributes
    ----------
    hardware : Hardware
        ``peak_flops`` = best GEMM FLOP/s over M, ``memory_bandwidth`` = best STREAM bandwidth.
    bandwidth : pandas.DataFrame
        :func:`streaming_bandwidth`'s table.
    gemm : pandas.DataFrame
        :func:`gemm_curve`'s table (weights read from memory).
    settings : dict
        device, dtype, threads, repeats, cache and array sizes, date, torch version.
    """

    hardware: Hardware
    bandwidth: pd.DataFrame
    gemm: pd.DataFrame
    settings: dict

    @property
    def ridge_point(self) -> float:
        """Eq. 1 for this machine in this dtype (FLOP/byte)."""
        return self.hardware.ridge_point

    def as_dict(self) -> dict:
        """The curves and settings as plain JSON values (a sidecar's ``roofline_measurement``)."""
        return {"settings": dict(self.settings), "bandwidth": self.bandwidth.to_dict("records"),
                "gemm": self.gemm.to_dict("records")}

    def sidecar_entries(self) -> dict:
        """``{"hardware": Hardware.as_dict(), "roofline_measurement": as_dict()}`` for a sweep's sidecar."""
        return {"hardware": self.hardware.as_dict(), "roofline_measurement": self.as_dict()}

    @classmethod
    def from_sidecar(cls, sidecar: dict) -> "RooflineMeasurement":
        """The measurement stored by :meth:`sidecar_entries` (in a sweep's sidecar or a ``--json`` file)."""
        if "hardware" not in sidecar or "roofline_measurement" not in sidecar:
            raise ValueError("the sidecar holds no measured roofline (keys 'hardware' and 'roofline_measurement')")
        values = sidecar["roofline_measurement"]
        return cls(Hardware.from_dict(sidecar["hardware"]), pd.DataFrame(values["bandwidth"]),
                   pd.DataFrame(values["gemm"]), dict(values["settings"]))


def measure_roofline(device: str = "cpu", dtype: str = "float32", threads: int | None = None,
                     tokens=None, in_features: int | None = None, out_features: int | None = None,
                     array_bytes: int | None = None, repeats: int | None = None,
                     quick: bool = False, clock: str = "wall") -> RooflineMeasurement:
    """Measure the roofline of this machine: STREAM bandwidth and GEMM FLOP/s against M.

    Its time grows with the last-level cache, four times which its STREAM arrays and its GEMM weight
    copies fill: 20 s with the defaults and 2 s with ``quick`` (small arrays and shapes, for tests)
    on one of this project's 2-core VMs, which reports a 503 MB cache. The numbers are the best of
    the repeats (as STREAM reports); medians are kept in the curves.

    Parameters
    ----------
    device : str, default "cpu"
        ``"cpu"`` or ``"cuda"`` (timed with CUDA events and synchronisation).
    dtype : str, default "float32"
        Type of the GEMMs (the sweeps' dtype).
    threads : int, optional
        torch threads during the measurement (default: ``torch.get_num_threads()``, the sweeps'
        count); restored afterwards. Ignored on CUDA beyond being recorded.
    tokens : sequence of int, optional
        M values of the GEMM sweep (default :data:`GEMM_TOKENS`, on CUDA up to 16384; quick: 1, 4, 16, 64).
    in_features, out_features : int, optional
        Weight shape (default: a Qwen2-57B-A14B expert's gate projection, from :mod:`moesd.zoo`;
        quick: 256 x 256).
    array_bytes : int, optional
        Bytes of each STREAM array (default: see :func:`streaming_bandwidth`; quick: 8 MiB).
    repeats : int, optional
        Timed repeats per kernel and per M (default 5 for STREAM and 3 per M; quick: 2).
    quick : bool, default False
        Small sizes for tests: the numbers are then not the machine's roofline.
    clock : str, default "wall"
        ``"cpu"``: time in the thread's CPU time (one thread on a shared CPU; see :data:`CLOCKS`).

    Returns
    -------
    RooflineMeasurement
    """
    import torch

    from moesd.zoo import get_model

    torch_device = _check_device(device)
    _check_dtype(dtype)
    expert = get_model("qwen2-57b-a14b").config
    if tokens is None:
        tokens = (1, 4, 16, 64) if quick else GEMM_TOKENS + ((4096, 8192, 16384) if torch_device.type == "cuda" else ())
    in_features = in_features or (256 if quick else expert["hidden_size"])
    out_features = out_features or (256 if quick else expert["moe_intermediate_size"])
    if quick and array_bytes is None:
        array_bytes = 8 * _MIB
    stream_repeats, gemm_repeats = (repeats, repeats) if repeats else ((2, 2) if quick else (5, 3))
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    with _threads(threads) as used_threads:
        _check_clock(clock, torch_device)
        bandwidth = streaming_bandwidth(device, array_bytes, stream_repeats, clock)
        gemm = gemm_curve(tokens, in_features, out_features, device, dtype, gemm_repeats, clock=clock)
    cache = last_level_cache_bytes(torch_device)
    is_cuda = torch_device.type == "cuda"
    name = torch.cuda.get_device_name(torch_device) if is_cuda else cpu_name()
    name += f" ({dtype}), measured" if is_cuda else f" ({used_threads} threads, {dtype}), measured"
    best_stream = bandwidth.loc[bandwidth["bandwidth"].idxmax()]
    best_gemm = gemm.loc[gemm["flop_per_s"].idxmax()]
    source = (f"measured by moesd.measure.hardware.measure_roofline on {date}{' (quick)' if quick else ''}: "
              f"peak = best {dtype} GEMM (torch.nn.functional.linear, weight {out_features} x {in_features} "
              f"read from memory) over M = {min(gemm['tokens'])}..{max(gemm['tokens'])}, "
              f"{best_gemm['flop_per_s'] / 1e9:.4g} GFLOP/s at M = {int(best_gemm['tokens'])}; bandwidth = best STREAM "
              f"{best_stream['kernel']} over {best_stream['array_bytes'] / _MIB:.0f} MiB arrays, "
              f"{best_stream['bandwidth'] / 1e9:.4g} GB/s; best of {gemm_repeats} (GEMM) and {stream_repeats} "
              f"(STREAM) repeats; {'CUDA events' if is_cuda else f'{used_threads} torch threads'}, "
              f"{'thread CPU time, ' if clock == 'cpu' else ''}"
              f"torch {torch.__version__}")
    hardware = Hardware(name=name, peak_flops=float(best_gemm["flop_per_s"]),
                        memory_bandwidth=float(best_stream["bandwidth"]),
                        memory_bytes=device_memory_bytes(torch_device), source=source)
    settings = {"device": str(torch_device), "dtype": dtype, "threads": None if is_cuda else used_threads,
                "quick": quick, "date": date, "torch": torch.__version__, "last_level_cache_bytes": cache,
                "stream_repeats": stream_repeats, "gemm_repeats": gemm_repeats, "clock": clock}
    return RooflineMeasurement(hardware, bandwidth, gemm, settings)


@functools.lru_cache(maxsize=None)
def _measured_once(device: str, dtype: str, threads: int) -> RooflineMeasurement:
    return measure_roofline(device, dtype, threads)


def measured_roofline(device: str = "cpu", dtype: str = "float32", threads: int | None = None) -> RooflineMeasurement:
    """:func:`measure_roofline` with its defaults, measured once per process for each device, dtype and threads.

    What a sweep stores in its sidecar: several sweeps in one process (a test session, a notebook)
    share one measurement instead of re-measuring for each.
    """
    import torch

    return _measured_once(device, dtype, threads or torch.get_num_threads())


# ---------------------------------------------------------------------------------------------
# Where a decode step's time goes


def _meta_model(model: str, layers: int | None, width: float, top_k: int | None = None):
    """The architecture on the meta device (shapes only, no memory) and its :class:`~moesd.zoo.ModelSpec`."""
    import torch
    from transformers import AutoModelForCausalLM

    from moesd.zoo import get_model

    spec = get_model(model)
    config = spec.hf_config(layers, top_k, width)
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(config)
    return spec, config, meta


def step_cost(model: str = "qwen2-57b-a14b", batch_sizes=(1, 8, 24, 100), layers: int | None = 4,
              width: float = 1 / 8, context: int = 64, bytes_per_value: float = 4,
              top_k: int | None = None) -> pd.DataFrame:
    """Bytes read and FLOPs of one decode step (one new token per sequence) of a :mod:`moesd.zoo` shape.

    Bytes: every weight except the input embedding (of which only ``B`` rows are read; a tied
    embedding counts once, as the output layer), ``N(B)`` of the ``E`` experts of each MoE layer
    (Eq. 8, uniform routing) and the KV cache of ``context`` tokens per sequence. FLOPs: two per
    weight per token it multiplies (``B`` tokens for the dense weights, ``K`` experts per token) and
    ``4 B context`` per attention head width for scores and values.

    Parameters
    ----------
    model : str
        :data:`moesd.zoo.MODELS` name.
    batch_sizes : sequence of int
        Sequences B, one token each.
    layers, width, top_k
        As in :meth:`moesd.zoo.ModelSpec.config_dict`.
    context : int
        Tokens already in the KV cache of each sequence.
    bytes_per_value : float, default 4
        Bytes per weight and cache value (4 for float32, 2 for bfloat16).

    Returns
    -------
    pandas.DataFrame
        Per batch size: ``batch_size``, ``active_experts`` (per MoE layer, Eq. 8),
        ``tokens_per_expert`` (Eq. 10), ``moe_layers``, ``dense_bytes``, ``expert_bytes``,
        ``cache_bytes``, ``bytes``, ``dense_flops``, ``expert_flops``, ``attention_flops``, ``flops``.
    """
    batch = as_array("batch_sizes", list(batch_sizes), low=1, whole=True).ravel()
    as_array("context", context, low=0, whole=True)
    as_array("bytes_per_value", bytes_per_value, low=0, low_open=True)
    spec, config, meta = _meta_model(model, layers, width, top_k)
    experts = {name: p for name, p in meta.named_parameters() if ".mlp.experts." in name}
    moe_layers = len({name.split(".mlp.experts.")[0] for name in experts})
    embedding = meta.get_input_embeddings().weight
    tied = embedding is meta.get_output_embeddings().weight
    dense = [p for name, p in meta.named_parameters() if name not in experts and (tied or p is not embedding)]
    dense_values = sum(p.numel() for p in dense)
    dense_weights = sum(p.numel() for p in dense if p.dim() == 2)
    E, K = (spec.num_experts, config.num_experts_per_tok) if spec.is_moe else (1, 0)
    values_per_expert = sum(p.numel() for p in experts.values()) / max(moe_layers, 1) / E
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    active = expected_active_experts(batch, E, K) if spec.is_moe else np.zeros_like(batch)
    per_expert = tokens_per_expert(batch, K / E) if spec.is_moe else np.zeros_like(batch)
    cache_values = 2 * config.num_hidden_layers * batch * context * kv_heads * head_dim
    frame = pd.DataFrame({
        "batch_size": batch.astype(int), "active_experts": active, "tokens_per_expert": per_expert,
        "moe_layers": moe_layers,
        "dense_bytes": float(dense_values * bytes_per_value),
        "expert_bytes": active * moe_layers * values_per_expert * bytes_per_value,
        "cache_bytes": cache_values * bytes_per_value,
        "dense_flops": 2.0 * batch * dense_weights,
        "expert_flops": 2.0 * batch * K * moe_layers * values_per_expert,
        "attention_flops": 4.0 * batch * context * heads * head_dim * config.num_hidden_layers,
    })
    frame["bytes"] = frame["dense_bytes"] + frame["expert_bytes"] + frame["cache_bytes"]
    frame["flops"] = frame["dense_flops"] + frame["expert_flops"] + frame["attention_flops"]
    return frame


def forward_seconds(model, batch_size: int, tokens_per_sequence: int = 1, context: int = 64,
                    repeats: int = 7, seed: int = 0, clock: str = "wall") -> list[float]:
    """Seconds of each of ``repeats`` forwards of ``tokens_per_sequence`` new tokens for ``batch_size`` sequences.

    The timing of the sweeps' forward study: a KV cache of ``context`` tokens is filled first; every
    timed forward extends it and is cropped off again; one untimed forward comes first.
    """
    import torch

    device = next(model.parameters()).device
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        prompt = torch.randint(1, vocab, (batch_size, context), generator=generator).to(device)
        cache = model(input_ids=prompt, use_cache=True).past_key_values
        new = torch.randint(1, vocab, (batch_size, tokens_per_sequence), generator=generator).to(device)
        positions = torch.arange(context, context + tokens_per_sequence, device=device).expand(batch_size, -1)

        return _time_calls(lambda: model(input_ids=new, position_ids=positions, past_key_values=cache, use_cache=True),
                           repeats, device, after=lambda: cache.crop(-tokens_per_sequence),  # a negative count
                           clock=clock)


def expert_dispatch_seconds(model: str = "qwen2-57b-a14b", dtype: str = "float32", device: str = "cpu",
                            repeats: int = 7, width: float = OVERHEAD_WIDTH, statistic: str = "median",
                            clock: str = "wall") -> dict:
    """Seconds one activated expert adds to a MoE layer's call, at negligible weights.

    Times the routed-experts module of one layer of ``model`` at ``width`` (every width at its floor:
    the weights fit in the first cache levels and the FLOPs are negligible) with routing built to
    activate exactly ``n`` of the ``E`` experts, for ``n = K, 2K, ..., E``, and fits the medians
    (``statistic="best"``: the fastest of the repeats) by a line: its slope is the per-expert
    dispatch cost (the loop's indexing, two matrix products, activation, scaling and scatter of one
    expert), its intercept the call's fixed cost.

    Returns
    -------
    dict
        ``per_expert_seconds`` (slope), ``fixed_seconds`` (intercept) and ``table``
        (a DataFrame of ``experts``, ``median_seconds`` and ``best_seconds``).
    """
    import torch

    from moesd.zoo import get_model

    spec = get_model(model)
    if not spec.is_moe:
        raise ValueError(f"model must be a MoE architecture; {model} is dense")
    device = _check_device(device)
    net = spec.random_model(1, None, width, dtype=_check_dtype(dtype), device=device)
    experts = next(module for name, module in net.named_modules() if name.endswith("mlp.experts"))
    E, K = spec.num_experts, spec.top_k
    tokens = E
    hidden = torch.randn(tokens, net.config.hidden_size, dtype=net.dtype, device=device)
    weights = torch.full((tokens, K), 1.0 / K, dtype=net.dtype, device=device)
    rows = []
    with torch.no_grad():
        for n in range(K, E + 1, K):
            index = (torch.arange(tokens)[:, None] * K + torch.arange(K)[None, :]) % n
            index = index.to(device)
            seconds = _time_calls(lambda: experts(hidden, index, weights), repeats, device, clock=clock)
            rows.append({"experts": n, "median_seconds": statistics.median(seconds), "best_seconds": min(seconds)})
    table = pd.DataFrame(rows)
    slope, intercept = np.polyfit(table["experts"], table[f"{_check_statistic(statistic)}_seconds"], 1)
    return {"per_expert_seconds": float(slope), "fixed_seconds": float(intercept), "table": table}


def _matmul_seconds(shapes, tokens, dtype: str, device: str, repeats: int, from_memory: bool,
                    statistic: str, clock: str) -> dict:
    """Median (or best) seconds of ``linear`` per (out, in) weight shape and M (see :func:`gemm_curve`)."""
    seconds = {}
    for out_features, in_features in sorted(set(shapes)):
        curve = gemm_curve(sorted(set(tokens)), in_features, out_features, device, dtype, repeats, from_memory,
                           clock=clock)
        for m, value in zip(curve["tokens"], curve[f"{statistic}_seconds"]):
            seconds[out_features, in_features, int(m)] = value
    return seconds


def _step_matmuls(seconds: dict, dense_shapes, expert_shapes, batch_size: int, tokens_per_expert: float,
                  experts: float, call: dict) -> float:
    """Seconds of a step's matrix products, net of the call cost: dense weights at M = B, experts at M = T_exp."""
    total = sum(seconds[out, inp, batch_size] - call[batch_size] for out, inp in dense_shapes)
    if experts:
        low, high = max(1, math.floor(tokens_per_expert)), max(1, math.ceil(tokens_per_expert))
        for out, inp in expert_shapes:
            at = [seconds[out, inp, low] - call[low], seconds[out, inp, high] - call[high]]
            total += experts * float(np.interp(tokens_per_expert, [low, high + (high == low)], at))
    return total


def decode_step_breakdown(model: str = "qwen2-57b-a14b", layers: int | None = 1, width: float = 1.0,
                          batch_sizes=(1, 8, 24, 100), context: int = 64, dtype: str = "bfloat16",
                          device: str = "cpu", threads: int | None = None, repeats: int = 7,
                          roofline: RooflineMeasurement | None = None, dispatch: dict | None = None,
                          statistic: str = "median", clock: str = "wall", seed: int = 0) -> pd.DataFrame:
    """Where a measured decode step of a scaled model goes: weights, compute, dispatch, other overhead.

    For each batch size ``B`` (one new token per sequence over a KV cache of ``context`` tokens):

    * ``measured_s``: median (or best) step time of ``model`` at ``layers`` and ``width`` (random weights,
      the sweeps' experts implementation);
    * ``streaming_s``: :func:`step_cost`'s bytes (dense weights, ``N(B)`` experts per MoE layer by
      Eq. 8, KV cache) over the measured STREAM bandwidth: the floor weight streaming sets;
    * ``compute_s``: the step's matrix products timed one by one with the weight in cache (dense
      weights at ``M = B``, each of the ``N(B)`` experts at ``M = T_exp(B)`` of Eq. 10, interpolated
      between whole M): FLOPs over the GEMM FLOP/s measured at the relevant M;
    * ``matmul_s``: the same products with every weight read from memory, as in the step: weight
      streaming and compute as the kernels achieve them (a matrix-vector product reads its weight
      slower than STREAM copies);
    * ``dispatch_s``: :func:`expert_dispatch_seconds` per expert x ``N(B)`` x MoE layers;
    * ``other_overhead_s``: the step of the same architecture at :data:`OVERHEAD_WIDTH` (weights
      negligible) minus its expert dispatch: every other call's fixed cost;
    * ``residual_s = measured - (matmul + dispatch + other overhead)``.

    The products' times are net of the cost of a call (a 2 x 2 weight at the same M), which the
    overhead parts already hold. Shares are of ``measured_s``; streaming and compute overlap
    inside ``matmul_s``, so their shares need not add up.

    Parameters
    ----------
    model, layers, width : as in :meth:`moesd.zoo.ModelSpec.random_model`
        Default: the CPU preset's target (Qwen2-57B-A14B shape, one layer at real width, in bf16).
    batch_sizes : sequence of int
    context : int
    dtype, device : str
    threads : int, optional
        torch threads (default: as they are).
    repeats : int
        Timed repeats of every timing.
    roofline : RooflineMeasurement, optional
        Measured roofline for the bandwidth (default: :func:`measure_roofline` now).
    dispatch : dict, optional
        A :func:`expert_dispatch_seconds` result to reuse (default: measured now, for MoE models).
    statistic : str, default "median"
        Each timing's median over the repeats, or ``"best"``: the fastest repeat (on a shared
        machine, interference only ever adds time).
    clock : str, default "wall"
        ``"cpu"``: every timing in the thread's CPU time (one torch thread on a shared CPU).
    seed : int

    Returns
    -------
    pandas.DataFrame
        :func:`step_cost`'s columns plus ``model``, ``layers``, ``width``, ``measured_s``,
        ``streaming_s``, ``compute_s``, ``matmul_s``, ``dispatch_s``, ``other_overhead_s``,
        ``residual_s`` and the shares ``streaming_share``, ``compute_share``, ``matmul_share``,
        ``dispatch_share``, ``other_overhead_share``, ``residual_share``.
    """
    import torch

    from moesd.zoo import get_model

    _check_device(device)
    torch_dtype = _check_dtype(dtype)
    pick = {"median": statistics.median, "best": min}[_check_statistic(statistic)]
    spec = get_model(model)
    bytes_per_value = torch.tensor([], dtype=torch_dtype).element_size()
    cost = step_cost(model, batch_sizes, layers, width, context, bytes_per_value)
    batch = [int(b) for b in cost["batch_size"]]
    _, _, meta = _meta_model(model, layers, width)
    embedding = meta.get_input_embeddings().weight
    dense_shapes = [tuple(p.shape) for name, p in meta.named_parameters()
                    if p.dim() == 2 and ".mlp.experts." not in name and p is not embedding]
    dense_shapes += [] if embedding is not meta.get_output_embeddings().weight else [tuple(embedding.shape)]
    expert_names = [name for name, _ in meta.named_parameters() if ".mlp.experts." in name]
    first_layer = expert_names[0].split(".mlp.experts.")[0] + ".mlp.experts." if expert_names else None
    expert_shapes = [tuple(p.shape[1:]) for name, p in meta.named_parameters()
                     if first_layer and name.startswith(first_layer)]
    expert_tokens = {max(1, f(t)) for t in cost["tokens_per_expert"] for f in (math.floor, math.ceil)}
    with _threads(threads):
        _check_clock(clock, device)
        roofline = roofline or measure_roofline(device, dtype, clock=clock)
        if spec.is_moe and dispatch is None:
            dispatch = expert_dispatch_seconds(model, dtype, device, repeats, statistic=statistic, clock=clock)
        per_expert = dispatch["per_expert_seconds"] if spec.is_moe else 0.0
        step = {}
        for scale in (width, OVERHEAD_WIDTH):
            net = spec.random_model(layers, None, scale, seed=seed, dtype=torch_dtype, device=device)
            for b in batch:
                step[scale, b] = pick(forward_seconds(net, b, 1, context, repeats, seed, clock))
            del net
        all_tokens = set(batch) | expert_tokens
        call = _matmul_seconds([(2, 2)], all_tokens, dtype, device, repeats, False, statistic, clock)
        call = {m: call[2, 2, m] for m in all_tokens}
        products = {}
        for from_memory in (False, True):
            products[from_memory] = _matmul_seconds(dense_shapes, batch, dtype, device, repeats, from_memory,
                                                    statistic, clock)
            products[from_memory].update(_matmul_seconds(expert_shapes, expert_tokens, dtype, device, repeats,
                                                         from_memory, statistic, clock))
    rows = []
    for _, row in cost.iterrows():
        b = int(row["batch_size"])
        experts = row["active_experts"] * row["moe_layers"]
        compute, matmul = (_step_matmuls(products[cold], dense_shapes, expert_shapes, b, row["tokens_per_expert"],
                                         experts, call) for cold in (False, True))
        dispatch_s = per_expert * experts
        other = step[OVERHEAD_WIDTH, b] - dispatch_s
        rows.append({"model": model, "layers": layers, "width": width, "measured_s": step[width, b],
                     "streaming_s": row["bytes"] / roofline.hardware.memory_bandwidth, "compute_s": compute,
                     "matmul_s": matmul, "dispatch_s": dispatch_s, "other_overhead_s": other,
                     "residual_s": step[width, b] - matmul - dispatch_s - other})
    frame = pd.concat([cost, pd.DataFrame(rows)], axis=1)
    for part in ("streaming", "compute", "matmul", "dispatch", "other_overhead", "residual"):
        frame[f"{part}_share"] = frame[f"{part}_s"] / frame["measured_s"]
    return frame


def study_seconds(target_seconds, draft_seconds, batch_sizes, gammas=(2, 3, 4), repeats: int = 3,
                  rounds: int = 32, ar_steps: int = 32, settings: int = 1) -> float:
    """Timed seconds of a steady-state e2e study from step times (warm-up and prefill not counted).

    Each point (B, gamma) times ``ar_steps`` autoregressive steps ``T_T(B, 1)`` and ``rounds`` SD
    rounds of ``gamma`` draft steps ``T_D(B)`` and one verification ``T_T(B, gamma + 1)``.

    Parameters
    ----------
    target_seconds : callable
        ``target_seconds(batch_size, tokens_per_sequence)`` -> seconds of a target forward.
    draft_seconds : callable
        ``draft_seconds(batch_size)`` -> seconds of a draft step.
    batch_sizes, gammas : sequence of int
    repeats : int
        Repeats of every point.
    rounds, ar_steps : int
        Timed SD rounds and AR steps per point.
    settings : int
        Further settings every point is run for (e.g. 6 values of K in the sparsity study).

    Returns
    -------
    float
        Seconds.
    """
    total = 0.0
    for b in batch_sizes:
        for gamma in gammas:
            total += ar_steps * target_seconds(b, 1) + rounds * (gamma * draft_seconds(b) + target_seconds(b, gamma + 1))
    return float(total * repeats * settings)
