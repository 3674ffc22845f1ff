"""Prompt loaders on the shared offline copies of HumanEval, MT-bench and GSM8K."""

from pathlib import Path

import pytest

from moesd.prompts import load_prompts

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "prompts"
pytestmark = pytest.mark.skipif(not SHARED.exists(), reason="shared prompt files not beside the project")


@pytest.mark.parametrize("name, count, first_id", [
    ("humaneval", 164, "HumanEval/0"), ("mt_bench", 80, "81"), ("gsm8k", 1319, "gsm8k/0")])
def test_local_folder(name, count, first_id):
    prompts = load_prompts(name, SHARED)
    assert len(prompts) == count and list(prompts.columns[:2]) == ["id", "prompt"]
    assert prompts["id"].iloc[0] == first_id and prompts["prompt"].str.len().min() > 0


def test_mt_bench_keeps_both_turns():
    prompts = load_prompts("mt_bench", SHARED / "mt_bench" / "question.jsonl")
    assert (prompts["turns"].map(len) == 2).all()
    assert (prompts["prompt"] == prompts["turns"].str[0]).all()


def test_offline_without_a_copy_says_what_to_do(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.delenv("MOESD_PROMPTS", raising=False)
    with pytest.raises(ValueError, match="MOESD_PROMPTS"):
        load_prompts("gsm8k")


def test_environment_fallback(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("MOESD_PROMPTS", str(SHARED))
    assert len(load_prompts("humaneval")) == 164


def test_bad_name_and_missing_file(tmp_path):
    with pytest.raises(ValueError, match="name must be one of"):
        load_prompts("squad")
    with pytest.raises(FileNotFoundError, match="no gsm8k prompts"):
        load_prompts("gsm8k", tmp_path)
    (tmp_path / "bad.jsonl").write_text("{oops\n")
    with pytest.raises(ValueError, match="bad.jsonl: not JSON"):
        load_prompts("gsm8k", tmp_path / "bad.jsonl")
