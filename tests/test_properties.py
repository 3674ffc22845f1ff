"""Property tests (hypothesis): invariants that must hold for any input the strategies draw.

* the bitmask trace statistics equal the plain-Python set references of ``oracles.py`` for any routing,
  any gaps and unlogged entries, any window;
* the predictor's step time never falls as the batch grows and never rises as memory bandwidth grows;
* target efficiency lies between 1 / (tokens verified per sequence) and 1: for one FFN layer's roofline floor and
  for the predictor's whole model on the GPUs' work alone.

Eq. 8's bounds and growth in tokens are tested in ``test_experts.py``.
"""

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from oracles import random_trace, reference_batch, reference_windows, with_gaps_and_missing

from moesd.predictor.forward import step_time
from moesd.predictor.predict import predict_sd
from moesd.predictor.setup import Setup
from moesd.routing.unions import batch_union, window_union
from moesd.theory.roofline import HARDWARE, ffn_target_efficiency

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


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 512), gamma=st.integers(1, 16), hardware=st.sampled_from(["H100", "A800", "L40"]),
       experts=st.sampled_from([(1, 1), (8, 2), (64, 8), (128, 8), (256, 8)]))
def test_ffn_target_efficiency_lies_between_one_over_gamma_and_one(batch, gamma, hardware, experts):
    """Verifying B gamma tokens costs at least a decode step of B and at most gamma of them (N(t) is concave)."""
    E, K = experts
    efficiency = ffn_target_efficiency(batch, gamma, hardware, 4096, 1536, E=E, K=K)
    assert 1 / gamma - 1e-12 <= efficiency <= 1 + 1e-12


@settings(max_examples=25, deadline=None)
@given(model=st.sampled_from(MODELS), hardware=st.sampled_from(["H100", "A100", "H200"]),
       batch=st.integers(1, 256), gamma=st.integers(1, 8), context=st.integers(0, 4096))
def test_predicted_target_efficiency_lies_between_one_over_gamma_plus_one_and_one(model, hardware, batch, gamma,
                                                                                   context):
    """On the GPUs' work alone, a verification pass of gamma + 1 tokens per sequence costs at least a decode step
    and at most gamma + 1 of them."""
    draft = "qwen2-0.5b" if model.startswith("qwen") else "opt-350m" if model.startswith("opt") else model
    tp = 2 if model == "opt-30b" else 1
    row = predict_sd(Setup(model, draft, hardware, tp=tp, context=context), batch, gamma, sigma=0.5).iloc[0]
    assert 1 / (gamma + 1) - 1e-12 <= row["target_efficiency"] <= 1 + 1e-12
