"""A provisional measured roofline of this CPU, for calibrating moesd.predict on the CPU forward study.

The shipped CPU sweeps predate ``moesd.hardware.measure_roofline`` (their sidecars hold no measured
roofline), so this script measures the two numbers ``moesd.predict.calibrate`` needs, with the sweeps'
settings (2 threads, float32): the bandwidth of a large tensor copy and the FLOP/s of a float32 GEMM.
The fastest of repeated timings, in rounds spread over a minute or two (a peak: other work on the
shared machine only slows a run down). Writes
``data/measurements/cpu/roofline_provisional.json`` (a ``moesd.roofline.Hardware`` record and its context).

    .venv/bin/python benchmarks/cpu_roofline_provisional.py
"""

from __future__ import annotations

import datetime
import json
import time
from pathlib import Path

import torch

from moesd.bench import _cpu_name
from moesd.roofline import Hardware

THREADS, REPEATS, ROUNDS, PAUSE = 2, 15, 6, 10.0
OUT = Path(__file__).resolve().parents[1] / "data" / "measurements" / "cpu" / "roofline_provisional.json"


def fastest_seconds(function) -> float:
    function()  # warm-up
    times = []
    for round_ in range(ROUNDS):
        if round_:
            time.sleep(PAUSE)
        for _ in range(REPEATS):
            tick = time.perf_counter()
            function()
            times.append(time.perf_counter() - tick)
    return min(times)


def main() -> None:
    torch.set_num_threads(THREADS)
    source = torch.empty(64 * 2**20, dtype=torch.float32)  # 256 MiB, far beyond the caches
    target = torch.empty_like(source)
    copy_seconds = fastest_seconds(lambda: target.copy_(source))
    bandwidth = 2 * source.numel() * source.element_size() / copy_seconds  # read + write
    size = 2048
    a, b = torch.randn(size, size), torch.randn(size, size)
    gemm_seconds = fastest_seconds(lambda: a @ b)
    flops = 2 * size**3 / gemm_seconds
    record = Hardware(
        name="CPU (measured, 2 threads)", peak_flops=flops, memory_bandwidth=bandwidth, memory_bytes=0.0,
        source=(f"measured on this machine by benchmarks/cpu_roofline_provisional.py: fastest of {ROUNDS} x "
                f"{REPEATS} copies of 256 MiB (read + write) and of float32 {size}^3 GEMMs, {THREADS} threads, "
                f"torch {torch.__version__}; shared machine, noisy"),
        fp32_flops=flops)
    OUT.write_text(json.dumps({
        "device": _cpu_name(), "threads": THREADS,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "benchmarks/cpu_roofline_provisional.py", "hardware": record.as_dict()}, indent=2) + "\n")
    print(f"copy {bandwidth / 1e9:.2f} GB/s, float32 GEMM {flops / 1e9:.1f} GFLOP/s -> {OUT}")


if __name__ == "__main__":
    main()
