"""A ``/predict`` request's rows as a ``Batch``: the numba parsers of ``data/`` run straight
on the body's bytes (no Python a row), in the model's own format.

A text body is lines as a file of that format holds them, labelled or not (as
``paramserver predict`` reads them: the first line says which, ``sniff_unlabeled``'s
rule); a CSV or Avazu body starts with its header, as a file does.  A JSON body is
``{"rows": [...]}``, each row a line of text, or its tokens: for LIBSVM ``["3:1.0",
"17:0.5"]`` or ``[[3, 1.0], [17, 0.5]]``, for Criteo the 39 (or, labelled, 40) fields;
a CSV model's JSON names its columns in ``"header"``.  A malformed row is a ``DataError``
naming the row (or the line) and the parser's rule, which the server answers with 400.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from paramserver.data import csv, parse
from paramserver.data.parsers import _what_is_wrong
from paramserver.data.reader import Batch, DataError, DataFormat
from paramserver.errors import ConfigError

NL = b"\n"


def text_batch(body: bytes, fmt: DataFormat, what: str = "line") -> Batch:
    """The rows of a text body (``what``: how a row is named in an error)."""
    if not body.strip():
        raise DataError("the request has no rows: send lines in the model's format, or JSON {\"rows\": [...]}")
    if not body.endswith(NL):
        body += NL
    if fmt.name in ("csv", "avazu"):
        return _csv(body, fmt, what)
    arr = np.frombuffer(body, np.uint8)
    unlabeled = _unlabeled(body, fmt)
    if fmt.name == "criteo":
        rows = body.count(NL)
        labels, keys = np.empty(rows, np.float32), np.empty((rows, parse.CRITEO_KEYS), np.uint64)
        n, _, _, err, at = parse.parse_criteo(arr, rows, False, fmt.mask, labels, keys, np.empty(rows, np.int64),
                                              unlabeled)
        _check(body, fmt, err, at, what)
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
    _check(body, fmt, err, at, what)
    nnz = int(indptr[n])
    return Batch(labels[:n], indptr[:n + 1], keys[:nnz], vals[:nnz])


def _unlabeled(body: bytes, fmt: DataFormat) -> bool:
    """Whether the rows have no label: the first non-blank line says (as ``sniff_unlabeled``)."""
    start = 0
    while True:
        end = body.find(NL, start)
        line = body[start:end].rstrip(b"\r")
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
    raise DataError(f"{what} {number}: {_what_is_wrong(fmt, err, columns)} ({fmt.name} format, as the model was "
                    f"trained on): {text!r}")


def _csv(body: bytes, fmt: DataFormat, what: str) -> Batch:
    """A CSV body: its header line, then rows (an Avazu body may be rows of Avazu's 24 columns)."""
    cut = body.find(NL) + 1
    try:
        columns = csv.columns_of(body[:cut].decode("utf-8", errors="replace"), "the request", fmt.name,
                                 fmt.label_column, fmt.ignore_columns, fmt.numeric_columns)
    except ConfigError as exc:
        raise DataError(str(exc)) from None
    data = body[cut:] if columns.header else body
    rows = data.count(NL)
    labels, keys = np.empty(rows, np.float32), np.empty((rows, columns.keys_per_row), np.uint64)
    n, _, _, err, at = csv.parse_csv(np.frombuffer(data, np.uint8), rows, False, fmt.mask, columns.roles,
                                     columns.namespaces, labels, keys, np.empty(rows, np.int64))
    _check(data, fmt, err, at, what, columns, first=2 if columns.header and what == "line" else 1)
    k = columns.keys_per_row
    return Batch(labels[:n], np.arange(0, (n + 1) * k, k, dtype=np.int64), keys[:n].reshape(-1),
                 np.ones(n * k, np.float32))


def json_batch(body: bytes, fmt: DataFormat) -> Batch:
    """The rows of a JSON body ``{"rows": [...]}`` (see the module)."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise DataError(f"the body is not JSON ({exc}): send {{\"rows\": [...]}}, or rows as text/plain") from None
    rows = doc.get("rows") if isinstance(doc, dict) else None
    if not isinstance(rows, list) or not rows:
        raise DataError("a JSON body needs \"rows\": a non-empty list of rows (each a line of text, or a list "
                        "of tokens)")
    head = _csv_header(doc, fmt) if fmt.name in ("csv", "avazu") else ""
    sep = "\t" if fmt.name == "criteo" else "," if fmt.name in ("csv", "avazu") else " "
    text = _joined(rows, sep)
    if text is not None and text.count("\n") == len(rows) - 1:  # the usual case: no look at each row
        batch = text_batch((head + text + "\n").encode(), fmt, "row")
        if len(batch) == len(rows):
            return batch  # else an empty row: found below
    lines = [_row_text(i, row, fmt, sep) for i, row in enumerate(rows, 1)]
    return text_batch((head + "\n".join(lines) + "\n").encode(), fmt, "row")


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
