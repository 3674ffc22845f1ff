"""Engine profiles, acceptance by draft position, tiles, 4-bit dtypes, EAGLE-3 heads and the check against
published engine measurements (moesd.predictor.engine, moesd.theory.acceptance, moesd.paper.engine_check)."""

import contextlib
import dataclasses
import io

import numpy as np
import pandas as pd
import pytest

from moesd import cli
from moesd.predictor.engine import ENGINES, Cost, engine_profile
from moesd.predictor.forward import step_time
from moesd.predictor.kernels import Efficiency, achieved_rates, grouped_gemm_roofline
from moesd.predictor.layout import DTYPE_BYTES, attention_dtype, ffn_dtype, weights_per_gpu
from moesd.predictor.models import eagle3_head, resolve_model
from moesd.predictor.predict import predict_sd
from moesd.predictor.setup import Setup
from moesd.paper.engine_check import VARIANTS, check_engines, published_speedups
from moesd.theory.acceptance import alpha_for_acceptance_length, position_acceptance, tokens_per_round
from moesd.theory.roofline import HARDWARE
from moesd.theory.speedup import expected_tokens_per_round

SGLANG = engine_profile("sglang")


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.8, 1.0])
@pytest.mark.parametrize("gamma", [1, 3, 7])
def test_constant_acceptance_gives_eq_5(alpha, gamma):
    assert tokens_per_round(position_acceptance(alpha, gamma)) == pytest.approx(
        expected_tokens_per_round(alpha, gamma))


def test_tokens_per_round_by_hand():
    assert tokens_per_round([0.8, 0.5, 0.25]) == pytest.approx(1 + 0.8 + 0.4 + 0.1)
    assert position_acceptance(0.8, 3, 0.5) == pytest.approx([0.8, 0.4, 0.2])


@pytest.mark.parametrize("decay", [1.0, 0.9, 0.5])
def test_alpha_for_acceptance_length_inverts(decay):
    for alpha in (0.1, 0.55, 0.9):
        length = tokens_per_round(position_acceptance(alpha, 4, decay))
        assert alpha_for_acceptance_length(length, 4, decay) == pytest.approx(alpha, abs=1e-9)


def test_acceptance_length_beyond_gamma_is_refused():
    with pytest.raises(ValueError, match="at most 4"):
        alpha_for_acceptance_length(4.5, 3)
    with pytest.raises(ValueError, match="acceptance must hold one value"):
        tokens_per_round([])


def test_every_engine_cost_is_sourced_and_ordered():
    for profile in ENGINES.values():
        for name, cost in profile.costs().items():
            assert cost.source, (profile.name, name)  # Cost itself keeps low <= value <= high
        low, high = profile.at("low"), profile.at("high")
        assert low.exposed_host_seconds.value <= high.exposed_host_seconds.value
        assert low.draft_host_seconds.value <= high.draft_host_seconds.value
        for dtype, cost in profile.expert_flops_fraction.items():  # a higher fraction favours SD
            assert low.expert_flops_fraction[dtype].value >= high.expert_flops_fraction[dtype].value


def test_bad_profiles_are_refused():
    with pytest.raises(ValueError, match="engine must be one of"):
        engine_profile("tgi")
    with pytest.raises(ValueError, match="low <= value <= high"):
        Cost(2.0, 0.0, 1.0, "x")
    with pytest.raises(ValueError, match="end must be"):
        SGLANG.at("middle")


def _frame(alpha_decay=1.0, **deployment):
    setup = Setup("deepseek-v3", "deepseek-v3-mtp", "H200", tp=8, draft_tp=8, dtype="fp8", context=1024, **deployment)
    return predict_sd(setup, [1, 16], [1, 3], alpha=0.7, alpha_decay=alpha_decay)


def test_the_device_profile_changes_nothing_without_a_step():
    plain, device = _frame(), _frame(engine="device")
    for column in ("t_target_1", "t_target_gamma", "speedup"):
        np.testing.assert_allclose(device[column], plain[column])


def test_a_measured_step_anchors_the_plain_step_and_spreads_over_layers():
    quiet = dataclasses.replace(SGLANG, exposed_host_seconds=Cost(0, 0, 0, "-"), attention_fractions={})
    frame = _frame(engine=quiet, step_seconds=0.03)
    at_one = frame[frame.batch_size == 1]
    assert at_one["t_target_1"].to_numpy() == pytest.approx(0.03)
    fixed = at_one["fixed_seconds"].iloc[0]
    plain = _frame(engine=quiet)
    # every target pass adds the same fixed cost
    np.testing.assert_allclose(frame["t_target_gamma"] - plain["t_target_gamma"], fixed)
    # the head drafts: an extend pass then gamma - 1 steps, each with one layer's share (61 layers)
    head = resolve_model("deepseek-v3-mtp")
    row = frame[(frame.batch_size == 16) & (frame.gamma == 3)].iloc[0]
    step = step_time(head, "H200", 1, 16, 1024, 8, 1, "fp8", efficiency=Efficiency(expert_tile_rows=64,
                     expert_flops_fraction=0.41)).total.item()
    extend = step_time(head, "H200", 4, 16, 1024, 8, 1, "fp8", cuda_graphs=False, efficiency=Efficiency(
        expert_tile_rows=64, expert_flops_fraction=0.41)).total.item() + fixed / 61
    assert row["t_draft_extend"] == pytest.approx(extend)
    assert row["t_draft"] * 3 == pytest.approx(extend + 2 * (step + fixed / 61))


def test_exposed_host_time_adds_to_verification_only():
    without = _frame(engine=dataclasses.replace(SGLANG, exposed_host_seconds=Cost(0, 0, 0, "-")))
    with_host = _frame(engine="sglang")
    # the host time an overlapped plain step hides is at most that step
    np.testing.assert_allclose(with_host["t_target_gamma"] - without["t_target_gamma"],
                               np.minimum(6.1e-3, without["t_target_1"]))
    assert (with_host["t_target_gamma"] - without["t_target_gamma"] < 6.1e-3).any()
    anchored = _frame(engine="sglang", step_seconds=0.03)
    np.testing.assert_allclose(anchored["exposed_host_seconds"], 6.1e-3)
    np.testing.assert_allclose(with_host["t_target_1"], without["t_target_1"])


def test_the_anchor_keeps_top_k_and_torch_dtype_names():
    setup = Setup("qwen3-30b-a3b", "qwen3-0.6b", "H100", tp=2, step_seconds=4.5e-3, context=512)
    frame = predict_sd(setup, [1, 8], 2, alpha=0.7, top_k=2)
    assert frame.loc[frame.batch_size == 1, "t_target_1"].to_numpy() == pytest.approx(4.5e-3)
    named, short = (predict_sd(Setup("deepseek-v3", "deepseek-v3-mtp", "H20", tp=8, draft_tp=8, engine="sglang",
                                     dtype=dtype, context=512), [1, 64], 2, alpha=0.7)
                    for dtype in ("float8_e4m3fn", "fp8"))
    np.testing.assert_allclose(named["speedup"], short["speedup"])  # the engine's fp8 tiles either way
    with pytest.raises(ValueError, match="alpha_decay"):
        predict_sd(Setup("qwen3-30b-a3b", "qwen3-0.6b", "H100", context=512), 1, 2, sigma=0.5, alpha_decay=0.5)


def test_a_step_below_the_roofline_is_refused():
    with pytest.raises(ValueError, match="step_seconds must be at least"):
        _frame(step_seconds=1e-4)


def test_decaying_acceptance_lowers_sigma():
    flat, decaying = _frame(), _frame(alpha_decay=0.8)
    assert (decaying["sigma"] <= flat["sigma"] + 1e-12).all()
    one = decaying[decaying.gamma == 1]
    np.testing.assert_allclose(one["sigma"], flat[flat.gamma == 1]["sigma"])  # one position: no decay


def test_tiles_pad_each_expert_to_whole_tiles():
    h20 = HARDWARE["H20"]
    efficiency = Efficiency(expert_tile_rows=64, flops_fraction=1.0, bandwidth_fraction=1.0)
    seconds = grouped_gemm_roofline(h20, 8, 1.0, 7168, 4096, "fp8", efficiency)
    # one token per expert padded to 64 rows: 64 x 2 x 7168 x 4096 FLOPs per expert, compute-bound on an H20
    assert seconds == pytest.approx(8 * 64 * 2 * 7168 * 4096 / h20.fp8_flops)
    unpadded = grouped_gemm_roofline(h20, 8, 1.0, 7168, 4096, "fp8", dataclasses.replace(efficiency,
                                                                                          expert_tile_rows=1))
    assert unpadded == pytest.approx(8 * 7168 * 4096 / h20.memory_bandwidth, rel=1e-2)


def test_flash_mla_fractions_price_the_attention_kernel():
    h800 = HARDWARE["H800"]
    efficiency = Efficiency(attention_bandwidth_fraction=0.9, attention_flops_fraction=0.5)
    step = step_time("deepseek-v3", h800, 1, 64, 4096, 8, 1, "fp8", efficiency=efficiency)
    arch = resolve_model("deepseek-v3")
    keys, tokens = arch.num_layers * 4096, 64
    kv_bytes = 64 * keys * arch.kv_values_per_token * 2  # MLA's latent cache on every GPU, bf16
    kv_flops = tokens * keys * arch.attention_flops_per_key / 8
    assert step.seconds["kv_cache"].item() == pytest.approx(max(kv_bytes / (0.9 * h800.memory_bandwidth),
                                                                kv_flops / (0.5 * h800.peak_flops)))
    low, high = SGLANG.at("low").attention_fractions["mla"][1].value, SGLANG.at("high").attention_fractions["mla"][1]
    assert low == pytest.approx(660 / 989.5) and high.value == pytest.approx(580 / 989.5)


def test_the_tile_switches_above_as_many_tokens_as_experts():
    switching = Efficiency(expert_tile_rows=16, expert_tile_rows_above=64)
    for batch, fixed in ((100, Efficiency(expert_tile_rows=16)), (200, Efficiency(expert_tile_rows=64))):
        experts = [step_time("qwen3-30b-a3b", "H20", 1, batch, 0, efficiency=e).seconds["routed_experts"].item()
                   for e in (switching, fixed)]  # qwen3-30b-a3b routes over 128 experts
        assert experts[0] == pytest.approx(experts[1])


def test_expert_flops_fraction_replaces_the_records():
    efficiency = Efficiency(expert_flops_fraction=0.4)
    h200 = HARDWARE["H200"]
    seconds = grouped_gemm_roofline(h200, 1, 10000, 1024, 1024, "fp8", efficiency)
    assert seconds == pytest.approx(2 * 10000 * 1024 * 1024 / (h200.fp8_flops * 0.4))


def test_four_bit_dtypes_quantise_the_routed_experts_only():
    arch = resolve_model("gpt-oss-120b")
    routed = arch.moe_layers * arch.num_experts * arch.expert_params
    difference = weights_per_gpu(arch, "bf16") - weights_per_gpu(arch, "mxfp4")
    assert difference == pytest.approx(routed * (2 - DTYPE_BYTES["mxfp4"]))
    assert DTYPE_BYTES["mxfp4"] == 0.5 + 1 / 32 and DTYPE_BYTES["nvfp4"] == 0.5 + 1 / 16
    assert attention_dtype("w4a8") == ffn_dtype("w4a8") == "fp8" and attention_dtype("fp8") == "fp8"
    assert attention_dtype("nvfp4") == "bf16" and ffn_dtype("nvfp4") == "nvfp4"
    assert achieved_rates(HARDWARE["B200"], "nvfp4", Efficiency())[1] == pytest.approx(
        9000e12 * HARDWARE["B200"].flops_fraction)
    assert achieved_rates(HARDWARE["H200"], "mxfp4", Efficiency())[1] == pytest.approx(
        achieved_rates(HARDWARE["H200"], "bf16", Efficiency())[1])


def test_eagle3_head_by_hand():
    """SpecForge's LlamaForCausalLMEagle3: q, k, v read 2 d values; fc 3 d x d; MLP; its own 32000-token LM head."""
    head = resolve_model("qwen3-30b-a3b-eagle3")
    d, q, kv = 2048, 2 * 2048 * 32 * 128, 2 * 2 * 2048 * 4 * 128
    mlp_and_fc = 3 * d * 6144 + 3 * d * d
    weights = q + kv + 32 * 128 * d + mlp_and_fc + d * 32000 + 2 * d + d
    assert weights_per_gpu(head) == pytest.approx(2 * weights)
    assert head.num_layers == 1 and head.num_experts == 0 and head.vocab_size == 32000
    assert head.head_of == "qwen3-30b-a3b" and head.drafter == "eagle3"


def test_eagle3_heads_of_latent_attention_targets():
    """An MLA target's head has Llama attention of its heads at its value width: Kimi-K2's 64 heads of 128 give
    SpecForge's configs/kimi-k2-eagle3.json (64 query and KV heads of 128, MLP 18432) from the target alone."""
    built, published = eagle3_head("kimi-k2"), resolve_model("kimi-k2-eagle3")
    for field in ("q_params", "kv_params", "o_params", "dense_ffn_params", "num_heads", "num_kv_heads"):
        assert getattr(built, field) == getattr(published, field), field
    assert built.q_params == 2 * 7168 * 64 * 128 and built.dense_ffn_params == 3 * 7168 * 18432 + 3 * 7168 ** 2
    deepseek = resolve_model("deepseek-v3-eagle3")  # SpecForge's own head: 56 query and 8 KV heads of 128
    assert (deepseek.num_heads, deepseek.num_kv_heads, deepseek.o_params) == (56, 8, 56 * 128 * 7168)


def test_new_hardware_records():
    assert HARDWARE["H20-141GB"].memory_bandwidth == 4.8e12 and HARDWARE["H20-141GB"].memory_bytes == 141e9
    assert HARDWARE["B200"].fp4_flops == 9000e12 and HARDWARE["H200"].fp4_flops is None


def test_published_points_are_sourced():
    points = published_speedups()
    assert len(points) >= 12 and points["source"].nunique() >= 4
    for column in ("url", "quote", "acceptance_from", "baseline_from"):
        assert points[column].notna().all() and (points[column].str.len() > 5).all()
    assert (points["acceptance_length"] <= points["gamma"] + 1).all()
    # a speedup of nearly the acceptance length would need a free round: a sign of a mismatched setup
    assert (points["speedup"] < 0.97 * points["acceptance_length"]).all()
    # the speedup is the ratio of the two published measurements, to the two decimals sources print
    both = points.dropna(subset=["published_baseline", "published_sd"])
    latency = both["published_unit"].str.startswith("ms")
    ratio = np.where(latency, both["published_baseline"] / both["published_sd"],
                     both["published_sd"] / both["published_baseline"])
    assert len(both) >= len(points) - 1 and set(points["published_unit"]) <= {
        "tok/s", "tok/s per user", "tok/s per rank", "ms per request"}
    np.testing.assert_allclose(both["speedup"], ratio, atol=0.005)


def test_check_engines_scores_every_variant():
    check = check_engines()
    assert list(check.scores["variant"]) == list(VARIANTS)
    row = check.points.iloc[0]
    alpha = alpha_for_acceptance_length(row["acceptance_length"], row["gamma"])  # a chain: alpha or sigma alike
    setup = Setup(row["model"], row["draft"], row["hardware"], tp=row["tp"], draft_tp=row["tp"], ep=row["ep"],
                  dtype=row["dtype"], draft_dtype=row["draft_dtype"], context=row["context"])
    device = predict_sd(setup, row["batch_size"], row["gamma"], alpha=alpha)
    assert check.points["device"].iloc[0] == pytest.approx(device["speedup"].iloc[0])


def test_a_tree_scores_its_tokens_and_drafts_topk_per_step():
    chain = Setup("qwen3-30b-a3b", "qwen3-30b-a3b-eagle3", "H100", tp=4, draft_tp=4, context=512)
    chain, tree = (predict_sd(setup, 4, 4, sigma=0.5)
                   for setup in (chain, dataclasses.replace(chain, verify_tokens=16, draft_topk=4)))
    head = resolve_model("qwen3-30b-a3b-eagle3")
    assert tree["t_target_gamma"].iloc[0] == pytest.approx(
        step_time("qwen3-30b-a3b", "H100", 16, 4, 512, 4).total.item())
    assert tree["t_draft"].iloc[0] == pytest.approx(step_time(head, "H100", 4, 4, 512, 4).total.item())
    assert chain["t_target_gamma"].iloc[0] < tree["t_target_gamma"].iloc[0]
    assert tree["tokens_per_round"].iloc[0] == pytest.approx(2.5)
    with pytest.raises(ValueError, match="verify_tokens must be"):
        Setup("qwen3-30b-a3b", "qwen3-30b-a3b-eagle3", "H100", verify_tokens="all")
    with pytest.raises(ValueError, match="draft_topk"):
        Setup("qwen3-30b-a3b", "qwen3-30b-a3b-eagle3", "H100", draft_topk=0)


def test_check_engines_names_the_wrong_signs_and_the_best_draft_lengths():
    check = check_engines()
    points = check.points.set_index("point")
    for point in check.wrong_sign:
        assert (points.loc[point, "anchored"] > 1) != (points.loc[point, "speedup"] > 1)
    # the one source published at several draft lengths: TensorRT-LLM's B200 table peaks at MTP 3 (2.28x)
    (peak,) = check.gamma_peaks.itertuples()
    assert (peak.hardware, peak.batch_size, peak.published) == ("B200", 1, 3)
    b200 = points[points["hardware"] == "B200"]
    assert peak.anchored == b200.loc[b200["anchored"].idxmax(), "gamma"]


def test_every_ablation_leaves_out_one_engine_term():
    from moesd.paper.engine_check import _LEFT_OUT, _profile

    ablations = [variant for variant in VARIANTS if variant.startswith("anchored, no")]
    assert sorted(_LEFT_OUT) == sorted(ablations)  # a renamed variant would silently be the whole profile
    for variant in ablations:  # each changes the SGLang profile, which has every term
        assert _profile("sglang", variant) != engine_profile("sglang"), variant


def _predict(*extra):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        cli.main(["predict", "--target", "qwen3-30b-a3b", "--draft", "qwen3-30b-a3b-eagle3", "--hardware",
                  "H100", "--tp", "2", "--draft-tp", "2", "--batch", "1,8,64", "--gamma", "1-4", *extra])
    return out.getvalue()


def test_cli_takes_an_engine_a_measured_step_and_an_acceptance_length():
    text = _predict("--acceptance-length", "1.86@3", "--engine-profile", "sglang", "--step-ms", "4.5")
    assert "alpha = 0.49" in text and "sensitivity to sglang-spec-v1's published cost ranges" in text and "EAGLE-3 head" in text


@pytest.mark.parametrize("extra, fragment", [
    (("--acceptance-length", "2.5"), "such as 2.4@3"),
    (("--acceptance-length", "5@3"), "--acceptance-length: length must be at most 4"),
    (("--acceptance-length", "2@3", "--alpha", "0.7"), "exclude each other"),
    (("--alpha-decay", "1.5"), "--alpha-decay must be in (0, 1]"),
    (("--step-ms", "4", "--host-ms", "1"), "exclude each other"),
    (("--step-ms", "-1"), "--step-ms must be a finite number > 0"),
])
def test_cli_refuses_bad_engine_options(extra, fragment, capsys):
    with pytest.raises(SystemExit) as exit_:
        _predict(*extra)
    assert exit_.value.code == 2 and fragment in capsys.readouterr().err


def test_the_cli_reproduces_every_published_point(tmp_path):
    """``moesd predict`` with a point's setup (tree flags, anchor, acceptance length, DP-attention) gives the anchored
    prediction: the command line and the validation share one predictor."""
    check = check_engines().points
    for point in check.itertuples():
        path = tmp_path / f"{point.point}.csv"
        argv = ["predict", "--target", point.model, "--draft", point.draft, "--hardware", point.hardware,
                "--tp", str(point.tp), "--ep", str(point.ep), "--dtype", point.dtype, "--draft-dtype",
                point.draft_dtype, "--engine-profile", point.engine, "--step-ms", str(point.baseline_step_ms),
                "--step-batch", str(point.baseline_batch_size), "--gamma", str(point.gamma),
                "--acceptance-length", f"{point.acceptance_length}@{point.gamma}", "--batch", str(point.batch_size),
                "--context", str(point.context), "--csv", str(path)]
        if point.draft_topk > 1:
            argv += ["--draft-topk", str(point.draft_topk), "--verify-tokens", str(point.verify_tokens)]
        argv += ["--dp-attention"] if point.dp_attention else []
        with contextlib.redirect_stdout(io.StringIO()):
            cli.main(argv)
        assert pd.read_csv(path)["speedup"].iloc[0] == pytest.approx(point.anchored, rel=1e-9), point.point
