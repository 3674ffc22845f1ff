"""The engines: moesd's speculative decoding engine (a batched, lossless SD round over Hugging Face causal LMs, the KV
caches it decodes over, and the clocks that time it from outside), and vLLM as a library.

* :mod:`moesd.engine.sd` -- :class:`~moesd.engine.sd.SpeculativeDecoder` (its round: draft, verify, accept,
  keep what was accepted) and the plain-decoding baseline;
* :mod:`moesd.engine.static_cache` -- the slot layout both caches share, static caches and CUDA graphs;
* :mod:`moesd.engine.timing` -- timing from outside: a generation's rounds, one call, repeated calls;
* :mod:`moesd.engine.records` -- what a generation records and returns;
* :mod:`moesd.engine.vllm` -- vLLM imported with its CPU environment, models saved where it loads them, its
  spec-decode counters.

The studies that use the engines (protocol, sweeps, result files, regime) live in :mod:`moesd.measure`, the routing
captured through them in :mod:`moesd.routing`; nothing here imports either. Importing this package imports no torch.
"""


def round_source(stage=None) -> str:
    """The source of one round of the engine, :meth:`moesd.engine.sd.SpeculativeDecoder.round`, dedented; or, given
    one of the functions the round calls (``stage``, e.g. :func:`moesd.engine.sd.draft`), that function's.

    Read from the package with :mod:`inspect`, so that a chapter shows the code that runs and cannot drift
    from it.
    """
    import inspect
    import textwrap

    from moesd.engine.sd import SpeculativeDecoder

    return textwrap.dedent(inspect.getsource(SpeculativeDecoder.round if stage is None else stage))
