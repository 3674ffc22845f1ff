"""Property tests (hypothesis): invariants that must hold for any input the strategies draw.

* the bitmask trace statistics equal the plain-Python set references of ``oracles.py`` for any routing,
  any gaps and unlogged entries, any window;
* the predictor's step time never falls as the batch grows and never rises as memory bandwidth grows.

Eq. 8's bounds and growth in tokens are tested in ``test_experts.py``.
"""

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from oracles import random_trace, reference_batch, reference_windows, with_gaps_and_missing

from moesd.model.forward import step_time
from moesd.routing.unions import batch_union, window_union
from moesd.theory.roofline import HARDWARE

traces = st.builds(lambda seed, tokens, E, K, sequences, calls, gaps: (
    with_gaps_and_missing(random_trace(seed, tokens, 2, E, min(K, E), sequences, calls), seed) if gaps
    else random_trace(seed, tokens, 2, E, min(K, E), sequences, calls)),
    seed=st.integers(0, 2**16), tokens=st.integers(1, 60), E=st.sampled_from([4, 8, 63, 64, 65, 130]),
    K=st.integers(1, 8), sequences=st.integers(1, 6), calls=st.integers(1, 9), gaps=st.booleans())


@settings(max_examples=40, deadline=None)
@given(trace=traces)
def test_batch_union_is_the_union_of_each_calls_expert_sets(trace):
    frame = batch_union(trace).sort_values(["call", "layer"])
    assert list(frame.itertuples(index=False, name=None)) == sorted(reference_batch(trace),
                                                                      key=lambda r: (r[1], r[0]))


@settings(max_examples=40, deadline=None)
@given(trace=traces, t=st.integers(1, 7))
def test_window_union_is_the_union_over_each_run_of_consecutive_positions(trace, t):
    got = sorted(window_union(trace, t)[["layer", "sequence", "start", "union"]].itertuples(index=False, name=None))
    assert got == reference_windows(trace, t)


MODELS = ["qwen2-57b-a14b", "mixtral-8x7b", "deepseek-v2-lite", "opt-30b", "qwen3-30b-a3b"]


@settings(max_examples=30, deadline=None)
@given(model=st.sampled_from(MODELS), hardware=st.sampled_from(["H100", "A100", "H200", "L40"]),
       tokens=st.integers(1, 8), batch=st.integers(1, 512), context=st.integers(0, 4096))
def test_a_step_never_gets_cheaper_with_more_sequences(model, hardware, tokens, batch, context):
    times = step_time(model, hardware, tokens, np.array([batch, batch + 1, 2 * batch]), context=context).total
    assert np.all(np.diff(times) >= -1e-12 * times[:-1])


@settings(max_examples=30, deadline=None)
@given(model=st.sampled_from(MODELS), tokens=st.integers(1, 8), batch=st.integers(1, 512),
       faster=st.floats(1.0, 8.0))
def test_a_step_never_gets_slower_with_more_memory_bandwidth(model, tokens, batch, faster):
    slow = HARDWARE["H100"]
    fast = dataclasses.replace(slow, memory_bandwidth=slow.memory_bandwidth * faster)
    assert step_time(model, fast, tokens, batch).total <= step_time(model, slow, tokens, batch).total * (1 + 1e-12)
