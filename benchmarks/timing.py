"""The benchmarks' timers (imported by the scripts beside it): median wall time over repeats, alone or interleaved."""

import os
import random
import statistics
import time


def median_seconds(function, repeats: int, warmup: int = 0) -> float:
    """Median seconds of ``function()`` over ``repeats`` calls, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        function()
    times = []
    for _ in range(repeats):
        tick = time.perf_counter()
        function()
        times.append(time.perf_counter() - tick)
    return statistics.median(times)


def interleaved_seconds(points: dict, repeats: int, seed: int = 0) -> tuple[dict, dict]:
    """Seconds of each of ``points`` (name -> function) in each of ``repeats`` interleaved repeats.

    One untimed pass first; then every repeat calls every point once, in an order shuffled per repeat, so that
    drift of the machine (another process starting, the clock changing) spreads over all points alike rather than
    falling on the points timed in one stretch. Returns name -> list of seconds, one per repeat, twice: by the wall
    clock, and by the calling thread's CPU time (with one torch thread, the time the work itself took: a shared
    machine that keeps the thread waiting does not count).
    """
    for function in points.values():
        function()
    order, wall, cpu = list(points), {name: [] for name in points}, {name: [] for name in points}
    shuffler = random.Random(seed)
    for _ in range(repeats):
        shuffler.shuffle(order)
        for name in order:
            tick, tock = time.perf_counter(), time.thread_time()
            points[name]()
            wall[name].append(time.perf_counter() - tick)
            cpu[name].append(time.thread_time() - tock)
    return wall, cpu


def machine_state() -> str:
    """Torch threads and the 1-minute load average, for the line every timing prints beside its numbers."""
    import torch

    return f"{torch.get_num_threads()} torch thread(s), 1-min load {os.getloadavg()[0]:.2f}"
