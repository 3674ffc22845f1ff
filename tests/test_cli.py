"""The moesd command."""

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


def test_bad_arguments_exit_with_usage(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["theory", "--E", "4", "--K", "8"])
    assert exit_.value.code == 2
    assert "K must be <= E" in capsys.readouterr().err



def test_fit_reads_a_sweep_file(tmp_path, capsys):
    import numpy as np
    import pandas as pd

    from moesd.fit import compute_speedup

    true = dict(bias=1e-2, k1=2e-4, k2=2e-4, k3=5e-4, draft_bias=6e-4, draft_k=2e-5, reject_bias=2e-4,
                reject_k=2e-6, lam=0.5, s=1.02)
    grid = pd.DataFrame([dict(batch_size=b, gamma=g, num_experts_per_tok=k, sigma=0.9) for k in (2, 8)
                         for g in (2, 4) for b in (1, 2, 4, 8, 16, 32, 64, 100)])
    grid["speedup"] = compute_speedup(true, grid.batch_size, grid.gamma, grid.num_experts_per_tok, 64, 0.9, 10.0)
    path = tmp_path / "sparsity.csv"
    grid.to_csv(path, index=False)
    assert main(["fit", str(path), "--stride", "2"]) == 0
    out = capsys.readouterr().out
    assert "16 of 32 measurements, variant eq4" in out and "relative to bias" in out
    assert np.isfinite(float(out.split("MAPE ")[1].split(" %")[0]))
