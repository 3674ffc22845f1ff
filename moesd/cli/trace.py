"""``moesd trace``: capture the expert routing of an MoE model into a trace file (Hugging Face or vLLM)."""

import argparse
import math


from moesd._checks import UsageError, new_file, seed, torch_device, usage_errors
from moesd.cli.arguments import local_model, positions_left, random_model_spec


def run(args: argparse.Namespace) -> None:
    from moesd.routing.prompts import load_prompts

    for flag, value in (("--num-prompts", args.num_prompts), ("--batch-size", args.batch_size),
                        ("--max-new-tokens", args.max_new_tokens)):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be >= 1, got {value}")
    _check_trace_engine(args)
    seed("--seed", args.seed)
    if args.random_weights:
        if args.engine == "hf" and (args.dtype != "auto" or args.device is not None):
            raise UsageError("--dtype and --device apply only without --random-weights (random models run on the CPU)")
        spec = random_model_spec(args)
        model_type, config = spec.model_type, spec.config_dict()
        if args.engine == "vllm":
            from moesd.routing.vllm_capture import check_random_shape

            with usage_errors():
                check_random_shape(args.model, args.width)
    else:
        if args.layers is not None or args.width != 1.0:
            raise UsageError("--layers and --width apply only with --random-weights")
        if args.device is not None:
            torch_device("--device", args.device)
        config = local_model(args.model) or {}
        model_type = config.get("model_type")
    out = new_file("--out", args.out, args.overwrite)
    with usage_errors():
        prompts = load_prompts(args.prompts, args.prompt_source)
    if args.num_prompts is not None:
        prompts = prompts.head(args.num_prompts)
    if model_type is not None:  # random weights read bytes as tokens; a checkpoint's new tokens alone are checked
        longest = max(len(text.encode("utf-8")) for text in prompts["prompt"]) if args.random_weights else 0
        positions_left("--max-new-tokens", model_type, config, longest, args.max_new_tokens)
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


def add_parser(commands) -> None:
    """Declare ``moesd trace`` and its options on the sub-command parsers ``commands``."""
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
    trace.set_defaults(run=run, prints_only=False)
