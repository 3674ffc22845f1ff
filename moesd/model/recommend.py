"""Should SD be on? The predictor's answer for one setup as a typed result.

:func:`recommend` runs :func:`moesd.model.predict.predict_sd` over batch sizes and draft lengths, checks
which batch sizes fit the GPUs' memory (:func:`moesd.model.predict.memory_fit`), and for each
acceptance value says where SD pays: *on* where the best draft length's speedup exceeds
``1 + SD_MARGIN``, *marginal* where it exceeds 1 by less, *off* elsewhere. It also says whether that
answer depends on the host cost per forward pass (it is recomputed at a serving engine's measured
cost when none was given, and at none when one was). ``moesd predict`` prints a
:class:`Recommendation` (:mod:`moesd.narration` writes its sentences); a chapter reads its fields.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from moesd.model.engine import engine_profile
from moesd.model.kernels import Efficiency
from moesd.model.layout import DTYPE_BYTES, check_dtype, resolve_model, tensor_parallel_sizes
from moesd.model.predict import batch_range, best_gamma, memory_fit, predict_sd
from moesd.theory.roofline import hardware_record
from moesd.zoo import DRAFT_HEADS

SD_MARGIN = 0.05
"""SD is 'on' only where the best speedup exceeds 1 by more than this fraction, and 'marginal' above 1
below it: a stated choice, smaller than the errors the book finds for the model."""


def sd_status(speedup) -> np.ndarray:
    """``"on"``, ``"marginal"`` or ``"off"`` for each speedup (dimensionless), by :data:`SD_MARGIN`."""
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
        Tensor-parallel sizes above ``gpus`` the model divides over: those within one node, or, where
        ``gpus`` fills a node, those across nodes.
    smaller_dtypes : tuple of str
        Weight dtypes of fewer bytes than the one asked for.
    """

    role: str
    gpus: int
    largest_bytes: float
    smallest_bytes: float
    capacity_bytes: float
    more_gpus: tuple
    smaller_dtypes: tuple


@dataclass(frozen=True)
class Advice:
    """Where SD pays at one acceptance value.

    Attributes
    ----------
    column : str
        ``"alpha"`` or ``"sigma"``; ``value`` its value.
    best : pandas.DataFrame
        One row per judged batch size: the best gamma's prediction (:func:`~moesd.model.predict.best_gamma`)
        with its ``sd`` status.
    on, marginal : numpy.ndarray
        The batch sizes where SD is on and marginal.
    peak : float
        The largest best speedup; ``peak_batch_size`` where.
    band : tuple or None
        The unbroken run of batch sizes around the peak at or above peak / sqrt(2) and above 1
        (:func:`~moesd.model.predict.batch_range`), None when SD pays nowhere.
    other_host_ms : float
        The other host cost this was recomputed at (ms per forward pass).
    on_at_other_host : numpy.ndarray
        The batch sizes where SD is on at that host cost.
    host_decides : bool
        Whether the on/marginal batch sizes differ at the other host cost.
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


@dataclass(frozen=True)
class Recommendation:
    """The predictor's answer for one setup (:func:`recommend`).

    Attributes
    ----------
    frame : pandas.DataFrame
        Every predicted row (:func:`~moesd.model.predict.predict_sd`), all batch sizes.
    hardware : moesd.theory.roofline.Hardware
        The GPU.
    fits : numpy.ndarray
        Whether each batch size asked for fits target and draft in memory.
    judged : numpy.ndarray
        The batch sizes the advice covers: those that fit, or all when none does.
    shortfalls : list of Shortfall
        The models that do not fit at the largest batch size.
    vocabularies : tuple of int
        The target's and the draft's vocabulary sizes (SD needs them equal).
    shares_target_shape : bool
        The draft shares the target's hidden size and vocabulary (an MTP head or a one-layer draft).
    advice : list of Advice
        One per acceptance value.
    engine_ends : dict
        With an engine profile: for ``"low"`` and ``"high"`` (its costs at the end of their published
        ranges that favours and that disfavours SD, :meth:`~moesd.model.engine.EngineProfile.at`), the batch
        sizes where SD is on, one array per acceptance value; empty without a profile.
    draft_head : bool
        The draft is an EAGLE-3 head of :data:`moesd.zoo.DRAFT_HEADS` (its own vocabulary, by design).
    """

    frame: pd.DataFrame
    hardware: object
    fits: np.ndarray
    judged: np.ndarray
    shortfalls: list
    vocabularies: tuple
    shares_target_shape: bool
    advice: list
    engine_ends: dict = dataclasses.field(default_factory=dict)
    draft_head: bool = False


def _shortfalls(fit: pd.DataFrame, models: dict, hardware, dtype: str) -> list:
    """The models of ``models`` (role: ``(model, GPUs, dp_attention)``) that ``fit`` says do not fit, each with
    the larger tensor-parallel sizes it takes: those within one node, or, from a full node, those across nodes."""
    smaller = tuple(name for name, size in DTYPE_BYTES.items() if size < DTYPE_BYTES[check_dtype(dtype)])
    shortfalls = []
    for role, (model, gpus, dp_attention) in models.items():
        held = fit[f"{role}_bytes"].to_numpy()
        if held.max() > hardware.memory_bytes:
            larger = [tp for tp in tensor_parallel_sizes(model, hardware, dp_attention) if tp > gpus]
            in_node = [tp for tp in larger if tp <= hardware.gpus_per_node]
            shortfalls.append(Shortfall(role, gpus, float(held.max()), float(held.min()), float(hardware.memory_bytes),
                                        tuple(in_node or larger), smaller))
    return shortfalls


def _advice(column: str, value: float, rows: pd.DataFrame, other: pd.DataFrame, other_host_ms: float) -> Advice:
    best = best_gamma(rows)
    best = best.assign(sd=sd_status(best["speedup"]))
    alternative = best_gamma(other)
    status, other_status = sd_status(best["speedup"]), sd_status(alternative["speedup"])
    low, high, peak, at = batch_range(rows)
    return Advice(column, float(value), best, best.loc[status == "on", "batch_size"].to_numpy(),
                  best.loc[status == "marginal", "batch_size"].to_numpy(), peak, at,
                  None if low is None else (low, high), other_host_ms,
                  alternative.loc[other_status == "on", "batch_size"].to_numpy(),
                  not np.array_equal(status == "on", other_status == "on")
                  or not np.array_equal(status == "marginal", other_status == "marginal"))


def recommend(target, draft, hardware, batch_sizes, gammas, column: str, values, tp: int = 1, draft_tp: int = 1,
              ep: int = 1, context: int = 1024, dtype: str = "bf16", host_ms: float = 0.0,
              other_host_ms: float | None = None, engine=None, step_ms: float | None = None,
              alpha_decay: float = 1.0, dp_attention: bool = False) -> Recommendation:
    """Where SD pays for ``target`` with ``draft`` on ``hardware``, over batch sizes and draft lengths.

    Parameters
    ----------
    target, draft, hardware
        As :func:`moesd.model.predict.predict_sd` takes them.
    batch_sizes, gammas : array_like of int
        Sequences B and draft lengths to predict.
    column : str
        ``"alpha"`` (per-token acceptance) or ``"sigma"`` (Eq. 5's emitted fraction); ``values`` its values.
    tp, draft_tp, ep, context, dtype
        As :func:`~moesd.model.predict.predict_sd` takes them (``context`` in tokens).
    host_ms : float
        Host cost of every forward pass, ms.
    other_host_ms : float, optional
        The host cost the advice is checked against, ms (default: vLLM v0's measured cost,
        :data:`moesd.paper.predictor_check.HOST_SECONDS_VLLM_V0`, when ``host_ms`` is 0, else 0).
    engine, alpha_decay, dp_attention
        As :func:`~moesd.model.predict.predict_sd` takes them; with a profile the advice is also
        recomputed at both ends of its costs' ranges (``Recommendation.engine_ends``).
    step_ms : float, optional
        A measured plain decoding step at batch size 1, ms (``predict_sd``'s ``step_seconds``).

    Returns
    -------
    Recommendation
    """
    from moesd.paper.predictor_check import HOST_SECONDS_VLLM_V0

    batch_sizes, values = np.asarray(batch_sizes), np.asarray(values, dtype=float)
    if step_ms is not None:  # a measured step holds the host's cost already
        other_host_ms = host_ms
    elif other_host_ms is None:
        other_host_ms = 0.0 if host_ms else HOST_SECONDS_VLLM_V0 * 1e3

    profile = None if engine is None else engine_profile(engine)
    step_seconds = None if step_ms is None else step_ms * 1e-3
    decay = {"alpha_decay": alpha_decay} if column == "alpha" else {}

    def predict(batch, milliseconds, engine_at=profile):
        return predict_sd(target, draft, hardware, batch, gammas, tp=tp, draft_tp=draft_tp, context=context, ep=ep,
                          dtype=dtype, efficiency=Efficiency(step_seconds=milliseconds * 1e-3), engine=engine_at,
                          step_seconds=step_seconds, dp_attention=dp_attention, **decay, **{column: values})

    frame = predict(batch_sizes, host_ms)
    hardware = hardware_record(hardware)
    target_shape, draft_shape = resolve_model(target), resolve_model(draft)
    fit = memory_fit(target, draft, hardware, batch_sizes, context, tp, draft_tp, ep, dtype, dp_attention=dp_attention)
    fits = fit["fits"].to_numpy()
    judged = batch_sizes[fits] if fits.any() else batch_sizes
    other = predict(judged, other_host_ms)
    advice = [_advice(column, value, frame[(frame[column] == value) & frame["batch_size"].isin(judged)],
                      other[other[column] == value], other_host_ms) for value in values]
    ends = {}
    if profile is not None and profile.costs() and any(c.low < c.high for c in profile.costs().values()):
        for end in ("low", "high"):
            rows = predict(judged, host_ms, profile.at(end))
            ends[end] = [best_gamma(rows[rows[column] == value]).pipe(
                lambda best: best.loc[sd_status(best["speedup"]) == "on", "batch_size"].to_numpy()) for value in values]
    return Recommendation(frame, hardware, fits, judged,
                          _shortfalls(fit, {"target": (target_shape, tp, dp_attention),
                                            "draft": (draft_shape, draft_tp, False)}, hardware, dtype),
                          (target_shape.vocab_size, draft_shape.vocab_size),
                          target_shape.hidden_size == draft_shape.hidden_size
                          and target_shape.vocab_size == draft_shape.vocab_size, advice, ends,
                          isinstance(draft, str) and draft.lower() in DRAFT_HEADS)
