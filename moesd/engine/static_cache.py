"""The KV caches the engine decodes over: the slot layout they share, and static caches run eagerly or
replayed as CUDA graphs.

**The slot layout** (:class:`SlotLayout`). The speculative decoding engine (:mod:`moesd.engine.sd`) keeps
one layout of *slots* for a batch, shared by the target's and the draft's KV caches, dynamic or static.
A slot is one column of every sequence's cache: slot ``j`` of sequence ``b`` holds the token
``tokens[b, j]`` at position ``positions[b, j]``, and attention sees it where ``mask[b, j]`` is 1. Slots are
appended a column at a time for the whole batch, so every sequence has the same number of slots
(``length``); a slot that must not be seen (left padding, a rejected draft token) stays in the caches as a
hole in the mask. Positions count only the slots attention sees, so every sequence gets the positions plain
decoding would give it. A cached model (:class:`StaticCacheModel` here, ``DynamicCacheModel`` in
:mod:`moesd.engine.sd`) covers slots ``[0, length)`` and runs a forward over the slots after them.

**Static caches and CUDA graphs.** A CUDA graph replays a fixed list of kernels on fixed memory: it removes
the launch cost that an eager small-batch step pays on a GPU (the paper's engine, vLLM, captures its decode
steps the same way), but it needs static shapes and no host synchronisation inside the forward.
Transformers' ``StaticCache`` gives both: it holds ``max_cache_len`` slots per sequence and writes each
forward's keys at a device counter (``cumulative_length``) that the forward advances, so a forward of ``s``
new tokens is the same kernels wherever the cache stands. The causal mask is passed ready-made as a 4D
boolean over all slots (transformers would otherwise read the cache's length back to the host).

Two users:

* the forward study times one forward of ``s`` tokens after ``context`` cached ones, again and again
  (:func:`static_step` rewinds the cache first; :class:`GraphStep` replays it as a graph);
* the speculative decoding engine decodes over :class:`StaticCaches`: one static cache per model and
  batch, whose forwards of each number of new tokens are captured once and replayed at every round, so
  that the AR baseline and every SD run of a study point share them.
"""

from __future__ import annotations

import torch


class SlotLayout:
    """The slots of a generation, shared by the target's and the draft's KV caches (see the module's notes).

    Parameters
    ----------
    input_ids, attention_mask : torch.Tensor
        [batch, prompt] the prompts (left-padded) and 1 on their tokens, 0 on padding: the first slots.
    capacity : int
        Slots per sequence, at least the prompt's (a static cache's slots, or exactly the generation's).

    Attributes
    ----------
    tokens, mask, positions : torch.Tensor
        [batch, capacity] long: the token of each slot, 1 where attention sees it, its position.
    length : int
        Slots filled so far, the same for every sequence.
    """

    def __init__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, capacity: int):
        batch, prompt = input_ids.shape
        self.tokens = torch.zeros(batch, capacity, dtype=torch.long, device=input_ids.device)
        self.mask = torch.zeros_like(self.tokens)
        self.positions = torch.zeros_like(self.tokens)
        self.tokens[:, :prompt] = input_ids
        self.mask[:, :prompt] = attention_mask
        self.positions[:, :prompt] = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        self.length = prompt

    @property
    def capacity(self) -> int:
        """Slots per sequence."""
        return self.tokens.shape[1]

    def append(self, tokens: torch.Tensor, positions: torch.Tensor) -> None:
        """Fill the next slot of every sequence with ``tokens`` [batch] at ``positions`` [batch], seen by attention."""
        self.tokens[:, self.length] = tokens
        self.mask[:, self.length] = 1
        self.positions[:, self.length] = positions
        self.length += 1

    def keep_first(self, start: int, stop: int, kept: torch.Tensor) -> None:
        """Of slots ``[start, stop)``, attention sees the first ``kept[b]`` of sequence ``b`` and no others."""
        offsets = torch.arange(stop - start, device=kept.device)
        self.mask[:, start:stop] = offsets < kept[:, None]

    def attention(self, start: int, stop: int, width: int | None = None) -> torch.Tensor:
        """[batch, 1, stop - start, width] boolean: which of the first ``width`` slots (default: all) each of
        slots ``[start, stop)`` attends to (the earlier slots attention sees, and itself).

        Passed as the attention mask of a forward (scaled-dot-product attention's format), it is used as it
        is: transformers builds none of its own.
        """
        width = self.capacity if width is None else width
        rows = torch.arange(start, stop, device=self.tokens.device)[:, None]
        columns = torch.arange(width, device=rows.device)
        return (columns <= rows) & (self.mask[:, None, None, :width].bool() | (columns == rows))


def filled_cache(model, batch: int, context: int, device: str, static_tokens: int | None = None):
    """The KV cache of ``batch`` random prompts of ``context`` tokens: dynamic, or static with room for
    ``static_tokens`` more tokens per sequence."""
    generator = torch.Generator().manual_seed(batch)
    ids = torch.randint(1, model.config.vocab_size, (batch, context), generator=generator).to(device)
    if static_tokens is None:
        return model(input_ids=ids, use_cache=True).past_key_values
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=context + static_tokens)
    model(input_ids=ids, past_key_values=cache, use_cache=True)
    return cache


def rewind(cache, length: int) -> None:
    """Set a static cache back to ``length`` tokens per sequence (the slots after it are written again).

    Transformers 5 counts a static layer's tokens in a device tensor (``cumulative_length``) that each
    update advances.
    """
    for layer in cache.layers:
        counter = getattr(layer, "cumulative_length", None)
        if not isinstance(counter, torch.Tensor):
            raise RuntimeError(f"cannot rewind a {type(layer).__name__}: this transformers version keeps no device "
                               "counter of its tokens (timed forwards over a static cache need one)")
        counter.fill_(length)


def static_forward(model, cache, new: torch.Tensor, context: int) -> torch.Tensor:
    """One forward of ``new`` (B x s tokens) over a static cache holding ``context`` tokens; the logits.

    The causal mask over the cache's slots is passed ready-made (4D, boolean): transformers then
    uses it as it is, where building one itself would read the cache's length back to the host
    (``q_offset == 0`` in ``masking_utils``, and OPT's ``torch.ones`` of a tensor length), which a
    CUDA graph cannot capture. Attention covers all ``max_cache_len`` slots, those past the new tokens
    masked. Rewind the cache (:func:`rewind`) before each call.
    """
    batch, tokens = new.shape
    positions = torch.arange(context, context + tokens, device=new.device)
    slots = torch.arange(cache.layers[0].max_cache_len, device=new.device)
    mask = (slots <= positions[:, None]).expand(batch, 1, tokens, -1)
    return model(input_ids=new, attention_mask=mask, past_key_values=cache, use_cache=True,
                 position_ids=positions.expand(batch, -1)).logits


def static_step(model, cache, new: torch.Tensor, context: int) -> torch.Tensor:
    """:func:`static_forward` after rewinding the cache to ``context`` tokens: repeatable, every call
    writes the same slots and sees the same keys. Returns the logits."""
    rewind(cache, context)
    return static_forward(model, cache, new, context)


_side_stream = None


def _warm_up(run, before) -> None:
    """Three eager runs on a side stream, each after ``before()``: the warm-up PyTorch's documentation
    of ``torch.cuda.graph`` asks for before a capture."""
    global _side_stream
    if _side_stream is None:
        _side_stream = torch.cuda.Stream()
    _side_stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(_side_stream):
        for _ in range(3):
            before()
            run()
    torch.cuda.current_stream().wait_stream(_side_stream)
    before()


class GraphStep:
    """A forward over a static cache captured as a CUDA graph: call :meth:`prepare`, then :meth:`replay`.

    The warm-up runs first, then the capture and one untimed replay (the first launch of a graph also
    uploads it). The rewind runs eagerly before each replay, outside the graph, so a timed replay
    holds the forward's kernels only. A study captures each forward once and replays it in every
    repeat, its graphs sharing the memory pool of the first (``pool``: another live graph's
    :attr:`pool`; they are replayed one at a time, and what one replay leaves in the pool, the logits
    included, is never read). A pool lives as long as a graph that uses it.
    """

    def __init__(self, model, cache, new: torch.Tensor, context: int, pool=None):
        self.cache, self.context = cache, context
        _warm_up(lambda: static_forward(model, cache, new, context), self.prepare)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.logits = static_forward(model, cache, new, context)
        self.pool = self.graph.pool()
        self.prepare()
        self.graph.replay()
        torch.cuda.synchronize()

    def prepare(self) -> None:
        """Rewind the cache (a device operation), so that the next replay writes the same slots."""
        rewind(self.cache, self.context)

    def replay(self) -> None:
        self.graph.replay()


class StaticCaches:
    """The static KV caches of a decoding engine, one per model and batch size, with their CUDA graphs.

    Parameters
    ----------
    capacity : int
        Slots per sequence of every cache: at least the prompt's plus every slot the generations
        append (:class:`moesd.engine.sd.SpeculativeDecoder` appends ``gamma + 1`` a round). Attention
        covers all of them in every forward (the later ones masked), whatever the generation.
    cuda_graphs : bool, default False
        Replay every forward after the prefill as a CUDA graph, captured at the first forward of each
        number of new tokens (on a CUDA device only). False: the same forwards, run eagerly.
    routing : moesd.measure.router_control.RoutingControl, optional
        The routing control installed on an MoE model: a replay runs no Python hook, so after each
        replay of that model's graphs the expert ids the graph wrote are appended to the control's
        ``forwards`` (as the hooks do for an eager forward).

    Notes
    -----
    The caches and graphs live as long as this object: build one per study point (batch size), so
    that its AR run and its SD runs at every gamma share the captures. The graphs of all models
    share one memory pool; they are replayed one at a time and the logits are copied out at once.
    """

    def __init__(self, capacity: int, cuda_graphs: bool = False, routing=None):
        if isinstance(capacity, bool) or int(capacity) != capacity or capacity < 2:
            raise ValueError(f"capacity must be a whole number of slots >= 2, got {capacity!r}")
        self.capacity, self.cuda_graphs, self.routing = int(capacity), bool(cuda_graphs), routing
        self.pool = None
        self._models: dict = {}

    def bind(self, model, batch: int) -> StaticCacheModel:
        """``model``'s cache for ``batch`` sequences, emptied for a new generation."""
        key = (id(model), batch)
        if key not in self._models:
            self._models[key] = StaticCacheModel(model, self)
        bound = self._models[key]
        bound.length = 0
        return bound


class StaticCacheModel(torch.nn.Module):
    """A model and its static cache within :class:`StaticCaches`; the cache covers slots [0, length).

    Calling it runs :meth:`forward`, as the engine's dynamic-cache model does (a module: forward hooks see
    every forward, a replayed graph's too).
    """

    def __init__(self, model, caches: StaticCaches):
        from transformers import StaticCache

        super().__init__()
        self.model, self.caches, self.length = model, caches, 0
        self.cache = StaticCache(config=model.config, max_cache_len=caches.capacity)
        self.graphs: dict = {}  # (new tokens, last only) -> (graph, input buffers, logits, the routing ids it writes)
        routing = caches.routing
        self.routing = routing if routing is not None and routing.model is model else None

    def forward(self, slots: SlotLayout, stop: int | None = None, last_only: bool = False) -> torch.Tensor:
        """Float logits [batch, new, V] of slots [length, stop) (default: up to the newest slot), which the
        cache then holds; with ``last_only``, of the last of them alone ([batch, 1, V])."""
        start, stop = self.length, slots.length if stop is None else stop
        if slots.capacity != self.caches.capacity:
            raise ValueError(f"the slot layout has {slots.capacity} slots, the static caches {self.caches.capacity}")
        inputs = (slots.tokens[:, start:stop], slots.positions[:, start:stop], slots.attention(start, stop))
        if start == 0:
            rewind(self.cache, 0)  # a new generation: its prefill runs eagerly
        if start == 0 or not self.caches.cuda_graphs:
            logits = self._run(*inputs, last_only=last_only)
        else:
            logits = self._replay((stop - start, last_only), inputs, start)
        self.length = stop
        return logits.float()

    def _run(self, ids, positions, mask, last_only: bool = False) -> torch.Tensor:
        return self.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=self.cache,
                          use_cache=True, logits_to_keep=1 if last_only else 0).logits

    def _replay(self, shape: tuple, inputs: tuple, start: int) -> torch.Tensor:
        """Replay the graph of forwards of ``shape`` (new tokens, last logits only), captured at its first."""
        if shape not in self.graphs:
            self.graphs[shape] = self._capture(inputs, start, shape[1])
        graph, buffers, logits, routed = self.graphs[shape]
        for buffer, value in zip(buffers, inputs):
            buffer.copy_(value)
        graph.replay()
        if routed is not None:
            self.routing.forwards.append(torch.stack(routed))  # this replay's ids, (layers, tokens, K)
        return logits

    def _capture(self, inputs: tuple, start: int, last_only: bool) -> tuple:
        """A graph of the forward of ``inputs``' tokens from slot ``start``; its cache rewound to ``start``."""
        buffers = tuple(value.clone() for value in inputs)
        _warm_up(lambda: self._run(*buffers, last_only=last_only), lambda: rewind(self.cache, start))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.caches.pool):
            logits = self._run(*buffers, last_only=last_only)
        routed = self.routing.forwards[-1] if self.routing is not None else None  # the graph's own id tensors
        self.caches.pool = graph.pool()
        rewind(self.cache, start)
        return graph, buffers, logits, routed
