"""Rooflines: when an FFN or a layer of experts is memory-bound (the paper's Eqs. 1 and 11).

A kernel is memory-bound while its arithmetic intensity AI (FLOPs per byte moved) is below
the hardware's ridge point ``RP = peak FLOP/s / memory bandwidth`` (Eq. 1). For a bf16 GEMM
whose traffic is its weights, AI is about the number of tokens it processes, so a token
count can be read against RP directly. A layer of routed experts loads ``N(t)`` experts
for ``t`` tokens and gives each ``T_exp = t K / N(t)`` tokens, so its AI is ``T_exp``, not
``t``: sparse experts stay memory-bound to far larger batches than a dense FFN does.

The paper's fitted model replaces the hard roofline corner by the smooth ``G`` of Eq. 11.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from moesd._checks import UsageError, as_array, broadcast
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
        Fractions of ``memory_bandwidth`` and of the tensor peaks that measured kernels achieve
        (1 for a record whose peaks were themselves measured).
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
                   "gpus_per_node": dict(low=1, whole=True), "bandwidth_fraction": positive,
                   "flops_fraction": positive, "internode_bandwidth": dict(low=0),
                   "internode_latency": dict(low=0), "max_nodes": dict(low=1, whole=True)}
        for field, domain in domains.items():
            value = getattr(self, field)
            if value is not None or field not in ("fp8_flops", "fp32_flops", "fp4_flops"):
                try:
                    as_array(f"hardware.{field}", value, **domain)
                except UsageError as error:
                    raise UsageError(f"{error} (Hardware record {self.name!r})") from None
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


_TERA, _GIGA = 1e12, 1e9

#: Achieved fractions from public microbenchmarks (see each record's ``efficiency_source``).
_MAMF = ("Stas Bekman, ML Engineering (github.com/stas00/ml-engineering), compute/accelerator/README.md, "
         "Maximum Achievable Matmul FLOPS table, bf16: ")
_GPU_BENCHES = "gpu-benches (github.com/te42kyfo/gpu-benches), "
_HOPPER_BANDWIDTH = (_GPU_BENCHES + "gpu-l2-cache/h200.txt: H200 DRAM read 3,888 GB/s of 4,800 (0.81)")
_ALLREDUCE_LATENCY = ("all-reduce latency: an assumed order of magnitude for small NCCL/custom all-reduces "
                      "(no public measurement is cited)")
_NVLINK_LATENCY, _PCIE_LATENCY = 10e-6, 25e-6


def _nvlink(name: str, gb_per_s: float, source: str, board: str) -> dict:
    """An NVLink record of eight GPUs per node, ``board`` naming the 8-GPU server board that says so."""
    return dict(interconnect_bandwidth=gb_per_s * _GIGA, interconnect_latency=_NVLINK_LATENCY, gpus_per_node=8,
                interconnect=f"{name} {gb_per_s:g} GB/s ({source}); 8 GPUs per node ({board}); "
                f"{_ALLREDUCE_LATENCY}")


_NIC_LATENCY = 20e-6
_NIC_SOURCES = ("a NIC's line rate, not an achieved one (an NCCL maintainer expects 46-48 GB/s per 400 Gb/s NIC in "
                "two-node all-reduces: github.com/NVIDIA/nccl-tests/issues/290); latency 20 us: nccl-tests issue #150 "
                "(github.com/NVIDIA/nccl-tests/issues/150) times all_reduce_perf of 8 to 64 bytes between two nodes, "
                "one A100 each over HDR InfiniBand, at 19-21 us, taken for every record (no NDR time found); at "
                "most 32 nodes per group: DeepEP's README (github.com/deepseek-ai/DeepEP) times its all-to-all "
                "kernels up to EP 256, 32 nodes of eight H800s")
_BASEPOD = "NVIDIA DGX BasePOD reference architecture (docs.nvidia.com/dgx-basepod), Core Components"


def _network(gbit_per_s: float, source: str) -> dict:
    """An inter-node network of one NIC of ``gbit_per_s`` per GPU, ``source`` naming who says so."""
    return dict(internode_bandwidth=gbit_per_s / 8 * _GIGA, internode_latency=_NIC_LATENCY, max_nodes=32,
                internode=f"one {gbit_per_s:g} Gb/s NIC per GPU, {gbit_per_s / 8:g} GB/s each way ({source}); "
                f"{_NIC_SOURCES}")


_AMPERE = dict(fp32_flops=19.5 * _TERA, bandwidth_fraction=1769 / 2039, flops_fraction=271.2 / 312,
               efficiency_source=_GPU_BENCHES + "cuda-stream/a100_80.txt: A100 80GB read kernel 1,769 GB/s "
               "of 2,039 (0.87); " + _MAMF + "A100 SXM 271.2 of 312 TFLOPS (0.87)")
_HOPPER = dict(fp8_flops=1979 * _TERA, fp32_flops=67 * _TERA, bandwidth_fraction=3888 / 4800,
               flops_fraction=794.5 / 989,
               efficiency_source=_HOPPER_BANDWIDTH + ", taken for every Hopper part (no H100/H800 SXM "
               "measurement found); " + _MAMF + "H100 SXM 794.5 of 989 TFLOPS (0.80), 'H200 is the same'")

HARDWARE = {
    hw.name: hw
    for hw in [
        Hardware("A800", 312 * _TERA, 2039 * _GIGA, 80 * _GIGA,
                 "NVIDIA A800 SXM4 80GB data sheet: BF16 tensor 312 TFLOPS (624 with sparsity), "
                 "HBM2e 2,039 GB/s, 80 GB (the A100 80GB SXM figures); FP32 19.5 TFLOPS",
                 **_AMPERE, **_nvlink("NVLink", 400, "A800 SXM4 data sheet: NVLink 400 GB/s",
                          "HGX A800 8-GPU board")),
        Hardware("A100", 312 * _TERA, 2039 * _GIGA, 80 * _GIGA,
                 "NVIDIA A100 data sheet, 80GB SXM: BF16 tensor 312 TFLOPS (624 with sparsity), "
                 "HBM2e 2,039 GB/s, 80 GB; FP32 19.5 TFLOPS",
                 **_AMPERE, **_nvlink("NVLink 3", 600, "A100 data sheet, SXM: NVLink 600 GB/s",
                          "HGX A100 8-GPU board; the 16-GPU HGX A100 is not modelled"),
                 **_network(200, "NVIDIA DGX A100 data sheet: 8x single-port Mellanox ConnectX-6 VPI 200 Gb/s HDR "
                            "InfiniBand")),
        Hardware("H800", 989.5 * _TERA, 3350 * _GIGA, 80 * _GIGA,
                 "NVIDIA H800 SXM5 data sheet: BF16 tensor 1,979 TFLOPS with sparsity (989.5 dense), "
                 "FP8 3,958 with sparsity (1,979 dense), FP32 67 TFLOPS, HBM3 3.35 TB/s, 80 GB",
                 **_HOPPER, **_nvlink("NVLink", 400, "H800 SXM5 data sheet: NVLink 400 GB/s",
                          "HGX H800 8-GPU board"),
                 **_network(400, "DeepEP's README: each H800 connected to a CX7 InfiniBand 400 Gb/s RDMA network "
                            "card")),
        Hardware("H20", 148 * _TERA, 4000 * _GIGA, 96 * _GIGA,
                 "NVIDIA HGX H20 specifications as published by resellers (no NVIDIA data sheet online): "
                 "BF16 tensor 148 TFLOPS dense, FP8 296 dense, FP32 44 TFLOPS, HBM3 4.0 TB/s, 96 GB",
                 **{**_HOPPER, "fp8_flops": 296 * _TERA, "fp32_flops": 44 * _TERA,
                    "efficiency_source": _HOPPER["efficiency_source"] + "; neither measured on an H20"},
                 **_nvlink("NVLink 4", 900, "HGX H20 specifications: NVLink 900 GB/s",
                          "HGX H20 8-GPU board")),
        Hardware("H20-141GB", 148 * _TERA, 4800 * _GIGA, 141 * _GIGA,
                 "NVIDIA H20 with 141 GB HBM3e ('H20-3e'; no NVIDIA data sheet online): 4.8 TB/s and 141 GB "
                 "as tile-ai/TileOPs PR #1658 and NVIDIA/nvbandwidth issue #48 ('according to official data ... "
                 "4.8TB/s') give them; BF16 148 and FP8 296 TFLOPS dense and FP32 44 TFLOPS as the 96 GB H20's",
                 **{**_HOPPER, "fp8_flops": 296 * _TERA, "fp32_flops": 44 * _TERA,
                    "efficiency_source": _HOPPER["efficiency_source"] + "; neither measured on an H20"},
                 **_nvlink("NVLink 4", 900, "the 96 GB H20's NVLink 900 GB/s, assumed unchanged",
                          "HGX H20 8-GPU board")),
        Hardware("H100", 989.5 * _TERA, 3350 * _GIGA, 80 * _GIGA,
                 "NVIDIA H100 data sheet, SXM5: BF16 tensor 1,979 TFLOPS with sparsity (989.5 dense), "
                 "FP8 3,958 with sparsity (1,979 dense), FP32 67 TFLOPS, HBM3 3.35 TB/s, 80 GB",
                 **_HOPPER, **_nvlink("NVLink 4", 900, "H100 data sheet, SXM: NVLink 900 GB/s",
                          "HGX H100 8-GPU board"),
                 **_network(400, _BASEPOD + ", DGX H100: eight single-port ConnectX-7, up to 400 Gb/s")),
        Hardware("H200", 989.5 * _TERA, 4800 * _GIGA, 141 * _GIGA,
                 "NVIDIA H200 data sheet, SXM: BF16 tensor 1,979 TFLOPS with sparsity (989.5 dense), "
                 "FP8 3,958 with sparsity (1,979 dense), FP32 67 TFLOPS, HBM3e 4.8 TB/s, 141 GB",
                 **_HOPPER, **_nvlink("NVLink 4", 900, "H200 data sheet, SXM: NVLink 900 GB/s",
                          "HGX H200 8-GPU board"),
                 **_network(400, _BASEPOD + ", DGX H200: eight single-port ConnectX-7, up to 400 Gb/s")),
        Hardware("L40", 181.05 * _TERA, 864 * _GIGA, 48 * _GIGA,
                 "NVIDIA L40 data sheet: BF16 tensor 362.1 TFLOPS with sparsity (181.05 dense), "
                 "FP8 724 with sparsity (362 dense), FP32 90.5 TFLOPS, GDDR6 864 GB/s, 48 GB",
                 fp8_flops=362 * _TERA, fp32_flops=90.5 * _TERA, bandwidth_fraction=796 / 864,
                 flops_fraction=794.5 / 989,
                 efficiency_source=_GPU_BENCHES + "gpu-l2-cache/l40.txt: L40 DRAM read 796 GB/s of 864 "
                 "(0.92); flops fraction assumed equal to the H100's (no L40 MAMF published)",
                 interconnect_bandwidth=64 * _GIGA, interconnect_latency=_PCIE_LATENCY,
                 interconnect="PCIe Gen4 x16, 64 GB/s both directions (L40 data sheet: no NVLink); 8 GPUs per "
                 "node (NVIDIA OVX servers hold eight L40s, as PCIe servers of eight GPUs do); "
                 + _ALLREDUCE_LATENCY, gpus_per_node=8),
        Hardware("B200", 2250 * _TERA, 8000 * _GIGA, 180 * _GIGA,
                 "NVIDIA HGX B200 (1,000 W) specifications: BF16 tensor 4.5 PFLOPS with sparsity "
                 "(2.25 dense), FP8 9 PFLOPS with sparsity (4.5 dense), HBM3e 8 TB/s, 180 GB per GPU; FP4 "
                 "9 PFLOPS dense (NVIDIA Blackwell architecture technical brief, as glennklockwood.com/garden/"
                 "processors/B200 tabulates it)",
                 fp8_flops=4500 * _TERA, fp4_flops=9000 * _TERA, bandwidth_fraction=3888 / 4800, flops_fraction=1745 / 2250,
                 efficiency_source=_MAMF + "B200 SXM 1,745 of 2,250 TFLOPS (0.78); bandwidth fraction "
                 "assumed equal to the H200's (no B200 measurement found): " + _HOPPER_BANDWIDTH,
                 **_nvlink("NVLink 5", 1800, "HGX B200 specifications: NVLink 1.8 TB/s per GPU",
                          "HGX B200 8-GPU board"),
                 **_network(400, _BASEPOD + ", DGX B200: 8x single-port ConnectX-7, up to 400 Gb/s")),
        Hardware("MI300X", 1307.4 * _TERA, 5300 * _GIGA, 192 * _GIGA,
                 "AMD Instinct MI300X data sheet: BF16 dense matrix 1,307.4 TFLOPS, FP8 2,614.9, "
                 "FP32 vector 163.4 TFLOPS, HBM3 5.3 TB/s, 192 GB",
                 fp8_flops=2614.9 * _TERA, fp32_flops=163.4 * _TERA, bandwidth_fraction=3888 / 4800,
                 flops_fraction=668.4 / 1300,
                 efficiency_source=_MAMF + "MI300X 668.4 of 1,300 TFLOPS (0.51); bandwidth fraction "
                 "assumed equal to the H200's (no MI300X measurement found): " + _HOPPER_BANDWIDTH,
                 interconnect_bandwidth=896 * _GIGA, interconnect_latency=_NVLINK_LATENCY, interconnect_peers=7,
                 interconnect="AMD Infinity Fabric, 7 links x 128 GB/s = 896 GB/s peer bandwidth (MI300X "
                 "data sheet), a full mesh of eight (the AMD Instinct MI300X Platform: 8 GPUs per node): one "
                 "128 GB/s link to each peer, so a group of p GPUs has (p - 1) x 128 GB/s; " + _ALLREDUCE_LATENCY,
                 gpus_per_node=8),
        Hardware("CPU", 3.072 * _TERA, 307.2 * _GIGA, 256 * _GIGA,
                 "Illustrative server CPU socket, derived, not measured: 16 cores x 3.0 GHz x 64 "
                 "BF16 FLOP/cycle (AVX-512 BF16 dot products) = 3.07 TFLOP/s; 8 channels of "
                 "DDR5-4800 at 38.4 GB/s (JEDEC JESD79-5) = 307 GB/s; 256 GB; fp32: 16 cores x "
                 "3.0 GHz x 32 FLOP/cycle (two AVX-512 FMA units) = 1.54 TFLOP/s",
                 fp32_flops=1.536 * _TERA),
    ]
}
"""Hardware records by name; ``HARDWARE["H200"].ridge_point`` is about 206 FLOP/byte."""


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
    if not isinstance(hardware, Hardware):
        raise UsageError(f"hardware must be one of {', '.join(HARDWARE)} or a Hardware "
                         f"record, got {hardware!r}", argument)
    return hardware


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


def G(t, lam_rp, s):
    """Roofline-shaped growth of time with tokens, the paper's ``G(t; lambda RP, s)`` (Eq. 11).

    ``G = s**t`` up to the transition ``lam_rp`` (memory-bound: slow growth), then the tangent
    line ``s**lam_rp (1 + ln(s) (t - lam_rp))`` (compute-bound: linear growth). ``G`` and its
    first derivative are continuous at ``lam_rp``.

    Parameters
    ----------
    t : array_like
        Tokens (>= 0, real values allowed).
    lam_rp : array_like
        Transition point ``lambda RP`` in tokens (> 0): the empirical ridge point.
    s : array_like
        Growth base (>= 1; the paper bounds it to [1, 2]).

    Returns
    -------
    numpy.ndarray or float
        Dimensionless growth factor, ``G(0) = 1``.
    """
    t = as_array("t", t, low=0)
    lam_rp = as_array("lam_rp", lam_rp, low=0, low_open=True)
    s = as_array("s", s, low=1)
    broadcast(t=t, lam_rp=lam_rp, s=s)
    with np.errstate(over="ignore", invalid="ignore"):
        growth = unchecked_G(t, lam_rp, s)
    overflow = ~np.isfinite(growth)
    if overflow.any():
        t_, lam_, s_ = (np.broadcast_to(a, overflow.shape)[overflow].flat[0] for a in (t, lam_rp, s))
        raise UsageError(f"t, lam_rp and s must keep G within float64 (s**lam_rp and the line after it), "
                         f"got t = {t_:g}, lam_rp = {lam_:g}, s = {s_:g}")
    return growth


def unchecked_G(t, lam_rp, s, derivatives: bool = False):
    """Eq. 11's ``G(t; lam_rp, s)`` without :func:`G`'s input checks, and, if asked, its derivatives.

    The one home of Eq. 11's formulas: :func:`G` checks its inputs and calls it, and Algorithm 1's
    fit (:class:`moesd.model.algorithm1.SpeedupInputs`) calls it directly in its hot loop, with the
    derivatives for its analytic Jacobian. Below the transition ``L = lam_rp``: ``G = s**t``,
    ``dG/dL = 0``, ``dG/ds = t s**(t - 1)``. Above it: ``G = s**L (1 + ln s (t - L))``,
    ``dG/dL = s**L (ln s)**2 (t - L)``, ``dG/ds = s**(L - 1) (L (1 + ln s (t - L)) + t - L)``. Both
    derivatives are continuous at ``t = L`` (0 and ``L s**(L - 1)`` from either side).

    Parameters
    ----------
    t : array_like
        Tokens (>= 0).
    lam_rp : float or numpy.ndarray
        Transition point ``lambda RP`` in tokens (> 0).
    s : float or numpy.ndarray
        Growth base (>= 1). A Python or numpy scalar takes ``ln s`` from :func:`math.log` (the fit's
        scalar parameters), an array from :func:`numpy.log` (:func:`G`'s checked inputs); the two can
        differ in the last bit, and each caller keeps the digits it always had.
    derivatives : bool, default False
        Also return ``dG/dL`` and ``dG/ds``.

    Returns
    -------
    numpy.ndarray or tuple of numpy.ndarray
        ``G`` (dimensionless, ``G(0) = 1``), or ``(G, dG/dL, dG/ds)`` with ``dG/dL`` per token and
        ``dG/ds`` dimensionless, broadcast over the arguments. Overflow is not caught (see :func:`G`).
    """
    log_s = np.log(s) if isinstance(s, np.ndarray) else math.log(s)
    at_transition = s ** lam_rp
    excess = t - lam_rp
    below = t <= lam_rp
    linear = 1.0 + log_s * excess
    value = np.where(below, np.power(s, np.minimum(t, lam_rp)), at_transition * linear)
    if not derivatives:
        return value
    d_transition = np.where(below, 0.0, (at_transition * log_s * log_s) * excess)
    d_s = np.where(below, t * value / s, (at_transition / s) * (lam_rp * linear + excess))
    return value, d_transition, d_s
