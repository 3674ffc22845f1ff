"""The ``moesd`` command: one sub-command per job.

``moesd theory --E 64 --K 8`` prints N(t), tokens per expert and T_thres (Eqs. 8-10);
``moesd hardware`` prints the hardware table with ridge points (Eq. 1).
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
    table = pd.DataFrame([{
        "name": hw.name,
        "bf16 TFLOP/s": hw.peak_flops / 1e12,
        "TB/s": hw.memory_bandwidth / 1e12,
        "GB": hw.memory_bytes / 1e9,
        "ridge point": hw.ridge_point,
    } for hw in HARDWARE.values()])
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))


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

    hardware = commands.add_parser("hardware", help="hardware records and ridge points")
    hardware.set_defaults(run=_hardware)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the ``moesd`` command; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.run(args)
    except ValueError as error:
        parser.error(str(error))
    return 0


if __name__ == "__main__":
    sys.exit(main())
