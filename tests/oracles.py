"""The shared test oracle: random routing traces and plain-Python set references of their statistics.

The vectorised bitmask statistics of :mod:`moesd.routing.unions` are checked against these slow,
obviously-correct set computations, in the example tests of ``test_traces.py`` and the property tests
of ``test_properties.py``.
"""

import numpy as np
import pandas as pd

from moesd.routing.traces import MISSING, RoutingTrace


def random_trace(seed=0, tokens=120, layers=3, E=70, K=4, sequences=5, calls=17):
    """Routing of `tokens` tokens over `sequences` sequences and `calls` forward calls."""
    rng = np.random.default_rng(seed)
    experts = np.argsort(rng.random((tokens, layers, E)), axis=-1)[..., :K]
    sequence = np.sort(rng.integers(0, sequences, tokens))
    position = pd.Series(sequence).groupby(sequence).cumcount().to_numpy()
    return RoutingTrace(experts, E, sequence=sequence, position=position,
                        call=rng.integers(0, calls, tokens), layers=np.array([1, 3, 4])[:layers])


def with_gaps_and_missing(trace, seed=0):
    """The trace with shuffled tokens, a few positions skipped and a few (token, layer) entries unlogged."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(trace.num_tokens)
    position = trace.position + np.cumsum(rng.random(trace.num_tokens) < 0.08)  # gaps inside sequences
    experts = trace.experts.copy()
    experts[rng.random(experts.shape[:2]) < 0.05] = MISSING
    return RoutingTrace(experts[order], trace.num_experts, trace.sequence[order], position[order],
                        trace.call[order], layers=trace.layers)


def token_sets(trace):
    """{(token, layer index): set of experts} for logged entries."""
    return {(i, j): set(trace.experts[i, j].tolist()) for i in range(trace.num_tokens)
            for j in range(len(trace.layers)) if trace.experts[i, j, 0] != MISSING}


def reference_batch(trace):
    sets, rows = token_sets(trace), []
    for call in sorted(set(trace.call.tolist())):
        idx = np.flatnonzero(trace.call == call)
        for j, layer in enumerate(trace.layers):
            logged = [i for i in idx if (i, j) in sets]
            rows.append((layer, call, len(logged), len(set().union(*[sets[i, j] for i in logged]))))
    return rows


def reference_windows(trace, t):
    """Runs of t tokens with one sequence and positions p, p+1, ..., all logged in the layer."""
    sets, rows = token_sets(trace), []
    where = {(s, p): i for i, (s, p) in enumerate(zip(trace.sequence.tolist(), trace.position.tolist()))}
    for (seq, pos), first in where.items():
        members = [where.get((seq, pos + k)) for k in range(t)]
        if None in members:
            continue
        for j, layer in enumerate(trace.layers):
            if all((i, j) in sets for i in members):
                rows.append((layer, seq, pos, len(set().union(*[sets[i, j] for i in members]))))
    return sorted(rows)
