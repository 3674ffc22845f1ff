"""Tables for a reader: rounded numbers, units in the header, no scientific notation, no meaningless index.

A chapter shows a data frame through :func:`formatted`; what it returns prints the same table as text (what nbval
compares) and as HTML (what the book renders), both deterministic.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Mapping

import numpy as np
import pandas as pd

UNIT_SUFFIXES = (
    ("_gb_s", "GB/s"), ("_gbs", "GB/s"), ("_tflops", "TFLOP/s"), ("_tokens_s", "tokens/s"),
    ("_ms", "ms"), ("_us", "µs"), ("_s", "s"), ("_gib", "GiB"), ("_gb", "GB"), ("_mb", "MB"),
    ("_pct", "%"), ("_percent", "%"),
)
"""Column-name endings that carry a unit, longest first: ``step_ms`` is shown as ``step (ms)``."""

MISSING = "–"
"""What an empty cell (NaN or None) shows."""


def decimals(values, digits: int = 3) -> int:
    """The decimals one column shows: enough for ``digits`` significant digits of its median magnitude (finite,
    non-zero values; 0 to 6), 0 where every value is whole."""
    finite = np.abs(np.asarray([v for v in values if _is_number(v) and math.isfinite(v)], dtype=float))
    if finite.size == 0 or np.all(finite == np.round(finite)):
        return 0
    typical = float(np.median(finite[finite > 0]))
    return int(min(max(digits - 1 - math.floor(math.log10(typical)), 0), 6))


def cell(value, places: int = 2) -> str:
    """One value as a table shows it.

    Parameters
    ----------
    value : object
        A number, a boolean, a string or a missing value.
    places : int, default 2
        Decimals of a number (:func:`decimals` picks them per column); never scientific notation.

    Returns
    -------
    str
        Numbers with ``places`` decimals (integers whole), booleans as ``yes``/``no``, missing values as
        :data:`MISSING`, infinities as ``∞``, anything else by ``str``.
    """
    if _is_missing(value):
        return MISSING
    if isinstance(value, bool | np.bool_):
        return "yes" if value else "no"
    if isinstance(value, int | np.integer):
        return f"{int(value)}"
    if _is_number(value):
        if not math.isfinite(value):
            return "∞" if value > 0 else "-∞"
        text = f"{value:.{places}f}"
        return text[1:] if text.startswith("-") and float(text) == 0 else text
    return str(value)


def _is_number(value) -> bool:
    return isinstance(value, float | np.floating | int | np.integer) and not isinstance(value, bool | np.bool_)


def header(column, names: Mapping | None = None, units: Mapping | None = None) -> str:
    """A column's header: its display name and its unit in parentheses.

    The name is ``names[column]`` if given; else a snake-case name (``step_ms``: lower case, digits and ``_``)
    is read as words, a unit ending of :data:`UNIT_SUFFIXES` cut off (``step (ms)``); any other name (``T_AR``,
    ``N(B), decode``) is kept as written. The unit is ``units[column]`` if given, else the ending's.
    """
    names, units = names or {}, units or {}
    name, unit = str(column), units.get(column)
    if SNAKE_CASE.fullmatch(name):
        for suffix, suffix_unit in UNIT_SUFFIXES:
            if name.endswith(suffix) and len(name) > len(suffix):
                name, unit = name[: -len(suffix)], unit or suffix_unit
                break
        name = name.replace("_", " ")
    name = names.get(column, name)
    return f"{name} ({unit})" if unit else name


SNAKE_CASE = re.compile(r"[a-z0-9]+(?:_[a-z0-9]+)*")
"""Names read as words (``tokens_per_batch``); others are shown as written."""


def _shows_index(index: pd.Index) -> bool:
    """Whether a reader learns from an index: a named one, or unnamed labels that are not row numbers."""
    return any(name is not None for name in index.names) or not pd.api.types.is_integer_dtype(index)


class Table:
    """A formatted table: ``frame`` (all cells strings) shown without its index, as text and as HTML.

    ``words`` (a frame of booleans of the same shape, default none) marks the cells that hold words (labels,
    statuses): the HTML gives them ``class="text"``, and a column's header too where all its cells are words, so
    that the book aligns words left and numbers right.
    """

    def __init__(self, frame: pd.DataFrame, words: pd.DataFrame | None = None):
        self.frame = frame
        self.words = pd.DataFrame(False, index=frame.index, columns=frame.columns) if words is None else words

    @property
    def text_columns(self) -> frozenset:
        """The columns whose cells are all words (none for an empty table)."""
        return frozenset(c for c in self.frame.columns if len(self.frame) and self.words[c].all())

    def __repr__(self) -> str:
        return self.frame.to_string(index=False)

    def _repr_html_(self) -> str:
        def mark(is_text):
            return ' class="text"' if is_text else ""

        head = "".join(f"<th{mark(c in self.text_columns)}>{html.escape(str(c))}</th>" for c in self.frame.columns)
        body = "".join("<tr>" + "".join(f"<td{mark(is_text)}>{html.escape(value)}</td>"
                                        for value, is_text in zip(row, words)) + "</tr>\n"
                       for row, words in zip(self.frame.itertuples(index=False),
                                             self.words.itertuples(index=False)))
        return (f'<table class="dataframe moesd-table">\n<thead><tr>{head}</tr></thead>\n'
                f"<tbody>\n{body}</tbody>\n</table>")


def is_word(value) -> bool:
    """Whether a cell holds words: neither a number, a boolean nor a missing value."""
    return not (_is_number(value) or isinstance(value, bool | np.bool_) or _is_missing(value))


def _is_missing(value) -> bool:
    return value is None or value is pd.NA or value is pd.NaT or (_is_number(value) and math.isnan(value))


def formatted(frame: pd.DataFrame, digits: int | Mapping[str, int] = 3, names: Mapping[str, str] | None = None,
              units: Mapping[str, str] | None = None, index: bool | None = None) -> Table:
    """A data frame ready to show: each column rounded alike (:func:`decimals`, :func:`cell`), each header with its unit (:func:`header`).

    Parameters
    ----------
    frame : pandas.DataFrame
        The table as computed (numbers, not strings).
    digits : int or mapping of column to int, default 3
        Significant digits of a column's typical value (:func:`decimals`), for all columns or per column
        (others: 3). A column shows one number of decimals throughout.
    names : mapping of column to str, optional
        Display names replacing the column names.
    units : mapping of column to str, optional
        Units for the header, replacing any unit the column's name ends with. Columns of several levels are
        named by their non-empty levels, each read by :func:`header`, joined by ``", "`` (``("draft_term",
        "qwen3-0.6b")``: ``draft term, qwen3-0.6b``) before ``names`` and ``units`` apply.
    index : bool, optional
        Whether the frame's index becomes the first column(s), named by the index's names (an unnamed level:
        a blank header); by default it does where it is named or holds labels, not where it holds unnamed
        row numbers (0, 1, 2... or what is left of them after a filter), which tell a reader nothing.

    Returns
    -------
    Table
        Prints as text (``repr``) and renders as HTML in a notebook; ``.frame`` holds the strings.
    """
    if not isinstance(frame, pd.DataFrame):
        raise TypeError(f"formatted needs a pandas DataFrame, got {type(frame).__name__}")
    if index is None:
        index = _shows_index(frame.index)
    if index:
        frame = frame.rename_axis([name if name is not None else " " * level
                                   for level, name in enumerate(frame.index.names)]).reset_index()
    if frame.columns.nlevels > 1:
        frame = frame.set_axis([", ".join(header(part) for part in column if str(part))
                                for column in frame.columns], axis=1)
    per_column = digits if isinstance(digits, Mapping) else {}
    headers = [header(column, names, units) for column in frame.columns]
    repeated = sorted({text for text in headers if headers.count(text) > 1})
    if repeated:
        raise ValueError(f"two columns show the same header: {repeated}")
    shown, words = {}, {}
    for column, text in zip(frame.columns, headers):
        values = frame[column].tolist()
        places = decimals(values, per_column.get(column, 3) if per_column else digits)
        shown[text] = [cell(value, places) for value in values]
        words[text] = [is_word(value) for value in values]
    return Table(pd.DataFrame(shown, columns=headers), pd.DataFrame(words, columns=headers))
