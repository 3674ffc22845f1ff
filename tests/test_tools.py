"""tools/layers.py (the import graph's layers, no arrow back up), tools/mutants.py (the mutation check) and
tools/sizes.py (no module over 500 lines, no function over 80 code lines)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

_TOOLS = Path(__file__).resolve().parents[1] / "tools"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"tools_{name}", _TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[f"tools_{name}"] = module  # a dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


layers = _load("layers")
mutants = _load("mutants")
sizes = _load("sizes")


def test_the_package_has_no_new_arrow_back_up_and_no_new_circle():
    graph = layers.import_graph()
    assert {tuple(group) for group in layers.cycles(graph)} <= set(layers.KNOWN_CIRCLES)
    assert set(layers.back_arrows(graph)) <= set(layers.KNOWN)
    text, passed = layers.report(graph)
    assert passed and "0 new" in text


def test_every_module_has_its_layer_and_the_root_package_holds_only_itself():
    graph = layers.import_graph()
    surface = layers.layer_of("moesd")
    assert [module for module in graph if layers.layer_of(module) == surface] == ["moesd"]
    assert layers.layer_of("moesd.theory.experts") < layers.layer_of("moesd.engine.sd") < layers.layer_of(
        "moesd.measure.bench") < layers.layer_of("moesd.plots.theory")


def test_the_engine_imports_nothing_above_it():
    graph = layers.import_graph()
    engine = layers.layer_of("moesd.engine")
    modules = [m for m in graph if m == "moesd.engine" or m.startswith("moesd.engine.")]
    assert {"moesd.engine", "moesd.engine.sd", "moesd.engine.static_cache", "moesd.engine.timing"} <= set(modules)
    assert all(layers.layer_of(target) <= engine for m in modules for target in graph[m])


def test_a_back_arrow_and_a_circle_are_found_in_a_made_up_graph():
    graph = {"moesd.theory.a": {"moesd.engine.b"}, "moesd.engine.b": {"moesd.engine.c"},
             "moesd.engine.c": {"moesd.engine.b"}}
    assert layers.back_arrows(graph) == [("moesd.theory.a", "moesd.engine.b")]
    assert layers.cycles(graph) == [["moesd.engine.b", "moesd.engine.c"]]
    text, passed = layers.report(graph, known={}, known_circles={})
    assert not passed and "NEW" in text
    assert layers.depths(graph)["moesd.theory.a"] == 2  # the arrow closing the circle is left out
    with pytest.raises(ValueError, match="in no layer"):
        layers.layer_of("elsewhere.module")


def test_imports_are_read_inside_functions_and_relative_ones_resolved(tmp_path):
    package = tmp_path / "moesd"
    (package / "engine").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "engine" / "__init__.py").write_text("")
    (package / "engine" / "sd.py").write_text("def f():\n    from moesd.measure import bench\n")
    (package / "engine" / "timing.py").write_text("from . import sd\nfrom .sd import f\n")
    (package / "measure").mkdir()
    (package / "measure" / "__init__.py").write_text("")
    (package / "measure" / "bench.py").write_text("import numpy\nimport moesd\n")
    graph = layers.import_graph(package)
    assert graph["moesd.engine.sd"] == {"moesd.measure.bench"}
    assert graph["moesd.engine.timing"] == {"moesd.engine.sd"}
    assert graph["moesd.measure.bench"] == {"moesd"}
    assert layers.depths(graph) == {"moesd": 0, "moesd.engine": 0, "moesd.measure": 0, "moesd.measure.bench": 1,
                                    "moesd.engine.sd": 2, "moesd.engine.timing": 3}
    assert layers.back_arrows(graph) == [("moesd.engine.sd", "moesd.measure.bench"),
                                         ("moesd.measure.bench", "moesd")]


def test_the_command_prints_the_layers_and_passes():
    result = subprocess.run([sys.executable, str(_TOOLS / "layers.py")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
    assert "engine" in result.stdout and "check passed" in result.stdout


SOURCE = '''"""Docstring 1 < 2."""
LIMIT = 2.0**53
TABLE = {"a": 3}


def f(x, y=0.5):
    """Not mutated: 1 + 1."""
    if x < 1 and not y:
        raise ValueError(f"x must be >= {1 + 1}")
    return np.ceil(np.round(x * 2, 9)) + abs(-y) + (x > 1e-12).any()
'''


def test_mutation_sites_skip_docstrings_messages_and_tables():
    found = [(m.line, m.description) for m in mutants.mutants(SOURCE)]
    assert (2, "53 -> 54") in found and (2, "** -> *") in found
    assert not any(line in (1, 3, 7, 9) for line, _ in found)  # docstrings, the table, the raise
    for description in ("< -> <=", "and -> or", "drop the unary not", "0.5 -> 1.0", "ceil -> floor",
                        "drop the round()", "drop the abs()", "any -> all", "1e-12 -> 0.0", "* -> /", "+ -> -"):
        assert description in {d for _, d in found}, description


def test_each_mutant_changes_one_site_and_compiles():
    every = mutants.mutants(SOURCE)
    sources = {mutants.mutated(SOURCE, m.index) for m in every}
    assert len(sources) == len(every)
    for source in sources:
        compile(source, "mutant", "exec")
    clip = next(m for m in every if m.description == "drop the round()")
    assert "np.ceil(x * 2)" in mutants.mutated(SOURCE, clip.index)


def test_relevant_tests_put_the_module_s_own_first_and_leave_torch_files_out():
    found = [path.name for path in mutants.relevant_tests(_TOOLS.parent / "moesd" / "theory" / "experts.py")]
    assert found[0] == "test_experts.py" and "test_boundaries.py" in found
    assert "test_sd.py" not in found and "test_hardware.py" not in found  # they import torch at the top


SIZED = '''"""Module docstring."""


def f(x):
    """A docstring
    of three lines
    that does not count."""
    # a comment that does not count

    y = (x +
         1)
    return y


class C:
    def g(self):
        def inner():
            return 1
        return inner()
'''


def test_code_lines_leave_out_docstrings_comments_and_blank_lines():
    found = {name: size for name, _, size in sizes.function_sizes(SIZED)}
    assert found == {"f": 3, "C.g": 3, "C.g.inner": 1}


def test_a_long_module_and_a_long_function_are_offenders(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(81))
    (tmp_path / "long.py").write_text("def long():\n" + body + "\n" + "\n" * 430)
    (tmp_path / "short.py").write_text("def short():\n" + body.replace("x80 = 80", "") + "\n")
    modules, functions = sizes.offenders([tmp_path])
    assert [(path.name, n) for path, n in modules] == [("long.py", 512)]
    assert [(path.name, name, n) for path, name, _, n in functions] == [("long.py", "long", 81)]


def test_the_package_and_tools_keep_to_the_size_limits():
    modules, functions = sizes.offenders()
    assert not modules and not functions, (modules, functions)
