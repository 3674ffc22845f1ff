"""Importers of other tools' routing logs, on the committed excerpts in tests/data/traces/ and on
files written here; window unions of an imported ragged log against plain-Python sets."""

import json
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from moesd.routing.importers import from_arrays, from_layer_csv, from_token_jsonl, imported_with_warnings
from moesd.routing.traces import MISSING
from moesd.routing.unions import window_union
from moesd.routing.vllm_logs import from_vllm_moe_log, from_vllm_routed_experts, save_vllm_routed_experts

EXCERPTS = Path(__file__).parent / "data" / "traces"


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# Per-token JSONL ---------------------------------------------------------------------------

def test_token_jsonl_excerpt_drops_ragged_tokens_with_a_warning():
    with pytest.warns(UserWarning, match=r"2 tokens logged in only some of the 4 layers dropped: "
                                         r"sequence 'HumanEval/0' position 4; sequence 'HumanEval/1' position 3"):
        trace = from_token_jsonl(EXCERPTS / "token_routing.jsonl", num_experts=8)
    assert trace.num_tokens == 7 and trace.layers.tolist() == [0, 1, 2, 3] and trace.num_missing == 0
    assert trace.sequence.tolist() == [0, 0, 0, 0, 1, 1, 1]
    assert trace.position.tolist() == [0, 1, 2, 3, 0, 1, 2]
    assert trace.meta["sequence_ids"] == ["HumanEval/0", "HumanEval/1"]
    assert trace.experts[2].tolist() == [[5, 1], [3, 0], [7, 2], [6, 1]]  # HumanEval/0 token 2, from the file
    np.testing.assert_allclose(trace.weights[0, :, 0], [0.62, 0.55, 0.71, 0.5])


def test_token_jsonl_keeps_ragged_tokens_with_the_layers_they_have():
    with pytest.warns(UserWarning, match="kept with the layers they have"):
        trace = from_token_jsonl(EXCERPTS / "token_routing.jsonl", num_experts=8, ragged="keep")
    assert trace.num_tokens == 9 and trace.num_missing == 2 + 3
    last = trace.experts[(trace.sequence == 0) & (trace.position == 4)][0]
    assert last.tolist() == [[4, 1], [5, 3], [MISSING] * 2, [MISSING] * 2]
    assert np.isnan(trace.weights[(trace.sequence == 0) & (trace.position == 4)][0, 2:]).all()
    with pytest.raises(ValueError, match=r"token_routing\.jsonl: 2 tokens are logged in only some"):
        from_token_jsonl(EXCERPTS / "token_routing.jsonl", num_experts=8, ragged="error")


def test_token_jsonl_aliases_and_a_record_without_weights():
    with pytest.warns(UserWarning, match=r"1 of 12 records \(first on line 12\) have no weights"):
        trace = from_token_jsonl(EXCERPTS / "token_routing_aliases.jsonl", num_experts=8)
    assert trace.meta["sequence_ids"] == [7, 8] and trace.num_tokens == 6
    assert trace.experts[:, 0].tolist() == [[7, 2], [0, 4], [1, 6], [0, 3], [1, 5], [2, 7]]
    assert np.isnan(trace.weights[5, 1]).all() and not np.isnan(trace.weights[:5]).any()


def test_token_jsonl_field_mapping(tmp_path):
    path = write_jsonl(tmp_path / "r.jsonl", [{"seq": "a", "t": t, "l": 2, "ids": [t, t + 1]} for t in range(3)])
    trace = from_token_jsonl(path, num_experts=4, fields={"sequence": "seq", "position": "t", "layer": "l",
                                                          "experts": ("choice", "ids")})
    assert trace.layers.tolist() == [2] and trace.experts[:, 0].tolist() == [[0, 1], [1, 2], [2, 3]]
    with pytest.raises(ValueError, match="fields has an unknown key 'token'"):
        from_token_jsonl(path, fields={"token": "t"})


@pytest.mark.parametrize("change, message", [
    ({"token_idx": 2.5}, r"r\.jsonl:2: position must be a whole number, got 2\.5"),
    ({"token_idx": True}, r"r\.jsonl:2: position must be a whole number"),
    ({"experts": [1, 2.5]}, r"r\.jsonl:2: experts must be a whole number"),
    ({"experts": []}, r"r\.jsonl:2: experts must be a non-empty list"),
    ({"gating_probs": [0.5]}, r"r\.jsonl:2: weights must list one number per expert id"),
    ({"problem_id": 1}, r"r\.jsonl:2: sequence id 1 is a number but .*r\.jsonl:1 has a string"),
    ({"token_idx": 0}, r"r\.jsonl:2: a second record for the same sequence, position and layer"),
    ({"experts": [1, 2, 3], "gating_probs": [0.4, 0.3, 0.3]}, r"r\.jsonl:2: experts lists 3 ids, the first record 2"),
])
def test_token_jsonl_errors_name_file_line_and_field(tmp_path, change, message):
    first = {"problem_id": "1", "layer": 0, "experts": [1, 2], "gating_probs": [0.5, 0.5], "token_idx": 0}
    path = write_jsonl(tmp_path / "r.jsonl", [first, {**first, "token_idx": 1, **change}])
    with pytest.raises(ValueError, match=message):
        from_token_jsonl(path, num_experts=4)


def test_token_jsonl_missing_field_and_bad_json(tmp_path):
    path = write_jsonl(tmp_path / "r.jsonl", [{"problem_id": "p", "layer": 0, "token_idx": 0}])
    with pytest.raises(ValueError, match=r"r\.jsonl:1: no experts field \(looked for experts, topk_ids"):
        from_token_jsonl(path)
    path.write_text(json.dumps({"problem_id": "p", "layer": 0, "token_idx": 0, "experts": [1, 2]}) + "\n{oops\n")
    with pytest.raises(ValueError, match=r"r\.jsonl:2: not JSON"):
        from_token_jsonl(path)


def test_ragged_mixtral_log_gives_the_window_unions_of_its_complete_tokens(tmp_path):
    """A per-token JSONL of a Mixtral-shaped model (32 layers, E = 8,
    K = 2) whose last one or two tokens per sequence are logged in only some layers loads with a
    warning, and its window unions equal those of plain-Python sets over the complete tokens."""
    rng = np.random.default_rng(13)
    layers, num_experts, top_k = 32, 8, 2
    records, complete = [], {}
    for sequence in ("mt_bench/81", "mt_bench/82", "mt_bench/83"):
        length, short = int(rng.integers(18, 26)), int(rng.integers(1, 3))
        for position in range(length):
            logged = layers if position < length - short else int(rng.integers(1, layers))
            choices = [rng.choice(num_experts, top_k, replace=False).tolist() for _ in range(logged)]
            if logged == layers:
                complete[sequence, position] = choices
            for layer, ids in enumerate(choices):
                records.append({"problem_id": sequence, "token_pos": position, "layer": layer, "experts": ids,
                                "gating_probs": [0.6, 0.4]})
    rng.shuffle(records)
    path = write_jsonl(tmp_path / "mixtral.jsonl", records)
    with pytest.warns(UserWarning, match=r"tokens logged in only some of the 32 layers dropped: sequence 'mt_bench/8"):
        trace = from_token_jsonl(path, num_experts=num_experts)
    assert trace.num_tokens == len(complete)
    names = trace.meta["sequence_ids"]
    for t in (1, 2, 3, 5):
        expected = []
        for (sequence, position), _ in complete.items():
            run = [complete.get((sequence, position + k)) for k in range(t)]
            if all(run):
                for layer in range(layers):
                    expected.append((layer, sequence, position, len({e for token in run for e in token[layer]})))
        frame = window_union(trace, t)
        got = [(layer, names[s], start, union) for layer, s, start, union in frame.itertuples(index=False)]
        assert sorted(got) == sorted(expected)


# vLLM per-layer logs ------------------------------------------------------------------------

def test_vllm_log_excerpt_with_a_constant_request_id():
    files = sorted((EXCERPTS / "vllm_moe_log").glob("*.jsonl"))
    with pytest.warns(UserWarning) as caught:
        trace = from_vllm_moe_log(files, num_experts=60, skip_calls=1)
    messages = " ".join(str(w.message) for w in caught)
    assert "moe_layer12.jsonl (1 row short)" in messages and "dropped" in messages
    assert "every record has req_id 'r1'" in messages
    assert trace.layers.tolist() == [0, 12] and trace.top_k == 4
    assert trace.num_tokens == 7 + 2 + 2 + 2 + 1  # the last 1-row call is not in layer 12's file
    assert "prefill" not in trace.phase.tolist()
    assert trace.phase.tolist() == ["unknown"] * 13 + ["decode"]
    assert trace.meta["model_id"].startswith("example") and trace.meta["request_ids"] == "uninformative"


def test_vllm_log_excerpt_with_the_number_of_concurrent_requests():
    files = sorted((EXCERPTS / "vllm_moe_log").glob("*.jsonl"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trace = from_vllm_moe_log(files, num_experts=60, skip_calls=1, max_decode_rows=2, ragged="keep")
    assert trace.num_tokens == 15 and trace.num_missing == 1
    assert trace.phase.tolist() == ["unknown"] * 7 + ["decode"] * 8
    decode = trace.select(trace.phase == "decode")
    # rows of a 2-row step are different requests; the two 1-row steps are one request's consecutive tokens
    assert np.unique(decode.sequence[:6]).size == 6
    assert decode.sequence[6] == decode.sequence[7] and decode.position[7] == decode.position[6] + 1
    assert window_union(decode, 2)["layer"].tolist() == [0]  # the last row is missing in layer 12


def vllm_layer(layer, calls):
    lines = [{"type": "meta", "model_id": "tiny-moe", "layers_logged": [1, 3], "top_k": 2}]
    for call in calls:
        for row, (request, ids) in enumerate(call):
            lines.append({"type": "route", "req_id": request, "token_idx": row, "layer": layer,
                          "topk_ids": [i + layer for i in ids], "topk_weights": [0.6, 0.4]})
    return lines


CALLS = [
    [("warm", [0, 1])],                                       # warm-up, skipped
    [("a", [0, 1]), ("a", [1, 2]), ("b", [2, 3])],            # prefill of a (2 rows) and b (1 row)
    [("a", [3, 4]), ("b", [4, 5])],                           # one decode step of both
    [("a", [5, 6]), ("a", [6, 7]), ("b", [7, 8])],            # a verifies two tokens (SD), b decodes
]


def test_vllm_log_with_request_ids(tmp_path):
    for layer in (1, 3):
        write_jsonl(tmp_path / f"layer{layer}.jsonl", vllm_layer(layer, CALLS))
    trace = from_vllm_moe_log([tmp_path / "layer3.jsonl", tmp_path / "layer1.jsonl"], num_experts=16,
                              skip_calls=1)
    assert trace.layers.tolist() == [1, 3] and trace.num_tokens == 8
    assert trace.call.tolist() == [0, 0, 0, 1, 1, 2, 2, 2]
    assert trace.sequence.tolist() == [0, 0, 1, 0, 1, 0, 0, 1]
    assert trace.position.tolist() == [0, 1, 0, 2, 1, 3, 4, 2]
    assert trace.phase.tolist() == ["prefill", "prefill", "prefill", "decode", "decode", "unknown", "unknown",
                                    "decode"]
    assert trace.experts[:, 1].tolist()[:3] == [[3, 4], [4, 5], [5, 6]]
    assert trace.meta["model_id"] == "tiny-moe" and trace.meta["request_ids"] == ["a", "b"]


def test_vllm_log_infers_e_with_a_warning(tmp_path):
    write_jsonl(tmp_path / "l.jsonl", vllm_layer(1, CALLS))
    with pytest.warns(UserWarning, match="inferring E = 10"):
        assert from_vllm_moe_log(tmp_path / "l.jsonl").num_experts == 10


@pytest.mark.parametrize("mutate, message", [
    (lambda lines: lines[1:], r"l\.jsonl: no meta line"),
    (lambda lines: lines + [{"type": "route", "layer": 1, "req_id": "a"}], r"l\.jsonl:\d+: no row field"),
    (lambda lines: lines + [{"type": "oops"}], r"l\.jsonl:\d+: expected type"),
    (lambda lines: lines[:2] + [dict(lines[2], topk_ids="3")] + lines[3:], r"l\.jsonl:3: experts must be a non-empty"),
    (lambda lines: lines[:2] + [dict(lines[2], token_idx=0.5)] + lines[3:], r"l\.jsonl:3: row must be a whole number"),
    (lambda lines: lines[:2] + [dict(lines[2], layer=2)] + lines[3:], r"l\.jsonl:3: layer 2 in a file of layer 1"),
])
def test_vllm_log_errors(tmp_path, mutate, message):
    write_jsonl(tmp_path / "l.jsonl", mutate(vllm_layer(1, CALLS)))
    with pytest.raises(ValueError, match=message):
        from_vllm_moe_log(tmp_path / "l.jsonl", num_experts=16)


def test_vllm_log_not_json(tmp_path):
    (tmp_path / "l.jsonl").write_text('{"type": "meta"}\n{oops\n')
    with pytest.raises(ValueError, match=r"l\.jsonl:2: not JSON"):
        from_vllm_moe_log(tmp_path / "l.jsonl", num_experts=8)


def test_vllm_layer_files_that_disagree_name_the_line(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", vllm_layer(1, CALLS))
    changed = [list(call) for call in CALLS]
    changed[2] = [("b", [3, 4]), ("a", [4, 5])]
    write_jsonl(tmp_path / "b.jsonl", vllm_layer(3, changed))
    with pytest.raises(ValueError, match=r"b\.jsonl:6: call 2 row 0 request 'b' where .*a\.jsonl:6 has call 2 "
                                         r"row 0 request 'a'"):
        from_vllm_moe_log([tmp_path / "a.jsonl", tmp_path / "b.jsonl"], num_experts=16)
    write_jsonl(tmp_path / "b.jsonl", vllm_layer(3, CALLS[:2]))
    with pytest.raises(ValueError, match=r"layer files end early: b\.jsonl \(5 rows short\)"):
        from_vllm_moe_log([tmp_path / "a.jsonl", tmp_path / "b.jsonl"], num_experts=16, ragged="error")


# Layer CSV ------------------------------------------------------------------------------------

def test_layer_csv_excerpt():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trace = from_layer_csv(EXCERPTS / "layer_routing.csv", num_experts=10)
    assert trace.layers.tolist() == [0, 1] and trace.num_tokens == 4
    assert trace.experts[:, 0].tolist() == [[3, 9], [3, 4], [9, 1], [0, 3]]
    assert set(trace.phase) == {"unknown"}


@pytest.mark.parametrize("text, message", [
    ("0,1 2\n0,x 2\n", r"r\.csv:2: expert_ids must be whole numbers, got 'x 2'"),
    ("0,1 2\nq,1 2\n", r"r\.csv:2: layer_id must be a whole number"),
    ("0,1 2\n0\n", r"r\.csv:2: expected two fields"),
    ("0,1 2\n1,\n", r"r\.csv:2: expert_ids must be a non-empty list of expert ids, got \[\]"),
    ("0,1 2\n0,2 1 3\n", "different numbers of experts"),
    ("", "no routing lines"),
])
def test_layer_csv_errors(tmp_path, text, message):
    (tmp_path / "r.csv").write_text(text)
    with pytest.raises(ValueError, match=message):
        from_layer_csv(tmp_path / "r.csv", num_experts=8)


@pytest.mark.parametrize("text", ["0,3 1\n0,2 1\n", "\ufeff0,3 1\n0,2 1\n", "layer_id,expert_ids\n0,3 1\n0,2 1\n"])
def test_layer_csv_reads_the_first_line_of_a_headerless_file(tmp_path, text):
    """A first line with a digit is a token (it was skipped as a header when it started with a byte-order mark)."""
    (tmp_path / "r.csv").write_text(text, encoding="utf-8")
    assert from_layer_csv(tmp_path / "r.csv", num_experts=4).experts[:, 0].tolist() == [[3, 1], [2, 1]]


def test_layer_csv_ragged(tmp_path):
    (tmp_path / "r.csv").write_text("0,1 2\n1,1 2\n0,2 3\n")
    with pytest.warns(UserWarning, match="different numbers of tokens.*dropped"):
        assert from_layer_csv(tmp_path / "r.csv", num_experts=8).num_tokens == 1
    with pytest.warns(UserWarning, match="marked missing"):
        assert from_layer_csv(tmp_path / "r.csv", num_experts=8, ragged="keep").num_missing == 1
    with pytest.raises(ValueError, match="different numbers of tokens"):
        from_layer_csv(tmp_path / "r.csv", num_experts=8, ragged="error")


# Per-request arrays and vLLM's routed experts ---------------------------------------------------

def test_from_arrays():
    arrays = [np.array([[[0, 1]], [[1, 2]], [[2, 3]]]), np.array([[[3, 0]], [[0, 2]]])]
    trace = from_arrays(arrays, num_experts=4, layers=[5], prompt_tokens=[2, 1], sequence_ids=[10, 11])
    assert trace.sequence.tolist() == [10, 10, 10, 11, 11] and trace.position.tolist() == [0, 1, 2, 0, 1]
    assert trace.phase.tolist() == ["prefill", "prefill", "decode", "prefill", "decode"]
    assert trace.layers.tolist() == [5] and trace.call.tolist() == [0, 1, 2, 3, 4]
    assert set(from_arrays(arrays, 4).phase) == {"unknown"}
    with pytest.raises(ValueError, match=r"arrays\[1\] has layers x K = \(1, 3\)"):
        from_arrays([arrays[0], np.zeros((2, 1, 3), int)], 4)
    with pytest.raises(ValueError, match=r"arrays\[0\] must be an integer array"):
        from_arrays([np.zeros((2, 1, 2))], 4)
    with pytest.raises(ValueError, match="prompt_tokens must give one count"):
        from_arrays(arrays, 4, prompt_tokens=[1])


def test_vllm_routed_experts_excerpts_in_both_formats_agree():
    from_json = from_vllm_routed_experts(EXCERPTS / "vllm_routed_experts.json")
    from_npz = from_vllm_routed_experts(EXCERPTS / "vllm_routed_experts.npz")
    for trace in (from_json, from_npz):
        assert trace.num_experts == 16 and trace.top_k == 2 and trace.layers.tolist() == [0, 1]
        assert trace.meta["request_ids"] == ["0", "1"] and trace.meta["source"] == "vllm_routed_experts"
        assert trace.phase.tolist() == ["prefill"] * 3 + ["decode"] * 2 + ["prefill"] * 2 + ["decode"] * 3
        assert trace.experts[5].tolist() == [[15, 2], [3, 6]]
    np.testing.assert_array_equal(from_json.experts, from_npz.experts)
    np.testing.assert_array_equal(from_json.position, from_npz.position)


def request_output(request_id, prompt, output, routed, completions=1):
    return SimpleNamespace(request_id=request_id, prompt_token_ids=list(range(prompt)), outputs=[
        SimpleNamespace(index=i, token_ids=list(range(output)), routed_experts=routed) for i in range(completions)])


def test_save_and_read_vllm_routed_experts(tmp_path):
    rng = np.random.default_rng(0)
    routed = np.stack([np.argsort(rng.random((9, 3, 8)), axis=-1)[:, j, :2] for j in range(3)], axis=1)
    routed[:, 0] = 0  # a dense layer left zero in a buffer sized by every hidden layer
    outputs = [request_output("q0", 4, 6, routed, completions=2)]
    path = save_vllm_routed_experts(outputs, tmp_path / "r.json", model_id="m", num_experts=8)
    with pytest.warns(UserWarning, match=r"layer axis entries \[0\] hold no routing"):
        trace = from_vllm_routed_experts(path, layers=[0, 1, 2])
    assert trace.layers.tolist() == [1, 2] and trace.meta["request_ids"] == ["q0#0", "q0#1"]
    np.testing.assert_array_equal(trace.experts[:9], routed[:, 1:])
    with pytest.raises(ValueError, match="request 'q1' has no routed_experts: start vLLM with"):
        save_vllm_routed_experts([request_output("q1", 2, 2, None)], tmp_path / "x.npz")
    save_vllm_routed_experts([request_output("q2", 2, 2, routed)], tmp_path / "long.npz")
    with pytest.raises(ValueError, match=r"request 'q2': routed_experts of shape \(9, 3, 2\) for 2 prompt and 2"):
        from_vllm_routed_experts(tmp_path / "long.npz", num_experts=8)
    (tmp_path / "other.json").write_text('{"requests": []}')
    with pytest.raises(ValueError, match=r"other\.json: field 'format' must be"):
        from_vllm_routed_experts(tmp_path / "other.json")


def test_the_book_reads_the_same_excerpts():
    from moesd.paper_tables import DATA_DIR

    book = DATA_DIR / "traces" / "examples"
    ours = sorted(p.relative_to(EXCERPTS) for p in EXCERPTS.rglob("*") if p.is_file())
    assert ours == sorted(p.relative_to(book) for p in book.rglob("*") if p.is_file())
    for name in ours:
        assert (book / name).read_bytes() == (EXCERPTS / name).read_bytes(), name


def test_importers_take_their_path_by_keyword_and_warn_at_the_callers_line(tmp_path):
    """The file-naming wrapper keeps each importer's signature and reports warnings where it was called,
    also when the import then fails (the warning often explains the failure)."""
    path = tmp_path / "routes.csv"
    path.write_text("layer_id,expert_ids\n0,1 2\n0,1 3\n1,1 2\n")  # layer 0 lists a second token
    with pytest.warns(UserWarning, match="different numbers of tokens") as record:
        trace = from_layer_csv(path=path, num_experts=4)
    assert trace.experts.shape == (1, 2, 2) and record[0].filename == __file__
    meta = {"type": "meta", "model_id": "m", "layers_logged": [0, 1], "top_k": 2}
    for layer, rows in ((0, [[0, 1], [0, 1]]), (1, [[0, 1, 2]])):  # layer 1 ends early, with K = 3
        routes = [{"type": "route", "req_id": "a", "token_idx": i, "layer": layer, "topk_ids": ids}
                  for i, ids in enumerate(rows)]
        (tmp_path / f"layer{layer}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [meta, *routes]))
    with pytest.warns(UserWarning, match="layer files end early") as record:
        with pytest.raises(ValueError, match="layer1.jsonl:2: 3 experts per token where .*layer0.jsonl:2 has 2"):
            from_vllm_moe_log([tmp_path / "layer0.jsonl", tmp_path / "layer1.jsonl"], num_experts=4, ragged="keep")
    assert record[0].filename == __file__


def test_imported_with_warnings_returns_the_trace_and_the_messages_in_order(tmp_path):
    path = tmp_path / "routes.csv"
    path.write_text("layer_id,expert_ids\n0,1 2\n0,1 3\n1,1 2\n")  # layer 0 lists a second token
    trace, messages = imported_with_warnings(from_layer_csv, path, num_experts=4)
    assert trace.experts.shape == (1, 2, 2) and len(messages) == 1 and "different numbers of tokens" in messages[0]
    clean = tmp_path / "clean.csv"
    clean.write_text("layer_id,expert_ids\n0,1 2\n1,1 3\n")
    assert imported_with_warnings(from_layer_csv, clean, num_experts=4)[1] == []
