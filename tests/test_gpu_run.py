"""tools/gpu_run.py on a GPU of one's own (no $OUT: no budget, no archive) and on the lent machine ($OUT: 540 s).

No GPU here: the GPU query and the commands are stood in for, and the plan's stages, deadlines and files checked.
"""

import importlib.util
import math
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def gpu_run(monkeypatch, tmp_path):
    """The script as a module, on an H100 of 80 GiB free, each command recorded with its deadline and exit 0."""
    spec = importlib.util.spec_from_file_location("gpu_run", ROOT / "tools" / "gpu_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (tmp_path / "data" / "measurements").mkdir(parents=True)
    shutil.copytree(ROOT / "data" / "paper", tmp_path / "data" / "paper")
    monkeypatch.setenv("MOESD_DATA", str(tmp_path / "data"))
    monkeypatch.delenv("OUT", raising=False)
    monkeypatch.setattr(module, "gpu", lambda: ("NVIDIA H100 80GB HBM3", "h100", 80 * 2**30))
    module.commands = []

    def run(command, log, deadline, dry_run):
        module.commands.append((command, deadline))
        return 0

    monkeypatch.setattr(module, "run", run)
    return module


def studies(commands):
    return [command[command.index("sweep") + 1] for command, _ in commands if "sweep" in command]


def test_on_ones_own_gpu_every_stage_runs_to_its_end_into_the_data_folder(gpu_run, tmp_path, capsys):
    work = tmp_path / "data" / "measurements"
    assert gpu_run.main(["--work", str(work)]) == 0
    assert studies(gpu_run.commands) == ["forward", "dense_forward", "e2e", "sparsity", "dense", "settings"]
    assert all(math.isinf(deadline) for _, deadline in gpu_run.commands)  # no budget, no stage caps
    assert any(command[-1] == work / "h100" / "roofline_bfloat16.json" for command, _ in gpu_run.commands)
    assert (work / "h100" / "gpu_run.log").exists() and (work / "h100" / "environment.txt").exists()
    assert not list(tmp_path.rglob("gpu_results.tar.gz"))  # nothing packed without the device tool
    assert f"results in {work / 'h100'}" in capsys.readouterr().out


def test_on_the_lent_machine_a_budget_caps_the_stages_and_the_results_are_packed(gpu_run, tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv("OUT", str(out))
    assert gpu_run.main(["env", "forward", "--work", str(tmp_path / "work")]) == 0
    deadlines = [deadline for _, deadline in gpu_run.commands]
    assert all(math.isfinite(deadline) for deadline in deadlines)
    assert max(deadlines) - min(deadlines) <= gpu_run.STAGE_SECONDS["forward"] + 1  # the forward stage's cap
    assert (out / "gpu_results.tar.gz").exists() and (out / "gpu_run.log").exists()


def test_a_budget_given_caps_ones_own_run_too(gpu_run, tmp_path):
    assert gpu_run.main(["forward", "--seconds", "100", "--work", str(tmp_path / "work")]) == 0
    (_, deadline), = gpu_run.commands
    assert math.isfinite(deadline)
