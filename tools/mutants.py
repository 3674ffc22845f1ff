"""Mutation check: does a change of one operator or constant in a module make its unit tests fail?

Run: ``python tools/mutants.py [MODULE.py ...] [--limit N] [--seed S] [--timeout SECONDS]``
(default: every module of ``moesd/theory/``). Heavy: run it under the CPU lock,
``flock /tmp/moesd-cpu.lock .venv/bin/python tools/mutants.py``.

Each *mutant* is the module with one small change, made on its syntax tree (:mod:`ast`):

* a comparison turned (``<`` and ``<=``, ``>`` and ``>=``, ``==`` and ``!=``);
* an arithmetic operator swapped (``+`` and ``-``, ``*`` and ``/``, ``**`` to ``*``, ``//`` to ``/``);
* a number changed (a whole number ``n`` to ``n + 1``; a float ``x`` to ``2 x``, a tolerance below 1e-6 to 0);
* ``and`` and ``or`` swapped, a ``not`` or a unary minus dropped;
* ``any`` and ``all``, ``ceil`` and ``floor``, ``maximum`` and ``minimum``, ``min`` and ``max`` swapped;
* a ``round``, ``clip`` or ``abs`` call replaced by its first argument.

Docstrings, f-strings and ``raise`` statements (the error messages) are left alone. Each mutant is
written into a copy of the repository (``moesd/``, ``tests/``, ``data/``, ``tools/`` and the pytest settings) and the
unit tests that import the module run there (``pytest -x -m "not integration"``) with a time cap: a
test that fails *kills* the mutant; a mutant that runs past the cap counts as killed too (a loop that no
longer ends) and is listed apart. A surviving mutant is either a gap in the tests or *equivalent*
(it behaves as the original on every input): each survivor is printed with its line for a reader to judge.
"""

from __future__ import annotations

import argparse
import ast
import copy
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

COMPARISONS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
               ast.NotEq: ast.Eq}
OPERATORS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.Pow: ast.Mult,
             ast.FloorDiv: ast.Div}
SWAPPED_NAMES = {"any": "all", "all": "any", "ceil": "floor", "floor": "ceil", "maximum": "minimum",
                 "minimum": "maximum", "min": "max", "max": "min"}
UNWRAPPED_CALLS = ("round", "clip", "abs")
TOLERANCE = 1e-6
"""A float constant below this (in size) is read as a tolerance: its mutant sets it to 0."""


@dataclass(frozen=True)
class Mutant:
    """One change: the ``index``-th mutable site of the module, at ``line``, described in words."""

    index: int
    line: int
    description: str


def _callee(node: ast.Call) -> str | None:
    function = node.func
    return function.attr if isinstance(function, ast.Attribute) else function.id if isinstance(function, ast.Name) else None


class _Sites(ast.NodeTransformer):
    """Walks a module's tree, counting mutable sites; with ``target`` set, applies that site's change."""

    def __init__(self, target: int | None = None):
        self.target, self.count, self.found = target, 0, []

    def _site(self, node, description: str) -> bool:
        """Register a site; True when it is the one to change."""
        self.found.append(Mutant(self.count, getattr(node, "lineno", 0), description))
        self.count += 1
        return self.count - 1 == self.target

    def _skip(self, node):
        return node  # not visited: nothing inside is mutated

    visit_JoinedStr = visit_Raise = _skip

    def visit_Module(self, node):
        """Functions and scalar settings (``NAME = number expression``) only: module-level tables are data."""
        node.body = [self.visit(statement) if _is_code(statement) else statement for statement in node.body]
        return node

    def visit_ClassDef(self, node):
        node.body = [self.visit(statement) if _is_code(statement) else statement for statement in node.body]
        return node

    def visit_Expr(self, node):
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return node  # a docstring
        return self.generic_visit(node)

    def visit_Assign(self, node):
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return node
        return self.generic_visit(node)

    def visit_Compare(self, node):
        self.generic_visit(node)
        for i, op in enumerate(node.ops):
            if type(op) in COMPARISONS:
                new = COMPARISONS[type(op)]
                if self._site(node, f"{_symbol(op)} -> {_symbol(new())}"):
                    node.ops[i] = new()
        return node

    def visit_BinOp(self, node):
        self.generic_visit(node)
        if type(node.op) in OPERATORS:
            new = OPERATORS[type(node.op)]
            if self._site(node, f"{_symbol(node.op)} -> {_symbol(new())}"):
                node.op = new()
        return node

    def visit_AugAssign(self, node):
        self.generic_visit(node)
        if type(node.op) in OPERATORS:
            new = OPERATORS[type(node.op)]
            if self._site(node, f"{_symbol(node.op)}= -> {_symbol(new())}="):
                node.op = new()
        return node

    def visit_BoolOp(self, node):
        self.generic_visit(node)
        new = ast.Or if isinstance(node.op, ast.And) else ast.And
        if self._site(node, f"{type(node.op).__name__.lower()} -> {new.__name__.lower()}"):
            node.op = new()
        return node

    def visit_UnaryOp(self, node):
        self.generic_visit(node)
        if isinstance(node.op, (ast.Not, ast.USub)):
            if self._site(node, f"drop the unary {'not' if isinstance(node.op, ast.Not) else 'minus'}"):
                return node.operand
        return node

    def visit_Constant(self, node):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return node
        if isinstance(value, int):
            new = value + 1
        else:
            new = 0.0 if 0 < abs(value) < TOLERANCE else 2 * value if value else 1.0
        if self._site(node, f"{value!r} -> {new!r}"):
            return ast.copy_location(ast.Constant(new), node)
        return node

    def visit_Call(self, node):
        self.generic_visit(node)
        name = _callee(node)
        if name in SWAPPED_NAMES:
            if self._site(node, f"{name} -> {SWAPPED_NAMES[name]}"):
                if isinstance(node.func, ast.Attribute):
                    node.func.attr = SWAPPED_NAMES[name]
                else:
                    node.func.id = SWAPPED_NAMES[name]
        elif name in UNWRAPPED_CALLS:
            subject = node.func.value if isinstance(node.func, ast.Attribute) and not node.args else (
                node.args[0] if node.args else None)
            if subject is not None and not (isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
                                             and node.func.value.id in ("np", "numpy", "math") and not node.args):
                if self._site(node, f"drop the {name}()"):
                    return subject
        return node


def _is_code(statement) -> bool:
    """A function, a class (its methods are visited), or a scalar setting such as ``LIMIT = 2.0**53``."""
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return True
    value = statement.value if isinstance(statement, (ast.Assign, ast.AnnAssign)) else None
    return value is not None and all(isinstance(n, (ast.Constant, ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop))
                                     for n in ast.walk(value)) and any(isinstance(n, ast.Constant) and
                                                                       isinstance(n.value, (int, float))
                                                                       for n in ast.walk(value))


def _symbol(op) -> str:
    return {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=", ast.Add: "+",
            ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Pow: "**", ast.FloorDiv: "//"}[type(op)]


def mutants(source: str) -> list[Mutant]:
    """Every mutant of a module's source, in the order of its tree."""
    sites = _Sites()
    sites.visit(ast.parse(source))
    return sites.found


def mutated(source: str, index: int) -> str:
    """The module's source with mutant ``index``'s change (comments and layout are not kept)."""
    tree = _Sites(target=index).visit(copy.deepcopy(ast.parse(source)))
    return ast.unparse(ast.fix_missing_locations(tree))


def relevant_tests(module: Path, tests: Path = ROOT / "tests") -> list[Path]:
    """The test files that import ``module`` (``moesd.x.y``, or ``from moesd.x import y``), the module's own
    (``test_<name>.py``) first, so that ``pytest -x`` stops early on a killed mutant."""
    dotted = ".".join(module.resolve().relative_to(ROOT).with_suffix("").parts)
    package, _, name = dotted.rpartition(".")
    pattern = re.compile(rf"{re.escape(dotted)}\b|from {re.escape(package)} import [^\n]*\b{name}\b")
    found = [path for path in tests.glob("test_*.py") if pattern.search(path.read_text()) and not _loads_torch(path)]
    return sorted(found, key=lambda path: (path.name != f"test_{name}.py", path.name))


def _loads_torch(path: Path) -> bool:
    """Whether a test file imports torch or transformers at its top (all its tests are then integration tests)."""
    for node in ast.parse(path.read_text()).body:
        for inner in ast.walk(node) if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) else ():
            names = ([a.name for a in inner.names] if isinstance(inner, ast.Import) else
                     [inner.module or ""] if isinstance(inner, ast.ImportFrom) else
                     [inner.args[0].value] if isinstance(inner, ast.Call) and getattr(inner.func, "attr", "") ==
                     "importorskip" and inner.args and isinstance(inner.args[0], ast.Constant) else [])
            if any(name.split(".")[0] in ("torch", "transformers") for name in names):
                return True
    return False


def _copy_repository(into: Path) -> None:
    for folder in ("moesd", "tests", "data", "tools"):
        shutil.copytree(ROOT / folder, into / folder, ignore=shutil.ignore_patterns("__pycache__", ".hypothesis"))
    for name in ("pytest.ini", "pyproject.toml"):
        shutil.copy(ROOT / name, into / name)


def run_tests(copy_root: Path, tests: list[Path], timeout: float) -> str:
    """``"passed"``, ``"failed"`` or ``"timeout"`` for the unit tests among ``tests`` in a copy of the repository."""
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-m", "not integration", "-p", "no:cacheprovider",
               *[str(copy_root / "tests" / path.name) for path in tests]]
    environment = {**os.environ, "PYTHONPATH": str(copy_root), "OMP_NUM_THREADS": "1"}
    try:
        result = subprocess.run(command, cwd=copy_root, env=environment, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout"
    if result.returncode == 5:
        raise RuntimeError(f"no unit tests collected from {[p.name for p in tests]}")
    return "passed" if result.returncode == 0 else "failed"


def check_module(module: Path, limit: int | None, seed: int, timeout: float | None) -> dict:
    """Run a module's mutants (all, or a seeded sample of ``limit``); the counts and the survivors."""
    source = module.read_text()
    tests = relevant_tests(module)
    every = mutants(source)
    chosen = every if limit is None or limit >= len(every) else sorted(
        random.Random(seed).sample(every, limit), key=lambda m: m.index)
    with tempfile.TemporaryDirectory(prefix="moesd-mutants-") as folder:
        root = Path(folder)
        _copy_repository(root)
        target = root / module.resolve().relative_to(ROOT)
        tick = time.perf_counter()
        if run_tests(root, tests, timeout=600) != "passed":
            raise RuntimeError(f"the unit tests of {module} fail without any mutant")
        cap = timeout or max(30.0, 5 * (time.perf_counter() - tick))
        outcomes = {}
        for mutant in chosen:
            target.write_text(mutated(source, mutant.index))
            outcomes[mutant] = run_tests(root, tests, cap)
        target.write_text(source)
    survivors = [m for m, outcome in outcomes.items() if outcome == "passed"]
    return {"module": str(module.relative_to(ROOT)), "tests": [p.name for p in tests], "sites": len(every),
            "run": len(chosen), "killed": len(chosen) - len(survivors),
            "timeouts": [m for m, outcome in outcomes.items() if outcome == "timeout"], "survivors": survivors}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", type=Path, help="default: moesd/theory/*.py")
    parser.add_argument("--limit", type=int, help="a seeded sample of this many mutants per module")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, help="seconds a mutant's tests may run (default: 5 x the clean run)")
    args = parser.parse_args(argv)
    modules = args.modules or sorted(p for p in (ROOT / "moesd" / "theory").glob("*.py") if p.name != "__init__.py")
    run = killed = 0
    for module in modules:
        result = check_module(module.resolve(), args.limit, args.seed, args.timeout)
        run, killed = run + result["run"], killed + result["killed"]
        print(f"{result['module']}: {result['killed']} of {result['run']} mutants killed "
              f"({result['sites']} sites; tests: {', '.join(result['tests'])})")
        for mutant in result["timeouts"]:
            print(f"    timed out (counted killed): line {mutant.line}: {mutant.description}")
        for mutant in result["survivors"]:
            print(f"    survived: line {mutant.line}: {mutant.description}")
    print(f"kill rate: {killed} of {run} ({100 * killed / run:.1f} %)" if run else "no mutants")
    return 0


if __name__ == "__main__":
    sys.exit(main())
