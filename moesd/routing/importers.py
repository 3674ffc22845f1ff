"""Read per-token JSONL, layer CSV and per-request arrays into a :class:`moesd.routing.traces.RoutingTrace`.

Two file formats and one in-memory form, each described in its reader's docstring and tried on a
small excerpt under ``tests/data/traces/``:

* :func:`from_token_jsonl`: one JSON record per (sequence, token, layer), as per-token routing
  dumps write them;
* :func:`from_layer_csv`: ``layer_id,expert_ids`` lines;
* :func:`from_arrays`: per-request arrays [tokens, layers, K] from anywhere.

vLLM's logs and its returned routed experts are read by :mod:`moesd.routing.vllm_logs`.

Real logs are ragged: when generation stops, the last token or two is often logged in only some
layers. The readers drop such tokens (``ragged="drop"``), or keep them with the layers they have
(``ragged="keep"``: the other layers are marked :data:`moesd.routing.traces.MISSING`), or refuse the file
(``ragged="error"``), and warn naming how many tokens of which sequences
(:data:`moesd.routing.log_reading.RAGGED`). Field names differ between tools: a ``fields`` mapping picks
them, with defaults that cover the common spellings. Errors name the file, the line and the field.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from moesd._checks import as_array
from moesd.routing.log_reading import (check_ragged, expert_ids, field_names, get_field, given_num_experts,
                                       infer_num_experts, names_its_files, read_jsonl, request_key, router_weights,
                                       whole_number)
from moesd.routing.traces import MISSING, PHASES, RoutingTrace

TOKEN_FIELDS = {
    "sequence": ("problem_id", "req_id", "request_id", "sequence_id", "sequence"),
    "position": ("token_idx", "token_pos", "position", "token_index"),
    "layer": ("layer", "layer_id", "layer_idx"),
    "experts": ("experts", "topk_ids", "expert_ids", "topk_indices"),
    "weights": ("gating_probs", "topk_weights", "weights", "expert_weights"),
}
"""Default field names of :func:`from_token_jsonl`, tried in order; ``weights`` is optional."""


# --- per-token JSONL ---------------------------------------------------------------------------

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


@names_its_files
def from_token_jsonl(path, num_experts=None, fields: Mapping | None = None, ragged: str = "drop",
                     phase: str = "decode") -> RoutingTrace:
    """Read one JSON record per (sequence, token, layer).

    Records look like ``{"problem_id": "HumanEval/0", "token_idx": 3, "layer": 5, "experts": [1, 7],
    "gating_probs": [0.6, 0.4]}``; other spellings are found through ``fields`` (defaults
    :data:`TOKEN_FIELDS`: ``token_idx`` or ``token_pos``, ``experts`` or ``topk_ids``...). A
    sequence's tokens are ordered by position; positions must be whole numbers. Sequence ids may be
    strings or whole numbers, not both in one file (1 and "1" are refused, not merged). Expert ids are
    checked on their line: whole numbers (``[true, false]`` is refused), distinct, in ``[0, num_experts)``.
    A second record of one (sequence, position, layer) is refused naming both lines: a file of two runs
    appended must be split into one file per run (each read on its own, joined with
    :func:`moesd.routing.traces.concatenate` after giving them distinct sequence ids). The format has no
    forward-pass information, so every token is its own call and all tokens get ``phase``.

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
    num_experts = given_num_experts(num_experts)
    check_ragged(ragged)
    if phase not in PHASES or phase == "rejected":
        raise ValueError(f"phase must be one of {tuple(p for p in PHASES if p != 'rejected')}, got {phase!r}")
    names = field_names(TOKEN_FIELDS, fields)
    records, kinds = [], {}
    for number, record in read_jsonl(path):
        where = f"{path}:{number}"
        sequence = request_key(get_field(record, names["sequence"], "sequence", where), where, kinds)
        position = whole_number(get_field(record, names["position"], "position", where), where, "position")
        layer = whole_number(get_field(record, names["layer"], "layer", where), where, "layer")
        ids = expert_ids(get_field(record, names["experts"], "experts", where), where, "experts", num_experts)
        weights = router_weights(get_field(record, names["weights"], "weights", where, required=False),
                               len(ids), where, "weights")
        records.append((sequence, position, layer, ids, weights, number))
    if not records:
        raise ValueError(f"{path}: no records")
    frame = pd.DataFrame(records, columns=["sequence", "position", "layer", "ids", "weights", "line"])
    duplicated = frame.duplicated(["sequence", "position", "layer"])
    if duplicated.any():
        sequence, position, layer, *_, line = records[duplicated.idxmax()]
        first = next(r[-1] for r in records if r[:3] == (sequence, position, layer))
        raise ValueError(f"{path}:{line}: a second record for the same sequence, position and layer "
                         f"(sequence {sequence!r} position {position} layer {layer}, first on line {first}); "
                         "a log of two runs appended? split it into one file per run")
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
        experts, infer_num_experts(num_experts, largest, path),
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


# --- layer CSV ---------------------------------------------------------------------------------

@names_its_files
def from_layer_csv(path, num_experts=None, ragged: str = "drop") -> RoutingTrace:
    """Read lines ``layer_id,expert_ids`` (ids space-separated), one token of one layer per line.

    The n-th line of a layer is the n-th token. The first line is a header when it holds no digit
    (``layer_id,expert_ids``); otherwise it is the first token of a header-less file, checked as any other
    line (``0,1 2.5`` is refused, not skipped as a header). A byte-order mark is skipped. Expert ids are
    checked on their line: distinct, in ``[0, num_experts)``. Token order is all that is known, so the
    trace is one sequence with one call per token and phase ``unknown``. Layers that list fewer tokens
    than the others are ragged at the end: the extra tokens are dropped, kept (marked missing where
    absent) or refused, per ``ragged``.
    """
    path = Path(path)
    num_experts = given_num_experts(num_experts)
    check_ragged(ragged)
    by_layer: dict[int, list[list[int]]] = {}
    with open(path, encoding="utf-8-sig") as file:
        for number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            parts = line.strip().split(",")
            if number == 1 and not any(c.isdigit() for c in line):
                continue
            where = f"{path}:{number}"
            if len(parts) != 2:
                raise ValueError(f"{where}: expected two fields, layer_id,expert_ids: {line.strip()!r}")
            try:
                layer = int(parts[0])
            except ValueError:
                raise ValueError(f"{where}: layer_id must be a whole number, got {parts[0]!r}") from None
            whole_number(layer, where, "layer_id")  # below 2^53: an int64 index
            try:
                ids = [int(v) for v in parts[1].split()]
            except ValueError:
                raise ValueError(f"{where}: expert_ids must be whole numbers, got {parts[1]!r}") from None
            by_layer.setdefault(layer, []).append(expert_ids(ids, where, "expert_ids", num_experts))
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
    return RoutingTrace(experts, infer_num_experts(num_experts, int(experts.max()), path),
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
        Prompt tokens of each request, whole numbers >= 0 (NaN and booleans are refused): its first
        ``prompt_tokens[r]`` rows are ``prefill``, the rest ``decode``. Without it every token is ``unknown``.
    sequence_ids : sequence of int, optional
        The ``sequence`` of each request, distinct whole numbers (default ``0..requests-1``).
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
    if sequence_ids.shape != (len(checked),) or np.unique(sequence_ids).size != len(checked) or \
            not (np.issubdtype(sequence_ids.dtype, np.integer) or sequence_ids.size == 0):
        raise ValueError(f"sequence_ids must give {len(checked)} distinct whole numbers, "
                         f"got {sequence_ids.tolist()}")
    position = np.concatenate([np.arange(n) for n in lengths])
    if prompt_tokens is None:
        phase = np.full(position.size, "unknown")
    else:
        prompt = as_array("prompt_tokens", prompt_tokens, low=0, whole=True)
        if prompt.shape != (len(checked),):
            raise ValueError(f"prompt_tokens must give one count per request ({len(checked)}), got {prompt.tolist()}")
        phase = np.where(position < np.repeat(prompt, lengths), "prefill", "decode")
    experts = np.concatenate(checked)
    stacked = None if weights is None else np.concatenate([np.asarray(w, dtype=np.float32) for w in weights])
    return RoutingTrace(experts, infer_num_experts(num_experts, int(experts.max(initial=0)), "arrays"),
                        sequence=np.repeat(sequence_ids, lengths), position=position, phase=phase,
                        weights=stacked, layers=layers, meta={"source": "arrays", **(meta or {})})


def imported_with_warnings(reader, *args, **kwargs) -> tuple[RoutingTrace, list[str]]:
    """Run an importer (``reader(*args, **kwargs)``) and return its trace with the messages of every warning it
    gave, in order, instead of showing them (for a page that prints what an importer says about a file)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trace = reader(*args, **kwargs)
    return trace, [str(warning.message) for warning in caught]
