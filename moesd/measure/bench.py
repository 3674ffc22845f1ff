"""Timing sweeps of the paper's experiments (Sec. 4): the protocol, the timing, and result files written
with their environment. What a sweep measures (its study, models, grid and acceptance) is a
:class:`moesd.measure.sweeps.SweepConfig`; the names of :mod:`moesd.measure.sweeps` stay importable from here.

Steady-state protocol (e2e, sparsity, dense, settings)
------------------------------------------------------
A *point* is one batch of B random prompts of ``context`` tokens at one K and repeat. The target
decodes it autoregressively for ``warmup_rounds + rounds`` steps, and SD decodes the same prompts for
``warmup_rounds + rounds`` rounds at every gamma (and, in the settings study, every workload), in a
seeded random order. The token budgets (``1 + n`` for AR, ``1 + n (gamma + 1)`` for SD) are never
reached and there is no EOS, so all B sequences are active in every round; the first
``warmup_rounds`` are dropped and the *timed window* is the remaining ``rounds`` rounds (and steps).
The speedup is the ratio of tokens per second over the two windows: AR emits B tokens a step, SD the
counted tokens of its timed rounds. Stage times come from the same windows, so Eq. 4 evaluated from
them (``speedup_eq4``, with T_T(B, 1) the AR time per step as in Eq. 3) accounts for every second
of both windows and equals the measured speedup; under the old protocol (a static batch timed until
its last sequence stopped) it did not, by the share of sequence-rounds left idle.

Synthetic acceptance draws its coins from a seed of its own per (study, B, gamma, K, repeat,
workload) (:func:`acceptance_seed`, recorded in the ``seed`` column), so points never share their
acceptance pattern.

*KV length.* The cache holds ``context`` prompt slots after the prefill. AR step ``i`` (from 0)
attends over ``context + i + 1`` slots, so the AR window covers ``context + warmup_rounds + 1`` to
``context + warmup_rounds + rounds``. An SD round appends ``gamma + 1`` slots whatever is accepted
(rejected drafts stay as masked holes), so the SD window's verifications attend over
``context + (warmup_rounds + 1)(gamma + 1)`` to ``context + (warmup_rounds + rounds)(gamma + 1)``
slots: at gamma = 4 and 32 rounds about five times the AR window's growth. SD's forwards therefore
run over longer caches than the AR steps they are compared with, which lowers the measured speedup
(and Eq. 4 from the same run) by the growth of attention cost with the cache; the data README
states its size on the CPU preset.

Method: warm-up runs first; points are visited in a seeded random order in every repeat so that
drift (thermal, background load) spreads over them; device work is synchronised before every clock
reading (CUDA events time the forwards of the forward study on a GPU). Results go to
``<out_dir>/<study>.csv`` (default ``$MOESD_DATA/measurements/<device>/``), rewritten atomically
after every point together with a JSON sidecar of the environment. A sweep that stops part-way resumes
where it stopped when run again with the same settings: a row cut mid-line or incomplete is dropped
and its point measured again. A finished result file is never replaced without ``overwrite=True``.

The timed MoE forward reads each activated expert's weights once per forward: the ``eager`` experts
implementation (a loop over activated experts) on a CPU, where it beat ``grouped_mm`` above 64
tokens per forward, and ``grouped_mm`` (one grouped GEMM) on CUDA. ``batched_mm`` is never used: it
gathers one weight copy per token and would read an expert as many times as it has tokens.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import io
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from moesd.measure import studies as measurements
from moesd._checks import UsageError, torch_device, writable_folder
from moesd._files import atomic_write
from moesd.measure.hardware import measured_roofline
from moesd.measure.studies import NULLABLE_COLUMNS, measurements_dir
from moesd.measure.router_control import RoutingControl, distinct_experts, set_top_k
from moesd.measure.sd import DecodeStats, SpeculativeDecoder, generate_autoregressive
from moesd.measure.static_cache import GraphStep, StaticCaches, filled_cache
from moesd.theory.speedup import alpha_from_sigma, speedup
from moesd.measure.sweeps import (BATCH_SIZES, DTYPES, FORWARD_STUDIES, PAPER_SIGMA, STUDIES, SweepConfig,  # noqa: F401
                          acceptance_seed, estimate_seconds, gpu_label, paper_workloads, preset, preset_settings)
from moesd.zoo import default_experts_implementation, get_model

summarize = measurements.summarize
"""Kept importable from its old home; chapters import it from :mod:`moesd.measure.studies`."""


def environment(config: SweepConfig) -> dict:
    """Device, software and provenance of a sweep, for its JSON sidecar."""
    device = torch.device(config.device)
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        name, memory = properties.name, properties.total_memory
        driver = _command(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    else:
        name, memory, driver = _cpu_name(), None, None
    if config.study in FORWARD_STUDIES:
        acceptance = {"mode": "none"}
    elif config.study == "settings":
        acceptance = {"mode": "synthetic", "workloads": [
            {**w, "sigma": {str(g): s for g, s in w["sigma"].items()},
             "alpha": {str(g): float(alpha_from_sigma(s, g)) for g, s in w["sigma"].items()}}
            for w in config.workloads]}
    elif config.sigma == "real":
        acceptance = {"mode": "real"}
    else:
        acceptance = {"mode": "synthetic", "sigma": {str(g): s for g, s in config.sigma.items()},
                      "alpha": {str(g): float(alpha_from_sigma(s, g)) for g, s in config.sigma.items()}}
    return {
        "device": name, "device_memory_bytes": memory, "driver": driver, "cuda": torch.version.cuda,
        "cpu_threads": torch.get_num_threads(), "load_average": _load_average(), "python": platform.python_version(),
        "torch": torch.__version__, "transformers": _version("transformers"),
        # MOESD_COMMIT names the commit of a copy whose .git is missing or stale (the GPU machine's was stale)
        "commit": (os.environ.get("MOESD_COMMIT")
                   or _command(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent)),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": _invocation(sys.argv), "weights": config.weights, "acceptance": acceptance,
        "protocol": "forward passes" if config.study in FORWARD_STUDIES else "steady state",
        "experts_implementation": (default_experts_implementation(device) if get_model(config.target).is_moe
                                   else None),
        # the measured roofline of this device in the sweep's dtype and threads: "hardware" (ridge point) and curves
        **measured_roofline(config.device, config.dtype).sidecar_entries(),
    }


def _invocation(argv: list) -> str:
    """The command line of this process; ``python -c`` running the CLI (as tools/gpu_run.py does) reads as ``moesd``."""
    return shlex.join(["moesd", *argv[1:]] if argv[:1] == ["-c"] else argv)


def _command(arguments, cwd=None) -> str | None:
    try:
        return subprocess.run(arguments, capture_output=True, text=True, check=True, cwd=cwd).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def _load_average() -> list | None:
    """The machine's load averages over 1, 5 and 15 minutes (None where the system keeps none)."""
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except OSError:
        return None


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "cpu"


def check_device(device: str) -> None:
    """Refuse a device this machine does not have (:class:`~moesd._checks.UsageError` naming it)."""
    torch_device("device", device)


def device_label(device: str) -> str:
    """A folder name for a device: the GPU's name (``h100``, ``h200``...) or ``cpu``."""
    if torch.device(device).type != "cuda":
        return "cpu"
    return gpu_label(torch.cuda.get_device_name(torch.device(device)))


def check_sweep(config: SweepConfig, out_dir=None, overwrite: bool = False) -> Path:
    """The result file a sweep will write, after every check that needs no model.

    The device must be here, the folder (default ``$MOESD_DATA/measurements/<device>``) writable, and
    an existing result file resumable (see :class:`ResultFile`) unless ``overwrite``.

    Raises
    ------
    UsageError
        A ``ValueError`` for a missing device, a folder that is a file or read-only, or a result file
        or sidecar that is not a regular file.
    FileExistsError
        If the result file holds a finished sweep or one with other settings and ``overwrite`` is False.
    """
    check_device(config.device)
    folder = out_dir if out_dir is not None else measurements_dir() / device_label(config.device)
    path = writable_folder("out_dir", folder) / f"{config.study}.csv"
    _resumable(path, config, overwrite)
    return path


# ---- Result files --------------------------------------------------------------------------------

def _key(row: dict, columns) -> tuple:
    """A row's key with missing values as None and numbers as floats (CSV round trips change types)."""
    values = []
    for column in columns:
        value = row.get(column)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            values.append(None)
        elif isinstance(value, (int, float, np.integer, np.floating)):
            values.append(float(value))
        else:
            values.append(value)
    return tuple(values)


def read_complete_rows(path, nullable=NULLABLE_COLUMNS) -> list[dict]:
    """The complete rows of a result CSV; a line cut mid-way or a row with empty cells is dropped.

    A row is complete when its line ends with a newline, it has the header's number of fields, and
    no cell outside ``nullable`` (default :data:`NULLABLE_COLUMNS`) is empty. Each dropped row is
    named in a warning.
    """
    text = Path(path).read_text()
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        warnings.warn(f"{path}: dropped line {len(lines)}, cut mid-line; its point will be measured again",
                      stacklevel=2)
        lines = lines[:-1]
    if len(lines) < 2:
        return []
    frame = pd.read_csv(io.StringIO("".join(lines)), on_bad_lines="warn")
    required = [column for column in frame.columns if column not in nullable]
    incomplete = frame[required].isna().any(axis=1)
    for index in np.flatnonzero(incomplete):
        warnings.warn(f"{path}: dropped data row {index + 1}, which has empty cells; its point will be "
                      "measured again", stacklevel=2)
    return frame[~incomplete].to_dict("records")


def _resumable(path: Path, config: SweepConfig, overwrite: bool) -> bool:
    """Whether ``path`` holds rows to resume from; refuse what must not be replaced (see :func:`check_sweep`)."""
    sidecar = path.with_suffix(".json")
    for file in (path, sidecar):
        if file.exists() and not file.is_file():
            raise UsageError(f"{file} is not a regular file; choose another out_dir")
    if overwrite or not path.exists():
        return False
    try:
        previous = json.loads(sidecar.read_text()) if sidecar.exists() else {}
    except (json.JSONDecodeError, UnicodeDecodeError):
        previous = {}
    elsewhere = "pass overwrite (--overwrite) to replace it, or write elsewhere (out_dir, --out-dir or MOESD_DATA)"
    if previous.get("complete"):
        raise FileExistsError(f"{path} holds a finished sweep; {elsewhere}")
    if previous.get("settings") != config.settings():
        raise FileExistsError(f"{path} holds a sweep with other settings; {elsewhere}")
    return True


class ResultFile:
    """``<study>.csv`` plus its ``.json`` sidecar: resumable, written atomically, never silently replaced."""

    nullable = NULLABLE_COLUMNS
    """Columns a complete row may leave empty (an engine that cannot measure a column adds it)."""

    def __init__(self, path, config: SweepConfig, overwrite: bool = False):
        self.path, self.sidecar = Path(path), Path(path).with_suffix(".json")
        self.config, self.columns = config, config.key_columns()
        rows = read_complete_rows(self.path, self.nullable) if _resumable(self.path, config, overwrite) else []
        self.rows = {_key(row, self.columns): row for row in rows}
        self.environment = environment(config)
        self.earlier_runs = _earlier_runs(self.sidecar) if rows else []

    def done(self, keys) -> bool:
        """Whether every key (a dict of key-column values) already has a row: a resumed sweep skips it."""
        return all(_key(key, self.columns) in self.rows for key in keys)

    def add(self, rows: list[dict]) -> None:
        """Add (or replace) one point's rows and rewrite both files atomically."""
        for row in rows:
            self.rows[_key(row, self.columns)] = row
        with atomic_write(self.path, "w") as file:
            pd.DataFrame(list(self.rows.values())).to_csv(file, index=False)
        self._write_sidecar(False)

    def finish(self, expected_keys) -> None:
        """Mark the sweep complete once every expected key has a complete row."""
        missing = [key for key in expected_keys if _key(key, self.columns) not in self.rows]
        if missing:
            raise RuntimeError(f"{self.path}: {len(missing)} point(s) not measured, e.g. {missing[0]}")
        self._write_sidecar(True)

    def _write_sidecar(self, complete: bool) -> None:
        from moesd.measure.regime import measured_streaming_share

        sidecar = {**self.environment, "settings": self.config.settings(), "complete": complete,
                   "rows": len(self.rows), "load_average_now": _load_average(),
                   **({"earlier_runs": self.earlier_runs} if self.earlier_runs else {})}
        share = measured_streaming_share(pd.DataFrame(list(self.rows.values())), sidecar)
        with atomic_write(self.sidecar, "w") as file:
            json.dump({**sidecar, **({"streaming_share": share} if share else {})}, file, indent=2)


EARLIER_RUN_FIELDS = ("date", "commit", "command", "device", "driver", "cuda", "torch", "transformers", "rows")
"""What a resumed sweep's sidecar keeps of each earlier run (the top-level fields describe the last)."""


def _earlier_runs(sidecar: Path) -> list[dict]:
    """The runs a resumed result file's rows came from: the earlier sidecar's history and its own run."""
    try:
        previous = json.loads(sidecar.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return []
    return previous.get("earlier_runs", []) + [{name: previous.get(name) for name in EARLIER_RUN_FIELDS}]


# ---- Models and timing ----------------------------------------------------------------------------

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


def _random_ids(batch_size: int, length: int, vocab_size: int, seed: int, device: str) -> torch.Tensor:
    """Seeded random token ids (timing depends on shapes, not on which tokens)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab_size, (batch_size, length), generator=generator).to(device)


class Timer:
    """Seconds of one call: CUDA events on a GPU (after waiting for the work queued before), the wall clock elsewhere."""

    def __init__(self, device: str):
        self.cuda = torch.device(device).type == "cuda"

    def __call__(self, function) -> float:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            function()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / 1e3
        tick = time.perf_counter()
        function()
        return time.perf_counter() - tick


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
                    new = _random_ids(batch, tokens, model.config.vocab_size, tokens, config.device)
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


def _variants(config: SweepConfig, batch: int, top_k, run: int) -> list[dict]:
    """The SD runs of one point: one per gamma (and workload), with their key and acceptance columns."""
    workloads = config.workloads or ({},)
    variants = []
    for gamma in config.gammas:
        for workload in workloads:
            sigma = workload["sigma"][gamma] if workload else (None if config.sigma == "real" else config.sigma[gamma])
            label = f"{workload['dataset']} T={workload['temperature']:g}" if workload else ""
            setting = {"dataset": workload["dataset"], "temperature": workload["temperature"],
                       "setting": label} if workload else {}
            variants.append({"run": run, "batch_size": batch, "gamma": gamma, "num_experts_per_tok": top_k,
                             **setting, "context": config.context,
                             "seed": acceptance_seed(config.study, batch, gamma, top_k, run, label, config.seed),
                             "sigma_target": sigma,
                             "alpha": None if sigma is None else float(alpha_from_sigma(sigma, gamma)),
                             "warmup_rounds": config.warmup_rounds})
    return variants


@torch.no_grad()
def run_e2e_study(config: SweepConfig, result: ResultFile, progress: bool = True) -> None:
    """AR and SD under the steady-state protocol over top_ks x repeats x batch sizes (x gammas, workloads)."""
    rng = np.random.default_rng(config.seed)
    points = [(top_k, run, batch) for top_k in config.top_k_values for run in range(config.repeats)
              for batch in config.batch_sizes]
    every = [v for top_k, run, batch in points for v in _variants(config, batch, top_k, run)]
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
                    ids = _random_ids(config.batch_sizes[0], config.context, target.config.vocab_size, 0,
                                      config.device)
                    time_autoregressive(target, ids, 2, 1)
                    for decoder in decoders.values():
                        time_speculative(decoder, ids, 2, 1, alpha=0.5, seed=0)
                for run in range(config.repeats):
                    for index in rng.permutation(len(config.batch_sizes)):
                        batch = config.batch_sizes[index]
                        bar.update()
                        variants = _variants(config, batch, top_k, run)
                        if result.done(variants):
                            continue
                        ids = _random_ids(batch, config.context, target.config.vocab_size,
                                          int(np.random.SeedSequence([config.seed, run, batch]).generate_state(1)[0]),
                                          config.device)
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
    complete rows when run again with the same settings.
    """
    result = ResultFile(check_sweep(config, out_dir, overwrite), config, overwrite)
    if config.study in FORWARD_STUDIES:
        run_forward_study(config, result, progress)
    else:
        run_e2e_study(config, result, progress)
    return result.path


