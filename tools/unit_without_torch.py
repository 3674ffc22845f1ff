"""Check the unit-test layer's marking: do the tests that are not marked ``integration`` run without torch?

Run: ``flock /tmp/moesd-cpu.lock .venv/bin/python tools/unit_without_torch.py [tests/test_x.py ...]`` (a few minutes:
one process per test file).

``tests/conftest.py`` marks a test ``integration`` when it uses torch, read from the source (the imports of its
module, the torch-loading calls in its function). This runs each test file's unit tests (``-m "not
integration"``) in a process of its own in which, once collection is over, importing torch or transformers
raises ``ImportError``: a unit test that needs them fails, and is listed. A file whose collection itself
imports torch has every test marked integration by the conftest, so none of its tests run here. Exit status 1
when a unit test needed torch.
"""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PLUGIN = '''
import sys

import pytest

BLOCKED = ("torch", "transformers")


class _Refused:
    """A loader that refuses to run the module: a probe (``importlib.util.find_spec``) still finds it."""

    def create_module(self, spec):
        raise ImportError(f"UNIT-TEST-IMPORTED-TORCH: {spec.name}")

    def exec_module(self, module):
        raise ImportError(f"UNIT-TEST-IMPORTED-TORCH: {module.__name__}")


class _Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            import importlib.machinery

            return importlib.machinery.ModuleSpec(name, _Refused())
        return None


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    if not any(name.split(".")[0] in BLOCKED for name in sys.modules):
        sys.meta_path.insert(0, _Blocker())
'''


def check(path: Path, plugin_dir: Path) -> list[str]:
    """The unit tests of ``path`` that fail without torch and transformers (they pass with them: the suite is green)."""
    result = subprocess.run([sys.executable, "-m", "pytest", str(path), "-m", "not integration", "-q", "-p",
                             "no:cacheprovider", "-p", "no_torch_after_collection", "-rf", "--tb=line"],
                            cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": f"{plugin_dir}:{ROOT}", "OMP_NUM_THREADS": "1"})
    if result.returncode not in (0, 1, 5):  # 5: no unit test in the file
        raise RuntimeError(f"pytest {path.name} stopped with status {result.returncode}:\n{result.stdout[-2000:]}")
    return [line.split(" ")[1] for line in result.stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))]


def main(argv) -> int:
    import tempfile

    files = [Path(a) for a in argv] or sorted((ROOT / "tests").glob("test_*.py"))
    needing = []
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "no_torch_after_collection.py").write_text(PLUGIN)
        for path in files:
            found = check(path.resolve(), Path(folder))
            print(f"{path.name}: {'; '.join(found) if found else 'ok'}", flush=True)
            needing += found
    print(f"{len(needing)} unit test(s) needed torch" + (": mark them integration" if needing else ""))
    return 1 if needing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
