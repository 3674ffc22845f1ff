"""Test configuration: the same run in any clone and any environment, offline by construction.

pytest imports this file before any test module, so the variables below are set before
huggingface_hub, datasets or transformers read them at import: the tests are offline whether or
not the Makefile exported them. ``MPLBACKEND`` is removed so that the notebooks nbval runs keep
IPython's inline figures (``MPLBACKEND=Agg``, common on CI images, turns them into text).
Hypothesis runs derandomised, without a database, so that CI is reproducible.

A sweep stores the measured roofline of its machine in its sidecar (``moesd.measure.hardware.measured_roofline``,
once per process). Its STREAM arrays are four times the last-level cache: on a machine that reports a
large cache (503 MB on one of this project's 2-core VMs) that takes 20 s, paid by the first sweep in each
test process. Sweeps under test store a quick roofline instead (small arrays and shapes, once per
process). No test runs the full-size measurement; ``tests/test_hardware.py`` checks
``measure_roofline`` at small sizes, and a test marked ``real_roofline`` sees the package's own
once-per-process ``measured_roofline``.

Tests in a module that uses torch are marked ``integration``: the module imports torch, transformers or a
moesd module whose import loads them (:func:`torch_loading_modules`, read from the package's source), or it calls
one of :data:`TORCH_CALLS`, the functions of torch-free modules (``moesd.zoo``, ``moesd.model.algorithm1``) that
import torch when called. ``pytest -m "not integration"`` runs the unit tests alone, and ``make test`` runs
everything. A test elsewhere can be marked ``@pytest.mark.integration`` by hand.
"""

import ast
import functools
import inspect
import os
import sys
import textwrap
from pathlib import Path

for _name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY"):
    os.environ[_name] = "1"
os.environ.pop("MPLBACKEND", None)
_STATE = Path(__file__).resolve().parents[1] / "_build" / ".state"  # as the Makefile keeps it
for _name, _folder in (("HF_HOME", "huggingface"), ("MPLCONFIGDIR", "matplotlib")):
    if _name not in os.environ:
        os.environ[_name] = str(_STATE / _folder)
        (_STATE / _folder).mkdir(parents=True, exist_ok=True)

_TOO_EARLY = sorted({"huggingface_hub", "datasets", "transformers"} & set(sys.modules))
if _TOO_EARLY:  # a plugin imported them first: their offline switches were read already
    raise RuntimeError(f"{', '.join(_TOO_EARLY)} imported before tests/conftest.py set the offline variables")

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

settings.register_profile("moesd", derandomize=True, database=None, max_examples=200, deadline=None)
settings.load_profile("moesd")

TORCH = ("torch", "transformers")

TORCH_CALLS = frozenset({"random_model", "noisy_copy", "parameter_counts", "hf_config", "parameter_bounds",
                         "appendix_c2_bounds", "trace_random_model", "build_models"})
"""Names of functions that build or load torch models when called, though their modules import no torch."""


def _top_level_imports(path: Path) -> set[str]:
    """Modules a source file imports when it is imported (not the imports inside its functions)."""
    found, pending = set(), list(ast.parse(path.read_text()).body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            pending += ast.iter_child_nodes(node)
    return found


@functools.lru_cache(maxsize=None)
def torch_loading_modules() -> frozenset:
    """torch, transformers, and the moesd modules whose import loads one of them (directly or through another)."""
    package = Path(__file__).resolve().parents[1] / "moesd"
    imports = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        imports[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = _top_level_imports(path)
    loading = set(TORCH)
    while True:
        more = {name for name, targets in imports.items() if name not in loading
                and any(t == m or t.startswith(m + ".") for t in targets for m in loading)}
        if not more:
            return frozenset(loading)
        loading |= more


def _imports_torch(module) -> bool:
    """Whether a test module imported a torch-loading module, or a name from one."""
    loading = torch_loading_modules()
    for value in vars(module).values():
        origin = value.__name__ if inspect.ismodule(value) else getattr(value, "__module__", None)
        if isinstance(origin, str) and any(origin == m or origin.startswith(m + ".") for m in loading):
            return True
    return False


@functools.lru_cache(maxsize=None)
def _calls_torch(function) -> bool:
    """Whether a test function's own source imports torch (``import``, ``importorskip``) or calls one of TORCH_CALLS."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in TORCH_CALLS or isinstance(node, ast.Name) and node.id in TORCH_CALLS:
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [alias.name if isinstance(node, ast.Import) else f"{node.module}.{alias.name}" for alias in node.names]
            if any(n == m or n.startswith(m + ".") for n in names for m in torch_loading_modules()):
                return True
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "importorskip" and node.args and \
                getattr(node.args[0], "value", None) in TORCH:
            return True
    return False


def pytest_collection_modifyitems(config, items):
    heavy = {}
    for item in items:
        module = getattr(item, "module", None)
        if module is None:
            continue
        if heavy.setdefault(module.__name__, _imports_torch(module)) or _calls_torch(getattr(item, "function", None)):
            item.add_marker(pytest.mark.integration)


@functools.lru_cache(maxsize=None)
def _quick_roofline(device: str, dtype: str, threads: int):
    """What ``moesd.measure.hardware.measured_roofline`` gives sweeps under test: a quick measurement, once per process."""
    from moesd.measure import hardware

    return hardware.measure_roofline(device, dtype, threads, quick=True)


@pytest.fixture(autouse=True)
def quick_sweep_roofline(request, monkeypatch):
    """Sweeps store :func:`_quick_roofline` in their sidecars, except in tests marked ``real_roofline``."""
    if not request.node.get_closest_marker("real_roofline"):
        from moesd.measure import hardware

        monkeypatch.setattr(hardware, "_measured_once", _quick_roofline)
