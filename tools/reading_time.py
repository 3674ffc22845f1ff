"""Print the reading time of chapters: prose at 200 words a minute, visible code at 10 lines a minute.

The count is :func:`moesd.chapter.reading_time`'s: words of the Markdown cells (fences and directive options left
out) and non-blank lines of the code cells a reader sees (none tagged remove-cell, remove-input, hide-input or
hide-cell), outside the exercises' solutions; the minutes are rounded up. Exercises and runs are not included.

Run: python tools/reading_time.py book/*.ipynb
"""

import sys

from moesd.chapter import CODE_LINES_PER_MINUTE, WORDS_PER_MINUTE, reading_time


def main(paths: list[str]) -> int:
    print(f"{'chapter':<34} {'words':>6} {'code lines':>10} {'minutes':>8}"
          f"   ({WORDS_PER_MINUTE} words/min, {CODE_LINES_PER_MINUTE} code lines/min)")
    for path in paths:
        time = reading_time(path)
        print(f"{path:<34} {time.words:>6} {time.code_lines:>10} {time.minutes:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
