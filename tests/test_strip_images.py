"""tools/strip_images.py: committed chapters lose their PNGs, keep what nbval compares, and still
match the executed copy in the book's execution cache (so make book shows the figures)."""

import base64
import importlib.util
import subprocess
import sys
from pathlib import Path

import nbformat
from jupyter_cache import get_cache
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

_SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "strip_images.py"
_spec = importlib.util.spec_from_file_location("strip_images", _SCRIPT)
strip_images = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(strip_images)

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n not a real image").decode()
"""Any base64 string: nothing here decodes the image."""

FIGURE_CELL = (
    "from IPython.display import display\n"
    f"display({{'image/png': '{PNG}', 'text/plain': '<Figure size 640x480 with 1 Axes>'}}, raw=True)\n"
    "print('gamma = 4')"
)


def _executed_notebook() -> nbformat.NotebookNode:
    """A small notebook as jupyter-execute leaves it: a figure, a table, a stream, execution metadata."""
    metadata = {"tags": ["hide-input"], "execution": {"iopub.status.busy": "2026-01-01T00:00:00.000000Z"}}
    figure = new_code_cell(FIGURE_CELL, execution_count=1, metadata=metadata)
    figure.outputs = [
        new_output("display_data", data={"image/png": PNG, "text/plain": "<Figure size 640x480 with 1 Axes>"},
                   metadata={"image/png": {"width": 640, "height": 480}}),
        new_output("stream", name="stdout", text="gamma = 4\n"),
    ]
    table = new_code_cell("x = 1", execution_count=2)
    table.outputs = [new_output("execute_result", data={"text/html": "<table></table>", "text/plain": "x"},
                                execution_count=2)]
    nb = new_notebook(cells=[new_markdown_cell("# A chapter"), figure, table])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def test_strip_removes_images_and_keeps_the_rest():
    nb = _executed_notebook()
    reference = nbformat.from_dict(nb)  # a deep copy
    assert strip_images.strip_images(nb) == 1
    figure = nb.cells[1]
    assert figure.outputs[0].data == {"text/plain": "<Figure size 640x480 with 1 Axes>"}
    assert "image/png" not in figure.outputs[0].metadata
    assert figure.outputs[1] == reference.cells[1].outputs[1]
    assert figure.metadata == reference.cells[1].metadata
    assert nb.cells[2] == reference.cells[2]
    assert nb.metadata == reference.metadata
    assert strip_images.strip_images(nb) == 0  # idempotent


def test_stripped_notebook_matches_the_cached_execution(tmp_path):
    executed = tmp_path / "chapter.ipynb"
    nbformat.write(_executed_notebook(), executed)
    cache = get_cache(str(tmp_path / "cache"))
    cache.cache_notebook_file(str(executed))
    stripped = nbformat.read(executed, as_version=4)
    strip_images.strip_images(stripped)
    cache.match_cache_notebook(stripped)  # raises KeyError where the key changed
    _, merged = cache.merge_match_into_notebook(stripped)
    assert merged.cells[1].outputs[0].data["image/png"] == PNG


def test_script_rewrites_only_notebooks_with_images(tmp_path):
    with_images, without = tmp_path / "a.ipynb", tmp_path / "b.ipynb"
    nb = _executed_notebook()  # new cells get random ids: one notebook, written twice
    nbformat.write(nb, with_images)
    strip_images.strip_images(nb)
    nbformat.write(nb, without)
    before = without.read_bytes()
    subprocess.run([sys.executable, str(_SCRIPT), str(with_images), str(without)], check=True, capture_output=True)
    assert without.read_bytes() == before
    assert with_images.read_bytes() == before


def test_nbval_passes_on_a_stripped_notebook_whose_run_makes_images(tmp_path):
    """nbval itself is the reference: it must ignore the PNG that the run produces and the file lacks."""
    path = tmp_path / "chapter.ipynb"
    nb = _executed_notebook()
    nb.cells = nb.cells[:2]
    strip_images.strip_images(nb)
    nbformat.write(nb, path)
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--nbval", "-q", path.name],
                         cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout


def test_committed_chapters_hold_no_png():
    """The committed chapters went through make outputs: their figures live in the execution cache and
    the built book, not in git (one full re-execution used to add about 4 MB of PNG to the repository)."""
    chapters = sorted((Path(__file__).resolve().parents[1] / "book").glob("*.ipynb"))
    assert chapters
    with_images = {path.name: strip_images.strip_images(nbformat.read(path, as_version=4)) for path in chapters}
    assert not {name: count for name, count in with_images.items() if count}, \
        "run make outputs (or python tools/strip_images.py book/*.ipynb) before committing chapters"
