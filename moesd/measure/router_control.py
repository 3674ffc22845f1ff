"""Routing under control in a timing sweep: who picks each token's experts, and how many were activated.

A sweep's MoE target routes its tokens one of these ways (``SweepConfig.routing``):

* ``"uniform"``: each token's K experts are K distinct experts drawn uniformly at random,
  independently of every other token, with equal weights 1/K: the assumption of Eq. 8, under which
  a forward of ``t`` tokens activates ``N(t) = E (1 - (1 - K/E)^t)`` experts per layer on average.
  The model's router still runs (its cost belongs to a step); only its choice is replaced.
* ``"model"``: the model's own router. With random weights its choice depends on the model's
  widths: cut to 1/8 width it is far from uniform (a few experts take most tokens) and activates
  fewer experts than Eq. 8 says; at real width it comes close to uniform.
* ``"trace"``: the expert choices of a :class:`~moesd.routing.traces.RoutingTrace` replayed token by token
  (its decode tokens, in order, wrapping around): real routing, with its popularity and its
  correlation between consecutive tokens, on a random-weight model of the same E and K.
* ``"popularity"``: each token's K distinct experts drawn independently of every other token, expert ``e``
  of layer ``i`` with the probability ``p_e`` of a trained router's layer ``i mod n``
  (:func:`moesd.routing.sources.popularity`): a trained router's skew without its token-to-token
  correlation, under which ``t`` tokens activate ``sum_e 1 - (1 - p_e)^t`` experts per layer on average
  (:func:`moesd.theory.experts.expected_active_experts_from_popularity`). The K experts of a token are a
  randomised systematic sample (:func:`draw_by_popularity`), whose inclusion probabilities are exactly ``p``.

:class:`RoutingControl` installs the choice on the routers of a model and keeps the expert ids of its
most recent forwards as device tensors: no copy and no host synchronisation inside a forward, so a
timed forward, or one captured as a CUDA graph, is the same forward. :func:`distinct_experts` counts
afterwards the distinct experts each MoE layer activated: N(t) measured, not assumed. Under a CUDA
graph the hooks run only at capture; the tensors recorded then are the graph's own outputs, which
every replay overwrites with that replay's ids.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import torch

from moesd.routing.capture import moe_layers
from moesd.measure.sweeps import ROUTINGS


def num_experts(model) -> int:
    """E, the routed experts per MoE layer, from a Transformers MoE config."""
    config = model.config
    for name in ("num_experts", "n_routed_experts", "num_local_experts"):
        value = getattr(config, name, None)
        if value:
            return int(value)
    raise ValueError(f"this {config.model_type} config names no number of routed experts")


def set_top_k(model, top_k: int) -> None:
    """Route every token of ``model`` to ``top_k`` experts from now on (K of Eq. 8), in place.

    The weights do not depend on K, so this gives the model that building it with ``top_k`` would
    give (the same seed gives the same weights): a sweep over K builds its models once.

    Raises
    ------
    ValueError
        If ``top_k`` is not in [1, E] or a router keeps no ``top_k``.
    """
    experts = num_experts(model)
    if isinstance(top_k, bool) or int(top_k) != top_k or not 1 <= top_k <= experts:
        raise ValueError(f"top_k must be a whole number in [1, {experts}] (E of this model), got {top_k!r}")
    for index, router in moe_layers(model).items():
        if not hasattr(router, "top_k"):
            raise ValueError(f"the router of layer {index} ({type(router).__name__}) keeps no top_k")
        router.top_k = int(top_k)
    model.config.num_experts_per_tok = int(top_k)


class RoutingControl:
    """Context manager: route ``model`` as ``routing`` says and keep the expert ids of its last forwards.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        An MoE causal LM (:func:`moesd.routing.capture.moe_layers` finds its routers).
    routing : str
        One of :data:`ROUTINGS`.
    keep : int
        Forwards whose ids are kept (the most recent; older ones are released).
    trace : RoutingTrace, optional
        With ``routing="trace"``: the trace to replay (its E and K must be the model's). Model layer
        ``i`` replays trace layer ``i`` modulo the trace's layers; every layer of one forward takes
        the same next rows. The ids are copied to the device in each forward, so a CUDA graph
        would freeze one forward's choice: replay eager forwards only.
    popularity : array_like, shape (layers, E), optional
        With ``routing="popularity"``: each recorded layer's popularity, rows summing to the model's K
        (:func:`moesd.routing.sources.popularity`); model layer ``i`` draws from row ``i`` modulo the rows.
    seed : int
        Seed of the popularity draws: a generator of their own on a CPU; on CUDA the device's default
        generator is seeded (which a CUDA graph captures and advances at every replay, as uniform routing's).

    Attributes
    ----------
    forwards : collections.deque of list of torch.Tensor
        Per forward, the (tokens, K) expert ids of every MoE layer, in layer order, on the model's device.
    """

    def __init__(self, model, routing: str, keep: int = 1, trace=None, popularity=None, seed: int = 0):
        if routing not in ROUTINGS:
            raise ValueError(f"routing must be one of {', '.join(ROUTINGS)}, got {routing!r}")
        if isinstance(keep, bool) or int(keep) != keep or keep < 1:
            raise ValueError(f"keep must be a whole number >= 1, got {keep!r}")
        self.model, self.routers = model, moe_layers(model)
        self.first_layer = min(self.routers)
        self.routing, self.num_experts = routing, num_experts(model)
        self.forwards: deque = deque(maxlen=int(keep))
        self._handles = []
        self._replay, self._cursor, self._start = None, 0, 0
        if (routing == "trace") != (trace is not None):
            raise ValueError("a trace is replayed with routing 'trace', and routing 'trace' needs one")
        if trace is not None:
            self._replay = _replayed_ids(trace, self.num_experts, model.config.num_experts_per_tok)
        if (routing == "popularity") != (popularity is not None):
            raise ValueError("a popularity is drawn from with routing 'popularity', and routing 'popularity' needs one")
        self._popularity, self._generator = None, None
        if popularity is not None:
            self._popularity, self._generator = _popularity_draws(model, popularity, seed)

    def _hook(self, index: int):
        def route(module, inputs, output):
            if not (isinstance(output, tuple) and len(output) == 3):
                raise TypeError(f"{type(module).__name__} returns {type(output).__name__}, not the "
                                "(logits, weights, expert ids) this module replaces")
            logits, weights, ids = output
            if index == self.first_layer:
                self.forwards.append([])
                if self._replay is not None:  # every layer of this forward replays the same rows
                    self._start, self._cursor = self._cursor, (self._cursor + ids.shape[0]) % len(self._replay)
            if self.routing == "uniform":
                draws = torch.rand(ids.shape[0], self.num_experts, device=ids.device)
                ids = draws.topk(ids.shape[-1], dim=-1).indices  # K distinct experts, each subset equally likely
                weights = torch.full_like(weights, 1.0 / ids.shape[-1])
            elif self.routing == "trace":
                ids = self._next_rows(index, ids.shape[0], ids.device)
                weights = torch.full_like(weights, 1.0 / ids.shape[-1])
            elif self.routing == "popularity":
                p = self._popularity[index % self._popularity.shape[0]]
                ids = draw_by_popularity(p, ids.shape[0], ids.shape[-1], self._generator)
                weights = torch.full_like(weights, 1.0 / ids.shape[-1])
            self.forwards[-1].append(ids)
            return logits, weights, ids
        return route

    def _next_rows(self, index: int, tokens: int, device) -> torch.Tensor:
        """This forward's ``tokens`` rows of the trace for model layer ``index``."""
        rows = (self._start + np.arange(tokens)) % self._replay.shape[0]
        layer = self._replay[rows, index % self._replay.shape[1]]
        return torch.as_tensor(layer, dtype=torch.long, device=device)

    def __enter__(self) -> "RoutingControl":
        self._handles = [router.register_forward_hook(self._hook(index)) for index, router in self.routers.items()]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def mean_distinct(self, forwards=None) -> float:
        """Mean of :func:`distinct_experts` over ``forwards`` (default: every kept forward)."""
        forwards = list(self.forwards if forwards is None else forwards)
        if not forwards:
            raise ValueError("no forward has been recorded")
        return sum(distinct_experts(forward, self.num_experts) for forward in forwards) / len(forwards)


def _replayed_ids(trace, experts: int, top_k: int) -> np.ndarray:
    """The (tokens, layers, K) ids a trace replay takes: its decode tokens with every layer logged."""
    from moesd.routing.traces import MISSING

    if trace.num_experts != experts or trace.top_k != top_k:
        raise ValueError(f"the trace routes E = {trace.num_experts}, K = {trace.top_k}; the model has E = {experts}, "
                         f"K = {top_k} (set K to the trace's)")
    ids = np.asarray(trace.experts)
    keep = np.isin(np.asarray(trace.phase), ("decode", "unknown")) & ~(ids == MISSING).any(axis=(1, 2))
    if not keep.any():
        raise ValueError("the trace has no decode token logged in every layer")
    return ids[keep]


def _popularity_draws(model, popularity, seed: int):
    """The popularity as a float64 tensor on the model's device, checked, and the generator its draws use."""
    p = torch.as_tensor(np.asarray(popularity, dtype=np.float64))
    experts, top_k = num_experts(model), model.config.num_experts_per_tok
    if p.ndim != 2 or p.shape[1] != experts:
        raise ValueError(f"popularity must have shape (layers, {experts}) (E of this model), got {tuple(p.shape)}")
    if ((p < 0) | (p > 1)).any() or not torch.allclose(p.sum(dim=1), torch.full((p.shape[0],), float(top_k),
                                                                               dtype=torch.float64)):
        raise ValueError(f"each row of popularity must hold probabilities in [0, 1] summing to K = {top_k}")
    device = next(model.parameters()).device
    if device.type == "cuda":
        torch.cuda.default_generators[device.index or 0].manual_seed(int(seed))
        return p.to(device), None
    return p.to(device), torch.Generator(device=device).manual_seed(int(seed))


def draw_by_popularity(p: torch.Tensor, tokens: int, top_k: int, generator=None) -> torch.Tensor:
    """K distinct experts per token, expert ``e`` included with probability ``p_e``, tokens independent.

    Randomised systematic sampling: the experts in a fresh random order per token lay out intervals of
    lengths ``p_e`` end to end on [0, K); the points ``u, u + 1, ..., u + K - 1`` with one uniform ``u`` in
    [0, 1) pick the experts whose intervals hold them. Each ``p_e <= 1`` holds at most one point, so the K
    experts are distinct, and expert ``e`` is picked with probability exactly ``p_e``.

    Parameters
    ----------
    p : torch.Tensor, shape (E,)
        Inclusion probabilities in [0, 1] summing to ``top_k`` (float64 keeps the ends exact).
    tokens, top_k : int
        Tokens to route and experts per token.
    generator : torch.Generator, optional
        Generator of the draws (default: the device's).

    Returns
    -------
    torch.Tensor of int64, shape (tokens, top_k)
    """
    order = torch.rand(tokens, p.shape[0], device=p.device, generator=generator).argsort(dim=-1)
    ends = torch.cumsum(p[order], dim=-1)
    points = torch.rand(tokens, 1, device=p.device, generator=generator, dtype=p.dtype) + torch.arange(
        top_k, device=p.device, dtype=p.dtype)
    slot = torch.searchsorted(ends, points, right=True).clamp_(max=p.shape[0] - 1)  # a rounding overshoot: the last
    return order.gather(-1, slot)


def distinct_experts(forward: list, num_experts: int) -> float:
    """Distinct experts activated per MoE layer in one forward, averaged over its layers (N(t) measured).

    Parameters
    ----------
    forward : list of torch.Tensor
        The (tokens, K) expert ids of every MoE layer of one forward.
    num_experts : int
        E.

    Returns
    -------
    float
        Experts, in [1, min(tokens K, E)].
    """
    ids = torch.stack([layer.reshape(-1) for layer in forward]).long()
    hit = torch.zeros(ids.shape[0], num_experts, dtype=torch.bool, device=ids.device)
    hit.scatter_(1, ids, True)
    return float(hit.sum(dim=1, dtype=torch.float64).mean())
