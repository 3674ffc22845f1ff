"""Read vLLM's routing into a :class:`moesd.routing.traces.RoutingTrace`: per-layer batch logs and returned routed experts.

Two sources, each described in its reader's docstring and tried on a small excerpt under
``tests/data/traces/``:

* :func:`from_vllm_moe_log`: JSONL files, one per layer, of an instrumented vLLM whose records carry
  the row inside a forward call (``token_idx``) and often a constant request id;
* :func:`from_vllm_routed_experts`: what vLLM returns itself with ``enable_return_routed_experts``
  (``CompletionOutput.routed_experts``, an array [tokens, layers, K] per request), saved to
  ``.npz`` or ``.json`` by :func:`save_vllm_routed_experts`.

Layer files cut short at the end are ragged: the rows that some files lack are dropped, kept (marked
:data:`moesd.routing.traces.MISSING`) or refused, per ``ragged`` (:data:`moesd.routing.log_reading.RAGGED`).
Errors name the file, the line and the field. Capturing routing through vLLM is
:mod:`moesd.routing.vllm_capture`; the other tools' formats are :mod:`moesd.routing.importers`.
"""

from __future__ import annotations

import json
import numbers
import os
import warnings
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from moesd._files import atomic_write, npz_arrays, parse_json, read_json
from moesd.routing.importers import from_arrays
from moesd.routing.log_reading import (check_ragged, expert_ids, field_names, get_field, given_num_experts,
                                       infer_num_experts, names_its_files, read_jsonl, request_key, router_weights,
                                       whole_number)
from moesd.routing.traces import MISSING, RoutingTrace

VLLM_LOG_FIELDS = {
    "request": ("req_id", "request_id"),
    "row": ("token_idx", "token_pos", "row"),
    "layer": ("layer", "layer_id"),
    "experts": ("topk_ids", "experts", "expert_ids"),
    "weights": ("topk_weights", "gating_probs", "weights"),
}
"""Default field names of :func:`from_vllm_moe_log`; ``weights`` is optional."""

VLLM_ROUTED_FORMAT = "moesd-vllm-routed-experts/1"
"""Value of the ``format`` field of the files :func:`save_vllm_routed_experts` writes."""


def _count_of(number: int, noun: str) -> str:
    return f"{number} {noun}" + ("" if number == 1 else "s")


# --- vLLM per-layer logs -----------------------------------------------------------------------

@names_its_files
def from_vllm_moe_log(paths, num_experts=None, skip_calls: int = 0, fields: Mapping | None = None,
                      request_ids: str = "auto", max_decode_rows: int = 1, ragged: str = "drop") -> RoutingTrace:
    """Read the JSONL routing logs of an instrumented vLLM, one file per logged layer.

    Each file opens with ``{"type": "meta", "model_id", "layers_logged", "top_k", ...}``; every other
    line is ``{"type": "route", "req_id", "token_idx", "layer", "topk_ids", "topk_weights"}``, where
    ``token_idx`` is the row inside one forward call and restarts at 0 at each call (the format of
    a FusedMoE logger hooked after ``select_experts``). Field names can be changed with ``fields``
    (defaults :data:`VLLM_LOG_FIELDS`). Request ids are strings or whole numbers, not both in one file
    (1 and "1" are refused, not merged); expert ids are checked on their line (whole numbers, distinct,
    in ``[0, num_experts)``).

    Phases are never guessed to be ``prefill`` where the log cannot say:

    * with informative request ids, a request's first call is its prefill, a later call with one
      row of it a decode step, a later call with several rows ``unknown`` (a prefill chunk or a
      speculative verification);
    * when every record has the same ``req_id`` (FusedMoE does not know the request, so loggers
      write a constant), requests cannot be told apart inside a call: a call with one row after
      another call is a decode step and continues the sequence of the call before it; a call with
      at most ``max_decode_rows`` rows (give the number of requests the engine ran at once) is a
      decode step of that many requests, one sequence per row; every other call is ``unknown``
      and its rows a sequence of their own. A warning says how many calls went which way.

    Parameters
    ----------
    paths : path or list of paths
        The files, one per layer; they must log the same calls.
    num_experts : int, optional
        ``E``; inferred as largest id + 1, with a warning, when missing.
    skip_calls : int, default 0
        Forward calls to drop from the start (warm-up and profiling runs).
    fields : mapping, optional
        Field name (or names) per key ``request``, ``row``, ``layer``, ``experts``, ``weights``.
    request_ids : {"auto", "use", "ignore"}
        Whether ``req_id`` tells requests apart: ``"auto"`` trusts it when it takes more than one value.
    max_decode_rows : int, default 1
        With uninformative request ids, the largest call still read as one decode step.
    ragged : {"drop", "keep", "error"}
        What to do with rows at the end of the log that some layer files lack (a file cut short);
        files that disagree anywhere else are refused, naming the file and line.
    """
    paths = [Path(paths)] if isinstance(paths, (str, os.PathLike)) else [Path(p) for p in paths]
    if not paths:
        raise ValueError("paths must name at least one log file")
    num_experts = given_num_experts(num_experts)
    if request_ids not in ("auto", "use", "ignore"):
        raise ValueError(f"request_ids must be 'auto', 'use' or 'ignore', got {request_ids!r}")
    for name, value, low in (("max_decode_rows", max_decode_rows, 1), ("skip_calls", skip_calls, 0)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
            raise ValueError(f"{name} must be a whole number >= {low}, got {value!r}")
    check_ragged(ragged)
    names = field_names(VLLM_LOG_FIELDS, fields)
    per_layer, meta = {}, {}
    for path in paths:
        layer, rows, file_meta = _read_vllm_layer(path, names, num_experts)
        if layer in per_layer:
            raise ValueError(f"{path}: layer {layer} is logged twice (also in {per_layer[layer][0]})")
        per_layer[layer] = (path, [r for r in rows if r[0] >= skip_calls])
        meta = {**file_meta, **meta}
    layers = sorted(per_layer)
    reference = _aligned_rows(per_layer, layers, ragged)
    if not reference:
        raise ValueError(f"skip_calls = {skip_calls} drops every call")
    first_path, first_rows = per_layer[layers[0]]
    top_k = len(first_rows[0][4])
    for path, rows in per_layer.values():
        other = next((r for r in rows if len(r[4]) != top_k), None)
        if other is not None:
            raise ValueError(f"{path}:{other[6]}: {len(other[4])} experts per token where "
                             f"{first_path}:{first_rows[0][6]} has {top_k}")
    experts = np.full((len(reference), len(layers), top_k), MISSING, dtype=np.int64)
    weights = np.full(experts.shape, np.nan, dtype=np.float32)
    for j, layer in enumerate(layers):
        rows = per_layer[layer][1]
        experts[:len(rows), j] = [r[4] for r in rows]
        weights[:len(rows), j] = [r[5] if r[5] is not None else [np.nan] * top_k for r in rows]
    calls = np.array([r[0] for r in reference]) - skip_calls
    requests = pd.Series([r[3] for r in reference])
    informative = request_ids == "use" or (request_ids == "auto" and requests.nunique() > 1)
    if informative:
        sequence, position, phase = _phases_by_request(calls, requests)
    else:
        sequence, position, phase = _phases_by_call_size(calls, max_decode_rows)
        _warn_uninformative(paths[0], requests.iloc[0], phase, calls, max_decode_rows)
    has_weights = not np.isnan(weights).all()
    if has_weights and np.isnan(weights[experts != MISSING]).any():
        warnings.warn(f"{paths[0].parent}: some route records have no weights; their weights are NaN", stacklevel=2)
    return RoutingTrace(
        experts, infer_num_experts(num_experts, int(experts.max()), paths[0]),
        sequence=sequence, position=position, call=calls, phase=phase,
        weights=weights if has_weights else None, layers=np.array(layers),
        meta={"source": "vllm_moe_log", "files": [p.name for p in paths], "skip_calls": skip_calls,
              "request_ids": requests.unique().tolist() if informative else "uninformative",
              **{k: v for k, v in meta.items() if k != "type"}})


def _read_vllm_layer(path: Path, names: dict, num_experts: int | None):
    """(layer, rows, meta) of one file; a row is (call, row, layer, request, ids, weights, line)."""
    rows, call, previous, file_meta, kinds = [], -1, None, None, {}
    for number, record in read_jsonl(path):
        where = f"{path}:{number}"
        kind = record.get("type", "route")
        if kind == "meta":
            file_meta = record
            continue
        if kind != "route":
            raise ValueError(f"{where}: expected type 'meta' or 'route', got {kind!r}")
        row = whole_number(get_field(record, names["row"], "row", where), where, "row")
        layer = whole_number(get_field(record, names["layer"], "layer", where), where, "layer")
        request = request_key(get_field(record, names["request"], "request", where), where, kinds)
        ids = expert_ids(get_field(record, names["experts"], "experts", where), where, "experts", num_experts)
        weights = router_weights(get_field(record, names["weights"], "weights", where, required=False),
                               len(ids), where, "weights")
        if previous is None or row <= previous:
            call += 1
        previous = row
        if rows and layer != rows[0][2]:
            raise ValueError(f"{where}: layer {layer} in a file of layer {rows[0][2]} (one file per layer)")
        rows.append((call, row, layer, str(request), ids, weights, number))
    if file_meta is None:
        raise ValueError(f"{path}: no meta line")
    if not rows:
        raise ValueError(f"{path}: no route lines")
    return rows[0][2], rows, file_meta


def _aligned_rows(per_layer: dict, layers: list, ragged: str) -> list:
    """The rows of the longest layer file, after checking every file logs the same (call, row, request)
    sequence; files cut short at the end are trimmed (drop), padded (keep) or refused (error)."""
    longest = max(layers, key=lambda layer: len(per_layer[layer][1]))
    reference = per_layer[longest][1]
    shortest = min(len(per_layer[layer][1]) for layer in layers)
    for layer in layers:
        path, rows = per_layer[layer]
        for mine, theirs in zip(rows, reference):
            if mine[:2] != theirs[:2] or mine[3] != theirs[3]:
                raise ValueError(f"{path}:{mine[6]}: call {mine[0]} row {mine[1]} request {mine[3]!r} where "
                                 f"{per_layer[longest][0]}:{theirs[6]} has call {theirs[0]} row {theirs[1]} "
                                 f"request {theirs[3]!r}: the layer files do not log the same calls")
    if shortest < len(reference):
        cut = [f"{per_layer[layer][0].name} ({_count_of(len(reference) - len(per_layer[layer][1]), 'row')} short)"
               for layer in layers if len(per_layer[layer][1]) < len(reference)]
        message = (f"layer files end early: {', '.join(cut)}; not every layer logs the last "
                   f"{_count_of(len(reference) - shortest, 'row')}")
        if ragged == "error":
            raise ValueError(message)
        warnings.warn(message + ("; dropped" if ragged == "drop" else "; kept, marked missing where absent"),
                      stacklevel=3)
        if ragged == "drop":
            for layer in layers:
                path, rows = per_layer[layer]
                per_layer[layer] = (path, rows[:shortest])
            reference = reference[:shortest]
    return reference


def _phases_by_request(calls: np.ndarray, requests: pd.Series):
    sequence = pd.factorize(requests)[0]
    position = requests.groupby(sequence).cumcount().to_numpy()
    rows_in_call = requests.groupby([calls, sequence]).transform("size").to_numpy()
    first_call = pd.Series(calls).groupby(sequence).transform("min").to_numpy() == calls
    phase = np.where(first_call, "prefill", np.where(rows_in_call == 1, "decode", "unknown"))
    return sequence, position, phase


def _phases_by_call_size(calls: np.ndarray, max_decode_rows: int):
    """Sequences and phases when request ids say nothing (see :func:`from_vllm_moe_log`)."""
    call_ids, starts, sizes = np.unique(calls, return_index=True, return_counts=True)
    sequence = np.empty(calls.size, np.int64)
    position = np.empty(calls.size, np.int64)
    phase = np.empty(calls.size, dtype="<U7")
    next_sequence, holder, next_position = 0, None, 0
    for index, (start, size) in enumerate(zip(starts, sizes)):
        rows = slice(start, start + size)
        if size == 1 and index > 0 and holder is not None:
            sequence[rows], position[rows], phase[rows] = holder, next_position, "decode"
            next_position += 1
        elif size <= max_decode_rows and index > 0:
            sequence[rows] = np.arange(next_sequence, next_sequence + size)
            position[rows], phase[rows] = 0, "decode"
            next_sequence += size
            holder = next_sequence - 1 if size == 1 else None
            next_position = 1
        else:
            sequence[rows], position[rows], phase[rows] = next_sequence, np.arange(size), "unknown"
            holder, next_position = next_sequence, size
            next_sequence += 1
    return sequence, position, phase


def _warn_uninformative(path: Path, request, phase: np.ndarray, calls: np.ndarray, max_decode_rows: int) -> None:
    decode_calls = np.unique(calls[phase == "decode"]).size
    unknown_calls = np.unique(calls[phase == "unknown"]).size
    warnings.warn(
        f"{path}: every record has req_id {request!r}, so requests cannot be told apart: "
        f"{_count_of(decode_calls, 'call')} of at most {_count_of(max_decode_rows, 'row')} read as decode steps, "
        f"{_count_of(unknown_calls, 'call')} marked 'unknown' (a prefill, or a decode step of more requests; "
        "pass max_decode_rows = the number of requests the engine ran at once to read those as decode steps)",
        stacklevel=3)


# --- vLLM's returned routed experts --------------------------------------------------------------

def save_vllm_routed_experts(request_outputs, path, model_id: str = "", num_experts: int | None = None) -> Path:
    """Save the routed experts vLLM returned with its outputs, to ``.npz`` or ``.json``.

    With ``LLM(model, enable_return_routed_experts=True)`` (an engine option added by vLLM pull
    request 28284, late 2025), every
    ``RequestOutput.outputs[i].routed_experts`` is a numpy array [tokens, layers, K] of the experts
    each forwarded token of the request went to (the prompt, then the generated tokens; the last
    generated token is never forwarded). This writes them with the prompt length of each request so
    that :func:`from_vllm_routed_experts` can label prefill and decode. vLLM is not imported: any
    objects with ``request_id``, ``prompt_token_ids`` and ``outputs[i].routed_experts`` /
    ``.token_ids`` will do. Example::

        from vllm import LLM, SamplingParams
        llm = LLM("Qwen/Qwen1.5-MoE-A2.7B-Chat", enable_return_routed_experts=True)
        outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=256))
        save_vllm_routed_experts(outputs, "qwen_humaneval.npz", model_id="Qwen/Qwen1.5-MoE-A2.7B-Chat",
                                 num_experts=60)

    ``.npz`` holds ``routed_experts`` (all requests' rows, concatenated), ``rows``,
    ``prompt_tokens``, ``output_tokens`` and ``request_id`` (one per request and completion) and
    ``meta`` (JSON: ``format``, ``model_id``, ``num_experts``). ``.json`` holds
    ``{"format", "meta", "requests": [{"request_id", "prompt_tokens", "output_tokens",
    "routed_experts": [[[...]]]}]}``.

    Raises
    ------
    ValueError
        If an output carries no routed experts (the engine was started without the option), naming
        the request.
    """
    path = Path(path)
    if path.suffix not in (".npz", ".json"):
        raise ValueError(f"path must end in .npz or .json, got {path.name!r}")
    requests = []
    for output in request_outputs:
        for completion in output.outputs:
            routed = getattr(completion, "routed_experts", None)
            name = str(output.request_id) + (f"#{completion.index}" if len(output.outputs) > 1 else "")
            if routed is None:
                raise ValueError(f"request {name!r} has no routed_experts: start vLLM with "
                                 "enable_return_routed_experts=True")
            routed = np.asarray(routed)
            if routed.ndim != 3:
                raise ValueError(f"request {name!r}: routed_experts has shape {routed.shape}, expected "
                                 "[tokens, layers, K]")
            requests.append((name, len(output.prompt_token_ids or []), len(completion.token_ids), routed))
    if not requests:
        raise ValueError("request_outputs is empty")
    meta = {"format": VLLM_ROUTED_FORMAT, "model_id": model_id, "num_experts": num_experts}
    if path.suffix == ".json":
        document = {"format": VLLM_ROUTED_FORMAT, "meta": meta, "requests": [
            {"request_id": name, "prompt_tokens": prompt, "output_tokens": output, "routed_experts": routed.tolist()}
            for name, prompt, output, routed in requests]}
        with atomic_write(path, "w") as file:
            json.dump(document, file)
        return path
    with atomic_write(path) as file:
        np.savez_compressed(
            file, routed_experts=np.concatenate([r[3] for r in requests]).astype(np.int32),
            rows=np.array([len(r[3]) for r in requests]), prompt_tokens=np.array([r[1] for r in requests]),
            output_tokens=np.array([r[2] for r in requests]), request_id=np.array([r[0] for r in requests]),
            meta=np.array(json.dumps(meta)))
    return path


def _read_vllm_routed(path: Path):
    """(meta, [(request_id, prompt_tokens, output_tokens, array)]) from a saved file.

    Counts must be whole numbers >= 0 and expert ids whole numbers (``true``/``false`` are refused); in an
    ``.npz``, ``rows``, ``prompt_tokens``, ``output_tokens`` and ``request_id`` give one entry per request
    and ``rows`` adds up to the rows of ``routed_experts``. Errors name the file and the request (a
    ``.json``) or the array (an ``.npz``).
    """
    if not path.is_file():
        raise (IsADirectoryError if path.is_dir() else FileNotFoundError)(2, "not a file", str(path))
    if path.suffix == ".json":
        document = read_json("path", path)
        if not isinstance(document, dict) or document.get("format") != VLLM_ROUTED_FORMAT:
            raise ValueError(f"{path}: field 'format' must be {VLLM_ROUTED_FORMAT!r} (written by "
                             "save_vllm_routed_experts)")
        requests = []
        for index, request in enumerate(document.get("requests") or []):
            where = f"{path}: requests[{index}]"
            try:
                routed = np.array(request["routed_experts"])
                if routed.size and routed.dtype.kind not in "iu":
                    raise ValueError(f"{where}: routed_experts must hold whole-number expert ids, got "
                                     f"{routed.dtype} values")
                requests.append((str(request["request_id"]), whole_number(request["prompt_tokens"], where, "prompt_tokens"),
                                 whole_number(request["output_tokens"], where, "output_tokens"), routed))
            except KeyError as error:
                raise ValueError(f"{where}: no field {error}") from None
        return document.get("meta", {}), requests
    try:
        data = npz_arrays(path)  # each array's declared size checked before it is read
        missing = {"routed_experts", "rows", "prompt_tokens", "output_tokens", "request_id"} - set(data)
        if missing:
            raise ValueError(f"missing arrays {sorted(missing)}")
        rows, routed = data["rows"], data["routed_experts"]
        _check_routed_arrays(data)
        bounds = np.r_[0, np.cumsum(rows)]
        requests = [(str(name), int(prompt), int(output), routed[a:b]) for name, prompt, output, a, b in
                    zip(data["request_id"], data["prompt_tokens"], data["output_tokens"], bounds[:-1], bounds[1:])]
        meta = parse_json(str(data["meta"]), "its meta") if "meta" in data else {}
    except Exception as error:
        raise ValueError(f"{path}: not a file written by save_vllm_routed_experts: {error}") from error
    return meta, requests


def _check_routed_arrays(data) -> None:
    """Refuse the arrays of a saved ``.npz`` that do not describe one set of requests (:func:`_read_vllm_routed`)."""
    counts = {name: data[name] for name in ("rows", "prompt_tokens", "output_tokens")}
    requests = len(data["request_id"])
    if data["routed_experts"].dtype.kind not in "iu":
        raise ValueError(f"routed_experts must hold whole-number expert ids, got {data['routed_experts'].dtype}")
    for name, values in counts.items():
        if values.dtype.kind not in "iu" or (values < 0).any():
            raise ValueError(f"{name} must hold whole numbers >= 0, got {values.dtype} values "
                             f"{values.ravel()[:4].tolist()}")
        if values.shape != (requests,):
            raise ValueError(f"{name} has shape {values.shape}: one entry per request ({requests} request_id)")
    if int(counts["rows"].sum()) != len(data["routed_experts"]):
        raise ValueError(f"rows add up to {int(counts['rows'].sum())}, but routed_experts holds "
                         f"{len(data['routed_experts'])} rows")


@names_its_files
def from_vllm_routed_experts(path, num_experts: int | None = None, layers=None) -> RoutingTrace:
    """Read routed experts saved by :func:`save_vllm_routed_experts` (``.npz`` or ``.json``).

    Request ``r`` becomes sequence ``r``; its first ``prompt_tokens`` rows are ``prefill`` and the
    rest ``decode``; each row is its own call (vLLM does not say which requests shared a step).
    Layers in which no token holds distinct ids (a zero-filled slot some vLLM versions leave for
    dense layers) or every token is -1 are dropped with a warning.

    Parameters
    ----------
    path : path
        The saved file.
    num_experts : int, optional
        ``E``; taken from the file's metadata, else inferred as largest id + 1 with a warning.
    layers : array_like of int, optional
        The model's layer index of each layer axis entry vLLM returned (before any is dropped);
        default ``0..layers-1``.
    """
    path = Path(path)
    num_experts = given_num_experts(num_experts)
    meta, requests = _read_vllm_routed(path)
    if not requests:
        raise ValueError(f"{path}: no requests")
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: meta must be a JSON object, got {meta!r}")
    for name, prompt, output, routed in requests:
        if routed.ndim != 3 or len(routed) > prompt + output:
            raise ValueError(f"{path}: request {name!r}: routed_experts of shape {routed.shape} for {prompt} "
                             f"prompt and {output} output tokens (expected [at most {prompt + output}, layers, K])")
    arrays = [r[3] for r in requests]
    num_layers = arrays[0].shape[1]
    names = np.arange(num_layers) if layers is None else np.asarray(layers)
    if names.shape != (num_layers,):
        raise ValueError(f"layers must name the {num_layers} layers of the file, got {names.tolist()}")
    stacked = np.concatenate(arrays)
    ordered = np.sort(stacked, axis=-1)
    distinct = (ordered[..., 1:] != ordered[..., :-1]).all(axis=-1) if stacked.shape[2] > 1 else \
        np.ones(stacked.shape[:2], bool)
    empty = ~(distinct & (stacked[..., 0] >= 0)).any(axis=0)
    if empty.any():
        warnings.warn(f"{path}: layer axis entries {names[empty].tolist()} hold no routing (no token with "
                      "distinct expert ids: dense layers?); dropped", stacklevel=2)
        arrays, names = [a[:, ~empty] for a in arrays], names[~empty]
    if num_experts is None:
        try:
            num_experts = given_num_experts(meta.get("num_experts"))
        except ValueError as error:
            raise ValueError(f"{path}: meta's {error}") from None
    if num_experts is None:
        num_experts = infer_num_experts(None, int(max(a.max(initial=0) for a in arrays)), path)
    return from_arrays(arrays, num_experts, layers=names, prompt_tokens=[r[1] for r in requests],
                       meta={"source": "vllm_routed_experts", "file": path.name,
                             "model_id": meta.get("model_id", ""), "request_ids": [r[0] for r in requests]})
