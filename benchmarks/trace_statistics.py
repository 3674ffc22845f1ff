"""Time window_union and verify_union against a plain-Python set implementation (issue 3).

Synthetic trace: 200,000 tokens x 16 layers x K = 8 in 100 sequences, for E = 64 and E = 256.
The set reference runs on a slice of the trace and is scaled to the whole by rows per second.
Reported figures are medians over repeats. Run: python benchmarks/trace_statistics.py
"""

import numpy as np
from timing import median_seconds

from moesd.traces import RoutingTrace, verify_union, window_union

TOKENS, LAYERS, K, SEQUENCES, WINDOW = 200_000, 16, 8, 100, 5
REPEATS = 5


def synthetic_trace(num_experts: int, seed: int = 0) -> RoutingTrace:
    rng = np.random.default_rng(seed)
    experts = np.empty((TOKENS, LAYERS, K), dtype=np.int64)
    for start in range(0, TOKENS, 20_000):  # top-K of random scores, in chunks to bound memory
        scores = rng.random((min(20_000, TOKENS - start), LAYERS, num_experts))
        experts[start:start + len(scores)] = np.argpartition(scores, K, axis=-1)[..., :K]
    sequence = np.repeat(np.arange(SEQUENCES), TOKENS // SEQUENCES)
    position = np.tile(np.arange(TOKENS // SEQUENCES), SEQUENCES)
    return RoutingTrace(experts, num_experts, sequence=sequence, position=position)


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


def main() -> None:
    for num_experts in (64, 256):
        trace = synthetic_trace(num_experts)
        rows = len(window_union(trace, WINDOW))
        fast = median_seconds(lambda: window_union(trace, WINDOW), REPEATS)
        part = 10_000
        slow = median_seconds(lambda: reference_window_union(trace.experts[:part], trace.sequence[:part], WINDOW),
                              REPEATS)
        slow_rows = len(reference_window_union(trace.experts[:part], trace.sequence[:part], WINDOW))
        fast_rate, slow_rate = rows / fast, slow_rows / slow
        verify = median_seconds(lambda: verify_union(trace, batch_size=32, window=WINDOW, samples=1000), REPEATS)
        print(f"E = {num_experts:3d}: window_union(t={WINDOW}) {fast:6.2f} s for {rows:,} rows "
              f"({fast_rate:,.0f} rows/s); Python sets {slow_rate:,.0f} rows/s; "
              f"ratio {fast_rate / slow_rate:,.0f}x; "
              f"verify_union(B=32, w={WINDOW}, 1000 samples) {verify:5.2f} s")


if __name__ == "__main__":
    main()
