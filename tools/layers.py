"""The import graph of the ``moesd`` package in layers, and the arrows that go back up.

Run: ``python tools/layers.py`` (exit status 1 when an arrow goes back up that :data:`KNOWN` does not list,
or when modules import each other in a circle).

Every module's imports are read from its source with :mod:`ast`, nothing is imported: the imports inside
functions count too (a lazy import is an arrow all the same). The package's concepts stand in
:data:`LAYERS`, bottom to top; an arrow from a module to one in a higher layer goes *back up*. Within a
layer arrows may go either way, but never in a circle. Each module's *depth* is the longest chain of
imports below it (0: it imports no other moesd module).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "moesd"

LAYERS = (
    ("base", ("moesd._checks", "moesd._files", "moesd._numeric")),
    ("theory", ("moesd.theory",)),
    ("model shapes", ("moesd.families", "moesd.architecture", "moesd.zoo")),
    ("the paper's numbers", ("moesd.paper_tables",)),
    ("engines", ("moesd.engine",)),
    ("routing", ("moesd.routing",)),
    ("predictor", ("moesd.predictor",)),
    ("studies", ("moesd.measure",)),
    ("analysis", ("moesd.model", "moesd.paper")),
    ("presentation", ("moesd.narration", "moesd.plots", "moesd.chapter", "moesd.lab", "moesd.cli")),
    ("package surface", ("moesd",)),
)
"""The concepts bottom to top, each with the modules it holds (a package holds its submodules)."""

KNOWN = {}
"""Arrows back up that were there when this check was written, each with the work that removes it."""

KNOWN_CIRCLES = {}
"""Circles that were there when this check was written (sorted module names), with how they close."""


def module_name(path: Path, package: Path = PACKAGE) -> str:
    """``moesd.x.y`` of a source file under ``package`` (a package's ``__init__.py``: the package)."""
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Each module of ``package`` and the package's modules it imports (anywhere in its source).

    ``from a.b import c`` is an arrow to ``a.b.c`` where that is a module, else to ``a.b``.
    """
    paths = {module_name(path, package): path for path in sorted(package.rglob("*.py"))}
    root = package.name
    graph = {}
    for name, path in paths.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(here.split(".")[:len(here.split(".")) - node.level + 1] + ([base] if base else []))
                targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base for a in node.names}
        graph[name] = {t for t in targets if (t == root or t.startswith(root + ".")) and t != name}
    return graph


def layer_of(module: str, layers=LAYERS) -> int:
    """Index in ``layers`` of the concept that holds ``module`` (its longest matching prefix; the root package
    holds itself alone)."""
    best, length = None, -1
    for index, (_, prefixes) in enumerate(layers):
        for prefix in prefixes:
            inside = module == prefix or ("." in prefix and module.startswith(prefix + "."))
            if inside and len(prefix) > length:
                best, length = index, len(prefix)
    if best is None:
        raise ValueError(f"{module} is in no layer of LAYERS: add it to one")
    return best


def back_arrows(graph: dict[str, set[str]], layers=LAYERS) -> list[tuple[str, str]]:
    """Arrows ``(importer, imported)`` from a layer to a higher one, sorted."""
    return sorted((a, b) for a, targets in graph.items() for b in targets if layer_of(b, layers) > layer_of(a, layers))


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other in a circle (strongly connected, more than one module)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while not group or group[-1] != node:
                group.append(stack.pop())
                on_stack.discard(group[-1])
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def depths(graph: dict[str, set[str]]) -> dict[str, int]:
    """Longest chain of imports below each module (0: it imports no module of the package); in a circle, the
    arrow that closes it is left out."""
    depth: dict[str, int] = {}
    visiting: set[str] = set()

    def of(node):
        if node not in depth:
            visiting.add(node)
            depth[node] = 1 + max((of(t) for t in graph.get(node, ()) if t in graph and t not in visiting),
                                  default=-1)
            visiting.discard(node)
        return depth[node]

    for node in graph:
        of(node)
    return depth


def report(graph: dict[str, set[str]], layers=LAYERS, known=KNOWN, known_circles=KNOWN_CIRCLES) -> tuple[str, bool]:
    """The layers with their modules' depths, the arrows back up and the circles; and whether the check passes."""
    circles = cycles(graph)
    depth = depths(graph)
    lines = []
    for index in reversed(range(len(layers))):
        members = sorted((m for m in graph if layer_of(m, layers) == index), key=lambda m: (-depth.get(m, 0), m))
        lines.append(f"{index} {layers[index][0]} ({len(members)} modules)")
        lines += [f"    {depth.get(m, '?'):>2}  {m}" for m in members]
    arrows = back_arrows(graph, layers)
    new = [arrow for arrow in arrows if arrow not in known]
    lines.append(f"arrows back up: {len(arrows)} ({len(arrows) - len(new)} known, {len(new)} new)")
    lines += [f"    {a} -> {b}" + (f"   known: {known[a, b]}" if (a, b) in known else "   NEW") for a, b in arrows]
    lines += [f"    gone, drop it from KNOWN: {a} -> {b}" for a, b in sorted(set(known) - set(arrows))]
    new_circles = [group for group in circles if tuple(group) not in known_circles]
    lines.append(f"circles: {len(circles)} ({len(circles) - len(new_circles)} known, {len(new_circles)} new)")
    lines += [f"    {' <-> '.join(group)}" + (f"   known: {known_circles[tuple(group)]}" if tuple(group) in
                                              known_circles else "   NEW") for group in circles]
    return "\n".join(lines), not new and not new_circles


def main() -> int:
    text, passed = report(import_graph())
    print(text)
    print("check passed" if passed else "check FAILED: an arrow goes back up or modules import in a circle")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
