"""Sizing a GPU sweep to the GPU (moesd.sweeps.layers_that_fit) and the GPU run script's plan (tools/gpu_run.py)."""

import subprocess
import sys
from pathlib import Path

import pytest

from moesd._checks import UsageError
from moesd.sweeps import gpu_label, layers_that_fit
from moesd.zoo import get_model

ROOT = Path(__file__).resolve().parents[1]


def weight_bytes(name: str, layers: int | None = None) -> float:
    return 2.0 * get_model(name).weight_counts(num_layers=layers)["total"]


@pytest.mark.parametrize("gib", [12, 24, 40, 78, 139])
@pytest.mark.parametrize("target, draft", [("qwen2-57b-a14b", "qwen2-0.5b"), ("opt-30b", "opt-350m")])
def test_the_layers_fit_and_one_more_would_not(target, draft, gib):
    memory = gib * 2**30
    layers = layers_that_fit(target, draft, memory)
    assert weight_bytes(target, layers) + weight_bytes(draft) <= 0.8 * memory
    if layers < get_model(target).architecture().num_layers:
        assert weight_bytes(target, layers + 1) + weight_bytes(draft) > 0.8 * memory


def test_qwen2_57b_fits_an_h200_whole_and_an_h100_in_part():
    # Model card: 57B parameters, 2 bytes each in bf16 (114 GB); the lent H200 shows about 139 GiB
    # (149 GB) free, the H100 about 78 GiB (84 GB): 80 % of them hold 119 GB and 67 GB.
    assert layers_that_fit("qwen2-57b-a14b", "qwen2-0.5b", 139 * 2**30) == 28
    h100 = layers_that_fit("qwen2-57b-a14b", "qwen2-0.5b", 78 * 2**30)
    assert 28 * 67 / 114 * 0.9 < h100 < 28 * 67 / 114  # the layers' share of 67 GB, less embeddings and draft
    assert layers_that_fit("qwen2-57b-a14b", "qwen2-0.5b", 78 * 2**30, bytes_per_parameter=4) < h100


@pytest.mark.parametrize("kwargs, fragment", [
    ({"memory_bytes": 1e9}, "one layer of qwen2-57b-a14b and the whole qwen2-0.5b need"),
    ({"memory_bytes": 0}, "memory_bytes must be a finite number > 0"),
    ({"memory_bytes": float("nan")}, "memory_bytes must be a finite number > 0"),
    ({"memory_bytes": True}, "memory_bytes must be a finite number > 0"),
    ({"memory_bytes": 80e9, "share": 1.5}, "share must be in (0, 1]"),
    ({"memory_bytes": 80e9, "bytes_per_parameter": -2}, "bytes_per_parameter must be a finite number > 0"),
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
    """--dry-run prints the sweeps a stage would run; without OUT or a GPU the script says what is missing."""
    env = {"PATH": "/usr/bin:/bin", "OUT": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, "tools/gpu_run.py", "forward", "--dry-run"], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert f"sweep forward --preset gpu --layers {layers_that_fit('qwen2-57b-a14b', 'qwen2-0.5b', 80 * 2**30)} " \
           f"--out-dir {tmp_path}/h100" in run.stdout
    run = subprocess.run([sys.executable, "tools/gpu_run.py", "env", "--dry-run"], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("sweep ") == 3 and "hardware --measure --device cuda --dtype bfloat16" in run.stdout
    assert "cuda_graph_probe.py" in run.stdout
    run = subprocess.run([sys.executable, "tools/gpu_run.py", "e2e"], cwd=ROOT, env={**env, "OUT": ""},
                         capture_output=True, text=True)
    assert run.returncode != 0 and "OUT is not set" in run.stderr
    if not any((Path(p) / "nvidia-smi").exists() for p in env["PATH"].split(":")):
        run = subprocess.run([sys.executable, "tools/gpu_run.py", "e2e"], cwd=ROOT, env=env, capture_output=True,
                             text=True)
        assert run.returncode != 0 and "no nvidia-smi here" in run.stderr


def test_the_cuda_graph_probe_times_a_repeatable_static_cache_step_on_the_cpu(capsys):
    """The probe's eager part: a forward over a rewound static cache gives the dynamic cache's logits (exit 0)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("cuda_graph_probe", ROOT / "tools" / "cuda_graph_probe.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--device", "cpu", "--layers", "1", "--width", "0.05", "--repeats", "1"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("B ")]
    assert len(rows) == 4 and all("static = dynamic cache True" in row for row in rows)
