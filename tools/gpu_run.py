"""Issue 15 on a lent GPU: the studies in a few calls of the device tool, each inside its 10-minute limit.

Run from the repository root on the device machine, whose python3 has torch and transformers
(moesd is imported from the repository, not installed). One call runs one or more stages in order
within one budget (``--seconds``, default 540), so that the machine's start is paid once for them:

    MOESD_COMMIT=<commit> python3 tools/gpu_run.py env forward forward_graphs
    MOESD_COMMIT=<commit> python3 tools/gpu_run.py dense_forward dense_forward_graphs e2e
    MOESD_COMMIT=<commit> python3 tools/gpu_run.py sparsity        # then dense, settings

Stages: ``env`` records the environment, the bf16 roofline (``moesd hardware --measure``), a smoke
run of each kind of study and tools/cuda_graph_probe.py; ``forward`` times T_T(B, s) and T_D(B, s) of
the Qwen2-57B-A14B / Qwen2-0.5B shapes, ``dense_forward`` the same for OPT-30b / OPT-350m; the
``*_graphs`` stages time the same forwards as CUDA graph replays (``--cuda-graphs``) into
``<gpu>-graphs/``; ``e2e``, ``sparsity``, ``dense`` and ``settings`` are the steady-state studies.
``MOESD_COMMIT`` names the commit in the sidecars (the machine's copy of the repository has no ``.git``).

A study stage runs ``moesd sweep <study> --preset gpu`` (real shapes, random bf16 weights built on the
GPU) into ``$OUT/<gpu>/`` (``h100``, ``h200``... from the GPU's name), starting from the files of
``data/measurements/<gpu>/`` that travelled with the repository: a study that the budget cuts
resumes in a later call once the files that came back are committed there (every finished point
is in them; the sweep writes each point atomically); a stage whose turn comes with under a minute
left is skipped and says so. The target keeps the most layers whose weights and KV cache, with the
draft's, fit 80 % of the GPU's free memory in every study of its pair
(:func:`moesd.sweeps.layers_that_fit`; all of Qwen2-57B-A14B's on an H200, about half on an H100),
and the draft keeps the same share of its layers (:func:`moesd.sweeps.proportional_draft_layers`), so
that the draft costs the target about what it would at full depth. A stage takes the layers of a file
of the same model pair already measured on this GPU, so that every study of a pair describes one
model; the sidecars record them. Each stage ends with a short summary; the whole log of the call is
``$OUT/gpu_run.log``. The device tool returns at most 8 files a call: ``env`` writes 3, a study
stage 2, the log 1, and a plan that would write more is refused.

Options: ``--seconds S`` is the call's budget; ``--layers L`` overrides the target's layers;
``--dry-run`` prints the commands without running them (on any machine).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from moesd.measurements import measurements_dir  # noqa: E402
from moesd.sweeps import (STUDIES, SweepConfig, cached_tokens, gpu_label, layers_that_fit,  # noqa: E402
                          preset_settings, proportional_draft_layers)

MOESD = [sys.executable, "-c", "import sys; from moesd.cli import main; sys.exit(main(sys.argv[1:]))"]
"""The moesd command, from the repository (nothing is installed on the device machine)."""
SMOKE = {"forward": ["--batch-sizes", "1", "32", "--repeats", "1"],
         "forward --cuda-graphs": ["--batch-sizes", "1", "32", "--repeats", "1"],
         "dense_forward": ["--batch-sizes", "1", "32", "--repeats", "1"],
         "dense_forward --cuda-graphs": ["--batch-sizes", "1", "32", "--repeats", "1"],
         "e2e": ["--batch-sizes", "1", "32", "--gammas", "2", "--repeats", "1", "--rounds", "8",
                 "--warmup-rounds", "1"]}
"""A smoke run of each kind of study: two batch sizes, two layers, few repeats."""
GRAPH_STAGES = ("forward_graphs", "dense_forward_graphs")
"""The forward studies again with ``--cuda-graphs``, into ``<gpu>-graphs/`` (``h100-graphs``...)."""
RETURNED_FILES = 8
"""The most files one call of the device tool brings back."""
LAST_STAGE_SECONDS = 60
"""A stage whose turn comes with less of the budget left is skipped (a model build alone takes longer)."""


def gpu() -> tuple[str, str, float]:
    """This GPU's name, its folder name (:func:`moesd.sweeps.gpu_label`) and free memory (bytes).

    Asked of torch in a process of its own (it sees what CUDA will use, MIG slices and
    ``CUDA_VISIBLE_DEVICES`` included), whose CUDA context ends with it instead of holding memory
    the sweep needs.
    """
    query = subprocess.run([sys.executable, "-c", "import torch; assert torch.cuda.is_available(), 'no CUDA device'; "
                            "print(torch.cuda.get_device_name()); print(torch.cuda.mem_get_info()[0])"],
                           capture_output=True, text=True)
    if query.returncode != 0:
        raise SystemExit(f"gpu_run: torch sees no GPU here ({query.stderr.strip().splitlines()[-1:]}); "
                         "run it on the GPU machine, or pass --dry-run")
    name, free = query.stdout.split("\n")[:2]
    return name, gpu_label(name), float(free)


def pair_studies(study: str) -> list[str]:
    """The studies whose GPU preset measures the same model pair as ``study`` (its target)."""
    target = preset_settings(study, "gpu")["target"]
    return [other for other in STUDIES if preset_settings(other, "gpu")["target"] == target]


def pair_layers(study: str, free: float) -> int:
    """Target layers for every study of the study's model pair: the fewest that any of them fits.

    The MoE studies (forward, e2e, sparsity, settings) and the dense ones (dense, dense_forward) each
    keep one layer count, so that their files describe the same model.
    """
    configs = [SweepConfig(**preset_settings(other, "gpu")) for other in pair_studies(study)]
    return min(layers_that_fit(c.target, c.draft, free, cached_tokens=cached_tokens(c)) for c in configs)


def measured_layers(study: str, folders: list) -> tuple[int, int | None] | None:
    """Target and draft layers of a result file of the study's model pair in ``folders`` (None if none)."""
    for folder in folders:
        for other in pair_studies(study):
            path = Path(folder) / f"{other}.json"
            if path.exists():
                settings = json.loads(path.read_text()).get("settings", {})
                if settings.get("layers"):
                    return settings["layers"], settings.get("draft_layers")
    return None


def resume_from_repository(study: str, label: str, folder: Path, name: str) -> dict:
    """Copy ``<measurements>/<label>/<study>.*`` into ``folder`` and return the sidecar (empty if none).

    ``<measurements>`` is :func:`moesd.measurements.measurements_dir` (the repository's
    ``data/measurements`` unless ``MOESD_DATA`` names another data folder). Refuses a file measured on
    another GPU of the same label (an H100 PCIe against an SXM).
    """
    shipped = measurements_dir() / label / f"{study}.json"
    if not shipped.exists():
        return {}
    sidecar = json.loads(shipped.read_text())
    if sidecar.get("device") != name:
        raise SystemExit(f"gpu_run: {shipped} was measured on {sidecar.get('device')!r}, this GPU is {name!r}; "
                         "move that file aside to measure afresh")
    for path in (shipped, shipped.with_suffix(".csv")):
        if path.exists() and not (folder / path.name).exists():
            shutil.copy(path, folder / path.name)
    return sidecar


def environment(path: Path) -> None:
    """nvidia-smi's view of the GPU and the versions of the Python packages moesd uses there."""
    from importlib.metadata import PackageNotFoundError, version

    lines = [subprocess.run(["nvidia-smi"], capture_output=True, text=True).stdout, f"python {sys.version}"]
    for name in ("torch", "transformers", "numpy", "pandas", "scipy", "safetensors", "tokenizers", "triton", "tqdm"):
        try:
            lines.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            lines.append(f"{name}: not installed")
    path.write_text("\n".join(lines) + "\n")


def run(command: list, log, deadline: float, dry_run: bool) -> int:
    """Run ``command``, its output appended to ``log``; kill it at ``deadline`` (time.monotonic)."""
    shown = command[3:] if command[:3] == MOESD else [Path(command[-1]).name]
    print("$ " + " ".join(map(str, shown)), flush=True)
    if dry_run:
        return 0
    log.write(f"$ {' '.join(map(str, command))}\n")
    log.flush()
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))  # carried wheels stay visible
    try:
        return subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=max(1.0, deadline - time.monotonic()),
                              env={**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1"}).returncode
    except subprocess.TimeoutExpired:
        log.write("gpu_run: stopped at the budget; the points finished before it are in the result file\n")
        print("  stopped at the budget (the points finished before it are in the result file)", flush=True)
        return 124


def summary(csv: Path) -> str:
    """Rows and points of a result file, and whether its sidecar says it is complete."""
    import pandas as pd

    if not csv.exists():
        return f"{csv.name}: none"
    rows = pd.read_csv(csv)
    sidecar = json.loads(csv.with_suffix(".json").read_text()) if csv.with_suffix(".json").exists() else {}
    settings = sidecar.get("settings", {})
    return (f"{csv.name}: {len(rows)} rows, complete {sidecar.get('complete')}, layers {settings.get('layers')}, "
            f"device {sidecar.get('device')}")


def measure_environment(folder: Path, log, deadline: float, dry_run: bool) -> int:
    """The ``env`` stage: environment, bf16 roofline, smoke runs and the CUDA graph probe (3 files in ``folder``)."""
    if not dry_run:
        environment(folder / "environment.txt")
    status = run(MOESD + ["hardware", "--measure", "--device", "cuda", "--dtype", "bfloat16",
                          "--json", folder / "roofline_bfloat16.json"], log, deadline, dry_run)
    smoke = Path("/tmp/gpu_run_smoke")
    shutil.rmtree(smoke, ignore_errors=True)
    for study, options in SMOKE.items():
        where = smoke / study.replace(" --", "_").replace("-", "_")
        code = run(MOESD + ["sweep", *study.split(), "--preset", "gpu", "--layers", "2", "--draft-layers", "2",
                            "--out-dir", where] + options, log, deadline, dry_run)
        csv = where / f"{study.split()[0]}.csv"
        print(f"  {study}: exit {code}; " + ("" if dry_run else summary(csv)))
    probe = [sys.executable, str(ROOT / "tools" / "cuda_graph_probe.py")]
    with open(os.devnull if dry_run else folder / "cuda_graphs.txt", "w") as graph_log:
        code = run(probe, graph_log, deadline, dry_run)
    print(f"  CUDA graph probe: exit {code}" + ("" if dry_run else "\n" + (folder / "cuda_graphs.txt").read_text()))
    return status


def measure_study(stage: str, out: Path, label: str, name: str, free: float, layers: int | None, log,
                  deadline: float, dry_run: bool) -> int:
    """A study stage: resume or start ``moesd sweep <study> --preset gpu`` into ``out/<label>[-graphs]/``."""
    graphs = ["--cuda-graphs"] if stage in GRAPH_STAGES else []
    folder = out / (label + ("-graphs" if graphs else ""))
    folder.mkdir(parents=True, exist_ok=True)
    study = stage.removesuffix("_graphs")
    sidecar = resume_from_repository(study, folder.name, folder, name)
    if sidecar.get("complete"):
        print(f"{stage}: {measurements_dir() / folder.name / study}.csv is complete; nothing to measure")
        return 0
    settings = sidecar.get("settings", {})
    if layers:
        draft_layers = None
    elif settings.get("layers"):
        layers, draft_layers = settings["layers"], settings.get("draft_layers")
    else:
        earlier = measured_layers(study, [measurements_dir() / label, measurements_dir() / f"{label}-graphs",
                                          out / label, out / f"{label}-graphs"])
        layers, draft_layers = earlier or (pair_layers(study, free), None)
    preset = preset_settings(study, "gpu")
    draft_layers = draft_layers or proportional_draft_layers(preset["target"], preset["draft"], layers)
    status = run(MOESD + ["sweep", study, "--preset", "gpu", "--layers", str(layers), "--draft-layers",
                          str(draft_layers), "--out-dir", folder] + graphs, log, deadline, dry_run)
    for leftover in folder.glob(".*.tmp"):  # a point in flight when the budget ran out
        leftover.unlink()
    print(f"{stage}: exit {status}, {layers} target layers, {draft_layers} draft layers; "
          + ("" if dry_run else summary(folder / f"{study}.csv")))
    return status


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stages", nargs="+", choices=("env",) + STUDIES + GRAPH_STAGES, metavar="stage",
                        help="env, " + ", ".join(STUDIES + GRAPH_STAGES))
    parser.add_argument("--seconds", type=float, default=540.0)
    parser.add_argument("--layers", type=int)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.seconds
    files = 1 + sum(3 if stage == "env" else 2 for stage in dict.fromkeys(args.stages))
    if files > RETURNED_FILES:
        raise SystemExit(f"gpu_run: these stages would write {files} files and the device tool returns at most "
                         f"{RETURNED_FILES} a call; split them over two calls")
    if not (os.environ.get("OUT") or args.dry_run):
        raise SystemExit("gpu_run: OUT is not set (run it through the device tool, or pass --dry-run)")
    out = Path(os.environ.get("OUT") or "/tmp/gpu_run")
    name, label, free = ("NVIDIA H100 80GB HBM3", "h100", 78 * 2**30) if args.dry_run else gpu()
    (out / label).mkdir(parents=True, exist_ok=True)
    failed = []
    with open(out / "gpu_run.log", "a") as log:
        for stage in dict.fromkeys(args.stages):
            left = deadline - time.monotonic()
            if left < LAST_STAGE_SECONDS and not args.dry_run:
                print(f"{stage}: skipped, {left:.0f} s of the budget left; run it in the next call")
                continue
            if stage == "env":
                status = measure_environment(out / label, log, deadline, args.dry_run)
            else:
                status = measure_study(stage, out, label, name, free, args.layers, log, deadline, args.dry_run)
            if status not in (0, 124):
                failed.append(stage)
    if failed:
        print(f"failed: {', '.join(failed)} (see gpu_run.log)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
