"""Which models the predictor prices: names, records, config files, and the drafters built for a target.

:func:`resolve_model` turns a :mod:`moesd.zoo` name, a :class:`~moesd.zoo.ModelSpec`, a ``config.json`` path (read
offline, :func:`moesd.architecture.read_config`) or an :class:`~moesd.architecture.Architecture` into the
Architecture the predictor prices; a zoo head (an MTP module, a published EAGLE-3 head) comes back with ``head_of``
naming its target. :func:`one_layer_draft` builds a draft of one layer of a target's shape.

A separate draft model is an :class:`~moesd.architecture.Architecture` of its own; the drafters here draft from the
target itself, so they are built from its dimensions (or from the head's ``config.json``) and keep its name in
``Architecture.head_of``:

* :func:`mtp_head`: the target's multi-token-prediction module, one decoder layer of its shape and a fusing
  projection of ``2 d x d`` (DeepSeek's ``eh_proj``, Qwen3-Next's ``fc``), sharing its embedding and LM head;
  refused for a target whose config declares none.
* :func:`eagle_head` (EAGLE-1 and EAGLE-2, which share the head) and :func:`eagle3_head`: one dense decoder layer of
  the target's width with an ``fc`` fusing ``2 d`` (EAGLE-1/2) or ``3 d`` (EAGLE-3) values; for a target with latent
  attention (MLA) the layer has Llama attention with the target's heads of its value width.
* :func:`medusa_heads`: ``K`` Medusa heads, each a residual block and an LM head, which propose ``K`` positions in
  one pass over the target's last hidden state.
* :data:`NGRAM`: an n-gram (prompt-lookup) drafter, which matches the last tokens against the context on the host:
  no weights and no GPU pass, so its draft cost is taken as zero; its acceptance is what the text gives.

:func:`resolve_draft` turns what ``--draft`` takes (a zoo name, a head's name, a keyword of :data:`DRAFTERS`, a
``config.json`` path) into the Architecture. Pure Python; no torch.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from moesd._checks import UsageError, as_array
from moesd.architecture import Architecture, read_config
from moesd.zoo import DRAFT_HEADS, MODELS, ModelSpec, get_model

__all__ = ["resolve_model", "is_config_path", "one_layer_draft", "DRAFTERS", "MEDUSA_HEADS", "NGRAM", "mtp_head",
           "eagle_head", "eagle3_head", "medusa_heads", "ngram_drafter", "head_from_config", "resolve_draft"]


def is_config_path(text: str) -> bool:
    """Whether ``text`` names a ``config.json`` file or a folder holding one (rather than a zoo name)."""
    return text.endswith(".json") or os.sep in text or os.path.isdir(text)


def resolve_model(model, argument: str = "model") -> Architecture:
    """An :class:`~moesd.architecture.Architecture` from a :mod:`moesd.zoo` name, a ``ModelSpec``, a ``config.json``
    path or itself.

    A zoo draft head (:data:`moesd.zoo.DRAFT_HEADS`, or a record with ``head_of``) keeps its target's name in
    ``Architecture.head_of``; a published EAGLE-3 head is built by :func:`resolve_draft`.

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


# ---- Drafters built for a target ----------------------------------------------------------------------------------

DRAFTERS = {
    "mtp": "the target's own multi-token-prediction module (its config must declare one)",
    "eagle": "an EAGLE-1/2 head built from the target's dimensions (EAGLE-2 differs in its tree, not its head)",
    "eagle3": "an EAGLE-3 head built from the target's dimensions, 32000 draft tokens",
    "medusa": "Medusa heads on the target's last hidden state (medusa:K for K heads; default 4)",
    "ngram": "an n-gram / prompt-lookup drafter: no model, draft cost taken as zero",
}
"""Drafter keywords ``--draft`` takes, and what each builds."""

MEDUSA_HEADS = 4
"""Medusa heads when none are given: ``MedusaConfig``'s default ``medusa_num_heads`` (FasterDecoding/Medusa
``medusa/model/medusa_model.py``, commit 11af0aa)."""

NGRAM = Architecture(
    name="n-gram drafter", model_type="ngram", hidden_size=1, num_layers=0, moe_layers=0, vocab_size=1,
    num_experts=0, top_k=0, attention="gqa", num_heads=0, num_kv_heads=0, q_params=0, kv_params=0, o_params=0,
    replicated_attention_params=0, kv_values_per_token=0, attention_flops_per_key=0, sliding_window=None,
    sliding_layers=0, router_params=0, expert_params=0, expert_intermediate=0, shared_params=0, dense_ffn_params=0,
    norm_params=0, final_norm_params=0, embedding_params=0, head_params=0, tied_embeddings=False, drafter="ngram")
"""The n-gram (prompt-lookup) drafter as a record with no weights: vLLM's ``ngram`` method matches the last
``prompt_lookup_min``-``prompt_lookup_max`` tokens against the request's tokens on the host (vLLM docs, "N-gram
speculative decoding"; ``vllm/v1/spec_decode/ngram_proposer.py``), so no GPU pass drafts; the predictor prices its
draft steps at zero. Its acceptance is the text's (repetitive code and retrieval accept more): give it as measured."""


def ngram_drafter(target) -> Architecture:
    """:data:`NGRAM` for ``target``: its vocabulary (the drafts are the context's own tokens) and its name."""
    arch = resolve_model(target, "target")
    return dataclasses.replace(NGRAM, vocab_size=arch.vocab_size, hidden_size=arch.hidden_size, head_of=arch.name)


def _attention_dims(arch: Architecture) -> tuple[int, int, int]:
    """Query heads, KV heads and head width of a Llama attention that stands for ``arch``'s in a head: its own for GQA;
    for MLA its query heads, as many KV heads, of its value width (the rule that gives SpecForge's Kimi-K2 EAGLE-3
    head, configs/kimi-k2-eagle3.json: 64 heads of 128 for Kimi-K2's 64 heads of v_head_dim 128)."""
    if arch.attention == "mla":
        width = arch.o_params // (arch.num_heads * arch.hidden_size)
        return arch.num_heads, arch.num_heads, width
    return arch.num_heads, arch.num_kv_heads, arch.kv_values_per_token // (2 * arch.num_kv_heads)


def _dense_width(arch: Architecture, intermediate_size) -> int:
    """The head's MLP width: ``intermediate_size``, else the target's dense FFN width or, without dense layers, its
    routed experts' (the config's ``intermediate_size`` as the zoo reads it)."""
    if intermediate_size:
        return int(as_array("intermediate_size", intermediate_size, low=1, whole=True))
    return arch.dense_ffn_params // (3 * arch.hidden_size) if arch.dense_ffn_params else arch.expert_intermediate


def _head_layer(target: Architecture, name: str, drafter: str, inputs: int, heads: int, kv_heads: int,
                head_dim: int, width: int, fuse: int, vocab: int) -> Architecture:
    """One dense Llama decoder layer of ``target``'s width for a head: attention reading ``inputs x d`` values, an MLP
    of ``width``, a fusing projection of ``fuse`` weights (counted with the MLP), an LM head over ``vocab`` tokens."""
    d = target.hidden_size
    return dataclasses.replace(
        target, name=name, model_type="llama", num_layers=1, moe_layers=0, num_experts=0, top_k=0, attention="gqa",
        num_heads=heads, num_kv_heads=kv_heads, q_params=inputs * d * heads * head_dim,
        kv_params=2 * inputs * d * kv_heads * head_dim, o_params=heads * head_dim * d, replicated_attention_params=0,
        kv_values_per_token=2 * kv_heads * head_dim, attention_flops_per_key=4 * heads * head_dim,
        sliding_window=None, sliding_layers=0, router_params=0, expert_params=0, expert_intermediate=0,
        shared_params=0, dense_ffn_params=3 * d * width + fuse, norm_params=2 * d, final_norm_params=d,
        vocab_size=vocab, embedding_params=0, head_params=d * vocab, tied_embeddings=False, head_of=target.name,
        linear_layers=0, linear_params=0, linear_state_values=0, index_topk=0, index_values_per_token=0,
        index_flops_per_key=0, index_params=0, mtp_layers=0, drafter=drafter, draft_positions=0,
        borrowed_params=d * vocab if drafter == "eagle" else 0)  # EAGLE-1/2 read the target's LM head


def eagle_head(model, intermediate_size: int | None = None) -> Architecture:
    """An EAGLE-1/2 head for ``model``: one decoder layer of its width after an ``fc`` of ``2 d x d`` (and bias) that
    fuses the token's embedding and the target's feature (SafeAILab/EAGLE ``eagle/model/cnets.py``), reading the
    target's embedding and LM head (EAGLE-2 keeps EAGLE-1's head and changes the tree). Its MLP width is
    ``intermediate_size`` or :func:`_dense_width`'s."""
    arch = resolve_model(model)
    d = arch.hidden_size
    return _head_layer(arch, f"EAGLE head of {arch.name}", "eagle", 1, *_attention_dims(arch),
                       _dense_width(arch, intermediate_size), 2 * d * d + d, arch.vocab_size)


def eagle3_head(model, draft_vocab_size: int = 32000, intermediate_size: int | None = None,
                config: dict | None = None) -> Architecture:
    """An EAGLE-3 draft head for ``model``: one dense decoder layer of the target's width, its fc and its own vocabulary.

    As SpecForge's ``LlamaForCausalLMEagle3`` builds it: an ``fc`` of ``3 d x d`` fuses three of the target's hidden
    states, the layer's query, key and value projections read ``2 d`` values (the token's embedding and the fused
    state), its MLP has ``intermediate_size`` (default :func:`_dense_width`), and its LM head maps to
    ``draft_vocab_size`` tokens; the embedding is the target's. Attention is the target's (:func:`_attention_dims`,
    Llama attention of the target's heads for MLA) unless ``config`` (the head's ``config.json`` keys) gives its heads
    (``num_attention_heads``, ``num_key_value_heads``, ``head_dim``), MLP width and draft vocabulary. For a cost
    estimate: acceptance is not modelled. The ``fc`` is counted with the MLP's weights.
    """
    arch = resolve_model(model)
    d = arch.hidden_size
    heads, kv_heads, head_dim = _attention_dims(arch)
    if config:
        if config.get("hidden_size", d) != d:
            raise UsageError(f"draft: the head's config has hidden_size {config['hidden_size']}, its target "
                             f"{arch.name} {d}: a head reads its own target's hidden states", "draft")
        heads = config.get("num_attention_heads", heads)
        kv_heads = config.get("num_key_value_heads", heads)
        head_dim = config.get("head_dim") or d // heads
        intermediate_size = intermediate_size or config.get("intermediate_size")
        draft_vocab_size = config.get("draft_vocab_size") or config.get("vocab_size") or draft_vocab_size
    vocabulary = int(as_array("draft_vocab_size", draft_vocab_size, low=1, whole=True))
    return _head_layer(arch, f"EAGLE-3 head of {arch.name}", "eagle3", 2, heads, kv_heads, head_dim,
                       _dense_width(arch, intermediate_size), 3 * d * d, vocabulary)


def medusa_heads(model, heads: int = MEDUSA_HEADS) -> Architecture:
    """``heads`` Medusa heads for ``model``, which propose ``heads`` positions in one pass over its last hidden state.

    Each head is a residual block (a ``d x d`` linear layer with bias, SiLU) and an LM head of ``d x V``
    (FasterDecoding/Medusa ``medusa/model/medusa_model.py``: ``ResBlock`` and ``nn.Linear(hidden_size, vocab_size)``
    per head; one block per head, ``medusa_num_layers`` 1). No attention, no KV cache of their own.
    """
    arch = resolve_model(model)
    count = int(as_array("medusa heads", heads, low=1, high=64, whole=True))
    d, vocab = arch.hidden_size, arch.vocab_size
    return dataclasses.replace(
        NGRAM, name=f"{count} Medusa heads of {arch.name}", model_type="medusa", hidden_size=d, num_layers=1,
        vocab_size=vocab, dense_ffn_params=count * (d * d + d), head_params=count * d * vocab, head_of=arch.name,
        drafter="medusa", draft_positions=count)


def mtp_head(model) -> Architecture:
    """The multi-token-prediction module of ``model`` as its config declares it: one decoder layer of its shape with
    routed experts where it has them and softmax attention over the whole context (DeepSeek-V3's and GLM's MTP layer
    is a main layer; Qwen3-Next's and MiniMax-M2's a full-attention layer), a ``2 d x d`` projection fusing the
    token's embedding and the target's hidden state, and three norms, sharing the embedding and LM head
    (README_WEIGHTS.md of deepseek-ai/DeepSeek-V3; vLLM ``qwen3_next_mtp.py``'s ``fc``).

    Raises
    ------
    UsageError
        Naming ``draft``, for a target whose config declares no MTP module.
    """
    arch = resolve_model(model)
    if not arch.mtp_layers:
        raise UsageError(f"draft: {arch.name}'s config declares no multi-token-prediction module "
                         f"(num_nextn_predict_layers, mtp_num_hidden_layers or num_mtp_modules); use an EAGLE head "
                         f"(--draft eagle3) or a draft model", "draft")
    d = arch.hidden_size
    return dataclasses.replace(
        arch, name=f"MTP module of {arch.name}", num_layers=1, moe_layers=1 if arch.moe_layers else 0,
        sliding_layers=0, linear_layers=0, linear_params=0, linear_state_values=0, head_of=arch.name,
        dense_ffn_params=arch.dense_ffn_params if not arch.moe_layers else 0, mtp_layers=0, drafter="mtp",
        norm_params=arch.norm_params + 2 * d, fuse_params=2 * d * d,
        borrowed_params=arch.embedding_params + arch.head_params)


def head_from_config(config: dict, target, argument: str = "draft") -> Architecture | None:
    """The head a drafter's ``config.json`` describes for ``target``: an EAGLE-3 head (``architectures`` naming
    ``Eagle3``), an EAGLE head (``Eagle``) or Medusa heads (``medusa_num_heads``); None for a model of its own."""
    kinds = " ".join(config.get("architectures") or []).lower()
    if "eagle3" in kinds:
        return eagle3_head(target, config=config)
    if "eagle" in kinds:
        return eagle_head(target, config.get("intermediate_size"))
    if config.get("medusa_num_heads"):
        return medusa_heads(target, config["medusa_num_heads"])
    return None


def _keyword(draft: str, target: Architecture, argument: str) -> Architecture | None:
    """The drafter a keyword of :data:`DRAFTERS` names (``medusa:K`` for K heads), None for another string."""
    kind, _, count = draft.lower().partition(":")
    if kind in ("eagle", "eagle1", "eagle2"):
        return eagle_head(target)
    builders = {"mtp": mtp_head, "eagle3": eagle3_head, "ngram": ngram_drafter}
    if kind in builders and not count:
        return builders[kind](target)
    if kind == "medusa":
        try:
            return medusa_heads(target, int(count) if count else MEDUSA_HEADS)
        except ValueError:
            raise UsageError(f"{argument}: medusa:K takes a whole number of heads K, got {draft!r}", argument) from None
    return None


def resolve_draft(draft, target, argument: str = "draft") -> Architecture:
    """The draft's Architecture for ``target``: a drafter keyword of :data:`DRAFTERS`, a published EAGLE-3 head of
    :data:`moesd.zoo.DRAFT_HEADS` (built from its config), a zoo MTP module such as ``deepseek-v3-mtp``
    (:func:`mtp_head` of its target), a
    ``config.json`` path (a head's, :func:`head_from_config`, or a draft model's), or anything
    :func:`~moesd.predictor.models.resolve_model` takes."""
    target = resolve_model(target, "target")
    if isinstance(draft, str):
        built = _keyword(draft, target, argument)
        if built is not None:
            return built
        head = DRAFT_HEADS.get(draft.lower())
        if head is not None:
            return dataclasses.replace(eagle3_head(head.target, config=head.config), name=head.name,
                                       head_of=head.target)
        spec = MODELS.get(draft.lower())
        if spec is not None and spec.head_of is not None:  # a zoo MTP module (deepseek-v3-mtp)
            return dataclasses.replace(mtp_head(spec.head_of), name=spec.name)
        if is_config_path(draft):
            path = Path(draft)
            file = path / "config.json" if path.is_dir() else path
            try:
                config = json.loads(file.read_text())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
                raise UsageError(f"{argument}: {str(file)!r} cannot be read as a config.json ({error})",
                                 argument) from None
            built = head_from_config(config, target, argument) if isinstance(config, dict) else None
            if built is not None:
                return built
    return resolve_model(draft, argument)
