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
weights and KV cache, with the draft's, fit 80 % of the GPU's free memory in every study of its pair
(:func:`moesd.sweeps.layers_that_fit`; all of Qwen2-57B-A14B's on an H200, about half on an H100), or
the layers of the partial file it resumes; the sidecar records them. The study stages time eager
forwards; the ``*_graphs`` stages time the same forwards as CUDA graph replays over a static cache
(the sidecar's ``settings.cuda_graphs`` says which). Each stage ends with a short summary; its whole log is ``$OUT/<stage>.log``.

Options: ``--seconds S`` (default 540) is the stage's budget; ``--layers L`` overrides the layers;
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
                          preset_settings)

MOESD = [sys.executable, "-c", "import sys; from moesd.cli import main; sys.exit(main(sys.argv[1:]))"]
"""The moesd command, from the repository (nothing is installed on the device machine)."""
SMOKE = {"forward": ["--batch-sizes", "1", "32", "--repeats", "1"],
         "forward --cuda-graphs": ["--batch-sizes", "1", "32", "--repeats", "1"],
         "dense_forward": ["--batch-sizes", "1", "32", "--repeats", "1"],
         "e2e": ["--batch-sizes", "1", "32", "--gammas", "2", "--repeats", "1", "--rounds", "8",
                 "--warmup-rounds", "1"]}
"""A smoke run of each kind of study: two batch sizes, two layers, few repeats."""
GRAPH_STAGES = ("forward_graphs", "dense_forward_graphs")
"""The forward studies again with ``--cuda-graphs``, into ``<gpu>-graphs/`` (``h100-graphs``...)."""


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


def pair_layers(study: str, free: float) -> int:
    """Target layers for every study of the study's model pair: the fewest that any of them fits.

    The MoE studies (forward, e2e, sparsity, settings) and the dense ones (dense, dense_forward) each
    keep one layer count, so that their files describe the same model.
    """
    target = preset_settings(study, "gpu")["target"]
    configs = [SweepConfig(**preset_settings(other, "gpu")) for other in STUDIES]
    return min(layers_that_fit(c.target, c.draft, free, cached_tokens=cached_tokens(c))
               for c in configs if c.target == target)


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
    try:
        return subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=max(1.0, deadline - time.monotonic()),
                              env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}).returncode
    except subprocess.TimeoutExpired:
        log.write("gpu_run: stopped at the stage's time budget; finished points are in the result file\n")
        print("  stopped at the time budget (finished points kept)", flush=True)
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
    name, label, free = ("NVIDIA H100 80GB HBM3", "h100", 78 * 2**30) if args.dry_run else gpu()
    graphs = ["--cuda-graphs"] if args.stage in GRAPH_STAGES else []
    folder = out / (label + ("-graphs" if graphs else ""))
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
                where = smoke / study.replace(" --", "_").replace("-", "_")
                status = run(MOESD + ["sweep", *study.split(), "--preset", "gpu", "--layers", "2", "--out-dir", where]
                             + options, log, deadline, args.dry_run)
                csv = where / f"{study.split()[0]}.csv"
                print(f"  {study}: exit {status}; " + ("" if args.dry_run else summary(csv)))
            probe = [sys.executable, str(ROOT / "tools" / "cuda_graph_probe.py")]
            with open(folder / "cuda_graphs.txt", "w") as graph_log:
                status = run(probe, graph_log, deadline, args.dry_run)
            print(f"  CUDA graph probe: exit {status}" + ("" if args.dry_run else "\n" + (folder / "cuda_graphs.txt").read_text()))
            return 0
        study = args.stage.removesuffix("_graphs")
        sidecar = resume_from_repository(study, folder.name, folder, name)
        if sidecar.get("complete"):
            print(f"{args.stage}: {measurements_dir() / folder.name / study}.csv is complete; nothing to measure")
            return 0
        layers = args.layers or sidecar.get("settings", {}).get("layers") or pair_layers(study, free)
        status = run(MOESD + ["sweep", study, "--preset", "gpu", "--layers", str(layers), "--out-dir", folder]
                     + graphs, log, deadline, args.dry_run)
        for leftover in folder.glob(".*.tmp"):  # a point in flight when the budget ran out
            leftover.unlink()
        print(f"{args.stage}: exit {status}, {layers} target layers; "
              + ("" if args.dry_run else summary(folder / f"{study}.csv")))
        return 0 if status in (0, 124) else status


if __name__ == "__main__":
    sys.exit(main())
