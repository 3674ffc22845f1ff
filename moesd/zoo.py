"""Real model architectures as records that build Hugging Face configs (Sec. 4 of the paper).

A :class:`ModelSpec` holds the dimensions of a public checkpoint's ``config.json`` (cited in
``source``). It builds that config, optionally with fewer layers, another ``num_experts_per_tok``
(the paper's sparsity sweep) or every width scaled, so a model of the real shape can be made with
random weights (:meth:`ModelSpec.random_model`) where the weights cannot be downloaded, or loaded from
the hub or a local folder (:meth:`ModelSpec.load`) where they can.

Scaling (``width < 1``) keeps the architecture's parameter proportions: widths (hidden size, FFN and
expert widths, latent-attention ranks) are multiplied by ``width``, the vocabulary by
``width x layers / L``, so experts, attention and embeddings keep their shares when layers are dropped.
Experts per layer E and experts per token K are never scaled.

:meth:`ModelSpec.architecture` reads the same config keys into an :class:`Architecture`: the
dimensions that set a model's weights, FLOPs and KV cache, with an analytic, torch-free count of
the weights of each component (:meth:`Architecture.weight_counts`). It agrees exactly with the
meta-device count of :meth:`ModelSpec.parameter_counts` and is what :mod:`moesd.model.predict` uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

HF = "https://huggingface.co/{}/blob/main/config.json"

#: Config keys that are widths (scaled by ``width``), per family; the rest are kept.
_WIDTH_KEYS = ("hidden_size", "intermediate_size", "moe_intermediate_size",
               "shared_expert_intermediate_size", "ffn_dim", "word_embed_proj_dim", "kv_lora_rank",
               "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "head_dim")
#: Keys naming the number of routed experts per layer, by model type.
_EXPERT_COUNT_KEY = {"mixtral": "num_local_experts", "gpt_oss": "num_local_experts", "deepseek_v2": "n_routed_experts",
                     "deepseek_v3": "n_routed_experts"}


@dataclass(frozen=True)
class ModelSpec:
    """One public architecture.

    Parameters
    ----------
    name : str
        Short name used in file names and tables.
    hub_id : str
        Hugging Face hub id of the checkpoint.
    model_type : str
        Transformers ``model_type``.
    config : dict
        The architecture's keys of its ``config.json``.
    role : str
        What the paper (or this project) uses it for.
    source : str
        Where the numbers come from.
    """

    name: str
    hub_id: str
    model_type: str
    config: dict = field(repr=False)
    role: str = ""
    source: str = ""

    @property
    def num_layers(self) -> int:
        """Decoder layers L."""
        return self.config["num_hidden_layers"]

    @property
    def num_experts(self) -> int | None:
        """Routed experts per MoE layer E (None for a dense model)."""
        return self.config.get(_EXPERT_COUNT_KEY.get(self.model_type, "num_experts"))

    @property
    def top_k(self) -> int | None:
        """Routed experts per token K (None for a dense model)."""
        return self.config.get("num_experts_per_tok")

    @property
    def is_moe(self) -> bool:
        """Whether the model routes tokens to experts."""
        return self.num_experts is not None

    def config_dict(self, num_layers: int | None = None, top_k: int | None = None, width: float = 1.0,
                    min_vocab: int = 256) -> dict:
        """The config keys, changed as asked.

        Parameters
        ----------
        num_layers : int, optional
            Keep the first ``num_layers`` decoder layers (default: all).
        top_k : int, optional
            Experts per token K, in [1, E] (default: the checkpoint's).
        width : float, default 1.0
            Factor on every width, in (0, 1]. Below 1 the model is a scaled toy: widths are rounded to
            even numbers with attention heads still dividing the hidden size, and the vocabulary is
            scaled by ``width x num_layers / L`` so embeddings keep their share of the parameters.
            At 1 the real widths and vocabulary are kept (a truncated real model).
        min_vocab : int, default 256
            Smallest vocabulary a scaled model keeps (a tokenizer needs some ids).

        Returns
        -------
        dict
            Keyword arguments of the Transformers config class of ``model_type``.
        """
        config = dict(self.config)
        layers = self.num_layers if num_layers is None else num_layers
        if not 1 <= layers <= self.num_layers:
            raise ValueError(f"num_layers must be in [1, {self.num_layers}] for {self.name}, got {layers}")
        config["num_hidden_layers"] = layers
        if top_k is not None:
            if not self.is_moe:
                raise ValueError(f"top_k applies to MoE models; {self.name} is dense")
            if not 1 <= top_k <= self.num_experts:
                raise ValueError(f"top_k must be in [1, {self.num_experts}] for {self.name}, got {top_k}")
            config["num_experts_per_tok"] = top_k
        if not 0 < width <= 1:
            raise ValueError(f"width must be in (0, 1], got {width}")
        if width < 1:
            for key in _WIDTH_KEYS:
                if config.get(key):
                    config[key] = _even(config[key] * width)
            if "head_dim" not in config and "kv_lora_rank" not in config:  # head width = hidden / heads
                heads = config["num_attention_heads"]
                config["hidden_size"] = heads * _even(config["hidden_size"] / heads)
            if self.config.get("word_embed_proj_dim") == self.config["hidden_size"]:
                config["word_embed_proj_dim"] = config["hidden_size"]
            vocab = self.config["vocab_size"] * width * layers / self.num_layers
            config["vocab_size"] = max(min_vocab, 64 * math.ceil(vocab / 64))
            config.update(pad_token_id=0, bos_token_id=None, eos_token_id=None)  # ids in the new vocab
        return config

    def hf_config(self, num_layers: int | None = None, top_k: int | None = None, width: float = 1.0,
                  **overrides):
        """A Transformers config of this architecture (see :meth:`config_dict`)."""
        from transformers import CONFIG_MAPPING, AutoConfig

        if self.model_type not in CONFIG_MAPPING:
            raise ValueError(f"{self.name}: the installed transformers has no config class for model_type "
                             f"{self.model_type!r}; the record serves moesd.model.predict (analytic counts) only")
        return AutoConfig.for_model(self.model_type, **{**self.config_dict(num_layers, top_k, width),
                                                        **overrides})

    def random_model(self, num_layers: int | None = None, top_k: int | None = None, width: float = 1.0,
                     seed: int = 0, dtype=None, device=None, experts_implementation: str | None = None,
                     **overrides):
        """A model of this shape with random weights, in eval mode.

        ``experts_implementation`` defaults to :func:`default_experts_implementation` of the device.
        """
        import torch
        from transformers import AutoModelForCausalLM

        config = self.hf_config(num_layers, top_k, width, **overrides)
        device = torch.device(device or "cpu")
        kwargs = {}
        if self.is_moe:
            kwargs["experts_implementation"] = experts_implementation or default_experts_implementation(device)
        torch.manual_seed(seed)
        with device:
            model = AutoModelForCausalLM.from_config(config, dtype=dtype or torch.float32, **kwargs)
        return model.eval()

    def load(self, path: str | None = None, dtype: str = "auto", device=None,
             experts_implementation: str | None = None, **kwargs):
        """The pretrained model from the hub (``hub_id``) or a local folder ``path``."""
        import torch
        from transformers import AutoModelForCausalLM

        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if self.is_moe:
            kwargs["experts_implementation"] = experts_implementation or default_experts_implementation(device)
        model = AutoModelForCausalLM.from_pretrained(path or self.hub_id, dtype=dtype, **kwargs)
        return model.to(device).eval()

    def architecture(self, num_layers: int | None = None, top_k: int | None = None,
                     width: float = 1.0) -> "Architecture":
        """The dimensions of the (changed) architecture, read from :meth:`config_dict` without torch."""
        return Architecture.from_config(self.name, self.model_type,
                                        self.config_dict(num_layers, top_k, width))

    def weight_counts(self, num_layers: int | None = None, top_k: int | None = None,
                      width: float = 1.0) -> dict:
        """Parameters per component, counted analytically (see :meth:`Architecture.weight_counts`)."""
        return self.architecture(num_layers, top_k, width).weight_counts()

    def parameter_counts(self, num_layers: int | None = None, top_k: int | None = None,
                         width: float = 1.0) -> dict:
        """Parameters of the (changed) architecture, counted on a meta-device model.

        Returns
        -------
        dict
            ``total``, ``experts`` (all routed experts), ``dense`` (everything else: embeddings,
            attention, norms, routers, shared experts, dense FFNs) and ``active`` (dense + the K of E
            routed experts a token uses), in parameters.
        """
        import torch
        from transformers import AutoModelForCausalLM

        config = self.hf_config(num_layers, top_k, width)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        total = sum(p.numel() for p in model.parameters())
        experts = sum(p.numel() for name, p in model.named_parameters() if ".mlp.experts." in name)
        fraction = (config.num_experts_per_tok / self.num_experts) if self.is_moe else 0.0
        dense = total - experts
        return {"total": total, "experts": experts, "dense": dense, "active": dense + experts * fraction}


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
    one with :meth:`ModelSpec.architecture`.

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
        """Read the shape of a ``config.json`` (as :meth:`ModelSpec.config_dict` returns it).

        Supports the families of :data:`MODELS`: ``qwen2``, ``qwen3``, ``qwen2_moe``, ``qwen3_moe``, ``mixtral``,
        ``olmoe``, ``opt``, ``deepseek_v2``, ``deepseek_v3`` and ``gpt_oss``.
        """
        if model_type not in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "mixtral", "olmoe", "opt", "deepseek_v2",
                              "deepseek_v3", "gpt_oss"):
            raise ValueError(f"model_type {model_type!r} has no analytic shape; add it to Architecture")
        c = {**_SHAPE_DEFAULTS.get(model_type, {}), **config}
        d, layers, vocab = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
        heads = c["num_attention_heads"]
        kv_heads = c.get("num_key_value_heads") or heads
        head_dim = c.get("head_dim") or d // heads
        experts = c.get(_EXPERT_COUNT_KEY.get(model_type, "num_experts")) or 0
        top_k = (c.get("num_experts_per_tok") or 0) if experts else 0
        tied = bool(c.get("tie_word_embeddings", False))

        # Which layers route to experts.
        if not experts:
            moe_layers = 0
        elif model_type in ("deepseek_v2", "deepseek_v3"):
            moe_layers = max(0, layers - c["first_k_dense_replace"])
        elif model_type in ("qwen2_moe", "qwen3_moe"):
            moe_layers = sum(1 for i in range(layers) if i not in c["mlp_only_layers"]
                             and (i + 1) % c["decoder_sparse_step"] == 0)
        else:
            moe_layers = layers

        # Attention.
        sliding_window, sliding_layers = None, 0
        if model_type in ("deepseek_v2", "deepseek_v3"):
            nope, rope, v_dim = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
            kv_lora, q_lora = c["kv_lora_rank"], c["q_lora_rank"]
            q_params = (d * heads * (nope + rope) if not q_lora
                        else d * q_lora + q_lora + q_lora * heads * (nope + rope))
            kv_params = d * (kv_lora + rope) + kv_lora + kv_lora * heads * (nope + v_dim)
            o_params = heads * v_dim * d
            replicated = (d * q_lora + q_lora if q_lora else 0) + d * (kv_lora + rope) + kv_lora
            kv_heads, kv_values = 1, kv_lora + rope
            flops_per_key = 2 * heads * (kv_lora + rope) + 2 * heads * kv_lora
            attention = "mla"
        else:
            v_dim, replicated = head_dim, 0
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
            kv_values = 2 * kv_heads * head_dim
            flops_per_key = 2 * heads * head_dim + 2 * heads * v_dim
            attention = "gqa"

        # Feed-forward blocks.
        if model_type == "opt":
            ffn = c["ffn_dim"]
            dense_ffn = 2 * d * ffn + (ffn + d if c["enable_bias"] else 0)
        else:
            dense_ffn = 3 * d * c["intermediate_size"] if moe_layers < layers else 0
        router = expert = shared = width = 0
        if experts:
            width = c.get("moe_intermediate_size") or c["intermediate_size"]
            expert = 3 * d * width + (2 * width + d if model_type == "gpt_oss" else 0)
            router = experts * d + (experts if model_type == "gpt_oss" else 0)
            if model_type == "qwen2_moe":
                shared = 3 * d * c["shared_expert_intermediate_size"] + d  # and its sigmoid gate
            elif model_type in ("deepseek_v2", "deepseek_v3"):
                shared = 3 * d * c["n_shared_experts"] * width

        # Norms, embeddings, head.
        if model_type == "opt":
            norm = 2 * 2 * d  # two LayerNorms with bias
            final_norm = 2 * d if c["do_layer_norm_before"] and not c["_remove_final_layer_norm"] else 0
            proj = c.get("word_embed_proj_dim") or d
            embedding = vocab * proj + (c["max_position_embeddings"] + 2) * d
            embedding += 2 * d * proj if proj != d else 0  # project_in and project_out
            head = vocab * proj
        else:
            norm, final_norm = 2 * d, d
            embedding = head = vocab * d
        return cls(name=name, model_type=model_type, hidden_size=d, num_layers=layers, moe_layers=moe_layers,
                   vocab_size=vocab, num_experts=experts, top_k=top_k, attention=attention, num_heads=heads,
                   num_kv_heads=kv_heads, q_params=q_params, kv_params=kv_params, o_params=o_params,
                   replicated_attention_params=replicated, kv_values_per_token=kv_values,
                   attention_flops_per_key=flops_per_key,
                   sliding_window=sliding_window, sliding_layers=sliding_layers, router_params=router,
                   expert_params=expert, expert_intermediate=width, shared_params=shared,
                   dense_ffn_params=dense_ffn, norm_params=norm, final_norm_params=final_norm,
                   embedding_params=embedding, head_params=head, tied_embeddings=tied)

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


def depth_scaled_vocab(name: str, layers: int, multiple: int = 64, min_vocab: int = 256) -> int:
    """A vocabulary cut by the depth factor, for a model kept at ``layers`` of its ``L`` layers at full width.

    The embedding and LM head do not shrink when layers are dropped; cutting the vocabulary by
    ``layers / L`` keeps the LM head's share of a decode step what it is in the full-depth model.

    Returns
    -------
    int
        ``V x layers / L`` rounded up to a multiple of ``multiple``, at least ``min_vocab``.
    """
    spec = get_model(name)
    if isinstance(layers, bool) or int(layers) != layers or not 1 <= layers <= spec.num_layers:
        raise ValueError(f"layers must be a whole number in [1, {spec.num_layers}] for {spec.name}, got {layers!r}")
    vocab = spec.config["vocab_size"] * layers / spec.num_layers
    return max(min_vocab, multiple * math.ceil(vocab / multiple))


def default_experts_implementation(device) -> str:
    """``"eager"`` on a CPU, ``"grouped_mm"`` on CUDA: both read each activated expert's weights once per forward.

    ``eager`` runs one matrix product per activated expert (on this project's CPU it beat ``grouped_mm``
    above 64 tokens per forward); ``grouped_mm`` runs one grouped GEMM. ``batched_mm`` is never chosen: it
    gathers a weight copy per token, reading an expert as often as it has tokens.
    """
    import torch

    return "grouped_mm" if torch.device(device).type == "cuda" else "eager"


def noisy_copy(model, scale: float, seed: int = 1):
    """A copy of ``model`` with Gaussian noise of ``scale`` x each tensor's standard deviation added.

    With random weights no small model agrees with a target; a noisy copy does, partly, so it serves
    as a draft with real, ragged acceptance (smaller ``scale``, higher acceptance).
    """
    import copy

    import torch

    draft = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in draft.parameters():
            noise = torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype).to(parameter.device)
            parameter.add_(noise * parameter.std().nan_to_num() * scale)
    return draft


def _even(value: float) -> int:
    """The nearest even integer >= 2 (rotary embeddings split a head's width in halves)."""
    return max(2, 2 * round(value / 2))


def _spec(name, hub_id, model_type, role, **config) -> ModelSpec:
    return ModelSpec(name, hub_id, model_type, config, role, HF.format(hub_id))


_QWEN_ROPE = dict(rope_theta=1e6, rms_norm_eps=1e-6)
_DEEPSEEK_V3 = dict(hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048, n_routed_experts=256,
                    n_shared_experts=1, num_experts_per_tok=8, first_k_dense_replace=3, num_hidden_layers=61,
                    num_attention_heads=128, num_key_value_heads=128, q_lora_rank=1536, kv_lora_rank=512,
                    qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, vocab_size=129280,
                    n_group=8, topk_group=4, routed_scaling_factor=2.5, norm_topk_prob=True,
                    rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)
MODELS: dict[str, ModelSpec] = {spec.name: spec for spec in [
    _spec("qwen2-57b-a14b", "Qwen/Qwen2-57B-A14B-Instruct", "qwen2_moe", "MoE target (Tables 1-2, Figs. 2-6)",
          hidden_size=3584, intermediate_size=18944, moe_intermediate_size=2560,
          shared_expert_intermediate_size=20480, num_experts=64, num_experts_per_tok=8,
          num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4, vocab_size=151936,
          norm_topk_prob=False, tie_word_embeddings=False, **_QWEN_ROPE),
    _spec("qwen2-0.5b", "Qwen/Qwen2-0.5B-Instruct", "qwen2", "draft of Qwen2-57B-A14B",
          hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
          num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, **_QWEN_ROPE),
    _spec("mixtral-8x7b", "mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral", "MoE target (Table 1, Fig. 2)",
          hidden_size=4096, intermediate_size=14336, num_local_experts=8, num_experts_per_tok=2,
          num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
          rope_theta=1e6, rms_norm_eps=1e-5, tie_word_embeddings=False),
    _spec("opt-30b", "facebook/opt-30b", "opt", "dense target (Figs. 3, 6)",
          hidden_size=7168, ffn_dim=28672, num_hidden_layers=48, num_attention_heads=56,
          word_embed_proj_dim=7168, vocab_size=50272, max_position_embeddings=2048,
          do_layer_norm_before=True),
    _spec("opt-350m", "facebook/opt-350m", "opt", "draft of OPT-30b",
          hidden_size=1024, ffn_dim=4096, num_hidden_layers=24, num_attention_heads=16,
          word_embed_proj_dim=512, vocab_size=50272, max_position_embeddings=2048,
          do_layer_norm_before=False),
    _spec("deepseek-v2-lite", "deepseek-ai/DeepSeek-V2-Lite-Chat", "deepseek_v2", "routing (Fig. 1a)",
          hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408, n_routed_experts=64,
          n_shared_experts=2, num_experts_per_tok=6, first_k_dense_replace=1, num_hidden_layers=27,
          num_attention_heads=16, num_key_value_heads=16, kv_lora_rank=512, q_lora_rank=None,
          qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, vocab_size=102400,
          topk_method="greedy", n_group=1, topk_group=1, routed_scaling_factor=1.0,
          norm_topk_prob=False, tie_word_embeddings=False),
    _spec("qwen1.5-moe-a2.7b", "Qwen/Qwen1.5-MoE-A2.7B-Chat", "qwen2_moe", "routing (Fig. 1b)",
          hidden_size=2048, intermediate_size=5632, moe_intermediate_size=1408,
          shared_expert_intermediate_size=5632, num_experts=60, num_experts_per_tok=4,
          num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=16, vocab_size=151936,
          norm_topk_prob=False, tie_word_embeddings=False, **_QWEN_ROPE),
    _spec("olmoe-1b-7b", "allenai/OLMoE-1B-7B-0924", "olmoe", "modern MoE (beyond the paper)",
          hidden_size=2048, intermediate_size=1024, num_experts=64, num_experts_per_tok=8,
          num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=16, vocab_size=50304,
          rope_theta=1e4, rms_norm_eps=1e-5, tie_word_embeddings=False),
    _spec("qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B", "qwen3_moe", "modern MoE (beyond the paper)",
          hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_experts=128,
          num_experts_per_tok=8, num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
          head_dim=128, vocab_size=151936, norm_topk_prob=True, tie_word_embeddings=False, **_QWEN_ROPE),
    _spec("qwen3-0.6b", "Qwen/Qwen3-0.6B", "qwen3", "draft of the Qwen3 MoEs (same tokenizer)",
          hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
          num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True, **_QWEN_ROPE),
    _spec("qwen3-235b-a22b", "Qwen/Qwen3-235B-A22B", "qwen3_moe", "modern MoE (beyond the paper)",
          hidden_size=4096, intermediate_size=12288, moe_intermediate_size=1536, num_experts=128,
          num_experts_per_tok=8, num_hidden_layers=94, num_attention_heads=64, num_key_value_heads=4,
          head_dim=128, vocab_size=151936, norm_topk_prob=True, tie_word_embeddings=False, **_QWEN_ROPE),
    _spec("deepseek-v3", "deepseek-ai/DeepSeek-V3", "deepseek_v3", "modern MoE (beyond the paper)",
          **_DEEPSEEK_V3),
    ModelSpec("deepseek-v3-mtp", "deepseek-ai/DeepSeek-V3", "deepseek_v3",
              {**_DEEPSEEK_V3, "num_hidden_layers": 1, "first_k_dense_replace": 0},
              "draft of DeepSeek-V3: one decoder layer of its shape, the size of its multi-token-prediction "
              "module", HF.format("deepseek-ai/DeepSeek-V3") + "; README_WEIGHTS.md of "
              "deepseek-ai/DeepSeek-V3 (the MTP module is one transformer layer identical to the main "
              "layers, sharing embedding and head; its eh_proj, 7168 x 14336, is left out)"),
    _spec("kimi-k2", "moonshotai/Kimi-K2-Instruct", "deepseek_v3", "modern MoE (beyond the paper); its "
          "config says model_type kimi_k2 with the DeepseekV3ForCausalLM architecture, built here as deepseek_v3",
          **{**_DEEPSEEK_V3, "num_attention_heads": 64, "num_key_value_heads": 64, "n_routed_experts": 384,
             "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.827,
             "vocab_size": 163840, "rope_theta": 50000.0}),
    _spec("gpt-oss-120b", "openai/gpt-oss-120b", "gpt_oss", "modern MoE (beyond the paper); the "
          "checkpoint stores experts in MXFP4, predicted here in the dtype asked",
          hidden_size=2880, intermediate_size=2880, num_local_experts=128, num_experts_per_tok=4,
          num_hidden_layers=36, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
          vocab_size=201088, sliding_window=128, attention_bias=True, rope_theta=150000.0,
          rms_norm_eps=1e-5, tie_word_embeddings=False),
    _spec("mixtral-8x22b", "mistralai/Mixtral-8x22B-v0.1", "mixtral", "modern MoE (beyond the paper)",
          hidden_size=6144, intermediate_size=16384, num_local_experts=8, num_experts_per_tok=2,
          num_hidden_layers=56, num_attention_heads=48, num_key_value_heads=8, vocab_size=32000,
          rope_theta=1e6, rms_norm_eps=1e-5, tie_word_embeddings=False),
]}


def get_model(name: str) -> ModelSpec:
    """The :class:`ModelSpec` called ``name`` (a key of :data:`MODELS`) or with that hub id, in any case."""
    for spec in MODELS.values():
        if str(name).lower() in (spec.name.lower(), spec.hub_id.lower()):
            return spec
    raise KeyError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
