"""Print, per chapter, the reading time, the paragraphs over a length, and the exercises and check questions.

The reading time is :func:`moesd.chapter.reading_time`'s: prose at 200 words a minute and visible code at 10 lines a
minute (words of the Markdown cells, fences and directive options left out; non-blank lines of the code cells a reader
sees, none tagged remove-cell, remove-input, hide-input or hide-cell), outside the exercises' solutions; the minutes
are rounded up. Exercises and runs are not included. The paragraphs are :func:`moesd.chapter.paragraph_words`'s (each
list item one; headings, tables, display math and directive lines left out); ``long`` counts those over ``--limit``
words and ``longest`` gives the longest. ``checks`` counts ``**Check:**`` questions.

Run: python tools/reading_time.py [--limit 120] book/*.ipynb
"""

import argparse
import json
import sys

from moesd.chapter import CODE_LINES_PER_MINUTE, WORDS_PER_MINUTE, paragraph_words, reading_time


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=120, help="words over which a paragraph counts as long")
    parser.add_argument("notebooks", nargs="+", help="chapter notebooks (.ipynb)")
    args = parser.parse_args(argv)
    print(f"{'chapter':<34} {'words':>6} {'code lines':>10} {'minutes':>8} {'long':>5} {'longest':>7} {'checks':>6}"
          f"   ({WORDS_PER_MINUTE} words/min, {CODE_LINES_PER_MINUTE} code lines/min, long: over {args.limit} words)")
    for path in args.notebooks:
        time = reading_time(path)
        lengths = paragraph_words(path)
        with open(path, encoding="utf-8") as handle:
            cells = json.load(handle)["cells"]
        checks = sum("".join(c["source"]).count("**Check:**") for c in cells if c["cell_type"] == "markdown")
        print(f"{path:<34} {time.words:>6} {time.code_lines:>10} {time.minutes:>8} "
              f"{sum(n > args.limit for n in lengths):>5} {max(lengths, default=0):>7} {checks:>6}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
