"""Predicting a speculative-decoding setup from first principles (beyond the paper): its speedup and its memory.

The paper fits Algorithm 1 to measurements; this module predicts the same quantities for any
:class:`moesd.zoo.ModelSpec` on any :class:`moesd.theory.roofline.Hardware`, from the step times of
:func:`moesd.model.forward.step_time`:

* :func:`predict_sd`: ``T_T(B, 1)``, ``T_T(B, gamma + 1)``, ``T_D(B, 1)`` and the rejection step, and
  from them target efficiency and the speedup of Eq. 4 with its decomposition, over a grid of batch
  sizes, draft lengths, acceptance and contexts. A separate draft model runs on a GPU of its own, as in the
  paper; a draft head (an MTP module, an EAGLE head) on the target's GPUs, as serving engines run it.
  :func:`best_gamma` and :func:`batch_range` read the best draft length and the band of batch sizes
  where SD pays.
* :func:`check_pair`: refuses a draft that cannot serve the target, and says whether it is a head.
* :func:`memory_per_gpu` and :func:`memory_fit`: whether target and draft, weights and KV cache, fit
  their GPUs' memory.

The model checked against the paper's Tables 1-2 lives in :mod:`moesd.paper.predictor_check`, and fitted to a
measured forward study in :mod:`moesd.model.calibrate`.

Pure numpy; no torch.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from moesd._checks import as_array
from moesd.model.engine import engine_profile
from moesd.model.forward import step_time
from moesd.model.kernels import Efficiency, rejection_time
from moesd.model.layout import check_dtype, resolve_model, weights_per_gpu
from moesd.theory.acceptance import position_acceptance, tokens_per_round
from moesd.theory.speedup import sigma as emitted_fraction
from moesd.theory.speedup import speedup_terms
from moesd.theory.roofline import hardware_record
from moesd.zoo import DRAFT_HEADS, get_model

__all__ = ["PAPER_BATCH_SIZES", "check_pair", "default_draft_tp", "tree_capacity", "memory_per_gpu", "memory_fit",
           "predict_sd", "best_gamma", "batch_range"]

PAPER_BATCH_SIZES = (1, 2, 4, *range(8, 61, 4), 80, 100)
"""The paper's batch sizes (Sec. 7): 19 values from 1 to 100; ``moesd.measure.sweeps.BATCH_SIZES`` is this tuple."""


def _head_of(model) -> str | None:
    """The :data:`moesd.zoo.MODELS` name of the target ``model`` is a draft head of, by its zoo name: the target of
    an EAGLE-3 head of :data:`~moesd.zoo.DRAFT_HEADS` or a record's ``head_of`` (an MTP module); None for any
    other model."""
    name = model if isinstance(model, str) else model.name
    head = DRAFT_HEADS.get(name.lower())
    if head is not None:
        return head.target
    try:
        return get_model(name).head_of
    except KeyError:
        return None


def check_pair(target, draft) -> bool:
    """Whether ``draft`` is a draft head of ``target``, after refusing a pair that cannot run SD.

    A draft head is one decoder layer that drafts from the target's hidden states: a zoo record that names its
    target (an EAGLE-3 head of :data:`moesd.zoo.DRAFT_HEADS`, an MTP module such as ``deepseek-v3-mtp``), or an
    Architecture of one layer of the target's hidden size (:func:`~moesd.model.layout.one_layer_draft`,
    :func:`~moesd.model.layout.eagle3_head`). Refused:

    * a head as the target: it serves no tokens of its own;
    * a zoo head with another target than ``target`` (by zoo name): it was trained on its own target's hidden
      states (and reads vectors of that target's width);
    * a separate draft model whose vocabulary differs from the target's. Standard SD checks the draft's tokens
      by their ids in the target's distribution, so the two need one tokenizer; the rule is equal
      ``vocab_size`` (the rows of the LM heads), as :mod:`moesd.measure.sd` and vLLM require. Vocabularies
      padded to different sizes around one tokenizer (Qwen2.5-72B's 152064 against Qwen2.5-0.5B's 151936) are
      refused as well: a tolerance would also pass unrelated tokenizers (OLMoE's 50304 against OPT's 50272).
      Price such a pair with the draft's Architecture at the target's ``vocab_size``. A head keeps its own
      vocabulary (an EAGLE-3 head maps a smaller one onto the target's).

    Parameters
    ----------
    target, draft : str, ModelSpec or Architecture
        The models.

    Returns
    -------
    bool
        Whether the draft is a head of the target (serving engines run it on the target's GPUs).

    Raises
    ------
    ValueError
        Naming ``target`` or ``draft``, and the models.
    """
    target_arch, draft_arch = resolve_model(target), resolve_model(draft)
    target_name = target if isinstance(target, str) else target_arch.name
    draft_name = draft if isinstance(draft, str) else draft_arch.name
    owner = _head_of(target)
    if owner is not None:
        raise ValueError(f"target: {target_name} is a draft head of {owner}, not a model to serve; give {owner} as "
                         f"the target and {target_name} as the draft")
    owner = _head_of(draft)
    if owner is not None and owner != target_arch.name:
        widths = (f" (hidden size {draft_arch.hidden_size} against {target_arch.name}'s {target_arch.hidden_size})"
                  if draft_arch.hidden_size != target_arch.hidden_size else "")
        raise ValueError(f"draft: {draft_name} is a draft head of {owner} and cannot draft for {target_name}{widths}: "
                         f"a head drafts from its own target's hidden states")
    head = owner is not None or (draft_arch.num_layers == 1 and draft_arch.hidden_size == target_arch.hidden_size)
    if not head and draft_arch.vocab_size != target_arch.vocab_size:
        raise ValueError(f"draft: {draft_name}'s vocabulary has {draft_arch.vocab_size} tokens, {target_name}'s "
                         f"{target_arch.vocab_size}: SD checks the draft's tokens by their ids in the target's "
                         f"vocabulary, so it needs a draft with the target's tokenizer")
    return head


def default_draft_tp(target, draft, tp: int, shared: bool = False, draft_hardware=None, hardware=None) -> int:
    """The draft's GPUs when ``draft_tp`` is not given: the target's ``tp`` for a draft head (:func:`check_pair`)
    on the target's hardware, as serving engines run MTP modules and EAGLE heads, and for any draft placed there
    with ``shared``; else 1, the paper's separate draft on a GPU of its own. ``draft_hardware`` and ``hardware``
    (names or records) matter only when both are given: a draft on other hardware is on GPUs of its own."""
    elsewhere = (draft_hardware is not None and hardware is not None
                 and hardware_record(draft_hardware) != hardware_record(hardware))
    return tp if (shared or check_pair(target, draft)) and not elsewhere else 1


def tree_capacity(gamma, draft_topk) -> np.ndarray:
    """The most tokens a tree of drafts can offer for verification per sequence (the last verified token
    included): ``1 + k + (gamma - 1) k^2`` for ``gamma`` draft steps of ``k = draft_topk`` candidates, each step
    expanding the ``k`` best nodes into ``k`` children each (SGLang's EAGLE tree); ``gamma + 1`` for a chain."""
    gamma = as_array("gamma", gamma, low=1, whole=True)
    k = as_array("draft_topk", draft_topk, low=1, whole=True)
    return 1 + k + (gamma - 1) * k ** 2


def _draft_data_parallel(dp_attention: bool, tp: int, draft_tp: int, draft_arch) -> bool:
    """Whether the draft runs attention data-parallel: a MoE draft on the target's ``tp`` GPUs (an MTP head) under
    ``dp_attention`` runs as the target does."""
    return dp_attention and draft_tp == tp and bool(draft_arch.num_experts)


def memory_per_gpu(model, hardware, batch_size, context, tp=1, ep=1, dtype="bf16", dp_attention=False) -> np.ndarray:
    """Bytes each of the target's ``tp`` GPUs holds: its weights (:func:`weights_per_gpu`) and KV cache.

    The cache holds ``context`` tokens for each of ``batch_size`` sequences, what a decode step of
    :func:`step_time` reads from it (KV heads split over the GPUs as there; bf16 values, fp32 for fp32 weights).
    Activations, the serving engine's workspace and fragmentation are not counted: a setup above
    the GPU's memory does not fit, one just below may not either. With ``dp_attention`` each GPU holds all
    weights but the routed experts (``E / tp`` of those) and the whole KV cache of ``ceil(B / tp)`` sequences.

    Returns
    -------
    numpy.ndarray
        Bytes, broadcast over ``batch_size`` and ``context``.
    """
    step = step_time(model, hardware, 1, batch_size, context, tp=tp, ep=ep, dtype=dtype, dp_attention=dp_attention)
    return weights_per_gpu(model, dtype, tp, dp_attention) + step.bytes["kv_cache"]


def memory_fit(target, draft, hardware, batch_size, context, tp=1, draft_tp=None, ep=1, dtype="bf16",
               draft_dtype=None, shared=False, dp_attention=False, draft_hardware=None) -> pd.DataFrame:
    """Whether target and draft fit their GPUs' memory at each batch size.

    The target's weights and KV cache on each of its ``tp`` GPUs, and the draft's on each of its
    ``draft_tp`` GPUs (:func:`memory_per_gpu`), each against its own GPU's memory, as :func:`predict_sd` places
    them. A draft on the target's GPUs adds its weights and KV cache to theirs: a draft head
    (:func:`check_pair`) with ``draft_tp`` equal to ``tp`` on the target's hardware always is there, as serving
    engines run MTP modules and EAGLE heads; any other draft is with ``shared``. Activations and the serving
    engine's workspace are not counted, so a setup that fits here may still not fit.

    Parameters
    ----------
    target, draft : str, ModelSpec or Architecture
        The models; a pair :func:`check_pair` refuses raises its ValueError.
    hardware : str or Hardware
        The target's GPU (and the draft's, unless ``draft_hardware``).
    batch_size : array_like
        Sequences ``B`` (>= 1).
    context : array_like
        Tokens in each sequence's KV cache (>= 0), broadcast against ``batch_size``.
    tp, ep : int
        GPUs of the target and its expert-parallel degree.
    draft_tp : int, optional
        GPUs of the draft; default ``tp`` for a draft head or with ``shared``, else 1 (as :func:`predict_sd`).
    dtype, draft_dtype : str
        Weight dtypes (the draft's defaults to ``dtype``).
    shared : bool, default False
        A draft that is not a head on the target's GPUs too (``draft_tp`` must equal ``tp``, and
        ``draft_hardware`` be the target's), as serving engines may run a small draft.
    dp_attention : bool, default False
        The target's attention data-parallel and its routed experts expert-parallel over its ``tp`` GPUs
        (:func:`memory_per_gpu`); a MoE draft on ``tp`` GPUs runs so too, as in :func:`predict_sd`.
    draft_hardware : str or Hardware, optional
        The draft's GPU when it differs from the target's: the draft is checked against its memory.

    Returns
    -------
    pandas.DataFrame
        One row per broadcast ``(batch_size, context)``: ``target_bytes``, what each of the target's GPUs
        holds (a draft on them included), and ``draft_bytes``, the draft's weights and KV cache per GPU of its
        own (bytes), and ``fits``: each at most its GPU's memory.
    """
    hardware = hardware_record(hardware)
    draft_hardware = hardware if draft_hardware is None else hardware_record(draft_hardware)
    B, context = np.broadcast_arrays(as_array("batch_size", batch_size, low=1, whole=True),
                                     as_array("context", context, low=0, whole=True))
    head = check_pair(target, draft)
    if shared and draft_hardware != hardware:
        raise ValueError(f"draft_hardware: a draft on the target's GPUs (shared) runs on the target's {hardware.name}, "
                         f"got {draft_hardware.name}")
    if draft_tp is None:
        draft_tp = default_draft_tp(target, draft, tp, shared, draft_hardware, hardware)
    if shared and draft_tp != tp:
        raise ValueError(f"draft_tp must equal tp for a draft on the target's GPUs (shared), got {draft_tp} and {tp}")
    draft_dp = _draft_data_parallel(dp_attention, tp, draft_tp, resolve_model(draft))
    target_bytes = memory_per_gpu(target, hardware, B, context, tp, ep, dtype, dp_attention)
    draft_bytes = memory_per_gpu(draft, draft_hardware, B, context, draft_tp, draft_tp if draft_dp else 1,
                                 dtype if draft_dtype is None else draft_dtype, draft_dp)
    if shared or (head and draft_tp == tp and draft_hardware == hardware):
        target_bytes = target_bytes + draft_bytes
    fits = (target_bytes <= hardware.memory_bytes) & (draft_bytes <= draft_hardware.memory_bytes)
    return pd.DataFrame({"batch_size": B.ravel(), "context": context.ravel(), "target_bytes": np.ravel(target_bytes),
                         "draft_bytes": np.ravel(draft_bytes), "fits": np.ravel(fits)}
                        ).astype({"batch_size": int, "context": int})


def _grid(**arrays) -> dict:
    """Every combination of the 1-D arguments, flattened (the first argument varies slowest)."""
    names = list(arrays)
    mesh = np.meshgrid(*(np.atleast_1d(arrays[n]).ravel() for n in names), indexing="ij")
    return {n: m.ravel() for n, m in zip(names, mesh)}


def predict_sd(target, draft, hardware, batch_size, gamma, sigma=None, tp=1, draft_tp=None, context=512, *, alpha=None,
               ep=1, top_k=None, dtype="bf16", draft_dtype=None, draft_hardware=None, routing=None,
               routing_model="windows", verify_tokens="gamma+1", efficiency: Efficiency | None = None,
               draft_efficiency: Efficiency | None = None, cuda_graphs=True, grouped_experts=True,
               alpha_decay=1.0, engine=None, step_seconds=None, step_batch_size=1, draft_topk=1,
               dp_attention=False) -> pd.DataFrame:
    """Predicted speculative-decoding speedup (Eq. 4) and its terms over a grid of settings.

    The target verifies on ``tp`` GPUs; the draft proposes on ``draft_tp`` GPUs (by default one GPU for a separate
    draft model, the paper's setup, and the target's ``tp`` for a draft head). A round costs
    ``gamma T_D(B, 1) + T_T(B, gamma + 1) + T_reject``; the verification pass scores ``gamma + 1`` positions
    per sequence (the drafts and the bonus token, as vLLM and :mod:`moesd.measure.sd` do;
    ``verify_tokens="gamma"`` scores ``gamma``, as Algorithm 1 writes).

    Parameters
    ----------
    target, draft : str, ModelSpec or Architecture
        The models (:data:`moesd.zoo.MODELS` names such as ``"qwen2-57b-a14b"``, or records); a pair
        :func:`check_pair` refuses (a head as the target, a head of another target, a separate draft of another
        vocabulary) raises its ValueError.
    hardware : str or Hardware
        The target's GPUs (and the draft's, unless ``draft_hardware``), e.g. ``"H800"``.
    batch_size, gamma, sigma : array_like
        Batch sizes ``B``, draft lengths and emitted fractions ``sigma`` (Eq. 5; each in
        ``[1 / (gamma + 1), 1]``). Every combination is a row.
    alpha : array_like, optional
        Per-token acceptance probabilities instead of ``sigma``: each row then has
        ``sigma = sigma(alpha, gamma)`` of Eq. 5, so longer drafts emit a smaller fraction.
    tp : int
        GPUs of the target.
    draft_tp : int, optional
        GPUs of the draft. Default: ``tp`` for a draft head (:func:`check_pair`: an MTP module or an EAGLE
        head, which serving engines run on the target's GPUs), 1 for a separate draft model (the paper's).
    context : array_like, default 512
        Tokens in each sequence's KV cache (prompt and generated so far).
    ep, top_k, dtype, routing, routing_model, cuda_graphs, grouped_experts, efficiency, dp_attention
        As in :func:`step_time` (the target's); ``top_k`` may be an array (a grid axis). A
        :class:`~moesd.routing.traces.RoutingTrace` as ``routing`` gives ``N(B)`` of the decode step and
        ``N(B (gamma + 1))`` of verification from the measured routing (its consecutive tokens'
        correlation kept with ``routing_model="windows"``), so real routing reaches the speedup.
    draft_dtype : str, optional
        The draft's weight dtype (default ``dtype``).
    draft_hardware : str or Hardware, optional
        The draft's GPU when it differs from the target's.
    draft_efficiency : Efficiency, optional
        The draft's efficiency and overheads (default ``efficiency``).
    verify_tokens : {"gamma+1", "gamma"} or int
        Positions per sequence in the verification pass; a number for a tree of drafts (SGLang's
        ``num_draft_tokens``, which counts the last verified token too).
    draft_topk : int, default 1
        Candidates per position in each draft step (SGLang's ``eagle_topk``; 1: a chain): every draft step
        is priced as a pass of this many tokens per sequence, all ``gamma`` of them, or, for a draft head with
        an ``engine`` whose profile runs an extend pass, the ``gamma - 1`` after that pass (which gives the
        first position). Give a tree's acceptance as ``sigma`` (its mean acceptance length over ``gamma + 1``).
    alpha_decay : float, default 1.0
        With ``alpha``: the acceptance of draft position ``i`` is ``alpha alpha_decay**(i - 1)``
        (:func:`moesd.theory.acceptance.position_acceptance`), so ``alpha`` is the first position's; 1 is
        Eq. 5's constant acceptance.
    engine : str or EngineProfile, optional
        A serving engine's profile (:data:`moesd.model.engine.ENGINES`): the host time SD rounds expose, the
        draft steps' fixed cost, a draft head's extend pass (:func:`check_pair`) and grouped-GEMM tiles.
        Default: the GPUs' work only.
    step_seconds : float, optional
        A measured plain decoding step of the target at batch size ``step_batch_size`` (seconds, at each
        row's ``context``): what it exceeds the predicted step by is a fixed cost per forward pass, spread
        evenly over the target's layers; every target pass adds it and every draft pass its layers' share.
    step_batch_size : int, default 1
        The batch size ``step_seconds`` was measured at.

    Returns
    -------
    pandas.DataFrame
        One row per combination: ``batch_size``, ``gamma``, ``sigma``, ``context`` (and
        ``num_experts_per_tok`` when ``top_k`` is given); the times ``t_target_1``, ``t_target_gamma``
        (the verification pass), ``t_draft`` (one proposal step), ``t_reject`` (seconds); the Eq. 4
        terms ``tokens_per_round = sigma (gamma + 1)``, ``verify_term = 1 / target efficiency``,
        ``draft_term = gamma t_draft / t_target_1``, ``reject_term = t_reject / t_target_1``; and
        ``target_efficiency`` and ``speedup = tokens_per_round / (verify_term + draft_term + reject_term)``.
        With ``engine`` or ``step_seconds`` also ``fixed_seconds`` (the fixed cost per target pass),
        ``exposed_host_seconds`` (per round) and ``t_draft_extend`` (the extend pass; 0 without one);
        ``t_draft`` is then the round's drafting time over ``gamma``.
    """
    if isinstance(verify_tokens, str) and verify_tokens not in ("gamma+1", "gamma"):
        raise ValueError(f"verify_tokens must be 'gamma+1', 'gamma' or a number of tokens, got {verify_tokens!r}")
    tree_tokens = None if isinstance(verify_tokens, str) else int(as_array("verify_tokens", verify_tokens, low=2,
                                                                            high=4096, whole=True))
    draft_topk = int(as_array("draft_topk", draft_topk, low=1, high=4096, whole=True))
    target_arch, draft_arch = resolve_model(target), resolve_model(draft)
    hardware = hardware_record(hardware)
    draft_hardware = hardware_record(draft_hardware) if draft_hardware is not None else hardware
    dtype = check_dtype(dtype)
    draft_dtype = dtype if draft_dtype is None else check_dtype(draft_dtype)
    if (sigma is None) == (alpha is None):
        raise ValueError("sigma: give either sigma or alpha (not both)")
    if alpha is None and alpha_decay != 1:
        raise ValueError("alpha_decay: a decay applies to alpha, not to sigma")
    axes = dict(batch_size=as_array("batch_size", batch_size, low=1, whole=True),
                gamma=as_array("gamma", gamma, low=1, whole=True))
    if alpha is None:
        axes["sigma"] = as_array("sigma", sigma, low=0, high=1, low_open=True)
    else:
        axes["alpha"] = as_array("alpha", alpha, low=0, high=1)
    axes["context"] = as_array("context", context, low=0, whole=True)
    if top_k is not None:
        axes["num_experts_per_tok"] = as_array("top_k", top_k, low=1, whole=True)
    grid = _grid(**axes)
    head = check_pair(target, draft)
    if draft_tp is None:
        draft_tp = default_draft_tp(target, draft, tp, draft_hardware=draft_hardware, hardware=hardware)
    if alpha is not None:
        grid = {**grid, "sigma": _emitted(grid["alpha"], grid["gamma"], alpha_decay)}
    if tree_tokens is not None:
        capacity = tree_capacity(grid["gamma"], draft_topk)
        if (capacity < tree_tokens).any():
            raise ValueError(f"verify_tokens: a tree of gamma = {int(grid['gamma'][capacity < tree_tokens].min())} "
                             f"draft steps of {draft_topk} candidates offers at most "
                             f"{int(capacity[capacity < tree_tokens].min())} tokens per sequence, got {tree_tokens}")
        emitted = grid["sigma"] * (grid["gamma"] + 1)
        if (emitted > tree_tokens * (1 + 1e-12)).any():
            raise ValueError(f"verify_tokens: a round emits at most the {tree_tokens} tokens it verifies, but the "
                             f"acceptance gives up to {float(emitted.max()):.3g} tokens per round; give a smaller "
                             f"gamma or the tree's own acceptance length")
    profile = engine_profile(engine) if engine is not None else None
    if profile is not None:
        efficiency = _engine_efficiency(profile, efficiency, dtype, target_arch.attention)
        draft_efficiency = _engine_efficiency(profile, draft_efficiency, draft_dtype, draft_arch.attention)
    k = grid.get("num_experts_per_tok")
    common = dict(routing=routing, routing_model=routing_model, efficiency=efficiency,
                  grouped_experts=grouped_experts, dp_attention=dp_attention)
    draft_dp = _draft_data_parallel(dp_attention, tp, draft_tp, draft_arch)

    def target_pass(tokens, batch, context, top_k=None):
        """Seconds of one target pass of ``tokens`` new tokens per sequence."""
        return step_time(target_arch, hardware, tokens, batch, context, tp, ep, dtype, top_k=top_k,
                         cuda_graphs=cuda_graphs, **common).total

    def draft_pass(tokens, batch, context, graphs=cuda_graphs):
        """Seconds of one draft pass of ``tokens`` new tokens per sequence."""
        try:
            return step_time(draft_arch, draft_hardware, tokens, batch, context, draft_tp,
                             draft_tp if draft_dp else 1, draft_dtype, cuda_graphs=graphs,
                             efficiency=draft_efficiency or efficiency, grouped_experts=grouped_experts,
                             dp_attention=draft_dp).total
        except ValueError as error:  # the draft's parallelism is draft_tp's
            message = str(error)
            raise ValueError("draft_" + message if message.startswith("tp") else message) from None

    verify = (np.full_like(grid["gamma"], tree_tokens) if tree_tokens is not None
              else grid["gamma"] + (1 if verify_tokens == "gamma+1" else 0))
    # Time each distinct (B, s, context, K) once: sigma does not change a step.
    key = np.stack([grid["batch_size"], grid["context"], k if k is not None else np.zeros_like(grid["gamma"])])
    unique, inverse = np.unique(key, axis=1, return_inverse=True)
    inverse = inverse.ravel()
    t1 = target_pass(1, unique[0], unique[1], unique[2] if k is not None else None)[inverse]
    draft_step = draft_pass(draft_topk, unique[0], unique[1])[inverse]
    t_verify = target_pass(verify, grid["batch_size"], grid["context"], k)
    t_reject = rejection_time(hardware, grid["batch_size"], grid["gamma"], target_arch.vocab_size, efficiency,
                              cuda_graphs, verified=tree_tokens)
    engine_columns = {}
    if profile is not None or step_seconds is not None:
        engine_columns = _engine_round(profile or engine_profile("device"), grid, t1, draft_step,
                                       target_arch.num_layers, draft_arch.num_layers, head, target_pass, draft_pass,
                                       step_seconds, step_batch_size)
        t1, t_verify = t1 + engine_columns["fixed_seconds"], t_verify + engine_columns.pop("verify_extra")
        draft_step = engine_columns.pop("draft_per_token")
    terms = speedup_terms(grid["sigma"], grid["gamma"], t1, t_verify, draft_step, t_reject)
    return pd.DataFrame({
        **{name: values for name, values in grid.items()},
        "t_target_1": t1, "t_target_gamma": t_verify, "t_draft": draft_step,
        "t_reject": t_reject, "tokens_per_round": terms.tokens_per_round, "verify_term": terms.verify,
        "draft_term": terms.draft, "reject_term": terms.reject, "target_efficiency": 1.0 / terms.verify,
        "speedup": terms.speedup, **engine_columns,
    }).astype({"batch_size": int, "gamma": int, "context": int})


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


def _engine_efficiency(profile, efficiency: Efficiency | None, dtype: str, attention: str) -> Efficiency:
    """``efficiency`` with the engine's grouped-GEMM tile and achieved FLOP fraction for ``dtype`` and its
    attention kernel's fractions for the ``attention`` kind."""
    fraction = profile.expert_flops_fraction.get(dtype)
    bandwidth, flops = profile.attention_fractions.get(attention, (None, None))
    rows, above = profile.expert_tile_rows.get(dtype, (1, None))
    return dataclasses.replace(efficiency or Efficiency(), expert_tile_rows=rows, expert_tile_rows_above=above,
                               expert_flops_fraction=None if fraction is None else fraction.value,
                               attention_bandwidth_fraction=None if bandwidth is None else bandwidth.value,
                               attention_flops_fraction=None if flops is None else flops.value)


def _engine_round(profile, grid: dict, t1, draft_step, target_layers: int, draft_layers: int, head: bool,
                  target_pass, draft_pass, step_seconds=None, step_batch_size=1) -> dict:
    """Seconds an engine adds to a round (see :func:`predict_sd`'s ``engine`` and ``step_seconds``).

    Parameters
    ----------
    profile : EngineProfile
        The engine.
    grid : dict
        :func:`predict_sd`'s rows (``batch_size``, ``gamma``, ``context``, ``num_experts_per_tok`` if given).
    t1, draft_step : numpy.ndarray
        The target's plain step and one draft step per row, from the GPUs' work, seconds.
    target_layers, draft_layers : int
        Decoder layers of target and draft, over which a fixed cost per pass is spread.
    head : bool
        The draft is a head of the target (:func:`check_pair`), which engines run with an extend pass.
    target_pass, draft_pass : callable
        ``(tokens per sequence, batch size, context[, top_k or graphs])`` to seconds of one pass.
    step_seconds : float, optional
        A measured plain step at ``step_batch_size`` sequences, seconds.

    Returns
    -------
    dict
        Per row, seconds: ``fixed_seconds`` (per target pass), ``exposed_host_seconds`` (per round: the
        profile's, at most the plain step it is hidden behind), ``t_draft_extend``, ``verify_extra`` (what
        verification adds) and ``draft_per_token`` (the round's drafting over ``gamma``).
    """
    B, gamma, context = grid["batch_size"], grid["gamma"], grid["context"]
    fixed = np.zeros(B.shape)
    if step_seconds is not None:
        measured = float(as_array("step_seconds", step_seconds, low=0, low_open=True))
        anchor = int(as_array("step_batch_size", step_batch_size, low=1, whole=True))
        alone = target_pass(1, anchor, context, grid.get("num_experts_per_tok"))
        if (alone > measured).any():
            raise ValueError(f"step_seconds must be at least the predicted step at batch size {anchor}, "
                             f"{float(alone.max()) * 1e3:.3g} ms, got {measured * 1e3:.3g} ms")
        fixed = measured - alone
    draft_fixed = fixed / target_layers * draft_layers + profile.draft_host_seconds.value
    # overlap scheduling hides host time behind the GPU's step: never more than the plain step itself
    exposed = np.minimum(profile.exposed_host_seconds.value, t1 + fixed)
    extend = np.zeros(B.shape)
    head = head and profile.draft_extend
    if head:
        extend = draft_pass(gamma + 1, B, context, profile.extend_graphs) + draft_fixed
    drafting = extend + (gamma - head) * (draft_step + draft_fixed)
    return {"fixed_seconds": fixed, "exposed_host_seconds": exposed, "t_draft_extend": extend,
            "verify_extra": fixed + exposed, "draft_per_token": drafting / gamma}


def best_gamma(frame: pd.DataFrame, by=("batch_size",)) -> pd.DataFrame:
    """The row of highest speedup per group of ``by`` (default: per batch size) of a :func:`predict_sd` frame."""
    by = list(by)
    missing = [c for c in [*by, "speedup"] if c not in frame.columns]
    if missing:
        raise ValueError(f"frame lacks column(s) {', '.join(missing)}; pass a predict_sd frame")
    return frame.loc[frame.groupby(by)["speedup"].idxmax()].reset_index(drop=True)


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
