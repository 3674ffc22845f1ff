"""Expert-routing traces: one on-disk format, importers of other tools' logs, fast statistics.

A :class:`RoutingTrace` holds, for every routed token and every MoE layer, the ``K`` expert ids the
token was sent to, with per-token bookkeeping: which request (``sequence``), where in it
(``position``), which forward pass (``call``) and whether that pass was a prefill or a decode step
(``phase``). The statistics ask how many distinct experts a set of tokens activates, the quantity
``N(t)`` of Eq. 8, for the sets that matter to speculative decoding:

* :func:`batch_union`: the tokens of one forward pass (what a decode step of ``B`` sequences loads);
* :func:`window_union`: ``t`` consecutive tokens of one sequence (what verifying a draft loads);
* :func:`random_union`: ``t`` tokens drawn at random (the i.i.d. assumption of Eq. 8);
* :func:`verify_union`: ``B`` sequences x ``w`` consecutive tokens (one batched verification);
* :func:`popularity` and :func:`adjacent_overlap`: why real routing activates fewer experts.

Unions are computed on bitmasks (``ceil(E / 64)`` uint64 words per token and layer), so any ``E``
works and nothing loops over tokens in Python.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from moesd._files import atomic_write
from moesd.experts import expected_active_experts, expected_active_experts_from_popularity

PHASES = ("prefill", "decode")


@dataclass
class RoutingTrace:
    """Expert ids each routed token used in each MoE layer.

    Parameters
    ----------
    experts : array_like of int, shape (tokens, layers, K)
        Expert ids in ``[0, num_experts)``, distinct within a token's top-K.
    num_experts : int
        Routed experts per layer, ``E``.
    sequence, position, call : array_like of int, shape (tokens,), optional
        Request id, index of the token in its request, and index of the forward pass. Missing ones
        default to one sequence, positions ``0..tokens-1`` and one call per token.
    phase : array_like of str, shape (tokens,), optional
        ``"prefill"`` or ``"decode"``; defaults to ``"decode"``.
    weights : array_like of float, shape (tokens, layers, K), optional
        Router weights of the chosen experts.
    layers : array_like of int, shape (layers,), optional
        The model's layer index of each MoE layer (they need not be contiguous: dense layers
        are not traced). Defaults to ``0..layers-1``.
    meta : dict, optional
        Model id, ``E``, ``K``, dataset, prompt ids, capture settings: anything JSON can hold.

    Raises
    ------
    ValueError
        If shapes disagree, an id is outside ``[0, E)``, or a token lists an expert twice.
    """

    experts: np.ndarray
    num_experts: int
    sequence: np.ndarray | None = None
    position: np.ndarray | None = None
    call: np.ndarray | None = None
    phase: np.ndarray | None = None
    weights: np.ndarray | None = None
    layers: np.ndarray | None = None
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.experts = np.asarray(self.experts)
        if self.experts.ndim != 3 or not np.issubdtype(self.experts.dtype, np.integer):
            raise ValueError("experts must be an integer array of shape (tokens, layers, K), "
                             f"got {self.experts.dtype} of shape {self.experts.shape}")
        tokens, num_layers, top_k = self.experts.shape
        self.num_experts = int(self.num_experts)
        if self.num_experts < 1:
            raise ValueError(f"num_experts must be >= 1, got {self.num_experts}")
        if top_k > self.num_experts:
            raise ValueError(f"K = {top_k} experts per token exceeds num_experts = {self.num_experts}")
        if tokens and (self.experts.min() < 0 or self.experts.max() >= self.num_experts):
            raise ValueError(f"expert ids must lie in [0, {self.num_experts}), found "
                             f"{self.experts.min()}..{self.experts.max()}")
        ordered = np.sort(self.experts, axis=-1)
        repeated = (ordered[..., 1:] == ordered[..., :-1]).any(axis=-1)
        if repeated.any():
            token, layer = np.argwhere(repeated)[0]
            raise ValueError(f"token {token} lists an expert twice in layer {layer}: "
                             f"{self.experts[token, layer].tolist()}")
        self.experts = self.experts.astype(np.int16 if self.num_experts <= 32767 else np.int32)
        defaults = {"sequence": np.zeros(tokens, np.int64), "position": np.arange(tokens),
                    "call": np.arange(tokens)}
        for name, default in defaults.items():
            value = default if getattr(self, name) is None else np.asarray(getattr(self, name))
            if value.shape != (tokens,) or not np.issubdtype(value.dtype, np.integer):
                raise ValueError(f"{name} must be an integer array of shape ({tokens},), "
                                 f"got {value.dtype} of shape {value.shape}")
            setattr(self, name, value.astype(np.int64))
        phase = np.full(tokens, "decode") if self.phase is None else np.asarray(self.phase, dtype=str)
        if phase.shape != (tokens,) or not np.isin(phase, PHASES).all():
            raise ValueError(f"phase must hold one of {PHASES} for each of the {tokens} tokens")
        self.phase = phase
        if self.weights is not None:
            self.weights = np.asarray(self.weights, dtype=np.float32)
            if self.weights.shape != self.experts.shape:
                raise ValueError(f"weights must have the shape of experts {self.experts.shape}, "
                                 f"got {self.weights.shape}")
        layers = np.arange(num_layers) if self.layers is None else np.asarray(self.layers)
        if layers.shape != (num_layers,) or not np.issubdtype(layers.dtype, np.integer):
            raise ValueError(f"layers must be {num_layers} integer layer indices, got {layers!r}")
        self.layers = layers.astype(np.int64)
        self.meta = dict(self.meta or {})

    @property
    def num_tokens(self) -> int:
        """Routed tokens in the trace."""
        return self.experts.shape[0]

    @property
    def top_k(self) -> int:
        """Experts per token, ``K``."""
        return self.experts.shape[2]

    def select(self, mask) -> "RoutingTrace":
        """A trace of the tokens where ``mask`` is true (e.g. ``trace.phase == "decode"``)."""
        mask = np.asarray(mask, dtype=bool)
        return RoutingTrace(
            self.experts[mask], self.num_experts, self.sequence[mask], self.position[mask],
            self.call[mask], self.phase[mask], None if self.weights is None else self.weights[mask],
            self.layers, self.meta)

    def save(self, path) -> Path:
        """Write the trace to one compressed ``.npz`` file, atomically.

        The file is written under a temporary name in the same folder and renamed into place,
        so an interrupted save leaves no partial file.
        """
        path = Path(path)
        arrays = {"experts": self.experts, "num_experts": np.int64(self.num_experts),
                  "sequence": self.sequence, "position": self.position, "call": self.call,
                  "phase": self.phase, "layers": self.layers,
                  "meta": np.array(json.dumps(self.meta, sort_keys=True))}
        if self.weights is not None:
            arrays["weights"] = self.weights
        with atomic_write(path) as file:
            np.savez_compressed(file, **arrays)
        return path

    @classmethod
    def load(cls, path) -> "RoutingTrace":
        """Read and validate a trace written by :meth:`save`.

        Raises
        ------
        ValueError
            Naming the file, if it is not a trace or fails validation.
        """
        path = Path(path)
        try:
            with np.load(path, allow_pickle=False) as data:
                missing = {"experts", "num_experts"} - set(data.files)
                if missing:
                    raise ValueError(f"missing arrays {sorted(missing)}")
                fields = {name: data[name] for name in data.files}
            fields["num_experts"] = int(fields["num_experts"])
            fields["meta"] = json.loads(str(fields.get("meta", "{}")))
            return cls(**fields)
        except FileNotFoundError:
            raise
        except Exception as error:  # a corrupt zip, bad JSON or failed validation
            raise ValueError(f"{path}: not a valid routing trace: {error}") from error


def concatenate(traces: list[RoutingTrace]) -> RoutingTrace:
    """Join traces of the same model, renumbering calls so they stay distinct.

    Sequence ids are kept as they are: give each part distinct ones. ``meta`` comes from the first.
    """
    if not traces:
        raise ValueError("traces must hold at least one trace")
    first = traces[0]
    for other in traces[1:]:
        if (other.num_experts, other.top_k) != (first.num_experts, first.top_k) or \
                not np.array_equal(other.layers, first.layers):
            raise ValueError("traces must share num_experts, K and layers to be joined")
    offsets = np.cumsum([0] + [int(t.call.max()) + 1 if t.num_tokens else 0 for t in traces[:-1]])
    weights = [t.weights for t in traces]
    return RoutingTrace(
        np.concatenate([t.experts for t in traces]), first.num_experts,
        np.concatenate([t.sequence for t in traces]), np.concatenate([t.position for t in traces]),
        np.concatenate([t.call + offset for t, offset in zip(traces, offsets)]),
        np.concatenate([t.phase for t in traces]),
        None if any(w is None for w in weights) else np.concatenate(weights), first.layers, first.meta)


# --- importers ---------------------------------------------------------------------------------

def _infer_num_experts(num_experts, largest_id: int, source) -> int:
    if num_experts is not None:
        return int(num_experts)
    warnings.warn(f"{source}: num_experts not given; inferring E = {largest_id + 1} from the largest "
                  "expert id (pass num_experts when some experts may never be chosen)", stacklevel=3)
    return largest_id + 1


def _read_jsonl(path: Path) -> Iterable[tuple[int, dict]]:
    with open(path) as file:
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


def _id_list(value, where: str) -> list[int]:
    if not isinstance(value, list) or not value or not all(isinstance(v, int) for v in value):
        raise ValueError(f"{where}: expert ids must be a non-empty list of integers, got {value!r}")
    return value


def from_vllm_moe_log(paths, num_experts=None, skip_calls=0) -> RoutingTrace:
    """Read the JSONL routing logs of an instrumented vLLM, one file per logged layer.

    Each file opens with ``{"type": "meta", "model_id", "layers_logged", "top_k", ...}``; every other
    line is ``{"type": "route", "req_id", "token_idx", "layer", "topk_ids", "topk_weights"}``, where
    ``token_idx`` is the row inside one forward call and restarts at 0 at each call. A request with
    several rows in one call is taken to be in prefill there, one row to be a decode step.

    Parameters
    ----------
    paths : path or list of paths
        The files, one per layer; they must log the same calls.
    num_experts : int, optional
        ``E``; inferred as largest id + 1, with a warning, when missing.
    skip_calls : int, default 0
        Forward calls to drop from the start (warm-up and profiling runs).
    """
    paths = [Path(paths)] if isinstance(paths, (str, os.PathLike)) else [Path(p) for p in paths]
    if not paths:
        raise ValueError("paths must name at least one log file")
    per_layer, meta = {}, {}
    for path in paths:
        rows, call, previous, file_meta = [], -1, None, None
        for number, record in _read_jsonl(path):
            where = f"{path}:{number}"
            if record.get("type") == "meta":
                file_meta = record
                continue
            if record.get("type") != "route":
                raise ValueError(f"{where}: expected type 'meta' or 'route', got {record.get('type')!r}")
            try:
                row, layer, request = int(record["token_idx"]), int(record["layer"]), record["req_id"]
            except (KeyError, TypeError, ValueError) as error:
                raise ValueError(f"{where}: route record needs token_idx, layer, req_id: {error}") from None
            if previous is None or row <= previous:
                call += 1
            previous = row
            ids = _id_list(record.get("topk_ids"), where)
            weights = record.get("topk_weights")
            if weights is not None and (not isinstance(weights, list) or len(weights) != len(ids)):
                raise ValueError(f"{where}: topk_weights must list one weight per id")
            rows.append((call, row, layer, str(request), ids, weights))
        if file_meta is None:
            raise ValueError(f"{path}: no meta line")
        if not rows:
            raise ValueError(f"{path}: no route lines")
        layers = {r[2] for r in rows}
        if len(layers) != 1:
            raise ValueError(f"{path}: one file per layer expected, found layers {sorted(layers)}")
        layer = layers.pop()
        if layer in per_layer:
            raise ValueError(f"{path}: layer {layer} is logged twice")
        per_layer[layer] = [r for r in rows if r[0] >= skip_calls]
        meta = {**file_meta, **meta}
    ordered_layers = sorted(per_layer)
    keys = [[(r[0], r[1]) for r in per_layer[layer]] for layer in ordered_layers]
    if any(k != keys[0] for k in keys):
        raise ValueError("the layer files do not log the same calls and rows")
    reference = per_layer[ordered_layers[0]]
    if not reference:
        raise ValueError(f"skip_calls = {skip_calls} drops every call")
    top_k = {len(r[4]) for layer in ordered_layers for r in per_layer[layer]}
    if len(top_k) != 1:
        raise ValueError(f"rows disagree on the number of experts per token: {sorted(top_k)}")
    experts = np.array([[r[4] for r in per_layer[layer]] for layer in ordered_layers]).transpose(1, 0, 2)
    has_weights = all(r[5] is not None for layer in ordered_layers for r in per_layer[layer])
    weights = (np.array([[r[5] for r in per_layer[layer]] for layer in ordered_layers]).transpose(1, 0, 2)
               if has_weights else None)
    calls = np.array([r[0] for r in reference]) - skip_calls
    requests = pd.Series([r[3] for r in reference])
    sequence = pd.factorize(requests)[0]
    rows_in_call = requests.groupby([calls, sequence]).transform("size").to_numpy()
    return RoutingTrace(
        experts, _infer_num_experts(num_experts, int(experts.max()), paths[0]),
        sequence=sequence, position=requests.groupby(sequence).cumcount().to_numpy(),
        call=calls, phase=np.where(rows_in_call > 1, "prefill", "decode"), weights=weights,
        layers=np.array(ordered_layers),
        meta={"source": "vllm_moe_log", "files": [p.name for p in paths], "skip_calls": skip_calls,
              "request_ids": requests.unique().tolist(),
              **{k: v for k, v in meta.items() if k != "type"}})


def from_token_jsonl(path, num_experts=None) -> RoutingTrace:
    """Read one JSON record per (sequence, layer, token).

    Records are ``{"problem_id", "layer", "experts", "gating_probs", "token_idx"}``; a sequence's
    tokens are its decode tokens in order of ``token_idx``. Every token must appear in every layer.
    """
    path = Path(path)
    records = []
    for number, record in _read_jsonl(path):
        where = f"{path}:{number}"
        try:
            key = (str(record["problem_id"]), int(record["token_idx"]), int(record["layer"]))
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"{where}: record needs problem_id, token_idx, layer: {error}") from None
        ids = _id_list(record.get("experts"), where)
        probs = record.get("gating_probs")
        if probs is not None and (not isinstance(probs, list) or len(probs) != len(ids)):
            raise ValueError(f"{where}: gating_probs must list one probability per expert")
        records.append((*key, ids, probs, number))
    if not records:
        raise ValueError(f"{path}: no records")
    frame = pd.DataFrame(records, columns=["problem", "token", "layer", "ids", "probs", "line"])
    duplicated = frame.duplicated(["problem", "token", "layer"])
    if duplicated.any():
        line = frame.loc[duplicated.idxmax(), "line"]
        raise ValueError(f"{path}:{line}: a second record for the same problem, token and layer")
    if frame["ids"].map(len).nunique() != 1:
        line = frame.loc[frame["ids"].map(len) != len(frame["ids"].iloc[0]), "line"].iloc[0]
        raise ValueError(f"{path}:{line}: a different number of experts than the first record")
    layers = np.sort(frame["layer"].unique())
    tokens = frame.groupby(["problem", "token"], sort=False).size()
    incomplete = tokens[tokens != layers.size]
    if len(incomplete):
        problem, token = incomplete.index[0]
        raise ValueError(f"{path}: token {token} of problem {problem} is missing in some layers")
    frame["sequence"] = pd.factorize(frame["problem"])[0]
    frame = frame.sort_values(["sequence", "token", "layer"])
    experts = np.array(frame["ids"].tolist()).reshape(len(tokens), layers.size, -1)
    weights = None
    if frame["probs"].notna().all():
        weights = np.array(frame["probs"].tolist()).reshape(experts.shape)
    first = frame.drop_duplicates(["sequence", "token"])
    return RoutingTrace(
        experts, _infer_num_experts(num_experts, int(experts.max()), path),
        sequence=first["sequence"].to_numpy(), position=first["token"].to_numpy(),
        call=np.arange(len(first)), weights=weights, layers=layers,
        meta={"source": "token_jsonl", "file": path.name,
              "problem_ids": pd.unique(frame["problem"]).tolist()})


def from_layer_csv(path, num_experts=None) -> RoutingTrace:
    """Read lines ``layer_id,expert_ids`` (ids space-separated), one token of one layer per line.

    The n-th line of a layer is the n-th token; every layer must list the same number of tokens.
    A first line that is not numeric is taken as a header. Token order is all that is known, so the
    trace is one sequence with one call per token.
    """
    path = Path(path)
    by_layer: dict[int, list[list[int]]] = {}
    with open(path) as file:
        for number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            parts = line.strip().split(",")
            if number == 1 and not parts[0].strip().lstrip("-").isdigit():
                continue
            try:
                if len(parts) != 2:
                    raise ValueError("expected two fields, layer_id,expert_ids")
                layer, ids = int(parts[0]), [int(v) for v in parts[1].split()]
                if not ids:
                    raise ValueError("no expert ids")
            except ValueError as error:
                raise ValueError(f"{path}:{number}: {error}: {line.strip()!r}") from None
            by_layer.setdefault(layer, []).append(ids)
    if not by_layer:
        raise ValueError(f"{path}: no routing lines")
    layers = sorted(by_layer)
    counts = {layer: len(by_layer[layer]) for layer in layers}
    if len(set(counts.values())) != 1:
        raise ValueError(f"{path}: layers list different numbers of tokens: {counts}")
    widths = {len(ids) for layer in layers for ids in by_layer[layer]}
    if len(widths) != 1:
        raise ValueError(f"{path}: lines list different numbers of experts: {sorted(widths)}")
    experts = np.array([by_layer[layer] for layer in layers]).transpose(1, 0, 2)
    return RoutingTrace(experts, _infer_num_experts(num_experts, int(experts.max()), path),
                        layers=np.array(layers), meta={"source": "layer_csv", "file": path.name})


# --- statistics ------------------------------------------------------------------------------

def expert_masks(trace: RoutingTrace, chunk: int = 8192) -> np.ndarray:
    """Bitmask of each token's experts, shape (tokens, layers, ceil(E / 64)), dtype uint64.

    Bit ``e % 64`` of word ``e // 64`` is set when the token chose expert ``e``. Built from a
    one-hot of ``chunk`` tokens at a time, packed eight experts to a byte and read as
    little-endian 64-bit words.
    """
    words = -(-trace.num_experts // 64)
    masks = np.empty((trace.num_tokens, trace.experts.shape[1], words), dtype=np.uint64)
    for start in range(0, trace.num_tokens, chunk):
        ids = trace.experts[start:start + chunk].astype(np.intp)
        one_hot = np.zeros(ids.shape[:2] + (64 * words,), dtype=bool)
        np.put_along_axis(one_hot, ids, True, axis=-1)
        masks[start:start + chunk] = np.packbits(one_hot, axis=-1, bitorder="little").view("<u8")
    return masks


def _in_sequence_order(trace: RoutingTrace) -> tuple[np.ndarray, np.ndarray]:
    """Token order by (sequence, position), and the bitmasks in that order."""
    order = np.lexsort((trace.position, trace.sequence))
    masks = expert_masks(trace)
    if (order[1:] > order[:-1]).all():  # already ordered: no copy
        return order, masks
    return order, masks[order]


def _count(masks: np.ndarray) -> np.ndarray:
    return np.bitwise_count(masks).sum(axis=-1, dtype=np.int64)


def _long_frame(counts: np.ndarray, trace: RoutingTrace, **columns) -> pd.DataFrame:
    """Frame with one row per (row of counts, layer); ``columns`` label the rows of ``counts``."""
    rows, num_layers = counts.shape
    frame = {name: np.repeat(np.asarray(values), num_layers) for name, values in columns.items()}
    return pd.DataFrame({"layer": np.tile(trace.layers, rows), **frame, "union": counts.ravel()})


def batch_union(trace: RoutingTrace) -> pd.DataFrame:
    """Distinct experts activated by each forward call, per layer.

    Returns
    -------
    pandas.DataFrame
        Columns ``layer``, ``call``, ``tokens`` (routed tokens in the call), ``union``.
    """
    order = np.argsort(trace.call, kind="stable")
    calls = trace.call[order]
    starts = np.flatnonzero(np.r_[True, calls[1:] != calls[:-1]])
    unions = np.bitwise_or.reduceat(expert_masks(trace)[order], starts, axis=0)
    sizes = np.diff(np.r_[starts, calls.size])
    return _long_frame(_count(unions), trace, call=calls[starts], tokens=sizes)


def _window_masks(trace: RoutingTrace, window: int):
    """Bitmask unions of every run of ``window`` consecutive tokens of one sequence.

    Returns the unions, shape (windows, layers, words), and the first token of each window (in
    the order sorted by sequence and position).
    """
    if int(window) != window or window < 1:
        raise ValueError(f"window must be a whole number >= 1, got {window!r}")
    window = int(window)
    order, masks = _in_sequence_order(trace)
    sequence = trace.sequence[order]
    if window > masks.shape[0]:
        return masks[:0], order[:0]
    # Doubling table: after k steps, span[i] is the union of tokens i .. i + 2**k - 1.
    span, width = masks, 1
    while 2 * width <= window:
        span = span[:-width] | span[width:]
        width *= 2
    count = masks.shape[0] - window + 1
    unions = span[:count] | span[window - width:window - width + count]
    within = sequence[:count] == sequence[window - 1:]
    return (unions, order[:count]) if within.all() else (unions[within], order[:count][within])


def window_union(trace: RoutingTrace, t: int) -> pd.DataFrame:
    """Distinct experts activated by each sliding window of ``t`` consecutive tokens of a sequence.

    Returns
    -------
    pandas.DataFrame
        Columns ``layer``, ``sequence``, ``start`` (position of the window's first token), ``union``.
    """
    unions, first = _window_masks(trace, t)
    return _long_frame(_count(unions), trace, sequence=trace.sequence[first],
                       start=trace.position[first])


def random_union(trace: RoutingTrace, t: int, samples: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Distinct experts activated by ``t`` tokens drawn at random from the whole trace.

    Each sample draws ``t`` distinct tokens; this is the i.i.d. setting of Eq. 8, with the trace's
    own expert popularity.

    Returns
    -------
    pandas.DataFrame
        Columns ``layer``, ``sample``, ``union``.
    """
    if int(t) != t or not 1 <= t <= trace.num_tokens:
        raise ValueError(f"t must be a whole number in [1, {trace.num_tokens}], got {t!r}")
    rng = np.random.default_rng(seed)
    picks = np.stack([rng.choice(trace.num_tokens, int(t), replace=False) for _ in range(samples)])
    unions = np.bitwise_or.reduce(expert_masks(trace)[picks], axis=1)
    return _long_frame(_count(unions), trace, sample=np.arange(samples))


def verify_union(trace: RoutingTrace, batch_size: int, window: int, samples: int = 1000,
                 seed: int = 0) -> pd.DataFrame:
    """Distinct experts one batched verification loads: ``batch_size`` sequences x ``window`` tokens.

    Each sample picks ``batch_size`` distinct sequences and, in each, a random run of ``window``
    consecutive tokens, and takes the union over all ``batch_size * window`` tokens.

    Returns
    -------
    pandas.DataFrame
        Columns ``layer``, ``sample``, ``union``.
    """
    unions, first = _window_masks(trace, window)
    sequence = trace.sequence[first]
    owners, offsets = np.unique(sequence, return_index=True)
    if int(batch_size) != batch_size or not 1 <= batch_size <= owners.size:
        raise ValueError(f"batch_size must be a whole number in [1, {owners.size}] (sequences with "
                         f"at least {window} tokens), got {batch_size!r}")
    counts = np.diff(np.r_[offsets, sequence.size])
    rng = np.random.default_rng(seed)
    chosen = np.argsort(rng.random((samples, owners.size)), axis=1)[:, :int(batch_size)]
    picks = offsets[chosen] + (rng.random(chosen.shape) * counts[chosen]).astype(np.int64)
    batch = np.bitwise_or.reduce(unions[picks], axis=1)
    return _long_frame(_count(batch), trace, sample=np.arange(samples))


def popularity(trace: RoutingTrace) -> pd.DataFrame:
    """How often each expert is chosen, per layer.

    Returns
    -------
    pandas.DataFrame
        Columns ``layer``, ``expert``, ``count``, ``probability`` (the chance that one token picks
        the expert; it sums to ``K`` over a layer's experts, the ``p`` of
        :func:`moesd.experts.expected_active_experts_from_popularity`).
    """
    counts = _expert_counts(trace)
    return pd.DataFrame({
        "layer": np.repeat(trace.layers, trace.num_experts),
        "expert": np.tile(np.arange(trace.num_experts), len(trace.layers)),
        "count": counts.ravel(),
        "probability": (counts / max(trace.num_tokens, 1)).ravel(),
    })


def effective_experts(trace: RoutingTrace) -> pd.DataFrame:
    """The number of equally used experts with the same spread as each layer's routing.

    ``exp(H)`` with ``H`` the entropy (nats) of the layer's expert shares ``p_e / K``: ``E`` when
    routing is balanced, ``K`` when the same ``K`` experts take every token.

    Returns
    -------
    pandas.DataFrame
        Columns ``layer``, ``effective_experts``.
    """
    shares = _expert_counts(trace) / max(trace.num_tokens * trace.top_k, 1)
    logs = np.log(np.where(shares > 0, shares, 1.0))
    return pd.DataFrame({"layer": trace.layers, "effective_experts": np.exp(-(shares * logs).sum(axis=1))})


def _expert_counts(trace: RoutingTrace) -> np.ndarray:
    """Times each expert was chosen, shape (layers, E)."""
    flat = trace.experts.transpose(1, 0, 2).reshape(len(trace.layers), -1).astype(np.int64)
    return np.stack([np.bincount(row, minlength=trace.num_experts) for row in flat])


def adjacent_overlap(trace: RoutingTrace) -> pd.DataFrame:
    """Fraction of its experts a token shares with the previous token of its sequence, per layer.

    Returns
    -------
    pandas.DataFrame
        Columns ``layer``, ``overlap`` (mean of ``|S_i & S_{i-1}| / K`` over consecutive pairs),
        ``independent`` (its expectation for independent tokens with the trace's popularity,
        ``sum_e p_e**2 / K``; ``K / E`` for uniform routing) and ``pairs``.
    """
    order, masks = _in_sequence_order(trace)
    sequence = trace.sequence[order]
    same = sequence[1:] == sequence[:-1]
    shared = _count(masks[1:][same] & masks[:-1][same])
    probability = _expert_counts(trace) / max(trace.num_tokens, 1)
    return pd.DataFrame({
        "layer": trace.layers,
        "overlap": shared.mean(axis=0) / trace.top_k if same.any() else np.nan,
        "independent": (probability**2).sum(axis=1) / trace.top_k,
        "pairs": int(same.sum()),
    })


def verify_union_predictions(trace: RoutingTrace, batch_size: int, window: int, samples: int = 1000,
                             seed: int = 0) -> pd.DataFrame:
    """Measured verification load of ``batch_size`` sequences x ``window`` tokens, and three predictions.

    * ``uniform``: Eq. 8 at ``t = batch_size * window`` tokens, the paper's i.i.d. uniform model;
    * ``popularity``: the same tokens independent but with each expert's measured popularity
      (:func:`moesd.experts.expected_active_experts_from_popularity`);
    * ``windows``: windows of different sequences independent, each activating expert ``e`` with the
      measured probability ``q_e`` that one window of ``window`` consecutive tokens does, so
      ``sum_e 1 - (1 - q_e)**batch_size``. It keeps the correlation of consecutive tokens.

    Returns
    -------
    pandas.DataFrame
        One row per layer: ``layer``, ``measured`` (mean of :func:`verify_union`), ``uniform``,
        ``popularity``, ``windows``.
    """
    tokens = batch_size * window
    measured = verify_union(trace, batch_size, window, samples, seed).groupby("layer", sort=False)["union"].mean()
    probability = _expert_counts(trace) / max(trace.num_tokens, 1)
    unions, _ = _window_masks(trace, window)
    bits = np.unpackbits(unions.view(np.uint8), axis=-1, bitorder="little")[..., :trace.num_experts]
    hit = bits.mean(axis=0)  # layers x E: chance one window activates each expert
    return pd.DataFrame({
        "layer": trace.layers,
        "measured": measured.to_numpy(),
        "uniform": expected_active_experts(tokens, trace.num_experts, trace.top_k),
        "popularity": expected_active_experts_from_popularity(tokens, probability),
        "windows": (1.0 - (1.0 - hit) ** batch_size).sum(axis=-1),
    })
