"""How many distinct experts a set of routed tokens activates, measured on a :class:`~moesd.routing.traces.RoutingTrace`.

The quantity is ``N(t)`` of Eq. 8, taken for the sets of tokens that matter to speculative decoding:

* :func:`batch_union`: the tokens of one forward pass (what a decode step of ``B`` sequences loads);
* :func:`window_union`: ``t`` consecutive tokens of one sequence (what verifying a draft loads);
* :func:`random_union`: ``t`` tokens drawn at random (the i.i.d. assumption of Eq. 8);
* :func:`verify_union`: ``B`` sequences x ``w`` consecutive tokens (one batched verification), with
  :func:`verify_picks` the windows it samples and :func:`verify_union_predictions` three predictions of it;
* :func:`popularity`, :func:`selection_probability`, :func:`effective_experts`,
  :func:`window_activation_probability` and :func:`adjacent_overlap`: why real routing activates
  fewer experts.

Tokens are *consecutive* when they belong to the same sequence and their positions differ by one:
a gap in the positions (a token the log lost) ends a window. Unions are computed on bitmasks
(:func:`expert_masks`: ``ceil(E / 64)`` 64-bit words per token and layer) built once per trace and kept
with it (:func:`moesd.routing.traces.cached`), so any ``E`` works and nothing loops over tokens in
Python. Statistics over sequences refuse a trace holding rejected draft tokens
(:func:`moesd.routing.traces.without_rejected` drops them); statistics over tokens count them as the
routed work they were.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from moesd._checks import as_array, within_memory
from moesd.routing.traces import RoutingTrace, cached, missing_entries, read_only
from moesd.theory.experts import expected_active_experts, expected_active_experts_from_popularity

# --- cached building blocks -------------------------------------------------------------------

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
        within_memory(f"the expert bitmasks of {trace.num_tokens} tokens x {layers} layers x E = "
                      f"{trace.num_experts} experts", trace.num_tokens * layers * words)
        has_missing = missing_entries(trace) is not None
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
        return read_only(masks)
    return cached(trace, "masks", build)


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
        masks = expert_masks(trace) if order is None else read_only(expert_masks(trace)[order])
        return order, masks, breaks
    return cached(trace, "sequence_order", build)


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
    missing = missing_entries(trace)
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
    missing = missing_entries(trace)
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
    missing = missing_entries(trace)
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


def mean_union_per_layer(unions: pd.DataFrame) -> np.ndarray:
    """The mean distinct experts per layer of a union table (:func:`window_union`, :func:`random_union`, ...), in
    the order of the layers."""
    return unions.groupby("layer")["union"].mean().to_numpy()


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
    samples = _checked_samples(samples, int(t) + 3 * len(trace.layers), f"{int(t)} tokens")
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
    samples = _checked_samples(samples, int(batch_size) + 3 * len(trace.layers),
                               f"{batch_size} sequences x {window} tokens")
    picks = verify_picks(trace, batch_size, window, samples, seed)
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


def _checked_samples(samples, values_each: int, what: str) -> int:
    """``samples`` as an int (a whole number >= 1), refused before any work when the samples' picks and rows would
    pass :data:`moesd._checks.MEMORY_LIMIT` (``values_each`` values per sample)."""
    samples = int(as_array("samples", samples, low=1, whole=True))
    within_memory(f"{samples} samples of {what}", samples * values_each)
    return samples


def verify_picks(trace: RoutingTrace, batch_size: int, window: int, samples: int, seed: int) -> np.ndarray:
    """The windows :func:`verify_union` samples: ``batch_size`` windows of distinct sequences per sample.

    Each sample picks ``batch_size`` distinct sequences (among those with a run of ``window``
    consecutive tokens logged in every layer) and, in each, one such run at random.

    Returns
    -------
    numpy.ndarray of int, shape (samples, batch_size)
        Index of each window's first token in the trace's tokens sorted by (sequence, position).

    Raises
    ------
    ValueError
        If ``batch_size`` is not a whole number in ``[1, sequences with such a run]``.
    """
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
        within_memory(f"expert counts of {num_layers} layers x E = {trace.num_experts} experts",
                      3 * num_layers * trace.num_experts)  # the counts, then probabilities and a mask of them
        ids = trace.experts.astype(np.int64)
        index = (np.arange(num_layers) * trace.num_experts)[None, :, None] + ids
        return np.bincount(index[ids >= 0], minlength=num_layers * trace.num_experts).reshape(
            num_layers, trace.num_experts)
    return cached(trace, "expert_counts", build)


def _logged_tokens(trace: RoutingTrace) -> np.ndarray:
    """Tokens logged in each layer, shape (layers,)."""
    missing = missing_entries(trace)
    return np.full(len(trace.layers), trace.num_tokens) if missing is None else (~missing).sum(axis=0)


def selection_probability(trace: RoutingTrace) -> np.ndarray:
    """Chance that one token picks each expert, per layer: the ``p_e`` of the routing models.

    Counted over the tokens logged in each layer (the counts are kept with the trace).

    Returns
    -------
    numpy.ndarray, shape (layers, E)
        Probabilities in [0, 1], summing to ``K`` over a layer's experts; NaN for a layer without tokens.
    """
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
    within_memory(f"the popularity of {len(trace.layers)} layers x E = {trace.num_experts} experts",
                  7 * len(trace.layers) * trace.num_experts)  # four columns, the counts and probabilities behind
    return pd.DataFrame({
        "layer": np.repeat(trace.layers, trace.num_experts),
        "expert": np.tile(np.arange(trace.num_experts), len(trace.layers)),
        "count": _expert_counts(trace).ravel(),
        "probability": selection_probability(trace).ravel(),
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
    shares = selection_probability(trace) / trace.top_k
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
        within_memory(f"window activation of {len(trace.layers)} layers x E = {trace.num_experts} experts",
                      3 * len(trace.layers) * trace.num_experts)  # hits, then probabilities and a mask of them
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
    return cached(trace, ("window_activation", int(window)), build)


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
        "independent": (selection_probability(trace) ** 2).sum(axis=1) / trace.top_k,
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
        "popularity": expected_active_experts_from_popularity(tokens, selection_probability(trace)),
        "windows": (1.0 - (1.0 - hit) ** batch_size).sum(axis=-1),
    })
