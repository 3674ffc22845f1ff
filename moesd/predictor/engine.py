"""Serving engines as the predictor sees them (beyond the paper): where an engine's fixed costs fall in a round.

A roofline of the GPUs' work (:func:`moesd.predictor.forward.step_time`) leaves out what serving engines add:
kernels that never reach the roofline at batch 1, collectives at their real latency, the host's scheduling
and sampling, a draft head's *extend* pass, and grouped-GEMM tiles. An :class:`EngineProfile` says where
these costs fall in a round of speculative decoding, each constant with the range public material gives
and its source:

* ``exposed_host_seconds``: the host time that an SD round exposes and a plain decoding step hides.
  SGLang's overlap scheduler hides the host's scheduling behind the GPU's work in plain decoding but
  could not with speculative decoding (until its "spec v2").
* ``draft_host_seconds``: a fixed cost per draft step outside CUDA graphs (sampling the draft token,
  eager attention between graph pieces).
* ``draft_extend``: draft heads (EAGLE, multi-token prediction) run one pass over the ``gamma + 1``
  tokens of the last round before drafting, which gives the first draft token; ``extend_graphs`` whether
  that pass replays a CUDA graph.
* ``expert_tile_rows`` and ``expert_flops_fraction``: the grouped-GEMM kernels' row tile and achieved
  fraction of the tensor peak, per weight dtype.
* ``attention_fractions``: the decode attention kernel's achieved fractions of bandwidth and tensor peak
  (FlashMLA's for multi-head latent attention).

The fixed cost of a forward pass that the roofline misses (kernel latencies, collectives) is not a profile
constant: it differs by model and deployment by tens of milliseconds. :func:`moesd.predictor.predict.predict_sd`
takes it from a *measured plain decoding step* (``step_seconds`` at batch 1, as an engine's benchmark reports
it), spreads it over the layers, and gives a draft head its layers' share. :data:`ENGINES` holds the presets, named by
engine and version, read from the data table ``records/engines.toml`` (:func:`load_engines`; older names are
:data:`ALIASES`); the grouped-GEMM figures measured per GPU come from ``records/kernels.toml``
(:data:`GPU_KERNELS`).

Pure Python; no torch.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass
from pathlib import Path

from moesd._checks import UsageError
from moesd.predictor.kernels import Efficiency

__all__ = ["Cost", "EngineProfile", "ENGINES", "ALIASES", "GPU_KERNELS", "load_engines", "load_kernels",
           "engine_profile", "HOST_SECONDS_VLLM_V0"]


@dataclass(frozen=True)
class Cost:
    """One constant of an engine profile with its published range.

    Attributes
    ----------
    value : float
        The value used by default (in the unit of the field it fills).
    low, high : float
        The range public material gives (``low <= value <= high``).
    source : str
        Where the numbers come from.
    """

    value: float
    low: float
    high: float
    source: str

    def __post_init__(self):
        if not 0 <= self.low <= self.value <= self.high:
            raise UsageError(f"a Cost needs 0 <= low <= value <= high, got {self.low}, {self.value}, {self.high}", "value")


@dataclass(frozen=True)
class EngineProfile:
    """Where a serving engine's fixed costs fall in plain decoding and in a round of SD.

    Attributes
    ----------
    name, description : str
        The engine and version it describes.
    exposed_host_seconds : Cost
        Host time an SD round exposes and a plain decoding step hides, seconds per round.
    draft_host_seconds : Cost
        Fixed cost of one draft step outside CUDA graphs, seconds.
    draft_extend : bool
        A draft head runs an extend pass over ``gamma + 1`` tokens per round, giving the first draft token.
    extend_graphs : bool
        The extend pass replays a CUDA graph (else its kernels pay launch costs).
    expert_tile_rows : dict
        Rows the grouped-GEMM kernel pads each expert's tokens to, per weight dtype, as ``(rows while a pass's
        tokens are at most the routed experts, rows above)`` (missing: no padding).
    expert_flops_fraction : dict
        Achieved fraction of the tensor peak in grouped expert GEMMs, per weight dtype, as a
        :class:`Cost` (missing: the hardware record's fraction).
    attention_fractions : dict
        Achieved fractions of the data-sheet bandwidth and tensor peak of the decode attention kernel, per
        attention kind (``"mla"``, ``"gqa"``), as ``(bandwidth Cost, FLOP Cost)`` (missing: the hardware
        record's fractions).
    pick : str
        Which engine setting the profile stands for (``moesd predict --help`` prints it).
    gpu_kernels : dict
        Per GPU name and weight dtype, ``(Cost of the achieved fraction of the tensor peak, tile rows)`` measured for
        that GPU (:data:`GPU_KERNELS`), in place of ``expert_flops_fraction`` and ``expert_tile_rows`` there, for the
        dtypes the profile prices with kernels of its own.
    """

    name: str
    description: str
    exposed_host_seconds: Cost
    draft_host_seconds: Cost
    draft_extend: bool = True
    extend_graphs: bool = True
    expert_tile_rows: dict = dataclasses.field(default_factory=dict)
    expert_flops_fraction: dict = dataclasses.field(default_factory=dict)
    attention_fractions: dict = dataclasses.field(default_factory=dict)
    pick: str = ""
    gpu_kernels: dict = dataclasses.field(default_factory=dict, repr=False)

    def costs(self) -> dict:
        """Every :class:`Cost` of the profile by name (``"expert_flops_fraction[fp8]"`` for a dtype's)."""
        found = {"exposed_host_seconds": self.exposed_host_seconds, "draft_host_seconds": self.draft_host_seconds}
        found.update({f"expert_flops_fraction[{dtype}]": cost for dtype, cost in self.expert_flops_fraction.items()})
        for kind, (bandwidth, flops) in self.attention_fractions.items():
            found.update({f"attention_bandwidth_fraction[{kind}]": bandwidth,
                          f"attention_flops_fraction[{kind}]": flops})
        return found

    def efficiency(self, base: Efficiency | None, dtype: str, attention: str, hardware=None) -> Efficiency:
        """``base`` (default :class:`~moesd.predictor.kernels.Efficiency`) with this engine's grouped-GEMM tile and
        achieved FLOP fraction for weights of ``dtype`` (those measured on ``hardware``, a record or name, where
        :attr:`gpu_kernels` has them) and its attention kernel's fractions for the ``attention`` kind (``"gqa"``,
        ``"mla"``)."""
        fraction = self.expert_flops_fraction.get(dtype)
        bandwidth, flops = self.attention_fractions.get(attention, (None, None))
        rows, above = self.expert_tile_rows.get(dtype, (1, None))
        name = getattr(hardware, "name", hardware)
        if fraction is not None and dtype in self.gpu_kernels.get(name, {}):
            fraction, rows = self.gpu_kernels[name][dtype]
            above = rows
        return dataclasses.replace(base or Efficiency(), expert_tile_rows=rows, expert_tile_rows_above=above,
                                   expert_flops_fraction=None if fraction is None else fraction.value,
                                   attention_bandwidth_fraction=None if bandwidth is None else bandwidth.value,
                                   attention_flops_fraction=None if flops is None else flops.value)

    def at(self, end: str) -> "EngineProfile":
        """The profile with every cost at the ``"low"``, ``"value"`` or ``"high"`` end of its range.

        ``"low"`` is the end that favours SD (least exposed host time and draft cost, and the *highest*
        expert FLOP fraction); ``"high"`` the end that disfavours it.
        """
        if end not in ("low", "value", "high"):
            raise UsageError(f"end must be 'low', 'value' or 'high', got {end!r}", "end")
        flip = {"low": "high", "high": "low", "value": "value"}[end]

        def pick(cost: Cost, which: str) -> Cost:
            return dataclasses.replace(cost, value=getattr(cost, which))

        return dataclasses.replace(
            self, name=f"{self.name} ({end})" if end != "value" else self.name,
            exposed_host_seconds=pick(self.exposed_host_seconds, end), draft_host_seconds=pick(self.draft_host_seconds, end),
            expert_flops_fraction={dtype: pick(cost, flip) for dtype, cost in self.expert_flops_fraction.items()},
            attention_fractions={kind: (pick(bandwidth, flip), pick(flops, flip))
                                 for kind, (bandwidth, flops) in self.attention_fractions.items()},
            gpu_kernels={name: {dtype: (pick(cost, flip), rows) for dtype, (cost, rows) in kernels.items()}
                         for name, kernels in self.gpu_kernels.items()})


RECORDS = Path(__file__).resolve().parents[1] / "records"
"""The package's data tables (``engines.toml``, ``kernels.toml``)."""


def _fraction(value) -> float:
    """A number, or a fraction written ``"a / b"``."""
    if isinstance(value, str):
        top, _, bottom = value.partition("/")
        return float(top) / float(bottom)
    return float(value)


def _cost(entry: dict, sources: dict, source: str | None = None) -> Cost:
    """A :class:`Cost` from a table's ``{value, low, high, source}`` (``{name}`` in a source names ``[sources]``)."""
    text = entry.get("source", source or "")
    for name, line in sources.items():
        text = text.replace("{" + name + "}", line)
    return Cost(_fraction(entry["value"]), _fraction(entry["low"]), _fraction(entry["high"]), text)


def load_kernels(path=None) -> dict:
    """The fp8 grouped-GEMM figures per GPU of ``records/kernels.toml``: ``{hardware name: {"fp8": (Cost of the
    achieved fraction of the fp8 peak, tile rows)}}``."""
    with open(Path(path) if path is not None else RECORDS / "kernels.toml", "rb") as file:
        table = tomllib.load(file)
    found = {}
    for entry in table.get("fp8_grouped_gemm", []):
        cost = _cost(entry["fraction"], {}, entry["source"])
        for name in entry["hardware"]:
            found[name] = {"fp8": (cost, int(entry["tile_rows"]))}
    return found


GPU_KERNELS = load_kernels()
"""Grouped-GEMM tile and achieved FLOP fraction per GPU and weight dtype, as public kernel benchmarks measure them
(``records/kernels.toml``); an engine profile with kernels prices those GPUs with them."""


def load_engines(path=None) -> tuple[dict, dict]:
    """The engine profiles of a table (default ``records/engines.toml``) by name, and the aliases of older names.

    Raises
    ------
    ValueError
        For a key a profile does not know, naming the file and the profile.
    """
    with open(Path(path) if path is not None else RECORDS / "engines.toml", "rb") as file:
        table = tomllib.load(file)
    sources, kernels = table.get("sources", {}), table.get("kernels", {})
    shared = dict(expert_tile_rows={dtype: tuple(rows) for dtype, rows in kernels.get("expert_tile_rows", {}).items()},
                  expert_flops_fraction={dtype: _cost(cost, sources) for dtype, cost
                                         in kernels.get("expert_flops_fraction", {}).items()},
                  attention_fractions={kind: tuple(_cost(cost, sources) for cost in pair) for kind, pair
                                       in kernels.get("attention_fractions", {}).items()},
                  gpu_kernels=GPU_KERNELS)
    profiles, aliases = {}, {}
    known = {"name", "aliases", "description", "pick", "exposed_host_seconds", "draft_host_seconds", "draft_extend",
             "extend_graphs", "kernels"}
    for row in table["profile"]:
        unknown = sorted(set(row) - known)
        if unknown:
            raise ValueError(f"{path or 'engines.toml'}: profile {row.get('name')!r} has the unknown key(s) {unknown}")
        profile = EngineProfile(row["name"], row["description"], _cost(row["exposed_host_seconds"], sources),
                                _cost(row["draft_host_seconds"], sources), draft_extend=row["draft_extend"],
                                extend_graphs=row["extend_graphs"], pick=row.get("pick", ""),
                                **(shared if row["kernels"] else {}))
        profiles[profile.name] = profile
        aliases.update({alias: profile.name for alias in row.get("aliases", [])})
    return profiles, aliases


ENGINES, ALIASES = load_engines()
"""Engine presets by name (``records/engines.toml``); each constant's ``source`` cites where it comes from.
``ALIASES`` maps older names (``sglang``: ``sglang-spec-v1``) to them."""


def engine_profile(engine) -> EngineProfile:
    """An :class:`EngineProfile` from a name of :data:`ENGINES` or :data:`ALIASES` (any case) or itself; a UsageError
    naming ``engine`` otherwise."""
    if isinstance(engine, EngineProfile):
        return engine
    if isinstance(engine, str):
        name = ALIASES.get(engine.lower(), engine.lower())
        if name in ENGINES:
            return ENGINES[name]
    raise UsageError(f"engine must be one of {', '.join(ENGINES)} (or the older {', '.join(ALIASES)}) or an "
                     f"EngineProfile, got {engine!r}", "engine")


HOST_SECONDS_VLLM_V0 = 0.29 / 0.38 * 5e-3
"""An order of magnitude of vLLM v0's host work per forward pass (seconds): scheduling alone.

vLLM's profile of v0.5.3 serving Llama 3 8B on one H100 puts scheduling (gathering the last step's
results, scheduling the next, preparing its inputs) at 29 % of the execution time and the GPU's
forward pass at 38 % ("vLLM v0.6.0: 2.7x Throughput Improvement and 5x Latency Reduction", vLLM blog,
2024-09-05); that forward takes about 5 ms ("vLLM V1", vLLM blog, 2025-01-27): 0.29 / 0.38 x 5 ms.
Not a measurement of the paper's runs (a 57B MoE on several GPUs, SD's draft steps, another vLLM
version); only its order of magnitude is used."""
