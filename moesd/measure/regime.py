"""Is a study in the paper's regime? The share of a decode step that is weight streaming.

The paper's mechanism (verification is cheap once a batch has loaded every expert, and each expert
stays memory-bound) is about steps whose time is mostly reading weights. A study tests it only if
its target step is: :func:`streaming_share` divides the bytes a ``B = 1`` target step must read (the
weights it uses, from :func:`moesd.predictor.forward.step_time`'s byte count for the sweep's model, Eq. 8's
experts, its KV cache) by the measured bandwidth of the measuring device (the sweep's sidecar), and
that time by the measured step. A share near 1 is a memory-bound step, the paper's regime; a share
of 0.1 is a step spent on something else (per-kernel launch cost, per-expert dispatch).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from moesd._checks import UsageError
from moesd.measure.analysis import measured_shapes, measuring_hardware
from moesd.predictor.forward import step_time

_STEP_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "bf16"}
"""The predictor's weight dtype for a sweep's dtype (two bytes for both half-precision types)."""


@dataclass(frozen=True)
class StreamingShare:
    """The streaming share of one measured target step.

    Attributes
    ----------
    share : float
        ``bytes / bandwidth / step_seconds``: the part of the step that reading its bytes at the
        measured bandwidth accounts for (1: memory-bound; may exceed 1 where caches serve reads).
    bytes : float
        Bytes the step reads: weights it uses, KV cache, logits' weights (bytes).
    bandwidth : float
        The device's measured STREAM bandwidth (bytes/s).
    step_seconds : float
        The measured step (s).
    """

    share: float
    bytes: float
    bandwidth: float
    step_seconds: float

    def as_dict(self) -> dict:
        """Plain values, as a sidecar stores them (``streaming_share``)."""
        return {"share": self.share, "bytes": self.bytes, "bandwidth": self.bandwidth,
                "step_seconds": self.step_seconds}


def step_bytes(sidecar: dict, batch_size: int = 1, tokens: int = 1, top_k: int | None = None) -> float:
    """Bytes one target forward of a sweep reads (weights used, KV cache), from its sidecar's shapes.

    Parameters
    ----------
    sidecar : dict
        A result file's sidecar (``settings``: target, draft, layers, draft_layers, width, vocab_size,
        dtype, context).
    batch_size, tokens : int
        B and the new tokens per sequence s of the forward.
    top_k : int, optional
        K of the forward (default: the checkpoint's).

    Returns
    -------
    float
        Bytes.
    """
    settings = sidecar.get("settings", {})
    target, _ = measured_shapes(sidecar)
    dtype = _STEP_DTYPES.get(settings.get("dtype", "float32"))
    if dtype is None:
        raise ValueError(f"sidecar: no step byte count for dtype {settings.get('dtype')!r}")
    step = step_time(target, "H200", tokens, batch_size, context=settings.get("context", 0), dtype=dtype,
                     top_k=top_k)
    return float(sum(float(value) for value in step.bytes.values()))


def streaming_share(sidecar: dict, step_seconds: float, batch_size: int = 1, tokens: int = 1,
                    top_k: int | None = None) -> StreamingShare:
    """The share of a measured target step that reading its bytes at the measured bandwidth accounts for.

    Parameters
    ----------
    sidecar : dict
        The sweep's sidecar: its shapes (:func:`step_bytes`) and measured roofline (``hardware``).
    step_seconds : float
        The measured target step, e.g. the median ``T_T(1, 1)`` of a forward study (s, > 0).
    batch_size, tokens : int
        The step's B and s (default a ``B = 1`` decode step).
    top_k : int, optional
        The step's K (default: the checkpoint's).

    Returns
    -------
    StreamingShare
    """
    if not step_seconds > 0:
        raise ValueError(f"step_seconds must be > 0, got {step_seconds!r}")
    bandwidth = measuring_hardware(sidecar).memory_bandwidth
    moved = step_bytes(sidecar, batch_size, tokens, top_k)
    return StreamingShare(share=moved / bandwidth / step_seconds, bytes=moved, bandwidth=bandwidth,
                          step_seconds=float(step_seconds))


def attention_dominated_context(model: str, batch_size: int = 1, top_k: int | None = None,
                                dtype: str = "bfloat16") -> float:
    """Tokens of context per sequence from which attention reads at least half of a decode step's bytes.

    Attention here is its projections' weights and the KV cache a step reads; the rest is everything else the step
    reads (shared and routed experts, with Eq. 8's activated experts at ``B`` tokens, the router, norms, the LM
    head). The KV cache grows linearly with the context, so the crossing is ``(rest - projections) / (KV bytes per
    token of context)`` (0 where the projections alone are the larger part). This is the context a study needs
    before the paper's explanation of K = 1, 2's fall (attention dominating, Amdahl's law) can apply.

    Parameters
    ----------
    model : str
        A :data:`moesd.zoo.MODELS` name, at full depth.
    batch_size : int
        Sequences B of the decode step.
    top_k : int, optional
        K of the step (default: the checkpoint's).
    dtype : str
        The sweep's dtype (``bfloat16``, ``float16`` or ``float32``).

    Returns
    -------
    float
        Tokens of context per sequence.
    """
    step_dtype = _STEP_DTYPES.get(dtype)
    if step_dtype is None:
        raise ValueError(f"dtype: no step byte count for {dtype!r}")
    empty = step_time(model, "H200", 1, batch_size, context=0, dtype=step_dtype, top_k=top_k).bytes
    full = step_time(model, "H200", 1, batch_size, context=1024, dtype=step_dtype, top_k=top_k).bytes
    per_token = float(full["kv_cache"]) / 1024
    rest = sum(float(value) for key, value in empty.items() if key not in ("attention", "kv_cache"))
    return max(0.0, (rest - float(empty["attention"])) / per_token)


IN_REGIME_SHARE = 1 / 3
"""The weight-reading share of a B = 1 target step from which a study is judged on the first page.

A study tests the paper's mechanism only if the bytes a pass reads drive its time. If a share ``s`` of a step is
reading weights and the rest an overhead that does not depend on them (kernel launches, per-expert dispatch), a
verification that reads ``r`` times the bytes takes ``1 + s (r - 1)`` steps, not ``r``: below a third, the overhead
is at least twice the weight reading and the curves are mostly the overhead's. The rule was set to tell the
launch- and dispatch-bound contrast folders apart from the studies whose steps are their weight-reading
products, with those folders' shares (0.11-0.23 for their MoE steps) known when it was set; it decides which
studies the first page shows, not any verdict's status.
"""


@dataclass(frozen=True)
class StudyRegime:
    """Whether one study is in the paper's regime (:func:`study_regime`).

    Attributes
    ----------
    streaming_share : float
        Bytes of its B = 1 target step at the copy (STREAM) bandwidth over the measured step (NaN if unknown).
    products_share : float
        Where the device's regime check (``regime.json``) timed the same model and dtype: the share of the step its
        weight-reading matrix products take, timed one by one at their own reading rate (NaN otherwise).
    weight_share : float
        The larger of the two, at most 1: how much of the step is reading weights.
    in_regime : bool
        ``weight_share >= IN_REGIME_SHARE``.
    """

    streaming_share: float
    products_share: float
    weight_share: float
    in_regime: bool


def study_regime(rows: pd.DataFrame, sidecar: dict, check: "RegimeCheck | None" = None) -> StudyRegime:
    """Whether a study's B = 1 target step is mostly reading weights (:data:`IN_REGIME_SHARE`).

    The streaming share is the sidecar's (``streaming_share``) or, for files measured before sweeps recorded it,
    :func:`measured_streaming_share` of the rows. A CPU's matrix-vector kernels may read weights well below the
    STREAM rate, so where the device's regime check measured the same model and dtype, the products' share of the
    step counts too: a step that is its weight-reading products is in the regime at the kernels' reading rate.
    """
    recorded = sidecar.get("streaming_share") or measured_streaming_share(rows, sidecar) or {}
    streaming = float(recorded.get("share", float("nan")))
    products = float("nan")
    if check is not None:
        settings = sidecar.get("settings", {})
        match = check.steps[(check.steps["model"] == settings.get("target"))
                            & (check.steps["dtype"] == settings.get("dtype"))]
        if not match.empty:
            products = float(match["products_share"].iloc[0])
    share = min(1.0, max((x for x in (streaming, products) if x == x), default=float("nan")))
    return StudyRegime(streaming, products, share, bool(share >= IN_REGIME_SHARE))


# ---- The regime check: can this machine run a study in the paper's regime? --------------------------

PROJECTIONS = {"qwen2-57b-a14b expert gate/up": ("qwen2-57b-a14b", 3584, 2560),
               "qwen2-57b-a14b expert down": ("qwen2-57b-a14b", 2560, 3584),
               "opt-30b fc1": ("opt-30b", 7168, 28672), "opt-30b fc2": ("opt-30b", 28672, 7168)}
"""The real weight shapes a decode step of the paper's pairs multiplies most: name -> (model, in, out)."""
REGIME_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
"""Tokens M of the regime check's GEMM curves."""
MIN_STREAMING_SHARE = 0.6
"""The streaming share a study needs to test the paper's mechanism (the design rule of the studies at real width: a step mostly reading weights)."""


@dataclass(frozen=True)
class RegimeCheck:
    """What :func:`regime_check` measured, and the study design it implies.

    Attributes
    ----------
    gemm : pandas.DataFrame
        ``projection``, ``dtype``, ``tokens``, ``median_seconds``, ``weight_bandwidth`` (weight bytes per
        median second) and ``median_flop_per_s``: the real projections against M, weights read from memory.
    dispatch : pandas.DataFrame
        ``model``, ``dtype``, ``per_expert_seconds``, ``fixed_seconds``: the MoE layer's cost per
        activated expert beyond its products (:func:`moesd.measure.breakdown.expert_dispatch_seconds`).
    steps : pandas.DataFrame
        ``model``, ``dtype``, ``layers``, ``vocab_size``, ``step_seconds`` (median B = 1 decode step of
        the model cut in depth only), ``bytes``, ``bandwidth`` (measured STREAM, bytes/s),
        ``streaming_share``, ``products_seconds`` (the step's matrix products at M = 1 timed one by
        one, weights read from memory: K experts' and every other weight but the input embedding),
        ``products_share`` (their share of the step), ``products_bandwidth`` (bytes per second
        they read) and ``dispatch_share`` (K experts' dispatch over the step).
    settings : dict
        ``threads``, ``repeats``, ``date``, ``torch``, ``cpu``.
    """

    gemm: pd.DataFrame
    dispatch: pd.DataFrame
    steps: pd.DataFrame
    settings: dict

    def design(self, minimum: float = MIN_STREAMING_SHARE) -> pd.DataFrame:
        """Per model, the dtype whose step streams the largest share, and whether it reaches ``minimum``."""
        best = self.steps.loc[self.steps.groupby("model")["streaming_share"].idxmax()]
        return best.assign(in_regime=best["streaming_share"] >= minimum).reset_index(drop=True)

    def as_dict(self) -> dict:
        """Plain JSON values (``data/measurements/<device>/regime.json``)."""
        return {"settings": dict(self.settings), "gemm": self.gemm.to_dict("records"),
                "dispatch": self.dispatch.to_dict("records"), "steps": self.steps.to_dict("records")}

    @classmethod
    def from_dict(cls, values: dict) -> "RegimeCheck":
        return cls(pd.DataFrame(values["gemm"]), pd.DataFrame(values["dispatch"]), pd.DataFrame(values["steps"]),
                   dict(values["settings"]))


def study_sidecar(model: str, dtype: str, layers: int = 1, context: int = 8, bandwidth: float | None = None) -> dict:
    """The sidecar fields :func:`step_bytes` and :func:`streaming_share` read, for a model cut in depth only.

    The draft is the model's pair's (:data:`moesd.measure.presets.PAIRS`) cut in the same proportion, the
    vocabulary cut by the depth factor (:func:`moesd.zoo.depth_scaled_vocab`), as the CPU preset does.
    """
    from moesd.measure.presets import PAIRS, proportional_draft_layers
    from moesd.zoo import depth_scaled_vocab

    draft = PAIRS[model]
    sidecar = {"settings": {"target": model, "draft": draft, "layers": layers,
                            "draft_layers": proportional_draft_layers(model, draft, layers), "width": 1.0,
                            "vocab_size": depth_scaled_vocab(model, layers), "dtype": dtype, "context": context}}
    if bandwidth is not None:
        sidecar["hardware"] = {"name": "measured", "peak_flops": 1.0, "memory_bandwidth": float(bandwidth),
                               "memory_bytes": 1.0, "source": "regime check"}
    return sidecar


def regime_check(models=("qwen2-57b-a14b", "opt-30b"), dtypes=("float32", "bfloat16"), tokens=REGIME_TOKENS,
                 layers: int = 1, threads: int | None = None, repeats: int = 5, progress: bool = True) -> RegimeCheck:
    """Measure whether this CPU can run the paper's studies in the regime their claims are about.

    For each dtype: the STREAM bandwidth, the real projections of :data:`PROJECTIONS` against the
    tokens M (weights read from memory), the per-expert dispatch of the MoE layer, and the median
    ``B = 1`` decode step of each model cut to ``layers`` at full width with its vocabulary cut by
    the depth factor, whose streaming share (:func:`streaming_share`) decides the design
    (:meth:`RegimeCheck.design`). A 1-layer Qwen2-57B-A14B holds 2 billion weights (4 GB in bf16, 8 in
    float32), built one model at a time.

    Parameters
    ----------
    models : sequence of str
        Targets of the studies (pairs of :data:`moesd.measure.presets.PAIRS`).
    dtypes : sequence of str
    tokens : sequence of int
        M of the GEMM curves.
    layers : int
        Decoder layers kept.
    threads : int, optional
        torch threads (default: as they are; the sweeps' count).
    repeats : int
        Timed calls per measurement (medians are kept).
    progress : bool
        Print a line per measurement.

    Returns
    -------
    RegimeCheck
    """
    import datetime
    import gc
    import statistics

    import torch

    from moesd.measure.breakdown import expert_dispatch_seconds, forward_seconds
    from moesd.measure.hardware import cpu_name, gemm_curve, streaming_bandwidth
    from moesd.measure.hardware import torch_threads
    from moesd.zoo import get_model

    def say(text):
        if progress:
            print(text, flush=True)

    gemm, dispatch, steps = [], [], []
    with torch_threads(threads) as used:
        for dtype in dtypes:
            bandwidth = float(streaming_bandwidth("cpu", repeats=repeats)["bandwidth"].max())
            say(f"{dtype}: STREAM {bandwidth / 1e9:.1f} GB/s")
            for name, (_, in_features, out_features) in PROJECTIONS.items():
                curve = gemm_curve(tokens, in_features, out_features, "cpu", dtype, repeats)
                gemm += [{"projection": name, "dtype": dtype, "tokens": int(row.tokens),
                          "median_seconds": float(row.median_seconds),
                          "weight_bandwidth": in_features * out_features * torch.tensor([], dtype=getattr(
                              torch, dtype)).element_size() / float(row.median_seconds),
                          "median_flop_per_s": float(row.median_flop_per_s)} for row in curve.itertuples()]
                say(f"  {name}: {1e3 * curve['median_seconds'].iloc[0]:.2f} ms at M = 1")
            for model in models:
                spec = get_model(model)
                if spec.is_moe:
                    cost = expert_dispatch_seconds(model, dtype, "cpu", repeats)
                    dispatch.append({"model": model, "dtype": dtype, "per_expert_seconds": cost["per_expert_seconds"],
                                     "fixed_seconds": cost["fixed_seconds"]})
                sidecar = study_sidecar(model, dtype, layers, bandwidth=bandwidth)
                settings = sidecar["settings"]
                net = spec.random_model(layers, None, 1.0, dtype=getattr(torch, dtype), vocab_size=settings["vocab_size"])
                products, product_bytes = _products_seconds(net, dtype, repeats)
                if spec.is_moe:
                    from moesd.measure.router_control import RoutingControl
                    with RoutingControl(net, "uniform"):
                        step = statistics.median(forward_seconds(net, 1, 1, settings["context"], repeats))
                else:
                    step = statistics.median(forward_seconds(net, 1, 1, settings["context"], repeats))
                del net
                gc.collect()
                share = streaming_share(sidecar, step)
                per_expert = dispatch[-1]["per_expert_seconds"] if spec.is_moe else 0.0
                steps.append({"model": model, "dtype": dtype, "layers": layers, "vocab_size": settings["vocab_size"],
                              "step_seconds": step, "bytes": share.bytes, "bandwidth": bandwidth,
                              "streaming_share": share.share, "products_seconds": products,
                              "products_share": products / step, "products_bandwidth": product_bytes / products,
                              "dispatch_share": per_expert * (spec.top_k or 0) * layers / step})
                say(f"  {model}, {layers} layer(s): B = 1 step {1e3 * step:.1f} ms, streaming share {share.share:.2f}, "
                    f"products {products / step:.2f} of it at {product_bytes / products / 1e9:.1f} GB/s")
    settings = {"threads": used, "repeats": repeats, "torch": torch.__version__, "cpu": cpu_name(),
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    return RegimeCheck(pd.DataFrame(gemm), pd.DataFrame(dispatch), pd.DataFrame(steps), settings)


def _products_seconds(net, dtype: str, repeats: int) -> tuple[float, float]:
    """Seconds and bytes of a B = 1 step's matrix products, each weight shape timed at M = 1 from memory.

    Every 2-D weight but the input embedding counts once (a tied embedding once, as the LM head);
    each MoE layer's experts count ``K`` times per 3-D expert weight (one slice each).
    """
    from moesd.measure.hardware import matmul_seconds

    embedding = net.get_input_embeddings().weight
    tied = embedding is net.get_output_embeddings().weight
    top_k = getattr(net.config, "num_experts_per_tok", 0) or 0
    counts = {}
    for name, weight in net.named_parameters():
        if weight.dim() == 2 and (weight is not embedding or tied):
            shape = tuple(weight.shape)
            counts[shape] = counts.get(shape, 0) + 1
        elif weight.dim() == 3:  # (E, out, in) stacked experts
            shape = tuple(weight.shape[1:])
            counts[shape] = counts.get(shape, 0) + top_k
    seconds = matmul_seconds(list(counts), [1], dtype, "cpu", repeats, True, "median", "wall")
    size = net.dtype.itemsize
    total = sum(count * seconds[out, inp, 1] for (out, inp), count in counts.items())
    moved = sum(count * out * inp * size for (out, inp), count in counts.items())
    return float(total), float(moved)


def measured_streaming_share(rows: pd.DataFrame, sidecar: dict) -> dict | None:
    """The streaming share of a result file's smallest-batch target step, as its sidecar records it.

    The step is the median ``T_T(B, 1)`` at the smallest batch size measured: the target's one-token
    forwards of a forward study, or ``t_target_1`` of an e2e-type study; in a study over several K,
    those of the largest K (the bytes count that K's experts). None when the rows hold no such step
    or the sidecar cannot give the bytes (no measured roofline, an unknown model).

    Returns
    -------
    dict or None
        :meth:`StreamingShare.as_dict` plus ``batch_size`` and ``top_k`` (None for a dense target).
    """
    if rows.empty or "batch_size" not in rows:
        return None
    if "role" in rows:
        steps = rows[(rows["role"] == "target") & (rows["tokens"] == 1)]
        column = "seconds"
    else:
        steps, column = rows, "t_target_1"
    if steps.empty or column not in steps:
        return None
    top_k = None
    if "num_experts_per_tok" in steps and steps["num_experts_per_tok"].notna().any():
        top_k = int(steps["num_experts_per_tok"].max())  # one K's steps: the densest a study measured
        steps = steps[steps["num_experts_per_tok"] == top_k]
    smallest = int(steps["batch_size"].min())
    seconds = float(steps.loc[steps["batch_size"] == smallest, column].median())
    try:
        share = streaming_share(sidecar, seconds, batch_size=smallest, top_k=top_k)
    except (ValueError, KeyError):
        return None
    return {**share.as_dict(), "batch_size": smallest, "top_k": top_k}


def target_step_seconds(forward: pd.DataFrame, batch_size: int = 1, tokens: int = 1) -> float:
    """The target's step in a forward study: the median time of its forwards of ``tokens`` new tokens per sequence
    at ``batch_size`` sequences, over the study's repeats (seconds; ``T_T(B, tokens)``).

    Raises
    ------
    UsageError
        Where the study holds no such forward.
    """
    rows = forward[(forward["role"] == "target") & (forward["batch_size"] == batch_size)
                   & (forward["tokens"] == tokens)]
    if rows.empty:
        raise UsageError(f"the forward study holds no target forward of {tokens} token(s) at B = {batch_size}",
                         "batch_size")
    return float(rows["seconds"].median())
