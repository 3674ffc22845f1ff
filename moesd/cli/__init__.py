"""The ``moesd`` command: one sub-command per job.

``moesd theory --E 64 --K 8`` prints N(t), tokens per expert and T_thres (Eqs. 8-10);
``moesd hardware`` prints the hardware table with ridge points (Eq. 1); ``--measure`` adds this machine's;
``moesd trace --model M --prompts humaneval ...`` captures expert routing into a trace file;
``moesd sweep e2e --preset cpu`` times AR against SD over batch sizes (``moesd.measure.bench``);
``moesd fit data/measurements/cpu/sparsity.csv --stride 11`` fits Algorithm 1 (``moesd.model.fit``);
``moesd predict --target deepseek-v3 --draft deepseek-v3-mtp --hardware H200 --tp 8 --dtype fp8`` predicts SD's speedup
(``moesd.predictor.predict``);
``moesd lab --prompts mt_bench`` measures SD's acceptance and the routing of a real MoE on a laptop (``moesd.lab``).
"""

from __future__ import annotations

import argparse
import os
import sys

from moesd._checks import UsageError
from moesd.cli import fit, hardware, lab, predict, sweep, theory, trace
from moesd.cli.arguments import check_paths

COMMANDS = (theory, hardware, trace, sweep, fit, predict, lab)
"""The sub-command modules, in the order ``moesd --help`` lists them: each declares its parser
(``add_parser``) and runs it (``run``)."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``moesd`` command."""
    parser = argparse.ArgumentParser(prog="moesd", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(commands)
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
        check_paths(args)
        args.run(args)
    except UsageError as error:
        parser.error(str(error))
    except BrokenPipeError:
        if not args.prints_only:
            raise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes
        return 1
    return 0
