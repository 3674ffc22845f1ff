"""What a chapter needs besides its science: glued numbers that read outside the book, and its data.

The built book puts each glued value (``{glue:text}`key``` in the prose) into its sentence; JupyterLab
(jupyterlab-myst renders MyST but not glue roles) shows the key instead. So every chapter glues through
:func:`glue`, which records the value in this kernel as well as handing it to myst-nb, and ends with a cell
tagged ``remove-cell`` (hidden in the book) that shows :func:`numbers_on_this_page`: every key its prose
uses, the value this kernel glued (or, before the cells ran, the value saved in the notebook), and the words
before it, so a reader in JupyterLab finds each number where the text needs it.

:func:`reading_time` measures what a chapter asks of a reader by its length, so that its stated time is
computed, not guessed. A notebook downloaded from the book needs the ``moesd`` package and the repository's ``data/`` folder;
:func:`data_folder` says exactly what is missing when it is not there.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

GLUED: dict[str, str] = {}
"""Values glued by :func:`glue` in this process, by key (the latest value of a key wins)."""

GLUE_ROLE = re.compile(r"\{glue:text\}`([A-Za-z0-9_.:-]+)`")
"""A ``{glue:text}`` role in a chapter's Markdown; group 1 is the key (a role quoted as code, such as
```{glue:text}``` in a sentence about roles, names no key)."""

_SAVED_MIME = "application/papermill.record/text/plain"
"""The mime type under which myst-nb saves a value glued with ``display=False``."""


def glue(name: str, value, display: bool = False):
    """Glue ``value`` under ``name`` for the book (myst-nb) and record its text for :func:`numbers_on_this_page`.

    Parameters
    ----------
    name : str
        The key, unique in the book.
    value : object
        What the text shows (its ``str``).
    display : bool, default False
        Also show the value as the cell's output (myst-nb's ``display``).

    Returns
    -------
    object
        ``value``.
    """
    from myst_nb import glue as myst_glue

    GLUED[name] = str(value)
    myst_glue(name, value, display=display)
    return value


def _saved_values(cells: list) -> dict[str, str]:
    """The glued values a notebook's saved outputs hold, by key (myst-nb's scrapbook metadata)."""
    values = {}
    for cell in cells:
        for output in cell.get("outputs", []):
            name = output.get("metadata", {}).get("scrapbook", {}).get("name")
            text = output.get("data", {}).get(_SAVED_MIME)
            if name and text is not None:
                text = "".join(text) if isinstance(text, list) else str(text)
                values[name] = text[1:-1] if len(text) > 1 and text[0] == text[-1] == "'" else text
    return values


def _other_page(path: Path) -> dict[str, str]:
    """The glued values saved in another page's notebook (none if it is not there)."""
    if not path.is_file():
        return {}
    return _saved_values(json.loads(path.read_text(encoding="utf-8"))["cells"])


def _cells(notebook, hint: str = "") -> list[dict]:
    """The cells of chapter ``notebook``, after refusing a path that is not a notebook file (``hint``: what to give)."""
    path = Path(notebook)
    if not path.is_file() or path.suffix != ".ipynb":
        raise ValueError(f"notebook {str(path)!r} is not a notebook file (.ipynb){hint}")
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def numbers_on_this_page(notebook, context: int = 60) -> pd.DataFrame:
    """Every glued number the prose of ``notebook`` uses, in reading order, with the words before it.

    Parameters
    ----------
    notebook : str or os.PathLike
        The chapter's ``.ipynb`` (a chapter's kernel runs in ``book/``, so its file name is enough).
    context : int, default 60
        Characters of the sentence before the number to show (Markdown roles and math left as written).

    Returns
    -------
    pandas.DataFrame
        Columns ``key``, ``value`` (this kernel's :func:`glue`, else the notebook's saved output, else
        ``"(run the cells above)"``; a key ``page.ipynb::name`` is read from that notebook, beside ``notebook``) and
        ``in the text`` (the words before the number, ``...`` first),
        one row per use of a key.

    Raises
    ------
    ValueError
        If ``notebook`` is not a notebook file.
    """
    path = Path(notebook)
    cells = _cells(path, " here; give the chapter's file name from the folder its kernel runs in (book/)")
    saved = _saved_values(cells)
    rows = []
    for cell in cells:
        if cell["cell_type"] != "markdown":
            continue
        text = "".join(cell["source"])
        for match in GLUE_ROLE.finditer(text):
            key = re.sub(r"(?<!:):[^:]*$", "", match.group(1))  # a format spec (``key:.2f``) left out
            before = " ".join(text[:match.start()].split())[-context:]
            if "::" in key:  # a value glued by another page of the book (myst-nb's ``page.ipynb::key``)
                page, name = key.split("::", 1)
                value = _other_page(path.parent / page).get(name, "(run that page's cells)")
            else:
                value = GLUED.get(key, saved.get(key, "(run the cells above)"))
            rows.append({"key": key, "value": value, "in the text": "..." + before})
    return pd.DataFrame(rows, columns=["key", "value", "in the text"])


def data_folder() -> Path:
    """The ``data/`` folder the chapters read (``MOESD_DATA``, else the repository's), checked to be there.

    Raises
    ------
    FileNotFoundError
        Saying what to install or set when the folder is missing, e.g. for a chapter downloaded from the
        book and run with ``moesd`` installed from a wheel (which holds no ``data/``).
    """
    from moesd.paper_tables import DATA_DIR

    folder = Path(os.environ.get("MOESD_DATA", DATA_DIR))
    if not (folder / "paper").is_dir():
        raise FileNotFoundError(
            f"this chapter reads the moesd repository's data/ folder, not found at {folder}. Run it from a clone of "
            "the repository with the package installed from it (in the clone: make lab, or pip install -e . and "
            "jupyter lab book/), or set MOESD_DATA to the data/ folder of a clone")
    return folder


WORDS_PER_MINUTE = 200
"""Reading speed of prose, words a minute (a common figure for technical text; Jupyter Book's own estimate)."""
CODE_LINES_PER_MINUTE = 10
"""Reading speed of code, lines a minute (a stated choice: code is read more slowly than prose)."""
HIDDEN_TAGS = ("remove-cell", "remove-input", "hide-input", "hide-cell")
"""Cell tags whose source a reader of the book does not see unless they open it."""


@dataclass(frozen=True)
class ReadingTime:
    """What a chapter asks of a reader, its exercises' solutions left out.

    Attributes
    ----------
    words : int
        Words of the Markdown cells (directive lines such as fences and options not counted).
    code_lines : int
        Non-blank lines of the code cells a reader sees (none tagged with one of :data:`HIDDEN_TAGS`).
    minutes : int
        ``words / WORDS_PER_MINUTE + code_lines / CODE_LINES_PER_MINUTE``, rounded up.
    """

    words: int
    code_lines: int
    minutes: int


_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*$")


def _skipped_lines(text: str, skip: tuple[str, ...], state: list) -> list[bool]:
    """For each line of a Markdown cell, whether it lies in a skipped section; ``state`` is ``[level or None]``,
    the level of the skipped section open at the cell's start, updated in place."""
    flags, fences = [], 0
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fences = fences - 1 if line.strip() == "```" and fences else fences + 1
        heading = _HEADING.match(line) if not fences else None
        if heading:
            level, title = len(heading.group(1)), heading.group(2)
            if state[0] is not None and level <= state[0]:
                state[0] = None
            if state[0] is None and any(title.startswith(prefix) for prefix in skip):
                state[0] = level
        flags.append(state[0] is not None)
    return flags


def reading_time(notebook, skip: tuple[str, ...] = ()) -> ReadingTime:
    """The reading time of a chapter notebook: its prose and visible code, outside the exercises' solutions.

    Cells from a ``{solution-start}`` cell to its ``{solution-end}`` cell are the solutions, which a student reads
    while doing the exercise, not while reading the chapter.

    Parameters
    ----------
    notebook : str or os.PathLike
        The chapter's ``.ipynb``.
    skip : tuple of str, default ()
        Sections left out: a heading whose title starts with one of these opens a skipped section, which runs to
        the next heading of the same or a higher level (its subsections included).

    Raises
    ------
    ValueError
        If ``notebook`` is not a notebook file.
    """
    words = code_lines = 0
    in_solution, state, hidden = False, [None], set(HIDDEN_TAGS)
    for cell in _cells(notebook):
        text = "".join(cell["source"])
        if cell["cell_type"] == "markdown" and "{solution-start}" in text:
            in_solution = True
        if cell["cell_type"] == "markdown":
            skipped = _skipped_lines(text, skip, state)
            if not in_solution:
                words += sum(len(line.split()) for line, out in zip(text.splitlines(), skipped)
                             if not out and not line.lstrip().startswith(("```", ":")))
        elif not (in_solution or state[0] is not None or set(cell.get("metadata", {}).get("tags", [])) & hidden):
            code_lines += sum(1 for line in text.splitlines() if line.strip())
        if cell["cell_type"] == "markdown" and "{solution-end}" in text:
            in_solution = False
    minutes = math.ceil(words / WORDS_PER_MINUTE + code_lines / CODE_LINES_PER_MINUTE)
    return ReadingTime(words, code_lines, minutes)


def reading_minutes(notebook) -> int:
    """:attr:`ReadingTime.minutes` of :func:`reading_time`: the minutes a chapter's opening states."""
    return reading_time(notebook).minutes


def _markdown_cells(notebook) -> list[str]:
    return ["".join(cell["source"]) for cell in _cells(notebook) if cell["cell_type"] == "markdown"]


_LIST_ITEM = re.compile(r"^\s*(?:[*+-]|\d+\.)\s")
_ROLE_TARGET = re.compile(r"(\{[a-z:]+\}`[^`<]*?)\s*<[^>`]*>`")
"""A role's explicit target (``{term}`text <target>```), which the reader does not see."""


def paragraph_words(notebook) -> list[int]:
    """The length in words of every prose paragraph of a chapter's Markdown, in reading order.

    A paragraph is a run of lines between blank lines, and each list item is one; headings, tables
    (lines starting with ``|``), display math (``$$`` blocks) and directive lines (fences and ``:option:`` lines) are
    not prose. The text inside a directive (an admonition's, an exercise's) is; a role's explicit target
    (``{term}`text <target>```) is not.

    Raises
    ------
    ValueError
        If ``notebook`` is not a notebook file.
    """
    lengths = []
    for text in _markdown_cells(notebook):
        text = _ROLE_TARGET.sub(r"\1`", text)
        words, in_math = 0, False
        for line in text.splitlines() + [""]:
            stripped = line.strip()
            if stripped.startswith("$$") and not (in_math is False and stripped.endswith("$$") and len(stripped) > 2):
                in_math = not in_math
                continue
            boundary = (not stripped or stripped.startswith(("#", "|", "```", ":")) or _LIST_ITEM.match(line))
            if in_math or boundary:
                if words:
                    lengths.append(words)
                words = 0
                if in_math or not _LIST_ITEM.match(line):
                    continue
            words += len(_LIST_ITEM.sub("", line).split())
    return lengths


def long_paragraphs(notebook, limit: int = 120) -> list[int]:
    """The lengths (words) of a chapter's paragraphs over ``limit`` words (:func:`paragraph_words`)."""
    return [words for words in paragraph_words(notebook) if words > limit]


STUDENT_TRACK: tuple[tuple[int, str, tuple[str, ...]], ...] = (
    (1, "intro", ()),
    (1, "speculative_decoding", ()),
    (2, "expert_activation", ()),
    (3, "roofline", ()),
    (4, "routing_traces", ("Bring your own trace", "Capturing real routing on a GPU")),
    (5, "serving", ()),
    (6, "lab", ()),
    (7, "measuring_sd", ()),
    (8, "target_efficiency", ()),
    (9, "sparsity_and_model", ()),
    (10, "where_sd_pays", ()),
    (0, "more_settings", ()),
    (0, "fitting_robustness", ()),
)
"""The two-week student track: (study day, 1-10, or 0 for an optional chapter; chapter file stem; the titles, or
title beginnings, of the sections a student skips: audit detail, or tools for one's own data). Audit detail that
left its chapter lives on appendix pages (``book/appendix_*.ipynb``, :data:`APPENDIX_PREFIX`), which the track
skips whole and does not list."""

APPENDIX_PREFIX = "appendix_"
"""The file-name start of an appendix page: audit detail moved out of a chapter, not on the student track."""


def student_track(book_dir="book") -> pd.DataFrame:
    """The student track (:data:`STUDENT_TRACK`) with each chapter's reading time, exercises and check questions.

    Parameters
    ----------
    book_dir : str or os.PathLike, default "book"
        The folder of the chapter notebooks (a chapter's kernel runs in it: pass ``"."``).

    Returns
    -------
    pandas.DataFrame
        One row per chapter in track order: ``week`` (1, 2, or ``"optional"``), ``day``, ``chapter`` (its title),
        ``stem`` (file name without ``.ipynb``), ``minutes`` (:func:`reading_minutes`, the whole chapter),
        ``track minutes`` (:func:`reading_time` without the skipped sections), ``exercises`` and ``checks``
        (counted in its Markdown) and ``skip`` (the skipped sections, ``"; "``-joined).

    Raises
    ------
    ValueError
        If a chapter of the track is not in ``book_dir``, or a skipped section is not a heading of its chapter.
    """
    rows = []
    for day, stem, skip in STUDENT_TRACK:
        path = Path(book_dir) / f"{stem}.ipynb"
        cells = _markdown_cells(path)
        titles = [m.group(2) for text in cells for line in text.splitlines() if (m := _HEADING.match(line))]
        missing = [prefix for prefix in skip if not any(title.startswith(prefix) for title in titles)]
        if missing:
            raise ValueError(f"{stem}: no section titled {missing} to skip")
        title = next((t for text in cells for line in text.splitlines() if (t := line[2:].strip()) and
                      line.startswith("# ")), stem)
        rows.append({"week": (day + 4) // 5 if day else "optional", "day": day or "", "chapter": title,
                     "stem": stem, "minutes": reading_minutes(path),
                     "track minutes": reading_time(path, skip).minutes,
                     "exercises": sum(text.count("{exercise}") for text in cells),
                     "checks": sum(text.count("**Check:**") for text in cells), "skip": "; ".join(skip)})
    return pd.DataFrame(rows)
