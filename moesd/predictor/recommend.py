"""Should SD be on? The predictor's answer for one setup as a typed result.

:func:`recommend` runs :func:`moesd.predictor.predict.predict_sd` over batch sizes and draft lengths for one
:class:`~moesd.predictor.setup.Setup`, checks which batch sizes fit the GPUs' memory
(:func:`moesd.predictor.memory.memory_fit`), and for each
acceptance value says where SD pays, by the low end of the error band around the best draft length's speedup
(:mod:`moesd.predictor.band`: how far published speedups have fallen from predictions made the same way): *on* where
it exceeds ``1 + SD_MARGIN``, *marginal* where it exceeds 1 by less, *off* elsewhere (off unless the band is above
1). It also says whether that
answer depends on the host cost per forward pass (it is recomputed at a serving engine's measured
cost when none was given, and at none when one was; not with an engine profile or a measured step, which
hold the host's cost). Where no batch size fits, SD is not judged (:data:`NOT_JUDGED`). ``moesd predict`` prints a
:class:`Recommendation` (:mod:`moesd.narration` writes its sentences); a chapter reads its fields.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from moesd.predictor.band import ErrorBand, error_band_of
from moesd.predictor.engine import HOST_SECONDS_VLLM_V0
from moesd.predictor.layout import DTYPE_BYTES, tensor_parallel_sizes
from moesd.predictor.memory import memory_fit
from moesd.predictor.predict import batch_range, best_gamma, predict_sd
from moesd.predictor.setup import Setup

SD_MARGIN = 0.05
"""SD is 'on' only where the best speedup exceeds 1 by more than this fraction, and 'marginal' above 1
below it: a stated choice, smaller than the errors the book finds for the model."""

NOT_JUDGED = "not judged"
"""The SD status of every batch size when none fits the GPUs' memory: the speedups assume one did."""


def sd_status(speedup) -> np.ndarray:
    """``"on"``, ``"marginal"`` or ``"off"`` for each speedup (dimensionless, the band's low end in
    :func:`recommend`), by :data:`SD_MARGIN`."""
    speedup = np.asarray(speedup, dtype=float)
    return np.select([speedup > 1 + SD_MARGIN, speedup > 1], ["on", "marginal"], "off")


@dataclass(frozen=True)
class Shortfall:
    """A model that does not fit its GPUs at the largest batch size asked for.

    Attributes
    ----------
    role : str
        ``"target"`` or ``"draft"``.
    gpus : int
        The GPUs it is spread over (its tensor-parallel size).
    largest_bytes, smallest_bytes : float
        Its weights and KV cache per GPU at the largest and the smallest batch size, in bytes.
    capacity_bytes : float
        One GPU's memory, in bytes.
    more_gpus : tuple of int
        Tensor-parallel sizes above ``gpus`` the model divides over at which more of the batch sizes asked
        for fit: those within one node, or, where none within one does, those across nodes.
    smaller_dtypes : tuple of str
        Weight dtypes of fewer bytes than the one asked for at which more batch sizes fit, of those the
        GPU multiplies natively (:func:`_native_dtypes`).
    dp_attention_gpus : tuple of int
        For a target with MLA and experts, not yet attention data-parallel: the tensor-parallel sizes (``gpus``
        or more; within one node where any does) at which attention data-parallel (``dp_attention``) makes
        more batch sizes fit than now and than that tensor-parallel size alone. MLA's one latent KV head is copied to every GPU under tensor parallelism; data-
        parallel attention splits the sequences instead.
    shorter_context : bool
        Whether more batch sizes fit with an empty KV cache (context 0): a shorter context helps.
    holds_draft : bool
        The target's GPUs hold the draft head too (its bytes are in ``largest_bytes`` and ``smallest_bytes``).
    """

    role: str
    gpus: int
    largest_bytes: float
    smallest_bytes: float
    capacity_bytes: float
    more_gpus: tuple
    smaller_dtypes: tuple
    dp_attention_gpus: tuple = ()
    shorter_context: bool = False
    holds_draft: bool = False


@dataclass(frozen=True)
class Advice:
    """Where SD pays at one acceptance value.

    Attributes
    ----------
    column : str
        ``"alpha"`` or ``"sigma"``; ``value`` its value.
    best : pandas.DataFrame
        One row per judged batch size: the best gamma's prediction (:func:`~moesd.predictor.predict.best_gamma`)
        with ``speedup_low`` and ``speedup_high`` (its error band) and its ``sd`` status, by the band's low end
        (:data:`NOT_JUDGED` where nothing fits).
    on, marginal : numpy.ndarray
        The batch sizes where SD is on and marginal (none where nothing fits).
    peak : float
        The largest best speedup; ``peak_batch_size`` where.
    band : tuple or None
        The unbroken run of batch sizes around the peak at or above peak / sqrt(2) and above 1
        (:func:`~moesd.predictor.predict.batch_range`), None when SD pays nowhere or is not judged.
    other_host_ms : float
        The other host cost this was recomputed at (ms per forward pass).
    on_at_other_host : numpy.ndarray
        The batch sizes where SD is on at that host cost.
    host_decides : bool
        Whether the on/marginal batch sizes differ at the other host cost.
    judged : bool
        Whether SD is judged: False where no batch size fits (every status :data:`NOT_JUDGED`, no batch size
        on, marginal or decided by the host cost; the speedups assume one fitted).
    peak_edge : str or None
        ``"largest"`` where the peak is at the largest batch size asked for (a larger batch may peak higher),
        ``"smallest"`` where it is at the smallest asked for and that is above 1; None otherwise, for a
        single batch size and where SD is not judged.
    """

    column: str
    value: float
    best: pd.DataFrame
    on: np.ndarray
    marginal: np.ndarray
    peak: float
    peak_batch_size: int
    band: tuple | None
    other_host_ms: float
    on_at_other_host: np.ndarray
    host_decides: bool
    judged: bool = True
    peak_edge: str | None = None


@dataclass(frozen=True)
class Recommendation:
    """The predictor's answer for one setup (:func:`recommend`).

    Attributes
    ----------
    frame : pandas.DataFrame
        Every predicted row (:func:`~moesd.predictor.predict.predict_sd`), all batch sizes, with ``speedup_low`` and
        ``speedup_high`` (the error band) and ``fits``: whether the row's batch size fits target and draft in memory.
    hardware : moesd.theory.roofline.Hardware
        The GPU.
    fits : numpy.ndarray
        Whether each batch size asked for fits target and draft in memory.
    judged : numpy.ndarray
        The batch sizes the advice covers: those that fit, or all when none does (SD then not judged:
        ``Advice.judged``).
    shortfalls : list of Shortfall
        The models that do not fit at the largest batch size.
    vocabularies : tuple of int
        The target's and the draft's vocabulary sizes (a separate draft has the target's; an EAGLE-3 head its own).
    advice : list of Advice
        One per acceptance value.
    engine_ends : dict
        With an engine profile: for ``"low"`` and ``"high"`` (its costs at the end of their published
        ranges that favours and that disfavours SD, :meth:`~moesd.predictor.engine.EngineProfile.at`), the batch
        sizes where SD is on, one array per acceptance value; empty without a profile.
    draft_head : bool
        The draft is a head of the target (:func:`~moesd.predictor.predict.check_pair`: an MTP module or an EAGLE
        head), which serving engines run on the target's GPUs.
    draft_tp : int
        The draft's GPUs, as priced: ``draft_tp``, or by default the target's ``tp`` for a draft head
        (:func:`~moesd.predictor.predict.check_pair`) and 1 for a separate draft model.
    band : ErrorBand or None
        The error band the SD calls use (:func:`~moesd.predictor.band.error_band_of` the setup).
    """

    frame: pd.DataFrame
    hardware: object
    fits: np.ndarray
    judged: np.ndarray
    shortfalls: list
    vocabularies: tuple
    advice: list
    engine_ends: dict = dataclasses.field(default_factory=dict)
    draft_head: bool = False
    draft_tp: int = 1
    band: ErrorBand | None = None


def _native_dtypes(hardware) -> list:
    """The weight dtypes worth suggesting on ``hardware``: fp32, bf16 and fp8 everywhere (fp8 weight-only where
    it has no fp8 tensor cores), the 4-bit ones only where it has their tensor cores: W4A8 (multiplied as fp8)
    with ``Hardware.fp8_flops``, MXFP4 and NVFP4 with ``Hardware.fp4_flops``."""
    return ["fp32", "bf16", "fp8", *(["w4a8"] if hardware.fp8_flops else []),
            *(["mxfp4", "nvfp4"] if hardware.fp4_flops else [])]


def _shortfalls(fit: pd.DataFrame, setup: Setup) -> list:
    """The models that ``fit`` (:func:`~moesd.predictor.memory.memory_fit` of ``setup``) says do not fit at the
    largest batch size (``fit``'s), each with the changes that make more of the batch sizes fit, each checked by
    :func:`~moesd.predictor.memory.memory_fit` again: more GPUs (within one node, or across nodes where no size
    within one helps), smaller native dtypes, attention data-parallel for an MLA target, a shorter context. The
    bytes do not depend on the expert-parallel degree, the engine or a measured step, so the changes are checked
    at ``ep`` 1 (which every tensor-parallel size takes), without them."""
    hardware = setup.hardware
    capacity = hardware.memory_bytes
    batch = fit["batch_size"].to_numpy()
    head_with_target = setup.draft_gpus == setup.tp and setup.head and setup.drafting != "free"
    shortfalls = []
    for role, model, gpus, tp_name, dtype_name in (("target", setup.target, setup.tp, "tp", "dtype"),
                                                   ("draft", setup.draft, setup.draft_gpus, "draft_tp",
                                                    "draft_dtype")):
        held = fit[f"{role}_bytes"].to_numpy()
        if held.max() <= capacity:
            continue
        now = int((held <= capacity).sum())

        def fitting(**changes):
            if "tp" in changes and head_with_target:  # a head on the target's GPUs moves with them
                changes = {"draft_tp": changes["tp"], **changes}
            try:
                changed = dataclasses.replace(setup, ep=1, engine=None, step_seconds=None, sd_step_seconds=None,
                                              sd_step_gamma=None, **changes)
            except ValueError:  # a layout the model refuses
                return 0
            return int((memory_fit(changed, batch)[f"{role}_bytes"] <= capacity).sum())

        def helps(**changes):
            return fitting(**changes) > now

        def within_node(sizes):
            return tuple([tp for tp in sizes if tp <= hardware.gpus_per_node] or sizes)

        dp_attention = setup.dp_attention and role == "target"
        plain = {tp: fitting(**{tp_name: tp}) for tp in tensor_parallel_sizes(model, hardware, dp_attention)
                 if tp > gpus}
        larger = [tp for tp, count in plain.items() if count > now]
        dtype = setup.dtype if role == "target" else setup.draft_weights
        smaller = tuple(name for name in _native_dtypes(hardware)
                        if DTYPE_BYTES[name] < DTYPE_BYTES[dtype] and helps(**{dtype_name: name}))
        data_parallel = []
        if role == "target" and not dp_attention and model.attention == "mla" and model.num_experts:
            # only where it fits more than now and than tensor parallelism alone on as many GPUs or fewer
            data_parallel = [tp for tp in tensor_parallel_sizes(model, hardware, True) if tp >= max(gpus, 2)
                             and fitting(tp=tp, dp_attention=True)
                             > max([now, *(count for size, count in plain.items() if size <= tp)])]
        shortfalls.append(Shortfall(role, gpus, float(held.max()), float(held.min()), float(capacity),
                                    within_node(larger), smaller, within_node(data_parallel),
                                    bool(setup.context) and helps(context=0),
                                    role == "target" and head_with_target))
    return shortfalls


def _advice(column: str, value: float, rows: pd.DataFrame, other: pd.DataFrame, other_host_ms: float,
            judged: bool, asked) -> Advice:
    """The :class:`Advice` of one acceptance value from its rows at the host cost and at ``other_host_ms``;
    ``judged`` False where no batch size fits; ``asked`` the batch sizes asked for (where the peak's edge lies)."""
    best = best_gamma(rows)
    alternative = best_gamma(other)
    status, other_status = sd_status(best["speedup_low"]), sd_status(alternative["speedup_low"])
    if not judged:
        status = other_status = np.full(len(best), NOT_JUDGED)
    low, high, peak, at = batch_range(rows)
    edge = (None if len(best) < 2 or not judged else "largest" if at == max(asked)
            else "smallest" if at == min(asked) > 1 else None)
    if not judged:  # the speedups assume a batch that does not fit: no band where SD pays
        low = high = None
    return Advice(column, float(value), best.assign(sd=status), best.loc[status == "on", "batch_size"].to_numpy(),
                  best.loc[status == "marginal", "batch_size"].to_numpy(), peak, at,
                  None if low is None else (low, high), other_host_ms,
                  alternative.loc[other_status == "on", "batch_size"].to_numpy(),
                  not np.array_equal(status == "on", other_status == "on")
                  or not np.array_equal(status == "marginal", other_status == "marginal"), judged, edge)


def recommend(setup: Setup, batch_sizes, gammas, column: str, values, *, other_host_ms: float | None = None,
              alpha_decay: float = 1.0, routing=None) -> Recommendation:
    """Where SD pays for the deployment ``setup``, over batch sizes and draft lengths.

    Parameters
    ----------
    setup : Setup
        The deployment (:class:`~moesd.predictor.setup.Setup`): models, GPUs, parallelism, dtypes, context, engine
        profile, measured plain step, host cost per forward pass (``Setup.host_seconds``: added to every forward pass
        of target and draft, the target's plain and verification passes and each draft step, not the rejection
        sampling), tree.
    batch_sizes, gammas : array_like of int
        Sequences B and draft lengths to predict.
    column : str
        ``"alpha"`` (per-token acceptance) or ``"sigma"`` (Eq. 5's emitted fraction); ``values`` its values.
    other_host_ms : float, optional
        The host cost the advice is checked against, ms (default: vLLM v0's measured cost,
        :data:`moesd.predictor.engine.HOST_SECONDS_VLLM_V0`, when the setup has none, else 0); not used with an
        engine profile or a measured step, which hold the host's cost.
    alpha_decay : float, default 1.0
        As :func:`~moesd.predictor.predict.predict_sd` takes it (with ``column="alpha"``). With a profile the advice
        is also recomputed at both ends of its costs' ranges (``Recommendation.engine_ends``) where some batch size
        fits.
    routing : optional
        As :func:`~moesd.predictor.predict.predict_sd` takes it: ``None`` (uniform, Eq. 8), per-expert or per-layer
        popularity, a trace, or a shipped trained-routing source by name (``"olmoe/github"``,
        :func:`moesd.routing.sources.names`).

    Returns
    -------
    Recommendation

    Raises
    ------
    UsageError
        As :func:`~moesd.predictor.predict.predict_sd` raises.
    """
    host_ms = setup.host_seconds * 1e3
    batch_sizes, values = np.asarray(batch_sizes), np.asarray(values, dtype=float)
    if setup.step_seconds is not None or setup.engine is not None:  # a measured step or a profile holds the host's cost
        other_host_ms = host_ms
    elif other_host_ms is None:
        other_host_ms = 0.0 if host_ms else HOST_SECONDS_VLLM_V0 * 1e3
    decay = {"alpha_decay": alpha_decay} if column == "alpha" else {}

    band = error_band_of(setup)

    def predict(batch, at=setup):
        frame = predict_sd(at, batch, gammas, **decay, **{column: values}, routing=routing)
        low, high = band.interval(frame["speedup"])
        return frame.assign(speedup_low=low, speedup_high=high)

    frame = predict(batch_sizes)
    fit = memory_fit(setup, batch_sizes)
    fits = fit["fits"].to_numpy()
    frame = frame.assign(fits=np.isin(frame["batch_size"], batch_sizes[fits]))
    judged = batch_sizes[fits] if fits.any() else batch_sizes
    other = predict(judged, dataclasses.replace(setup, host_seconds=other_host_ms * 1e-3))
    advice = [_advice(column, value, frame[(frame[column] == value) & frame["batch_size"].isin(judged)],
                      other[other[column] == value], other_host_ms, bool(fits.any()), batch_sizes) for value in values]
    ends = {}
    profile = setup.engine
    if (fits.any() and profile is not None and profile.costs()
            and any(c.low < c.high for c in profile.costs().values())):
        for end in ("low", "high"):
            rows = predict(judged, dataclasses.replace(setup, engine=profile.at(end)))
            ends[end] = [best_gamma(rows[rows[column] == value]).pipe(
                lambda best: best.loc[sd_status(best["speedup_low"]) == "on", "batch_size"].to_numpy()) for value in values]
    return Recommendation(frame, setup.hardware, fits, judged, _shortfalls(fit, setup),
                          (setup.target.vocab_size, setup.draft.vocab_size), advice, ends, setup.head,
                          setup.draft_gpus, band)
