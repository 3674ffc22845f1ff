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

:meth:`ModelSpec.architecture` reads the same config keys into an
:class:`~moesd.architecture.Architecture` (:mod:`moesd.architecture`): the dimensions that set a
model's weights, FLOPs and KV cache, counted analytically.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from moesd._checks import as_array
from moesd.architecture import EXPERT_COUNT_KEY, Architecture

HF = "https://huggingface.co/{}/blob/main/config.json"

#: Config keys that are widths (scaled by ``width``), per family; the rest are kept.
_WIDTH_KEYS = ("hidden_size", "intermediate_size", "moe_intermediate_size",
               "shared_expert_intermediate_size", "ffn_dim", "word_embed_proj_dim", "kv_lora_rank",
               "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "head_dim")


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
    head_of : str, optional
        The :data:`MODELS` name of the target this record is a draft head of (an MTP module, built from
        its target and trained on its hidden states); None for a model of its own.

    Raises
    ------
    UsageError
        A ``ValueError`` naming the model and the key, if ``num_hidden_layers`` is not a whole number >= 1,
        the expert count E (when there is one) not a whole number >= 1, or ``num_experts_per_tok`` K not a
        whole number in [1, E].
    """

    name: str
    hub_id: str
    model_type: str
    config: dict = field(repr=False)
    role: str = ""
    source: str = ""
    head_of: str | None = None

    def __post_init__(self) -> None:
        as_array(f"{self.name}: num_hidden_layers", self.config.get("num_hidden_layers"), low=1, whole=True)
        if self.is_moe:
            as_array(f"{self.name}: {EXPERT_COUNT_KEY.get(self.model_type, 'num_experts')}", self.num_experts,
                     low=1, whole=True)
            as_array(f"{self.name}: num_experts_per_tok", self.top_k, low=1, high=self.num_experts, whole=True)

    @property
    def num_layers(self) -> int:
        """Decoder layers L."""
        return self.config["num_hidden_layers"]

    @property
    def num_experts(self) -> int | None:
        """Routed experts per MoE layer E (None for a dense model)."""
        return self.config.get(EXPERT_COUNT_KEY.get(self.model_type, "num_experts"))

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
        as_array(f"num_layers ({self.name})", layers, low=1, high=self.num_layers, whole=True)
        config["num_hidden_layers"] = int(layers)
        if top_k is not None:
            if not self.is_moe:
                raise ValueError(f"top_k applies to MoE models; {self.name} is dense")
            as_array(f"top_k ({self.name})", top_k, low=1, high=self.num_experts, whole=True)
            config["num_experts_per_tok"] = int(top_k)
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

    def check_routed_layers(self, num_layers: int | None, name: str = "num_layers") -> None:
        """Refuse a ``num_layers`` that keeps only dense layers: a model cut to them routes nothing.

        DeepSeek-V3's first 3 layers are dense, so a routing trace of it needs at least 4. Cheap (no torch):
        counted with :meth:`architecture`.

        Raises
        ------
        ValueError
            Naming ``name`` and how many layers are needed.
        """
        if not self.is_moe:
            raise ValueError(f"{self.name} is dense: there is no expert routing")
        if num_layers is not None and not self.architecture(num_layers).moe_layers:
            needed = next(n for n in range(1, self.num_layers + 1) if self.architecture(n).moe_layers)
            raise ValueError(f"{name} {num_layers} keeps only dense layers of {self.name} (its first {needed - 1} "
                             f"are dense, without expert routing): give {name} >= {needed}")

    def hf_config(self, num_layers: int | None = None, top_k: int | None = None, width: float = 1.0,
                  **overrides):
        """A Transformers config of this architecture (see :meth:`config_dict`)."""
        from transformers import CONFIG_MAPPING, AutoConfig

        if self.model_type not in CONFIG_MAPPING:
            raise ValueError(f"{self.name}: the installed transformers has no config class for model_type "
                             f"{self.model_type!r}; the record serves moesd.predictor.predict (analytic counts) only")
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
              "layers, sharing embedding and head; its eh_proj, 7168 x 14336, is left out)", head_of="deepseek-v3"),
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


@dataclass(frozen=True)
class DraftHead:
    """A published EAGLE-3 draft head: the target it drafts for and the dimensions it adds.

    Its shape is :func:`moesd.predictor.layout.eagle3_head` of the target's; these records only name it (the
    head's checkpoint is not a Hugging Face model class, so it is priced, not built).

    Attributes
    ----------
    name, hub_id, target : str
        Its short name, its hub id, and the :data:`MODELS` name of its target.
    draft_vocab_size : int
        Tokens its LM head scores.
    intermediate_size : int
        Its MLP's width.
    source : str
        Where the numbers come from.
    """

    name: str
    hub_id: str
    target: str
    draft_vocab_size: int
    intermediate_size: int
    source: str


DRAFT_HEADS: dict[str, DraftHead] = {head.name: head for head in [
    DraftHead("qwen3-30b-a3b-eagle3", "AngelSlim/Qwen3-a3B_eagle3", "qwen3-30b-a3b", 32000, 6144,
              "SpecForge's EAGLE-3 configs (LlamaForCausalLMEagle3: one layer of the target's width and heads, "
              "draft_vocab_size 32000); the MLP width 6144 is the target config's intermediate_size, which gives "
              "145 M weights, 0.29 GB in bf16, the checkpoint's published size"),
]}
"""EAGLE-3 heads by name (``moesd predict --draft`` takes these names)."""


def get_model(name: str) -> ModelSpec:
    """The :class:`ModelSpec` called ``name`` (a key of :data:`MODELS`) or with that hub id, in any case."""
    for spec in MODELS.values():
        if str(name).lower() in (spec.name.lower(), spec.hub_id.lower()):
            return spec
    raise KeyError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
