"""Time window_union and verify_union against plain-Python set implementations.

Synthetic trace: 200,000 tokens x 16 layers x K = 8 in 100 sequences, for E = 64 and E = 256 (ids
uniform and distinct within a token; routing statistics do not depend on the values, only on E).

* ``cold``: the first call on a fresh trace, building its bitmasks (what one analysis pays once);
* ``warm``: later calls, which reuse the masks cached on the trace.

The set references run on a part of the work (a 10,000-token slice for windows, 100 of the samples
for verification) and are scaled to the whole by rows per second; verify_union's reference unions
exactly the windows verify_union sampled. Figures are medians over REPEATS runs, each cold run on a
fresh trace. The last lines compare E = 256 with the goal set for them: each statistic at least
GOAL_FACTOR times faster than Python sets and under GOAL_SECONDS, cold and warm.
Run on a quiet machine: python benchmarks/trace_statistics.py
"""

import statistics
import time

import numpy as np
from timing import median_seconds

from moesd.routing.traces import RoutingTrace
from moesd.routing.unions import verify_picks, verify_union, window_union

TOKENS, LAYERS, K, SEQUENCES, WINDOW, BATCH, SAMPLES = 200_000, 16, 8, 100, 5, 32, 1000
REPEATS = 5
GOAL_FACTOR, GOAL_SECONDS = 50, 1.0


def synthetic_experts(num_experts: int, seed: int = 0) -> np.ndarray:
    """K distinct uniform ids per token and layer (rows with a repeat are redrawn)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, num_experts, (TOKENS, LAYERS, K), dtype=np.int16)
    while True:
        ordered = np.sort(ids, axis=-1)
        repeated = (ordered[..., 1:] == ordered[..., :-1]).any(axis=-1)
        if not repeated.any():
            return ids
        ids[repeated] = rng.integers(0, num_experts, (int(repeated.sum()), K), dtype=np.int16)


def fresh_trace(experts: np.ndarray, num_experts: int) -> RoutingTrace:
    return RoutingTrace(experts, num_experts, sequence=np.repeat(np.arange(SEQUENCES), TOKENS // SEQUENCES),
                        position=np.tile(np.arange(TOKENS // SEQUENCES), SEQUENCES))


def reference_window_union(experts: np.ndarray, sequence: np.ndarray, window: int) -> list[int]:
    """Plain Python: a set per window, per layer."""
    sets = [[set(row) for row in token] for token in experts.tolist()]
    out = []
    for layer in range(experts.shape[1]):
        for start in range(len(sets) - window + 1):
            if sequence[start] == sequence[start + window - 1]:
                union = set()
                for i in range(start, start + window):
                    union |= sets[i][layer]
                out.append(len(union))
    return out


def reference_verify_union(experts: np.ndarray, picks: np.ndarray, window: int) -> list[int]:
    """Plain Python: per sample and layer, the set union of the picked windows' tokens."""
    out = []
    for starts in picks.tolist():
        tokens = [experts[start + step].tolist() for start in starts for step in range(window)]
        for layer in range(experts.shape[1]):
            union = set()
            for token in tokens:
                union.update(token[layer])
            out.append(len(union))
    return out


def cold_seconds(experts: np.ndarray, num_experts: int, statistic) -> float:
    """Median over REPEATS of the first call of ``statistic`` on a fresh trace."""
    times = []
    for _ in range(REPEATS):
        trace = fresh_trace(experts, num_experts)
        tick = time.perf_counter()
        statistic(trace)
        times.append(time.perf_counter() - tick)
    return statistics.median(times)


def goal(name: str, cold: float, warm: float, reference: float) -> str:
    """One line: ``name``'s cold and warm times and speed-ups against the goal."""
    def verdict(seconds):
        met = reference / seconds >= GOAL_FACTOR and seconds < GOAL_SECONDS
        return f"{seconds:.3f} s, x{reference / seconds:,.0f}: {'met' if met else 'NOT met'}"
    return f"  {name}: cold {verdict(cold)}; warm {verdict(warm)}"


def main() -> None:
    print(f"{TOKENS:,} tokens x {LAYERS} layers x K = {K}, {SEQUENCES} sequences; medians of {REPEATS} runs")
    goals = []
    for num_experts in (64, 256):
        experts = synthetic_experts(num_experts)
        trace = fresh_trace(experts, num_experts)

        def windows(t):
            return window_union(t, WINDOW)

        def verification(t):
            return verify_union(t, BATCH, WINDOW, SAMPLES)

        rows = len(windows(trace))
        window_cold, window_warm = cold_seconds(experts, num_experts, windows), median_seconds(
            lambda: windows(trace), REPEATS)
        part = 10_000
        reference = median_seconds(lambda: reference_window_union(experts[:part], trace.sequence[:part], WINDOW),
                                   REPEATS)
        reference_rate = len(reference_window_union(experts[:part], trace.sequence[:part], WINDOW)) / reference
        verify_cold, verify_warm = cold_seconds(experts, num_experts, verification), median_seconds(
            lambda: verification(trace), REPEATS)
        picks = verify_picks(trace, BATCH, WINDOW, SAMPLES, 0)[:100]
        verify_reference = median_seconds(lambda: reference_verify_union(experts, picks, WINDOW), REPEATS)
        verify_reference_rate = len(picks) * LAYERS / verify_reference
        verify_rows = SAMPLES * LAYERS
        print(f"E = {num_experts:3d}: window_union(t={WINDOW}) {rows:,} rows: cold {window_cold:5.2f} s, "
              f"warm {window_warm:5.2f} s; Python sets {rows / reference_rate:6.1f} s "
              f"(x{rows / reference_rate / window_cold:,.0f} cold, x{rows / reference_rate / window_warm:,.0f} warm)")
        print(f"         verify_union(B={BATCH}, w={WINDOW}, {SAMPLES} samples): cold {verify_cold:5.2f} s, "
              f"warm {verify_warm:6.3f} s; Python sets {verify_rows / verify_reference_rate:6.2f} s "
              f"(x{verify_rows / verify_reference_rate / verify_cold:,.0f} cold, "
              f"x{verify_rows / verify_reference_rate / verify_warm:,.0f} warm)")
        if num_experts == 256:
            goals = [goal(f"window_union(t={WINDOW})", window_cold, window_warm, rows / reference_rate),
                     goal(f"verify_union(B={BATCH}, w={WINDOW})", verify_cold, verify_warm,
                          verify_rows / verify_reference_rate)]
    print(f"The goal at E = 256: >= x{GOAL_FACTOR} the Python-set reference and < {GOAL_SECONDS:g} s "
          "(cold: masks built in the call; warm: masks cached on the trace)")
    print("\n".join(goals))


if __name__ == "__main__":
    main()
