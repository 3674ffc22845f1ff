"""A deployment of speculative decoding as one frozen, validated record: :class:`Setup`.

Target and draft, their GPUs and how each is split over them, weight dtypes, the KV cache's context, a serving
engine's profile and a measured plain step: everything :func:`moesd.predictor.predict.predict_sd`,
:func:`moesd.predictor.recommend.recommend` and :func:`moesd.predictor.memory.memory_fit` need besides the grid of
batch sizes, draft lengths and acceptance they are asked about. A ``Setup`` checks itself when it is made, so a
deployment the predictor cannot price is refused before any work, with a :class:`moesd._checks.UsageError` that
names the argument (``moesd predict`` maps it to its flag). :func:`check_pair` refuses a draft that cannot serve
its target and says whether it is a head.

Pure numpy; no torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


from moesd._checks import UsageError, as_array
from moesd.architecture import Architecture
from moesd.predictor.engine import engine_profile
from moesd.predictor.forward import step_time
from moesd.predictor.kernels import Efficiency, sampling_time
from moesd.predictor.layout import check_dtype, check_kv_dtype, check_parallelism, ffn_dtype
from moesd.predictor.models import resolve_draft, resolve_model
from moesd.theory.roofline import Hardware, hardware_record

__all__ = ["check_pair", "default_draft_tp", "Setup"]


def _name(model, arch: Architecture) -> str:
    """The name a message gives ``model``: as the caller wrote it, or its record's."""
    return model if isinstance(model, str) else arch.name


def _check_applies(model, arch: Architecture, dtype: str, context, argument: str) -> None:
    """Refuse a weight dtype that would not change a dense model's numbers (it quantises routed experts only, and the
    model has none: its label would stand over another dtype's numbers), and a context past the positions its
    config names (naming ``context``)."""
    dtype = check_dtype(dtype, argument)
    if not arch.num_experts and ffn_dtype(dtype) != dtype:
        raise UsageError(f"{argument}: {dtype} quantises routed experts only, and {_name(model, arch)} is dense: its "
                         f"weights would be priced as {ffn_dtype(dtype)}; give {argument} {ffn_dtype(dtype)}", argument)
    if context is not None and arch.max_positions is not None and context >= arch.max_positions:
        raise UsageError(f"context: {context} tokens in each KV cache and the token a step adds pass the "
                         f"{arch.max_positions} positions of {_name(model, arch)}", "context")


def check_pair(target, draft) -> bool:
    """Whether ``draft`` is a draft head of ``target``, after refusing a pair that cannot run SD.

    A draft head drafts from the target itself: a record whose ``head_of`` names its target (a drafter of
    :mod:`moesd.predictor.models`: an MTP module such as ``deepseek-v3-mtp``, an EAGLE or EAGLE-3 head of
    :data:`moesd.zoo.DRAFT_HEADS` or built for the target, Medusa heads, the n-gram drafter), or an Architecture of
    one layer of the target's hidden size (:func:`~moesd.predictor.models.one_layer_draft`). Refused:

    * a head as the target: it serves no tokens of its own;
    * a zoo head with another target than ``target`` (by zoo name): it was trained on its own target's hidden
      states (and reads vectors of that target's width);
    * a separate draft model whose vocabulary differs from the target's. Standard SD checks the draft's tokens
      by their ids in the target's distribution, so the two need one tokenizer; the rule is equal
      ``vocab_size`` (the rows of the LM heads), as :mod:`moesd.engine.sd` and vLLM require. Vocabularies
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
    UsageError
        Naming ``target`` or ``draft``, and the models.
    """
    target_arch = resolve_model(target, "target")
    draft_arch = resolve_draft(draft, target_arch, "draft")
    target_name, draft_name = _name(target, target_arch), _name(draft, draft_arch)
    owner = target_arch.head_of
    if owner is not None:
        raise UsageError(f"target: {target_name} is a draft head of {owner}, not a model "
                         f"to serve; give {owner} as the target and {target_name} as the draft", "target")
    owner = draft_arch.head_of
    if owner is not None and owner != target_arch.name:
        widths = (f" (hidden size {draft_arch.hidden_size} against {target_arch.name}'s {target_arch.hidden_size})"
                  if draft_arch.hidden_size != target_arch.hidden_size else "")
        raise UsageError(f"draft: {draft_name} is a draft head of {owner} and cannot draft "
                         f"for {target_name}{widths}: a head drafts from its own target's hidden states", "draft")
    head = owner is not None or (draft_arch.num_layers == 1 and draft_arch.hidden_size == target_arch.hidden_size)
    if draft_arch.drafter is not None and draft_arch.hidden_size != target_arch.hidden_size:
        raise UsageError(f"draft: {draft_name} reads hidden states of width {draft_arch.hidden_size}, {target_name}'s "
                         f"are {target_arch.hidden_size}", "draft")
    if not head and draft_arch.vocab_size != target_arch.vocab_size:
        raise UsageError(f"draft: {draft_name}'s vocabulary has {draft_arch.vocab_size} "
                         f"tokens, {target_name}'s {target_arch.vocab_size}: SD checks the draft's tokens by their "
                         f"ids in the target's vocabulary, so it needs a draft with the target's tokenizer", "draft")
    return head


def default_draft_tp(target, draft, tp: int, shared: bool = False, draft_hardware=None, hardware=None) -> int:
    """The draft's GPUs when ``draft_tp`` is not given: the target's ``tp`` for a draft head (:func:`check_pair`)
    on the target's hardware, as serving engines run MTP modules and EAGLE heads, and for any draft placed there
    with ``shared``; else 1, the paper's separate draft on a GPU of its own. ``draft_hardware`` and ``hardware``
    (names or records) matter only when both are given: a draft on other hardware is on GPUs of its own."""
    elsewhere = (draft_hardware is not None and hardware is not None
                 and hardware_record(draft_hardware) != hardware_record(hardware))
    return tp if (shared or check_pair(target, draft)) and not elsewhere else 1


_DERIVED = ("head", "draft_gpus", "draft_device", "draft_weights", "draft_dp_attention", "draft_ep")
"""The fields a :class:`Setup` works out from the others (not arguments: ``dataclasses.replace`` recomputes them)."""


@dataclass(frozen=True)
class Setup:
    """One deployment of speculative decoding, checked when it is made.

    Build it from names, ``Setup("deepseek-v3", "deepseek-v3-mtp", "H200", tp=8, dtype="fp8")``, or records;
    change one field with ``dataclasses.replace(setup, tp=16)`` (checked again, with the derived fields worked out
    again). The grid a prediction runs over (batch sizes, draft lengths, acceptance) is not part of it.

    Parameters
    ----------
    target, draft : str, ModelSpec or Architecture
        The models (:data:`moesd.zoo.MODELS` names, ``config.json`` paths, or records; the draft also a name of
        :data:`moesd.zoo.DRAFT_HEADS` or a drafter keyword of :data:`moesd.predictor.models.DRAFTERS`, ``"mtp"``,
        ``"eagle"``, ``"eagle3"``, ``"medusa"``, ``"ngram"``, built for the target); kept as
        :class:`~moesd.architecture.Architecture` records. :func:`check_pair` refuses a pair that cannot run SD.
    hardware : str or Hardware
        The target's GPU (:data:`moesd.theory.roofline.HARDWARE` name or record); kept as a record.
    tp, ep : int, default 1
        The target's GPUs and its expert-parallel degree (:func:`~moesd.predictor.layout.check_parallelism`; with
        ``dp_attention``, ``ep`` is kept as ``tp``).
    dp_attention : bool, default False
        Attention data-parallel and the routed experts expert-parallel over the ``tp`` GPUs (SGLang's
        ``--enable-dp-attention``); a MoE draft on the target's GPUs runs so too.
    draft_tp : int, optional
        The draft's GPUs (default: ``tp`` for a draft head or with ``shared``, else 1: :func:`default_draft_tp`).
    draft_hardware : str or Hardware, optional
        The draft's GPU when it is not the target's.
    shared : bool, default False
        A draft that is not a head on the target's GPUs too (``draft_tp`` must be ``tp``).
    dtype, draft_dtype : str
        Weight dtypes (:data:`~moesd.predictor.layout.DTYPE_BYTES`; the draft's defaults to ``dtype``).
    kv_dtype : {"bf16", "fp8", "fp32"}, optional
        The KV cache's dtype (:data:`~moesd.predictor.layout.KV_DTYPES`; default the activations', bf16 or fp32).
    context : int, default 1024
        Tokens in each sequence's KV cache.
    engine : str or EngineProfile, optional
        A serving engine's profile (:data:`moesd.predictor.engine.ENGINES`); kept as a record. Default: the GPUs'
        work only.
    step_seconds : float, optional
        A measured plain decoding step at ``step_batch_size`` sequences (seconds, at ``context``): what it exceeds
        the predicted step by becomes a fixed cost per forward pass. It must be at least the predicted step.
    step_batch_size : int, default 1
        Where ``step_seconds`` (and ``sd_step_seconds``) was measured.
    sd_step_seconds : float, optional
        A measured round of SD at ``step_batch_size`` sequences and ``sd_step_gamma`` drafts (seconds; with
        ``step_seconds``): what it exceeds the predicted round by becomes a fixed cost per round, in place of the
        engine profile's exposed host time.
    sd_step_gamma : int, optional
        The draft length ``sd_step_seconds`` was measured at.
    temperature : float, optional
        Sampling temperature: None prices rejection sampling as the paper's engine does (both distributions read
        once); 0 greedy verification (an argmax over the target's logits); above 0 the sampling kernels of
        :func:`~moesd.predictor.kernels.sampling_time` in the plain step and the round.
    host_seconds : float, default 0
        A fixed host cost added to every forward pass of target and draft (seconds); not with ``engine`` or
        ``step_seconds``, which hold the host's cost.
    draft_topk : int, default 1
        Candidates per draft position (a tree's branching, SGLang's ``eagle_topk``; 1: a chain).
    verify_tokens : {"gamma+1", "gamma"} or int
        Positions per sequence in the verification pass; a number for a tree (SGLang's ``num_draft_tokens``).

    Attributes
    ----------
    head : bool
        The draft is a head of the target (:func:`check_pair`).
    draft_gpus : int
        The draft's GPUs as placed (``draft_tp`` or its default).
    draft_device : Hardware
        The draft's GPU.
    draft_weights : str
        The draft's weight dtype.
    draft_dp_attention : bool
        The draft runs attention data-parallel: a MoE draft on the target's ``tp`` GPUs under ``dp_attention``.
    draft_ep : int
        The draft's expert-parallel degree (its GPUs where it runs attention data-parallel, else 1).

    Raises
    ------
    UsageError
        Naming the argument, for any value or combination the predictor cannot price.
    """

    target: object
    draft: object
    hardware: object
    tp: int = 1
    ep: int = 1
    dp_attention: bool = False
    draft_tp: int | None = None
    draft_hardware: object = None
    shared: bool = False
    dtype: str = "bf16"
    draft_dtype: str | None = None
    context: int = 1024
    engine: object = None
    step_seconds: float | None = None
    step_batch_size: int = 1
    host_seconds: float = 0.0
    draft_topk: int = 1
    verify_tokens: object = "gamma+1"
    kv_dtype: str | None = None
    temperature: float | None = None
    sd_step_seconds: float | None = None
    sd_step_gamma: int | None = None
    head: bool = dataclasses.field(init=False, repr=False)
    draft_gpus: int = dataclasses.field(init=False, repr=False)
    draft_device: Hardware = dataclasses.field(init=False, repr=False)
    draft_weights: str = dataclasses.field(init=False, repr=False)
    draft_dp_attention: bool = dataclasses.field(init=False, repr=False)
    draft_ep: int = dataclasses.field(init=False, repr=False)

    def __post_init__(self):
        def keep(**values):
            for name, value in values.items():
                object.__setattr__(self, name, value)

        target = resolve_model(self.target, "target")
        draft = resolve_draft(self.draft, target, "draft")
        head = check_pair(target, draft)
        hardware = hardware_record(self.hardware, "hardware")
        draft_hardware = None if self.draft_hardware is None else hardware_record(self.draft_hardware,
                                                                                  "draft_hardware")
        device = hardware if draft_hardware is None else draft_hardware
        keep(target=target, draft=draft, hardware=hardware, draft_hardware=draft_hardware, head=head,
             dtype=check_dtype(self.dtype), draft_device=device,
             draft_dtype=None if self.draft_dtype is None else check_dtype(self.draft_dtype, "draft_dtype"),
             context=int(as_array("context", self.context, low=0, whole=True)),
             dp_attention=bool(self.dp_attention), shared=bool(self.shared),
             kv_dtype=None if self.kv_dtype is None else check_kv_dtype(self.kv_dtype, self.dtype),
             temperature=None if self.temperature is None else float(as_array("temperature", self.temperature, low=0)))
        _check_applies(self.target, target, self.dtype, self.context, "dtype")
        if self.draft_dtype is not None:
            _check_applies(self.draft, draft, self.draft_dtype, None, "draft_dtype")
        tp, ep = check_parallelism(target, hardware, self.tp, self.ep, self.dp_attention)
        keep(tp=tp, ep=ep, draft_weights=self.draft_dtype or self.dtype)
        self._place_draft()
        self._check_engine()
        self._check_tree()
        self._check_round()

    def _place_draft(self):
        """Check and work out where the draft runs: its GPUs, their hardware, its parallelism."""
        if self.shared and self.draft_device != self.hardware:
            raise UsageError(f"draft_hardware: a draft on the target's GPUs "
                             f"(shared) runs on the target's {self.hardware.name}, got {self.draft_device.name}", "draft_hardware")
        gpus = (int(as_array("draft_tp", self.draft_tp, low=1, whole=True)) if self.draft_tp is not None
                else default_draft_tp(self.target, self.draft, self.tp, self.shared, self.draft_device,
                                      self.hardware))
        if self.shared and gpus != self.tp:
            raise UsageError(f"draft_tp must equal tp for a draft on the target's GPUs "
                             f"(shared), got {gpus} and {self.tp}", "draft_tp")
        data_parallel = self.dp_attention and gpus == self.tp and bool(self.draft.num_experts)
        try:
            _, ep = check_parallelism(self.draft, self.draft_device, gpus, gpus if data_parallel else 1,
                                      data_parallel)
        except UsageError as error:  # the draft's parallelism is draft_tp's
            raise UsageError("draft_" + error.message
                             if error.argument == "tp" else error.message, "draft_tp") from None
        for name, value in (("draft_gpus", gpus), ("draft_dp_attention", data_parallel), ("draft_ep", ep)):
            object.__setattr__(self, name, value)

    def _check_engine(self):
        """Check the engine's profile, the measured step and the host cost, which exclude one another in part."""
        if self.engine is not None:
            object.__setattr__(self, "engine", engine_profile(self.engine))
        host = float(as_array("host_seconds", self.host_seconds, low=0))
        object.__setattr__(self, "host_seconds", host)
        if host and self.engine is not None:
            raise UsageError(f"host_seconds: an engine profile holds the engine's "
                             f"host costs (with step_seconds, a measured plain step), so host_seconds must be 0 "
                             f"with one, got {host}", "host_seconds")
        if host and self.step_seconds is not None:
            raise UsageError(f"host_seconds: a measured plain step (step_seconds) "
                             f"holds the host's cost, so host_seconds must be 0 with one, got {host}", "host_seconds")
        anchor = int(as_array("step_batch_size", self.step_batch_size, low=1, whole=True))
        object.__setattr__(self, "step_batch_size", anchor)
        if self.step_seconds is None:
            return
        measured = float(as_array("step_seconds", self.step_seconds, low=0, low_open=True))
        object.__setattr__(self, "step_seconds", measured)
        alone = self.plain_step(anchor)
        if alone > measured:
            raise UsageError(f"step_seconds must be at least the predicted step at "
                             f"batch size {anchor}, {alone * 1e3:.3g} ms, got {measured * 1e3:.3g} ms", "step_seconds")

    def _check_tree(self):
        """Check the draft's candidates per position and the tokens verified per sequence."""
        topk = int(as_array("draft_topk", self.draft_topk, low=1, high=4096, whole=True))
        verify = self.verify_tokens
        if isinstance(verify, str):
            if verify not in ("gamma+1", "gamma"):
                raise UsageError(f"verify_tokens must be 'gamma+1', 'gamma' or a "
                                 f"number of tokens, got {verify!r}", "verify_tokens")
        else:
            verify = int(as_array("verify_tokens", verify, low=2, high=4096, whole=True))
        object.__setattr__(self, "draft_topk", topk)
        object.__setattr__(self, "verify_tokens", verify)

    def _check_round(self):
        """Check a measured SD round: it comes with the plain step it is compared with and the gamma it ran at."""
        if self.sd_step_seconds is None:
            if self.sd_step_gamma is not None:
                raise UsageError("sd_step_gamma applies only with sd_step_seconds (the measured round)", "sd_step_gamma")
            return
        if self.step_seconds is None:
            raise UsageError("sd_step_seconds: a measured SD round needs the measured plain step (step_seconds) "
                             "at the same batch size, which holds the engine's fixed cost per pass", "sd_step_seconds")
        if self.sd_step_gamma is None:
            raise UsageError("sd_step_gamma: give the draft length the SD round was measured at", "sd_step_gamma")
        object.__setattr__(self, "sd_step_seconds",
                           float(as_array("sd_step_seconds", self.sd_step_seconds, low=0, low_open=True)))
        object.__setattr__(self, "sd_step_gamma", int(as_array("sd_step_gamma", self.sd_step_gamma, low=1, high=64,
                                                               whole=True)))

    @property
    def drafting(self) -> str:
        """How the draft proposes: ``"free"`` (the n-gram drafter: no GPU pass), ``"parallel"`` (Medusa heads: every
        position in one pass) or ``"autoregressive"`` (one pass per position)."""
        return {"ngram": "free", "medusa": "parallel"}.get(self.draft.drafter, "autoregressive")

    @property
    def tree_tokens(self) -> int | None:
        """Tokens a tree verifies per sequence (``verify_tokens`` when a number), None for a chain."""
        return None if isinstance(self.verify_tokens, str) else self.verify_tokens

    def efficiency(self, base: Efficiency | None = None, role: str = "target") -> Efficiency:
        """The :class:`~moesd.predictor.kernels.Efficiency` the ``role``'s passes are priced with: ``base`` (default:
        the host cost as a fixed cost per forward pass) with the engine's kernels for its dtype, attention and GPU."""
        base = base or Efficiency(step_seconds=self.host_seconds)
        if self.engine is None:
            return base
        arch, dtype, device = ((self.target, self.dtype, self.hardware) if role == "target"
                               else (self.draft, self.draft_weights, self.draft_device))
        return self.engine.efficiency(base, dtype, arch.attention, device)

    def plain_step(self, batch_size, context=None, top_k=None, efficiency: Efficiency | None = None):
        """Seconds of the target's plain decoding step at ``batch_size`` sequences (default ``context``: the
        setup's), from the GPUs' work and the engine's kernels, without a measured step's fixed cost."""
        efficiency = self.efficiency(efficiency)
        seconds = step_time(self.target, self.hardware, 1, batch_size, self.context if context is None else context,
                            self.tp, self.ep, self.dtype, top_k=top_k, efficiency=efficiency,
                            dp_attention=self.dp_attention, kv_dtype=self.kv_dtype).total
        if self.temperature is None:
            return seconds
        return seconds + sampling_time(self.hardware, batch_size, 1, self.target.vocab_size, self.temperature,
                                       efficiency=efficiency)
