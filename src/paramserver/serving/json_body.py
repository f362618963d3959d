"""A JSON ``/predict`` body's rows, parsed a piece at a time from the body's bytes.

``json.loads`` of a whole body builds its text and then a Python object a row: a 113 MB
body of rows as lines peaked at 2.2 times its size over the idle process.  Here one pass
of a numba kernel (``_rows_items``) finds the top-level object's ``"rows"`` list and where
each of its items starts and ends, without building anything; ``JsonRows.piece`` then
parses ``PIECE_ROWS`` of them at a time (``json.loads`` of that slice alone), so what a
body holds is its bytes and one piece.  The rest of the object (a CSV model's
``"header"``) is parsed with the rows left out.  A body that is not UTF-8, or not an
object with a list ``"rows"``, is parsed whole as before, for ``json.loads`` to say what
is wrong with it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit

from paramserver.data.reader import DataError
from paramserver.serving.body import _after_string

_NEEDS = "send {\"rows\": [...]}, each row a line of text or a list of tokens"


@dataclass(frozen=True)
class JsonRows:
    """A JSON body's ``count`` rows (``piece(start, stop)`` parses those of them), and the
    rest of its object (``rest``: a CSV model's ``"header"``)."""

    count: int
    piece: Callable[[int, int], list[Any]]
    rest: dict[str, Any]


def json_rows(body: bytearray, max_rows: int) -> JsonRows:
    """The rows of a JSON body (at most ``max_rows`` + 1 are located; more is said by the
    caller's bound), or a ``DataError`` saying why there are none."""
    if json.detect_encoding(bytes(body[:4])) == "utf-8":
        cuts = np.empty(2 * (max_rows + 2), np.int64)
        opened, closed, n = _rows_items(np.frombuffer(body, np.uint8), cuts)
        if opened >= 0:
            rest = _loads(bytes(body[:opened]) + b"[]" + bytes(body[closed + 1:]))
            view = memoryview(body)

            def piece(start: int, stop: int) -> list[Any]:
                try:
                    rows: list[Any] = json.loads(b"[" + view[cuts[2 * start]:cuts[2 * stop - 1]] + b"]")
                except (ValueError, RecursionError) as exc:
                    raise DataError(f"rows {start + 1}-{stop} of the JSON body are not JSON ({exc}): "
                                    f"{_NEEDS}") from None
                return rows

            return _checked(n, piece, rest)
    doc = _loads(body)
    rows = doc.get("rows") if isinstance(doc, dict) else None
    return _checked(len(rows) if isinstance(rows, list) else 0, lambda a, b: rows[a:b],  # type: ignore[index]
                    doc if isinstance(doc, dict) else {})


def _checked(n: int, piece: Callable[[int, int], list[Any]], rest: Any) -> JsonRows:
    if not n:
        raise DataError("a JSON body needs \"rows\": a non-empty list of rows (each a line of text, or a list "
                        "of tokens)")
    return JsonRows(n, piece, rest if isinstance(rest, dict) else {})


def _loads(body: Any) -> Any:
    try:
        text = bytes(body).decode(json.detect_encoding(bytes(body[:4])), "surrogatepass")
        with contextlib.suppress(BufferError, AttributeError):  # the text is all that is held from here
            body.clear()
        return json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise DataError(f"the body is not JSON ({exc}): send {{\"rows\": [...]}}, or rows as text/plain") from None
    except RecursionError:
        raise DataError(f"the JSON body nests too deep: {_NEEDS}") from None


@njit(inline="always", nogil=True, cache=True)
def _blank(c):  # type: ignore[no-untyped-def]
    return c == 32 or c == 9 or c == 10 or c == 13


@njit(inline="always", nogil=True, cache=True)
def _skip_blanks(b, i):  # type: ignore[no-untyped-def]
    while i < b.shape[0] and _blank(b[i]):
        i += 1
    return i


@njit(nogil=True, cache=True)
def _value_end(b, i, cuts, count):  # type: ignore[no-untyped-def]
    """Where the value starting at ``i`` ends: at the ``,`` after it, or at the closing
    bracket of what holds it.  With ``count`` (the value is a list), where its own ``]``
    is, and each of its items into ``cuts`` (start and end, in turn) with how many (-1,
    -1: more than ``cuts`` holds, or the body ends first)."""
    depth = n = 0
    if count:
        i = _skip_blanks(b, i + 1)
        if i < b.shape[0] and b[i] == 93:
            return i, 0
        cuts[0] = i
    while i < b.shape[0]:
        c = b[i]
        if c == 34:
            i = _after_string(b, i)
            continue
        if c == 91 or c == 123:
            depth += 1
        elif c == 93 or c == 125:
            depth -= 1
            if depth < 0:
                if count:
                    cuts[2 * n + 1] = i
                    n += 1
                return i, n
        elif c == 44 and depth == 0:
            if not count:
                return i, 0
            cuts[2 * n + 1] = i
            n += 1
            if 2 * n + 1 >= cuts.shape[0]:
                return -1, -1
            cuts[2 * n] = i + 1
        i += 1
    return -1, -1


@njit(nogil=True, cache=True)
def _rows_items(b, cuts):  # type: ignore[no-untyped-def]
    """(the ``[`` and ``]`` of the top-level object's ``"rows"`` list, its items): each item
    ``k`` is ``b[cuts[2k]:cuts[2k + 1]]``.  (-1, -1, 0) where the body is not such an object,
    or has more items than ``cuts`` holds."""
    i = _skip_blanks(b, 0)
    if i >= b.shape[0] or b[i] != 123:
        return -1, -1, 0
    opened, closed, items = -1, -1, 0
    i += 1
    while True:
        i = _skip_blanks(b, i)
        if i >= b.shape[0] or b[i] == 125:
            return (opened, closed, items) if i < b.shape[0] else (-1, -1, 0)
        if b[i] == 44:
            i += 1
            continue
        if b[i] != 34:
            return -1, -1, 0
        key, i = i, _after_string(b, i)
        rows = i - key == 6 and b[key + 1] == 114 and b[key + 2] == 111 and b[key + 3] == 119 \
            and b[key + 4] == 115  # "rows"
        i = _skip_blanks(b, i)
        if i >= b.shape[0] or b[i] != 58:
            return -1, -1, 0
        i = _skip_blanks(b, i + 1)
        if rows and i < b.shape[0] and b[i] == 91:
            end, n = _value_end(b, i, cuts, True)
            if end < 0:
                return -1, -1, 0
            opened, closed, items = i, end, n
            i = end + 1
        else:
            end, _ = _value_end(b, i, cuts, False)
            if end < 0:
                return -1, -1, 0
            i = end
