"""The analytic shape of a decoder: the dimensions that set its weights, FLOPs and KV cache.

:class:`Architecture` reads a ``config.json`` (as :meth:`moesd.zoo.ModelSpec.config_dict` builds it)
into those dimensions, with a torch-free count of the weights of each component
(:meth:`Architecture.weight_counts`) that agrees exactly with the meta-device count of
:meth:`moesd.zoo.ModelSpec.parameter_counts`. The predictor (:mod:`moesd.model`) prices a step from it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from moesd import families
from moesd._checks import UsageError
from moesd.families import EXPERT_COUNT_KEY, FAMILIES

__all__ = ["Architecture", "EXPERT_COUNT_KEY", "FAMILIES", "read_config"]

POSITION_DEFAULTS = {"qwen2": 32768, "qwen3": 32768, "qwen2_moe": 32768, "qwen3_moe": 32768, "qwen3_next": 32768,
                     "mixtral": 131072, "olmoe": 4096, "opt": 2048, "deepseek_v2": 2048, "deepseek_v3": 4096,
                     "deepseek_v32": 163840, "glm4_moe": 131072, "gpt_oss": 131072, "llama4_text": 131072,
                     "minimax": 131072, "minimax_m2": 196608}
"""Transformers' default ``max_position_embeddings`` of each config class of the zoo's models (the pinned
transformers'; a test compares them): the positions a model built from a config that does not name them has
(OPT's learned position table, the others' rotary embeddings precomputed up to it)."""


def max_positions(model_type: str, config: dict) -> int | None:
    """The token positions a model of ``config`` has: its ``max_position_embeddings``, else its class's default
    (:data:`POSITION_DEFAULTS`); None for a model type without one (its loader knows its positions)."""
    value = config.get("max_position_embeddings", POSITION_DEFAULTS.get(model_type))
    return None if value is None else int(value)


@dataclass(frozen=True)
class Architecture:
    """The dimensions that set a decoder's weights, FLOPs and KV cache (pure Python, no torch).

    Counts are parameters per layer (``*_params``) or per token (``kv_values_per_token``). Build
    one with :meth:`moesd.zoo.ModelSpec.architecture`.

    Attributes
    ----------
    name, model_type : str
        The record it was read from.
    hidden_size, num_layers, vocab_size : int
        ``d``, ``L`` and ``V``.
    moe_layers : int
        Layers with routed experts; the other ``num_layers - moe_layers`` have a dense FFN.
    num_experts, top_k : int
        Routed experts per MoE layer ``E`` and experts per token ``K`` (0 for a dense model).
    attention : str
        ``"gqa"`` (grouped-query, multi-head as a special case) or ``"mla"`` (latent attention).
    num_heads, num_kv_heads : int
        Query heads and key-value heads (MLA: 1, the latent is shared by all heads).
    q_params, kv_params, o_params : int
        Attention weights per layer: query side, key-value side (projections and their norms), output.
    replicated_attention_params : int
        Those of them every tensor-parallel GPU holds whole (MLA's down-projections and their norms).
    kv_values_per_token : int
        Values cached per token and layer (GQA ``2 kv_heads head_dim``; MLA ``kv_lora_rank + rope``).
    attention_flops_per_key : int
        FLOPs of one query token against one cached token in one layer (scores and values; MLA with
        the projections absorbed into the query, as inference engines run it).
    sliding_window : int or None
        Keys a sliding-window layer attends to; ``sliding_layers`` of the layers use it.
    router_params, expert_params, shared_params : int
        Per MoE layer: router, one routed expert (its biases included), all shared experts (and
        their gate).
    expert_intermediate : int
        Width of one routed expert.
    dense_ffn_params : int
        FFN of one dense layer.
    norm_params, final_norm_params : int
        Norms of one layer (outside attention) and after the last layer.
    embedding_params : int
        Token (and learned position) embeddings and input/output projections.
    head_params : int
        The LM head's matrix, read at every step (the embedding when tied).
    tied_embeddings : bool
        Whether the LM head is the token embedding (not counted twice).
    head_of : str or None
        The :data:`moesd.zoo.MODELS` name of the target this is a draft head of (an MTP module, a published
        EAGLE-3 head: trained on that target's hidden states); None for a model of its own.
    linear_layers : int
        Layers with linear attention (Gated DeltaNet, lightning attention) instead of softmax attention over a KV
        cache; ``linear_params`` their weights each, ``linear_state_values`` the recurrent state of one sequence in
        each, read and written once per pass whatever the context.
    index_topk, index_values_per_token, index_flops_per_key, index_params : int
        DeepSeek Sparse Attention: the keys each query attends to (0: all), the indexer's cached values per token and
        FLOPs per query and key (it scores every cached token), and its weights per layer.
    mtp_layers : int
        Multi-token-prediction modules the config declares (drafts of the target's own: :mod:`moesd.predictor.models`).
    drafter : str or None
        The kind of draft head this is (:data:`moesd.predictor.models.DRAFTERS`: ``"mtp"``, ``"eagle"``,
        ``"eagle3"``, ``"medusa"``, ``"ngram"``); None for a model of its own.
    borrowed_params : int
        Weights it reads that its target holds (a head's shared embedding and LM head): counted in its passes, not in
        its memory.
    draft_positions : int
        Positions one pass proposes (Medusa's heads, all at once); 0 for a drafter that proposes one per pass.
    fuse_params : int
        A head's projection fusing the token's embedding with the target's hidden state (an MTP module's
        ``eh_proj``), priced as one matrix product per pass.
    max_positions : int or None
        The token positions its config names (``max_position_embeddings``); None where the record names none.
    """

    name: str
    model_type: str
    hidden_size: int
    num_layers: int
    moe_layers: int
    vocab_size: int
    num_experts: int
    top_k: int
    attention: str
    num_heads: int
    num_kv_heads: int
    q_params: int
    kv_params: int
    o_params: int
    replicated_attention_params: int
    kv_values_per_token: int
    attention_flops_per_key: int
    sliding_window: int | None
    sliding_layers: int
    router_params: int
    expert_params: int
    expert_intermediate: int
    shared_params: int
    dense_ffn_params: int
    norm_params: int
    final_norm_params: int
    embedding_params: int
    head_params: int
    tied_embeddings: bool
    head_of: str | None = None
    linear_layers: int = 0
    linear_params: int = 0
    linear_state_values: int = 0
    index_topk: int = 0
    index_values_per_token: int = 0
    index_flops_per_key: int = 0
    index_params: int = 0
    mtp_layers: int = 0
    drafter: str | None = None
    borrowed_params: int = 0
    draft_positions: int = 0
    fuse_params: int = 0
    max_positions: int | None = None

    @property
    def dense_layers(self) -> int:
        """Layers with a dense FFN instead of routed experts."""
        return self.num_layers - self.moe_layers

    @property
    def attention_params(self) -> int:
        """Attention weights of one softmax-attention layer."""
        return self.q_params + self.kv_params + self.o_params

    @property
    def full_layers(self) -> int:
        """Layers with softmax attention over a KV cache (of the whole context or a window)."""
        return self.num_layers - self.linear_layers

    @property
    def attention_weights(self) -> int:
        """Attention weights of all layers: softmax and linear attention, a sparse-attention indexer."""
        return (self.full_layers * self.attention_params + self.linear_layers * self.linear_params
                + self.num_layers * self.index_params)

    @classmethod
    def from_config(cls, name: str, model_type: str, config: dict) -> "Architecture":
        """Read the shape of a ``config.json`` (as :meth:`moesd.zoo.ModelSpec.config_dict` returns it).

        Supports the families of :data:`moesd.families.FAMILIES` (and the aliases of
        :data:`moesd.families.ALIASES`).

        Raises
        ------
        UsageError
            Naming ``model_type`` for another family, or the config key the predictor cannot price.
        """
        model_type = families.ALIASES.get(model_type, model_type)
        if model_type not in FAMILIES:
            raise UsageError(f"model_type {model_type!r} has no analytic shape (the families read: "
                             f"{', '.join(FAMILIES)})", "config.model_type")
        c = {**families.SHAPE_DEFAULTS.get(model_type, {}), **config}
        missing = [key for key in ("num_hidden_layers", "hidden_size", "vocab_size", "num_attention_heads")
                   if c.get(key) is None]
        if missing:
            raise UsageError(f"config.json lacks {', '.join(missing)}, which set the {model_type} model's shape",
                             f"config.{missing[0]}")
        layers = c["num_hidden_layers"]
        experts = c.get(EXPERT_COUNT_KEY.get(model_type, "num_experts")) or 0
        moe_layers = families.moe_layer_count(model_type, c, experts)
        return cls(name=name, model_type=model_type, hidden_size=c["hidden_size"], num_layers=layers,
                   moe_layers=moe_layers, vocab_size=c["vocab_size"], num_experts=experts,
                   top_k=(c.get("num_experts_per_tok") or 0) if experts else 0,
                   tied_embeddings=bool(c.get("tie_word_embeddings", False)), mtp_layers=families.mtp_layer_count(model_type, c),
                   max_positions=c.get("max_position_embeddings"),
                   **families.attention_fields(model_type, c),
                   **families.feed_forward_fields(model_type, c, experts, moe_layers < layers),
                   **families.norm_fields(model_type, c))

    def weight_counts(self) -> dict:
        """Parameters of the whole model per component, counted from the dimensions alone.

        Returns
        -------
        dict
            ``embeddings``, ``attention`` (projections and their norms), ``router``, ``shared_experts``,
            ``routed_experts`` (all E per MoE layer), ``dense_ffn`` (dense layers' FFNs), ``norms``,
            ``lm_head`` (0 when tied to the embeddings), and the totals of
            :meth:`ModelSpec.parameter_counts`: ``total``, ``experts`` (= ``routed_experts``),
            ``dense`` (the rest) and ``active`` (``dense`` + K of E routed experts), in parameters.
        """
        counts = {
            "embeddings": self.embedding_params,
            "attention": self.attention_weights,
            "router": self.moe_layers * self.router_params,
            "shared_experts": self.moe_layers * self.shared_params,
            "routed_experts": self.moe_layers * self.num_experts * self.expert_params,
            "dense_ffn": self.dense_layers * self.dense_ffn_params,
            "norms": self.num_layers * self.norm_params + self.final_norm_params,
            "lm_head": 0 if self.tied_embeddings else self.head_params,
        }
        if self.fuse_params:
            counts["fuse"] = self.fuse_params
        total = sum(counts.values())
        experts = counts["routed_experts"]
        fraction = self.top_k / self.num_experts if self.num_experts else 0.0
        return {**counts, "total": total, "experts": experts, "dense": total - experts,
                "active": total - experts + experts * fraction}


def read_config(path, name: str | None = None) -> Architecture:
    """The :class:`Architecture` of a model's ``config.json`` (a file, or a folder holding one), read offline.

    A multimodal config's ``text_config`` (Llama 4's) is read with the top level's ``tie_word_embeddings``. The name is
    ``name``, else the config's ``_name_or_path``, else the folder's name.

    Raises
    ------
    UsageError
        Naming ``config`` for a path that is no readable JSON config, or the key the predictor cannot price.
    """
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    try:
        config = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UsageError(f"config {str(file)!r} cannot be read as a config.json ({error})", "config") from None
    if not isinstance(config, dict):
        raise UsageError(f"config {str(file)!r} is not a JSON object", "config")
    if isinstance(config.get("text_config"), dict):
        config = {"tie_word_embeddings": config.get("tie_word_embeddings", False), **config["text_config"]}
    if not config.get("model_type"):
        raise UsageError(f"config {str(file)!r} has no model_type", "config.model_type")
    label = name or config.get("_name_or_path") or file.parent.name or file.stem
    return Architecture.from_config(str(label), config["model_type"], config)
