"""The paper's printed tables in data/paper/ are complete and consistent with its equations."""

import math

import numpy as np
import pytest

from moesd.theory.experts import expected_active_experts
from moesd.paper_tables import paper_table
from moesd.theory.speedup import alpha_from_sigma, sigma


@pytest.fixture(scope="module")
def tables():
    return paper_table("tables_1_2")


def test_tables_1_2_complete(tables):
    assert len(tables) == 8 * 3 + 12 * 3
    assert set(tables.columns) >= {"T_AR", "T_SD", "sigma", "speedup", "source"}
    assert tables["speedup"].max() == 2.29
    peak = tables.loc[tables["speedup"].idxmax()]
    assert (peak["device"], peak["dataset"], peak["temperature"], peak["gamma"]) == ("2xH800", "humaneval", 0.0, 4)


def test_speedup_is_t_ar_over_t_sd(tables):
    """Each printed x equals T_AR / T_SD to the two decimals the paper prints."""
    ratio = tables["T_AR"] / tables["T_SD"]
    worst = (ratio - tables["speedup"]).abs().max()
    assert worst <= 0.01


def test_every_sigma_implies_an_acceptance_rate(tables):
    alpha = alpha_from_sigma(tables["sigma"], tables["gamma"])
    assert ((alpha > 0) & (alpha < 1)).all()
    # and that rate gives the printed sigma back through Eq. 5
    np.testing.assert_allclose(sigma(alpha, tables["gamma"]), tables["sigma"], rtol=1e-12)


def test_table_3_strides_give_m():
    table = paper_table("table_3")
    assert len(table) == 21
    assert (table["m"] == [math.ceil(228 / s) for s in table["stride"]]).all()


def test_models_have_sources_and_valid_routing():
    models = paper_table("models")
    assert models[["config_source", "params_source"]].notna().all().all()
    moe = models.dropna(subset=["num_experts"])
    assert set(moe["model"]) >= {"Qwen2-57B-A14B-Instruct", "Mixtral-8x7B-Instruct-v0.1"}
    assert (moe["num_experts_per_tok"] <= moe["num_experts"]).all()
    n = expected_active_experts(1, moe["num_experts"].to_numpy(float), moe["num_experts_per_tok"].to_numpy(float))
    np.testing.assert_allclose(n, moe["num_experts_per_tok"].to_numpy(float))
    assert (models["active_params"] <= models["total_params"]).all()


def test_unknown_table():
    with pytest.raises(ValueError, match="name must be one of"):
        paper_table("table_9")
