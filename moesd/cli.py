"""The ``moesd`` command: one sub-command per job.

``moesd theory --E 64 --K 8`` prints N(t), tokens per expert and T_thres (Eqs. 8-10);
``moesd hardware`` prints the hardware table with ridge points (Eq. 1); ``--measure`` adds this machine's;
``moesd trace --model M --prompts humaneval ...`` captures expert routing into a trace file;
``moesd sweep e2e --preset cpu`` times AR against SD over batch sizes (``moesd.measure.bench``);
``moesd fit data/measurements/cpu/sparsity.csv --stride 11`` fits Algorithm 1 (``moesd.model.fit``);
``moesd predict --target deepseek-v3 --draft deepseek-v3-mtp --hardware H200 --tp 8 --dtype fp8`` predicts SD's speedup
(``moesd.model.predict``).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd

from moesd._checks import UsageError, as_array, new_file, torch_device, usage_errors
from moesd.theory.experts import expected_active_experts, full_activation_threshold, sparsity, tokens_per_expert
from moesd.theory.roofline import HARDWARE
from moesd.zoo import MODELS

DEFAULT_TOKENS = [1, 2, 4, 8, 16, 32, 64, 100, 200, 400]


def _theory(args: argparse.Namespace) -> None:
    tokens = as_array("--tokens", args.tokens, low=1, whole=True)
    rho = sparsity(args.E, args.K)  # refuses E < 1 and K outside [1, E]
    threshold = full_activation_threshold(rho, args.tau)  # refuses tau outside (0, 1), a too small rho
    table = pd.DataFrame({
        "tokens": args.tokens,
        "active_experts": expected_active_experts(tokens, args.E, args.K),
        "tokens_per_expert": tokens_per_expert(tokens, rho),
    })
    print(f"E = {args.E}, K = {args.K}, rho = {float(rho):.4g}; "
          f"T_thres(tau={args.tau}) = {threshold} tokens")
    print(table.to_string(index=False, float_format=lambda v: f"{v:.2f}"))


def _hardware(args: argparse.Namespace) -> None:
    if args.regime:
        _regime(args)
        return
    if not args.measure:
        given = [flag for flag, value in (("--device", args.device), ("--dtype", args.dtype),
                                          ("--threads", args.threads), ("--json", args.json),
                                          ("--overwrite", args.overwrite or None)) if value is not None]
        if given:
            raise UsageError(f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} only with --measure")
    else:
        from pathlib import Path

        if args.threads is not None and args.threads < 1:
            raise UsageError(f"--threads must be >= 1, got {args.threads}")
        if args.json is not None and not Path(args.json).resolve().parent.is_dir():
            raise UsageError(f"--json: folder {Path(args.json).resolve().parent} does not exist")
        if args.json is not None:
            new_file("--json", args.json, overwrite=args.overwrite)
        if args.device is not None:
            torch_device("--device", args.device)
    table = pd.DataFrame([{
        "name": hw.name,
        "bf16 TFLOP/s": hw.peak_flops / 1e12,
        "TB/s": hw.memory_bandwidth / 1e12,
        "GB": hw.memory_bytes / 1e9,
        "ridge point": hw.ridge_point,
        "GPUs/node": hw.gpus_per_node,
    } for hw in HARDWARE.values()])
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(_HARDWARE_NOTE)
    if args.measure:
        _measured_hardware(args)


def _regime(args: argparse.Namespace) -> None:
    import json

    from moesd.measure.regime import MIN_STREAMING_SHARE, regime_check

    if args.measure or args.device not in (None, "cpu") or args.dtype is not None:
        raise UsageError("--regime measures the CPU in float32 and bfloat16; leave out --measure, --device and --dtype")
    if args.threads is not None and args.threads < 1:
        raise UsageError(f"--threads must be >= 1, got {args.threads}")
    if args.json is not None:
        new_file("--json", args.json, overwrite=args.overwrite)
    check = regime_check(threads=args.threads)
    design = check.design()
    print(f"\nstreaming share of a B = 1 step (need {MIN_STREAMING_SHARE:g}), {check.settings['threads']} thread(s):")
    print(check.steps.assign(step_ms=1e3 * check.steps["step_seconds"], GB=check.steps["bytes"] / 1e9)
          [["model", "dtype", "layers", "vocab_size", "GB", "step_ms", "streaming_share"]]
          .to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    for row in design.itertuples():
        print(f"{row.model}: {row.dtype} streams {row.streaming_share:.2f} of its step"
              + ("" if row.in_regime else f", below {MIN_STREAMING_SHARE:g}: not the paper's regime"))
    if args.json is not None:
        with open(args.json, "w") as file:
            json.dump(check.as_dict(), file, indent=1)
        print(f"-> {args.json}")


_HARDWARE_NOTE = ("A100, A800, H100, H800, H200: the SXM parts (their data sheets' SXM figures); GPUs/node: the GPUs "
                  "one NVLink or Infinity Fabric domain (L40: one PCIe server) joins, the largest --tp moesd "
                  "predict prices; each record's sources: moesd.theory.roofline.HARDWARE")


def _measured_hardware(args: argparse.Namespace) -> None:
    import json

    from moesd.measure.hardware import measure_roofline

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
    from moesd.routing.prompts import load_prompts

    for flag, value in (("--num-prompts", args.num_prompts), ("--batch-size", args.batch_size),
                        ("--max-new-tokens", args.max_new_tokens)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be >= 1, got {value}")
    _check_trace_engine(args)
    if args.random_weights:
        if args.engine == "hf" and (args.dtype != "auto" or args.device is not None):
            raise UsageError("--dtype and --device apply only without --random-weights (random models run on the CPU)")
        _random_model_spec(args)
        if args.engine == "vllm":
            from moesd.routing.vllm_capture import check_random_shape

            with usage_errors():
                check_random_shape(args.model, args.width)
    else:
        if args.layers is not None or args.width != 1.0:
            raise UsageError("--layers and --width apply only with --random-weights")
        if args.device is not None:
            torch_device("--device", args.device)
        _local_model(args.model)
    out = new_file("--out", args.out, args.overwrite)
    with usage_errors():
        prompts = load_prompts(args.prompts, args.prompt_source)
    if args.num_prompts is not None:
        prompts = prompts.head(args.num_prompts)
    if args.engine == "vllm":
        from moesd.routing.vllm_capture import trace_with_vllm

        trace = trace_with_vllm(args.model, prompts, args.batch_size, args.max_new_tokens, dataset=args.prompts,
                                dtype=args.dtype, draft=args.draft, gamma=args.gamma,
                                temperature=args.temperature, random_weights=args.random_weights,
                                num_layers=args.layers, width=args.width, seed=args.seed)
    elif args.random_weights:
        from moesd.routing.capture import trace_random_model

        trace = trace_random_model(args.model, prompts, args.batch_size, args.max_new_tokens,
                                   num_layers=args.layers, width=args.width, seed=args.seed,
                                   dataset=args.prompts)
    else:
        from moesd.routing.capture import trace_prompts

        trace = trace_prompts(args.model, prompts, args.batch_size, args.max_new_tokens, dataset=args.prompts,
                              dtype=args.dtype, device=args.device)
    path = trace.save(out)
    print(f"{trace.num_tokens} tokens x {len(trace.layers)} MoE layers (E = {trace.num_experts}, "
          f"K = {trace.top_k}) -> {path}")


def _check_trace_engine(args: argparse.Namespace) -> None:
    """Refuse the options of ``moesd trace`` that the chosen --engine does not take."""
    if args.engine == "hf":
        if args.draft is not None or args.gamma is not None or args.temperature != 0:
            raise UsageError("--draft, --gamma and --temperature apply only with --engine vllm")
        return
    if args.device is not None:
        raise UsageError("--device applies only with --engine hf (vLLM uses the GPU it finds, or the CPU)")
    if (args.draft is None) != (args.gamma is None):
        raise UsageError("--draft and --gamma go together (speculative decoding)")
    if args.gamma is not None and args.gamma < 1:
        raise UsageError(f"--gamma must be >= 1, got {args.gamma}")
    if args.draft is not None and args.random_weights:
        raise UsageError("--draft needs pretrained weights: a random-weight target and draft agree on no token")
    if not (math.isfinite(args.temperature) and args.temperature >= 0):
        raise UsageError(f"--temperature must be a finite number >= 0, got {args.temperature}")
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise UsageError("--engine vllm needs vllm, which is not installed here: `make vllm` builds .venv-vllm "
                         "with it (run .venv-vllm/bin/moesd)")


def _random_model_spec(args: argparse.Namespace) -> None:
    """Refuse a --model, --layers or --width that ``moesd trace --random-weights`` cannot build."""
    from moesd.zoo import get_model

    with usage_errors():
        spec = get_model(args.model)
    if not spec.is_moe:
        raise UsageError(f"--model {spec.name} is dense: there is no expert routing to trace")
    from moesd.routing.capture import SUPPORTED_MODEL_TYPES

    if spec.model_type not in SUPPORTED_MODEL_TYPES:
        raise UsageError(f"--model {spec.name}: routing capture supports the model types "
                         f"{', '.join(SUPPORTED_MODEL_TYPES)}, not {spec.model_type!r}")
    if args.layers is not None and not 1 <= args.layers <= spec.num_layers:
        raise UsageError(f"--layers must be in [1, {spec.num_layers}] ({spec.name}), got {args.layers}")
    if not 0 < args.width <= 1:
        raise UsageError(f"--width must be in (0, 1], got {args.width}")


def _local_model(model: str) -> None:
    """Refuse a --model written as a local path (absolute, or starting with . or ~) that is no folder."""
    from pathlib import Path

    path = Path(model).expanduser()
    if model.startswith((".", "~", "/")) and not path.is_dir():
        raise UsageError(f"--model {model!r} is {'a file' if path.exists() else 'not there'}: give a folder "
                         "holding a saved model, or a hub id such as deepseek-ai/DeepSeek-V2-Lite-Chat")


def _sweep(args: argparse.Namespace) -> None:
    from moesd.measure.presets import with_overrides
    from moesd.measure.sweeps import SweepConfig

    given = {name: value for name, value in {
        "target": args.target, "draft": args.draft, "weights": args.weights, "layers": args.layers,
        "draft_layers": args.draft_layers, "width": args.width, "batch_sizes": args.batch_sizes,
        "gammas": args.gammas, "top_ks": args.top_ks, "routing": args.routing,
        "routing_trace": args.routing_trace, "context": args.context, "rounds": args.rounds,
        "warmup_rounds": args.warmup_rounds, "repeats": args.repeats, "dtype": args.dtype,
        "device": args.device, "target_path": args.target_path, "draft_path": args.draft_path,
        "cuda_graphs": args.cuda_graphs or None}.items()
        if value is not None}
    settings = with_overrides(args.study, args.preset, given)  # derived shape settings follow the given ones
    if args.sigma is not None:
        settings["sigma"] = _sigma_per_gamma(args.sigma, settings["gammas"])
    try:
        config = SweepConfig(**settings)
    except UsageError as error:
        raise UsageError(_as_option(str(error))) from None
    if args.engine != "vllm" and (args.tp, args.draft_tp) != (1, 1):
        raise UsageError("--tp and --draft-tp apply only with --engine vllm")

    from moesd.measure.bench import run_sweep  # torch: after the settings are checked
    from moesd.measure.result_file import check_sweep

    with usage_errors():  # device, --out-dir and an existing result file, before any model is built
        path = check_sweep(config, args.out_dir, args.overwrite)
    if args.engine == "vllm":
        from moesd.measure.vllm_engine import run_sweep as run_vllm_sweep

        path = run_vllm_sweep(config, path.parent, overwrite=args.overwrite, tp=args.tp, draft_tp=args.draft_tp)
    else:
        run_sweep(config, path.parent, overwrite=args.overwrite)
    print(f"{config.study} study -> {path}")
    from moesd.measure.studies import check_file

    problems = check_file(path)[2]
    for problem in problems:
        print(f"warning: {path.name}: {problem}", file=sys.stderr)
    if problems:
        print(f"warning: {len(problems)} problem(s) in {path.name} (a bound broken by timing noise in short windows: "
              "more --rounds or --repeats); moesd.measure.studies.load, which the chapters use, warns of them too",
              file=sys.stderr)


def _sigma_per_gamma(words: list[str], gammas) -> dict | str:
    """``--sigma``: ``real``, or one number per gamma as ``{gamma: sigma}``."""
    if words == ["real"]:
        return "real"
    try:
        values = [float(value) for value in words]
    except ValueError:
        raise UsageError(f"--sigma takes numbers or 'real', got {' '.join(words)}") from None
    if len(values) != len(gammas):
        raise UsageError(f"--sigma has {len(values)} value(s) for {len(gammas)} gamma(s) "
                         f"{list(gammas)}: give one sigma per gamma")
    return dict(zip(gammas, values))


def _read_result_file(path) -> tuple[pd.DataFrame, dict | None]:
    """The rows of an e2e or sparsity result file and its sidecar (None if absent), or a one-line UsageError."""
    import json
    from pathlib import Path

    from moesd.measure.studies import FITTING_COLUMNS

    path = Path(path)
    if path.is_dir():
        found = [str(path / f"{study}.csv") for study in ("sparsity", "e2e") if (path / f"{study}.csv").exists()]
        raise UsageError(f"{path} is a directory; give an e2e or sparsity result file"
                         + (f", e.g. {found[0]}" if found else ""))
    if not path.exists():
        raise UsageError(f"{path}: no such file")
    if path.suffix == ".npz":
        raise UsageError(f"{path} is a routing trace (.npz); moesd fit reads an e2e or sparsity result file (.csv)")
    if path.suffix == ".json":
        raise UsageError(f"{path} is a sidecar; give the result file beside it ({path.with_suffix('.csv')})")
    try:
        rows = pd.read_csv(path)
    except (UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as error:
        raise UsageError(f"{path} is not a readable CSV file ({str(error).splitlines()[0]})") from None
    if {"role", "tokens", "seconds"} <= set(rows.columns):
        siblings = [str(path.parent / f"{study}.csv") for study in ("sparsity", "e2e")
                    if (path.parent / f"{study}.csv").exists()]
        hint = f"fit {' or '.join(siblings)}" if siblings else "measure one with `moesd sweep sparsity`"
        raise UsageError(f"{path} is a forward study (stage times per forward, no speedups); moesd fit needs an "
                         f"e2e or sparsity result: {hint}")
    missing = [column for column in FITTING_COLUMNS if column not in rows.columns]
    if missing:
        raise UsageError(f"{path} lacks the column(s) {', '.join(missing)}; moesd fit reads the e2e or sparsity "
                         "result files of `moesd sweep`")
    if rows["num_experts_per_tok"].isna().all():
        raise UsageError(f"{path} has no experts per token (a dense target?); Algorithm 1 fits an MoE target")
    sidecar = path.with_suffix(".json")
    try:
        return rows, json.loads(sidecar.read_text()) if sidecar.exists() else None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise UsageError(f"{sidecar} is not valid JSON ({error})") from None


def _experts(args: argparse.Namespace, sidecar: dict | None) -> tuple[int, str]:
    """E and where it came from: --E, or the target named in the sidecar."""
    from moesd.measure.studies import routed_experts

    if args.E is not None:
        if args.E < 1:
            raise UsageError(f"--E must be >= 1, got {args.E}")
        return args.E, "--E"
    if sidecar is None:
        raise UsageError(f"{args.measurements} has no sidecar (.json beside it) to read E from; pass --E")
    try:
        return routed_experts(sidecar), "sidecar"
    except (KeyError, ValueError) as error:
        raise UsageError(f"{args.measurements}: {error.args[0]}; pass --E") from None


def _ridge_point(args: argparse.Namespace, sidecar: dict | None) -> tuple[float, str]:
    """Algorithm 1's ridge point in tokens and its source: the sidecar's measured roofline, else --hardware's data sheet.

    A data-sheet record gives bf16 peaks, whose ridge point in tokens equals its FLOP/byte
    (:func:`moesd.measure.studies.ridge_tokens_for`).
    """
    from moesd.measure.studies import ridge_tokens_for
    from moesd.theory.roofline import ridge_point

    try:
        rp, source = ridge_tokens_for(sidecar or {}), "measured roofline in the sidecar, in its dtype"
    except ValueError as error:
        if args.hardware is None:
            raise UsageError(f"{args.measurements}: {str(error).split(';')[0]}; pass --hardware NAME to use a "
                             "data-sheet ridge point (moesd hardware lists them)") from None
        with usage_errors():
            return float(ridge_point(args.hardware)), f"{args.hardware} data sheet, --hardware"
    return rp, source + (f"; --hardware {args.hardware} not used" if args.hardware is not None else "")


_SWEEP_OPTIONS = {"target", "draft", "weights", "layers", "draft_layers", "width", "batch_sizes", "gammas", "top_ks",
                  "sigma", "context", "rounds", "warmup_rounds", "repeats", "dtype", "device",
                  "cuda_graphs"}


def _as_option(message: str) -> str:
    """A SweepConfig message with its leading field written as the option (top_ks -> --top-ks)."""
    field, _, rest = message.partition(" ")
    return f"--{field.replace('_', '-')} {rest}" if field in _SWEEP_OPTIONS else message


def _fit(args: argparse.Namespace) -> None:
    from moesd.model.algorithm1 import PARAMETERS
    from moesd.model.diagnostics import held_out_errors
    from moesd.model.fit import fit_speedup_model
    from moesd.model.measurements import check_measurements, from_sweep
    from moesd.model.samples import stride_sample

    if args.stride is not None and args.stride < 1:
        raise UsageError(f"--stride must be >= 1, got {args.stride}")
    rows, sidecar = _read_result_file(args.measurements)
    experts, experts_source = _experts(args, sidecar)
    rp, rp_source = _ridge_point(args, sidecar)
    repeats = int(rows["run"].nunique()) if "run" in rows else 1
    if repeats > 1:  # a point is the mean of its repeats (the paper's are means over runs too)
        from moesd.model.measurements import mean_over_repeats

        rows = mean_over_repeats(rows)
    frame = from_sweep(rows, experts)
    try:
        check_measurements(frame)
    except ValueError as error:
        raise UsageError(f"{args.measurements}: {error}") from None
    if len(frame) < len(PARAMETERS):
        raise UsageError(f"{args.measurements} holds {len(frame)} measurements, fewer than the {len(PARAMETERS)} "
                         "parameters of Algorithm 1")
    fitted = len(frame) if args.stride is None else len(stride_sample(frame, args.stride))
    if fitted < len(PARAMETERS):  # every stride-th of n rows keeps ceil(n / stride) of them
        raise UsageError(f"--stride {args.stride} leaves {fitted} of {len(frame)} measurements to fit, fewer than "
                         f"the {len(PARAMETERS)} parameters of Algorithm 1; use a stride of at most "
                         f"{(len(frame) - 1) // (len(PARAMETERS) - 1)}")
    bounds = None
    if args.bounds == "appendix-c2":
        from moesd.measure.studies import appendix_c2_bounds

        try:
            bounds = appendix_c2_bounds(rows, sidecar)
        except (KeyError, ValueError) as error:
            raise UsageError(f"{args.measurements}: --bounds appendix-c2: {error}") from None
    result = fit_speedup_model(frame, rp, variant=args.variant, stride=args.stride, verify_tokens=args.verify_tokens,
                               bounds=bounds)
    errors = held_out_errors(result, frame)
    verified = "B gamma" if args.verify_tokens == "gamma" else "B (gamma + 1)"
    means = f" (each the mean of {repeats} repeats)" if repeats > 1 else ""
    print(f"{len(result.fitted)} of {len(frame)} measurements{means}, variant {args.variant}, {verified} verified tokens; "
          f"E = {experts} ({experts_source}); ridge point {rp:.4g} tokens ({rp_source}); "
          f"fit {result.fit_seconds:.3f} s")
    print(f"solver: {result.solver}, status {result.status} ({'converged' if result.status > 0 else 'NOT converged'}), "
          f"{result.nfev} evaluations: {result.message}")
    ends = result.on_bounds()
    print(f"bounds: {args.bounds}; on bounds: "
          + (", ".join(f"{name} ({side})" for name, side in ends.items()) if ends else "none"))
    print(f"MSE fitted {result.mse:.4g}; over all {errors['mse_all']:.4g}; "
          + (f"held back ({errors['points']}): MAPE {errors['mape']:.4g} %, max error {errors['max_abs_error']:.4g}"
             if errors["points"] else "none held back (--stride holds some back)"))
    fitted = "fitted (s; lam, s dimensionless)" if bounds is not None else "fitted"
    print(pd.DataFrame({fitted: result.params, "relative to bias": result.relative_params()})
          .to_string(float_format=lambda v: f"{v:.4g}"))


def _integers(text: str, name: str) -> np.ndarray:
    """``"1-5"``, ``"1,2,4"`` or ``"1-4,8,16"`` as sorted unique integers; ValueError naming ``name``."""
    values = set()
    try:
        for part in text.split(","):
            low, _, high = part.partition("-")
            low, high = int(low), int(high or low)
            if high < low:
                raise ValueError
            values.update(range(low, high + 1))
    except ValueError:
        raise UsageError(f"{name} must be integers such as 1-5, 1,2,4 or 1-4,8, got {text!r}") from None
    return np.array(sorted(values))


def _numbers(text: str, name: str) -> np.ndarray:
    try:
        return np.array(sorted({float(part) for part in text.split(",")}))
    except ValueError:
        raise UsageError(f"{name} must be numbers such as 0.8 or 0.7,0.9, got {text!r}") from None


def _span(low: int, high: int) -> str:
    """``B = low-high``, or ``B = low`` when the two are one batch size."""
    return f"B = {low}" if low == high else f"B = {low}-{high}"


def _runs(chosen: pd.Series, best: pd.DataFrame) -> str:
    """The batch sizes ``chosen`` out of ``best["batch_size"]`` as unbroken runs: ``B = 1, 4-256``."""
    sizes = best["batch_size"].to_numpy()
    inside = np.isin(sizes, chosen.to_numpy())
    starts = np.flatnonzero(inside & ~np.r_[False, inside[:-1]])
    ends = np.flatnonzero(inside & ~np.r_[inside[1:], False])
    return "B = " + ", ".join(f"{sizes[a]}" if a == b else f"{sizes[a]}-{sizes[b]}" for a, b in zip(starts, ends))


SD_MARGIN = 0.05
"""``moesd predict`` says SD is 'on' only where the best speedup exceeds 1 by more than this fraction, and
'marginal' above 1 below it: a stated choice, smaller than the errors the book finds for the model."""


def _plot_path(plot: str) -> Path:
    """The file ``--plot`` names, as matplotlib writes it (``.png`` added to a name without a suffix);
    UsageError for a suffix matplotlib cannot write."""
    from matplotlib.backend_bases import FigureCanvasBase

    path = Path(plot)
    if not path.suffix:
        return path.with_name(path.name + ".png")
    formats = FigureCanvasBase.get_supported_filetypes()
    if path.suffix[1:].lower() not in formats:
        raise UsageError(f"--plot: matplotlib cannot write {path.suffix!r} files; use one of "
                         f"{', '.join('.' + kind for kind in sorted(formats))}")
    return path


def _predict_options(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray, str, np.ndarray, dict]:
    """The checked batch sizes, gammas, acceptance column and values, and options of ``moesd predict``."""
    batch, gammas = _integers(args.batch, "--batch"), _integers(args.gamma, "--gamma")
    for name, values in (("--batch", batch), ("--gamma", gammas)):
        if values.min() < 1:
            raise UsageError(f"{name} must be >= 1, got {values.min()}")
    if args.alpha is not None and args.sigma is not None:
        raise UsageError("--sigma and --alpha exclude each other")
    if args.sigma is None:
        column, values = "alpha", _numbers(args.alpha or "0.8", "--alpha")
        if ((values < 0) | (values > 1)).any():
            raise UsageError(f"--alpha must be in [0, 1], got {args.alpha}")
    else:
        column, values = "sigma", _numbers(args.sigma, "--sigma")
        if ((values <= 0) | (values > 1)).any():
            raise UsageError(f"--sigma must be in (0, 1], got {args.sigma}")
        if (values[:, None] < 1 / (gammas[None, :] + 1)).any():
            raise UsageError(f"--sigma must be >= 1 / (gamma + 1) for every --gamma, got {args.sigma}")
    for flag, value, low in (("--tp", args.tp, 1), ("--ep", args.ep, 1), ("--draft-tp", args.draft_tp, 1),
                             ("--context", args.context, 0)):
        if value < low:
            raise UsageError(f"{flag} must be >= {low}, got {value}")
    if not (math.isfinite(args.host_ms) and args.host_ms >= 0):
        raise UsageError(f"--host-ms must be a finite number >= 0, got {args.host_ms}")
    return batch, gammas, column, values, dict(tp=args.tp, draft_tp=args.draft_tp, context=args.context, ep=args.ep,
                                               dtype=args.dtype)


def _verdict(best: pd.DataFrame) -> str:
    """Where the best speedups of ``best`` (one row per batch size) say SD is on, marginal or off."""
    on = best.loc[best["speedup"] > 1 + SD_MARGIN, "batch_size"]
    marginal = best.loc[(best["speedup"] > 1) & (best["speedup"] <= 1 + SD_MARGIN), "batch_size"]
    if not len(on) and not len(marginal):
        return "SD does not pay at any of these batch sizes: leave it off"
    parts = [f"SD pays (best speedup > {1 + SD_MARGIN:g}) at {len(on)} of {len(best)} batch sizes"
             + (f", {_runs(on, best)}" if len(on) else "")]
    if len(marginal):
        parts.append(f"marginal (1-{1 + SD_MARGIN:g}) at {_runs(marginal, best)}")
    return "; ".join(parts)


def _predict(args: argparse.Namespace) -> None:
    from moesd.model.kernels import Efficiency
    from moesd.model.layout import DTYPE_BYTES, resolve_hardware, resolve_model, tensor_parallel_sizes
    from moesd.model.predict import batch_range, best_gamma, memory_fit, predict_sd
    from moesd.paper.predictor_check import HOST_SECONDS_VLLM_V0

    batch, gammas, column, values, options = _predict_options(args)
    plot = _plot_path(args.plot) if args.plot else None
    for flag, path in (("--csv", args.csv), ("--plot", plot)):
        if path and not Path(path).resolve().parent.is_dir():
            raise UsageError(f"{flag}: folder {Path(path).resolve().parent} does not exist")
        if path:
            new_file(flag, path, overwrite=True)

    def predict(batch_sizes, acceptance, host_ms):
        return predict_sd(args.target, args.draft, args.hardware, batch_sizes, gammas, **options,
                          efficiency=Efficiency(step_seconds=host_ms * 1e-3), **{column: acceptance})

    try:  # one point checks what the options must satisfy together (ep divides E, an interconnect for tp...)
        predict(batch[:1], values[:1], args.host_ms)
    except ValueError as error:  # name the command-line flag of the argument the package names
        message = str(error)
        first = message.split(" ", 1)[0].rstrip(":")
        flag = {"model": "--target/--draft", "hardware": "--hardware", "tp": "--tp", "draft_tp": "--draft-tp",
                "ep": "--ep", "dtype": "--dtype", "context": "--context"}.get(first)
        message = message.replace(" or a Hardware record", "")  # what a program, not the command line, may pass
        raise UsageError(f"{flag}: {message}" if flag else message) from None
    frame = predict(batch, values, args.host_ms)
    if args.csv:
        frame.to_csv(args.csv, index=False)
    hardware = resolve_hardware(args.hardware)
    other_ms = 0.0 if args.host_ms else HOST_SECONDS_VLLM_V0 * 1e3  # the verdict says if it changes there
    print(f"{args.target} on {args.tp} x {hardware.name} (ep {args.ep}), draft {args.draft} on {args.draft_tp} "
          f"GPU(s), {args.dtype}, context {args.context} tokens; speedup of Eq. 4 predicted by moesd.model.predict "
          f"(roofline at achieved fractions of data-sheet peaks, host cost {args.host_ms:g} ms per forward pass"
          + (f": where SD pays, an upper bound; --host-ms adds a serving engine's, e.g. {other_ms:.2g} ms from "
             "vLLM v0's own profile, moesd.paper.predictor_check" if args.host_ms == 0 else "") + ")")
    target, draft = resolve_model(args.target), resolve_model(args.draft)
    if target.vocab_size != draft.vocab_size:
        print(f"note: the vocabularies differ ({target.vocab_size} against {draft.vocab_size} tokens); SD needs a "
              "draft that shares the target's tokenizer")
    elif target.hidden_size == draft.hidden_size and args.draft_tp < args.tp:
        print(f"note: the draft shares the target's hidden size and vocabulary (an MTP head or a one-layer draft), "
              f"which engines run on the target's GPUs: --draft-tp {args.tp} times that (its memory still "
              f"checked on GPUs of its own), --draft-tp {args.draft_tp} times it on {args.draft_tp} GPU(s)")
    fit = memory_fit(args.target, args.draft, hardware, batch, args.context, args.tp, args.draft_tp, args.ep,
                     args.dtype)
    fits = fit["fits"].to_numpy()
    smaller = [name for name, size in DTYPE_BYTES.items() if size < DTYPE_BYTES[args.dtype]]
    for role, model, gpus, flag in (("target", target, args.tp, "--tp"), ("draft", draft, args.draft_tp, "--draft-tp")):
        held = fit[f"{role}_bytes"].to_numpy()
        if held.max() > hardware.memory_bytes:
            more = [tp for tp in tensor_parallel_sizes(model, hardware) if tp > gpus]
            remedies = ([f"{flag} {' or '.join(map(str, more))}"] if more else []) \
                + ([f"--dtype {' or '.join(smaller)}"] if smaller else []) \
                + (["a shorter --context"] if args.context else [])
            print(f"does not fit: the {role}'s weights and KV cache need {held.max() / 1e9:.0f} GB per GPU at "
                  f"B = {batch.max()}" + (f" ({held.min() / 1e9:.0f} GB at B = {batch.min()})" if len(batch) > 1 else "")
                  + f" on {gpus} GPU(s); one {hardware.name} holds {hardware.memory_bytes / 1e9:.0f} GB"
                  + (f" (try {'; '.join(remedies)})." if remedies else "."))
    if not fits.all():
        print(f"Only B <= {batch[fits].max()} fits ({fits.sum()} of {len(batch)} batch sizes; activations and the "
              "engine's workspace not counted); the summary below covers those." if fits.any()
              else "No batch size fits; the numbers below assume one did.")
    judged = batch[fits] if fits.any() else batch
    other = predict(judged, values, other_ms)
    for value in values:
        rows = frame[(frame[column] == value) & frame["batch_size"].isin(judged)]
        best = best_gamma(rows)
        shown = best
        if len(best) > 24:  # a readable table: powers of two and the ends
            keep = {int(b) for b in best["batch_size"] if b & (b - 1) == 0} | {int(best["batch_size"].iloc[0]),
                                                                            int(best["batch_size"].iloc[-1])}
            shown = best[best["batch_size"].isin(keep)]
        sd = np.select([shown["speedup"] > 1 + SD_MARGIN, shown["speedup"] > 1], ["on", "marginal"], "off")
        table = shown.assign(t_target_1=shown["t_target_1"] * 1e3, t_target_gamma=shown["t_target_gamma"] * 1e3,
                             t_draft=shown["t_draft"] * 1e3, sd=sd)[
            ["batch_size", "gamma", "speedup", "sd", "target_efficiency", "draft_term", "t_target_1",
             "t_target_gamma", "t_draft"]].rename(columns={
                "gamma": "best gamma", "sd": "SD", "t_target_1": "T_T(B,1) ms", "t_target_gamma": "T_T(B,g+1) ms",
                "t_draft": "T_D(B,1) ms"})
        low, high, peak, at = batch_range(rows)
        verdict = _verdict(best)
        alternative = best_gamma(other[other[column] == value])
        on = alternative.loc[alternative["speedup"] > 1 + SD_MARGIN, "batch_size"]
        if _verdict(alternative) != verdict:
            verdict += (f" (this depends on the host cost: at --host-ms {other_ms:.2g} SD is on at "
                        + (_runs(on, alternative) if len(on) else "no batch size") + ")")
        band = f", the paper's x / sqrt(2) band (>= peak / sqrt(2) and > 1) {_span(low, high)}" if peak > 1 else ""
        print(f"\n{column} = {value:g}: {verdict}; peak speedup {peak:.2f}x at B = {at}{band}"
              + (" (rows shown: powers of two and the ends)" if shown is not best else ""))
        print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"\nSD: on where the best gamma's speedup exceeds {1 + SD_MARGIN:g}, marginal where it exceeds 1 by less "
          f"(a margin of {100 * SD_MARGIN:g} %), else off. draft_term: gamma T_D(B,1) / T_T(B,1), the draft's "
          "share of Eq. 4's denominator; target_efficiency: T_T(B,1) / T_T(B,gamma+1).")
    if plot:
        import matplotlib.pyplot as plt

        from moesd.plots import speedup_heatmap

        figure, axes = plt.subplots(len(values), 1, figsize=(6.4, 3.2 * len(values)), squeeze=False,
                                    layout="constrained")
        for value, ax in zip(values, axes[:, 0]):
            speedup_heatmap(frame[(frame[column] == value) & frame["batch_size"].isin(judged)], ax=ax,
                            title=f"{args.target} on {args.tp} x {hardware.name}, {column} {value:g}")
        figure.savefig(plot, dpi=150, bbox_inches="tight")
    if args.csv or plot:
        print("\n" + " and ".join(f"{path}" for path in (args.csv, plot) if path) + " written")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``moesd`` command."""
    parser = argparse.ArgumentParser(prog="moesd", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    theory = commands.add_parser("theory", help="expected activated experts and tokens per expert")
    theory.add_argument("--E", type=int, required=True, help="routed experts per MoE layer")
    theory.add_argument("--K", type=int, required=True, help="experts per token")
    theory.add_argument("--tokens", type=int, nargs="+", default=DEFAULT_TOKENS,
                        help="token counts to tabulate (default: %(default)s)")
    theory.add_argument("--tau", type=float, default=0.95,
                        help="'almost all' fraction for T_thres (default: %(default)s)")
    theory.set_defaults(run=_theory)

    hardware = commands.add_parser("hardware", help="hardware records and ridge points; --measure: this machine's")
    hardware.add_argument("--measure", action="store_true",
                          help="measure this machine's roofline (STREAM bandwidth, GEMM FLOP/s against M)")
    hardware.add_argument("--device", choices=["cpu", "cuda"], help="with --measure: device (default cpu)")
    hardware.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                          help="with --measure: GEMM type (default float32)")
    hardware.add_argument("--threads", type=int, help="with --measure: torch threads (default: torch's)")
    hardware.add_argument("--json", help="with --measure or --regime: write what was measured to this JSON file")
    hardware.add_argument("--overwrite", action="store_true", help="replace an existing --json file")
    hardware.add_argument("--regime", action="store_true",
                          help="measure whether this CPU can run the studies in the paper's regime: real expert "
                               "projections against M, per-expert dispatch and the streaming share of a B = 1 step "
                               "(moesd.measure.regime)")
    hardware.set_defaults(run=_hardware)

    trace = commands.add_parser("trace", help="capture expert routing of a MoE model (Hugging Face or vLLM)")
    trace.add_argument("--model", required=True,
                       help="hub id or local folder; with --random-weights a moesd.zoo name or hub id")
    trace.add_argument("--prompts", required=True, choices=["humaneval", "mt_bench", "gsm8k"])
    trace.add_argument("--prompt-source", help="local file or folder of the prompts (default: the hub)")
    trace.add_argument("--num-prompts", type=int, help="use only the first N prompts")
    trace.add_argument("--batch-size", type=int, default=8, help="sequences per generate call")
    trace.add_argument("--max-new-tokens", type=int, default=128, help="tokens generated per sequence")
    trace.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"],
                       help="weight dtype of a checkpoint (default: auto, the checkpoint's)")
    trace.add_argument("--device", help="torch device of a checkpoint, e.g. cuda, cuda:1 or cpu (default: cuda when "
                       "available; --random-weights models run on the CPU)")
    trace.add_argument("--out", required=True, help="trace file to write (.npz)")
    trace.add_argument("--overwrite", action="store_true", help="replace an existing trace file")
    trace.add_argument("--random-weights", action="store_true",
                       help="build the architecture with random weights (no download; byte tokens)")
    trace.add_argument("--layers", type=int, help="with --random-weights: keep the first N layers")
    trace.add_argument("--width", type=float, default=1.0, help="with --random-weights: scale every width")
    trace.add_argument("--seed", type=int, default=0, help="seed of the random weights (--random-weights) and, with --engine vllm, of "
                            "vLLM and its sampling")
    trace.add_argument("--engine", default="hf", choices=["hf", "vllm"],
                       help="hf: hooks on Hugging Face routers (default); vllm: vLLM's router callbacks "
                            "(moesd.routing.vllm_capture, needs vllm: make vllm)")
    trace.add_argument("--draft", help="with --engine vllm: draft model (hub id or folder) for speculative decoding; "
                                       "verified draft tokens not in the sequence get phase 'rejected'")
    trace.add_argument("--gamma", type=int, help="with --draft: draft tokens per round")
    trace.add_argument("--temperature", type=float, default=0.0,
                       help="with --engine vllm: sampling temperature (default 0, greedy)")
    trace.set_defaults(run=_trace)

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
    sweep.add_argument("--routing", choices=["uniform", "model", "trace"],
                       help="how an MoE target routes: each token's experts drawn uniformly (Eq. 8; the default "
                            "with random weights), by its own router (the default with pretrained weights), or "
                            "as a routing trace (--routing-trace) recorded them")
    sweep.add_argument("--routing-trace", help="with --routing trace: the .npz routing trace to replay (its E and K "
                                               "must be the target's)")
    sweep.add_argument("--sigma", nargs="+", help="one sigma per gamma for synthetic acceptance, or 'real'")
    sweep.add_argument("--context", type=int, help="prompt tokens per sequence")
    sweep.add_argument("--rounds", type=int, help="timed SD rounds and AR steps per point (default 32)")
    sweep.add_argument("--warmup-rounds", type=int, help="untimed rounds before them (default 1)")
    sweep.add_argument("--repeats", type=int, help="independent repeats of every point (default: the preset's)")
    sweep.add_argument("--dtype", help="float32, float64, bfloat16 or float16")
    sweep.add_argument("--device", help="cpu, cuda or cuda:N")
    sweep.add_argument("--out-dir", help="folder of the result file (default: $MOESD_DATA/measurements/<device>, "
                                         "MOESD_DATA defaulting to the repository's data/)")
    sweep.add_argument("--overwrite", action="store_true", help="replace a finished result file")
    sweep.add_argument("--cuda-graphs", action="store_true",
                       help="on CUDA: run each forward as a CUDA graph replay over a static cache (forward "
                            "studies time the replays; end-to-end studies decode with them)")
    sweep.add_argument("--engine", default="hf", choices=["hf", "vllm"],
                       help="hf: moesd's own engine (default); vllm: vLLM's offline API (moesd.measure.vllm_engine, "
                            "needs vllm: make vllm)")
    sweep.add_argument("--tp", type=int, default=1, help="with --engine vllm: tensor-parallel GPUs of the target")
    sweep.add_argument("--draft-tp", type=int, default=1, help="with --engine vllm: tensor-parallel GPUs of the draft")
    sweep.set_defaults(run=_sweep)

    fit = commands.add_parser("fit", help="fit Algorithm 1 to an e2e or sparsity result file (moesd.model.fit)")
    fit.add_argument("measurements", help="CSV written by moesd sweep (e2e, sparsity), with its .json sidecar")
    fit.add_argument("--E", type=int, help="override E, the routed experts per layer (default: from the sidecar)")
    fit.add_argument("--hardware", help="moesd.theory.roofline.HARDWARE name whose data-sheet ridge point is used when "
                                        "the sidecar holds no measured roofline")
    fit.add_argument("--variant", default="eq4", choices=["eq4", "printed"], help="Algorithm 1 denominator")
    fit.add_argument("--verify-tokens", default="gamma", choices=["gamma", "gamma+1"],
                     help="tokens per sequence verified: Algorithm 1's gamma or vLLM's gamma + 1")
    fit.add_argument("--stride", type=int, help="fit df[::stride] of the rows sorted by K, gamma, B")
    fit.add_argument("--bounds", default="free", choices=["free", "appendix-c2"],
                     help="free: time-like parameters in [0, inf), reported relative to bias (default); appendix-c2: "
                          "the paper's volume bounds for the models and measured bandwidth of the sidecar, which "
                          "make the parameters seconds (moesd.measure.studies.appendix_c2_bounds)")
    fit.set_defaults(run=_fit)

    predict = commands.add_parser(
        "predict", help="predict SD's speedup for a model on GPUs (moesd.model.predict)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=textwrap.fill("models (--target, --draft): " + ", ".join(MODELS), 100, break_on_hyphens=False) + "\n"
        + textwrap.fill("hardware (--hardware, any case): " + ", ".join(HARDWARE), 100, break_on_hyphens=False) + "\n"
        + textwrap.fill(_HARDWARE_NOTE + "; `moesd hardware` lists them.", 100, break_on_hyphens=False))
    predict.add_argument("--target", required=True, help="moesd.zoo name of the target, e.g. deepseek-v3")
    predict.add_argument("--draft", required=True, help="moesd.zoo name of the draft, e.g. deepseek-v3-mtp")
    predict.add_argument("--hardware", required=True, help="moesd.theory.roofline.HARDWARE name, e.g. H200 (below)")
    predict.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs of the target (default 1)")
    predict.add_argument("--ep", type=int, default=1, help="expert-parallel degree, dividing --tp (default 1)")
    predict.add_argument("--draft-tp", type=int, default=1,
                         help="tensor-parallel GPUs of the draft, its own beside the target's (default 1)")
    predict.add_argument("--gamma", default="1-5", help="draft lengths, e.g. 1-5 or 2,4 (default 1-5)")
    predict.add_argument("--alpha", help="per-token acceptance probability(ies): sigma(alpha, gamma) of Eq. 5 for "
                         "each gamma (default 0.8)")
    predict.add_argument("--sigma", help="emitted fraction(s) sigma of Eq. 5 instead of --alpha, the same for every "
                         "gamma (then a longer draft looks better wherever verification is memory-bound)")
    predict.add_argument("--batch", default="1-256", help="batch sizes, e.g. 1-256 or 1,8,64 (default 1-256)")
    predict.add_argument("--context", type=int, default=1024, help="tokens in each KV cache (default 1024)")
    predict.add_argument("--dtype", default="bf16", help="weight dtype: bf16, fp8 or fp32 (default bf16)")
    predict.add_argument("--host-ms", type=float, default=0.0,
                         help="host cost of every forward pass of target and draft, ms (scheduling, input "
                         "preparation, sampling in a serving engine; default 0: the GPUs' work only)")
    predict.add_argument("--csv", help="write every predicted row to this CSV file")
    predict.add_argument("--plot", help="write a heatmap of speedup over (B, gamma) to this image file (a suffix matplotlib writes, "
                         ".png if none), one panel per --alpha or --sigma, over the batch sizes that fit")
    predict.set_defaults(run=_predict)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the ``moesd`` command; returns the exit status.

    A :class:`moesd._checks.UsageError` (a bad argument, raised by a sub-command's checks or by
    the package's input validation) is printed as a one-line usage error with exit status 2;
    any other exception is a failure of the program and keeps its traceback. When the reader of
    the output of a command that only prints (theory, hardware, fit, predict) goes away
    (``moesd predict ... | head``), the command stops quietly with status 1, as Python's documentation
    of SIGPIPE advises; a broken pipe inside trace or sweep (a worker process, say) is a failure.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.run(args)
    except UsageError as error:
        parser.error(str(error))
    except BrokenPipeError:
        if args.run not in (_theory, _hardware, _fit, _predict):
            raise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
