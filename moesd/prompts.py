"""The prompt sets of the paper's experiments: HumanEval, MT-bench and GSM8K.

:func:`load_prompts` reads a set from a local file or folder when given one, and otherwise from the
Hugging Face hub through ``datasets`` (``pip install datasets``), falling back to the folder named
by the ``MOESD_PROMPTS`` environment variable. Every set comes back as a DataFrame with the same
two leading columns, ``id`` and ``prompt`` (the text the model is asked to continue; MT-bench's
first turn).
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pandas as pd

PROMPT_SETS = {
    # name: (hub dataset id, hub config, hub split, file inside a local folder)
    "humaneval": ("openai/openai_humaneval", None, "test", "humaneval/HumanEval.jsonl.gz"),
    "mt_bench": ("HuggingFaceH4/mt_bench_prompts", None, "train", "mt_bench/question.jsonl"),
    "gsm8k": ("openai/gsm8k", "main", "test", "gsm8k/test.jsonl"),
}


def _normalise(name: str, records: pd.DataFrame) -> pd.DataFrame:
    """Put ``id`` and ``prompt`` first, whichever source the records came from."""
    if name == "humaneval":
        frame = records.rename(columns={"task_id": "id"})
    elif name == "mt_bench":
        turns = records["turns"] if "turns" in records else records["prompt"]
        ids = records["question_id"] if "question_id" in records else records["prompt_id"]
        frame = records.assign(id=ids.astype(str), turns=turns, prompt=[t[0] for t in turns])
    else:
        frame = records.assign(id=[f"gsm8k/{i}" for i in range(len(records))],
                               prompt=records["question"])
    return frame[["id", "prompt"] + [c for c in frame.columns if c not in ("id", "prompt")]]


def _read_local(name: str, source: Path) -> pd.DataFrame:
    path = source / PROMPT_SETS[name][3] if source.is_dir() else source
    if source.is_dir() and not path.exists():
        path = source / Path(PROMPT_SETS[name][3]).name
    if not path.exists():
        raise FileNotFoundError(f"no {name} prompts at {source} (looked for {PROMPT_SETS[name][3]})")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as file:
        try:
            records = [json.loads(line) for line in file if line.strip()]
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: not JSON lines: {error}") from None
    return pd.DataFrame(records)


def _read_hub(name: str) -> pd.DataFrame:
    import datasets  # optional: only for the hub

    dataset_id, config, split, _ = PROMPT_SETS[name]
    return datasets.load_dataset(dataset_id, config, split=split).to_pandas()


def load_prompts(name: str, source=None) -> pd.DataFrame:
    """Load one prompt set.

    Parameters
    ----------
    name : {"humaneval", "mt_bench", "gsm8k"}
        The set.
    source : path, optional
        A file of the set (JSON lines, optionally gzipped) or a folder laid out like
        ``humaneval/HumanEval.jsonl.gz``, ``mt_bench/question.jsonl``, ``gsm8k/test.jsonl``. When
        missing, the hub is tried, then the folder in ``MOESD_PROMPTS``.

    Returns
    -------
    pandas.DataFrame
        Columns ``id``, ``prompt``, then the set's own fields (MT-bench keeps both ``turns``).

    Raises
    ------
    ValueError
        For an unknown set, or when neither the hub nor a local copy can be read.
    """
    if name not in PROMPT_SETS:
        raise ValueError(f"name must be one of {sorted(PROMPT_SETS)}, got {name!r}")
    if source is not None:
        return _normalise(name, _read_local(name, Path(source)))
    try:
        return _normalise(name, _read_hub(name))
    except Exception as hub_error:  # offline, no datasets package, or the hub refused
        fallback = os.environ.get("MOESD_PROMPTS")
        if fallback:
            return _normalise(name, _read_local(name, Path(fallback)))
        raise ValueError(f"cannot load {name}: the hub failed ({type(hub_error).__name__}: "
                         f"{hub_error}) and no local copy was given; pass source= or set "
                         "MOESD_PROMPTS to a folder of prompt files") from hub_error
