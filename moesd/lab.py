"""The laptop lab: speculative decoding and expert routing of a real pretrained MoE, on real prompts.

One code path, two sets of weights. With the network, the target is a pretrained MoE loaded by hub id
(:data:`LAB_TARGET`, OLMoE-1B-7B-Instruct, by default) and the prompts a public set's (:mod:`moesd.routing.prompts`),
tokenised with the model's chat template. Without it (the book's build, the tests), the target is a model of the
same architecture with **random weights** built from the config (:meth:`moesd.zoo.ModelSpec.random_model`), and
the prompts are tokenised as UTF-8 bytes; every result says which weights made it (:attr:`LabResult.weights`).

The draft is the target's own first ``draft_layers`` decoder layers with its final norm and LM head
(:func:`self_draft`): self-speculative decoding as Draft & Verify (Zhang et al., ACL 2024) does it by skipping
layers. It shares the target's weights, so it needs no memory of its own and no second tokenizer, and a draft step
costs about ``draft_layers / L`` of a target step plus the LM head: the draft term of Eq. 4 is set by one number.

:func:`run_lab` runs the project's engine (:class:`moesd.engine.sd.SpeculativeDecoder`) over the prompts and
captures the target's routing of the same prompts (:func:`moesd.routing.capture.capture_generate`): the measured
acceptance, sigma and tokens per round, and a routing trace whose windows of consecutive tokens show what a
verification pass loads.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from moesd.engine.sd import SpeculativeDecoder
from moesd.routing.capture import capture_generate, chat_texts, moe_layers
from moesd.routing.traces import RoutingTrace
from moesd.routing.unions import random_union, window_union
from moesd.theory.experts import expected_active_experts
from moesd.theory.speedup import alpha_from_sigma
from moesd.zoo import get_model

LAB_TARGET = "allenai/OLMoE-1B-7B-0924-Instruct"
"""The lab's pretrained target: OLMoE-1B-7B's instruction-tuned checkpoint (the architecture of the
:data:`moesd.zoo.MODELS` record ``olmoe-1b-7b``), 6.9 B parameters, 13.8 GB in bf16."""
LAB_ARCHITECTURE = "olmoe-1b-7b"
"""The :data:`moesd.zoo.MODELS` record whose config the random-weight target is built from."""
EXCERPTS = Path(__file__).resolve().parents[1] / "tests" / "data" / "prompts"
"""The first four records of HumanEval, MT-bench and GSM8K that the repository ships with their licences (test
fixtures, ``tests/data/prompts/README.md``): the lab's prompts without the network."""
LAB_CANDIDATES = ("olmoe-1b-7b", "qwen1.5-moe-a2.7b", "deepseek-v2-lite", "qwen3-30b-a3b", "mixtral-8x7b")
"""MoEs with public checkpoints whose routing :mod:`moesd.routing.capture` reads, smallest first."""


def fit_table(memory_gb: float = 16.0, names=LAB_CANDIDATES) -> pd.DataFrame:
    """Which MoEs' weights fit a machine's memory in bf16, counted from their published configs.

    Parameters
    ----------
    memory_gb : float, default 16
        The machine's memory, GB (1e9 bytes).
    names : sequence of str
        :data:`moesd.zoo.MODELS` names.

    Returns
    -------
    pandas.DataFrame
        Indexed by ``model`` (hub id): ``total_billions`` and ``active_billions`` (parameters, billions, from
        :meth:`moesd.zoo.ModelSpec.weight_counts`), ``E``, ``K``, ``bf16_gb`` (2 bytes a parameter),
        ``left_gb`` (memory less the weights: what the system, the KV cache and activations share) and
        ``fits`` (the weights alone take less than the memory).
    """
    if not memory_gb > 0:
        raise ValueError(f"memory_gb must be > 0, got {memory_gb!r}")
    rows = []
    for name in names:
        spec = get_model(name)
        counts = spec.weight_counts()
        weights_gb = 2 * counts["total"] / 1e9
        rows.append({"model": spec.hub_id, "total_billions": counts["total"] / 1e9, "active_billions": counts["active"] / 1e9,
                     "E": spec.num_experts, "K": spec.top_k, "bf16_gb": weights_gb,
                     "left_gb": memory_gb - weights_gb, "fits": weights_gb < memory_gb})
    return pd.DataFrame(rows).set_index("model")


def draft_cost_ratio(name: str, draft_layers) -> float:
    """Weights a :func:`self_draft` step reads over those of a target step, at one token (``B = 1``).

    At one token a decode step reads each layer's attention, router and ``K`` of its ``E`` routed experts (and its
    shared experts), then the LM head; a draft of the first ``draft_layers`` layers reads those layers and the same
    head. In a memory-bound step time follows the bytes read, so this is the draft term's ``T_D(1, 1) / T_T(1, 1)``
    by the roofline.

    Parameters
    ----------
    name : str
        A :data:`moesd.zoo.MODELS` name.
    draft_layers : array_like of int
        Layers the draft keeps, in ``[1, L]``.

    Returns
    -------
    float or numpy.ndarray
        The ratio, in ``(0, 1]`` (1 at ``draft_layers = L``).
    """
    spec = get_model(name)
    counts = spec.weight_counts()
    layers = spec.num_layers
    kept = np.asarray(draft_layers)
    if not np.issubdtype(kept.dtype, np.integer) or (kept < 1).any() or (kept > layers).any():
        raise ValueError(f"draft_layers must be whole numbers in [1, {layers}] for {spec.name}, got {draft_layers!r}")
    per_layer = (counts["active"] - counts["embeddings"] - counts["lm_head"]) / layers  # at one token
    head = counts["lm_head"] or counts["embeddings"]  # a tied head is the embedding matrix
    return (kept * per_layer + head) / (layers * per_layer + head)


def self_draft(target, draft_layers: int):
    """A draft made of the target's first ``draft_layers`` decoder layers, its final norm and its LM head.

    Nothing is copied: the draft's modules are the target's, so the draft needs no memory of its own and
    follows any change to the target's weights. It keeps its own KV cache (a config of ``draft_layers``
    layers), so the engine runs it as any other draft model.

    Parameters
    ----------
    target : transformers.PreTrainedModel
        A decoder-only causal LM with ``model.embed_tokens``, ``model.layers``, ``model.norm``,
        ``model.rotary_emb`` and ``lm_head`` (Llama-style: OLMoE, Qwen, Mixtral, DeepSeek).
    draft_layers : int
        Layers kept, in ``[1, L - 1]``.

    Returns
    -------
    transformers.PreTrainedModel
        The draft, in eval mode.
    """
    from transformers import AutoModelForCausalLM

    layers = target.config.num_hidden_layers
    if isinstance(draft_layers, bool) or int(draft_layers) != draft_layers or not 1 <= draft_layers < layers:
        raise ValueError(f"draft_layers must be a whole number in [1, {layers - 1}] (the target has {layers} "
                         f"layers), got {draft_layers!r}")
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = int(draft_layers)
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:draft_layers]
    with torch.device("meta"):
        draft = AutoModelForCausalLM.from_config(config, dtype=target.dtype)
    for name in ("embed_tokens", "norm", "rotary_emb"):
        setattr(draft.model, name, getattr(target.model, name))
    draft.model.layers = torch.nn.ModuleList(target.model.layers[:draft_layers])
    draft.lm_head = target.lm_head
    left = [name for name, tensor in [*draft.named_parameters(), *draft.named_buffers()] if tensor.is_meta]
    if left:
        raise ValueError(f"this {config.model_type} model has modules the draft does not share: {left[:3]}")
    return draft.eval()


def byte_tokens(texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Texts as UTF-8 byte ids (token id = byte value), left-padded with id 0: the random-weight lab's tokenizer.

    Returns
    -------
    input_ids, attention_mask : torch.Tensor
        ``[len(texts), longest]`` int64.
    """
    rows = [list(text.encode("utf-8")) or [32] for text in texts]
    width = max(map(len, rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, tokens in enumerate(rows):
        ids[row, width - len(tokens):] = torch.tensor(tokens)
        mask[row, width - len(tokens):] = 1
    return ids, mask


@dataclass(frozen=True)
class LabResult:
    """What one lab run measured.

    Attributes
    ----------
    weights : str
        Which weights: ``"pretrained, <hub id>"`` or ``"random (seed s) with the shape of <hub id>: ..."``.
    prompt_ids : tuple of str
        The prompts' ids, in batch order.
    gamma, draft_layers, target_layers : int
        Draft tokens per round, the draft's layers and the target's.
    temperature : float
        0: greedy (accept while the draft token is the target's argmax); above 0: speculative sampling.
    rounds : int
        SD rounds run.
    acceptance_rate : float
        Accepted over drafted tokens (vLLM's draft acceptance rate).
    sigma : float
        Emitted tokens per round and sequence over ``gamma + 1`` (Eq. 5's sigma).
    accept_length : float
        Emitted tokens per round and sequence, ``sigma (gamma + 1)``.
    alpha : float
        The per-token acceptance Eq. 5 infers from ``sigma``.
    completions : tuple of str
        Each prompt's SD output, decoded (byte text for random weights: meaningless).
    trace : RoutingTrace
        The target's routing of the same prompts under greedy decoding (prefill and decode).
    """

    weights: str
    prompt_ids: tuple
    gamma: int
    draft_layers: int
    target_layers: int
    temperature: float
    rounds: int
    acceptance_rate: float
    sigma: float
    accept_length: float
    alpha: float
    completions: tuple
    trace: RoutingTrace

    def summary(self) -> pd.Series:
        """The scalar results as a labelled series (for a table)."""
        return pd.Series({"weights": self.weights, "prompts": len(self.prompt_ids), "gamma": self.gamma,
                          "draft layers": f"{self.draft_layers} of {self.target_layers}",
                          "temperature": self.temperature, "rounds": self.rounds,
                          "acceptance rate (accepted / drafted)": self.acceptance_rate, "sigma (Eq. 5)": self.sigma,
                          "tokens per round": self.accept_length, "alpha from sigma (Eq. 5)": self.alpha})


def run_lab(target, input_ids, attention_mask, prompt_ids, weights: str, gamma: int = 4, draft_layers: int = 4,
            max_new_tokens: int = 64, temperature: float = 0.0, seed: int = 0, eos_token_id=None,
            pad_token_id: int = 0, decode=None) -> LabResult:
    """Speculative decoding of ``target`` with its :func:`self_draft` over a batch, and the target's routing.

    Parameters
    ----------
    target : transformers.PreTrainedModel
        An MoE :mod:`moesd.routing.capture` supports.
    input_ids, attention_mask : torch.Tensor
        ``[batch, length]`` left-padded prompts.
    prompt_ids : sequence of str
        An id per row.
    weights : str
        What the weights are, for the result.
    gamma, draft_layers : int
        Draft tokens per round; the draft's layers.
    max_new_tokens : int
        Tokens per sequence (SD and the routing capture alike).
    temperature : float
        0 for greedy SD; above 0 for speculative sampling (the routing is captured greedily either way).
    seed : int
        Seed of the sampling.
    eos_token_id, pad_token_id
        As :meth:`moesd.engine.sd.SpeculativeDecoder.generate` takes them.
    decode : callable, optional
        Token ids (list of int) to text; default: UTF-8 bytes.

    Returns
    -------
    LabResult
    """
    moe_layers(target)  # refuse a model whose routing cannot be captured before any work
    draft = self_draft(target, draft_layers)
    output = SpeculativeDecoder(target, draft, gamma).generate(
        input_ids, attention_mask, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
        eos_token_id=eos_token_id, pad_token_id=pad_token_id)
    decode = decode or (lambda ids: bytes(i for i in ids if 0 < i < 256).decode("utf-8", "replace"))
    start = input_ids.shape[1]
    completions = tuple(decode(row[start:start + int(count)].tolist())
                        for row, count in zip(output.sequences, output.num_generated))
    trace, _ = capture_generate(target, input_ids, attention_mask, max_new_tokens,
                                meta={"weights": weights, "prompt_ids": list(map(str, prompt_ids))},
                                pad_token_id=pad_token_id)
    stats = output.stats
    return LabResult(weights, tuple(map(str, prompt_ids)), int(gamma), int(draft_layers),
                     target.config.num_hidden_layers, float(temperature), stats.rounds, stats.acceptance_rate,
                     stats.sigma, stats.accept_length, float(alpha_from_sigma(stats.sigma, gamma)), completions, trace)


def random_lab(prompts: pd.DataFrame, num_layers: int = 4, width: float = 1 / 16, draft_layers: int = 1,
               seed: int = 0, **options) -> LabResult:
    """:func:`run_lab` on a random-weight model of the lab's architecture (no download), prompts as UTF-8 bytes.

    Parameters
    ----------
    prompts : pandas.DataFrame
        Columns ``id`` and ``prompt`` (:func:`moesd.routing.prompts.load_prompts`).
    num_layers, width : optional
        The random model's shape: its first ``num_layers`` layers, widths x ``width``
        (:meth:`moesd.zoo.ModelSpec.config_dict`); the vocabulary keeps at least 256 ids, one per byte.
    draft_layers, seed, **options
        As :func:`run_lab` takes them (``seed`` also seeds the weights).
    """
    spec = get_model(LAB_ARCHITECTURE)
    target = spec.random_model(num_layers=num_layers, width=width, seed=seed, dtype=torch.float32)
    input_ids, attention_mask = byte_tokens(list(prompts["prompt"]))
    weights = (f"random (seed {seed}) with the shape of {spec.hub_id}: {num_layers} of {spec.num_layers} layers, "
               f"widths x {width:g}")
    return run_lab(target, input_ids, attention_mask, prompts["id"], weights, draft_layers=draft_layers,
                   seed=seed, **options)


def pretrained_lab(prompts: pd.DataFrame, hub_id: str = LAB_TARGET, dtype: str = "bfloat16", device=None,
                   **options) -> LabResult:
    """:func:`run_lab` on a pretrained MoE from the hub (or a local folder), prompts in its chat template.

    Needs the network (or the checkpoint in the Hugging Face cache) and the memory of :func:`fit_table`.

    Parameters
    ----------
    prompts : pandas.DataFrame
        Columns ``id`` and ``prompt``.
    hub_id : str
        The checkpoint (default :data:`LAB_TARGET`).
    dtype : str, default "bfloat16"
        The weights' dtype.
    device : str, optional
        Default: CUDA when there is one, else the CPU.
    **options
        As :func:`run_lab` takes them.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = AutoTokenizer.from_pretrained(hub_id, padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    target = AutoModelForCausalLM.from_pretrained(hub_id, dtype=getattr(torch, dtype)).to(device).eval()
    texts, chat = chat_texts(tokenizer, list(prompts["prompt"]))
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=not chat).to(device)
    return run_lab(target, batch["input_ids"], batch["attention_mask"], prompts["id"], f"pretrained, {hub_id}",
                   eos_token_id=target.generation_config.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                   decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True), **options)


def window_activation(trace: RoutingTrace, windows=(1, 2, 5, 16)) -> pd.DataFrame:
    """Experts a window of consecutive tokens of one sequence activates, against Eq. 8 and independent tokens.

    A verification pass of one sequence routes ``gamma + 1`` consecutive tokens: how many distinct experts
    they load is what its cost follows (Eq. 8 assumes independent, uniformly routed tokens).

    Returns
    -------
    pandas.DataFrame
        Indexed by ``tokens`` (the window): ``measured`` (mean distinct experts per layer over every window of
        the trace), ``independent tokens`` (the same number of tokens drawn at random across the trace:
        the trace's popularity without its correlation), ``Eq. 8`` (uniform routing) and ``E``.
    """
    rows = []
    for tokens in windows:
        rows.append({"tokens": int(tokens), "measured": window_union(trace, tokens)["union"].mean(),
                     "independent tokens": random_union(trace, tokens, samples=200)["union"].mean(),
                     "Eq. 8": float(expected_active_experts(tokens, trace.num_experts, trace.top_k)),
                     "E": trace.num_experts})
    return pd.DataFrame(rows).set_index("tokens")


def one_window(trace: RoutingTrace, tokens: int = 5, layer_index: int = 0, sequence: int | None = None) -> pd.DataFrame:
    """The experts of one window of ``tokens`` consecutive decode tokens of one sequence in one MoE layer.

    Returns
    -------
    pandas.DataFrame
        One row per token (``position``) with its ``experts`` (sorted ids), and a last row ``union`` with
        the window's distinct experts; ``attrs["layer"]`` and ``attrs["sequence"]`` say where it was taken.
    """
    decode = np.flatnonzero(trace.phase == "decode")
    sequence = int(trace.sequence[decode[0]]) if sequence is None else int(sequence)
    rows = decode[trace.sequence[decode] == sequence]
    rows = rows[np.argsort(trace.position[rows], kind="stable")][:tokens]
    if rows.size < tokens:
        raise ValueError(f"sequence {sequence} has {rows.size} decode tokens in the trace, fewer than {tokens}")
    picked = trace.experts[rows, layer_index]
    frame = pd.DataFrame({"position": trace.position[rows].tolist() + ["union"],
                          "experts": [sorted(map(int, e)) for e in picked] + [sorted(set(picked.ravel().tolist()))]})
    frame["count"] = frame["experts"].map(len)
    frame.attrs.update(layer=int(trace.layers[layer_index]), sequence=sequence)
    return frame.set_index("position")
