"""Sizing a GPU sweep to the GPU (moesd.measure.presets.layers_that_fit) and the GPU run script's plan (tools/gpu_run.py)."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from moesd._checks import UsageError
from moesd.measure.presets import (DERIVED, PAIRS, PRESETS, PRESETS_TABLE, layers_that_fit, load_presets, preset,
                                   preset_settings, proportional_draft_layers, with_overrides)
from moesd.measure.sweeps import STUDIES
from moesd.measure.sweep_memory import cached_tokens
from moesd.measure.sweeps import SweepConfig, gpu_label
from moesd.zoo import get_model

ROOT = Path(__file__).resolve().parents[1]


def memory_bytes(name: str, layers: int | None = None, cached: int = 0) -> float:
    """bf16 weights and KV cache: the zoo's parameter count and 2 kv_heads head_dim values per token and layer."""
    spec = get_model(name)
    config = spec.config_dict(layers, None, 1.0)
    heads = config.get("num_key_value_heads", config["num_attention_heads"])
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return 2.0 * (spec.weight_counts(num_layers=layers)["total"]
                  + 2 * heads * head_dim * config["num_hidden_layers"] * cached)


@pytest.mark.parametrize("cached", [0, 40_000])
@pytest.mark.parametrize("gib", [12, 24, 40, 78, 139])
@pytest.mark.parametrize("target, draft", [("qwen2-57b-a14b", "qwen2-0.5b"), ("opt-30b", "opt-350m")])
def test_the_layers_fit_and_one_more_would_not(target, draft, gib, cached):
    memory = gib * 2**30
    try:
        layers = layers_that_fit(target, draft, memory, cached_tokens=cached)
    except UsageError:
        assert memory_bytes(target, 1, cached) + memory_bytes(draft, None, cached) > 0.8 * memory
        return
    assert memory_bytes(target, layers, cached) + memory_bytes(draft, None, cached) <= 0.8 * memory
    if layers < get_model(target).architecture().num_layers:
        assert memory_bytes(target, layers + 1, cached) + memory_bytes(draft, None, cached) > 0.8 * memory


def test_qwen2_57b_fits_an_h200_whole_and_an_h100_in_part():
    # Model card: 57B parameters, 2 bytes each in bf16 (114 GB); the lent H200 shows about 139 GiB
    # (149 GB) free, the H100 about 78 GiB (84 GB): 80 % of them hold 119 GB and 67 GB.
    assert layers_that_fit("qwen2-57b-a14b", "qwen2-0.5b", 139 * 2**30) == 28
    h100 = layers_that_fit("qwen2-57b-a14b", "qwen2-0.5b", 78 * 2**30)
    assert 28 * 67 / 114 * 0.9 < h100 < 28 * 67 / 114  # the layers' share of 67 GB, less embeddings and draft
    assert layers_that_fit("qwen2-57b-a14b", "qwen2-0.5b", 78 * 2**30, bytes_per_parameter=4) < h100


def test_the_opt_pair_s_cache_costs_layers_on_an_h100():
    # OPT-30b: 48 layers of full multi-head attention, hidden 7168 (model card): 2 x 7168 values per token and
    # layer, 1.4 MB per token in bf16; 40 000 cached tokens are 55 GB, so the 60 GB of weights no longer all fit.
    assert layers_that_fit("opt-30b", "opt-350m", 78 * 2**30) == 48
    assert layers_that_fit("opt-30b", "opt-350m", 78 * 2**30, cached_tokens=40_000) < 30


def test_cached_tokens_of_the_gpu_presets():
    forward = SweepConfig(**preset_settings("forward", "gpu"))
    assert cached_tokens(forward) == sum(forward.batch_sizes) * (64 + 5)  # every B at once, room for s = 5
    e2e = SweepConfig(**preset_settings("e2e", "gpu"))
    assert cached_tokens(e2e) == 100 * (64 + (1 + 8 + 1) * 5)  # the largest batch after every round at gamma 4


@pytest.mark.parametrize("kwargs, fragment", [
    ({"memory_bytes": 1e9}, "one layer of qwen2-57b-a14b and the whole qwen2-0.5b, with 0 cached tokens, need"),
    ({"memory_bytes": 80e9, "cached_tokens": -1}, "cached_tokens must be >= 0"),
    ({"memory_bytes": 0}, "memory_bytes must be a number > 0"),
    ({"memory_bytes": float("nan")}, "memory_bytes must be a number > 0"),
    ({"memory_bytes": True}, "memory_bytes must be a number > 0"),
    ({"memory_bytes": 80e9, "share": 1.5}, "share must be a number in (0, 1]"),
    ({"memory_bytes": 80e9, "bytes_per_parameter": -2}, "bytes_per_parameter must be a number > 0"),
])
def test_bad_sizes_are_refused_by_name(kwargs, fragment):
    with pytest.raises(UsageError) as caught:
        layers_that_fit("qwen2-57b-a14b", "qwen2-0.5b", **kwargs)
    assert fragment in str(caught.value)


def test_an_unknown_model_is_refused():
    with pytest.raises(UsageError, match="target"):
        layers_that_fit("no-such-model", "qwen2-0.5b", 80e9)


def test_gpu_labels_follow_the_driver_names():
    assert gpu_label("NVIDIA H100 80GB HBM3") == "h100"
    assert gpu_label("NVIDIA H200") == "h200"
    assert gpu_label("NVIDIA A800-SXM4-80GB") == "a800"
    assert gpu_label("Tesla V100-SXM2-32GB") == "tesla-v100-sxm2-32gb"


def test_the_gpu_run_plan_without_a_gpu(tmp_path):
    """--dry-run prints the plan of one call; without OUT or a GPU the script says what is missing."""
    (tmp_path / "data" / "measurements").mkdir(parents=True)  # no GPU files yet
    shutil.copytree(ROOT / "data" / "paper", tmp_path / "data" / "paper")  # the settings study's workloads
    env = {"PATH": "/usr/bin:/bin", "OUT": str(tmp_path), "HF_HUB_OFFLINE": "1", "MOESD_DATA": str(tmp_path / "data")}

    def gpu_run(*arguments, **changes):
        return subprocess.run([sys.executable, "tools/gpu_run.py", *arguments], cwd=ROOT, env={**env, **changes},
                              capture_output=True, text=True)

    plan = gpu_run("--dry-run", "--work", str(tmp_path / "work"))
    assert plan.returncode == 0, plan.stderr
    sweeps = [line for line in plan.stdout.splitlines() if line.startswith("$ sweep ")]
    assert [line.split()[2] for line in sweeps] == ["forward", "dense_forward", "e2e", "sparsity", "dense",
                                                    "settings"]  # the plan's order
    assert "hardware --measure --device cuda --dtype bfloat16" in plan.stdout and "cuda_graph_probe.py" in plan.stdout
    layers = {line.split()[2]: int(re.search(r"--layers (\d+)", line).group(1)) for line in sweeps}
    assert layers["forward"] == layers["e2e"] == layers["sparsity"] == layers["settings"] == 28  # all of them on an H200
    assert layers["dense_forward"] == layers["dense"] < 48  # the OPT pair's KV cache takes memory too
    assert all(line.split("--out-dir ")[1].split()[0] == str(tmp_path / "work" / "h200") for line in sweeps)
    assert all("--cuda-graphs" in line for line in sweeps)  # the probe passes in a dry run: graphs for every study
    assert not (tmp_path / "gpu_results.tar.gz").exists()  # a dry run writes nothing
    some = gpu_run("e2e", "--dry-run", "--work", str(tmp_path / "work"))
    assert some.returncode == 0 and some.stdout.count("$ sweep ") == 1, some.stderr
    routed = gpu_run("forward_popularity", "--dry-run", "--work", str(tmp_path / "work"))  # only when named
    line = next(line for line in routed.stdout.splitlines() if line.startswith("$ sweep "))
    assert "--routing popularity --routing-source olmoe/github" in line and line.split()[2] == "forward"
    assert line.split("--out-dir ")[1].split()[0] == str(tmp_path / "work" / "h200-popularity-routing")
    unknown = gpu_run("e2e", "bogus", "--dry-run")
    assert unknown.returncode != 0 and "unknown stage bogus" in unknown.stderr
    for changes in ({"OUT": ""}, {"CUDA_VISIBLE_DEVICES": ""}):  # without the device tool too: no GPU here
        refused = gpu_run("e2e", **changes)
        assert refused.returncode != 0 and "torch sees no GPU here" in refused.stderr and "make gpu" in refused.stderr


@pytest.mark.integration  # the probe (tools/cuda_graph_probe.py) builds torch models
def test_the_cuda_graph_probe_times_a_repeatable_static_cache_step_on_the_cpu(capsys):
    """The probe's eager part: a forward over a rewound static cache gives the dynamic cache's logits (exit 0)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("cuda_graph_probe", ROOT / "tools" / "cuda_graph_probe.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--device", "cpu", "--layers", "1", "--width", "0.05", "--repeats", "1"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("B ")]
    assert len(rows) == 4 and all("static - dynamic logits" in row and "graph" not in row for row in rows)


def test_gpu_run_resumes_from_the_data_folder(tmp_path):
    """A stage resumes with the layers of the committed partial file, skips a complete one, refuses another GPU's."""
    import json

    data, work = tmp_path / "data", tmp_path / "work"
    (data / "measurements" / "h200").mkdir(parents=True)
    shutil.copytree(ROOT / "data" / "paper", data / "paper")
    sidecar = data / "measurements" / "h200" / "forward.json"
    env = {"PATH": "/usr/bin:/bin", "OUT": str(tmp_path), "HF_HUB_OFFLINE": "1", "MOESD_DATA": str(data)}

    def plan(*stages, **fields):
        sidecar.write_text(json.dumps({"device": "NVIDIA H200", "complete": False, "settings": {"layers": 12},
                                       **fields}))
        sidecar.with_suffix(".csv").write_text("run,role\n")
        shutil.rmtree(work, ignore_errors=True)
        return subprocess.run([sys.executable, "tools/gpu_run.py", *(stages or ("forward",)), "--dry-run", "--work",
                               str(work)], cwd=ROOT, env=env, capture_output=True, text=True)

    partial = plan()
    assert partial.returncode == 0 and "--layers 12 --draft-layers 24 " in partial.stdout, partial.stderr
    assert (work / "h200" / "forward.json").exists() and (work / "h200" / "forward.csv").exists()
    complete = plan(complete=True)
    assert complete.returncode == 0 and "is complete; nothing to measure" in complete.stdout
    other = plan(device="NVIDIA H200 NVL")
    assert other.returncode != 0 and "was measured on 'NVIDIA H200 NVL'" in other.stderr
    sibling = plan("e2e", "sparsity", "dense_forward", settings={"layers": 12, "draft_layers": 5})
    lines = {line.split()[2]: line for line in sibling.stdout.splitlines() if line.startswith("$ sweep")}
    assert all("--layers 12 --draft-layers 5 " in lines[s] for s in ("e2e", "sparsity")), sibling.stdout  # the pair's
    assert "--layers 12 " not in lines["dense_forward"]  # the dense pair is sized on its own


@pytest.mark.parametrize("target, draft", [("qwen2-57b-a14b", "qwen2-0.5b"), ("opt-30b", "opt-350m")])
def test_the_draft_keeps_the_share_of_its_depth_that_the_target_keeps(target, draft):
    depth, draft_depth = get_model(target).num_layers, get_model(draft).num_layers
    kept = [proportional_draft_layers(target, draft, layers) for layers in range(1, depth + 1)]
    assert kept[-1] == draft_depth and min(kept) >= 1 and kept == sorted(kept)
    assert all(abs(k / draft_depth - layers / depth) <= 0.5 / draft_depth + 1e-12
               for layers, k in enumerate(kept, 1) if k > 1)
    for bad in (0, depth + 1, 2.5):
        with pytest.raises(UsageError, match="layers"):
            proportional_draft_layers(target, draft, bad)


def test_a_sidecar_s_settings_rebuild_its_config():
    """JSON turns gamma keys into strings; SweepConfig(**sidecar["settings"]) takes them back."""
    import json

    for study in ("e2e", "settings", "sparsity", "forward"):
        config = SweepConfig(**preset_settings(study))
        again = SweepConfig(**json.loads(json.dumps(config.settings())))
        assert again.settings() == config.settings()


def test_the_cpu_preset_s_derived_shape_follows_the_target_and_its_layers():
    from moesd.measure.presets import with_overrides
    from moesd.zoo import depth_scaled_vocab

    four = with_overrides("e2e", "cpu", {"layers": 4})
    assert four["vocab_size"] == depth_scaled_vocab("qwen2-57b-a14b", 4) and four["draft_layers"] == 3  # 24 x 4/28
    other = with_overrides("forward", "cpu", {"target": "qwen3-30b-a3b", "draft": "qwen3-0.6b"})
    assert other["vocab_size"] == depth_scaled_vocab("qwen3-30b-a3b", 1)
    kept = with_overrides("e2e", "cpu", {"layers": 4, "vocab_size": 1000, "draft_layers": 2})
    assert kept["vocab_size"] == 1000 and kept["draft_layers"] == 2  # what is given is kept
    pretrained = with_overrides("e2e", "cpu", {"weights": "pretrained"})
    assert pretrained["layers"] is None and pretrained["vocab_size"] is None and pretrained["width"] == 1.0
    assert with_overrides("e2e", "gpu", {"layers": 14}).get("vocab_size") is None  # the GPU preset keeps its vocabulary
    assert SweepConfig(**four).vocab_size == four["vocab_size"]


def test_memory_of_a_local_checkpoint_is_its_own_shape(tmp_path):
    """A pretrained sweep of local folders is sized by their config.json, not by the zoo's full model."""
    from moesd.measure.sweep_memory import memory_needed

    folders = {}
    for role, name in (("target", "qwen3-30b-a3b"), ("draft", "qwen3-0.6b")):
        folder = tmp_path / role
        folder.mkdir()
        config = get_model(name).config_dict(num_layers=1, width=1 / 16)
        (folder / "config.json").write_text(json.dumps({**config, "model_type": get_model(name).model_type}))
        folders[f"{role}_path"] = str(folder)
    settings = dict(study="e2e", target="qwen3-30b-a3b", draft="qwen3-0.6b", weights="pretrained",
                    batch_sizes=(1,), gammas=(2,), context=8, rounds=1, warmup_rounds=0, repeats=1)
    local = memory_needed(SweepConfig(**settings, **folders))["weights"]
    zoo = memory_needed(SweepConfig(**settings))["weights"]
    assert local < zoo / 100


def test_every_preset_of_the_table_is_a_valid_sweep_of_a_paper_pair():
    assert set(PRESETS) == {"cpu", "gpu"} and PAIRS == {"qwen2-57b-a14b": "qwen2-0.5b", "opt-30b": "opt-350m"}
    for name, studies in PRESETS.items():
        assert set(studies) == set(STUDIES)
        for study in STUDIES:
            settings = preset_settings(study, name)
            config = SweepConfig(**settings)
            assert config == preset(study, name) and config.study == study
            assert PAIRS[config.target] == config.draft
            assert (config.target == "opt-30b") == (study in ("dense", "dense_forward"))
            assert not any(isinstance(value, (list, str)) and key in DERIVED for key, value in settings.items())
            if name == "cpu":  # real widths cut in depth only, the draft and vocabulary derived from the cut
                assert config.layers == 1 and config.width == 1.0 and config.device == "cpu"
                assert config.draft_layers == proportional_draft_layers(config.target, config.draft, 1)
            else:  # the real shapes
                assert config.layers is None and config.device == "cuda" and config.context == 64


def test_overrides_of_the_cpu_preset_rederive_what_the_table_leaves_derived():
    given = {"layers": 2}
    settings = with_overrides("e2e", "cpu", given)
    assert settings["draft_layers"] == proportional_draft_layers("qwen2-57b-a14b", "qwen2-0.5b", 2)
    assert with_overrides("e2e", "gpu", given) == {**preset_settings("e2e", "gpu"), **given}  # nothing derived


@pytest.mark.parametrize(("change", "match"), [
    (lambda text: text.replace("[cpu.settings]", "[cpu.other]"), "must have the studies"),
    (lambda text: text.replace("context = 8", "contxt = 8", 1), "contxt"),
    (lambda text: text.replace('\nvocab_size = "depth-scaled"', '\nvocab_size = "scaled"', 1), "vocab_size"),
])
def test_a_preset_table_with_a_missing_study_or_a_wrong_setting_is_refused(tmp_path, change, match):
    path = tmp_path / "presets.toml"
    path.write_text(change(PRESETS_TABLE.read_text()))
    with pytest.raises(ValueError, match=match):
        load_presets(path)
