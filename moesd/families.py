"""The ``config.json`` keys of each model family, read into the fields of an :class:`~moesd.architecture.Architecture`.

One reader per part of a decoder: :func:`moe_layer_count` (which layers route to experts), :func:`attention_fields`
(projections per layer, KV cache per token, FLOPs per key; sliding, chunked, linear and sparse attention),
:func:`feed_forward_fields` (dense FFN, router, routed and shared experts) and :func:`norm_fields` (norms,
embeddings, LM head). Each counts parameters as the Hugging Face implementation of the family holds them, so that
:meth:`~moesd.architecture.Architecture.weight_counts` agrees with a meta-device model (``tests/test_zoo.py``). A key
the predictor cannot price is refused with a :class:`~moesd._checks.UsageError` naming it.

Pure Python; no torch.
"""

from __future__ import annotations

from moesd._checks import UsageError

FAMILIES = ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "qwen3_next", "mixtral", "olmoe", "opt", "llama", "llama4",
            "deepseek_v2", "deepseek_v3", "deepseek_v32", "glm4_moe", "minimax", "minimax_m2", "gpt_oss")
"""The ``model_type`` values :meth:`~moesd.architecture.Architecture.from_config` reads."""

ALIASES = {"kimi_k2": "deepseek_v3", "llama4_text": "llama4", "minimax_m1": "minimax"}
"""Model types read as another family: Kimi-K2's configs name ``kimi_k2`` with the DeepseekV3ForCausalLM architecture;
Llama 4's text tower is ``llama4_text``; MiniMax-M1's own config names ``minimax_m1``, Transformers ``minimax``."""

EXPERT_COUNT_KEY = {"mixtral": "num_local_experts", "gpt_oss": "num_local_experts", "llama4": "num_local_experts",
                    "minimax": "num_local_experts", "minimax_m2": "num_local_experts",
                    "deepseek_v2": "n_routed_experts", "deepseek_v3": "n_routed_experts",
                    "deepseek_v32": "n_routed_experts", "glm4_moe": "n_routed_experts"}
"""Config keys naming the number of routed experts per layer, by model type (default ``num_experts``)."""
EXPERT_COUNT_KEY.update({alias: EXPERT_COUNT_KEY[family] for alias, family in ALIASES.items() if family in EXPERT_COUNT_KEY})

MTP_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_modules")
"""Config keys naming a model's multi-token-prediction modules (DeepSeek and GLM, Qwen3-Next, MiniMax-M2)."""

MTP_DEFAULTS = {"qwen3_next": 1}
"""MTP modules of a family whose config names none: Qwen3-Next's checkpoints hold one (vLLM's
``vllm/model_executor/models/qwen3_next_mtp.py`` reads ``num_nextn_predict_layers``, default 1)."""

#: Transformers defaults of the keys that shape a model, where a record may leave them out.
SHAPE_DEFAULTS = {
    "opt": dict(tie_word_embeddings=True, enable_bias=True, do_layer_norm_before=True,
                _remove_final_layer_norm=False),
    "deepseek_v2": dict(first_k_dense_replace=0, q_lora_rank=1536, n_shared_experts=2),
    "deepseek_v3": dict(first_k_dense_replace=3, q_lora_rank=1536, n_shared_experts=1),
    "deepseek_v32": dict(first_k_dense_replace=3, q_lora_rank=1536, n_shared_experts=1),
    "qwen2_moe": dict(decoder_sparse_step=1, mlp_only_layers=(), qkv_bias=True),
    "qwen3_moe": dict(decoder_sparse_step=1, mlp_only_layers=(), attention_bias=False),
    "qwen3_next": dict(decoder_sparse_step=1, mlp_only_layers=(), full_attention_interval=4, linear_conv_kernel_dim=4),
    "qwen3": dict(attention_bias=False),
    "olmoe": dict(attention_bias=False),
    "gpt_oss": dict(attention_bias=True),
    "llama": dict(attention_bias=False, mlp_bias=False),
    "llama4": dict(interleave_moe_layer_step=1, no_rope_layer_interval=4),
    "glm4_moe": dict(first_k_dense_replace=1, n_shared_experts=1, attention_bias=False, use_qk_norm=False),
}

_MLA = ("deepseek_v2", "deepseek_v3", "deepseek_v32")


def refuse(key: str, message: str):
    """Raise the :class:`UsageError` of a config key the predictor cannot price (``argument`` is ``config.<key>``)."""
    raise UsageError(f"config.json {key}: {message}", f"config.{key}")


def layer_kinds(model_type: str, c: dict) -> list:
    """The attention kind of each layer (``"full"``, ``"sliding"``, ``"linear"``) from ``layer_types``,
    ``attn_type_list`` or the family's default pattern; a kind the predictor cannot price is refused."""
    layers = c["num_hidden_layers"]
    names = {"full_attention": "full", "sliding_attention": "sliding", "linear_attention": "linear",
             "chunked_attention": "sliding", "indexed_attention": "full"}  # indexed: DeepSeek-V3.2's, by its indexer
    if c.get("layer_types"):
        unknown = sorted(set(c["layer_types"]) - set(names))
        if unknown:
            refuse("layer_types", f"layers of kind {', '.join(unknown)} are not priced (known: {', '.join(names)})")
        return [names[kind] for kind in c["layer_types"][:layers]]
    if c.get("attn_type_list") and model_type == "minimax":  # MiniMax's own key: 0 lightning (linear), 1 softmax
        return ["full" if kind else "linear" for kind in c["attn_type_list"][:layers]]
    if model_type == "qwen3_next":
        return ["full" if (i + 1) % c["full_attention_interval"] == 0 else "linear" for i in range(layers)]
    if model_type == "gpt_oss":
        return ["sliding" if (i + 1) % 2 else "full" for i in range(layers)]
    if model_type == "llama4" and c.get("attention_chunk_size"):  # RoPE layers attend within a chunk, NoPE ones to all
        rope = c.get("no_rope_layers") or [int((i + 1) % c["no_rope_layer_interval"] != 0) for i in range(layers)]
        return ["sliding" if rope[i] else "full" for i in range(layers)]
    return ["full"] * layers


def moe_layer_count(model_type: str, c: dict, experts: int) -> int:
    """Layers that route to experts."""
    layers = c["num_hidden_layers"]
    if not experts:
        return 0
    if model_type in (*_MLA, "glm4_moe"):
        return max(0, layers - c["first_k_dense_replace"])
    if model_type in ("qwen2_moe", "qwen3_moe", "qwen3_next"):
        return sum(1 for i in range(layers) if i not in c["mlp_only_layers"] and (i + 1) % c["decoder_sparse_step"] == 0)
    if model_type == "llama4":
        step = c["interleave_moe_layer_step"]
        chosen = c.get("moe_layers") or (range(step - 1, layers, step) if step else ())
        return sum(1 for i in chosen if i < layers)
    return layers


def _mla(c: dict, d: int, heads: int) -> dict:
    """Multi-head latent attention (DeepSeek-V2/V3): projections, the latent cache, FLOPs with absorbed projections,
    and DeepSeek-V3.2's sparse-attention indexer where the config has one."""
    nope, rope, v_dim = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    kv_lora, q_lora = c["kv_lora_rank"], c["q_lora_rank"]
    q_params = (d * heads * (nope + rope) if not q_lora
                else d * q_lora + q_lora + q_lora * heads * (nope + rope))
    fields = dict(attention="mla", num_heads=heads, num_kv_heads=1, q_params=q_params,
                  kv_params=d * (kv_lora + rope) + kv_lora + kv_lora * heads * (nope + v_dim),
                  o_params=heads * v_dim * d,
                  replicated_attention_params=(d * q_lora + q_lora if q_lora else 0) + d * (kv_lora + rope) + kv_lora,
                  kv_values_per_token=kv_lora + rope,
                  attention_flops_per_key=2 * heads * (kv_lora + rope) + 2 * heads * kv_lora,
                  sliding_window=None, sliding_layers=0)
    if c.get("index_topk"):  # DeepSeek Sparse Attention: an indexer scores every key, attention reads the top-k
        index_heads, index_dim = c["index_n_heads"], c["index_head_dim"]
        fields.update(index_topk=c["index_topk"], index_values_per_token=index_dim,
                      index_flops_per_key=2 * index_heads * index_dim,
                      index_params=q_lora * index_heads * index_dim + d * index_dim + 2 * index_dim + d * index_heads)
    return fields


def _linear_attention(model_type: str, c: dict, d: int, heads: int, head_dim: int) -> dict:
    """Linear-attention layers (Qwen3-Next's Gated DeltaNet, MiniMax-M1's lightning attention): weights of one such
    layer and the recurrent state of one sequence, read and written once per pass whatever the context."""
    if model_type == "qwen3_next":
        k_heads, v_heads = c["linear_num_key_heads"], c["linear_num_value_heads"]
        k_dim, v_dim = k_heads * c["linear_key_head_dim"], v_heads * c["linear_value_head_dim"]
        conv = 2 * k_dim + v_dim
        params = (conv * c["linear_conv_kernel_dim"] + d * (2 * k_dim + 2 * v_dim) + d * 2 * v_heads + 2 * v_heads
                  + c["linear_value_head_dim"] + v_dim * d)
        state = v_heads * c["linear_key_head_dim"] * c["linear_value_head_dim"] + conv * (c["linear_conv_kernel_dim"] - 1)
        return dict(linear_params=params, linear_state_values=state)
    width = heads * head_dim  # MiniMax: qkv, output gate, out projection and a norm over all heads
    return dict(linear_params=3 * width * d + 2 * width * d + width, linear_state_values=heads * head_dim * head_dim)


def attention_fields(model_type: str, c: dict) -> dict:
    """The attention fields of an Architecture: projections per layer, KV cache per token, FLOPs per key; the layers
    that attend within a window or chunk, and the linear-attention layers."""
    d, heads = c["hidden_size"], c["num_attention_heads"]
    if model_type in _MLA:
        return _mla(c, d, heads)
    kv_heads = c.get("num_key_value_heads") or heads
    head_dim = c.get("head_dim") or d // heads
    kinds = layer_kinds(model_type, c)
    bias = {"qwen2": True, "qwen2_moe": c.get("qkv_bias"), "opt": c.get("enable_bias"),
            "gpt_oss": c.get("attention_bias"), "qwen3_moe": c.get("attention_bias"), "qwen3": c.get("attention_bias"),
            "olmoe": c.get("attention_bias"), "llama": c.get("attention_bias"),
            "glm4_moe": c.get("attention_bias")}.get(model_type, False)
    o_bias = model_type in ("opt", "gpt_oss", "llama") and bias
    gate = 2 if model_type == "qwen3_next" else 1  # Qwen3-Next's gated attention: the query projection gives a gate
    q_params = gate * d * heads * head_dim + (heads * head_dim if bias else 0)
    kv_params = 2 * (d * kv_heads * head_dim + (kv_heads * head_dim if bias else 0))
    o_params = heads * head_dim * d + (d if o_bias else 0)
    if model_type in ("qwen3", "qwen3_moe", "qwen3_next") or (model_type == "glm4_moe" and c.get("use_qk_norm")):
        q_params, kv_params = q_params + head_dim, kv_params + head_dim  # RMSNorm over each head's width
    elif model_type in ("olmoe", "minimax_m2"):  # RMSNorm over all heads
        q_params, kv_params = q_params + heads * head_dim, kv_params + kv_heads * head_dim
    elif model_type == "gpt_oss":  # one attention-sink logit per head
        q_params += heads
    window = c.get("sliding_window") if model_type == "gpt_oss" else c.get("attention_chunk_size")
    sliding = kinds.count("sliding") if window else 0
    fields = dict(attention="gqa", num_heads=heads, num_kv_heads=kv_heads, q_params=q_params, kv_params=kv_params,
                  o_params=o_params, replicated_attention_params=0, kv_values_per_token=2 * kv_heads * head_dim,
                  attention_flops_per_key=2 * heads * head_dim + 2 * heads * head_dim,
                  sliding_window=window if sliding else None, sliding_layers=sliding)
    if "linear" in kinds:
        if model_type not in ("qwen3_next", "minimax"):
            refuse("layer_types", f"linear attention is priced for qwen3_next and minimax, not {model_type}")
        fields.update(linear_layers=kinds.count("linear"), **_linear_attention(model_type, c, d, heads, head_dim))
    return fields


def feed_forward_fields(model_type: str, c: dict, experts: int, has_dense_layers: bool) -> dict:
    """The feed-forward fields of an Architecture: dense FFN, router, routed and shared experts."""
    d = c["hidden_size"]
    if model_type == "opt":
        ffn = c["ffn_dim"]
        dense_ffn = 2 * d * ffn + (ffn + d if c["enable_bias"] else 0)
    elif model_type == "llama4":
        dense_ffn = 3 * d * c["intermediate_size_mlp"] if has_dense_layers else 0
    else:
        dense_ffn = 3 * d * c["intermediate_size"] if has_dense_layers else 0
        if model_type == "llama" and c.get("mlp_bias"):
            dense_ffn += 2 * c["intermediate_size"] + d
    router = expert = shared = width = 0
    if experts:
        width = c.get("moe_intermediate_size") or c["intermediate_size"]
        expert = 3 * d * width + (2 * width + d if model_type == "gpt_oss" else 0)
        router = experts * d + (experts if model_type == "gpt_oss" else 0)
        if model_type in ("qwen2_moe", "qwen3_next"):
            shared = 3 * d * c["shared_expert_intermediate_size"] + d  # and its sigmoid gate
        elif model_type in (*_MLA, "glm4_moe"):
            shared = 3 * d * c["n_shared_experts"] * width
        elif model_type == "llama4":  # one shared expert of the routed experts' width
            shared = 3 * d * width
        elif c.get("shared_intermediate_size"):
            refuse("shared_intermediate_size", f"shared experts are not priced for {model_type}")
    return dict(dense_ffn_params=dense_ffn, router_params=router, expert_params=expert, expert_intermediate=width,
                shared_params=shared)


def norm_fields(model_type: str, c: dict) -> dict:
    """The norm, embedding and LM-head fields of an Architecture."""
    d, vocab = c["hidden_size"], c["vocab_size"]
    if model_type != "opt":
        return dict(norm_params=2 * d, final_norm_params=d, embedding_params=vocab * d, head_params=vocab * d)
    proj = c.get("word_embed_proj_dim") or d
    embedding = vocab * proj + (c["max_position_embeddings"] + 2) * d
    embedding += 2 * d * proj if proj != d else 0  # project_in and project_out
    return dict(norm_params=2 * 2 * d,  # two LayerNorms with bias
                final_norm_params=2 * d if c["do_layer_norm_before"] and not c["_remove_final_layer_norm"] else 0,
                embedding_params=embedding, head_params=vocab * proj)


def mtp_layer_count(model_type: str, c: dict) -> int:
    """Multi-token-prediction modules the config declares (0 for none; :data:`MTP_DEFAULTS` where it names none)."""
    declared = [int(c[key]) for key in MTP_KEYS if c.get(key) is not None]
    return declared[0] if declared else MTP_DEFAULTS.get(model_type, 0)
