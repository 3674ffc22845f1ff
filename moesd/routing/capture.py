"""Capture expert routing from Hugging Face MoE models during batched ``generate``.

A forward hook on each MoE layer's router (``layer.mlp.gate``) records the expert indices the
router hands to the experts module: the third output of every supported router,
``(router_logits, weights, indices)``. Reading those indices, rather than recomputing
``topk(router_logits)``, is what makes the capture right for DeepSeek-V2/V3, whose grouped and
bias-corrected selection differs from a plain top-K, and keying them by the real layer index is
what keeps them right when some layers are dense.

Supported: Mixtral, Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B), Qwen3-MoE, DeepSeek-V2 (and V2-Lite),
DeepSeek-V3 and OLMoE, as implemented in ``transformers``. torch is imported here, not by
``import moesd``.
"""

from __future__ import annotations

import numpy as np
import torch
from tqdm.auto import tqdm

from moesd._checks import UsageError
from moesd.routing.traces import RoutingTrace, concatenate

SUPPORTED_MODEL_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "olmoe")


def moe_layers(model) -> dict[int, torch.nn.Module]:
    """The router of every MoE layer, keyed by the model's layer index.

    Raises
    ------
    ValueError
        If the model's architecture is not one this module knows, or it has no MoE layer.
    """
    model_type = getattr(model.config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"routing capture supports {', '.join(SUPPORTED_MODEL_TYPES)}; "
                         f"this model is {model_type!r}")
    routers = {index: layer.mlp.gate for index, layer in enumerate(model.model.layers)
               if hasattr(layer.mlp, "gate") and hasattr(layer.mlp, "experts")}
    if not routers:
        raise ValueError(f"no layer of this {model_type} model has a router at layer.mlp.gate")
    return routers


class RoutingRecorder:
    """Context manager that records every router call of a model's MoE layers.

    ``calls`` holds, per forward pass, a dict from layer index to the (rows, K) index tensor,
    with rows in the flattened (batch, sequence) order the router sees.
    """

    def __init__(self, model):
        self.routers = moe_layers(model)
        self.first_layer = min(self.routers)
        self.calls: list[dict[int, torch.Tensor]] = []
        self._handles = []

    def _hook(self, index: int):
        def record(module, inputs, output):
            indices = output[2] if isinstance(output, tuple) and len(output) >= 3 else None
            if not (isinstance(indices, torch.Tensor) and indices.ndim == 2 and not indices.is_floating_point()
                    and (not self.calls or not self.calls[-1] or
                         indices.shape[1] == next(iter(self.calls[-1].values())).shape[1])):
                shapes = ([tuple(part.shape) if isinstance(part, torch.Tensor) else type(part).__name__
                           for part in output] if isinstance(output, tuple) else type(output).__name__)
                raise UsageError(f"the router of layer {index} ({type(module).__name__}) returned {shapes}, not the "
                                 "(logits, weights, indices) of the transformers routers moesd.routing.capture reads "
                                 "(indices: an integer tensor of (tokens, K), the same K in every layer)")
            if index == self.first_layer:
                self.calls.append({})
            self.calls[-1][index] = indices.detach().to("cpu", torch.int64)
        return record

    def __enter__(self) -> "RoutingRecorder":
        self._handles = [router.register_forward_hook(self._hook(index))
                         for index, router in self.routers.items()]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


def capture_generate(model, input_ids, attention_mask, max_new_tokens: int, sequence_ids=None,
                     meta=None, **generate_kwargs) -> tuple[RoutingTrace, torch.Tensor]:
    """Run greedy batched ``generate`` on left-padded prompts and record its routing.

    Padding rows of the prefill and rows of sequences that already ended (fed their EOS or what
    follows it) are left out; every other token appears once per MoE layer.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A supported MoE causal LM.
    input_ids, attention_mask : torch.Tensor, shape (batch, prompt_length)
        Left-padded prompts.
    max_new_tokens : int
        Tokens to generate per sequence.
    sequence_ids : array_like of int, optional
        The trace's ``sequence`` value of each row (defaults to ``0..batch-1``).
    meta : dict, optional
        Stored in the trace.
    **generate_kwargs
        Passed to ``model.generate``.

    Returns
    -------
    trace : RoutingTrace
    sequences : torch.Tensor
        The generated sequences, prompts included.
    """
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    batch, prompt_length = input_ids.shape
    with RoutingRecorder(model) as recorder, torch.no_grad():
        sequences = model.generate(input_ids=input_ids, attention_mask=attention_mask,
                                   max_new_tokens=max_new_tokens, do_sample=False, **generate_kwargs)
    layers = sorted(recorder.routers)
    num_experts = int(recorder.routers[layers[0]].weight.shape[0])
    mask = attention_mask.cpu().numpy().astype(bool)
    prompt_lengths = mask.sum(axis=1)
    sequence_ids = np.arange(batch) if sequence_ids is None else np.asarray(sequence_ids)
    stops = _stop_ids(model)
    generated = sequences[:, prompt_length:].cpu().numpy()
    experts, sequence, position, call, phase = [], [], [], [], []
    for step, routed in enumerate(recorder.calls):
        indices = torch.stack([routed[layer] for layer in layers], dim=1).numpy()  # rows, layers, K
        if step == 0:
            keep = mask.ravel()
            rows = np.repeat(np.arange(batch), prompt_length)[keep]
            positions = (np.cumsum(mask, axis=1) - 1).ravel()[keep]
        else:
            # Decode step s feeds generated token s - 1; the row is wasted work once a stop token
            # is among the first s generated tokens (HF keeps computing finished rows).
            keep = ~np.isin(generated[:, :step], stops).any(axis=1)
            rows = np.arange(batch)[keep]
            positions = prompt_lengths[keep] + step - 1
        experts.append(indices[keep])
        sequence.append(sequence_ids[rows])
        position.append(positions)
        call.append(np.full(rows.size, step))
        phase.append(np.full(rows.size, "prefill" if step == 0 else "decode"))
    trace = RoutingTrace(np.concatenate(experts), num_experts, np.concatenate(sequence),
                         np.concatenate(position), np.concatenate(call), np.concatenate(phase),
                         layers=np.array(layers), meta=dict(meta or {}))
    return trace, sequences


def _stop_ids(model) -> list[int]:
    """The EOS token ids of the model's generation config."""
    ids = model.generation_config.eos_token_id
    return [] if ids is None else [ids] if isinstance(ids, int) else list(ids)


def chat_texts(tokenizer, prompts: list) -> tuple[list, bool]:
    """The prompts as the model reads them: each wrapped as one user turn in its chat template, if it has one.

    Returns the texts and whether a chat template was applied (its texts then carry their special tokens).
    """
    chat = tokenizer.chat_template is not None
    return [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
            if chat else p for p in prompts], chat


def trace_prompts(model_id: str, prompts, batch_size: int, max_new_tokens: int, dataset: str = "",
                  dtype: str = "auto", device: str | None = None) -> RoutingTrace:
    """Load a model and its tokenizer, and capture routing over prompts in batches.

    Parameters
    ----------
    model_id : str
        A Hugging Face hub id (e.g. ``deepseek-ai/DeepSeek-V2-Lite-Chat``) or a local folder.
    prompts : pandas.DataFrame
        With columns ``id`` and ``prompt``, as :func:`moesd.routing.prompts.load_prompts` returns.
    batch_size : int
        Sequences per ``generate`` call.
    max_new_tokens : int
        Tokens generated per sequence.
    dataset : str
        Recorded in the trace's metadata.
    dtype : str, default "auto"
        Weight dtype (``"auto"`` keeps the checkpoint's, e.g. bf16).
    device : str, optional
        ``"cuda"``, ``"cpu"``...; defaults to CUDA when available.

    Returns
    -------
    RoutingTrace
        Sequence ``i`` is row ``i`` of ``prompts``; ``meta`` records the model, data and settings.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype != "auto" and not isinstance(getattr(torch, str(dtype), None), torch.dtype):
        raise ValueError(f"dtype must be 'auto' or a torch dtype name such as 'bfloat16', got {dtype!r}")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = AutoTokenizer.from_pretrained(model_id, padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_id, dtype=dtype).to(device).eval()
    moe_layers(model)  # refuse an unsupported model before any work
    texts, chat = chat_texts(tokenizer, list(prompts["prompt"]))

    def encode(batch_texts):
        batch = tokenizer(batch_texts, return_tensors="pt", padding=True,
                          add_special_tokens=not chat).to(device)
        return batch["input_ids"], batch["attention_mask"]

    trace = _trace_batches(model, encode, texts, batch_size, max_new_tokens, tokenizer.pad_token_id, model_id)
    trace.meta = _meta(trace, model, model_id, prompts, dataset, batch_size, max_new_tokens, chat_template=chat,
                       device=device, weights="pretrained, as loaded from " + model_id)
    return trace


def trace_random_model(name: str, prompts, batch_size: int, max_new_tokens: int, num_layers: int | None = None,
                       width: float = 1.0, seed: int = 0, dataset: str = "") -> RoutingTrace:
    """Capture routing of a random-weight model of a real architecture from :mod:`moesd.zoo`.

    What this measures is the routing of *random* weights: with random routers every expert is
    about equally likely, so it exercises the pipeline and the statistics, not a trained model's
    expert popularity. Prompts are tokenised as UTF-8 bytes (token id = byte value), left-padded
    with id 0; the trace's metadata says all of this.

    Parameters
    ----------
    name : str
        A :data:`moesd.zoo.MODELS` name or hub id, e.g. ``"deepseek-v2-lite"``.
    prompts : pandas.DataFrame
        With columns ``id`` and ``prompt``.
    batch_size, max_new_tokens : int
        As in :func:`trace_prompts`.
    num_layers, width : optional
        Shape changes passed to :meth:`moesd.zoo.ModelSpec.random_model`.
    seed : int, default 0
        Seed of the random weights.
    dataset : str
        Recorded in the trace's metadata.
    """
    from moesd.zoo import get_model

    spec = get_model(name)
    spec.check_routed_layers(num_layers)
    model = spec.random_model(num_layers=num_layers, width=width, seed=seed)
    moe_layers(model)
    texts = list(prompts["prompt"])

    def encode(batch_texts):
        rows = [list(text.encode("utf-8")) for text in batch_texts]
        width_ = max(map(len, rows))
        ids = torch.zeros(len(rows), width_, dtype=torch.long)
        mask = torch.zeros(len(rows), width_, dtype=torch.long)
        for row, tokens in enumerate(rows):
            ids[row, width_ - len(tokens):] = torch.tensor(tokens)
            mask[row, width_ - len(tokens):] = 1
        return ids, mask

    trace = _trace_batches(model, encode, texts, batch_size, max_new_tokens, 0, f"{spec.name} (random weights)")
    config = model.config
    trace.meta = _meta(trace, model, spec.hub_id, prompts, dataset, batch_size, max_new_tokens,
                       chat_template=False, device="cpu", tokenizer="UTF-8 bytes",
                       weights=random_weights_note(spec, config, seed, width))
    return trace


def random_weights_note(spec, config, seed: int, width: float) -> str:
    """How a trace's random-weight model was built, for its metadata (``config``: the built model's)."""
    return (f"random (seed {seed}) with the shape of {spec.hub_id}: {config.num_hidden_layers} of "
            f"{spec.num_layers} layers, widths x {width:g}")


def _meta(trace, model, model_id, prompts, dataset, batch_size, max_new_tokens, **details) -> dict:
    """A trace's metadata: model, E, K, prompts and capture settings, plus ``details``."""
    return {"source": "moesd.routing.capture", "model_id": model_id, "model_type": model.config.model_type, "E": trace.num_experts,
            "K": trace.top_k, "dataset": dataset, "prompt_ids": prompts["id"].astype(str).tolist(),
            "batch_size": batch_size, "max_new_tokens": max_new_tokens, "dtype": str(model.dtype), **details}


def _trace_batches(model, encode, texts, batch_size, max_new_tokens, pad_token_id, label) -> RoutingTrace:
    """Capture routing over ``texts`` in batches; ``encode`` maps texts to (input_ids, attention_mask)."""
    parts = []
    for start in tqdm(range(0, len(texts), batch_size), desc=f"tracing {label}", unit="batch"):
        input_ids, attention_mask = encode(texts[start:start + batch_size])
        trace, _ = capture_generate(model, input_ids, attention_mask, max_new_tokens,
                                    sequence_ids=np.arange(start, start + len(input_ids)),
                                    pad_token_id=pad_token_id)
        parts.append(trace)
    return concatenate(parts)
