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
it), spreads it over the layers, and gives a draft head its layers' share. :data:`ENGINES` holds the presets.

Pure Python; no torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from moesd._checks import UsageError
from moesd.predictor.kernels import Efficiency

__all__ = ["Cost", "EngineProfile", "ENGINES", "engine_profile", "HOST_SECONDS_VLLM_V0"]


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

    def costs(self) -> dict:
        """Every :class:`Cost` of the profile by name (``"expert_flops_fraction[fp8]"`` for a dtype's)."""
        found = {"exposed_host_seconds": self.exposed_host_seconds, "draft_host_seconds": self.draft_host_seconds}
        found.update({f"expert_flops_fraction[{dtype}]": cost for dtype, cost in self.expert_flops_fraction.items()})
        for kind, (bandwidth, flops) in self.attention_fractions.items():
            found.update({f"attention_bandwidth_fraction[{kind}]": bandwidth,
                          f"attention_flops_fraction[{kind}]": flops})
        return found

    def efficiency(self, base: Efficiency | None, dtype: str, attention: str) -> Efficiency:
        """``base`` (default :class:`~moesd.predictor.kernels.Efficiency`) with this engine's grouped-GEMM tile and
        achieved FLOP fraction for weights of ``dtype`` and its attention kernel's fractions for the ``attention``
        kind (``"gqa"``, ``"mla"``)."""
        fraction = self.expert_flops_fraction.get(dtype)
        bandwidth, flops = self.attention_fractions.get(attention, (None, None))
        rows, above = self.expert_tile_rows.get(dtype, (1, None))
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
                                 for kind, (bandwidth, flops) in self.attention_fractions.items()})


_SGLANG_OVERLAP = ("LMSYS blog 'Accelerating SGLang with Multiple Token Prediction' (2025-07-17): DeepSeek-V3 on "
                   "16 H200, 2 requests per rank: 51.0 tok/s per rank without, 60.4 with overlap scheduling alone, "
                   "and 'MTP + overlap' not yet supported: the overlap hides 2/51.0 - 2/60.4 s = 6.1 ms of a "
                   "step; low end 0: SGLang's 'spec v2' (SGLANG_ENABLE_SPEC_V2, sgl-project/sglang PR #15591) "
                   "overlaps SD rounds too")
_DEEPGEMM_MASKED = ("deepseek-ai/DeepGEMM README (H800): masked grouped GEMM 4 groups x 256 rows, 932 and 815 "
                    "TFLOPS of the 1,979 fp8 dense peak (0.41-0.47); none published below 256 rows")
_FLASH_MLA = ("deepseek-ai/FlashMLA README: the dense MLA decoding kernel reaches 3000 GB/s memory-bound (0.90 of "
              "the H800's 3350) and 660 TFLOPS compute-bound (0.67 of 989.5) on H800 SXM5 with CUDA 12.8; 580 TFLOPS "
              "(0.59) with CUDA 12.6; FlashMLA's figures taken for every GPU (no MI300X or B200 figure found)")
_MLA = {"mla": (Cost(3000 / 3350, 3000 / 3350, 3000 / 3350, _FLASH_MLA), Cost(660 / 989.5, 580 / 989.5, 660 / 989.5,
                                                                            _FLASH_MLA))}
_VLLM_DRAFTER = ("vllm-project/vllm issue #45258 (vLLM 0.22 on a GB10, sm_121; Gemma-4 26B-A4B, gamma 3, "
                 "concurrency 1): sampling 2.1 ms and the whole drafter chain 4.9 ms for 3 steps, 0.7 and 1.6 ms "
                 "a step, with eager attention between piecewise graphs; vllm PR #21477: a full-graph drafter on "
                 "par (low end 0)")
# Tiles: DeepGEMM deep_gemm/jit_kernels config (masked layout block_m 64 up to 64 expected rows); vLLM/SGLang
# fused_moe get_default_config (bf16 BLOCK_SIZE_M 16 when tokens <= experts, else 64; fp8 block-quantised 64).
_KERNELS = dict(expert_tile_rows={"fp8": (64, 64), "bf16": (16, 64)}, attention_fractions=_MLA,
                expert_flops_fraction={"fp8": Cost(0.41, 0.41, 0.47, _DEEPGEMM_MASKED)})
"""The kernels SGLang, vLLM and TensorRT-LLM share for MoE decoding: fused_moe or DeepGEMM, FlashMLA."""
_GRAPHED_DRAFT = Cost(0.0, 0.0, 0.0, "draft steps replay CUDA graphs (sgl-project/sglang EAGLE draft CUDA graph "
                      "runner)")

ENGINES = {profile.name: profile for profile in [
    EngineProfile(
        "device", "the GPUs' work only: no host cost, no extend pass, no tiles (the paper's engine)",
        Cost(0.0, 0.0, 0.0, "none"), Cost(0.0, 0.0, 0.0, "none"), draft_extend=False),
    EngineProfile(
        "sglang", "SGLang 0.4-0.5 with EAGLE/MTP ('spec v1'): overlap scheduling in plain decoding only, "
        "draft steps and verification replayed from CUDA graphs, an eager draft-extend pass (graphed from "
        "PR #6606 on some attention backends)",
        Cost(6.1e-3, 0.0, 6.1e-3, _SGLANG_OVERLAP), _GRAPHED_DRAFT, extend_graphs=False, **_KERNELS),
    EngineProfile(
        "sglang-no-overlap", "SGLang as 'sglang', run with --disable-overlap-schedule: plain decoding exposes its "
        "host time as SD rounds do, so SD rounds expose none beyond it",
        Cost(0.0, 0.0, 0.0, "no overlap in either mode (--disable-overlap-schedule)"), _GRAPHED_DRAFT,
        extend_graphs=False, **_KERNELS),
    EngineProfile(
        "vllm-v1", "vLLM V1 with EAGLE/MTP, async scheduling off (its default): the host's step cost in "
        "plain decoding and SD alike, the drafter's attention eager between piecewise graphs",
        Cost(0.0, 0.0, 0.0, "no overlap in either mode (async scheduling off by default)"),
        Cost(0.7e-3, 0.0, 1.6e-3, _VLLM_DRAFTER), extend_graphs=False, **_KERNELS),
    EngineProfile(
        "tensorrt-llm", "TensorRT-LLM (PyTorch back end) with MTP: verification and drafting captured in "
        "one CUDA graph, overlap scheduler in both modes",
        Cost(0.0, 0.0, 0.27e-3, "TensorRT-LLM tech blog 2 (DeepSeek-R1 MTP, 8 B200): 'both the verification "
             "and draft stages can be captured in one graph'; the overlap scheduler 1.03x at minimum latency, "
             "3 % of tech blog 1's 9.0 ms step (111 tokens/s per user): 0.27 ms at most"),
        Cost(0.0, 0.0, 0.0, "drafting inside the CUDA graph (TensorRT-LLM tech blog 2)"), extend_graphs=True,
        **_KERNELS),
]}
"""Engine presets by name; each constant's ``source`` cites where it comes from."""


def engine_profile(engine) -> EngineProfile:
    """An :class:`EngineProfile` from a name of :data:`ENGINES` (any case) or itself; ValueError otherwise."""
    if isinstance(engine, EngineProfile):
        return engine
    if isinstance(engine, str) and engine.lower() in ENGINES:
        return ENGINES[engine.lower()]
    raise UsageError(f"engine must be one of {', '.join(ENGINES)} or an EngineProfile, got {engine!r}", "engine")


HOST_SECONDS_VLLM_V0 = 0.29 / 0.38 * 5e-3
"""An order of magnitude of vLLM v0's host work per forward pass (seconds): scheduling alone.

vLLM's profile of v0.5.3 serving Llama 3 8B on one H100 puts scheduling (gathering the last step's
results, scheduling the next, preparing its inputs) at 29 % of the execution time and the GPU's
forward pass at 38 % ("vLLM v0.6.0: 2.7x Throughput Improvement and 5x Latency Reduction", vLLM blog,
2024-09-05); that forward takes about 5 ms ("vLLM V1", vLLM blog, 2025-01-27): 0.29 / 0.38 x 5 ms.
Not a measurement of the paper's runs (a 57B MoE on several GPUs, SD's draft steps, another vLLM
version); only its order of magnitude is used."""
