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

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from moesd._checks import as_array
from moesd.architecture import EXPERT_COUNT_KEY, Architecture

#: Config keys that are widths (scaled by ``width``), per family; the rest are kept.
_WIDTH_KEYS = ("hidden_size", "intermediate_size", "moe_intermediate_size",
               "shared_expert_intermediate_size", "ffn_dim", "word_embed_proj_dim", "kv_lora_rank",
               "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "head_dim", "rotary_dim",
               "linear_key_head_dim", "linear_value_head_dim")
#: Config keys that hold one entry per layer (cut with the layers).
_PER_LAYER_KEYS = ("layer_types", "attn_type_list", "no_rope_layers")


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
        for key in _PER_LAYER_KEYS:
            if isinstance(config.get(key), list):
                config[key] = config[key][:int(layers)]
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
        experts = sum(p.numel() for name, p in model.named_parameters() if ".experts." in name)  # Llama 4: feed_forward
        fraction = (config.num_experts_per_tok / self.num_experts) if self.is_moe else 0.0
        dense = total - experts
        return {"total": total, "experts": experts, "dense": dense, "active": dense + experts * fraction}


PAPER_DIMENSIONS = ("num_experts", "num_experts_per_tok", "num_shared_experts", "hidden_size", "moe_intermediate_size",
                    "shared_expert_intermediate_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                    "num_key_value_heads", "vocab_size")
"""The dimensions ``moesd.paper_tables.paper_table("models")`` shows for each of the paper's models, read from the
shipped records by :func:`paper_dimensions` (``data/paper/models.csv`` holds none of them)."""


def paper_dimensions(spec: ModelSpec) -> dict:
    """The :data:`PAPER_DIMENSIONS` of a record, named as the paper's model table names them: experts and shared
    experts (None for a dense model), their widths (a shared width is all shared experts together; None without),
    the dense FFN width (OPT's ``ffn_dim``), and the attention heads (KV heads: the heads where the config has none)."""
    c, arch = spec.config, spec.architecture()
    shared = (c.get("n_shared_experts", 1 if c.get("shared_expert_intermediate_size") else 0)
              if spec.is_moe else None)
    shared_width = (c.get("shared_expert_intermediate_size") or shared * arch.expert_intermediate) if shared else None
    return {"num_experts": spec.num_experts, "num_experts_per_tok": spec.top_k, "num_shared_experts": shared,
            "hidden_size": c["hidden_size"], "moe_intermediate_size": arch.expert_intermediate if spec.is_moe else None,
            "shared_expert_intermediate_size": shared_width,
            "intermediate_size": c.get("intermediate_size") or c.get("ffn_dim"), "num_hidden_layers": spec.num_layers,
            "num_attention_heads": c["num_attention_heads"],
            "num_key_value_heads": c.get("num_key_value_heads") or c["num_attention_heads"],
            "vocab_size": c["vocab_size"]}


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


RECORDS = Path(__file__).resolve().parent / "records"
"""The shipped configs: ``records/models/<name>.json`` (a target's or draft's ``config.json`` keys) and
``records/heads/<name>.json`` (an EAGLE-3 head's), each with a ``_moesd`` block naming the record and citing its
source. They are the one source of model dimensions (``data/paper/models.csv`` holds only the paper's facts)."""

ORDER = ("qwen2-57b-a14b", "qwen2-0.5b", "mixtral-8x7b", "opt-30b", "opt-350m", "deepseek-v2-lite",
         "qwen1.5-moe-a2.7b", "olmoe-1b-7b", "qwen3-30b-a3b", "qwen3-0.6b", "qwen3-235b-a22b", "deepseek-v3",
         "kimi-k2", "gpt-oss-120b", "mixtral-8x22b")
"""The records listed first (the paper's, then the book's); the others follow by name."""


def _load(folder: str) -> list:
    """The shipped records of ``records/<folder>``: ``(metadata, config keys)`` pairs, :data:`ORDER` first."""
    records = []
    for path in sorted((RECORDS / folder).glob("*.json")):
        config = json.loads(path.read_text())
        records.append((config.pop("_moesd"), config))
    rank = {name: i for i, name in enumerate(ORDER)}
    return sorted(records, key=lambda record: (rank.get(record[0]["name"], len(rank)), record[0]["name"]))


def _spec(meta: dict, config: dict) -> ModelSpec:
    config = dict(config)
    return ModelSpec(meta["name"], meta["hub_id"], config.pop("model_type"), config, meta["role"], meta["source"])


def mtp_spec(spec: ModelSpec) -> ModelSpec:
    """The multi-token-prediction module of ``spec`` as a one-layer record of its shape (MoE where its last layer is)
    that Transformers can build; the predictor prices it with its fusing projection
    (:func:`moesd.predictor.models.mtp_head`)."""
    keep = {"num_hidden_layers": 1, "first_k_dense_replace": 0, "num_nextn_predict_layers": 0}
    config = {**spec.config, **{key: value for key, value in keep.items() if key in spec.config or key == "num_hidden_layers"}}
    return ModelSpec(f"{spec.name}-mtp", spec.hub_id, spec.model_type, config,
                     f"draft of {spec.name}: its multi-token-prediction module, one decoder layer of its shape",
                     spec.source + "; README_WEIGHTS.md of deepseek-ai/DeepSeek-V3 (the MTP module is one transformer "
                     "layer identical to the main layers, sharing embedding and head, with an eh_proj of 2d x d)",
                     head_of=spec.name)


MODELS: dict[str, ModelSpec] = {}
"""The shipped model records by name (:data:`RECORDS`); ``deepseek-v3-mtp`` is DeepSeek-V3's MTP module
(:func:`mtp_spec`)."""
for _meta, _config in _load("models"):
    MODELS[_meta["name"]] = _spec(_meta, _config)
    if _meta["name"] == "deepseek-v3":
        MODELS["deepseek-v3-mtp"] = mtp_spec(MODELS["deepseek-v3"])


@dataclass(frozen=True)
class DraftHead:
    """A published EAGLE-3 draft head: the target it drafts for and its config's keys.

    Its shape is :func:`moesd.predictor.models.eagle3_head` of its config (the head's checkpoint is not a Hugging
    Face model class, so it is priced, not built).

    Attributes
    ----------
    name, hub_id, target : str
        Its short name, its hub id (empty for a training config only), and the :data:`MODELS` name of its target.
    config : dict
        The keys of its ``config.json`` (``hidden_size``, heads, ``intermediate_size``, ``draft_vocab_size``...).
    source : str
        Where the numbers come from.
    """

    name: str
    hub_id: str
    target: str
    config: dict = field(repr=False)
    source: str = ""

    @property
    def draft_vocab_size(self) -> int:
        """Tokens its LM head scores."""
        return self.config["draft_vocab_size"]

    @property
    def intermediate_size(self) -> int:
        """Its MLP's width."""
        return self.config["intermediate_size"]


DRAFT_HEADS: dict[str, DraftHead] = {meta["name"]: DraftHead(meta["name"], meta["hub_id"], meta["target"], config,
                                                             meta["source"]) for meta, config in _load("heads")}
"""EAGLE-3 heads by name (``moesd predict --draft`` takes these names)."""


def get_model(name: str) -> ModelSpec:
    """The :class:`ModelSpec` called ``name`` (a key of :data:`MODELS`) or with that hub id, in any case."""
    for spec in MODELS.values():
        if str(name).lower() in (spec.name.lower(), spec.hub_id.lower()):
            return spec
    raise KeyError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
