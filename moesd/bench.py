"""Timing sweeps of the paper's experiments (Sec. 4), written as result files with their environment.

Studies
-------
forward
    T_T(B, s) and T_D(B, s): one forward of ``s`` new tokens per sequence over a KV cache of
    ``context`` tokens, for every batch size B, s in {1, gamma, gamma + 1} and experts per token K.
e2e
    Autoregressive (AR) against speculative decoding (SD) over B and gamma under the steady-state
    protocol below: T_AR, T_SD, sigma, speedup, Eq. 4 and target efficiency per point and repeat.
sparsity
    The e2e study for each experts-per-token K of the target (the paper's sparsity sweep, the
    fitting data of Algorithm 1).
dense, dense_forward
    The e2e and forward studies for the dense pair (OPT-30b / OPT-350m shapes).
settings
    The e2e study at the sigma of the paper's other workloads (Fig. 5): Table 1's Qwen2 rows on
    2xA800, HumanEval and MT-bench at temperatures 0 and 1, emulated by synthetic acceptance.

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

import dataclasses
import datetime
import io
import json
import math
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from moesd import measurements
from moesd._files import atomic_write
from moesd.hardware import measured_roofline
from moesd.measurements import NULLABLE_COLUMNS, measurements_dir
from moesd.sd import DecodeStats, SpeculativeDecoder, generate_autoregressive
from moesd.speedup import alpha_from_sigma, speedup
from moesd.zoo import default_experts_implementation, get_model

BATCH_SIZES = (1, 2, 4, *range(8, 61, 4), 80, 100)
"""The paper's batch sizes: 19 values from 1 to 100."""

PAPER_SIGMA = {2: 0.95, 3: 0.93, 4: 0.90}
"""sigma of Qwen2-57B-A14B with Qwen2-0.5B on HumanEval at temperature 0 on 2xH800, 4xA800 and 4xL40
(paper, Table 2; Table 1's 2xA800 row prints 0.94, 0.93, 0.91)."""

summarize = measurements.summarize
"""Kept importable from its old home; chapters import it from :mod:`moesd.measurements`."""

STUDIES = ("forward", "e2e", "sparsity", "dense", "dense_forward", "settings")
FORWARD_STUDIES = ("forward", "dense_forward")
DTYPES = ("float32", "float64", "bfloat16", "float16")


def paper_workloads(gammas=(2, 3, 4)) -> tuple:
    """The settings study's workloads: Table 1's Qwen2-57B-A14B rows on 2xA800 (paper).

    Returns
    -------
    tuple of dict
        ``{"dataset", "temperature", "sigma": {gamma: sigma}}`` for HumanEval and MT-bench at
        temperatures 0 and 1, read from ``data/paper/tables_1_2.csv``.
    """
    from moesd.paper import paper_table

    table = paper_table("tables_1_2")
    rows = table[(table["table"] == 1) & table["model"].str.startswith("Qwen2") & (table["device"] == "2xA800")]
    rows = rows.drop_duplicates(["dataset", "temperature", "gamma"])
    workloads = []
    for (dataset, temperature), part in rows.groupby(["dataset", "temperature"], sort=True):
        sigma = dict(zip(part["gamma"].astype(int), part["sigma"].astype(float)))
        missing = [g for g in gammas if g not in sigma]
        if missing:
            raise ValueError(f"Table 1 has no sigma for {dataset} at temperature {temperature} and gamma {missing}")
        workloads.append({"dataset": dataset, "temperature": float(temperature),
                          "sigma": {int(g): sigma[g] for g in gammas}})
    return tuple(workloads)


@dataclass
class SweepConfig:
    """Everything that defines a sweep; two runs with equal configs write the same kind of rows.

    Settings a study does not use are refused (``ValueError``), never recorded.

    Attributes
    ----------
    study : str
        One of :data:`STUDIES`.
    target, draft : str
        :data:`moesd.zoo.MODELS` names (or their hub ids).
    weights : str
        ``"random"`` (the zoo's shapes with random weights) or ``"pretrained"`` (from the hub or
        ``target_path``/``draft_path``; shape settings are then refused).
    layers, draft_layers : int, optional
        Decoder layers kept (default: all).
    width : float
        Width factor of both models with random weights, in (0, 1] (1 keeps real widths).
    batch_sizes, gammas : tuple of int
        Batch sizes B and draft lengths gamma (the forward study times s in {1, gamma, gamma + 1}).
    top_ks : tuple of int, optional
        Experts per token K of the target (MoE targets only); default the checkpoint's.
    sigma : dict, "real" or None
        Target sigma per gamma for synthetic acceptance (alpha from Eq. 5 inverted), or ``"real"``
        for real greedy acceptance (pretrained weights). ``None`` takes the study's default: the
        paper's :data:`PAPER_SIGMA` with random weights, real acceptance with pretrained ones; the
        forward and settings studies use none.
    workloads : tuple of dict, optional
        Settings study only: ``{"dataset", "temperature", "sigma": {gamma: sigma}}`` per workload
        (default :func:`paper_workloads`).
    context : int
        Prompt tokens per sequence (the KV cache the forward study times over).
    rounds, warmup_rounds : int, optional
        Timed SD rounds (and AR steps) per point, and untimed rounds before them (e2e-type studies;
        defaults 32 and 1).
    repeats, warmup : int
        Repeats of every point; warm-up runs of the whole study before timing.
    dtype : str
        One of :data:`DTYPES`.
    device : str
        ``"cpu"`` or ``"cuda"`` / ``"cuda:N"``.
    seed : int
        Seed of the weights, the prompts, the order of points and the acceptance seeds.
    target_path, draft_path : str, optional
        Local folders of pretrained weights.
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
    sigma: dict | str | None = None
    workloads: tuple | None = None
    context: int = 16
    rounds: int | None = None
    warmup_rounds: int | None = None
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
        target, draft = (_model_spec(name, role) for name, role in ((self.target, "target"), (self.draft, "draft")))
        self._check_shape(target, draft)
        self.batch_sizes = _whole_numbers("batch_sizes", self.batch_sizes)
        self.gammas = _whole_numbers("gammas", self.gammas)
        for name in ("context", "repeats"):
            setattr(self, name, _whole(name, getattr(self, name), 1))
        self.warmup, self.seed = _whole("warmup", self.warmup, 0), _whole("seed", self.seed, 0)
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if not isinstance(self.device, str) or not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        if self.top_ks is not None:
            if not target.is_moe:
                raise ValueError(f"top_ks applies to MoE targets; {target.name} is dense")
            self.top_ks = _whole_numbers("top_ks", self.top_ks)
            if max(self.top_ks) > target.num_experts:
                raise ValueError(f"top_ks must lie in [1, {target.num_experts}] (E of {target.name}), "
                                 f"got {max(self.top_ks)}")
        if self.study in FORWARD_STUDIES:
            for name in ("sigma", "workloads", "rounds", "warmup_rounds"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name} is not used by the {self.study} study (forward passes only); "
                                     "leave it unset")
        else:
            self.rounds = _whole("rounds", 32 if self.rounds is None else self.rounds, 1)
            self.warmup_rounds = _whole("warmup_rounds", 1 if self.warmup_rounds is None else self.warmup_rounds, 0)
            self._check_acceptance()

    def _check_shape(self, target, draft) -> None:
        if self.weights == "pretrained":
            shaped = {name: value for name, value in (("layers", self.layers), ("draft_layers", self.draft_layers),
                                                      ("width", None if self.width == 1 else self.width))
                      if value is not None}
            if shaped:
                raise ValueError(f"{', '.join(f'{k}={v}' for k, v in shaped.items())}: shape settings apply to "
                                 "random weights only; pretrained weights keep their checkpoint's shape")
            return
        if self.target_path or self.draft_path:
            raise ValueError("target_path and draft_path apply to pretrained weights only")
        if not (isinstance(self.width, (int, float)) and 0 < self.width <= 1):
            raise ValueError(f"width must be in (0, 1], got {self.width!r}")
        for name, spec in (("layers", target), ("draft_layers", draft)):
            if getattr(self, name) is not None:
                setattr(self, name, _whole(name, getattr(self, name), 1, spec.num_layers))

    def _check_acceptance(self) -> None:
        if self.study == "settings":
            if self.sigma is not None:
                raise ValueError("sigma is not used by the settings study: its workloads carry their own sigma")
            workloads = paper_workloads(self.gammas) if self.workloads is None else self.workloads
            self.workloads = tuple({"dataset": str(w["dataset"]), "temperature": float(w["temperature"]),
                                    "sigma": self._sigma_per_gamma(w["sigma"], f"{w['dataset']} sigma")}
                                   for w in workloads)
            return
        if self.workloads is not None:
            raise ValueError(f"workloads are used by the settings study only, not by {self.study}")
        if self.sigma is None:  # the study's default
            self.sigma = ("real" if self.weights == "pretrained"
                          else {g: PAPER_SIGMA[g] for g in self.gammas if g in PAPER_SIGMA})
        if self.sigma == "real":
            if self.weights == "random":
                raise ValueError("random weights accept almost nothing: give sigma for synthetic acceptance")
            return
        self.sigma = self._sigma_per_gamma(self.sigma, "sigma")

    def _sigma_per_gamma(self, values, name: str) -> dict:
        if not isinstance(values, dict):
            raise ValueError(f"{name} must map each gamma to a sigma, got {values!r}")
        values = {int(g): float(s) for g, s in values.items()}
        missing = [g for g in self.gammas if g not in values]
        if missing:
            raise ValueError(f"{name} has no value for gamma {missing} (one sigma per gamma {list(self.gammas)})")
        unused = sorted(set(values) - set(self.gammas))
        if unused:
            raise ValueError(f"{name} has values for gamma {unused}, which the sweep does not run")
        for gamma, value in values.items():
            if not 1 / (gamma + 1) <= value <= 1:
                raise ValueError(f"{name} at gamma {gamma} must lie in [1/(gamma+1), 1] = [{1 / (gamma + 1):.3f}, 1], "
                                 f"got {value}")
        return values

    @property
    def top_k_values(self) -> tuple:
        """The K of every pass: ``top_ks``, or the target checkpoint's (None for a dense target)."""
        return self.top_ks or (get_model(self.target).top_k,)

    def key_columns(self) -> tuple:
        """Columns that identify a row: one measurement per distinct key."""
        if self.study in FORWARD_STUDIES:
            return ("num_experts_per_tok", "run", "role", "batch_size", "tokens")
        return ("num_experts_per_tok", "dataset", "temperature", "run", "batch_size", "gamma")

    def settings(self) -> dict:
        """The config as plain JSON values (what a resumed sweep must match)."""
        return json.loads(json.dumps(dataclasses.asdict(self)))


def _model_spec(name, role):
    try:
        return get_model(name)
    except KeyError as error:
        raise ValueError(f"{role} {error.args[0]}") from None


def _whole(name: str, value, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer)) or value != int(value):
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    if value < low or (high is not None and value > high):
        allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return int(value)


def _whole_numbers(name: str, values) -> tuple:
    values = tuple(values) if isinstance(values, (list, tuple)) else (values,)
    if not values:
        raise ValueError(f"{name} must hold at least one value")
    values = tuple(_whole(name, v, 1) for v in values)
    if len(set(values)) != len(values):
        raise ValueError(f"{name} must not repeat a value, got {list(values)}")
    return values


def acceptance_seed(study: str, batch_size: int, gamma: int, top_k: int | None, run: int,
                    workload: str = "", base_seed: int = 0) -> int:
    """An independent seed per point: ``numpy.random.SeedSequence`` of its coordinates (32 bits)."""
    entropy = [base_seed, zlib.crc32(study.encode()), zlib.crc32(workload.encode()), batch_size, gamma,
               top_k or 0, run]
    return int(np.random.SeedSequence(entropy).generate_state(1)[0])


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
        "cpu_threads": torch.get_num_threads(), "python": platform.python_version(),
        "torch": torch.__version__, "transformers": _version("transformers"),
        "commit": _command(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(sys.argv), "weights": config.weights, "acceptance": acceptance,
        "protocol": "forward passes" if config.study in FORWARD_STUDIES else "steady state",
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


def check_device(device: str) -> None:
    """Refuse a device this machine does not have (``ValueError`` naming it and what is available)."""
    parsed = torch.device(device)
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} is not available: this torch ({torch.__version__}) sees no CUDA "
                             "device; use device 'cpu'")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r} is not available: {torch.cuda.device_count()} CUDA device(s)")


def device_label(device: str) -> str:
    """A folder name for a device: the GPU's name (``h100``, ``h200``...) or ``cpu``."""
    if torch.device(device).type != "cuda":
        return "cpu"
    name = torch.cuda.get_device_name(torch.device(device)).lower()
    for known in ("h200", "h100", "h800", "a800", "a100", "l40", "b200", "mi300x"):
        if known in name:
            return known
    return "".join(c if c.isalnum() else "-" for c in name).strip("-")


def check_out_dir(out_dir) -> Path:
    """Refuse an output folder that is a file or cannot be written; return it as a Path."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"out_dir {str(out_dir)!r} is not a folder")
    existing = next(p for p in (out_dir, *out_dir.parents) if p.exists())
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as error:
        raise ValueError(f"out_dir {str(out_dir)!r} cannot be written ({existing}: {error.strerror})") from None
    return out_dir


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


class ResultFile:
    """``<study>.csv`` plus its ``.json`` sidecar: resumable, written atomically, never silently replaced."""

    nullable = NULLABLE_COLUMNS
    """Columns a complete row may leave empty (an engine that cannot measure a column adds it)."""

    def __init__(self, path, config: SweepConfig, overwrite: bool = False):
        self.path, self.sidecar = Path(path), Path(path).with_suffix(".json")
        self.config, self.columns = config, config.key_columns()
        for file in (self.path, self.sidecar):
            if file.exists() and not file.is_file():
                raise ValueError(f"{file} is not a regular file; choose another out_dir")
        rows = []
        if self.path.exists() and not overwrite:
            try:
                previous = json.loads(self.sidecar.read_text()) if self.sidecar.exists() else {}
            except json.JSONDecodeError:
                previous = {}
            if previous.get("complete"):
                raise FileExistsError(f"{self.path} holds a finished sweep; pass overwrite to replace it")
            if previous.get("settings") != config.settings():
                raise FileExistsError(f"{self.path} holds a sweep with other settings; pass overwrite "
                                      "to replace it")
            rows = read_complete_rows(self.path, self.nullable)
        self.rows = {_key(row, self.columns): row for row in rows}
        self.environment = environment(config)

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
        with atomic_write(self.sidecar, "w") as file:
            json.dump({**self.environment, "settings": self.config.settings(), "complete": complete,
                       "rows": len(self.rows)}, file, indent=2)


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


def time_autoregressive(target, input_ids: torch.Tensor, rounds: int, warmup_rounds: int) -> DecodeStats:
    """The timed window of ``rounds`` AR steps after ``warmup_rounds``, every sequence active (greedy)."""
    steps = warmup_rounds + rounds
    stats = generate_autoregressive(target, input_ids, max_new_tokens=steps + 1, max_rounds=steps).stats
    return _timed_window(stats, warmup_rounds)


def time_speculative(decoder: SpeculativeDecoder, input_ids: torch.Tensor, rounds: int, warmup_rounds: int,
                     alpha: float | None = None, seed: int | None = None) -> DecodeStats:
    """The timed window of ``rounds`` SD rounds after ``warmup_rounds``, every sequence active.

    ``alpha`` is the synthetic acceptance probability (``None``: real greedy acceptance).
    """
    total = warmup_rounds + rounds
    stats = decoder.generate(input_ids, max_new_tokens=1 + total * (decoder.gamma + 1), max_rounds=total,
                             synthetic_acceptance=alpha, seed=seed).stats
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


# ---- Studies --------------------------------------------------------------------------------------

@torch.no_grad()
def run_forward_study(config: SweepConfig, result: ResultFile, progress: bool = True) -> None:
    """T_T(B, s) and T_D(B, s) for every K, B and s in {1} and {gamma, gamma + 1} of ``config.gammas``."""
    sizes = sorted({1, *config.gammas, *(g + 1 for g in config.gammas)})
    points = [(role, batch, tokens) for role in ("target", "draft") for batch in config.batch_sizes
              for tokens in sizes]
    timer, rng = _Timer(config.device), np.random.default_rng(config.seed)
    orders = [rng.permutation(len(points)) for _ in range(config.repeats)]
    keys = [dict(num_experts_per_tok=k, run=run, role=role, batch_size=batch, tokens=tokens)
            for k in config.top_k_values for run in range(config.repeats) for role, batch, tokens in points]
    with tqdm(total=len(keys), desc=f"{config.study} study", disable=not progress) as bar:
        for top_k in config.top_k_values:
            if result.done([key for key in keys if key["num_experts_per_tok"] == top_k]):
                bar.update(len(points) * config.repeats)
                continue
            target, draft = build_models(config, top_k)
            models = {"target": target, "draft": draft}
            caches = {(role, batch): models[role](input_ids=_random_ids(batch, config.context,
                                                                        model.config.vocab_size, batch,
                                                                        config.device), use_cache=True).past_key_values
                      for role, model in models.items() for batch in config.batch_sizes}

            def one(role, batch, tokens):
                model, cache = models[role], caches[role, batch]
                new = _random_ids(batch, tokens, model.config.vocab_size, tokens, config.device)
                positions = torch.arange(config.context, config.context + tokens, device=config.device)
                seconds = timer(lambda: model(input_ids=new, position_ids=positions.expand(batch, -1),
                                              past_key_values=cache, use_cache=True))
                cache.crop(-tokens)  # drop the timed tokens (crop takes a negative count)
                return seconds

            for point in points[:: max(1, len(points) // 8)] * config.warmup:
                one(*point)
            for run, order in enumerate(orders):
                for index in order:
                    role, batch, tokens = points[index]
                    key = dict(num_experts_per_tok=top_k, run=run, role=role, batch_size=batch, tokens=tokens)
                    bar.update()
                    if not result.done([key]):
                        result.add([{**key, "context": config.context, "seconds": one(role, batch, tokens)}])
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
    with tqdm(total=len(points), desc=f"{config.study} study", disable=not progress) as bar:
        for top_k in config.top_k_values:
            if result.done([v for v in every if v["num_experts_per_tok"] == top_k]):
                bar.update(len(config.batch_sizes) * config.repeats)
                continue
            target, draft = build_models(config, top_k)
            decoders = {gamma: SpeculativeDecoder(target, draft, gamma) for gamma in config.gammas}
            for _ in range(config.warmup):
                ids = _random_ids(config.batch_sizes[0], config.context, target.config.vocab_size, 0, config.device)
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
                    result.add(_measure_point(target, decoders, ids, variants, config, rng))
    result.finish(every)


def _measure_point(target, decoders, ids, variants, config, rng) -> list[dict]:
    """One AR run and one SD run per variant on the same prompts, in a random order; a row per variant."""
    windows = {}
    for index in rng.permutation(len(variants) + 1):
        if index == len(variants):
            windows["ar"] = time_autoregressive(target, ids, config.rounds, config.warmup_rounds)
        else:
            variant = variants[index]
            windows[index] = time_speculative(decoders[variant["gamma"]], ids, config.rounds,
                                              config.warmup_rounds, variant["alpha"], variant["seed"])
    return [{**variant, **steady_state_row(windows["ar"], windows[index])} for index, variant in enumerate(variants)]


def run_sweep(config: SweepConfig, out_dir=None, overwrite: bool = False, progress: bool = True) -> Path:
    """Run a study and return its CSV path (``$MOESD_DATA/measurements/<device>/<study>.csv`` by default).

    The device and the output folder are checked, and an existing result file read, before any model
    is built: a bad one raises ``ValueError`` (or ``FileExistsError`` for a finished result file).
    """
    check_device(config.device)
    out_dir = check_out_dir(out_dir if out_dir is not None else measurements_dir() / device_label(config.device))
    result = ResultFile(out_dir / f"{config.study}.csv", config, overwrite)
    if config.study in FORWARD_STUDIES:
        run_forward_study(config, result, progress)
    else:
        run_e2e_study(config, result, progress)
    return result.path


# ---- Presets and their cost ------------------------------------------------------------------------

def preset_settings(study: str, name: str = "cpu") -> dict:
    """The keyword arguments of :func:`preset` (for callers that change some before building a config)."""
    if name not in ("cpu", "gpu"):
        raise ValueError(f"preset must be 'cpu' or 'gpu', got {name!r}")
    if study not in STUDIES:
        raise ValueError(f"study must be one of {', '.join(STUDIES)}, got {study!r}")
    dense = study in ("dense", "dense_forward")
    settings = dict(study=study, target="opt-30b" if dense else "qwen2-57b-a14b",
                    draft="opt-350m" if dense else "qwen2-0.5b", gammas=(2, 3, 4))
    if study == "sparsity":
        settings.update(top_ks=(1, 2, 4, 8, 16, 32), gammas=(2, 4))
    if study == "settings":
        settings.update(gammas=(4,), batch_sizes=(1, 8, 24, 48, 100))
    if name == "gpu":
        settings.update(dtype="bfloat16", device="cuda", context=64,
                        repeats={"forward": 10, "dense_forward": 10, "sparsity": 1, "settings": 5}.get(study, 3))
        if study not in FORWARD_STUDIES:
            settings.update(rounds=64, warmup_rounds=3)
        return settings
    settings.update(layers=4, draft_layers=2 if dense else 3, width=1 / 8, dtype="float32", device="cpu")
    if study in FORWARD_STUDIES:
        settings.update(context=64, repeats=10)
    else:
        settings.update(context=16, rounds=32, warmup_rounds=1,
                        repeats={"e2e": 2, "sparsity": 1, "dense": 3, "settings": 5}[study])
    if study == "sparsity":
        settings.update(layers=1, draft_layers=1, width=1 / 7)
    return settings


def preset(study: str, name: str = "cpu") -> SweepConfig:
    """The project's settings of a study.

    ``"cpu"``: scaled random-weight models sized for a 2-core CPU that keep E, K and the parameter
    shares of Qwen2-57B-A14B (4 of 28 layers, widths / 8; a 3-layer draft of the Qwen2-0.5B shape,
    3.2 % of the target's active parameters against the real 3.5 %) and of the OPT pair (4 of 48
    layers; a 2-layer OPT-350m-shaped draft, 1.1 % as in reality), in float32, with synthetic
    acceptance at the paper's sigma, 32 timed rounds and AR steps per point after one warm-up round,
    and 16-token prompts (the prefill lies outside the timed window: a longer prompt only costs time).
    Each study is sized to at most 15 minutes of an otherwise idle 2-core machine, as estimated by
    :func:`estimate_seconds` from a quiet-machine forward study of the same models (``python
    benchmarks/study_time.py`` prints the estimates and their parts):

    * ``forward``, ``dense_forward``: 10 repeats of every (B, s) forward over a 64-token cache
      (about 3 and 2 minutes).
    * ``e2e``: 19 batch sizes x gamma 2, 3, 4, two repeats (about 12 minutes).
    * ``sparsity``: all 228 (K, gamma, B) points, one repeat, on a **1-layer** target and 1-layer
      draft at widths / 7 (about 7 minutes): the 32-round protocol at 4 layers would need an
      estimated 27 minutes and at 2 layers 14, with no margin. Widths / 7 rather than / 8 keep the
      weights one K = 8 decode step reads (about 38 MiB) above this CPU's 32 MiB last-level cache
      (``benchmarks/decode_step.py``).
    * ``dense``: 19 batch sizes x gamma 2, 3, 4, three repeats (about 12 minutes).
    * ``settings``: Fig. 5's four workloads (HumanEval and MT-bench at temperatures 0 and 1, sigma
      from the paper's Table 1 on 2xA800) x five runs at gamma = 4, where the rise and fall is
      largest, over B = 1, 8, 24, 48, 100 (below, near and above the peak at T_thres), about 11
      minutes. The workloads differ only in sigma: sampling at temperature 1 is not emulated.

    On this CPU the draft's step is mostly call overhead (``moesd.hardware.decode_step_breakdown``):
    its cost relative to the target's step falls as the batch grows, which the chapters show as the
    draft term of Eq. 4.

    ``"gpu"``: the real shapes in bf16 on CUDA with random weights (Qwen2-57B-A14B needs about
    115 GB: it fits one H200; pass ``layers`` for a smaller GPU), 64 timed rounds after 3 warm-up
    rounds, 64-token prompts.
    """
    return SweepConfig(**preset_settings(study, name))


def estimate_seconds(config: SweepConfig, forward: pd.DataFrame, build_seconds: float = 5.0,
                     target_scale: float = 1.0, draft_scale: float = 1.0) -> dict:
    """Estimated wall time of a sweep from the forward times of the same models (seconds).

    Every forward the sweep runs is priced at the median of ``forward`` for its role, batch size and
    tokens per sequence (and K where ``forward`` has several); a prefill of ``context`` tokens is
    extrapolated linearly in tokens from the longest and shortest forwards measured, which on the
    shipped CPU data runs close to a measured prefill. Token selection, bookkeeping and rejection
    (under 1 % of a round on the CPU preset) are left out.

    Parameters
    ----------
    config : SweepConfig
    forward : pandas.DataFrame
        Rows ``role``, ``batch_size``, ``tokens``, ``seconds`` (and ``num_experts_per_tok``) of a
        forward study covering the sweep's batch sizes and tokens 1 and gamma + 1.
    build_seconds : float
        Seconds to build the models of one K (random initialisation).
    target_scale, draft_scale : float
        Factors on the target's and the draft's forward times (e.g. layers of the sweep over layers
        of the forward study).

    Returns
    -------
    dict
        ``timed``, ``warmup``, ``prefill``, ``build`` and ``total`` seconds.
    """
    with_k = "num_experts_per_tok" in forward and forward["num_experts_per_tok"].notna().any()
    by = ["role", "batch_size", "tokens"] + (["num_experts_per_tok"] if with_k else [])
    medians = forward.groupby(by)["seconds"].median()

    def time(role, batch, tokens, top_k):
        index = (role, batch, tokens, top_k) if with_k else (role, batch, tokens)
        if index not in medians.index:
            raise ValueError(f"forward has no {role} time at B = {batch}, s = {tokens}"
                             + (f", K = {top_k}" if with_k else ""))
        return medians[index] * (target_scale if role == "target" else draft_scale)

    def prefill(role, batch, top_k):
        tokens = sorted(t for r, b, t, *_ in medians.index if r == role and b == batch)
        low, high = time(role, batch, tokens[0], top_k), time(role, batch, tokens[-1], top_k)
        return low + (high - low) * (config.context - tokens[0]) / (tokens[-1] - tokens[0])

    timed = warm = fill = 0.0
    for top_k in config.top_k_values:
        for batch in config.batch_sizes:
            if config.study in FORWARD_STUDIES:
                sizes = sorted({1, *config.gammas, *(g + 1 for g in config.gammas)})
                timed += config.repeats * sum(time(role, batch, s, top_k) for role in ("target", "draft")
                                              for s in sizes)
                fill += prefill("target", batch, top_k) + prefill("draft", batch, top_k)
                continue
            runs = config.repeats * len(config.workloads or (None,))
            ar = time("target", batch, 1, top_k)
            rounds = {g: g * time("draft", batch, 1, top_k) + time("target", batch, g + 1, top_k)
                      for g in config.gammas}
            timed += config.repeats * config.rounds * ar + runs * config.rounds * sum(rounds.values())
            warm += config.repeats * config.warmup_rounds * ar + runs * config.warmup_rounds * sum(rounds.values())
            fill += (config.repeats + runs * len(config.gammas)) * prefill("target", batch, top_k)
            fill += runs * len(config.gammas) * prefill("draft", batch, top_k)
    build = build_seconds * len(config.top_k_values)
    return {"timed": timed, "warmup": warm, "prefill": fill, "build": build, "total": timed + warm + fill + build}
