"""Timing sweeps of the paper's experiments (Sec. 4), written as result files with their environment.

Studies
-------
forward
    T_T(B, s) and T_D(B, s): one forward of ``s`` new tokens per sequence over a KV cache of
    ``context`` tokens, for every batch size B and s in {1, gamma, gamma + 1}.
e2e
    Autoregressive against speculative decoding over B and gamma: T_AR, T_SD, sigma, speedup and
    target efficiency per point, every repeat kept as its own row.
sparsity
    The e2e study for each experts-per-token K of the target (the paper's sparsity sweep).
dense
    The e2e study for the dense pair (OPT-30b / OPT-350m shapes).
dense_forward
    The forward study for the dense pair.

Method: warm-up runs first; configurations are visited in a seeded random order in every repeat so
that drift (thermal, background load) spreads evenly over them; device work is synchronised before
every clock reading (CUDA events time the forwards on a GPU). Results go to
``<out_dir>/<study>.csv``, rewritten atomically after every configuration, with a JSON sidecar of
the environment. A sweep that stops part-way resumes where it stopped when run again with the same
settings; a finished result file is never replaced without ``overwrite=True``.

The timed MoE forward reads each activated expert's weights once per forward: the ``eager`` experts
implementation (a loop over activated experts) on a CPU, where it beat ``grouped_mm`` above 64
tokens per forward, and ``grouped_mm`` (one grouped GEMM) on CUDA. ``batched_mm`` is never used: it
gathers one weight copy per token and would read an expert as many times as it has tokens.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from moesd._files import atomic_write
from moesd.hardware import measured_roofline
from moesd.sd import SpeculativeDecoder, generate_autoregressive
from moesd.speedup import alpha_from_sigma
from moesd.zoo import default_experts_implementation, get_model

BATCH_SIZES = (1, 2, 4, *range(8, 61, 4), 80, 100)
"""The paper's batch sizes: 19 values from 1 to 100."""

PAPER_SIGMA = {2: 0.95, 3: 0.93, 4: 0.90}
"""sigma of Qwen2-57B-A14B with Qwen2-0.5B on HumanEval at temperature 0 (paper, Tables 1-2)."""

STUDIES = ("forward", "e2e", "sparsity", "dense", "dense_forward")


@dataclass
class SweepConfig:
    """Everything that defines a sweep; two runs with equal configs write the same kind of rows.

    Attributes
    ----------
    study : str
        One of :data:`STUDIES`.
    target, draft : str
        :data:`moesd.zoo.MODELS` names (or hub ids).
    weights : str
        ``"random"`` (the zoo's shapes with random weights) or ``"pretrained"`` (from the hub or
        ``target_path``/``draft_path``).
    layers, draft_layers : int, optional
        Decoder layers kept (default: all).
    width : float
        Width factor of both models with random weights (1 keeps real widths).
    batch_sizes : tuple of int
    gammas : tuple of int
    top_ks : tuple of int, optional
        Experts per token of the target (sparsity study); default the checkpoint's.
    sigma : dict, optional
        Target sigma per gamma for synthetic acceptance (alpha from Eq. 5 inverted); ``None``
        means real acceptance (pretrained weights only).
    context : int
        Prompt tokens per sequence.
    max_new_tokens : int
        Tokens generated per sequence in the e2e studies.
    repeats, warmup : int
    dtype : str
        ``"float32"``, ``"bfloat16"``...
    device : str
    seed : int
    """

    study: str
    target: str
    draft: str
    weights: str = "random"
    layers: int | None = None
    draft_layers: int | None = None
    width: float = 1.0
    batch_sizes: tuple = BATCH_SIZES
    gammas: tuple = (2, 3, 4)
    top_ks: tuple | None = None
    sigma: dict | None = field(default_factory=lambda: dict(PAPER_SIGMA))
    context: int = 64
    max_new_tokens: int = 32
    repeats: int = 5
    warmup: int = 1
    dtype: str = "float32"
    device: str = "cpu"
    seed: int = 0
    target_path: str | None = None
    draft_path: str | None = None

    def __post_init__(self):
        if self.study not in STUDIES:
            raise ValueError(f"study must be one of {', '.join(STUDIES)}, got {self.study!r}")
        if self.weights not in ("random", "pretrained"):
            raise ValueError(f"weights must be 'random' or 'pretrained', got {self.weights!r}")
        if self.sigma is None and self.weights == "random":
            raise ValueError("random weights accept almost nothing: give sigma for synthetic acceptance")
        if self.sigma is not None:
            self.sigma = {int(g): float(s) for g, s in self.sigma.items()}
            missing = [g for g in self.gammas if g not in self.sigma]
            if missing:
                raise ValueError(f"sigma has no value for gamma {missing}")
        for name in ("repeats", "context", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if min(self.batch_sizes) < 1 or min(self.gammas) < 1:
            raise ValueError("batch sizes and gammas must be >= 1")
        self.batch_sizes, self.gammas = tuple(self.batch_sizes), tuple(self.gammas)
        self.top_ks = None if self.top_ks is None else tuple(self.top_ks)

    def settings(self) -> dict:
        """The config as plain JSON values (what a resumed sweep must match)."""
        settings = dataclasses.asdict(self)
        settings["sigma"] = None if self.sigma is None else {str(g): s for g, s in self.sigma.items()}
        return json.loads(json.dumps(settings))


def environment(config: SweepConfig) -> dict:
    """Device, software and provenance of a sweep, for its JSON sidecar."""
    device = torch.device(config.device)
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        name, memory = properties.name, properties.total_memory
        driver = _command(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    else:
        name, memory, driver = _cpu_name(), None, None
    acceptance = ({"mode": "synthetic", "sigma": config.sigma,
                   "alpha": {str(g): float(alpha_from_sigma(s, g)) for g, s in config.sigma.items()}}
                  if config.sigma is not None else {"mode": "real"})
    return {
        "device": name, "device_memory_bytes": memory, "driver": driver, "cuda": torch.version.cuda,
        "cpu_threads": torch.get_num_threads(), "python": platform.python_version(),
        "torch": torch.__version__, "transformers": _version("transformers"),
        "commit": _command(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(sys.argv), "weights": config.weights, "acceptance": acceptance,
        "experts_implementation": default_experts_implementation(device),
        # the measured roofline of this device in the sweep's dtype and threads: "hardware" (ridge point) and curves
        **measured_roofline(config.device, config.dtype).sidecar_entries(),
    }


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


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "cpu"


def device_label(device: str) -> str:
    """A folder name for a device: the GPU's name (``h100``, ``h200``...) or ``cpu``."""
    if torch.device(device).type != "cuda":
        return "cpu"
    name = torch.cuda.get_device_name(torch.device(device)).lower()
    for known in ("h200", "h100", "h800", "a800", "a100", "l40", "b200", "mi300x"):
        if known in name:
            return known
    return "".join(c if c.isalnum() else "-" for c in name).strip("-")


class ResultFile:
    """``<study>.csv`` plus its ``.json`` sidecar: resumable, written atomically, never silently replaced."""

    def __init__(self, path: Path, config: SweepConfig, overwrite: bool = False):
        self.path, self.sidecar = Path(path), Path(path).with_suffix(".json")
        self.config = config
        self.rows: list[dict] = []
        if self.path.exists() and not overwrite:
            previous = json.loads(self.sidecar.read_text()) if self.sidecar.exists() else {}
            if previous.get("complete"):
                raise FileExistsError(f"{self.path} holds a finished sweep; pass overwrite to replace it")
            if previous.get("settings") != config.settings():
                raise FileExistsError(f"{self.path} holds a sweep with other settings; pass overwrite "
                                      "to replace it")
            self.rows = pd.read_csv(self.path).to_dict("records")
        self.environment = environment(config)

    def done(self, **key) -> bool:
        """Whether a row with these values already exists (a resumed sweep skips it)."""
        return any(all(row.get(k) == v for k, v in key.items()) for row in self.rows)

    def add(self, rows: list[dict], complete: bool = False) -> None:
        """Append rows and rewrite both files atomically."""
        self.rows.extend(rows)
        with atomic_write(self.path, "w") as file:
            pd.DataFrame(self.rows).to_csv(file, index=False)
        self._write_sidecar(complete)

    def finish(self) -> None:
        """Mark the sweep complete."""
        self._write_sidecar(True)

    def _write_sidecar(self, complete: bool) -> None:
        with atomic_write(self.sidecar, "w") as file:
            json.dump({**self.environment, "settings": self.config.settings(), "complete": complete,
                       "rows": len(self.rows)}, file, indent=2)


def build_models(config: SweepConfig, top_k: int | None = None):
    """The target and draft of a sweep on its device, in eval mode, with one shared vocabulary."""
    dtype = getattr(torch, config.dtype)
    target_spec, draft_spec = get_model(config.target), get_model(config.draft)
    if config.weights == "pretrained":
        changes = {} if top_k is None else {"num_experts_per_tok": top_k}  # overrides the loaded config
        target = target_spec.load(config.target_path, dtype=dtype, device=config.device, **changes)
        draft = draft_spec.load(config.draft_path, dtype=dtype, device=config.device)
        return target, draft
    target = target_spec.random_model(config.layers, top_k, config.width, seed=config.seed, dtype=dtype,
                                      device=config.device)
    draft = draft_spec.random_model(config.draft_layers, None, config.width, seed=config.seed + 1,
                                    dtype=dtype, device=config.device, vocab_size=target.config.vocab_size)
    return target, draft


def _random_ids(batch_size: int, length: int, vocab_size: int, seed: int, device: str) -> torch.Tensor:
    """Seeded random token ids (timing depends on shapes, not on which tokens)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab_size, (batch_size, length), generator=generator).to(device)


class _Timer:
    """Seconds of one call: CUDA events on a GPU, the synchronised wall clock elsewhere."""

    def __init__(self, device: str):
        self.cuda = torch.device(device).type == "cuda"

    def __call__(self, function) -> float:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            function()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / 1e3
        tick = time.perf_counter()
        function()
        return time.perf_counter() - tick


@torch.no_grad()
def run_forward_study(config: SweepConfig, result: ResultFile, progress: bool = True) -> None:
    """T_T(B, s) and T_D(B, s) for every B and s in {1} and {gamma, gamma + 1} of ``config.gammas``."""
    target, draft = build_models(config)
    sizes = sorted({1, *config.gammas, *(g + 1 for g in config.gammas)})
    timer = _Timer(config.device)
    caches = {}
    for role, model in (("target", target), ("draft", draft)):
        for batch in config.batch_sizes:
            ids = _random_ids(batch, config.context, model.config.vocab_size, batch, config.device)
            caches[role, batch] = model(input_ids=ids, use_cache=True).past_key_values

    def one(role, batch, tokens):
        model = target if role == "target" else draft
        new = _random_ids(batch, tokens, model.config.vocab_size, tokens, config.device)
        cache = caches[role, batch]
        positions = torch.arange(config.context, config.context + tokens, device=config.device).expand(batch, -1)
        seconds = timer(lambda: model(input_ids=new, position_ids=positions, past_key_values=cache, use_cache=True))
        cache.crop(-tokens)  # drop the timed tokens (crop takes a negative count)
        return seconds

    points = [(role, batch, tokens) for role in ("target", "draft") for batch in config.batch_sizes
              for tokens in sizes]
    for point in points[:: max(1, len(points) // 8)] * config.warmup:
        one(*point)
    rng = np.random.default_rng(config.seed)
    k = target.config.num_experts_per_tok if hasattr(target.config, "num_experts_per_tok") else None
    with tqdm(total=len(points) * config.repeats, desc="forward study", disable=not progress) as bar:
        for run in range(config.repeats):
            rows = []
            for index in rng.permutation(len(points)):
                role, batch, tokens = points[index]
                bar.update()
                if result.done(run=run, role=role, batch_size=batch, tokens=tokens):
                    continue
                rows.append({"run": run, "role": role, "batch_size": batch, "tokens": tokens,
                             "context": config.context, "num_experts_per_tok": k, "seconds": one(role, batch, tokens)})
            result.add(rows)
    result.finish()


@torch.no_grad()
def run_e2e_study(config: SweepConfig, result: ResultFile, progress: bool = True) -> None:
    """AR and SD runs over top_ks x batch sizes x gammas; every repeat is its own row."""
    top_ks = config.top_ks or (None,)
    points = [(batch, gamma) for batch in config.batch_sizes for gamma in config.gammas]
    rng = np.random.default_rng(config.seed)
    tokens = config.max_new_tokens
    with tqdm(total=len(top_ks) * len(points) * config.repeats, desc=f"{config.study} study",
              disable=not progress) as bar:
        for top_k in top_ks:
            target, draft = build_models(config, top_k)
            k = getattr(target.config, "num_experts_per_tok", None)
            decoders = {gamma: SpeculativeDecoder(target, draft, gamma) for gamma in config.gammas}
            for _ in range(config.warmup):
                ids = _random_ids(config.batch_sizes[0], config.context, target.config.vocab_size, 0, config.device)
                generate_autoregressive(target, ids, max_new_tokens=4)
                decoders[config.gammas[0]].generate(ids, max_new_tokens=4, synthetic_acceptance=0.5)
            for run in range(config.repeats):
                rows = []
                for index in rng.permutation(len(points)):
                    batch, gamma = points[index]
                    bar.update()
                    key = dict(run=run, batch_size=batch, gamma=gamma)
                    if k is not None:
                        key["num_experts_per_tok"] = k
                    if result.done(**key):
                        continue
                    ids = _random_ids(batch, config.context, target.config.vocab_size, 1000 * run + batch,
                                      config.device)
                    alpha = None if config.sigma is None else float(alpha_from_sigma(config.sigma[gamma], gamma))
                    ar = generate_autoregressive(target, ids, max_new_tokens=tokens).stats
                    sd = decoders[gamma].generate(ids, max_new_tokens=tokens, synthetic_acceptance=alpha,
                                                  seed=run).stats
                    rows.append({**key, "num_experts_per_tok": k, "alpha": alpha, **_e2e_row(ar, sd, tokens)})
                result.add(rows)
    result.finish()


def _e2e_row(ar, sd, tokens: int) -> dict:
    """One e2e point from the AR and SD statistics of the same batch (prefill excluded)."""
    t_ar = (ar.t_total - ar.t_prefill) / (tokens - 1) if tokens > 1 else float("nan")
    t_sd = (sd.t_total - sd.t_prefill) / (tokens - 1) if tokens > 1 else float("nan")
    t_target_1 = ar.t_verify / ar.rounds
    t_target_gamma = sd.t_verify / sd.rounds
    return {"t_ar": t_ar, "t_sd": t_sd, "t_target_1": t_target_1, "t_target_gamma": t_target_gamma,
            "t_draft": sd.t_draft / (sd.rounds * sd.gamma), "t_reject": sd.t_reject / sd.rounds,
            "rounds": sd.rounds, "sigma": sd.sigma, "accept_length": sd.accept_length,
            "speedup": t_ar / t_sd, "target_efficiency": t_target_1 / t_target_gamma}


def run_sweep(config: SweepConfig, out_dir=None, overwrite: bool = False, progress: bool = True) -> Path:
    """Run a study and return its CSV path (``data/measurements/<device>/<study>.csv`` by default)."""
    from moesd.paper import DATA_DIR

    out_dir = Path(out_dir) if out_dir else DATA_DIR / "measurements" / device_label(config.device)
    result = ResultFile(out_dir / f"{config.study}.csv", config, overwrite)
    if config.study.endswith("forward"):
        run_forward_study(config, result, progress)
    else:
        run_e2e_study(config, result, progress)
    return result.path


def summarize(frame: pd.DataFrame, by: list[str], value: str) -> pd.DataFrame:
    """Median and interquartile range of ``value`` over repeats, grouped by ``by``."""
    grouped = frame.groupby(by)[value]
    return pd.DataFrame({"median": grouped.median(), "q25": grouped.quantile(0.25),
                         "q75": grouped.quantile(0.75), "runs": grouped.size()}).reset_index()


def preset(study: str, name: str = "cpu") -> SweepConfig:
    """The project's settings of a study.

    ``"cpu"``: scaled random-weight models sized for a 2-core CPU (each study in minutes) that keep
    E, K and the parameter shares of Qwen2-57B-A14B (4 of 28 layers, widths / 8; a 3-layer draft of
    the Qwen2-0.5B shape, 3.2 % of the target's active parameters against the real 3.4 %) and of the
    OPT pair (4 of 48 layers; a 2-layer OPT-350m-shaped draft, 1.1 % as in reality), with synthetic
    acceptance at the paper's sigma. ``"gpu"``: the real shapes in bf16 on CUDA with random weights
    (Qwen2-57B-A14B needs about 115 GB: it fits one H200; pass ``layers`` for a smaller GPU).
    """
    if name not in ("cpu", "gpu"):
        raise ValueError(f"preset must be 'cpu' or 'gpu', got {name!r}")
    dense = study in ("dense", "dense_forward")
    pair = dict(target="opt-30b", draft="opt-350m") if dense else dict(target="qwen2-57b-a14b", draft="qwen2-0.5b")
    settings = dict(study=study, **pair, gammas=(2, 4) if study == "sparsity" else (2, 3, 4),
                    top_ks=(1, 2, 4, 8, 16, 32) if study == "sparsity" else None)
    if name == "cpu":
        settings.update(layers=4, draft_layers=2 if dense else 3, width=1 / 8, dtype="float32", device="cpu",
                        max_new_tokens=12 if study == "sparsity" else 16, context=32 if study == "sparsity" else 64,
                        repeats={"forward": 5, "e2e": 3, "sparsity": 1, "dense": 2, "dense_forward": 5}[study])
    else:
        settings.update(dtype="bfloat16", device="cuda", max_new_tokens=64,
                        repeats=1 if study == "sparsity" else (10 if study.endswith("forward") else 3))
    return SweepConfig(**settings)
