"""The moesd command."""

import re

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
    from moesd.measure.analysis import appendix_c2_bounds

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
    assert csv.read_text().startswith("batch_size,") and plot.read_text().lstrip().startswith("<?xml")
    written = {path: path.read_bytes() for path in (csv, plot)}
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--gamma", "2"])
    assert exit_.value.code == 2 and "p.csv' exists; pass --overwrite" in capsys.readouterr().err
    assert {path: path.read_bytes() for path in (csv, plot)} == written
    assert main([*argv, "--gamma", "2", "--overwrite"]) == 0
    assert csv.read_bytes() != written[csv] and sorted(p.name for p in tmp_path.iterdir()) == ["p.csv", "p.svg"]

