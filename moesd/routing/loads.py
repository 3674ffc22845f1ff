"""Routing into the verification cost: how many experts a decode step and a verification pass load.

A decode step of ``B`` sequences routes ``B`` tokens; a verification pass routes ``B`` sequences x
``w`` consecutive tokens (``w = gamma + 1`` when the last accepted token is verified with the
``gamma`` drafts). While experts are memory-bound, each MoE layer's time grows with the number
``N`` of distinct experts it loads, so the expert part of the target efficiency is set by
``N(B) / N(B w)``. :func:`activated_experts` gives ``N`` per layer under four routing models:

* ``"uniform"``: Eq. 8, every token picks ``K`` of ``E`` experts uniformly and independently;
* ``"popularity"``: tokens independent, expert ``e`` chosen with its measured probability ``p_e``
  (:func:`moesd.theory.experts.expected_active_experts_from_popularity`);
* ``"windows"``: sequences independent, each run of ``w`` consecutive tokens activating expert
  ``e`` with its measured probability ``q_e(w)`` (:func:`moesd.routing.unions.window_activation_probability`),
  so ``N = sum_e 1 - (1 - q_e(w))**B``: it keeps the correlation of consecutive tokens;
* ``"measured"``: the mean of :func:`moesd.routing.unions.verify_union`, sampled from the trace.

:func:`verification_expert_ratio` turns the counts into the expert-weight bytes a verification
pass loads relative to a decode step, and :func:`routed_ffn_target_efficiency` into the roofline
floor of the MoE FFN's target efficiency, the cost model of :func:`moesd.theory.roofline.ffn_cost` with
``N`` from routing instead of Eq. 8. For the whole model (attention, shared experts, dense layers and
LM head as well) pass the trace to :func:`moesd.predictor.forward.step_time` or :func:`moesd.predictor.predict.predict_sd`
as ``routing=trace`` (with ``routing_model="windows"`` or ``"popularity"``): the same counts then reach
target efficiency and the speedup of Eq. 4.
"""

from __future__ import annotations

import numpy as np

from moesd._checks import as_array, within_memory
from moesd.theory.experts import expected_active_experts, expected_active_experts_from_popularity
from moesd.theory.roofline import Hardware
from moesd.routing.traces import RoutingTrace
from moesd.routing.unions import selection_probability, verify_union, window_activation_probability

ROUTING_MODELS = ("uniform", "popularity", "windows", "measured")


def _popularity(source) -> np.ndarray:
    """Per-layer selection probabilities (layers, E) of a trace or of a popularity array."""
    if isinstance(source, RoutingTrace):
        return selection_probability(source)
    p = as_array("source", source, low=0, high=1)
    if p.ndim not in (1, 2):
        raise ValueError(f"a popularity source must have shape (E,) or (layers, E), got {p.shape}")
    return p.reshape(-1, p.shape[-1])


def activated_experts(source, batch_size, tokens_per_sequence=1, model: str = "popularity",
                      samples: int = 1000, seed: int = 0) -> np.ndarray:
    """Expected distinct experts each MoE layer loads for ``batch_size`` sequences x ``tokens_per_sequence`` tokens.

    Parameters
    ----------
    source : RoutingTrace or array_like
        A trace, or expert popularity: the chance one token picks each expert, shape (E,) or
        (layers, E), each row summing to ``K`` (what :func:`moesd.routing.unions.popularity` measures). A
        popularity array serves ``"uniform"`` (its E and K) and ``"popularity"``; ``"windows"`` and
        ``"measured"`` need a trace.
    batch_size : array_like
        Sequences ``B`` (>= 0; real values allowed except for ``"measured"``).
    tokens_per_sequence : array_like, default 1
        Consecutive tokens ``w`` of each sequence (whole numbers >= 1): 1 for a decode step,
        ``gamma + 1`` for a verification pass. Broadcast against ``batch_size``.
    model : {"uniform", "popularity", "windows", "measured"}
        The routing model (see the module docstring).
    samples, seed : int
        Monte-Carlo samples and seed of ``"measured"``.

    Returns
    -------
    numpy.ndarray, shape broadcast(batch_size, tokens_per_sequence) + (layers,)
        Activated experts per layer (a popularity of shape (E,) counts as one layer); NaN for a
        layer without tokens.
    """
    if model not in ROUTING_MODELS:
        raise ValueError(f"model must be one of {ROUTING_MODELS}, got {model!r}")
    batch = as_array("batch_size", batch_size, low=0)
    width = as_array("tokens_per_sequence", tokens_per_sequence, low=1, whole=True)
    batch, width = np.broadcast_arrays(batch, width)
    if model in ("windows", "measured") and not isinstance(source, RoutingTrace):
        raise ValueError(f"model={model!r} needs a RoutingTrace: a popularity has no token order")
    if model == "uniform" and isinstance(source, RoutingTrace):  # Eq. 8 needs E and K, no array of E
        value = expected_active_experts(batch * width, source.num_experts, source.top_k)
        return np.repeat(np.asarray(value)[..., None], len(source.layers), axis=-1)
    if model in ("uniform", "popularity"):
        p = _popularity(source)
        if model == "popularity":
            return expected_active_experts_from_popularity((batch * width)[..., None], p)
        value = expected_active_experts(batch * width, p.shape[-1], int(round(float(np.nansum(p[0])))))
        return np.repeat(np.asarray(value)[..., None], p.shape[0], axis=-1)
    result = np.empty(batch.shape + (len(source.layers),))
    if model == "windows":
        for w in np.unique(width):
            chosen = width == w
            q = window_activation_probability(source, int(w))
            within_memory(f"model='windows' over {q.shape[0]} layers x E = {q.shape[1]} experts x "
                          f"{int(chosen.sum())} batch sizes", 2 * int(chosen.sum()) * q.size)
            result[chosen] = (1.0 - (1.0 - q) ** batch[chosen][:, None, None]).sum(axis=-1)
        return result
    for index in np.ndindex(batch.shape):
        b = batch[index]
        if b != int(b) or b < 1:
            raise ValueError(f"model='measured' needs whole batch sizes >= 1, got {b!r}")
        frame = verify_union(source, int(b), int(width[index]), samples, seed)
        result[index] = frame.groupby("layer", sort=False)["union"].mean().to_numpy()
    return result


def verification_expert_ratio(source, batch_size, tokens_per_sequence, model: str = "popularity",
                              samples: int = 1000, seed: int = 0):
    """Expert-weight bytes of a verification pass over those of a decode step of the same batch.

    ``sum_l N_l(B, w) / sum_l N_l(B, 1)`` over the MoE layers (routed experts of one model all have
    the same size, so expert counts are bytes up to a constant). 1 means verification loads no
    expert the decode step would not have loaded; ``w`` is the most it can be.

    Parameters are those of :func:`activated_experts`.

    Returns
    -------
    numpy.ndarray or float
        The ratio, shape broadcast(batch_size, tokens_per_sequence).
    """
    verify = activated_experts(source, batch_size, tokens_per_sequence, model, samples, seed)
    decode = activated_experts(source, batch_size, 1, model, samples, seed)
    ratio = np.nansum(verify, axis=-1) / np.nansum(np.broadcast_to(decode, verify.shape), axis=-1)
    return ratio if ratio.ndim else float(ratio)


def routed_ffn_target_efficiency(source, batch_size, tokens_per_sequence, hardware: Hardware, d_model, d_ff,
                                 model: str = "popularity", num_matrices=3, bytes_per_value=2,
                                 samples: int = 1000, seed: int = 0):
    """Roofline-floor target efficiency of the MoE FFN layers with routing-aware expert counts.

    ``sum_l T_l(B) / sum_l T_l(B w)`` where each layer's time is the roofline floor
    ``max(traffic / bandwidth, flops / peak)`` of :func:`moesd.theory.roofline.ffn_cost`'s cost model:
    ``2 m d d_ff`` FLOPs per routed token per expert, and the ``N_l`` loaded experts' weights plus
    each routed token's input and output as traffic, with ``N_l`` from :func:`activated_experts`.
    With ``model="uniform"`` it equals :func:`moesd.theory.roofline.ffn_target_efficiency` at
    ``gamma = w``. Attention and dense parts are left out, as there.

    Parameters
    ----------
    source, batch_size, tokens_per_sequence, model, samples, seed
        As in :func:`activated_experts`.
    hardware : Hardware
        The device.
    d_model, d_ff : int
        Hidden size and one expert's intermediate size.
    num_matrices : int, default 3
        Weight matrices per expert (3 for SwiGLU).
    bytes_per_value : float, default 2
        Bytes per weight and activation.

    Returns
    -------
    numpy.ndarray or float
        Between ``1 / w`` (compute-bound) and 1 (memory-bound and no extra expert loaded).
    """
    d_model = as_array("d_model", d_model, low=1, whole=True)
    d_ff = as_array("d_ff", d_ff, low=1, whole=True)
    num_matrices = as_array("num_matrices", num_matrices, low=1, whole=True)
    bytes_per_value = as_array("bytes_per_value", bytes_per_value, low=0, low_open=True)
    top_k = source.top_k if isinstance(source, RoutingTrace) else int(round(float(np.nansum(_popularity(source)[0]))))
    weights_per_expert = num_matrices * d_model * d_ff

    def floor(width):
        tokens = np.asarray(batch_size, dtype=float) * np.asarray(width, dtype=float)
        loaded = activated_experts(source, batch_size, width, model, samples, seed)
        flops = 2.0 * weights_per_expert * tokens * top_k
        traffic = (loaded * weights_per_expert + (2.0 * tokens * top_k * d_model)[..., None]) * bytes_per_value
        # The roofline floor of moesd.theory.roofline.time_floor, layer by layer; a layer without tokens
        # (NaN experts) is left out of the sum.
        seconds = np.maximum(traffic / hardware.memory_bandwidth, (flops / hardware.peak_flops)[..., None])
        return np.nansum(seconds, axis=-1)

    efficiency = floor(1) / floor(tokens_per_sequence)
    return efficiency if efficiency.ndim else float(efficiency)
