"""``moesd lab``: the laptop lab (:mod:`moesd.lab`) from the shell: SD acceptance and routing of a real MoE.

``moesd lab`` loads :data:`moesd.lab.LAB_TARGET` from the hub (13.8 GB in bf16), decodes prompts of a public set
with speculative decoding (its own first layers as the draft) and prints the measured acceptance, sigma and tokens
per round, and the experts windows of consecutive tokens activate; ``--random-weights`` runs the same path on a
random-weight model of the same architecture, offline. ``--trace`` saves the routing trace.
"""

import argparse

from moesd._checks import UsageError, new_file, torch_device, usage_errors


def run(args: argparse.Namespace) -> None:
    import pandas as pd

    from moesd import lab
    from moesd.routing.prompts import load_prompts

    for flag, value in (("--num-prompts", args.num_prompts), ("--gamma", args.gamma),
                        ("--draft-layers", args.draft_layers), ("--max-new-tokens", args.max_new_tokens)):
        if value < 1:
            raise UsageError(f"{flag} must be >= 1, got {value}")
    if not args.temperature >= 0:
        raise UsageError(f"--temperature must be >= 0, got {args.temperature}")
    if args.random_weights and (args.device is not None or args.model is not None):
        raise UsageError("--device and --model apply only without --random-weights (the random model is "
                         f"{lab.LAB_ARCHITECTURE}'s shape, on the CPU)")
    if args.random_weights and not args.draft_layers < args.layers:
        raise UsageError(f"--draft-layers must be below --layers ({args.layers}) with --random-weights, "
                         f"got {args.draft_layers}")
    if args.device is not None:
        torch_device("--device", args.device)
    out = new_file("--trace", args.trace, args.overwrite) if args.trace else None
    with usage_errors():
        prompts = load_prompts(args.prompts, args.prompt_source).head(args.num_prompts)
    options = dict(gamma=args.gamma, draft_layers=args.draft_layers, max_new_tokens=args.max_new_tokens,
                   temperature=args.temperature, seed=args.seed)
    if args.random_weights:
        result = lab.random_lab(prompts, num_layers=args.layers, width=args.width, **options)
    else:
        result = lab.pretrained_lab(prompts, args.model or lab.LAB_TARGET, device=args.device, **options)
    with pd.option_context("display.max_colwidth", 120):
        print(result.summary().to_string())
        print("\nexperts a window of consecutive tokens activates (mean over windows and layers):")
        print(lab.window_activation(result.trace).round(2).to_string())
        print(f"\nfirst completion: {result.completions[0][:300]!r}")
    if out is not None:
        print(f"routing trace -> {result.trace.save(out)}")


def add_parser(commands) -> None:
    """Declare ``moesd lab`` and its options on the sub-command parsers ``commands``."""
    lab = commands.add_parser("lab", help="SD acceptance and routing of a real MoE on real prompts (the laptop lab)")
    lab.add_argument("--model", help="hub id or local folder of the target (default: moesd.lab.LAB_TARGET, "
                     "allenai/OLMoE-1B-7B-0924-Instruct)")
    lab.add_argument("--prompts", default="mt_bench", choices=("humaneval", "mt_bench", "gsm8k"),
                     help="prompt set (default: %(default)s)")
    lab.add_argument("--prompt-source", help="local file or folder of the prompt set (default: the hub)")
    lab.add_argument("--num-prompts", type=int, default=8, help="prompts, decoded as one batch (default: %(default)s)")
    lab.add_argument("--gamma", type=int, default=4, help="draft tokens per round (default: %(default)s)")
    lab.add_argument("--draft-layers", type=int, default=8,
                     help="the target's first layers the draft runs, below its layers (default: %(default)s)")
    lab.add_argument("--max-new-tokens", type=int, default=64, help="tokens per prompt (default: %(default)s)")
    lab.add_argument("--temperature", type=float, default=0.0,
                     help="0: greedy; above 0: speculative sampling (default: %(default)s)")
    lab.add_argument("--seed", type=int, default=0, help="sampling seed, and the random weights' (default: %(default)s)")
    lab.add_argument("--device", help="cpu, cuda... (default: CUDA when there is one)")
    lab.add_argument("--random-weights", action="store_true",
                     help="a random-weight model of the target's architecture instead of the pretrained one (offline)")
    lab.add_argument("--layers", type=int, default=4, help="with --random-weights: layers kept (default: %(default)s)")
    lab.add_argument("--width", type=float, default=1 / 16,
                     help="with --random-weights: factor on every width (default: %(default)s)")
    lab.add_argument("--trace", help="save the target's routing trace here (.npz)")
    lab.add_argument("--overwrite", action="store_true", help="replace an existing --trace file")
    lab.set_defaults(run=run, prints_only=False)
