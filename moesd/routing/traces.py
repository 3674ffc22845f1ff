"""Expert-routing traces: one on-disk format and fast statistics of activated experts.

A :class:`RoutingTrace` holds, for every routed token and every MoE layer, the ``K`` expert ids the
token was sent to, with per-token bookkeeping: which request (``sequence``), where in it
(``position``), which forward pass (``call``) and whether that pass was a prefill or a decode step
(``phase``, ``"unknown"`` where the source cannot say, ``"rejected"`` for a speculative-decoding draft
token that was verified but is not part of its sequence). The statistics ask how many distinct experts
a set of tokens activates, the quantity ``N(t)`` of Eq. 8, for the sets that matter to speculative
decoding:

* :func:`batch_union`: the tokens of one forward pass (what a decode step of ``B`` sequences loads);
* :func:`window_union`: ``t`` consecutive tokens of one sequence (what verifying a draft loads);
* :func:`random_union`: ``t`` tokens drawn at random (the i.i.d. assumption of Eq. 8);
* :func:`verify_union`: ``B`` sequences x ``w`` consecutive tokens (one batched verification);
* :func:`popularity`, :func:`window_activation_probability` and :func:`adjacent_overlap`: why real
  routing activates fewer experts.

Tokens are *consecutive* when they belong to the same sequence and their positions differ by one:
a gap in the positions (a token the log lost) ends a window. Unions are computed on bitmasks
(``ceil(E / 64)`` 64-bit words per token and layer) built once per trace and kept with it, so any
``E`` works and nothing loops over tokens in Python. Readers of other tools' logs live in
:mod:`moesd.routing.importers`; turning the statistics into verification cost is :mod:`moesd.routing.loads`.
"""

from __future__ import annotations

import json
import numbers
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from moesd._files import atomic_write
from moesd.theory.experts import expected_active_experts, expected_active_experts_from_popularity

PHASES = ("prefill", "decode", "unknown", "rejected")
"""Allowed ``phase`` values; ``"unknown"`` marks tokens whose forward pass the source did not name, and
``"rejected"`` draft tokens that a speculative-decoding verification pass routed but that are not part of
their sequence (rejected, or cut at the sequence's end). Statistics over sequences (windows of consecutive
tokens) refuse a trace holding them: :func:`without_rejected` drops them. Statistics over tokens
(:func:`popularity`, :func:`random_union`, :func:`batch_union`) count them as the routed work they were."""

MISSING = -1
"""Expert id that marks a (token, layer) the source did not log (all ``K`` ids of the row)."""

_INDEX_FIELDS = ("sequence", "position", "call")
_CACHED_FROM = {"experts", "num_experts", "sequence", "position", "call", "layers"}


def _whole_number(name: str, value) -> int:
    """``value`` as an int if it is a whole number (not a bool), else a ValueError naming ``name``."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or value != int(value):
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    return int(value)


@dataclass(eq=False)
class RoutingTrace:
    """Expert ids each routed token used in each MoE layer.

    The arrays are validated, converted and made read-only on construction; statistics cache the
    bitmasks they build on the trace, so assign a new array rather than edit one in place.

    Parameters
    ----------
    experts : array_like of int, shape (tokens, layers, K)
        Expert ids in ``[0, num_experts)``, distinct within a token's top-K. A row of ``K`` times
        :data:`MISSING` (-1) marks a layer the source did not log for that token.
    num_experts : int
        Routed experts per layer, ``E`` (a whole number; 4.7 is refused, not truncated).
    sequence, position, call : array_like of int, shape (tokens,), optional
        Request id, index of the token in its request, and index of the forward pass. Missing ones
        default to one sequence, positions ``0..tokens-1`` and one call per token.
    phase : array_like of str, shape (tokens,), optional
        ``"prefill"``, ``"decode"``, ``"unknown"`` or ``"rejected"``; defaults to ``"decode"``.
    weights : array_like of float, shape (tokens, layers, K), optional
        Router weights of the chosen experts (NaN where the source gave none).
    layers : array_like of int, shape (layers,), optional
        The model's layer index of each MoE layer (they need not be contiguous: dense layers
        are not traced). Defaults to ``0..layers-1``.
    meta : dict, optional
        Model id, ``E``, ``K``, dataset, prompt ids, capture settings: anything JSON can hold.

    Raises
    ------
    ValueError
        If shapes disagree, an id is outside ``[0, E)``, a token lists an expert twice, or a
        number that must be whole is not.
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
    _cache: dict = field(default_factory=dict, init=False, repr=False)

    def __setattr__(self, name, value) -> None:
        object.__setattr__(self, name, value)
        if name in _CACHED_FROM:
            object.__setattr__(self, "_cache", {})

    def __post_init__(self) -> None:
        experts = np.asarray(self.experts)
        if experts.ndim != 3 or not np.issubdtype(experts.dtype, np.integer):
            raise ValueError("experts must be an integer array of shape (tokens, layers, K), "
                             f"got {experts.dtype} of shape {experts.shape}")
        tokens, num_layers, top_k = experts.shape
        num_experts = _whole_number("num_experts", self.num_experts)
        if num_experts < 1:
            raise ValueError(f"num_experts must be >= 1, got {num_experts}")
        if top_k > num_experts:
            raise ValueError(f"K = {top_k} experts per token exceeds num_experts = {num_experts}")
        missing = experts == MISSING
        logged = ~missing.any(axis=-1)
        if (missing.any(axis=-1) & ~missing.all(axis=-1)).any():
            token, layer = np.argwhere(missing.any(axis=-1) & ~missing.all(axis=-1))[0]
            raise ValueError(f"token {token} marks only some of its experts missing in layer {layer}: "
                             f"{experts[token, layer].tolist()} (a missing layer is K times {MISSING})")
        if experts.size and ((experts < MISSING) | (experts >= num_experts)).any():
            bad = experts[(experts < MISSING) | (experts >= num_experts)]
            raise ValueError(f"expert ids must lie in [0, {num_experts}), found {bad.min()}..{bad.max()}")
        ordered = np.sort(experts, axis=-1)
        repeated = (ordered[..., 1:] == ordered[..., :-1]).any(axis=-1) & logged
        if repeated.any():
            token, layer = np.argwhere(repeated)[0]
            raise ValueError(f"token {token} lists an expert twice in layer {layer}: "
                             f"{experts[token, layer].tolist()}")
        self.num_experts = num_experts
        self.experts = _frozen(experts.astype(np.int16 if num_experts <= 32767 else np.int32))
        defaults = {"sequence": np.zeros(tokens, np.int64), "position": np.arange(tokens),
                    "call": np.arange(tokens)}
        for name, default in defaults.items():
            value = default if getattr(self, name) is None else np.asarray(getattr(self, name))
            if value.shape != (tokens,) or not (np.issubdtype(value.dtype, np.integer) or value.size == 0):
                raise ValueError(f"{name} must be an integer array of shape ({tokens},), "
                                 f"got {value.dtype} of shape {value.shape}")
            setattr(self, name, _frozen(value.astype(np.int64)))
        phase = np.full(tokens, "decode") if self.phase is None else np.asarray(self.phase, dtype=str)
        if phase.shape != (tokens,) or not np.isin(phase, PHASES).all():
            raise ValueError(f"phase must hold one of {PHASES} for each of the {tokens} tokens")
        self.phase = _frozen(phase.astype("<U8"))
        if self.weights is not None:
            weights = np.asarray(self.weights, dtype=np.float32)
            if weights.shape != experts.shape:
                raise ValueError(f"weights must have the shape of experts {experts.shape}, got {weights.shape}")
            self.weights = _frozen(weights)
        layers = np.arange(num_layers) if self.layers is None else np.asarray(self.layers)
        if layers.shape != (num_layers,) or not (np.issubdtype(layers.dtype, np.integer) or layers.size == 0):
            raise ValueError(f"layers must be {num_layers} integer layer indices, got {layers!r}")
        if np.unique(layers).size != num_layers:
            raise ValueError(f"layers must be distinct, got {layers.tolist()}")
        self.layers = _frozen(layers.astype(np.int64))
        self.meta = dict(self.meta or {})

    @property
    def num_tokens(self) -> int:
        """Routed tokens in the trace."""
        return self.experts.shape[0]

    @property
    def top_k(self) -> int:
        """Experts per token, ``K``."""
        return self.experts.shape[2]

    @property
    def num_missing(self) -> int:
        """(token, layer) pairs the source did not log (see :data:`MISSING`)."""
        missing = _missing(self)
        return 0 if missing is None else int(missing.sum())

    def __repr__(self) -> str:
        phases = ", ".join(f"{name} {count}" for name, count in zip(*np.unique(self.phase, return_counts=True)))
        layers = self.layers.tolist()
        shown = (f"{layers[0]}..{layers[-1]}" if layers == list(range(layers[0], layers[-1] + 1))
                 else ",".join(map(str, layers))) if layers else "none"
        missing = f", missing {self.num_missing} (token, layer)" if self.num_missing else ""
        return (f"RoutingTrace(model={self.meta.get('model_id', '?')!r}, E={self.num_experts}, K={self.top_k}, "
                f"tokens={self.num_tokens}, layers={len(layers)} [{shown}], "
                f"sequences={np.unique(self.sequence).size}, phases=({phases or 'none'}), "
                f"weights={'yes' if self.weights is not None else 'no'}{missing})")

    def summary(self) -> pd.DataFrame:
        """One row describing the trace: model, source, E, K, tokens by phase, layers, sequences, calls."""
        counts = {name: int((self.phase == name).sum()) for name in PHASES}
        return pd.DataFrame([{
            "model": self.meta.get("model_id", "?"), "source": self.meta.get("source", "?"),
            "E": self.num_experts, "K": self.top_k, "tokens": self.num_tokens, **counts,
            "layers": len(self.layers), "sequences": np.unique(self.sequence).size,
            "calls": np.unique(self.call).size, "weights": self.weights is not None,
            "missing": self.num_missing}])

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
            Naming the file, if it is not a trace (a text log, a corrupt archive) or fails validation.
        """
        path = Path(path)
        with open(path, "rb") as file:
            if file.read(4) != b"PK\x03\x04":
                raise ValueError(f"{path}: not a RoutingTrace .npz archive (it does not start like a zip file); "
                                 "logs of other tools (JSONL, CSV, vLLM output) are read by moesd.routing.importers")
            file.seek(0)
            try:
                with np.load(file, allow_pickle=False) as data:
                    missing = {"experts", "num_experts"} - set(data.files)
                    if missing:
                        raise ValueError(f"missing arrays {sorted(missing)}")
                    fields = {name: data[name] for name in data.files}
                fields["num_experts"] = fields["num_experts"].item()
                fields["meta"] = json.loads(str(fields.get("meta", "{}")))
                return cls(**fields)
            except Exception as error:  # a corrupt zip, bad JSON or failed validation
                raise ValueError(f"{path}: not a valid routing trace: {error}") from error


def without_rejected(trace: RoutingTrace) -> RoutingTrace:
    """The trace without the rows of rejected draft tokens (phase ``"rejected"``): its sequences' own tokens."""
    rejected = trace.phase == "rejected"
    return trace.select(~rejected) if rejected.any() else trace


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


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


# --- cached building blocks -------------------------------------------------------------------

def _cached(trace: RoutingTrace, key, build):
    if key not in trace._cache:
        trace._cache[key] = build()
    return trace._cache[key]


def _missing(trace: RoutingTrace) -> np.ndarray | None:
    """Boolean (tokens, layers) of unlogged entries, or None when every entry was logged."""
    def build():
        missing = trace.experts[..., 0] == MISSING
        return missing if missing.any() else None
    return _cached(trace, "missing", build)


def expert_masks(trace: RoutingTrace, chunk: int = 16384) -> np.ndarray:
    """Bitmask of each token's experts, shape (tokens, layers, ceil(E / 64)), dtype little-endian uint64.

    Bit ``e % 64`` of word ``e // 64`` is set when the token chose expert ``e``; a missing entry
    has no bit set. Built once per trace, ``chunk`` tokens at a time, by or-ing the ``k``-th
    choice of every token into its word (one word, ``E <= 64``) or byte (several words), and
    cached on the trace.
    """
    def build():
        words = -(-trace.num_experts // 64)
        layers, top_k = trace.experts.shape[1:]
        has_missing = _missing(trace) is not None
        masks = np.zeros((trace.num_tokens, layers, words), dtype="<u8")
        for start in range(0, trace.num_tokens, chunk):
            part = trace.experts[start:start + chunk].astype(np.int32)
            rows = part.shape[0] * layers
            target = masks[start:start + chunk].reshape(rows) if words == 1 else \
                masks[start:start + chunk].view(np.uint8).reshape(-1)
            base = np.arange(rows, dtype=np.int32 if rows * 8 * words < 2**31 else np.int64) * (8 * words)
            for k in range(top_k):
                ids = part[..., k].reshape(rows)
                logged = ids >= 0 if has_missing else None
                if logged is not None:
                    ids = np.where(logged, ids, 0)
                if words == 1:
                    bits = np.left_shift(np.uint64(1), ids.astype(np.uint64))
                    target |= bits if logged is None else np.where(logged, bits, np.uint64(0))
                else:  # one entry per row, so no index repeats: take, or, put
                    bits = np.left_shift(np.uint8(1), (ids & 7).astype(np.uint8))
                    bits = bits if logged is None else np.where(logged, bits, np.uint8(0))
                    index = base + (ids >> 3)
                    np.put(target, index, np.take(target, index) | bits)
        return _frozen(masks)
    return _cached(trace, "masks", build)


def _sequence_order(trace: RoutingTrace):
    """Tokens sorted by (sequence, position): the order (None when already sorted), the masks in that
    order, and ``breaks``, with ``breaks[j] - breaks[i] == 0`` exactly when sorted tokens ``i..j``
    are consecutive (one sequence, positions one apart)."""
    if (trace.phase == "rejected").any():
        raise ValueError("the trace holds rejected draft tokens, which share positions with the tokens that "
                         "replaced them: take without_rejected(trace) for statistics over sequences")

    def build():
        order = np.lexsort((trace.position, trace.sequence))
        if (order[1:] > order[:-1]).all():
            order = None
        sequence = trace.sequence if order is None else trace.sequence[order]
        position = trace.position if order is None else trace.position[order]
        follows = (sequence[1:] == sequence[:-1]) & (position[1:] == position[:-1] + 1)
        breaks = np.concatenate([[0], np.cumsum(~follows)])
        masks = expert_masks(trace) if order is None else _frozen(expert_masks(trace)[order])
        return order, masks, breaks
    return _cached(trace, "sequence_order", build)


def _sorted(trace: RoutingTrace, values: np.ndarray) -> np.ndarray:
    order = _sequence_order(trace)[0]
    return values if order is None else values[order]


def _window_starts(trace: RoutingTrace, window: int) -> np.ndarray:
    """Sorted-order indices where a run of ``window`` consecutive tokens starts."""
    if int(window) != window or window < 1:
        raise ValueError(f"window must be a whole number >= 1, got {window!r}")
    window = int(window)
    breaks = _sequence_order(trace)[2]
    if window > trace.num_tokens:
        return np.zeros(0, np.int64)
    return np.flatnonzero(breaks[window - 1:] == breaks[:breaks.size - window + 1])


def _window_blocks(trace: RoutingTrace, window: int, block: int = 4096):
    """Yield (starts, unions) for every run of ``window`` consecutive tokens, ``block`` runs at a time.

    ``starts`` are sorted-order indices of the first token of each run; ``unions`` their bitmask
    unions, shape (runs, layers, words). Working block by block keeps the temporaries in cache.
    """
    starts = _window_starts(trace, window)
    masks = _sequence_order(trace)[1]
    window = int(window)
    for low in range(0, starts.size, block):
        chosen = starts[low:low + block]
        first = chosen[0]
        part = masks[first:chosen[-1] + window]
        # Doubling table: after k steps, span[i] is the union of tokens i .. i + 2**k - 1.
        span, width = part, 1
        while 2 * width <= window:
            span = span[:-width] | span[width:]
            width *= 2
        if chosen[-1] - first == chosen.size - 1:  # consecutive starts: slices, no gather
            yield chosen, span[:chosen.size] | span[window - width:window - width + chosen.size]
        else:
            offsets = chosen - first
            yield chosen, span[offsets] | span[offsets + window - width]


def _window_counts(trace: RoutingTrace, window: int):
    """Distinct experts of every run of ``window`` consecutive tokens, (runs, layers), and the runs' starts."""
    parts = [(starts, _count(unions)) for starts, unions in _window_blocks(trace, window)]
    if not parts:
        return np.zeros((0, len(trace.layers)), np.int64), np.zeros(0, np.int64)
    return np.concatenate([p[1] for p in parts]), np.concatenate([p[0] for p in parts])


def _window_logged(trace: RoutingTrace, starts: np.ndarray, window: int) -> np.ndarray | None:
    """(windows, layers): whether every token of the window was logged in the layer; None if all were."""
    missing = _missing(trace)
    if missing is None:
        return None
    cumulative = np.concatenate([np.zeros((1, missing.shape[1]), np.int64),
                                 np.cumsum(_sorted(trace, missing), axis=0)])
    return cumulative[starts + window] == cumulative[starts]


def _count(masks: np.ndarray) -> np.ndarray:
    """Set bits per (row, layer), summed over the words: the number of distinct experts."""
    counts = np.bitwise_count(masks)
    return counts[..., 0].astype(np.int64) if counts.shape[-1] == 1 else counts.sum(axis=-1, dtype=np.int64)


def _long_frame(counts: np.ndarray, trace: RoutingTrace, keep=None, **columns) -> pd.DataFrame:
    """Frame with one row per (row of counts, layer); ``columns`` label the rows of ``counts``;
    ``keep`` (rows, layers), when given, selects the (row, layer) pairs to report."""
    rows, num_layers = counts.shape
    frame = {name: np.repeat(np.asarray(values), num_layers) for name, values in columns.items()}
    frame = pd.DataFrame({"layer": np.tile(trace.layers, rows), **frame, "union": counts.ravel()})
    return frame if keep is None else frame[keep.ravel()].reset_index(drop=True)


def _complete_tokens(trace: RoutingTrace) -> np.ndarray:
    """Indices of the tokens logged in every layer."""
    missing = _missing(trace)
    return np.arange(trace.num_tokens) if missing is None else np.flatnonzero(~missing.any(axis=1))


# --- statistics -------------------------------------------------------------------------------

def batch_union(trace: RoutingTrace) -> pd.DataFrame:
    """Distinct experts activated by each forward call, per layer.

    Returns
    -------
    pandas.DataFrame
        Columns ``layer``, ``call``, ``tokens`` (tokens of the call logged in the layer), ``union``.
    """
    order = np.argsort(trace.call, kind="stable")
    calls = trace.call[order]
    starts = np.flatnonzero(np.r_[True, calls[1:] != calls[:-1]]) if calls.size else np.zeros(0, np.int64)
    unions = np.bitwise_or.reduceat(expert_masks(trace)[order], starts, axis=0)
    missing = _missing(trace)
    if missing is None:
        tokens = np.repeat(np.diff(np.r_[starts, calls.size]), len(trace.layers))
    else:
        tokens = np.add.reduceat((~missing[order]).astype(np.int64), starts, axis=0).ravel()
    frame = _long_frame(_count(unions), trace, call=calls[starts])
    frame.insert(2, "tokens", tokens)
    return frame


def window_union(trace: RoutingTrace, t: int) -> pd.DataFrame:
    """Distinct experts activated by each sliding window of ``t`` consecutive tokens of a sequence.

    Consecutive means one sequence and positions one apart; a window with a token missing in a
    layer is left out of that layer.

    Returns
    -------
    pandas.DataFrame
        Columns ``layer``, ``sequence``, ``start`` (position of the window's first token), ``union``.
    """
    counts, starts = _window_counts(trace, t)
    return _long_frame(counts, trace, _window_logged(trace, starts, int(t)),
                       sequence=_sorted(trace, trace.sequence)[starts],
                       start=_sorted(trace, trace.position)[starts])


def random_union(trace: RoutingTrace, t: int, samples: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Distinct experts activated by ``t`` tokens drawn at random from the whole trace.

    Each sample draws ``t`` distinct tokens (among those logged in every layer); this is the
    i.i.d. setting of Eq. 8, with the trace's own expert popularity.

    Returns
    -------
    pandas.DataFrame
        Columns ``layer``, ``sample``, ``union``.
    """
    pool = _complete_tokens(trace)
    if int(t) != t or not 1 <= t <= pool.size:
        raise ValueError(f"t must be a whole number in [1, {pool.size}], got {t!r}")
    rng = np.random.default_rng(seed)
    picks = pool[np.stack([rng.choice(pool.size, int(t), replace=False) for _ in range(samples)])]
    unions = np.bitwise_or.reduce(np.take(expert_masks(trace), picks, axis=0), axis=1)
    return _long_frame(_count(unions), trace, sample=np.arange(samples))


def verify_union(trace: RoutingTrace, batch_size: int, window: int, samples: int = 1000,
                 seed: int = 0) -> pd.DataFrame:
    """Distinct experts one batched verification loads: ``batch_size`` sequences x ``window`` tokens.

    Each sample picks ``batch_size`` distinct sequences and, in each, a random run of ``window``
    consecutive tokens (logged in every layer), and takes the union over all ``batch_size * window``
    tokens. Only the sampled windows are built.

    Returns
    -------
    pandas.DataFrame
        Columns ``layer``, ``sample``, ``union``.
    """
    picks = _verify_picks(trace, batch_size, window, samples, seed)
    masks = _sequence_order(trace)[1]
    tokens, layers, words = masks.shape
    flat = masks.reshape(tokens, layers * words)
    chunk = max(1, 2**18 // max(picks.shape[1] * layers * words, 1))
    counts = []
    for start in range(0, samples, chunk):
        chosen = picks[start:start + chunk]
        union = np.take(flat, chosen, axis=0)  # (samples, batch_size, layers * words); take beats indexing
        for step in range(1, int(window)):
            union |= np.take(flat, chosen + step, axis=0)
        counts.append(_count(np.bitwise_or.reduce(union, axis=1).reshape(len(chosen), layers, words)))
    counts = np.concatenate(counts) if counts else np.zeros((0, len(trace.layers)), np.int64)
    return _long_frame(counts, trace, sample=np.arange(samples))


def _verify_picks(trace: RoutingTrace, batch_size: int, window: int, samples: int, seed: int) -> np.ndarray:
    """(samples, batch_size) sorted-order starts of windows of distinct sequences."""
    starts = _window_starts(trace, window)
    logged = _window_logged(trace, starts, int(window))
    if logged is not None:
        starts = starts[logged.all(axis=1)]
    sequence = _sorted(trace, trace.sequence)[starts]
    owners, offsets = np.unique(sequence, return_index=True)
    if int(batch_size) != batch_size or not 1 <= batch_size <= owners.size:
        raise ValueError(f"batch_size must be a whole number in [1, {owners.size}] (sequences with "
                         f"{window} consecutive tokens), got {batch_size!r}")
    counts = np.diff(np.r_[offsets, sequence.size])
    rng = np.random.default_rng(seed)
    chosen = np.argsort(rng.random((samples, owners.size)), axis=1)[:, :int(batch_size)]
    return starts[offsets[chosen] + (rng.random(chosen.shape) * counts[chosen]).astype(np.int64)]


def _expert_counts(trace: RoutingTrace) -> np.ndarray:
    """Times each expert was chosen, shape (layers, E)."""
    def build():
        num_layers = len(trace.layers)
        ids = trace.experts.astype(np.int64)
        index = (np.arange(num_layers) * trace.num_experts)[None, :, None] + ids
        return np.bincount(index[ids >= 0], minlength=num_layers * trace.num_experts).reshape(
            num_layers, trace.num_experts)
    return _cached(trace, "expert_counts", build)


def _logged_tokens(trace: RoutingTrace) -> np.ndarray:
    """Tokens logged in each layer, shape (layers,)."""
    missing = _missing(trace)
    return np.full(len(trace.layers), trace.num_tokens) if missing is None else (~missing).sum(axis=0)


def _selection_probability(trace: RoutingTrace) -> np.ndarray:
    """Chance one token picks each expert, shape (layers, E); NaN for a layer without tokens."""
    tokens = _logged_tokens(trace)[:, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(tokens > 0, _expert_counts(trace) / np.maximum(tokens, 1), np.nan)


def popularity(trace: RoutingTrace) -> pd.DataFrame:
    """How often each expert is chosen, per layer.

    Returns
    -------
    pandas.DataFrame
        Columns ``layer``, ``expert``, ``count``, ``probability`` (the chance that one token picks
        the expert; it sums to ``K`` over a layer's experts, the ``p`` of
        :func:`moesd.theory.experts.expected_active_experts_from_popularity`; NaN for a layer without
        tokens).
    """
    return pd.DataFrame({
        "layer": np.repeat(trace.layers, trace.num_experts),
        "expert": np.tile(np.arange(trace.num_experts), len(trace.layers)),
        "count": _expert_counts(trace).ravel(),
        "probability": _selection_probability(trace).ravel(),
    })


def effective_experts(trace: RoutingTrace) -> pd.DataFrame:
    """The number of equally used experts with the same spread as each layer's routing.

    ``exp(H)`` with ``H`` the entropy (nats) of the layer's expert shares ``p_e / K``: ``E`` when
    routing is balanced, ``K`` when the same ``K`` experts take every token, NaN for a layer
    without tokens.

    Returns
    -------
    pandas.DataFrame
        Columns ``layer``, ``effective_experts``.
    """
    shares = _selection_probability(trace) / trace.top_k
    logs = np.log(np.where(shares > 0, shares, 1.0))
    return pd.DataFrame({"layer": trace.layers, "effective_experts": np.exp(-(shares * logs).sum(axis=1))})


def window_activation_probability(trace: RoutingTrace, window: int) -> np.ndarray:
    """Chance that ``window`` consecutive tokens of one sequence activate each expert.

    ``q_e(w)``: the fraction of runs of ``window`` consecutive tokens whose union holds expert
    ``e``, per layer (windows with a token missing in a layer are left out of it). ``q_e(1)`` is
    the popularity ``p_e``. Cached on the trace per window.

    Returns
    -------
    numpy.ndarray, shape (layers, E)
        Probabilities in [0, 1]; NaN for a layer without windows.
    """
    def build():
        windows = np.zeros(len(trace.layers), np.int64)
        hits = np.zeros((len(trace.layers), -(-trace.num_experts // 64) * 64), dtype=np.int64)
        for starts, unions in _window_blocks(trace, window):
            logged = _window_logged(trace, starts, int(window))
            if logged is not None:
                unions = np.where(logged[..., None], unions, np.uint64(0))
            windows += starts.size if logged is None else logged.sum(axis=0)
            bits = np.unpackbits(unions.view(np.uint8), axis=-1, bitorder="little")
            hits += bits.sum(axis=0, dtype=np.int64)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(windows[:, None] > 0, hits[:, :trace.num_experts] / np.maximum(windows, 1)[:, None],
                            np.nan)
    if int(window) != window or window < 1:
        raise ValueError(f"window must be a whole number >= 1, got {window!r}")
    return _cached(trace, ("window_activation", int(window)), build)


def adjacent_overlap(trace: RoutingTrace) -> pd.DataFrame:
    """Fraction of its experts a token shares with the previous token of its sequence, per layer.

    Pairs are consecutive tokens (one sequence, positions one apart) both logged in the layer.

    Returns
    -------
    pandas.DataFrame
        Columns ``layer``, ``overlap`` (mean of ``|S_i & S_{i-1}| / K`` over consecutive pairs),
        ``independent`` (its expectation for independent tokens with the trace's popularity,
        ``sum_e p_e**2 / K``; ``K / E`` for uniform routing) and ``pairs``.
    """
    starts = _window_starts(trace, 2)
    masks = _sequence_order(trace)[1]
    shared = _count(masks[starts] & masks[starts + 1])
    logged = _window_logged(trace, starts, 2)
    logged = np.ones(shared.shape, bool) if logged is None else logged
    pairs = logged.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        overlap = np.where(logged, shared, 0).sum(axis=0) / pairs / trace.top_k
    return pd.DataFrame({
        "layer": trace.layers,
        "overlap": np.where(pairs > 0, overlap, np.nan),
        "independent": (_selection_probability(trace) ** 2).sum(axis=1) / trace.top_k,
        "pairs": pairs,
    })


def verify_union_predictions(trace: RoutingTrace, batch_size: int, window: int, samples: int = 1000,
                             seed: int = 0) -> pd.DataFrame:
    """Measured verification load of ``batch_size`` sequences x ``window`` tokens, and three predictions.

    * ``uniform``: Eq. 8 at ``t = batch_size * window`` tokens, the paper's i.i.d. uniform model;
    * ``popularity``: the same tokens independent but with each expert's measured popularity
      (:func:`moesd.theory.experts.expected_active_experts_from_popularity`);
    * ``windows``: windows of different sequences independent, each activating expert ``e`` with the
      measured probability ``q_e`` that one window of ``window`` consecutive tokens does
      (:func:`window_activation_probability`), so ``sum_e 1 - (1 - q_e)**batch_size``. It keeps the
      correlation of consecutive tokens.

    Returns
    -------
    pandas.DataFrame
        One row per layer: ``layer``, ``measured`` (mean of :func:`verify_union`), ``uniform``,
        ``popularity``, ``windows``.
    """
    tokens = batch_size * window
    measured = verify_union(trace, batch_size, window, samples, seed).groupby("layer", sort=False)["union"].mean()
    hit = window_activation_probability(trace, window)
    return pd.DataFrame({
        "layer": trace.layers,
        "measured": measured.to_numpy(),
        "uniform": expected_active_experts(tokens, trace.num_experts, trace.top_k),
        "popularity": expected_active_experts_from_popularity(tokens, _selection_probability(trace)),
        "windows": (1.0 - (1.0 - hit) ** batch_size).sum(axis=-1),
    })
