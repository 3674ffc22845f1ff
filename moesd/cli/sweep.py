"""``moesd sweep``: a timing study (forward, e2e, sparsity, dense, settings) into a result file."""

import argparse
import sys
import warnings
from pathlib import Path


from moesd._checks import UsageError, usage_errors
from moesd.cli.arguments import as_option, sigma_per_gamma


def run(args: argparse.Namespace) -> None:
    from moesd.measure.presets import with_overrides
    from moesd.measure.sweeps import SweepConfig

    given = {name: value for name, value in {
        "target": args.target, "draft": args.draft, "weights": args.weights, "layers": args.layers,
        "draft_layers": args.draft_layers, "width": args.width, "batch_sizes": args.batch_sizes,
        "gammas": args.gammas, "top_ks": args.top_ks, "routing": args.routing,
        "routing_trace": args.routing_trace, "routing_source": args.routing_source, "context": args.context, "rounds": args.rounds,
        "warmup_rounds": args.warmup_rounds, "repeats": args.repeats, "dtype": args.dtype,
        "device": args.device, "target_path": args.target_path, "draft_path": args.draft_path,
        "cuda_graphs": args.cuda_graphs or None}.items()
        if value is not None}
    settings = with_overrides(args.study, args.preset, given)  # derived shape settings follow the given ones
    if args.sigma is not None:
        settings["sigma"] = sigma_per_gamma(args.sigma, settings["gammas"])
    try:
        config = SweepConfig(**settings)
    except UsageError as error:
        raise UsageError(as_option(str(error))) from None
    if args.engine != "vllm" and (args.tp, args.draft_tp) != (1, 1):
        raise UsageError("--tp and --draft-tp apply only with --engine vllm")

    from moesd.measure.bench import run_sweep  # torch: after the settings are checked
    from moesd.measure.result_file import SweepWriteError, check_sweep, writing_file

    try:
        with usage_errors():  # device, --out-dir and an existing result file, before any model is built
            path = check_sweep(config, args.out_dir, args.overwrite)
    except UsageError as error:
        raise UsageError(as_option(str(error))) from None
    writing = writing_file(path, config, args.overwrite)[0]
    try:
        if args.engine == "vllm":
            from moesd.measure.vllm_engine import run_sweep as run_vllm_sweep

            path = run_vllm_sweep(config, path.parent, overwrite=args.overwrite, tp=args.tp, draft_tp=args.draft_tp)
        else:
            run_sweep(config, path.parent, overwrite=args.overwrite)
    except KeyboardInterrupt:
        _stopped("interrupted", writing, path, 130)
    except SweepWriteError as error:  # a full disk, a file made read-only: the files keep what they had
        _stopped(str(error), error.writing, path, 1)
    print(f"{config.study} study -> {path}")
    from moesd.measure.studies import check_file

    problems = check_file(path)[2]
    for problem in problems:
        print(f"warning: {path.name}: {problem}", file=sys.stderr)
    if problems:
        print(f"warning: {len(problems)} problem(s) in {path.name} (a bound broken by timing noise in short windows: "
              "more --rounds or --repeats); moesd.measure.studies.load, which the chapters use, warns of them too",
              file=sys.stderr)


def _stopped(what: str, writing: Path, path: Path, status: int) -> None:
    """Say, on one line, why a sweep stopped (Ctrl-C, a failed write), how many rows it keeps and the command that
    resumes it; exit with ``status``.

    The rows are those of ``writing`` (the result file ``path``, or its partial file while a sweep
    replaces ``path``: only ``--overwrite`` resumes that one); the command is this one, without ``--overwrite``
    once the result file itself has a row to resume.
    """
    import shlex

    from moesd.measure.result_file import read_complete_rows

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows = len(read_complete_rows(writing)) if writing.is_file() else 0
    plain = writing == path and rows
    argv = [argument for argument in sys.argv[1:] if not (plain and argument == "--overwrite")]
    where = f"{writing} ({path} keeps its rows until the sweep completes)" if writing != path else str(writing)
    kept = f": {rows} row(s) kept in {where}" if status == 130 else ""  # a failure says what it kept
    print(f"{what}{kept}; resume with: {shlex.join(['moesd', *argv])}", file=sys.stderr)
    raise SystemExit(status)


def add_parser(commands) -> None:
    """Declare ``moesd sweep`` and its options on the sub-command parsers ``commands``."""
    sweep = commands.add_parser("sweep", help="time AR and SD over batch sizes (moesd.measure.bench)",
                                description="Run a timing study into <out-dir>/<study>.csv with a JSON sidecar. "
                                            "Every point is written when it finishes; run again to resume.")
    sweep.add_argument("study", choices=["forward", "e2e", "sparsity", "dense", "dense_forward", "settings"])
    sweep.add_argument("--preset", default="cpu", choices=["cpu", "gpu"],
                       help="cpu: scaled random-weight models; gpu: real shapes in bf16 (default: cpu)")
    sweep.add_argument("--target", help="moesd.zoo name of the target")
    sweep.add_argument("--draft", help="moesd.zoo name of the draft")
    sweep.add_argument("--weights", choices=["random", "pretrained"])
    sweep.add_argument("--target-path", help="local folder of pretrained target weights")
    sweep.add_argument("--draft-path", help="local folder of pretrained draft weights")
    sweep.add_argument("--layers", type=int, help="target layers kept (random weights)")
    sweep.add_argument("--draft-layers", type=int, help="draft layers kept (random weights)")
    sweep.add_argument("--width", type=float, help="width factor of random-weight models, in (0, 1]")
    sweep.add_argument("--batch-sizes", type=int, nargs="+",
                       help="sequences per batch (default: the preset's; for most studies the paper's 19 from 1 to 100)")
    sweep.add_argument("--gammas", type=int, nargs="+", help="draft lengths (default: the preset's, e.g. 2 3 4)")
    sweep.add_argument("--top-ks", type=int, nargs="+", help="experts per token of an MoE target")
    sweep.add_argument("--routing", choices=["uniform", "model", "trace", "popularity"],
                       help="how an MoE target routes: each token's experts drawn uniformly (Eq. 8; the default "
                            "with random weights), by its own router (the default with pretrained weights), as a "
                            "routing trace (--routing-trace) recorded them, or drawn with a trained router's "
                            "per-layer popularity (--routing-source)")
    sweep.add_argument("--routing-trace", help="with --routing trace: the .npz routing trace to replay (its E and K "
                                               "must be the target's)")
    sweep.add_argument("--routing-source", help="with --routing popularity: a shipped trained-routing source "
                                                "<model>/<domain> (e.g. olmoe/c4; moesd.routing.sources.names()) of "
                                                "the target's E and K")
    sweep.add_argument("--sigma", nargs="+", help="one sigma per gamma for synthetic acceptance, or 'real'")
    sweep.add_argument("--context", type=int, help="prompt tokens per sequence")
    sweep.add_argument("--rounds", type=int, help="timed SD rounds and AR steps per point (default 32)")
    sweep.add_argument("--warmup-rounds", type=int, help="untimed rounds before them (default 1)")
    sweep.add_argument("--repeats", type=int, help="independent repeats of every point (default: the preset's)")
    sweep.add_argument("--dtype", help="float32, float64, bfloat16 or float16")
    sweep.add_argument("--device", help="cpu, cuda or cuda:N")
    sweep.add_argument("--out-dir", help="folder of the result file (default: $MOESD_DATA/measurements/<device>, "
                                         "MOESD_DATA defaulting to the repository's data/)")
    sweep.add_argument("--overwrite", action="store_true",
                       help="replace a finished result file (kept until the new sweep completes)")
    sweep.add_argument("--cuda-graphs", action="store_true",
                       help="on CUDA: run each forward as a CUDA graph replay over a static cache (forward "
                            "studies time the replays; end-to-end studies decode with them)")
    sweep.add_argument("--engine", default="hf", choices=["hf", "vllm"],
                       help="hf: moesd's own engine (default); vllm: vLLM's offline API (moesd.measure.vllm_engine, "
                            "needs vllm: make vllm)")
    sweep.add_argument("--tp", type=int, default=1, help="with --engine vllm: tensor-parallel GPUs of the target")
    sweep.add_argument("--draft-tp", type=int, default=1, help="with --engine vllm: tensor-parallel GPUs of the draft")
    sweep.set_defaults(run=run, prints_only=False)
