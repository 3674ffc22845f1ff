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

