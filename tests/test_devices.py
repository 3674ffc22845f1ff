"""This machine's torch build and GPUs (moesd.measure.devices) and what moesd hardware prints of them.

No GPU here: the GPU cases stand torch.cuda's answers in with monkeypatch, as a CUDA build would give them.
"""

import types
import warnings

import pytest
import torch

from moesd.cli import main
from moesd.measure.devices import local_devices, matching_record
from moesd.theory.roofline import HARDWARE

H100 = types.SimpleNamespace(name="NVIDIA H100 80GB HBM3", total_memory=85_028_896_768, major=9, minor=0)
A6000 = types.SimpleNamespace(name="NVIDIA RTX A6000", total_memory=51_041_271_808, major=8, minor=6)


def cuda_build(monkeypatch, gpus=(), warning=None, error=None):
    """torch as a CUDA 13.0 build would answer on a machine with ``gpus`` (``warning`` when it looks, ``error``
    when it initialises CUDA)."""
    def is_available():
        if warning:
            warnings.warn(warning, UserWarning)
        return bool(gpus)

    def init():
        if error:
            raise RuntimeError(error)

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "init", init)
    monkeypatch.setattr(torch.cuda, "is_available", is_available)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(gpus))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: gpus[index])


def test_records_match_whole_names_and_the_nearest_memory():
    assert matching_record("NVIDIA H100 80GB HBM3", 85e9) == "H100"
    assert matching_record("NVIDIA H200", 150e9) == "H200"  # not H20, a prefix of it
    assert matching_record("NVIDIA A100-SXM4-80GB", 85e9) == "A100"
    assert matching_record("NVIDIA H20", 97e9) == "H20"
    assert matching_record("NVIDIA H20", 150e9) == "H20-141GB"  # two records of one name: the memory decides
    assert matching_record("NVIDIA GeForce RTX 4090", 25e9) is None
    assert matching_record("AMD Instinct MI300X", 206e9) == "MI300X"
    assert all(matching_record(f"NVIDIA {key}", HARDWARE[key].memory_bytes) == key for key in HARDWARE if key != "CPU")


def test_this_cpu_build_sees_no_gpu():
    here = local_devices()
    assert here.torch == torch.__version__ and here.gpus == ()
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:  # the lock's CPU build
        assert here.build == "CPU" and here.unavailable is None


def test_a_cuda_build_reports_each_gpu_with_its_record_and_folder(monkeypatch):
    cuda_build(monkeypatch, gpus=(H100, A6000))
    here = local_devices()
    assert here.build == "CUDA 13.0" and here.unavailable is None
    assert [(g.index, g.record, g.folder, g.capability) for g in here.gpus] == [
        (0, "H100", "h100", (9, 0)), (1, None, "nvidia-rtx-a6000", (8, 6))]
    assert here.gpus[0].memory_bytes == H100.total_memory


def test_a_cuda_build_without_a_usable_gpu_says_why(monkeypatch):
    cuda_build(monkeypatch, warning="CUDA initialization: The NVIDIA driver on your system is too old\n (found 12040).")
    here = local_devices()
    assert here.gpus == () and here.unavailable.endswith("driver on your system is too old (found 12040).")
    cuda_build(monkeypatch, error="Found no NVIDIA driver on your system.")
    assert local_devices().unavailable == "Found no NVIDIA driver on your system."
    cuda_build(monkeypatch)
    assert local_devices().unavailable == "torch.cuda.is_available() is False"


def test_moesd_hardware_prints_this_machine(monkeypatch, capsys):
    main(["hardware"])
    out = capsys.readouterr().out
    assert f"this machine: torch {torch.__version__}" in out
    cuda_build(monkeypatch, gpus=(H100,))
    main(["hardware"])
    out = capsys.readouterr().out
    assert "CUDA 13.0 build; 1 GPU(s):" in out
    row = next(line for line in out.splitlines() if line.lstrip().startswith("cuda:0"))
    assert row.split()[1:] == ["NVIDIA", "H100", "80GB", "HBM3", "85.03", "9.0", "H100", "h100"]


def test_without_torch_the_report_says_so(monkeypatch, capsys):
    import builtins

    real_import = builtins.__import__

    def no_torch(name, *args, **kwargs):
        if name == "torch":
            raise ImportError("No module named 'torch'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    here = local_devices()
    assert here.torch is None and here.build == "none" and here.gpus == ()
    main(["hardware"])
    assert "this machine: torch is not installed" in capsys.readouterr().out


@pytest.mark.parametrize("build, expected", [(("12.6", None), "CUDA 12.6"), ((None, "6.4"), "ROCm 6.4"),
                                             ((None, None), "CPU")])
def test_build_names(build, expected):
    from moesd.measure.devices import LocalDevices

    assert LocalDevices(torch="2.13.0", cuda=build[0], hip=build[1], gpus=(), unavailable=None).build == expected
