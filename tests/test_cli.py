"""The moesd command."""

import re

import numpy as np
import pandas as pd
import pytest

from moesd.cli import main


def test_theory_prints_threshold_and_table(capsys):
    assert main(["theory", "--E", "64", "--K", "8", "--tokens", "2", "16"]) == 0
    out = capsys.readouterr().out
    assert "T_thres(tau=0.95) = 23 tokens" in out
    assert "15.00" in out and "56.44" in out


def test_hardware_lists_ridge_points(capsys):
    main(["hardware"])
    out = capsys.readouterr().out
    assert "H200" in out and "206.1" in out
    assert "GPUs/node" in out and "H100, H800, H200: the SXM parts" in out


def test_bad_arguments_exit_with_usage(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["theory", "--E", "4", "--K", "8"])
    assert exit_.value.code == 2
    assert "K must be <= E" in capsys.readouterr().err


TRUE = dict(bias=1e-2, k1=2e-4, k2=2e-4, k3=5e-4, draft_bias=6e-4, draft_k=2e-5, reject_bias=2e-4, reject_k=2e-6,
            lam=0.5, s=1.02)
HOST = dict(name="test host", peak_flops=1e12, memory_bandwidth=2.7e10, memory_bytes=1e9, source="made up")
"""A measured roofline as new sweeps store it: ridge point 37.04 FLOP/byte, 37.04 tokens in bf16 (2 bytes a weight)."""


def write_sweep(folder, hardware=HOST, target="mixtral-8x7b", name="sparsity.csv"):
    """A sparsity result file of Mixtral's shape (E = 8) whose speedups Algorithm 1 gives exactly."""
    import json

    import pandas as pd

    from moesd.model.algorithm1 import compute_speedup

    rp = HOST["peak_flops"] / HOST["memory_bandwidth"]
    rows = pd.DataFrame([dict(run=0, batch_size=b, gamma=g, num_experts_per_tok=k, sigma=0.9)
                         for k in (1, 2) for g in (2, 4) for b in (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 80, 100)])
    rows["speedup"] = compute_speedup(TRUE, rows.batch_size, rows.gamma, rows.num_experts_per_tok, 8, rows.sigma, rp)
    path = folder / name
    rows.to_csv(path, index=False)
    sidecar = {"device": "test", "settings": {"target": target, "dtype": "bfloat16"}, "complete": True}
    if hardware:
        sidecar["hardware"] = hardware
    path.with_suffix(".json").write_text(json.dumps(sidecar))
    return path


def number_after(text, label):
    return float(text.split(label)[1].split()[0].rstrip(";,%"))


def test_fit_takes_E_and_the_ridge_point_from_the_sidecar(tmp_path, capsys):
    path = write_sweep(tmp_path)
    assert main(["fit", str(path), "--stride", "4"]) == 0
    out = capsys.readouterr().out
    assert "12 of 48 measurements" in out and "E = 8 (sidecar)" in out
    assert "ridge point 37.04 tokens (measured roofline in the sidecar, in its dtype)" in out
    assert re.search(r"solver: trf(, L-BFGS-B, trf)?, status [1-4] \(converged\), \d+ evaluations", out)
    # Noise-free data from known parameters: every speedup is recovered, held back ones too.
    assert number_after(out, "over all") < 1e-12 and number_after(out, "max error") < 1e-6
    assert number_after(out, "MAPE") < 1e-4
    assert "on bounds: none" in out
    assert main(["fit", str(path)]) == 0  # every row fitted: nothing to score held-back errors on
    out = capsys.readouterr().out
    assert "48 of 48 measurements" in out and "none held back" in out and "nan" not in out


def test_fit_overrides(tmp_path, capsys):
    path = write_sweep(tmp_path)
    assert main(["fit", str(path), "--stride", "4", "--E", "64", "--verify-tokens", "gamma+1"]) == 0
    out = capsys.readouterr().out
    assert "E = 64 (--E)" in out and "B (gamma + 1) verified tokens" in out
    assert number_after(out, "max error") > 1e-4  # the wrong E cannot fit these speedups exactly


def test_fit_without_a_measured_roofline_needs_hardware(tmp_path, capsys):
    path = write_sweep(tmp_path, hardware=None)
    with pytest.raises(SystemExit) as exit_:
        main(["fit", str(path)])
    assert exit_.value.code == 2
    assert f"{path}: the sidecar of this result file" in capsys.readouterr().err
    assert main(["fit", str(path), "--hardware", "CPU", "--stride", "4"]) == 0
    out = capsys.readouterr().out
    assert "ridge point 10 tokens (CPU data sheet, --hardware)" in out
    assert number_after(out, "max error") > 1e-4  # the data were made with a ridge point of 37


def test_fit_with_appendix_c2_bounds(tmp_path, capsys):
    """The paper's volume bounds make the fitted time-like parameters seconds within them."""
    from moesd.measure.studies import load, measurements_dir
    from moesd.model.bounds import appendix_c2_bounds

    path = measurements_dir() / "cpu" / "sparsity.csv"
    assert main(["fit", str(path), "--stride", "2", "--bounds", "appendix-c2"]) == 0
    out = capsys.readouterr().out
    points = load("sparsity", "cpu")[0].groupby(["batch_size", "gamma", "num_experts_per_tok"]).ngroups
    # the shipped study's 5 repeats are averaged into its points before sampling every second one
    assert out.startswith(f"{-(-points // 2)} of {points} measurements (each the mean of 5 repeats)")
    assert "bounds: appendix-c2; on bounds:" in out and "fitted (s; lam, s dimensionless)" in out
    lower, upper = appendix_c2_bounds(*load("sparsity", "cpu"))
    bias = number_after(out, "\nbias")
    assert lower[0] * (1 - 1e-3) <= bias <= upper[0] * (1 + 1e-3)  # seconds, not the free fit's 1
    synthetic = write_sweep(tmp_path)  # its sidecar names no draft and its rows hold no rejection times
    with pytest.raises(SystemExit) as exit_:
        main(["fit", str(synthetic), "--bounds", "appendix-c2"])
    assert exit_.value.code == 2
    assert "settings.draft, a t_reject column" in capsys.readouterr().err


def test_predict_writes_csv_and_plot_once_and_replaces_them_with_overwrite(tmp_path, capsys):
    """--csv and --plot refuse existing files (leaving them as they were) unless --overwrite, and are written
    atomically: no temporary file is left beside them."""
    csv, plot = tmp_path / "p.csv", tmp_path / "p.svg"
    argv = ["predict", "--target", "qwen3-30b-a3b", "--draft", "qwen3-0.6b", "--hardware", "H100", "--batch", "8",
            "--csv", str(csv), "--plot", str(plot)]
    assert main(argv) == 0
    assert csv.read_text().startswith("target,draft,hardware,tp,") and plot.read_text().lstrip().startswith("<?xml")
    written = pd.read_csv(csv)  # the setup in every row, then predict_sd's columns
    assert (written["target"] == "qwen3-30b-a3b").all() and (written["draft_tp"] == 1).all()
    assert list(written.columns[written.columns.get_loc("batch_size"):][:2]) == ["batch_size", "gamma"]
    written = {path: path.read_bytes() for path in (csv, plot)}
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--gamma", "2"])
    assert exit_.value.code == 2 and "p.csv' exists; pass --overwrite" in capsys.readouterr().err
    assert {path: path.read_bytes() for path in (csv, plot)} == written
    assert main([*argv, "--gamma", "2", "--overwrite"]) == 0
    assert csv.read_bytes() != written[csv] and sorted(p.name for p in tmp_path.iterdir()) == ["p.csv", "p.svg"]


def _predict(capsys, *args):
    assert main(["predict", *args]) == 0
    return capsys.readouterr().out


def _refused(capsys, *args):
    with pytest.raises(SystemExit) as exit_:
        main(["predict", *args])
    assert exit_.value.code == 2
    return capsys.readouterr().err


QWEN3 = ["--target", "qwen3-30b-a3b", "--draft", "qwen3-0.6b", "--hardware", "H100"]
DEEPSEEK = ["--target", "deepseek-v3", "--draft", "deepseek-v3-mtp", "--hardware", "H200", "--tp", "8",
            "--dtype", "fp8"]


def test_predict_host_cost_and_engine_profile_exclude_each_other(capsys):
    """A profile leaves the draft's steps to the profile: --host-ms would charge the target alone. With a profile
    the advice is not re-checked at vLLM v0's host cost, so no hint about --host-ms is printed."""
    err = _refused(capsys, *QWEN3, "--engine-profile", "sglang", "--host-ms", "3.8")
    assert "--host-ms and --engine-profile exclude each other" in err and "--step-ms" in err
    out = _predict(capsys, *QWEN3, "--engine-profile", "sglang", "--batch", "1-64", "--alpha", "0.6,0.8")
    assert "depends on the host cost" not in out and "--host-ms" not in out
    assert "not the rejection sampling" in " ".join(_help(capsys).split())


def _help(capsys):
    with pytest.raises(SystemExit):
        main(["predict", "--help"])
    return capsys.readouterr().out


def test_predict_judges_nothing_when_nothing_fits(tmp_path, capsys):
    csv = tmp_path / "p.csv"
    out = _predict(capsys, "--target", "qwen3-235b-a22b", "--draft", "qwen3-0.6b", "--hardware", "H100",
                   "--batch", "1,8,64", "--csv", str(csv))
    verdict = next(line for line in out.splitlines() if line.startswith("alpha = 0.8"))
    assert "not judged: nothing fits" in verdict and "SD pays" not in verdict and "leave it off" not in verdict
    rows = [line.split() for line in out.splitlines() if re.match(r"\s+\d+\s+\d+\s", line)]
    assert len(rows) == 3 and all(row[5:7] == ["not", "judged"] for row in rows)

    assert pd.read_csv(csv)["fits"].eq(False).all()
    _predict(capsys, *QWEN3, "--batch", "1,256", "--csv", str(csv), "--overwrite")
    assert pd.read_csv(csv).groupby("batch_size")["fits"].all().to_dict() == {1: True, 256: False}


def test_predict_runs_a_draft_head_on_the_target_gpus_by_default(capsys):
    out = _predict(capsys, *DEEPSEEK, "--batch", "1,64")
    assert "draft deepseek-v3-mtp on 8 GPU(s)" in out and "note:" not in out
    out = _predict(capsys, *DEEPSEEK, "--batch", "1,64", "--draft-tp", "1")
    assert "--draft-tp 8 prices that" in out and "--draft-tp 1 prices it on 1 GPU(s)" in out
    assert "draft qwen3-0.6b on 1 GPU(s)" in _predict(capsys, *QWEN3, "--tp", "2", "--batch", "8")


def test_predict_takes_trees_draft_dtypes_and_the_batch_of_a_measured_step(tmp_path, capsys):
    from moesd.predictor.predict import predict_sd
    from moesd.predictor.setup import Setup

    csv = tmp_path / "p.csv"
    eagle = ["--target", "qwen3-30b-a3b", "--draft", "qwen3-30b-a3b-eagle3", "--hardware", "H100", "--tp", "2",
             "--batch", "1,8", "--gamma", "4", "--acceptance-length", "2.5@4", "--engine-profile", "sglang"]
    out = _predict(capsys, *eagle, "--draft-topk", "4", "--verify-tokens", "16", "--draft-dtype", "fp8",
                   "--step-ms", "12", "--step-batch", "8", "--csv", str(csv))
    assert "(fp8 weights, 4 candidates per position, 16 tokens verified per sequence)" in out.splitlines()[0]
    assert "plain step at B = 8 your measured 12 ms" in out.splitlines()[0]

    expected = predict_sd(Setup("qwen3-30b-a3b", "qwen3-30b-a3b-eagle3", "H100", tp=2, context=1024, engine="sglang",
                                draft_topk=4, verify_tokens=16, draft_dtype="fp8", step_seconds=12e-3,
                                step_batch_size=8), [1, 8], 4, sigma=0.5)
    np.testing.assert_allclose(pd.read_csv(csv)["speedup"], expected["speedup"], rtol=1e-9)
    for flags, message in ((["--draft-topk", "0"], "--draft-topk must be >= 1, got 0"),
                           (["--draft-topk", "2", "--verify-tokens", "1"], "--verify-tokens must be >= 2, got 1"),
                           (["--verify-tokens", "8"], "--verify-tokens applies to a tree of drafts"),
                           (["--draft-topk", "2", "--verify-tokens", "5000"], "--verify-tokens: verify_tokens must be"),
                           (["--draft-dtype", "int3"], "--draft-dtype: dtype must be one of"),
                           (["--step-batch", "8"], "--step-batch applies only with --step-ms"),
                           (["--step-ms", "12", "--step-batch", "0"], "--step-batch must be >= 1, got 0")):
        assert message in _refused(capsys, *eagle, *flags)


def test_predict_suggests_only_changes_that_make_more_fit(capsys):
    """DeepSeek-V3 at 2M tokens: its MLA cache is on every GPU, so no --tp helps, and H200 has no FP4 cores."""
    out = _predict(capsys, *DEEPSEEK, "--batch", "1", "--context", "2000000")
    line = next(line for line in out.splitlines() if line.startswith("does not fit"))
    assert line.endswith("(try a shorter --context).")
    out = _predict(capsys, *DEEPSEEK, "--batch", "1,64,256", "--context", "200000")
    line = next(line for line in out.splitlines() if line.startswith("does not fit"))
    assert "--dp-attention at --tp 16 or" in line and "try --tp" not in line and "--dtype" not in line
    out = _predict(capsys, *QWEN3, "--batch", "1,256")
    assert "(try --tp 2 or 4 or 8; --dtype fp8 or w4a8; a shorter --context)." in out


def test_predict_says_how_to_anchor_an_engine_profile(capsys):
    note = "a measured plain step (--step-ms"
    assert note in _predict(capsys, *QWEN3, "--batch", "8", "--engine-profile", "sglang")
    assert "Against serving engines" in _predict(capsys, *QWEN3, "--batch", "8", "--engine-profile", "sglang")
    assert note not in _predict(capsys, *QWEN3, "--batch", "8", "--engine-profile", "sglang", "--step-ms", "20")


def test_hardware_says_where_tensor_parallelism_crosses_nodes(capsys):
    main(["hardware"])
    out = capsys.readouterr().out
    assert "NIC GB/s" in out and "nodes" in out
    assert "Hardware.max_nodes" in " ".join(_help(capsys).split())
    out = _predict(capsys, "--target", "deepseek-v3", "--draft", "deepseek-v3-mtp", "--hardware", "H100", "--tp",
                   "16", "--dtype", "fp8", "--batch", "8")
    assert "--tp 16 spans 2 nodes of 8 H100" in out.splitlines()[0]
    assert "spans" not in _predict(capsys, *DEEPSEEK, "--batch", "8").splitlines()[0]


def test_predict_wording_of_acceptance_data_parallel_and_the_batch_range(capsys):
    out = _predict(capsys, *QWEN3, "--batch", "1,8", "--acceptance-length", "1@3")
    assert "alpha = 0.000 (the first draft position's, from --acceptance-length 1@3)" in out
    assert "(at the largest batch size asked; try larger --batch)" in out
    assert "try larger --batch" not in _predict(capsys, *QWEN3, "--batch", "1-128")
    assert "--dp-attention needs --tp 2 or more" in _refused(capsys, *DEEPSEEK[:6], "--tp", "1", "--dp-attention")
