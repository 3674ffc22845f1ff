"""Which models the predictor prices: names, records and draft heads built for a target.

:func:`resolve_model` turns a :mod:`moesd.zoo` name, a :class:`~moesd.zoo.ModelSpec` or an
:class:`~moesd.architecture.Architecture` into the Architecture the predictor prices; a zoo head (an MTP module, a
published EAGLE-3 head) comes back with ``head_of`` naming its target. :func:`one_layer_draft` and
:func:`eagle3_head` build draft heads of a target's shape for a cost estimate.

Pure Python; no torch.
"""

from __future__ import annotations

import dataclasses

from moesd._checks import UsageError, as_array
from moesd.architecture import Architecture
from moesd.zoo import DRAFT_HEADS, MODELS, ModelSpec, get_model

__all__ = ["resolve_model", "one_layer_draft", "eagle3_head"]


def resolve_model(model, argument: str = "model") -> Architecture:
    """An :class:`~moesd.architecture.Architecture` from a :mod:`moesd.zoo` name, a ``ModelSpec`` or itself.

    A zoo draft head (:data:`moesd.zoo.DRAFT_HEADS`, or a record with ``head_of``) keeps its target's name in
    ``Architecture.head_of``.

    Raises
    ------
    UsageError
        Naming ``argument``, for another name or object.
    """
    if isinstance(model, Architecture):
        return model
    if isinstance(model, ModelSpec):
        return _with_head(model.architecture(), model.head_of)
    if isinstance(model, str):
        head = DRAFT_HEADS.get(model.lower())
        if head is not None:
            return _with_head(eagle3_head(head.target, head.draft_vocab_size, head.intermediate_size), head.target)
        try:
            spec = get_model(model)
        except KeyError:
            raise UsageError(f"{argument} must be a moesd.zoo name "
                             f"({', '.join([*MODELS, *DRAFT_HEADS])}), got {model!r}", argument) from None
        return _with_head(spec.architecture(), spec.head_of)
    raise UsageError(f"{argument} must be a moesd.zoo name, ModelSpec or Architecture, "
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
                               moe_layers=1 if arch.moe_layers else 0, head_of=None,
                               sliding_layers=0)  # its one layer attends to the full context


def eagle3_head(model, draft_vocab_size: int = 32000, intermediate_size: int | None = None) -> Architecture:
    """An EAGLE-3 draft head for ``model``: one dense decoder layer of the target's width, its fc and its own vocabulary.

    As SpecForge's ``LlamaForCausalLMEagle3`` builds it: an ``fc`` of ``3 d x d`` fuses three of the target's
    hidden states, the layer's query, key and value projections read ``2 d`` values (the token's embedding
    and the fused state), its MLP has ``intermediate_size`` (default: the target's dense FFN width or, for a
    model without dense layers, its config's ``intermediate_size`` as the zoo reads it), and its LM head maps
    to ``draft_vocab_size`` tokens. The embedding is the target's (no weights of its own). For a cost
    estimate: acceptance is not modelled. The ``fc`` is counted with the MLP's weights (both are dense
    products over every token).
    """
    arch = resolve_model(model)
    if arch.attention != "gqa":
        raise UsageError(f"model: an EAGLE-3 head is built for GQA attention, {arch.name} "
                         f"has {arch.attention}", "model")
    d = arch.hidden_size
    width = int(as_array("intermediate_size", intermediate_size, low=1, whole=True)) if intermediate_size \
        else (arch.dense_ffn_params // (3 * d) if arch.dense_ffn_params else arch.expert_intermediate)
    vocabulary = int(as_array("draft_vocab_size", draft_vocab_size, low=1, whole=True))
    return dataclasses.replace(
        arch, name=f"EAGLE-3 head of {arch.name}", model_type="llama", num_layers=1, moe_layers=0, num_experts=0,
        top_k=0, q_params=2 * arch.q_params, kv_params=2 * arch.kv_params, router_params=0, expert_params=0,
        expert_intermediate=0, shared_params=0, dense_ffn_params=3 * d * width + 3 * d * d, sliding_window=None,
        sliding_layers=0, vocab_size=vocabulary, embedding_params=0, head_params=d * vocabulary,
        tied_embeddings=False, head_of=None)
