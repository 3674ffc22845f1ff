"""Numbers and phrases for sentences: a number, a range of numbers, the phrases of a curve's shape, fall
and noise, and the phrase of a verdict's parts.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from moesd.paper.criteria import CONTRADICTED, DETAIL, NOT_SHOWN, SHOWN, UNTESTABLE



def number(x, whole: bool = False, digits: int = 2) -> str:
    """A number for a sentence: ``digits`` decimals (two by default), or whole (batch sizes and widths in batch
    sizes)."""
    return f"{x:.{0 if whole else digits}f}"


def span(values, whole: bool = False, digits: int = 2) -> str:
    """``a`` or ``a-b`` (``a to b`` if negative): the range of some numbers, for a sentence, each written by
    :func:`number` (``a`` alone where both ends read the same)."""
    low, high = number(min(values), whole, digits), number(max(values), whole, digits)
    return low if low == high else f"{low}-{high}" if min(values) >= 0 else f"{low} to {high}"


def judged_from(statement: str, smallest) -> str:
    """A claim's statement, with the smallest batch size judged when not all are."""
    return statement if smallest is None else f"{statement}; judged from B = {number(smallest, whole=True)}"


def shape_phrase(shape: dict) -> str:
    reversal = ("" if shape["unimodal"] else
                f"; reversal {number(shape['largest_reversal'])} beyond noise from B = "
                f"{number(shape['largest_reversal_from'], whole=True)} to {number(shape['largest_reversal_to'], whole=True)}")
    return (f"{number(shape['first'])} at the smallest B, {number(shape['peak'])} at B = "
            f"{number(shape['peak_batch_size'], whole=True)}, {number(shape['last'])} at the largest B "
            f"(rise {number(shape['rise'])}, fall {number(shape['fall'])}; noise margins "
            f"{number(shape['rise_margin'])}, {number(shape['fall_margin'])}{reversal})")


def shapes_phrase(rows, prefix: str = "") -> str:
    """The rise-then-fall numbers of several passing curves at once (``prefix`` names their columns)."""
    def values(key):
        return [row[prefix + key] for row in rows]
    margins = values("rise_margin") + values("fall_margin")
    return (f"{span(values('first'))} at the smallest B, {span(values('peak'))} at B = "
            f"{span(values('peak_batch_size'), whole=True)}, {span(values('last'))} at the largest B (rise "
            f"{span(values('rise'))}, fall {span(values('fall'))}; noise margins at most {number(max(margins))})")


def fall_phrase(fall: dict) -> str:
    bump = (f"largest rise {number(fall['largest_rise'])} from B = {number(fall['largest_rise_from'], whole=True)} to "
            f"{number(fall['largest_rise_to'], whole=True)}" if fall["largest_rise"] > 0 else "no rise anywhere")
    return (f"{number(fall['first'])} -> {number(fall['last'])} (fall {number(fall['fall'])}, margin "
            f"{number(fall['fall_margin'])}; {bump})")


def noise_phrase(rows, key: str = "noise") -> str:
    noise = sorted({row[key] for row in rows if isinstance(row.get(key), str)})
    return f"noise from {', '.join(noise)}" if noise else ""


def join(*phrases) -> str:
    return "; ".join(p for p in phrases if p)


def parts_phrase(parts: pd.DataFrame) -> str:
    """The parts of a reading that are not shown, grouped by part and outcome (contradicted first), with where and
    the range of the detectable effects of the parts within noise; details marked as such."""
    grouped = {}
    for part in parts[parts["outcome"] != SHOWN].itertuples(index=False):
        grouped.setdefault((part.outcome, part.part, part.role), []).append(part)
    order = (CONTRADICTED, NOT_SHOWN, UNTESTABLE)

    def places(group):
        wheres, prefix = [str(n.where) for n in group], "gamma = "
        text = (prefix + ", ".join(w[len(prefix):] for w in wheres)
                if all(w.startswith(prefix) and "," not in w for w in wheres) else "; ".join(wheres))
        sizes = [n.detectable for n in group if np.isfinite(n.detectable)]
        if sizes:
            unit = group[0].unit
            low, high = (f"{x:.0f}" if unit == "B" else f"{x:.2g}" for x in (min(sizes), max(sizes)))
            text += f"; detectable from {low if low == high else f'{low}-{high}'}{' ' + unit if unit else ''}"
        return text
    return "; ".join(f"{part}{' (a detail)' if role == DETAIL else ''} {outcome} ({places(group)})"
                     for (outcome, part, role), group in
                     sorted(grouped.items(), key=lambda item: (item[0][2] == DETAIL, order.index(item[0][0]))))
