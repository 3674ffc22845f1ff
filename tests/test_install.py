"""The installs: pinned files that public registries serve, the GPU venv's pins, and the Makefile's install steps.

What pip then fetches on another machine needs that machine and its network; these tests check, offline, what
the files and the Makefile tell pip to do (``make -n`` prints a recipe without running it).
"""

import platform
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PINNED = ("requirements.txt", "requirements-vllm.txt", "requirements-gpu.txt")
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)\s*$")


def pins(name: str) -> dict[str, str]:
    """Package name: pinned version, of a pinned file of the repository."""
    found = (PIN.match(line) for line in (ROOT / name).read_text().splitlines())
    return {match[1].lower(): match[2] for match in found if match}


def via(name: str) -> dict[str, set[str]]:
    """Package name: what requires it, from pip-compile's ``# via`` notes (``-r requirements.txt`` for an input)."""
    notes, package = {}, None
    for line in (ROOT / name).read_text().splitlines():
        if match := PIN.match(line):
            package = match[1].lower()
            notes[package] = set()
        elif package and line.startswith("    #") and (source := line.strip("# ").removeprefix("via").strip()):
            notes[package].add(source.lower())
    return notes


def recipe(*arguments: str) -> list[str]:
    """The commands ``make -n -B`` prints for ``arguments`` (a target and variables), one a line."""
    done = subprocess.run(["make", "-n", "-B", *arguments], cwd=ROOT, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin:/usr/local/bin"})
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_every_pinned_file_pins_the_lock_torch_without_a_label_no_named_index_serves():
    """A local label (+cpu) is served by no public registry: only where the file names an index that has it."""
    torch = pins("requirements.txt")["torch"]
    for name in PINNED:
        pinned = pins(name)
        assert len(pinned) > 100, name  # the file parsed
        text = (ROOT / name).read_text()
        names_an_index = re.search(r"^\s*(--index-url|--extra-index-url|-i|--find-links|-f)\b", text, re.M)
        labelled = {package: version for package, version in pinned.items() if "+" in version}
        assert not labelled or names_an_index, f"{name}: {labelled} with no index that serves them"
        assert pinned["torch"] == torch and Version(torch).local is None, name


def test_the_bare_pin_matches_the_cpu_build_and_pip_prefers_that():
    """PEP 440, as pip applies it: ==2.13.0 admits 2.13.0+cpu, which sorts after 2.13.0 (so an index with it wins)."""
    torch = pins("requirements.txt")["torch"]
    assert SpecifierSet(f"=={torch}").contains(f"{torch}+cpu")
    assert Version(f"{torch}+cpu") > Version(torch)
    assert not SpecifierSet(f"=={torch}").contains(f"{Version(torch).major}.{Version(torch).minor + 1}.0+cpu")


@pytest.mark.skipif(platform.system() != "Linux", reason="the CPU index is added on Linux only")
@pytest.mark.parametrize("target, pinned", [(".venv/.installed", "requirements.txt"),
                                            (".venv-vllm/.installed", "requirements-vllm.txt")])
def test_linux_installs_take_torch_first_with_pytorchs_cpu_index(target, pinned):
    lines = recipe(target)
    torch = next(i for i, line in enumerate(lines) if '"torch==' in line)
    rest = next(i for i, line in enumerate(lines) if f"-r {pinned}" in line)
    assert torch < rest  # torch is in place before the pins, which then keep it
    assert f'--no-deps --extra-index-url {CPU_INDEX} --retries 1 --timeout 20 "torch=={pins(pinned)["torch"]}"' \
        in lines[torch]
    without = recipe(target, "TORCH_INDEX=")
    assert not any("--extra-index-url" in line for line in without)
    assert any(f"-r {pinned}" in line for line in without)


def test_ci_installs_from_the_lock():
    """.ci/run installs nothing itself: make book and make test build .venv from requirements.txt."""
    ci = (ROOT / ".ci" / "run").read_text()
    commands = [line.strip() for line in ci.splitlines() if line.strip().startswith("make ")]
    assert {"make book", "make test"} <= set(commands)
    assert "pip install" not in ci and "requirements" not in ci
    for target in ("book", "test", "lint"):
        assert any(line.startswith(".venv/bin/python -m pip install") and "-r requirements.txt" in line
                   for line in recipe(target)), target


def test_make_gpu_installs_the_gpu_pins_and_refuses_a_cpu_build():
    lines = recipe("gpu")
    assert lines[0] == "test -x .venv-gpu/bin/python || python3 -m venv .venv-gpu"
    installs = [line for line in lines if " -m pip install " in line]
    assert [line.split(" -m pip install ")[0] for line in installs] == [".venv-gpu/bin/python"] * 2
    assert installs[0].endswith("-r requirements-gpu.txt") and installs[1].endswith("--no-build-isolation -e .")
    assert any("torch.version.cuda or sys.exit(" in line for line in lines)  # a CPU build stops it, saying why
    assert lines[-2:] == [".venv-gpu/bin/moesd hardware", "touch .venv-gpu/.installed"]


def test_make_gpu_takes_another_cuda_build_from_a_named_index():
    index = "https://download.pytorch.org/whl/cu126"
    installs = [line for line in recipe("gpu", f"GPU_TORCH_INDEX={index}") if " -m pip install " in line]
    torch = pins("requirements.txt")["torch"]
    assert installs[0].endswith(f'--index-url {index} "torch=={torch}"')
    assert installs[1].endswith("-r requirements.txt")  # the lock's pins, which the CUDA build satisfies


def test_gpu_pins_are_the_lock_apart_from_torchs_build_and_its_cuda_libraries():
    lock, gpu = pins("requirements.txt"), pins("requirements-gpu.txt")
    for package, version in lock.items():
        assert package in gpu, package
        assert Version(gpu[package]).public == Version(version).public, package
        assert package == "torch" or gpu[package] == version, package
    notes = via("requirements-gpu.txt")
    assert notes["torch"] == {"-r requirements.txt"}  # compiled from the lock itself

    def for_torch(package, seen=frozenset()):  # required by torch alone, through packages the lock lacks
        sources = notes[package]
        return bool(sources) and "-r requirements.txt" not in sources and all(
            source == "torch" or (source not in lock and source not in seen and for_torch(source, seen | {source}))
            for source in sources)

    extra = sorted(set(gpu) - set(lock))
    assert extra and all(for_torch(package) for package in extra), extra
    assert "triton" in extra and any(package.startswith("nvidia-cudnn") for package in extra)
    assert "requirements.txt" in (ROOT / "requirements-gpu.txt").read_text().split("#    pip-compile")[1].split("\n")[0]


def test_make_lock_drops_the_cpu_label_of_torch_alone(tmp_path):
    """The sed line of make lock, run on a copy: 2.13.0+cpu loses its label, other lines keep theirs."""
    sed = next(line for line in recipe("lock") if line.startswith("sed "))
    arguments = shlex.split(sed)
    assert arguments[-2:] == ["requirements.txt", "requirements-vllm.txt"]
    copy = tmp_path / "requirements.txt"
    copy.write_text("torch==2.13.0+cpu\n    # via moesd\ntorchvision==0.28.0+cpu\ntorch-x==1.0+cpu\n")
    subprocess.run([*arguments[:-2], str(copy)], check=True)
    assert copy.read_text() == "torch==2.13.0\n    # via moesd\ntorchvision==0.28.0+cpu\ntorch-x==1.0+cpu\n"


def test_the_cuda_build_check_of_make_gpu_refuses_this_pythons_cpu_build():
    """make gpu's last check, run with this Python: it passes a CUDA build and stops a CPU one, saying why."""
    import sys

    import torch

    check = next(line for line in recipe("gpu") if "torch.version.cuda or sys.exit(" in line)
    assert check.startswith(".venv-gpu/bin/python -c ")
    done = subprocess.run([sys.executable, *shlex.split(check)[1:]], capture_output=True, text=True)
    if torch.version.cuda:  # run in .venv-gpu
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode == 1 and f"make gpu: torch {torch.__version__} in .venv-gpu is a CPU build" in done.stderr
