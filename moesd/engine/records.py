"""What a generation records: one :class:`RoundRecord` per round (or decode step), the
:class:`DecodeStats` of a generation or of a window of its rounds, and the :class:`DecodeOutput`
that :mod:`moesd.engine.sd` returns.

Times are seconds, taken from outside each round (:class:`moesd.engine.timing.RoundTimer`: CUDA events on a
GPU, the wall clock elsewhere); counters follow vLLM's
definitions (per sequence and round: ``gamma`` drafted, ``accepted`` kept, ``accepted + 1`` emitted).
A caller times a *window* of rounds in which every sequence was active (:meth:`DecodeStats.window`,
:attr:`DecodeStats.full`), as :mod:`moesd.measure.bench` does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class RoundRecord:
    """One SD round or autoregressive decode step.

    Attributes
    ----------
    active : int
        Sequences still generating when the round began.
    accepted, emitted : int
        Draft tokens accepted and tokens emitted by those sequences (``accepted + active`` for SD,
        ``active`` for a decode step).
    t_draft, t_verify, t_reject : float
        Seconds of the round's stages, contiguous: drafting (the ``gamma`` draft forwards and picks), the
        target forward (verification; the decode forward of a step), and acceptance with bookkeeping
        (token selection of a step).
    """

    active: int
    accepted: int
    emitted: int
    t_draft: float
    t_verify: float
    t_reject: float

    @property
    def seconds(self) -> float:
        """Seconds of the round (the sum of its stages)."""
        return self.t_draft + self.t_verify + self.t_reject


@dataclass
class DecodeStats:
    """Counters and stage times of one generation, or of a window of its rounds.

    Counters follow vLLM's definitions: per sequence and round, ``gamma`` tokens are drafted,
    ``accepted`` of them are kept, and ``accepted + 1`` tokens are emitted. Times are seconds, taken
    from outside each round (:class:`moesd.engine.timing.RoundTimer`).

    Attributes
    ----------
    mode : str
        ``"autoregressive"``, ``"greedy"``, ``"sampling"`` or ``"synthetic alpha=<a>"``.
    gamma : int
        Draft tokens per round (0 for autoregressive decoding).
    batch_size : int
        Sequences in the batch.
    records : list of RoundRecord
        The rounds (decode steps) after the prefill, in order.
    t_prefill, t_total : float
        Seconds of the prefill of both models, and of everything (prefill and rounds); a window has
        no prefill and its total is the sum of its rounds.
    """

    mode: str
    gamma: int
    batch_size: int
    records: list = field(default_factory=list, repr=False)
    t_prefill: float = 0.0
    t_total: float = 0.0

    def window(self, start: int, stop: int | None = None) -> DecodeStats:
        """The statistics of rounds ``records[start:stop]`` alone."""
        window = DecodeStats(self.mode, self.gamma, self.batch_size, self.records[start:stop])
        window.t_total = window.t_rounds
        return window

    @property
    def full(self) -> bool:
        """Whether every sequence was active in every round."""
        return all(record.active == self.batch_size for record in self.records)

    @property
    def rounds(self) -> int:
        """Rounds (decode steps) recorded."""
        return len(self.records)

    @property
    def sequence_rounds(self) -> int:
        """Sum over rounds of the sequences active in them."""
        return sum(record.active for record in self.records)

    @property
    def drafted(self) -> int:
        """Draft tokens proposed to active sequences."""
        return self.gamma * self.sequence_rounds

    @property
    def accepted(self) -> int:
        """Draft tokens accepted by active sequences."""
        return sum(record.accepted for record in self.records)

    @property
    def emitted(self) -> int:
        """Tokens emitted in the rounds (the prefill's first token excluded)."""
        return sum(record.emitted for record in self.records)

    @property
    def t_draft(self) -> float:
        """Seconds in draft forwards."""
        return sum(record.t_draft for record in self.records)

    @property
    def t_verify(self) -> float:
        """Seconds in target forwards after the prefill."""
        return sum(record.t_verify for record in self.records)

    @property
    def t_reject(self) -> float:
        """Seconds in acceptance (token selection) and bookkeeping."""
        return sum(record.t_reject for record in self.records)

    @property
    def t_rounds(self) -> float:
        """Seconds in the rounds: the sum of their stages (the prefill and the gaps between rounds excluded)."""
        return sum(record.seconds for record in self.records)

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
