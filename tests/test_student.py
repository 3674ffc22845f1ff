"""make student (tools/student_notebooks.py): the chapters without their solutions and check answers."""

import importlib.util
import json
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "book").glob("*.ipynb"))
_spec = importlib.util.spec_from_file_location("student_notebooks", ROOT / "tools" / "student_notebooks.py")
student_notebooks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(student_notebooks)


def _text(cells, kind=None):
    return ["".join(c["source"]) for c in cells if kind is None or c["cell_type"] == kind]


def _solution_code_cells(cells) -> int:
    """Code cells inside {solution-start} ... {solution-end}, counted independently of the tool."""
    count, inside = 0, False
    for cell in cells:
        text = "".join(cell["source"])
        inside = inside or (cell["cell_type"] == "markdown" and "{solution-start}" in text)
        count += inside and cell["cell_type"] == "code"
        inside = inside and not (cell["cell_type"] == "markdown" and "{solution-end}" in text)
    return count


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("student")
    assert student_notebooks.main(["--out", str(out)] + [str(p) for p in CHAPTERS]) == 0
    return out


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_no_solution_or_answer_is_left(written, chapter):
    cells = json.loads((written / chapter.name).read_text())["cells"]
    text = "\n".join(_text(cells))
    for marker in ("{solution-start}", "{solution-end}", "{solution}", "{admonition} Answer"):
        assert marker not in text, f"{chapter.name}: {marker} left in the student notebook"
    assert not any("acceptance-solution" in c.get("metadata", {}).get("tags", []) for c in cells)
    nbformat.validate(nbformat.reads(json.dumps(json.load(open(written / chapter.name))), as_version=4))


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_every_exercise_and_check_stays_with_room_for_an_answer(written, chapter):
    original = json.loads(chapter.read_text())["cells"]
    student = json.loads((written / chapter.name).read_text())["cells"]
    exercises = sum(t.count("{exercise}") for t in _text(original, "markdown"))
    assert sum(t.count("{exercise}") for t in _text(student, "markdown")) == exercises
    assert sum(t.count("**Check:**") for t in _text(student, "markdown")) == \
        sum(t.count("**Check:**") for t in _text(original, "markdown"))
    solutions = sum(t.count("{solution-start}") for t in _text(original, "markdown"))
    ids = [c.get("id") for c in student]
    assert sum(i.startswith("your-") and not i.endswith("-code") for i in ids) == solutions
    # every other code cell is kept, in order, with its source
    kept = [c for c in student if c["cell_type"] == "code" and not c.get("id", "").startswith("your-")]
    assert len(kept) == sum(c["cell_type"] == "code" for c in original) - _solution_code_cells(original)


def test_the_question_of_a_check_survives_its_answer():
    cell = nbformat.v4.new_markdown_cell("**Check:** why?\n\n```{admonition} Answer\n:class: dropdown\nBecause.\n```\n"
                                         "\nThe text after it.")
    (kept,) = student_notebooks.student_cells([cell])
    assert "why?" in kept.source and "Because" not in kept.source and "The text after it." in kept.source


@pytest.mark.parametrize("cells, message", [
    (["```{solution-start} ex-a\n```", "```{solution-start} ex-b\n```"], "not closed"),
    (["```{solution-end}\n```"], "without its"),
    (["```{solution-start} ex-a\n```"], "never closed"),
])
def test_unbalanced_solutions_are_refused(cells, message):
    with pytest.raises(ValueError, match=message):
        student_notebooks.student_cells([nbformat.v4.new_markdown_cell(c) for c in cells])
