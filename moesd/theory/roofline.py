"""Rooflines: when an FFN or a layer of experts is memory-bound (the paper's Eqs. 1 and 11).

A kernel is memory-bound while its arithmetic intensity AI (FLOPs per byte moved) is below
the hardware's ridge point ``RP = peak FLOP/s / memory bandwidth`` (Eq. 1). For a bf16 GEMM
whose traffic is its weights, AI is about the number of tokens it processes, so a token
count can be read against RP directly. A layer of routed experts loads ``N(t)`` experts
for ``t`` tokens and gives each ``T_exp = t K / N(t)`` tokens, so its AI is ``T_exp``, not
``t``: sparse experts stay memory-bound to far larger batches than a dense FFN does.

The paper's fitted model replaces the hard roofline corner by the smooth ``G`` of Eq. 11
(:mod:`moesd.theory.growth`).
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from moesd._checks import UsageError, as_array, broadcast, finite_results
from moesd.theory.experts import expected_active_experts


@dataclass(frozen=True)
class Hardware:
    """Peak numbers of one accelerator, from its vendor's data sheet (or measured on the device).

    The first five fields are the data sheet's roofline; the rest, added for the whole-model
    performance model (:mod:`moesd.predictor.forward`), have defaults so older records still load.

    Attributes
    ----------
    name : str
        Product name.
    peak_flops : float
        Dense (not 2:4 sparse) bf16 tensor throughput (FLOP/s).
    memory_bandwidth : float
        Peak device memory bandwidth (bytes/s).
    memory_bytes : float
        Device memory (bytes).
    source : str
        Where the three numbers come from.
    fp8_flops : float or None
        Dense fp8 tensor throughput (FLOP/s); None where the device has no fp8 tensor cores (fp8
        weights are then multiplied at the bf16 rate).
    fp4_flops : float or None
        Dense 4-bit floating-point (FP4, NVFP4/MXFP4) tensor throughput (FLOP/s); None where the device
        has no FP4 tensor cores (4-bit weights are then dequantised and multiplied at the bf16 rate).
    fp32_flops : float or None
        fp32 throughput without tensor cores (FLOP/s), what a framework's default fp32 matmul gets;
        None where unknown (a measured record sets the rate it measured).
    interconnect_bandwidth : float
        GPU-to-GPU bandwidth of one device, both directions together as data sheets state it
        (bytes/s); 0 where the device has no peer link on record.
    interconnect_latency : float
        Fixed cost of one small collective (all-reduce) over that link (seconds).
    interconnect : str
        What the link is, and where its numbers come from.
    interconnect_peers : int
        Peers of a full mesh of direct links that share ``interconnect_bandwidth`` equally (7 for
        eight MI300X); 0 where a switch (NVSwitch) or a shared bus gives each GPU the whole bandwidth
        whatever the group. In a mesh, a tensor-parallel group of ``p`` GPUs uses ``p - 1`` of the links.
    gpus_per_node : int
        GPUs that ``interconnect`` joins: one server board (an NVLink or Infinity Fabric domain, or
        the PCIe slots of one server). Without an inter-node link :mod:`moesd.predictor.forward` prices tensor
        parallelism over this link only, so it refuses a larger group (default 1: no peers on record).
    internode_bandwidth : float
        Bandwidth of the network adapter each GPU has to other nodes, ONE direction (bytes/s): the NIC's
        line rate (400 Gb/s = 50 GB/s, and as much again the other way); 0 where none is on record.
    internode_latency : float
        Fixed cost of one small collective across nodes over that network (seconds).
    max_nodes : int
        Nodes of ``gpus_per_node`` GPUs that one tensor- or expert-parallel group may span in
        :mod:`moesd.predictor.forward` (default 1; more only with ``internode_bandwidth``).
    internode : str
        What the inter-node network is, and where its numbers come from.
    bandwidth_fraction, flops_fraction : float
        Fractions of ``memory_bandwidth`` and of the tensor peaks that measured kernels achieve, in (0, 1]
        (1 for a record whose peaks were themselves measured; no kernel beats its peak).
    efficiency_source : str
        Where the two fractions come from.
    """

    name: str
    peak_flops: float
    memory_bandwidth: float
    memory_bytes: float
    source: str
    fp8_flops: float | None = None
    fp32_flops: float | None = None
    interconnect_bandwidth: float = 0.0
    interconnect_latency: float = 0.0
    interconnect: str = ""
    interconnect_peers: int = 0
    gpus_per_node: int = 1
    bandwidth_fraction: float = 1.0
    flops_fraction: float = 1.0
    efficiency_source: str = ""
    fp4_flops: float | None = None
    internode_bandwidth: float = 0.0
    internode_latency: float = 0.0
    max_nodes: int = 1
    internode: str = ""

    def __post_init__(self) -> None:
        """Refuse, naming the field, a peak, memory or rate that is not a finite number in its range (a zero or
        infinite bandwidth would otherwise surface as a time of zero or infinity deep inside a prediction)."""
        positive = dict(low=0, low_open=True)
        domains = {"peak_flops": positive, "memory_bandwidth": positive, "memory_bytes": positive,
                   "fp8_flops": positive, "fp32_flops": positive, "fp4_flops": positive, "interconnect_bandwidth": dict(low=0),
                   "interconnect_latency": dict(low=0), "interconnect_peers": dict(low=0, whole=True),
                   "gpus_per_node": dict(low=1, whole=True), "bandwidth_fraction": dict(positive, high=1),
                   "flops_fraction": dict(positive, high=1), "internode_bandwidth": dict(low=0),
                   "internode_latency": dict(low=0), "max_nodes": dict(low=1, whole=True)}
        for field, domain in domains.items():
            value = getattr(self, field)
            if value is not None or field not in ("fp8_flops", "fp32_flops", "fp4_flops"):
                try:
                    as_array(f"hardware.{field}", value, **domain)
                except UsageError as error:
                    raise UsageError(f"{error} (Hardware record {self.name!r})") from None
        with np.errstate(over="ignore", under="ignore"):
            ridge = np.float64(self.peak_flops) / np.float64(self.memory_bandwidth)
        if not 0 < ridge < np.inf:
            raise UsageError(f"hardware.peak_flops / hardware.memory_bandwidth, the ridge point, is {ridge:g} FLOP/byte "
                             f"for {self.peak_flops:g} FLOP/s over {self.memory_bandwidth:g} bytes/s: not a number "
                             f"a float holds (Hardware record {self.name!r})")
        if self.max_nodes > 1 and not self.internode_bandwidth:
            raise UsageError(f"hardware.max_nodes must be 1 without an internode_bandwidth, got {self.max_nodes} "
                             f"(Hardware record {self.name!r})")

    @property
    def ridge_point(self) -> float:
        """Eq. 1: ``peak_flops / memory_bandwidth`` (FLOP/byte)."""
        return self.peak_flops / self.memory_bandwidth

    def as_dict(self) -> dict:
        """The record as plain JSON values (how sweep sidecars store the measuring device)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "Hardware":
        """The record stored by :meth:`as_dict`; unknown keys are refused, missing ones named."""
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - fields)
        if unknown:
            raise ValueError(f"unknown Hardware field(s) {', '.join(unknown)}")
        missing = sorted(f.name for f in dataclasses.fields(cls)
                         if f.name not in values and f.default is dataclasses.MISSING)
        if missing:
            raise ValueError(f"a Hardware record needs {', '.join(missing)}")
        return cls(**values)


RECORDS = Path(__file__).resolve().parents[1] / "records"
"""The package's data tables: hardware records, engine profiles, kernel benchmarks, shipped model configs."""

_SCALED = {"bf16_tflops": ("peak_flops", 1e12), "fp8_tflops": ("fp8_flops", 1e12), "fp4_tflops": ("fp4_flops", 1e12),
           "fp32_tflops": ("fp32_flops", 1e12), "bandwidth_gb_s": ("memory_bandwidth", 1e9),
           "memory_gb": ("memory_bytes", 1e9), "interconnect_gb_s": ("interconnect_bandwidth", 1e9)}
"""Keys of ``hardware.toml`` in units and the :class:`Hardware` field and factor each fills."""


def _fraction(value) -> float:
    """A number, or a text ``"a / b"`` (a measured value over the data sheet's) as ``a / b``."""
    if isinstance(value, str):
        numerator, _, denominator = value.partition("/")
        return float(numerator) / float(denominator)
    return float(value)


def load_hardware(path=None) -> tuple[dict, dict]:
    """The hardware records of a table (default: the package's ``records/hardware.toml``) and the devices it refuses.

    Each table of the file is one :class:`Hardware` record; its keys carry their units (``bf16_tflops``,
    ``bandwidth_gb_s``, ``internode_gbit_s``, ``*_s``...), fractions may be written ``"a / b"`` and texts may name
    entries of ``[fragments]`` as ``{name}``; ``[refused]`` maps device names to why they are not priced.

    Returns
    -------
    tuple of dict
        ``(records by name, reason by refused name)``.

    Raises
    ------
    ValueError
        For a key the table does not know, naming the file, the device and the key.
    """
    path = Path(path) if path is not None else RECORDS / "hardware.toml"
    with open(path, "rb") as file:
        table = tomllib.load(file)
    fragments, refused = table.pop("fragments", {}), table.pop("refused", {})
    fields = {f.name for f in dataclasses.fields(Hardware)}
    records = {}
    for name, row in table.items():
        values = {}
        for key, value in row.items():
            if key in _SCALED:
                values[_SCALED[key][0]] = value * _SCALED[key][1]
            elif key == "internode_gbit_s":
                values["internode_bandwidth"] = value / 8 * 1e9
            elif key.endswith("_latency_s"):
                values[key[:-2]] = value
            elif key in ("bandwidth_fraction", "flops_fraction"):
                values[key] = _fraction(value)
            elif key in fields and isinstance(value, str):
                for fragment, text in fragments.items():
                    value = value.replace("{" + fragment + "}", text)
                values[key] = value
            elif key in fields:
                values[key] = value
            else:
                raise ValueError(f"{path}: [{name}] has the unknown key {key!r}")
        records[name] = Hardware(name=name, **values)
    return records, refused


HARDWARE, REFUSED_HARDWARE = load_hardware()
"""Hardware records by name (``records/hardware.toml``); ``HARDWARE["H200"].ridge_point`` is about 206 FLOP/byte.
``REFUSED_HARDWARE`` maps devices that have no citable data-sheet peaks to why naming them is refused."""


def ridge_point(hardware) -> float:
    """Ridge point of a :class:`Hardware` record or of a name in :data:`HARDWARE` (Eq. 1).

    Returns
    -------
    float
        Peak FLOP/s over memory bandwidth (FLOP/byte).
    """
    return hardware_record(hardware).ridge_point


def hardware_record(hardware, argument: str = "hardware") -> Hardware:
    """The :class:`Hardware` record given, or named in :data:`HARDWARE` (in any case); a record checks its
    numbers when it is made.

    Raises
    ------
    UsageError
        (a ValueError) for another name or object, naming ``argument``.
    """
    if isinstance(hardware, str):
        names = {name.lower(): name for name in HARDWARE}
        if hardware.lower() in names:
            return HARDWARE[names[hardware.lower()]]
        refused = {name.lower(): name for name in REFUSED_HARDWARE}
        if hardware.lower() in refused:
            name = refused[hardware.lower()]
            raise UsageError(f"hardware {name}: {REFUSED_HARDWARE[name]}", argument)
    if not isinstance(hardware, Hardware):
        raise UsageError(f"hardware must be one of {', '.join(HARDWARE)} or a Hardware "
                         f"record, got {hardware!r}", argument)
    return hardware


@finite_results
def ffn_cost(tokens, d_model, d_ff, E=1, K=1, num_matrices=3, bytes_per_value=2):
    """FLOPs and memory traffic of one FFN layer, dense or a layer of routed experts.

    Each of the ``tokens`` tokens goes through ``K`` of ``E`` expert FFNs of width ``d_ff``;
    the layer loads the expected ``N(tokens)`` distinct experts (Eq. 8) once, reads each
    token's input and writes its output once per expert. ``E = K = 1`` is a dense FFN.

    Parameters
    ----------
    tokens : array_like
        Tokens through the layer (>= 0).
    d_model : int
        Hidden size.
    d_ff : int
        Intermediate size of one expert (or of the dense FFN).
    E, K : int, default 1
        Routed experts and experts per token.
    num_matrices : int, default 3
        Weight matrices per FFN (3 for SwiGLU: gate, up, down; 2 for a plain MLP).
    bytes_per_value : float, default 2
        Bytes per weight and activation (2 for bf16).

    Returns
    -------
    flops : numpy.ndarray
        Floating-point operations (FLOP), two per multiply-add.
    traffic : numpy.ndarray
        Bytes moved to and from memory.
    """
    tokens = as_array("tokens", tokens, low=0)
    d_model = as_array("d_model", d_model, low=1, whole=True)
    d_ff = as_array("d_ff", d_ff, low=1, whole=True)
    E = as_array("E", E, low=1, whole=True)
    K = as_array("K", K, low=1, whole=True)
    num_matrices = as_array("num_matrices", num_matrices, low=1, whole=True)
    bytes_per_value = as_array("bytes_per_value", bytes_per_value, low=0, low_open=True)
    broadcast(tokens=tokens, d_model=d_model, d_ff=d_ff, E=E, K=K, num_matrices=num_matrices,
              bytes_per_value=bytes_per_value)
    weights_per_expert = num_matrices * d_model * d_ff
    flops = 2.0 * weights_per_expert * tokens * K
    loaded = expected_active_experts(tokens, E, K) * weights_per_expert
    activations = 2.0 * tokens * K * d_model
    return flops, (loaded + activations) * bytes_per_value


@finite_results
def arithmetic_intensity(flops, traffic):
    """Arithmetic intensity, FLOPs per byte of memory traffic (Eq. 1).

    Parameters
    ----------
    flops : array_like
        Operations (FLOP, >= 0).
    traffic : array_like
        Bytes moved (> 0).

    Returns
    -------
    numpy.ndarray or float
        FLOP/byte; compare with :func:`ridge_point`.
    """
    flops = as_array("flops", flops, low=0)
    traffic = as_array("traffic", traffic, low=0, low_open=True)
    broadcast(flops=flops, traffic=traffic)
    return flops / traffic


@finite_results
def time_floor(flops, traffic, hardware):
    """Roofline lower bound on a kernel's time, ``max(traffic / bandwidth, flops / peak)``.

    Parameters
    ----------
    flops : array_like
        Operations (FLOP, >= 0).
    traffic : array_like
        Bytes moved (>= 0).
    hardware : Hardware or str
        The device, or its name in :data:`HARDWARE`.

    Returns
    -------
    numpy.ndarray or float
        Seconds.
    """
    flops = as_array("flops", flops, low=0)
    traffic = as_array("traffic", traffic, low=0)
    broadcast(flops=flops, traffic=traffic)
    hardware = hardware_record(hardware)
    return np.maximum(traffic / hardware.memory_bandwidth, flops / hardware.peak_flops)


@finite_results
def ffn_target_efficiency(batch_size, gamma, hardware, d_model, d_ff, E=1, K=1,
                          num_matrices=3, bytes_per_value=2):
    """Roofline-floor target efficiency of one FFN layer, ``T(B) / T(B gamma)``.

    The ratio of :func:`time_floor` for a decode step of ``batch_size`` tokens and a verification
    pass of ``batch_size * gamma`` tokens. It covers the FFN (dense or routed experts) alone:
    attention, the dense parts and imperfect bandwidth use are left out, so it sketches the shape
    of the paper's target efficiency, not measured values.

    Parameters
    ----------
    batch_size : array_like
        Sequences ``B`` (whole number >= 1), one token each in the decode step.
    gamma : array_like
        Tokens per sequence in the verification pass (whole number >= 1).
    hardware : Hardware or str
        The device, or its name in :data:`HARDWARE`.
    d_model, d_ff, E, K, num_matrices, bytes_per_value
        As in :func:`ffn_cost`.

    Returns
    -------
    numpy.ndarray or float
        Between ``1 / gamma`` (compute-bound) and 1 (memory-bound, no extra experts).
    """
    batch_size = as_array("batch_size", batch_size, low=1, whole=True)
    gamma = as_array("gamma", gamma, low=1, whole=True)
    broadcast(batch_size=batch_size, gamma=gamma)
    decode = time_floor(*ffn_cost(batch_size, d_model, d_ff, E, K, num_matrices, bytes_per_value),
                        hardware)
    verify = time_floor(*ffn_cost(batch_size * gamma, d_model, d_ff, E, K, num_matrices,
                                  bytes_per_value), hardware)
    return decode / verify


_MAX_SEARCHED_TOKENS = 10**7
"""Largest ``max_tokens`` of :func:`compute_bound_tokens`, which holds one float per count."""


def compute_bound_tokens(hardware, d_model, d_ff, E=1, K=1, num_matrices=3,
                         bytes_per_value=2, max_tokens=1_000_000):
    """Fewest tokens at which an FFN layer's arithmetic intensity reaches the ridge point.

    Parameters
    ----------
    hardware : Hardware or str
        The device, or its name in :data:`HARDWARE`.
    d_model, d_ff, E, K, num_matrices, bytes_per_value
        As in :func:`ffn_cost`, single numbers.
    max_tokens : int, default 1,000,000
        Largest token count searched (whole number in [1, 10**7]: the search holds every count).

    Returns
    -------
    int or None
        Tokens per forward pass where the layer turns compute-bound, or ``None`` when it stays
        memory-bound up to ``max_tokens``.
    """
    hardware = hardware_record(hardware)
    shape = {"d_model": d_model, "d_ff": d_ff, "E": E, "K": K, "num_matrices": num_matrices,
             "bytes_per_value": bytes_per_value}
    for name, value in shape.items():
        if np.ndim(value) != 0:
            raise UsageError(f"{name} must be a single number here, got shape {np.shape(value)}")
    max_tokens = as_array("max_tokens", max_tokens, low=1, high=_MAX_SEARCHED_TOKENS, whole=True)
    tokens = np.arange(1, int(max_tokens) + 1, dtype=float)
    intensity = arithmetic_intensity(*ffn_cost(tokens, d_model, d_ff, E, K, num_matrices,
                                               bytes_per_value))
    reached = np.flatnonzero(intensity >= hardware.ridge_point)
    return int(tokens[reached[0]]) if reached.size else None
