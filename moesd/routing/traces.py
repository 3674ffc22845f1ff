"""Expert-routing traces: the :class:`RoutingTrace` record, its validation and its one on-disk format.

A :class:`RoutingTrace` holds, for every routed token and every MoE layer, the ``K`` expert ids the
token was sent to, with per-token bookkeeping: which request (``sequence``), where in it
(``position``), which forward pass (``call``) and whether that pass was a prefill or a decode step
(``phase``, ``"unknown"`` where the source cannot say, ``"rejected"`` for a speculative-decoding draft
token that was verified but is not part of its sequence). A trace is saved to and loaded from one
compressed ``.npz`` file (:meth:`RoutingTrace.save`, :meth:`RoutingTrace.load`); :func:`concatenate`
joins traces and :func:`without_rejected` keeps a trace's sequences' own tokens.

Its arrays are read-only: statistics build what they need once per trace and keep it with the trace
(:func:`cached`), and assigning a new array clears what they kept. The statistics (how many distinct
experts a set of tokens activates) live in :mod:`moesd.routing.unions`; readers of other tools' logs in
:mod:`moesd.routing.importers` and :mod:`moesd.routing.vllm_logs`; turning the statistics into
verification cost is :mod:`moesd.routing.loads`.
"""

from __future__ import annotations

import json
import numbers
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from moesd._files import atomic_write, npz_arrays, parse_json, regular_file

PHASES = ("prefill", "decode", "unknown", "rejected")
"""Allowed ``phase`` values; ``"unknown"`` marks tokens whose forward pass the source did not name, and
``"rejected"`` draft tokens that a speculative-decoding verification pass routed but that are not part of
their sequence (rejected, or cut at the sequence's end). Statistics over sequences (windows of consecutive
tokens) refuse a trace holding them: :func:`without_rejected` drops them. Statistics over tokens
(:func:`~moesd.routing.unions.popularity`, :func:`~moesd.routing.unions.random_union`,
:func:`~moesd.routing.unions.batch_union`) count them as the routed work they were."""

MISSING = -1
"""Expert id that marks a (token, layer) the source did not log (all ``K`` ids of the row)."""

_CACHED_FROM = {"experts", "num_experts", "sequence", "position", "call", "layers"}


_INT64_MAX = np.iinfo(np.int64).max


def _refuse_repeated_tokens(sequence: np.ndarray, position: np.ndarray, phase: np.ndarray) -> None:
    """Refuse two tokens of one (sequence, position) outside phase ``"rejected"`` (a draft token that was
    rejected shares its position with the token the sequence holds there)."""
    tokens = pd.DataFrame({"sequence": sequence, "position": position})[phase != "rejected"]
    repeated = tokens.duplicated()
    if repeated.any():
        second = tokens.index[repeated][0]
        first = tokens.index[(tokens == tokens.loc[second]).all(axis=1)][0]
        raise ValueError(f"tokens {first} and {second} are both sequence {sequence[first]} position "
                         f"{position[first]}: a (sequence, position) holds one token (outside phase 'rejected'); "
                         "give joined parts distinct sequence ids")


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
        If shapes disagree, an id is outside ``[0, E)``, a token lists an expert twice, two tokens
        outside phase ``"rejected"`` share a (sequence, position), ``E`` exceeds 2**63 - 1, or a
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
        if num_experts > _INT64_MAX:
            raise ValueError(f"num_experts must be <= 2**63 - 1 (ids are stored as int64), got {num_experts}")
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
        self.experts = read_only(experts.astype(next(t for t in (np.int16, np.int32, np.int64)
                                                      if num_experts <= np.iinfo(t).max)))
        defaults = {"sequence": np.zeros(tokens, np.int64), "position": np.arange(tokens),
                    "call": np.arange(tokens)}
        for name, default in defaults.items():
            value = default if getattr(self, name) is None else np.asarray(getattr(self, name))
            if value.shape != (tokens,) or not (np.issubdtype(value.dtype, np.integer) or value.size == 0):
                raise ValueError(f"{name} must be an integer array of shape ({tokens},), "
                                 f"got {value.dtype} of shape {value.shape}")
            setattr(self, name, read_only(value.astype(np.int64)))
        phase = np.full(tokens, "decode") if self.phase is None else np.asarray(self.phase, dtype=str)
        if phase.shape != (tokens,) or not np.isin(phase, PHASES).all():
            raise ValueError(f"phase must hold one of {PHASES} for each of the {tokens} tokens")
        self.phase = read_only(phase.astype("<U8"))
        _refuse_repeated_tokens(self.sequence, self.position, self.phase)
        if self.weights is not None:
            weights = np.asarray(self.weights, dtype=np.float32)
            if weights.shape != experts.shape:
                raise ValueError(f"weights must have the shape of experts {experts.shape}, got {weights.shape}")
            self.weights = read_only(weights)
        layers = np.arange(num_layers) if self.layers is None else np.asarray(self.layers)
        if layers.shape != (num_layers,) or not (np.issubdtype(layers.dtype, np.integer) or layers.size == 0):
            raise ValueError(f"layers must be {num_layers} integer layer indices, got {layers!r}")
        if np.unique(layers).size != num_layers:
            raise ValueError(f"layers must be distinct, got {layers.tolist()}")
        self.layers = read_only(layers.astype(np.int64))
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
        missing = missing_entries(self)
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
            Naming the file, if it does not exist, is not a regular file (a FIFO would block forever),
            is not a trace (a text log, a corrupt archive) or fails validation.
        """
        path = regular_file("path", path)
        with open(path, "rb") as file:
            if file.read(4) != b"PK\x03\x04":
                raise ValueError(f"{path}: not a RoutingTrace .npz archive (it does not start like a zip file); "
                                 "logs of other tools (JSONL, CSV) are read by moesd.routing.importers, "
                                 "vLLM's by moesd.routing.vllm_logs")
            file.seek(0)
            try:
                fields = npz_arrays(path)  # each array's declared size checked before it is read
                missing = {"experts", "num_experts"} - set(fields)
                if missing:
                    raise ValueError(f"missing arrays {sorted(missing)}")
                fields["num_experts"] = fields["num_experts"].item()
                fields["meta"] = parse_json(str(fields.get("meta", "{}")), "its meta")
                return cls(**fields)
            except Exception as error:  # a corrupt zip, bad JSON or failed validation
                raise ValueError(f"{path}: not a valid routing trace: {error}") from error


def without_rejected(trace: RoutingTrace) -> RoutingTrace:
    """The trace without the rows of rejected draft tokens (phase ``"rejected"``): its sequences' own tokens."""
    rejected = trace.phase == "rejected"
    return trace.select(~rejected) if rejected.any() else trace


def read_only(array: np.ndarray) -> np.ndarray:
    """``array``, made read-only (as every array a trace holds or caches)."""
    array.flags.writeable = False
    return array


def concatenate(traces: list[RoutingTrace]) -> RoutingTrace:
    """Join traces of the same model, renumbering calls so they stay distinct.

    Sequence ids are kept as they are: give each part distinct ones (parts that share a (sequence, position)
    are refused). ``meta`` comes from the first.
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


# --- what statistics keep with a trace --------------------------------------------------------

def cached(trace: RoutingTrace, key, build):
    """``build()``, computed once per trace and ``key`` and kept with the trace.

    What is kept is dropped when one of the trace's arrays is assigned anew (never edit one in
    place: they are read-only).
    """
    if key not in trace._cache:
        trace._cache[key] = build()
    return trace._cache[key]


def missing_entries(trace: RoutingTrace) -> np.ndarray | None:
    """Boolean (tokens, layers) of unlogged entries (see :data:`MISSING`), or None when every entry was logged."""
    def build():
        missing = trace.experts[..., 0] == MISSING
        return missing if missing.any() else None
    return cached(trace, "missing", build)


def correlated_trace(sequences: int, length: int, num_experts: int, top_k: int, reuse: float,
                     seed: int = 0) -> RoutingTrace:
    """A synthetic one-layer trace whose consecutive tokens share experts, with uniform popularity.

    The first token of each sequence picks ``top_k`` of ``num_experts`` experts uniformly. Every later
    token keeps each expert of the token before it with probability ``reuse`` and draws the rest of its
    ``top_k`` uniformly from the experts it has not kept. Every expert is equally popular (the process is
    symmetric in the experts), so the trace isolates the correlation of consecutive tokens from
    popularity: ``reuse = 0`` is Eq. 8's independent uniform routing, ``reuse = 1`` a sequence that never
    changes its experts.

    Parameters
    ----------
    sequences, length : int
        Sequences and decode tokens per sequence (>= 1).
    num_experts, top_k : int
        ``E`` and ``K`` (1 <= K <= E).
    reuse : float
        Probability in [0, 1] that a token keeps one given expert of the token before it.
    seed : int
        Seed of the draw.

    Returns
    -------
    RoutingTrace
        ``sequences * length`` decode tokens of one layer.
    """
    if not 0 <= reuse <= 1:
        raise ValueError(f"reuse must be in [0, 1], got {reuse!r}")
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k must be in [1, num_experts = {num_experts}], got {top_k!r}")
    if sequences < 1 or length < 1:
        raise ValueError(f"sequences and length must be >= 1, got {sequences!r} and {length!r}")
    rng = np.random.default_rng(seed)
    experts = np.empty((sequences, length, top_k), dtype=np.int64)
    experts[:, 0] = np.argsort(rng.random((sequences, num_experts)), axis=1)[:, :top_k]
    for step in range(1, length):
        previous = experts[:, step - 1]
        kept = rng.random(previous.shape) < reuse
        # rank the experts: kept ones first, then the others in a random order
        score = rng.random((sequences, num_experts)) + 1.0
        np.put_along_axis(score, previous, np.where(kept, 0.0, np.take_along_axis(score, previous, 1)), axis=1)
        experts[:, step] = np.argsort(score, axis=1)[:, :top_k]
    return RoutingTrace(experts.reshape(sequences * length, 1, top_k), num_experts,
                        sequence=np.repeat(np.arange(sequences), length),
                        position=np.tile(np.arange(length), sequences),
                        meta={"model_id": f"synthetic: reuse {reuse:g}", "weights": "none (synthetic)"})
