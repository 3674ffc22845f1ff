"""The memory a timing sweep takes at once: the KV cache positions it keeps (:func:`cached_tokens`), its two
models' weights and caches (:func:`memory_needed`), and the refusal of a sweep that cannot fit a device
(:func:`check_memory`). Counted analytically from the models' shapes, without importing torch.
"""

from __future__ import annotations

from moesd._checks import UsageError
from moesd.measure.sweep_checks import checkpoint_config, positions
from moesd.measure.sweeps import DTYPE_BYTES, FORWARD_STUDIES, SweepConfig
from moesd.zoo import get_model


def memory_needed(config: SweepConfig) -> dict:
    """The least memory a sweep's two models take at once: their weights and KV caches, in bytes.

    The weights are those of the shapes the sweep builds (its layers, width and vocabulary; the
    checkpoint's shape with pretrained weights, read from the ``config.json`` of ``target_path`` or
    ``draft_path`` where given), counted analytically; the caches hold :func:`cached_tokens` positions.
    Activations, logits and the allocator's slack come on top.

    Returns
    -------
    dict
        ``weights``, ``kv_cache`` and ``total`` bytes.
    """
    from moesd.architecture import Architecture

    def shape(name, layers, vocab, path):
        spec = get_model(name)
        if path is not None:  # a local checkpoint: its own shape
            return Architecture.from_config(spec.name, spec.model_type, checkpoint_config(name, path))
        values = spec.config_dict(layers, None, config.width)
        return Architecture.from_config(spec.name, spec.model_type, {**values, **({"vocab_size": vocab} if vocab else {})})

    target = shape(config.target, config.layers, config.vocab_size, config.target_path)
    draft = shape(config.draft, config.draft_layers, target.vocab_size, config.draft_path)
    weights = sum(model.weight_counts()["total"] for model in (target, draft)) * DTYPE_BYTES[config.dtype]
    cache = (sum(model.kv_values_per_token * model.num_layers for model in (target, draft)) * cached_tokens(config)
             * DTYPE_BYTES[config.dtype])
    return {"weights": weights, "kv_cache": cache, "total": weights + cache}


def check_memory(config: SweepConfig, memory_bytes: float, device: str) -> None:
    """Refuse a sweep whose weights and KV caches alone (:func:`memory_needed`) exceed ``memory_bytes``.

    Raises
    ------
    UsageError
        Naming the estimate, the memory of ``device`` and the settings that set the cache.
    """
    need = memory_needed(config)
    if need["total"] > memory_bytes:
        raise UsageError(f"the sweep needs at least {need['total'] / 1e9:.3g} GB ({need['weights'] / 1e9:.3g} GB of "
                         f"weights, {need['kv_cache'] / 1e9:.3g} GB of KV cache for {cached_tokens(config)} cached "
                         f"tokens), more than the {memory_bytes / 1e9:.3g} GB of {device}; lower batch sizes, "
                         "context or rounds, or keep fewer layers")


def cached_tokens(config: SweepConfig) -> int:
    """The most token positions a study keeps in each model's KV cache at once, summed over sequences.

    A forward study keeps a filled cache for every batch size at once (``context`` tokens plus room
    for the longest pass); an e2e-type study one batch at a time, the largest growing by up to
    ``gamma + 1`` tokens per round over its warm-up and timed rounds.
    """
    return (sum(config.batch_sizes) if config.study in FORWARD_STUDIES else max(config.batch_sizes)) * positions(config)
