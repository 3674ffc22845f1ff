"""The deployments people run in 2026: any model by its config.json, any drafter, today's GPUs and
dtypes, engine profiles by version, per-GPU kernels against their cited benchmarks, sampling, a measured SD round,
and the error band calibrated on the validation table."""

import dataclasses
import json
import tomllib

import numpy as np
import pandas as pd
import pytest

from moesd._checks import UsageError
from moesd.architecture import read_config
from moesd import narration
from moesd.predictor.band import BANDS, band_variant, load_bands
from moesd.predictor.engine import ALIASES, ENGINES, GPU_KERNELS, RECORDS, _fraction, engine_profile
from moesd.predictor.forward import step_time
from moesd.predictor.kernels import Efficiency, grouped_gemm_roofline, sampling_time
from moesd.predictor.layout import kv_cache_bytes, weights_per_gpu
from moesd.predictor.memory import memory_fit, rows_that_fit
from moesd.predictor.models import (DRAFTERS, MEDUSA_HEADS, eagle3_head, eagle_head, medusa_heads, mtp_head,
                                    resolve_draft, resolve_model)
from moesd.predictor.predict import best_speedup, one_layer_draft_setup, predict_fitting, predict_sd, speedup_shape
from moesd.predictor.recommend import recommend
from moesd.predictor.setup import Setup
from moesd.theory.roofline import HARDWARE, REFUSED_HARDWARE
from moesd.zoo import DRAFT_HEADS, MODELS, RECORDS as MODEL_RECORDS

FAMILIES = {"llama-4-scout": "llama4", "llama-4-maverick": "llama4", "qwen3-next-80b-a3b": "qwen3_next",
            "qwen3-coder-480b-a35b": "qwen3_moe", "glm-4.5": "glm4_moe", "minimax-m1": "minimax",
            "minimax-m2": "minimax_m2", "kimi-k2": "deepseek_v3", "deepseek-v3.1": "deepseek_v3",
            "deepseek-v3.2-exp": "deepseek_v32", "deepseek-r1": "deepseek_v3", "gpt-oss-20b": "gpt_oss",
            "gpt-oss-120b": "gpt_oss"}
"""The families the predictor must price, each with a shipped config, and the model type it is read as."""


# ---- models by their config.json --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_shipped_config_reads_offline_as_the_zoo_record(name):
    path = MODEL_RECORDS / "models" / f"{name}.json"
    arch, zoo = read_config(path), MODELS[name].architecture()
    assert arch.model_type == FAMILIES[name]
    assert dataclasses.replace(arch, name=zoo.name) == zoo
    assert json.loads(path.read_text())["_moesd"]["source"]  # every record cites where its dimensions come from
    assert resolve_model(str(path), "target") == arch  # what --target takes


def test_every_shipped_record_cites_its_source_and_is_named_by_its_file():
    for folder in ("models", "heads"):
        for path in (MODEL_RECORDS / folder).glob("*.json"):
            meta = json.loads(path.read_text())["_moesd"]
            assert meta["name"] == path.stem and len(meta["source"]) > 20, path


def test_a_folder_and_a_multimodal_config_read_as_their_text_tower(tmp_path):
    """Llama 4's config.json nests the decoder in text_config; a folder holding a config.json reads as the file."""
    record = json.loads((MODEL_RECORDS / "models" / "llama-4-scout.json").read_text())
    record.pop("_moesd")
    (tmp_path / "scout").mkdir()
    (tmp_path / "scout" / "config.json").write_text(json.dumps(
        {"model_type": "llama4", "tie_word_embeddings": False, "text_config": record}))
    arch = read_config(tmp_path / "scout")
    assert arch.name == "scout" and arch.num_experts == 16 and arch.moe_layers == 48
    assert arch.sliding_layers == 36 and arch.sliding_window == 8192  # chunked attention in 3 of 4 layers


@pytest.mark.parametrize("change, argument, words", [
    ({"model_type": "mamba2"}, "config.model_type", "model_type 'mamba2' has no analytic shape"),
    ({"hidden_size": None}, "config.hidden_size", "lacks hidden_size"),
    ({"layer_types": ["full_attention", "mamba"] * 24}, "config.layer_types", "layers of kind mamba are not priced"),
])
def test_a_config_the_predictor_cannot_price_is_refused_naming_the_key(tmp_path, change, argument, words):
    record = json.loads((MODEL_RECORDS / "models" / "qwen3-next-80b-a3b.json").read_text())
    record.update(change)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(record))
    with pytest.raises(UsageError, match=words) as error:
        read_config(path)
    assert error.value.argument == argument
    with pytest.raises(UsageError, match=words) as error:  # as a Setup's target: the argument is the target
        Setup(str(path), "ngram", "H100", tp=4)
    assert error.value.argument == "target"


def test_minimax_m2_shared_experts_would_be_refused():
    record = dict(MODELS["minimax-m2"].config, shared_intermediate_size=1536)
    from moesd.architecture import Architecture

    with pytest.raises(UsageError, match="shared experts are not priced") as error:
        Architecture.from_config("m2", "minimax_m2", record)
    assert error.value.argument == "config.shared_intermediate_size"


def test_deepseek_v32_adds_its_indexer_and_reads_only_the_selected_keys():
    v3, v32 = MODELS["deepseek-v3"].architecture(), MODELS["deepseek-v3.2-exp"].architecture()
    index = 1536 * 64 * 128 + 7168 * 128 + 2 * 128 + 7168 * 64  # wq_b, wk, its norm, the head weights
    assert v32.index_params == index
    assert v32.weight_counts()["total"] == v3.weight_counts()["total"] + 61 * index
    long, short = (kv_cache_bytes(v32, 1, context, 1, "fp8") - kv_cache_bytes(v3, 1, context, 1, "fp8")
                   for context in (100_000, 1000))
    assert long == pytest.approx(61 * 100_000 * (128 + 4)) and short == pytest.approx(61 * 1000 * (128 + 4))
    # at 100k tokens of context attention reads the 2048 selected keys: cheaper than V3's full read
    assert (step_time(v32, "H200", 1, 8, 100_000, 8, dtype="fp8").seconds["kv_cache"]
            < step_time(v3, "H200", 1, 8, 100_000, 8, dtype="fp8").seconds["kv_cache"] / 5)


def test_linear_attention_layers_keep_a_state_the_context_does_not_grow():
    arch = MODELS["qwen3-next-80b-a3b"].architecture()
    assert (arch.linear_layers, arch.full_layers) == (36, 12)
    grow = kv_cache_bytes(arch, 1, 2000, 1, "bf16") - kv_cache_bytes(arch, 1, 1000, 1, "bf16")
    assert grow == pytest.approx(12 * 1000 * arch.kv_values_per_token * 2)  # the 12 full-attention layers only


# ---- drafters ----------------------------------------------------------------------------------------------------

def test_the_drafter_keywords_build_heads_for_any_target():
    assert set(DRAFTERS) == {"mtp", "eagle", "eagle3", "medusa", "ngram"}
    for target in ("deepseek-v3", "kimi-k2", "llama-4-maverick", "qwen3-next-80b-a3b", "gpt-oss-20b"):
        for keyword in ("eagle", "eagle3", "medusa", "ngram"):
            draft = resolve_draft(keyword, target)
            assert draft.head_of == resolve_model(target).name and draft.drafter == keyword.rstrip("3") + (
                "3" if keyword == "eagle3" else ""), (target, keyword)
            Setup(target, keyword, "B200", tp=8, dtype="fp8")


def test_mtp_heads_come_from_the_targets_config():
    for target, layers in (("deepseek-v3", 1), ("glm-4.5", 1), ("minimax-m2", 3), ("qwen3-next-80b-a3b", 1)):
        assert resolve_model(target).mtp_layers == layers
        head = mtp_head(target)
        d = head.hidden_size
        assert head.num_layers == 1 and head.fuse_params == 2 * d * d and head.linear_layers == 0
        assert head.borrowed_params == head.embedding_params + head.head_params  # the target's, not held again
    assert resolve_model("deepseek-v3-mtp").fuse_params == 2 * 7168 * 7168  # DeepSeek's eh_proj
    with pytest.raises(UsageError, match="declares no multi-token-prediction module") as error:
        Setup("llama-4-scout", "mtp", "H100", tp=8)
    assert error.value.argument == "draft"


def test_an_eagle_head_fuses_two_hidden_states_and_reads_the_targets_lm_head():
    head, target = eagle_head("qwen3-30b-a3b"), resolve_model("qwen3-30b-a3b")
    d = 2048  # a target without dense layers gives the head its experts' width, 768
    assert head.dense_ffn_params == 3 * d * 768 + 2 * d * d + d and head.vocab_size == target.vocab_size
    assert eagle_head("qwen3-30b-a3b", 6144).dense_ffn_params == 3 * d * 6144 + 2 * d * d + d
    assert head.borrowed_params == d * target.vocab_size
    assert weights_per_gpu(head) == pytest.approx(weights_per_gpu(dataclasses.replace(
        head, head_params=0, borrowed_params=0)))  # its LM head is the target's


def test_a_head_config_json_builds_the_head(tmp_path):
    config = {**DRAFT_HEADS["kimi-k2-eagle3"].config, "architectures": ["LlamaForCausalLMEagle3"]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    built = resolve_draft(str(tmp_path), "kimi-k2")
    assert dataclasses.replace(built, name="x") == dataclasses.replace(resolve_model("kimi-k2-eagle3"), name="x")
    (tmp_path / "config.json").write_text(json.dumps({"medusa_num_heads": 3, "hidden_size": 7168}))
    assert resolve_draft(str(tmp_path), "kimi-k2").draft_positions == 3
    with pytest.raises(UsageError, match="hidden_size 7168"):
        eagle3_head("qwen3-30b-a3b", config=config)


def test_medusa_heads_draft_every_position_in_one_pass():
    setup = Setup("qwen3-30b-a3b", "medusa:3", "H100")
    heads = medusa_heads("qwen3-30b-a3b", 3)
    assert MEDUSA_HEADS == 4 and heads.dense_ffn_params == 3 * (2048 ** 2 + 2048)
    frame = predict_sd(setup, 8, [1, 2, 3], 0.6)
    drafting = frame["t_draft"] * frame["gamma"]
    np.testing.assert_allclose(drafting, drafting.iloc[0])  # one pass, whatever gamma
    with pytest.raises(UsageError, match="propose 3 positions per round") as error:
        predict_sd(setup, 8, 4, 0.5)
    assert error.value.argument == "gamma"


def test_the_ngram_drafter_costs_nothing_to_draft_and_holds_no_memory():
    setup = Setup("deepseek-v3", "ngram", "H200", tp=8, dtype="fp8", engine="vllm-v1", step_seconds=0.03)
    frame = predict_sd(setup, [1, 32], 3, 0.5)
    assert (frame["t_draft"] == 0).all() and (frame["t_draft_extend"] == 0).all()
    assert (memory_fit(setup, [1, 32])["draft_bytes"] == 0).all()
    plain = frame["t_target_1"]
    expected = 2 / (frame["t_target_gamma"] / plain + frame["t_reject"] / plain)
    np.testing.assert_allclose(frame["speedup"], expected)


# ---- hardware, dtypes ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, bf16, fp8, fp4, memory, per_node", [
    ("B300", 2250e12, 4500e12, 13125e12, 288e9, 8), ("GB200", 2500e12, 5000e12, 10000e12, 186e9, 72),
    ("GB300", 2500e12, 5000e12, 15000e12, 288e9, 72), ("MI325X", 1307.4e12, 2614.9e12, None, 256e9, 8),
("L40S", 362.05e12, 733e12, None, 48e9, 8)])
def test_the_new_gpus_carry_their_data_sheet_peaks(name, bf16, fp8, fp4, memory, per_node):
    hw = HARDWARE[name]
    assert (hw.peak_flops, hw.fp8_flops, hw.fp4_flops, hw.memory_bytes, hw.gpus_per_node) == pytest.approx(
        (bf16, fp8, fp4, memory, per_node)) if fp4 else (hw.fp4_flops is None and hw.peak_flops == bf16)
    assert len(hw.source) > 40 and hw.interconnect


def test_a_gpu_without_citable_peaks_is_refused_with_the_reason():
    assert set(REFUSED_HARDWARE) == {"RTX PRO 6000", "RTX 6000 Ada", "MI355X"}
    for name in REFUSED_HARDWARE:
        with pytest.raises(UsageError, match="no data-sheet (BF16 )?tensor throughput") as error:
            Setup("qwen3-30b-a3b", "eagle3", name)
        assert error.value.argument == "hardware"


def test_an_nvl72_domain_takes_tensor_parallelism_across_its_72_gpus():
    setup = Setup("kimi-k2", "eagle3", "GB200", tp=64, dp_attention=True, dtype="nvfp4")
    assert setup.tp == setup.ep == 64
    with pytest.raises(UsageError, match="tp must be"):
        Setup("kimi-k2", "eagle3", "MI325X", tp=64, dp_attention=True)  # 8 per node, no network on record


def test_mxfp8_w4a16_and_an_fp8_kv_cache():
    base = dict(model="qwen3-30b-a3b", hardware="H100", tokens_per_sequence=1, batch_size=64, context=4096)
    fp8, mxfp8, w4a16, bf16 = (step_time(**base, dtype=d) for d in ("fp8", "mxfp8", "w4a16", "bf16"))
    assert mxfp8.bytes["routed_experts"].item() == pytest.approx(fp8.bytes["routed_experts"].item() * 33 / 32, rel=0.01)
    assert w4a16.flops["dense_ffn"] == bf16.flops["dense_ffn"]
    half = step_time(**base, dtype="bf16", kv_dtype="fp8")
    assert half.bytes["kv_cache"].item() == pytest.approx(bf16.bytes["kv_cache"].item() / 2)
    setup = Setup("qwen3-30b-a3b", "eagle3", "H100", kv_dtype="fp8")
    full = Setup("qwen3-30b-a3b", "eagle3", "H100")
    assert (memory_fit(setup, 64, 32000)["target_bytes"] < memory_fit(full, 64, 32000)["target_bytes"]).all()


# ---- engines and kernels ---------------------------------------------------------------------------------------

def test_engine_profiles_are_named_by_version_with_the_old_names_kept():
    assert list(ENGINES) == ["device", "sglang-spec-v1", "sglang-spec-v2", "sglang-no-overlap", "vllm-v1",
                             "vllm-v1-async", "tensorrt-llm"]
    assert ALIASES == {"sglang": "sglang-spec-v1"} and engine_profile("SGLang") is ENGINES["sglang-spec-v1"]
    assert ENGINES["sglang-spec-v2"].exposed_host_seconds.value == 0 < ENGINES["sglang-spec-v1"].exposed_host_seconds.value
    assert all(profile.pick for profile in ENGINES.values())


def _points():
    with open(RECORDS / "kernels.toml", "rb") as file:
        for entry in tomllib.load(file)["fp8_grouped_gemm"]:
            for point in entry["points"]:
                yield entry, point


@pytest.mark.parametrize("entry, point", list(_points()))
def test_the_per_gpu_grouped_gemm_prices_the_cited_kernel_benchmarks(entry, point):
    """Each cited point within 30 % (the H20's within 20 %) with the GPU's tile and achieved fraction."""
    hardware = HARDWARE[entry["hardware"][0]]
    flops = 2 * point["groups"] * point["rows"] * point["n"] * point["k"]
    measured = point["us"] * 1e-6 if "us" in point else flops / (point["tflops"] * 1e12)
    cost, tile = GPU_KERNELS[hardware.name]["fp8"]
    assert cost.value == pytest.approx(_fraction(entry["fraction"]["value"])) and tile == entry["tile_rows"]
    predicted = grouped_gemm_roofline(hardware, point["groups"], point["rows"], point["k"], point["n"], "fp8",
                                      Efficiency(expert_tile_rows=tile, expert_flops_fraction=cost.value))
    assert predicted / measured == pytest.approx(1, abs=0.2 if hardware.name == "H20" else 0.3)


def test_an_engine_profile_prices_an_h20_with_the_h20s_kernels():
    profile = ENGINES["sglang-spec-v1"]
    h20, h100 = (profile.efficiency(None, "fp8", "mla", name) for name in ("H20", "H100"))
    assert h20.expert_flops_fraction == pytest.approx(248 / 296) and h100.expert_flops_fraction == 0.41
    assert profile.efficiency(None, "bf16", "gqa", "H20").expert_flops_fraction is None


# ---- sampling and a measured round ---------------------------------------------------------------------------------

def test_sampling_at_a_temperature_costs_more_than_greedy_verification():
    greedy, hot = (sampling_time("H100", 8, 4, 151936, t) for t in (0.0, 1.0))
    assert hot > 4 * greedy
    base = Setup("qwen3-30b-a3b", "qwen3-0.6b", "H100")
    frames = {t: predict_sd(dataclasses.replace(base, temperature=t), 16, 3, 0.6) for t in (None, 0.0, 1.0)}
    assert frames[1.0]["t_reject"].item() > frames[None]["t_reject"].item() > frames[0.0]["t_reject"].item()
    assert frames[1.0]["t_target_1"].item() > frames[None]["t_target_1"].item()
    assert frames[1.0]["speedup"].item() < frames[0.0]["speedup"].item()


def test_a_measured_round_is_reproduced_where_it_was_measured():
    base = dict(engine="sglang-spec-v1", step_seconds=4.5e-3, context=512, tp=2)
    setup = Setup("qwen3-30b-a3b", "qwen3-30b-a3b-eagle3", "H100", sd_step_seconds=12e-3, sd_step_gamma=3, **base)
    row = predict_sd(setup, 1, 3, 0.5).iloc[0]
    assert row["t_target_gamma"] + 3 * row["t_draft"] + row["t_reject"] == pytest.approx(12e-3)
    other = predict_sd(setup, [8, 64], [2, 5], 0.4)
    assert other["exposed_host_seconds"].nunique() == 1  # one fixed cost per round, at every B and gamma
    with pytest.raises(UsageError, match="at least the predicted round") as error:
        predict_sd(dataclasses.replace(setup, sd_step_seconds=5e-3), 1, 3, 0.5)
    assert error.value.argument == "sd_step_seconds"
    with pytest.raises(UsageError, match="needs the measured plain step") as error:
        Setup("qwen3-30b-a3b", "eagle3", "H100", sd_step_seconds=1e-2, sd_step_gamma=3)
    assert error.value.argument == "sd_step_seconds"


# ---- the error band ------------------------------------------------------------------------------------------------

def test_the_shipped_band_is_the_validation_tables_and_held_out_coverage():
    from moesd.paper.engine_check import error_band

    computed = error_band().set_index("variant")
    for variant, band in BANDS.items():
        row = computed.loc[variant]
        assert (band.low, band.high) == pytest.approx((row["low"], row["high"]), rel=1e-5)
        assert (band.points, band.sources, band.loso_covered) == (row["points"], row["sources"], row["loso_covered"])
        assert band.low < 1 < band.high and band.loso_covered <= band.points
    assert band_variant(Setup("qwen3-30b-a3b", "eagle3", "H100")) == "device"
    assert band_variant(Setup("qwen3-30b-a3b", "eagle3", "H100", engine="vllm-v1")) == "profile"
    assert band_variant(Setup("qwen3-30b-a3b", "eagle3", "H100", engine="vllm-v1", step_seconds=9e-3)) == "anchored"


def test_sd_is_off_unless_the_band_is_above_one(tmp_path):
    path = tmp_path / "band.csv"
    pd.DataFrame([{"variant": v, "low": 1.0, "high": 1.0, "points": 1, "sources": 1, "loso_covered": 1,
                   "loso_coverage": 1.0} for v in ("device", "profile", "anchored")]).to_csv(path, index=False)
    assert load_bands(path)["device"].interval(2.0) == (2.0, 2.0)
    answer = recommend(Setup("qwen3-30b-a3b", "qwen3-0.6b", "H100"), np.arange(1, 33), np.arange(1, 6), "alpha",
                       [0.9])
    best = answer.advice[0].best
    assert ((best["sd"] == "on") == (best["speedup_low"] > 1.05)).all()
    assert (best["speedup"] > 1.05).sum() > (best["sd"] == "on").sum()  # the band turns some point estimates off


# ---- the README's examples ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, words", [
    (["--target", str(MODEL_RECORDS / "models" / "qwen3-next-80b-a3b.json"), "--draft", "mtp", "--hardware", "H200",
      "--tp", "2", "--dtype", "fp8", "--kv-dtype", "fp8", "--acceptance-length", "2.4@3", "--gamma", "3"],
     "fp8 KV cache"),
    (["--target", "qwen3-coder-480b-a35b", "--draft", "ngram", "--hardware", "H200", "--tp", "8", "--dtype", "fp8",
      "--acceptance-length", "1.9@4", "--gamma", "4", "--engine-profile", "vllm-v1-async", "--step-ms", "25"],
     "no GPU pass"),
    (["--target", "deepseek-r1", "--draft", "mtp", "--hardware", "GB200", "--tp", "16", "--dp-attention", "--dtype",
      "nvfp4", "--engine-profile", "tensorrt-llm", "--acceptance-length", "2.6@3", "--gamma", "3", "--temperature",
      "0.6"], "16 x GB200"),
])
def test_the_readme_examples_run(capsys, args, words):
    from moesd.cli import main

    main(["predict", *args, "--batch", "1,16,64"])
    out = capsys.readouterr().out
    assert words in out and "error band:" in out and "upper bound" not in out


def test_the_readme_states_the_shipped_bands_coverage():
    from pathlib import Path

    text = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    covered = ", ".join(str(BANDS[v].loso_covered) for v in ("device", "profile")) + f" and {BANDS['anchored'].loso_covered}"
    assert f"it held at {covered} of the {BANDS['device'].points} points" in text


def test_what_would_fit_is_found_for_a_setup_with_a_measured_round():
    setup = Setup("qwen3-235b-a22b", "qwen3-0.6b", "H100", tp=4, engine="vllm-v1", step_seconds=0.03,
                  sd_step_seconds=0.08, sd_step_gamma=3)
    (short,) = recommend(setup, np.array([1, 64, 256]), np.arange(1, 4), "alpha", [0.8]).shortfalls
    assert short.role == "target" and short.more_gpus == (8,) and "fp8" in short.smaller_dtypes


@pytest.mark.parametrize("target", sorted(FAMILIES))
def test_every_family_predicts_with_every_drafter_on_the_new_gpus(target):
    drafters = ["eagle", "eagle3", "medusa", "ngram"] + (["mtp"] if resolve_model(target).mtp_layers else [])
    for hardware in ("B300", "GB200", "GB300", "MI325X", "L40S"):
        for dtype in ("fp8", "mxfp8", "w4a16"):
            for draft in drafters:
                setup = Setup(target, draft, hardware, tp=8, dtype=dtype, kv_dtype="fp8")
                frame = predict_sd(setup, [1, 64], 2, 0.6)
                assert (frame["speedup"] > 0).all() and np.isfinite(frame["speedup"]).all(), (hardware, draft)


def test_rows_that_fit_keep_exactly_the_batch_sizes_memory_fit_admits():
    setup = Setup("qwen3-30b-a3b", "qwen3-0.6b", "H100", dtype="bf16", context=32768)
    frame = predict_sd(setup, [1, 64, 1024, 4096], [2, 3], 0.7)
    kept = rows_that_fit(frame, setup)
    fits = memory_fit(setup, [1, 64, 1024, 4096], 32768).set_index("batch_size")["fits"]
    assert set(kept["batch_size"]) == set(fits.index[fits])
    assert 0 < len(kept) < len(frame) and list(kept.index) == sorted(kept.index)  # some cut, the order kept


def test_speedup_shape_reads_the_best_gamma_curve_by_hand():
    # best over gamma: 1.5 at B = 1, 1.2 at 2 (a dip), 2.0 at 4 (the peak, gamma 3), 1.5 at 8, 0.9 at 16
    frame = pd.DataFrame({"batch_size": [1, 1, 2, 2, 4, 4, 8, 8, 16, 16], "gamma": [2, 3] * 5,
                          "speedup": [1.5, 1.4, 1.2, 1.1, 1.9, 2.0, 1.5, 1.4, 0.9, 0.8]})
    shape = speedup_shape(frame)
    assert (shape.batch_sizes, shape.largest_batch_size, shape.at_one) == (5, 16, 1.5)
    assert (shape.lowest_before_peak, shape.lowest_before_peak_at) == (1.2, 2)
    assert (shape.peak, shape.peak_at, shape.peak_gamma) == (2.0, 4, 3)
    assert (shape.band_low, shape.band_high) == (4, 8)  # 1.2 < 2 / sqrt(2) <= 1.5; 0.9 <= 1 ends it
    assert speedup_shape(frame.assign(speedup=frame["speedup"] / 3)).band_low is None  # SD pays nowhere
    assert best_speedup(frame).to_dict() == {1: 1.5, 2: 1.2, 4: 2.0, 8: 1.5, 16: 0.9}


def test_a_one_layer_draft_on_the_target_s_gpus_predicted_where_it_fits():
    setup = one_layer_draft_setup("qwen3-30b-a3b", "H100", 1, "bf16", context=32768)
    assert (setup.tp, setup.draft_tp, setup.shared, setup.context) == (1, 1, True, 32768)
    assert setup.draft.num_layers == 1 and setup.draft.num_experts == setup.target.num_experts
    frame = predict_fitting(setup, [1, 64, 1024, 4096], [2, 3], 0.7)
    assert frame.equals(rows_that_fit(predict_sd(setup, [1, 64, 1024, 4096], [2, 3], alpha=0.7), setup))
    columns = narration.shape_columns(speedup_shape(frame), 4)
    assert columns["B that fit"].startswith(f"{frame['batch_size'].nunique()} of 4, up to ")
    assert columns["peak speedup"] == frame["speedup"].max()


def test_a_step_s_table_is_its_frame_in_ms_gb_and_gflop():
    step = step_time("qwen2-57b-a14b", "H800", 1, 32, context=256, tp=2)
    frame, table = step.frame(), step.table()
    assert list(table.columns) == ["ms", "GB per GPU", "GFLOP per GPU"] and list(table.index) == list(frame.index)
    np.testing.assert_allclose(table["ms"].sum(), 1e3 * step.total)
    np.testing.assert_allclose(table[["GB per GPU", "GFLOP per GPU"]].to_numpy() * 1e9,
                               frame[["bytes", "flops"]].to_numpy())
