"""``moesd fit``: Algorithm 1 fitted to an e2e or sparsity result file."""

import argparse
from pathlib import Path

import pandas as pd

from moesd._checks import UsageError, as_array, usage_errors
from moesd._files import lookup_problem


def _read_result_file(args: argparse.Namespace) -> tuple[pd.DataFrame, dict | None]:
    """The rows of an e2e or sparsity result file and its sidecar (None if absent), or a one-line UsageError
    (:func:`moesd.model.measurements.read_result_file`)."""
    from moesd.model.measurements import read_result_file

    path = Path(args.measurements)
    problem = lookup_problem(path)  # a loop of links, a name too long: said before "no such file"
    if problem:
        raise UsageError(f"measurements {str(path)!r} cannot be read: {problem}")
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
    with usage_errors():
        return read_result_file(path, args.allow_incomplete, args.allow_above_ceiling)


def _experts(args: argparse.Namespace, sidecar: dict | None) -> tuple[int, str]:
    """E and where it came from: --E, or the target named in the sidecar."""
    from moesd.measure.analysis import routed_experts

    if args.E is not None:
        if args.E < 1:
            raise UsageError(f"--E must be >= 1, got {args.E}")
        return int(as_array("--E", args.E, low=1, whole=True)), "--E"
    if sidecar is None:
        raise UsageError(f"{args.measurements} has no sidecar (.json beside it) to read E from; pass --E")
    try:
        return routed_experts(sidecar), "sidecar"
    except (KeyError, ValueError) as error:
        raise UsageError(f"{args.measurements}: {error.args[0]}; pass --E") from None


def _ridge_point(args: argparse.Namespace, sidecar: dict | None) -> tuple[float, str]:
    """Algorithm 1's ridge point in tokens and its source: the sidecar's measured roofline, else --hardware's data sheet.

    A data-sheet record gives bf16 peaks, whose ridge point in tokens equals its FLOP/byte
    (:func:`moesd.measure.analysis.ridge_tokens_for`).
    """
    from moesd.measure.analysis import ridge_tokens_for
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






def run(args: argparse.Namespace) -> None:
    from moesd.model.algorithm1 import PARAMETERS
    from moesd.model.diagnostics import held_out_errors
    from moesd.model.fit import fit_speedup_model
    from moesd.model.measurements import check_measurements, from_sweep
    from moesd.model.samples import stride_sample

    if args.stride is not None and args.stride < 1:
        raise UsageError(f"--stride must be >= 1, got {args.stride}")
    if args.stride is not None:
        as_array("--stride", args.stride, low=1, whole=True)
    rows, sidecar = _read_result_file(args)
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
        from moesd.model.bounds import appendix_c2_bounds

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


def add_parser(commands) -> None:
    """Declare ``moesd fit`` and its options on the sub-command parsers ``commands``."""
    fit = commands.add_parser("fit", help="fit Algorithm 1 to an e2e or sparsity result file (moesd.model.fit)")
    fit.add_argument("measurements", help="CSV written by moesd sweep (e2e, sparsity), with its .json sidecar")
    fit.add_argument("--E", type=int, help="override E, the routed experts per layer (default: from the sidecar)")
    fit.add_argument("--hardware", help="moesd.theory.roofline.HARDWARE name whose data-sheet ridge point is used when "
                                        "the sidecar holds no measured roofline")
    fit.add_argument("--variant", default="eq4", choices=["eq4", "printed"], help="Algorithm 1 denominator")
    fit.add_argument("--verify-tokens", default="gamma", choices=["gamma", "gamma+1"],
                     help="tokens per sequence verified: Algorithm 1's gamma or vLLM's gamma + 1")
    fit.add_argument("--allow-incomplete", action="store_true",
                     help="fit the rows of a sweep that stopped part-way (its sidecar says complete: false)")
    fit.add_argument("--allow-above-ceiling", action="store_true",
                     help="fit rows whose speedup exceeds Eq. 4's ceiling sigma (gamma + 1) (timing noise?)")
    fit.add_argument("--stride", type=int, help="fit df[::stride] of the rows sorted by K, gamma, B")
    fit.add_argument("--bounds", default="free", choices=["free", "appendix-c2"],
                     help="free: time-like parameters in [0, inf), reported relative to bias (default); appendix-c2: "
                          "the paper's volume bounds for the models and measured bandwidth of the sidecar, which "
                          "make the parameters seconds (moesd.model.bounds.appendix_c2_bounds)")
    fit.set_defaults(run=run, prints_only=True)
