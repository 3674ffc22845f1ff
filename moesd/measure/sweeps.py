"""What a timing sweep measures and what it costs: its settings (:class:`SweepConfig`), checked without
importing torch, the per-point acceptance seeds, and the estimated time of a sweep
(:func:`estimate_seconds`; its KV cache and memory in :mod:`moesd.measure.sweep_memory`). Pure Python and
pandas; the project's presets are in :mod:`moesd.measure.presets`, and the sweeps themselves run in
:mod:`moesd.measure.bench`.

Studies
-------
forward
    T_T(B, s) and T_D(B, s): one forward of ``s`` new tokens per sequence over a KV cache of
    ``context`` tokens, for every batch size B, s in {1, gamma, gamma + 1} and experts per token K.
e2e
    Autoregressive (AR) against speculative decoding (SD) over B and gamma under the steady-state
    protocol of :mod:`moesd.measure.protocol`: T_AR, T_SD, sigma, speedup, Eq. 4 and target efficiency per point and repeat.
sparsity
    The e2e study for each experts-per-token K of the target (the paper's sparsity sweep, the
    fitting data of Algorithm 1).
dense, dense_forward
    The e2e and forward studies for the dense pair (OPT-30b / OPT-350m shapes).
settings
    The e2e study at the sigma of the paper's other workloads (Fig. 5): Table 1's Qwen2 rows on
    2xA800, HumanEval and MT-bench at temperatures 0 and 1, emulated by synthetic acceptance.
"""

from __future__ import annotations

import dataclasses
import json
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from moesd._checks import UsageError, seed
from moesd._files import lookup_problem
from moesd.predictor.predict import PAPER_BATCH_SIZES as BATCH_SIZES  # the paper's 19 batch sizes, 1 to 100 (one home)
from moesd.measure.sweep_checks import check_size, checkpoint_folder
from moesd.zoo import get_model

PAPER_SIGMA = {2: 0.95, 3: 0.93, 4: 0.90}
"""sigma of Qwen2-57B-A14B with Qwen2-0.5B on HumanEval at temperature 0 on 2xH800, 4xA800 and 4xL40
(paper, Table 2; Table 1's 2xA800 row prints 0.94, 0.93, 0.91)."""


STUDIES = ("forward", "e2e", "sparsity", "dense", "dense_forward", "settings")
FORWARD_STUDIES = ("forward", "dense_forward")
DTYPE_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}
"""Bytes per weight and per cached value of each dtype a sweep runs in."""
DTYPES = tuple(DTYPE_BYTES)
ROUTINGS = ("uniform", "model", "trace", "popularity")
"""How a sweep's MoE target routes: ``uniform`` (each token's K experts drawn uniformly, Eq. 8),
``model`` (its own router), ``trace`` (a routing trace replayed) or ``popularity`` (each token's K experts
drawn with a trained router's per-layer popularity, :mod:`moesd.routing.sources`);
:mod:`moesd.measure.router_control` installs it."""


def paper_workloads(gammas=(2, 3, 4)) -> tuple:
    """The settings study's workloads: Table 1's Qwen2-57B-A14B rows on 2xA800 (paper).

    Returns
    -------
    tuple of dict
        ``{"dataset", "temperature", "sigma": {gamma: sigma}}`` for HumanEval and MT-bench at
        temperatures 0 and 1, read from ``data/paper/tables_1_2.csv``.
    """
    from moesd.paper_tables import paper_table

    table = paper_table("tables_1_2")
    rows = table[(table["table"] == 1) & table["model"].str.startswith("Qwen2") & (table["device"] == "2xA800")]
    rows = rows.drop_duplicates(["dataset", "temperature", "gamma"])
    workloads = []
    for (dataset, temperature), part in rows.groupby(["dataset", "temperature"], sort=True):
        sigma = dict(zip(part["gamma"].astype(int), part["sigma"].astype(float)))
        missing = [g for g in gammas if g not in sigma]
        if missing:
            raise UsageError(f"Table 1 has no sigma for {dataset} at temperature {temperature} and gamma {missing}")
        workloads.append({"dataset": dataset, "temperature": float(temperature),
                          "sigma": {int(g): sigma[g] for g in gammas}})
    return tuple(workloads)


@dataclass
class SweepConfig:
    """Everything that defines a sweep; two runs with equal configs write the same kind of rows.

    Bad settings, and settings a study does not use, are refused (:class:`~moesd._checks.UsageError`,
    a ``ValueError``), never recorded.

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
    vocab_size : int, optional
        Vocabulary of both models with random weights (the draft shares the target's); default the
        shape's (:meth:`moesd.zoo.ModelSpec.config_dict`: the real one at width 1). The CPU preset cuts
        it by the depth factor (:func:`moesd.zoo.depth_scaled_vocab`).
    batch_sizes, gammas : tuple of int
        Batch sizes B and draft lengths gamma (the forward study times s in {1, gamma, gamma + 1}).
    top_ks : tuple of int, optional
        Experts per token K of the target (MoE targets only); default the checkpoint's.
    routing : str, optional
        How an MoE target routes (:data:`ROUTINGS`): ``"uniform"`` (each
        token's K experts drawn uniformly, Eq. 8's assumption; the default with random weights),
        ``"model"`` (its own router; the default with pretrained weights), ``"trace"`` (the choices
        of ``routing_trace`` replayed; eager forwards only) or ``"popularity"`` (each token's K distinct
        experts drawn independently with the per-layer popularity of ``routing_source``, seeded by ``seed``).
        None for a dense target.
    routing_trace : str, optional
        With ``routing="trace"``: the ``.npz`` file of a :class:`~moesd.routing.traces.RoutingTrace` of the
        target's E and K.
    routing_source : str, optional
        With ``routing="popularity"``: a shipped trained-routing source (:func:`moesd.routing.sources.names`,
        e.g. ``"olmoe/c4"``) of the target's E and K; target layer ``i`` takes recorded layer ``i mod n``.
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
    cuda_graphs : bool
        On CUDA only: run each forward as the replay of a CUDA graph captured over a static KV cache
        (as vLLM and other serving engines run decode steps, without the per-kernel launch cost an
        eager step pays; :mod:`moesd.engine.static_cache`): the forward studies time the replays, the
        end-to-end studies decode with them (captured in the warm-up round, so at least one is
        needed); default False, eager forwards over a dynamic cache.
    """

    study: str
    target: str
    draft: str
    weights: str = "random"
    layers: int | None = None
    draft_layers: int | None = None
    width: float = 1.0
    vocab_size: int | None = None
    batch_sizes: tuple = BATCH_SIZES
    gammas: tuple = (2, 3, 4)
    top_ks: tuple | None = None
    routing: str | None = None
    routing_trace: str | None = None
    routing_source: str | None = None
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
    cuda_graphs: bool = False

    def __post_init__(self):
        if self.study not in STUDIES:
            raise UsageError(f"study must be one of {', '.join(STUDIES)}, got {self.study!r}")
        if self.weights not in ("random", "pretrained"):
            raise UsageError(f"weights must be 'random' or 'pretrained', got {self.weights!r}")
        target, draft = (checked_model(name, role) for name, role in ((self.target, "target"), (self.draft, "draft")))
        self._check_shape(target, draft)
        self.batch_sizes = _whole_numbers("batch_sizes", self.batch_sizes)
        self.gammas = _whole_numbers("gammas", self.gammas)
        for name in ("context", "repeats"):
            setattr(self, name, whole_number(name, getattr(self, name), 1))
        self.warmup, self.seed = whole_number("warmup", self.warmup, 0), seed("seed", self.seed)
        if self.dtype not in DTYPES:
            raise UsageError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if not isinstance(self.device, str) or not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise UsageError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        if self.top_ks is not None:
            if not target.is_moe:
                raise UsageError(f"top_ks applies to MoE targets; {target.name} is dense")
            self.top_ks = _whole_numbers("top_ks", self.top_ks)
            if max(self.top_ks) > target.num_experts:
                raise UsageError(f"top_ks must lie in [1, {target.num_experts}] (E of {target.name}), "
                                 f"got {max(self.top_ks)}")
        self._check_routing(target)
        if not isinstance(self.cuda_graphs, bool):
            raise UsageError(f"cuda_graphs must be True or False, got {self.cuda_graphs!r}")
        if self.cuda_graphs and not self.device.startswith("cuda"):
            raise UsageError(f"cuda_graphs applies on a CUDA device, not on {self.device}")
        if self.study in FORWARD_STUDIES:
            for name in ("sigma", "workloads", "rounds", "warmup_rounds"):
                if getattr(self, name) is not None:
                    raise UsageError(f"{name} is not used by the {self.study} study (forward passes only); "
                                     "leave it unset")
        else:
            self.rounds = whole_number("rounds", 32 if self.rounds is None else self.rounds, 1)
            self.warmup_rounds = whole_number("warmup_rounds", 1 if self.warmup_rounds is None else self.warmup_rounds, 0)
            if self.cuda_graphs and self.warmup_rounds < 1:
                raise UsageError("cuda_graphs captures its graphs in the warm-up round: set warmup_rounds >= 1")
            self._check_acceptance()
        check_size(self)

    def _check_shape(self, target, draft) -> None:
        if self.weights == "pretrained":
            shaped = {name: value for name, value in (("layers", self.layers), ("draft_layers", self.draft_layers),
                                                      ("width", None if self.width == 1 else self.width),
                                                      ("vocab_size", self.vocab_size))
                      if value is not None}
            if shaped:
                raise UsageError(f"{', '.join(f'{k}={v}' for k, v in shaped.items())}: shape settings apply to "
                                 "random weights only; pretrained weights keep their checkpoint's shape")

            for name, model in (("target_path", self.target), ("draft_path", self.draft)):
                if getattr(self, name) is not None:  # a hub id is checked by check_pretrained, before any load
                    checkpoint_folder(name, model, getattr(self, name))
            return
        if self.target_path or self.draft_path:
            raise UsageError("target_path and draft_path apply to pretrained weights only")
        if not (isinstance(self.width, (int, float)) and 0 < self.width <= 1):
            raise UsageError(f"width must be in (0, 1], got {self.width!r}")
        for name, spec in (("layers", target), ("draft_layers", draft)):
            if getattr(self, name) is not None:
                setattr(self, name, whole_number(name, getattr(self, name), 1, spec.num_layers))
        if target.is_moe:
            try:
                target.check_routed_layers(self.layers, "layers")
            except ValueError as error:
                raise UsageError(str(error)) from None
        if self.vocab_size is not None:
            self.vocab_size = whole_number("vocab_size", self.vocab_size, 2)

    def _check_routing(self, target) -> None:
        if not target.is_moe:
            if self.routing is not None or self.routing_trace is not None or self.routing_source is not None:
                raise UsageError(f"routing applies to MoE targets; {target.name} is dense")
            return
        if self.routing is None:
            self.routing = "model" if self.weights == "pretrained" else "uniform"
        if self.routing not in ROUTINGS:
            raise UsageError(f"routing must be one of {', '.join(ROUTINGS)}, got {self.routing!r}")
        if (self.routing == "trace") != (self.routing_trace is not None):
            raise UsageError("routing_trace names the trace that routing 'trace' replays: give both or neither")
        if (self.routing == "popularity") != (self.routing_source is not None):
            raise UsageError("routing_source names the trained router whose popularity routing 'popularity' draws "
                             "from: give both or neither")
        if self.routing == "popularity":
            self._check_routing_source(target)
        if self.routing == "trace":

            from moesd.routing.traces import RoutingTrace

            if not Path(self.routing_trace).is_file():
                problem = lookup_problem(self.routing_trace)  # a loop of links, a name too long
                raise UsageError(f"routing_trace {self.routing_trace!r} is not a file" + (f" ({problem})" * bool(problem)))
            if self.cuda_graphs:
                raise UsageError("routing 'trace' copies each forward's ids to the device, which a CUDA graph "
                                 "would freeze: replay traces with eager forwards (no cuda_graphs)")
            try:
                trace = RoutingTrace.load(self.routing_trace)
            except (OSError, ValueError, KeyError) as error:
                raise UsageError(f"routing_trace {self.routing_trace!r} is not a routing trace: {error}") from None
            ks = self.top_ks or (target.top_k,)
            if trace.num_experts != target.num_experts or set(ks) != {trace.top_k}:
                raise UsageError(f"routing_trace routes E = {trace.num_experts}, K = {trace.top_k}; the sweep's "
                                 f"{target.name} has E = {target.num_experts} and K = {', '.join(map(str, ks))}")

    def _check_routing_source(self, target) -> None:
        from moesd.routing import sources

        try:
            source = sources.info(self.routing_source)
        except ValueError as error:
            raise UsageError(f"routing_source {self.routing_source!r} is not a shipped source: {error}") from None
        ks = self.top_ks or (target.top_k,)
        if source.num_experts != target.num_experts or set(ks) != {source.top_k}:
            raise UsageError(f"routing_source {source.name} routes E = {source.num_experts}, K = {source.top_k}; the "
                             f"sweep's {target.name} has E = {target.num_experts} and K = {', '.join(map(str, ks))}")

    def _check_acceptance(self) -> None:
        if self.study == "settings":
            if self.sigma is not None:
                raise UsageError("sigma is not used by the settings study: its workloads carry their own sigma")
            workloads = paper_workloads(self.gammas) if self.workloads is None else self.workloads
            self.workloads = tuple({"dataset": str(w["dataset"]), "temperature": float(w["temperature"]),
                                    "sigma": self._sigma_per_gamma(w["sigma"], f"{w['dataset']} sigma")}
                                   for w in workloads)
            return
        if self.workloads is not None:
            raise UsageError(f"workloads are used by the settings study only, not by {self.study}")
        if self.sigma is None:  # the study's default
            self.sigma = ("real" if self.weights == "pretrained"
                          else {g: PAPER_SIGMA[g] for g in self.gammas if g in PAPER_SIGMA})
        if self.sigma == "real":
            if self.weights == "random":
                raise UsageError("random weights accept almost nothing: give sigma for synthetic acceptance")
            if self.routing in ("uniform", "popularity"):
                raise UsageError(f"{self.routing} routing draws the target's experts at random, so its tokens are not "
                                 "the model's and real acceptance means nothing: use routing 'model' or give sigma")
            return
        self.sigma = self._sigma_per_gamma(self.sigma, "sigma")

    def _sigma_per_gamma(self, values, name: str) -> dict:
        if not isinstance(values, dict):
            raise UsageError(f"{name} must map each gamma to a sigma, got {values!r}")
        try:  # a sidecar's JSON keys are strings: "4" names gamma = 4
            values = {whole_number("gamma", int(g) if isinstance(g, str) and g.isdigit() else g, 1): float(s)
                      for g, s in values.items()}
        except (TypeError, ValueError):
            raise UsageError(f"{name} must map each gamma (a whole number) to a sigma (a number), got {values!r}") from None
        missing = [g for g in self.gammas if g not in values]
        if missing:
            raise UsageError(f"{name} has no value for gamma {missing} (one sigma per gamma {list(self.gammas)})")
        unused = sorted(set(values) - set(self.gammas))
        if unused:
            raise UsageError(f"{name} has values for gamma {unused}, which the sweep does not run")
        for gamma, value in values.items():
            if not 1 / (gamma + 1) <= value <= 1:
                raise UsageError(f"{name} at gamma {gamma} must lie in [1/(gamma+1), 1] = [{1 / (gamma + 1):.3f}, 1], "
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
        """The config as plain JSON values (what a resumed sweep must match); ``routing_source`` only where set,
        as in the sidecars written before it existed."""
        values = json.loads(json.dumps(dataclasses.asdict(self)))
        if values["routing_source"] is None:
            del values["routing_source"]
        return values


def routing_provenance(config: SweepConfig) -> dict:
    """Where a ``popularity``-routed sweep's popularity comes from, for its sidecar: the source, its repository,
    commit, licence and checkpoint, the recorded layers, and the one each target layer takes (``layers_mapped``)."""
    from moesd.routing import sources

    layers = config.layers or get_model(config.target).num_layers
    return sources.info(config.routing_source).provenance(sources.layer_map(config.routing_source, layers))


def checked_model(name, role: str):
    """The :mod:`moesd.zoo` spec of ``name``; a :class:`~moesd._checks.UsageError` naming the ``role`` if unknown,
    or if a ``target`` is a draft head (an MTP module runs on its target's hidden states: there is nothing of
    its own to time, as ``moesd predict`` refuses it as a target)."""
    try:
        spec = get_model(name)
    except KeyError as error:
        raise UsageError(f"{role} {error.args[0]}") from None
    if role == "target" and spec.head_of:
        raise UsageError(f"target {spec.name} is a draft head of {spec.head_of}, not a model of its own: give a "
                         f"target model (its own is {spec.head_of})")
    return spec


def whole_number(name: str, value, low: int, high: int | None = None) -> int:
    """``value`` as an int if it is a whole number in ``[low, high]``; a :class:`~moesd._checks.UsageError` naming ``name`` otherwise."""
    if (isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating))
            or not np.isfinite(value) or value != int(value)):
        raise UsageError(f"{name} must be a whole number, got {value!r}")
    if value < low or (high is not None and value > high):
        allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise UsageError(f"{name} must be {allowed}, got {value!r}")
    return int(value)


def _whole_numbers(name: str, values) -> tuple:
    values = tuple(values) if isinstance(values, (list, tuple)) else (values,)
    if not values:
        raise UsageError(f"{name} must hold at least one value")
    values = tuple(whole_number(name, v, 1) for v in values)
    if len(set(values)) != len(values):
        raise UsageError(f"{name} must not repeat a value, got {list(values)}")
    return values


def gpu_label(name: str) -> str:
    """The folder name of a GPU from its name as the driver reports it (``NVIDIA H100 80GB HBM3``: ``h100``)."""
    name = name.lower()
    for known in ("h200", "h100", "h800", "a800", "a100", "l40", "b200", "mi300x"):
        if known in name:
            return known
    return "".join(c if c.isalnum() else "-" for c in name).strip("-")


def acceptance_seed(study: str, batch_size: int, gamma: int, top_k: int | None, run: int,
                    workload: str = "", base_seed: int = 0) -> int:
    """An independent seed per point: ``numpy.random.SeedSequence`` of its coordinates (32 bits)."""
    entropy = [base_seed, zlib.crc32(study.encode()), zlib.crc32(workload.encode()), batch_size, gamma,
               top_k or 0, run]
    return int(np.random.SeedSequence(entropy).generate_state(1)[0])



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
            raise UsageError(f"forward has no {role} time at B = {batch}, s = {tokens}"
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
