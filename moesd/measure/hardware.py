"""The measured roofline of the machine that measures: its streaming bandwidth and GEMM FLOP/s curve.

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
Every sweep stores both in its sidecar (``moesd.measure.result_file.environment``).

:func:`matmul_seconds` reads the GEMM curve per weight shape, and :func:`torch_threads`,
:func:`parse_device` and :func:`parse_dtype` set and check what a measurement runs on: the
decode-step breakdown (:mod:`moesd.measure.breakdown`) and the regime check
(:mod:`moesd.measure.regime`) build on them. Calls are timed by :func:`moesd.engine.timing.time_calls`.

torch is imported inside the functions that measure; the records and arithmetic need only pandas.
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
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from moesd._checks import as_array
from moesd.engine.timing import check_clock, time_calls
from moesd.theory.roofline import Hardware

STREAM_ARRAYS = {"copy": 2, "triad": 3}
"""Arrays a STREAM kernel reads or writes once per element: copy ``a = b``, triad ``a = b + s c``."""

GEMM_TOKENS = tuple(2 ** i for i in range(12))
"""Default tokens M of the GEMM sweep on a CPU: 1, 2, 4, ..., 2048 (on CUDA up to 16384, where a
GPU's tensor cores need more tokens to reach their peak)."""

DTYPES = ("float32", "bfloat16", "float16")
"""The GEMM types the ``moesd hardware --measure`` command offers."""


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


def parse_device(device: str):
    """The ``torch.device`` of ``"cpu"`` or ``"cuda"`` (``"cuda:N"``); a ``ValueError`` for anything else or an absent GPU."""
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


def parse_dtype(dtype: str):
    """The torch floating-point type named ``dtype`` (e.g. one of :data:`DTYPES`); a ``ValueError`` otherwise."""
    import torch

    value = getattr(torch, dtype, None) if isinstance(dtype, str) else None
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise ValueError(f"dtype must be a torch floating-point type such as {', '.join(DTYPES)}, got {dtype!r}")
    return value


@contextlib.contextmanager
def torch_threads(threads: int | None):
    """Run the block with ``threads`` torch threads (``None``: as they are), then restore the count.

    Yields the number of threads in use; a ``ValueError`` for a count that is not a whole number >= 1.
    """
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
        ``"cpu"``: the thread's CPU time (one torch thread on a shared CPU; see :data:`moesd.engine.timing.CLOCKS`).

    Returns
    -------
    pandas.DataFrame
        One row per kernel: ``kernel``, ``array_bytes``, ``bytes_counted`` (per pass),
        ``best_seconds``, ``median_seconds``, ``bandwidth`` (best, bytes/s) and ``median_bandwidth``.
    """
    import torch

    device = parse_device(device)
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
        seconds = time_calls(function, repeats, device, clock=clock)
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

    device, torch_dtype = parse_device(device), parse_dtype(dtype)
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
            seconds = time_calls(lambda: torch.nn.functional.linear(x, weight()), repeats, device, clock=clock)
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
        ``"cpu"``: time in the thread's CPU time (one thread on a shared CPU; see :data:`moesd.engine.timing.CLOCKS`).

    Returns
    -------
    RooflineMeasurement
    """
    import torch

    from moesd.zoo import get_model

    torch_device = parse_device(device)
    parse_dtype(dtype)
    expert = get_model("qwen2-57b-a14b").config
    if tokens is None:
        tokens = (1, 4, 16, 64) if quick else GEMM_TOKENS + ((4096, 8192, 16384) if torch_device.type == "cuda" else ())
    in_features = in_features or (256 if quick else expert["hidden_size"])
    out_features = out_features or (256 if quick else expert["moe_intermediate_size"])
    if quick and array_bytes is None:
        array_bytes = 8 * _MIB
    stream_repeats, gemm_repeats = (repeats, repeats) if repeats else ((2, 2) if quick else (5, 3))
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    with torch_threads(threads) as used_threads:
        check_clock(clock, torch_device)
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


def matmul_seconds(shapes, tokens, dtype: str, device: str, repeats: int, from_memory: bool,
                   statistic: str, clock: str) -> dict:
    """Median (or best) seconds of ``linear`` per weight shape and M, from :func:`gemm_curve`.

    Parameters
    ----------
    shapes : iterable of (int, int)
        Weight shapes ``(out_features, in_features)``; each distinct one is timed once.
    tokens : iterable of int
        Rows M of the activations.
    dtype, device : str
        As in :func:`gemm_curve`.
    repeats : int
        Timed calls per shape and M.
    from_memory : bool
        As in :func:`gemm_curve`: every call reads its weight from memory, or one weight stays in cache.
    statistic : str
        ``"median"`` or ``"best"``: which seconds of the curve to keep.
    clock : str
        One of :data:`moesd.engine.timing.CLOCKS`.

    Returns
    -------
    dict
        Seconds keyed by ``(out_features, in_features, M)``.
    """
    seconds = {}
    for out_features, in_features in sorted(set(shapes)):
        curve = gemm_curve(sorted(set(tokens)), in_features, out_features, device, dtype, repeats, from_memory,
                           clock=clock)
        for m, value in zip(curve["tokens"], curve[f"{statistic}_seconds"]):
            seconds[out_features, in_features, int(m)] = value
    return seconds
