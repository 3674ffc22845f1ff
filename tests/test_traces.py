"""RoutingTrace: validation, summary, atomic save/load, and statistics against plain-Python sets."""

import itertools

import numpy as np
import pandas as pd
import pytest

from moesd.theory.experts import expected_active_experts, expected_active_experts_from_popularity
from moesd.routing.traces import RoutingTrace, without_rejected
from oracles import random_trace, reference_batch, reference_windows, token_sets, with_gaps_and_missing
from moesd.routing.unions import (
    adjacent_overlap,
    batch_union,
    effective_experts,
    expert_masks,
    mean_union_per_layer,
    popularity,
    random_union,
    verify_union,
    verify_union_predictions,
    window_activation_probability,
    window_union,
)


@pytest.mark.parametrize("E", [8, 64, 70, 256])
def test_masks_hold_exactly_the_experts(E):
    trace = random_trace(E=E, K=min(8, E))
    masks = expert_masks(trace)
    for i in (0, 7, 55):
        for j in range(masks.shape[1]):
            bits = {w * 64 + b for w in range(masks.shape[2]) for b in range(64)
                    if int(masks[i, j, w]) >> b & 1}
            assert bits == set(trace.experts[i, j].tolist())


def test_masks_are_cached_and_reset_when_the_routing_changes():
    trace = random_trace()
    assert expert_masks(trace) is expert_masks(trace)
    with pytest.raises(ValueError, match="read-only"):
        trace.experts[0, 0, 0] = 1
    other = random_trace(seed=9)
    trace.experts = other.experts
    np.testing.assert_array_equal(expert_masks(trace), expert_masks(other))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batch_union_matches_sets(seed):
    trace = random_trace(seed)
    frame = batch_union(trace).sort_values(["call", "layer"])
    expected = sorted(reference_batch(trace), key=lambda r: (r[1], r[0]))
    assert list(frame.itertuples(index=False, name=None)) == expected


def test_batch_union_counts_only_logged_entries():
    trace = with_gaps_and_missing(random_trace(4))
    frame = batch_union(trace).sort_values(["call", "layer"])
    expected = sorted(reference_batch(trace), key=lambda r: (r[1], r[0]))
    assert list(frame.itertuples(index=False, name=None)) == expected


@pytest.mark.parametrize("t", [1, 2, 3, 5, 8, 13])
def test_window_union_matches_sets(t):
    trace = random_trace(3, E=130, K=6)
    frame = window_union(trace, t)
    got = sorted(frame[["layer", "sequence", "start", "union"]].itertuples(index=False, name=None))
    assert got == reference_windows(trace, t)


def test_mean_union_per_layer_averages_the_reference_windows_of_each_layer():
    trace = random_trace(3, E=130, K=6)
    means = mean_union_per_layer(window_union(trace, 4))
    windows = reference_windows(trace, 4)
    expected = [np.mean([u for layer, _, _, u in windows if layer == each]) for each in sorted(trace.layers)]
    np.testing.assert_allclose(means, expected)


@pytest.mark.parametrize("t", [1, 2, 4, 7])
def test_windows_stop_at_position_gaps_and_unlogged_entries(t):
    trace = with_gaps_and_missing(random_trace(5, tokens=200, E=90, K=3), seed=t)
    got = sorted(window_union(trace, t).itertuples(index=False, name=None))
    assert got == reference_windows(trace, t)
    assert len(got) < len(reference_windows(random_trace(5, tokens=200, E=90, K=3), t))


def test_a_repeated_position_is_refused_unless_rejected():
    """Two tokens at one (sequence, position) were accepted (and counted as no run); a rejected draft token
    shares its position with the sequence's own token."""
    experts = np.array([[[0, 1]], [[2, 3]], [[4, 5]]])
    with pytest.raises(ValueError, match=r"tokens 1 and 2 are both sequence 0 position 1"):
        RoutingTrace(experts, 8, sequence=[0, 0, 0], position=[0, 1, 1])
    trace = RoutingTrace(experts, 8, sequence=[0, 0, 0], position=[0, 1, 1], phase=["decode", "rejected", "decode"])
    assert trace.num_tokens == 3


def test_ids_above_int32_keep_their_value():
    """E above 2**31 stored ids in int32, wrapping them negative."""
    trace = RoutingTrace(np.array([[[2**31 + 3, 1]]]), 2**32)
    assert trace.experts.dtype == np.int64 and trace.experts[0, 0, 0] == 2**31 + 3


def test_window_longer_than_every_sequence_is_empty():
    assert window_union(random_trace(), 1000).empty


def test_random_union_follows_the_exact_distribution_of_pairs():
    """Five tokens, t = 2: the union of a random pair takes each value with the frequency of the 10 pairs."""
    experts = np.array([[[0, 1]], [[0, 2]], [[0, 1]], [[3, 4]], [[1, 2]]])
    trace = RoutingTrace(experts, 5)
    sizes = [len(set(experts[a, 0]) | set(experts[b, 0])) for a, b in itertools.combinations(range(5), 2)]
    exact = pd.Series(sizes).value_counts(normalize=True)
    drawn = random_union(trace, 2, samples=4000, seed=1)["union"]
    assert set(drawn) <= set(sizes)
    observed = drawn.value_counts(normalize=True).reindex(exact.index, fill_value=0)
    np.testing.assert_allclose(observed, exact, atol=0.025)
    pd.testing.assert_frame_equal(random_union(trace, 2, 50, seed=3), random_union(trace, 2, 50, seed=3))


def test_verify_union_takes_one_window_from_each_of_b_sequences():
    """Four sequences of 2-3 tokens, B = 3, w = 2: every sample is the union of one window of three
    distinct sequences; its mean is the mean over all such choices, each equally likely."""
    rng = np.random.default_rng(2)
    lengths = [3, 2, 3, 2]
    experts = np.argsort(rng.random((sum(lengths), 2, 12)), axis=-1)[..., :2]
    sequence = np.repeat(np.arange(4), lengths)
    position = np.concatenate([np.arange(n) for n in lengths])
    trace = RoutingTrace(experts, 12, sequence=sequence, position=position)
    windows = {s: [np.flatnonzero((sequence == s) & (position >= p) & (position < p + 2))
                   for p in range(lengths[s] - 1)] for s in range(4)}
    exact = {0: [], 1: []}
    for chosen in itertools.combinations(range(4), 3):
        per_choice = {0: [], 1: []}
        for picks in itertools.product(*[windows[s] for s in chosen]):
            tokens = np.concatenate(picks)
            for layer in (0, 1):
                per_choice[layer].append(len(set(experts[tokens, layer].ravel().tolist())))
        for layer in (0, 1):
            exact[layer].append(np.mean(per_choice[layer]))
    drawn = verify_union(trace, batch_size=3, window=2, samples=6000, seed=0)
    for layer in (0, 1):
        values = drawn[drawn["layer"] == layer]["union"]
        possible = {len(set(experts[np.concatenate(p), layer].ravel().tolist()))
                    for c in itertools.combinations(range(4), 3) for p in itertools.product(*[windows[s] for s in c])}
        assert set(values) <= possible
        assert values.mean() == pytest.approx(np.mean(exact[layer]), abs=0.05)
    with pytest.raises(ValueError, match="batch_size"):
        verify_union(trace, batch_size=5, window=2)


def test_verify_union_of_every_sequence_whole_is_deterministic():
    trace = random_trace(6, tokens=60, sequences=3)
    lengths = np.bincount(trace.sequence)
    trace = trace.select(np.isin(trace.sequence, np.flatnonzero(lengths >= 4)))
    trace = trace.select(trace.position < 4)  # every sequence now has exactly 4 tokens
    owners = np.unique(trace.sequence).size
    frame = verify_union(trace, batch_size=owners, window=4, samples=5)
    for j, layer in enumerate(trace.layers):
        expected = len(set(trace.experts[:, j].ravel().tolist()))
        assert (frame[frame["layer"] == layer]["union"] == expected).all()


def test_popularity_matches_counting_and_its_prediction_matches_random_tokens():
    """Tokens drawn independently with a skewed popularity: the popularity form of Eq. 8 predicts
    the unions of random tokens, and Eq. 8 (uniform) overestimates them."""
    rng = np.random.default_rng(0)
    share = rng.dirichlet(np.full(16, 0.5))
    experts = np.array([rng.choice(16, 2, replace=False, p=share) for _ in range(4000)])[:, None, :]
    trace = RoutingTrace(experts, 16)
    table = popularity(trace)
    counted = [sum(e in row for row in experts[:, 0].tolist()) / 4000 for e in range(16)]
    np.testing.assert_allclose(table["probability"], counted)
    measured = random_union(trace, 8, samples=3000)["union"].mean()
    predicted = expected_active_experts_from_popularity(8, table["probability"].to_numpy())
    assert predicted == pytest.approx(measured, rel=0.02)
    assert expected_active_experts(8, 16, 2) > 1.1 * measured


def test_adjacent_overlap_of_repeated_tokens_is_one():
    experts = np.repeat(np.array([[[0, 1], [2, 3]]]), 10, axis=0)
    trace = RoutingTrace(experts, 8)
    table = adjacent_overlap(trace)
    assert (table["overlap"] == 1.0).all() and (table["pairs"] == 9).all()
    assert table["independent"].tolist() == [1.0, 1.0]


def test_adjacent_overlap_of_random_routing_is_near_k_over_e():
    table = adjacent_overlap(random_trace(tokens=4000, E=16, K=2, sequences=4))
    np.testing.assert_allclose(table["overlap"], 2 / 16, atol=0.03)


def test_adjacent_overlap_skips_gaps_and_unlogged_entries():
    trace = with_gaps_and_missing(random_trace(8, tokens=150, E=10, K=3), seed=3)
    sets = token_sets(trace)
    where = {(s, p): i for i, (s, p) in enumerate(zip(trace.sequence.tolist(), trace.position.tolist()))}
    table = adjacent_overlap(trace)
    for j in range(len(trace.layers)):
        shared = [len(sets[i, j] & sets[where[s, p + 1], j]) / 3 for (s, p), i in where.items()
                  if (s, p + 1) in where and (i, j) in sets and (where[s, p + 1], j) in sets]
        assert table["pairs"][j] == len(shared)
        assert table["overlap"][j] == pytest.approx(np.mean(shared))


def test_window_activation_probability_matches_sets():
    trace = with_gaps_and_missing(random_trace(2, tokens=150, E=20, K=3), seed=1)
    q = window_activation_probability(trace, 3)
    windows = pd.DataFrame(reference_windows(trace, 3), columns=["layer", "sequence", "start", "union"])
    sets, where = token_sets(trace), {(s, p): i for i, (s, p) in enumerate(zip(trace.sequence.tolist(),
                                                                                trace.position.tolist()))}
    for j, layer in enumerate(trace.layers):
        rows = windows[windows["layer"] == layer]
        hits = np.zeros(20)
        for _, row in rows.iterrows():
            for e in set().union(*[sets[where[row["sequence"], row["start"] + k], j] for k in range(3)]):
                hits[e] += 1
        np.testing.assert_allclose(q[j], hits / len(rows))


def test_predictions_on_uniform_independent_routing_agree():
    trace = random_trace(7, tokens=6000, layers=2, E=32, K=2, sequences=40)
    table = verify_union_predictions(trace, batch_size=4, window=3, samples=2000)
    for column in ("uniform", "popularity", "windows"):
        np.testing.assert_allclose(table[column], table["measured"], rtol=0.03)


def test_window_prediction_sees_correlated_tokens():
    # Each sequence repeats one token's routing: a window loads K experts, not w K.
    rng = np.random.default_rng(0)
    per_sequence = np.argsort(rng.random((50, 1, 32)), axis=-1)[..., :2]
    experts = np.repeat(per_sequence, 20, axis=0)
    trace = RoutingTrace(experts, 32, sequence=np.repeat(np.arange(50), 20),
                         position=np.tile(np.arange(20), 50))
    table = verify_union_predictions(trace, batch_size=4, window=4, samples=2000)
    # Four sequences with independent uniform pairs: E (1 - (1 - K/E)**4) experts, Eq. 8 at t = 4.
    assert table["windows"].iloc[0] == pytest.approx(float(expected_active_experts(4, 32, 2)), rel=0.05)
    assert table["windows"].iloc[0] == pytest.approx(table["measured"].iloc[0], rel=0.05)
    assert table["uniform"].iloc[0] > 1.5 * table["measured"].iloc[0]


def test_effective_experts_bounds():
    rng = np.random.default_rng(0)
    balanced = np.array([rng.permutation(16)[:4] for _ in range(4000)])[:, None, :]
    fixed = np.tile(np.array([3, 5, 7, 9]), (50, 1))[:, None, :]
    spread = effective_experts(RoutingTrace(balanced, 16))["effective_experts"].item()
    assert 15.5 < spread <= 16
    assert effective_experts(RoutingTrace(fixed, 16))["effective_experts"].item() == pytest.approx(4)


def test_an_empty_trace_reports_no_statistics():
    empty = RoutingTrace(np.zeros((0, 2, 2), int), 8)
    assert effective_experts(empty)["effective_experts"].isna().all()
    assert popularity(empty)["probability"].isna().all()
    assert adjacent_overlap(empty)["overlap"].isna().all()
    assert window_union(empty, 1).empty and batch_union(empty).empty


# Format, summary, save and load ------------------------------------------------------------

def test_repr_summarises_instead_of_printing_arrays():
    trace = random_trace(tokens=5000)
    trace.meta = {"model_id": "tiny-moe"}
    text = repr(trace)
    assert len(text) < 250 and "E=70" in text and "tokens=5000" in text and "layers=3 [1,3,4]" in text
    assert "sequences=5" in text and "decode 5000" in text
    row = trace.summary()
    assert len(row) == 1 and row.loc[0, "model"] == "tiny-moe" and row.loc[0, "decode"] == 5000
    assert row.loc[0, ["E", "K", "tokens", "layers", "sequences"]].tolist() == [70, 4, 5000, 3, 5]


def test_round_trip(tmp_path):
    trace = random_trace()
    trace.weights = np.random.default_rng(0).random(trace.experts.shape).astype(np.float32)
    trace.phase = np.where(trace.position < 3, "prefill", np.where(trace.position < 6, "unknown", "decode"))
    trace.meta = {"model_id": "tiny", "dataset": "humaneval", "prompt_ids": ["HumanEval/0"]}
    path = trace.save(tmp_path / "sub" / "t.npz")
    loaded = RoutingTrace.load(path)
    for name in ("experts", "sequence", "position", "call", "phase", "weights", "layers"):
        np.testing.assert_array_equal(getattr(loaded, name), getattr(trace, name))
    assert loaded.meta == trace.meta and loaded.num_experts == trace.num_experts
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["t.npz"]


def test_failed_save_leaves_no_file(tmp_path):
    trace = random_trace()
    trace.meta = {"not json": object()}
    with pytest.raises(TypeError):
        trace.save(tmp_path / "t.npz")
    assert list(tmp_path.iterdir()) == []


def test_load_names_the_file_and_the_problem(tmp_path):
    bad = tmp_path / "bad.npz"
    np.savez(bad, experts=np.array([[[0, 0]]]), num_experts=4)
    with pytest.raises(ValueError, match=r"bad\.npz.*expert twice"):
        RoutingTrace.load(bad)
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"PK\x03\x04 but not a zip")
    with pytest.raises(ValueError, match="junk.npz: not a valid routing trace"):
        RoutingTrace.load(junk)
    np.savez(bad, experts=np.array([[[0, 9]]]), num_experts=4)
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        RoutingTrace.load(bad)


def test_load_of_a_text_log_says_what_it_is(tmp_path):
    log = tmp_path / "routes.jsonl"
    log.write_text('{"problem_id": 0, "token_idx": 0, "layer": 0, "experts": [1, 2]}\n')
    with pytest.raises(ValueError, match=r"routes\.jsonl: not a RoutingTrace \.npz.*moesd\.routing\.importers") as error:
        RoutingTrace.load(log)
    assert "pickle" not in str(error.value)


@pytest.mark.parametrize("kwargs, message", [
    ({"experts": np.zeros((2, 2))}, "shape"),
    ({"experts": np.zeros((2, 1, 2), float)}, "integer"),
    ({"num_experts": 1}, "exceeds"),
    ({"num_experts": 4.7}, "num_experts must be a whole number, got 4.7"),
    ({"num_experts": "4"}, "num_experts must be a whole number"),
    ({"num_experts": True}, "num_experts must be a whole number"),
    ({"sequence": np.zeros(3, int)}, "sequence"),
    ({"position": np.array([0.0, 1.5])}, "position must be an integer array"),
    ({"phase": np.array(["decode", "verify"])}, "phase"),
    ({"weights": np.zeros((2, 1, 3))}, "weights"),
    ({"layers": np.array([0, 1])}, "layers"),
    ({"experts": np.array([[[0, -1]], [[2, 3]]])}, "only some of its experts missing"),
    ({"experts": np.array([[[0, -2]], [[2, 3]]])}, r"\[0, 4\)"),
])
def test_bad_traces(kwargs, message):
    arguments = {"experts": np.array([[[0, 1]], [[2, 3]]]), "num_experts": 4, **kwargs}
    with pytest.raises(ValueError, match=message):
        RoutingTrace(**arguments)


def test_whole_float_num_experts_is_accepted_and_missing_rows_are_allowed():
    trace = RoutingTrace(np.array([[[0, 1], [-1, -1]]]), np.float64(4.0))
    assert trace.num_experts == 4 and trace.num_missing == 1
    assert "missing 1" in repr(trace)


def test_rejected_draft_rows_are_kept_apart(tmp_path):
    """Rows of rejected draft tokens (phase "rejected") survive a save and load, are refused by sequence statistics,
    and without_rejected leaves exactly the sequence's own tokens."""
    experts = np.array([[[0, 1]], [[1, 2]], [[2, 3]], [[3, 0]], [[0, 2]]])
    # A verification (call 2) fed positions 2 (accepted) and 3 (rejected); call 3 fed the token that replaced it.
    trace = RoutingTrace(experts, 4, sequence=[0, 0, 0, 0, 0], position=[0, 1, 2, 3, 3], call=[0, 1, 2, 2, 3],
                         phase=["prefill", "decode", "decode", "rejected", "decode"])
    loaded = RoutingTrace.load(trace.save(tmp_path / "sd.npz"))
    assert loaded.phase.tolist() == trace.phase.tolist() and loaded.summary()["rejected"].item() == 1
    with pytest.raises(ValueError, match="without_rejected"):
        window_union(loaded, 2)
    own = without_rejected(loaded)
    assert own.position.tolist() == [0, 1, 2, 3] and own.call.tolist() == [0, 1, 2, 3] and "rejected" not in own.phase
    assert without_rejected(own) is own
