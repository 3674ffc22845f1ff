"""Read other tools' routing logs into a :class:`moesd.routing.traces.RoutingTrace`.

Four file formats and one in-memory form, each described in its reader's docstring and tried on a
small excerpt under ``tests/data/traces/``:

* :func:`from_token_jsonl`: one JSON record per (sequence, token, layer), as per-token routing
  dumps write them;
* :func:`from_vllm_moe_log`: JSONL files, one per layer, of an instrumented vLLM whose records carry
  the row inside a forward call (``token_idx``) and often a constant request id;
* :func:`from_layer_csv`: ``layer_id,expert_ids`` lines;
* :func:`from_vllm_routed_experts`: what vLLM returns itself with ``enable_return_routed_experts``
  (``CompletionOutput.routed_experts``, an array [tokens, layers, K] per request), saved to
  ``.npz`` or ``.json`` by :func:`save_vllm_routed_experts`;
* :func:`from_arrays`: per-request arrays [tokens, layers, K] from anywhere.

Real logs are ragged: when generation stops, the last token or two is often logged in only some
layers. The readers drop such tokens (``ragged="drop"``), or keep them with the layers they have
(``ragged="keep"``: the other layers are marked :data:`moesd.routing.traces.MISSING`), or refuse the file
(``ragged="error"``), and warn naming how many tokens of which sequences. Field names differ
between tools: a ``fields`` mapping picks them, with defaults that cover the common spellings.
Errors name the file, the line and the field.
"""

from __future__ import annotations

import functools
import inspect
import json
import numbers
import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from moesd._files import atomic_write
from moesd.routing.traces import MISSING, PHASES, RoutingTrace

TOKEN_FIELDS = {
    "sequence": ("problem_id", "req_id", "request_id", "sequence_id", "sequence"),
    "position": ("token_idx", "token_pos", "position", "token_index"),
    "layer": ("layer", "layer_id", "layer_idx"),
    "experts": ("experts", "topk_ids", "expert_ids", "topk_indices"),
    "weights": ("gating_probs", "topk_weights", "weights", "expert_weights"),
}
"""Default field names of :func:`from_token_jsonl`, tried in order; ``weights`` is optional."""

VLLM_LOG_FIELDS = {
    "request": ("req_id", "request_id"),
    "row": ("token_idx", "token_pos", "row"),
    "layer": ("layer", "layer_id"),
    "experts": ("topk_ids", "experts", "expert_ids"),
    "weights": ("topk_weights", "gating_probs", "weights"),
}
"""Default field names of :func:`from_vllm_moe_log`; ``weights`` is optional."""

RAGGED = ("drop", "keep", "error")
VLLM_ROUTED_FORMAT = "moesd-vllm-routed-experts/1"


# --- shared helpers ----------------------------------------------------------------------------

def _field_names(defaults: dict, fields: Mapping | None) -> dict[str, tuple[str, ...]]:
    """Defaults overridden by ``fields`` (a name or a sequence of names per key)."""
    names = dict(defaults)
    for key, value in (fields or {}).items():
        if key not in defaults:
            raise ValueError(f"fields has an unknown key {key!r}; known keys are {sorted(defaults)}")
        names[key] = (value,) if isinstance(value, str) else tuple(value)
    return names


def _get(record: dict, names: tuple[str, ...], key: str, where: str, required: bool = True):
    for name in names:
        if name in record:
            return record[name]
    if required:
        raise ValueError(f"{where}: no {key} field (looked for {', '.join(names)})")
    return None


def _whole(value, where: str, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value != int(value):
        raise ValueError(f"{where}: {name} must be a whole number, got {value!r}")
    return int(value)


def _id_list(value, where: str, name: str) -> list[int]:
    if not isinstance(value, list) or not value:
        raise ValueError(f"{where}: {name} must be a non-empty list of expert ids, got {value!r}")
    return [_whole(v, where, name) for v in value]


def _weight_list(value, count: int, where: str, name: str) -> list[float] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != count or \
            not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in value):
        raise ValueError(f"{where}: {name} must list one number per expert id, got {value!r}")
    return [float(v) for v in value]


def _read_jsonl(path: Path) -> Iterable[tuple[int, dict]]:
    with open(path, encoding="utf-8") as file:
        for number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not JSON: {error.msg}") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{number}: expected a JSON object")
            yield number, record


def _count_of(number: int, noun: str) -> str:
    return f"{number} {noun}" + ("" if number == 1 else "s")


def _check_ragged(ragged: str) -> None:
    if ragged not in RAGGED:
        raise ValueError(f"ragged must be one of {RAGGED}, got {ragged!r}")


def _infer_num_experts(num_experts, largest_id: int, source) -> int:
    if num_experts is not None:
        return num_experts
    warnings.warn(f"{source}: num_experts not given; inferring E = {largest_id + 1} from the largest "
                  "expert id (pass num_experts when some experts may never be chosen)", stacklevel=3)
    return largest_id + 1


def _describe(tokens: pd.DataFrame, limit: int = 4) -> str:
    """'sequence 'a' positions 8-9; sequence 'b' position 4' for a frame of (sequence, position)."""
    parts = []
    for sequence, group in tokens.groupby("sequence", sort=False):
        positions = sorted(group["position"].tolist())
        span = (f"position {positions[0]}" if len(positions) == 1 else
                f"positions {positions[0]}-{positions[-1]}" if positions[-1] - positions[0] == len(positions) - 1
                else "positions " + ",".join(map(str, positions)))
        parts.append(f"sequence {sequence!r} {span}")
    more = f"; and {len(parts) - limit} more sequences" if len(parts) > limit else ""
    return "; ".join(parts[:limit]) + more


def _sequence_key(value, where: str, first_of_kind: dict) -> object:
    """A request id as given, refusing a file that mixes numbers and strings (1 and "1" would merge)."""
    if isinstance(value, bool) or not isinstance(value, (str, numbers.Integral)):
        raise ValueError(f"{where}: a sequence id must be a string or a whole number, got {value!r}")
    kind, other = ("string", "number") if isinstance(value, str) else ("number", "string")
    first_of_kind.setdefault(kind, where)
    if other in first_of_kind:
        raise ValueError(f"{where}: sequence id {value!r} is a {kind} but {first_of_kind[other]} has a {other}; "
                         "ids of mixed types are ambiguous (1 and \"1\"): write them all one way")
    return value


# --- per-token JSONL ---------------------------------------------------------------------------

def _names_its_files(read):
    """Make an importer name its file(s) in every error (missing, a folder, binary bytes, a bad trace), and issue
    its warnings at the caller's line whatever the depth they came from (also when it then fails)."""
    signature = inspect.signature(read)
    first = next(iter(signature.parameters))

    @functools.wraps(read)
    def reader(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        paths = bound.arguments[first]
        single = isinstance(paths, (str, os.PathLike))
        files = [Path(paths)] if single else [Path(p) for p in paths]
        if not single:
            bound.arguments[first] = files
        name = files[0] if len(files) == 1 else (files[0].parent if files else None)
        caught = []
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                return read(*bound.args, **bound.kwargs)
        except (FileNotFoundError, IsADirectoryError) as error:
            problem = "no such file" if isinstance(error, FileNotFoundError) else "a folder, not a routing file"
            raise type(error)(f"{error.filename or name}: {problem}") from None
        except UnicodeDecodeError:
            raise ValueError(f"{name}: not UTF-8 text (a binary file?)") from None
        except ValueError as error:
            if name is None or any(str(path) in str(error) for path in files):
                raise
            raise ValueError(f"{name}: {error}") from None
        finally:
            for warning in caught:
                warnings.warn(warning.message, warning.category, stacklevel=2)
    return reader


@_names_its_files
def from_token_jsonl(path, num_experts=None, fields: Mapping | None = None, ragged: str = "drop",
                     phase: str = "decode") -> RoutingTrace:
    """Read one JSON record per (sequence, token, layer).

    Records look like ``{"problem_id": "HumanEval/0", "token_idx": 3, "layer": 5, "experts": [1, 7],
    "gating_probs": [0.6, 0.4]}``; other spellings are found through ``fields`` (defaults
    :data:`TOKEN_FIELDS`: ``token_idx`` or ``token_pos``, ``experts`` or ``topk_ids``...). A
    sequence's tokens are ordered by position; positions must be whole numbers. Sequence ids may be
    strings or whole numbers, not both in one file. The format has no forward-pass information, so
    every token is its own call and all tokens get ``phase``.

    Parameters
    ----------
    path : path
        The JSONL file.
    num_experts : int, optional
        ``E``; inferred as largest id + 1, with a warning, when missing.
    fields : mapping, optional
        Field name (or names to try) per key ``sequence``, ``position``, ``layer``, ``experts``,
        ``weights``, overriding the defaults.
    ragged : {"drop", "keep", "error"}
        What to do with tokens logged in only some layers (see the module docstring); a warning
        names them.
    phase : str, default "decode"
        Phase of every token (one of ``moesd.routing.traces.PHASES``).

    Returns
    -------
    RoutingTrace
        ``meta["sequence_ids"]`` holds the ids as the file wrote them, in order of first appearance.
        Weights are kept when any record has them, NaN where one has not (with a warning).
    """
    path = Path(path)
    _check_ragged(ragged)
    if phase not in PHASES or phase == "rejected":
        raise ValueError(f"phase must be one of {tuple(p for p in PHASES if p != 'rejected')}, got {phase!r}")
    names = _field_names(TOKEN_FIELDS, fields)
    records, kinds = [], {}
    for number, record in _read_jsonl(path):
        where = f"{path}:{number}"
        sequence = _sequence_key(_get(record, names["sequence"], "sequence", where), where, kinds)
        position = _whole(_get(record, names["position"], "position", where), where, "position")
        layer = _whole(_get(record, names["layer"], "layer", where), where, "layer")
        ids = _id_list(_get(record, names["experts"], "experts", where), where, "experts")
        weights = _weight_list(_get(record, names["weights"], "weights", where, required=False),
                               len(ids), where, "weights")
        records.append((sequence, position, layer, ids, weights, number))
    if not records:
        raise ValueError(f"{path}: no records")
    frame = pd.DataFrame(records, columns=["sequence", "position", "layer", "ids", "weights", "line"])
    duplicated = frame.duplicated(["sequence", "position", "layer"])
    if duplicated.any():
        line = frame.loc[duplicated.idxmax(), "line"]
        raise ValueError(f"{path}:{line}: a second record for the same sequence, position and layer")
    widths = frame["ids"].map(len)
    if widths.nunique() != 1:
        line = frame.loc[widths != widths.iloc[0], "line"].iloc[0]
        raise ValueError(f"{path}:{line}: experts lists {widths[frame['line'] == line].iloc[0]} ids, "
                         f"the first record {widths.iloc[0]}")
    frame["order"], sequence_ids = pd.factorize(frame["sequence"])
    layers = np.sort(frame["layer"].unique())
    tokens = _tokens_with_layers(frame, layers.size, path, ragged)
    frame = frame.merge(tokens[["order", "position", "token"]], on=["order", "position"])
    top_k = widths.iloc[0]
    experts = np.full((len(tokens), layers.size, top_k), MISSING, dtype=np.int64)
    layer_index = np.searchsorted(layers, frame["layer"].to_numpy())
    experts[frame["token"].to_numpy(), layer_index] = np.array(frame["ids"].tolist())
    weights = _weights(frame, experts.shape, layer_index, path)
    largest = int(experts.max())
    return RoutingTrace(
        experts, _infer_num_experts(num_experts, largest, path),
        sequence=tokens["order"].to_numpy(), position=tokens["position"].to_numpy(),
        phase=np.full(len(tokens), phase), weights=weights, layers=layers,
        meta={"source": "token_jsonl", "file": path.name,
              "sequence_ids": list(sequence_ids.tolist())})


def _tokens_with_layers(frame: pd.DataFrame, num_layers: int, path: Path, ragged: str) -> pd.DataFrame:
    """One row per kept (sequence, position) token, numbered ``token`` in (sequence, position) order."""
    tokens = frame.groupby(["order", "position"], sort=True).agg(
        sequence=("sequence", "first"), layers=("layer", "size")).reset_index()
    ragged_tokens = tokens["layers"] < num_layers
    if ragged_tokens.any():
        described = _describe(tokens[ragged_tokens])
        count = int(ragged_tokens.sum())
        if ragged == "error":
            raise ValueError(f"{path}: {count} tokens are logged in only some of the {num_layers} layers: "
                             f"{described}")
        action = ("dropped" if ragged == "drop" else
                  "kept with the layers they have (the others marked missing)")
        warnings.warn(f"{path}: {count} tokens logged in only some of the {num_layers} layers {action}: "
                      f"{described}", stacklevel=3)
        if ragged == "drop":
            tokens = tokens[~ragged_tokens]
    return tokens.reset_index(drop=True).assign(token=lambda t: np.arange(len(t)))


def _weights(frame: pd.DataFrame, shape, layer_index: np.ndarray, path: Path) -> np.ndarray | None:
    """Router weights, NaN where a record gave none; None when none did."""
    given = frame["weights"].notna()
    if not given.any():
        return None
    if not given.all():
        warnings.warn(f"{path}: {int((~given).sum())} of {len(frame)} records (first on line "
                      f"{frame.loc[~given, 'line'].min()}) have no weights; their weights are NaN", stacklevel=3)
    weights = np.full(shape, np.nan, dtype=np.float32)
    rows = frame[given]
    weights[rows["token"].to_numpy(), layer_index[given.to_numpy()]] = np.array(rows["weights"].tolist())
    return weights


# --- vLLM per-layer logs -----------------------------------------------------------------------

@_names_its_files
def from_vllm_moe_log(paths, num_experts=None, skip_calls: int = 0, fields: Mapping | None = None,
                      request_ids: str = "auto", max_decode_rows: int = 1, ragged: str = "drop") -> RoutingTrace:
    """Read the JSONL routing logs of an instrumented vLLM, one file per logged layer.

    Each file opens with ``{"type": "meta", "model_id", "layers_logged", "top_k", ...}``; every other
    line is ``{"type": "route", "req_id", "token_idx", "layer", "topk_ids", "topk_weights"}``, where
    ``token_idx`` is the row inside one forward call and restarts at 0 at each call (the format of
    a FusedMoE logger hooked after ``select_experts``). Field names can be changed with ``fields``
    (defaults :data:`VLLM_LOG_FIELDS`).

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
    if request_ids not in ("auto", "use", "ignore"):
        raise ValueError(f"request_ids must be 'auto', 'use' or 'ignore', got {request_ids!r}")
    for name, value, low in (("max_decode_rows", max_decode_rows, 1), ("skip_calls", skip_calls, 0)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
            raise ValueError(f"{name} must be a whole number >= {low}, got {value!r}")
    _check_ragged(ragged)
    names = _field_names(VLLM_LOG_FIELDS, fields)
    per_layer, meta = {}, {}
    for path in paths:
        layer, rows, file_meta = _read_vllm_layer(path, names)
        if layer in per_layer:
            raise ValueError(f"{path}: layer {layer} is logged twice (also in {per_layer[layer][0]})")
        per_layer[layer] = (path, [r for r in rows if r[0] >= skip_calls])
        meta = {**file_meta, **meta}
    layers = sorted(per_layer)
    reference = _aligned_rows(per_layer, layers, ragged)
    if not reference:
        raise ValueError(f"skip_calls = {skip_calls} drops every call")
    top_k = {len(r[4]) for layer in layers for r in per_layer[layer][1]}
    if len(top_k) != 1:
        raise ValueError(f"rows disagree on the number of experts per token: {sorted(top_k)}")
    top_k = top_k.pop()
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
        experts, _infer_num_experts(num_experts, int(experts.max()), paths[0]),
        sequence=sequence, position=position, call=calls, phase=phase,
        weights=weights if has_weights else None, layers=np.array(layers),
        meta={"source": "vllm_moe_log", "files": [p.name for p in paths], "skip_calls": skip_calls,
              "request_ids": requests.unique().tolist() if informative else "uninformative",
              **{k: v for k, v in meta.items() if k != "type"}})


def _read_vllm_layer(path: Path, names: dict):
    """(layer, rows, meta) of one file; a row is (call, row, layer, request, ids, weights, line)."""
    rows, call, previous, file_meta = [], -1, None, None
    for number, record in _read_jsonl(path):
        where = f"{path}:{number}"
        kind = record.get("type", "route")
        if kind == "meta":
            file_meta = record
            continue
        if kind != "route":
            raise ValueError(f"{where}: expected type 'meta' or 'route', got {kind!r}")
        row = _whole(_get(record, names["row"], "row", where), where, "row")
        layer = _whole(_get(record, names["layer"], "layer", where), where, "layer")
        request = _get(record, names["request"], "request", where)
        ids = _id_list(_get(record, names["experts"], "experts", where), where, "experts")
        weights = _weight_list(_get(record, names["weights"], "weights", where, required=False),
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


# --- layer CSV ---------------------------------------------------------------------------------

@_names_its_files
def from_layer_csv(path, num_experts=None, ragged: str = "drop") -> RoutingTrace:
    """Read lines ``layer_id,expert_ids`` (ids space-separated), one token of one layer per line.

    The n-th line of a layer is the n-th token. A first line that is not numeric is taken as a
    header. Token order is all that is known, so the trace is one sequence with one call per token
    and phase ``unknown``. Layers that list fewer tokens than the others are ragged at the end:
    the extra tokens are dropped, kept (marked missing where absent) or refused, per ``ragged``.
    """
    path = Path(path)
    _check_ragged(ragged)
    by_layer: dict[int, list[list[int]]] = {}
    with open(path, encoding="utf-8") as file:
        for number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            parts = line.strip().split(",")
            if number == 1 and not parts[0].strip().lstrip("-").isdigit():
                continue
            where = f"{path}:{number}"
            if len(parts) != 2:
                raise ValueError(f"{where}: expected two fields, layer_id,expert_ids: {line.strip()!r}")
            try:
                layer = int(parts[0])
            except ValueError:
                raise ValueError(f"{where}: layer_id must be a whole number, got {parts[0]!r}") from None
            try:
                ids = [int(v) for v in parts[1].split()]
            except ValueError:
                raise ValueError(f"{where}: expert_ids must be whole numbers, got {parts[1]!r}") from None
            if not ids:
                raise ValueError(f"{where}: expert_ids is empty")
            by_layer.setdefault(layer, []).append(ids)
    if not by_layer:
        raise ValueError(f"{path}: no routing lines")
    layers = sorted(by_layer)
    widths = {len(ids) for layer in layers for ids in by_layer[layer]}
    if len(widths) != 1:
        raise ValueError(f"{path}: lines list different numbers of experts: {sorted(widths)}")
    counts = {layer: len(by_layer[layer]) for layer in layers}
    tokens = max(counts.values())
    if min(counts.values()) < tokens:
        message = f"{path}: layers list different numbers of tokens: {counts}"
        if ragged == "error":
            raise ValueError(message)
        warnings.warn(message + ("; the tokens not in every layer are dropped" if ragged == "drop"
                                 else "; kept, marked missing where absent"), stacklevel=2)
        tokens = min(counts.values()) if ragged == "drop" else tokens
    experts = np.full((tokens, len(layers), widths.pop()), MISSING, dtype=np.int64)
    for j, layer in enumerate(layers):
        rows = by_layer[layer][:tokens]
        experts[:len(rows), j] = rows
    return RoutingTrace(experts, _infer_num_experts(num_experts, int(experts.max()), path),
                        phase=np.full(tokens, "unknown"), layers=np.array(layers),
                        meta={"source": "layer_csv", "file": path.name})


# --- per-request arrays -------------------------------------------------------------------------

def from_arrays(arrays: Sequence, num_experts=None, layers=None, prompt_tokens=None, sequence_ids=None,
                weights: Sequence | None = None, meta: dict | None = None) -> RoutingTrace:
    """Build a trace from one array of expert ids per request, shape [tokens, layers, K].

    Token ``i`` of request ``r`` gets sequence ``r`` (or ``sequence_ids[r]``) and position ``i``.
    Nothing says which tokens shared a forward pass, so every token is its own call.

    Parameters
    ----------
    arrays : sequence of array_like of int
        One [tokens, layers, K] array per request, as vLLM's ``CompletionOutput.routed_experts``
        or SGLang's returned routed experts hold them; rows of ``K`` times -1 mark a missing layer.
    num_experts : int, optional
        ``E``; inferred as largest id + 1, with a warning, when missing.
    layers : array_like of int, optional
        The model's layer index of each layer of the arrays (default ``0..layers-1``).
    prompt_tokens : sequence of int, optional
        Prompt tokens of each request: its first ``prompt_tokens[r]`` rows are ``prefill``, the rest
        ``decode``. Without it every token is ``unknown``.
    sequence_ids : sequence of int, optional
        The ``sequence`` of each request (default ``0..requests-1``).
    weights : sequence of array_like of float, optional
        Router weights, one array of the shape of each ``arrays[r]``.
    meta : dict, optional
        Stored in the trace.
    """
    if len(arrays) == 0:
        raise ValueError("arrays must hold at least one request")
    checked = []
    for index, array in enumerate(arrays):
        array = np.asarray(array)
        if array.ndim != 3 or not np.issubdtype(array.dtype, np.integer):
            raise ValueError(f"arrays[{index}] must be an integer array [tokens, layers, K], "
                             f"got {array.dtype} of shape {array.shape}")
        if checked and array.shape[1:] != checked[0].shape[1:]:
            raise ValueError(f"arrays[{index}] has layers x K = {array.shape[1:]}, arrays[0] {checked[0].shape[1:]}")
        checked.append(array)
    lengths = np.array([len(a) for a in checked])
    if sequence_ids is None:
        sequence_ids = np.arange(len(checked))
    sequence_ids = np.asarray(sequence_ids)
    if sequence_ids.shape != (len(checked),) or np.unique(sequence_ids).size != len(checked):
        raise ValueError(f"sequence_ids must give {len(checked)} distinct ids, got {sequence_ids.tolist()}")
    position = np.concatenate([np.arange(n) for n in lengths])
    if prompt_tokens is None:
        phase = np.full(position.size, "unknown")
    else:
        prompt = np.asarray(prompt_tokens)
        if prompt.shape != (len(checked),) or (prompt < 0).any():
            raise ValueError(f"prompt_tokens must give one count >= 0 per request, got {prompt.tolist()}")
        phase = np.where(position < np.repeat(prompt, lengths), "prefill", "decode")
    experts = np.concatenate(checked)
    stacked = None if weights is None else np.concatenate([np.asarray(w, dtype=np.float32) for w in weights])
    return RoutingTrace(experts, _infer_num_experts(num_experts, int(experts.max(initial=0)), "arrays"),
                        sequence=np.repeat(sequence_ids, lengths), position=position, phase=phase,
                        weights=stacked, layers=layers, meta={"source": "arrays", **(meta or {})})


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
    """(meta, [(request_id, prompt_tokens, output_tokens, array)]) from a saved file."""
    if not path.is_file():
        raise (IsADirectoryError if path.is_dir() else FileNotFoundError)(2, "not a file", str(path))
    if path.suffix == ".json":
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: not JSON: {error.msg} (line {error.lineno})") from None
        if not isinstance(document, dict) or document.get("format") != VLLM_ROUTED_FORMAT:
            raise ValueError(f"{path}: field 'format' must be {VLLM_ROUTED_FORMAT!r} (written by "
                             "save_vllm_routed_experts)")
        requests = []
        for index, request in enumerate(document.get("requests") or []):
            where = f"{path}: requests[{index}]"
            try:
                routed = np.array(request["routed_experts"])
                requests.append((str(request["request_id"]), _whole(request["prompt_tokens"], where, "prompt_tokens"),
                                 _whole(request["output_tokens"], where, "output_tokens"), routed))
            except KeyError as error:
                raise ValueError(f"{where}: no field {error}") from None
        return document.get("meta", {}), requests
    try:
        with open(path, "rb") as file, np.load(file, allow_pickle=False) as data:
            missing = {"routed_experts", "rows", "prompt_tokens", "output_tokens", "request_id"} - set(data.files)
            if missing:
                raise ValueError(f"missing arrays {sorted(missing)}")
            rows, routed = data["rows"], data["routed_experts"]
            bounds = np.r_[0, np.cumsum(rows)]
            requests = [(str(name), int(prompt), int(output), routed[a:b]) for name, prompt, output, a, b in
                        zip(data["request_id"], data["prompt_tokens"], data["output_tokens"], bounds[:-1], bounds[1:])]
            meta = json.loads(str(data["meta"])) if "meta" in data.files else {}
    except Exception as error:
        raise ValueError(f"{path}: not a file written by save_vllm_routed_experts: {error}") from error
    return meta, requests


@_names_its_files
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
    meta, requests = _read_vllm_routed(path)
    if not requests:
        raise ValueError(f"{path}: no requests")
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
        num_experts = meta.get("num_experts")
    if num_experts is None:
        num_experts = _infer_num_experts(None, int(max(a.max(initial=0) for a in arrays)), path)
    return from_arrays(arrays, num_experts, layers=names, prompt_tokens=[r[1] for r in requests],
                       meta={"source": "vllm_routed_experts", "file": path.name,
                             "model_id": meta.get("model_id", ""), "request_ids": [r[0] for r in requests]})
