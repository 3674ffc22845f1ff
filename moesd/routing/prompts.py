"""The prompt sets of the paper's experiments: HumanEval, MT-bench and GSM8K.

:func:`load_prompts` reads a set from a local file or folder when given one, and otherwise from the
Hugging Face hub through ``datasets`` (``pip install datasets``), falling back to the folder named
by the ``MOESD_PROMPTS`` environment variable. Every set comes back as a DataFrame with the same
two leading columns, ``id`` and ``prompt`` (the text the model is asked to continue; MT-bench's
first turn).
"""

from __future__ import annotations

import gzip
import os
import zlib
from pathlib import Path

import numpy as np
import pandas as pd

from moesd._checks import UsageError, one_of, usage_errors
from moesd._files import MAX_READ_BYTES, lookup_problem, parse_json, regular_file

PROMPT_SETS = {
    # name: (hub dataset id, hub config, hub split, file inside a local folder)
    "humaneval": ("openai/openai_humaneval", None, "test", "humaneval/HumanEval.jsonl.gz"),
    "mt_bench": ("HuggingFaceH4/mt_bench_prompts", None, "train", "mt_bench/question.jsonl"),
    "gsm8k": ("openai/gsm8k", "main", "test", "gsm8k/test.jsonl"),
}


# The fields each set's records need, each as alternatives: a local file's name, then the hub's.
_FIELDS = {
    "humaneval": (("task_id",), ("prompt",)),
    "mt_bench": (("question_id", "prompt_id"), ("turns", "prompt")),
    "gsm8k": (("question",),),
}


def _lacking(name: str, columns) -> list[str]:
    """The fields of set ``name`` that records with these ``columns`` lack (alternatives joined by "or")."""
    return [" or ".join(options) for options in _FIELDS[name] if not any(o in columns for o in options)]


def _normalise(name: str, records: pd.DataFrame, origin: str) -> pd.DataFrame:
    """Put ``id`` and ``prompt`` first, whichever source the records came from; refuse another set's records."""
    lacking = _lacking(name, records.columns)
    if lacking:
        fits = [other for other in PROMPT_SETS if not _lacking(other, records.columns)]
        hint = f"; it looks like {' or '.join(fits)}" if fits else ""
        raise UsageError(f"{origin}: not {name} prompts: the records lack {', '.join(lacking)} "
                         f"(they have {', '.join(map(str, records.columns))}){hint}")
    if name == "humaneval":
        frame = records.rename(columns={"task_id": "id"})
    elif name == "mt_bench":
        turns = records["turns"] if "turns" in records else records["prompt"]
        ids = records["question_id"] if "question_id" in records else records["prompt_id"]
        for row, value in enumerate(turns):
            if not isinstance(value, (list, tuple, np.ndarray)) or len(value) == 0:
                raise UsageError(f"{origin}: record {row} has turns {value!r}, not a list of at least one turn")
        frame = records.assign(id=ids.astype(str), turns=turns, prompt=[t[0] for t in turns])
    else:
        frame = records.assign(id=[f"gsm8k/{i}" for i in range(len(records))],
                               prompt=records["question"])
    for row, text in enumerate(frame["prompt"]):
        if not isinstance(text, str) or not text.strip():
            raise UsageError(f"{origin}: record {row} has the prompt {text!r}, not a non-empty text")
    return frame[["id", "prompt"] + [c for c in frame.columns if c not in ("id", "prompt")]]


def _read_local(name: str, source: Path) -> tuple[pd.DataFrame, Path]:
    """The records of set ``name`` in a file or folder, and the file they came from."""
    path = source / PROMPT_SETS[name][3] if source.is_dir() else source
    if source.is_dir() and not path.exists():
        path = source / Path(PROMPT_SETS[name][3]).name
    if not path.exists():
        if lookup_problem(path):  # a loop of links, a name too long
            regular_file("prompt source", path)
        raise FileNotFoundError(f"no {name} prompts at {source} (looked for {PROMPT_SETS[name][3]})")
    if not path.is_file():
        raise UsageError(f"{path}: not a file of {name} prompts")
    with usage_errors():
        regular_file("prompt source", path)  # not a FIFO or a device, not larger than a file read whole may be
    compressed = path.suffix == ".gz"
    opener = gzip.open if compressed else open
    records = []
    try:
        with opener(path, "rt", encoding="utf-8") as file:
            read = 0
            for number, line in enumerate(file, start=1):
                read += len(line)
                if read > MAX_READ_BYTES:  # a gzip file that unpacks to far more than it holds
                    raise UsageError(f"{path}: unpacks to more than {MAX_READ_BYTES / 2**30:g} GiB by line {number}, "
                                     "more than a file read whole may hold")
                if not line.strip():
                    continue
                try:
                    record = parse_json(line, f"{path}: line {number}")
                except ValueError as error:
                    raise UsageError(f"{error}; a prompt file holds one JSON object per line") from None
                if not isinstance(record, dict):
                    raise UsageError(f"{path}: line {number} holds a {type(record).__name__}, "
                                     "not a JSON object (one record per line)")
                records.append(record)
    except (EOFError, OSError, zlib.error, UnicodeDecodeError) as error:
        kind = "gzipped JSON lines" if compressed else "UTF-8 JSON lines"
        raise UsageError(f"{path}: cannot be read as {kind}, the file is truncated or corrupt "
                         f"({type(error).__name__}: {error})") from error
    if not records:
        raise UsageError(f"{path}: holds no records")
    return pd.DataFrame(records), path


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
    FileNotFoundError
        When ``source`` (or the ``MOESD_PROMPTS`` folder) holds no file of the set.
    ValueError
        For an unknown set; a file that is not JSON lines, truncated or corrupt, empty, or holds
        another set's records (the message names the file, the line or record and the set it looks
        like); or when neither the hub nor a local copy can be read.
    """
    one_of("name", name, tuple(PROMPT_SETS))
    if source is not None:
        if not isinstance(source, (str, os.PathLike)):
            raise UsageError(f"source must be a path to a file or folder of prompts, got {source!r}")
        return _normalise(name, *_read_local(name, Path(source)))
    try:
        records = _read_hub(name)
    except Exception as hub_error:  # offline, no datasets package, or the hub refused
        fallback = os.environ.get("MOESD_PROMPTS")
        if fallback:
            return _normalise(name, *_read_local(name, Path(fallback)))
        raise ValueError(f"cannot load {name}: the hub failed ({type(hub_error).__name__}: "
                         f"{hub_error}) and no local copy was given; pass source= (moesd trace: "
                         "--prompt-source) or set MOESD_PROMPTS to a folder of prompt files") from hub_error
    return _normalise(name, records, f"the hub's {PROMPT_SETS[name][0]}")
