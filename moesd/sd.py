"""Batched, lossless speculative decoding over Hugging Face causal LMs (Sec. 3.1 of the paper).

Every round the draft proposes ``gamma`` tokens per sequence, the target scores all ``gamma + 1``
positions in one forward pass, and each sequence keeps its own accepted prefix plus one token from
the target (a correction, or the bonus token when every draft token was accepted). Sequences
accept different numbers of tokens, so the engine keeps one *slot* layout shared by both KV caches:
each round appends ``gamma + 1`` slots to every sequence, and the slots of rejected draft tokens
stay in the caches but are masked out of attention (a hole in the attention mask). Position ids
count only unmasked slots, so every sequence sees exactly the positions plain decoding would give it.

The draft's cache lags the target's by one slot (the last draft token is scored by the target but
never fed to the draft); the next round's first draft forward feeds that slot together with the
new token, so both caches always cover the same slots without extra forward passes.

Acceptance follows Leviathan et al. (2023): greedy verification at ``temperature == 0`` (accept while
the draft token is the target's argmax) and speculative sampling otherwise (accept with probability
``min(1, p/q)``, resample a rejection from ``max(0, p - q)``, sample a bonus token from ``p``). Both
are lossless: the output has the target's distribution (greedy: equals greedy decoding of the
target). ``synthetic_acceptance=alpha`` instead accepts each draft token with probability alpha,
keeping all the draft and verification work, to time systems at a fixed acceptance.

Batching is static: the batch runs until its last sequence stops; a stopped sequence's rows are
still computed (as in Hugging Face ``generate``) but emit nothing and leave the counters alone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch


@dataclass
class DecodeStats:
    """Counters and stage times of one generation.

    Counters follow vLLM's definitions: per sequence and round, ``gamma`` tokens are drafted,
    ``accepted`` of them are kept, and ``accepted + 1`` tokens are emitted. Times are seconds of wall
    clock, taken after device synchronisation.

    Attributes
    ----------
    mode : str
        ``"autoregressive"``, ``"greedy"``, ``"sampling"`` or ``"synthetic alpha=<a>"``.
    gamma : int
        Draft tokens per round (0 for autoregressive decoding).
    rounds : int
        Rounds (decode steps) the batch ran after the prefill.
    sequence_rounds : int
        Sum over sequences of the rounds in which each was still generating.
    drafted, accepted, emitted : int
        Draft tokens proposed, accepted, and tokens emitted, over active sequences and rounds
        (the prefill's first token excluded).
    t_prefill, t_draft, t_verify, t_reject, t_total : float
        Seconds in the prefill of both models, in draft forwards, in target forwards after the
        prefill, in acceptance and bookkeeping, and in all.
    """

    mode: str
    gamma: int
    rounds: int = 0
    sequence_rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    t_prefill: float = 0.0
    t_draft: float = 0.0
    t_verify: float = 0.0
    t_reject: float = 0.0
    t_total: float = 0.0

    @property
    def sigma(self) -> float:
        """Emitted tokens per round and sequence over gamma + 1 (Eq. 5's sigma as vLLM counts it)."""
        return self.emitted / (self.sequence_rounds * (self.gamma + 1)) if self.sequence_rounds else float("nan")

    @property
    def accept_length(self) -> float:
        """Mean tokens emitted per sequence and round (accepted + 1)."""
        return self.emitted / self.sequence_rounds if self.sequence_rounds else float("nan")

    @property
    def acceptance_rate(self) -> float:
        """Accepted over drafted tokens."""
        return self.accepted / self.drafted if self.drafted else float("nan")


@dataclass
class DecodeOutput:
    """What :meth:`SpeculativeDecoder.generate` and :func:`generate_autoregressive` return.

    Attributes
    ----------
    sequences : torch.Tensor
        [batch, prompt + max_new_tokens] token ids, prompts included (left padding kept); after a
        sequence stops, its row is filled with the pad id, as in Hugging Face ``generate``.
    num_generated : torch.Tensor
        [batch] tokens each sequence generated (an EOS included).
    stats : DecodeStats
    """

    sequences: torch.Tensor
    num_generated: torch.Tensor
    stats: DecodeStats = field(repr=False)


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

    def append(self, tokens: torch.Tensor, first_position: torch.Tensor) -> None:
        """Add one slot per sequence holding ``tokens`` at position ``first_position``."""
        self.tokens[:, self.length] = tokens
        self.mask[:, self.length] = 1
        self.positions[:, self.length] = first_position
        self.length += 1


def _forward(model, slots: _Slots, start: int, cache):
    """Logits of ``model`` for slots [start, slots.length), given a cache of slots [0, start)."""
    output = model(input_ids=slots.tokens[:, start:slots.length],
                   attention_mask=slots.mask[:, :slots.length],
                   position_ids=slots.positions[:, start:slots.length],
                   past_key_values=cache, use_cache=True)
    return output.logits.float(), output.past_key_values


def _pick(logits: torch.Tensor, temperature: float, generator) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Next tokens from [..., V] logits: argmax at temperature 0, else a sample; and the probabilities."""
    if temperature == 0:
        return logits.argmax(-1), None
    probs = torch.softmax(logits / temperature, dim=-1)
    flat = torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=generator)
    return flat.reshape(probs.shape[:-1]), probs


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
            after_eos = (is_eos.cumsum(-1) - is_eos.long()) > 0
            valid &= ~after_eos
            stopped = is_eos.any(-1)
        else:
            stopped = torch.zeros_like(self.active)
        rows, columns = valid.nonzero(as_tuple=True)
        self.sequences[rows, self.prompt + self.count[rows] + columns] = candidates[rows, columns]
        self.count += valid.sum(-1)
        self.active &= ~stopped & (self.count < self.max_new_tokens)


def _check_inputs(input_ids, attention_mask, max_new_tokens, temperature):
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
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0, got {temperature!r}")
    return attention_mask.long()


@torch.no_grad()
def generate_autoregressive(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                            max_new_tokens: int = 128, temperature: float = 0.0, seed: int | None = None,
                            eos_token_id=None, pad_token_id: int = 0) -> DecodeOutput:
    """Plain batched decoding with the same bookkeeping as :class:`SpeculativeDecoder` (the T_AR baseline).

    Parameters are those of :meth:`SpeculativeDecoder.generate`; ``stats.t_verify`` holds the time of
    the decode forwards.
    """
    attention_mask = _check_inputs(input_ids, attention_mask, max_new_tokens, temperature)
    device = input_ids.device
    generator = None if seed is None else torch.Generator(device).manual_seed(seed)
    stats = DecodeStats(mode="autoregressive", gamma=0)
    slots = _Slots(input_ids, attention_mask, input_ids.shape[1] + max_new_tokens)
    out = _Emitter(input_ids, max_new_tokens, eos_token_id, pad_token_id)
    start = _synchronize(device)
    logits, cache = _forward(model, slots, 0, None)
    token, _ = _pick(logits[:, -1], temperature, generator)
    out.emit(token[:, None], torch.ones_like(token))
    position = attention_mask.sum(-1)
    stats.t_prefill = _synchronize(device) - start
    while out.active.any():
        tick = _synchronize(device)
        active = out.active.clone()
        slots.append(token, position)
        logits, cache = _forward(model, slots, slots.length - 1, cache)
        tock = _synchronize(device)
        token, _ = _pick(logits[:, -1], temperature, generator)
        out.emit(token[:, None], torch.ones_like(token))
        position = position + 1
        stats.rounds += 1
        stats.sequence_rounds += int(active.sum())
        stats.emitted += int(active.sum())
        stats.t_verify += tock - tick
        stats.t_reject += _synchronize(device) - tock
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
                 pad_token_id: int = 0) -> DecodeOutput:
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

        Returns
        -------
        DecodeOutput
        """
        attention_mask = _check_inputs(input_ids, attention_mask, max_new_tokens, temperature)
        if synthetic_acceptance is not None and not 0 <= synthetic_acceptance <= 1:
            raise ValueError(f"synthetic_acceptance must be in [0, 1], got {synthetic_acceptance!r}")
        gamma, device = self.gamma, input_ids.device
        generator = torch.Generator(device)
        generator.manual_seed(seed) if seed is not None else generator.seed()
        mode = (f"synthetic alpha={synthetic_acceptance:g}" if synthetic_acceptance is not None
                else "greedy" if temperature == 0 else "sampling")
        stats = DecodeStats(mode=mode, gamma=gamma)
        slots = _Slots(input_ids, attention_mask, input_ids.shape[1] + max_new_tokens * (gamma + 1) + 1)
        out = _Emitter(input_ids, max_new_tokens, eos_token_id, pad_token_id)
        batch = torch.arange(input_ids.shape[0], device=device)
        offsets = torch.arange(gamma + 1, device=device)

        start = _synchronize(device)
        logits, target_cache = _forward(self.target, slots, 0, None)
        _, draft_cache = _forward(self.draft, slots, 0, None)
        token, _ = _pick(logits[:, -1], temperature, generator)
        out.emit(token[:, None], torch.ones_like(token))
        position = attention_mask.sum(-1)  # position of ``token``, the newest emitted token
        draft_length = slots.length  # slots in the draft's cache
        stats.t_prefill = _synchronize(device) - start

        while out.active.any():
            active = out.active.clone()
            tick = _synchronize(device)
            round_start = slots.length
            slots.append(token, position)
            drafts, draft_probs = [], []
            for step in range(gamma):
                logits, draft_cache = _forward(self.draft, slots, draft_length, draft_cache)
                draft_length = slots.length
                proposal, probs = _pick(logits[:, -1], temperature, generator)
                drafts.append(proposal)
                draft_probs.append(probs)
                slots.append(proposal, position + step + 1)
            draft_tokens = torch.stack(drafts, dim=1)  # [batch, gamma]
            tock = _synchronize(device)
            logits, target_cache = _forward(self.target, slots, round_start, target_cache)  # [batch, gamma+1, V]
            verified = _synchronize(device)

            if synthetic_acceptance is not None:
                accept = torch.rand(draft_tokens.shape, generator=generator, device=device) < synthetic_acceptance
                target_tokens, _ = _pick(logits, temperature, generator)
                accepted = accept.long().cumprod(-1).sum(-1)
                following = target_tokens[batch, accepted]
            elif temperature == 0:
                target_tokens = logits.argmax(-1)
                accepted = (draft_tokens == target_tokens[:, :gamma]).long().cumprod(-1).sum(-1)
                following = target_tokens[batch, accepted]
            else:
                accepted, following = _speculative_sampling(logits, draft_tokens, torch.stack(draft_probs, 1),
                                                            temperature, generator)
            # Rejected draft slots become holes: masked out of attention from now on.
            slots.mask[:, round_start + 1:slots.length] = (offsets[:gamma] < accepted[:, None]).long()
            candidates = torch.cat([draft_tokens, draft_tokens[:, :1]], dim=1)
            candidates[batch, accepted] = following
            out.emit(candidates, accepted + 1)
            token, position = following, position + accepted + 1

            live = int(active.sum())
            stats.rounds += 1
            stats.sequence_rounds += live
            stats.drafted += gamma * live
            stats.accepted += int(accepted[active].sum())
            stats.emitted += int(accepted[active].sum()) + live
            stats.t_draft += tock - tick
            stats.t_verify += verified - tock
            stats.t_reject += _synchronize(device) - verified
        stats.t_total = _synchronize(device) - start
        return DecodeOutput(out.sequences, out.count, stats)


def _speculative_sampling(logits, draft_tokens, draft_probs, temperature, generator):
    """Leviathan et al.'s rule: accepted counts and the token that follows the accepted prefix.

    ``logits`` [batch, gamma+1, V] of the target, ``draft_tokens`` [batch, gamma] sampled from
    ``draft_probs`` [batch, gamma, V].
    """
    batch, gamma = draft_tokens.shape
    rows = torch.arange(batch, device=logits.device)
    target_probs = torch.softmax(logits / temperature, dim=-1)
    p = target_probs[:, :gamma].gather(-1, draft_tokens[..., None])[..., 0]
    q = draft_probs.gather(-1, draft_tokens[..., None])[..., 0]
    uniform = torch.rand(p.shape, generator=generator, device=logits.device)
    accepted = (uniform * q < p).long().cumprod(-1).sum(-1)  # u < p/q without dividing by q
    # After a rejection at j: sample max(0, p_j - q_j), normalised; after all accepted: p_gamma.
    padded_q = torch.cat([draft_probs, torch.zeros_like(draft_probs[:, :1])], dim=1)
    residual = (target_probs[rows, accepted] - padded_q[rows, accepted]).clamp(min=0)
    mass = residual.sum(-1, keepdim=True)
    residual = torch.where(mass > 0, residual / mass.clamp(min=torch.finfo(mass.dtype).tiny),
                           target_probs[rows, accepted])
    following = torch.multinomial(residual, 1, generator=generator)[:, 0]
    return accepted, following
