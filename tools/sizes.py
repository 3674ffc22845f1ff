"""Module and function sizes of the ``moesd`` package and ``tools/``, against the project's limits.

Run: ``python tools/sizes.py`` (exit status 1 when a module is over :data:`MODULE_LINES` lines or a function
over :data:`FUNCTION_CODE_LINES` code lines).

A module's size is its count of lines, all of them. A function's *code lines* are the lines of its body that
hold code: blank lines, comment lines and the docstring do not count (a nested function counts inside the one
that holds it, and on its own). Sources are read with :mod:`ast`, nothing is imported.
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = (ROOT / "moesd", ROOT / "tools")
MODULE_LINES = 500
"""Most lines a module may hold."""
FUNCTION_CODE_LINES = 80
"""Most code lines a function may hold."""


def code_lines(source: str) -> set[int]:
    """Line numbers (1-based) of ``source`` that hold a token of code (not a comment, not only blank space)."""
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENDMARKER, tokenize.ENCODING}
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skip:
            lines |= set(range(token.start[0], token.end[0] + 1))
    return lines


def function_sizes(source: str) -> list[tuple[str, int, int]]:
    """``(qualified name, first line, code lines)`` of each function in ``source``, docstrings left out."""
    tree = ast.parse(source)
    code = code_lines(source)
    found = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            name = f"{prefix}{child.name}" if hasattr(child, "name") else prefix
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                body = child.body
                if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None),
                                                                           ast.Constant) \
                        and isinstance(body[0].value.value, str):
                    docstring = set(range(body[0].lineno, body[0].end_lineno + 1))
                    body = body[1:]
                else:
                    docstring = set()
                span = set(range(body[0].lineno, child.end_lineno + 1)) if body else set()
                found.append((name, child.lineno, len((span - docstring) & code)))
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def offenders(folders=FOLDERS, module_lines=MODULE_LINES, function_lines=FUNCTION_CODE_LINES):
    """Modules over ``module_lines`` lines and functions over ``function_lines`` code lines under ``folders``.

    Returns
    -------
    tuple of (list of (Path, int), list of (Path, str, int, int))
        The modules with their line counts; the functions with their name, first line and code lines.
    """
    modules, functions = [], []
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            source = path.read_text()
            if len(source.splitlines()) > module_lines:
                modules.append((path, len(source.splitlines())))
            functions += [(path, name, line, size) for name, line, size in function_sizes(source)
                          if size > function_lines]
    return modules, functions


def summary(folders=FOLDERS) -> tuple[str, bool]:
    """The largest module and function, each offender, and whether the check passes."""
    sizes = [(len(p.read_text().splitlines()), p) for f in folders for p in f.rglob("*.py")]
    functions = [(size, path, name) for f in folders for path in f.rglob("*.py")
                 for name, _, size in function_sizes(path.read_text())]
    modules, long = offenders(folders)
    top_module, top_function = max(sizes), max(functions)
    lines = [f"largest module: {top_module[1].relative_to(ROOT)} ({top_module[0]} lines; limit {MODULE_LINES})",
             f"largest function: {top_function[1].relative_to(ROOT)}:{top_function[2]} ({top_function[0]} code "
             f"lines; limit {FUNCTION_CODE_LINES})",
             f"modules over the limit: {len(modules)}; functions over the limit: {len(long)}"]
    lines += [f"    {path.relative_to(ROOT)}: {n} lines" for path, n in modules]
    lines += [f"    {path.relative_to(ROOT)}:{line} {name}: {n} code lines" for path, name, line, n in long]
    return "\n".join(lines), not modules and not long


def main() -> int:
    text, passed = summary()
    print(text)
    print("check passed" if passed else "check FAILED")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
