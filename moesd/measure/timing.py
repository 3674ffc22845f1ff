"""Timing a call: the one home of the package's clocks.

Two ways, for two kinds of measurement:

* :class:`Timer` -- seconds of one call, the device's queued work waited for before and after it
  (CUDA events on a GPU, the wall clock elsewhere): the sweeps time each forward of the forward
  study so (:mod:`moesd.measure.bench`);
* :func:`time_calls` -- seconds of each of several calls after an untimed one, queued back to back on
  a GPU, on a CPU by the wall clock or the calling thread's CPU time (:data:`CLOCKS`): the measured
  roofline and the decode-step breakdown time kernels and forwards so (:mod:`moesd.measure.hardware`,
  :mod:`moesd.measure.breakdown`).

torch is imported inside the functions.
"""

from __future__ import annotations

import time

CLOCKS = ("wall", "cpu")
"""How a CPU call is timed: the wall clock, or the calling thread's CPU time (one torch thread only)."""


def check_clock(clock: str, device) -> str:
    """``clock`` if it is one of :data:`CLOCKS` and usable here (``"cpu"``: a CPU device and one torch thread).

    Raises
    ------
    ValueError
        For an unknown clock, or the CPU clock on a GPU or with several torch threads.
    """
    import torch

    if clock not in CLOCKS:
        raise ValueError(f"clock must be 'wall' or 'cpu', got {clock!r}")
    if clock == "cpu" and (torch.device(device).type != "cpu" or torch.get_num_threads() != 1):
        raise ValueError("clock='cpu' (the calling thread's CPU time) needs device 'cpu' and one torch thread, "
                         f"got {device!r} with {torch.get_num_threads()} threads")
    return clock


def time_calls(function, calls: int, device, after=None, clock: str = "wall") -> list[float]:
    """Seconds of each of ``calls`` calls of ``function()`` after one untimed call.

    CUDA events on a GPU, recorded around every call and read after one synchronisation at the end
    (the calls queue back to back); on a CPU the wall clock or (``clock="cpu"``) the calling
    thread's CPU time, which leaves out the time a shared machine keeps the thread waiting.

    Parameters
    ----------
    function : callable
        Called with no arguments.
    calls : int
        Timed calls (>= 1).
    device : torch.device
        Where ``function`` runs.
    after : callable, optional
        Runs untimed after every call (e.g. cropping a KV cache back).
    clock : str, default "wall"
        One of :data:`CLOCKS`.

    Returns
    -------
    list of float
        Seconds of each timed call.
    """
    import torch

    read = time.thread_time if check_clock(clock, device) == "cpu" else time.perf_counter
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


class Timer:
    """Seconds of one call: CUDA events on a GPU (after waiting for the work queued before), the wall clock elsewhere."""

    def __init__(self, device: str):
        import torch

        self.cuda = torch.device(device).type == "cuda"

    def __call__(self, function) -> float:
        """Seconds of ``function()``, called once."""
        import torch

        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            function()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / 1e3
        tick = time.perf_counter()
        function()
        return time.perf_counter() - tick
