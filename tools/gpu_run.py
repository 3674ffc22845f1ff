"""The GPU studies in one command: environment, roofline, forward and end-to-end studies.

Run from the repository root with a Python whose torch is a CUDA build and sees the GPU (moesd is imported
from the repository, so nothing else needs installing): on your own GPU the venv of ``make gpu``, on the
project's lent GPU machine the image's python3:

    .venv-gpu/bin/python tools/gpu_run.py --work mydata/measurements   # your GPU: every stage, to its end
    MOESD_COMMIT=<commit> python3 tools/gpu_run.py                 # the lent machine ($OUT set): in 540 s
    python3 tools/gpu_run.py --dry-run                             # the commands, on any machine

It runs every stage in order. On the lent machine (the device tool sets ``$OUT``) a lease is 15 minutes of
device time in all (the machine's start included) and one command may run 10 minutes, so the stages share
one budget (``--seconds``, default 540 there; elsewhere none unless given):

1. ``env``: nvidia-smi and the package versions (``environment.txt``), the bf16 roofline
   (``moesd hardware --measure``: copy bandwidth and a Qwen2-57B-A14B expert's GEMM against the
   tokens M, ``roofline_bfloat16.json``) and ``tools/cuda_graph_probe.py`` (``cuda_graphs.txt``);
2. ``forward``: T_T(B, s) and T_D(B, s) of the Qwen2-57B-A14B / Qwen2-0.5B shapes, as CUDA graph
   replays if the probe passed (else eagerly; the sidecar's ``settings.cuda_graphs`` says which);
3. ``dense_forward``: the same for OPT-30b / OPT-350m;
4. ``e2e`` and 5. ``sparsity``: batched SD against AR under the steady-state protocol, decoding over
   static caches whose forwards replay CUDA graphs if the probe (which also checks that engine) passed;
6. ``dense`` (OPT-30b / OPT-350m, Fig. 6) and 7. ``settings`` (Fig. 5's workloads) the same way;
8. ``forward_popularity`` (only when named): the forward study with each token's experts drawn with OLMoE's
   popularity on code (``--routing popularity --routing-source olmoe/github``, :data:`ROUTED_STAGES`), into
   ``<gpu>-popularity-routing/``.

The roofline is not measured again when the repository holds this GPU's.

Each study runs ``moesd sweep <study> --preset gpu`` (random bf16 weights built on the GPU, uniform
routing for the MoE target, the preset's grid: :func:`moesd.measure.presets.preset`) and, under a budget, has
a cap of its own (:data:`STAGE_SECONDS`), so that a slow study leaves time to the next; what a cap
or the budget cuts is in the result file (each point is written atomically when measured) and
resumes in a later call. The target keeps the most layers whose bf16 weights and KV cache, with the
draft's, fit 80 % of the GPU's free memory in every study of its pair
(:func:`moesd.measure.presets.layers_that_fit`: all 28 of Qwen2-57B-A14B on an H200, about half on an H100),
and the draft keeps the same share of its layers (:func:`moesd.measure.presets.proportional_draft_layers`).

The results go to ``<work>/<gpu>/`` (``--work``, default ``runs/gpu``; ``<gpu>`` is ``h100``, ``h200``... from
the GPU's name; ``runs/`` is ignored by git, so it stays on a warm machine between calls), with the log of the
commands, ``gpu_run.log``, starting from ``$MOESD_DATA/measurements/<gpu>/`` where it holds files of this GPU.
With ``--work $MOESD_DATA/measurements`` they go straight where the chapters read (README, "On your own GPU").
Where ``$OUT`` is set, the device tool's, which brings back at most 8 files, the whole work folder is packed
after every stage into ``$OUT/gpu_results.tar.gz`` and the log copied to ``$OUT/gpu_run.log``: unpack the
archive into ``data/measurements/`` and commit. ``MOESD_COMMIT`` names the commit in the sidecars (the lent
machine's copy has no ``.git``; a clone's sidecars take git's).
"""

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from moesd.measure.studies import measurements_dir  # noqa: E402
from moesd.measure.presets import layers_that_fit, preset_settings, proportional_draft_layers  # noqa: E402
from moesd.measure.sweep_memory import cached_tokens  # noqa: E402
from moesd.measure.sweeps import STUDIES, SweepConfig, gpu_label  # noqa: E402

MOESD = [sys.executable, "-c", "import sys; from moesd.cli import main; sys.exit(main(sys.argv[1:]))"]
"""The moesd command, from the repository (nothing is installed on the device machine)."""
STAGES = ("env", "forward", "dense_forward", "e2e", "sparsity", "dense", "settings", "forward_popularity")
"""Every stage, in the plan's order (the default plan is :data:`DEFAULT_STAGES`)."""
STAGE_SECONDS = {"env": 75, "forward": 150, "dense_forward": 110, "e2e": 300, "sparsity": 150, "dense": 200,
                 "forward_popularity": 150}
"""The most seconds a stage may take (a stage not named here takes what is left of the budget)."""
ROUTED_STAGES = {"forward_popularity": ("forward", ["--routing", "popularity", "--routing-source", "olmoe/github"],
                                        "-popularity-routing")}
"""Stages that run a study with other routing: (study, extra options, suffix of the GPU's folder); run when named."""
DEFAULT_STAGES = tuple(stage for stage in STAGES if stage not in ROUTED_STAGES)
"""The plan when no stage is named: every study under uniform routing."""
LAST_STAGE_SECONDS = 45
"""A stage whose turn comes with less of the budget left is skipped (building the models takes longer)."""
LENT_SECONDS = 540.0
"""The default budget where ``$OUT`` is set (the lent machine: 10 minutes a command, less the packing)."""
WORK = ROOT / "runs" / "gpu"
"""Where the results are written on the machine (ignored by git: kept between calls on a warm machine)."""


def gpu() -> tuple[str, str, float]:
    """This GPU's name, its folder name (:func:`moesd.measure.sweeps.gpu_label`) and free memory (bytes).

    Asked of torch in a process of its own (it sees what CUDA will use), whose CUDA context ends
    with it instead of holding memory the sweeps need.
    """
    query = subprocess.run([sys.executable, "-c", "import torch; assert torch.cuda.is_available(), 'no CUDA device'; "
                            "print(torch.cuda.get_device_name()); print(torch.cuda.mem_get_info()[0])"],
                           capture_output=True, text=True)
    if query.returncode != 0:
        raise SystemExit(f"gpu_run: torch sees no GPU here ({query.stderr.strip().splitlines()[-1:]}); run it with "
                         "a Python whose torch is a CUDA build and sees the GPU (make gpu builds .venv-gpu: "
                         ".venv-gpu/bin/python tools/gpu_run.py; .venv-gpu/bin/moesd hardware says what torch "
                         "sees), or pass --dry-run")
    name, free = query.stdout.split("\n")[:2]
    return name, gpu_label(name), float(free)


def pair_studies(study: str) -> list[str]:
    """The studies whose GPU preset measures the same model pair as ``study`` (its target)."""
    target = preset_settings(study, "gpu")["target"]
    return [other for other in STUDIES if preset_settings(other, "gpu")["target"] == target]


def pair_layers(study: str, free: float, folders: list) -> tuple[int, int]:
    """Target and draft layers for every study of the study's model pair.

    Those of a result file of the pair in ``folders`` (so that every study of a pair describes one
    model), else the fewest that any study of the pair fits in ``free`` bytes.
    """
    for folder in folders:
        for other in pair_studies(study):
            path = Path(folder) / f"{other}.json"
            if path.exists():
                settings = json.loads(path.read_text()).get("settings", {})
                if settings.get("layers") and settings.get("draft_layers"):
                    return settings["layers"], settings["draft_layers"]
    configs = [SweepConfig(**preset_settings(other, "gpu")) for other in pair_studies(study)]
    layers = min(layers_that_fit(c.target, c.draft, free, cached_tokens=cached_tokens(c)) for c in configs)
    return layers, proportional_draft_layers(configs[0].target, configs[0].draft, layers)


def resume_from_repository(study: str, label: str, folder: Path, name: str) -> dict:
    """Copy ``<measurements>/<label>/<study>.*`` into ``folder`` (unless there) and return its sidecar ({} if none).

    Refuses a file measured on another GPU of the same label (an H100 PCIe against an SXM).
    """
    shipped = measurements_dir() / label / f"{study}.json"
    if not shipped.exists():
        return {}
    sidecar = json.loads(shipped.read_text())
    if sidecar.get("device") != name:
        raise SystemExit(f"gpu_run: {shipped} was measured on {sidecar.get('device')!r}, this GPU is {name!r}; "
                         "move that file aside to measure afresh")
    for path in (shipped, shipped.with_suffix(".csv")):
        if not (folder / path.name).exists():
            shutil.copy(path, folder / path.name)
    return json.loads((folder / shipped.name).read_text())


def environment(path: Path) -> None:
    """nvidia-smi's view of the GPU and the versions of the Python packages moesd uses there."""
    from importlib.metadata import PackageNotFoundError, version

    smi = shutil.which("nvidia-smi")
    lines = [subprocess.run([smi], capture_output=True, text=True).stdout if smi else "nvidia-smi: not found",
             f"python {sys.version}"]
    for name in ("torch", "transformers", "numpy", "pandas", "scipy", "safetensors", "tokenizers", "triton", "tqdm"):
        try:
            lines.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            lines.append(f"{name}: not installed")
    path.write_text("\n".join(lines) + "\n")


def run(command: list, log, deadline: float, dry_run: bool) -> int:
    """Run ``command``, its output appended to ``log``; stop it at ``deadline`` (time.monotonic; inf: none): exit 124."""
    shown = command[3:] if command[:3] == MOESD else [Path(str(command[-1])).name]
    print("$ " + " ".join(map(str, shown)), flush=True)
    if dry_run:
        return 0
    log.write(f"$ {' '.join(map(str, command))}\n")
    log.flush()
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))  # carried wheels stay visible
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                               env={**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1"})
    try:
        return process.wait(timeout=None if math.isinf(deadline) else max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        process.terminate()  # SIGTERM: the sweep's finished points are already written
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.write("gpu_run: stopped at the stage's limit; the points finished before it are in the result file\n")
        print("  stopped at the stage's limit (the points finished before it are in the result file)", flush=True)
        return 124


def summary(csv: Path) -> str:
    """Rows of a result file, and what its sidecar says of it."""
    if not csv.exists():
        return f"{csv.name}: none"
    rows = sum(1 for _ in csv.open()) - 1
    sidecar = json.loads(csv.with_suffix(".json").read_text()) if csv.with_suffix(".json").exists() else {}
    settings = sidecar.get("settings", {})
    return (f"{csv.name}: {rows} rows, complete {sidecar.get('complete')}, layers {settings.get('layers')}/"
            f"{settings.get('draft_layers')}, cuda_graphs {settings.get('cuda_graphs')}, "
            f"routing {settings.get('routing')}")


def measure_environment(folder: Path, log, deadline: float, dry_run: bool) -> bool:
    """The ``env`` stage; returns whether the CUDA graph probe passed (graphs for every study).

    The roofline is measured unless the repository holds this GPU's already.
    """
    if not dry_run:
        environment(folder / "environment.txt")
    shipped = measurements_dir() / folder.name / "roofline_bfloat16.json"
    if shipped.exists():
        print(f"  roofline: {shipped.name} of this GPU is in the repository; not measured again", flush=True)
        if not (folder / shipped.name).exists() and not dry_run:
            shutil.copy(shipped, folder / shipped.name)
    else:
        run(MOESD + ["hardware", "--measure", "--device", "cuda", "--dtype", "bfloat16",
                     "--json", folder / "roofline_bfloat16.json"], log, deadline, dry_run)
    probe = [sys.executable, str(ROOT / "tools" / "cuda_graph_probe.py")]
    with open(os.devnull if dry_run else folder / "cuda_graphs.txt", "w") as graph_log:
        code = run(probe, graph_log, deadline, dry_run)
    print(f"  CUDA graph probe: exit {code}" + ("" if dry_run else "\n" + (folder / "cuda_graphs.txt").read_text()),
          flush=True)
    return code == 0


def measure_study(study: str, folder: Path, name: str, layers: tuple[int, int], graphs: bool, log,
                  deadline: float, dry_run: bool, extra=()) -> int:
    """A study stage: resume or start ``moesd sweep <study> --preset gpu`` into ``folder``."""
    sidecar = resume_from_repository(study, folder.name, folder, name)
    if sidecar.get("complete"):
        print(f"{study}: {measurements_dir() / folder.name / study}.csv is complete; nothing to measure")
        return 0
    settings = sidecar.get("settings", {})
    target_layers, draft_layers = ((settings["layers"], settings.get("draft_layers") or layers[1])
                                   if settings.get("layers") else layers)
    graphs = settings.get("cuda_graphs", graphs)
    command = MOESD + ["sweep", study, "--preset", "gpu", "--layers", str(target_layers), "--draft-layers",
                       str(draft_layers), "--out-dir", folder, *extra] + (["--cuda-graphs"] if graphs else [])
    status = run(command, log, deadline, dry_run)
    if status not in (0, 124) and graphs and not dry_run:  # the graph path failed: keep its rows aside, go eager
        aside = folder / "failed-graphs"
        aside.mkdir(exist_ok=True)
        for path in (folder / f"{study}.csv", folder / f"{study}.json"):
            if path.exists():
                path.rename(aside / path.name)
        print(f"{study}: the CUDA graph sweep failed (exit {status}); its files are in {aside.name}/, now eagerly")
        status = run(command[:-1], log, deadline, dry_run)
    for leftover in folder.glob(".*.tmp"):  # a point in flight when the limit came
        leftover.unlink()
    print(f"{study}: exit {status}, {target_layers} target layers, {draft_layers} draft layers; "
          + ("" if dry_run else summary(folder / f"{study}.csv")), flush=True)
    return status


def pack(work: Path, log: Path, out: Path) -> None:
    """``$OUT/gpu_results.tar.gz`` of everything under ``work``, and the log beside it."""
    with tarfile.open(out / ".gpu_results.tar.gz", "w:gz") as archive:
        archive.add(work, arcname=".")
    (out / ".gpu_results.tar.gz").replace(out / "gpu_results.tar.gz")
    shutil.copy(log, out / "gpu_run.log")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stages", nargs="*", metavar="stage",
                        help=f"stages to run, in the plan's order (default: {' '.join(DEFAULT_STAGES)})")
    parser.add_argument("--seconds", type=float,
                        help=f"the budget of the run, each stage capped within it (default: {LENT_SECONDS:.0f} where "
                             "$OUT is set, the lent machine; elsewhere none, every stage runs to its end)")
    parser.add_argument("--work", default=str(WORK), help=f"where the results are written (default {WORK})")
    parser.add_argument("--dry-run", action="store_true", help="print the commands without running them")
    args = parser.parse_args(argv)
    unknown = [stage for stage in args.stages if stage not in STAGES]
    if unknown:
        parser.error(f"unknown stage {', '.join(unknown)} (choose from {', '.join(STAGES)})")
    out = Path(os.environ["OUT"]) if os.environ.get("OUT") else None  # the device tool's: pack the results there
    seconds = args.seconds if args.seconds is not None else (LENT_SECONDS if out else None)
    start = time.monotonic()
    deadline = start + seconds if seconds else math.inf
    name, label, free = ("NVIDIA H200", "h200", 140 * 2**30) if args.dry_run else gpu()
    work = Path(args.work)
    folder = work / label
    folder.mkdir(parents=True, exist_ok=True)
    graphs, failed = False, []
    with open(folder / "gpu_run.log", "a") as log:
        for stage in (stage for stage in STAGES if stage in (args.stages or DEFAULT_STAGES)):
            left = deadline - time.monotonic()
            if left < LAST_STAGE_SECONDS and not args.dry_run:
                print(f"{stage}: skipped, {left:.0f} s of the budget left; run it in the next call", flush=True)
                continue
            cap = STAGE_SECONDS.get(stage, math.inf) if seconds else math.inf
            stage_deadline = min(deadline, time.monotonic() + cap)
            print(f"[{time.monotonic() - start:.0f} s] {stage}", flush=True)
            if stage == "env":
                graphs = measure_environment(folder, log, stage_deadline, args.dry_run)
                status = 0
            else:
                study, extra, suffix = ROUTED_STAGES.get(stage, (stage, [], ""))
                layers = pair_layers(study, free, [measurements_dir() / label, folder])
                where = folder.with_name(folder.name + suffix)
                where.mkdir(exist_ok=True)
                status = measure_study(study, where, name, layers, graphs, log, stage_deadline, args.dry_run, extra)
            if status not in (0, 124):
                failed.append(stage)
            if not args.dry_run and out:
                log.flush()
                pack(work, folder / "gpu_run.log", out)
    print(f"[{time.monotonic() - start:.0f} s] done; results in {folder}"
          + (f"; failed: {', '.join(failed)} (see its gpu_run.log)" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
