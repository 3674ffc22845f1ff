"""RoutingTrace: validation, atomic save/load, importers, and statistics against plain Python."""

import json
import warnings

import numpy as np
import pandas as pd
import pytest

from moesd.experts import expected_active_experts_from_popularity
from moesd.traces import (
    RoutingTrace,
    adjacent_overlap,
    batch_union,
    expert_masks,
    from_layer_csv,
    from_token_jsonl,
    from_vllm_moe_log,
    popularity,
    random_union,
    verify_union,
    verify_union_predictions,
    window_union,
)


def random_trace(seed=0, tokens=120, layers=3, E=70, K=4, sequences=5, calls=17):
    """Routing of `tokens` tokens over `sequences` sequences and `calls` forward calls."""
    rng = np.random.default_rng(seed)
    experts = np.argsort(rng.random((tokens, layers, E)), axis=-1)[..., :K]
    sequence = np.sort(rng.integers(0, sequences, tokens))
    position = pd.Series(sequence).groupby(sequence).cumcount().to_numpy()
    return RoutingTrace(experts, E, sequence=sequence, position=position,
                        call=rng.integers(0, calls, tokens), layers=np.array([1, 3, 4])[:layers])


# Reference implementations with Python sets -------------------------------------------------

def reference_batch(trace):
    rows = []
    for call in sorted(set(trace.call.tolist())):
        idx = np.flatnonzero(trace.call == call)
        for j, layer in enumerate(trace.layers):
            rows.append((layer, call, len(idx), len({e for i in idx for e in trace.experts[i, j]})))
    return rows


def reference_windows(trace, t):
    rows = []
    for seq in sorted(set(trace.sequence.tolist())):
        idx = np.flatnonzero(trace.sequence == seq)
        idx = idx[np.argsort(trace.position[idx])]
        for j, layer in enumerate(trace.layers):
            for start in range(len(idx) - t + 1):
                window = idx[start:start + t]
                rows.append((layer, seq, trace.position[window[0]],
                             len({e for i in window for e in trace.experts[i, j]})))
    return sorted(rows)


@pytest.mark.parametrize("E", [8, 64, 70, 256])
def test_masks_hold_exactly_the_experts(E):
    trace = random_trace(E=E, K=min(8, E))
    masks = expert_masks(trace)
    for i in (0, 7, 55):
        for j in range(masks.shape[1]):
            bits = {w * 64 + b for w in range(masks.shape[2]) for b in range(64)
                    if int(masks[i, j, w]) >> b & 1}
            assert bits == set(trace.experts[i, j].tolist())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batch_union_matches_sets(seed):
    trace = random_trace(seed)
    frame = batch_union(trace).sort_values(["call", "layer"])
    expected = sorted(reference_batch(trace), key=lambda r: (r[1], r[0]))
    assert list(frame.itertuples(index=False, name=None)) == expected


@pytest.mark.parametrize("t", [1, 2, 3, 5, 8, 13])
def test_window_union_matches_sets(t):
    trace = random_trace(3, E=130, K=6)
    frame = window_union(trace, t)
    got = sorted(frame[["layer", "sequence", "start", "union"]].itertuples(index=False, name=None))
    assert got == reference_windows(trace, t)


def test_window_longer_than_every_sequence_is_empty():
    assert window_union(random_trace(), 1000).empty


def test_random_union_bounds_and_determinism():
    trace = random_trace()
    a, b = random_union(trace, 6, samples=50, seed=4), random_union(trace, 6, samples=50, seed=4)
    pd.testing.assert_frame_equal(a, b)
    assert a["union"].between(trace.top_k, 6 * trace.top_k).all()


def test_verify_union_is_a_union_of_windows():
    trace = random_trace(5, tokens=300, sequences=6)
    one = verify_union(trace, batch_size=1, window=3, samples=200)
    windows = set(window_union(trace, 3)["union"])
    assert set(one["union"]) <= windows
    many = verify_union(trace, batch_size=6, window=3, samples=200)
    assert many["union"].mean() > one["union"].mean()
    assert many["union"].max() <= min(trace.num_experts, 6 * 3 * trace.top_k)
    with pytest.raises(ValueError, match="batch_size"):
        verify_union(trace, batch_size=7, window=3)


def test_popularity_sums_to_k_and_predicts_uniform():
    trace = random_trace(tokens=2000, E=16, K=2)
    table = popularity(trace)
    sums = table.groupby("layer")["probability"].sum()
    np.testing.assert_allclose(sums, 2.0)
    p = table["probability"].to_numpy().reshape(3, 16)
    assert expected_active_experts_from_popularity(1, p) == pytest.approx([2, 2, 2])


def test_adjacent_overlap_of_repeated_tokens_is_one():
    experts = np.repeat(np.array([[[0, 1], [2, 3]]]), 10, axis=0)
    trace = RoutingTrace(experts, 8)
    table = adjacent_overlap(trace)
    assert (table["overlap"] == 1.0).all() and (table["pairs"] == 9).all()
    assert table["independent"].tolist() == [1.0, 1.0]


def test_adjacent_overlap_of_random_routing_is_near_k_over_e():
    table = adjacent_overlap(random_trace(tokens=4000, E=16, K=2, sequences=4))
    np.testing.assert_allclose(table["overlap"], 2 / 16, atol=0.03)


# Save and load ------------------------------------------------------------------------------

def test_round_trip(tmp_path):
    trace = random_trace()
    trace.weights = np.random.default_rng(0).random(trace.experts.shape).astype(np.float32)
    trace.phase = np.where(trace.position < 3, "prefill", "decode")
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
    junk.write_text("not a zip")
    with pytest.raises(ValueError, match="junk.npz"):
        RoutingTrace.load(junk)
    np.savez(bad, experts=np.array([[[0, 9]]]), num_experts=4)
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        RoutingTrace.load(bad)


@pytest.mark.parametrize("kwargs, message", [
    ({"experts": np.zeros((2, 2))}, "shape"),
    ({"experts": np.zeros((2, 1, 2), float)}, "integer"),
    ({"num_experts": 1}, "exceeds"),
    ({"sequence": np.zeros(3, int)}, "sequence"),
    ({"phase": np.array(["decode", "verify"])}, "phase"),
    ({"weights": np.zeros((2, 1, 3))}, "weights"),
    ({"layers": np.array([0, 1])}, "layers"),
])
def test_bad_traces(kwargs, message):
    arguments = {"experts": np.array([[[0, 1]], [[2, 3]]]), "num_experts": 4, **kwargs}
    with pytest.raises(ValueError, match=message):
        RoutingTrace(**arguments)


# Importers ----------------------------------------------------------------------------------

def write_jsonl(path, records):
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")


def vllm_layer(layer, calls):
    lines = [{"type": "meta", "model_id": "tiny-moe", "layers_logged": [1, 3], "top_k": 2}]
    for call in calls:
        for row, (request, ids) in enumerate(call):
            lines.append({"type": "route", "req_id": request, "token_idx": row, "layer": layer,
                          "topk_ids": [i + layer for i in ids], "topk_weights": [0.6, 0.4]})
    return lines


CALLS = [
    [("warm", [0, 1])],                                       # warm-up, skipped
    [("a", [0, 1]), ("a", [1, 2]), ("b", [2, 3])],            # prefill of a (2 rows), b (1 row)
    [("a", [3, 4]), ("b", [4, 5])],                           # one decode step of both
]


def test_vllm_log(tmp_path):
    for layer in (1, 3):
        write_jsonl(tmp_path / f"layer{layer}.jsonl", vllm_layer(layer, CALLS))
    trace = from_vllm_moe_log([tmp_path / "layer3.jsonl", tmp_path / "layer1.jsonl"], num_experts=16,
                              skip_calls=1)
    assert trace.layers.tolist() == [1, 3] and trace.num_tokens == 5
    assert trace.call.tolist() == [0, 0, 0, 1, 1]
    assert trace.sequence.tolist() == [0, 0, 1, 0, 1]
    assert trace.position.tolist() == [0, 1, 0, 2, 1]
    assert trace.phase.tolist() == ["prefill", "prefill", "decode", "decode", "decode"]
    assert trace.experts[:, 1].tolist() == [[3, 4], [4, 5], [5, 6], [6, 7], [7, 8]]
    assert trace.meta["model_id"] == "tiny-moe" and trace.meta["request_ids"] == ["a", "b"]


def test_vllm_log_infers_e_with_a_warning(tmp_path):
    write_jsonl(tmp_path / "l.jsonl", vllm_layer(1, CALLS))
    with pytest.warns(UserWarning, match="inferring E = 7"):
        assert from_vllm_moe_log(tmp_path / "l.jsonl").num_experts == 7


@pytest.mark.parametrize("mutate, message", [
    (lambda lines: lines[1:], "no meta line"),
    (lambda lines: lines + [{"type": "route", "layer": 1}], r"l\.jsonl:\d+: route record"),
    (lambda lines: lines + [{"type": "oops"}], r"l\.jsonl:\d+: expected type"),
    (lambda lines: lines[:2] + [dict(lines[2], topk_ids="3")] + lines[3:], r"l\.jsonl:3: expert ids"),
])
def test_vllm_log_errors(tmp_path, mutate, message):
    write_jsonl(tmp_path / "l.jsonl", mutate(vllm_layer(1, CALLS)))
    with pytest.raises(ValueError, match=message):
        from_vllm_moe_log(tmp_path / "l.jsonl", num_experts=16)


def test_vllm_log_not_json(tmp_path):
    (tmp_path / "l.jsonl").write_text('{"type": "meta"}\n{oops\n')
    with pytest.raises(ValueError, match=r"l\.jsonl:2: not JSON"):
        from_vllm_moe_log(tmp_path / "l.jsonl", num_experts=8)


def test_vllm_layers_must_agree(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", vllm_layer(1, CALLS))
    write_jsonl(tmp_path / "b.jsonl", vllm_layer(3, CALLS[:2]))
    with pytest.raises(ValueError, match="same calls"):
        from_vllm_moe_log([tmp_path / "a.jsonl", tmp_path / "b.jsonl"], num_experts=16)


def test_token_jsonl(tmp_path):
    records = [{"problem_id": p, "layer": layer, "experts": [t + layer, t + layer + 1],
                "gating_probs": [0.7, 0.3], "token_idx": t}
               for p in ("HumanEval/1", "HumanEval/0") for t in (1, 0, 2) for layer in (2, 0)]
    write_jsonl(tmp_path / "r.jsonl", records)
    trace = from_token_jsonl(tmp_path / "r.jsonl", num_experts=8)
    assert trace.num_tokens == 6 and trace.layers.tolist() == [0, 2]
    assert trace.position.tolist() == [0, 1, 2, 0, 1, 2]
    assert trace.experts[:3, 1].tolist() == [[2, 3], [3, 4], [4, 5]]
    assert trace.meta["problem_ids"] == ["HumanEval/1", "HumanEval/0"]
    np.testing.assert_allclose(trace.weights[..., 0], 0.7)


def test_token_jsonl_errors(tmp_path):
    base = {"problem_id": "p", "layer": 0, "experts": [1, 2], "gating_probs": [0.5, 0.5], "token_idx": 0}
    write_jsonl(tmp_path / "r.jsonl", [base, base])
    with pytest.raises(ValueError, match=r"r\.jsonl:2: a second record"):
        from_token_jsonl(tmp_path / "r.jsonl", num_experts=4)
    write_jsonl(tmp_path / "r.jsonl", [base, dict(base, layer=1), dict(base, token_idx=1)])
    with pytest.raises(ValueError, match="missing in some layers"):
        from_token_jsonl(tmp_path / "r.jsonl", num_experts=4)
    write_jsonl(tmp_path / "r.jsonl", [base, dict(base, token_idx=1, experts=[1])])
    with pytest.raises(ValueError, match=r"r\.jsonl:2: gating_probs"):
        from_token_jsonl(tmp_path / "r.jsonl", num_experts=4)


def test_layer_csv(tmp_path):
    path = tmp_path / "r.csv"
    path.write_text("layer_id,expert_ids\n0,1 2\n5,3 4\n0,2 3\n5,0 7\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trace = from_layer_csv(path, num_experts=8)
    assert trace.layers.tolist() == [0, 5]
    assert trace.experts.tolist() == [[[1, 2], [3, 4]], [[2, 3], [0, 7]]]


@pytest.mark.parametrize("text, message", [
    ("0,1 2\n0,x 2\n", r"r\.csv:2"),
    ("0,1 2\n0\n", r"r\.csv:2: expected two fields"),
    ("0,1 2\n1,\n", r"r\.csv:2: no expert ids"),
    ("0,1 2\n1,1 2\n1,2 3\n", "different numbers of tokens"),
    ("0,1 2\n0,2 1 3\n", "different numbers of experts"),
    ("", "no routing lines"),
])
def test_layer_csv_errors(tmp_path, text, message):
    (tmp_path / "r.csv").write_text(text)
    with pytest.raises(ValueError, match=message):
        from_layer_csv(tmp_path / "r.csv", num_experts=8)


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
    assert table["windows"].iloc[0] == pytest.approx(table["measured"].iloc[0], rel=0.05)
    assert table["uniform"].iloc[0] > 1.5 * table["measured"].iloc[0]


def test_effective_experts_bounds():
    from moesd.traces import effective_experts

    rng = np.random.default_rng(0)
    balanced = np.array([rng.permutation(16)[:4] for _ in range(4000)])[:, None, :]
    fixed = np.tile(np.array([3, 5, 7, 9]), (50, 1))[:, None, :]
    spread = effective_experts(RoutingTrace(balanced, 16))["effective_experts"].item()
    assert 15.5 < spread <= 16
    assert effective_experts(RoutingTrace(fixed, 16))["effective_experts"].item() == pytest.approx(4)
