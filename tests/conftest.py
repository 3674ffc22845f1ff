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

Tests in a module that uses torch models (imports torch, transformers or a torch-importing moesd
module) are marked ``integration``; ``pytest -m "not integration"`` runs the unit tests alone, and ``make test``
runs everything. A test elsewhere can be marked ``@pytest.mark.integration`` by hand.
"""

import functools
import inspect
import os
import sys
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

MODEL_MODULES = ("torch", "transformers", "moesd.measure.sd", "moesd.routing.capture", "moesd.measure.bench", "moesd.zoo")
"""Modules whose use makes a test module model-heavy."""


def _uses_models(module) -> bool:
    """Whether a test module imported torch, transformers or a torch-importing moesd module."""
    for value in vars(module).values():
        origin = value.__name__ if inspect.ismodule(value) else getattr(value, "__module__", None)
        if isinstance(origin, str) and any(origin == m or origin.startswith(m + ".") for m in MODEL_MODULES):
            return True
    return False


def pytest_collection_modifyitems(config, items):
    heavy = {}
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and heavy.setdefault(module.__name__, _uses_models(module)):
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
