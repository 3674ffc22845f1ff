"""Sweeps: result files, columns, resuming, refusing to overwrite; on tiny random-weight models."""

import json

import pandas as pd
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import moesd.bench as bench  # noqa: E402
from moesd.bench import SweepConfig, preset, run_sweep, summarize  # noqa: E402
from moesd.speedup import alpha_from_sigma  # noqa: E402

TINY = dict(target="qwen2-57b-a14b", draft="qwen2-0.5b", layers=1, draft_layers=1, width=1 / 32,
            batch_sizes=(1, 3), gammas=(2, 3), context=8, max_new_tokens=6, repeats=2, warmup=1)


def test_forward_study_writes_every_point(tmp_path):
    path = run_sweep(SweepConfig("forward", **TINY), tmp_path, progress=False)
    frame = pd.read_csv(path)
    assert len(frame) == 2 * 2 * 4 * 2  # roles x batch sizes x s in {1, 2, 3, 4} x repeats
    assert set(frame["tokens"]) == {1, 2, 3, 4} and set(frame["role"]) == {"target", "draft"}
    assert (frame["seconds"] > 0).all() and (frame["num_experts_per_tok"] == 8).all()
    sidecar = json.loads(path.with_suffix(".json").read_text())
    assert sidecar["complete"] and sidecar["weights"] == "random" and sidecar["acceptance"]["mode"] == "synthetic"
    assert {"device", "torch", "transformers", "commit", "date", "command"} <= set(sidecar)
    medians = summarize(frame, ["role", "batch_size", "tokens"], "seconds")
    assert (medians["q25"] <= medians["median"]).all() and (medians["median"] <= medians["q75"]).all()


def test_e2e_rows_are_consistent(tmp_path):
    path = run_sweep(SweepConfig("e2e", **TINY), tmp_path, progress=False)
    frame = pd.read_csv(path)
    assert len(frame) == 2 * 2 * 2
    required = {"batch_size", "gamma", "num_experts_per_tok", "t_ar", "t_sd", "t_target_1", "t_target_gamma",
                "t_draft", "t_reject", "sigma", "speedup", "target_efficiency", "run", "alpha"}
    assert required <= set(frame.columns)
    assert frame["speedup"].to_numpy() == pytest.approx((frame["t_ar"] / frame["t_sd"]).to_numpy())
    assert frame["target_efficiency"].to_numpy() == pytest.approx(
        (frame["t_target_1"] / frame["t_target_gamma"]).to_numpy())
    assert ((frame["sigma"] >= 1 / (frame["gamma"] + 1)) & (frame["sigma"] <= 1)).all()
    for gamma, alpha in frame.groupby("gamma")["alpha"].first().items():
        assert alpha == pytest.approx(float(alpha_from_sigma(bench.PAPER_SIGMA[gamma], gamma)))


def test_sparsity_study_varies_k(tmp_path):
    config = SweepConfig("sparsity", **{**TINY, "top_ks": (1, 4), "repeats": 1, "batch_sizes": (2,)})
    frame = pd.read_csv(run_sweep(config, tmp_path, progress=False))
    assert sorted(frame["num_experts_per_tok"].unique()) == [1, 4] and len(frame) == 2 * 2


def test_an_interrupted_sweep_resumes_and_a_finished_one_is_kept(tmp_path, monkeypatch):
    config = SweepConfig("e2e", **TINY)
    real_row, calls = bench._e2e_row, []

    def failing_row(*args):
        calls.append(1)
        if len(calls) == 6:
            raise KeyboardInterrupt
        return real_row(*args)

    monkeypatch.setattr(bench, "_e2e_row", failing_row)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(config, tmp_path, progress=False)
    partial = pd.read_csv(tmp_path / "e2e.csv")
    assert len(partial) == 4  # the first repeat's rows were written, the second's lost with the interruption
    assert not json.loads((tmp_path / "e2e.json").read_text())["complete"]
    monkeypatch.setattr(bench, "_e2e_row", real_row)
    frame = pd.read_csv(run_sweep(config, tmp_path, progress=False))
    assert len(frame) == 8 and not frame.duplicated(["run", "batch_size", "gamma"]).any()
    pd.testing.assert_frame_equal(frame.iloc[:4], partial)
    with pytest.raises(FileExistsError, match="finished"):
        run_sweep(config, tmp_path, progress=False)
    with pytest.raises(FileExistsError, match="finished"):
        run_sweep(SweepConfig("e2e", **{**TINY, "repeats": 3}), tmp_path, progress=False)
    assert len(pd.read_csv(run_sweep(config, tmp_path, overwrite=True, progress=False))) == 8


def test_other_settings_do_not_resume(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "_e2e_row", lambda *args: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        run_sweep(SweepConfig("e2e", **TINY), tmp_path, progress=False)
    (tmp_path / "e2e.csv").write_text("run,batch_size,gamma\n")
    with pytest.raises(FileExistsError, match="other settings"):
        run_sweep(SweepConfig("e2e", **{**TINY, "context": 9}), tmp_path, progress=False)


@pytest.mark.parametrize("changes, match", [
    (dict(study="prefill"), "study"), (dict(weights="trained"), "weights"), (dict(sigma=None), "random weights"),
    (dict(sigma={2: 0.9}), "no value for gamma"), (dict(repeats=0), "repeats"), (dict(batch_sizes=(0, 1)), ">= 1")])
def test_bad_configs_raise(changes, match):
    with pytest.raises(ValueError, match=match):
        SweepConfig(**{"study": "e2e", **TINY, **changes})


def test_presets_keep_the_paper_settings():
    cpu = preset("sparsity")
    assert cpu.top_ks == (1, 2, 4, 8, 16, 32) and cpu.gammas == (2, 4) and len(cpu.batch_sizes) == 19
    assert preset("dense").target == "opt-30b" and preset("e2e", "gpu").dtype == "bfloat16"
    assert preset("e2e").sigma == {2: 0.95, 3: 0.93, 4: 0.90}
    with pytest.raises(ValueError, match="preset"):
        preset("e2e", "tpu")


def test_cli_sweep(tmp_path, capsys):
    from moesd.cli import main

    arguments = ["sweep", "e2e", "--layers", "1", "--draft-layers", "1", "--width", "0.03125", "--batch-sizes", "2",
                 "--gammas", "2", "--sigma", "0.8", "--repeats", "1", "--max-new-tokens", "4", "--context", "5",
                 "--out-dir", str(tmp_path)]
    assert main(arguments) == 0
    frame = pd.read_csv(tmp_path / "e2e.csv")
    assert len(frame) == 1 and frame["alpha"].iloc[0] == pytest.approx(float(alpha_from_sigma(0.8, 2)))
    with pytest.raises(SystemExit):
        main(arguments)
    assert "finished" in capsys.readouterr().err
