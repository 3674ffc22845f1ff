"""The benchmarks' one timer: median wall time over repeats (imported by the scripts beside it)."""

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
