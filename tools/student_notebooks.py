"""Write the chapters as students get them: the notebooks without the exercises' solutions or the checks' answers.

Each chapter keeps every cell a reader sees, outputs included, except:

* the cells of a solution, from the Markdown cell that opens it (``{solution-start}``) to the one that closes it
  (``{solution-end}``), both included, which become one Markdown cell ("Your solution to ...") and one empty code
  cell for it;
* a solution written as one ``{solution}`` block, removed from its cell;
* the hidden answer of each check question (a ``{admonition} Answer`` block), removed from its cell.

Run: python tools/student_notebooks.py --out _build/student NOTEBOOK...   (``make student`` runs it on book/*.ipynb)
"""

import argparse
import re
import sys
from pathlib import Path

import nbformat

ANSWER = re.compile(r"\n?```\{admonition\} Answer\n.*?\n```[ \t]*(?=\n|$)", re.DOTALL)
"""A check question's answer block (a dropdown admonition titled Answer) in a Markdown cell."""
SOLUTION_BLOCK = re.compile(r"\n?```\{solution\}[^\n]*\n.*?\n```[ \t]*(?=\n|$)", re.DOTALL)
"""A solution written as one block (``{solution}``), as opposed to ``{solution-start}`` ... ``{solution-end}``."""
EXERCISE_LABEL = re.compile(r"\{solution-start\}\s*([\w-]+)")
"""The label of the exercise a ``{solution-start}`` cell opens the solution of."""


def student_cells(cells: list) -> list:
    """The cells of a chapter with its solutions and answers taken out (new cells for the student's work).

    Parameters
    ----------
    cells : list of nbformat.NotebookNode
        A notebook's cells.

    Returns
    -------
    list of nbformat.NotebookNode
        The cells kept, in order, and for each solution removed a Markdown cell naming its exercise and an
        empty code cell.

    Raises
    ------
    ValueError
        If a solution is opened and not closed, or closed and not opened.
    """
    kept, label = [], None
    for cell in cells:
        text = "".join(cell.source)
        if cell.cell_type == "markdown" and "{solution-start}" in text:
            if label is not None:
                raise ValueError(f"the solution of {label} is not closed before the next one opens")
            match = EXERCISE_LABEL.search(text)
            label = match.group(1) if match else "the exercise above"
        if label is None:
            if cell.cell_type == "markdown":
                if "{solution-end}" in text:
                    raise ValueError("a {solution-end} without its {solution-start}")
                cell.source = SOLUTION_BLOCK.sub("", ANSWER.sub("", text))
            kept.append(cell)
        elif cell.cell_type == "markdown" and "{solution-end}" in text:
            kept.append(nbformat.v4.new_markdown_cell(f"**Your solution** to exercise `{label}` (the exercise above):",
                                                      id=f"your-{label}"))
            kept.append(nbformat.v4.new_code_cell("", id=f"your-{label}-code"))
            label = None
    if label is not None:
        raise ValueError(f"the solution of {label} is never closed")
    return kept


def write_student_notebook(source: Path, out_dir: Path) -> Path:
    """Write ``source``'s student version to ``out_dir`` under the same name; return its path."""
    notebook = nbformat.read(source, as_version=4)
    notebook.cells = student_cells(notebook.cells)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / source.name
    nbformat.write(notebook, target)
    return target


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="folder of the student notebooks")
    parser.add_argument("notebooks", nargs="+", type=Path, help="chapter notebooks (.ipynb)")
    args = parser.parse_args(argv)
    for source in args.notebooks:
        try:
            target = write_student_notebook(source, args.out)
        except ValueError as error:
            print(f"{source}: {error}", file=sys.stderr)
            return 1
        print(f"{source} -> {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
