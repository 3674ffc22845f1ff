"""Prompt loaders on the four-record excerpts of HumanEval, MT-bench and GSM8K in tests/data/prompts.

The excerpts ship with the repository, so these tests run (never skip) in any clone, offline;
bad files and names are cases of tests/test_bad_input.py.
"""

import gzip
import json
from pathlib import Path

import pytest

from moesd.routing.prompts import PROMPT_SETS, load_prompts

EXCERPTS = Path(__file__).resolve().parent / "data" / "prompts"
FIRST_IDS = {"humaneval": "HumanEval/0", "mt_bench": "81", "gsm8k": "gsm8k/0"}


def _raw_records(name):
    path = EXCERPTS / PROMPT_SETS[name][3]
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as file:
        return [json.loads(line) for line in file if line.strip()]


@pytest.mark.parametrize("name", sorted(PROMPT_SETS))
def test_local_folder(name):
    prompts = load_prompts(name, EXCERPTS)
    assert len(prompts) == 4 and list(prompts.columns[:2]) == ["id", "prompt"]
    assert prompts["id"].iloc[0] == FIRST_IDS[name] and prompts["id"].is_unique
    assert prompts["prompt"].str.len().min() > 0


@pytest.mark.parametrize("name", sorted(PROMPT_SETS))
def test_prompt_is_the_sets_own_text(name):
    """Against the raw records: the text a model continues is the set's own field, unchanged."""
    field = {"humaneval": "prompt", "gsm8k": "question"}.get(name)
    expected = [r["turns"][0] if field is None else r[field] for r in _raw_records(name)]
    assert load_prompts(name, EXCERPTS / PROMPT_SETS[name][3])["prompt"].tolist() == expected


def test_mt_bench_keeps_both_turns():
    prompts = load_prompts("mt_bench", EXCERPTS / "mt_bench" / "question.jsonl")
    assert (prompts["turns"].map(len) == 2).all()
    assert (prompts["prompt"] == prompts["turns"].str[0]).all()


def test_flat_folder(tmp_path):
    """A folder holding the file itself, without the set's sub-folder, is read too."""
    (tmp_path / "test.jsonl").write_bytes((EXCERPTS / "gsm8k" / "test.jsonl").read_bytes())
    assert load_prompts("gsm8k", tmp_path)["id"].tolist() == [f"gsm8k/{i}" for i in range(4)]


def test_offline_without_a_copy_says_what_to_do(monkeypatch):
    monkeypatch.delenv("MOESD_PROMPTS", raising=False)
    with pytest.raises(ValueError, match="MOESD_PROMPTS"):
        load_prompts("gsm8k")


def test_environment_fallback(monkeypatch):
    monkeypatch.setenv("MOESD_PROMPTS", str(EXCERPTS))
    assert len(load_prompts("humaneval")) == 4
