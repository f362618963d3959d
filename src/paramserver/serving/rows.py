"""A ``/predict`` request's rows as a ``Batch``: the numba parsers of ``data/`` run straight
on the body's bytes (no Python a row), in the model's own format.

A text body is lines as a file of that format holds them, labelled or not (as
``paramserver predict`` reads them: the first line says which, ``sniff_unlabeled``'s
rule); a CSV or Avazu body starts with its header, as a file does.  A JSON body is
``{"rows": [...]}``, each row a line of text, or its tokens: for LIBSVM ``["3:1.0",
"17:0.5"]`` or ``[[3, 1.0], [17, 0.5]]``, for Criteo the 39 (or, labelled, 40) fields;
a CSV model's JSON names its columns in ``"header"``.  A malformed row is a ``DataError``
naming the row (or the line) and the parser's rule, which the server answers with 400.

A body is parsed a piece at a time (``text_batches``, ``json_batches``): ``PIECE_BYTES`` of
whole lines, or ``PIECE_ROWS`` rows of JSON, each scored before the next is parsed, so that
the parsers' arrays (up to ten times the bytes they parse, for LIBSVM) are a piece's and
not the body's: a 250 MB body of Criteo rows peaked at 1.3 times its size over the idle
server, 5.5 times when parsed whole (``bench/serve_memory.py``).  A JSON body's rows come a
piece at a time from its bytes too (``json_body.py``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np

from paramserver.data import csv, parse
from paramserver.data.parsers import what_is_wrong
from paramserver.data.reader import Batch, DataError, DataFormat
from paramserver.errors import ConfigError
from paramserver.serving.json_body import JsonRows

NL = b"\n"
PIECE_BYTES = 1 << 20  # a text body is parsed and scored this much at a time (its work: ~8 MB for Criteo rows)
PIECE_ROWS = 8192  # a JSON body's rows, as many at a time
SNIFF_BYTES = 1 << 16  # the first line's bytes that say whether rows are labelled (a Criteo row is ~40 fields)


def text_batches(body: bytes | bytearray, fmt: DataFormat) -> Iterator[Batch]:
    """The rows of a text body, a piece of about ``PIECE_BYTES`` (whole lines) at a time: the
    parsers' arrays are a piece's, so a body of any size takes its own size and a piece's
    work (the caller scores each piece before asking for the next)."""
    unlabeled, columns, start, first = _unlabeled(body, fmt), None, 0, 1
    if fmt.name in ("csv", "avazu"):
        cut = body.find(NL) + 1 or len(body)
        columns = _columns(bytes(memoryview(body)[:cut]), fmt)
        if columns.header:
            start, first = cut, 2
    view = memoryview(body)
    try:
        while start < len(body):
            end = _piece_end(body, start)
            piece = bytes(view[start:end])
            if piece.strip():
                yield text_batch(piece, fmt, first=first, unlabeled=unlabeled, columns=columns)
            first += piece.count(NL)
            start = end
    finally:
        view.release()


def _piece_end(body: bytes | bytearray, start: int) -> int:
    """Where the piece from ``start`` ends: after the last newline within ``PIECE_BYTES`` (or
    the first one after, for a longer line), else at the body's end."""
    if len(body) - start <= PIECE_BYTES:
        return len(body)
    end = body.rfind(NL, start, start + PIECE_BYTES)
    if end < 0:
        end = body.find(NL, start + PIECE_BYTES)
    return len(body) if end < 0 else end + 1


def text_batch(body: bytes, fmt: DataFormat, what: str = "line", *, first: int = 1, unlabeled: bool | None = None,
               columns: csv.Columns | None = None) -> Batch:
    """The rows of a text body (``what``: how a row is named in an error; ``first``: the
    number of its first line; ``unlabeled``: whether its rows have no label, as its first
    line says when None; ``columns``: a CSV body's, read from its first line when None)."""
    if not body.strip():
        raise DataError("the request has no rows: send lines in the model's format, or JSON {\"rows\": [...]}")
    if not body.endswith(NL):
        body += NL
    if fmt.name in ("csv", "avazu"):
        return _csv(body, fmt, what, columns, first)
    arr = np.frombuffer(body, np.uint8)
    unlabeled = _unlabeled(body, fmt) if unlabeled is None else unlabeled
    if fmt.name == "criteo":
        rows = body.count(NL)
        labels, keys = np.empty(rows, np.float32), np.empty((rows, parse.CRITEO_KEYS), np.uint64)
        n, _, _, err, at = parse.parse_criteo(arr, rows, False, fmt.mask, labels, keys, np.empty(rows, np.int64),
                                              unlabeled)
        _check(body, fmt, err, at, what, first=first)
        k = parse.CRITEO_KEYS
        return Batch(labels[:n], np.arange(0, (n + 1) * k, k, dtype=np.int64), keys[:n].reshape(-1),
                     np.ones(n * k, np.float32))
    size = arr.shape[0]
    rows = body.count(NL)
    cap = size // 2 + rows + 1  # a feature takes >= 2 bytes, and a row has its bias too
    labels, indptr = np.empty(rows, np.float32), np.empty(rows + 1, np.int64)
    keys, vals = np.empty(cap, np.uint64), np.empty(cap, np.float32)
    n, _, _, err, at = parse.parse_libsvm(arr, rows, False, fmt.mask, parse.LABEL_FORMATS[fmt.label_format], labels,
                                          indptr, keys, vals, np.empty(rows, np.int64), unlabeled,
                                          np.empty(cap, np.int64))
    _check(body, fmt, err, at, what, first=first)
    nnz = int(indptr[n])
    return Batch(labels[:n], indptr[:n + 1], keys[:nnz], vals[:nnz])


def _unlabeled(body: bytes | bytearray, fmt: DataFormat) -> bool:
    """Whether the rows have no label: the first non-blank line says (as ``sniff_unlabeled``)."""
    start = 0
    while True:  # the first line that is not blank, its first SNIFF_BYTES (not a copy of a body of one line)
        end = body.find(NL, start)
        line = bytes(body[start:min(end if end >= 0 else len(body), start + SNIFF_BYTES)]).rstrip(b"\r")
        if fmt.name == "libsvm":
            line = line.split(b"#", 1)[0]  # svmlight's comment
        if line.strip() or end < 0:
            break
        start = end + 1
    if fmt.name == "criteo":
        return line.count(b"\t") == parse.CRITEO_FIELDS - 2
    first = line.split(None, 1)[0] if line.split() else b""
    return b":" in first


def _check(body: bytes, fmt: DataFormat, err: int, at: int, what: str, columns: csv.Columns | None = None,
           first: int = 1) -> None:
    """A ``DataError`` naming the row that the parser refused (its number counted in the body)."""
    if err == parse.ERR_NONE:
        return
    stop = body.find(NL, at)
    text = body[at:stop if stop >= 0 else len(body)].decode("utf-8", errors="replace")
    text = text if len(text) <= 200 else text[:200] + "..."
    number = body.count(NL, 0, at) + first
    raise DataError(f"{what} {number}: {what_is_wrong(fmt, err, columns)} ({fmt.name} format, as the model was "
                    f"trained on): {text!r}")


def _columns(header: bytes, fmt: DataFormat) -> csv.Columns:
    try:
        return csv.columns_of(header.decode("utf-8", errors="replace"), "the request", fmt.name, fmt.label_column,
                              fmt.ignore_columns, fmt.numeric_columns)
    except ConfigError as exc:
        raise DataError(str(exc)) from None


def _csv(body: bytes, fmt: DataFormat, what: str, columns: csv.Columns | None, first: int) -> Batch:
    """A CSV body: its header line, then rows (an Avazu body may be rows of Avazu's 24 columns);
    given its ``columns``, rows only."""
    data = body
    if columns is None:
        cut = body.find(NL) + 1
        columns = _columns(body[:cut], fmt)
        if columns.header:
            data, first = body[cut:], first + (what == "line")
    rows = data.count(NL)
    labels, keys = np.empty(rows, np.float32), np.empty((rows, columns.keys_per_row), np.uint64)
    n, _, _, err, at = csv.parse_csv(np.frombuffer(data, np.uint8), rows, False, fmt.mask, columns.roles,
                                     columns.namespaces, labels, keys, np.empty(rows, np.int64))
    _check(data, fmt, err, at, what, columns, first=first)
    k = columns.keys_per_row
    return Batch(labels[:n], np.arange(0, (n + 1) * k, k, dtype=np.int64), keys[:n].reshape(-1),
                 np.ones(n * k, np.float32))


def json_batches(doc: JsonRows, fmt: DataFormat) -> Iterator[Batch]:
    """A JSON body's rows, ``PIECE_ROWS`` at a time (as ``text_batches``); whether they are
    labelled, the first row says for all."""
    sep = "\t" if fmt.name == "criteo" else "," if fmt.name in ("csv", "avazu") else " "
    head = _csv_header(doc.rest, fmt) if fmt.name in ("csv", "avazu") else ""
    unlabeled = None
    for start in range(0, doc.count, PIECE_ROWS):
        rows = doc.piece(start, min(start + PIECE_ROWS, doc.count))
        text = _joined(rows, sep)
        if text is not None and text.count("\n") == len(rows) - 1:  # the usual case: no look at each row
            body = (head + text + "\n").encode()
            unlabeled = _unlabeled(body, fmt) if unlabeled is None else unlabeled
            batch = text_batch(body, fmt, "row", first=start + 1, unlabeled=unlabeled)
            if len(batch) == len(rows):
                yield batch
                continue  # else an empty row: found below
        lines = [_row_text(i, row, fmt, sep) for i, row in enumerate(rows, start + 1)]
        body = (head + "\n".join(lines) + "\n").encode()
        unlabeled = _unlabeled(body, fmt) if unlabeled is None else unlabeled
        yield text_batch(body, fmt, "row", first=start + 1, unlabeled=unlabeled)


def _joined(rows: list[Any], sep: str) -> str | None:
    """Rows that are lines or lists of string tokens, as lines (None: some other row, for
    ``_row_text`` to name)."""
    try:
        return "\n".join([r if type(r) is str else sep.join(r) if type(r) is list else None  # type: ignore[misc]
                          for r in rows])
    except TypeError:
        return None


def _csv_header(doc: dict[str, Any], fmt: DataFormat) -> str:
    """A CSV model's JSON body's ``"header"`` line (its columns, the label's among them)."""
    header = doc.get("header")
    if isinstance(header, list):
        header = ",".join(map(str, header))
    if not isinstance(header, str) or not header.strip():
        raise DataError(f"a {fmt.name} model's JSON body names its columns: \"header\": \"c1,c2,...\" (the label "
                        "column among them, as in training)")
    return header.strip() + "\n"


def _row_text(number: int, row: Any, fmt: DataFormat, sep: str) -> str:
    """One JSON row as a line of the model's format."""
    if isinstance(row, str):
        line = row.rstrip("\r\n")
    elif isinstance(row, list) and row:
        line = sep.join(_token(number, t, fmt) for t in row)
    else:
        raise DataError(f"row {number}: a row is a line of text or a non-empty list of tokens, got "
                        f"{json.dumps(row)[:100]}")
    if not line.strip() or "\n" in line:
        raise DataError(f"row {number}: {'an empty row' if not line.strip() else 'a row is one line'}: "
                        f"{line[:100]!r}")
    return line


def _token(number: int, token: Any, fmt: DataFormat) -> str:
    if isinstance(token, str):
        return token
    if isinstance(token, bool) or token is None:
        raise DataError(f"row {number}: a token is a string or a number, got {json.dumps(token)}")
    if isinstance(token, (int, float)):
        return repr(token)
    if fmt.name == "libsvm" and isinstance(token, list) and len(token) == 2 and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in token):
        return f"{token[0]!r}:{token[1]!r}"
    pair = " or [index, value]" if fmt.name == "libsvm" else ""
    raise DataError(f"row {number}: a token is a string or a number{pair}, got {json.dumps(token)[:100]}")
