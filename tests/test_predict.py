"""The whole-model performance model: closed forms, limits, monotonicity, Eq. 4, bad input, the CLI."""

import dataclasses
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from moesd._checks import UsageError
from moesd.measure.analysis import measured_device
from moesd.model.calibrate import calibrate
from moesd.theory.experts import expected_active_experts, most_loaded_share
from moesd.predictor.forward import COMPONENTS, step_time, zipf_popularity
from moesd.predictor.kernels import Efficiency, expert_gemm_time, rejection_time
from moesd.predictor.engine import engine_profile
from moesd.predictor.layout import DTYPE_BYTES, tensor_parallel_sizes, weights_per_gpu
from moesd.predictor.memory import memory_fit, memory_per_gpu
from moesd.predictor.models import eagle3_head, one_layer_draft, resolve_model
from moesd.predictor.predict import batch_range, best_gamma, predict_sd
from moesd.predictor.setup import Setup, check_pair
from moesd.paper.predictor_check import PAPER_ORDERINGS, efficiency_to_match, ordering_scan, paper_orderings
from moesd.theory.roofline import HARDWARE, hardware_record
from moesd.theory.speedup import sigma as speedup_sigma
from moesd.theory.speedup import speedup
from moesd.routing.traces import RoutingTrace
from moesd.routing.unions import popularity
from moesd.zoo import get_model

H100 = HARDWARE["H100"]
BANDWIDTH = H100.memory_bandwidth * H100.bandwidth_fraction
KERNEL = Efficiency().kernel_seconds


def test_a_dense_model_at_batch_one_is_its_bytes_over_bandwidth_plus_fixed_costs():
    """Qwen2-0.5B, one token, empty cache: every weight but the embedding lookup is streamed once."""
    spec = get_model("qwen2-0.5b")
    counts, arch = spec.weight_counts(), spec.architecture()
    streamed = counts["total"] - counts["embeddings"] + arch.head_params  # tied: the head is the embedding
    kernels = arch.num_layers * (5 + 4) + 4 + 1  # attention, FFN per layer; head; embedding
    expected = streamed * 2 / BANDWIDTH + kernels * KERNEL
    assert step_time(spec, H100, 1, 1, 0).total == pytest.approx(expected, rel=2e-3)  # activations < 0.2 %


def test_weight_bytes_of_a_decode_step_match_the_analytic_count():
    spec = get_model("opt-30b")
    counts = spec.weight_counts()
    step = step_time(spec, H100, 1, 1, 0)
    weights = sum(step.bytes[c] for c in COMPONENTS) - step.bytes["kv_cache"]
    positions = (2048 + 2) * 7168  # OPT's learned positions: only the rows of the new tokens are read
    assert weights == pytest.approx((counts["total"] - counts["embeddings"] + 50272 * 7168) * 2 - 0, rel=2e-3)
    assert positions * 2 < 0.002 * weights


def test_experts_equal_to_top_k_reduce_to_a_dense_ffn():
    """E = K: every expert is always active and gets every token, i.e. a dense FFN of width K x d_expert."""
    arch = get_model("qwen2-57b-a14b").architecture()
    all_active = dataclasses.replace(arch, num_experts=8, top_k=8)
    width = 8 * arch.expert_intermediate
    dense = dataclasses.replace(arch, num_experts=0, top_k=0, moe_layers=0, shared_params=0, router_params=0,
                                dense_ffn_params=3 * arch.hidden_size * width)
    B = np.array([1, 4, 64, 1024])
    moe, ffn = step_time(all_active, H100, 1, B), step_time(dense, H100, 1, B)
    np.testing.assert_allclose(moe.flops["routed_experts"], ffn.flops["dense_ffn"], rtol=1e-12)
    weights = arch.moe_layers * 3 * arch.hidden_size * width * 2
    # activations: each token's d inputs and 2 w outputs of the first product, w inputs and d outputs of the second
    activations = B * 8 * (2 * arch.hidden_size + 3 * arch.expert_intermediate) * 2 * arch.moe_layers
    np.testing.assert_allclose(moe.bytes["routed_experts"] - activations, weights, rtol=1e-12)


def test_routed_expert_traffic_follows_eq8_and_saturates():
    arch = get_model("qwen2-57b-a14b").architecture()
    B = np.array([1, 2, 8, 32, 4096])
    step = step_time(arch, H100, 1, B)
    per_expert = 3 * arch.hidden_size * arch.expert_intermediate * 2 * arch.moe_layers
    activations = B * 8 * (2 * arch.hidden_size + 3 * arch.expert_intermediate) * 2 * arch.moe_layers
    loaded = (step.bytes["routed_experts"] - activations) / per_expert
    np.testing.assert_allclose(loaded, expected_active_experts(B, 64, 8), rtol=1e-9)
    assert loaded[0] == pytest.approx(8) and loaded[-1] == pytest.approx(64)


@pytest.mark.parametrize("name, tp", [("qwen2-57b-a14b", 4), ("deepseek-v3", 8), ("opt-30b", 8), ("gpt-oss-120b", 8)])
def test_step_time_grows_with_batch_size_tokens_and_context(name, tp):
    B = np.arange(1, 513)
    times = step_time(name, "H200", 1, B, 512, tp=tp).total
    assert (np.diff(times) >= 0).all()
    contexts = np.array([0, 128, 1024, 8192, 65536])
    assert (np.diff(step_time(name, "H200", 1, 16, contexts, tp=tp).total) > 0).all()
    assert (np.diff(step_time(name, "H200", np.arange(1, 9), 16, 512, tp=tp).total) >= 0).all()


def test_tensor_parallelism_halves_the_weight_streaming_time():
    """OPT-30b, one token: attention, FFN and head weights split evenly over two GPUs (56 KV heads)."""
    parts = ("attention", "dense_ffn", "lm_head")
    one, two = (step_time("opt-30b", H100, 1, 1, 0, tp=tp) for tp in (1, 2))
    assert sum(two.bytes[p] for p in parts) / sum(one.bytes[p] for p in parts) == pytest.approx(0.5, rel=1e-3)
    fixed = (48 * (5 + 4) + 4) * KERNEL  # kernels do not split
    ratio = (sum(two.seconds[p] for p in parts) - fixed) / (sum(one.seconds[p] for p in parts) - fixed)
    assert ratio == pytest.approx(0.5, rel=2e-3)
    assert two.seconds["communication"] > 0 == one.seconds["communication"]


def test_kv_heads_are_replicated_not_split_below_one_per_gpu():
    """Qwen3-30B-A3B has 4 KV heads (and 32 query heads): beyond tp = 4 every GPU keeps a whole one."""
    bytes_at = {tp: step_time("qwen3-30b-a3b", "H100", 1, 8, 4096, tp=tp).bytes["kv_cache"] for tp in (1, 2, 4, 8)}
    assert bytes_at[2] == pytest.approx(bytes_at[1] / 2) and bytes_at[4] == pytest.approx(bytes_at[1] / 4)
    assert bytes_at[8] == pytest.approx(bytes_at[4])


def test_expert_parallelism_loads_the_most_loaded_gpus_experts():
    """TP splits every activated expert's width 8 ways (N / 8 experts' weights per GPU); EP deals whole experts
    and the step waits for the GPU holding the most activated ones."""
    spec = get_model("deepseek-v3").architecture()
    B = np.array([1, 8, 64, 4096])
    one = step_time(spec, "H200", 1, B, 0, tp=8)
    ep = step_time(spec, "H200", 1, B, 0, tp=8, ep=8)
    assert ep.flops["routed_experts"] == pytest.approx(one.flops["routed_experts"])
    d, w, layers = spec.hidden_size, spec.expert_intermediate, spec.moe_layers
    tp_activations = B * spec.top_k * (2 * d + 3 * w / 8) * 2 * layers  # every token, an eighth of each width
    ep_activations = B * spec.top_k / 8 * (2 * d + 3 * w) * 2 * layers  # an eighth of the tokens, whole widths
    N = expected_active_experts(B, spec.num_experts, spec.top_k)
    ratio = (ep.bytes["routed_experts"] - ep_activations) / (one.bytes["routed_experts"] - tp_activations)
    np.testing.assert_allclose(ratio, most_loaded_share(N, spec.num_experts, 8) / (N / 8), rtol=1e-9)
    assert ratio[0] > 2 and ratio[-1] == pytest.approx(1)  # one token: 2.5 experts on the busiest GPU, not 1


def test_expert_gemm_time_is_a_roofline_plus_a_fixed_cost():
    eff = Efficiency(kernel_seconds=3e-6)
    memory = expert_gemm_time(H100, 10, 1, 1000, 2000, "bf16", eff)
    assert memory == pytest.approx(10 * 1000 * 2000 * 2 / BANDWIDTH + 10 * 3000 * 2 / BANDWIDTH + 3e-6)
    compute = expert_gemm_time(H100, 2, 100_000, 1000, 1000, "bf16", eff)
    assert compute == pytest.approx(2 * 2 * 100_000 * 1e6 / (H100.peak_flops * H100.flops_fraction) + 3e-6)
    fp8, bf16 = (expert_gemm_time(H100, 64, 1, 4096, 4096, d, Efficiency(kernel_seconds=0)) for d in ("fp8", "bf16"))
    assert fp8 / bf16 == pytest.approx(0.5, rel=1e-3)
    assert expert_gemm_time(H100, 8, 1, 64, 64, grouped=False, efficiency=eff) > expert_gemm_time(H100, 8, 1, 64, 64,
                                                                                                  efficiency=eff)
    assert DTYPE_BYTES == {"fp32": 4, "bf16": 2, "fp8": 1, "mxfp8": 1 + 1 / 32, "w4a8": 0.5 + 2 / 128,
                           "w4a16": 0.5 + 2 / 128, "mxfp4": 0.5 + 1 / 32, "nvfp4": 0.5625}


def test_popularity_and_callable_routing():
    E, K = 64, 8
    uniform = np.full(E, K / E)
    base = step_time("qwen2-57b-a14b", H100, 1, [1, 8, 64])
    same = step_time("qwen2-57b-a14b", H100, 1, [1, 8, 64], routing=uniform)
    np.testing.assert_allclose(same.total, base.total, rtol=1e-12)
    skew = zipf_popularity(E, K, 1.0)
    assert skew.sum() == pytest.approx(K) and skew.max() <= 1.0 and skew[0] == 1.0
    # by hand: expert 1 capped at 1, the other 7 of K spread as 1 / i: p_i = 7 / (H i), H = sum_{i=2}^{64} 1 / i
    harmonic = sum(1 / i for i in range(2, 65))
    np.testing.assert_allclose(skew[1:4], [7 / (harmonic * i) for i in (2, 3, 4)], rtol=1e-12)
    skewed = step_time("qwen2-57b-a14b", H100, 1, [8, 64], routing=skew)
    assert (skewed.bytes["routed_experts"] < base.bytes["routed_experts"][1:]).all()  # fewer distinct experts
    per_layer = step_time("qwen2-57b-a14b", H100, 1, [8, 64], routing=np.tile(uniform, (28, 1)))
    np.testing.assert_allclose(per_layer.total, base.total[1:], rtol=1e-12)
    fixed = step_time("qwen2-57b-a14b", H100, 1, [8, 64], routing=lambda t: np.full_like(t, 64.0))
    np.testing.assert_allclose(fixed.bytes["routed_experts"], step_time("qwen2-57b-a14b", H100, 1, [4096, 4096])
                               .bytes["routed_experts"] - (4096 - np.array([8, 64])) * 8 * (2 * 3584 + 3 * 2560) * 2 * 28,
                               rtol=1e-9)


def routing_trace(sequences, length, layers=1, num_experts=64, top_k=8, correlated=False, seed=0) -> RoutingTrace:
    """Decode tokens of ``sequences`` sequences; each token draws ``top_k`` distinct experts uniformly, or
    (``correlated``) each sequence draws its experts once and every token of it reuses them."""
    rng = np.random.default_rng(seed)
    draws = sequences if correlated else sequences * length
    ids = np.argsort(rng.random((draws, layers, num_experts)), axis=-1)[..., :top_k]
    if correlated:
        ids = np.repeat(ids, length, axis=0)
    return RoutingTrace(ids, num_experts, sequence=np.repeat(np.arange(sequences), length),
                        position=np.tile(np.arange(length), sequences))


def test_a_trace_of_sequences_that_reuse_their_experts_makes_verification_load_no_new_expert():
    """Perfectly correlated routing (windows model): verifying s tokens per sequence loads the experts of
    one token per sequence, so the routed experts' traffic grows only by the activations."""
    trace = routing_trace(40, 12, layers=2, correlated=True)
    B = np.array([1, 4, 16])
    decode = step_time("qwen2-57b-a14b", H100, 1, B, routing=trace).bytes["routed_experts"]
    verify = step_time("qwen2-57b-a14b", H100, 5, B, routing=trace).bytes["routed_experts"]
    np.testing.assert_allclose(verify - decode, 28 * B * 4 * 8 * (2 * 3584 + 3 * 2560) * 2, rtol=1e-9)
    uniform = step_time("qwen2-57b-a14b", H100, 5, B).bytes["routed_experts"]
    assert (verify < uniform).all()


def test_a_trace_of_independent_uniform_routing_reproduces_eq8():
    trace = routing_trace(400, 40, seed=1)
    for s in (1, 5):
        for model in ("windows", "popularity"):
            got = step_time("qwen2-57b-a14b", H100, s, [1, 4, 16], routing=trace, routing_model=model)
            want = step_time("qwen2-57b-a14b", H100, s, [1, 4, 16])
            np.testing.assert_allclose(got.bytes["routed_experts"], want.bytes["routed_experts"], rtol=0.03)


def test_a_trace_read_as_popularity_equals_its_popularity_vector():
    trace = routing_trace(30, 20, correlated=True, seed=2)
    shares = popularity(trace)["probability"].to_numpy()
    got = step_time("qwen2-57b-a14b", H100, [1, 3, 5], 8, routing=trace, routing_model="popularity")
    want = step_time("qwen2-57b-a14b", H100, [1, 3, 5], 8, routing=shares)
    np.testing.assert_allclose(got.total, want.total, rtol=1e-12)


def test_routing_traces_reach_the_speedup():
    """Correlated routing makes verification cheaper below T_thres: higher target efficiency and speedup than
    Eq. 8 at small B, and the frame still satisfies Eq. 4."""
    trace = routing_trace(60, 12, layers=2, correlated=True, seed=3)
    setup = Setup("qwen2-57b-a14b", "qwen2-0.5b", "H800", tp=2, context=256)
    routed = predict_sd(setup, [1, 4, 16], 4, 0.9, routing=trace)
    uniform = predict_sd(setup, [1, 4, 16], 4, 0.9)
    assert (routed["target_efficiency"] > uniform["target_efficiency"]).all()
    assert (routed["speedup"] > uniform["speedup"]).all()
    expected = speedup(routed["sigma"], routed["gamma"], routed["t_target_1"], routed["t_target_gamma"],
                       routed["t_draft"], routed["t_reject"])
    np.testing.assert_allclose(routed["speedup"], expected, rtol=1e-12)


def test_predict_sd_satisfies_eq4_and_has_the_sweep_columns():
    frame = predict_sd(Setup("qwen2-57b-a14b", "qwen2-0.5b", "H800", tp=2, context=256),
                       [1, 16, 64], [2, 4], [0.8, 0.9])
    assert len(frame) == 3 * 2 * 2
    for column in ("batch_size", "gamma", "sigma", "t_target_1", "t_target_gamma", "t_draft", "target_efficiency",
                   "speedup", "tokens_per_round", "verify_term", "draft_term", "reject_term", "t_reject"):
        assert column in frame.columns
    independent = speedup(frame["sigma"], frame["gamma"], frame["t_target_1"], frame["t_target_gamma"],
                          frame["t_draft"], frame["t_reject"])
    np.testing.assert_allclose(frame["speedup"], independent, rtol=1e-12)
    by_hand = frame["sigma"] * (frame["gamma"] + 1) / (
        frame["t_target_gamma"] / frame["t_target_1"] + frame["gamma"] * frame["t_draft"] / frame["t_target_1"]
        + frame["t_reject"] / frame["t_target_1"])
    np.testing.assert_allclose(frame["speedup"], by_hand, rtol=1e-12)
    verify = step_time("qwen2-57b-a14b", "H800", frame["gamma"] + 1, frame["batch_size"], 256, tp=2).total
    np.testing.assert_allclose(frame["t_target_gamma"], verify, rtol=1e-12)
    gamma_only = predict_sd(Setup("qwen2-57b-a14b", "qwen2-0.5b", "H800", tp=2, context=256, verify_tokens="gamma"),
                            16, 4, 0.9)
    assert gamma_only["t_target_gamma"].iloc[0] == pytest.approx(
        step_time("qwen2-57b-a14b", "H800", 4, 16, 256, tp=2).total)


def test_alpha_sets_sigma_per_gamma_by_eq5():
    from moesd.theory.speedup import sigma

    frame = predict_sd(Setup("qwen2-57b-a14b", "qwen2-0.5b", "H800", tp=2, context=512), [8, 32], [1, 3, 5], alpha=0.8)
    np.testing.assert_allclose(frame["sigma"], sigma(0.8, frame["gamma"]), rtol=1e-12)
    with pytest.raises(ValueError, match="^sigma: give either"):
        predict_sd(Setup("qwen2-57b-a14b", "qwen2-0.5b", "H800", context=512), 8, 4, 0.9, alpha=0.8)


def test_one_layer_draft_and_weights_per_gpu():
    draft = one_layer_draft("deepseek-v3")
    assert draft.num_layers == draft.moe_layers == 1
    counts = draft.weight_counts()
    assert counts["routed_experts"] == 256 * 3 * 7168 * 2048
    total = get_model("deepseek-v3").weight_counts()["total"]
    # bytes, not parameters: the DeepSeek-V3 card's 671B in bf16 on one GPU; over 8 GPUs a little more than
    # an eighth each, since every GPU holds the parts below
    assert weights_per_gpu("deepseek-v3", "bf16", 1) == 2 * total == pytest.approx(2 * 671e9, rel=0.001)
    assert 2 * 671e9 / 8 < weights_per_gpu("deepseek-v3", "bf16", 8) < 1.02 * 2 * 671e9 / 8
    # On every GPU, by hand from the config: MLA's latent projections and their norms in each of 61 layers
    # (7168 x 1536 + 1536 + 7168 x (512 + 64) + 512), the router of each of 58 MoE layers (256 x 7168), two
    # norms per layer and the final norm (7168 each): seven copies more on eight GPUs than on one.
    replicated = 61 * (7168 * 1536 + 1536 + 7168 * (512 + 64) + 512) + 58 * 256 * 7168 + (2 * 61 + 1) * 7168
    assert 8 * weights_per_gpu("deepseek-v3", "bf16", 8) - weights_per_gpu("deepseek-v3", "bf16", 1) == \
        pytest.approx(2 * 7 * replicated, rel=1e-12)
    # fp8 saves a byte per weight except on the router, the embedding and LM head (129280 x 7168 each), the norms
    kept = 58 * 256 * 7168 + 2 * 129280 * 7168 + (2 * 61 + 1) * 7168
    assert weights_per_gpu("deepseek-v3", "bf16", 1) - weights_per_gpu("deepseek-v3", "fp8", 1) == total - kept


def test_moe_speedup_rises_then_falls_and_the_dense_pair_only_falls():
    B = np.arange(1, 257)
    moe = predict_sd(Setup("qwen2-57b-a14b", "qwen2-0.5b", "H800", tp=2, context=256), B, 4, 0.9)
    peak = int(moe["speedup"].idxmax())
    assert 0 < peak < len(B) - 1 and moe["speedup"].iloc[peak] > 1.3 * moe["speedup"].iloc[0]
    dense = predict_sd(Setup("opt-30b", "opt-350m", "A800", tp=2, context=256), B, 4, 0.9)
    assert (np.diff(dense["speedup"]) <= 1e-12).all() and (np.diff(dense["target_efficiency"]) <= 1e-12).all()


def test_best_gamma_and_batch_range():
    frame = predict_sd(Setup("qwen2-57b-a14b", "qwen2-0.5b", "H800", tp=2, context=512),
                       np.arange(1, 129), [1, 2, 3, 4], 0.9)
    best = best_gamma(frame)
    most = frame.groupby("batch_size")["speedup"].max().to_numpy()
    assert len(best) == 128 and (best["speedup"].to_numpy() >= most - 1e-15).all()
    low, high, peak, at = batch_range(frame)
    assert low <= at <= high and peak == pytest.approx(frame["speedup"].max())
    # by hand: best per B is 1.2, 1.5, 2.0, 1.5; above 2 / sqrt(2) = 1.414 from B = 2 to 4, peak 2.0 at B = 3
    hand = pd.DataFrame({"batch_size": [1, 1, 2, 2, 3, 3, 4, 4], "gamma": [1, 2] * 4,
                         "speedup": [1.0, 1.2, 1.5, 1.4, 2.0, 1.9, 1.3, 1.5]})
    assert batch_range(hand) == (2, 4, 2.0, 3)
    assert batch_range(hand, fraction=0.9) == (3, 3, 2.0, 3)
    assert best_gamma(hand)["gamma"].tolist() == [2, 1, 1, 2]
    # a dip below the threshold ends the run: best per B 1.5, 1.2, 2.0, 1.5, so B = 1 (1.5) lies beyond B = 2 (1.2)
    dip = pd.DataFrame({"batch_size": [1, 2, 3, 4], "gamma": [1] * 4, "speedup": [1.5, 1.2, 2.0, 1.5]})
    assert batch_range(dip) == (3, 4, 2.0, 3)


def test_the_paper_band_stops_where_sd_stops_paying_and_is_absent_below_one():
    """peak 1.3: 1.3 / sqrt(2) = 0.92, so B = 1 (0.95) and B = 4 (1.0) are within x / sqrt(2) but SD loses there."""
    low = pd.DataFrame({"batch_size": [1, 2, 3, 4], "gamma": [1] * 4, "speedup": [0.95, 1.1, 1.3, 1.0]})
    assert batch_range(low) == (2, 3, 1.3, 3)
    never = low.assign(speedup=[0.5, 0.7, 0.9, 1.0])
    assert batch_range(never) == (None, None, 1.0, 4)


def test_a_grid_of_ten_thousand_points_is_one_call():
    frame = predict_sd(Setup("deepseek-v3", "deepseek-v3-mtp", "H200", tp=8, context=512),
                       np.arange(1, 2001), np.arange(1, 6), 0.8)
    assert len(frame) == 10_000 and np.isfinite(frame["speedup"]).all()
    grid = frame.set_index(["batch_size", "gamma"])
    for B, gamma in ((1, 1), (1000, 3), (2000, 5)):  # each grid point is the point computed alone
        alone = predict_sd(Setup("deepseek-v3", "deepseek-v3-mtp", "H200", tp=8, context=512), B, gamma, 0.8).iloc[0]
        for column in ("t_target_1", "t_target_gamma", "t_draft", "speedup"):
            assert grid.loc[(B, gamma), column] == pytest.approx(alone[column], rel=1e-12)


def test_efficiency_to_match_closes_the_gap():
    setup = Setup("qwen2-57b-a14b", "qwen2-0.5b", "H800", tp=2, context=256)
    step = efficiency_to_match(2.0, setup, np.arange(1, 129), 4, 0.9)
    frame = predict_sd(setup, np.arange(1, 129), 4, 0.9, efficiency=Efficiency(step_seconds=step))
    assert frame["speedup"].max() == pytest.approx(2.0, rel=1e-4) and step > 0
    with pytest.raises(ValueError, match="not reached"):
        efficiency_to_match(100.0, setup, [1, 8], 4, 0.9)


def test_measured_device_reads_the_sidecar_roofline_as_the_sweeps_dtype():
    record = dataclasses.replace(HARDWARE["CPU"], name="measured", peak_flops=1e11, memory_bandwidth=4e10,
                                 fp32_flops=None)
    sidecar = {"hardware": record.as_dict(), "roofline_measurement": {"settings": {"dtype": "float32"}}}
    device = measured_device(sidecar)
    assert device.fp32_flops == device.peak_flops == 1e11 and device.memory_bandwidth == 4e10
    assert step_time("qwen2-0.5b", device, 1, 1, dtype="fp32").total > 0
    with pytest.raises(ValueError, match="no measured roofline"):
        measured_device({"device": "cpu"})


def test_paper_orderings_at_equal_sigma_compare_the_cost_of_a_round():
    """x orders two setups printed with different sigma one way, the cost of a round sigma (gamma + 1) / x the other."""
    rows = []
    for device, sigma, printed, predicted in (("2xH800", 0.90, 2.20, 3.0), ("2xA800", 0.95, 2.25, 3.2)):
        rows.append({"device": device, "dataset": "humaneval", "temperature": 0.0, "gamma": 4, "sigma": sigma,
                     "printed": printed, "printed_denominator": sigma * 5 / printed, "predicted": predicted})
    table = paper_orderings(pd.DataFrame(rows)).set_index("better").loc["2xH800"]
    assert table["pairs"] == 1 and table["printed_holds"] == 0 and table["predicted_holds"] == 0
    assert table["printed_holds_at_equal_sigma"] == 1  # 4.5 / 2.20 = 2.05 < 4.75 / 2.25 = 2.11
    assert table["predicted_holds_at_equal_sigma"] == 0  # 4.5 / 3.0 = 1.50 > 4.75 / 3.2 = 1.48

    assert table["printed_p_value"] == 0.5  # one pair holding of one: a coin's chance


def test_the_print_s_support_is_a_one_sided_sign_test_by_hand():
    """Tables 1-2 at equal sigma: 7, 10 and 11 of 12 pairs hold; P(at least k of 12 | 1/2) summed by hand."""
    from moesd.paper.predictor_check import paper_comparison

    table = paper_orderings(paper_comparison(match=False)).set_index("better")
    assert table["printed_holds_at_equal_sigma"].tolist() == [7, 10, 11] and (table["pairs"] == 12).all()
    by_hand = [(792 + 495 + 220 + 66 + 12 + 1) / 4096, (66 + 12 + 1) / 4096, (12 + 1) / 4096]
    assert table["printed_p_value"].tolist() == pytest.approx(by_hand, rel=1e-12)


def test_the_signed_rank_test_weighs_each_pair_by_its_difference():
    """Three pairs, the cost of a round lower on the H800 in two; the A800's one win the smallest difference.
    Sign test: P(at least 2 of 3) = 4/8. Signed ranks 2 + 3 = 5 of the 8 equally likely sums of subsets of
    {1, 2, 3} (0, 1, 2, 3, 3, 4, 5, 6): P(W >= 5) = 2/8."""
    rows = []
    for gamma, h800, a800 in ((2, 1.90, 2.00), (3, 1.80, 2.00), (4, 2.02, 2.00)):  # denominators sigma (gamma+1)/x
        for device, denominator in (("2xH800", h800), ("2xA800", a800)):
            rows.append({"device": device, "dataset": "humaneval", "temperature": 0.0, "gamma": gamma, "sigma": 0.9,
                         "printed": 0.9 * (gamma + 1) / denominator, "printed_denominator": denominator,
                         "predicted": 3.0})
    table = paper_orderings(pd.DataFrame(rows)).set_index("better").loc["2xH800"]
    assert table["printed_holds_at_equal_sigma"] == 2
    assert table["printed_p_value"] == pytest.approx(4 / 8) and table["printed_signed_rank_p"] == pytest.approx(2 / 8)
    assert table["printed_mean_log_gain"] == pytest.approx(np.log(2.00 * 2.00 * 2.00 / (1.90 * 1.80 * 2.02)) / 3)


def test_ordering_scan_counts_what_paper_orderings_counts():
    from moesd.paper.predictor_check import paper_comparison

    efficiency = Efficiency(step_seconds=2e-3)
    scan = ordering_scan({"default": None, "host": efficiency})
    for label, option in (("default", None), ("host", efficiency)):
        frame = paper_comparison(match=False, efficiency=option)
        orderings = paper_orderings(frame)
        counts = [scan.loc[f"{r.better} > {r.worse} (of {r.pairs})", label] for r in orderings.itertuples()]
        assert counts == orderings["predicted_holds_at_equal_sigma"].tolist()
        every = sum(count == pairs for count, pairs in zip(counts, orderings["pairs"]))
        assert scan.loc["orderings holding in every pair", label] == every <= len(PAPER_ORDERINGS)
        ratio = (frame["predicted"] / frame["printed"]).median()
        assert scan.loc["median predicted / printed", label] == pytest.approx(ratio)
        assert scan.loc["peak B, 2xH800", label] == int(frame.loc[frame["device"] == "2xH800", "peak_B"].median())


def test_calibrate_recovers_known_parameters_and_holds_out_batch_sizes():
    arch = get_model("qwen2-57b-a14b").architecture(num_layers=2, width=1 / 8)
    truth = Efficiency(bandwidth_fraction=0.6, flops_fraction=0.4, step_seconds=1e-3, expert_seconds=1.5e-4)
    B = np.repeat(np.array([1, 2, 4, 8, 16, 32, 64, 100]), 3)
    s = np.tile([1, 3, 5], 8)
    seconds = step_time(arch, "CPU", s, B, 64, dtype="fp32", efficiency=truth, grouped_experts=False).total
    frame = pd.DataFrame({"role": "target", "batch_size": B, "tokens": s, "context": 64, "seconds": seconds})
    result = calibrate(frame, arch, "CPU")
    assert result.held_out_batch_sizes == (2, 16, 100)
    assert result.held_out_mape < 1e-3 and result.train_mape < 1e-3
    assert set(result.fitted) == {"bandwidth_fraction", "flops_fraction", "step_seconds", "expert_seconds"}
    for name, value in result.fitted.items():
        assert value == pytest.approx(getattr(truth, name), rel=1e-2)


@pytest.mark.parametrize("call, name", [
    (lambda: step_time("qwen2-57b-a14b", "H100", 0, 1), "tokens_per_sequence"),
    (lambda: step_time("qwen2-57b-a14b", "H100", 1, 0), "batch_size"),
    (lambda: step_time("qwen2-57b-a14b", "H100", 1, 1.5), "batch_size"),
    (lambda: step_time("qwen2-57b-a14b", "H100", 1, 1, -1), "context"),
    (lambda: step_time("qwen2-57b-a14b", "H100", 1, 1, tp=0), "tp"),
    (lambda: step_time("qwen2-57b-a14b", "H100", 1, 1, tp=4, ep=3), "ep"),
    (lambda: step_time("qwen2-57b-a14b", "H100", 1, 1, dtype="int4"), "dtype"),
    (lambda: step_time("qwen2-57b-a14b", "H200", 1, 1, dtype="fp32", tp=1), None),
    (lambda: step_time("qwen2-57b-a14b", "B200", 1, 1, dtype="fp32"), "dtype"),
    (lambda: step_time("qwen2-57b-a14b", "CPU", 1, 1, tp=2), "tp"),
    (lambda: step_time("qwen2-57b-a14b", "H100", 1, 1, top_k=65), "top_k"),
    (lambda: step_time("opt-30b", "H100", 1, 1, top_k=2), "top_k"),
    (lambda: step_time("qwen2-57b-a14b", "H100", 1, 1, routing=np.ones(63) / 63 * 8), "routing"),
    (lambda: step_time("qwen2-57b-a14b", "H100", 1, 1, routing=lambda t: t * 0 - 1), "routing"),
    (lambda: step_time("opt-30b", "H100", 1, 1, routing=np.ones(8)), "routing"),
    (lambda: step_time("qwen2-57b-a14b", "H100", 1, 1, routing=routing_trace(4, 4, num_experts=60)), "routing"),
    (lambda: step_time("qwen2-57b-a14b", "H100", 6, 1, routing=routing_trace(4, 4)), "routing"),
    (lambda: step_time("qwen2-57b-a14b", "H100", 1, 1, routing=routing_trace(4, 4), top_k=4), "top_k"),
    (lambda: step_time("qwen2-57b-a14b", "H100", 1, 1, routing_model="measured"), "routing_model"),
    (lambda: step_time("gpt-9", "H100", 1, 1), "model"),
    (lambda: step_time("qwen2-57b-a14b", "TPU", 1, 1), "hardware"),
    (lambda: expert_gemm_time("H100", -1, 1, 8, 8), "experts"),
    (lambda: expert_gemm_time("H100", 1, -1, 8, 8), "tokens_per_expert"),
    (lambda: expert_gemm_time("H100", 1, 1, 0, 8), "in_features"),
    (lambda: expert_gemm_time("H100", 1, 1, 8, 8.5), "out_features"),
    (lambda: rejection_time("H100", 1, 0, 100), "gamma"),
    (lambda: Efficiency(bandwidth_fraction=0), "bandwidth_fraction"),
    (lambda: Efficiency(kernel_seconds=-1), "kernel_seconds"),
    (lambda: predict_sd(Setup("qwen2-57b-a14b", "qwen2-0.5b", "H100", context=512), 8, 4, 0.1), "sigma"),
    (lambda: predict_sd(Setup("qwen2-57b-a14b", "qwen2-0.5b", "H100", context=512), 8, 0, 0.9), "gamma"),
    (lambda: predict_sd(Setup("qwen2-57b-a14b", "qwen2-0.5b", "H100", context=512), 8, 4, 1.5), "sigma"),
    (lambda: predict_sd(Setup("qwen2-57b-a14b", "qwen2-0.5b", "H100", verify_tokens="all", context=512),
                        8, 4, 0.9), "verify_tokens"),
    (lambda: predict_sd(Setup("qwen2-57b-a14b", "qwen2-0.5b", "H100", draft_tp=0, context=512), 8, 4, 0.9), "draft_tp"),
    (lambda: best_gamma(pd.DataFrame({"x": [1]})), "frame"),
    (lambda: efficiency_to_match(2, Setup("qwen2-57b-a14b", "qwen2-0.5b", "H100", context=512),
                                 8, 4, 0.9, field="x"), "field"),
    (lambda: calibrate(pd.DataFrame({"role": ["target"]}), "qwen2-0.5b", "CPU"), "forward_frame"),
])
def test_bad_input_names_the_argument(call, name):
    if name is None:  # a valid call (H200 has an fp32 peak on record)
        call()
        return
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        call()


def test_predict_does_not_import_torch():
    code = "import sys, moesd.predictor.predict; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_cli_prints_the_best_gamma_per_batch_size(capsys, tmp_path):
    from moesd.cli import main

    out = tmp_path / "p.csv"
    main(["predict", "--target", "deepseek-v3", "--draft", "deepseek-v3-mtp", "--hardware", "H200", "--tp", "8",
          "--draft-tp", "8", "--gamma", "1-5", "--sigma", "0.8", "--batch", "1-64", "--csv", str(out)])
    printed = capsys.readouterr().out
    assert "best gamma" in printed and "peak speedup" in printed
    frame = pd.read_csv(out)
    assert len(frame) == 64 * 5 and set(frame["gamma"]) == {1, 2, 3, 4, 5}


def test_memory_per_gpu_is_weights_and_the_kv_cache_by_hand():
    """Qwen2-57B-A14B: 28 layers x 4 KV heads x 128 values per head, keys and values, 2 bytes each, split
    over 2 GPUs: 28 672 bytes per cached token per GPU."""
    weights = weights_per_gpu("qwen2-57b-a14b", "bf16", 2)
    held = memory_per_gpu("qwen2-57b-a14b", "H800", [1, 10], [0, 1000], tp=2)
    assert held.tolist() == pytest.approx([weights, weights + 10 * 1000 * 28 * 4 * 128 * 2 * 2 / 2])


def test_cli_says_when_a_setup_does_not_fit(capsys):
    from moesd.cli import main

    deepseek = ["predict", "--target", "deepseek-v3", "--draft", "deepseek-v3-mtp", "--hardware", "H200", "--tp", "8",
                "--draft-tp", "1"]
    main(deepseek)  # bf16: 671e9 x 2 bytes / 8 GPUs = 168 GB of weights alone against 141 GB
    assert "No batch size fits" in capsys.readouterr().out
    main([*deepseek, "--dtype", "fp8"])  # 85 GB of weights: every B up to 256 fits with 1024 tokens each
    assert "does not fit" not in capsys.readouterr().out
    main([*deepseek, "--dtype", "fp8", "--batch", "1-1024"])
    largest = int(re.search(r"Only B <= (\d+) fits", capsys.readouterr().out).group(1))
    held = memory_per_gpu("deepseek-v3", "H200", [largest, largest + 1], 1024, tp=8, dtype="fp8")
    assert held[0] <= HARDWARE["H200"].memory_bytes < held[1]  # the MTP draft, on a GPU of its own, fits there
    main(["predict", "--target", "qwen3-30b-a3b", "--draft", "qwen3-235b-a22b", "--hardware", "H100", "--batch", "1"])
    printed = capsys.readouterr().out  # the target alone (61 GB in bf16) fits; a 235B draft beside it does not
    assert memory_per_gpu("qwen3-30b-a3b", "H100", 1, 1024) < HARDWARE["H100"].memory_bytes
    assert "the draft's weights and KV cache need" in printed and "the target's weights" not in printed
    assert "No batch size fits" in printed


def test_cli_default_acceptance_is_alpha_so_the_best_gamma_is_a_choice(capsys, tmp_path):
    """sigma(alpha, gamma) of Eq. 5 falls with gamma, so the best gamma is not simply the largest offered;
    --sigma, the same for every gamma, says so in its help."""
    from moesd.cli import main

    out = tmp_path / "p.csv"
    main(["predict", "--target", "qwen3-30b-a3b", "--draft", "qwen3-0.6b", "--hardware", "H100", "--gamma", "1-12",
          "--batch", "1,16,128", "--csv", str(out)])
    frame = pd.read_csv(out)
    assert (frame["alpha"] == 0.8).all()
    np.testing.assert_allclose(frame["sigma"], speedup_sigma(0.8, frame["gamma"]))
    assert best_gamma(frame)["gamma"].max() < 12


def test_cli_host_cost_adds_to_every_forward_and_sd_off_is_said(capsys, tmp_path):
    from moesd.cli import main

    runs = {}
    for host_ms in (0, 5):
        out = tmp_path / f"host{host_ms}.csv"
        main(["predict", "--target", "qwen2-57b-a14b", "--draft", "qwen2-0.5b", "--hardware", "A800", "--tp", "2",
              "--batch", "1,32", "--host-ms", str(host_ms), "--csv", str(out)])
        runs[host_ms] = pd.read_csv(out)
    for column in ("t_target_1", "t_target_gamma", "t_draft"):
        np.testing.assert_allclose(runs[5][column] - runs[0][column], 5e-3, rtol=1e-9)
    capsys.readouterr()
    main(["predict", "--target", "qwen2-57b-a14b", "--draft", "qwen2-0.5b", "--hardware", "A800", "--tp", "2",
          "--batch", "1,32", "--alpha", "0"])  # nothing accepted: a round emits one token and costs more
    printed = capsys.readouterr().out
    assert "SD's error band reaches 1 or below at every one of these batch sizes: leave it off" in printed
    assert re.search(r"\d\s+off\s+\d", printed) and not re.search(r"\d\s+on\s+\d", printed)  # the SD column


def test_cli_stops_quietly_when_its_reader_goes_away():
    """moesd predict ... | head: the pipe's reader closes; exit status 1 and no traceback."""
    import os

    read, write = os.pipe()
    os.close(read)
    done = subprocess.run([sys.executable, "-m", "moesd.cli", "predict", "--target", "qwen2-57b-a14b", "--draft",
                           "qwen2-0.5b", "--hardware", "H800", "--tp", "2"], stdout=write, stderr=subprocess.PIPE)
    os.close(write)
    assert done.returncode == 1 and done.stderr == b""


def test_a_broken_pipe_inside_a_sweep_is_a_failure(monkeypatch):
    """Only the commands that just print stop quietly; a sweep's broken pipe (a worker's, say) propagates."""
    from moesd import cli

    def broken(args):
        raise BrokenPipeError("a worker went away")

    monkeypatch.setattr(cli.sweep, "run", broken)
    with pytest.raises(BrokenPipeError, match="worker"):
        cli.main(["sweep", "forward", "--preset", "cpu"])


@pytest.mark.parametrize("flag, value, match", [("--gamma", "0-2", "--gamma"), ("--batch", "x", "--batch"),
                                                 ("--sigma", "2", "--sigma"), ("--hardware", "TPU", "--hardware"),
                                                 ("--target", "gpt-9", "--target"), ("--tp", "0", "--tp"),
                                                 ("--alpha", "1.5", "--alpha")])
def test_cli_bad_arguments_are_one_line_errors(flag, value, match, capsys):
    from moesd.cli import main

    args = {"--target": "qwen2-57b-a14b", "--draft": "qwen2-0.5b", "--hardware": "H800", "--tp": "2"}
    args[flag] = value
    with pytest.raises(SystemExit) as exit_info:
        main(["predict", *[x for pair in args.items() for x in pair]])
    assert exit_info.value.code == 2
    assert match in capsys.readouterr().err.strip().splitlines()[-1]


def test_tensor_parallel_collectives_count_an_all_reduce_per_sublayer_and_one_after_the_embedding():
    """With a link of unlimited bandwidth only latencies remain: 2 L + 1 all-reduces and one gather of the logits."""
    instant = dataclasses.replace(HARDWARE["H100"], interconnect_bandwidth=1e30)
    spec = get_model("qwen2-57b-a14b")
    step = step_time(spec, instant, 1, 8, tp=2)
    assert step.seconds["communication"] == pytest.approx((2 * 28 + 1 + 1) * instant.interconnect_latency, rel=1e-9)


def test_a_full_mesh_gives_a_small_group_only_its_own_links():
    """MI300X: one 128 GB/s link to each of 7 peers; a pair of GPUs shares one link, a group of eight all seven."""
    mesh = HARDWARE["MI300X"]
    switched = dataclasses.replace(mesh, interconnect_peers=0)
    latency_only = dataclasses.replace(mesh, interconnect_bandwidth=1e30)

    def transfer(hardware, tp):  # seconds of the collectives beyond their latencies
        return (step_time("qwen3-30b-a3b", hardware, 5, 64, tp=tp).seconds["communication"]
                - step_time("qwen3-30b-a3b", latency_only, 5, 64, tp=tp).seconds["communication"])

    assert transfer(mesh, 2) == pytest.approx(7 * transfer(switched, 2), rel=1e-9)
    assert transfer(mesh, 4) == pytest.approx(7 / 3 * transfer(switched, 4), rel=1e-9)
    assert transfer(mesh, 8) == pytest.approx(transfer(switched, 8), rel=1e-9)
    assert transfer(HARDWARE["H100"], 2) > 0 and HARDWARE["H100"].interconnect_peers == 0  # NVSwitch


def test_fp8_weights_leave_router_head_and_norms_in_bf16():
    """DeepSeek-V3's fp8 checkpoint quantises the linear layers only: its router, LM head and norms read as in bf16."""
    fp8, bf16 = (step_time("deepseek-v3", "H200", 1, 16, context=1024, tp=8, dtype=d) for d in ("fp8", "bf16"))
    for part in ("router", "lm_head", "fixed", "kv_cache"):
        assert fp8.bytes[part] == pytest.approx(bf16.bytes[part], rel=1e-12), part
    spec = get_model("deepseek-v3").architecture()
    weights = {d: s.bytes["routed_experts"] - 16 * spec.top_k * (2 * spec.hidden_size + 3 * spec.expert_intermediate / 8)
               * 2 * spec.moe_layers for d, s in (("fp8", fp8), ("bf16", bf16))}
    assert weights["fp8"] == pytest.approx(weights["bf16"] / 2, rel=1e-9)  # the experts themselves are fp8


def test_hardware_is_found_by_name_in_any_case():
    assert hardware_record("h100") is HARDWARE["H100"] and hardware_record("H100") is HARDWARE["H100"]
    with pytest.raises(ValueError, match="hardware must be one of"):
        hardware_record("h1000")


def test_cli_lists_where_sd_is_on_and_marginal_as_unbroken_runs(capsys, tmp_path):
    """The verdict names every run of batch sizes where the low end of the best speedup's error band exceeds
    1 + SD_MARGIN ('on') and where it exceeds 1 by less ('marginal'); the SD column agrees row by row."""
    from moesd.cli import main
    from moesd.predictor.recommend import SD_MARGIN

    out = tmp_path / "p.csv"
    main(["predict", "--target", "qwen1.5-moe-a2.7b", "--draft", "qwen2-0.5b", "--hardware", "H100", "--alpha",
          "0.8", "--batch", "1-24", "--csv", str(out)])  # 24 rows: the table shows every one
    printed = capsys.readouterr().out
    frame = pd.read_csv(out)
    best = frame.loc[frame.groupby("batch_size")["speedup"].idxmax()]
    np.testing.assert_allclose(best["speedup_low"] / best["speedup"], best["speedup_low"].iloc[0] / best["speedup"].iloc[0])

    def listed(sizes):
        runs = np.split(sizes, np.flatnonzero(np.diff(sizes) > 1) + 1)
        return runs, ", ".join(f"{r[0]}" if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)

    on = best.loc[best["speedup_low"] > 1 + SD_MARGIN, "batch_size"].to_numpy()
    marginal = best.loc[(best["speedup_low"] > 1) & (best["speedup_low"] <= 1 + SD_MARGIN), "batch_size"].to_numpy()
    (_, on_text), (_, marginal_text) = listed(on), listed(marginal)
    assert len(on) and len(marginal)
    assert f"at {len(on)} of {len(best)} batch sizes, B = {on_text};" in printed
    assert f"marginal (the band's low end 1-{1 + SD_MARGIN:g}) at B = {marginal_text} " in printed
    rows = {int(line.split()[0]): line.split()[5] for line in printed.splitlines() if re.match(r"\s+\d+\s+\d+\s", line)}
    assert {b for b, sd in rows.items() if sd == "marginal"} == set(marginal.tolist())
    assert {b for b, sd in rows.items() if sd == "on"} == set(on.tolist())


def test_tensor_parallelism_spans_whole_nodes_only_where_a_network_is_on_record():
    """Within a node any size the heads take; beyond it whole nodes, up to max_nodes, where the record has NICs."""
    assert tensor_parallel_sizes("qwen3-30b-a3b", "H100") == [1, 2, 4, 8, 16, 32]  # 32 heads, 4 KV heads
    assert tensor_parallel_sizes("qwen2-0.5b", "H100") == [1, 2]  # 14 heads, 2 KV heads: 7 splits neither way
    assert tensor_parallel_sizes("qwen3-30b-a3b", "CPU") == [1]
    assert tensor_parallel_sizes("deepseek-v3", "H100") == [1, 2, 4, 8, 16, 32, 64, 128]  # 128 heads
    assert tensor_parallel_sizes("deepseek-v3", "H20") == [1, 2, 4, 8]  # no NIC on record
    for tp in (16, 32):  # H20: no inter-node network on record
        with pytest.raises(ValueError, match=r"^tp must be at most 8, .*not modelled\): one of 1, 2, 4, 8 for "
                           r"deepseek-v3, got"):
            step_time("deepseek-v3", "H20", 1, 8, tp=tp)
    with pytest.raises(ValueError, match=r"^tp must be a multiple of 8 beyond one node, .* got 12$"):
        step_time("deepseek-v3", "H100", 1, 8, tp=12)
    with pytest.raises(ValueError, match=r"^tp must be at most 256, 32 nodes of 8 H100 GPUs"):
        step_time("deepseek-v3", "H100", 1, 8, tp=512, dp_attention=True)
    with pytest.raises(ValueError, match=r"got 3; on H100: 1, 2, 4, 8, 16, 32$"):
        step_time("qwen3-30b-a3b", "H100", 1, 8, tp=3)


def test_step_time_accepts_exactly_the_tensor_parallel_sizes_listed():
    """Every model of the zoo on every hardware: tp is refused, with a reason, iff tensor_parallel_sizes omits it."""
    from moesd.zoo import MODELS

    for model in MODELS:
        for name, hardware in HARDWARE.items():
            sizes = tensor_parallel_sizes(model, name)
            for tp in range(1, max(hardware.gpus_per_node, 1) + 2):
                if tp in sizes:
                    step_time(model, name, 1, 1, tp=tp)
                else:
                    with pytest.raises(ValueError, match=r"^tp(: hardware .* has no interconnect| must) "):
                        step_time(model, name, 1, 1, tp=tp)


def test_memory_fit_places_target_and_draft_as_predict_sd_does():
    fit = memory_fit(Setup("deepseek-v3", "deepseek-v3-mtp", "H200", tp=8, draft_tp=1, dtype="fp8"),
                     [1, 100, 1000], 4096)
    target = memory_per_gpu("deepseek-v3", "H200", [1, 100, 1000], 4096, tp=8, dtype="fp8")
    draft = memory_per_gpu("deepseek-v3-mtp", "H200", [1, 100, 1000], 4096, tp=1, dtype="fp8")
    np.testing.assert_array_equal(fit["target_bytes"], target)
    np.testing.assert_array_equal(fit["draft_bytes"], draft)
    capacity = HARDWARE["H200"].memory_bytes
    assert fit["fits"].tolist() == ((target <= capacity) & (draft <= capacity)).tolist() == [True, True, False]
    with pytest.raises(ValueError, match="^draft_tp must equal tp"):
        memory_fit(Setup("deepseek-v3", "deepseek-v3-mtp", "H200", tp=8, draft_tp=1, shared=True), 1, 4096)
    # a draft too large for its one GPU fails every batch size, whatever the target
    assert not memory_fit(Setup("qwen3-30b-a3b", "qwen3-235b-a22b", "H100"), [1, 2], 1024)["fits"].any()


def test_memory_fit_adds_a_head_on_the_target_gpus_to_their_memory():
    """An MTP head at draft_tp = tp (its default) on the target's hardware shares the target's GPUs; a separate
    draft shares them only with shared; on other hardware the draft is checked against that hardware's memory."""
    sizes, capacity = [1, 100, 1000], HARDWARE["H200"].memory_bytes
    target = memory_per_gpu("deepseek-v3", "H200", sizes, 4096, tp=8, dtype="fp8")
    head = memory_per_gpu("deepseek-v3-mtp", "H200", sizes, 4096, tp=8, dtype="fp8")
    together = memory_fit(Setup("deepseek-v3", "deepseek-v3-mtp", "H200", tp=8, dtype="fp8"), sizes, 4096)
    np.testing.assert_array_equal(together["target_bytes"], target + head)
    np.testing.assert_array_equal(together["draft_bytes"], head)
    assert together["fits"].tolist() == (target + head <= capacity).tolist()
    explicit = memory_fit(Setup("deepseek-v3", "deepseek-v3-mtp", "H200", tp=8, draft_tp=8, dtype="fp8", shared=True),
                          sizes, 4096)
    pd.testing.assert_frame_equal(explicit, together)
    apart = memory_fit(Setup("deepseek-v3", "deepseek-v3-mtp", "H200", tp=8, dtype="fp8", draft_hardware="H100"),
                       sizes, 4096)
    np.testing.assert_array_equal(apart["target_bytes"], target)  # not on the target's GPUs: by default one H100
    np.testing.assert_array_equal(apart["draft_bytes"], memory_per_gpu("deepseek-v3-mtp", "H100", sizes, 4096,
                                                                       dtype="fp8"))
    separate = memory_fit(Setup("qwen3-235b-a22b", "qwen3-0.6b", "H200", tp=8), 64, 4096)
    shared = memory_fit(Setup("qwen3-235b-a22b", "qwen3-0.6b", "H200", tp=8, shared=True), 64, 4096)
    assert shared["draft_bytes"].item() == pytest.approx(memory_per_gpu("qwen3-0.6b", "H200", 64, 4096, tp=8).item())
    assert shared["target_bytes"].item() == separate["target_bytes"].item() + shared["draft_bytes"].item()
    with pytest.raises(ValueError, match="^draft_hardware: a draft on the target's GPUs"):
        memory_fit(Setup("qwen3-235b-a22b", "qwen3-0.6b", "H200", tp=8, shared=True, draft_hardware="H100"), 64, 4096)
    # a 30B draft (61 GB in bf16) fits one H200 (141 GB) but not the L40 (48 GB) it is given
    assert memory_fit(Setup("qwen3-235b-a22b", "qwen3-30b-a3b", "H200", tp=8), 1, 1024)["fits"].item()
    on_l40 = memory_fit(Setup("qwen3-235b-a22b", "qwen3-30b-a3b", "H200", tp=8, draft_hardware="L40"), 1, 1024)
    assert not on_l40["fits"].item() and on_l40["draft_bytes"].item() > HARDWARE["L40"].memory_bytes


def test_a_draft_that_cannot_serve_the_target_is_refused():
    """A head of another target (its own named, and both widths), a head as the target, a separate draft of another
    vocabulary; predict_sd and memory_fit refuse what check_pair refuses, and the paper's pairs pass."""
    with pytest.raises(ValueError, match=r"^draft: qwen3-30b-a3b-eagle3 is a draft head of qwen3-30b-a3b and cannot "
                                         r"draft for deepseek-v3 \(hidden size 2048 against deepseek-v3's 7168\)"):
        predict_sd(Setup("deepseek-v3", "qwen3-30b-a3b-eagle3", "H200", tp=8, context=512), 8, 2, 0.8)
    kimi = "^draft: deepseek-v3-mtp is a draft head of deepseek-v3 and cannot draft for kimi-k2: "  # same width
    with pytest.raises(ValueError, match=kimi):
        predict_sd(Setup("kimi-k2", "deepseek-v3-mtp", "H200", tp=8, dtype="fp8", context=512), 8, 2, 0.8)
    with pytest.raises(ValueError, match=kimi):
        memory_fit(Setup("kimi-k2", "deepseek-v3-mtp", "H200", tp=8, dtype="fp8"), 8, 1024)
    for head, owner in (("qwen3-30b-a3b-eagle3", "qwen3-30b-a3b"), ("deepseek-v3-mtp", "deepseek-v3")):
        with pytest.raises(ValueError, match=f"^target: {head} is a draft head of {owner}, not a model to serve"):
            predict_sd(Setup(head, "qwen3-0.6b", "H100", context=512), 8, 2, 0.8)
    vocabulary = r"^draft: qwen3-0.6b's vocabulary has 151936 tokens, mixtral-8x7b's 32000: "
    with pytest.raises(ValueError, match=vocabulary):
        predict_sd(Setup("mixtral-8x7b", "qwen3-0.6b", "H100", context=512), 8, 2, 0.8)
    with pytest.raises(ValueError, match=vocabulary):
        memory_fit(Setup("mixtral-8x7b", "qwen3-0.6b", "H100"), 8, 1024)
    # heads of the target's own, by zoo name or by shape (an EAGLE-3 head keeps its own vocabulary)
    assert check_pair("qwen3-30b-a3b", "qwen3-30b-a3b-eagle3") and check_pair("deepseek-v3", "deepseek-v3-mtp")
    assert check_pair("qwen3-30b-a3b", eagle3_head("qwen3-30b-a3b")) and check_pair("kimi-k2", one_layer_draft("kimi-k2"))
    assert not check_pair("qwen2-57b-a14b", "qwen2-0.5b") and not check_pair("opt-30b", "opt-350m")


def test_draft_tp_defaults_to_the_target_gpus_for_a_head_and_one_gpu_for_a_separate_draft():
    def predict(**deployment):
        return predict_sd(Setup(**deployment, context=512), [1, 64], 2, 0.8)

    head = dict(target="deepseek-v3", draft="deepseek-v3-mtp", hardware="H200", tp=8, dtype="fp8")
    pd.testing.assert_frame_equal(predict(**head), predict(**head, draft_tp=8))
    assert (predict(**head, draft_tp=1)["t_draft"] > predict(**head)["t_draft"]).all()  # integers as given
    assert Setup(**head).draft_gpus == 8
    separate = dict(target="qwen2-57b-a14b", draft="qwen2-0.5b", hardware="H800", tp=2)
    pd.testing.assert_frame_equal(predict(**separate), predict(**separate, draft_tp=1))
    assert not predict(**separate).equals(predict(**separate, draft_tp=2))
    assert Setup(**separate).draft_gpus == 1
    pd.testing.assert_frame_equal(memory_fit(Setup("qwen2-57b-a14b", "qwen2-0.5b", "H800", tp=2), [1, 64], 256),
                                  memory_fit(Setup("qwen2-57b-a14b", "qwen2-0.5b", "H800", tp=2, draft_tp=1),
                                             [1, 64], 256))


def test_draft_topk_prices_every_draft_step_but_a_head_s_extend_pass():
    """Each of the gamma draft steps is a pass of draft_topk tokens per sequence; with an engine that runs a head's
    extend pass, that pass gives the first position and the other gamma - 1 steps score draft_topk tokens each."""
    setup = Setup("qwen3-30b-a3b", "qwen3-30b-a3b-eagle3", "H100", tp=4, draft_topk=4, context=512)
    plain = predict_sd(setup, 4, 3, 0.5)
    head = resolve_model("qwen3-30b-a3b-eagle3")
    assert plain["t_draft"].item() == pytest.approx(step_time(head, "H100", 4, 4, 512, 4).total.item())
    sglang = engine_profile("sglang")
    extend = predict_sd(dataclasses.replace(setup, engine=sglang), 4, 3, 0.5)
    steps = predict_sd(dataclasses.replace(setup, engine=dataclasses.replace(sglang, draft_extend=False)), 4, 3, 0.5)
    assert extend["t_draft_extend"].item() > 0 == steps["t_draft_extend"].item()
    assert 3 * extend["t_draft"].item() - extend["t_draft_extend"].item() == pytest.approx(2 * steps["t_draft"].item())


def _predict_cli(capsys, *args):
    from moesd.cli import main

    main(["predict", *args])
    return capsys.readouterr().out


def test_cli_suggests_only_what_exists_when_a_setup_does_not_fit(capsys):
    printed = _predict_cli(capsys, "--target", "deepseek-v3", "--draft", "deepseek-v3-mtp", "--hardware", "H200",
                           "--tp", "8", "--draft-tp", "8", "--dtype", "fp8", "--batch", "1", "--context", "2000000")
    line = next(line for line in printed.splitlines() if line.startswith("does not fit"))
    # MLA's latent KV cache is copied to every GPU: at 2M tokens neither more GPUs nor 4-bit experts help
    assert line.endswith("GB per GPU at B = 1 on 8 GPU(s); one H200 holds 141 GB (try a shorter --context).")
    assert "(with the draft head's on the same GPUs)" in line
    printed = _predict_cli(capsys, "--target", "deepseek-v3", "--draft", "deepseek-v3-mtp", "--hardware", "H100",
                           "--tp", "8", "--draft-tp", "8", "--dtype", "fp8", "--batch", "1", "--context", "0")
    line = next(line for line in printed.splitlines() if line.startswith("does not fit"))
    # two nodes or more; no DP-attention, which fits no more than tensor parallelism here; no FP4 cores on H100
    assert line.endswith(" on 8 GPU(s); one H100 holds 80 GB (try --tp 16 or 32 or 64 or 128; --dtype w4a8).")
    printed = _predict_cli(capsys, "--target", "qwen3-30b-a3b", "--draft", "qwen3-0.6b", "--hardware", "H100",
                           "--batch", "1,256")
    line = next(line for line in printed.splitlines() if line.startswith("does not fit"))
    assert line.endswith(" on 1 GPU(s); one H100 holds 80 GB (try --tp 2 or 4 or 8; --dtype fp8 or w4a8; "
                         "a shorter --context).")
    assert "Only B <= 1 fits (1 of 2 batch sizes;" in printed


def test_cli_says_where_sd_is_marginal_and_when_the_host_cost_decides(capsys):
    """At the default host cost 0 qwen3-30b-a3b at alpha 0.95 is on at some batch sizes; vLLM v0's host cost
    changes where."""
    from moesd.predictor.recommend import SD_MARGIN

    printed = _predict_cli(capsys, "--target", "qwen3-30b-a3b", "--draft", "qwen3-0.6b", "--hardware", "H100",
                           "--batch", "1-16", "--alpha", "0.95")
    verdict = next(line for line in printed.splitlines() if line.startswith("alpha = 0.95"))
    assert re.search(rf"SD pays \(the best speedup's error band above {1 + SD_MARGIN:g}\) at \d+ of 16 batch sizes, "
                     r"B = [\d, -]+", verdict)
    assert re.search(r"this depends on the host cost: at --host-ms 3\.8 SD is on at (B = [\d, -]+|no batch size)\)",
                     verdict)
    assert f"a margin of {100 * SD_MARGIN:g} %" in printed


def test_cli_draws_no_band_where_sd_never_pays(capsys):
    printed = _predict_cli(capsys, "--target", "qwen2-57b-a14b", "--draft", "qwen2-0.5b", "--hardware", "A800",
                           "--tp", "2", "--batch", "1,32", "--alpha", "0")
    assert "sqrt(2)" not in printed and "leave it off" in printed


def test_cli_notes_an_mtp_draft_placed_off_the_target_gpus(capsys):
    deepseek = ["--target", "deepseek-v3", "--draft", "deepseek-v3-mtp", "--hardware", "H200", "--tp", "8",
                "--dtype", "fp8", "--batch", "1,64"]
    assert "--draft-tp 8 prices that" in _predict_cli(capsys, *deepseek, "--draft-tp", "1")
    assert "note:" not in _predict_cli(capsys, *deepseek, "--draft-tp", "8")


def test_cli_plot_one_batch_size_a_panel_per_alpha_and_the_file_written(capsys, tmp_path):
    import matplotlib.image

    args = ["--target", "qwen3-30b-a3b", "--draft", "qwen3-0.6b", "--hardware", "H100", "--batch", "8"]
    printed = _predict_cli(capsys, *args, "--plot", str(tmp_path / "noext"))
    assert f"{tmp_path / 'noext.png'} written" in printed and (tmp_path / "noext.png").exists()
    one = matplotlib.image.imread(tmp_path / "noext.png")
    _predict_cli(capsys, *args, "--alpha", "0.6,0.8", "--plot", str(tmp_path / "two.png"))
    two = matplotlib.image.imread(tmp_path / "two.png")
    assert two.shape[0] > 1.5 * one.shape[0]  # two panels, one above the other


def test_a_heatmap_of_one_batch_size_fills_its_cells():
    import matplotlib.pyplot as plt

    from moesd.plots import speedup_heatmap

    frame = predict_sd(Setup("qwen3-30b-a3b", "qwen3-0.6b", "H100", context=512), 8, [1, 2, 3], alpha=0.8)
    figure = speedup_heatmap(frame)
    mesh = figure.axes[0].collections[0]
    assert mesh.get_array().size == 3
    low, high = figure.axes[0].get_xlim()
    assert low < 8 < high and high / low > 1.5  # a cell of width, not a line
    plt.close(figure)


def test_cli_help_names_every_model_and_gpu(capsys):
    from moesd.cli import main
    from moesd.zoo import MODELS

    with pytest.raises(SystemExit):
        main(["predict", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert all(name in text for name in [*MODELS, *HARDWARE]) and "SXM" in text


def test_records_with_a_network_cite_it_and_may_span_nodes():
    """The 8-GPU NVIDIA records with a NIC on record: 400 Gb/s (50 GB/s one way) per GPU, 200 Gb/s on the A100."""
    for name, hw in HARDWARE.items():
        assert (hw.max_nodes > 1) == (hw.internode_bandwidth > 0) == bool(hw.internode), name
        if hw.internode_bandwidth:
            assert "Gb/s NIC per GPU" in hw.internode and "nccl-tests" in hw.internode and hw.internode_latency == 20e-6
    assert {n: h.internode_bandwidth / 1e9 for n, h in HARDWARE.items() if h.internode_bandwidth} == {
        "A100": 25, "H800": 50, "H100": 50, "H200": 50, "B200": 50}


def test_all_reduce_across_two_nodes_is_hierarchical():
    """DeepSeek-V3 on 16 H100s (two nodes of 8), B = 8 tokens, bf16, by hand: M = 8 x 7168 x 2 = 114,688 bytes;
    an all-reduce is the node's ring (10 us + 2 x 7/8 M / 450 GB/s) plus the shard M / 8 all-reduced with the other
    node over a 50 GB/s NIC (20 us + 2 x 1/2 x M / 8 / 50 GB/s), 2 x 61 + 1 of them; the logits' gather
    (S = 8 x 129,280 x 2 = 2,068,480 bytes) is 20 us + 1/16 S / 50 GB/s across and 10 us + 7/8 S / 450 GB/s within."""
    step = step_time("deepseek-v3", "H100", 1, 8, tp=16)
    all_reduce = 10e-6 + 1.75 * 114688 / 450e9 + 20e-6 + 114688 / 8 / 50e9  # 30.7327 us
    gather = 10e-6 + 7 / 8 * 2068480 / 450e9 + 20e-6 + 2068480 / 16 / 50e9  # 36.6076 us
    assert step.seconds["communication"] == pytest.approx(123 * all_reduce + gather, rel=1e-12)
    assert step.seconds["communication"] == pytest.approx(3816.7333e-6, rel=1e-7)
    assert step.bytes["communication"] == pytest.approx(123 * (1.75 + 1 / 8) * 114688, rel=1e-12)
    instant = dataclasses.replace(HARDWARE["H100"], interconnect_bandwidth=1e30, internode_bandwidth=1e30)
    latency = step_time("deepseek-v3", instant, 1, 8, tp=32).seconds["communication"]
    assert latency == pytest.approx(124 * (10e-6 + 20e-6), rel=1e-9)  # four nodes: latencies only


def test_dp_attention_on_one_gpu_is_the_plain_step():
    plain = step_time("deepseek-v3", "H200", [1, 3], [5, 64], 1024, dtype="fp8")
    dp = step_time("deepseek-v3", "H200", [1, 3], [5, 64], 1024, dtype="fp8", dp_attention=True)
    for part in COMPONENTS:
        np.testing.assert_array_equal(dp.seconds[part], plain.seconds[part])
        np.testing.assert_array_equal(dp.bytes[part], plain.bytes[part])


def test_dp_attention_runs_the_dense_parts_of_one_gpus_sequences_unsplit():
    """Eight GPUs, B = 9: each runs attention, cache, router, shared experts, dense FFNs and head on ceil(9 / 8) = 2
    sequences with every weight, as one GPU does for B = 2; the routed experts are dealt E / 8 per GPU."""
    dp = step_time("deepseek-v3", "H200", 1, 9, 1024, tp=8, dtype="fp8", dp_attention=True)
    alone = step_time("deepseek-v3", "H200", 1, 2, 1024, dtype="fp8")
    for part in ("attention", "kv_cache", "router", "shared_experts", "dense_ffn", "lm_head", "fixed"):
        assert dp.seconds[part] == alone.seconds[part] and dp.bytes[part] == alone.bytes[part], part
    assert dp.bytes["kv_cache"] == 2 * 61 * 1024 * 576 * 2  # MLA: 576 values per token and layer, bf16
    ep = step_time("deepseek-v3", "H200", 1, 9, 1024, tp=8, ep=8, dtype="fp8")
    assert dp.seconds["routed_experts"] == ep.seconds["routed_experts"]  # the experts as ep = tp deals them
    assert step_time("deepseek-v3", "H200", 1, 9, 1024, tp=8, ep=8, dtype="fp8", dp_attention=True).total == dp.total
    with pytest.raises(ValueError, match=r"^ep: with dp_attention the routed experts are dealt over all tp GPUs "
                       r"\(ep = tp = 8\), got 4$"):
        step_time("deepseek-v3", "H200", 1, 9, tp=8, ep=4, dp_attention=True)
    with pytest.raises(ValueError, match=r"^dp_attention: qwen2-0.5b is dense"):
        step_time("qwen2-0.5b", "H200", 1, 9, tp=2, dp_attention=True)
    assert tensor_parallel_sizes("deepseek-v3", "H100", dp_attention=True) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert tensor_parallel_sizes("qwen3-30b-a3b", "H20", dp_attention=True) == [1, 2, 4, 8]  # 128 experts, one node
    with pytest.raises(ValueError, match=r"^tp must divide the routed experts of deepseek-v3 \(256\) with "
                       r"dp_attention"):
        step_time("deepseek-v3", "H200", 1, 9, tp=6, dp_attention=True)


def test_dp_attention_dispatches_and_combines_every_moe_layer():
    """DeepSeek-V3 fp8 (bf16 activations), B = 64, K = 8, 58 MoE layers, two all-to-alls each. On 8 H200s each
    GPU has 8 tokens: C = 8 x 8 x 7168 x 2 = 917,504 bytes, 7/8 of it to the other GPUs over NVLink (450 GB/s one
    way, 10 us). On 16 (two nodes) each has 4: C = 458,752, 7/16 over NVLink and 8/16 over the 50 GB/s NIC at
    once, 20 us."""
    within = step_time("deepseek-v3", "H200", 1, 64, tp=8, dtype="fp8", dp_attention=True)
    assert within.bytes["communication"] == pytest.approx(116 * 7 / 8 * 917504, rel=1e-12)
    assert within.seconds["communication"] == pytest.approx(116 * (10e-6 + 802816 / 450e9), rel=1e-12)  # 1.367 ms
    across = step_time("deepseek-v3", "H200", 1, 64, tp=16, dtype="fp8", dp_attention=True)
    assert across.seconds["communication"] == pytest.approx(116 * (20e-6 + max(200704 / 450e9, 229376 / 50e9)),
                                                            rel=1e-12)  # 2.852 ms
    assert across.bytes["communication"] == pytest.approx(116 * 15 / 16 * 458752, rel=1e-12)


def test_dp_attention_reaches_memory_predict_sd_and_the_cli(capsys):
    """Each GPU holds every weight but the routed experts, E / tp of those, and the cache of ceil(B / tp) sequences."""
    spec = get_model("deepseek-v3").architecture()
    routed = spec.moe_layers * spec.num_experts * spec.expert_params  # fp8: one byte each
    assert weights_per_gpu("deepseek-v3", "fp8", 8, dp_attention=True) == pytest.approx(
        weights_per_gpu("deepseek-v3", "fp8") - 7 / 8 * routed, rel=1e-12)
    held = memory_per_gpu("deepseek-v3", "H200", [8, 9], 1024, tp=8, dtype="fp8", dp_attention=True)
    np.testing.assert_allclose(held - weights_per_gpu("deepseek-v3", "fp8", 8, dp_attention=True),
                               [1, 2] * np.array(61 * 1024 * 576 * 2.0), rtol=1e-12)
    fit = memory_fit(Setup("deepseek-v3", "deepseek-v3-mtp", "H200", tp=8, draft_tp=1, dtype="fp8", dp_attention=True),
                     [8, 9], 1024)
    np.testing.assert_array_equal(fit["target_bytes"], held)
    # the MTP head on the target's GPUs runs as the target does (predict_sd's draft_dp), and adds to their memory
    head = memory_per_gpu("deepseek-v3-mtp", "H200", [8, 9], 1024, tp=8, ep=8, dtype="fp8", dp_attention=True)
    fit = memory_fit(Setup("deepseek-v3", "deepseek-v3-mtp", "H200", tp=8, dtype="fp8", dp_attention=True),
                     [8, 9], 1024)
    np.testing.assert_array_equal(fit["draft_bytes"], head)
    np.testing.assert_array_equal(fit["target_bytes"], held + head)
    frame = predict_sd(Setup("deepseek-v3", "deepseek-v3-mtp", "H200", tp=16, dtype="fp8", dp_attention=True,
                             context=512),
                       [1, 64], 2, alpha=0.7)
    t1 = step_time("deepseek-v3", "H200", 1, [1, 64], 512, tp=16, dtype="fp8", dp_attention=True).total
    np.testing.assert_allclose(frame["t_target_1"], t1, rtol=1e-12)
    printed = _predict_cli(capsys, "--target", "deepseek-v3", "--draft", "deepseek-v3-mtp", "--hardware", "H200",
                           "--tp", "16", "--dp-attention", "--dtype", "fp8", "--batch", "1,64", "--gamma", "2")
    assert printed.startswith("deepseek-v3 on 16 x H200 (ep 16, attention data-parallel), draft")


def test_a_tree_offers_at_most_its_capacity_and_emits_at_most_what_it_verifies():
    from moesd.predictor.predict import tree_capacity

    # SGLang's trees: k candidates at the first step, k^2 at each later one, and the last verified token
    assert tree_capacity(4, 4) == 1 + 4 + 3 * 16 and tree_capacity(2, 4) == 21 and tree_capacity(5, 1) == 6
    def tree(tokens):
        return Setup("qwen3-30b-a3b", "qwen3-30b-a3b-eagle3", "H100", tp=4, draft_topk=4, verify_tokens=tokens)

    with pytest.raises(UsageError, match="^verify_tokens: a tree of gamma = 1 draft steps of 4 candidates offers "
                                         "at most 5 tokens per sequence, got 16") as error:
        predict_sd(tree(16), 4, 1, 0.5)
    assert error.value.argument == "verify_tokens"
    with pytest.raises(UsageError, match="^verify_tokens: a round emits at most the 4 tokens it verifies"):
        predict_sd(tree(4), 4, 5, alpha=0.9)  # sigma(0.9, 5) 6 = 4.69 > 4
    assert predict_sd(tree(4), 4, 4, 0.8)["tokens_per_round"].item() == 4


def test_the_draft_gpus_default_to_the_targets_for_a_head_on_its_hardware():
    from moesd.predictor.setup import default_draft_tp

    assert default_draft_tp("deepseek-v3", "deepseek-v3-mtp", 8) == 8
    assert default_draft_tp("qwen3-235b-a22b", "qwen3-0.6b", 8) == 1
    assert default_draft_tp("qwen3-235b-a22b", "qwen3-0.6b", 8, shared=True) == 8
    assert default_draft_tp("deepseek-v3", "deepseek-v3-mtp", 8, draft_hardware="H100", hardware="H200") == 1
    assert default_draft_tp("deepseek-v3", "deepseek-v3-mtp", 8, draft_hardware="h200", hardware="H200") == 8
