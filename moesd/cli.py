"""The ``moesd`` command: one sub-command per job.

``moesd theory --E 64 --K 8`` prints N(t), tokens per expert and T_thres (Eqs. 8-10);
``moesd hardware`` prints the hardware table with ridge points (Eq. 1); ``--measure`` adds this machine's;
``moesd trace --model M --prompts humaneval ...`` captures expert routing into a trace file;
``moesd sweep e2e --preset cpu`` times AR against SD over batch sizes (``moesd.bench``);
``moesd fit data/measurements/cpu/sparsity.csv --stride 11`` fits Algorithm 1 (``moesd.fit``).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pandas as pd

from moesd.experts import expected_active_experts, full_activation_threshold, tokens_per_expert
from moesd.roofline import HARDWARE

DEFAULT_TOKENS = [1, 2, 4, 8, 16, 32, 64, 100, 200, 400]


def _theory(args: argparse.Namespace) -> None:
    rho = args.K / args.E
    tokens = np.asarray(args.tokens, dtype=float)
    table = pd.DataFrame({
        "tokens": args.tokens,
        "active_experts": expected_active_experts(tokens, args.E, args.K),
        "tokens_per_expert": tokens_per_expert(tokens, rho),
    })
    print(f"E = {args.E}, K = {args.K}, rho = {rho:.4g}; "
          f"T_thres(tau={args.tau}) = {full_activation_threshold(rho, args.tau)} tokens")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.2f}"))


def _hardware(args: argparse.Namespace) -> None:
    if not args.measure:
        given = [flag for flag, value in (("--device", args.device), ("--dtype", args.dtype),
                                          ("--threads", args.threads), ("--json", args.json)) if value is not None]
        if given:
            raise ValueError(f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} only with --measure")
    else:
        from pathlib import Path

        if args.threads is not None and args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
        if args.json is not None and not Path(args.json).resolve().parent.is_dir():
            raise ValueError(f"--json: folder {Path(args.json).resolve().parent} does not exist")
        if args.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise ValueError("--device cuda: torch sees no CUDA device here")
    table = pd.DataFrame([{
        "name": hw.name,
        "bf16 TFLOP/s": hw.peak_flops / 1e12,
        "TB/s": hw.memory_bandwidth / 1e12,
        "GB": hw.memory_bytes / 1e9,
        "ridge point": hw.ridge_point,
    } for hw in HARDWARE.values()])
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if args.measure:
        _measured_hardware(args)


def _measured_hardware(args: argparse.Namespace) -> None:
    import json

    from moesd.hardware import measure_roofline

    measured = measure_roofline(args.device or "cpu", args.dtype or "float32", args.threads)
    hw = measured.hardware
    print(f"\nmeasured here: {hw.name}")
    print(pd.DataFrame([{"name": hw.name, f"{measured.settings['dtype']} TFLOP/s": hw.peak_flops / 1e12,
                         "TB/s": hw.memory_bandwidth / 1e12, "GB": hw.memory_bytes / 1e9,
                         "ridge point": hw.ridge_point}])
          .to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(f"source: {hw.source}")
    bandwidth = measured.bandwidth.assign(**{"best GB/s": measured.bandwidth["bandwidth"] / 1e9,
                                             "median GB/s": measured.bandwidth["median_bandwidth"] / 1e9,
                                             "MiB per array": measured.bandwidth["array_bytes"] / 2 ** 20})
    print(bandwidth[["kernel", "MiB per array", "best GB/s", "median GB/s"]]
          .to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    gemm = measured.gemm.assign(**{"M": measured.gemm["tokens"], "best GFLOP/s": measured.gemm["flop_per_s"] / 1e9,
                                   "median GFLOP/s": measured.gemm["median_flop_per_s"] / 1e9,
                                   "ms": measured.gemm["best_seconds"] * 1e3,
                                   "weight GB/s": measured.gemm["weight_bandwidth"] / 1e9})
    print(f"GEMM {int(gemm['out_features'][0])} x {int(gemm['in_features'][0])} weight read from memory, "
          "against the tokens M:")
    print(gemm[["M", "ms", "best GFLOP/s", "median GFLOP/s", "weight GB/s"]]
          .to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if args.json:
        from moesd._files import atomic_write

        with atomic_write(args.json, "w") as file:
            json.dump(measured.sidecar_entries(), file, indent=2)
        print(f"-> {args.json}")


def _trace(args: argparse.Namespace) -> None:
    from pathlib import Path

    from moesd.capture import trace_prompts, trace_random_model
    from moesd.prompts import load_prompts

    if Path(args.out).exists() and not args.overwrite:
        raise ValueError(f"{args.out} exists; pass --overwrite to replace it")
    if args.random_weights:
        from moesd.zoo import get_model

        get_model(args.model)  # an unknown architecture fails before any work
    elif args.layers is not None or args.width != 1.0:
        raise ValueError("--layers and --width apply only with --random-weights")
    prompts = load_prompts(args.prompts, args.prompt_source)
    if args.num_prompts:
        prompts = prompts.head(args.num_prompts)
    if args.random_weights:
        trace = trace_random_model(args.model, prompts, args.batch_size, args.max_new_tokens,
                                   num_layers=args.layers, width=args.width, seed=args.seed,
                                   dataset=args.prompts)
    else:
        trace = trace_prompts(args.model, prompts, args.batch_size, args.max_new_tokens, dataset=args.prompts,
                              dtype=args.dtype, device=args.device)
    path = trace.save(args.out)
    print(f"{trace.num_tokens} tokens x {len(trace.layers)} MoE layers (E = {trace.num_experts}, "
          f"K = {trace.top_k}) -> {path}")


def _sweep(args: argparse.Namespace) -> None:
    import dataclasses

    from moesd.bench import preset, run_sweep

    changes = {name: value for name, value in {
        "target": args.target, "draft": args.draft, "weights": args.weights, "layers": args.layers,
        "draft_layers": args.draft_layers, "width": args.width, "batch_sizes": args.batch_sizes,
        "gammas": args.gammas, "top_ks": args.top_ks, "context": args.context,
        "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "dtype": args.dtype,
        "device": args.device, "target_path": args.target_path, "draft_path": args.draft_path}.items()
        if value is not None}
    if args.sigma is not None:
        changes["sigma"] = None if args.sigma == ["real"] else dict(
            zip(changes.get("gammas", preset(args.study, args.preset).gammas), map(float, args.sigma)))
    config = dataclasses.replace(preset(args.study, args.preset), **changes)
    path = run_sweep(config, args.out_dir, overwrite=args.overwrite)
    print(f"{config.study} study -> {path}")


def _fit(args: argparse.Namespace) -> None:
    from moesd.fit import fit_speedup_model, from_sweep, held_out_errors
    from moesd.roofline import ridge_point

    frame = from_sweep(pd.read_csv(args.measurements), args.E)
    rp = float(ridge_point(args.hardware))
    result = fit_speedup_model(frame, rp, variant=args.variant, stride=args.stride)
    errors = held_out_errors(result, frame)
    print(f"{len(result.fitted)} of {len(frame)} measurements, variant {args.variant}, ridge point {rp:.4g} "
          f"({args.hardware}); fit {result.fit_seconds:.3f} s")
    print(f"MSE fitted {result.mse:.4g}; over all {errors['mse_all']:.4g}; held back ({errors['points']}): "
          f"MAPE {errors['mape']:.2f} %, max error {errors['max_abs_error']:.3f}")
    print(pd.DataFrame({"fitted": result.params, "relative to bias": result.relative_params()})
          .to_string(float_format=lambda v: f"{v:.4g}"))


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``moesd`` command."""
    parser = argparse.ArgumentParser(prog="moesd", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    theory = commands.add_parser("theory", help="expected activated experts and tokens per expert")
    theory.add_argument("--E", type=int, required=True, help="routed experts per MoE layer")
    theory.add_argument("--K", type=int, required=True, help="experts per token")
    theory.add_argument("--tokens", type=int, nargs="+", default=DEFAULT_TOKENS,
                        help="token counts to tabulate")
    theory.add_argument("--tau", type=float, default=0.95, help="'almost all' fraction for T_thres")
    theory.set_defaults(run=_theory)

    hardware = commands.add_parser("hardware", help="hardware records and ridge points; --measure: this machine's")
    hardware.add_argument("--measure", action="store_true",
                          help="measure this machine's roofline (STREAM bandwidth, GEMM FLOP/s against M)")
    hardware.add_argument("--device", choices=["cpu", "cuda"], help="with --measure: device (default cpu)")
    hardware.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                          help="with --measure: GEMM type (default float32)")
    hardware.add_argument("--threads", type=int, help="with --measure: torch threads (default: torch's)")
    hardware.add_argument("--json", help="with --measure: write the record and curves to this JSON file")
    hardware.set_defaults(run=_hardware)

    trace = commands.add_parser("trace", help="capture expert routing of a Hugging Face MoE model")
    trace.add_argument("--model", required=True,
                       help="hub id or local folder; with --random-weights a moesd.zoo name or hub id")
    trace.add_argument("--prompts", required=True, choices=["humaneval", "mt_bench", "gsm8k"])
    trace.add_argument("--prompt-source", help="local file or folder of the prompts (default: the hub)")
    trace.add_argument("--num-prompts", type=int, help="use only the first N prompts")
    trace.add_argument("--batch-size", type=int, default=8, help="sequences per generate call")
    trace.add_argument("--max-new-tokens", type=int, default=128, help="tokens generated per sequence")
    trace.add_argument("--dtype", default="auto", help="weight dtype, e.g. bfloat16 (default: the checkpoint's)")
    trace.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    trace.add_argument("--out", required=True, help="trace file to write (.npz)")
    trace.add_argument("--overwrite", action="store_true", help="replace an existing trace file")
    trace.add_argument("--random-weights", action="store_true",
                       help="build the architecture with random weights (no download; byte tokens)")
    trace.add_argument("--layers", type=int, help="with --random-weights: keep the first N layers")
    trace.add_argument("--width", type=float, default=1.0, help="with --random-weights: scale every width")
    trace.add_argument("--seed", type=int, default=0, help="with --random-weights: seed of the weights")
    trace.set_defaults(run=_trace)

    sweep = commands.add_parser("sweep", help="time AR and SD over batch sizes (moesd.bench)")
    sweep.add_argument("study", choices=["forward", "e2e", "sparsity", "dense", "dense_forward"])
    sweep.add_argument("--preset", default="cpu", choices=["cpu", "gpu"],
                       help="cpu: scaled random-weight models; gpu: real shapes in bf16 (default: cpu)")
    sweep.add_argument("--target", help="moesd.zoo name of the target")
    sweep.add_argument("--draft", help="moesd.zoo name of the draft")
    sweep.add_argument("--weights", choices=["random", "pretrained"])
    sweep.add_argument("--target-path", help="local folder of pretrained target weights")
    sweep.add_argument("--draft-path", help="local folder of pretrained draft weights")
    sweep.add_argument("--layers", type=int, help="target layers kept")
    sweep.add_argument("--draft-layers", type=int, help="draft layers kept")
    sweep.add_argument("--width", type=float, help="width factor of random-weight models")
    sweep.add_argument("--batch-sizes", type=int, nargs="+")
    sweep.add_argument("--gammas", type=int, nargs="+")
    sweep.add_argument("--top-ks", type=int, nargs="+", help="experts per token of the target")
    sweep.add_argument("--sigma", nargs="+", help="sigma per gamma for synthetic acceptance, or 'real'")
    sweep.add_argument("--context", type=int, help="prompt tokens per sequence")
    sweep.add_argument("--max-new-tokens", type=int)
    sweep.add_argument("--repeats", type=int)
    sweep.add_argument("--dtype")
    sweep.add_argument("--device")
    sweep.add_argument("--out-dir", help="default: data/measurements/<device>")
    sweep.add_argument("--overwrite", action="store_true", help="replace a finished result file")
    sweep.set_defaults(run=_sweep)

    fit = commands.add_parser("fit", help="fit Algorithm 1 to an e2e or sparsity result file (moesd.fit)")
    fit.add_argument("measurements", help="CSV written by moesd sweep (e2e, sparsity)")
    fit.add_argument("--E", type=int, default=64, help="routed experts per layer of the target (default 64)")
    fit.add_argument("--hardware", default="CPU", help="moesd.roofline.HARDWARE name for the ridge point")
    fit.add_argument("--variant", default="eq4", choices=["eq4", "printed"], help="Algorithm 1 denominator")
    fit.add_argument("--stride", type=int, help="fit df[::stride] of the rows sorted by K, gamma, B")
    fit.set_defaults(run=_fit)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the ``moesd`` command; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.run(args)
    except (ValueError, KeyError, FileNotFoundError, FileExistsError) as error:
        parser.error(str(error.args[0]) if error.args else repr(error))
    return 0


if __name__ == "__main__":
    sys.exit(main())
