"""Batched, lossless speculative decoding over Hugging Face causal LMs (Sec. 3.1 of the paper).

A round (:meth:`SpeculativeDecoder.round`) has the paper's three stages, each a small function below (in
the manner of gpt-fast):

* :func:`draft` -- the draft proposes ``gamma`` tokens per sequence, one forward each;
* :func:`verify` -- the target scores all ``gamma + 1`` positions in one forward;
* acceptance -- one function per rule: :func:`accept_greedy` (temperature 0: accept while the draft
  token is the target's argmax), :func:`accept_sampling` (Leviathan et al.'s speculative sampling:
  accept with probability ``min(1, p/q)``, resample a rejection from ``max(0, p - q)``, sample a
  bonus token from ``p``) and :func:`accept_synthetic` (accept each draft token with a fixed
  probability alpha: a timing mode that keeps all the draft and verification work);

then :func:`keep_accepted` masks the rejected drafts out of attention and appends to each sequence its
accepted drafts and one token from the target (a correction, or the bonus token when every draft token
was accepted). Greedy and speculative sampling are lossless: the output has the target's distribution
(greedy: equals greedy decoding of the target).

Sequences accept different numbers of tokens, so both KV caches share one slot layout
(:class:`~moesd.engine.static_cache.SlotLayout`): each round appends ``gamma + 1`` slots to every
sequence, and the slots of rejected draft tokens stay in the caches, masked out. The KV length therefore
grows by ``gamma + 1`` slots a round, whatever was accepted. The draft's cache lags the target's by one
slot (the last draft token is scored by the target but never fed to the draft); the next round's first
draft forward feeds that slot together with the new token, so both caches cover the same slots without
extra forward passes. The draft's prefill stops one slot short too, so that every round has the same
forward shapes: the draft's 2, 1, ..., 1 new slots and the target's gamma + 1. Both caches can be static
ones (:class:`~moesd.engine.static_cache.StaticCaches`), whose forwards of each shape are captured once as
CUDA graphs and replayed every round.

Batching is static: the batch runs until its last sequence stops or ``max_rounds`` rounds have run; a
stopped sequence's rows are still computed (as in Hugging Face ``generate``) but append nothing. Nothing
inside a round reads a clock or waits for the device: :meth:`SpeculativeDecoder.generate` times each
round from outside (:class:`~moesd.engine.timing.RoundTimer`: marks around the round and a hook on the
target's forward, CUDA events on a GPU) and records it (:class:`~moesd.engine.records.RoundRecord`:
sequences active, tokens accepted and emitted, stage times), so a caller can time a *window* of rounds in
which every sequence was active (:meth:`~moesd.engine.records.DecodeStats.window`), as
:mod:`moesd.measure.bench` does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moesd.engine.records import DecodeOutput, DecodeStats, RoundRecord
from moesd.engine.static_cache import SlotLayout, StaticCaches
from moesd.engine.timing import RoundTimer


class DynamicCacheModel(torch.nn.Module):
    """A model and its dynamic KV cache, which covers slots [0, length) of a :class:`SlotLayout`.

    A model with scaled-dot-product attention and no sliding window gets its attention mask ready-made
    (:meth:`SlotLayout.attention`): transformers would otherwise build it from the slot mask at every
    forward, twice for models with sliding-window layers in their config.
    """

    def __init__(self, model):
        super().__init__()
        self.model, self.cache, self.length = model, None, 0
        config = getattr(model, "config", None)
        self.ready_mask = (getattr(config, "_attn_implementation", None) == "sdpa" and not getattr(
            config, "sliding_window", None) and set(getattr(config, "layer_types", None) or ["full_attention"])
            == {"full_attention"})

    def forward(self, slots: SlotLayout, stop: int | None = None, last_only: bool = False) -> torch.Tensor:
        """Float logits [batch, new, V] of the slots not yet in the cache (up to ``stop``, default all),
        which then holds them; with ``last_only``, of the last of them alone ([batch, 1, V])."""
        start, stop = self.length, slots.length if stop is None else stop
        mask = slots.attention(start, stop, width=stop) if self.ready_mask else slots.mask[:, :stop]
        output = self.model(input_ids=slots.tokens[:, start:stop], attention_mask=mask,
                            position_ids=slots.positions[:, start:stop], past_key_values=self.cache,
                            use_cache=True, logits_to_keep=1 if last_only else 0)
        self.cache, self.length = output.past_key_values, stop
        return output.logits.float()


class GeneratedTokens:
    """The output of a generation: prompts and generated tokens, with per-sequence budgets and EOS stops.

    Attributes
    ----------
    count : torch.Tensor
        [batch] tokens each sequence generated.
    active : torch.Tensor
        [batch] bool, whether a sequence still generates.
    """

    def __init__(self, input_ids: torch.Tensor, max_new_tokens: int, eos_token_id, pad_token_id: int):
        batch, self.prompt = input_ids.shape
        width = self.prompt + max_new_tokens
        self._buffer = torch.full((batch, width + 1), pad_token_id, dtype=torch.long, device=input_ids.device)
        self._buffer[:, :self.prompt] = input_ids  # the last column takes the writes that are dropped
        self.count = torch.zeros(batch, dtype=torch.long, device=input_ids.device)
        self.active = torch.ones(batch, dtype=torch.bool, device=input_ids.device)
        self.max_new_tokens = max_new_tokens
        ids = [] if eos_token_id is None else [eos_token_id] if isinstance(eos_token_id, int) else eos_token_id
        self.eos = torch.tensor(list(ids), dtype=torch.long, device=input_ids.device)

    @property
    def sequences(self) -> torch.Tensor:
        """[batch, prompt + max_new_tokens] token ids, the pad id after each sequence's last token."""
        return self._buffer[:, :-1]

    def append(self, tokens: torch.Tensor, lengths: torch.Tensor) -> None:
        """Append ``tokens[b, :lengths[b]]`` to each active sequence, up to its budget and an EOS (no host sync)."""
        offsets = torch.arange(tokens.shape[1], device=tokens.device)
        valid = (offsets < lengths[:, None]) & self.active[:, None]
        valid &= self.count[:, None] + offsets < self.max_new_tokens
        if self.eos.numel():
            is_eos = torch.isin(tokens, self.eos) & valid
            valid &= (is_eos.cumsum(-1) - is_eos.long()) == 0  # nothing after an EOS
            self.active &= ~is_eos.any(-1)
        columns = torch.where(valid, self.prompt + self.count[:, None] + offsets, self._buffer.shape[1] - 1)
        self._buffer.scatter_(1, columns, tokens)
        self.count += valid.sum(-1)
        self.active &= self.count < self.max_new_tokens


@dataclass
class Generation:
    """What a generation carries from round to round.

    ``token`` [batch] is each sequence's newest token, in no cache yet, at ``position`` [batch].
    """

    slots: SlotLayout
    generated: GeneratedTokens
    target: torch.nn.Module
    draft: torch.nn.Module | None
    token: torch.Tensor
    position: torch.Tensor
    temperature: float
    generator: torch.Generator
    synthetic_acceptance: float | None = None


def _pick(logits: torch.Tensor, temperature: float, generator) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Tokens from [..., V] logits: argmax at temperature 0, else a sample; and the probabilities."""
    if temperature == 0:
        return logits.argmax(-1), None
    probs = torch.softmax(logits / temperature, dim=-1)
    flat = torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=generator)
    return flat.reshape(probs.shape[:-1]), probs


# ---- The stages of a round -------------------------------------------------------------------------

def draft(model: torch.nn.Module, slots: SlotLayout, position: torch.Tensor, gamma: int, temperature: float,
          generator) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Propose ``gamma`` tokens per sequence after the newest slot, appending each as a slot.

    ``position`` [batch] is the position of the newest slot. Returns the draft tokens [batch, gamma]
    and, when sampling, the draft's probabilities [batch, gamma, V] they were drawn from.
    """
    tokens, probs = [], []
    for step in range(gamma):
        token, prob = _pick(model(slots, last_only=True)[:, -1], temperature, generator)
        tokens.append(token)
        probs.append(prob)
        slots.append(token, position + step + 1)
    return torch.stack(tokens, 1), None if temperature == 0 else torch.stack(probs, 1)


def verify(model: torch.nn.Module, slots: SlotLayout) -> torch.Tensor:
    """The target's logits [batch, gamma + 1, V] of the round's newest token and its ``gamma`` drafts."""
    return model(slots)


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


def keep_accepted(slots: SlotLayout, generated: GeneratedTokens, round_start: int, draft_tokens: torch.Tensor,
                  accepted: torch.Tensor, following: torch.Tensor) -> None:
    """After acceptance: mask the rejected drafts' slots out of attention (in both caches, from now on), and
    append to each sequence its ``accepted`` drafts and the token ``following`` them.

    The round's slots are ``round_start`` (the previous round's last token) and the ``gamma`` drafts after it.
    """
    gamma = draft_tokens.shape[1]
    slots.keep_first(round_start + 1, round_start + 1 + gamma, accepted)
    tokens = torch.cat([draft_tokens, following[:, None]], dim=1)
    tokens.scatter_(1, accepted[:, None], following[:, None])
    generated.append(tokens, accepted + 1)


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


def _start(target, draft, input_ids, attention_mask, max_new_tokens, temperature, seed, eos_token_id,
           pad_token_id, rounds: int, appended: int, static_caches: StaticCaches | None) -> Generation:
    """A generation of at most ``rounds`` rounds of ``appended`` slots, before its prefill.

    Its slot layout holds exactly the slots it needs (the prompt's, the rounds', the prefill token's), or a
    static cache's capacity if that holds them.
    """
    device = input_ids.device
    needed = input_ids.shape[1] + rounds * appended + 1
    if static_caches is not None and needed > static_caches.capacity:
        raise ValueError(f"this generation needs {needed} slots per sequence ({input_ids.shape[1]} prompt, then "
                         f"{rounds} rounds of {appended} and one more), the static caches hold {static_caches.capacity}")
    slots = SlotLayout(input_ids, attention_mask, needed if static_caches is None else static_caches.capacity)
    batch = input_ids.shape[0]

    def cached(model):
        return DynamicCacheModel(model) if static_caches is None else static_caches.bind(model, batch)

    generator = torch.Generator(device)
    generator.manual_seed(seed) if seed is not None else generator.seed()
    return Generation(slots, GeneratedTokens(input_ids, max_new_tokens, eos_token_id, pad_token_id), cached(target),
                      None if draft is None else cached(draft), token=input_ids[:, -1],
                      position=attention_mask.sum(-1), temperature=temperature, generator=generator)


def _prefill(gen: Generation) -> None:
    """Run the prompts through the caches; append the target's first token to the output and make it the
    newest token.

    The draft's cache takes all but the newest prompt slot, which its first round feeds together with
    the target's token: every round's first draft forward then has two new slots, the first round's too.
    """
    logits = gen.target(gen.slots, last_only=True)
    if gen.draft is not None and gen.slots.length > 1:
        gen.draft(gen.slots, stop=gen.slots.length - 1, last_only=True)
    gen.token, _ = _pick(logits[:, -1], gen.temperature, gen.generator)
    gen.generated.append(gen.token[:, None], torch.ones_like(gen.token))


def _run(gen: Generation, step, rounds: int, stats: DecodeStats) -> DecodeStats:
    """Prefill, then call ``step(gen)`` (a round, returning the accepted drafts [batch]) until every sequence
    stops or ``rounds`` rounds ran, timing each from outside; ``stats`` with the rounds' records."""
    counts = []
    with RoundTimer(gen.slots.tokens.device, verifier=gen.target) as timer:
        with timer.prefill():
            _prefill(gen)
        while len(counts) < rounds and bool(gen.generated.active.any()):
            active = gen.generated.active.clone()
            with timer.round():
                accepted = step(gen)
            counts.append((active, accepted))
        stats.t_prefill, stages, stats.t_total = timer.read()
    if counts:
        active, accepted = (torch.stack(column) for column in zip(*counts))
        live, kept = active.sum(-1).tolist(), (accepted * active).sum(-1).tolist()
        for n, k, (before, verify_seconds, after) in zip(live, kept, stages):
            stats.records.append(RoundRecord(n, k, k + n, before, verify_seconds, after) if stats.gamma else
                                 RoundRecord(n, 0, n, 0.0, before + verify_seconds, after))
    return stats


def _rounds_allowed(max_new_tokens: int, max_rounds: int | None) -> int:
    """Most rounds a generation can run: every round emits a token, and the prefill emits the first."""
    return max_new_tokens - 1 if max_rounds is None else min(max_new_tokens - 1, max_rounds)


def _decode_step(gen: Generation) -> torch.Tensor:
    """One step of plain decoding: the target's next token after the newest one. Returns 0 accepted drafts."""
    gen.slots.append(gen.token, gen.position)
    gen.token, _ = _pick(gen.target(gen.slots)[:, -1], gen.temperature, gen.generator)
    gen.generated.append(gen.token[:, None], torch.ones_like(gen.token))
    gen.position = gen.position + 1
    return torch.zeros_like(gen.position)


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
    steps = _rounds_allowed(max_new_tokens, max_rounds)
    gen = _start(model, None, input_ids, attention_mask, max_new_tokens, temperature, seed, eos_token_id,
                 pad_token_id, steps, 1, static_caches)
    stats = _run(gen, _decode_step, steps, DecodeStats(mode="autoregressive", gamma=0, batch_size=input_ids.shape[0]))
    return DecodeOutput(gen.generated.sequences, gen.generated.count, stats)


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

    def round(self, gen: Generation) -> torch.Tensor:
        """One round: draft, verify, accept, keep what was accepted. Returns the accepted drafts [batch]."""
        start = gen.slots.length
        gen.slots.append(gen.token, gen.position)
        draft_tokens, draft_probs = draft(gen.draft, gen.slots, gen.position, self.gamma, gen.temperature,
                                          gen.generator)
        target_logits = verify(gen.target, gen.slots)
        accepted, following = self.accept(gen, draft_tokens, draft_probs, target_logits)
        keep_accepted(gen.slots, gen.generated, start, draft_tokens, accepted, following)
        gen.token, gen.position = following, gen.position + accepted + 1
        return accepted

    @staticmethod
    def accept(gen: Generation, draft_tokens, draft_probs, target_logits) -> tuple[torch.Tensor, torch.Tensor]:
        """The generation's acceptance rule: synthetic, greedy or speculative sampling (accepted, following)."""
        if gen.synthetic_acceptance is not None:
            target_tokens, _ = _pick(target_logits, gen.temperature, gen.generator)
            return accept_synthetic(draft_tokens, target_tokens, gen.synthetic_acceptance, gen.generator)
        if gen.temperature == 0:
            return accept_greedy(draft_tokens, target_logits)
        target_probs = torch.softmax(target_logits / gen.temperature, dim=-1)
        return accept_sampling(draft_tokens, draft_probs, target_probs, gen.generator)

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
        static_caches : moesd.engine.static_cache.StaticCaches, optional
            Decode over these static KV caches (their forwards replayed as CUDA graphs if they say
            so) instead of dynamic ones; the output is the same.

        Returns
        -------
        DecodeOutput
            The sequences, and the rounds timed from outside each round (:class:`~moesd.engine.timing.RoundTimer`).
        """
        attention_mask = _check_inputs(input_ids, attention_mask, max_new_tokens, temperature, max_rounds)
        if synthetic_acceptance is not None and not 0 <= synthetic_acceptance <= 1:
            raise ValueError(f"synthetic_acceptance must be in [0, 1], got {synthetic_acceptance!r}")
        rounds = _rounds_allowed(max_new_tokens, max_rounds)
        gen = _start(self.target, self.draft, input_ids, attention_mask, max_new_tokens, temperature, seed,
                     eos_token_id, pad_token_id, rounds, self.gamma + 1, static_caches)
        gen.synthetic_acceptance = synthetic_acceptance
        mode = (f"synthetic alpha={synthetic_acceptance:g}" if synthetic_acceptance is not None
                else "greedy" if temperature == 0 else "sampling")
        stats = _run(gen, self.round, rounds, DecodeStats(mode=mode, gamma=self.gamma, batch_size=input_ids.shape[0]))
        return DecodeOutput(gen.generated.sequences, gen.generated.count, stats)
