"""Fig. 1a/1b on trained routers: distinct experts of the shipped sources against Eq. 8.

* :func:`popularity_curves`: per source and recorded layer, the experts ``t`` independent tokens activate
  with the layer's measured popularity (:func:`moesd.theory.experts.expected_active_experts_from_popularity`),
  Eq. 8's ``N(t)`` and the popularity curve's standard error from the counts' sampling;
* :func:`ratio_table`: their ratio at chosen token counts;
* :func:`window_activation` and :func:`batch_activation`: measured distinct experts of per-token sequences
  over windows of consecutive tokens and over batches of sequences (:mod:`moesd.routing.unions`), beside both
  predictions;
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from moesd._checks import as_array
from moesd.routing import sources
from moesd.routing.unions import verify_union, window_union
from moesd.theory.experts import expected_active_experts, expected_active_experts_from_popularity

TOKENS = np.arange(1, 257)
"""Token counts of the curves (Fig. 1's range, and past T_thres of every shipped source)."""


def popularity_standard_error(t, p, tokens: int) -> np.ndarray:
    """Standard error of ``N_pop(t) = sum_e 1 - (1 - p_e)^t`` estimated from counts over ``tokens`` tokens.

    Delta method: ``N_pop`` moves with each ``p_e`` by ``g_e = t (1 - p_e)^(t - 1)``. Each token picks exactly K
    experts, so the counts' errors cancel in their sum, and the variance of ``sum_e g_e X_e`` for one token's
    choices ``X`` is taken with Hajek's approximation for fixed-size sampling,
    ``sum_e p_e (1 - p_e) (g_e - g)^2`` with ``g`` the mean of ``g_e`` weighted by ``p_e (1 - p_e)`` (for K = 1,
    the multinomial case, it is close to the exact ``sum_e p_e g_e^2 - (sum_e p_e g_e)^2``); over independent
    tokens it falls as ``1 / tokens``. Correlated tokens (text) make the true error larger.

    Parameters
    ----------
    t : array_like
        Token counts (>= 1).
    p : array_like, shape (E,)
        Popularity (summing to K).
    tokens : int
        Tokens the counts were taken over.

    Returns
    -------
    numpy.ndarray
        Experts, shape of ``t``.
    """
    t = np.expand_dims(as_array("t", t, low=1), -1)
    p = as_array("p", p, low=0, high=1)
    slope = t * (1.0 - p) ** (t - 1.0)
    weight = p * (1.0 - p)
    mean = (weight * slope).sum(axis=-1, keepdims=True) / max(float(weight.sum()), 1e-300)
    return np.sqrt((weight * (slope - mean) ** 2).sum(axis=-1) / int(tokens))


def popularity_curves(names=None, t=TOKENS) -> pd.DataFrame:
    """N(t) of independent tokens with each recorded layer's popularity, against Eq. 8, for shipped sources.

    Parameters
    ----------
    names : iterable of str, optional
        Sources (:func:`moesd.routing.sources.names`); default all.
    t : array_like
        Token counts.

    Returns
    -------
    pandas.DataFrame
        Columns ``source``, ``model``, ``domain``, ``layer``, ``t``, ``uniform`` (Eq. 8), ``popularity``,
        ``popularity_se``, ``ratio`` (``popularity / uniform``).
    """
    t = np.asarray(as_array("t", t, low=1), dtype=float).ravel()
    frames = []
    for name in sources.names() if names is None else names:
        info = sources.info(name)
        model, domain = info.name.split("/")
        uniform = expected_active_experts(t, info.num_experts, info.top_k)
        for layer, p in zip(info.layers, sources.popularity(name)):
            curve = expected_active_experts_from_popularity(t, p)
            frames.append(pd.DataFrame({"source": info.name, "model": model, "domain": domain, "layer": layer, "t": t,
                                        "uniform": uniform, "popularity": curve,
                                        "popularity_se": popularity_standard_error(t, p, info.tokens),
                                        "ratio": curve / uniform}))
    return pd.concat(frames, ignore_index=True)


def skew_table(names=None) -> pd.DataFrame:
    """How skewed each recorded layer of the shipped sources is.

    Returns
    -------
    pandas.DataFrame
        Per ``model``, ``domain``, ``layer``: ``E``, ``K``, ``effective_experts`` (``exp(H)`` of the shares
        ``p_e / K``: ``E`` when balanced, as :func:`moesd.routing.unions.effective_experts` for traces),
        ``top_share`` (share of the choices the ``K`` most chosen experts take; ``K / E`` when balanced),
        ``max_over_uniform`` (the most chosen expert's ``p_e`` over ``K / E``) and ``unused`` (experts never chosen).
    """
    rows = []
    for name in sources.names() if names is None else names:
        info = sources.info(name)
        model, domain = info.name.split("/")
        for layer, p in zip(info.layers, sources.popularity(name)):
            shares = p / info.top_k
            logs = np.log(np.where(shares > 0, shares, 1.0))
            rows.append({"model": model, "domain": domain, "layer": layer, "E": info.num_experts, "K": info.top_k,
                         "effective_experts": float(np.exp(-(shares * logs).sum())),
                         "top_share": float(np.sort(shares)[::-1][:info.top_k].sum()),
                         "max_over_uniform": float(p.max() / (info.top_k / info.num_experts)),
                         "unused": int((p == 0).sum())})
    return pd.DataFrame(rows)


def ratio_table(names=None, tokens=(8, 32, 128)) -> pd.DataFrame:
    """``N_pop(t) / N_Eq8(t)`` per source and recorded layer at each of ``tokens`` (columns ``t = ...``)."""
    curves = popularity_curves(names, tokens)
    table = curves.set_index(["model", "domain", "layer", "t"])["ratio"].unstack("t")
    table = table.reindex(curves.set_index(["model", "domain", "layer"]).index.unique())  # the sources' order
    table.columns = [f"t = {int(t)}" for t in table.columns]
    return table


def window_activation(traces: dict, name: str, t=(8, 32)) -> pd.DataFrame:
    """Measured distinct experts over windows of ``t`` consecutive tokens of each sequence, beside the predictions.

    Parameters
    ----------
    traces : dict of int to RoutingTrace
        One trace per recorded layer (:func:`moesd.routing.sources.token_traces`).
    name : str
        The source whose per-layer popularity gives ``popularity`` (the same model's counts).
    t : iterable of int
        Window lengths; a sequence counts at ``t`` if it has at least ``t`` tokens.

    Returns
    -------
    pandas.DataFrame
        Columns ``sequence``, ``layer``, ``t``, ``windows`` (how many), ``measured`` (mean over the sequence's
        windows), ``uniform`` (Eq. 8) and ``popularity`` (independent tokens with the layer's popularity).
    """
    info = sources.info(name)
    p = dict(zip(info.layers, sources.popularity(name)))
    rows = []
    for layer, trace in traces.items():
        for tokens in t:
            windows = window_union(trace, int(tokens))
            for sequence, group in windows.groupby("sequence"):
                rows.append({"sequence": int(sequence), "layer": int(layer), "t": int(tokens), "windows": len(group),
                             "measured": float(group["union"].mean()),
                             "uniform": float(expected_active_experts(tokens, trace.num_experts, trace.top_k)),
                             "popularity": float(expected_active_experts_from_popularity(tokens, p[layer]))})
    return pd.DataFrame(rows)


def batch_activation(traces: dict, name: str, batch_size: int, window: int, samples: int = 400,
                     seed: int = 0) -> pd.DataFrame:
    """Measured distinct experts of ``batch_size`` sequences x ``window`` consecutive tokens, per layer.

    :func:`moesd.routing.unions.verify_union` over each layer's sequences (layers with fewer than
    ``batch_size`` sequences of ``window`` tokens are left out), beside Eq. 8 and the popularity model at
    ``batch_size * window`` tokens.

    Returns
    -------
    pandas.DataFrame
        Columns ``layer``, ``tokens``, ``measured``, ``uniform``, ``popularity``, ``sequences``.
    """
    info = sources.info(name)
    p = dict(zip(info.layers, sources.popularity(name)))
    rows, tokens = [], int(batch_size) * int(window)
    for layer, trace in traces.items():
        try:
            union = verify_union(trace, batch_size, window, samples, seed)
        except ValueError:  # too few sequences with a run of ``window`` tokens
            continue
        rows.append({"layer": int(layer), "tokens": tokens, "measured": float(union["union"].mean()),
                     "uniform": float(expected_active_experts(tokens, trace.num_experts, trace.top_k)),
                     "popularity": float(expected_active_experts_from_popularity(tokens, p[layer])),
                     "sequences": len(np.unique(trace.sequence))})
    return pd.DataFrame(rows)


def window_curves(traces: dict, t=None) -> pd.DataFrame:
    """Measured distinct experts over windows of every length ``t``: per layer and sequence, mean over its windows.

    Returns
    -------
    pandas.DataFrame
        Columns ``layer``, ``sequence``, ``t``, ``measured``.
    """
    rows = []
    for layer, trace in traces.items():
        longest = int(max(np.bincount(trace.sequence.astype(np.int64))))
        for tokens in (range(1, longest + 1) if t is None else t):
            means = window_union(trace, int(tokens)).groupby("sequence")["union"].mean()
            rows += [{"layer": int(layer), "sequence": int(s), "t": int(tokens), "measured": float(m)}
                     for s, m in means.items()]
    return pd.DataFrame(rows)
