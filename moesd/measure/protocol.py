"""The steady-state protocol of the e2e-type studies (e2e, sparsity, dense, settings), shared by both engines.

The project's engine (:mod:`moesd.measure.bench`) and vLLM's (:mod:`moesd.measure.vllm_engine`) run
the same points on the same prompts: :func:`prompt_seed` and :func:`random_ids` give a point's
prompts, :func:`sd_variants` its SD runs with their key and acceptance columns.

------------------------------------------------------
A *point* is one batch of B random prompts of ``context`` tokens at one K and repeat. The target
decodes it autoregressively for ``warmup_rounds + rounds`` steps, and SD decodes the same prompts for
``warmup_rounds + rounds`` rounds at every gamma (and, in the settings study, every workload), in a
seeded random order. The token budgets (``1 + n`` for AR, ``1 + n (gamma + 1)`` for SD) are never
reached and there is no EOS, so all B sequences are active in every round; the first
``warmup_rounds`` are dropped and the *timed window* is the remaining ``rounds`` rounds (and steps).
The speedup is the ratio of tokens per second over the two windows: AR emits B tokens a step, SD the
counted tokens of its timed rounds. Stage times come from the same windows, so Eq. 4 evaluated from
them (``speedup_eq4``, with T_T(B, 1) the AR time per step as in Eq. 3) accounts for every second
of both windows and equals the measured speedup; under the old protocol (a static batch timed until
its last sequence stopped) it did not, by the share of sequence-rounds left idle.

Synthetic acceptance draws its coins from a seed of its own per (study, B, gamma, K, repeat,
workload) (:func:`acceptance_seed`, recorded in the ``seed`` column), so points never share their
acceptance pattern.

*KV length.* The cache holds ``context`` prompt slots after the prefill. AR step ``i`` (from 0)
attends over ``context + i + 1`` slots, so the AR window covers ``context + warmup_rounds + 1`` to
``context + warmup_rounds + rounds``. An SD round appends ``gamma + 1`` slots whatever is accepted
(rejected drafts stay as masked holes), so the SD window's verifications attend over
``context + (warmup_rounds + 1)(gamma + 1)`` to ``context + (warmup_rounds + rounds)(gamma + 1)``
slots: at gamma = 4 and 32 rounds about five times the AR window's growth. SD's forwards therefore
run over longer caches than the AR steps they are compared with, which lowers the measured speedup
(and Eq. 4 from the same run) by the growth of attention cost with the cache; the data README
states its size on the CPU preset.

Method: warm-up runs first; points are visited in a seeded random order in every repeat so that
"""

from __future__ import annotations

import numpy as np
import torch

from moesd.measure.sweeps import SweepConfig, acceptance_seed
from moesd.theory.speedup import alpha_from_sigma


def random_ids(batch_size: int, length: int, vocab_size: int, seed: int, device: str) -> torch.Tensor:
    """Seeded random prompt token ids: timing depends on shapes, not on which tokens.

    Parameters
    ----------
    batch_size, length : int
        Sequences and tokens per sequence.
    vocab_size : int
        Ids are drawn uniformly from ``1 .. vocab_size - 1`` (0 is left to padding).
    seed : int
        Seed of a CPU ``torch.Generator`` (the same ids on every device).
    device : str
        Where the ids go.

    Returns
    -------
    torch.Tensor
        ``[batch_size, length]`` token ids.
    """
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab_size, (batch_size, length), generator=generator).to(device)


def prompt_seed(config: SweepConfig, run: int, batch: int) -> int:
    """The seed of a point's prompts (:func:`random_ids`): ``numpy.random.SeedSequence`` of the sweep's
    seed, the repeat and the batch size (32 bits), the same in both engines."""
    return int(np.random.SeedSequence([config.seed, run, batch]).generate_state(1)[0])


def sd_variants(config: SweepConfig, batch: int, top_k, run: int) -> list[dict]:
    """The SD runs of one point: one per gamma (and workload), with their key and acceptance columns.

    Parameters
    ----------
    config : SweepConfig
        An e2e-type sweep.
    batch : int
        Batch size B of the point.
    top_k : int or None
        Experts per token K of the target (None for a dense target).
    run : int
        Repeat of the point (from 0).

    Returns
    -------
    list of dict
        One per SD run: ``run``, ``batch_size``, ``gamma``, ``num_experts_per_tok``, the workload's
        ``dataset``, ``temperature`` and ``setting`` (settings study), ``context``, ``seed``
        (:func:`~moesd.measure.sweeps.acceptance_seed`), ``sigma_target``, ``alpha`` (None: real
        acceptance) and ``warmup_rounds``.
    """
    workloads = config.workloads or ({},)
    variants = []
    for gamma in config.gammas:
        for workload in workloads:
            sigma = workload["sigma"][gamma] if workload else (None if config.sigma == "real" else config.sigma[gamma])
            label = f"{workload['dataset']} T={workload['temperature']:g}" if workload else ""
            setting = {"dataset": workload["dataset"], "temperature": workload["temperature"],
                       "setting": label} if workload else {}
            variants.append({"run": run, "batch_size": batch, "gamma": gamma, "num_experts_per_tok": top_k,
                             **setting, "context": config.context,
                             "seed": acceptance_seed(config.study, batch, gamma, top_k, run, label, config.seed),
                             "sigma_target": sigma,
                             "alpha": None if sigma is None else float(alpha_from_sigma(sigma, gamma)),
                             "warmup_rounds": config.warmup_rounds})
    return variants
