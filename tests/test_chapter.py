"""moesd.chapter: glued numbers readable in JupyterLab, reading times, the data check."""

import math

import nbformat
import pytest

from moesd import chapter


def _notebook(tmp_path, cells, name="page.ipynb"):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = cells
    path = tmp_path / name
    nbformat.write(notebook, path)
    return path


def _glued_output(name, value):
    """A code cell's output as myst-nb saves a value glued with display=False."""
    return nbformat.v4.new_output("display_data", data={"application/papermill.record/text/plain": repr(value)},
                                  metadata={"scrapbook": {"name": name, "mime_prefix": "application/papermill.record/"}})


def test_numbers_on_this_page_reads_live_then_saved_values(tmp_path, monkeypatch):
    monkeypatch.setattr(chapter, "GLUED", {"live": "3.14"})
    code = nbformat.v4.new_code_cell("glue('saved', '0.65')")
    code.outputs = [_glued_output("saved", "0.65"), _glued_output("live", "stale")]
    path = _notebook(tmp_path, [
        nbformat.v4.new_markdown_cell("The rate is {glue:text}`saved` and pi is {glue:text}`live`."),
        code,
        nbformat.v4.new_markdown_cell("Not run yet: {glue:text}`missing`; again {glue:text}`saved`."),
        nbformat.v4.new_markdown_cell("In JupyterLab the text shows `{glue:text}` keys: this names no key."),
    ])
    table = chapter.numbers_on_this_page(path)
    assert list(table["key"]) == ["saved", "live", "missing", "saved"]
    assert list(table["value"]) == ["0.65", "3.14", "(run the cells above)", "0.65"]
    assert table["in the text"].iloc[0] == "...The rate is"
    assert table["in the text"].iloc[1].endswith("and pi is")


def test_numbers_on_this_page_refuses_what_is_not_a_notebook(tmp_path):
    with pytest.raises(ValueError, match="not a notebook"):
        chapter.numbers_on_this_page(tmp_path / "absent.ipynb")


def test_glue_records_the_text_and_hands_it_to_myst_nb(monkeypatch):
    handed = []
    monkeypatch.setattr(chapter, "GLUED", {})
    import myst_nb

    monkeypatch.setattr(myst_nb, "glue", lambda name, value, display: handed.append((name, value, display)))
    assert chapter.glue("k", 0.5) == 0.5
    assert chapter.GLUED == {"k": "0.5"} and handed == [("k", 0.5, False)]


def test_reading_time_counts_prose_and_visible_code_outside_solutions(tmp_path):
    words = " ".join(["word"] * 400)
    path = _notebook(tmp_path, [
        nbformat.v4.new_markdown_cell(f"{words}\n```{{admonition}} Answer\n:class: dropdown\n```"),
        nbformat.v4.new_code_cell("a = 1\n\nb = 2"),  # 2 lines
        nbformat.v4.new_code_cell("hidden = 1", metadata={"tags": ["remove-input"]}),
        nbformat.v4.new_markdown_cell("```{solution-start} ex-1\n```"),
        nbformat.v4.new_markdown_cell(words),
        nbformat.v4.new_code_cell("\n".join(["x = 1"] * 50)),
        nbformat.v4.new_markdown_cell("done\n```{solution-end}\n```"),
        nbformat.v4.new_markdown_cell("two more"),
    ])
    time = chapter.reading_time(path)
    assert (time.words, time.code_lines) == (400 + 2, 2)  # fences, directive options and solutions not counted
    assert time.minutes == math.ceil(402 / chapter.WORDS_PER_MINUTE + 2 / chapter.CODE_LINES_PER_MINUTE)
    assert chapter.reading_minutes(path) == time.minutes


def test_data_folder_says_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("MOESD_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="MOESD_DATA"):
        chapter.data_folder()
    (tmp_path / "paper").mkdir()
    assert chapter.data_folder() == tmp_path


def test_paragraph_words_counts_prose_only(tmp_path):
    path = _notebook(tmp_path, [
        nbformat.v4.new_markdown_cell("# A title of five words\n\none two three\nfour five\n\n| a | b |\n|---|---|\n"
                                      "| c | d |\n\n$$\nx = y + z\n$$\n\n* item one\n* item two words\n"
                                      "  continued here"),
        nbformat.v4.new_markdown_cell("```{admonition} Answer\n:class: dropdown\ninside the block\n```\nafter"),
        nbformat.v4.new_markdown_cell("a {term}`draft <draft model (a glossary term)>` and {term}`SD`"),
    ])
    assert chapter.paragraph_words(path) == [5, 2, 5, 3, 1, 4]  # a role's target is not read
    assert chapter.long_paragraphs(path, limit=4) == [5, 5]
    with pytest.raises(ValueError, match="not a notebook"):
        chapter.paragraph_words(tmp_path / "absent.ipynb")


def test_numbers_on_this_page_reads_another_pages_glue(tmp_path):
    code = nbformat.v4.new_code_cell("glue('minutes', 12)")
    code.outputs = [_glued_output("minutes", 12)]
    _notebook(tmp_path, [code], name="intro.ipynb")
    path = _notebook(tmp_path, [nbformat.v4.new_markdown_cell(
        "Read for {glue:text}`intro.ipynb::minutes:d` minutes, not {glue:text}`absent.ipynb::minutes:d`.")])
    table = chapter.numbers_on_this_page(path)
    assert list(table["key"]) == ["intro.ipynb::minutes", "absent.ipynb::minutes"]  # the format spec left out
    assert list(table["value"]) == ["12", "(run that page's cells)"]


def test_student_track_covers_the_chapters_in_two_weeks():
    from pathlib import Path

    book = Path(__file__).resolve().parents[1] / "book"
    track = chapter.student_track(book)
    pages = {p.stem for p in book.glob("*.ipynb")}
    appendix = {stem for stem in pages if stem.startswith(chapter.APPENDIX_PREFIX)}
    assert appendix  # the audit detail has pages of its own ...
    assert set(track["stem"]) == pages - appendix  # ... and every chapter is placed or skipped
    days = [d for d in track["day"] if d != ""]
    assert days == sorted(days) and set(days) == set(range(1, 11))
    assert set(track["week"]) == {1, 2, "optional"}
    for row in track.itertuples():
        assert row.minutes == chapter.reading_minutes(book / f"{row.stem}.ipynb") > 0
        assert 0 < track.loc[row.Index, "track minutes"] <= row.minutes
        assert (track.loc[row.Index, "track minutes"] < row.minutes) <= bool(row.skip)
        assert row.week == ("optional" if row.day == "" else 1 + (row.day - 1) // 5)
    with pytest.raises(ValueError, match="not a notebook"):
        chapter.student_track(book / "absent")


def test_reading_time_leaves_out_skipped_sections_and_their_subsections(tmp_path):
    five = "one two three four five"
    path = _notebook(tmp_path, [
        nbformat.v4.new_markdown_cell(f"# Title\n\n{five}\n\n## Audit detail\n\n{five}\n\n### Deeper\n\n{five}"),
        nbformat.v4.new_code_cell("x = 1\ny = 2"),  # inside the skipped section
        nbformat.v4.new_markdown_cell(f"```bash\n# not a heading\n```\n{five}\n## Kept\n\n{five}"),
        nbformat.v4.new_code_cell("z = 3"),
    ])
    whole = chapter.reading_time(path)
    assert (whole.words, whole.code_lines) == (5 * 5 + 2 + 3 + 2 + 4 + 2, 3)  # a fenced comment: prose
    kept = chapter.reading_time(path, skip=("Audit",))
    assert (kept.words, kept.code_lines) == (2 + 5 + 2 + 5, 1)  # the title, its text, the Kept heading and text


def test_student_track_refuses_a_section_that_is_not_there(monkeypatch):
    from pathlib import Path

    book = Path(__file__).resolve().parents[1] / "book"
    monkeypatch.setattr(chapter, "STUDENT_TRACK", ((1, "intro", ("No such section",)),))
    with pytest.raises(ValueError, match="no section titled"):
        chapter.student_track(book)
