"""Timing sweeps of the paper's experiments (Sec. 4) with the project's own engine (:mod:`moesd.engine.sd`):
the forward study and the e2e-type studies under the steady-state protocol (:mod:`moesd.measure.protocol`).
What a sweep measures (its study, models, grid and acceptance) is a :class:`moesd.measure.sweeps.SweepConfig`;
its rows go to a :class:`moesd.measure.result_file.ResultFile`.

Method: warm-up runs first; points are visited in a seeded random order in every repeat so that
drift (thermal, background load) spreads over them; device work is synchronised before every clock
reading (CUDA events time the forwards of the forward study on a GPU: :class:`moesd.engine.timing.Timer`).
Every point is written as soon as it is measured; a sweep that stops part-way resumes where it stopped
(:mod:`moesd.measure.result_file`).

The timed MoE forward reads each activated expert's weights once per forward: the ``eager`` experts
implementation (a loop over activated experts) on a CPU, where it beat ``grouped_mm`` above 64
tokens per forward, and ``grouped_mm`` (one grouped GEMM) on CUDA. ``batched_mm`` is never used: it
gathers one weight copy per token and would read an expert as many times as it has tokens.
"""

from __future__ import annotations

import contextlib
import gc
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from moesd.engine.records import DecodeStats
from moesd.engine.sd import SpeculativeDecoder, generate_autoregressive
from moesd.engine.static_cache import GraphStep, StaticCaches, filled_cache
from moesd.engine.timing import Timer
from moesd.measure.protocol import prompt_seed, random_ids, sd_variants
from moesd.measure.result_file import ResultFile, check_sweep
from moesd.measure.router_control import RoutingControl, distinct_experts, set_top_k
from moesd.measure.sweeps import FORWARD_STUDIES, SweepConfig
from moesd.theory.speedup import speedup
from moesd.zoo import get_model

# ---- Models and timed windows ---------------------------------------------------------------------

def build_models(config: SweepConfig, top_k: int | None = None):
    """The target and draft of a sweep on its device, in eval mode, with one shared vocabulary."""
    dtype = getattr(torch, config.dtype)
    target_spec, draft_spec = get_model(config.target), get_model(config.draft)
    if config.weights == "pretrained":
        changes = {} if top_k is None else {"num_experts_per_tok": top_k}  # overrides the loaded config
        target = target_spec.load(config.target_path, dtype=dtype, device=config.device, **changes)
        draft = draft_spec.load(config.draft_path, dtype=dtype, device=config.device)
        return target, draft
    vocab = {} if config.vocab_size is None else {"vocab_size": config.vocab_size}
    target = target_spec.random_model(config.layers, top_k, config.width, seed=config.seed, dtype=dtype,
                                      device=config.device, **vocab)
    draft = draft_spec.random_model(config.draft_layers, None, config.width, seed=config.seed + 1,
                                    dtype=dtype, device=config.device, vocab_size=target.config.vocab_size)
    return target, draft


def _timed_window(stats: DecodeStats, warmup_rounds: int) -> DecodeStats:
    window = stats.window(warmup_rounds)
    if not window.full:
        raise RuntimeError(f"a sequence stopped inside the timed window ({stats.mode}); the budget is too small")
    return window


def time_autoregressive(target, input_ids: torch.Tensor, rounds: int, warmup_rounds: int,
                        static_caches: StaticCaches | None = None) -> DecodeStats:
    """The timed window of ``rounds`` AR steps after ``warmup_rounds``, every sequence active (greedy)."""
    steps = warmup_rounds + rounds
    stats = generate_autoregressive(target, input_ids, max_new_tokens=steps + 1, max_rounds=steps,
                                    static_caches=static_caches).stats
    return _timed_window(stats, warmup_rounds)


def time_speculative(decoder: SpeculativeDecoder, input_ids: torch.Tensor, rounds: int, warmup_rounds: int,
                     alpha: float | None = None, seed: int | None = None,
                     static_caches: StaticCaches | None = None) -> DecodeStats:
    """The timed window of ``rounds`` SD rounds after ``warmup_rounds``, every sequence active.

    ``alpha`` is the synthetic acceptance probability (``None``: real greedy acceptance).
    """
    total = warmup_rounds + rounds
    stats = decoder.generate(input_ids, max_new_tokens=1 + total * (decoder.gamma + 1), max_rounds=total,
                             synthetic_acceptance=alpha, seed=seed, static_caches=static_caches).stats
    return _timed_window(stats, warmup_rounds)


def steady_state_row(ar: DecodeStats, sd: DecodeStats) -> dict:
    """One e2e point from the timed windows of an AR run and an SD run of the same prompts.

    Times are seconds: ``t_ar`` per AR step (forward and token selection), ``t_sd`` per emitted token
    per sequence, ``t_target_1`` per AR decode forward, ``t_target_gamma`` per verification forward
    (gamma + 1 positions), ``t_draft`` per draft forward, ``t_reject`` per round (acceptance and
    bookkeeping). ``speedup = t_ar / t_sd`` is the ratio of tokens per second. ``speedup_eq4`` is
    Eq. 4 of the same windows' stage times and measured sigma, with T_T(B, 1) = ``t_ar``, the AR
    time per token of Eq. 3 (``T_AR = S T_T(B, 1)``): it accounts for every second of both windows,
    so it equals ``speedup`` when every sequence is active in every timed round, and falls below it
    by the share of sequence-rounds that emit nothing otherwise (the stragglers of a static batch).
    ``target_efficiency = t_target_1 / t_target_gamma`` is the paper's ratio of forward times.
    """
    if ar.batch_size != sd.batch_size or not (ar.full and sd.full) or not (ar.rounds and sd.rounds):
        raise ValueError("steady_state_row needs full windows of the same batch")
    t_ar = ar.t_rounds / ar.rounds
    t_sd = sd.t_rounds * sd.batch_size / sd.emitted
    t_target_1, t_target_gamma = ar.t_verify / ar.rounds, sd.t_verify / sd.rounds
    t_draft, t_reject = sd.t_draft / (sd.rounds * sd.gamma), sd.t_reject / sd.rounds
    return {"rounds": sd.rounds, "ar_steps": ar.rounds, "t_ar": t_ar, "t_sd": t_sd, "t_target_1": t_target_1,
            "t_target_gamma": t_target_gamma, "t_draft": t_draft, "t_reject": t_reject, "sigma": sd.sigma,
            "accept_length": sd.accept_length, "speedup": t_ar / t_sd,
            "speedup_eq4": float(speedup(sd.sigma, sd.gamma, t_ar, t_target_gamma, t_draft, t_reject)),
            "target_efficiency": t_target_1 / t_target_gamma}


def _release_memory(device: str) -> None:
    """Free what dropped models and caches held, so that the next models fit where the last ones were."""
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


# ---- Studies --------------------------------------------------------------------------------------

def _routing_control(config: SweepConfig, target, keep: int):
    """The study's :class:`~moesd.measure.router_control.RoutingControl` on an MoE target (None for a dense one)."""
    if config.routing is None:
        return None
    if config.routing == "trace":
        from moesd.routing.traces import RoutingTrace

        return RoutingControl(target, "trace", keep, trace=RoutingTrace.load(config.routing_trace))
    if config.routing == "popularity":
        from moesd.routing.sources import popularity

        return RoutingControl(target, "popularity", keep, popularity=popularity(config.routing_source), seed=config.seed)
    return RoutingControl(target, config.routing, keep)


class _Models:
    """A study's target and draft, built once and set to each K in turn (:func:`~moesd.measure.router_control.set_top_k`)."""

    def __init__(self, config: SweepConfig):
        self.config, self.target, self.draft = config, None, None

    def at(self, top_k):
        if self.target is None:
            _release_memory(self.config.device)
            self.target, self.draft = build_models(self.config, self.config.top_k_values[0])
        if top_k is not None:
            set_top_k(self.target, top_k)
        return self.target, self.draft


@torch.no_grad()
def run_forward_study(config: SweepConfig, result: ResultFile, progress: bool = True) -> None:
    """T_T(B, s) and T_D(B, s) for every K, B and s in {1} and {gamma, gamma + 1} of ``config.gammas``.

    Each target row records ``activated_experts``, the distinct experts per MoE layer of its forward.
    """
    sizes = sorted({1, *config.gammas, *(g + 1 for g in config.gammas)})
    points = [(role, batch, tokens) for role in ("target", "draft") for batch in config.batch_sizes
              for tokens in sizes]
    timer, rng = Timer(config.device), np.random.default_rng(config.seed)
    orders = [rng.permutation(len(points)) for _ in range(config.repeats)]
    keys = [dict(num_experts_per_tok=k, run=run, role=role, batch_size=batch, tokens=tokens)
            for k in config.top_k_values for run in range(config.repeats) for role, batch, tokens in points]
    models = _Models(config)
    with tqdm(total=len(keys), desc=f"{config.study} study", disable=not progress) as bar:
        for top_k in config.top_k_values:
            if result.done([key for key in keys if key["num_experts_per_tok"] == top_k]):
                bar.update(len(points) * config.repeats)
                continue
            caches = graphs = None  # the previous K's, before the next are made
            _release_memory(config.device)
            target, draft = models.at(top_k)
            control = _routing_control(config, target, keep=1)
            with control or contextlib.nullcontext():
                roles = {"target": target, "draft": draft}
                caches = {(role, batch): filled_cache(model, batch, config.context, config.device,
                                                       max(sizes) if config.cuda_graphs else None)
                          for role, model in roles.items() for batch in config.batch_sizes}
                graphs = {}  # this K's graphs, sharing the memory pool of the first

                def one(role, batch, tokens) -> dict:
                    model, cache = roles[role], caches[role, batch]
                    new = random_ids(batch, tokens, model.config.vocab_size, tokens, config.device)
                    positions = torch.arange(config.context, config.context + tokens, device=config.device)
                    if config.cuda_graphs:
                        if (role, batch, tokens) not in graphs:
                            pool = next(iter(graphs.values()))[0].pool if graphs else None
                            step = GraphStep(model, cache, new, config.context, pool)
                            routed = control.forwards[-1] if control and role == "target" else None
                            graphs[role, batch, tokens] = step, routed  # the capture's ids, rewritten by each replay
                        step, routed = graphs[role, batch, tokens]
                        step.prepare()
                        seconds = timer(step.replay)
                    else:
                        seconds = timer(lambda: model(input_ids=new, position_ids=positions.expand(batch, -1),
                                                      past_key_values=cache, use_cache=True))
                        cache.crop(-tokens)  # drop the timed tokens (crop takes a negative count)
                        routed = control.forwards[-1] if control and role == "target" else None
                    experts = None if routed is None else distinct_experts(routed, control.num_experts)
                    return {"context": config.context, "seconds": seconds, "activated_experts": experts}

                for point in points[:: max(1, len(points) // 8)] * config.warmup:
                    one(*point)
                for run, order in enumerate(orders):
                    for index in order:
                        role, batch, tokens = points[index]
                        key = dict(num_experts_per_tok=top_k, run=run, role=role, batch_size=batch, tokens=tokens)
                        bar.update()
                        if not result.done([key]):
                            result.add([{**key, **one(role, batch, tokens)}])
    result.finish(keys)

@torch.no_grad()
def run_e2e_study(config: SweepConfig, result: ResultFile, progress: bool = True) -> None:
    """AR and SD under the steady-state protocol over top_ks x repeats x batch sizes (x gammas, workloads)."""
    rng = np.random.default_rng(config.seed)
    points = [(top_k, run, batch) for top_k in config.top_k_values for run in range(config.repeats)
              for batch in config.batch_sizes]
    every = [v for top_k, run, batch in points for v in sd_variants(config, batch, top_k, run)]
    models = _Models(config)
    with tqdm(total=len(points), desc=f"{config.study} study", disable=not progress) as bar:
        for top_k in config.top_k_values:
            if result.done([v for v in every if v["num_experts_per_tok"] == top_k]):
                bar.update(len(config.batch_sizes) * config.repeats)
                continue
            target, draft = models.at(top_k)
            decoders = {gamma: SpeculativeDecoder(target, draft, gamma) for gamma in config.gammas}
            control = _routing_control(config, target, keep=config.rounds)  # the timed window's forwards
            with control or contextlib.nullcontext():
                for _ in range(config.warmup):
                    ids = random_ids(config.batch_sizes[0], config.context, target.config.vocab_size, 0,
                                     config.device)
                    time_autoregressive(target, ids, 2, 1)
                    for decoder in decoders.values():
                        time_speculative(decoder, ids, 2, 1, alpha=0.5, seed=0)
                for run in range(config.repeats):
                    for index in rng.permutation(len(config.batch_sizes)):
                        batch = config.batch_sizes[index]
                        bar.update()
                        variants = sd_variants(config, batch, top_k, run)
                        if result.done(variants):
                            continue
                        ids = random_ids(batch, config.context, target.config.vocab_size,
                                         prompt_seed(config, run, batch), config.device)
                        result.add(_measure_point(target, decoders, ids, variants, config, rng, control))
    result.finish(every)


def _measure_point(target, decoders, ids, variants, config, rng, control=None) -> list[dict]:
    """One AR run and one SD run per variant on the same prompts, in a random order; a row per variant.

    With an MoE target (``control``), each row also records the distinct experts per MoE layer of the
    timed window's AR steps (``activated_experts_1``) and verifications (``activated_experts_gamma``).
    With ``config.cuda_graphs`` the runs decode over static caches whose forwards are CUDA graph
    replays, captured in the first run's warm-up round and shared by the point's runs.
    """
    total = config.warmup_rounds + config.rounds
    static = (StaticCaches(ids.shape[1] + total * (max(config.gammas) + 1) + 1, cuda_graphs=True, routing=control)
              if config.cuda_graphs else None)
    windows, experts = {}, {}
    for index in rng.permutation(len(variants) + 1):
        if index == len(variants):
            windows["ar"] = time_autoregressive(target, ids, config.rounds, config.warmup_rounds, static)
        else:
            variant = variants[index]
            windows[index] = time_speculative(decoders[variant["gamma"]], ids, config.rounds,
                                              config.warmup_rounds, variant["alpha"], variant["seed"], static)
        # the target's last ``rounds`` forwards: the window's AR steps or verifications (the draft has no hook)
        experts["ar" if index == len(variants) else index] = control.mean_distinct() if control else None
    return [{**variant, **steady_state_row(windows["ar"], windows[index]),
             "activated_experts_1": experts["ar"], "activated_experts_gamma": experts[index]}
            for index, variant in enumerate(variants)]


def run_sweep(config: SweepConfig, out_dir=None, overwrite: bool = False, progress: bool = True) -> Path:
    """Run a study and return its CSV path (``$MOESD_DATA/measurements/<device>/<study>.csv`` by default).

    Everything :func:`check_sweep` checks is checked before any model is built. Every point is written
    (atomically, with the sidecar) as soon as it is measured; a sweep stopped part-way resumes from its
    complete rows when run again with the same settings. ``overwrite`` replaces a finished result file
    only once the new sweep is complete (:func:`moesd.measure.result_file.writing_file`).
    """
    result = ResultFile(check_sweep(config, out_dir, overwrite), config, overwrite)
    if config.study in FORWARD_STUDIES:
        run_forward_study(config, result, progress)
    else:
        run_e2e_study(config, result, progress)
    return result.path
