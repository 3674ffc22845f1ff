"""Bad input gets a clear error before any work: one table row per case, plus a property test.

Each row of :data:`CASES` is a :class:`Case`: the module it belongs to, the bad input in words (the
test id), a call, the exception expected and a fragment its message must contain (plain text, not
a regex). To add cases for another module, append rows built with :class:`Case` (or :func:`cli`
for a ``moesd`` command line, which must exit with status 2 and print the fragment) to ``CASES``;
``test_case_count_by_module`` prints the count per module with ``pytest -s``.

A call takes no argument, or one: a fresh temporary folder (``pathlib.Path``) for cases that need
files. The property tests at the end check that no public theory function (experts, speedup,
roofline) returns NaN or infinity for finite input inside its domain, and that each is finite or
refused over its whole domain, that a resume keeps only its sweep's rows (and every shipped result file passes
under its own settings), that sweeps are refused exactly when their rows or positions pass the bounds, and that
output paths, nested JSON, seeds and a fitting frame's points are taken or refused in one line.

The third round's rows are grouped by kind, one rule each in its one home: ``resume`` (the rows a
resume keeps, moesd.measure.result_file), ``bounds`` (sizes before work), ``fit-domain`` (moesd.model.measurements),
``paths`` (moesd._checks.output_path), ``mid-sweep`` (a failed write), ``models`` (checks before a model is built
or loaded), ``options`` (options with no effect) and ``raw`` (raw exceptions); a command line's rows are counted
as ``"<kind> cli"``.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import inspect
import io
import json
import shlex
import sys
import warnings
from pathlib import Path
from typing import Callable, NamedTuple
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moesd import cli as moesd_cli
from moesd.measure import analysis
from moesd.measure import studies as measurements
from moesd.measure import presets, sweep_checks, sweep_memory, sweeps
from moesd.model import diagnostics, fit
from moesd.predictor import forward, memory, predict
from moesd.predictor import recommend as _recommend  # noqa: F401 (bound to the real predict_sd before any patch)
from moesd.predictor.kernels import Efficiency
from moesd.predictor.setup import Setup
from moesd.model.measurements import check_measurements, from_sweep
from moesd.paper import predictor_check as predict_paper
from moesd import paper_tables as paper
from moesd.routing import importers, traces, unions, vllm_logs
from moesd.theory import experts, growth, roofline, speedup
from moesd._checks import UsageError
from moesd._files import npz_arrays
from moesd.routing.prompts import load_prompts

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
    integration: bool = False  # imports torch (marked integration, still run by `make test`)


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


@contextlib.contextmanager
def _unimportable(names):
    """``import name`` fails for each of ``names`` inside the block (a ``None`` entry in ``sys.modules``).

    Only those entries are restored afterwards. ``mock.patch.dict(sys.modules, ...)`` would restore the
    whole dict, dropping modules first imported inside the block: torch then loads a second time in the
    next test and fails ("SystemError: ... bad call flags") when the block was the first to import it.
    """
    saved = {name: sys.modules[name] for name in names if name in sys.modules}
    sys.modules.update({name: None for name in names})
    try:
        yield
    finally:
        for name in names:
            if name in saved:
                sys.modules[name] = saved[name]
            else:
                sys.modules.pop(name, None)


def cli(what: str, argv, fragment: str, integration: bool = False, before: tuple = (), stops: tuple = ()) -> Case:
    """A row for a ``moesd`` command line that must stop with a one-line usage error (status 2).

    ``argv`` is a list, or a function of the temporary folder returning one. ``before`` names moesd
    modules the command must refuse without importing (they hold the work: models, torch);
    ``stops``, as (module, function) pairs, functions doing the work that it must not reach.
    """
    def call(tmp):
        with contextlib.ExitStack() as stack:
            stack.enter_context(_unimportable(before))
            for module, function in stops:
                stack.enter_context(mock.patch(f"{module}.{function}", side_effect=AssertionError(f"{function} ran")))
            _run_command(argv(tmp) if callable(argv) else argv)

    return Case("cli", what, call, CommandRefused, fragment, integration)


def _theory_failing_inside(error: Exception):
    """``moesd theory`` whose work raises ``error``, as torch or transformers might deep inside."""
    def failing(args):
        raise error

    with mock.patch.object(moesd_cli.theory, "run", failing):
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
         "E must be a whole number >= 1 below 2^53"),
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
    Case("growth", "G at negative tokens", lambda: growth.G(-1, 10, 1.5), ValueError,
         "t must be a number >= 0, got -1"),
    Case("growth", "G with its transition at 0", lambda: growth.G(1, 0, 1.5), ValueError,
         "lam_rp must be a number > 0, got 0"),
    Case("growth", "G shrinking", lambda: growth.G(1, 10, 0.9), ValueError, "s must be a number >= 1, got 0.9"),
    Case("growth", "G with NaN base", lambda: growth.G(1, 10, np.nan), ValueError,
         "s must be a number >= 1, got NaN"),
    Case("growth", "G beyond float64", lambda: growth.G(1e300, 500, 2.0), ValueError,
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
         ValueError, "bad.jsonl: line 1: not JSON"),
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
        ["theory", "--E", "100000000000000000000", "--K", "8"], "E must be a whole number >= 1 below 2^53"),
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

    with mock.patch.object(moesd_cli.theory, "run", failing):
        _run_command(["theory", "--E", "64", "--K", "8"])


# Traces and importers ----------------------------------------------------------------------------

def _trace(**changes) -> traces.RoutingTrace:
    """Two tokens, one layer, K = 2 of E = 4, with ``changes`` to the constructor's arguments."""
    return traces.RoutingTrace(**{"experts": np.array([[[0, 1]], [[1, 2]]]), "num_experts": 4, **changes})


def _lines(folder: Path, name: str, *records) -> Path:
    """A JSONL file of ``records`` (dicts are written as JSON, strings as they are)."""
    path = folder / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def _token(sequence=0, position=0, layer=0, experts=(0, 1), **fields) -> dict:
    return {"problem_id": sequence, "token_idx": position, "layer": layer, "experts": list(experts), **fields}


def _vllm_layer(folder: Path, layer: int, rows, name: str | None = None) -> Path:
    """A per-layer vLLM log: a meta line, then one route line per (call row, request) in ``rows``."""
    meta = {"type": "meta", "model_id": "m", "layers_logged": [0, 1], "top_k": 2}
    routes = [{"type": "route", "req_id": request, "token_idx": row, "layer": layer, "topk_ids": [0, 1]}
              for row, request in rows]
    return _lines(folder, name or f"layer{layer}.jsonl", meta, *routes)


def _vllm_pair(folder: Path, first, second, **options):
    """Read two layer files whose route lines are ``first`` and ``second``."""
    return vllm_logs.from_vllm_moe_log([_vllm_layer(folder, 0, first), _vllm_layer(folder, 1, second)], 4,
                                       **options)


def _saved_over(target):
    """Save a trace over ``target`` (a device, a folder); the error must come before anything is replaced."""
    _trace().save(target)


TRACES = [
    Case("traces", "fractional E (was truncated to 4)", lambda: _trace(num_experts=4.7), ValueError,
         "num_experts must be a whole number, got 4.7"),
    Case("traces", "E given as text", lambda: _trace(num_experts="4"), ValueError,
         "num_experts must be a whole number, got '4'"),
    Case("traces", "no experts", lambda: _trace(num_experts=0), ValueError, "num_experts must be >= 1, got 0"),
    Case("traces", "K above E", lambda: _trace(num_experts=1), ValueError,
         "K = 2 experts per token exceeds num_experts = 1"),
    Case("traces", "expert ids as floats", lambda: _trace(experts=np.array([[[0.0, 1.0]]])), ValueError,
         "experts must be an integer array of shape (tokens, layers, K), got float64"),
    Case("traces", "expert ids of two axes", lambda: _trace(experts=np.array([[0, 1]])), ValueError,
         "experts must be an integer array of shape (tokens, layers, K)"),
    Case("traces", "an expert id beyond E", lambda: _trace(experts=np.array([[[0, 4]]])), ValueError,
         "expert ids must lie in [0, 4), found 4..4"),
    Case("traces", "a negative expert id", lambda: _trace(experts=np.array([[[0, -3]]])), ValueError,
         "expert ids must lie in [0, 4)"),
    Case("traces", "an expert twice in one token", lambda: _trace(experts=np.array([[[2, 2]]])), ValueError,
         "token 0 lists an expert twice in layer 0: [2, 2]"),
    Case("traces", "one of K ids marked missing", lambda: _trace(experts=np.array([[[1, -1]]])), ValueError,
         "token 0 marks only some of its experts missing in layer 0"),
    Case("traces", "fractional positions (was truncated)", lambda: _trace(position=np.array([0.0, 1.5])), ValueError,
         "position must be an integer array of shape (2,), got float64"),
    Case("traces", "one sequence id for two tokens", lambda: _trace(sequence=np.array([0])), ValueError,
         "sequence must be an integer array of shape (2,)"),
    Case("traces", "an unknown phase", lambda: _trace(phase=["decode", "verify"]), ValueError,
         "phase must hold one of"),
    Case("traces", "weights of another shape", lambda: _trace(weights=np.ones((2, 1, 3))), ValueError,
         "weights must have the shape of experts (2, 1, 2), got (2, 1, 3)"),
    Case("traces", "a layer index twice",
         lambda: _trace(experts=np.zeros((1, 2, 1), int), num_experts=1, layers=[3, 3]), ValueError,
         "layers must be distinct, got [3, 3]"),
    Case("traces", "a text file loaded as a trace (talked about pickles)",
         lambda tmp: traces.RoutingTrace.load(_write(tmp, "log.npz", b'{"layer": 0}\n')), ValueError,
         "log.npz: not a RoutingTrace .npz archive (it does not start like a zip file)"),
    Case("traces", "a zip archive without the arrays",
         lambda tmp: (np.savez(tmp / "other.npz", x=np.zeros(2)), traces.RoutingTrace.load(tmp / "other.npz")),
         ValueError, "other.npz: not a valid routing trace: missing arrays ['experts', 'num_experts']"),
    Case("traces", "saving over a device (replaced /dev/null by a zip file as root)",
         lambda: _saved_over("/dev/null"), ValueError, "/dev/null is a character device, not a regular file"),
    Case("traces", "saving over a folder", lambda tmp: _saved_over(tmp), ValueError, "is a folder, not a regular file"),
    Case("traces", "joining no traces", lambda: traces.concatenate([]), ValueError,
         "traces must hold at least one trace"),
    Case("traces", "joining traces of different E",
         lambda: traces.concatenate([_trace(), _trace(num_experts=8)]), ValueError,
         "traces must share num_experts, K and layers"),
    Case("traces", "random union of 0 tokens", lambda: unions.random_union(_trace(), 0), ValueError,
         "t must be a whole number in [1, 2], got 0"),
    Case("traces", "random union of more tokens than logged", lambda: unions.random_union(_trace(), 3), ValueError,
         "t must be a whole number in [1, 2], got 3"),
    Case("traces", "window of 0 tokens", lambda: unions.window_union(_trace(), 0), ValueError,
         "window must be a whole number >= 1, got 0"),
    Case("traces", "verification batch larger than the sequences",
         lambda: unions.verify_union(_trace(), batch_size=2, window=1), ValueError,
         "batch_size must be a whole number in [1, 1]"),
]

IMPORTERS = [
    Case("importers", "fractional token_idx (was truncated)",
         lambda tmp: importers.from_token_jsonl(_lines(tmp, "t.jsonl", _token(position=1.5)), 4), ValueError,
         "t.jsonl:1: position must be a whole number, got 1.5"),
    Case("importers", "problem_id 1 and \"1\" (were merged)",
         lambda tmp: importers.from_token_jsonl(_lines(tmp, "t.jsonl", _token(1), _token("1", 1)), 4), ValueError,
         "t.jsonl:2: sequence id '1' is a string but"),
    Case("importers", "a sequence id that is a list",
         lambda tmp: importers.from_token_jsonl(_lines(tmp, "t.jsonl", _token([1])), 4), ValueError,
         "t.jsonl:1: a sequence id must be a string or a whole number, got [1]"),
    Case("importers", "a record without experts",
         lambda tmp: importers.from_token_jsonl(_lines(tmp, "t.jsonl", {"problem_id": 0, "token_idx": 0, "layer": 0}),
                                                4), ValueError,
         "t.jsonl:1: no experts field (looked for experts, topk_ids, expert_ids, topk_indices)"),
    Case("importers", "experts that are not a list",
         lambda tmp: importers.from_token_jsonl(_lines(tmp, "t.jsonl", {**_token(), "experts": 3}), 4), ValueError,
         "t.jsonl:1: experts must be a non-empty list of expert ids, got 3"),
    Case("importers", "weights not one per expert",
         lambda tmp: importers.from_token_jsonl(_lines(tmp, "t.jsonl", _token(gating_probs=[1.0])), 4), ValueError,
         "t.jsonl:1: weights must list one number per expert id, got [1.0]"),
    Case("importers", "a line that is not JSON",
         lambda tmp: importers.from_token_jsonl(_lines(tmp, "t.jsonl", _token(), "{oops"), 4), ValueError,
         "t.jsonl:2: not JSON"),
    Case("importers", "a JSON list for a record",
         lambda tmp: importers.from_token_jsonl(_lines(tmp, "t.jsonl", "[1, 2]"), 4), ValueError,
         "t.jsonl:1: expected a JSON object"),
    Case("importers", "a file with no records", lambda tmp: importers.from_token_jsonl(_lines(tmp, "t.jsonl"), 4),
         ValueError, "t.jsonl: no records"),
    Case("importers", "the same token and layer twice",
         lambda tmp: importers.from_token_jsonl(_lines(tmp, "t.jsonl", _token(), _token()), 4), ValueError,
         "t.jsonl:2: a second record for the same sequence, position and layer"),
    Case("importers", "records of different K",
         lambda tmp: importers.from_token_jsonl(_lines(tmp, "t.jsonl", _token(), _token(0, 1, experts=(0, 1, 2))), 4),
         ValueError, "t.jsonl:2: experts lists 3 ids, the first record 2"),
    Case("importers", "a token missing from a layer, refused",
         lambda tmp: importers.from_token_jsonl(_lines(tmp, "t.jsonl", _token(), _token(layer=1), _token(0, 1)), 4,
                                                ragged="error"), ValueError,
         "t.jsonl: 1 tokens are logged in only some of the 2 layers"),
    Case("importers", "a missing file", lambda tmp: vllm_logs.from_vllm_routed_experts(tmp / "nope.npz"),
         FileNotFoundError, "nope.npz: no such file"),
    Case("importers", "a folder for a log file", lambda tmp: vllm_logs.from_vllm_moe_log(tmp), IsADirectoryError,
         ": a folder, not a routing file"),
    Case("importers", "a binary file as a layer CSV",
         lambda tmp: importers.from_layer_csv(_write(tmp, "routes.csv", bytes(range(128, 256)))), ValueError,
         "routes.csv: not UTF-8 text (a binary file?)"),
    Case("importers", "an expert listed twice in a layer CSV (named the file)",
         lambda tmp: importers.from_layer_csv(_write(tmp, "twice.csv", b"layer_id,expert_ids\n0,1 1\n"), 4), ValueError,
         "twice.csv:2: expert_ids [1, 1] lists an expert twice"),
    Case("importers", "an unknown ragged rule", lambda tmp: importers.from_token_jsonl(tmp / "t.jsonl", ragged="pad"),
         ValueError, "ragged must be one of ('drop', 'keep', 'error'), got 'pad'"),
    Case("importers", "an unknown field key",
         lambda tmp: importers.from_token_jsonl(_lines(tmp, "t.jsonl", _token()), fields={"expert": "e"}), ValueError,
         "fields has an unknown key 'expert'"),
    Case("importers", "an unknown phase", lambda tmp: importers.from_token_jsonl(tmp / "t.jsonl", phase="verify"),
         ValueError, "phase must be one of"),
    Case("importers", "vLLM layer files of different calls (named no file or row)",
         lambda tmp: _vllm_pair(tmp, [(0, "a"), (1, "a")], [(0, "a"), (1, "b")]), ValueError,
         "layer1.jsonl:3: call 0 row 1 request 'b' where"),
    Case("importers", "vLLM layer file cut short, refused",
         lambda tmp: _vllm_pair(tmp, [(0, "a"), (1, "a")], [(0, "a")], ragged="error"), ValueError,
         "layer files end early: layer1.jsonl (1 row short)"),
    Case("importers", "vLLM file without its meta line",
         lambda tmp: vllm_logs.from_vllm_moe_log(_lines(tmp, "l.jsonl", {"type": "route", "req_id": "a",
                                                                          "token_idx": 0, "layer": 0,
                                                                          "topk_ids": [0, 1]}), 4), ValueError,
         "l.jsonl: no meta line"),
    Case("importers", "vLLM file of another record type",
         lambda tmp: vllm_logs.from_vllm_moe_log(_lines(tmp, "l.jsonl", {"type": "stats"}), 4), ValueError,
         "l.jsonl:1: expected type 'meta' or 'route', got 'stats'"),
    Case("importers", "vLLM layer logged twice",
         lambda tmp: vllm_logs.from_vllm_moe_log([_vllm_layer(tmp, 0, [(0, "a")]),
                                                  _vllm_layer(tmp, 0, [(0, "a")], "again.jsonl")], 4), ValueError,
         "again.jsonl: layer 0 is logged twice"),
    Case("importers", "vLLM: no files", lambda: vllm_logs.from_vllm_moe_log([]), ValueError,
         "paths must name at least one log file"),
    Case("importers", "vLLM: negative skip_calls", lambda tmp: vllm_logs.from_vllm_moe_log(tmp, skip_calls=-1),
         ValueError, "skip_calls must be a whole number >= 0, got -1"),
    Case("importers", "vLLM: skipping every call",
         lambda tmp: _vllm_pair(tmp, [(0, "a")], [(0, "a")], skip_calls=5), ValueError, "skip_calls = 5 drops every call"),
    Case("importers", "vLLM: unknown request_ids rule",
         lambda tmp: vllm_logs.from_vllm_moe_log(tmp, request_ids="maybe"), ValueError,
         "request_ids must be 'auto', 'use' or 'ignore', got 'maybe'"),
    Case("importers", "layer CSV line of one field",
         lambda tmp: importers.from_layer_csv(_write(tmp, "r.csv", b"0,1 2\n7\n"), 4), ValueError,
         "r.csv:2: expected two fields, layer_id,expert_ids"),
    Case("importers", "layer CSV with a word for an id",
         lambda tmp: importers.from_layer_csv(_write(tmp, "r.csv", b"0,1 two\n"), 4), ValueError,
         "r.csv:1: expert_ids must be whole numbers, got '1 two'"),
    Case("importers", "layer CSV of different K",
         lambda tmp: importers.from_layer_csv(_write(tmp, "r.csv", b"0,1 2\n0,1 2 3\n"), 4), ValueError,
         "r.csv: lines list different numbers of experts: [2, 3]"),
    Case("importers", "arrays: none", lambda: importers.from_arrays([]), ValueError,
         "arrays must hold at least one request"),
    Case("importers", "arrays: a float array", lambda: importers.from_arrays([np.zeros((2, 1, 2))]), ValueError,
         "arrays[0] must be an integer array [tokens, layers, K]"),
    Case("importers", "vLLM routed experts: not JSON",
         lambda tmp: vllm_logs.from_vllm_routed_experts(_write(tmp, "r.json", b"{oops")), ValueError,
         "r.json: not JSON"),
]


# Fitting and measurements ----------------------------------------------------------------------

def _frame(**changes):
    """48 measurements of Mixtral's shape (E = 8) as Algorithm 1 reads them, with column ``changes``."""
    import pandas as pd

    rows = pd.DataFrame([dict(B=b, gamma=g, K=k, E=8, sigma=0.9, speedup=1.5) for k in (1, 2) for g in (2, 4)
                         for b in (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 80, 100)])
    for column, value in changes.items():
        if isinstance(value, str):
            rows[column] = rows[column].astype(object)
        elif isinstance(value, float) and rows[column].dtype.kind == "i":  # 2.5 or 1e300 in a column of counts
            rows[column] = rows[column].astype(float)
        rows.loc[3, column] = value
    return rows


def _fitted(**options):
    return fit.fit_speedup_model(_frame(), 40.0, **options)


def _e2e_rows(**changes):
    import pandas as pd

    row = {"run": 0, "batch_size": 2, "gamma": 4, "num_experts_per_tok": 8, "t_ar": 0.02, "t_sd": 0.012,
           "t_target_1": 0.019, "t_target_gamma": 0.025, "t_draft": 0.002, "t_reject": 0.0005, "sigma": 0.95,
           "speedup": 1.6}
    return pd.DataFrame([row, {**row, "run": 1, **changes}])


def _loaded(tmp: Path, rows, sidecar='{"complete": true}'):
    """``measurements.load`` of ``rows`` with a MeasurementWarning raised as an error."""
    (tmp / "cpu").mkdir()
    rows.to_csv(tmp / "cpu" / "e2e.csv", index=False)
    (tmp / "cpu" / "e2e.json").write_text(sidecar)
    with warnings.catch_warnings():
        warnings.simplefilter("error", measurements.MeasurementWarning)
        return measurements.load("e2e", "cpu", directory=tmp)


FIT = [
    Case("fit", "stride 0 (fitted every row)", lambda: _fitted(stride=0), ValueError,
         "stride must be a whole number >= 1, got 0"),
    Case("fit", "fractional stride", lambda: _fitted(stride=2.5), ValueError,
         "stride must be a whole number >= 1, got 2.5"),
    Case("fit", "a stride leaving fewer rows than parameters", lambda: _fitted(stride=10), ValueError,
         "5 measurements cannot determine 10 parameters"),
    Case("fit", "begin without a stride", lambda: _fitted(begin=2), ValueError, "begin applies only with a stride"),
    Case("fit", "ridge point 0", lambda: fit.fit_speedup_model(_frame(), 0), ValueError,
         "rp must be a number > 0, got 0"),
    Case("fit", "unknown variant", lambda: _fitted(variant="eq5"), ValueError, "variant must be one of"),
    Case("fit", "unknown verified tokens", lambda: _fitted(verify_tokens="gamma+2"), ValueError,
         "verify_tokens must be one of"),
    Case("fit", "a text cell", lambda: check_measurements(_frame(speedup="fast")), ValueError,
         "measurements column speedup holds 'fast' (row 3), not a number"),
    Case("fit", "an empty speedup", lambda: check_measurements(_frame(speedup=np.nan)), ValueError,
         "measurements have NaN in speedup"),
    Case("fit", "K above E", lambda: check_measurements(_frame(K=16)), ValueError, "K must be in [1, E]"),
    Case("fit", "sigma below 1/(gamma+1)", lambda: check_measurements(_frame(sigma=0.1)), ValueError,
         "sigma must be in [1/(gamma+1), 1] (Eq. 5)"),
    Case("fit", "a speedup of 0", lambda: check_measurements(_frame(speedup=0.0)), ValueError,
         "speedup must be > 0"),
    Case("fit", "batch size 0", lambda: check_measurements(_frame(B=0)), ValueError, "B and gamma must be >= 1"),
    Case("fit", "measurements lacking sigma", lambda: check_measurements(_frame().drop(columns="sigma")),
         ValueError, "measurements lack the column(s) sigma"),
    Case("fit", "measurements as a list", lambda: check_measurements([[1, 2, 8, 64, 0.9, 1.5]]), ValueError,
         "measurements must be a pandas DataFrame, got list"),
    Case("fit", "a repeated index", lambda: fit.fit_speedup_model(_frame().set_index(np.zeros(48, int)), 40.0),
         ValueError, "the measurements' index must be unique"),
    Case("fit", "a sweep file without speedups", lambda: from_sweep(_e2e_rows().drop(columns="speedup"), 8),
         ValueError, "rows lack the column(s) speedup of an e2e or sparsity result file"),
    Case("fit", "a sweep file read with E 0", lambda: from_sweep(_e2e_rows(), 0), ValueError,
         "num_experts must be a whole number >= 1, got 0"),
    Case("fit", "errors of something not fitted", lambda: diagnostics.held_out_errors("result", _frame()), ValueError,
         "result must be a FitResult, got str"),
]

MEASUREMENTS = [
    Case("measurements", "a study not measured",
         lambda tmp: measurements.load("e2e", "tpu", directory=tmp), FileNotFoundError,
         "no e2e study measured on tpu (available: none); run `moesd sweep e2e` to measure it"),
    Case("measurements", "a sidecar that is not JSON", lambda tmp: _loaded(tmp, _e2e_rows(), "{not json"), ValueError,
         "cannot be read as a result file"),
    Case("measurements", "speedup above sigma (gamma + 1) (dense.csv's 5.17 > 5.0 was plotted silently)",
         lambda tmp: _loaded(tmp, _e2e_rows(sigma=1.0, speedup=5.17)), measurements.MeasurementWarning,
         "cpu/e2e.csv: line 3 (run=1, batch_size=2, gamma=4, num_experts_per_tok=8): speedup = 5.17 exceeds "
         "sigma (gamma + 1) = 5 by more than 2%"),
    Case("measurements", "a time of 0 s", lambda tmp: _loaded(tmp, _e2e_rows(t_draft=0.0)),
         measurements.MeasurementWarning, "line 3 (run=1, batch_size=2, gamma=4, num_experts_per_tok=8): t_draft = 0 s"),
    Case("measurements", "a negative time", lambda tmp: _loaded(tmp, _e2e_rows(t_sd=-0.01)),
         measurements.MeasurementWarning, "t_sd = -0.01 s is not > 0"),
    Case("measurements", "sigma above 1", lambda tmp: _loaded(tmp, _e2e_rows(sigma=1.2)),
         measurements.MeasurementWarning, "sigma = 1.2 lies outside [1/(gamma+1), 1]"),
    Case("measurements", "an empty cell", lambda tmp: _loaded(tmp, _e2e_rows(t_ar=np.nan)),
         measurements.MeasurementWarning, "line 3 (run=1, batch_size=2, gamma=4, num_experts_per_tok=8): t_ar is empty"),
    Case("measurements", "fitting a dense target",
         lambda: analysis.fitting_frame(_e2e_rows(), {"settings": {"target": "opt-30b"}}), ValueError,
         "opt-30b is dense: Algorithm 1 needs routed experts"),
    Case("measurements", "a sidecar naming no target", lambda: analysis.fitting_frame(_e2e_rows(), {}),
         ValueError, "the sidecar names no target (settings.target)"),
    Case("measurements", "a sidecar naming an unknown target",
         lambda: analysis.routed_experts({"settings": {"target": "gpt-5"}}), KeyError, "unknown model 'gpt-5'"),
    Case("measurements", "fitting a forward study",
         lambda: analysis.fitting_frame(_e2e_rows().drop(columns=["sigma", "speedup"]),
                                            {"settings": {"target": "qwen2-57b-a14b"}}), ValueError,
         "the rows lack sigma, speedup: fitting needs an e2e, sparsity or settings study"),
    Case("measurements", "a sidecar without a measured roofline",
         lambda: analysis.ridge_point_for({"device": "AMD EPYC"}), ValueError, "holds no measured roofline"),
    Case("measurements", "target efficiency at a gamma not measured",
         lambda: analysis.forward_target_efficiency(
             _e2e_rows().assign(role="target", tokens=1, seconds=0.01), gammas=(5,)), ValueError,
         "the forward study has no target pass of 1 and 6 tokens per sequence"),
]

_PAIR = ("qwen3-30b-a3b", "qwen3-0.6b", "H100")
_GRID = dict(batch_size=[1, 8], gamma=[2, 4], sigma=0.8)


def _predict(*pair, grid=None, **deployment):
    """``predict_sd`` of the deployment ``pair`` and ``deployment`` over ``_GRID`` with ``grid``'s changes."""
    return predict.predict_sd(Setup(*(pair or _PAIR), **deployment), **{**_GRID, **(grid or {})})


PREDICT = [
    Case("predict", "an unknown target", lambda: _predict("gpt-5", "qwen3-0.6b", "H100"), UsageError,
         "target must be a moesd.zoo name (qwen2-57b-a14b, qwen2-0.5b, "),
    Case("predict", "an unknown GPU", lambda: _predict("qwen3-30b-a3b", "qwen3-0.6b", "TPUv5"), UsageError,
         "hardware must be one of"),
    Case("predict", "sigma and alpha both", lambda: _predict(grid={"alpha": 0.8}), UsageError,
         "give either sigma or alpha (not both)"),
    Case("predict", "batch of 0", lambda: _predict(grid={"batch_size": [0, 8]}), UsageError,
         "batch_size must be a whole number >= 1, got 0"),
    Case("predict", "fractional gamma", lambda: _predict(grid={"gamma": 2.5}), UsageError,
         "gamma must be a whole number >= 1, got 2.5"),
    Case("predict", "sigma above 1", lambda: _predict(grid={"sigma": 1.5}), UsageError,
         "sigma must be a number in (0, 1], got 1.5"),
    Case("predict", "negative alpha", lambda: _predict(grid={"sigma": None, "alpha": -0.1}),
         UsageError, "alpha must be a number in [0, 1], got -0.1"),
    Case("predict", "negative context", lambda: _predict(context=-1), UsageError,
         "context must be a whole number >= 0, got -1"),
    Case("predict", "a negative context axis", lambda: _predict(grid={"context": [-1, 8]}), UsageError,
         "context must be a whole number >= 0, got -1"),
    Case("predict", "an unknown dtype", lambda: _predict(dtype="int3"), UsageError, "dtype must be one of"),
    Case("predict", "ep not dividing tp", lambda: _predict(tp=4, ep=3), UsageError,
         "ep must divide tp, got ep=3, tp=4"),
    Case("predict", "tp not dividing the attention heads",
         lambda: _predict("qwen2-57b-a14b", "qwen2-0.5b", "H100", tp=8), UsageError,
         "tp must divide the attention heads of qwen2-57b-a14b (28), got 8"),
    Case("predict", "tp neither dividing nor a multiple of the KV heads",
         lambda: forward.step_time("qwen2-57b-a14b", "H100", 1, 8, tp=7), UsageError,
         "tp must divide, or be a multiple of, the KV heads of qwen2-57b-a14b (4), got 7"),
    Case("predict", "unknown verified tokens", lambda: _predict(verify_tokens="all"),
         UsageError, "verify_tokens must be 'gamma+1', 'gamma' or a number of tokens, got 'all'"),
    Case("predict", "a host cost beside an Efficiency",
         lambda: predict.predict_sd(Setup(*_PAIR, host_seconds=1e-3), 1, 2, 0.8,
                                    efficiency=Efficiency()), UsageError,
         "efficiency: a host cost (Setup.host_seconds) is an Efficiency's step_seconds"),
    Case("predict", "best gamma of another table", lambda: predict.best_gamma(_frame()), ValueError,
         "frame lacks column(s) batch_size; pass a predict_sd frame"),
    Case("predict", "memory at a batch of 0", lambda: memory.memory_per_gpu("qwen2-57b-a14b", "H800", 0, 256),
         ValueError, "batch_size must be a whole number >= 1, got 0"),
    Case("predict", "memory at a negative context",
         lambda: memory.memory_per_gpu("qwen2-57b-a14b", "H800", 8, -1), ValueError,
         "context must be a whole number >= 0, got -1"),
    Case("predict", "memory on 0 GPUs", lambda: memory.memory_per_gpu("qwen2-57b-a14b", "H800", 8, 256, tp=0),
         ValueError, "tp must be a whole number >= 1, got 0"),
    Case("predict", "an ordering scan of a list", lambda: predict_paper.ordering_scan([None]), ValueError,
         "efficiencies must be a non-empty dict of label to Efficiency or None, got [None]"),
    Case("predict", "an ordering scan of nothing", lambda: predict_paper.ordering_scan({}), ValueError,
         "efficiencies must be a non-empty dict"),
    Case("predict", "an ordering scan of a number", lambda: predict_paper.ordering_scan({"a": 0.5}), ValueError,
         "efficiencies['a'] must be an Efficiency or None, got 0.5"),
]


# Sweeps (settings are checked without torch; the checks of a device, a folder and a result file need it) ---

_SWEEP = dict(study="e2e", target="qwen2-57b-a14b", draft="qwen2-0.5b", layers=1, draft_layers=1, width=1 / 32,
              batch_sizes=(1, 3), gammas=(2, 3), context=8, repeats=2, warmup=1, rounds=2, warmup_rounds=1)


def _sweep(**changes):
    return sweeps.SweepConfig(**{**_SWEEP, **changes})


def _checked_sweep(out_dir, **changes):
    from moesd.measure.result_file import check_sweep

    return check_sweep(_sweep(**changes), out_dir)


def _finished_sweep(tmp: Path) -> Path:
    """A folder holding a finished e2e result file."""
    _write(tmp, "e2e.csv", b"run\n0\n")
    _write(tmp, "e2e.json", json.dumps({"complete": True}).encode())
    return tmp


def _read_only(tmp: Path) -> Path:
    """A folder no one can write: one with mode 0555, or /proc for root (who writes through modes)."""
    import os

    if os.geteuid() == 0:
        return Path("/proc") / "moesd-out"
    tmp.chmod(0o555)
    return tmp / "out"


BENCH = [
    Case("bench", "unknown study", lambda: _sweep(study="prefill"), ValueError, "study must be one of"),
    Case("bench", "unknown weights", lambda: _sweep(weights="trained"), ValueError, "weights must be"),
    Case("bench", "unknown target", lambda: _sweep(target="gpt-5"), ValueError, "target unknown model 'gpt-5'"),
    Case("bench", "real acceptance with random weights", lambda: _sweep(sigma="real"), ValueError, "random weights"),
    Case("bench", "sigma missing a gamma", lambda: _sweep(sigma={2: 0.9}), ValueError, "no value for gamma [3]"),
    Case("bench", "sigma for a gamma not run", lambda: _sweep(sigma={2: 0.9, 3: 0.9, 4: 0.9}), ValueError,
         "gamma [4], which the sweep does not run"),
    Case("bench", "sigma below 1/(gamma+1)", lambda: _sweep(sigma={2: 0.2, 3: 0.9}), ValueError,
         "must lie in [1/(gamma+1), 1]"),
    Case("bench", "sigma as a list", lambda: _sweep(sigma=[0.9, 0.9]), ValueError, "must map each gamma"),
    Case("bench", "sigma keyed by a fractional gamma", lambda: _sweep(sigma={2.5: 0.9, 3: 0.9}), ValueError,
         "sigma must map each gamma (a whole number) to a sigma (a number)"),
    Case("bench", "sigma as text", lambda: _sweep(sigma={2: "high", 3: 0.9}), ValueError, "must map each gamma"),
    Case("bench", "no repeats", lambda: _sweep(repeats=0), ValueError, "repeats must be >= 1"),
    Case("bench", "no rounds", lambda: _sweep(rounds=0), ValueError, "rounds must be >= 1"),
    Case("bench", "fractional rounds", lambda: _sweep(rounds=2.5), ValueError, "rounds must be a whole number"),
    Case("bench", "infinite rounds", lambda: _sweep(rounds=float("inf")), ValueError, "rounds must be a whole number"),
    Case("bench", "negative warm-up rounds", lambda: _sweep(warmup_rounds=-1), ValueError, "warmup_rounds must be >= 0"),
    Case("bench", "empty prompts", lambda: _sweep(context=0), ValueError, "context must be >= 1"),
    Case("bench", "batch size 0", lambda: _sweep(batch_sizes=(0, 1)), ValueError, "batch_sizes must be >= 1"),
    Case("bench", "a batch size twice", lambda: _sweep(batch_sizes=(2, 2)), ValueError, "must not repeat"),
    Case("bench", "no batch sizes", lambda: _sweep(batch_sizes=()), ValueError, "at least one value"),
    Case("bench", "fractional gamma", lambda: _sweep(gammas=(2, 2.5)), ValueError, "gammas must be a whole number"),
    Case("bench", "unknown dtype", lambda: _sweep(dtype="bogus"), ValueError, "dtype must be one of float32"),
    Case("bench", "unknown device", lambda: _sweep(device="nonsense"), ValueError,
         "device must be 'cpu', 'cuda' or 'cuda:N'"),
    Case("bench", "K above E", lambda: _sweep(top_ks=(65,)), ValueError, "top_ks must lie in [1, 64]"),
    Case("bench", "K of a dense target", lambda: _sweep(target="opt-30b", draft="opt-350m", top_ks=(2,)), ValueError,
         "top_ks applies to MoE targets; opt-30b is dense"),
    Case("bench", "more layers than the model", lambda: _sweep(layers=29), ValueError, "layers must be in [1, 28]"),
    Case("bench", "width 0", lambda: _sweep(width=0.0), ValueError, "width must be in (0, 1]"),
    Case("bench", "shape settings with pretrained weights", lambda: _sweep(weights="pretrained"), ValueError,
         "shape settings apply to random weights only"),
    Case("bench", "weights folder with random weights", lambda: _sweep(target_path="/weights"), ValueError,
         "apply to pretrained weights only"),
    Case("bench", "workloads outside the settings study",
         lambda: _sweep(workloads=({"dataset": "x", "temperature": 0, "sigma": {2: 0.9, 3: 0.9}},)), ValueError,
         "settings study only"),
    Case("bench", "rounds in a forward study", lambda: _sweep(study="forward", rounds=8, warmup_rounds=None),
         ValueError, "rounds is not used by the forward study"),
    Case("bench", "sigma in the settings study", lambda: _sweep(study="settings", sigma={2: 0.9, 3: 0.9}),
         ValueError, "sigma is not used by the settings study"),
    Case("bench", "unknown preset", lambda: presets.preset("e2e", "tpu"), ValueError,
         "preset must be 'cpu' or 'gpu', got 'tpu'"),
    Case("bench", "an estimate without the forwards it needs",
         lambda: sweeps.estimate_seconds(_sweep(gammas=(3,)), _e2e_rows().assign(role="target", tokens=1,
                                                                                 seconds=0.01)), ValueError,
         "forward has no target time at B = 1, s = 1"),
    Case("bench", "out_dir a file", lambda tmp: _checked_sweep(_write(tmp, "file", b"")), ValueError,
         "file' is not a folder", True),
    Case("bench", "out_dir read-only", lambda tmp: _checked_sweep(_read_only(tmp)), ValueError, "cannot be written",
         True),
    Case("bench", "a device this machine lacks", lambda tmp: _checked_sweep(tmp, device="cuda:99"), ValueError,
         "device 'cuda:99' is not available", True),
    Case("bench", "a finished result file", lambda tmp: _checked_sweep(_finished_sweep(tmp)), FileExistsError,
         "holds a finished sweep; pass overwrite (--overwrite) to replace it, or write elsewhere", True),
    Case("bench", "a folder where the result file goes", lambda tmp: (tmp / "e2e.csv").mkdir() or _checked_sweep(tmp),
         ValueError, "e2e.csv is not a regular file", True),
]


# Command lines of trace, sweep, fit and predict -----------------------------------------------------

GSM8K_FOLDER = EXCERPTS / "gsm8k"


def _trace_argv(*changes, model=None, out=lambda tmp: tmp / "x.npz", source=lambda tmp: GSM8K_FOLDER):
    """``moesd trace`` (by default of a model folder that does not exist: errors must come first); ``model`` is a
    path or a function of the temporary folder returning one."""
    return lambda tmp: ["trace", "--model", str(model(tmp) if callable(model) else model or tmp / "no-model"),
                        "--prompts", "gsm8k", "--prompt-source", str(source(tmp)), "--out", str(out(tmp)), *changes]


def _saved_model(tmp: Path, config: str = '{"model_type": "olmoe"}') -> Path:
    """A folder that looks like a saved model to the checks before loading: its ``config.json`` holds ``config``."""
    (tmp / "saved-model").mkdir(exist_ok=True)
    _write(tmp / "saved-model", "config.json", config.encode())
    return tmp / "saved-model"


def _random_trace_argv(*changes):
    return lambda tmp: ["trace", "--random-weights", "--prompts", "gsm8k", "--prompt-source", str(GSM8K_FOLDER),
                        "--out", str(tmp / "x.npz"), *changes]


def _sweep_argv(*changes):
    return lambda tmp: ["sweep", *changes, "--out-dir", str(tmp)]


def _result_file(tmp: Path, name: str = "sparsity.csv", sidecar: dict | None = None, **changes) -> Path:
    """A sparsity result file (48 rows, E = 8 by its target) with a sidecar holding a measured roofline."""
    rows = _frame(**changes).rename(columns={"B": "batch_size", "K": "num_experts_per_tok"}).drop(columns="E")
    rows.insert(0, "run", 0)
    rows.to_csv(tmp / name, index=False)
    if sidecar is None:
        sidecar = {"settings": {"target": "mixtral-8x7b", "dtype": "bfloat16"}, "complete": True,
                   "hardware": dict(name="host", peak_flops=1e12, memory_bandwidth=2.7e10, memory_bytes=1e9,
                                    source="made up")}
    (tmp / name).with_suffix(".json").write_text(json.dumps(sidecar))
    return tmp / name


def _fit_argv(*changes, **file_changes):
    return lambda tmp: ["fit", str(_result_file(tmp, **file_changes)), *changes]


def _predict_argv(*changes):
    return ["predict", "--target", "qwen3-30b-a3b", "--draft", "qwen3-0.6b", "--hardware", "H100", *changes]


def _fit_failing_inside(tmp: Path):
    """``moesd fit`` of a good file whose fit raises ``ValueError``, as scipy might deep inside."""
    with mock.patch("moesd.model.fit.fit_speedup_model", side_effect=ValueError("deep inside scipy")):
        moesd_cli.main(["fit", str(_result_file(tmp))])


NO_MODELS = ("moesd.routing.capture", "moesd.measure.bench", "moesd.routing.vllm_capture")
"""What a refused command must not have imported: the modules that build and run models."""
TRACING = (("moesd.routing.capture", "trace_random_model"),)
SWEEPING = (("moesd.measure.bench", "run_sweep"),)
_PREDICTING = (("moesd.predictor.predict", "predict_sd"), ("moesd.predictor.recommend", "predict_sd"))
"""The work ``moesd predict`` must not reach, patched where it is defined and where recommend bound it."""
"""The work a refused command must not reach, where checking needs the module that does it."""

CLI_COMMANDS = [
    cli("trace of 0 prompts (used every prompt)", _trace_argv("--num-prompts", "0"), "--num-prompts must be >= 1, got 0",
        before=NO_MODELS),
    cli("trace of -1 prompts (dropped the last)", _trace_argv("--num-prompts", "-1"),
        "--num-prompts must be >= 1, got -1", before=NO_MODELS),
    cli("trace in batches of 0", _trace_argv("--batch-size", "0"), "--batch-size must be >= 1, got 0", before=NO_MODELS),
    cli("trace of 0 new tokens", _trace_argv("--max-new-tokens", "0"), "--max-new-tokens must be >= 1, got 0",
        before=NO_MODELS),
    cli("trace with a bogus dtype (was ignored)", _trace_argv("--dtype", "bogus"),
        "argument --dtype: invalid choice: 'bogus'", before=NO_MODELS),
    cli("trace on a bogus device (was ignored)", _trace_argv("--device", "nonsense"),
        "--device 'nonsense' is not a torch device", integration=True, before=NO_MODELS),
    cli("trace on a CUDA device not here", _trace_argv("--device", "cuda:99"), "--device 'cuda:99' is not available",
        integration=True, before=NO_MODELS),
    cli("trace of a model folder that is not there", _trace_argv(), "no-model' is not there: give a folder",
        before=NO_MODELS),
    cli("trace into an existing file", _trace_argv(model=_saved_model, out=lambda tmp: _write(tmp, "x.npz", b"")),
        "x.npz' exists; pass --overwrite to replace it", before=NO_MODELS),
    cli("trace into a folder", _trace_argv(model=_saved_model, out=lambda tmp: tmp),
        "is not a regular file (a folder or a device)", before=NO_MODELS),
    cli("trace into a read-only folder", _trace_argv(model=_saved_model, out=lambda tmp: _read_only(tmp) / "x.npz"),
        "cannot be written", before=NO_MODELS),
    cli("trace of prompts that are not there", _trace_argv(model=_saved_model, source=lambda tmp: tmp),
        "no gsm8k prompts at", before=NO_MODELS),
    cli("trace of another set's prompts", _trace_argv(model=_saved_model, source=lambda tmp: HUMANEVAL),
        "not gsm8k prompts", before=NO_MODELS),
    cli("random-weight trace with --device", _random_trace_argv("--model", "olmoe-1b-7b", "--device", "cpu"),
        "--dtype and --device apply only without --random-weights", before=NO_MODELS),
    cli("--width without random weights", _trace_argv("--width", "0.5"),
        "--layers and --width apply only with --random-weights", before=NO_MODELS),
    cli("random-weight trace of an unknown model", _random_trace_argv("--model", "not-a-model"),
        "unknown model 'not-a-model'", before=NO_MODELS),
    cli("random-weight trace of a dense model", _random_trace_argv("--model", "opt-30b"),
        "--model opt-30b is dense", before=NO_MODELS),
    cli("random-weight trace of more layers than the model", _random_trace_argv("--model", "olmoe-1b-7b", "--layers",
                                                                               "17"),
        "--layers must be in [1, 16] (olmoe-1b-7b), got 17", integration=True, stops=TRACING),
    cli("random-weight trace at width 2", _random_trace_argv("--model", "olmoe-1b-7b", "--width", "2"),
        "--width must be in (0, 1], got 2.0", integration=True, stops=TRACING),
    cli("trace by the HF engine with a draft", _trace_argv("--draft", "d", "--gamma", "2"),
        "--draft, --gamma and --temperature apply only with --engine vllm", before=NO_MODELS),
    cli("vLLM trace with a draft but no gamma", _trace_argv("--engine", "vllm", "--draft", "d"),
        "--draft and --gamma go together", before=NO_MODELS),
    cli("vLLM trace with gamma 0", _trace_argv("--engine", "vllm", "--draft", "d", "--gamma", "0"),
        "--gamma must be >= 1, got 0", before=NO_MODELS),
    cli("vLLM trace on a named device", _trace_argv("--engine", "vllm", "--device", "cpu"),
        "--device applies only with --engine hf", before=NO_MODELS),
    cli("vLLM trace of random weights with a draft", _random_trace_argv("--model", "olmoe-1b-7b", "--engine", "vllm",
                                                                        "--draft", "d", "--gamma", "2"),
        "--draft needs pretrained weights", before=NO_MODELS),
    cli("vLLM trace at an infinite temperature", _trace_argv("--engine", "vllm", "--temperature", "inf"),
        "--temperature must be a finite number >= 0, got inf", before=NO_MODELS),
    cli("vLLM trace at a negative temperature", _trace_argv("--engine", "vllm", "--temperature", "-1"),
        "--temperature must be a finite number >= 0, got -1.0", before=NO_MODELS),
    cli("sweep with two sigma for one gamma (dropped 0.5)", _sweep_argv("e2e", "--gammas", "2", "--sigma", "0.9", "0.5"),
        "--sigma has 2 value(s) for 1 gamma(s) [2]: give one sigma per gamma", before=NO_MODELS),
    cli("sweep with one sigma for three gammas", _sweep_argv("e2e", "--sigma", "0.9"),
        "--sigma has 1 value(s) for 3 gamma(s) [2, 3, 4]", before=NO_MODELS),
    cli("sweep with sigma as a word", _sweep_argv("e2e", "--sigma", "high"), "--sigma takes numbers or 'real'",
        before=NO_MODELS),
    cli("sweep of an e2e study with CUDA graphs on the CPU", _sweep_argv("e2e", "--cuda-graphs"),
        "--cuda-graphs applies on a CUDA device, not on cpu", before=NO_MODELS),
    cli("sweep of a forward study with CUDA graphs on the CPU", _sweep_argv("forward", "--cuda-graphs"),
        "--cuda-graphs applies on a CUDA device, not on cpu",
        before=NO_MODELS),
    cli("sweep with sigma out of range", _sweep_argv("e2e", "--gammas", "2", "--sigma", "1.5"),
        "--sigma at gamma 2 must lie in [1/(gamma+1), 1]", before=NO_MODELS),
    cli("forward sweep with rounds", _sweep_argv("forward", "--top-ks", "2", "--rounds", "4"),
        "--rounds is not used by the forward study", before=NO_MODELS),
    cli("dense sweep with --top-ks (rows had K = 8)", _sweep_argv("dense", "--top-ks", "2"),
        "--top-ks applies to MoE targets; opt-30b is dense", before=NO_MODELS),
    cli("sweep with K above E", _sweep_argv("sparsity", "--top-ks", "65"), "--top-ks must lie in [1, 64]",
        before=NO_MODELS),
    cli("pretrained sweep with --layers", _sweep_argv("e2e", "--weights", "pretrained", "--layers", "2"),
        "layers=2: shape settings apply to random weights only", before=NO_MODELS),
    cli("sweep with a bogus dtype", _sweep_argv("e2e", "--dtype", "bogus"), "--dtype must be one of float32",
        before=NO_MODELS),
    cli("sweep on a bogus device", _sweep_argv("e2e", "--device", "nonsense"),
        "--device must be 'cpu', 'cuda' or 'cuda:N', got 'nonsense'", before=NO_MODELS),
    cli("sweep of 0 rounds", _sweep_argv("e2e", "--rounds", "0"), "--rounds must be >= 1, got 0", before=NO_MODELS),
    cli("sweep of 0 repeats", _sweep_argv("e2e", "--repeats", "0"), "--repeats must be >= 1, got 0", before=NO_MODELS),
    cli("sweep at width 2", _sweep_argv("e2e", "--width", "2"), "--width must be in (0, 1], got 2.0", before=NO_MODELS),
    cli("sweep of batch size 0", _sweep_argv("e2e", "--batch-sizes", "0"), "--batch-sizes must be >= 1, got 0",
        before=NO_MODELS),
    cli("sweep into a file (ran, then said error: 17)",
        lambda tmp: ["sweep", "e2e", "--out-dir", str(_write(tmp, "file", b""))], "is not a folder", integration=True,
        stops=SWEEPING),
    cli("sweep into a read-only folder (crashed after the work)",
        lambda tmp: ["sweep", "e2e", "--out-dir", str(_read_only(tmp))], "cannot be written", integration=True,
        stops=SWEEPING),
    cli("sweep on CUDA without CUDA (a 24-line traceback)",
        lambda tmp: ["sweep", "e2e", "--preset", "gpu", "--device", "cuda:99", "--out-dir", str(tmp)],
        "device 'cuda:99' is not available", integration=True, stops=SWEEPING),
    cli("sweep over a finished result file", lambda tmp: ["sweep", "e2e", "--out-dir", str(_finished_sweep(tmp))],
        "holds a finished sweep; pass overwrite (--overwrite) to replace it, or write elsewhere", integration=True,
        stops=SWEEPING),
    cli("fit of a missing file (said error: 2)", lambda tmp: ["fit", str(tmp / "missing.csv")], "missing.csv: no such file"),
    cli("fit of a folder (a traceback)", lambda tmp: ["fit", str(tmp)], "is a directory; give an e2e or sparsity"),
    cli("fit of a trace (said error: utf-8)", lambda tmp: ["fit", str(_write(tmp, "t.npz", b"PK\x03\x04"))],
        "t.npz is a routing trace (.npz)"),
    cli("fit of a sidecar", lambda tmp: ["fit", str(_write(tmp, "e2e.json", b"{}"))], "is a sidecar; give the result"),
    cli("fit of a forward study (said error: gamma)",
        lambda tmp: ["fit", str(_write(tmp, "forward.csv", b"run,role,batch_size,tokens,seconds\n0,target,1,1,0.1\n"))],
        "is a forward study (stage times per forward, no speedups)"),
    cli("fit of a dense study",
        lambda tmp: ["fit", str(_write(tmp, "dense.csv", b"batch_size,gamma,num_experts_per_tok,sigma,speedup\n"
                                                         b"1,2,,0.9,1.5\n"))], "has no experts per token"),
    cli("fit of a CSV of other columns", lambda tmp: ["fit", str(_write(tmp, "other.csv", b"a,b\n1,2\n"))],
        "lacks the column(s) batch_size, gamma, num_experts_per_tok, sigma, speedup"),
    cli("fit of a binary file", lambda tmp: ["fit", str(_write(tmp, "binary.csv", bytes(range(256)) * 4))],
        "is not a readable CSV file"),
    cli("fit of a text cell (a traceback)", _fit_argv(speedup="fast"),
        "sparsity.csv: measurements column speedup holds 'fast' (row 3), not a number"),
    cli("fit of an impossible sigma", _fit_argv(sigma=0.1), "sparsity.csv: sigma must be in [1/(gamma+1), 1]"),
    cli("fit with stride 0 (fitted every row)", _fit_argv("--stride", "0"), "--stride must be >= 1, got 0"),
    cli("fit with a stride leaving too few rows", _fit_argv("--stride", "6"),
        "--stride 6 leaves 8 of 48 measurements to fit, fewer than the 10 parameters of Algorithm 1; use a stride "
        "of at most 5"),  # ceil(48 / 5) = 10 rows
    cli("fit of too few rows",
        lambda tmp: ["fit", str(_write(tmp, "sparsity.csv", b"".join(_result_file(tmp).read_bytes().splitlines(True)[:5])))],
        "sparsity.csv holds 4 measurements, fewer than the 10 parameters of Algorithm 1"),
    cli("fit with E 0", _fit_argv("--E", "0"), "--E must be >= 1, got 0"),
    cli("fit without a sidecar", lambda tmp: ["fit", str(_write(tmp, "e2e.csv", _result_file(tmp).read_bytes()))],
        "e2e.csv has no sidecar (.json beside it) to read E from; pass --E"),
    cli("fit of an unknown target", _fit_argv(sidecar={"settings": {"target": "gpt-5"}}),
        "unknown model 'gpt-5'"),
    cli("fit of a sidecar that is not JSON",
        lambda tmp: _result_file(tmp).with_suffix(".json").write_text("{oops") and ["fit", str(tmp / "sparsity.csv")],
        "sparsity.json: not JSON"),
    cli("fit without a roofline or --hardware", _fit_argv(sidecar={"settings": {"target": "mixtral-8x7b"}}),
        "pass --hardware NAME to use a data-sheet ridge point"),
    cli("fit with an unknown --hardware", _fit_argv("--hardware", "TPU", sidecar={"settings": {"target": "mixtral-8x7b"}}),
        "hardware must be one of"),
    Case("cli", "a ValueError inside moesd fit stays a traceback (was a usage error)", _fit_failing_inside, ValueError,
         "deep inside scipy"),
    cli("predict at batch 0", _predict_argv("--batch", "0-4"), "--batch must be >= 1, got 0"),
    cli("predict of a descending range", _predict_argv("--gamma", "5-1"), "--gamma: the range '5-1' runs backwards"),
    cli("predict at sigma 1.5", _predict_argv("--sigma", "1.5"), "--sigma must be in (0, 1], got 1.5"),
    cli("predict at a sigma no round can give", _predict_argv("--sigma", "0.1"),
        "--sigma must be >= 1 / (gamma + 1) for every --gamma"),
    cli("predict with sigma and alpha", _predict_argv("--sigma", "0.8", "--alpha", "0.8"),
        "--alpha and --sigma exclude each other"),
    cli("predict on 0 GPUs", _predict_argv("--tp", "0"), "--tp must be >= 1, got 0"),
    cli("predict with ep not dividing tp", _predict_argv("--tp", "4", "--ep", "3"), "--ep: ep must divide tp"),
    cli("predict on an unknown GPU", _predict_argv()[:-1] + ["TPU"],
        "--hardware: hardware must be one of A800, A100, H800, H20, H20-141GB, H100, H200, L40, B200, MI300X, B300, GB200, GB300, MI325X, L40S, CPU, got 'TPU'"),
    cli("predict of an unknown model", ["predict", "--target", "gpt-5", "--draft", "qwen3-0.6b", "--hardware", "H100"],
        "--target: target must be a moesd.zoo name (qwen2-57b-a14b, "),
    cli("predict in an unknown dtype", _predict_argv("--dtype", "int3"), "--dtype: dtype must be one of"),
    cli("predict a round without its plain step", _predict_argv("--sd-step-ms", "30@3"), "--sd-step-ms needs --step-ms"),
    cli("predict a round without its gamma", _predict_argv("--step-ms", "20", "--sd-step-ms", "30"),
        "--sd-step-ms must be a round's milliseconds and the gamma it ran at"),
    cli("predict at a negative temperature", _predict_argv("--temperature", "-1"),
        "--temperature: temperature must be a number >= 0, got -1"),
    cli("predict Medusa heads of no count", _predict_argv("--draft", "medusa:x"),
        "--draft: medusa:K takes a whole number of heads K, got 'medusa:x'"),
    cli("predict on a GPU without citable peaks", _predict_argv()[:-1] + ["RTX PRO 6000"],
        "--hardware: hardware RTX PRO 6000: no data-sheet tensor throughput per dtype found"),
    cli("predict the MTP module of a model without one", ["predict", "--target", "llama-4-scout", "--draft", "mtp",
                                                          "--hardware", "H100"],
        "--draft: llama-4-scout's config declares no multi-token-prediction module"),
    cli("predict with a negative host cost", _predict_argv("--host-ms", "-1"),
        "--host-ms must be a finite number >= 0, got -1.0"),
    cli("predict with a host cost of nan", _predict_argv("--host-ms", "nan"), "--host-ms must be a finite number"),
    cli("predict into a folder", lambda tmp: _predict_argv("--csv", str(tmp)), "is not a regular file"),
    cli("predict with a draft_tp the draft's heads refuse",
        ["predict", "--target", "qwen3-235b-a22b", "--draft", "qwen2-0.5b", "--hardware", "H100", "--tp", "8",
         "--draft-tp", "4"], "--draft-tp: draft_tp must divide the attention heads of qwen2-0.5b (14), got 4"),
    cli("predict into a missing folder", lambda tmp: _predict_argv("--csv", str(tmp / "nowhere" / "p.csv")),
        "--csv: folder ", stops=_PREDICTING),
    cli("predict with a negative context", _predict_argv("--context", "-1"), "--context must be >= 0, got -1"),
    cli("predict into an image type matplotlib lacks", lambda tmp: _predict_argv("--plot", str(tmp / "x.xyz")),
        "--plot: matplotlib cannot write '.xyz' files; use one of", stops=_PREDICTING),
    cli("predict across part of a node", ["predict", "--target", "deepseek-v3", "--draft", "deepseek-v3-mtp",
                                          "--hardware", "H100", "--tp", "12"],
        "--tp: tp must be a multiple of 8 beyond one node, whole nodes of 8 H100 GPUs (a group over part of a node "
        "is not modelled): one of 1, 2, 4, 8, 16, 32, 64, 128 for deepseek-v3, got 12"),
    cli("predict across nodes without a network on record", ["predict", "--target", "deepseek-v3", "--draft",
                                                             "deepseek-v3-mtp", "--hardware", "H20", "--tp", "16"],
        "--tp: tp must be at most 8, the GPUs one H20 node joins (no inter-node network is on record, so tensor "
        "parallelism across nodes is not modelled): one of 1, 2, 4, 8 for deepseek-v3, got 16"),
    cli("predict with dp-attention on a dense model", ["predict", "--target", "qwen2-0.5b", "--draft", "qwen2-0.5b",
                                                       "--hardware", "H100", "--tp", "2", "--dp-attention"],
        "--dp-attention: qwen2-0.5b is dense, it has no experts to deal over the GPUs"),
    cli("predict of a tree with a chain's acceptance", ["predict", "--target", "qwen3-30b-a3b", "--draft",
        "qwen3-30b-a3b-eagle3", "--hardware", "H100", "--draft-topk", "4", "--verify-tokens", "16"],
        "--draft-topk prices a tree of drafts: give its measured --acceptance-length"),
    cli("predict of a tree that emits more than it verifies", ["predict", "--target", "qwen3-30b-a3b", "--draft",
        "qwen3-30b-a3b-eagle3", "--hardware", "H100", "--draft-topk", "4", "--verify-tokens", "4",
        "--acceptance-length", "2.75@2"], "--verify-tokens: a round emits at most the 4 tokens it verifies"),
    cli("predict of a tree larger than its draft steps offer", ["predict", "--target", "qwen3-30b-a3b", "--draft",
        "qwen3-30b-a3b-eagle3", "--hardware", "H100", "--draft-topk", "4", "--verify-tokens", "16", "--gamma", "1",
        "--sigma", "0.9"], "--verify-tokens: a tree of gamma = 1 draft steps of 4 candidates offers at most 5"),
    cli("predict with a head of another target", ["predict", "--target", "deepseek-v3", "--draft",
        "qwen3-30b-a3b-eagle3", "--hardware", "H200", "--tp", "8"],
        "--draft: qwen3-30b-a3b-eagle3 is a draft head of qwen3-30b-a3b and cannot draft for deepseek-v3"),
    cli("predict with a separate draft of another tokenizer", ["predict", "--target", "mixtral-8x7b", "--draft",
        "qwen3-0.6b", "--hardware", "H100"], "--draft: qwen3-0.6b's vocabulary has 151936 tokens, mixtral-8x7b's 32000"),
    cli("predict with a measured step and a host cost", _predict_argv("--step-ms", "30", "--host-ms", "3"),
        "--step-ms and --host-ms exclude each other"),
    cli("predict with a tp the heads refuse", _predict_argv("--tp", "3"),
        "--tp: tp must divide the attention heads of qwen3-30b-a3b (32), got 3; on H100: 1, 2, 4, 8"),
]


# The second round of bad input: one list per kind of case.
_EARLIER = b"an earlier result\n"


def _kept(case: Case, *names: str) -> Case:
    """``case`` run over files ``names`` already in its folder: after the refusal each must be as it was, byte for
    byte."""
    def call(tmp):
        files = [_write(tmp, name, _EARLIER) for name in names]
        try:
            case.call(tmp)
        finally:
            for file in files:
                assert file.read_bytes() == _EARLIER, f"the refused call changed {file.name}"

    return case._replace(call=call)


def _outputs(overwrite=False, **paths):
    """``moesd._checks.new_files`` of options ``--csv``, ``--plot``... given as ``csv=``, ``plot=``..."""
    from moesd._checks import new_files

    return new_files({f"--{name}": path for name, path in paths.items()}, overwrite)


def _link(tmp: Path, name: str, target: str) -> Path:
    (tmp / name).symlink_to(tmp / target)
    return tmp / name


def _partial_sweep(tmp: Path) -> Path:
    """A folder holding the partial file of a sweep with other settings that was replacing its e2e.csv."""
    _write(tmp, ".e2e.partial.csv", b"run\n0\n")
    _write(tmp, ".e2e.partial.json", json.dumps({"complete": False, "settings": {"context": 9}}).encode())
    return tmp


_FINISHED = json.dumps({"complete": True}).encode()

OUTPUT_FILES = [
    _kept(Case("checks", "an output file that exists", lambda tmp: _outputs(csv=tmp / "p.csv"), UsageError,
               "p.csv' exists; pass --overwrite to replace it"), "p.csv"),
    _kept(Case("checks", "an output file that exists beside one not asked for",
               lambda tmp: _outputs(csv=None, plot=tmp / "p.png"), UsageError, "p.png' exists; pass --overwrite"),
          "p.png"),
    Case("checks", "two outputs at one path", lambda tmp: _outputs(csv=tmp / "x.png", plot=tmp / "x.png"), UsageError,
         "--csv and --plot name one file"),
    Case("checks", "two outputs at one path through a symbolic link",
         lambda tmp: _outputs(csv=_link(tmp, "l.png", "x.png"), plot=tmp / "x.png"), UsageError,
         "--csv and --plot name one file"),
    Case("checks", "two outputs at one path spelled apart",
         lambda tmp: _outputs(csv=tmp / "x.png", plot=tmp / "sub" / ".." / "x.png"), UsageError,
         "--csv and --plot name one file"),
    _kept(Case("checks", "two outputs at one existing path with overwrite",
               lambda tmp: _outputs(True, csv=tmp / "x.png", plot=tmp / "x.png"), UsageError,
               "--csv and --plot name one file"), "x.png"),
    _kept(cli("predict over an existing CSV (replaced it)", lambda tmp: _predict_argv("--csv", str(tmp / "p.csv")),
              "p.csv' exists; pass --overwrite to replace it", stops=_PREDICTING), "p.csv"),
    _kept(cli("predict over an existing plot (replaced it)", lambda tmp: _predict_argv("--plot", str(tmp / "p.png")),
              "p.png' exists; pass --overwrite to replace it", stops=_PREDICTING), "p.png"),
    _kept(cli("predict over the existing plot its name without suffix means",
              lambda tmp: _predict_argv("--plot", str(tmp / "heat")), "heat.png' exists; pass --overwrite",
              stops=_PREDICTING), "heat.png"),
    cli("predict with one path for CSV and plot (one replaced the other)",
        lambda tmp: _predict_argv("--csv", str(tmp / "x.png"), "--plot", str(tmp / "x.png")),
        "--csv and --plot name one file", stops=_PREDICTING),
    cli("predict with a CSV at the plot's path once .png is added",
        lambda tmp: _predict_argv("--csv", str(tmp / "x.png"), "--plot", str(tmp / "x")),
        "--csv and --plot name one file", stops=_PREDICTING),
    cli("predict with a CSV linked to the plot",
        lambda tmp: _predict_argv("--csv", str(_link(tmp, "l.csv", "x.png")), "--plot", str(tmp / "x.png")),
        "--csv and --plot name one file", stops=_PREDICTING),
    _kept(cli("predict with --overwrite and one existing path for CSV and plot",
              lambda tmp: _predict_argv("--overwrite", "--csv", str(tmp / "x.png"), "--plot", str(tmp / "x.png")),
              "--csv and --plot name one file", stops=_PREDICTING), "x.png"),
    _kept(cli("measured hardware over an existing JSON (replaced it)",
              lambda tmp: ["hardware", "--measure", "--json", str(tmp / "hw.json")],
              "hw.json' exists; pass --overwrite to replace it",
              stops=(("moesd.measure.hardware", "measure_roofline"),)), "hw.json"),
    _kept(cli("the regime check over an existing JSON",
              lambda tmp: ["hardware", "--regime", "--json", str(tmp / "r.json")],
              "r.json' exists; pass --overwrite to replace it",
              stops=(("moesd.measure.regime", "regime_check"),)), "r.json"),
    _kept(cli("trace over an existing file leaves it as it was",
              _trace_argv(model=_saved_model, out=lambda tmp: tmp / "x.npz"), "x.npz' exists; pass --overwrite",
              before=NO_MODELS), "x.npz"),
    _kept(Case("bench", "a finished result file is left as it was",
               lambda tmp: _write(tmp, "e2e.json", _FINISHED) and _checked_sweep(tmp), FileExistsError,
               "e2e.csv holds a finished sweep", True), "e2e.csv"),
    _kept(cli("sweep over a finished result file leaves it as it was",
              lambda tmp: _write(tmp, "e2e.json", _FINISHED) and _sweep_argv("e2e")(tmp), "holds a finished sweep",
              integration=True, stops=SWEEPING), "e2e.csv"),
    Case("bench", "the partial file of a sweep with other settings",
         lambda tmp: _checked_sweep(_partial_sweep(tmp)), FileExistsError,
         ".e2e.partial.csv holds a sweep with other settings", True),
    cli("sweep over the partial file of a sweep with other settings",
        lambda tmp: _sweep_argv("e2e")(_partial_sweep(tmp)),
        ".e2e.partial.csv holds a sweep with other settings", integration=True, stops=SWEEPING),
]

def _parse(kind: str, text: str, name: str = "--batch"):
    """``moesd.cli.arguments.integers`` or ``numbers`` of ``text`` for the option ``name``."""
    from moesd.cli import arguments

    return getattr(arguments, kind)(text, name)


def _activated(trace, *args, **options):
    from moesd.routing.loads import activated_experts

    return activated_experts(trace, *args, **options)


def _check_dtype(dtype: str):
    from moesd.predictor.layout import check_dtype

    return check_dtype(dtype)


def _with_hardware(**fields):
    return dataclasses.replace(roofline.HARDWARE["H100"], **fields)


def _sidecar_hardware(**fields) -> dict:
    """A result file's sidecar whose measured roofline has ``fields`` changed."""
    return {"settings": {"target": "mixtral-8x7b", "dtype": "bfloat16"}, "complete": True,
            "hardware": dict(name="host", peak_flops=1e12, memory_bandwidth=2.7e10, memory_bytes=1e9,
                             source="made up") | fields}


def _trace_of_e(num_experts: int) -> traces.RoutingTrace:
    """Fifty tokens of three layers, each picking experts 0 and 1 of ``num_experts``."""
    return traces.RoutingTrace(np.tile(np.array([0, 1]), (50, 3, 1)), num_experts)


BEYOND_INT64, BEYOND_FLOAT_WHOLE = str(10**20), str(2**53 + 1)
INT64_RANGE, EXACT_WHOLE = "within int64's range [-2^63, 2^63 - 1], got", "below 2^53 = 9007199254740992"
NO_PREDICTION = _PREDICTING

NUMBERS = [
    cli("predict over a grid of too many points", _predict_argv("--batch", "1-100000", "--gamma", "1-20"),
        "--batch, --gamma and the acceptance values make 2000000 predictions"),
    cli("predict over too many acceptance values", _predict_argv("--batch", "1-20000", "--alpha",
                                                                 ",".join(f"0.{i:02d}" for i in range(1, 100))),
        "at most 1000000 are allowed"),
    # integers beyond int64 (wrapped to INT64_MIN) and whole numbers beyond 2^53 (rounded)
    Case("numbers", "a count of 10**20 tokens", lambda: experts.expected_active_experts(10**20, 64, 8), UsageError,
         f"t must be a number >= 0 {INT64_RANGE} 100000000000000000000"),
    Case("numbers", "a list holding 2**63 (numpy made it a float)",
         lambda: experts.expected_active_experts([2**63, 1], 64, 8), UsageError, f"t must be a number >= 0 {INT64_RANGE}"),
    Case("numbers", "2**63 rounds as a uint64 array", lambda: speedup.sd_time(np.array([2**63], np.uint64), 1, 1, 1, 0),
         UsageError, f"rounds must be a number >= 0 {INT64_RANGE} 9223372036854775808"),
    Case("numbers", "E of 2**53 + 1 (rounded to 2**53)", lambda: experts.sparsity(2**53 + 1, 8), UsageError,
         f"E must be a whole number >= 1 {EXACT_WHOLE}"),
    Case("numbers", "gamma of 1e17 as a float", lambda: speedup.sigma(0.5, 1e17), UsageError,
         f"gamma must be a whole number >= 1 {EXACT_WHOLE} (beyond, a float does not hold every whole number), got 1e+17"),
    Case("numbers", "batch sizes beyond 2**53 in an int64 array",
         lambda: predict.predict_sd(Setup(*_PAIR), np.array([1, 2**53 + 1]), 2, alpha=0.8),
         UsageError, f"batch_size must be a whole number >= 1 {EXACT_WHOLE} (beyond, a float does not hold every whole "
         f"number), got {BEYOND_FLOAT_WHOLE}"),
    cli("predict with gamma 10**20 (printed -9223372036854775808)", _predict_argv("--gamma", BEYOND_INT64),
        f"--gamma must be whole numbers {EXACT_WHOLE} in magnitude, got {BEYOND_INT64}", stops=NO_PREDICTION),
    cli("predict with a batch size of 2**53 + 1 (rounded)", _predict_argv("--batch", BEYOND_FLOAT_WHOLE),
        f"--batch must be whole numbers {EXACT_WHOLE} in magnitude, got {BEYOND_FLOAT_WHOLE}", stops=NO_PREDICTION),
    cli("predict with a context of 10**20 tokens", _predict_argv("--context", BEYOND_INT64),
        f"--context: context must be a whole number >= 0 {EXACT_WHOLE}"),  # refused by predict_sd's own checks
    cli("predict on 10**20 GPUs", _predict_argv("--tp", BEYOND_INT64), f"--tp: tp must be a whole number >= 1 {EXACT_WHOLE}"),
    cli("theory of 2**53 + 1 tokens", ["theory", "--E", "64", "--K", "8", "--tokens", BEYOND_FLOAT_WHOLE],
        f"--tokens must be a whole number >= 1 {EXACT_WHOLE}"),
    # booleans inside a list of numbers (numpy turned [True, 2] into [1, 2])
    Case("numbers", "True among token counts", lambda: experts.expected_active_experts([True, 2], 64, 8), UsageError,
         "t must be a number >= 0, got True (a bool)"),
    Case("numbers", "numpy's True among draft lengths", lambda: speedup.sigma(0.5, [np.True_, 2.0]), UsageError,
         "gamma must be a whole number >= 1, got np.True_ (a bool)"),
    # ranges and lists of the command line: counted before they are built, parts checked, the flag named
    Case("numbers", "a range of 10**12 batch sizes", lambda: _parse("integers", "1-1000000000000"), UsageError,
         "--batch '1-1000000000000' holds 1000000000000 values; at most 100000 are allowed"),
    Case("numbers", "an empty list of integers", lambda: _parse("integers", ""), UsageError,
         "--batch has an empty part in ''"),
    Case("numbers", "a range that runs backwards", lambda: _parse("integers", "5-3"), UsageError,
         "--batch: the range '5-3' runs backwards"),
    Case("numbers", "a NaN acceptance", lambda: _parse("numbers", "0.5,nan", "--alpha"), UsageError,
         "--alpha must be finite numbers such as 0.8 or 0.7,0.9, got '0.5,nan'"),
    Case("numbers", "an empty part among numbers", lambda: _parse("numbers", "0.5,,0.7", "--alpha"), UsageError,
         "--alpha has an empty part in '0.5,,0.7'"),
    Case("numbers", "a number too large for a float", lambda: _parse("numbers", "1e999", "--sigma"), UsageError,
         "--sigma must be finite numbers"),
    cli("predict over 10**12 batch sizes (built them all)", _predict_argv("--batch", "1-1000000000000"),
        "--batch '1-1000000000000' holds 1000000000000 values; at most 100000 are allowed", stops=NO_PREDICTION),
    cli("predict over ranges that add up past the bound", _predict_argv("--gamma", "1-60000,70000-130000"),
        "--gamma '1-60000,70000-130000' holds 120001 values", stops=NO_PREDICTION),
    cli("predict with an empty batch part", _predict_argv("--batch", "1,,2"), "--batch has an empty part in '1,,2'",
        stops=NO_PREDICTION),
    cli("predict with no batch size", _predict_argv("--batch", ""), "--batch has an empty part in ''", stops=NO_PREDICTION),
    cli("predict with a backwards gamma range", _predict_argv("--gamma", "5-3"), "--gamma: the range '5-3' runs backwards",
        stops=NO_PREDICTION),
    cli("predict with a negative gamma (said 'integers such as')", _predict_argv("--gamma=-3"), "--gamma must be >= 1, got -3",
        stops=NO_PREDICTION),
    cli("predict with a negative batch range", _predict_argv("--batch=-5--3"), "--batch must be >= 1, got -5",
        stops=NO_PREDICTION),
    cli("predict at a NaN acceptance (named alpha, not --alpha)", _predict_argv("--alpha", "nan"),
        "--alpha must be finite numbers", stops=NO_PREDICTION),
    cli("predict at an infinite sigma", _predict_argv("--sigma", "0.5,inf"), "--sigma must be finite numbers",
        stops=NO_PREDICTION),
    cli("predict with an empty alpha part", _predict_argv("--alpha", ",0.5"), "--alpha has an empty part in ',0.5'",
        stops=NO_PREDICTION),
    # statistics over E experts: Eq. 8 needs no array of E; the others are bounded, with the estimate
    Case("numbers", "popularity of E = 10**6 experts for 1000 token counts",
         lambda: experts.expected_active_experts_from_popularity(np.arange(1000), np.full(10**6, 8e-6)), UsageError,
         "over E = 1000000 experts x 1000 token counts would need about 22.4 GiB of memory, more than the 4 GiB"),
    Case("numbers", "popularity table of a trace of E = 10**9 (grew to 22 GB)", lambda: unions.popularity(_trace_of_e(10**9)),
         UsageError, "the popularity of 3 layers x E = 1000000000 experts would need about 156 GiB of memory"),
    Case("numbers", "popularity loads of a trace of E = 10**9",
         lambda: _activated(_trace_of_e(10**9), 4, model="popularity"), UsageError,
         "expert counts of 3 layers x E = 1000000000 experts would need about 67.1 GiB"),
    Case("numbers", "window loads of a trace of E = 10**9",
         lambda: _activated(_trace_of_e(10**9), 4, 2, model="windows"), UsageError,
         "window activation of 3 layers x E = 1000000000 experts would need about 67.1 GiB"),
    Case("numbers", "window unions of a trace of E = 10**9", lambda: unions.window_union(_trace_of_e(10**9), 2),
         UsageError, "the expert bitmasks of 50 tokens x 3 layers x E = 1000000000 experts would need about 17.5 GiB"),
    # dtypes: torch's names are aliases; anything else lists both
    Case("numbers", "an unknown weight dtype", lambda: _check_dtype("int8"), ValueError,
         "(or torch's names float32, bfloat16, float8_e4m3fn, float8_e5m2), got 'int8'"),
    cli("predict in int8 (lists the dtypes and torch's names)", _predict_argv("--dtype", "int8"),
        "(or torch's names float32, bfloat16, float8_e4m3fn, float8_e5m2), got 'int8'",
        stops=NO_PREDICTION),
    # hardware records: refused when made, naming the field, not later as an internal time
    Case("numbers", "a record with zero bandwidth", lambda: _with_hardware(memory_bandwidth=0.0), UsageError,
         "hardware.memory_bandwidth must be a number > 0, got 0 (Hardware record 'H100')"),
    Case("numbers", "a record spanning nodes without a network", lambda: _with_hardware(internode_bandwidth=0.0),
         UsageError, "hardware.max_nodes must be 1 without an internode_bandwidth, got 32 (Hardware record 'H100')"),
    Case("numbers", "a record with infinite peak FLOP/s", lambda: _with_hardware(peak_flops=float("inf")), UsageError,
         "hardware.peak_flops must be a number > 0, got inf"),
    Case("numbers", "a record with NaN fp8 FLOP/s", lambda: _with_hardware(fp8_flops=float("nan")), UsageError,
         "hardware.fp8_flops must be a number > 0, got NaN"),
    Case("numbers", "a record of 0 GPUs per node", lambda: _with_hardware(gpus_per_node=0), UsageError,
         "hardware.gpus_per_node must be a whole number >= 1, got 0"),
    Case("numbers", "a stored record with a string bandwidth",
         lambda: roofline.Hardware.from_dict(_sidecar_hardware(memory_bandwidth="2.7e10")["hardware"]),
         UsageError, "hardware.memory_bandwidth must be a number > 0, got '2.7e10'"),
    cli("fit of a sweep measured at zero GEMM rate (said t_target_1 must be > 0)",
        lambda tmp: ["fit", str(_result_file(tmp, sidecar=_sidecar_hardware(peak_flops=0)))],
        "hardware.peak_flops must be a number > 0, got 0"),
    cli("fit of a sweep measured at infinite peak FLOP/s",
        lambda tmp: ["fit", str(_result_file(tmp, sidecar=_sidecar_hardware(peak_flops=float("inf"))))],
        "hardware.peak_flops must be a number > 0, got inf"),
]

def _sidecar(complete=True, **hardware) -> dict:
    """The sidecar :func:`_result_file` writes, with ``complete`` and roofline fields changed."""
    return {"settings": {"target": "mixtral-8x7b", "dtype": "bfloat16"}, "complete": complete,
            "hardware": {**dict(name="host", peak_flops=1e12, memory_bandwidth=2.7e10, memory_bytes=1e9,
                                source="made up"), **hardware}}


def _edited(path: Path, edit) -> Path:
    """``path`` with its text replaced by ``edit(text)``."""
    path.write_text(edit(path.read_text()))
    return path


def _cut(text: str) -> str:
    return text[:-4]  # the last line cut mid-number, as a killed write leaves it


def _doubled(text: str) -> str:
    return text + text.splitlines(keepends=True)[-1]  # the last row copied by hand


def _studies_file(tmp: Path, edit=None, sidecar=None, **changes) -> Path:
    """A sparsity result file in ``tmp/cpu`` (where ``load`` finds it), its text changed by ``edit``."""
    (tmp / "cpu").mkdir(exist_ok=True)
    path = _result_file(tmp / "cpu", sidecar=sidecar, **changes)
    return _edited(path, edit) if edit else path


def _load_file(tmp: Path, **options):
    """``studies.load`` of :func:`_studies_file` with a MeasurementWarning raised as an error."""
    _studies_file(tmp, **options)
    with warnings.catch_warnings():
        warnings.simplefilter("error", measurements.MeasurementWarning)
        return measurements.load("sparsity", "cpu", directory=tmp)


def _read_file(tmp: Path, allow=(), path=None, **options):
    """``read_result_file`` of ``path`` (default a new :func:`_studies_file`), warnings raised as errors."""
    from moesd.model.measurements import read_result_file

    path = path or _studies_file(tmp, **options)
    with warnings.catch_warnings():
        warnings.simplefilter("error", measurements.MeasurementWarning)
        return read_result_file(path, **{f"allow_{name}": True for name in allow})


def _fit_file(edit=None, sidecar=None, **changes):
    return lambda tmp: ["fit", str(_studies_file(tmp, edit, sidecar, **changes))]


def _fit_warned(tmp: Path, edit):
    """``moesd fit`` of a file edited by ``edit``, its MeasurementWarning raised as an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", measurements.MeasurementWarning)
        _run_command(_fit_file(edit)(tmp))


def _as_fifo(path: Path) -> Path:
    """``path`` replaced by a FIFO."""
    import os

    path.unlink(missing_ok=True)
    os.mkfifo(path)
    return path


def _resume_rows(tmp: Path, context=8, warn=False):
    """``check_sweep`` of an e2e file of two rows (recorded ``context``) whose sidecar is missing."""
    rows = _e2e_rows().assign(context=context, rounds=2, warmup_rounds=1, batch_size=1, gamma=2)
    rows.to_csv(tmp / "e2e.csv", index=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error" if warn else "ignore")
        return _checked_sweep(tmp, top_ks=(8,))


def _complete_rows(tmp: Path, edit):
    """``read_complete_rows`` (a resume's reader) of a result file edited by ``edit``, warnings as errors."""
    from moesd.measure.result_file import read_complete_rows

    path = _edited(_result_file(tmp), edit)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return read_complete_rows(path)


_PRETRAINED = {**_SWEEP, "weights": "pretrained", "layers": None, "draft_layers": None, "width": 1.0}

RESULT_FILES = [
    # a sweep that stopped part-way (complete: false)
    Case("measurements", "load of an unfinished sweep", lambda tmp: _load_file(tmp, sidecar=_sidecar(False)),
         measurements.MeasurementWarning, "sparsity.csv: its sidecar says complete: false"),
    Case("fit", "fit API of an unfinished sweep", lambda tmp: _read_file(tmp, sidecar=_sidecar(False)), ValueError,
         "sparsity.json says complete: false: the sweep stopped before its last point"),
    cli("fit of an unfinished sweep (fitted silently)", _fit_file(sidecar=_sidecar(False)),
        "pass allow_incomplete=True (--allow-incomplete) to fit the rows it has"),
    # rows above Eq. 4's ceiling sigma (gamma + 1)
    Case("fit", "fit API of a speedup above sigma (gamma + 1)", lambda tmp: _read_file(tmp, speedup=3.0), ValueError,
         "sparsity.csv: line 5 (and 0 more): speedup = 3 exceeds Eq. 4's ceiling sigma (gamma + 1) = 2.7"),
    Case("fit", "fit API of a speedup above the ceiling, allowed but unfinished",
         lambda tmp: _read_file(tmp, allow=("above_ceiling",), speedup=3.0, sidecar=_sidecar(False)), ValueError,
         "says complete: false"),
    cli("fit of a speedup above sigma (gamma + 1) (fitted silently)", _fit_file(speedup=3.0),
        "pass allow_above_ceiling=True (--allow-above-ceiling)"),
    # a last line cut mid-number
    Case("measurements", "load of a last line cut mid-number", lambda tmp: _load_file(tmp, edit=_cut),
         measurements.MeasurementWarning, "sparsity.csv: dropped line 49, cut mid-line"),
    Case("fit", "fit API of a last line cut mid-number", lambda tmp: _read_file(tmp, edit=_cut),
         measurements.MeasurementWarning, "sparsity.csv: dropped line 49, cut mid-line"),
    Case("cli", "fit of a last line cut mid-number (fitted silently)", lambda tmp: _fit_warned(tmp, _cut),
         measurements.MeasurementWarning, "sparsity.csv: dropped line 49, cut mid-line"),
    Case("bench", "resume of a last line cut mid-number", lambda tmp: _complete_rows(tmp, _cut),
         measurements.MeasurementWarning, "sparsity.csv: dropped line 49, cut mid-line", True),
    # a point in two rows
    Case("measurements", "load of a row copied twice", lambda tmp: _load_file(tmp, edit=_doubled),
         measurements.MeasurementWarning, "line 50 (run=0, batch_size=100, gamma=4, num_experts_per_tok=2): "
         "repeats the point of line 49"),
    Case("fit", "fit API of a row copied twice", lambda tmp: _read_file(tmp, edit=_doubled), ValueError,
         "sparsity.csv: line 50 repeats the point of line 49 (a row copied twice?)"),
    cli("fit of a row copied twice (fitted twice)", _fit_file(_doubled), "line 50 repeats the point of line 49"),
    Case("bench", "resume of a row copied twice (kept)", lambda tmp: _complete_rows(tmp, _doubled), UserWarning,
         "dropped data rows 48 and 49, which hold the same point", True),
    # malformed sidecars
    Case("measurements", "a sidecar holding a list", lambda tmp: _load_file(tmp, sidecar=[_sidecar()]), ValueError,
         "sparsity.json must hold a JSON object (a sidecar of moesd sweep), got a list"),
    Case("measurements", "a sidecar of bandwidth 0", lambda tmp: _load_file(tmp, sidecar=_sidecar(memory_bandwidth=0)),
         ValueError, "sparsity.json: hardware.memory_bandwidth must be a number > 0, got 0"),
    Case("measurements", "a sidecar of bandwidth as text",
         lambda tmp: _load_file(tmp, sidecar=_sidecar(memory_bandwidth="fast")), ValueError,
         "sparsity.json: hardware.memory_bandwidth must be a number > 0, got 'fast'"),
    Case("fit", "fit API of a sidecar whose settings are a list",
         lambda tmp: _read_file(tmp, sidecar={**_sidecar(), "settings": ["mixtral-8x7b"]}), ValueError,
         "sparsity.json: settings must be a JSON object, got [\"mixtral-8x7b\"]"),
    Case("fit", "fit API of a roofline without peak_flops",
         lambda tmp: _read_file(tmp, sidecar={**_sidecar(), "hardware": {"memory_bandwidth": 1e9}}), ValueError,
         "sparsity.json: hardware (the measured roofline) lacks peak_flops, memory_bytes"),
    Case("fit", "fit API of complete as text", lambda tmp: _read_file(tmp, sidecar={**_sidecar(), "complete": "yes"}),
         ValueError, "sparsity.json: complete must be true or false, got \"yes\""),
    cli("fit of a sidecar holding a list (a traceback)", _fit_file(sidecar=[_sidecar()]),
        "must hold a JSON object (a sidecar of moesd sweep), got a list"),
    cli("fit of a sidecar of bandwidth 0 (a traceback)", _fit_file(sidecar=_sidecar(memory_bandwidth=0)),
        "hardware.memory_bandwidth must be a number > 0, got 0"),
    cli("fit of a sidecar of bandwidth as text (a traceback)", _fit_file(sidecar=_sidecar(memory_bandwidth="fast")),
        "hardware.memory_bandwidth must be a number > 0, got 'fast'"),
    cli("fit of a sidecar whose settings are a list (a traceback)",
        _fit_file(sidecar={**_sidecar(), "settings": [1]}), "settings must be a JSON object, got [1]"),
    cli("fit of a roofline lacking keys", _fit_file(sidecar={**_sidecar(), "hardware": {"name": "x"}}),
        "hardware (the measured roofline) lacks peak_flops, memory_bandwidth, memory_bytes"),
    # non-finite rows into the fit
    Case("fit", "an infinite speedup (scipy's message)", lambda: fit.fit_speedup_model(_frame(speedup=np.inf), 40.0),
         ValueError, "measurements have infinite values in speedup: column speedup holds inf (row 3)"),
    Case("fit", "a batch size of 0 names its row", lambda: check_measurements(_frame(B=0)), ValueError,
         "B and gamma must be >= 1: column B holds 0 (row 3)"),
    Case("fit", "fit API of an infinite speedup", lambda tmp: _read_file(tmp, speedup=np.inf), ValueError,
         "sparsity.csv: line 5, column speedup is inf (empty or not finite)"),
    Case("fit", "fit API of an empty sigma", lambda tmp: _read_file(tmp, sigma=np.nan), ValueError,
         "sparsity.csv: line 5, column sigma is nan (empty or not finite)"),
    cli("fit of an infinite speedup (scipy's message)", _fit_file(speedup=np.inf),
        "sparsity.csv: line 5, column speedup is inf"),
    cli("fit of an empty gamma", _fit_file(gamma=np.nan), "sparsity.csv: line 5, column gamma is nan"),
    # a resume whose sidecar is missing or cut
    Case("bench", "resume without a sidecar, rows of other settings ('other settings; pass --overwrite')",
         lambda tmp: _resume_rows(tmp, context=9), FileExistsError,
         "e2e.json' does not exist; ", True),
    Case("bench", "resume without a sidecar names the setting that differs", lambda tmp: _resume_rows(tmp, context=9),
         FileExistsError, "e2e.csv: line 2 has context 9, not one of this sweep's (8)", True),
    Case("bench", "resume without a sidecar, rows of this sweep (kept, with a warning)",
         lambda tmp: _resume_rows(tmp, warn=True), UserWarning, "resuming from the 2 row(s) of e2e.csv", True),
    Case("bench", "resume with a cut sidecar, rows of this sweep (kept, with a warning)",
         lambda tmp: _write(tmp, "e2e.json", b'{"settings": {') and _resume_rows(tmp, warn=True), UserWarning,
         "e2e.json: not JSON", True),
    cli("sweep resuming rows of other settings without their sidecar",
        lambda tmp: (_e2e_rows().assign(context=99, rounds=2, warmup_rounds=1).to_csv(tmp / "e2e.csv", index=False)
                     or ["sweep", "e2e", "--out-dir", str(tmp)]),
        "e2e.json' does not exist; ", integration=True, stops=SWEEPING),
    # sweeps too large for memory or for the model's positions, checked before the models are built
    Case("bench", "a KV cache larger than memory",
         lambda: sweep_memory.check_memory(_sweep(batch_sizes=(1_000_000,), context=10_000), 64e9, "cpu"), ValueError,
         "the sweep needs at least"),
    Case("bench", "a KV cache larger than memory names the estimate",
         lambda: sweep_memory.check_memory(_sweep(batch_sizes=(1_000_000,), context=10_000), 64e9, "cpu"), ValueError,
         "of KV cache for 10016000000 cached tokens), more than the 64 GB of cpu"),
    Case("bench", "positions beyond the model's",
         lambda: _sweep(target="opt-30b", draft="opt-350m", top_ks=None, context=3000), ValueError,
         "context, rounds and gammas make a sequence reach 3016 positions, more than the 2048 of opt-30b"),
    cli("sweep of a KV cache larger than memory (checked after the models were built)",
        _sweep_argv("e2e", "--batch-sizes", "100000000", "--context", "20000"), "the sweep needs at least",
        integration=True, stops=SWEEPING),
    cli("sweep of positions beyond the model's", _sweep_argv("dense", "--context", "5000"),
        "more than the 2048 of opt-30b", before=NO_MODELS),
    cli("sweep of rounds beyond the model's positions", _sweep_argv("dense", "--rounds", "1000"),
        "positions, more than the 2048 of opt-30b", before=NO_MODELS),
    # a pretrained folder that does not exist (a hub error after seconds of work)
    Case("bench", "a pretrained target folder that does not exist",
         lambda tmp: sweeps.SweepConfig(**{**_PRETRAINED, "target_path": str(tmp / "nope")}), ValueError,
         "nope' does not exist; give the local folder of a pretrained checkpoint"),
    Case("bench", "a pretrained draft folder without config.json",
         lambda tmp: sweeps.SweepConfig(**{**_PRETRAINED, "draft_path": str(tmp)}), ValueError,
         "is not a model folder (no config.json in it)"),
    cli("sweep of a pretrained folder that does not exist (a hub error)",
        lambda tmp: ["sweep", "e2e", "--weights", "pretrained", "--target-path", str(tmp / "nope"), "--out-dir",
                     str(tmp)], "--target-path '", before=NO_MODELS),
    # FIFOs block a reader forever
    Case("measurements", "load of a FIFO",
         lambda tmp: _as_fifo(_studies_file(tmp)) and measurements.load("sparsity", "cpu", directory=tmp), ValueError,
         "sparsity.csv' is a FIFO, not a regular file: refusing to read it"),
    Case("fit", "fit API of a FIFO sidecar",
         lambda tmp: _read_file(tmp, path=_as_fifo(_studies_file(tmp).with_suffix(".json")).with_suffix(".csv")),
         ValueError, "sidecar '"),
    cli("fit of a FIFO (blocked forever)", lambda tmp: ["fit", str(_as_fifo(_studies_file(tmp)))],
        "is a FIFO, not a regular file: refusing to read it"),
    cli("fit of a result file whose sidecar is a FIFO (blocked forever)",
        lambda tmp: ["fit", str(_as_fifo(_studies_file(tmp).with_suffix(".json")).with_suffix(".csv"))],
        "sparsity.json' is a FIFO, not a regular file"),
]

def _bare_trace(tmp: Path, **arrays) -> Path:
    """A ``.npz`` that ``RoutingTrace.load`` reads, written without RoutingTrace's checks (two tokens, E = 64)."""
    np.savez(tmp / "bare.npz", **{"experts": np.array([[[0, 1]], [[1, 2]]]), "num_experts": np.int64(64), **arrays})
    return tmp / "bare.npz"


def _replay_argv(**arrays):
    """``moesd sweep sparsity`` replaying a bare trace of ``arrays`` (checked before any model is built)."""
    return lambda tmp: ["sweep", "sparsity", "--routing", "trace", "--routing-trace", str(_bare_trace(tmp, **arrays)),
                        "--out-dir", str(tmp / "out")]


def _routed_npz(tmp: Path, **changes) -> Path:
    """A saved ``.npz`` of vLLM's returned routed experts, two requests of 2 and 1 rows, with ``changes``."""
    arrays = dict(routed_experts=np.array([[[0, 1]]] * 3, np.int32), rows=np.array([2, 1]),
                  prompt_tokens=np.array([1, 1]), output_tokens=np.array([1, 1]), request_id=np.array(["a", "b"]))
    np.savez(tmp / "routed.npz", **{**arrays, **changes})
    return tmp / "routed.npz"


def _routed_json(tmp: Path, meta=None, **request) -> Path:
    """A saved ``.json`` of vLLM's returned routed experts, one request with ``request``'s fields changed."""
    document = {"format": vllm_logs.VLLM_ROUTED_FORMAT, "meta": meta or {}, "requests": [
        {"request_id": "a", "prompt_tokens": 1, "output_tokens": 1, "routed_experts": [[[0, 1]]], **request}]}
    (tmp / "routed.json").write_text(json.dumps(document))
    return tmp / "routed.json"


def _vllm_routes(tmp: Path, *routes, num_experts=4):
    """Read one layer file of route lines ``routes`` (dicts of the fields that differ from a plain route)."""
    meta = {"type": "meta", "model_id": "m", "layers_logged": [0], "top_k": 2}
    lines = [{"type": "route", "req_id": "a", "token_idx": i, "layer": 0, "topk_ids": [0, 1], **r}
             for i, r in enumerate(routes)]
    return vllm_logs.from_vllm_moe_log(_lines(tmp, "layer0.jsonl", meta, *lines), num_experts)


def _spec(**config):
    """A ModelSpec of a small qwen2_moe with ``config`` changed."""
    from moesd.zoo import ModelSpec

    return ModelSpec("tiny", "x/tiny", "qwen2_moe", {"num_hidden_layers": 4, "num_experts": 8,
                                                      "num_experts_per_tok": 2, **config})


def _zoo(name: str):
    from moesd.zoo import get_model

    return get_model(name)


def _random_trace_of(name: str, num_layers: int):
    """``capture.trace_random_model`` whose model must not be built (refused before)."""
    import pandas as pd

    from moesd.routing import capture

    with mock.patch("moesd.zoo.ModelSpec.random_model", side_effect=AssertionError("the model was built")):
        capture.trace_random_model(name, pd.DataFrame({"id": [0], "prompt": ["x"]}), 1, 1, num_layers=num_layers)


TRACE_FILES = [
    # expert ids against E, in a dtype that fits
    Case("traces", "E beyond int64 (ids above 2^31 wrapped in int32)", lambda: _trace(num_experts=2**63), ValueError,
         "num_experts must be <= 2**63 - 1 (ids are stored as int64), got 9223372036854775808"),
    Case("traces", "a saved trace of E beyond int64",
         lambda tmp: traces.RoutingTrace.load(_bare_trace(tmp, num_experts=np.uint64(2**63))), ValueError,
         "bare.npz: not a valid routing trace: num_experts must be <= 2**63 - 1"),
    Case("importers", "JSONL expert id 2^40 with E = 4 (named no line)",
         lambda tmp: importers.from_token_jsonl(_lines(tmp, "t.jsonl", _token(experts=(0, 2**40))), 4), ValueError,
         "t.jsonl:1: experts [0, 1099511627776]: expert id 1099511627776 is not in [0, 4) (num_experts = 4)"),
    Case("importers", "JSONL negative expert id",
         lambda tmp: importers.from_token_jsonl(_lines(tmp, "t.jsonl", _token(), _token(0, 1, experts=(-1, 1))), 4),
         ValueError, "t.jsonl:2: experts [-1, 1]: expert id -1 is not in [0, 4)"),
    Case("importers", "layer CSV expert id beyond E (named no line)",
         lambda tmp: importers.from_layer_csv(_write(tmp, "r.csv", b"0,1 2\n0,1 9\n"), 4), ValueError,
         "r.csv:2: expert_ids [1, 9]: expert id 9 is not in [0, 4)"),
    Case("importers", "vLLM log expert id beyond E (named no line)", lambda tmp: _vllm_routes(tmp, {}, num_experts=1),
         ValueError, "layer0.jsonl:2: experts [0, 1]: expert id 1 is not in [0, 1) (num_experts = 1)"),
    Case("importers", "E given as text to an importer (TypeError mid-file)",
         lambda tmp: importers.from_token_jsonl(_lines(tmp, "t.jsonl", _token()), "4"), ValueError,
         "num_experts must be a whole number >= 1, got '4'"),
    Case("importers", "fractional E to the vLLM routed reader",
         lambda tmp: vllm_logs.from_vllm_routed_experts(_routed_json(tmp), 4.5), ValueError,
         "num_experts must be a whole number >= 1, got 4.5"),
    Case("importers", "vLLM routed file whose meta gives E as text",
         lambda tmp: vllm_logs.from_vllm_routed_experts(_routed_json(tmp, meta={"num_experts": "64"})), ValueError,
         "routed.json: meta's num_experts must be a whole number >= 1, got '64'"),
    cli("sweep replaying a trace of E beyond int64", _replay_argv(num_experts=np.uint64(2**63)),
        "num_experts must be <= 2**63 - 1", before=NO_MODELS),
    cli("sweep replaying a trace with an id beyond E", _replay_argv(num_experts=np.int64(2)),
        "expert ids must lie in [0, 2)", before=NO_MODELS),
    # duplicate (sequence, position, layer)
    Case("traces", "two tokens at one (sequence, position) (were counted as a broken run)",
         lambda: _trace(sequence=np.array([0, 0]), position=np.array([0, 0])), ValueError,
         "tokens 0 and 1 are both sequence 0 position 0"),
    Case("traces", "joining two traces of the same sequence ids",
         lambda: traces.concatenate([_trace(), _trace()]), ValueError,
         "tokens 0 and 2 are both sequence 0 position 0"),
    Case("importers", "JSONL of two runs appended",
         lambda tmp: importers.from_token_jsonl(_lines(tmp, "t.jsonl", _token(), _token(0, 1), _token(), _token(0, 1)),
                                                4), ValueError,
         "t.jsonl:3: a second record for the same sequence, position and layer (sequence 0 position 0 layer 0, "
         "first on line 1); a log of two runs appended? split it"),
    cli("sweep replaying a trace with two tokens at one position",
        _replay_argv(sequence=np.array([0, 0]), position=np.array([3, 3])),
        "tokens 0 and 1 are both sequence 0 position 3", before=NO_MODELS),
    # boolean-looking lists and ids of mixed types
    Case("importers", "JSONL experts [true, false]",
         lambda tmp: importers.from_token_jsonl(_lines(tmp, "t.jsonl", _token(experts=(True, False))), 4), ValueError,
         "t.jsonl:1: experts must list whole-number expert ids, got [True, False]"),
    Case("importers", "vLLM log topk_ids [true, false]",
         lambda tmp: _vllm_routes(tmp, {"topk_ids": [True, False]}), ValueError,
         "layer0.jsonl:2: experts must list whole-number expert ids, got [True, False]"),
    Case("importers", "vLLM routed JSON of [true, false] ids (named no request)",
         lambda tmp: vllm_logs.from_vllm_routed_experts(_routed_json(tmp, routed_experts=[[[True, False]]]), 4),
         ValueError, "routed.json: requests[0]: routed_experts must hold whole-number expert ids, got bool values"),
    Case("importers", "arrays with sequence ids [true, false]",
         lambda: importers.from_arrays([np.array([[[0, 1]]])] * 2, 4, sequence_ids=[True, False]), ValueError,
         "sequence_ids must give 2 distinct whole numbers, got [True, False]"),
    Case("importers", "arrays with a prompt of true tokens (read as 1)",
         lambda: importers.from_arrays([np.array([[[0, 1]]])], 4, prompt_tokens=[True]), ValueError,
         "prompt_tokens must be a whole number >= 0, got [True]"),
    Case("importers", "vLLM log with req_id 1 and \"1\" (were merged)",
         lambda tmp: _vllm_routes(tmp, {"req_id": 1}, {"req_id": "1"}), ValueError,
         "layer0.jsonl:3: sequence id '1' is a string but"),
    Case("importers", "vLLM log with a req_id that is a list",
         lambda tmp: _vllm_routes(tmp, {"req_id": [1]}), ValueError,
         "layer0.jsonl:2: a sequence id must be a string or a whole number, got [1]"),
    cli("sweep replaying a trace of boolean expert ids", _replay_argv(experts=np.array([[[True, False]]] * 2)),
        "experts must be an integer array of shape (tokens, layers, K), got bool", before=NO_MODELS),
    # vLLM returned-experts files that do not add up
    Case("importers", "vLLM routed npz whose rows add up short (dropped a row)",
         lambda tmp: vllm_logs.from_vllm_routed_experts(_routed_npz(tmp, rows=np.array([1, 1])), 4), ValueError,
         "routed.npz: not a file written by save_vllm_routed_experts: rows add up to 2, but routed_experts holds 3"),
    Case("importers", "vLLM routed npz with more rows entries than requests (zip cut them)",
         lambda tmp: vllm_logs.from_vllm_routed_experts(_routed_npz(tmp, rows=np.array([1, 1, 1])), 4), ValueError,
         "routed.npz: not a file written by save_vllm_routed_experts: rows has shape (3,): one entry per request"),
    Case("importers", "vLLM routed npz with negative rows",
         lambda tmp: vllm_logs.from_vllm_routed_experts(_routed_npz(tmp, rows=np.array([4, -1])), 4), ValueError,
         "rows must hold whole numbers >= 0, got int64 values [4, -1]"),
    Case("importers", "vLLM routed npz of float expert ids",
         lambda tmp: vllm_logs.from_vllm_routed_experts(_routed_npz(tmp, routed_experts=np.zeros((3, 1, 2))), 4),
         ValueError, "routed.npz: not a file written by save_vllm_routed_experts: routed_experts must hold "
         "whole-number expert ids, got float64"),
    Case("importers", "vLLM routed JSON whose meta is a list (AttributeError)",
         lambda tmp: vllm_logs.from_vllm_routed_experts(_routed_json(tmp, meta=[1]), 4), ValueError,
         "routed.json: meta must be a JSON object, got [1]"),
    # NaN and infinite counts
    Case("importers", "arrays with a NaN prompt length (all read as decode)",
         lambda: importers.from_arrays([np.array([[[0, 1]]])], 4, prompt_tokens=[float("nan")]), ValueError,
         "prompt_tokens must be a whole number >= 0, got NaN"),
    Case("importers", "vLLM routed JSON with a NaN prompt length (int() message)",
         lambda tmp: vllm_logs.from_vllm_routed_experts(_routed_json(tmp, prompt_tokens=float("nan")), 4), ValueError,
         "routed.json: requests[0]: prompt_tokens must be a whole number, got nan"),
    Case("importers", "vLLM routed JSON with infinite output tokens (OverflowError)",
         lambda tmp: vllm_logs.from_vllm_routed_experts(_routed_json(tmp, output_tokens=float("inf")), 4), ValueError,
         "routed.json: requests[0]: output_tokens must be a whole number, got inf"),
    Case("importers", "vLLM routed npz with a NaN prompt length",
         lambda tmp: vllm_logs.from_vllm_routed_experts(_routed_npz(tmp, prompt_tokens=np.array([np.nan, 1])), 4),
         ValueError, "prompt_tokens must hold whole numbers >= 0, got float64 values [nan, 1.0]"),
    Case("importers", "JSONL position NaN", lambda tmp: importers.from_token_jsonl(
        _write(tmp, "t.jsonl", b'{"problem_id": 0, "token_idx": NaN, "layer": 0, "experts": [0, 1]}\n'), 4),
        ValueError, "t.jsonl:1: position must be a whole number, got nan"),
    Case("importers", "JSONL layer Infinity (OverflowError)", lambda tmp: importers.from_token_jsonl(
        _write(tmp, "t.jsonl", b'{"problem_id": 0, "token_idx": 0, "layer": Infinity, "experts": [0, 1]}\n'), 4),
        ValueError, "t.jsonl:1: layer must be a whole number, got inf"),
    Case("importers", "vLLM log row NaN", lambda tmp: _vllm_routes(tmp, {"token_idx": float("nan")}), ValueError,
         "layer0.jsonl:2: row must be a whole number, got nan"),
    # a header-less layer CSV
    Case("importers", "layer CSV whose first line 0,1 2.5 was skipped as a header",
         lambda tmp: importers.from_layer_csv(_write(tmp, "r.csv", b"0,1 2.5\n0,1 2\n"), 4), ValueError,
         "r.csv:1: expert_ids must be whole numbers, got '1 2.5'"),
    Case("importers", "layer CSV whose first line 0.0,1 2 was skipped as a header",
         lambda tmp: importers.from_layer_csv(_write(tmp, "r.csv", b"0.0,1 2\n0,2 3\n"), 4), ValueError,
         "r.csv:1: layer_id must be a whole number, got '0.0'"),
    # model specs
    Case("zoo", "a spec of 4.5 layers", lambda: _spec(num_hidden_layers=4.5), ValueError,
         "tiny: num_hidden_layers must be a whole number >= 1, got 4.5"),
    Case("zoo", "a spec of true layers", lambda: _spec(num_hidden_layers=True), ValueError,
         "tiny: num_hidden_layers must be a whole number >= 1, got True"),
    Case("zoo", "a spec with top-k 2.5", lambda: _spec(num_experts_per_tok=2.5), ValueError,
         "tiny: num_experts_per_tok must be a whole number in [1, 8], got 2.5"),
    Case("zoo", "a spec with top-k above E", lambda: _spec(num_experts_per_tok=9), ValueError,
         "tiny: num_experts_per_tok must be a whole number in [1, 8], got 9"),
    Case("zoo", "a spec of 8.5 experts", lambda: _spec(num_experts=8.5), ValueError,
         "tiny: num_experts must be a whole number >= 1, got 8.5"),
    Case("zoo", "a config of 2.5 layers", lambda: _spec().config_dict(num_layers=2.5), ValueError,
         "num_layers (tiny) must be a whole number in [1, 4], got 2.5"),
    Case("zoo", "a config of top-k 1.5", lambda: _spec().config_dict(top_k=1.5), ValueError,
         "top_k (tiny) must be a whole number in [1, 8], got 1.5"),
    cli("random trace of 2.5 layers", _random_trace_argv("--model", "deepseek-v2-lite", "--layers", "2.5"),
        "argument --layers: invalid int value: '2.5'", before=NO_MODELS),
    cli("sparsity sweep of top-k 2.5", _sweep_argv("sparsity", "--top-ks", "2.5"), "--top-ks", before=NO_MODELS),
    # a random DeepSeek-V3 cut to its dense first layers
    Case("zoo", "DeepSeek-V3 cut to its 3 dense layers", lambda: _zoo("deepseek-v3").check_routed_layers(3),
         ValueError, "num_layers 3 keeps only dense layers of deepseek-v3 (its first 3 are dense, without expert "
         "routing): give num_layers >= 4"),
    Case("traces", "random-weight DeepSeek-V3 of 2 layers traced (built, then failed)",
         lambda: _random_trace_of("deepseek-v3", 2), ValueError,
         "num_layers 2 keeps only dense layers of deepseek-v3", integration=True),
    cli("random trace of DeepSeek-V3's 2 dense layers (built them, then a traceback)",
        _random_trace_argv("--model", "deepseek-v3", "--layers", "2"),
        "--layers 2 keeps only dense layers of deepseek-v3 (its first 3 are dense, without expert routing): "
        "give --layers >= 4", integration=True, stops=TRACING),
    cli("random trace of Kimi-K2's dense first layer", _random_trace_argv("--model", "kimi-k2", "--layers", "1"),
        "--layers 1 keeps only dense layers of kimi-k2", integration=True, stops=TRACING),
    # FIFOs and devices refused when reading
    Case("traces", "loading a FIFO (blocked forever)",
         lambda tmp: traces.RoutingTrace.load(_as_fifo(tmp / "fifo")), ValueError,
         "fifo' is a FIFO, not a regular file: refusing to read it"),
    Case("traces", "loading /dev/zero", lambda: traces.RoutingTrace.load("/dev/zero"), ValueError,
         "path '/dev/zero' is a character device, not a regular file"),
    Case("importers", "JSONL from a FIFO (blocked forever)",
         lambda tmp: importers.from_token_jsonl(_as_fifo(tmp / "fifo"), 4), ValueError,
         "fifo' is a FIFO, not a regular file: refusing to read it"),
    Case("importers", "layer CSV from /dev/zero (never ended)", lambda: importers.from_layer_csv("/dev/zero", 4),
         ValueError, "path '/dev/zero' is a character device, not a regular file"),
    Case("importers", "vLLM logs with a FIFO among them",
         lambda tmp: vllm_logs.from_vllm_moe_log([_vllm_layer(tmp, 0, [(0, "a")]), _as_fifo(tmp / "layer1.jsonl")],
                                                 4),
         ValueError, "layer1.jsonl' is a FIFO, not a regular file"),
    Case("importers", "vLLM routed experts from a FIFO (said: no such file)",
         lambda tmp: vllm_logs.from_vllm_routed_experts(_as_fifo(tmp / "r.npz"), 4), ValueError,
         "r.npz' is a FIFO, not a regular file"),
    cli("sweep replaying a FIFO", lambda tmp: ["sweep", "sparsity", "--routing", "trace", "--routing-trace",
                                               str(_as_fifo(tmp / "fifo")), "--out-dir", str(tmp / "out")],
        "fifo' is not a file", before=NO_MODELS),
    cli("sweep replaying /dev/zero", lambda tmp: ["sweep", "sparsity", "--routing", "trace", "--routing-trace",
                                                  "/dev/zero", "--out-dir", str(tmp / "out")],
        "routing_trace '/dev/zero' is not a file", before=NO_MODELS),
    # every importer error names the file and the line
    Case("importers", "vLLM logs of different K (named no file or line)",
         lambda tmp: _vllm_routes(tmp, {}, {"topk_ids": [0, 1, 2]}), ValueError,
         "layer0.jsonl:3: 3 experts per token where"),
    Case("importers", "layer CSV listing an expert twice on line 3 (named no line)",
         lambda tmp: importers.from_layer_csv(_write(tmp, "r.csv", b"layer_id,expert_ids\n0,1 2\n0,3 3\n"), 4),
         ValueError, "r.csv:3: expert_ids [3, 3] lists an expert twice"),
    Case("importers", "JSONL listing an expert twice (named no line)",
         lambda tmp: importers.from_token_jsonl(_lines(tmp, "t.jsonl", _token(), _token(0, 1, experts=(2, 2))), 4),
         ValueError, "t.jsonl:2: experts [2, 2] lists an expert twice"),
]


# The third round of bad input: one list per kind, each rule in its one home -------------------
# Kinds: resume (rows a resume keeps), bounds (sizes before work), fit-domain, paths, mid-sweep (failed writes),
# models (checks before a model is built or loaded), options (options with no effect), raw (raw exceptions).

_SNAPSHOTS: dict = {}


def _snapshot(tmp: Path, *names: str) -> None:
    """Remember the bytes of files ``names`` in ``tmp`` as a case's set-up left them (see :func:`_unchanged`)."""
    _SNAPSHOTS[tmp] = {name: (tmp / name).read_bytes() for name in names}


def _unchanged(case: Case) -> Case:
    """``case``, after which the files its set-up remembered (:func:`_snapshot`) must be as they were."""
    def call(tmp):
        try:
            case.call(tmp)
        finally:
            for name, data in _SNAPSHOTS.pop(tmp, {}).items():
                assert (tmp / name).read_bytes() == data, f"the refused call changed {name}"

    return case._replace(call=call)


class _Captured(Exception):
    """``moesd sweep`` reached check_sweep: ``args[0]`` is the SweepConfig it built."""


def _cli_config(argv: list) -> sweeps.SweepConfig:
    """The SweepConfig ``moesd <argv>`` builds, captured where check_sweep gets it (nothing is checked or run)."""
    def capture(config, *args, **options):
        raise _Captured(config)

    with mock.patch("moesd.measure.result_file.check_sweep", capture), \
            contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        try:
            moesd_cli.main(argv)
        except _Captured as captured:
            return captured.args[0]
    raise AssertionError(f"moesd {' '.join(argv)} did not reach check_sweep")


def _tiny_argv(tmp: Path, *changes, study: str = "e2e") -> list:
    """``moesd sweep`` of a tiny e2e study (two batch sizes, one gamma, two repeats) into ``tmp``."""
    return ["sweep", study, "--layers", "1", "--width", "0.03125", "--batch-sizes", "1", "3", "--gammas", "2",
            "--sigma", "0.9", "--context", "4", "--repeats", "2", "--rounds", "2", "--warmup-rounds", "1",
            "--dtype", "float32", "--out-dir", str(tmp), *changes]


def _e2e_row(config: sweeps.SweepConfig, **changes) -> dict:
    """A row of ``config``'s e2e-type study at its first point, with ``changes``."""
    row = {"run": 0, "batch_size": config.batch_sizes[0], "gamma": config.gammas[0],
           "num_experts_per_tok": config.top_k_values[0], "context": config.context, "seed": 1, "sigma_target": 0.9,
           "alpha": 0.89, "warmup_rounds": config.warmup_rounds, "rounds": config.rounds, "ar_steps": config.rounds,
           "t_ar": 0.02, "t_sd": 0.015, "t_target_1": 0.019, "t_target_gamma": 0.024, "t_draft": 0.01,
           "t_reject": 0.001, "sigma": 0.9, "accept_length": 2.7, "speedup": 1.3, "speedup_eq4": 1.3,
           "target_efficiency": 0.8, "activated_experts_1": 8.0, "activated_experts_gamma": 19.0}
    return {**row, **changes}


def _forward_row(config: sweeps.SweepConfig, **changes) -> dict:
    return {"num_experts_per_tok": config.top_k_values[0], "run": 0, "role": "target",
            "batch_size": config.batch_sizes[0], "tokens": 1, "context": config.context, "seconds": 0.01,
            "activated_experts": 8.0, **changes}


def _unfinished(tmp: Path, config: sweeps.SweepConfig, rows=None, text: str | None = None, name: str | None = None,
                sidecar: bool = True, complete: bool = False) -> Path:
    """An unfinished result file of ``config`` in ``tmp``: ``rows`` (dicts) or ``text``, and a sidecar of its
    settings (none if not ``sidecar``)."""
    import pandas as pd

    path = tmp / (name or f"{config.study}.csv")
    if text is None:
        pd.DataFrame(rows).to_csv(path, index=False)
    else:
        path.write_text(text)
    if sidecar:
        path.with_suffix(".json").write_text(json.dumps({"settings": config.settings(), "complete": complete,
                                                         "rows": len(rows or []), "command": "moesd sweep e2e"}))
    return path


_TINY = dict(_SWEEP, top_ks=(8,))
_FORWARD = dict(_SWEEP, study="forward", top_ks=(8,), rounds=None, warmup_rounds=None)


def _resume(tmp: Path, *rows, text: str | None = None, sidecar: bool = True, **changes):
    """``check_sweep`` (a resume's checks, before any model) of an unfinished file holding ``rows``: each a dict
    of changes to a good row of the study, or a full row (with ``full=True``)."""
    from moesd.measure.result_file import check_sweep

    config = sweeps.SweepConfig(**{**_TINY, **changes})
    make = _forward_row if config.study in sweeps.FORWARD_STUDIES else _e2e_row
    _unfinished(tmp, config, [make(config, **row) for row in rows] or None, text, sidecar=sidecar)
    return check_sweep(config, tmp)


def _resume_forward(tmp: Path, *rows):
    return _resume(tmp, *rows, **{k: v for k, v in _FORWARD.items() if k not in _TINY or _TINY[k] != v})


def _header_twice() -> str:
    """A result file whose header comes again as its second row (two files joined with ``cat``)."""
    import pandas as pd

    text = pd.DataFrame([_e2e_row(sweeps.SweepConfig(**_TINY))]).to_csv(index=False)
    return text + text.splitlines(keepends=True)[0]


def _cli_resume(*rows, text: str | None = None, changes=(), sidecar: bool = True):
    """``moesd sweep`` over an unfinished result file of the same command holding ``rows`` (changes to a good row)."""
    def argv(tmp):
        arguments = _tiny_argv(tmp, *changes)
        config = _cli_config(arguments)
        _unfinished(tmp, config, [_e2e_row(config, **row) for row in rows] or None, text, sidecar=sidecar)
        return arguments

    return argv


def _killed_overwrite(tmp: Path, *changes) -> list:
    """A finished e2e.csv beside the partial file of an --overwrite of the same command that was stopped."""
    arguments = _tiny_argv(tmp, *changes)
    config = _cli_config(arguments)
    finished = [_e2e_row(config, run=run, batch_size=batch) for run in (0, 1) for batch in (1, 3)]
    _unfinished(tmp, config, finished, complete=True)
    partial = _unfinished(tmp, config, finished[:1], name=".e2e.partial.csv")
    sidecar = json.loads(partial.with_suffix(".json").read_text())
    partial.with_suffix(".json").write_text(json.dumps({**sidecar, "command": shlex.join(["moesd", *arguments,
                                                                                          "--overwrite"])}))
    _snapshot(tmp, "e2e.csv", "e2e.json", ".e2e.partial.csv")
    return arguments


def _api_killed_overwrite(tmp: Path):
    from moesd.measure.result_file import check_sweep

    config = sweeps.SweepConfig(**_TINY)
    finished = [_e2e_row(config, run=run, batch_size=batch, gamma=gamma) for run in (0, 1) for batch in (1, 3)
                for gamma in (2, 3)]
    _unfinished(tmp, config, finished, complete=True)
    _unfinished(tmp, config, finished[:2], name=".e2e.partial.csv")
    _snapshot(tmp, "e2e.csv", "e2e.json", ".e2e.partial.csv")
    return check_sweep(config, tmp)


def _finished_with(tmp: Path, *extra):
    """``ResultFile.finish`` of a file holding every point of the tiny sweep and the ``extra`` rows."""
    from moesd.measure.protocol import sd_variants
    from moesd.measure.result_file import ResultFile

    config = sweeps.SweepConfig(**_TINY)
    keys = [v for run in range(2) for batch in (1, 3) for v in sd_variants(config, batch, 8, run)]
    result = ResultFile(_unfinished(tmp, config, [_e2e_row(config, **k) for k in keys]), config)
    for row in extra:  # rows no resume would keep: added as a buggy study would
        result.rows[("x", *row.values())] = _e2e_row(config, **row)
    return result.finish(keys)


_KEPT = "so its rows are not this sweep's to resume"

RESUMES = [
    # rows of another point, context or repeat: refused naming the file and the line, before any model is built
    Case("resume", "rows of another context (kept: ended complete)", lambda tmp: _resume(tmp, {"context": 99}),
         FileExistsError, "e2e.csv: line 2 has context 99, not one of this sweep's (8), " + _KEPT, True),
    Case("resume", "a run id outside repeats", lambda tmp: _resume(tmp, {"run": 7}), FileExistsError,
         "e2e.csv: line 2 has run 7, not one of this sweep's (0, 1)", True),
    Case("resume", "a negative run id", lambda tmp: _resume(tmp, {"run": -1}), FileExistsError,
         "line 2 has run -1, not one of this sweep's", True),
    Case("resume", "a run id as text", lambda tmp: _resume(tmp, {"run": "first"}), FileExistsError,
         "line 2 has run 'first', not one of this sweep's", True),
    Case("resume", "a fractional run id", lambda tmp: _resume(tmp, {"run": 0.5}), FileExistsError,
         "line 2 has run 0.5, not one of this sweep's", True),
    Case("resume", "a batch size the sweep does not run", lambda tmp: _resume(tmp, {"batch_size": 5}),
         FileExistsError, "line 2 has batch_size 5, not one of this sweep's (1, 3)", True),
    Case("resume", "a gamma the sweep does not run", lambda tmp: _resume(tmp, {"gamma": 7}), FileExistsError,
         "line 2 has gamma 7, not one of this sweep's (2, 3)", True),
    Case("resume", "another K", lambda tmp: _resume(tmp, {"num_experts_per_tok": 4}), FileExistsError,
         "line 2 has num_experts_per_tok 4, not one of this sweep's (8)", True),
    Case("resume", "other rounds", lambda tmp: _resume(tmp, {"rounds": 9}), FileExistsError,
         "line 2 has rounds 9, not one of this sweep's (2)", True),
    Case("resume", "other warm-up rounds", lambda tmp: _resume(tmp, {"warmup_rounds": 0}), FileExistsError,
         "line 2 has warmup_rounds 0, not one of this sweep's (1)", True),
    Case("resume", "the third row of another context", lambda tmp: _resume(tmp, {}, {"batch_size": 3},
                                                                           {"run": 1, "context": 16}),
         FileExistsError, "e2e.csv: line 4 has context 16", True),
    # columns, types and times
    Case("resume", "rows of another study (a forward study's rows in e2e.csv)",
         lambda tmp: _resume(tmp, text="num_experts_per_tok,run,role,batch_size,tokens,context,seconds\n"
                                       "8,0,target,1,1,8,0.1\n"), FileExistsError,
         "e2e.csv: the header lacks gamma, rounds, warmup_rounds, t_ar, t_sd, t_target_1, t_target_gamma, t_draft, "
         "t_reject of the e2e study's rows", True),
    Case("resume", "a missing run column", lambda tmp: _resume(tmp, text="batch_size,gamma\n1,2\n"), FileExistsError,
         "the header lacks run, num_experts_per_tok, context", True),
    Case("resume", "a time as text", lambda tmp: _resume(tmp, {"t_ar": "fast"}), FileExistsError,
         "e2e.csv: line 2 has t_ar 'fast', not a number of seconds > 0", True),
    Case("resume", "a negative time", lambda tmp: _resume(tmp, {"t_sd": -0.1}), FileExistsError,
         "line 2 has t_sd -0.1, not a number of seconds > 0", True),
    Case("resume", "a time of zero", lambda tmp: _resume(tmp, {"t_draft": 0}), FileExistsError,
         "line 2 has t_draft 0, not a number of seconds > 0", True),
    Case("resume", "an infinite time", lambda tmp: _resume(tmp, {"t_target_gamma": float("inf")}), FileExistsError,
         "line 2 has t_target_gamma inf, not a number of seconds > 0", True),
    Case("resume", "a second header (two files joined)", lambda tmp: _resume(tmp, text=_header_twice()),
         FileExistsError, "e2e.csv: line 3 has run 'run', not one of this sweep's", True),
    Case("resume", "an empty file", lambda tmp: _resume(tmp, text=""), FileExistsError,
         "e2e.csv: cannot be read as a result file (No columns to parse from file)", True),
    Case("resume", "control characters for a header", lambda tmp: _resume(tmp, text="\x00\x01,\x02\n\x03,\x04\n"),
         FileExistsError, "e2e.csv: the header lacks run, batch_size", True),
    Case("resume", "a forward study's role that is not a model", lambda tmp: _resume_forward(tmp, {"role": "verifier"}),
         FileExistsError, "forward.csv: line 2 has role 'verifier', not one of this sweep's (draft, target)", True),
    Case("resume", "a forward study's pass of other tokens", lambda tmp: _resume_forward(tmp, {"tokens": 9}),
         FileExistsError, "forward.csv: line 2 has tokens 9, not one of this sweep's (1, 2, 3, 4)", True),
    Case("resume", "a forward study's negative seconds", lambda tmp: _resume_forward(tmp, {"seconds": -1.0}),
         FileExistsError, "forward.csv: line 2 has seconds -1.0, not a number of seconds > 0", True),
    Case("resume", "rows of another context without their sidecar",
         lambda tmp: _resume(tmp, {"context": 99}, sidecar=False), FileExistsError,
         "e2e.json' does not exist; ", True),
    Case("resume", "a run outside repeats without a sidecar names the line",
         lambda tmp: _resume(tmp, {"run": 2}, sidecar=False), FileExistsError,
         "e2e.csv: line 2 has run 2, not one of this sweep's (0, 1)", True),
    # a stopped --overwrite: a plain rerun never replaces the finished file
    _unchanged(Case("resume", "a plain rerun after a killed overwrite (replaced the finished file)", _api_killed_overwrite,
               FileExistsError, ".e2e.partial.csv holds 2 row(s) of a sweep that was replacing e2e.csv (overwrite, "
               "--overwrite) and stopped part-way; e2e.csv keeps its rows until that sweep completes. Finish it with "
               "the same sweep with overwrite", True)),
    Case("resume", "complete only when the rows are exactly the points", lambda tmp: _finished_with(tmp, {"run": 5}),
         RuntimeError, "1 row(s) of points this sweep does not measure", True),
    # the same through the command line
    cli("sweep resuming rows of another context", _cli_resume({"context": 99}),
        "e2e.csv: line 2 has context 99, not one of this sweep's (4)", integration=True, stops=SWEEPING),
    cli("sweep resuming a run id outside --repeats", _cli_resume({"run": 2}),
        "e2e.csv: line 2 has run 2, not one of this sweep's (0, 1)", integration=True, stops=SWEEPING),
    cli("sweep resuming a batch size not in --batch-sizes", _cli_resume({"batch_size": 2}),
        "line 2 has batch_size 2, not one of this sweep's (1, 3)", integration=True, stops=SWEEPING),
    cli("sweep resuming a gamma not in --gammas", _cli_resume({"gamma": 4}),
        "line 2 has gamma 4, not one of this sweep's (2)", integration=True, stops=SWEEPING),
    cli("sweep resuming a time as text (crashed after the work)", _cli_resume({"t_ar": "fast"}),
        "line 2 has t_ar 'fast', not a number of seconds > 0", integration=True, stops=SWEEPING),
    cli("sweep resuming a negative time", _cli_resume({"t_reject": -1}),
        "line 2 has t_reject -1, not a number of seconds > 0", integration=True, stops=SWEEPING),
    cli("sweep resuming a second header", _cli_resume(text=_header_twice()),
        "line 3 has run 'run', not one of this sweep's", integration=True, stops=SWEEPING),
    cli("sweep resuming an empty file", _cli_resume(text=""), "e2e.csv: cannot be read as a result file",
        integration=True, stops=SWEEPING),
    cli("sweep resuming another study's rows", _cli_resume(text="run,role,batch_size,tokens,seconds\n0,draft,1,1,1\n"),
        "the header lacks num_experts_per_tok, context, gamma", integration=True, stops=SWEEPING),
    cli("sweep resuming other rounds without a sidecar", _cli_resume({"rounds": 5}, sidecar=False),
        "line 2 has rounds 5, not one of this sweep's (2)", integration=True, stops=SWEEPING),
    _unchanged(cli("sweep after a killed --overwrite (replaced the finished file)", _killed_overwrite,
              "e2e.csv keeps its rows until that sweep completes. Finish it with `moesd sweep e2e ", integration=True,
              stops=SWEEPING)),
]


def _sparse(tmp: Path, name: str, gib: float = 2.0, head: bytes = b"") -> Path:
    """A file of ``gib`` GiB that takes no disk (a hole after ``head``): larger than a reader takes whole."""
    path = tmp / name
    with open(path, "wb") as file:
        file.write(head)
        file.truncate(int(gib * 2**30))
    return path


def _declaring(tmp: Path, name: str = "x.npz", shape=(10**11, 1, 2), holds: int = 64, **arrays) -> Path:
    """An ``.npz`` whose ``experts`` member declares ``shape`` of int64 but holds ``holds`` bytes after its header."""
    import zipfile

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<i8", "fortran_order": False, "shape": shape})
    with zipfile.ZipFile(tmp / name, "w") as archive:
        archive.writestr("experts.npy", header.getvalue() + b"\0" * holds)
        for key, value in {"num_experts": np.int64(8), **arrays}.items():
            buffer = io.BytesIO()
            np.save(buffer, value)
            archive.writestr(f"{key}.npy", buffer.getvalue())
    return tmp / name


def _unpacking(tmp: Path):
    """``load_prompts`` of the gzipped HumanEval excerpt with what a file may unpack to set below what it unpacks to
    (a gzip bomb, without writing one)."""
    with mock.patch("moesd.routing.prompts.MAX_READ_BYTES", 1_000):
        return load_prompts("humaneval", HUMANEVAL)


def _trace_2x4() -> traces.RoutingTrace:
    return traces.RoutingTrace(np.tile(np.array([0, 1]), (50, 3, 1)), 8)


def _checkpoint(tmp: Path, name: str, config: dict | str, folder: str | None = None) -> str:
    """A folder ``tmp/<folder or role>`` whose config.json holds ``config`` (a dict written as JSON, or text)."""
    path = tmp / (folder or name)
    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    return str(path)


def _zoo_checkpoint(tmp: Path, model: str, role: str, **changes) -> str:
    from moesd.zoo import get_model

    spec = get_model(model)
    return _checkpoint(tmp, role, {**spec.config_dict(num_layers=1, width=1 / 16), "model_type": spec.model_type,
                                   **changes})


def _pretrained(tmp: Path, target=None, draft=None, **changes):
    """A pretrained sweep of local folders of Qwen3 shapes (``target``, ``draft``: config changes or text)."""
    folders = {}
    for role, model, config in (("target", "qwen3-30b-a3b", target), ("draft", "qwen3-0.6b", draft)):
        folders[f"{role}_path"] = (_checkpoint(tmp, role, config) if isinstance(config, str)
                                   else _zoo_checkpoint(tmp, model, role, **(config or {})))
    return sweeps.SweepConfig(**{"study": "e2e", "target": "qwen3-30b-a3b", "draft": "qwen3-0.6b",
                                 "weights": "pretrained", "batch_sizes": (1,), "gammas": (2,), "context": 8,
                                 "rounds": 1, "warmup_rounds": 0, "repeats": 1, **folders, **changes})


def _random_trace_cli(*changes, model="olmoe-1b-7b"):
    return lambda tmp: ["trace", "--random-weights", "--model", model, "--prompts", "gsm8k", "--prompt-source",
                        str(GSM8K_FOLDER), "--out", str(tmp / "x.npz"), *changes]


BOUNDS = [
    # rows of a sweep: counted before any work, with the count
    Case("bounds", "a billion repeats (ran until stopped)", lambda: _sweep(repeats=10**9), UsageError,
         "repeats 1000000000 x 1 K x 2 batch sizes x 2 gammas x 1 workload(s) make 4000000000 rows, more than the "
         "20000 a result file holds"),
    Case("bounds", "a forward study of a million repeats", lambda: _sweep(study="forward", repeats=10**6, rounds=None,
                                                                         warmup_rounds=None), UsageError,
         "x 2 gammas x 2 models make 16000000 rows, more than the 20000"),
    Case("bounds", "ten thousand batch sizes", lambda: _sweep(batch_sizes=tuple(range(1, 10_001))), UsageError,
         "10000 batch sizes x 2 gammas x 1 workload(s) make 40000 rows"),
    Case("bounds", "a sparsity study of every K over many repeats", lambda: _sweep(top_ks=tuple(range(1, 65)),
                                                                                  repeats=100), UsageError,
         "repeats 100 x 64 K x 2 batch sizes x 2 gammas x 1 workload(s) make 25600 rows"),
    # positions: from the config, or the architecture's default where the config names none
    Case("bounds", "a context beyond Qwen2-MoE's default positions (no max_position_embeddings)",
         lambda: _sweep(context=10**6), UsageError,
         "context, rounds and gammas make a sequence reach 1000016 positions, more than the 32768 of qwen2-57b-a14b"),
    Case("bounds", "rounds beyond OLMoE's 4096 positions",
         lambda: _sweep(target="olmoe-1b-7b", layers=None, rounds=2000, top_ks=None), UsageError,
         "reach 8016 positions, more than the 4096 of olmoe-1b-7b"),
    Case("bounds", "a forward study's gamma beyond DeepSeek-V2-Lite's 2048 positions",
         lambda: _sweep(study="forward", target="deepseek-v2-lite", layers=2, gammas=(3000,), rounds=None,
                        warmup_rounds=None), UsageError, "reach 3009 positions, more than the 2048 of deepseek-v2-lite"),
    Case("bounds", "a context beyond the draft's positions", lambda: _sweep(target="mixtral-8x7b", draft="opt-350m",
                                                                           context=3000, layers=1), UsageError,
         "more than the 2048 of opt-350m"),
    Case("bounds", "a context beyond a local checkpoint's own positions",
         lambda tmp: _pretrained(tmp, target={"max_position_embeddings": 64}, context=100), UsageError,
         "reach 106 positions, more than the 64 of qwen3-30b-a3b"),
    # samples of the union statistics
    Case("bounds", "ten billion random-union samples", lambda: unions.random_union(_trace_2x4(), 2, samples=10**10),
         UsageError, "10000000000 samples of 2 tokens would need about 820 GiB of memory, more than the 4 GiB"),
    Case("bounds", "ten billion verification samples", lambda: unions.verify_union(_trace_2x4(), 1, 2, samples=10**10),
         UsageError, "10000000000 samples of 1 sequences x 2 tokens would need about"),
    Case("bounds", "zero samples", lambda: unions.random_union(_trace_2x4(), 2, samples=0), UsageError,
         "samples must be a whole number >= 1, got 0"),
    Case("bounds", "fractional samples", lambda: unions.verify_union(_trace_2x4(), 1, 2, samples=2.5), UsageError,
         "samples must be a whole number >= 1, got 2.5"),
    Case("bounds", "measured loads of ten billion samples",
         lambda: _activated(_trace_2x4(), 1, 2, model="measured", samples=10**10), UsageError,
         "10000000000 samples of 1 sequences x 2 tokens"),
    # archives that declare more than they hold, files larger than a reader takes whole
    Case("bounds", "a trace declaring 10**11 tokens in 64 bytes (numpy allocated them)",
         lambda tmp: traces.RoutingTrace.load(_declaring(tmp)), ValueError,
         "x.npz: not a valid routing trace: member experts.npy declares shape (100000000000, 1, 2) of int64 "
         "(1600000000000 bytes) but holds"),
    Case("bounds", "arrays declaring more than the memory bound",
         lambda tmp: npz_arrays(_declaring(tmp, shape=(8, 1, 2), holds=128), limit=64), ValueError,
         "its arrays declare"),
    Case("bounds", "vLLM routed experts declaring more than they hold",
         lambda tmp: vllm_logs.from_vllm_routed_experts(
             _declaring(tmp, "routed.npz", rows=np.array([1]), prompt_tokens=np.array([1]),
                        output_tokens=np.array([0]), request_id=np.array(["a"]))), ValueError,
         "routed.npz: not a file written by save_vllm_routed_experts: member experts.npy declares shape"),
    Case("bounds", "a 2 GiB result file (read whole)", lambda tmp: measurements.read_rows(_sparse(tmp, "e2e.csv")),
         ValueError, "e2e.csv' holds 2 GiB, more than the 1 GiB a file read whole may hold"),
    Case("bounds", "a 2 GiB sidecar", lambda tmp: measurements.read_sidecar(_sparse(tmp, "e2e.json")), ValueError,
         "e2e.json' holds 2 GiB, more than the 1 GiB"),
    Case("bounds", "a 2 GiB trace", lambda tmp: traces.RoutingTrace.load(_sparse(tmp, "t.npz", head=b"PK\x03\x04")),
         ValueError, "t.npz' holds 2 GiB"),
    Case("bounds", "a 2 GiB token JSONL", lambda tmp: importers.from_token_jsonl(_sparse(tmp, "t.jsonl"), 4),
         ValueError, "t.jsonl' holds 2 GiB"),
    Case("bounds", "a 2 GiB layer CSV", lambda tmp: importers.from_layer_csv(_sparse(tmp, "r.csv"), 4), ValueError,
         "r.csv' holds 2 GiB"),
    Case("bounds", "a 2 GiB vLLM log", lambda tmp: vllm_logs.from_vllm_moe_log(_sparse(tmp, "layer0.jsonl"), 4),
         ValueError, "layer0.jsonl' holds 2 GiB"),
    Case("bounds", "a 2 GiB prompt file", lambda tmp: load_prompts("gsm8k", _sparse(tmp, "test.jsonl")), ValueError,
         "test.jsonl' holds 2 GiB"),
    Case("bounds", "a gzip prompt file that unpacks to more than 1 GiB (read whole)",
         _unpacking, ValueError,
         "HumanEval.jsonl.gz: unpacks to more than"),
    # predict's context against the positions a model's config names
    Case("bounds", "a deployment's context past OPT's 2048 positions", lambda: Setup("opt-30b", "opt-350m", "H100",
                                                                                      context=5000), UsageError,
         "context: 5000 tokens in each KV cache and the token a step adds pass the 2048 positions of opt-30b"),
    Case("bounds", "a context past the positions of a config.json", lambda tmp: Setup(
        str(Path(_checkpoint(tmp, "target", {**_zoo("qwen3-30b-a3b").config_dict(), "model_type": "qwen3_moe",
                                             "max_position_embeddings": 64})) / "config.json"),
        "qwen3-0.6b", "H100", context=100), UsageError, "pass the 64 positions of"),
    # the same through the command line
    cli("predict at a context past OPT's positions (priced a cache it cannot hold)",
        ["predict", "--target", "opt-30b", "--draft", "opt-350m", "--hardware", "H100", "--context", "5000"],
        "--context: 5000 tokens in each KV cache and the token a step adds pass the 2048 positions of opt-30b"),
    cli("predict at a context of exactly OPT's positions", ["predict", "--target", "opt-30b", "--draft", "opt-350m",
                                                           "--hardware", "H100", "--context", "2048"],
        "--context: 2048 tokens in each KV cache"),
    cli("sweep of a billion repeats (ran until stopped)", _sweep_argv("e2e", "--repeats", "1000000000"),
        "--repeats 1000000000 x 1 K x 10 batch sizes x 3 gammas x 1 workload(s) make 30000000000 rows, more than the "
        "20000", before=NO_MODELS),
    cli("sweep of a million-token context on Qwen2-MoE (its config names no positions)",
        _sweep_argv("e2e", "--context", "1000000"), "more than the 32768 of qwen2-57b-a14b", before=NO_MODELS),
    cli("sweep of rounds past the positions", _sweep_argv("e2e", "--rounds", "10000"),
        "reach 50014 positions, more than the 32768 of qwen2-57b-a14b; lower context or rounds", before=NO_MODELS),
    cli("forward sweep of a gamma past the positions", _sweep_argv("forward", "--gammas", "40000"),
        "reach 40009 positions, more than the 32768 of qwen2-57b-a14b", before=NO_MODELS),
    cli("sweep of 3000 batch sizes", _sweep_argv("e2e", "--batch-sizes", *map(str, range(1, 3001))),
        "make 45000 rows, more than the 20000", before=NO_MODELS),
    cli("random-weight trace past OLMoE's positions", _random_trace_cli("--max-new-tokens", "5000"),
        "--max-new-tokens 5000 after prompts of up to", integration=True, stops=TRACING),
    cli("random-weight trace of DeepSeek-V2-Lite past its 2048 positions",
        _random_trace_cli("--max-new-tokens", "2000", model="deepseek-v2-lite"), "more than the model's 2048",
        integration=True, stops=TRACING),
    cli("trace of a saved model of 16 positions",
        _trace_argv(model=lambda tmp: _saved_model(tmp, '{"model_type": "qwen2_moe", "max_position_embeddings": 16}')),
        "--max-new-tokens 128 after prompts of up to 0 tokens reaches 128 positions, more than the model's 16",
        before=NO_MODELS),
    cli("fit of a 2 GiB result file", lambda tmp: ["fit", str(_sparse(tmp, "e2e.csv"))],
        "e2e.csv' holds 2 GiB, more than the 1 GiB"),
    cli("fit of a result file whose sidecar is 2 GiB",
        lambda tmp: _result_file(tmp) and _sparse(tmp, "sparsity.json") and ["fit", str(tmp / "sparsity.csv")],
        "sparsity.json' holds 2 GiB"),
    cli("sweep replaying a trace that declares more than it holds",
        lambda tmp: ["sweep", "sparsity", "--routing", "trace", "--routing-trace", str(_declaring(tmp)), "--out-dir",
                     str(tmp / "out")], "declares shape (100000000000, 1, 2)", before=NO_MODELS),
]


def _with_labels(*labels: str):
    """An edit of a result file's text adding a ``dataset`` column: ``labels[i]`` on data row i, the first
    label on the others."""
    def edit(text: str) -> str:
        lines = text.splitlines(keepends=True)
        rows = [line.rstrip("\n") + f",{labels[i] if i < len(labels) else labels[0]}\n"
                for i, line in enumerate(lines[1:])]
        return lines[0].rstrip("\n") + ",dataset\n" + "".join(rows)
    return edit


def _run_cells(value):
    """An edit setting the ``run`` cell of data row 3 (line 5) to ``value``."""
    def edit(text: str) -> str:
        lines = text.splitlines(keepends=True)
        lines[4] = f"{value}," + lines[4].split(",", 1)[1]
        return "".join(lines)
    return edit


def _ridge_sidecar(peak_flops: float, memory_bandwidth: float) -> dict:
    return _sidecar_hardware(peak_flops=peak_flops, memory_bandwidth=memory_bandwidth)


FIT_DOMAIN = [
    # the points' domain: whole batch sizes, gammas, K and runs, within bounds, named by file and line
    Case("fit-domain", "fit API of a fractional batch size (fitted)", lambda tmp: _read_file(tmp, B=2.5), ValueError,
         "sparsity.csv: line 5, column batch_size is 2.5, not a whole number in [1, 1048576]"),
    Case("fit-domain", "fit API of a batch size of 1e15", lambda tmp: _read_file(tmp, B=1e15), ValueError,
         "line 5, column batch_size is 1000000000000000.0, not a whole number in [1, 1048576]"),
    Case("fit-domain", "fit API of a batch size of 1e300 (overflowed inside the fit)",
         lambda tmp: _read_file(tmp, B=1e300), ValueError, "line 5, column batch_size is 1e+300, not a whole number"),
    Case("fit-domain", "fit API of a fractional gamma", lambda tmp: _read_file(tmp, gamma=2.5), ValueError,
         "line 5, column gamma is 2.5, not a whole number in [1, 1024]"),
    Case("fit-domain", "fit API of a gamma of 5000", lambda tmp: _read_file(tmp, gamma=5000), ValueError,
         "line 5, column gamma is 5000, not a whole number in [1, 1024]"),
    Case("fit-domain", "fit API of a fractional K", lambda tmp: _read_file(tmp, K=1.5), ValueError,
         "line 5, column num_experts_per_tok is 1.5, not a whole number >= 1"),
    Case("fit-domain", "fit API of a fractional run", lambda tmp: _read_file(tmp, edit=_run_cells("0.5")), ValueError,
         "line 5, column run is 0.5, not a whole number >= 0"),
    Case("fit-domain", "fit API of a run as text", lambda tmp: _read_file(tmp, edit=_run_cells("first")), ValueError,
         "line 5, column run is 'first', not a whole number >= 0"),
    Case("fit-domain", "fit API of a negative run", lambda tmp: _read_file(tmp, edit=_run_cells("-1")), ValueError,
         "line 5, column run is -1, not a whole number >= 0"),
    # the sidecar's row count against the CSV
    Case("fit-domain", "a sidecar promising more rows than the file holds",
         lambda tmp: _read_file(tmp, sidecar={**_sidecar(), "rows": 96}), ValueError,
         "sparsity.csv holds 48 rows but its sidecar (sparsity.json) says the finished sweep wrote 96: rows were lost"),
    Case("fit-domain", "a sidecar promising fewer rows than the file holds",
         lambda tmp: _read_file(tmp, sidecar={**_sidecar(), "rows": 40}), ValueError,
         "holds 48 rows but its sidecar (sparsity.json) says the finished sweep wrote 40"),
    # labels that differ only by what no one sees
    Case("fit-domain", "a label with a zero-width space", lambda tmp: _read_file(tmp, edit=_with_labels(
        "humaneval", "humaneval\u200b")), ValueError,
         "sparsity.csv: line 3, column dataset holds 'humaneval\\u200b', with U+200B (ZERO WIDTH SPACE) that no one "
         "sees"),
    Case("fit-domain", "a label with a trailing space", lambda tmp: _read_file(tmp, edit=_with_labels(
        "humaneval", "humaneval ")), ValueError, "line 3, column dataset holds 'humaneval ', with a space at its end"),
    Case("fit-domain", "a label with a non-breaking space", lambda tmp: _read_file(tmp, edit=_with_labels(
        "mt bench", "mt\u00a0bench")), ValueError, "with U+00A0 (NO-BREAK SPACE) that no one sees"),
    Case("fit-domain", "a label with a bell character", lambda tmp: _read_file(tmp, edit=_with_labels(
        "humaneval", "human\aeval")), ValueError, "with U+0007 (unnamed) that no one sees"),
    Case("fit-domain", "labels differing only in case", lambda tmp: _read_file(tmp, edit=_with_labels(
        "humaneval", "HumanEval")), ValueError,
         "line 3, column dataset holds 'HumanEval' and line 2 'humaneval', which differ only in case or Unicode form"),
    Case("fit-domain", "labels differing only in Unicode form (fullwidth letters)",
         lambda tmp: _read_file(tmp, edit=_with_labels("gsm8k", "\uff47sm8k")), ValueError,
         "which differ only in case or Unicode form"),
    # a fitting frame given directly
    Case("fit-domain", "a frame with a fractional B", lambda: check_measurements(_frame(B=2.5)), ValueError,
         "B must be a whole number in [1, 1048576]: column B holds 2.5 (row 3)"),
    Case("fit-domain", "a frame with B of ten million", lambda: check_measurements(_frame(B=10**7)), ValueError,
         "B must be a whole number in [1, 1048576]: column B holds 1e+07 (row 3)"),
    Case("fit-domain", "a frame with a gamma of 2000", lambda: check_measurements(_frame(gamma=2000)), ValueError,
         "gamma must be a whole number in [1, 1024]: column gamma holds 2000 (row 3)"),
    Case("fit-domain", "a frame with a fractional K", lambda: check_measurements(_frame(K=1.5)), ValueError,
         "K must be a whole number in [1, 2^53): column K holds 1.5 (row 3)"),
    Case("fit-domain", "a frame with E of 1e300", lambda: check_measurements(_frame(E=1e300)), ValueError,
         "E must be a whole number in [1, 2^53): column E holds 1e+300 (row 3)"),
    Case("fit-domain", "fitting a fractional B (fitted)", lambda: fit.fit_speedup_model(_frame(B=2.5), 40.0),
         ValueError, "B must be a whole number in [1, 1048576]"),
    Case("fit-domain", "fitting 200000 measurements (ran for hours)",
         lambda: fit.fit_speedup_model(_frame().sample(200_000, replace=True, random_state=0).reset_index(drop=True),
                                       40.0), ValueError,
         "measurements hold 200000 rows, more than the 100000 a fit takes"),
    cli("fit of 100001 points (ran for hours)", lambda tmp: _result_file(tmp) and _write(tmp, "sparsity.csv", (
        "run,batch_size,gamma,num_experts_per_tok,sigma,speedup\n"
        + "".join(f"0,{b},2,1,0.9,1.5\n" for b in range(1, 100_002))).encode()) and ["fit", str(tmp / "sparsity.csv")],
        "measurements hold 100001 rows, more than the 100000 a fit takes"),
    # a bandwidth or a peak that makes the ridge point vanish or overflow
    Case("fit-domain", "a sidecar whose ridge point underflows to 0",
         lambda: analysis.ridge_tokens_for(_ridge_sidecar(1e-300, 1e300)), ValueError,
         "hardware.peak_flops / hardware.memory_bandwidth, the ridge point, is 0 FLOP/byte for 1e-300 FLOP/s over "
         "1e+300 bytes/s: not a number a float holds"),
    Case("fit-domain", "a sidecar whose ridge point overflows", lambda: analysis.ridge_tokens_for(
        _ridge_sidecar(1e300, 1e-300)), ValueError, "the ridge point, is inf FLOP/byte"),
    # through the command line
    cli("fit of a fractional batch size (fitted)", _fit_file(B=2.5),
        "sparsity.csv: line 5, column batch_size is 2.5, not a whole number in [1, 1048576]"),
    cli("fit of a batch size of 1e15 (fitted)", _fit_file(B=1e15), "column batch_size is 1000000000000000.0"),
    cli("fit of a batch size of 1e300 (overflow warnings)", _fit_file(B=1e300), "column batch_size is 1e+300"),
    cli("fit of a fractional gamma", _fit_file(gamma=2.5), "line 5, column gamma is 2.5, not a whole number"),
    cli("fit of a fractional K", _fit_file(K=1.5), "line 5, column num_experts_per_tok is 1.5"),
    cli("fit of a run as text (averaged as another run)", _fit_file(_run_cells("zero")),
        "line 5, column run is 'zero', not a whole number >= 0"),
    cli("fit of a sidecar promising 96 rows of 48 (fitted)", _fit_file(sidecar={**_sidecar(), "rows": 96}),
        "holds 48 rows but its sidecar (sparsity.json) says the finished sweep wrote 96"),
    cli("fit of labels that differ by a zero-width space", _fit_file(_with_labels("humaneval", "humaneval\u200b")),
        "line 3, column dataset holds 'humaneval\\u200b', with U+200B (ZERO WIDTH SPACE)"),
    cli("fit of labels that differ only in case", _fit_file(_with_labels("humaneval", "HumanEval")),
        "which differ only in case or Unicode form"),
    cli("fit of a bandwidth that makes the ridge point vanish (fitted at rp 0)",
        _fit_file(sidecar=_ridge_sidecar(1e-300, 1e300)), "the ridge point, is 0 FLOP/byte"),
    cli("fit of a peak that makes the ridge point infinite", _fit_file(sidecar=_ridge_sidecar(1e300, 1e-300)),
        "the ridge point, is inf FLOP/byte"),
    cli("fit with --E of 10**20 (said num_experts)", _fit_argv("--E", str(10**20)),
        "--E must be a whole number >= 1 below 2^53"),
    cli("fit with --stride of 10**20 (said stride)", _fit_argv("--stride", str(10**20)),
        "--stride must be a whole number >= 1 below 2^53"),
]


def _output_path(name: str, path):
    from moesd._checks import output_path

    return output_path(name, path)


def _writable_folder(name: str, path):
    from moesd._checks import writable_folder

    return writable_folder(name, path)


def _loop(tmp: Path, name: str = "loop") -> Path:
    """A symbolic link that points at itself."""
    (tmp / name).symlink_to(tmp / name)
    return tmp / name


_LONG = "x" * 300  # a name longer than any file system takes (255 bytes)


def _too_deep(tmp: Path) -> Path:
    """A path longer than the system takes (PATH_MAX, 4096 bytes), each name short enough."""
    return tmp.joinpath(*["y" * 200] * 25, "x.csv")


def _linked_to(tmp: Path, target: str) -> Path:
    (tmp / "link").symlink_to(target)
    return tmp / "link"


_MEASURING = (("moesd.measure.hardware", "measure_roofline"),)
_REGIME = (("moesd.measure.regime", "regime_check"),)

PATHS = [
    # one rule for every output path (moesd._checks.output_path): checked before any work
    Case("paths", "an empty output path", lambda: _outputs(csv=""), UsageError, "--csv is '': give a path"),
    Case("paths", "a blank output path", lambda: _outputs(plot="  "), UsageError, "--plot is '  ': give a path"),
    Case("paths", "an output path of None", lambda: _output_path("--out", None), UsageError,
         "--out is None: give a path"),
    Case("paths", "/dev/null as an output file", lambda: _outputs(csv="/dev/null"), UsageError,
         "--csv '/dev/null' is a device or another program's open file (/dev/null)"),
    Case("paths", "/dev/stdout as an output file (renamed over a redirected file)", lambda: _outputs(csv="/dev/stdout"),
         UsageError, "--csv '/dev/stdout' is a device or another program's open file"),
    Case("paths", "a process's open file as an output file", lambda: _outputs(json="/proc/self/fd/1"), UsageError,
         "--json '/proc/self/fd/1' is a device or another program's open file"),
    Case("paths", "a link to a device as an output file", lambda tmp: _outputs(csv=_linked_to(tmp, "/dev/null")),
         UsageError, "link' is a device or another program's open file (/dev/null)"),
    Case("paths", "a symbolic link loop as an output file", lambda tmp: _outputs(csv=_loop(tmp)), UsageError,
         "loop' cannot be a path: a loop of symbolic links"),
    Case("paths", "a file inside a symbolic link loop", lambda tmp: _outputs(plot=_loop(tmp) / "x.png"), UsageError,
         "cannot be a path: a loop of symbolic links"),
    Case("paths", "an output name too long", lambda tmp: _outputs(csv=tmp / _LONG), UsageError,
         "cannot be a path: a name too long for the file system"),
    Case("paths", "an output path too long", lambda tmp: _outputs(csv=_too_deep(tmp)), UsageError,
         "cannot be a path: a name too long for the file system"),
    Case("paths", "an output file under a file", lambda tmp: _outputs(csv=_write(tmp, "f", b"") / "x.csv"), UsageError,
         "cannot be a path: Not a directory"),
    Case("paths", "an output folder that is a loop", lambda tmp: _writable_folder("--out-dir", _loop(tmp)),
         UsageError, "loop' cannot be a path: a loop of symbolic links"),
    Case("paths", "an output folder name too long", lambda tmp: _writable_folder("--out-dir", tmp / _LONG),
         UsageError, "cannot be a path: a name too long for the file system"),
    Case("paths", "a sweep into a loop (failed after the first point)", lambda tmp: _checked_sweep(_loop(tmp)),
         UsageError, "loop' cannot be a path: a loop of symbolic links", True),
    Case("paths", "saving a trace into a loop", lambda tmp: _trace().save(_loop(tmp) / "t.npz"), ValueError,
         "t.npz cannot be written: a loop of symbolic links"),
    Case("paths", "saving a trace under a name too long", lambda tmp: _trace().save(tmp / _LONG), ValueError,
         "cannot be written: a name too long for the file system"),
    Case("paths", "reading a trace through a loop", lambda tmp: traces.RoutingTrace.load(_loop(tmp)), ValueError,
         "loop' cannot be read: a loop of symbolic links"),
    Case("paths", "reading a result file of a name too long", lambda tmp: measurements.read_rows(tmp / _LONG),
         ValueError, "cannot be read: a name too long for the file system"),
    Case("paths", "prompts through a loop", lambda tmp: load_prompts("gsm8k", _loop(tmp)), ValueError,
         "loop' cannot be read: a loop of symbolic links"),
    # every output flag of the command line
    cli("sweep --out-dir a symbolic link loop (passed, failed after the first point)",
        lambda tmp: _sweep_argv("e2e")(tmp)[:-1] + [str(_loop(tmp))], "loop' cannot be a path: a loop", integration=True,
        stops=SWEEPING),
    cli("sweep --out-dir inside a loop", lambda tmp: _sweep_argv("e2e")(tmp)[:-1] + [str(_loop(tmp) / "out")],
        "cannot be a path: a loop of symbolic links", integration=True, stops=SWEEPING),
    cli("sweep --out-dir of a name too long", lambda tmp: _sweep_argv("e2e")(tmp)[:-1] + [str(tmp / _LONG)],
        "cannot be a path: a name too long", integration=True, stops=SWEEPING),
    cli("sweep --out-dir /dev/null", lambda tmp: _sweep_argv("e2e")(tmp)[:-1] + ["/dev/null"],
        "is a device or another program's open file", integration=True, stops=SWEEPING),
    cli("trace --out a symbolic link loop", lambda tmp: _random_trace_cli()(tmp)[:-1] + [str(_loop(tmp))],
        "loop' cannot be a path: a loop of symbolic links", before=NO_MODELS),
    cli("trace --out of a name too long", lambda tmp: _random_trace_cli()(tmp)[:-1] + [str(tmp / (_LONG + ".npz"))],
        "x.npz' cannot be a path: a name too long", before=NO_MODELS),
    cli("trace --out a path too long", lambda tmp: _random_trace_cli()(tmp)[:-1] + [str(_too_deep(tmp))],
        "cannot be a path: a name too long", before=NO_MODELS),
    cli("trace --out /dev/stdout", lambda tmp: _random_trace_cli()(tmp)[:-1] + ["/dev/stdout"],
        "--out '/dev/stdout' is a device or another program's open file", before=NO_MODELS),
    cli("predict --csv a symbolic link loop", lambda tmp: _predict_argv("--csv", str(_loop(tmp))),
        "loop' cannot be a path: a loop of symbolic links", stops=_PREDICTING),
    cli("predict --csv of a name too long", lambda tmp: _predict_argv("--csv", str(tmp / (_LONG + ".csv"))),
        "cannot be a path: a name too long", stops=_PREDICTING),
    cli("predict --plot of a name too long", lambda tmp: _predict_argv("--plot", str(tmp / (_LONG + ".png"))),
        "x.png' cannot be a path: a name too long", stops=_PREDICTING),
    cli("predict --plot inside a loop", lambda tmp: _predict_argv("--plot", str(_loop(tmp) / "x.png")),
        "cannot be a path: a loop of symbolic links", stops=_PREDICTING),
    cli("predict --csv /dev/stdout (renamed over the file stdout went to)", _predict_argv("--csv", "/dev/stdout"),
        "--csv '/dev/stdout' is a device or another program's open file", stops=_PREDICTING),
    cli("predict --csv /proc/self/fd/2", _predict_argv("--csv", "/proc/self/fd/2"),
        "--csv '/proc/self/fd/2' is a device or another program's open file", stops=_PREDICTING),
    cli("predict --csv a link to /dev/null", lambda tmp: _predict_argv("--csv", str(_linked_to(tmp, "/dev/null"))),
        "is a device or another program's open file (/dev/null)", stops=_PREDICTING),
    cli("hardware --measure --json a loop", lambda tmp: ["hardware", "--measure", "--json", str(_loop(tmp))],
        "loop' cannot be a path: a loop of symbolic links", stops=_MEASURING),
    cli("hardware --regime --json of a name too long",
        lambda tmp: ["hardware", "--regime", "--json", str(tmp / (_LONG + ".json"))],
        "cannot be a path: a name too long", stops=_REGIME),
    cli("hardware --measure --json /dev/stdout", ["hardware", "--measure", "--json", "/dev/stdout"],
        "--json '/dev/stdout' is a device or another program's open file", stops=_MEASURING),
    cli("fit of a symbolic link loop (said no such file)", lambda tmp: ["fit", str(_loop(tmp))],
        "loop' cannot be read: a loop of symbolic links"),
    cli("fit of a name too long (said no such file)", lambda tmp: ["fit", str(tmp / (_LONG + ".csv"))],
        "cannot be read: a name too long for the file system"),
    cli("trace --prompt-source a loop", lambda tmp: _random_trace_cli()(tmp)[:6] + [
        "--prompt-source", str(_loop(tmp)), "--out", str(tmp / "x.npz")], "loop' cannot be read: a loop of symbolic "
        "links", integration=True, stops=TRACING),
    cli("sweep --routing-trace a loop", lambda tmp: ["sweep", "sparsity", "--routing", "trace", "--routing-trace",
                                                     str(_loop(tmp)), "--out-dir", str(tmp / "out")],
        "loop' is not a file (a loop of symbolic links)", before=NO_MODELS),
]


class CommandFailed(Exception):
    """``moesd`` exited with status 1 after one line on stderr (what failed, what was kept, how to resume)."""


def _write_failing(error: OSError, after: int):
    """A patch of the result file's writes: the first ``after`` succeed, then each raises ``error``."""
    from moesd.measure import result_file

    real, calls = result_file.atomic_write, []

    def failing(path, mode="wb"):
        calls.append(path)
        if len(calls) > after:
            raise error
        return real(path, mode)

    return mock.patch.object(result_file, "atomic_write", failing)


def _failed_sweep(error: OSError, after: int, *changes, rows: int | None = None):
    """``moesd sweep`` of a tiny e2e study whose writes fail after ``after``; it must exit 1 with one line, and
    its result file keep the ``rows`` that line says (checked against the file)."""
    def call(tmp):
        import pandas as pd

        argv = ["sweep", "e2e", "--layers", "1", "--width", "0.03125", "--batch-sizes", "1", "2", "--gammas", "2",
                "--sigma", "0.9", "--context", "4", "--repeats", "1", "--rounds", "1", "--warmup-rounds", "1",
                "--dtype", "float32", "--out-dir", str(tmp), *changes]
        if "--overwrite" in changes:  # a finished file the overwrite replaces
            assert moesd_cli.main([a for a in argv if a != "--overwrite"]) == 0
        stderr = io.StringIO()
        with _write_failing(error, after), mock.patch("sys.argv", ["moesd", *argv]), \
                contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            try:
                moesd_cli.main(argv)
            except SystemExit as stop:
                lines = [line for line in stderr.getvalue().replace("\r", "\n").splitlines() if line.strip()]
                assert stop.code == 1 and "Traceback" not in stderr.getvalue(), stderr.getvalue()
                line = lines[-1]
                written = tmp / (".e2e.partial.csv" if "--overwrite" in changes else "e2e.csv")
                kept = len(pd.read_csv(written)) if written.exists() else 0
                assert f"it keeps its {kept} row(s)" in line, (line, kept)
                raise CommandFailed(line) from None
        raise AssertionError("the sweep did not fail")

    return Case("mid-sweep", f"sweep failing with {error.strerror} after {after} write(s)" + (
        f" ({' '.join(changes)})" if changes else ""), call, CommandFailed, "", True)


def _failing_result_file(tmp: Path, error: OSError, after: int, finish: bool = False):
    """``ResultFile.add`` of the tiny sweep's points in two halves (or ``finish`` of all of them) whose writes
    fail after ``after``."""
    from moesd.measure.protocol import sd_variants
    from moesd.measure.result_file import ResultFile, _key

    config = sweeps.SweepConfig(**_TINY)
    result = ResultFile(tmp / "e2e.csv", config)
    keys = [v for run in range(2) for batch in (1, 3) for v in sd_variants(config, batch, 8, run)]
    rows = [_e2e_row(config, **key) for key in keys]
    with _write_failing(error, after):
        if finish:
            result.rows = {_key(row, result.columns): row for row in rows}
            result.finish(keys)
        result.add(rows[:4])
        result.add(rows[4:])


_FULL = OSError(28, "No space left on device")
_IMMUTABLE = PermissionError(1, "Operation not permitted")
_READ_ONLY = OSError(30, "Read-only file system")


def _with_fragment(case: Case, fragment: str) -> Case:
    return case._replace(fragment=fragment)


MID_SWEEP = [
    # one line: what failed, what was kept, the command that resumes (was a raw traceback)
    _with_fragment(_failed_sweep(_FULL, 2), "writing e2e.csv failed (No space left on device); it keeps its 1 row(s), "
                   "in "),
    _with_fragment(_failed_sweep(_IMMUTABLE, 2), "writing e2e.csv failed (Operation not permitted); it keeps its 1 "
                   "row(s)"),
    _with_fragment(_failed_sweep(_FULL, 0), "writing e2e.csv failed (No space left on device); it keeps its 0 row(s)"),
    _with_fragment(_failed_sweep(_READ_ONLY, 4), "failed (Read-only file system); it keeps its 2 row(s)"),
    _with_fragment(_failed_sweep(_FULL, 2, "--overwrite"), "writing .e2e.partial.csv failed (No space left on "
                   "device); it keeps its 1 row(s)"),
    Case("mid-sweep", "a failed write says how to resume", lambda tmp: _failed_sweep(_FULL, 2).call(tmp),
         CommandFailed, "; resume with: moesd sweep e2e --layers 1", True),
    Case("mid-sweep", "a failed --overwrite resumes with --overwrite",
         lambda tmp: _failed_sweep(_FULL, 2, "--overwrite").call(tmp), CommandFailed, " --overwrite", True),
    Case("mid-sweep", "ResultFile.add on a full disk", lambda tmp: _failing_result_file(tmp, _FULL, 2), OSError,
         "writing e2e.csv failed (No space left on device); it keeps its 4 row(s), in ", True),
    Case("mid-sweep", "ResultFile.add on a file made immutable", lambda tmp: _failing_result_file(tmp, _IMMUTABLE, 0),
         OSError, "writing e2e.csv failed (Operation not permitted); it keeps its 0 row(s)", True),
    Case("mid-sweep", "ResultFile.finish on a full disk", lambda tmp: _failing_result_file(tmp, _FULL, 0, finish=True),
         OSError, "writing e2e.csv failed (No space left on device)", True),
]


def _pretrained_argv(*changes):
    return lambda tmp: ["sweep", "e2e", "--weights", "pretrained", "--batch-sizes", "1", "--out-dir", str(tmp / "out"),
                        *changes]


def _local_pretrained_argv(target: str | dict, draft: str | dict | None = None):
    """``moesd sweep`` of pretrained local folders whose config.json hold ``target`` and ``draft`` (text or changes
    to a good Qwen2 config)."""
    def argv(tmp):
        paths = [(_checkpoint(tmp, role, config) if isinstance(config, str)
                  else _zoo_checkpoint(tmp, model, role, **(config or {})))
                 for role, model, config in (("target", "qwen2-57b-a14b", target), ("draft", "qwen2-0.5b", draft))]
        return _pretrained_argv("--target-path", paths[0], "--draft-path", paths[1])(tmp)

    return argv


def _hub_check(hub_id: str):
    from moesd._checks import hub_model

    return hub_model("--model", hub_id, "a local folder")


MODEL_CHECKS = [
    # a model cut to its dense first layers routes nothing: refused before it is built
    Case("models", "DeepSeek-V2-Lite cut to its dense first layer", lambda: _sweep(target="deepseek-v2-lite", layers=1),
         UsageError, "layers 1 keeps only dense layers of deepseek-v2-lite (its first 1 are dense, without expert "
         "routing): give layers >= 2"),
    Case("models", "DeepSeek-V3 cut to its three dense layers", lambda: _sweep(target="deepseek-v3", layers=3),
         UsageError, "layers 3 keeps only dense layers of deepseek-v3 (its first 3 are dense"),
    Case("models", "Kimi-K2 cut to its dense first layer", lambda: _sweep(target="kimi-k2", layers=1), UsageError,
         "layers 1 keeps only dense layers of kimi-k2"),
    # local checkpoints: their config.json read and named before any load
    Case("models", "a target folder whose config.json is not JSON", lambda tmp: _pretrained(tmp, target="{oops"),
         UsageError, "target_path: "),
    Case("models", "a target folder whose config.json is not JSON names the file",
         lambda tmp: _pretrained(tmp, target="{oops"), UsageError, "target/config.json: not JSON (Expecting"),
    Case("models", "a draft folder whose config.json is a list", lambda tmp: _pretrained(tmp, draft="[1, 2]"),
         UsageError, "draft_path: "),
    Case("models", "a draft folder whose config.json is a list names the file",
         lambda tmp: _pretrained(tmp, draft="[1, 2]"), UsageError, "draft/config.json holds a JSON list, not the "
         "object of a model's config"),
    Case("models", "a target folder of another model type", lambda tmp: _pretrained(tmp, target={"model_type": "llama"}),
         UsageError, "target/config.json is the config of a 'llama' model, not of qwen3-30b-a3b ('qwen3_moe')"),
    Case("models", "a deeply nested config.json", lambda tmp: _pretrained(tmp, target="[" * 100000 + "]" * 100000),
         UsageError, "target/config.json: not JSON this reader can take (arrays or objects nested deeper than"),
    # hub ids the offline hub cannot give
    Case("models", "a pretrained sweep of a hub id, offline (a hub error after the checks)",
         lambda: sweep_checks.check_pretrained(_sweep(**{k: None for k in ("layers", "draft_layers")}, width=1.0,
                                               weights="pretrained")), UsageError,
         "target 'Qwen/Qwen2-57B-A14B-Instruct' is not in the local Hugging Face cache"),
    Case("models", "an offline hub id names what to give instead", lambda: _hub_check("org/not-cached"), UsageError,
         "the hub is offline (HF_HUB_OFFLINE=1): download it where the hub is reachable, or give a local folder"),
    Case("models", "an offline hub id that is no repository id", lambda: _hub_check("not a repo id!"), UsageError,
         "--model 'not a repo id!' is not in the local Hugging Face cache"),
    # the same through the command line
    cli("sweep of DeepSeek-V2-Lite cut to its dense layer (built, then failed)",
        _sweep_argv("sparsity", "--target", "deepseek-v2-lite", "--layers", "1"),
        "--layers 1 keeps only dense layers of deepseek-v2-lite", before=NO_MODELS),
    cli("sweep of DeepSeek-V3 cut to two layers", _sweep_argv("e2e", "--target", "deepseek-v3", "--layers", "2"),
        "--layers 2 keeps only dense layers of deepseek-v3 (its first 3 are dense", before=NO_MODELS),
    cli("pretrained sweep of an offline hub id (a hub error after the checks)", _pretrained_argv(),
        "--target 'Qwen/Qwen2-57B-A14B-Instruct' is not in the local Hugging Face cache", integration=True,
        stops=SWEEPING),
    cli("pretrained sweep of a folder whose config.json is not JSON (a traceback without the file)",
        _local_pretrained_argv("{oops"), "target/config.json: not JSON", before=NO_MODELS),
    cli("pretrained sweep of a folder of another model type", _local_pretrained_argv({"model_type": "llama"}),
        "--target-path: ", before=NO_MODELS),
    cli("pretrained sweep of a draft folder whose config.json is a list", _local_pretrained_argv(None, "[1]"),
        "draft/config.json holds a JSON list", before=NO_MODELS),
    cli("trace of a folder without config.json (a loader traceback)", _trace_argv(model=lambda tmp: tmp),
        "holds no config.json: not the folder of a saved model", before=NO_MODELS),
    cli("trace of a folder whose config.json is not JSON",
        _trace_argv(model=lambda tmp: _saved_model(tmp, "{oops")), "saved-model/config.json: not JSON",
        before=NO_MODELS),
    cli("trace of a folder whose config.json names no model type", _trace_argv(model=lambda tmp: _saved_model(tmp, "{}")),
        "config.json' is not a model's config (a JSON object with a model_type)", before=NO_MODELS),
    cli("trace of a folder whose config.json is a list", _trace_argv(model=lambda tmp: _saved_model(tmp, "[]")),
        "is not a model's config", before=NO_MODELS),
    cli("trace of a folder whose config.json is deeply nested",
        _trace_argv(model=lambda tmp: _saved_model(tmp, "[" * 100000 + "]" * 100000)),
        "config.json: not JSON this reader can take", before=NO_MODELS),
    cli("trace of an offline hub id (a hub error after the checks)", _trace_argv(model="org/not-cached"),
        "--model 'org/not-cached' is not in the local Hugging Face cache", before=NO_MODELS),
]


OPTIONS = [
    # a trained router's popularity that cannot price the target
    cli("predict with a --routing-source that is not shipped", _predict_argv("--routing-source", "olmoe/nothing"),
        "--routing-source: no shipped routing source is named 'olmoe/nothing'; the sources are olmoe/arxiv",
        stops=_PREDICTING),
    cli("predict with a --routing-source of another expert count (64 for 128)",
        _predict_argv("--routing-source", "olmoe/github"),
        "--routing-source: olmoe/github routes over 64 experts and qwen3-30b-a3b has 128 experts", stops=_PREDICTING),
    cli("predict of a dense target with a --routing-source",
        ["predict", "--target", "opt-30b", "--draft", "opt-350m", "--hardware", "H100", "--tp", "2",
         "--routing-source", "olmoe/github"], "--routing-source: opt-30b is dense", stops=_PREDICTING),
    # an empty path wrote nothing and succeeded (--plot ""), or failed far from the flag
    cli("predict with an empty --plot (wrote nothing, succeeded)", _predict_argv("--plot", ""),
        "--plot is '': give a path", stops=_PREDICTING),
    cli("predict with an empty --csv", _predict_argv("--csv", ""), "--csv is '': give a path", stops=_PREDICTING),
    cli("predict with a blank --csv", _predict_argv("--csv", "  "), "--csv is '  ': give a path", stops=_PREDICTING),
    cli("trace with an empty --out", lambda tmp: _random_trace_cli()(tmp)[:-1] + [""], "--out is '': give a path",
        before=NO_MODELS),
    cli("trace with an empty --prompt-source", lambda tmp: _random_trace_cli()(tmp)[:6] + [
        "--prompt-source", "", "--out", str(tmp / "x.npz")], "--prompt-source is '': give a path", before=NO_MODELS),
    cli("trace with an empty --model", lambda tmp: ["trace", "--model", "", "--prompts", "gsm8k", "--out",
                                                    str(tmp / "x.npz")], "--model is '': give a path",
        before=NO_MODELS),
    cli("sweep with an empty --out-dir (wrote into the working folder)", lambda tmp: _sweep_argv("e2e")(tmp)[:-1] + [""],
        "--out-dir is '': give a path", before=NO_MODELS),
    cli("sweep with an empty --routing-trace", lambda tmp: ["sweep", "sparsity", "--routing", "trace",
                                                            "--routing-trace", "", "--out-dir", str(tmp)],
        "--routing-trace is '': give a path", before=NO_MODELS),
    cli("sweep with an empty --target-path", lambda tmp: _pretrained_argv("--target-path", "")(tmp),
        "--target-path is '': give a path", before=NO_MODELS),
    cli("hardware --measure with an empty --json", ["hardware", "--measure", "--json", ""],
        "--json is '': give a path", stops=_MEASURING),
    cli("fit of an empty path", ["fit", ""], "measurements is '': give a path"),
    # a weight dtype that quantises routed experts only, on a model without them (its label over bf16 or fp8 numbers)
    Case("options", "w4a8 on a dense target", lambda: Setup("qwen3-0.6b", "qwen3-0.6b", "H100", dtype="w4a8"),
         UsageError, "dtype: w4a8 quantises routed experts only, and qwen3-0.6b is dense: its weights would be priced "
         "as fp8; give dtype fp8"),
    Case("options", "mxfp4 on a dense target", lambda: Setup("opt-30b", "opt-350m", "H100", dtype="mxfp4"),
         UsageError, "dtype: mxfp4 quantises routed experts only, and opt-30b is dense"),
    Case("options", "mxfp4 for a dense draft", lambda: Setup("qwen3-30b-a3b", "qwen3-0.6b", "H100",
                                                             draft_dtype="mxfp4"), UsageError,
         "draft_dtype: mxfp4 quantises routed experts only, and qwen3-0.6b is dense"),
    cli("predict of a dense model in w4a8 (fp8 numbers under the w4a8 label)",
        ["predict", "--target", "qwen3-0.6b", "--draft", "qwen3-0.6b", "--hardware", "H100", "--dtype", "w4a8"],
        "--dtype: w4a8 quantises routed experts only, and qwen3-0.6b is dense"),
    cli("predict of a dense model in mxfp4 (bf16 numbers under the mxfp4 label)",
        ["predict", "--target", "opt-30b", "--draft", "opt-350m", "--hardware", "H100", "--dtype", "mxfp4"],
        "--dtype: mxfp4 quantises routed experts only, and opt-30b is dense: its weights would be priced as bf16"),
    cli("predict with a dense draft in mxfp4", _predict_argv("--draft-dtype", "mxfp4"),
        "--draft-dtype: mxfp4 quantises routed experts only, and qwen3-0.6b is dense"),
    # a draft head is no model to time or trace (predict refuses it as a target)
    Case("options", "a draft head as a sweep's target", lambda: _sweep(target="deepseek-v3-mtp", layers=None),
         UsageError, "target deepseek-v3-mtp is a draft head of deepseek-v3, not a model of its own: give a target "
         "model (its own is deepseek-v3)"),
    Case("options", "a draft head as a forward study's target",
         lambda: _sweep(study="forward", target="deepseek-v3-mtp", layers=None, rounds=None, warmup_rounds=None),
         UsageError, "target deepseek-v3-mtp is a draft head of deepseek-v3"),
    cli("sweep of a draft head as the target (timed a lone MTP layer)",
        _sweep_argv("e2e", "--target", "deepseek-v3-mtp", "--layers", "1"),
        "--target deepseek-v3-mtp is a draft head of deepseek-v3, not a model of its own", before=NO_MODELS),
    cli("trace of a draft head (traced a lone MTP layer)", _random_trace_cli(model="deepseek-v3-mtp"),
        "--model deepseek-v3-mtp is a draft head of deepseek-v3, which runs on its target's hidden states: trace "
        "deepseek-v3 instead", before=NO_MODELS),
]


def _nested(depth: int = 100_000) -> str:
    return "[" * depth + "]" * depth


def _router_returning_two(tmp: Path):
    """Capture the routing of a tiny OLMoE whose router returns (logits, weights), as another transformers might."""
    import torch

    from moesd.routing import capture
    from moesd.zoo import get_model

    model = get_model("olmoe-1b-7b").random_model(num_layers=1, width=1 / 32)
    capture.moe_layers(model)[0].register_forward_hook(lambda module, inputs, output: output[:2])
    return capture.capture_generate(model, torch.ones(1, 3, dtype=torch.long), None, 2)


def _router_of_float_ids(tmp: Path):
    import torch

    from moesd.routing import capture
    from moesd.zoo import get_model

    model = get_model("olmoe-1b-7b").random_model(num_layers=1, width=1 / 32)
    capture.moe_layers(model)[0].register_forward_hook(lambda module, inputs, output: (*output[:2],
                                                                                       output[2].float()))
    return capture.capture_generate(model, torch.ones(1, 3, dtype=torch.long), None, 2)


RAW = [
    # seeds past what torch takes (OverflowError deep in model building)
    cli("trace with a seed of 2**64 (an OverflowError in torch)", _random_trace_cli("--seed", str(2**64)),
        "--seed must be a whole number in [0, 2^32 - 1 = 4294967295], got 18446744073709551616", before=NO_MODELS),
    cli("trace with a negative seed", _random_trace_cli("--seed", "-1"), "--seed must be a whole number in [0, 2^32 - 1",
        before=NO_MODELS),
    cli("trace with a seed of 2**32", _random_trace_cli("--seed", str(2**32)), "got 4294967296", before=NO_MODELS),
    Case("raw", "a sweep seeded 2**64 (a TypeError in numpy)", lambda: _sweep(seed=2**64), UsageError,
         "seed must be a whole number in [0, 2^32 - 1 = 4294967295], got 18446744073709551616"),
    Case("raw", "a negative sweep seed", lambda: _sweep(seed=-1), UsageError, "seed must be a whole number in [0,"),
    Case("raw", "a fractional sweep seed", lambda: _sweep(seed=1.5), UsageError, "got 1.5"),
    Case("raw", "a sweep seeded True", lambda: _sweep(seed=True), UsageError, "got True"),
    # ids of 1e20
    Case("raw", "a JSONL expert id of 1e20", lambda tmp: importers.from_token_jsonl(_lines(tmp, "t.jsonl", _token(
        experts=(1e20, 1))), 4), ValueError, "t.jsonl:1: experts must be a whole number below 2^53 in magnitude, "
         "got 1e+20"),
    Case("raw", "a JSONL position of 1e20", lambda tmp: importers.from_token_jsonl(_lines(tmp, "t.jsonl", _token(
        position=1e20)), 4), ValueError, "t.jsonl:1: position must be a whole number below 2^53 in magnitude"),
    Case("raw", "a JSONL position of 10**20 (an object array)", lambda tmp: importers.from_token_jsonl(_lines(
        tmp, "t.jsonl", _token(position=10**20)), 4), ValueError, "t.jsonl:1: position must be a whole number below "
         "2^53 in magnitude, got 100000000000000000000"),
    Case("raw", "a JSONL layer of 1e20 (an object array)", lambda tmp: importers.from_token_jsonl(_lines(
        tmp, "t.jsonl", _token(layer=1e20)), 4), ValueError, "t.jsonl:1: layer must be a whole number below 2^53"),
    Case("raw", "a layer CSV layer of 10**20 (an object array)", lambda tmp: importers.from_layer_csv(
        _write(tmp, "r.csv", b"100000000000000000000,1 2\n"), 4), ValueError,
         "r.csv:1: layer_id must be a whole number below 2^53 in magnitude, got 100000000000000000000"),
    Case("raw", "a vLLM log row of 1e20 (read)", lambda tmp: _vllm_routes(tmp, {"token_idx": 1e20}), ValueError,
         "layer0.jsonl:2: row must be a whole number below 2^53 in magnitude, got 1e+20"),
    Case("raw", "a vLLM log layer of 10**20", lambda tmp: _vllm_routes(tmp, {"layer": 10**20}), ValueError,
         "layer0.jsonl:2: layer must be a whole number below 2^53 in magnitude"),
    # routers of another shape (an IndexError inside a forward hook)
    Case("raw", "an HF router returning two tensors (IndexError)", _router_returning_two, UsageError,
         "the router of layer 0 (OlmoeTopKRouter) returned [(3, 64), (3, 8)], not the (logits, weights, indices)",
         True),
    Case("raw", "an HF router returning float indices", _router_of_float_ids, UsageError,
         "the router of layer 0 (OlmoeTopKRouter) returned [(3, 64), (3, 8), (3, 8)], not the", True),
    # JSON nested deeper than the parser follows (RecursionError)
    Case("raw", "a deeply nested sidecar", lambda tmp: measurements.read_sidecar(_write(tmp, "e2e.json",
                                                                                         _nested().encode())),
         ValueError, "e2e.json: not JSON this reader can take (arrays or objects nested deeper than about"),
    Case("raw", "a deeply nested vLLM routed JSON", lambda tmp: vllm_logs.from_vllm_routed_experts(_write(
        tmp, "routed.json", ('{"format": "x", "meta": ' + _nested() + "}").encode()), 4), ValueError,
         "routed.json: not JSON this reader can take"),
    Case("raw", "a deeply nested JSONL record", lambda tmp: importers.from_token_jsonl(_lines(
        tmp, "t.jsonl", '{"experts": ' + _nested() + "}"), 4), ValueError, "t.jsonl:1: not JSON this reader can take"),
    Case("raw", "a deeply nested vLLM log line", lambda tmp: vllm_logs.from_vllm_moe_log(_lines(
        tmp, "layer0.jsonl", _nested()), 4), ValueError, "layer0.jsonl:1: not JSON this reader can take"),
    Case("raw", "a deeply nested trace meta", lambda tmp: traces.RoutingTrace.load(_bare_trace(
        tmp, meta=np.array(_nested()))), ValueError, "bare.npz: not a valid routing trace: its meta: not JSON this "
         "reader can take"),
    Case("raw", "a deeply nested prompt line", lambda tmp: load_prompts("gsm8k", _write(
        tmp, "test.jsonl", ('{"question": ' + _nested() + "}\n").encode())), ValueError,
         "test.jsonl: line 1: not JSON this reader can take"),
    cli("fit of a deeply nested sidecar (a RecursionError)",
        lambda tmp: _write(_result_file(tmp).parent, "sparsity.json", ('{"a": ' + _nested() + "}").encode())
        and ["fit", str(tmp / "sparsity.csv")], "sparsity.json: not JSON this reader can take"),
    cli("sweep replaying a trace of deeply nested meta",
        lambda tmp: ["sweep", "sparsity", "--routing", "trace", "--routing-trace",
                     str(_bare_trace(tmp, meta=np.array(_nested()))), "--out-dir", str(tmp / "out")],
        "its meta: not JSON this reader can take", before=NO_MODELS),
    # hardware records: fractions of a peak above 1
    Case("raw", "a bandwidth fraction of 1.5", lambda: _with_hardware(bandwidth_fraction=1.5), UsageError,
         "hardware.bandwidth_fraction must be a number in (0, 1], got 1.5 (Hardware record 'H100')"),
    Case("raw", "a FLOP/s fraction of 3", lambda: _with_hardware(flops_fraction=3.0), UsageError,
         "hardware.flops_fraction must be a number in (0, 1], got 3"),
    Case("raw", "a stored record with a fraction above 1",
         lambda: roofline.Hardware.from_dict({**roofline.HARDWARE["H100"].as_dict(), "flops_fraction": 2.0}),
         UsageError, "hardware.flops_fraction must be a number in (0, 1], got 2"),
    cli("fit of a sidecar whose roofline achieves twice its peak",
        _fit_file(sidecar=_sidecar_hardware(flops_fraction=2.0)), "hardware.flops_fraction must be a number in (0, 1]"),
    # theory functions: finite or refused, naming the arguments (were inf for finite input)
    Case("raw", "target efficiency of 1e300 s over 1e-300 s (inf)", lambda: speedup.target_efficiency(1e300, 1e-300),
         UsageError, "target_efficiency: t_target_1 = 1e+300, t_target_gamma = 1e-300 make a result a float64 cannot "
         "hold (inf)"),
    Case("raw", "SD time of 1e300 rounds of 1e300 s (inf)", lambda: speedup.sd_time(1e300, 1000, 1e300, 1e300, 0),
         UsageError, "sd_time: rounds = 1e+300, gamma = 1000, t_draft = 1e+300, t_target_gamma = 1e+300, t_reject = 0 "
         "make a result a float64 cannot hold"),
    Case("raw", "Eq. 4 over a subnormal verification (inf)", lambda: speedup.speedup(0.9, 2, 1.0, 5e-324, 0, 0),
         UsageError, "speedup: sigma = 0.9, gamma = 2, t_target_1 = 1, t_target_gamma = 4.94066e-324"),
    Case("raw", "Eq. 4's terms over a subnormal verification", lambda: speedup.speedup_terms(0.9, 2, 1.0, 5e-324, 0),
         UsageError, "speedup_terms: sigma = 0.9"),
    Case("raw", "an FFN's FLOPs at 1e300 tokens (inf)", lambda: roofline.ffn_cost(1e300, 7168, 2048, 256, 8),
         UsageError, "ffn_cost: tokens = 1e+300, d_model = 7168, d_ff = 2048, E = 256, K = 8, num_matrices = 3, "
         "bytes_per_value = 2 make a result a float64 cannot hold (inf)"),
    Case("raw", "arithmetic intensity of 1e300 FLOP over 1e-300 bytes (inf)",
         lambda: roofline.arithmetic_intensity(1e300, 1e-300), UsageError,
         "arithmetic_intensity: flops = 1e+300, traffic = 1e-300 make a result a float64 cannot hold (inf)"),
    Case("raw", "the first infinite element of an array is named",
         lambda: speedup.target_efficiency([1.0, 1e300], [1.0, 1e-300]), UsageError,
         "target_efficiency: t_target_1 = 1e+300, t_target_gamma = 1e-300 make"),
]


def _of_kind(kind: str, cases: list) -> list:
    """``cases`` of the third round, the command-line rows among them labelled ``"<kind> cli"``."""
    return [case._replace(module=f"{kind} cli") if case.module == "cli" else case for case in cases]


CASES = (EXPERTS + SPEEDUP + ROOFLINE + PROMPTS + PAPER + CLI + TRACES + IMPORTERS + FIT + MEASUREMENTS + PREDICT
         + BENCH + CLI_COMMANDS + OUTPUT_FILES + NUMBERS + RESULT_FILES + TRACE_FILES
         + _of_kind("resume", RESUMES) + _of_kind("bounds", BOUNDS) + _of_kind("fit-domain", FIT_DOMAIN)
         + _of_kind("paths", PATHS) + _of_kind("mid-sweep", MID_SWEEP) + _of_kind("models", MODEL_CHECKS)
         + _of_kind("options", OPTIONS) + _of_kind("raw", RAW))
"""Every row of the table; the third round's rows are counted by kind: resume, bounds, fit-domain,
paths, mid-sweep, models, options and raw, a command line's rows as "<kind> cli"."""


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.integration) if c.integration else c for c in CASES],
                         ids=[f"{c.module}: {c.what}" for c in CASES])
def test_bad_input_is_refused_clearly(case, tmp_path):
    arguments = [tmp_path] if inspect.signature(case.call).parameters else []
    with pytest.raises(case.error) as raised:
        case.call(*arguments)
    message = str(raised.value.args[0]) if raised.value.args else ""
    if case.error is CommandRefused:  # one line: "moesd ...: error: <message>" after the usage
        message = "\n".join(line for line in message.splitlines() if ": error: " in line)
        assert len(message.splitlines()) == 1, message
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
    assert growth.G(1, 2000, 2.0) == 2.0  # s**lam_rp overflows but G(1) = s does not


def test_a_save_refused_leaves_the_special_file_as_it_was(tmp_path):
    """RoutingTrace.save over a device or a FIFO is refused before anything is written (as root it used to
    rename a zip file over /dev/full)."""
    import os
    import stat

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for target, is_kind in ((fifo, stat.S_ISFIFO), (Path("/dev/null"), stat.S_ISCHR)):
        with pytest.raises(ValueError, match="not a regular file: refusing to replace it"):
            _trace().save(target)
        assert is_kind(os.stat(target).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo"]  # no temporary file left behind


def test_a_record_without_weights_keeps_every_other_weight(tmp_path):
    """One record without gating_probs used to drop every weight; now only its own are NaN, with a warning."""
    path = _lines(tmp_path, "t.jsonl", _token(gating_probs=[0.6, 0.4]), _token(0, 1))
    with pytest.warns(UserWarning, match="1 of 2 records .first on line 2. have no weights; their weights are NaN"):
        trace = importers.from_token_jsonl(path, 4)
    assert trace.weights[0, 0].tolist() == pytest.approx([0.6, 0.4]) and np.isnan(trace.weights[1]).all()


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
    _finite(growth.G(t, lam_rp, s))


# Property: the command line's numbers parse exactly or are refused naming the flag -----------------

class _Parsed(Exception):
    """``moesd predict`` reached its work: the arguments ``recommend`` got."""


whole_numbers = st.one_of(st.integers(-3, 300), st.integers(-2**70, 2**70), st.sampled_from([2**53 - 1, 2**53, 2**63]))
any_floats = st.one_of(st.floats(0, 1), st.floats(allow_nan=True, allow_infinity=True))


@st.composite
def number_options(draw):
    """A ``moesd predict`` option holding numbers, its text and the values it must parse to (None: refused)."""
    flag = draw(st.sampled_from(["--batch", "--gamma", "--alpha", "--context", "--tp"]))
    if flag in ("--batch", "--gamma"):
        parts = draw(st.lists(st.one_of(whole_numbers.map(lambda v: (v, v)), st.tuples(whole_numbers, whole_numbers)),
                              min_size=1, max_size=3))
        text = ",".join(str(low) if low == high else f"{low}-{high}" for low, high in parts)
        exact = all(low <= high and max(-low, high) < 2**53 for low, high in parts) and \
            sum(high - low + 1 for low, high in parts) <= 10**5
        expected = sorted(set().union(*(range(low, high + 1) for low, high in parts))) if exact else None
    elif flag == "--alpha":
        values = draw(st.lists(any_floats, min_size=1, max_size=3))
        text, expected = ",".join(map(repr, values)), sorted(set(values))
    else:
        value = draw(st.one_of(whole_numbers, any_floats))
        text, expected = (str(value) if isinstance(value, int) else repr(value)), value
    empty = draw(st.sampled_from(["", ",", f"{text},", f",{text}", f"{text},,{text}", " "]))
    return (flag, empty, None) if draw(st.booleans()) and draw(st.booleans()) else (flag, text, expected)


@settings(max_examples=300)
@given(number_options())
def test_predict_numbers_parse_exactly_or_are_refused_naming_the_flag(option):
    """Huge, negative, non-finite, non-integral and empty numbers: exact values, or status 2 and one line that
    names the flag; never a traceback, a wrapped or a rounded value."""
    from moesd.predictor import recommend

    flag, text, expected = option

    def stop(*args, **options):  # the options were checked together when the Setup was made: this is the work
        raise _Parsed(args, options)

    with mock.patch.object(recommend, "recommend", stop):
        try:
            _run_command(_predict_argv(f"{flag}={text}"))
        except CommandRefused as refused:
            lines = [line for line in str(refused).splitlines() if ": error: " in line]
            assert len(lines) == 1 and flag in lines[0], lines
            return
        except _Parsed as parsed:
            args, options = parsed.args
    assert expected is not None, f"{flag}={text!r} was taken"
    if flag in ("--batch", "--gamma"):
        got = args[1 if flag == "--batch" else 2]
        assert got.dtype == np.int64 and got.tolist() == expected
    elif flag == "--alpha":
        assert args[3] == "alpha" and args[4].tolist() == expected
    else:
        got = getattr(args[0], flag[2:])
        assert type(got) is int and got == expected


# Property: theory functions are finite or refused over their whole domain ---------------------------

any_positive = st.floats(min_value=0, exclude_min=True, allow_infinity=False)  # subnormals to the float maximum
any_nonnegative = st.floats(min_value=0, allow_infinity=False)
any_whole = st.one_of(st.integers(1, 64), st.integers(1, 2**53 - 1))
any_fraction = st.floats(0, 1)


def _finite_or_refused(call) -> None:
    """``call()`` returns only finite numbers, or refuses with a UsageError naming its function."""
    from moesd._checks import _numbers_in

    try:
        result = call()
    except UsageError:
        return
    for value in _numbers_in(result):
        assert np.isfinite(value).all(), result


def _sigma_of(fraction: float, gamma: int) -> float:
    """A sigma in [1/(gamma+1), 1], ``fraction`` of the way."""
    return 1 / (gamma + 1) + fraction * (1 - 1 / (gamma + 1))


@given(any_positive, any_positive, any_nonnegative, any_whole, any_nonnegative, any_nonnegative)
def test_speedup_times_are_finite_or_refused_over_the_whole_domain(t1, tg, rounds, gamma, td, tr):
    _finite_or_refused(lambda: speedup.target_efficiency(t1, tg))
    _finite_or_refused(lambda: speedup.sd_time(rounds, gamma, td, tg, tr))


@given(any_fraction, st.integers(1, 64), any_positive, any_positive, any_nonnegative, any_nonnegative)
def test_eq4_is_finite_or_refused_over_the_whole_domain(fraction, gamma, t1, tg, td, tr):
    sigma = _sigma_of(fraction, gamma)
    _finite_or_refused(lambda: speedup.speedup(sigma, gamma, t1, tg, td, tr))
    _finite_or_refused(lambda: speedup.speedup_terms(sigma, gamma, t1, tg, td, tr))
    _finite_or_refused(lambda: speedup.min_target_efficiency(t1, sigma, gamma))


@given(any_fraction, any_whole, any_nonnegative)
def test_acceptance_is_finite_or_refused_over_the_whole_domain(alpha, gamma, cost):
    _finite_or_refused(lambda: speedup.expected_tokens_per_round(alpha, gamma))
    _finite_or_refused(lambda: speedup.sigma(alpha, gamma))
    _finite_or_refused(lambda: speedup.leviathan_speedup(alpha, gamma, cost))
    _finite_or_refused(lambda: speedup.alpha_from_sigma(_sigma_of(alpha, min(gamma, 10**6)), min(gamma, 10**6)))


@given(any_nonnegative, any_whole, any_whole, st.floats(min_value=1, allow_infinity=False),
       st.floats(0, 1, exclude_min=True))
def test_experts_are_finite_or_refused_over_the_whole_domain(t, E, K, t1, rho):
    _finite_or_refused(lambda: experts.expected_active_experts(t, E, min(K, E)))
    _finite_or_refused(lambda: experts.tokens_per_expert(t1, rho))
    _finite_or_refused(lambda: experts.tokens_per_expert_derivative(t1, rho))
    _finite_or_refused(lambda: experts.appendix_b_f(rho, t1))


@given(any_nonnegative, any_whole, any_whole, any_whole, any_whole, st.integers(1, 8), any_positive, any_positive,
       devices, st.floats(min_value=1, allow_infinity=False))
def test_roofline_is_finite_or_refused_over_the_whole_domain(t, d_model, d_ff, E, K, matrices, width, traffic,
                                                              device, s):
    _finite_or_refused(lambda: roofline.ffn_cost(t, d_model, d_ff, E, min(K, E), matrices, width))
    _finite_or_refused(lambda: roofline.arithmetic_intensity(t, traffic))
    _finite_or_refused(lambda: roofline.time_floor(t, traffic, device))
    _finite_or_refused(lambda: growth.G(t, traffic, s))


# Property: resumes keep only this sweep's rows -----------------------------------------------------------------

_GRID_CHANGES = st.sampled_from([("run", 2), ("run", -1), ("run", 0.5), ("batch_size", 2), ("gamma", 4),
                                 ("num_experts_per_tok", 4), ("context", 9), ("rounds", 3), ("warmup_rounds", 0),
                                 ("t_ar", -1.0), ("t_sd", 0.0), ("t_draft", "slow"), ("t_reject", float("inf"))])


@settings(max_examples=60)
@given(st.lists(st.tuples(st.integers(0, 1), st.sampled_from([1, 3]), st.sampled_from([2, 3])), min_size=1,
                max_size=6, unique=True),
       st.lists(st.tuples(st.integers(0, 5), _GRID_CHANGES), max_size=2))
def test_a_resume_keeps_only_the_sweeps_rows(points, edits):
    """Rows of the sweep's grid resume; a row with one cell outside it is refused, naming the file and its line."""
    import tempfile

    from moesd.measure.result_file import check_kept_rows

    config = sweeps.SweepConfig(**_TINY)
    rows = [_e2e_row(config, run=run, batch_size=batch, gamma=gamma) for run, batch, gamma in points]
    edited = set()
    for index, (column, value) in edits:
        if index < len(rows):
            rows[index][column] = value
            edited.add(index)
    with tempfile.TemporaryDirectory() as folder:
        path = _unfinished(Path(folder), config, rows)
        if not edited:
            check_kept_rows(path, config, "")
            return
        with pytest.raises(FileExistsError) as refused:
            check_kept_rows(path, config, "")
    assert f"e2e.csv: line {min(edited) + 2} has " in str(refused.value)


@pytest.mark.parametrize("sidecar", sorted(str(p) for p in Path(measurements.measurements_dir()).glob("*/*.json")
                                           if p.with_suffix(".csv").exists()))
def test_every_shipped_result_file_resumes_under_its_own_settings(sidecar):
    """No false refusal: the rows of every shipped study pass the resume checks of the settings they record."""
    from moesd.measure.result_file import check_kept_rows

    settings = json.loads(Path(sidecar).read_text())["settings"]
    check_kept_rows(Path(sidecar).with_suffix(".csv"), sweeps.SweepConfig(**settings), "")


# Property: sizes are bounded as counted --------------------------------------------------------------------------

@settings(max_examples=60)
@given(st.integers(1, 2000), st.integers(1, 40), st.lists(st.integers(1, 8), min_size=1, max_size=4, unique=True),
       st.integers(1, 100_000))
def test_a_sweep_is_refused_exactly_when_its_rows_or_positions_pass_the_bounds(repeats, batches, gammas, context):
    """SweepConfig accepts a sweep iff its rows (as ResultFile.finish expects them) and its positions are in bounds."""
    from moesd.measure.protocol import sd_variants

    settings_ = dict(_TINY, repeats=repeats, batch_sizes=tuple(range(1, batches + 1)), gammas=tuple(gammas),
                     context=context, sigma={g: 0.9 for g in gammas})
    rows = repeats * batches * len(gammas)
    positions = context + (1 + 2 + 1) * (max(gammas) + 1)
    try:
        config = sweeps.SweepConfig(**settings_)
    except UsageError as error:
        assert rows > sweep_checks.MAX_SWEEP_ROWS or positions > 32768, error
        return
    assert rows <= sweep_checks.MAX_SWEEP_ROWS and positions <= 32768
    assert sweep_checks.sweep_rows(config) == len([v for run in range(repeats) for batch in config.batch_sizes
                                             for v in sd_variants(config, batch, 8, run)])


def test_position_defaults_are_transformers_own():
    """Each default of moesd.architecture.POSITION_DEFAULTS is the pinned transformers' config default."""
    pytest.importorskip("transformers")
    from transformers import CONFIG_MAPPING

    from moesd.architecture import POSITION_DEFAULTS

    for model_type, positions in POSITION_DEFAULTS.items():
        assert CONFIG_MAPPING[model_type]().max_position_embeddings == positions, model_type


# Property: output paths are usable or refused in one line --------------------------------------------------------

_NAME_PART = st.one_of(st.sampled_from(["", ".", "..", "loop", "file", "dir", "x" * 300, "/dev/null", "/dev/stdout",
                                        "/proc/self/fd/1", " "]), st.text(st.characters(blacklist_characters="/"),
                                                                           min_size=1, max_size=20))


@settings(max_examples=150)
@given(st.lists(_NAME_PART, min_size=1, max_size=4))
def test_an_output_path_is_usable_or_refused_in_one_line(parts):
    """Any spelling of an output path: new_file returns a path whose folder exists or can be made, or refuses with a
    UsageError of one line; never an OSError or a path through a loop."""
    import os
    import tempfile

    from moesd._checks import new_file

    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "loop").symlink_to(root / "loop")
        (root / "file").write_text("")
        (root / "dir").mkdir()
        text = os.path.join(folder, *parts) if not parts[0].startswith("/") else os.path.join(*parts)
        try:
            path = new_file("--csv", text, overwrite=True)
        except UsageError as error:
            assert len(str(error).splitlines()) == 1 and "--csv" in str(error)
            return
        assert path == Path(text) and not str(path.absolute()).startswith(("/dev/", "/proc/"))


@given(st.integers(1, 200_000))
def test_json_nests_or_is_refused_naming_the_file(depth):
    from moesd._files import parse_json

    text = "[" * depth + "]" * depth
    try:
        value = parse_json(text, "f.json")
    except ValueError as error:
        assert str(error).startswith("f.json: not JSON this reader can take")
        return
    for _ in range(depth - 1):
        value = value[0]
    assert value == []


@given(st.one_of(st.integers(-3, 2**70), st.floats(allow_nan=True, allow_infinity=True), st.booleans()))
def test_a_seed_is_a_32_bit_whole_number_or_refused(value):
    from moesd._checks import seed

    try:
        got = seed("--seed", value)
    except UsageError as error:
        assert str(error).startswith("--seed must be a whole number in [0, 2^32 - 1")
        assert isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**32
        return
    assert got == value and type(got) is int and 0 <= got < 2**32


@given(st.one_of(st.integers(-5, 2**21), st.floats(0, 2**21)), st.sampled_from(["B", "gamma", "K"]))
def test_a_fitting_frame_takes_whole_points_within_bounds_only(value, column):
    """measurement_array takes a B, gamma or K iff it is a whole number in its bounds (K <= E = 8)."""
    from moesd.model.measurements import MAX_BATCH_SIZE, MAX_GAMMA

    frame = _frame()
    frame[column] = frame[column].astype(float)
    frame.loc[3, column] = float(value)
    high = {"B": MAX_BATCH_SIZE, "gamma": MAX_GAMMA, "K": 8}[column]
    good = float(value).is_integer() and 1 <= value <= high
    try:
        check_measurements(frame)
    except ValueError as error:
        assert not good and "(row 3)" in str(error), error
        return
    assert good


@pytest.mark.parametrize("model", ["qwen3-0.6b", "opt-30b", "qwen3-30b-a3b", "deepseek-v3"])
def test_a_weight_dtype_is_refused_exactly_where_it_changes_nothing(model):
    """Every weight dtype is taken for an MoE model; for a dense one, exactly those that quantise more than the
    routed experts (the others would price another dtype's numbers under their label)."""
    from moesd.predictor.layout import DTYPE_BYTES, ffn_dtype
    from moesd.zoo import get_model

    draft = {"qwen3-0.6b": "qwen3-0.6b", "opt-30b": "opt-350m", "qwen3-30b-a3b": "qwen3-0.6b",
             "deepseek-v3": "deepseek-v3-mtp"}[model]
    for dtype in DTYPE_BYTES:
        applies = get_model(model).is_moe or ffn_dtype(dtype) == dtype
        try:
            Setup(model, draft, "H200", tp=8 if model == "deepseek-v3" else 1, dtype=dtype)
        except UsageError as error:
            assert not applies and error.argument == "dtype", (dtype, error)
            continue
        assert applies, dtype
