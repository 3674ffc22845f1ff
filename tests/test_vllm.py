"""The vLLM engine (moesd.vllm_engine): counters against emitted tokens, 100 % acceptance with the target as its
own draft, greedy acceptance equal to the Hugging Face engine's on the same models and prompts, and a tiny sweep
that writes a valid result file with the Hugging Face engine's columns.

Tests that run vLLM carry the `vllm` mark: `make vllm` builds .venv-vllm and `make test-vllm` runs this whole file
there; `make test` (the project's venv, no vLLM) runs the checks that need no vLLM and deselects the marked ones.
Run by hand without vLLM, a marked test is skipped and says why.
"""

import gc
import importlib.util
import json

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from moesd import measurements  # noqa: E402
from moesd.bench import SweepConfig, _random_ids, run_sweep, time_speculative  # noqa: E402
from moesd.sd import SpeculativeDecoder  # noqa: E402
from moesd.speedup import sigma as eq5  # noqa: E402
from moesd.vllm_engine import (UNMEASURED_COLUMNS, check_config, save_model, synthetic_acceptance_rates,  # noqa: E402
                               tiny_models)

def needs_vllm(test):
    """Mark a test that runs vLLM (deselected by make test) and skip it, saying why, where vLLM is missing."""
    skip = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                              reason="vllm is not installed here: `make vllm` builds .venv-vllm with it and "
                                     "`make test-vllm` runs these tests there")
    return pytest.mark.vllm(skip(test))

ROUNDS, WARMUP = 8, 1


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.947, 1.0])
@pytest.mark.parametrize("gamma", [1, 2, 4, 7])
def test_synthetic_rates_give_eq5_sigma(alpha, gamma):
    """The mean accepted prefix is the sum of vLLM's per-position rates; with it sigma is Eq. 5's."""
    rates = synthetic_acceptance_rates(alpha, gamma)
    assert len(rates) == gamma and all(a >= b for a, b in zip(rates, rates[1:]))
    assert (1 + sum(rates)) / (gamma + 1) == pytest.approx(float(eq5(alpha, gamma)))


@pytest.mark.parametrize("alpha, gamma", [(-0.1, 2), (1.5, 2), (0.5, 0), (0.5, 2.5)])
def test_synthetic_rates_refuse_bad_input(alpha, gamma):
    with pytest.raises(ValueError):
        synthetic_acceptance_rates(alpha, gamma)


def test_synthetic_acceptance_on_cpu_is_refused_before_any_work(tmp_path):
    config = SweepConfig(study="e2e", target="qwen3-30b-a3b", draft="qwen3-0.6b", layers=1, draft_layers=1,
                         width=1 / 16, batch_sizes=(1,), gammas=(2,), sigma={2: 0.9})
    with pytest.raises(ValueError, match="not available with vLLM on a CPU"):
        check_config(config)
    for study in ("forward", "settings"):
        with pytest.raises(ValueError, match="not " + study):
            check_config(SweepConfig(study=study, target="qwen3-30b-a3b", draft="qwen3-0.6b", gammas=(4,)))


def test_tiny_draft_agrees_with_target_on_some_tokens():
    """The tiny pair has real acceptance strictly between none and all (the HF engine, greedy)."""
    target, draft = tiny_models()
    ids = _random_ids(4, 16, target.config.vocab_size, 0, "cpu")
    window = time_speculative(SpeculativeDecoder(target, draft, 2), ids, ROUNDS, WARMUP)
    assert 0 < window.accepted < window.drafted


# ---- vLLM itself -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """The tiny target and draft saved with a word-level tokenizer, and the Hugging Face models."""
    root = tmp_path_factory.mktemp("tiny")
    target, draft = tiny_models()
    return {"target": str(save_model(target, root / "target")), "draft": str(save_model(draft, root / "draft")),
            "models": (target, draft)}


def _config(folders, **changes):
    settings = dict(study="e2e", target="qwen3-30b-a3b", draft="qwen3-0.6b", weights="pretrained",
                    target_path=folders["target"], draft_path=folders["draft"], sigma="real",
                    batch_sizes=(1, 4), gammas=(2,), context=16, rounds=ROUNDS, warmup_rounds=WARMUP, repeats=1,
                    warmup=1)
    return SweepConfig(**{**settings, **changes})


@pytest.fixture(scope="module")
def engines(folders):
    """vLLM engines of the tiny target, built on first use: ``"ar"``, ``"draft"`` (SD with the dense draft, gamma
    2) and ``"same"`` (SD with the target as its own draft, gamma 3). One at a time: vLLM keeps one set of
    metrics per process, so a new engine replaces the previous one's counters."""
    from moesd.vllm_engine import make_llm

    config, held = _config(folders), {}

    def engine(kind):
        if kind not in held:
            held.clear()
            gc.collect()
            draft, gamma = {"ar": (None, None), "draft": (folders["draft"], 2), "same": (folders["target"], 3)}[kind]
            held[kind] = make_llm(folders["target"], config, draft=draft, gamma=gamma)
        return held[kind]

    yield engine
    held.clear()
    gc.collect()


def _prompts(folders, batch, seed=0):
    return _random_ids(batch, 16, folders["models"][0].config.vocab_size, seed, "cpu")


@needs_vllm
def test_target_as_its_own_draft_accepts_everything(folders, engines):
    from moesd.vllm_engine import time_window

    window = time_window(engines("same"), _prompts(folders, 3).tolist(), ROUNDS, WARMUP, 3)
    assert window.drafts == 3 * ROUNDS and window.draft_tokens == 3 * window.drafts
    assert window.accepted == window.draft_tokens and window.sigma == 1.0
    assert window.emitted == 3 * ROUNDS * 4


@needs_vllm
def test_counters_match_emitted_tokens_and_the_hf_engine(folders, engines):
    """Greedy acceptance is a property of the models and prompts: vLLM's counters over the window equal the
    accepted tokens of moesd's own engine (moesd.sd) on the same models, prompts and rounds."""
    from moesd.vllm_engine import time_window

    target, draft = folders["models"]
    for batch, seed in ((1, 0), (4, 1)):
        ids = _prompts(folders, batch, seed)
        window = time_window(engines("draft"), ids.tolist(), ROUNDS, WARMUP, 2)
        reference = time_speculative(SpeculativeDecoder(target, draft, 2), ids, ROUNDS, WARMUP)
        assert window.emitted == window.accepted + window.drafts  # counted twice, independently
        assert 0 < window.accepted < window.draft_tokens
        assert (window.drafts, window.accepted) == (reference.sequence_rounds, reference.accepted)


@needs_vllm
def test_ar_window_emits_one_token_per_request_and_step(folders, engines):
    from moesd.vllm_engine import time_window

    window = time_window(engines("ar"), _prompts(folders, 4).tolist(), ROUNDS, WARMUP)
    assert window.emitted == 4 * ROUNDS and window.drafts == window.accepted == 0 and window.seconds > 0


@needs_vllm
def test_tiny_sweep_writes_a_valid_result_file_with_the_hf_columns(folders, tmp_path):
    from moesd.vllm_engine import run_sweep as run_vllm_sweep

    config = _config(folders)
    path = run_vllm_sweep(config, tmp_path / "vllm", progress=False)
    hf = pd.read_csv(run_sweep(config, tmp_path / "hf", progress=False))
    rows, sidecar = measurements.load("e2e", "vllm", tmp_path)  # checks every row; warns on a violation
    assert list(rows.columns) == list(hf.columns) and len(rows) == len(hf) == 2
    assert sidecar["engine"] == "vllm" and sidecar["complete"] and sidecar["vllm"]
    assert rows[list(UNMEASURED_COLUMNS)].isna().all().all()
    assert (rows[["t_ar", "t_sd", "speedup"]] > 0).all().all()
    merged = rows.merge(hf, on=["batch_size", "gamma"], suffixes=("", "_hf"))
    np.testing.assert_allclose(merged["sigma"], merged["sigma_hf"])  # same models, prompts and rounds
    assert json.loads(path.with_suffix(".json").read_text())["settings"] == config.settings()
    with pytest.raises(FileExistsError):
        run_vllm_sweep(config, tmp_path / "vllm", progress=False)
