"""``moesd hardware``: the hardware records with their ridge points (Eq. 1) and this machine's torch build and
GPUs; ``--measure`` this machine's roofline, ``--regime`` whether this CPU can run the studies in the paper's
regime."""

import argparse

import pandas as pd

from moesd._checks import UsageError, new_file, torch_device
from moesd.theory.roofline import HARDWARE


def run(args: argparse.Namespace) -> None:
    if args.regime:
        _regime(args)
        return
    if not args.measure:
        given = [flag for flag, value in (("--device", args.device), ("--dtype", args.dtype),
                                          ("--threads", args.threads), ("--json", args.json),
                                          ("--overwrite", args.overwrite or None)) if value is not None]
        if given:
            raise UsageError(f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} only with --measure")
    else:
        from pathlib import Path

        if args.threads is not None and args.threads < 1:
            raise UsageError(f"--threads must be >= 1, got {args.threads}")
        if args.json is not None and not Path(args.json).resolve().parent.is_dir():
            raise UsageError(f"--json: folder {Path(args.json).resolve().parent} does not exist")
        if args.json is not None:
            new_file("--json", args.json, overwrite=args.overwrite)
        if args.device is not None:
            torch_device("--device", args.device)
    table = pd.DataFrame([{
        "name": hw.name,
        "bf16 TFLOP/s": hw.peak_flops / 1e12,
        "TB/s": hw.memory_bandwidth / 1e12,
        "GB": hw.memory_bytes / 1e9,
        "ridge point": hw.ridge_point,
        "GPUs/node": hw.gpus_per_node,
        "NIC GB/s": hw.internode_bandwidth / 1e9,
        "nodes": hw.max_nodes,
    } for hw in HARDWARE.values()])
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(HARDWARE_NOTE)
    _this_machine()
    if args.measure:
        _measured_hardware(args)


def _regime(args: argparse.Namespace) -> None:
    import json

    from moesd.measure.regime import MIN_STREAMING_SHARE, regime_check

    if args.measure or args.device not in (None, "cpu") or args.dtype is not None:
        raise UsageError("--regime measures the CPU in float32 and bfloat16; leave out --measure, --device and --dtype")
    if args.threads is not None and args.threads < 1:
        raise UsageError(f"--threads must be >= 1, got {args.threads}")
    if args.json is not None:
        new_file("--json", args.json, overwrite=args.overwrite)
    check = regime_check(threads=args.threads)
    design = check.design()
    print(f"\nstreaming share of a B = 1 step (need {MIN_STREAMING_SHARE:g}), {check.settings['threads']} thread(s):")
    print(check.steps.assign(step_ms=1e3 * check.steps["step_seconds"], GB=check.steps["bytes"] / 1e9)
          [["model", "dtype", "layers", "vocab_size", "GB", "step_ms", "streaming_share"]]
          .to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    for row in design.itertuples():
        print(f"{row.model}: {row.dtype} streams {row.streaming_share:.2f} of its step"
              + ("" if row.in_regime else f", below {MIN_STREAMING_SHARE:g}: not the paper's regime"))
    if args.json is not None:
        from moesd._files import atomic_write

        with atomic_write(args.json, "w") as file:
            json.dump(check.as_dict(), file, indent=1)
        print(f"-> {args.json}")


HARDWARE_NOTE = ("A100, A800, H100, H800, H200: the SXM parts (their data sheets' SXM figures); GPUs/node: the GPUs "
                 "one NVLink or Infinity Fabric domain (L40: one PCIe server) joins, the largest --tp moesd predict "
                 "prices within one node; NIC GB/s: the inter-node network of each GPU, one direction "
                 "(Hardware.internode_bandwidth), over which a --tp above GPUs/node spans whole nodes; nodes: the "
                 "most nodes it spans (Hardware.max_nodes; 1 where no network is on record, so --tp stays within "
                 "one node); each record's sources: moesd.theory.roofline.HARDWARE")


def _this_machine() -> None:
    """The torch of this Python, its build and the GPUs it sees (moesd.measure.devices)."""
    from moesd.measure.devices import local_devices

    here = local_devices()
    if here.torch is None:
        print("\nthis machine: torch is not installed (make book installs it into .venv, make gpu a CUDA build "
              "into .venv-gpu)")
        return
    print(f"\nthis machine: torch {here.torch}, {here.build} build", end="")
    if here.build == "CPU":
        print("; no GPU build (make gpu builds .venv-gpu with a CUDA build of it)")
    elif not here.gpus:
        print(f"; it sees no GPU: {here.unavailable}")
    else:
        print(f"; {len(here.gpus)} GPU(s):")
        print(pd.DataFrame([{"GPU": f"cuda:{gpu.index}", "name": gpu.name, "GB": gpu.memory_bytes / 1e9,
                             "capability": ".".join(map(str, gpu.capability)), "record": gpu.record or "none",
                             "results folder": gpu.folder} for gpu in here.gpus])
              .to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        print("record: the data sheet above that the name names; results folder: where moesd sweep --device cuda "
              "writes by default, under $MOESD_DATA/measurements/")


def _measured_hardware(args: argparse.Namespace) -> None:
    import json

    from moesd.measure.hardware import measure_roofline

    measured = measure_roofline(args.device or "cpu", args.dtype or "float32", args.threads)
    hw = measured.hardware
    print(f"\nmeasured here: {hw.name}")
    print(pd.DataFrame([{"name": hw.name, f"{measured.settings['dtype']} TFLOP/s": hw.peak_flops / 1e12,
                         "TB/s": hw.memory_bandwidth / 1e12, "GB": hw.memory_bytes / 1e9,
                         "ridge point": hw.ridge_point}])
          .to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(f"source: {hw.source}")
    bandwidth = measured.bandwidth.assign(**{"best GB/s": measured.bandwidth["bandwidth"] / 1e9,
                                             "median GB/s": measured.bandwidth["median_bandwidth"] / 1e9,
                                             "MiB per array": measured.bandwidth["array_bytes"] / 2 ** 20})
    print(bandwidth[["kernel", "MiB per array", "best GB/s", "median GB/s"]]
          .to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    gemm = measured.gemm.assign(**{"M": measured.gemm["tokens"], "best GFLOP/s": measured.gemm["flop_per_s"] / 1e9,
                                   "median GFLOP/s": measured.gemm["median_flop_per_s"] / 1e9,
                                   "ms": measured.gemm["best_seconds"] * 1e3,
                                   "weight GB/s": measured.gemm["weight_bandwidth"] / 1e9})
    print(f"GEMM {int(gemm['out_features'][0])} x {int(gemm['in_features'][0])} weight read from memory, "
          "against the tokens M:")
    print(gemm[["M", "ms", "best GFLOP/s", "median GFLOP/s", "weight GB/s"]]
          .to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if args.json:
        from moesd._files import atomic_write

        with atomic_write(args.json, "w") as file:
            json.dump(measured.sidecar_entries(), file, indent=2)
        print(f"-> {args.json}")


def add_parser(commands) -> None:
    """Declare ``moesd hardware`` and its options on the sub-command parsers ``commands``."""
    hardware = commands.add_parser("hardware", help="hardware records and ridge points; --measure: this machine's")
    hardware.add_argument("--measure", action="store_true",
                          help="measure this machine's roofline (STREAM bandwidth, GEMM FLOP/s against M)")
    hardware.add_argument("--device", choices=["cpu", "cuda"], help="with --measure: device (default cpu)")
    hardware.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                          help="with --measure: GEMM type (default float32)")
    hardware.add_argument("--threads", type=int, help="with --measure: torch threads (default: torch's)")
    hardware.add_argument("--json", help="with --measure or --regime: write what was measured to this JSON file")
    hardware.add_argument("--overwrite", action="store_true", help="replace an existing --json file")
    hardware.add_argument("--regime", action="store_true",
                          help="measure whether this CPU can run the studies in the paper's regime: real expert "
                               "projections against M, per-expert dispatch and the streaming share of a B = 1 step "
                               "(moesd.measure.regime)")
    hardware.set_defaults(run=run, prints_only=True)
