"""The predictor's recommendation as fields: where SD is on, marginal and off, what fits, what the host cost decides."""

import numpy as np
import pytest

from moesd.model.recommend import SD_MARGIN, recommend, sd_status


def test_sd_status_splits_at_one_and_at_the_margin():
    speedups = [0.5, 1.0, 1.0 + SD_MARGIN / 2, 1.0 + SD_MARGIN, 1.0 + 2 * SD_MARGIN]
    assert sd_status(speedups).tolist() == ["off", "off", "marginal", "marginal", "on"]


@pytest.fixture(scope="module")
def qwen3():
    """Qwen3-235B on one H100 does not fit; with a 0.6B draft the advice covers all batch sizes anyway."""
    return recommend("qwen3-235b-a22b", "qwen3-0.6b", "H100", np.arange(1, 65), np.arange(1, 6), "alpha",
                     [0.6, 0.9], context=1024)


def test_advice_partitions_the_judged_batch_sizes_by_the_best_speedup(qwen3):
    for advice in qwen3.advice:
        best = advice.best.set_index("batch_size")["speedup"]
        assert list(best.index) == list(qwen3.judged)
        assert set(advice.on) == set(best.index[best > 1 + SD_MARGIN])
        assert set(advice.marginal) == set(best.index[(best > 1) & (best <= 1 + SD_MARGIN)])
        assert advice.peak == pytest.approx(best.max()) and best[advice.peak_batch_size] == advice.peak
        low, high = advice.band
        assert best[low] >= advice.peak / np.sqrt(2) and best[high] >= advice.peak / np.sqrt(2)
    assert qwen3.advice[1].peak > qwen3.advice[0].peak  # more acceptance, more speedup


def test_what_does_not_fit_is_named_with_what_would_make_it_fit(qwen3):
    assert not qwen3.fits.any() and list(qwen3.judged) == list(range(1, 65))  # none fits: advice over all
    (short,) = qwen3.shortfalls
    assert short.role == "target" and short.gpus == 1 and short.largest_bytes > short.capacity_bytes
    assert short.largest_bytes >= short.smallest_bytes and 8 in short.more_gpus and "fp8" in short.smaller_dtypes


def test_the_host_cost_is_checked_both_ways():
    without = recommend("qwen3-30b-a3b", "qwen3-0.6b", "H100", [1, 8, 64], [2, 4], "alpha", [0.8])
    with_host = recommend("qwen3-30b-a3b", "qwen3-0.6b", "H100", [1, 8, 64], [2, 4], "alpha", [0.8], host_ms=3.8)
    assert without.advice[0].other_host_ms > 0 and with_host.advice[0].other_host_ms == 0
    for answer in (without, with_host):
        advice = answer.advice[0]
        if set(advice.on_at_other_host) != set(advice.on):  # where SD is on moves: the host cost decides
            assert advice.host_decides
    assert with_host.advice[0].peak < without.advice[0].peak  # host cost only slows SD's extra forwards down
    assert without.vocabularies[0] == without.vocabularies[1] and not without.shares_target_shape


def test_the_host_cost_decides_where_sd_turns_on_at_the_margin(qwen3):
    """At alpha 0.6, a serving engine's host cost moves where SD is on (B = 9 drops out); where SD is on at
    every batch size either way, it does not decide."""
    decided = qwen3.advice[0]
    assert decided.host_decides and set(decided.on_at_other_host) < set(decided.on)
    settled = recommend("deepseek-v3", "deepseek-v3-mtp", "H200", np.arange(1, 257), np.arange(1, 6), "alpha",
                        [0.8], tp=8, draft_tp=8, dtype="fp8").advice[0]
    assert not settled.host_decides and len(settled.on) == len(settled.on_at_other_host) == 256
