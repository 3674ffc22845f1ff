"""Batched, lossless speculative decoding over Hugging Face causal LMs (Sec. 3.1 of the paper).

A round has the paper's three stages, each a small function below (in the manner of gpt-fast):

* :func:`draft` -- the draft proposes ``gamma`` tokens per sequence, one forward each;
* :func:`verify` -- the target scores all ``gamma + 1`` positions in one forward;
* acceptance -- one function per rule: :func:`accept_greedy` (temperature 0: accept while the draft
  token is the target's argmax), :func:`accept_sampling` (Leviathan et al.'s speculative sampling:
  accept with probability ``min(1, p/q)``, resample a rejection from ``max(0, p - q)``, sample a
  bonus token from ``p``) and :func:`accept_synthetic` (accept each draft token with a fixed
  probability alpha: a timing mode that keeps all the draft and verification work);

then :func:`emit` does the bookkeeping. Each sequence keeps its own accepted prefix plus one token
from the target (a correction, or the bonus token when every draft token was accepted). Greedy and
speculative sampling are lossless: the output has the target's distribution (greedy: equals
greedy decoding of the target).

Sequences accept different numbers of tokens, so the engine keeps one *slot* layout shared by both
KV caches: each round appends ``gamma + 1`` slots to every sequence, and the slots of rejected draft
tokens stay in the caches but are masked out of attention (a hole in the attention mask). Position
ids count only unmasked slots, so every sequence sees exactly the positions plain decoding would
give it. The KV length therefore grows by ``gamma + 1`` slots a round, whatever was accepted. The
draft's cache lags the target's by one slot (the last draft token is scored by the target but never
fed to the draft); the next round's first draft forward feeds that slot together with the new
token, so both caches cover the same slots without extra forward passes. The draft's prefill stops
one slot short too, so that every round has the same forward shapes: the draft's 2, 1, ..., 1 new
slots and the target's gamma + 1. Both caches can be static ones (:class:`~moesd.measure.static_cache.StaticCaches`),
whose forwards of each shape are captured once as CUDA graphs and replayed every round.

Batching is static: the batch runs until its last sequence stops or ``max_rounds`` rounds have run;
a stopped sequence's rows are still computed (as in Hugging Face ``generate``) but emit nothing.
Every round is recorded (:class:`~moesd.measure.records.RoundRecord`: sequences active, tokens accepted
and emitted, stage times), so a caller can time a *window* of rounds in which every sequence was active
(:meth:`~moesd.measure.records.DecodeStats.window`), which is what :mod:`moesd.measure.bench` does.
"""

from __future__ import annotations

import time

import torch

from moesd.measure.records import DecodeOutput, DecodeStats, RoundRecord
from moesd.measure.static_cache import StaticCaches


def _synchronize(device: torch.device) -> float:
    """Wait for the device's queued work and return the wall clock in seconds."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


class _Slots:
    """Token, mask and position buffers of the slot layout shared by the target and draft caches."""

    def __init__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, capacity: int):
        batch, prompt = input_ids.shape
        self.tokens = torch.zeros(batch, capacity, dtype=torch.long, device=input_ids.device)
        self.mask = torch.zeros_like(self.tokens)
        self.positions = torch.zeros_like(self.tokens)
        self.tokens[:, :prompt] = input_ids
        self.mask[:, :prompt] = attention_mask
        self.positions[:, :prompt] = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        self.length = prompt  # slots filled

    def append(self, tokens: torch.Tensor, position: torch.Tensor) -> None:
        """Add one slot per sequence holding ``tokens`` at ``position``."""
        self.tokens[:, self.length] = tokens
        self.mask[:, self.length] = 1
        self.positions[:, self.length] = position
        self.length += 1


class _CachedModel:
    """A model and its KV cache, which covers slots [0, length)."""

    def __init__(self, model):
        self.model, self.cache, self.length = model, None, 0

    def forward(self, slots: _Slots, stop: int | None = None) -> torch.Tensor:
        """Float logits [batch, new, V] of the slots not yet in the cache (up to ``stop``, default all),
        which then holds them."""
        stop = slots.length if stop is None else stop
        output = self.model(input_ids=slots.tokens[:, self.length:stop], attention_mask=slots.mask[:, :stop],
                            position_ids=slots.positions[:, self.length:stop],
                            past_key_values=self.cache, use_cache=True)
        self.cache, self.length = output.past_key_values, stop
        return output.logits.float()


def _cached(model, slots: _Slots, static_caches: StaticCaches | None):
    """``model`` with an empty KV cache for a generation: dynamic, or from ``static_caches``."""
    return _CachedModel(model) if static_caches is None else static_caches.bind(model, slots.tokens.shape[0])


def _slot_layout(input_ids, attention_mask, rounds: int, appended: int,
                 static_caches: StaticCaches | None) -> _Slots:
    """The slot layout of a generation of ``rounds`` rounds appending ``appended`` slots each (and the
    prefill's token): exactly that many slots, or a static cache's capacity if it holds them."""
    needed = input_ids.shape[1] + rounds * appended + 1
    if static_caches is None:
        return _Slots(input_ids, attention_mask, needed)
    if needed > static_caches.capacity:
        raise ValueError(f"this generation needs {needed} slots per sequence ({input_ids.shape[1]} prompt, then "
                         f"{rounds} rounds of {appended} and one more), the static caches hold {static_caches.capacity}")
    return _Slots(input_ids, attention_mask, static_caches.capacity)


def _pick(logits: torch.Tensor, temperature: float, generator) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Tokens from [..., V] logits: argmax at temperature 0, else a sample; and the probabilities."""
    if temperature == 0:
        return logits.argmax(-1), None
    probs = torch.softmax(logits / temperature, dim=-1)
    flat = torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=generator)
    return flat.reshape(probs.shape[:-1]), probs


def _generator(device: torch.device, seed: int | None) -> torch.Generator:
    generator = torch.Generator(device)
    generator.manual_seed(seed) if seed is not None else generator.seed()
    return generator


# ---- The stages of a round -------------------------------------------------------------------------

def draft(model: _CachedModel, slots: _Slots, position: torch.Tensor, gamma: int, temperature: float,
          generator) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Propose ``gamma`` tokens per sequence after the newest slot, appending each as a slot.

    ``position`` [batch] is the position of the newest slot. Returns the draft tokens [batch, gamma]
    and, when sampling, the draft's probabilities [batch, gamma, V] they were drawn from.
    """
    tokens, probs = [], []
    for step in range(gamma):
        token, prob = _pick(model.forward(slots)[:, -1], temperature, generator)
        tokens.append(token)
        probs.append(prob)
        slots.append(token, position + step + 1)
    return torch.stack(tokens, 1), None if temperature == 0 else torch.stack(probs, 1)


def verify(model: _CachedModel, slots: _Slots) -> torch.Tensor:
    """The target's logits [batch, gamma + 1, V] of the round's newest token and its ``gamma`` drafts."""
    return model.forward(slots)


def accept_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy verification: accept while the draft token is the target's argmax.

    Parameters
    ----------
    draft_tokens : torch.Tensor
        [batch, gamma] proposed tokens.
    target_logits : torch.Tensor
        [batch, gamma + 1, V]; position ``j`` predicts the token after draft token ``j - 1``.

    Returns
    -------
    accepted, following : torch.Tensor
        [batch] accepted draft tokens, and the target's argmax after them (a correction, or the
        bonus token when all were accepted).
    """
    target_tokens = target_logits.argmax(-1)
    return _accept_prefix(draft_tokens == target_tokens[:, :-1], target_tokens)


def accept_synthetic(draft_tokens: torch.Tensor, target_tokens: torch.Tensor, alpha: float,
                     generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic acceptance: accept each draft token with probability ``alpha``, whatever it is.

    The accepted count is the number of successes before the first failure, capped at gamma, so a
    round emits ``(1 - alpha**(gamma+1)) / (1 - alpha)`` tokens on average (Eq. 5's numerator).
    ``target_tokens`` [batch, gamma + 1] are the target's picks; the one after the accepted prefix
    follows it. The output is not the target's: this mode times systems at a fixed acceptance.
    """
    coins = torch.rand(draft_tokens.shape, generator=generator, device=draft_tokens.device) < alpha
    return _accept_prefix(coins, target_tokens)


def accept_sampling(draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                    generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling (Leviathan et al. 2023): lossless at any temperature.

    Draft token ``x_j`` (drawn from ``q_j``) is accepted with probability ``min(1, p_j(x)/q_j(x))``;
    after the first rejection at ``j`` the next token is drawn from ``max(0, p_j - q_j)``
    normalised; when all ``gamma`` are accepted, a bonus token is drawn from ``p_gamma``.

    Parameters
    ----------
    draft_tokens : torch.Tensor
        [batch, gamma] proposed tokens.
    draft_probs : torch.Tensor
        [batch, gamma, V] the draft's distributions ``q`` they were drawn from.
    target_probs : torch.Tensor
        [batch, gamma + 1, V] the target's distributions ``p`` at the same temperature.

    Returns
    -------
    accepted, following : torch.Tensor
        [batch] accepted draft tokens, and the token drawn after them.
    """
    batch, gamma = draft_tokens.shape
    rows = torch.arange(batch, device=draft_tokens.device)
    p = target_probs[:, :gamma].gather(-1, draft_tokens[..., None])[..., 0]
    q = draft_probs.gather(-1, draft_tokens[..., None])[..., 0]
    uniform = torch.rand(p.shape, generator=generator, device=p.device)
    accepted = (uniform * q < p).long().cumprod(-1).sum(-1)  # u < p/q without dividing by q
    padded_q = torch.cat([draft_probs, torch.zeros_like(draft_probs[:, :1])], dim=1)  # q = 0 after the last
    residual = (target_probs[rows, accepted] - padded_q[rows, accepted]).clamp(min=0)
    mass = residual.sum(-1, keepdim=True)
    residual = torch.where(mass > 0, residual / mass.clamp(min=torch.finfo(mass.dtype).tiny),
                           target_probs[rows, accepted])
    return accepted, torch.multinomial(residual, 1, generator=generator)[:, 0]


def _accept_prefix(keep: torch.Tensor, target_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Accepted counts (leading True values of ``keep`` [batch, gamma]) and the target token after them."""
    accepted = keep.long().cumprod(-1).sum(-1)
    return accepted, target_tokens.gather(1, accepted[:, None])[:, 0]


class _Emitter:
    """Writes emitted tokens into the output with per-sequence budgets and EOS stops."""

    def __init__(self, input_ids: torch.Tensor, max_new_tokens: int, eos_token_id, pad_token_id: int):
        batch, self.prompt = input_ids.shape
        self.sequences = torch.full((batch, self.prompt + max_new_tokens), pad_token_id,
                                    dtype=torch.long, device=input_ids.device)
        self.sequences[:, :self.prompt] = input_ids
        self.count = torch.zeros(batch, dtype=torch.long, device=input_ids.device)
        self.active = torch.ones(batch, dtype=torch.bool, device=input_ids.device)
        self.max_new_tokens = max_new_tokens
        ids = [] if eos_token_id is None else [eos_token_id] if isinstance(eos_token_id, int) else eos_token_id
        self.eos = torch.tensor(list(ids), dtype=torch.long, device=input_ids.device)

    def emit(self, candidates: torch.Tensor, lengths: torch.Tensor) -> None:
        """Append ``candidates[b, :lengths[b]]`` to each active sequence, up to its budget and an EOS."""
        offsets = torch.arange(candidates.shape[1], device=candidates.device)
        valid = (offsets < lengths[:, None]) & self.active[:, None]
        valid &= self.count[:, None] + offsets < self.max_new_tokens
        if self.eos.numel():
            is_eos = torch.isin(candidates, self.eos) & valid
            valid &= (is_eos.cumsum(-1) - is_eos.long()) == 0  # nothing after an EOS
            stopped = is_eos.any(-1)
        else:
            stopped = torch.zeros_like(self.active)
        rows, columns = valid.nonzero(as_tuple=True)
        self.sequences[rows, self.prompt + self.count[rows] + columns] = candidates[rows, columns]
        self.count += valid.sum(-1)
        self.active &= ~stopped & (self.count < self.max_new_tokens)


def emit(slots: _Slots, out: _Emitter, round_start: int, draft_tokens: torch.Tensor, accepted: torch.Tensor,
         following: torch.Tensor) -> None:
    """Bookkeeping after acceptance: mask rejected draft slots, emit ``accepted + 1`` tokens per sequence.

    The round's slots are ``round_start`` (the previous round's last token) and the ``gamma`` drafts
    after it; rejected drafts become holes in the attention mask of both caches from now on.
    """
    gamma = draft_tokens.shape[1]
    offsets = torch.arange(gamma, device=draft_tokens.device)
    slots.mask[:, round_start + 1:round_start + 1 + gamma] = (offsets < accepted[:, None]).long()
    candidates = torch.cat([draft_tokens, following[:, None]], dim=1)
    candidates.scatter_(1, accepted[:, None], following[:, None])
    out.emit(candidates, accepted + 1)


# ---- Generation ------------------------------------------------------------------------------------

def _check_inputs(input_ids, attention_mask, max_new_tokens, temperature, max_rounds):
    if input_ids.ndim != 2 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must be [batch, length] with length >= 1, got shape {tuple(input_ids.shape)}")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if attention_mask.shape != input_ids.shape:
        raise ValueError("attention_mask must have the shape of input_ids")
    if (attention_mask.sum(-1) == 0).any():
        raise ValueError("every sequence needs at least one unmasked prompt token")
    if int(max_new_tokens) != max_new_tokens or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a whole number >= 1, got {max_new_tokens!r}")
    if max_rounds is not None and (int(max_rounds) != max_rounds or max_rounds < 1):
        raise ValueError(f"max_rounds must be a whole number >= 1 or None, got {max_rounds!r}")
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0, got {temperature!r}")
    return attention_mask.long()


def _rounds_allowed(max_new_tokens: int, max_rounds: int | None) -> int:
    """Most rounds a generation can run: every round emits a token, and the prefill emits the first."""
    return max_new_tokens - 1 if max_rounds is None else min(max_new_tokens - 1, max_rounds)


def _prefill(target, slots: _Slots, out: _Emitter, temperature: float, generator, drafter=None) -> torch.Tensor:
    """Run the prompts through the caches; emit and return the target's first token.

    The draft's cache takes all but the newest prompt slot, which its first round feeds together with
    the target's token: every round's first draft forward then has two new slots, the first round's too.
    """
    logits = target.forward(slots)
    if drafter is not None and slots.length > 1:
        drafter.forward(slots, stop=slots.length - 1)
    token, _ = _pick(logits[:, -1], temperature, generator)
    out.emit(token[:, None], torch.ones_like(token))
    return token


@torch.no_grad()
def generate_autoregressive(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                            max_new_tokens: int = 128, temperature: float = 0.0, seed: int | None = None,
                            eos_token_id=None, pad_token_id: int = 0, max_rounds: int | None = None,
                            static_caches: StaticCaches | None = None) -> DecodeOutput:
    """Plain batched decoding with the same bookkeeping as :class:`SpeculativeDecoder` (the T_AR baseline).

    Parameters are those of :meth:`SpeculativeDecoder.generate` (``max_rounds`` counts decode
    steps). Each step's record holds the decode forward in ``t_verify`` and the token selection
    and bookkeeping in ``t_reject``.
    """
    attention_mask = _check_inputs(input_ids, attention_mask, max_new_tokens, temperature, max_rounds)
    device = input_ids.device
    generator = _generator(device, seed)
    stats = DecodeStats(mode="autoregressive", gamma=0, batch_size=input_ids.shape[0])
    steps = _rounds_allowed(max_new_tokens, max_rounds)
    slots = _slot_layout(input_ids, attention_mask, steps, 1, static_caches)
    out = _Emitter(input_ids, max_new_tokens, eos_token_id, pad_token_id)
    target = _cached(model, slots, static_caches)
    start = _synchronize(device)
    token = _prefill(target, slots, out, temperature, generator)
    position = attention_mask.sum(-1)  # position of ``token``
    stats.t_prefill = _synchronize(device) - start
    while out.active.any() and stats.rounds < steps:
        active = int(out.active.sum())
        tick = _synchronize(device)
        slots.append(token, position)
        logits = target.forward(slots)
        tock = _synchronize(device)
        token, _ = _pick(logits[:, -1], temperature, generator)
        out.emit(token[:, None], torch.ones_like(token))
        position = position + 1
        done = _synchronize(device)
        stats.records.append(RoundRecord(active, 0, active, 0.0, tock - tick, done - tock))
    stats.t_total = _synchronize(device) - start
    return DecodeOutput(out.sequences, out.count, stats)


class SpeculativeDecoder:
    """Batched speculative decoding of ``target`` with ``draft`` proposing ``gamma`` tokens a round.

    Parameters
    ----------
    target, draft : transformers.PreTrainedModel
        Causal LMs with the same vocabulary (the logits' last dimensions must match), on one device.
    gamma : int
        Draft tokens per round, >= 1.
    """

    def __init__(self, target, draft, gamma: int):
        if int(gamma) != gamma or gamma < 1:
            raise ValueError(f"gamma must be a whole number >= 1, got {gamma!r}")
        target_vocab, draft_vocab = (m.get_output_embeddings().weight.shape[0] for m in (target, draft))
        if target_vocab != draft_vocab:
            raise ValueError(f"target and draft vocabularies differ ({target_vocab} vs {draft_vocab} logits)")
        self.target, self.draft, self.gamma = target, draft, int(gamma)

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 max_new_tokens: int = 128, temperature: float = 0.0, seed: int | None = None,
                 synthetic_acceptance: float | None = None, eos_token_id=None,
                 pad_token_id: int = 0, max_rounds: int | None = None,
                 static_caches: StaticCaches | None = None) -> DecodeOutput:
        """Generate up to ``max_new_tokens`` per sequence.

        Parameters
        ----------
        input_ids : torch.Tensor
            [batch, length] prompt ids, left-padded where prompts differ in length.
        attention_mask : torch.Tensor, optional
            [batch, length], 1 on prompt tokens and 0 on padding (default: all ones).
        max_new_tokens : int
            Token budget of every sequence.
        temperature : float, default 0.0
            0 for greedy decoding; above 0 for speculative sampling at that temperature.
        seed : int, optional
            Seed of the sampling and synthetic-acceptance random numbers.
        synthetic_acceptance : float, optional
            Accept each draft token with this probability in [0, 1] instead of verifying it
            (timing mode; the output is then not the target's).
        eos_token_id : int or list of int, optional
            A sequence stops after emitting one of these.
        pad_token_id : int, default 0
            Fills a row after its sequence stops.
        max_rounds : int, optional
            Stop after this many rounds even if sequences are still active. With
            ``max_new_tokens >= 1 + max_rounds (gamma + 1)`` and no EOS, every sequence is active
            in every round.
        static_caches : moesd.measure.static_cache.StaticCaches, optional
            Decode over these static KV caches (their forwards replayed as CUDA graphs if they say
            so) instead of dynamic ones; the output is the same.

        Returns
        -------
        DecodeOutput
        """
        attention_mask = _check_inputs(input_ids, attention_mask, max_new_tokens, temperature, max_rounds)
        if synthetic_acceptance is not None and not 0 <= synthetic_acceptance <= 1:
            raise ValueError(f"synthetic_acceptance must be in [0, 1], got {synthetic_acceptance!r}")
        gamma, device = self.gamma, input_ids.device
        generator = _generator(device, seed)
        mode = (f"synthetic alpha={synthetic_acceptance:g}" if synthetic_acceptance is not None
                else "greedy" if temperature == 0 else "sampling")
        stats = DecodeStats(mode=mode, gamma=gamma, batch_size=input_ids.shape[0])
        rounds = _rounds_allowed(max_new_tokens, max_rounds)
        slots = _slot_layout(input_ids, attention_mask, rounds, gamma + 1, static_caches)
        out = _Emitter(input_ids, max_new_tokens, eos_token_id, pad_token_id)
        target, drafter = _cached(self.target, slots, static_caches), _cached(self.draft, slots, static_caches)

        start = _synchronize(device)
        token = _prefill(target, slots, out, temperature, generator, drafter)
        position = attention_mask.sum(-1)  # position of ``token``, the newest emitted token
        stats.t_prefill = _synchronize(device) - start
        while out.active.any() and stats.rounds < rounds:
            active = out.active.clone()
            tick = _synchronize(device)
            round_start = slots.length
            slots.append(token, position)
            draft_tokens, draft_probs = draft(drafter, slots, position, gamma, temperature, generator)
            drafted = _synchronize(device)
            logits = verify(target, slots)
            verified = _synchronize(device)
            accepted, following = self._accept(draft_tokens, draft_probs, logits, temperature,
                                               synthetic_acceptance, generator)
            emit(slots, out, round_start, draft_tokens, accepted, following)
            token, position = following, position + accepted + 1
            done = _synchronize(device)
            live, kept = int(active.sum()), int(accepted[active].sum())
            stats.records.append(RoundRecord(live, kept, kept + live, drafted - tick, verified - drafted,
                                             done - verified))
        stats.t_total = _synchronize(device) - start
        return DecodeOutput(out.sequences, out.count, stats)

    @staticmethod
    def _accept(draft_tokens, draft_probs, logits, temperature, synthetic_acceptance, generator):
        """The acceptance rule of the generation: synthetic, greedy or speculative sampling."""
        if synthetic_acceptance is not None:
            target_tokens, _ = _pick(logits, temperature, generator)
            return accept_synthetic(draft_tokens, target_tokens, synthetic_acceptance, generator)
        if temperature == 0:
            return accept_greedy(draft_tokens, logits)
        return accept_sampling(draft_tokens, draft_probs, torch.softmax(logits / temperature, dim=-1), generator)
