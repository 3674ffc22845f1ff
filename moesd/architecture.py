"""The analytic shape of a decoder: the dimensions that set its weights, FLOPs and KV cache.

:class:`Architecture` reads a ``config.json`` (as :meth:`moesd.zoo.ModelSpec.config_dict` builds it)
into those dimensions, with a torch-free count of the weights of each component
(:meth:`Architecture.weight_counts`) that agrees exactly with the meta-device count of
:meth:`moesd.zoo.ModelSpec.parameter_counts`. The predictor (:mod:`moesd.model`) prices a step from it.
"""

from __future__ import annotations

from dataclasses import dataclass

EXPERT_COUNT_KEY = {"mixtral": "num_local_experts", "gpt_oss": "num_local_experts", "deepseek_v2": "n_routed_experts",
                    "deepseek_v3": "n_routed_experts"}
"""Config keys naming the number of routed experts per layer, by model type (default ``num_experts``)."""

#: Transformers defaults of the keys that shape a model, where a record may leave them out.
_SHAPE_DEFAULTS = {
    "opt": dict(tie_word_embeddings=True, enable_bias=True, do_layer_norm_before=True,
                _remove_final_layer_norm=False),
    "deepseek_v2": dict(first_k_dense_replace=0, q_lora_rank=1536, n_shared_experts=2),
    "deepseek_v3": dict(first_k_dense_replace=3, q_lora_rank=1536, n_shared_experts=1),
    "qwen2_moe": dict(decoder_sparse_step=1, mlp_only_layers=(), qkv_bias=True),
    "qwen3_moe": dict(decoder_sparse_step=1, mlp_only_layers=(), attention_bias=False),
    "qwen3": dict(attention_bias=False),
    "olmoe": dict(attention_bias=False),
    "gpt_oss": dict(attention_bias=True),
}


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

    @property
    def dense_layers(self) -> int:
        """Layers with a dense FFN instead of routed experts."""
        return self.num_layers - self.moe_layers

    @property
    def attention_params(self) -> int:
        """Attention weights of one layer."""
        return self.q_params + self.kv_params + self.o_params

    @classmethod
    def from_config(cls, name: str, model_type: str, config: dict) -> "Architecture":
        """Read the shape of a ``config.json`` (as :meth:`moesd.zoo.ModelSpec.config_dict` returns it).

        Supports the families of :data:`moesd.zoo.MODELS`: ``qwen2``, ``qwen3``, ``qwen2_moe``, ``qwen3_moe``,
        ``mixtral``, ``olmoe``, ``opt``, ``deepseek_v2``, ``deepseek_v3`` and ``gpt_oss``.
        """
        if model_type not in FAMILIES:
            raise ValueError(f"model_type {model_type!r} has no analytic shape; add it to Architecture")
        c = {**_SHAPE_DEFAULTS.get(model_type, {}), **config}
        layers = c["num_hidden_layers"]
        experts = c.get(EXPERT_COUNT_KEY.get(model_type, "num_experts")) or 0
        moe_layers = _moe_layers(model_type, c, experts)
        return cls(name=name, model_type=model_type, hidden_size=c["hidden_size"], num_layers=layers,
                   moe_layers=moe_layers, vocab_size=c["vocab_size"], num_experts=experts,
                   top_k=(c.get("num_experts_per_tok") or 0) if experts else 0,
                   tied_embeddings=bool(c.get("tie_word_embeddings", False)),
                   **_attention(model_type, c), **_feed_forward(model_type, c, experts, moe_layers < layers),
                   **_norms_and_embeddings(model_type, c))

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
            "attention": self.num_layers * self.attention_params,
            "router": self.moe_layers * self.router_params,
            "shared_experts": self.moe_layers * self.shared_params,
            "routed_experts": self.moe_layers * self.num_experts * self.expert_params,
            "dense_ffn": self.dense_layers * self.dense_ffn_params,
            "norms": self.num_layers * self.norm_params + self.final_norm_params,
            "lm_head": 0 if self.tied_embeddings else self.head_params,
        }
        total = sum(counts.values())
        experts = counts["routed_experts"]
        fraction = self.top_k / self.num_experts if self.num_experts else 0.0
        return {**counts, "total": total, "experts": experts, "dense": total - experts,
                "active": total - experts + experts * fraction}


FAMILIES = ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "mixtral", "olmoe", "opt", "deepseek_v2", "deepseek_v3",
            "gpt_oss")
"""The ``model_type`` values :meth:`Architecture.from_config` reads."""


def _moe_layers(model_type: str, c: dict, experts: int) -> int:
    """Layers that route to experts."""
    layers = c["num_hidden_layers"]
    if not experts:
        return 0
    if model_type in ("deepseek_v2", "deepseek_v3"):
        return max(0, layers - c["first_k_dense_replace"])
    if model_type in ("qwen2_moe", "qwen3_moe"):
        return sum(1 for i in range(layers) if i not in c["mlp_only_layers"] and (i + 1) % c["decoder_sparse_step"] == 0)
    return layers


def _attention(model_type: str, c: dict) -> dict:
    """The attention fields of an :class:`Architecture`: projections per layer, KV cache per token, FLOPs per key."""
    d, layers, heads = c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"]
    kv_heads = c.get("num_key_value_heads") or heads
    head_dim = c.get("head_dim") or d // heads
    if model_type in ("deepseek_v2", "deepseek_v3"):
        nope, rope, v_dim = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        kv_lora, q_lora = c["kv_lora_rank"], c["q_lora_rank"]
        q_params = (d * heads * (nope + rope) if not q_lora
                    else d * q_lora + q_lora + q_lora * heads * (nope + rope))
        return dict(attention="mla", num_heads=heads, num_kv_heads=1, q_params=q_params,
                    kv_params=d * (kv_lora + rope) + kv_lora + kv_lora * heads * (nope + v_dim),
                    o_params=heads * v_dim * d,
                    replicated_attention_params=(d * q_lora + q_lora if q_lora else 0) + d * (kv_lora + rope) + kv_lora,
                    kv_values_per_token=kv_lora + rope,
                    attention_flops_per_key=2 * heads * (kv_lora + rope) + 2 * heads * kv_lora,
                    sliding_window=None, sliding_layers=0)
    sliding_window, sliding_layers = None, 0
    bias = {"qwen2": True, "qwen2_moe": c.get("qkv_bias"), "opt": c.get("enable_bias"),
            "gpt_oss": c.get("attention_bias"), "qwen3_moe": c.get("attention_bias"),
            "qwen3": c.get("attention_bias"),
            "olmoe": c.get("attention_bias")}.get(model_type, False)
    o_bias = model_type in ("opt", "gpt_oss") and bias
    q_params = d * heads * head_dim + (heads * head_dim if bias else 0)
    kv_params = 2 * (d * kv_heads * head_dim + (kv_heads * head_dim if bias else 0))
    o_params = heads * head_dim * d + (d if o_bias else 0)
    if model_type in ("qwen3", "qwen3_moe"):  # RMSNorm over each head's width
        q_params, kv_params = q_params + head_dim, kv_params + head_dim
    elif model_type == "olmoe":  # RMSNorm over all heads
        q_params, kv_params = q_params + heads * head_dim, kv_params + kv_heads * head_dim
    elif model_type == "gpt_oss":  # one attention-sink logit per head
        q_params += heads
        sliding_window = c.get("sliding_window")
        types = c.get("layer_types") or ["sliding_attention" if (i + 1) % 2 else "full_attention"
                                         for i in range(layers)]
        sliding_layers = sum(t == "sliding_attention" for t in types[:layers]) if sliding_window else 0
    return dict(attention="gqa", num_heads=heads, num_kv_heads=kv_heads, q_params=q_params, kv_params=kv_params,
                o_params=o_params, replicated_attention_params=0, kv_values_per_token=2 * kv_heads * head_dim,
                attention_flops_per_key=2 * heads * head_dim + 2 * heads * head_dim,
                sliding_window=sliding_window, sliding_layers=sliding_layers)


def _feed_forward(model_type: str, c: dict, experts: int, has_dense_layers: bool) -> dict:
    """The feed-forward fields of an :class:`Architecture`: dense FFN, router, routed and shared experts."""
    d = c["hidden_size"]
    if model_type == "opt":
        ffn = c["ffn_dim"]
        dense_ffn = 2 * d * ffn + (ffn + d if c["enable_bias"] else 0)
    else:
        dense_ffn = 3 * d * c["intermediate_size"] if has_dense_layers else 0
    router = expert = shared = width = 0
    if experts:
        width = c.get("moe_intermediate_size") or c["intermediate_size"]
        expert = 3 * d * width + (2 * width + d if model_type == "gpt_oss" else 0)
        router = experts * d + (experts if model_type == "gpt_oss" else 0)
        if model_type == "qwen2_moe":
            shared = 3 * d * c["shared_expert_intermediate_size"] + d  # and its sigmoid gate
        elif model_type in ("deepseek_v2", "deepseek_v3"):
            shared = 3 * d * c["n_shared_experts"] * width
    return dict(dense_ffn_params=dense_ffn, router_params=router, expert_params=expert, expert_intermediate=width,
                shared_params=shared)


def _norms_and_embeddings(model_type: str, c: dict) -> dict:
    """The norm, embedding and LM-head fields of an :class:`Architecture`."""
    d, vocab = c["hidden_size"], c["vocab_size"]
    if model_type != "opt":
        return dict(norm_params=2 * d, final_norm_params=d, embedding_params=vocab * d, head_params=vocab * d)
    proj = c.get("word_embed_proj_dim") or d
    embedding = vocab * proj + (c["max_position_embeddings"] + 2) * d
    embedding += 2 * d * proj if proj != d else 0  # project_in and project_out
    return dict(norm_params=2 * 2 * d,  # two LayerNorms with bias
                final_norm_params=2 * d if c["do_layer_norm_before"] and not c["_remove_final_layer_norm"] else 0,
                embedding_params=embedding, head_params=vocab * proj)
