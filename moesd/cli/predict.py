"""``moesd predict``: should SD be on for this MoE on this GPU? The predicted speedup over batch size
and draft length, the memory that fits, and where SD pays."""

import argparse
import contextlib
import math
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd

from moesd._checks import UsageError, new_files
from moesd._files import atomic_write
from moesd.predictor.engine import ALIASES, ENGINES
from moesd.predictor.layout import KV_DTYPES
from moesd.predictor.models import DRAFTERS
from moesd.predictor.predict import check_grid
from moesd.predictor.setup import Setup
from moesd.theory.roofline import HARDWARE
from moesd.zoo import DRAFT_HEADS, MODELS
from moesd.cli.arguments import integers, numbers
from moesd.cli.hardware import HARDWARE_NOTE

FLAGS = {"target": "--target", "draft": "--draft", "hardware": "--hardware", "tp": "--tp", "draft_tp": "--draft-tp",
         "ep": "--ep", "dtype": "--dtype", "draft_dtype": "--draft-dtype", "context": "--context",
         "batch_size": "--batch", "gamma": "--gamma", "tokens_per_sequence": "--gamma", "sigma": "--sigma",
         "alpha": "--alpha", "alpha_decay": "--alpha-decay", "dp_attention": "--dp-attention",
         "draft_topk": "--draft-topk", "verify_tokens": "--verify-tokens", "step_seconds": "--step-ms",
         "step_batch_size": "--step-batch", "host_seconds": "--host-ms", "engine": "--engine-profile",
         "kv_dtype": "--kv-dtype", "temperature": "--temperature", "sd_step_seconds": "--sd-step-ms",
         "sd_step_gamma": "--sd-step-ms"}
"""The flag of each argument a :class:`~moesd.predictor.setup.Setup` or the grid names in its errors."""


@contextlib.contextmanager
def _flagged():
    """Re-raise a :class:`UsageError` of the package with the flag of its ``argument`` (:data:`FLAGS`) in front."""
    try:
        yield
    except UsageError as error:
        flag = FLAGS.get(error.argument)
        message = error.message.replace(" or a Hardware record", "")  # what a program, not the command line, passes
        if flag and message.startswith(f"{error.argument}: "):  # "draft: ..." becomes "--draft: ...", not twice
            message = message[len(error.argument) + 2:]
        raise UsageError(f"{flag}: {message}" if flag else message, error.argument) from None


MAX_ROWS = 10**6
"""The most predictions ``moesd predict`` makes (batch sizes x draft lengths x acceptance values), about 200 bytes
of table each."""


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


def _predict_options(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray, str, np.ndarray, Setup]:
    """The checked batch sizes, gammas, acceptance column and values, and the deployment of ``moesd predict``."""
    batch, gammas = integers(args.batch, "--batch"), integers(args.gamma, "--gamma")
    for name, values in (("--batch", batch), ("--gamma", gammas)):
        if values.min() < 1:
            raise UsageError(f"{name} must be >= 1, got {values.min()}")
    given = [flag for flag, value in (("--alpha", args.alpha), ("--sigma", args.sigma),
                                      ("--acceptance-length", args.acceptance_length)) if value is not None]
    if len(given) > 1:
        raise UsageError(f"{' and '.join(given)} exclude each other")
    if not (math.isfinite(args.alpha_decay) and 0 < args.alpha_decay <= 1):
        raise UsageError(f"--alpha-decay must be in (0, 1], got {args.alpha_decay}")
    if args.alpha_decay != 1 and args.sigma is not None:
        raise UsageError("--alpha-decay applies to --alpha or --acceptance-length, not --sigma")
    if args.acceptance_length is not None:
        column, values = "alpha", _alpha_from_length(args.acceptance_length, args.alpha_decay)
    elif args.sigma is None:
        column, values = "alpha", numbers("0.8" if args.alpha is None else args.alpha, "--alpha")
        if ((values < 0) | (values > 1)).any():
            raise UsageError(f"--alpha must be in [0, 1], got {args.alpha}")
    else:
        column, values = "sigma", numbers(args.sigma, "--sigma")
        if ((values <= 0) | (values > 1)).any():
            raise UsageError(f"--sigma must be in (0, 1], got {args.sigma}")
        if (values[:, None] < 1 / (gammas[None, :] + 1)).any():
            raise UsageError(f"--sigma must be >= 1 / (gamma + 1) for every --gamma, got {args.sigma}")
    for flag, value, low in (("--tp", args.tp, 1), ("--ep", args.ep, 1), ("--draft-tp", args.draft_tp, 1),
                             ("--context", args.context, 0), ("--draft-topk", args.draft_topk, 1),
                             ("--verify-tokens", args.verify_tokens, 2), ("--step-batch", args.step_batch, 1)):
        if value is not None and value < low:
            raise UsageError(f"{flag} must be >= {low}, got {value}")
    if args.draft_topk > 1 and args.acceptance_length is None and args.sigma is None:
        raise UsageError("--draft-topk prices a tree of drafts: give its measured --acceptance-length L@gamma (or "
                         "--sigma); --alpha's Eq. 5 is a chain's acceptance")
    if args.verify_tokens is not None and args.draft_topk == 1:
        raise UsageError("--verify-tokens applies to a tree of drafts (--draft-topk 2 or more); a chain verifies "
                         "gamma + 1 tokens")
    if args.dp_attention and args.tp < 2:
        raise UsageError("--dp-attention needs --tp 2 or more: on one GPU there is nothing to spread")
    if not (math.isfinite(args.host_ms) and args.host_ms >= 0):
        raise UsageError(f"--host-ms must be a finite number >= 0, got {args.host_ms}")
    if args.host_ms and args.engine_profile:
        raise UsageError("--host-ms and --engine-profile exclude each other: with a profile the engine's fixed "
                         "costs come from the profile and from --step-ms (a measured plain step)")
    if args.step_batch != 1 and args.step_ms is None:
        raise UsageError("--step-batch applies only with --step-ms (the batch size that step was measured at)")
    rows = len(batch) * len(gammas) * len(values)
    if rows > MAX_ROWS:
        raise UsageError(f"--batch, --gamma and the acceptance values make {rows} predictions "
                         f"({len(batch)} x {len(gammas)} x {len(values)}); at most {MAX_ROWS} are allowed "
                         f"(about {rows * 200 / 2**30:.0f} GiB of table): give fewer values")
    if args.step_ms is not None and not (math.isfinite(args.step_ms) and args.step_ms > 0):
        raise UsageError(f"--step-ms must be a finite number > 0, got {args.step_ms}")
    if args.step_ms is not None and args.host_ms:
        raise UsageError("--step-ms and --host-ms exclude each other: a measured step holds the host's cost")
    if args.sd_step_ms is not None and args.step_ms is None:
        raise UsageError("--sd-step-ms needs --step-ms: the measured plain step at the same --step-batch holds the "
                         "engine's fixed cost per pass, and the round's excess over the predicted one is the rest")
    sd_ms, sd_gamma = _measured_round(args.sd_step_ms) if args.sd_step_ms is not None else (None, None)
    with _flagged():
        setup = Setup(args.target, args.draft, args.hardware, tp=args.tp, ep=args.ep, dp_attention=args.dp_attention,
                      draft_tp=args.draft_tp, dtype=args.dtype, draft_dtype=args.draft_dtype, context=args.context,
                      engine=args.engine_profile, step_batch_size=args.step_batch, host_seconds=args.host_ms * 1e-3,
                      step_seconds=None if args.step_ms is None else args.step_ms * 1e-3,
                      draft_topk=args.draft_topk, verify_tokens=args.verify_tokens or "gamma+1",
                      kv_dtype=args.kv_dtype, temperature=args.temperature,
                      sd_step_seconds=None if sd_ms is None else sd_ms * 1e-3, sd_step_gamma=sd_gamma)
        check_grid(setup, batch, gammas, **{column: values}, **({"alpha_decay": args.alpha_decay}
                                                                   if column == "alpha" else {}))
    if args.routing_source is not None:
        _check_routing_source(args.routing_source, setup)
    return batch, gammas, column, values, setup


def _check_routing_source(name: str, setup: Setup) -> None:
    """Refuse a ``--routing-source`` that is not shipped, or whose router has another expert count than the target."""
    from moesd.routing import sources

    if name not in sources.names():
        raise UsageError(f"--routing-source: no shipped routing source is named {name!r}; the sources are "
                         f"{', '.join(sources.names())}")
    experts, target = sources.info(name).num_experts, setup.target
    if not target.num_experts:
        raise UsageError(f"--routing-source: {target.name} is dense: it routes no tokens to experts")
    if experts != target.num_experts:
        raise UsageError(f"--routing-source: {name} routes over {experts} experts and {target.name} has "
                         f"{target.num_experts} experts; pick a source of {target.num_experts} experts "
                         "or leave the option out (uniform routing, Eq. 8)")


def _at_gamma(text: str, flag: str, what: str, example: str) -> tuple[float, int]:
    """``VALUE@GAMMA`` of ``flag`` as (value, gamma), refused as ``what`` with an ``example``."""
    value, _, gamma = text.partition("@")
    try:
        return float(value), int(gamma)
    except ValueError:
        raise UsageError(f"{flag} must be {what}, such as {example}, got {text!r}") from None


def _measured_round(text: str) -> tuple[float, int]:
    """``--sd-step-ms MS@GAMMA`` as (milliseconds, gamma)."""
    ms, gamma = _at_gamma(text, "--sd-step-ms", "a round's milliseconds and the gamma it ran at", "31.5@3")
    if not (math.isfinite(ms) and ms > 0 and 1 <= gamma <= 64):
        raise UsageError(f"--sd-step-ms must be a finite time > 0 at a gamma in [1, 64], got {text!r}")
    return ms, gamma


def _alpha_from_length(text: str, decay: float) -> np.ndarray:
    """``--acceptance-length L@g`` as the first position's acceptance alpha (one value)."""
    from moesd.theory.acceptance import alpha_for_acceptance_length

    length, gamma = _at_gamma(text, "--acceptance-length", "tokens per round and the gamma measured", "2.4@3")
    if not (math.isfinite(length) and 1 <= gamma <= 64):
        raise UsageError(f"--acceptance-length must be a finite length at a gamma in [1, 64], got {text!r}")
    try:
        return np.atleast_1d(alpha_for_acceptance_length(length, gamma, decay))
    except ValueError as error:
        raise UsageError(f"--acceptance-length: {error}") from None


def run(args: argparse.Namespace) -> None:
    """Print where SD pays for the setup the options describe (:func:`moesd.predictor.recommend.recommend`)."""
    from moesd import narration
    from moesd.predictor.recommend import SD_MARGIN, recommend

    batch, gammas, column, values, setup = _predict_options(args)
    plot = _plot_path(args.plot) if args.plot else None
    for flag, path in (("--csv", args.csv), ("--plot", plot)):
        if path and not Path(path).resolve().parent.is_dir():
            raise UsageError(f"{flag}: folder {Path(path).resolve().parent} does not exist")
    new_files({"--csv": args.csv, "--plot": plot}, args.overwrite)
    answer = recommend(setup, batch, gammas, column, values, alpha_decay=args.alpha_decay, routing=args.routing_source)
    if args.csv:
        columns = {"target": args.target, "draft": args.draft, "hardware": answer.hardware.name, "tp": setup.tp,
                   "ep": setup.ep, "dp_attention": args.dp_attention, "draft_tp": answer.draft_tp, "dtype": args.dtype,
                   "draft_dtype": args.draft_dtype or args.dtype, "kv_dtype": args.kv_dtype or "",
                   "temperature": args.temperature, "draft_topk": args.draft_topk,
                   "verify_tokens": args.verify_tokens or "gamma+1",
                   "engine_profile": setup.engine.name if setup.engine is not None else "", "step_ms": args.step_ms,
                   "sd_step_ms": args.sd_step_ms or "", "host_ms": args.host_ms,
                   "routing_source": args.routing_source or "uniform"}
        with atomic_write(args.csv, "w") as file:  # the setup first, so files of several runs can be told apart
            pd.concat([pd.DataFrame(columns, index=answer.frame.index), answer.frame], axis=1).to_csv(file, index=False)
    print(narration.predict_setup(setup, args.target, args.draft, answer.advice[0].other_host_ms))
    if args.routing_source is not None:
        print(narration.routing_source_line(args.routing_source))
    for line in narration.predict_notes(answer, setup) + narration.memory_lines(answer, batch):
        print(line)
    print(narration.band_line(answer, SD_MARGIN))
    for advice in answer.advice:
        print(narration.advice_report(advice, SD_MARGIN, args.acceptance_length))
    if answer.engine_ends:
        print(narration.engine_range(setup.engine.name, answer, args.acceptance_length))
    print(narration.sd_legend(SD_MARGIN))
    if plot:
        _heatmaps(answer, column, values, plot, f"{args.target} on {args.tp} x {answer.hardware.name}, "
                  f"draft {args.draft}, {args.dtype}" + (f", {setup.engine.name}" if setup.engine is not None else ""))
    if args.csv or plot:
        print("\n" + " and ".join(f"{path}" for path in (args.csv, plot) if path) + " written")


def _heatmaps(answer, column: str, values, path, title: str) -> None:
    """One heatmap of speedup over (B, gamma) per acceptance value, over the batch sizes judged, to ``path``."""
    import matplotlib.pyplot as plt

    from moesd.plots import speedup_heatmap

    figure, axes = plt.subplots(len(values), 1, figsize=(6.4, 3.2 * len(values)), squeeze=False,
                                layout="constrained")
    for value, ax in zip(values, axes[:, 0]):
        rows = answer.frame[(answer.frame[column] == value) & answer.frame["batch_size"].isin(answer.judged)]
        speedup_heatmap(rows, ax=ax, title=f"{title}, {column} {value:.3g}")
    with atomic_write(path) as file:
        figure.savefig(file, format=Path(path).suffix[1:].lower(), dpi=150, bbox_inches="tight")


def _epilog() -> str:
    """The end of ``moesd predict --help``: the models, heads, drafters, hardware and engine profiles it takes."""
    return (textwrap.fill("models (--target, --draft; or a config.json path): " + ", ".join(MODELS), 100,
                             break_on_hyphens=False) + "\n"
        + textwrap.fill("EAGLE-3 heads (--draft): " + ", ".join(DRAFT_HEADS), 100, break_on_hyphens=False) + "\n"
        + textwrap.fill("drafters built for the target (--draft): " + "; ".join(
            f"{name}: {what}" for name, what in DRAFTERS.items()), 100, break_on_hyphens=False) + "\n"
        + textwrap.fill("hardware (--hardware, any case): " + ", ".join(HARDWARE), 100, break_on_hyphens=False) + "\n"
        + textwrap.fill(HARDWARE_NOTE + "; `moesd hardware` lists them.", 100, break_on_hyphens=False) + "\n"
        + "engine profiles (--engine-profile), which to pick:\n" + "\n".join(
            textwrap.fill(f"{name}: {profile.pick}", 100, initial_indent="  ", subsequent_indent="    ")
            for name, profile in ENGINES.items())
        + "\n" + textwrap.fill("older names: " + ", ".join(f"{old} = {new}" for old, new in ALIASES.items()), 100,
                               initial_indent="  ", subsequent_indent="    "))


def add_parser(commands) -> None:
    """Declare ``moesd predict`` and its options on the sub-command parsers ``commands``."""
    predict = commands.add_parser(
        "predict", help="predict SD's speedup for a model on GPUs (moesd.predictor.predict)",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_epilog())
    _add_deployment(predict)
    predict.add_argument("--gamma", default="1-5", help="draft lengths, e.g. 1-5 or 2,4 (default 1-5)")
    predict.add_argument("--alpha", help="per-token acceptance probability(ies): sigma(alpha, gamma) of Eq. 5 for "
                         "each gamma (default 0.8)")
    predict.add_argument("--sigma", help="emitted fraction(s) sigma of Eq. 5 instead of --alpha, the same for every "
                         "gamma (then a longer draft looks better wherever verification is memory-bound)")
    predict.add_argument("--batch", default="1-256", help="batch sizes, e.g. 1-256 or 1,8,64 (default 1-256)")
    predict.add_argument("--context", type=int, default=1024, help="tokens in each KV cache (default 1024)")
    predict.add_argument("--routing-source", help="price the target's experts under a trained router's per-layer "
                         "popularity: a shipped source <model>/<domain>, e.g. olmoe/github (its expert count must be "
                         "the target's; default: uniform routing, Eq. 8)")
    predict.add_argument("--dtype", default="bf16", help="weight dtype: bf16, fp8, mxfp8, fp32, or w4a8, w4a16, "
                         "mxfp4, nvfp4 (4-bit routed experts, the rest bf16 or fp8; default bf16)")
    predict.add_argument("--kv-dtype", choices=list(KV_DTYPES), help="the KV cache's dtype: fp8 halves the bytes "
                         "attention reads (default: the activations', bf16)")
    predict.add_argument("--temperature", type=float, help="sampling temperature: 0 prices greedy verification, "
                         "above 0 the sampling kernels over the vocabulary in the plain step and the round (give the "
                         "acceptance measured at that temperature, usually lower than greedy's); default: rejection "
                         "sampling as the paper's engine ran it")
    predict.add_argument("--host-ms", type=float, default=0.0,
                         help="a fixed host cost added to every forward pass, ms: the target's plain step and its "
                         "verification pass, and each of the draft's gamma steps (not the rejection sampling); "
                         "scheduling, input preparation, sampling in a serving engine. Not with --engine-profile "
                         "(its fixed costs are the profile's and --step-ms's) or --step-ms (default 0: the GPUs' "
                         "work only)")
    predict.add_argument("--acceptance-length", help="mean acceptance length as engines report it, tokens per "
                         "round including the bonus token, at the gamma it was measured with: L@gamma, e.g. "
                         "2.4@3, a tree's too (instead of --alpha; the first draft position's alpha it gives is "
                         "printed)")
    predict.add_argument("--alpha-decay", type=float, default=1.0, help="acceptance of draft position i is "
                         "alpha x decay^(i - 1) (default 1: the same at every position)")
    predict.add_argument("--engine-profile", choices=[*ENGINES, *ALIASES], help="a serving engine's fixed costs by "
                         "engine and version (moesd.predictor.engine.ENGINES; which to pick for which engine setting: "
                         "below): the host time SD rounds expose, draft steps' fixed cost, a draft head's extend pass, "
                         "grouped-GEMM tiles; add --step-ms (a measured plain step), not --host-ms (default: the "
                         "GPUs' work only)")
    predict.add_argument("--step-ms", type=float, help="your engine's measured plain decoding step at batch "
                         "size --step-batch, ms (at batch size 1: 1000 / tokens per second of one request): what the "
                         "GPUs' roofline misses becomes a fixed cost per forward pass, spread over the layers")
    predict.add_argument("--step-batch", type=int, default=1, help="the batch size --step-ms was measured at "
                         "(default 1)")
    predict.add_argument("--sd-step-ms", help="with --step-ms: one measured SD round at --step-batch sequences and the "
                         "gamma it ran at, MS@GAMMA, e.g. 31.5@3 (ms per round: 1000 x tokens per round / tokens per "
                         "second of one request): what it exceeds the predicted round by becomes a fixed cost per "
                         "round at every batch size and gamma")
    predict.add_argument("--csv", help="write every predicted row to this CSV file: the setup (target, draft, hardware, "
                         "tp, ..., engine_profile, step_ms, host_ms), then moesd.predictor.predict.predict_sd's columns "
                         "(times t_* in seconds, t_target_gamma the verification pass; speedup and terms "
                         "dimensionless) and fits: whether the row's batch size fits target and draft in memory")
    predict.add_argument("--overwrite", action="store_true", help="replace existing --csv and --plot files")
    predict.add_argument("--plot", help="write a heatmap of speedup over (B, gamma) to this image file (a suffix matplotlib writes, "
                         ".png if none), one panel per --alpha or --sigma, over the batch sizes that fit (all of "
                         "them when none does)")
    predict.set_defaults(run=run, prints_only=True)


def _add_deployment(predict) -> None:
    """The options that describe the deployment: models, GPUs and how they are split."""
    predict.add_argument("--target", required=True, help="moesd.zoo name of the target, e.g. deepseek-v3, or the "
                         "path of its config.json (or of the folder holding it), read offline")
    predict.add_argument("--draft", required=True, help="the draft: a moesd.zoo name (a draft model, or a head such "
                         "as deepseek-v3-mtp), an EAGLE-3 head's name (below), a drafter built for the target (mtp, "
                         "eagle, eagle3, medusa or medusa:K, ngram; below), or a config.json path (a draft model's, "
                         "or an EAGLE/EAGLE-3/Medusa head's)")
    predict.add_argument("--hardware", required=True, help="moesd.theory.roofline.HARDWARE name, e.g. H200 (below)")
    predict.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs of the target: within one node, or "
                         "whole nodes joined by their network where the hardware has one on record (below; default 1)")
    predict.add_argument("--ep", type=int, default=1, help="expert-parallel degree, dividing --tp (default 1)")
    predict.add_argument("--dp-attention", action="store_true", help="SGLang's --enable-dp-attention with expert "
                         "parallelism: each of the --tp GPUs runs attention and the dense weights on its share of "
                         "the sequences, the routed experts are dealt over all of them (ep = --tp), and every MoE "
                         "layer dispatches and combines its tokens (all-to-alls) instead of all-reduces (--tp 2 or "
                         "more)")
    predict.add_argument("--draft-tp", type=int, help="tensor-parallel GPUs of the draft (default: --tp for a draft "
                         "head, one layer of the target's width such as an MTP or EAGLE head, which engines run on "
                         "the target's GPUs; 1 for a separate draft model)")
    predict.add_argument("--draft-dtype", help="the draft's weight dtype, as --dtype takes them (default: --dtype)")
    predict.add_argument("--draft-topk", type=int, default=1, help="candidates per draft position, a tree's "
                         "branching (SGLang's eagle_topk; default 1: a chain)")
    predict.add_argument("--verify-tokens", type=int, help="tokens verified per sequence for a tree of drafts, the "
                         "last verified token included (SGLang's num_draft_tokens; default: gamma + 1)")
