"""Rows counted before they are read, so that ``train --stream ... --max-examples N`` trains
exactly N rows from any source that can count them.

A row is a line that is not blank (empty, or a lone ``\\r``), as the parsers skip blank
lines and as a Redis entry's rows are counted (``redis_rows.py``); a CSV file's header
(``--format csv``, and an Avazu file whose first line names ``click``) is not a row.  A
malformed line is a row: it counts whether it is trained or skipped (``--skip-bad-lines``).

``rows_until`` counts the rows of a file (plain, read in pieces; compressed, decompressed
whole but never held) up to a limit and says the byte after the last one counted, where
a shard can end: the lines whose first byte lies before it are exactly those rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from paramserver.data.files import COMPRESSED, open_input

PIECE = 16 << 20  # bytes of a plain file counted at a time

#: whether a file's first line is a header, by format (absent: never)
HEADERS: dict[str, Callable[[bytes], bool]] = {
    "csv": lambda first: True,
    "avazu": lambda first: b"click" in (c.strip() for c in first.rstrip(b"\r\n").split(b",")),
}


def lines(buf: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each line of the bytes ``buf`` (non-empty): where it starts, where it ends (its
    newline, or the data's end for an unfinished last line) and whether it is a row (not
    blank).  Vectorised: one pass of numpy over the bytes."""
    ends = np.flatnonzero(buf == 10)
    if ends.size == 0 or ends[-1] != buf.size - 1:
        ends = np.append(ends, buf.size)  # an unfinished last line ends with the data
    starts = np.concatenate(([0], ends[:-1] + 1))
    length = ends - starts
    return starts, ends, (length > 1) | ((length == 1) & (buf[np.minimum(starts, buf.size - 1)] != 13))


def count_lines(data: bytes | memoryview, limit: int | None) -> tuple[int, int]:
    """(rows, end) of ``data``, whole lines with perhaps an unfinished last one: its rows
    (at most ``limit``, None: all) and the byte after the last row counted (``len(data)``
    when every row was)."""
    buf = np.frombuffer(data, np.uint8)
    if buf.size == 0 or (limit is not None and limit <= 0):
        return 0, 0
    _, ends, row = lines(buf)
    counted = np.cumsum(row)
    total = int(counted[-1])
    if limit is None or total <= limit:
        return total, int(buf.size)
    last = int(np.searchsorted(counted, limit))  # the line of the limit-th row
    return limit, min(int(ends[last]) + 1, int(buf.size))


def rows_until(path: str, start: int, limit: int | None, header: bool) -> tuple[int, int]:
    """(rows, stop): the rows of ``path`` from byte ``start`` to its end, at most ``limit``,
    its header left out (``header``, only where ``start`` is 0), and the byte after the
    last one counted, where a shard of exactly them ends (the file's size when all were
    counted).  A compressed file is counted whole (``stop`` is then -1: it cannot be cut)."""
    if path.endswith(COMPRESSED):
        with open_input(path) as f:
            return _counted(f, 0, None, header)[0], -1
    import fsspec

    with fsspec.open(path, "rb") as f:
        f.seek(start)
        return _counted(f, start, limit, header and start == 0)


def _counted(f: Any, at: int, limit: int | None, header: bool) -> tuple[int, int]:
    """(rows, stop) of the rest of ``f`` (at byte ``at``), read a piece at a time."""
    rows, carry = 0, b""
    while True:
        piece = f.read(PIECE)
        data = carry + piece
        whole = len(data) if not piece else data.rfind(b"\n") + 1
        block, carry = data[:whole], data[whole:]
        if header and block:  # the first line, whole, is the header
            first = block.find(b"\n") + 1 or len(block)
            block, at, header = block[first:], at + first, False
        n, stop = count_lines(block, None if limit is None else limit - rows)
        rows += n
        if limit is not None and rows >= limit:
            return rows, at + stop
        at += len(block)
        if not piece:
            return rows, at
