"""Which models the predictor prices: names, records and config files.

:func:`resolve_model` turns a :mod:`moesd.zoo` name, a :class:`~moesd.zoo.ModelSpec`, a ``config.json`` path (read
offline, :func:`moesd.architecture.read_config`) or an :class:`~moesd.architecture.Architecture` into the
Architecture the predictor prices; a zoo head (an MTP module, a published EAGLE-3 head) comes back with ``head_of``
naming its target. :func:`one_layer_draft` builds a draft of one layer of a target's shape; the draft heads built for
a target are :mod:`moesd.predictor.drafters`'.

Pure Python; no torch.
"""

from __future__ import annotations

import dataclasses
import os

from moesd._checks import UsageError
from moesd.architecture import Architecture, read_config
from moesd.zoo import DRAFT_HEADS, MODELS, ModelSpec, get_model

__all__ = ["resolve_model", "is_config_path", "one_layer_draft"]


def is_config_path(text: str) -> bool:
    """Whether ``text`` names a ``config.json`` file or a folder holding one (rather than a zoo name)."""
    return text.endswith(".json") or os.sep in text or os.path.isdir(text)


def resolve_model(model, argument: str = "model") -> Architecture:
    """An :class:`~moesd.architecture.Architecture` from a :mod:`moesd.zoo` name, a ``ModelSpec``, a ``config.json``
    path or itself.

    A zoo draft head (:data:`moesd.zoo.DRAFT_HEADS`, or a record with ``head_of``) keeps its target's name in
    ``Architecture.head_of``; a published EAGLE-3 head is built by :func:`moesd.predictor.drafters.resolve_draft`.

    Raises
    ------
    UsageError
        Naming ``argument``, for another name or object; naming the config's key (``config.<key>``) for a
        ``config.json`` the predictor cannot price.
    """
    if isinstance(model, Architecture):
        return model
    if isinstance(model, ModelSpec):
        if model.head_of is not None and model.name in MODELS:
            return resolve_model(model.name, argument)
        return _with_head(model.architecture(), model.head_of)
    if isinstance(model, str):
        if model.lower() in DRAFT_HEADS:
            from moesd.predictor.drafters import resolve_draft

            return resolve_draft(model, DRAFT_HEADS[model.lower()].target, argument)
        try:
            spec = get_model(model)
        except KeyError:
            if is_config_path(model):
                try:
                    return read_config(model)
                except UsageError as error:  # the key it cannot price is in the message; the argument is ours
                    raise UsageError(f"{argument}: {error.message}", argument) from None
            raise UsageError(f"{argument} must be a moesd.zoo name "
                             f"({', '.join([*MODELS, *DRAFT_HEADS])}) or a config.json path, got {model!r}",
                             argument) from None
        if spec.head_of is not None:  # an MTP module: priced with its fusing projection
            from moesd.predictor.drafters import resolve_draft

            return resolve_draft(spec.name, spec.head_of, argument)
        return spec.architecture()
    raise UsageError(f"{argument} must be a moesd.zoo name, a config.json path, a ModelSpec or an Architecture, "
                     f"got {type(model).__name__}", argument)


def _with_head(arch: Architecture, target: str | None) -> Architecture:
    """``arch`` marked as a draft head of the zoo model ``target`` (unchanged for None)."""
    return arch if target is None else dataclasses.replace(arch, head_of=target)


def one_layer_draft(model) -> Architecture:
    """A draft of one decoder layer of the target's own shape, routed experts included, sharing its vocabulary.

    The size of a multi-token-prediction module (DeepSeek-V3's is one such layer) or of a one-layer
    EAGLE-style head with the target's FFN; for a cost estimate only (its acceptance is not modelled).
    Its layer attends to the full context, even where the target has sliding-window layers.
    """
    arch = resolve_model(model)
    return dataclasses.replace(arch, name=f"{arch.name} (one-layer draft)", num_layers=1,
                               moe_layers=1 if arch.moe_layers else 0, head_of=None, sliding_layers=0,
                               linear_layers=0)  # its one layer attends to the full context
