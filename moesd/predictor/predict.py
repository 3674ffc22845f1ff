"""Predicting a speculative-decoding setup from first principles (beyond the paper): its speedup.

The paper fits Algorithm 1 to measurements; this module predicts the same quantities for any deployment
(:class:`moesd.predictor.setup.Setup`: any :class:`~moesd.architecture.Architecture` on any
:class:`~moesd.theory.roofline.Hardware`) from the step times of :func:`moesd.predictor.forward.step_time`:

* :func:`predict_sd`: ``T_T(B, 1)``, ``T_T(B, gamma + 1)``, ``T_D(B, 1)`` and the rejection step, and
  from them target efficiency and the speedup of Eq. 4 with its decomposition, over a grid of batch
  sizes, draft lengths, acceptance and contexts. A separate draft model runs on a GPU of its own, as in the
  paper; a draft head (an MTP module, an EAGLE head) on the target's GPUs, as serving engines run it.
  :func:`best_gamma` and :func:`batch_range` read the best draft length and the band of batch sizes
  where SD pays.
* :func:`tree_capacity`: the most tokens a tree of drafts offers for verification.

Whether a setup fits its GPUs' memory is :mod:`moesd.predictor.memory`; the model checked against the paper's
Tables 1-2 lives in :mod:`moesd.paper.predictor_check`, and fitted to a measured forward study in
:mod:`moesd.model.calibrate`.

Pure numpy; no torch.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from moesd._checks import UsageError, as_array
from moesd.predictor.engine import Cost, engine_profile
from moesd.predictor.forward import step_time
from moesd.predictor.kernels import Efficiency, rejection_time, sampling_time
from moesd.predictor.setup import Setup
from moesd.theory.acceptance import position_acceptance, tokens_per_round
from moesd.theory.speedup import sigma as emitted_fraction
from moesd.theory.speedup import speedup_terms

__all__ = ["PAPER_BATCH_SIZES", "tree_capacity", "check_grid", "predict_sd", "best_gamma", "batch_range"]

PAPER_BATCH_SIZES = (1, 2, 4, *range(8, 61, 4), 80, 100)
"""The paper's batch sizes (Sec. 7): 19 values from 1 to 100; ``moesd.measure.sweeps.BATCH_SIZES`` is this tuple."""


def tree_capacity(gamma, draft_topk) -> np.ndarray:
    """The most tokens a tree of drafts can offer for verification per sequence (the last verified token
    included): ``1 + k + (gamma - 1) k^2`` for ``gamma`` draft steps of ``k = draft_topk`` candidates, each step
    expanding the ``k`` best nodes into ``k`` children each (SGLang's EAGLE tree); ``gamma + 1`` for a chain."""
    gamma = as_array("gamma", gamma, low=1, whole=True)
    k = as_array("draft_topk", draft_topk, low=1, whole=True)
    return 1 + k + (gamma - 1) * k ** 2


def _grid(**arrays) -> dict:
    """Every combination of the 1-D arguments, flattened (the first argument varies slowest)."""
    names = list(arrays)
    mesh = np.meshgrid(*(np.atleast_1d(arrays[n]).ravel() for n in names), indexing="ij")
    return {n: m.ravel() for n, m in zip(names, mesh)}


def check_grid(setup: Setup, batch_size, gamma, sigma=None, alpha=None, alpha_decay=1.0, context=None,
               top_k=None) -> dict:
    """:func:`predict_sd`'s rows, checked before any pricing: every combination of its axes (arguments as it takes
    them), with each row's ``sigma``, as a dict of flat arrays by column.

    Raises
    ------
    UsageError
        Naming the argument, as :func:`predict_sd` raises for its grid.
    """
    if (sigma is None) == (alpha is None):
        raise UsageError("sigma: give either sigma or alpha (not both)", "sigma")
    if alpha is None and alpha_decay != 1:
        raise UsageError("alpha_decay: a decay applies to alpha, not to sigma", "alpha_decay")
    axes = dict(batch_size=as_array("batch_size", batch_size, low=1, whole=True),
                gamma=as_array("gamma", gamma, low=1, whole=True))
    if alpha is None:
        axes["sigma"] = as_array("sigma", sigma, low=0, high=1, low_open=True)
    else:
        axes["alpha"] = as_array("alpha", alpha, low=0, high=1)
    axes["context"] = as_array("context", setup.context if context is None else context, low=0, whole=True)
    if top_k is not None:
        axes["num_experts_per_tok"] = as_array("top_k", top_k, low=1, whole=True)
    grid = _grid(**axes)
    if alpha is not None:
        grid = {**grid, "sigma": _emitted(grid["alpha"], grid["gamma"], alpha_decay)}
    positions = setup.draft.draft_positions
    if positions and (grid["gamma"] > positions).any():
        raise UsageError(f"gamma: {setup.draft.name} propose {positions} positions per round, got gamma = "
                         f"{int(grid['gamma'].max())}", "gamma")
    tree_tokens = setup.tree_tokens
    if tree_tokens is not None:
        capacity = tree_capacity(grid["gamma"], setup.draft_topk)
        if (capacity < tree_tokens).any():
            raise UsageError(f"verify_tokens: a tree of gamma = "
                             f"{int(grid['gamma'][capacity < tree_tokens].min())} draft steps of {setup.draft_topk} "
                             f"candidates offers at most {int(capacity[capacity < tree_tokens].min())} tokens per "
                             f"sequence, got {tree_tokens}", "verify_tokens")
        emitted = grid["sigma"] * (grid["gamma"] + 1)
        if (emitted > tree_tokens * (1 + 1e-12)).any():
            raise UsageError(f"verify_tokens: a round emits at most the "
                             f"{tree_tokens} tokens it verifies, but the acceptance gives up to "
                             f"{float(emitted.max()):.3g} tokens per round; give a smaller gamma or the tree's own "
                             f"acceptance length", "verify_tokens")
    return grid


def predict_sd(setup: Setup, batch_size, gamma, sigma=None, *, alpha=None, alpha_decay=1.0, context=None,
               top_k=None, routing=None, routing_model="windows", efficiency: Efficiency | None = None,
               draft_efficiency: Efficiency | None = None, cuda_graphs=True, grouped_experts=True) -> pd.DataFrame:
    """Predicted speculative-decoding speedup (Eq. 4) and its terms over a grid of settings.

    The target verifies on its ``tp`` GPUs; the draft proposes on its own (by default one GPU for a separate draft
    model, the paper's setup, and the target's ``tp`` for a draft head: :class:`~moesd.predictor.setup.Setup`). A
    round costs ``gamma T_D(B, 1) + T_T(B, gamma + 1) + T_reject``; the verification pass scores ``gamma + 1``
    positions per sequence (the drafts and the bonus token, as vLLM and :mod:`moesd.engine.sd` do;
    ``Setup.verify_tokens="gamma"`` scores ``gamma``, as Algorithm 1 writes, a number a tree's tokens).

    Parameters
    ----------
    setup : Setup
        The deployment: models, GPUs, parallelism, dtypes, context, engine profile, measured step, tree. With an
        engine profile (``Setup.engine``): the host time SD rounds expose, the draft steps' fixed cost, a draft
        head's extend pass and grouped-GEMM tiles. With a measured plain step (``Setup.step_seconds`` at
        ``Setup.step_batch_size`` sequences, at each row's ``context``): what it exceeds the predicted step by is a
        fixed cost per forward pass, spread evenly over the target's layers; every target pass adds it and every
        draft pass its layers' share. A tree (``Setup.draft_topk`` candidates per position): every draft step is
        priced as a pass of that many tokens per sequence, all ``gamma`` of them, or, for a draft head with a profile
        that runs an extend pass, the ``gamma - 1`` after that pass (which gives the first position); give a tree's
        acceptance as ``sigma`` (its mean acceptance length over ``gamma + 1``).
    batch_size, gamma, sigma : array_like
        Batch sizes ``B``, draft lengths and emitted fractions ``sigma`` (Eq. 5; each in
        ``[1 / (gamma + 1), 1]``). Every combination is a row.
    alpha : array_like, optional
        Per-token acceptance probabilities instead of ``sigma``: each row then has
        ``sigma = sigma(alpha, gamma)`` of Eq. 5, so longer drafts emit a smaller fraction.
    alpha_decay : float, default 1.0
        With ``alpha``: the acceptance of draft position ``i`` is ``alpha alpha_decay**(i - 1)``
        (:func:`moesd.theory.acceptance.position_acceptance`), so ``alpha`` is the first position's; 1 is
        Eq. 5's constant acceptance.
    context : array_like, optional
        Tokens in each sequence's KV cache (prompt and generated so far), a grid axis; default the setup's.
    top_k, routing, routing_model, cuda_graphs, grouped_experts, efficiency
        As in :func:`step_time` (the target's); ``top_k`` may be an array (a grid axis). A
        :class:`~moesd.routing.traces.RoutingTrace` as ``routing`` gives ``N(B)`` of the decode step and
        ``N(B (gamma + 1))`` of verification from the measured routing (its consecutive tokens'
        correlation kept with ``routing_model="windows"``), so real routing reaches the speedup. Default
        ``efficiency``: :class:`~moesd.predictor.kernels.Efficiency` with ``Setup.host_seconds`` per forward pass.
    draft_efficiency : Efficiency, optional
        The draft's efficiency and overheads (default ``efficiency``; with an engine profile, the defaults with the
        engine's kernels).

    Returns
    -------
    pandas.DataFrame
        One row per combination: ``batch_size``, ``gamma``, ``sigma``, ``context`` (and
        ``num_experts_per_tok`` when ``top_k`` is given); the times ``t_target_1``, ``t_target_gamma``
        (the verification pass), ``t_draft`` (one proposal step), ``t_reject`` (seconds); the Eq. 4
        terms ``tokens_per_round = sigma (gamma + 1)``, ``verify_term = 1 / target efficiency``,
        ``draft_term = gamma t_draft / t_target_1``, ``reject_term = t_reject / t_target_1``; and
        ``target_efficiency`` and ``speedup = tokens_per_round / (verify_term + draft_term + reject_term)``.
        With an engine profile or a measured step also ``fixed_seconds`` (the fixed cost per target pass),
        ``exposed_host_seconds`` (per round) and ``t_draft_extend`` (the extend pass; 0 without one);
        ``t_draft`` is then the round's drafting time over ``gamma``.

    Raises
    ------
    UsageError
        Naming the argument, for a grid the setup cannot take (a tree's tokens beyond what its draft steps offer,
        an acceptance that emits more than a tree verifies) and bad values; ``efficiency`` with a host cost.
    """
    grid = check_grid(setup, batch_size, gamma, sigma, alpha, alpha_decay, context, top_k)
    if setup.host_seconds and (efficiency is not None or draft_efficiency is not None):
        raise UsageError("efficiency: a host cost (Setup.host_seconds) is an "
                         "Efficiency's step_seconds; give one or the other", "efficiency")
    target_efficiency = setup.efficiency(efficiency)
    draft_efficiency = (setup.efficiency(draft_efficiency, "draft") if setup.engine is not None
                        else draft_efficiency or target_efficiency)
    passes = _Passes(setup, target_efficiency, draft_efficiency, routing, routing_model, cuda_graphs, grouped_experts)
    k = grid.get("num_experts_per_tok")
    tree_tokens = setup.tree_tokens
    verify = (np.full_like(grid["gamma"], tree_tokens) if tree_tokens is not None
              else grid["gamma"] + (1 if setup.verify_tokens == "gamma+1" else 0))
    # Time each distinct (B, s, context, K) once: sigma does not change a step.
    key = np.stack([grid["batch_size"], grid["context"], k if k is not None else np.zeros_like(grid["gamma"])])
    unique, inverse = np.unique(key, axis=1, return_inverse=True)
    inverse = inverse.ravel()
    t1 = passes.plain(unique[0], unique[1], unique[2] if k is not None else None)[inverse]
    draft_step = passes.draft_step(unique[0], unique[1])[inverse]
    t_verify = passes.target(verify, grid["batch_size"], grid["context"], k)
    t_reject = passes.reject(grid["batch_size"], grid["gamma"], verify)
    steps = passes.steps(grid["gamma"])
    engine_columns = {}
    if setup.engine is not None or setup.step_seconds is not None:
        extra = (_measured_round_extra(setup, efficiency, draft_efficiency if setup.engine is None else None,
                                       cuda_graphs, grouped_experts) if setup.sd_step_seconds is not None else None)
        engine_columns = _engine_round(setup, grid, t1, draft_step, passes, steps, extra)
        t1, t_verify = t1 + engine_columns["fixed_seconds"], t_verify + engine_columns.pop("verify_extra")
        draft_step = engine_columns.pop("draft_per_token")
    else:
        draft_step = draft_step * steps / grid["gamma"]
    terms = speedup_terms(grid["sigma"], grid["gamma"], t1, t_verify, draft_step, t_reject)
    return pd.DataFrame({
        **{name: values for name, values in grid.items()},
        "t_target_1": t1, "t_target_gamma": t_verify, "t_draft": draft_step,
        "t_reject": t_reject, "tokens_per_round": terms.tokens_per_round, "verify_term": terms.verify,
        "draft_term": terms.draft, "reject_term": terms.reject, "target_efficiency": 1.0 / terms.verify,
        "speedup": terms.speedup, **engine_columns,
    }).astype({"batch_size": int, "gamma": int, "context": int})


class _Passes:
    """The passes of one round of :func:`predict_sd` for a setup, each a function of the grid's arrays (seconds)."""

    def __init__(self, setup: Setup, target_efficiency: Efficiency, draft_efficiency: Efficiency, routing,
                 routing_model: str, cuda_graphs: bool, grouped_experts: bool):
        self.setup, self.target_efficiency, self.draft_efficiency = setup, target_efficiency, draft_efficiency
        self.routing, self.routing_model = routing, routing_model
        self.cuda_graphs, self.grouped_experts = cuda_graphs, grouped_experts

    def target(self, tokens, batch, context, top_k=None):
        """One target pass of ``tokens`` new tokens per sequence."""
        setup = self.setup
        return step_time(setup.target, setup.hardware, tokens, batch, context, setup.tp, setup.ep, setup.dtype,
                         top_k=top_k, cuda_graphs=self.cuda_graphs, routing=self.routing,
                         routing_model=self.routing_model, efficiency=self.target_efficiency,
                         grouped_experts=self.grouped_experts, dp_attention=setup.dp_attention,
                         kv_dtype=setup.kv_dtype).total

    def plain(self, batch, context, top_k=None):
        """The target's plain decoding step: one pass of one token per sequence and, at a temperature, its sampling."""
        seconds = self.target(1, batch, context, top_k)
        if self.setup.temperature is None:
            return seconds
        return seconds + sampling_time(self.setup.hardware, batch, 1, self.setup.target.vocab_size,
                                       self.setup.temperature, efficiency=self.target_efficiency,
                                       cuda_graphs=self.cuda_graphs)

    def draft(self, tokens, batch, context, graphs=None):
        """One draft pass of ``tokens`` new tokens per sequence (none for the n-gram drafter)."""
        setup = self.setup
        if setup.drafting == "free":
            return np.zeros(np.broadcast_shapes(np.shape(tokens), np.shape(batch), np.shape(context)))
        return step_time(setup.draft, setup.draft_device, tokens, batch, context, setup.draft_gpus, setup.draft_ep,
                         setup.draft_weights, cuda_graphs=self.cuda_graphs if graphs is None else graphs,
                         efficiency=self.draft_efficiency, grouped_experts=self.grouped_experts,
                         dp_attention=setup.draft_dp_attention, kv_dtype=setup.kv_dtype).total

    def draft_step(self, batch, context):
        """One draft step: a pass of ``draft_topk`` tokens per sequence (Medusa's heads: one, on the target's last
        hidden state) and, at a temperature, drawing from the draft's distribution (an argmax for a head)."""
        setup = self.setup
        seconds = self.draft(1 if setup.drafting == "parallel" else setup.draft_topk, batch, context)
        if setup.temperature is None or setup.drafting != "autoregressive":
            return seconds
        return seconds + sampling_time(setup.draft_device, batch, setup.draft_topk, setup.draft.vocab_size,
                                       0.0 if setup.head else setup.temperature, efficiency=self.draft_efficiency,
                                       cuda_graphs=self.cuda_graphs)

    def reject(self, batch, gamma, verify):
        """Verifying a round's drafts: rejection sampling (:func:`rejection_time`) or, at a temperature, the sampling
        kernels over the ``verify`` positions (:func:`sampling_time`)."""
        setup = self.setup
        if setup.temperature is None:
            return rejection_time(setup.hardware, batch, gamma, setup.target.vocab_size, self.target_efficiency,
                                  self.cuda_graphs, verified=setup.tree_tokens)
        return sampling_time(setup.hardware, batch, verify, setup.target.vocab_size, setup.temperature,
                             drafted=verify - 1, draft_probs=not setup.head, efficiency=self.target_efficiency,
                             cuda_graphs=self.cuda_graphs)

    def steps(self, gamma):
        """Draft passes per round: ``gamma``, one for Medusa's heads, none for the n-gram drafter."""
        return {"free": 0 * gamma, "parallel": np.ones_like(gamma)}.get(self.setup.drafting, gamma)


def _measured_round_extra(setup: Setup, efficiency, draft_efficiency, cuda_graphs, grouped_experts) -> float:
    """What the measured SD round (``Setup.sd_step_seconds`` at ``step_batch_size`` and ``sd_step_gamma``) exceeds the
    predicted one by, without the profile's exposed host time (seconds); a UsageError where it is below it."""
    profile = setup.engine or engine_profile("device")
    none = Cost(0.0, 0.0, 0.0, "replaced by the measured round")
    base = dataclasses.replace(setup, sd_step_seconds=None, sd_step_gamma=None,
                               engine=dataclasses.replace(profile, exposed_host_seconds=none))
    gamma = setup.sd_step_gamma
    row = predict_sd(base, setup.step_batch_size, gamma, 1 / (gamma + 1), efficiency=efficiency,
                     draft_efficiency=draft_efficiency, cuda_graphs=cuda_graphs,
                     grouped_experts=grouped_experts).iloc[0]
    predicted = row["t_target_gamma"] + gamma * row["t_draft"] + row["t_reject"]
    if predicted > setup.sd_step_seconds:
        raise UsageError(f"sd_step_seconds must be at least the predicted round at batch size {setup.step_batch_size} "
                         f"and gamma {gamma}, {predicted * 1e3:.3g} ms, got {setup.sd_step_seconds * 1e3:.3g} ms",
                         "sd_step_seconds")
    return setup.sd_step_seconds - predicted


def _engine_round(setup: Setup, grid: dict, t1, draft_step, passes: _Passes, steps, measured_extra=None) -> dict:
    """Seconds an engine adds to a round (see :func:`predict_sd`'s ``Setup.engine`` and ``Setup.step_seconds``).

    Parameters
    ----------
    setup : Setup
        The deployment (its engine profile, or the GPUs' work only, and its measured step).
    grid : dict
        :func:`predict_sd`'s rows (``batch_size``, ``gamma``, ``context``, ``num_experts_per_tok`` if given).
    t1, draft_step : numpy.ndarray
        The target's plain step and one draft step per row, from the GPUs' work, seconds.
    passes : _Passes
        The round's passes.
    steps : numpy.ndarray
        Draft passes per round and row.
    measured_extra : float, optional
        What a measured SD round exceeds the predicted one by (:func:`_measured_round_extra`): the exposed time of
        every round in place of the profile's.

    Returns
    -------
    dict
        Per row, seconds: ``fixed_seconds`` (per target pass), ``exposed_host_seconds`` (per round: the
        profile's, at most the plain step it is hidden behind, or the measured round's), ``t_draft_extend``,
        ``verify_extra`` (what verification adds) and ``draft_per_token`` (the round's drafting over ``gamma``).
    """
    profile = setup.engine or engine_profile("device")
    B, gamma, context = grid["batch_size"], grid["gamma"], grid["context"]
    fixed = np.zeros(B.shape)
    if setup.step_seconds is not None:
        measured, anchor = setup.step_seconds, setup.step_batch_size
        alone = passes.plain(anchor, context, grid.get("num_experts_per_tok"))
        if (alone > measured).any():
            raise UsageError(f"step_seconds must be at least the predicted step at "
                             f"batch size {anchor}, {float(alone.max()) * 1e3:.3g} ms, got {measured * 1e3:.3g} ms",
                             "step_seconds")
        fixed = measured - alone
    draft_fixed = (fixed / setup.target.num_layers * setup.draft.num_layers + profile.draft_host_seconds.value
                   if setup.drafting != "free" else 0.0)
    # overlap scheduling hides host time behind the GPU's step: never more than the plain step itself
    exposed = (np.minimum(profile.exposed_host_seconds.value, t1 + fixed) if measured_extra is None
               else np.full(B.shape, measured_extra))
    extend = np.zeros(B.shape)
    head = setup.head and profile.draft_extend and setup.drafting == "autoregressive"
    if head:
        extend = passes.draft(gamma + 1, B, context, profile.extend_graphs) + draft_fixed
    drafting = extend + (steps - head) * (draft_step + draft_fixed)
    return {"fixed_seconds": fixed, "exposed_host_seconds": exposed, "t_draft_extend": extend,
            "verify_extra": fixed + exposed, "draft_per_token": drafting / gamma}


def _emitted(alpha: np.ndarray, gamma: np.ndarray, decay) -> np.ndarray:
    """Eq. 5's ``sigma`` of each row, with the acceptance of draft position ``i`` ``alpha decay**(i - 1)``."""
    decay = float(as_array("alpha_decay", decay, low=0, high=1, low_open=True))
    if decay == 1.0:
        return emitted_fraction(alpha, gamma)
    sigma = np.empty(alpha.shape)
    for g in np.unique(gamma):
        rows = gamma == g
        sigma[rows] = tokens_per_round(position_acceptance(alpha[rows], int(g), decay)) / (g + 1)
    return sigma


def best_gamma(frame: pd.DataFrame, by=("batch_size",)) -> pd.DataFrame:
    """The row of highest speedup per group of ``by`` (default: per batch size) of a :func:`predict_sd` frame."""
    by = list(by)
    missing = [c for c in [*by, "speedup"] if c not in frame.columns]
    if missing:
        raise UsageError(f"frame lacks column(s) {', '.join(missing)}; pass a predict_sd frame", "frame")
    return frame.loc[frame.groupby(by)["speedup"].idxmax()].reset_index(drop=True)


def best_speedup(frame: pd.DataFrame) -> pd.Series:
    """The best speedup over gamma at each batch size of a :func:`predict_sd` frame (:func:`best_gamma`), indexed by
    batch size."""
    return best_gamma(frame).set_index("batch_size")["speedup"]


def batch_range(frame: pd.DataFrame, fraction=2 ** -0.5) -> tuple[int | None, int | None, float, int]:
    """The run of batch sizes around the peak where the best speedup over gamma stays at or above ``fraction``
    of its peak (the paper's x / sqrt(2) band) and above 1 (SD pays).

    The run is unbroken over the frame's batch sizes: it ends at the first batch size on either side of
    the peak that falls below, even if a farther one rises above again.

    Returns
    -------
    tuple
        ``(lowest B, highest B, peak speedup, B of the peak)`` over the frame's batch sizes; the two ends
        are None when the peak speedup is at most 1 (SD pays nowhere, so there is no band).
    """
    best = best_gamma(frame)
    speedup = best["speedup"].to_numpy()
    at = int(speedup.argmax())
    peak = float(speedup[at])
    sizes = best["batch_size"]
    if peak <= 1:
        return None, None, peak, int(sizes.iloc[at])
    below = np.flatnonzero((speedup < fraction * peak) | (speedup <= 1))
    low = below[below < at].max() + 1 if (below < at).any() else 0
    high = below[below > at].min() - 1 if (below > at).any() else len(best) - 1
    return int(sizes.iloc[low]), int(sizes.iloc[high]), peak, int(sizes.iloc[at])


@dataclasses.dataclass(frozen=True)
class SpeedupShape:
    """The shape of the best speedup over gamma against batch size, of a :func:`predict_sd` frame.

    Attributes
    ----------
    batch_sizes : int
        Batch sizes in the frame; ``largest_batch_size`` the largest of them.
    at_one : float
        Best speedup at the smallest batch size.
    lowest_before_peak, lowest_before_peak_at : float, int
        The lowest best speedup at or before the peak, and its batch size (a dip when below ``at_one``).
    peak, peak_at, peak_gamma : float, int, int
        The peak best speedup, its batch size and its gamma.
    band_low, band_high : int or None
        :func:`batch_range`'s run around the peak at or above peak / sqrt(2) and above 1 (None: SD pays nowhere).
    """

    batch_sizes: int
    largest_batch_size: int
    at_one: float
    lowest_before_peak: float
    lowest_before_peak_at: int
    peak: float
    peak_at: int
    peak_gamma: int
    band_low: int | None
    band_high: int | None


def speedup_shape(frame: pd.DataFrame) -> SpeedupShape:
    """The :class:`SpeedupShape` of a :func:`predict_sd` frame (its best gamma per batch size)."""
    low, high, peak, at = batch_range(frame)
    best = best_gamma(frame).set_index("batch_size")
    before = best.loc[:at, "speedup"]
    return SpeedupShape(len(best), int(best.index.max()), float(best["speedup"].iloc[0]), float(before.min()),
                        int(before.idxmin()), peak, at, int(best.loc[at, "gamma"]), low, high)


def one_layer_draft_setup(model, hardware, tp: int, dtype: str, **deployment) -> Setup:
    """A deployment of ``model`` with a one-layer draft of its own shape (the size of an MTP module:
    :func:`moesd.predictor.models.one_layer_draft`) on the target's own ``tp`` GPUs (``shared``): SD as engines
    deploy it today.

    ``deployment`` passes on to :class:`~moesd.predictor.setup.Setup` (``context``, ``ep``, ...).
    """
    from moesd.predictor.models import one_layer_draft

    return Setup(model, one_layer_draft(model), hardware, tp=tp, draft_tp=tp, shared=True, dtype=dtype, **deployment)


def predict_fitting(setup: Setup, batch_size, gamma, alpha, routing=None) -> pd.DataFrame:
    """:func:`predict_sd` at acceptance rate ``alpha`` over ``batch_size`` x ``gamma``, only the rows whose batch size
    and context fit the setup's GPUs in memory (:func:`moesd.predictor.memory.rows_that_fit`)."""
    from moesd.predictor.memory import rows_that_fit

    return rows_that_fit(predict_sd(setup, batch_size, gamma, alpha=alpha, routing=routing), setup)
