"""Markdown tables, every number formatted one way: floats to a given number of digits
with thousands separators, ints with separators, None and NaN as "-"."""

from __future__ import annotations

import math
from typing import Any


def fmt(v: Any, digits: int = 4) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def md_table(head: list[str], rows: list[list[Any]], digits: list[int] | None = None) -> str:
    """``head`` and ``rows`` as a markdown table, column i's floats to ``digits[i]`` places."""
    digits = digits or [4] * len(head)
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(fmt(c, d) for c, d in zip(r, digits)) + " |" for r in rows]
    return "\n".join(out)
