"""Bad input gets a clear error before any work: one table row per case, plus a property test.

Each row of :data:`CASES` is a :class:`Case`: the module it belongs to, the bad input in words (the
test id), a call, the exception expected and a fragment its message must contain (plain text, not
a regex). To add cases for another module, append rows built with :class:`Case` (or :func:`cli`
for a ``moesd`` command line, which must exit with status 2 and print the fragment) to ``CASES``;
``test_case_count_by_module`` prints the count per module with ``pytest -s``.

A call takes no argument, or one: a fresh temporary folder (``pathlib.Path``) for cases that need
files. The property tests at the end check that no public theory function (experts, speedup,
roofline) returns NaN or infinity for finite input inside its domain.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import inspect
import io
from pathlib import Path
from typing import Callable, NamedTuple
from unittest import mock

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from moesd import cli as moesd_cli
from moesd import experts, paper, roofline, speedup
from moesd._checks import UsageError
from moesd.prompts import load_prompts

EXCERPTS = Path(__file__).resolve().parent / "data" / "prompts"
HUMANEVAL = EXCERPTS / "humaneval" / "HumanEval.jsonl.gz"
MT_BENCH = EXCERPTS / "mt_bench" / "question.jsonl"
GSM8K = EXCERPTS / "gsm8k" / "test.jsonl"
QWEN_FFN = dict(d_model=3584, d_ff=2560, E=64, K=8)  # Qwen2-57B-A14B's experts


class Case(NamedTuple):
    module: str
    what: str
    call: Callable
    error: type
    fragment: str


class CommandRefused(Exception):
    """``moesd`` exited with status 2; the message is what it printed on stderr."""


def _run_command(argv: list[str]):
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        try:
            moesd_cli.main(argv)
        except SystemExit as exit_:
            if exit_.code != 2:
                raise AssertionError(f"exit status {exit_.code}, not 2: {stderr.getvalue()}") from None
            raise CommandRefused(stderr.getvalue()) from None
    raise AssertionError(f"moesd {' '.join(argv)} ran instead of refusing")


def cli(what: str, argv: list[str], fragment: str) -> Case:
    """A row for a ``moesd`` command line that must stop with a one-line usage error (status 2)."""
    return Case("cli", what, lambda: _run_command(argv), CommandRefused, fragment)


def _theory_failing_inside(error: Exception):
    """``moesd theory`` whose work raises ``error``, as torch or transformers might deep inside."""
    def failing(args):
        raise error

    with mock.patch.object(moesd_cli, "_theory", failing):
        moesd_cli.main(["theory", "--E", "64", "--K", "8"])


def _write(folder: Path, name: str, content: bytes) -> Path:
    path = folder / name
    path.write_bytes(content)
    return path


def _paper_table_from(folder: Path, name: str, content: bytes | None):
    """``paper_table(name)`` with ``MOESD_DATA`` at ``folder``, whose table holds ``content`` (no file: None)."""
    (folder / "paper").mkdir()
    if content is not None:
        _write(folder / "paper", f"{name}.csv", content)
    with mock.patch.object(paper, "DATA_DIR", folder):
        return paper.paper_table(name)


def _with_peak_flops(value):
    return dataclasses.replace(roofline.HARDWARE["H100"], peak_flops=value)


EXPERTS = [
    Case("experts", "negative tokens", lambda: experts.expected_active_experts(-1, 64, 8), ValueError,
         "t must be a number >= 0, got -1"),
    Case("experts", "no experts", lambda: experts.expected_active_experts(4, 0, 1), ValueError,
         "E must be a whole number >= 1, got 0"),
    Case("experts", "fractional E", lambda: experts.expected_active_experts(4, 64.5, 8), ValueError,
         "E must be a whole number >= 1, got 64.5"),
    Case("experts", "K above E", lambda: experts.expected_active_experts(4, 4, 8), ValueError,
         "K must be <= E (a token cannot pick more experts than exist), got K = 8 with E = 4"),
    Case("experts", "K zero", lambda: experts.expected_active_experts(4, 64, 0), ValueError,
         "K must be a whole number >= 1, got 0"),
    Case("experts", "NaN tokens", lambda: experts.expected_active_experts(np.nan, 64, 8), ValueError,
         "t must be a number >= 0, got NaN"),
    Case("experts", "infinite tokens", lambda: experts.expected_active_experts(np.inf, 64, 8), ValueError,
         "t must be a number >= 0, got inf"),
    Case("experts", "tokens as text", lambda: experts.expected_active_experts("4", 64, 8), ValueError,
         "t must be a number >= 0, got '4'"),
    Case("experts", "tokens None", lambda: experts.expected_active_experts(None, 64, 8), ValueError,
         "t must be a number >= 0, got None"),
    Case("experts", "tokens a boolean", lambda: experts.expected_active_experts(True, 64, 8), ValueError,
         "t must be a number >= 0, got True"),
    Case("experts", "complex tokens", lambda: experts.expected_active_experts(1 + 2j, 64, 8), ValueError,
         "t must be a number >= 0, got (1+2j)"),
    Case("experts", "a None inside a list", lambda: experts.expected_active_experts([1, None], 64, 8),
         ValueError, "t must be a number >= 0, got None (a NoneType)"),
    Case("experts", "ragged tokens", lambda: experts.expected_active_experts([[1, 2], [3]], 64, 8), ValueError,
         "t must be a number >= 0 or an array of them"),
    Case("experts", "shapes that do not broadcast",
         lambda: experts.expected_active_experts([1, 2, 3], 64, [1, 2]), ValueError,
         "t and E and K must broadcast together, got shapes t (3,), E (), K (2,)"),
    Case("experts", "E beyond float range", lambda: experts.expected_active_experts(4, 10**400, 8), ValueError,
         "E must be a whole number >= 1 within float range"),
    Case("experts", "sparsity with K above E", lambda: experts.sparsity(4, 8), ValueError, "K must be <= E"),
    Case("experts", "sparsity with negative K", lambda: experts.sparsity(64, -1), ValueError,
         "K must be a whole number >= 1, got -1"),
    Case("experts", "half a token per expert", lambda: experts.tokens_per_expert(0.5, 0.1), ValueError,
         "t must be a number >= 1, got 0.5"),
    Case("experts", "zero sparsity", lambda: experts.tokens_per_expert(4, 0), ValueError,
         "rho must be a number in (0, 1], got 0"),
    Case("experts", "sparsity above 1", lambda: experts.tokens_per_expert(4, 1.5), ValueError,
         "rho must be a number in (0, 1], got 1.5"),
    Case("experts", "tokens and rho that do not broadcast",
         lambda: experts.tokens_per_expert([1, 2], [0.1, 0.2, 0.3]), ValueError,
         "t and rho must broadcast together"),
    Case("experts", "threshold beyond 2**53 tokens (was int64 overflow)",
         lambda: experts.full_activation_threshold(1e-19), ValueError,
         "rho must be >= 3.33e-16 for tau = 0.95 (T_thres would exceed 2**53 tokens"),
    Case("experts", "threshold beyond 2**53 in an array",
         lambda: experts.full_activation_threshold(np.array([0.1, 1e-18])), ValueError, "got 1e-18"),
    Case("experts", "tau 1", lambda: experts.full_activation_threshold(0.1, tau=1), ValueError,
         "tau must be a number in (0, 1), got 1"),
    Case("experts", "tau 0", lambda: experts.full_activation_threshold(0.1, tau=0), ValueError,
         "tau must be a number in (0, 1), got 0"),
    Case("experts", "derivative at zero tokens", lambda: experts.tokens_per_expert_derivative(0, 0.1),
         ValueError, "t must be a number >= 1, got 0"),
    Case("experts", "Appendix B F at rho 0", lambda: experts.appendix_b_f(0, 4), ValueError,
         "rho must be a number in (0, 1], got 0"),
    Case("experts", "Appendix B F at half a token", lambda: experts.appendix_b_f(0.1, 0.5), ValueError,
         "t must be a number >= 1, got 0.5"),
    Case("experts", "popularity without an expert axis",
         lambda: experts.expected_active_experts_from_popularity(4, 0.5), ValueError,
         "p must have a last axis over the experts"),
    Case("experts", "popularity over no experts",
         lambda: experts.expected_active_experts_from_popularity(4, np.empty((2, 0))), ValueError,
         "p must have a last axis over the experts (at least one), got shape (2, 0)"),
    Case("experts", "popularity summing to 0.9",
         lambda: experts.expected_active_experts_from_popularity(4, [0.5, 0.4]), ValueError,
         "p must sum to a whole number K >= 1 over its last axis, got a sum of 0.9"),
    Case("experts", "a probability above 1",
         lambda: experts.expected_active_experts_from_popularity(4, [1.5, 0.5]), ValueError,
         "p must be a number in [0, 1], got 1.5"),
    Case("experts", "tokens that do not broadcast with popularity",
         lambda: experts.expected_active_experts_from_popularity([1, 2, 3], np.full((2, 4), 0.5)), ValueError,
         "t and p[..., 0] must broadcast together"),
]

SPEEDUP = [
    Case("speedup", "acceptance above 1", lambda: speedup.sigma(1.2, 2), ValueError,
         "alpha must be a number in [0, 1], got 1.2"),
    Case("speedup", "negative acceptance", lambda: speedup.expected_tokens_per_round(-0.1, 3), ValueError,
         "alpha must be a number in [0, 1], got -0.1"),
    Case("speedup", "draft length 0", lambda: speedup.sigma(0.5, 0), ValueError,
         "gamma must be a whole number >= 1, got 0"),
    Case("speedup", "fractional draft length", lambda: speedup.sigma(0.5, 2.5), ValueError,
         "gamma must be a whole number >= 1, got 2.5"),
    Case("speedup", "draft length a boolean", lambda: speedup.sigma(0.5, True), ValueError,
         "gamma must be a whole number >= 1, got True"),
    Case("speedup", "sigma below 1 / (gamma + 1)", lambda: speedup.alpha_from_sigma(0.2, 2), ValueError,
         "sigma must be in [1 / (gamma + 1), 1] (a round emits at least one token), got 0.2"),
    Case("speedup", "sigma above 1", lambda: speedup.alpha_from_sigma(1.01, 2), ValueError,
         "sigma must be a number in (0, 1], got 1.01"),
    Case("speedup", "sigma 0", lambda: speedup.alpha_from_sigma(0, 2), ValueError,
         "sigma must be a number in (0, 1], got 0"),
    Case("speedup", "sigma and gamma that do not broadcast",
         lambda: speedup.alpha_from_sigma([0.9, 0.8], [2, 3, 4]), ValueError,
         "sigma and gamma must broadcast together"),
    Case("speedup", "negative decode time", lambda: speedup.target_efficiency(-1.0, 2.0), ValueError,
         "t_target_1 must be a number > 0, got -1"),
    Case("speedup", "negative verification time", lambda: speedup.target_efficiency(1.0, -2.0), ValueError,
         "t_target_gamma must be a number > 0, got -2"),
    Case("speedup", "infinite verification time", lambda: speedup.target_efficiency(1.0, np.inf), ValueError,
         "t_target_gamma must be a number > 0, got inf"),
    Case("speedup", "negative rounds", lambda: speedup.sd_time(-1, 2, 1, 1, 1), ValueError,
         "rounds must be a number >= 0, got -1"),
    Case("speedup", "negative draft time in Eq. 2", lambda: speedup.sd_time(10, 2, -0.1, 1, 1), ValueError,
         "t_draft must be a number >= 0, got -0.1"),
    Case("speedup", "negative verification time in Eq. 2", lambda: speedup.sd_time(10, 2, 0.1, -1, 1),
         ValueError, "t_target_gamma must be a number >= 0, got -1"),
    Case("speedup", "negative decode time in Eq. 4", lambda: speedup.speedup(0.9, 4, -1.0, 1.3, 0.03),
         ValueError, "t_target_1 must be a number > 0, got -1"),
    Case("speedup", "negative verification time in Eq. 4", lambda: speedup.speedup(0.9, 4, 1.0, -1.3, 0.03),
         ValueError, "t_target_gamma must be a number > 0, got -1.3"),
    Case("speedup", "negative draft time in Eq. 4", lambda: speedup.speedup(0.9, 4, 1.0, 1.3, -0.03),
         ValueError, "t_draft must be a number >= 0, got -0.03"),
    Case("speedup", "negative rejection time", lambda: speedup.speedup(0.9, 4, 1, 1.3, 0.03, -0.1), ValueError,
         "t_reject must be a number >= 0, got -0.1"),
    Case("speedup", "sigma 5", lambda: speedup.speedup(5, 4, 1, 1.3, 0.03), ValueError,
         "sigma must be a number in (0, 1], got 5"),
    Case("speedup", "sigma -1", lambda: speedup.speedup(-1, 4, 1, 1.3, 0.03), ValueError,
         "sigma must be a number in (0, 1], got -1"),
    Case("speedup", "terms with draft length 0", lambda: speedup.speedup_terms(0.9, 0, 1, 1.3, 0.03),
         ValueError, "gamma must be a whole number >= 1, got 0"),
    Case("speedup", "negative cost ratio", lambda: speedup.leviathan_speedup(0.5, 2, -1), ValueError,
         "cost_ratio must be a number >= 0, got -1"),
    Case("speedup", "NaN cost ratio", lambda: speedup.leviathan_speedup(0.5, 2, np.nan), ValueError,
         "cost_ratio must be a number >= 0, got NaN"),
    Case("speedup", "speedup above Eq. 4's ceiling (was a bound of 22.2)",
         lambda: speedup.min_target_efficiency(100, 0.9, 4), ValueError,
         "observed_speedup must be <= sigma (gamma + 1), Eq. 4's ceiling, got 100 where sigma (gamma + 1) = 4.5"),
    Case("speedup", "one impossible speedup in an array",
         lambda: speedup.min_target_efficiency([1.5, 6.0], 0.9, 4), ValueError, "got 6 where"),
    Case("speedup", "zero speedup", lambda: speedup.min_target_efficiency(0, 0.9, 2), ValueError,
         "observed_speedup must be a number > 0, got 0"),
    Case("speedup", "bound with draft length 0", lambda: speedup.min_target_efficiency(1.5, 0.9, 0), ValueError,
         "gamma must be a whole number >= 1, got 0"),
]

ROOFLINE = [
    Case("roofline", "verification of 0 tokens (was inf)",
         lambda: roofline.ffn_target_efficiency(8, 0, "H100", **QWEN_FFN), ValueError,
         "gamma must be a whole number >= 1, got 0"),
    Case("roofline", "fractional gamma (was accepted)",
         lambda: roofline.ffn_target_efficiency(8, 2.5, "H100", **QWEN_FFN), ValueError,
         "gamma must be a whole number >= 1, got 2.5"),
    Case("roofline", "batch of 0 sequences (was NaN)",
         lambda: roofline.ffn_target_efficiency(0, 4, "H100", **QWEN_FFN), ValueError,
         "batch_size must be a whole number >= 1, got 0"),
    Case("roofline", "unknown device name", lambda: roofline.ffn_target_efficiency(8, 4, "TPU", **QWEN_FFN),
         ValueError, "hardware must be one of A800, A100"),
    Case("roofline", "K above E in the FFN",
         lambda: roofline.ffn_target_efficiency(8, 4, "H100", 4096, 14336, E=8, K=16), ValueError,
         "K must be <= E"),
    Case("roofline", "device given as a number", lambda: roofline.time_floor(1e9, 1e6, 42), ValueError,
         "hardware must be one of"),
    Case("roofline", "negative FLOPs", lambda: roofline.time_floor(-1, 1, "H100"), ValueError,
         "flops must be a number >= 0, got -1"),
    Case("roofline", "negative traffic", lambda: roofline.time_floor(1, -1, "H100"), ValueError,
         "traffic must be a number >= 0, got -1"),
    Case("roofline", "a device with negative peak FLOP/s",
         lambda: roofline.time_floor(1, 1, _with_peak_flops(-1.0)), ValueError,
         "hardware.peak_flops must be a number > 0, got -1"),
    Case("roofline", "a device with NaN peak FLOP/s",
         lambda: roofline.ridge_point(_with_peak_flops(np.nan)), ValueError,
         "hardware.peak_flops must be a number > 0, got NaN"),
    Case("roofline", "ridge point of an unknown name", lambda: roofline.ridge_point("TPU"), ValueError,
         "hardware must be one of"),
    Case("roofline", "ridge point of a number (was AttributeError)", lambda: roofline.ridge_point(3.0),
         ValueError, "hardware must be one of"),
    Case("roofline", "hidden size 0", lambda: roofline.ffn_cost(4, 0, 10), ValueError,
         "d_model must be a whole number >= 1, got 0"),
    Case("roofline", "fractional expert width", lambda: roofline.ffn_cost(4, 10, 10.5), ValueError,
         "d_ff must be a whole number >= 1, got 10.5"),
    Case("roofline", "negative tokens through the FFN", lambda: roofline.ffn_cost(-4, 10, 10), ValueError,
         "tokens must be a number >= 0, got -4"),
    Case("roofline", "no weight matrices", lambda: roofline.ffn_cost(4, 10, 10, num_matrices=0), ValueError,
         "num_matrices must be a whole number >= 1, got 0"),
    Case("roofline", "zero bytes per value", lambda: roofline.ffn_cost(4, 10, 10, bytes_per_value=0),
         ValueError, "bytes_per_value must be a number > 0, got 0"),
    Case("roofline", "K above E in ffn_cost", lambda: roofline.ffn_cost(4, 10, 10, E=4, K=8), ValueError,
         "K must be <= E"),
    Case("roofline", "FFN shapes that do not broadcast", lambda: roofline.ffn_cost([1, 2, 3], [10, 20], 10),
         ValueError, "must broadcast together, got shapes tokens (3,), d_model (2,)"),
    Case("roofline", "search up to 0 tokens",
         lambda: roofline.compute_bound_tokens("H100", 4096, 14336, max_tokens=0), ValueError,
         "max_tokens must be a whole number in [1, 1e+07], got 0"),
    Case("roofline", "search up to 10**9 tokens (8 GB of counts)",
         lambda: roofline.compute_bound_tokens("H100", 4096, 14336, max_tokens=10**9), ValueError,
         "max_tokens must be a whole number in [1, 1e+07], got 1000000000"),
    Case("roofline", "an array of hidden sizes in the search",
         lambda: roofline.compute_bound_tokens("H100", [4096, 8192], 14336), ValueError,
         "d_model must be a single number here, got shape (2,)"),
    Case("roofline", "search on an unknown device", lambda: roofline.compute_bound_tokens("nope", 4096, 14336),
         ValueError, "hardware must be one of"),
    Case("roofline", "G at negative tokens", lambda: roofline.G(-1, 10, 1.5), ValueError,
         "t must be a number >= 0, got -1"),
    Case("roofline", "G with its transition at 0", lambda: roofline.G(1, 0, 1.5), ValueError,
         "lam_rp must be a number > 0, got 0"),
    Case("roofline", "G shrinking", lambda: roofline.G(1, 10, 0.9), ValueError, "s must be a number >= 1, got 0.9"),
    Case("roofline", "G with NaN base", lambda: roofline.G(1, 10, np.nan), ValueError,
         "s must be a number >= 1, got NaN"),
    Case("roofline", "G beyond float64", lambda: roofline.G(1e300, 500, 2.0), ValueError,
         "t, lam_rp and s must keep G within float64"),
    Case("roofline", "intensity over zero traffic", lambda: roofline.arithmetic_intensity(1, 0), ValueError,
         "traffic must be a number > 0, got 0"),
]

PROMPTS = [
    Case("prompts", "unknown set", lambda: load_prompts("squad"), ValueError,
         "name must be one of 'humaneval', 'mt_bench', 'gsm8k', got 'squad'"),
    Case("prompts", "set name not a string", lambda: load_prompts(3), ValueError, "name must be one of"),
    Case("prompts", "set name a list", lambda: load_prompts(["gsm8k"]), ValueError, "name must be one of"),
    Case("prompts", "source a number", lambda: load_prompts("gsm8k", 42), ValueError,
         "source must be a path to a file or folder of prompts, got 42"),
    Case("prompts", "folder without the set", lambda tmp: load_prompts("gsm8k", tmp), FileNotFoundError,
         "no gsm8k prompts at"),
    Case("prompts", "HumanEval's file read as GSM8K (was KeyError)", lambda: load_prompts("gsm8k", HUMANEVAL),
         ValueError, "HumanEval.jsonl.gz: not gsm8k prompts: the records lack question"),
    Case("prompts", "the wrong set's file names the right one", lambda: load_prompts("gsm8k", HUMANEVAL),
         ValueError, "it looks like humaneval"),
    Case("prompts", "MT-bench's file read as HumanEval", lambda: load_prompts("humaneval", MT_BENCH), ValueError,
         "not humaneval prompts: the records lack task_id"),
    Case("prompts", "GSM8K's file read as MT-bench", lambda: load_prompts("mt_bench", GSM8K), ValueError,
         "the records lack question_id or prompt_id, turns or prompt"),
    Case("prompts", "truncated gzip (was EOFError)",
         lambda tmp: load_prompts("humaneval", _write(tmp, "HumanEval.jsonl.gz", HUMANEVAL.read_bytes()[:600])),
         ValueError, "HumanEval.jsonl.gz: cannot be read as gzipped JSON lines, the file is truncated or corrupt"),
    Case("prompts", "plain text named .gz",
         lambda tmp: load_prompts("gsm8k", _write(tmp, "test.jsonl.gz", GSM8K.read_bytes())), ValueError,
         "cannot be read as gzipped JSON lines"),
    Case("prompts", "bytes that are not UTF-8",
         lambda tmp: load_prompts("gsm8k", _write(tmp, "test.jsonl", b'{"question": "\xff\xfe"}\n')),
         ValueError, "cannot be read as UTF-8 JSON lines"),
    Case("prompts", "a line that is not JSON", lambda tmp: load_prompts("gsm8k", _write(tmp, "bad.jsonl", b"{oops\n")),
         ValueError, "bad.jsonl: line 1 is not JSON"),
    Case("prompts", "a JSON list instead of a record",
         lambda tmp: load_prompts("gsm8k", _write(tmp, "list.jsonl", b'{"question": "q"}\n[1, 2]\n')), ValueError,
         "list.jsonl: line 2 holds a list, not a JSON object"),
    Case("prompts", "an empty file", lambda tmp: load_prompts("gsm8k", _write(tmp, "empty.jsonl", b"\n")),
         ValueError, "empty.jsonl: holds no records"),
    Case("prompts", "an empty prompt",
         lambda tmp: load_prompts("gsm8k", _write(tmp, "blank.jsonl", b'{"question": "what?"}\n{"question": " "}\n')),
         ValueError, "record 1 has the prompt ' ', not a non-empty text"),
    Case("prompts", "a prompt that is a number",
         lambda tmp: load_prompts("gsm8k", _write(tmp, "number.jsonl", b'{"question": 7}\n')), ValueError,
         "record 0 has the prompt 7"),
    Case("prompts", "an MT-bench question without turns",
         lambda tmp: load_prompts("mt_bench", _write(tmp, "q.jsonl", b'{"question_id": 1, "turns": []}\n')),
         ValueError, "record 0 has turns [], not a list of at least one turn"),
    Case("prompts", "a folder where the file should be",
         lambda tmp: (tmp / "gsm8k" / "test.jsonl").mkdir(parents=True) or load_prompts("gsm8k", tmp), ValueError,
         "test.jsonl: not a file of gsm8k prompts"),
]

PAPER = [
    Case("paper", "unknown table", lambda: paper.paper_table("table_9"), ValueError,
         "name must be one of 'tables_1_2', 'table_3', 'models', got 'table_9'"),
    Case("paper", "table name a list", lambda: paper.paper_table(["models"]), ValueError, "name must be one of"),
    Case("paper", "a data folder without the table",
         lambda tmp: _paper_table_from(tmp, "models", None),
         FileNotFoundError, "models.csv not found"),
    Case("paper", "a table lacking its columns", lambda tmp: _paper_table_from(tmp, "table_3", b"m,stride\n10,25\n"),
         ValueError, "table_3.csv: not the paper's table_3: it lacks the column(s) mse, source"),
    Case("paper", "a binary file as a table", lambda tmp: _paper_table_from(tmp, "models", b"\xff\xfe\x00\x01" * 50),
         ValueError, "models.csv: not a readable CSV table"),
]

CLI = [
    cli("theory with no experts (was ZeroDivisionError)", ["theory", "--E", "0", "--K", "8"],
        "E must be a whole number >= 1, got 0"),
    cli("theory with negative experts", ["theory", "--E", "-3", "--K", "1"], "E must be a whole number >= 1, got -3"),
    cli("theory with K above E", ["theory", "--E", "4", "--K", "8"], "K must be <= E"),
    cli("theory with K 0", ["theory", "--E", "64", "--K", "0"], "K must be a whole number >= 1, got 0"),
    cli("theory with E 10**20 (printed -9223372036854775808)",
        ["theory", "--E", "100000000000000000000", "--K", "8"], "rho must be >= 3.33e-16"),
    cli("theory at 0 tokens", ["theory", "--E", "64", "--K", "8", "--tokens", "0"],
        "--tokens must be a whole number >= 1, got 0"),
    cli("theory with tau 1.5", ["theory", "--E", "64", "--K", "8", "--tau", "1.5"],
        "tau must be a number in (0, 1), got 1.5"),
    cli("theory with tau NaN", ["theory", "--E", "64", "--K", "8", "--tau", "nan"], "tau must be a number in (0, 1), got NaN"),
    Case("cli", "a ValueError inside a command stays a traceback",
         lambda: _theory_failing_inside(ValueError("deep inside torch")), ValueError, "deep inside torch"),
    Case("cli", "a KeyError inside a command stays a traceback",
         lambda: _theory_failing_inside(KeyError("model.layers.0.mlp.gate")), KeyError, "model.layers.0.mlp.gate"),
    Case("cli", "a UsageError inside a command is a usage error",
         lambda: _run_command_with_theory_raising(UsageError("--x must be 1, got 2")), CommandRefused,
         "moesd: error: --x must be 1, got 2"),
]


def _run_command_with_theory_raising(error: Exception):
    def failing(args):
        raise error

    with mock.patch.object(moesd_cli, "_theory", failing):
        _run_command(["theory", "--E", "64", "--K", "8"])


CASES = EXPERTS + SPEEDUP + ROOFLINE + PROMPTS + PAPER + CLI


@pytest.mark.parametrize("case", CASES, ids=[f"{c.module}: {c.what}" for c in CASES])
def test_bad_input_is_refused_clearly(case, tmp_path):
    arguments = [tmp_path] if inspect.signature(case.call).parameters else []
    with pytest.raises(case.error) as raised:
        case.call(*arguments)
    message = str(raised.value.args[0]) if raised.value.args else ""
    assert case.fragment in message, f"{case.fragment!r} not in {message!r}"


def test_case_count_by_module():
    counts = collections.Counter(case.module for case in CASES)
    print("\nbad-input cases by module:", dict(counts), "total", sum(counts.values()))
    assert len({(c.module, c.what) for c in CASES}) == len(CASES), "two cases share a description"


def test_validation_errors_are_usage_errors():
    """What the package's checks raise is a UsageError, so that moesd prints it as one line."""
    with pytest.raises(UsageError):
        experts.expected_active_experts(-1, 64, 8)
    with pytest.raises(UsageError):
        load_prompts("gsm8k", HUMANEVAL)


def test_usage_errors_turns_argument_checks_into_usage_errors():
    """The block a sub-command wraps around its argument checks: their errors become UsageErrors."""
    from moesd._checks import usage_errors

    for error in (ValueError("bad"), KeyError("bad"), FileNotFoundError("bad"), FileExistsError("bad")):
        with pytest.raises(UsageError, match="^bad$"), usage_errors():
            raise error
    with pytest.raises(RuntimeError), usage_errors():  # anything else stays what it is
        raise RuntimeError("internal")


def test_fixed_cases_give_the_right_answer():
    """Cases that used to fail or hang now work: a name for time_floor, a long draft for alpha_from_sigma."""
    h200 = roofline.HARDWARE["H200"]
    assert roofline.time_floor(1e12, 1e9, "H200") == roofline.time_floor(1e12, 1e9, h200) == 1e12 / h200.peak_flops
    assert roofline.compute_bound_tokens("H200", 3584, 2560) == roofline.compute_bound_tokens(h200, 3584, 2560)
    alpha = speedup.alpha_from_sigma(0.5, 100_000)  # hung in a Python loop over gamma
    assert speedup.sigma(alpha, 100_000) == pytest.approx(0.5, rel=1e-9)
    assert roofline.G(1, 2000, 2.0) == 2.0  # s**lam_rp overflows but G(1) = s does not


# Property: finite in-domain input gives finite output ---------------------------------------

tokens = st.floats(0, 1e12)
tokens_from_one = st.floats(1, 1e12)
sparsities = st.floats(0, 1, exclude_min=True)
experts_and_k = st.integers(1, 10**6).flatmap(lambda e: st.tuples(st.just(e), st.integers(1, e)))
alphas = st.floats(0, 1)
gammas = st.sampled_from([1, 2, 3, 4, 5, 8, 16, 64, 65, 1000, 10**6])  # both sides of alpha_from_sigma's switch
seconds = st.floats(1e-9, 1e6)
seconds_or_zero = st.one_of(st.just(0.0), seconds)
devices = st.sampled_from(sorted(roofline.HARDWARE))


def _finite(*values):
    for value in values:
        assert np.isfinite(np.asarray(value, dtype=float)).all(), values


@given(tokens, experts_and_k, tokens_from_one, sparsities, st.floats(0, 1, exclude_min=True, exclude_max=True))
def test_experts_functions_are_finite(t, e_and_k, t1, rho, tau):
    E, K = e_and_k
    _finite(experts.sparsity(E, K), experts.expected_active_experts(t, E, K), experts.tokens_per_expert(t1, rho),
            experts.tokens_per_expert_derivative(t1, rho), experts.appendix_b_f(rho, t1))
    _finite(experts.full_activation_threshold(max(rho, 1e-12), tau))


@given(tokens, st.lists(st.floats(0, 1), min_size=1, max_size=16))
def test_popularity_is_finite(t, weights):
    p = np.asarray(weights)
    if p.sum() < 1e-3:
        p = np.full_like(p, 1.0 / p.size)
    p = p / p.sum()  # K = 1
    _finite(experts.expected_active_experts_from_popularity(t, p))


@given(alphas, gammas, seconds, seconds, seconds_or_zero, seconds_or_zero, st.floats(0, 1e9), st.floats(0, 1e3),
       st.floats(1e-6, 1))
def test_speedup_functions_are_finite(alpha, gamma, t1, tg, td, tr, rounds, cost, fraction):
    s = speedup.sigma(alpha, gamma)
    terms = speedup.speedup_terms(s, gamma, t1, tg, td, tr)
    _finite(speedup.expected_tokens_per_round(alpha, gamma), s, speedup.alpha_from_sigma(s, gamma),
            speedup.target_efficiency(t1, tg), speedup.sd_time(rounds, gamma, td, tg, tr),
            terms.tokens_per_round, terms.verify, terms.draft, terms.reject, terms.target_efficiency, terms.speedup,
            speedup.speedup(s, gamma, t1, tg, td, tr), speedup.leviathan_speedup(alpha, gamma, cost),
            speedup.min_target_efficiency(fraction * s * (gamma + 1), s, gamma))


@given(devices, st.floats(0, 1e9), st.integers(1, 65536), st.integers(1, 65536), experts_and_k,
       st.integers(1, 4), st.floats(0.5, 8), st.floats(0, 1e20), st.floats(1, 1e20))
def test_roofline_functions_are_finite(device, t, d_model, d_ff, e_and_k, matrices, width, flops, traffic):
    E, K = e_and_k
    cost = roofline.ffn_cost(t, d_model, d_ff, E, K, matrices, width)
    _finite(roofline.ridge_point(device), *cost, roofline.arithmetic_intensity(flops, traffic),
            roofline.time_floor(flops, traffic, device))


@given(devices, st.integers(1, 10**5), st.integers(1, 64), st.integers(1, 16384), st.integers(1, 16384),
       experts_and_k, st.integers(1, 1000))
def test_roofline_efficiency_is_finite(device, batch, gamma, d_model, d_ff, e_and_k, max_tokens):
    E, K = e_and_k
    efficiency = roofline.ffn_target_efficiency(batch, gamma, device, d_model, d_ff, E, K)
    _finite(efficiency)
    assert 1 / gamma * (1 - 1e-9) <= efficiency <= 1 + 1e-9
    found = roofline.compute_bound_tokens(device, d_model, d_ff, E, K, max_tokens=max_tokens)
    assert found is None or 1 <= found <= max_tokens


@given(st.floats(0, 1e9), st.floats(0, 512, exclude_min=True), st.floats(1, 2))
def test_g_is_finite(t, lam_rp, s):
    _finite(roofline.G(t, lam_rp, s))
