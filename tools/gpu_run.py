"""Issue 15 on a lent GPU: one stage per call of the device tool, each inside the call's 10-minute limit.

Run from the repository root on the device machine, whose python3 has torch and transformers
(moesd is imported from the repository, not installed):

    python3 tools/gpu_run.py env            # first call: environment, bf16 roofline, a smoke run of each
                                            # kind of study, tools/cuda_graph_probe.py
    python3 tools/gpu_run.py forward        # T_T(B, s), T_D(B, s): Qwen2-57B-A14B / Qwen2-0.5B shapes
    python3 tools/gpu_run.py dense_forward  # the same for OPT-30b / OPT-350m
    python3 tools/gpu_run.py forward_graphs # the forward studies timed as CUDA graph replays (--cuda-graphs),
                                            # into <gpu>-graphs/; also dense_forward_graphs
    python3 tools/gpu_run.py e2e            # then sparsity, dense, settings

A study stage runs ``moesd sweep <study> --preset gpu`` (real shapes, random bf16 weights built on the
GPU) into ``$OUT/<gpu>/`` (``h100``, ``h200``... from the GPU's name), starting from the files of
``data/measurements/<gpu>/`` that travelled with the repository: a study that the time limit cuts
resumes in the next call once the files that came back are committed there (every finished point
is in them; the sweep writes each point atomically). The target keeps the most layers whose
weights, with the draft's, fit 80 % of the GPU's free memory (:func:`moesd.sweeps.layers_that_fit`;
all of them on an H200, about half of Qwen2-57B-A14B's on an H100), the same on every machine of a
kind, and the sidecar records it. The study stages time eager forwards; the ``*_graphs`` stages time
the same forwards as CUDA graph replays over a static cache (the sidecar's ``settings.cuda_graphs``
says which). Each stage ends with a short summary; its whole log is ``$OUT/<stage>.log``.

Options: ``--seconds S`` (default 540) is the stage's budget; ``--layers L`` overrides the layers;
``--dry-run`` prints the commands without running them (on any machine).
"""

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from moesd.sweeps import STUDIES, gpu_label, layers_that_fit, preset_settings  # noqa: E402

MOESD = [sys.executable, "-c", "import sys; from moesd.cli import main; sys.exit(main(sys.argv[1:]))"]
"""The moesd command, from the repository (nothing is installed on the device machine)."""
SMOKE = {"forward": ["--batch-sizes", "1", "32", "--repeats", "1"],
         "dense_forward": ["--batch-sizes", "1", "32", "--repeats", "1"],
         "e2e": ["--batch-sizes", "1", "32", "--gammas", "2", "--repeats", "1", "--rounds", "8",
                 "--warmup-rounds", "1"]}
"""A smoke run of each kind of study: two batch sizes, two layers, few repeats."""
GRAPH_STAGES = ("forward_graphs", "dense_forward_graphs")
"""The forward studies again with ``--cuda-graphs``, into ``<gpu>-graphs/`` (``h100-graphs``...)."""


def gpu() -> tuple[str, float]:
    """The folder name of this GPU (as moesd.sweeps.gpu_label names it) and its free memory (bytes), from nvidia-smi.

    Asked of nvidia-smi, not torch: a CUDA context in this process would hold memory the sweep needs.
    """
    if shutil.which("nvidia-smi") is None:
        raise SystemExit("gpu_run: no nvidia-smi here: run it on the GPU machine, or pass --dry-run")
    query = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.free", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True)
    if query.returncode != 0 or not query.stdout.strip():
        raise SystemExit(f"gpu_run: nvidia-smi found no GPU ({query.stderr.strip()})")
    name, free_mib = query.stdout.splitlines()[0].rsplit(",", 1)
    return gpu_label(name.strip()), float(free_mib) * 2**20


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
    try:
        return subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=max(1.0, deadline - time.monotonic()),
                              env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}).returncode
    except subprocess.TimeoutExpired:
        log.write("gpu_run: stopped at the stage's time budget; finished points are in the result file\n")
        print("  stopped at the time budget (finished points kept)", flush=True)
        return 124


def summary(csv: Path) -> str:
    """Rows and points of a result file, and whether its sidecar says it is complete."""
    import json

    import pandas as pd

    if not csv.exists():
        return f"{csv.name}: none"
    rows = pd.read_csv(csv)
    sidecar = json.loads(csv.with_suffix(".json").read_text()) if csv.with_suffix(".json").exists() else {}
    settings = sidecar.get("settings", {})
    return (f"{csv.name}: {len(rows)} rows, complete {sidecar.get('complete')}, layers {settings.get('layers')}, "
            f"device {sidecar.get('device')}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=("env",) + STUDIES + GRAPH_STAGES)
    parser.add_argument("--seconds", type=float, default=540.0)
    parser.add_argument("--layers", type=int)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    deadline = time.monotonic() + args.seconds
    if not (os.environ.get("OUT") or args.dry_run):
        raise SystemExit("gpu_run: OUT is not set (run it through the device tool, or pass --dry-run)")
    out = Path(os.environ.get("OUT") or "/tmp/gpu_run")
    label, free = ("h100", 80 * 2**30) if args.dry_run else gpu()
    folder = out / label
    folder.mkdir(parents=True, exist_ok=True)
    with open(out / f"{args.stage}.log", "a") as log:
        if args.stage == "env":
            if not args.dry_run:
                environment(folder / "environment.txt")
            run(MOESD + ["hardware", "--measure", "--device", "cuda", "--dtype", "bfloat16",
                         "--json", folder / "roofline_bfloat16.json"], log, deadline, args.dry_run)
            smoke = Path("/tmp/gpu_run_smoke")
            shutil.rmtree(smoke, ignore_errors=True)
            for study, options in SMOKE.items():
                status = run(MOESD + ["sweep", study, "--preset", "gpu", "--layers", "2", "--out-dir", smoke]
                             + options, log, deadline, args.dry_run)
                print(f"  {study}: exit {status}; " + ("" if args.dry_run else summary(smoke / f"{study}.csv")))
            probe = [sys.executable, str(ROOT / "tools" / "cuda_graph_probe.py")]
            with open(folder / "cuda_graphs.txt", "w") as graphs:
                status = run(probe, graphs, deadline, args.dry_run)
            print(f"  CUDA graph probe: exit {status}" + ("" if args.dry_run else "\n" + (folder / "cuda_graphs.txt").read_text()))
            return 0
        study = args.stage.removesuffix("_graphs")
        graphs = ["--cuda-graphs"] if args.stage in GRAPH_STAGES else []
        if graphs:
            label += "-graphs"
            folder = out / label
            folder.mkdir(parents=True, exist_ok=True)
        settings = preset_settings(study, "gpu")
        layers = args.layers or layers_that_fit(settings["target"], settings["draft"], free)
        for suffix in (".csv", ".json"):  # resume from what earlier calls measured and the repository holds
            shipped = ROOT / "data" / "measurements" / label / f"{study}{suffix}"
            if shipped.exists() and not (folder / shipped.name).exists():
                shutil.copy(shipped, folder / shipped.name)
        status = run(MOESD + ["sweep", study, "--preset", "gpu", "--layers", str(layers), "--out-dir", folder]
                     + graphs, log, deadline, args.dry_run)
        print(f"{args.stage}: exit {status}, {layers} target layers; "
              + ("" if args.dry_run else summary(folder / f"{study}.csv")))
        return 0 if status in (0, 124) else status


if __name__ == "__main__":
    sys.exit(main())
