"""The predictor's recommendation as fields: where SD is on, marginal and off, what fits, what the host cost decides."""

import dataclasses

import numpy as np
import pandas as pd
import pytest

from moesd._checks import UsageError
from moesd.predictor.memory import memory_fit
from moesd.predictor.predict import predict_sd
from moesd.predictor.recommend import NOT_JUDGED, SD_MARGIN, recommend, sd_status
from moesd.predictor.setup import Setup


def test_sd_status_splits_at_one_and_at_the_margin():
    speedups = [0.5, 1.0, 1.0 + SD_MARGIN / 2, 1.0 + SD_MARGIN, 1.0 + 2 * SD_MARGIN]
    assert sd_status(speedups).tolist() == ["off", "off", "marginal", "marginal", "on"]


@pytest.fixture(scope="module")
def qwen3():
    """Qwen3-235B with a 0.6B draft on eight H100s: every batch size up to 64 fits."""
    return recommend(Setup("qwen3-235b-a22b", "qwen3-0.6b", "H100", tp=8, context=1024), np.arange(1, 65),
                     np.arange(1, 6), "alpha", [0.6, 0.9])


@pytest.fixture(scope="module")
def unfitting():
    """Qwen3-235B on one H100 does not fit at any batch size."""
    return recommend(Setup("qwen3-235b-a22b", "qwen3-0.6b", "H100", context=1024), np.arange(1, 65),
                     np.arange(1, 6), "alpha", [0.6, 0.9])


def test_advice_partitions_the_judged_batch_sizes_by_the_low_end_of_the_band(qwen3):
    """On where the best speedup's error band lies above 1 + SD_MARGIN, marginal above 1: off unless the band is."""
    assert qwen3.band.variant == "device"
    for advice in qwen3.advice:
        frame = advice.best.set_index("batch_size")
        best, low = frame["speedup"], frame["speedup_low"]
        np.testing.assert_allclose(low, best * qwen3.band.low)
        np.testing.assert_allclose(frame["speedup_high"], best * qwen3.band.high)
        assert list(best.index) == list(qwen3.judged)
        assert set(advice.on) == set(best.index[low > 1 + SD_MARGIN])
        assert set(advice.marginal) == set(best.index[(low > 1) & (low <= 1 + SD_MARGIN)])
        assert advice.peak == pytest.approx(best.max()) and best[advice.peak_batch_size] == advice.peak
        low, high = advice.band
        assert best[low] >= advice.peak / np.sqrt(2) and best[high] >= advice.peak / np.sqrt(2)
    assert qwen3.advice[1].peak > qwen3.advice[0].peak  # more acceptance, more speedup


def test_what_does_not_fit_is_named_with_what_would_make_it_fit(unfitting):
    (short,) = unfitting.shortfalls
    assert short.role == "target" and short.gpus == 1 and short.largest_bytes > short.capacity_bytes
    assert short.largest_bytes >= short.smallest_bytes
    # 470 GB of bf16 weights: 8 GPUs of a node hold them, 2 or 4 do not, and no dtype or context fits one GPU
    assert short.more_gpus == (8,) and short.smaller_dtypes == () and not short.shorter_context
    assert short.dp_attention_gpus == () and not short.holds_draft  # GQA, and a draft on a GPU of its own


def test_when_nothing_fits_sd_is_not_judged(unfitting):
    """No batch size fits: the speedups stay (all batch sizes), but no status says on or off, nothing is on,
    marginal or decided by the host cost, and every CSV row says it does not fit."""
    assert not unfitting.fits.any() and list(unfitting.judged) == list(range(1, 65))
    assert "fits" in unfitting.frame and not unfitting.frame["fits"].any()
    for advice in unfitting.advice:
        assert not advice.judged and set(advice.best["sd"]) == {NOT_JUDGED}
        assert not len(advice.on) and not len(advice.marginal) and not len(advice.on_at_other_host)
        assert not advice.host_decides and advice.peak > 1
        assert advice.band is None and advice.peak_edge is None  # no band or edge for a batch that does not fit


def test_a_measured_step_excludes_a_host_cost():
    with pytest.raises(UsageError, match="^host_seconds: a measured plain step") as error:
        Setup("qwen3-30b-a3b", "qwen3-0.6b", "H100", host_seconds=3.8e-3, step_seconds=12e-3)
    assert error.value.argument == "host_seconds"


def test_the_frame_says_which_rows_fit(qwen3):
    long = recommend(Setup("qwen3-30b-a3b", "qwen3-0.6b", "H100"), [1, 256], [2], "alpha", [0.8])
    assert long.fits.tolist() == [True, False] and all(advice.judged for advice in long.advice)
    assert long.frame.groupby("batch_size")["fits"].all().to_dict() == {1: True, 256: False}
    assert qwen3.frame["fits"].all()


def _fitting_batch_sizes(setup, batch_sizes, **change):
    """How many of ``batch_sizes`` fit the target's GPUs once ``change`` is made to ``setup``."""
    changed = dataclasses.replace(setup, **change)
    return int((memory_fit(changed, batch_sizes)["target_bytes"] <= setup.hardware.memory_bytes).sum())


def test_memory_advice_is_only_what_makes_more_batch_sizes_fit():
    """DeepSeek-V3's MLA cache is copied to every GPU under tensor parallelism: at 200k tokens no --tp fits more,
    attention data-parallel over two or more nodes does (each checked again), and H200 has no 4-bit tensor cores
    for a 4-bit dtype to be suggested."""
    setup, batch = Setup("deepseek-v3", "deepseek-v3-mtp", "H200", tp=8, dtype="fp8", context=200_000), [1, 64, 256]
    answer = recommend(setup, batch, [1, 2], "alpha", [0.8])
    (short,) = answer.shortfalls
    assert short.holds_draft and short.more_gpus == () and short.smaller_dtypes == () and short.shorter_context
    assert short.dp_attention_gpus[0] == 16
    now = int(answer.fits.sum())
    for tp in short.dp_attention_gpus:
        assert _fitting_batch_sizes(setup, batch, tp=tp, dp_attention=True) > now
    assert _fitting_batch_sizes(setup, batch, tp=16) == now  # why no plain --tp is suggested
    assert _fitting_batch_sizes(setup, batch, context=0) > now


def test_a_4_bit_dtype_is_suggested_only_where_the_gpu_has_its_tensor_cores():
    """Qwen3-235B on two GPUs: fp8 (235 GB) fits two B200s, not two H100s; MXFP4 and NVFP4 only where the GPU
    has FP4 tensor cores (B200), W4A8 where it has fp8 ones."""
    kept = {}
    for hardware in ("H100", "B200"):
        answer = recommend(Setup("qwen3-235b-a22b", "qwen3-0.6b", hardware, tp=2, context=8192), [1, 64], [2],
                           "alpha", [0.8])
        kept[hardware] = answer.shortfalls[0].smaller_dtypes
    assert kept == {"H100": ("w4a8",), "B200": ("fp8", "w4a8", "mxfp4", "nvfp4")}


def test_a_draft_head_runs_on_the_target_gpus_unless_told_otherwise():
    """draft_tp None: the target's tp for an MTP or EAGLE head, 1 for a separate draft model, as predict_sd."""
    def advise(*pair, **deployment):
        return recommend(Setup(*pair, **deployment), [1, 8], [2], "alpha", [0.8])

    head = advise("deepseek-v3", "deepseek-v3-mtp", "H200", tp=8, dtype="fp8")
    alone = advise("deepseek-v3", "deepseek-v3-mtp", "H200", tp=8, dtype="fp8", draft_tp=1)
    separate = advise("qwen3-30b-a3b", "qwen3-0.6b", "H100", tp=2)
    eagle = advise("qwen3-30b-a3b", "qwen3-30b-a3b-eagle3", "H100", tp=2)
    assert (head.draft_tp, alone.draft_tp, separate.draft_tp, eagle.draft_tp) == (8, 1, 1, 2)
    expected = predict_sd(Setup("deepseek-v3", "deepseek-v3-mtp", "H200", tp=8, draft_tp=8, dtype="fp8",
                                context=1024), [1, 8], 2, alpha=0.8)
    np.testing.assert_allclose(head.frame["speedup"], expected["speedup"], rtol=1e-12)
    assert not np.allclose(alone.frame["speedup"], head.frame["speedup"])


def test_tree_dtype_and_step_options_reach_predict_sd():
    setup = Setup("qwen3-30b-a3b", "qwen3-30b-a3b-eagle3", "H100", tp=2, dtype="bf16", draft_dtype="fp8",
                  draft_topk=4, verify_tokens=16, context=512, engine="sglang", step_seconds=12e-3, step_batch_size=8)
    answer = recommend(setup, [1, 8], [4], "alpha", [0.7])
    expected = predict_sd(setup, [1, 8], 4, alpha=0.7)
    np.testing.assert_allclose(answer.frame["speedup"], expected["speedup"], rtol=1e-12)
    chain = recommend(Setup("qwen3-30b-a3b", "qwen3-30b-a3b-eagle3", "H100", tp=2, context=512, engine="sglang",
                            step_seconds=6e-3), [1, 8], [4], "alpha", [0.7])
    assert not np.allclose(chain.frame["speedup"], answer.frame["speedup"])


def test_an_engine_profile_holds_the_host_cost():
    """With a profile the draft's steps are the profile's, so a host cost per forward pass would charge the target
    alone: refused, and the advice is not re-checked at vLLM v0's host cost."""
    with pytest.raises(UsageError, match="^host_seconds: an engine profile holds"):
        Setup("qwen3-30b-a3b", "qwen3-0.6b", "H100", engine="sglang", host_seconds=3.8e-3)
    answer = recommend(Setup("qwen3-30b-a3b", "qwen3-0.6b", "H100", engine="sglang"), np.arange(1, 65),
                       np.arange(1, 6), "alpha", [0.6, 0.8])
    for advice in answer.advice:
        assert advice.other_host_ms == 0 and not advice.host_decides
        assert list(advice.on_at_other_host) == list(advice.on)


def test_the_peak_at_an_end_of_the_batch_sizes_asked_is_flagged():
    def edge(batch_sizes):
        return recommend(Setup("qwen3-30b-a3b", "qwen3-0.6b", "H100", tp=2), batch_sizes, [1, 2, 3], "alpha",
                         [0.8]).advice[0]

    largest, smallest = edge([2, 4, 8]), edge([64, 128, 256])
    assert (largest.peak_batch_size, largest.peak_edge) == (8, "largest")
    assert (smallest.peak_batch_size, smallest.peak_edge) == (64, "smallest")
    assert edge([8]).peak_edge is None  # one batch size has no range to extend
    assert edge(np.arange(1, 129)).peak_edge is None  # a peak inside the range asked


def test_the_host_cost_is_checked_both_ways():
    without = recommend(Setup("qwen3-30b-a3b", "qwen3-0.6b", "H100"), [1, 8, 64], [2, 4], "alpha", [0.8])
    with_host = recommend(Setup("qwen3-30b-a3b", "qwen3-0.6b", "H100", host_seconds=3.8e-3), [1, 8, 64], [2, 4],
                          "alpha", [0.8])
    assert without.advice[0].other_host_ms > 0 and with_host.advice[0].other_host_ms == 0
    for answer in (without, with_host):
        advice = answer.advice[0]
        if set(advice.on_at_other_host) != set(advice.on):  # where SD is on moves: the host cost decides
            assert advice.host_decides
    assert with_host.advice[0].peak < without.advice[0].peak  # host cost only slows SD's extra forwards down
    assert without.vocabularies[0] == without.vocabularies[1] and not without.draft_head


def test_the_host_cost_decides_where_sd_turns_on_at_the_margin(qwen3):
    """At alpha 0.9, a serving engine's host cost moves where SD is on; where SD is off at every batch size either
    way (alpha 0.6), it does not decide."""
    decided, settled = qwen3.advice[1], qwen3.advice[0]
    assert decided.host_decides and set(decided.on_at_other_host) < set(decided.on)
    assert not settled.host_decides and len(settled.on) == len(settled.on_at_other_host) == 0


def test_recommend_prices_a_shipped_router_by_name_as_its_popularity():
    """``routing="olmoe/github"`` reaches every prediction recommend makes, as the same popularity passed as an array
    does, and a skewed router changes the speedups (fewer experts per decode step) while uniform leaves them."""
    from moesd.predictor.models import resolve_model
    from moesd.routing import sources

    setup = Setup("qwen2-57b-a14b", "qwen2-0.5b", "H100", tp=2)
    layers = resolve_model("qwen2-57b-a14b").moe_layers
    by_name = recommend(setup, [1, 8, 32], [3], "alpha", [0.8], routing="olmoe/github").frame
    by_array = recommend(setup, [1, 8, 32], [3], "alpha", [0.8],
                         routing=sources.popularity("olmoe/github", layers)).frame
    uniform = recommend(setup, [1, 8, 32], [3], "alpha", [0.8]).frame
    pd.testing.assert_frame_equal(by_name, by_array)
    assert not np.allclose(by_name["speedup"], uniform["speedup"])
    assert (by_name["t_target_1"] <= uniform["t_target_1"] * (1 + 1e-12)).all()
