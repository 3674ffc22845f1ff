"""Timing from outside what is timed: the one home of the package's clocks.

Three ways, for three kinds of measurement:

* :class:`RoundTimer` -- the prefill and the stages of every round of a generation, marked around the
  round and around the target's forward (a forward hook), CUDA events on a GPU (no wait inside a round),
  the wall clock elsewhere: the SD engine's records (:mod:`moesd.engine.sd`);
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

import contextlib
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


class RoundTimer:
    """Times a generation's prefill and the three stages of each of its rounds, from outside them.

    The caller wraps the prefill in :meth:`prefill` and each round in :meth:`round`; a forward hook on the
    ``verifier`` (the module that runs the target's forward) marks where its forward starts and ends. A
    round then splits into three contiguous stages: before the target's forward (an SD round's draft
    forwards and picks), the target's forward, and after it (acceptance and bookkeeping). The marks are
    CUDA events on a GPU, recorded in the stream without waiting for the device, and read once by
    :meth:`read` after the generation; the wall clock elsewhere. Use it as a context manager, which removes
    the hooks at its end.

    Parameters
    ----------
    device : torch.device
        Where the generation runs.
    verifier : torch.nn.Module
        Its forward is the target's (the one forward per round this timer marks).
    """

    def __init__(self, device, verifier):
        import torch

        self._cuda = torch.device(device).type == "cuda"
        self._prefill: list = []
        self._rounds: list = []
        self._open: list | None = None  # the marks of the round under way
        self._handles = [verifier.register_forward_pre_hook(lambda module, args: self._mark_verify()),
                         verifier.register_forward_hook(lambda module, args, output: self._mark_verify())]

    def __enter__(self) -> RoundTimer:
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()

    def _now(self):
        if self._cuda:
            import torch

            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def _mark_verify(self) -> None:
        if self._open is not None:
            self._open.append(self._now())

    @contextlib.contextmanager
    def prefill(self):
        """Mark the start and the end of the prefill."""
        self._prefill.append(self._now())
        yield
        self._prefill.append(self._now())

    @contextlib.contextmanager
    def round(self):
        """Mark the start and the end of one round; the target's forward inside it marks itself."""
        self._open = [self._now()]
        yield
        marks, self._open = self._open + [self._now()], None
        if len(marks) != 4:
            raise RuntimeError(f"a round ran the target's forward {(len(marks) - 2) // 2} times, not once")
        self._rounds.append(marks)

    def read(self) -> tuple[float, list[tuple[float, float, float]], float]:
        """Seconds of the prefill, of each round's stages (before, during and after the target's forward),
        and from the prefill's start to the last round's end (once the device's work is done)."""
        if self._cuda:
            import torch

            torch.cuda.synchronize()

        def seconds(start, end) -> float:
            return start.elapsed_time(end) / 1e3 if self._cuda else end - start

        stages = [tuple(seconds(a, b) for a, b in zip(marks, marks[1:])) for marks in self._rounds]
        last = self._rounds[-1][-1] if self._rounds else self._prefill[-1]
        return seconds(*self._prefill), stages, seconds(self._prefill[0], last)
