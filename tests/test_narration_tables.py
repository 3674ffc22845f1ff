"""Tables for a reader (moesd.narration.tables): rounding, units, no scientific notation."""

import math

import numpy as np
import pandas as pd
import pytest

from moesd.narration import formatted
from moesd.narration.tables import MISSING, cell, decimals, header


@pytest.mark.parametrize("value", [1e-9, 3.3e-5, 0.5, 12.345, 98765.4321, 1.5e12, -2.5e-4])
def test_cells_never_use_scientific_notation(value):
    places = decimals([value])
    text = cell(value, places)
    assert "e" not in text.lower()
    assert abs(float(text) - value) <= 0.5 * 10.0 ** -places + 1e-12 * abs(value)


def test_a_column_shows_one_number_of_decimals():
    shown = formatted(pd.DataFrame({"x": [0.5, 1.25, 2.0, 10.0]})).frame["x"]
    assert len({len(text.split(".")[1]) for text in shown}) == 1


def test_significant_digits_follow_the_typical_value():
    assert decimals([0.0123, 0.0456]) == 4
    assert decimals([1.5, 2.5]) == 2
    assert decimals([1234.5, 2345.5]) == 0
    assert decimals([1.0, 2.0, 3.0]) == 0
    assert decimals([1e-12, 2e-12]) == 6


def test_integers_booleans_missing_and_infinite_values():
    assert cell(np.int64(42)) == "42"
    assert cell(True) == "yes" and cell(np.bool_(False)) == "no"
    assert cell(float("nan")) == MISSING and cell(None) == MISSING
    assert cell(math.inf) == "∞" and cell(-math.inf) == "-∞"
    assert cell(-1e-9, 2) == "0.00"
    assert cell("qwen") == "qwen"


def test_headers_carry_units_from_names_or_arguments():
    assert header("step_ms") == "step (ms)"
    assert header("copy_gb_s") == "copy (GB/s)"
    assert header("tokens_per_batch") == "tokens per batch"
    assert header("step_ms", names={"step_ms": "B = 1 step"}) == "B = 1 step (ms)"
    assert header("width", units={"width": "tokens"}) == "width (tokens)"
    assert header("_s") == "_s"


def test_text_and_html_hide_the_index_and_keep_the_values():
    frame = pd.DataFrame({"B": [1, 8], "speedup": [1.234, 2.5]}, index=[7, 9])
    table = formatted(frame, index=False)
    assert repr(table).split("\n")[0].split() == ["B", "speedup"]
    html = table._repr_html_()
    assert "<td>1.23</td>" in html and "<td>2.50</td>" in html and "<td>7</td>" not in html
    assert list(formatted(frame.set_index("B")).frame.columns) == ["B", "speedup"]
    assert list(formatted(frame.reset_index(drop=True)).frame.columns) == ["B", "speedup"]
    assert list(formatted(frame.set_index("B").T.rename_axis("row")).frame.columns) == ["row", "1", "8"]


def test_html_marks_columns_of_words_and_escapes_them():
    frame = pd.DataFrame({"claim": ["Fig. 2", "a<b"], "status": ["holds", None], "speedup": [1.5, float("nan")],
                          "tracks": [True, False]})
    table = formatted(frame)
    assert table.text_columns == {"claim"}  # a missing status is no word
    html = table._repr_html_()
    assert '<th class="text">claim</th>' in html and "<th>speedup</th>" in html and "<th>status</th>" in html
    assert '<td class="text">a&lt;b</td>' in html and "<td>1.50</td>" in html and "<td>yes</td>" in html
    assert '<td class="text">holds</td>' in html and f"<td>{MISSING}</td>" in html
    assert html.count("<tr>") == 3  # the header and two rows, no index


def test_a_transposed_table_aligns_each_cell_by_what_it_holds():
    wide = pd.DataFrame({"γ = 2": ["holds", 1.25], "γ = 4": ["inconclusive", 0.5]}, index=["status", "peak"])
    table = formatted(wide.rename_axis("quantity"), index=True)
    html = table._repr_html_()
    assert table.text_columns == {"quantity"} and "<th>γ = 2</th>" in html
    assert '<td class="text">holds</td>' in html and "<td>1.25</td>" in html


def test_missing_values_of_nullable_columns_show_as_missing():
    frame = pd.DataFrame({"B": [1, None], "ok": [True, None]}).convert_dtypes()
    assert formatted(frame).frame.iloc[1].tolist() == [MISSING, MISSING]


def test_bad_input():
    with pytest.raises(TypeError, match="DataFrame"):
        formatted([[1, 2]])
    with pytest.raises(ValueError, match="same header"):
        formatted(pd.DataFrame({"a_ms": [1.0], "a (ms)": [2.0]}))


def test_only_snake_case_names_are_read_as_words():
    assert header("T_AR") == "T_AR"
    assert header("T_D(1, 1) / T_T(1, 1)") == "T_D(1, 1) / T_T(1, 1)"
    assert header("t_exp") == "t exp"


def test_row_numbers_are_hidden_and_labels_shown_under_a_blank_header():
    frame = pd.DataFrame({"x": [1.5, 2.5, 3.5]})
    assert list(formatted(frame.iloc[[0, 2]]).frame.columns) == ["x"]
    labelled = formatted(frame.set_axis(["a", "b", "c"]))
    assert list(labelled.frame.columns) == ["", "x"] and list(labelled.frame[""]) == ["a", "b", "c"]
    two = frame.set_axis(pd.MultiIndex.from_tuples([("a", 1), ("a", 2), ("b", 1)]))
    assert list(formatted(two).frame.columns) == ["", " ", "x"]


def test_columns_of_several_levels_join_their_names():
    frame = pd.DataFrame([["Fig. 2", "holds"]],
                         columns=pd.MultiIndex.from_tuples([("claim", ""), ("step_ms", "qwen3-0.6b")]))
    assert list(formatted(frame).frame.columns) == ["claim", "step (ms), qwen3-0.6b"]
