"""``moesd theory``: expected activated experts, tokens per expert and T_thres (Eqs. 8-10)."""

import argparse

import pandas as pd

from moesd._checks import as_array
from moesd.theory.experts import expected_active_experts, full_activation_threshold, sparsity, tokens_per_expert


DEFAULT_TOKENS = [1, 2, 4, 8, 16, 32, 64, 100, 200, 400]


def run(args: argparse.Namespace) -> None:
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


def add_parser(commands) -> None:
    """Declare ``moesd theory`` and its options on the sub-command parsers ``commands``."""
    theory = commands.add_parser("theory", help="expected activated experts and tokens per expert")
    theory.add_argument("--E", type=int, required=True, help="routed experts per MoE layer")
    theory.add_argument("--K", type=int, required=True, help="experts per token")
    theory.add_argument("--tokens", type=int, nargs="+", default=DEFAULT_TOKENS,
                        help="token counts to tabulate (default: %(default)s)")
    theory.add_argument("--tau", type=float, default=0.95,
                        help="'almost all' fraction for T_thres (default: %(default)s)")
    theory.set_defaults(run=run, prints_only=True)
