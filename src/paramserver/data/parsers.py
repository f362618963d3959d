"""The per-format chunk parsers, and what a malformed line is reported as.

A parser is fed chunks of whole lines (``reader.py`` reads them) and yields ``Batch``es:
Criteo's and CSV's parse straight into the arrays of the batch being filled (every row
has the same number of keys, so a batch spans chunks without a copy); LIBSVM's parse a
chunk into buffers sized for it and yield its rows (the reader cuts them into batches).
The parsing itself is numba (``parse.py``, ``csv.py``); a line it refuses is raised as
``DataError`` naming the file, the line number, the text and the likely fix.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from paramserver.data import csv, parse
from paramserver.data.batch import FORMATS, STDIN, Batch, DataError, DataFormat, Shard
from paramserver.data.files import compressed_as, open_input

_COUNT_BYTES = 4 << 20  # read at a time while counting the lines before a bad one


def _line_number(path: str, offset: int) -> int:
    """1-based number of the line starting at byte ``offset`` (counted on demand)."""
    with open_input(path) as f:
        count, done = 0, 0
        while done < offset:
            chunk = f.read(min(_COUNT_BYTES, offset - done))
            if not chunk:
                break
            count += chunk.count(b"\n")
            done += len(chunk)
    return count + 1


class CriteoParser:
    """Parses Criteo lines straight into the arrays of the batch being filled, which
    may span chunks: no chunk-sized buffer, no copy, no re-cutting."""

    def __init__(self, fmt: DataFormat, batch_size: int):
        self.fmt, self.size = fmt, batch_size
        self.line_end = np.empty(batch_size, np.int64)
        self._new()

    def _new(self) -> None:
        self.labels = np.empty(self.size, np.float32)
        self.keys = np.empty((self.size, parse.CRITEO_KEYS), np.uint64)
        self.filled = 0

    def _batch(self) -> Batch:
        n, k = self.filled, parse.CRITEO_KEYS
        return Batch(self.labels[:n], np.arange(0, (n + 1) * k, k, dtype=np.int64),
                     self.keys[:n].reshape(-1), None, ones=True)

    def feed(self, arr: np.ndarray, base: int, shard: Shard, stats: dict[str, Any]) -> Iterator[Batch]:
        offset = 0
        while offset < arr.shape[0]:
            n, used, bad, err, err_at = self._parse(arr[offset:], self.filled)
            stats["bad_lines"] += bad
            stats["examples"] += n
            if err != parse.ERR_NONE:
                raise_bad_line(shard, self.fmt, arr, offset + err_at, base, err, getattr(self, "columns", None))
            self.filled += n
            offset += used
            if self.filled == self.size:
                yield self._batch()
                self._new()

    def _parse(self, arr: np.ndarray, f: int) -> tuple[Any, ...]:
        out: tuple[Any, ...] = parse.parse_criteo(arr, self.size - f, self.fmt.skip_bad, self.fmt.mask,
                                                  self.labels[f:], self.keys[f:], self.line_end, self.fmt.unlabeled)
        return out

    def flush(self) -> Iterator[Batch]:
        if self.filled:
            yield self._batch()
            self._new()


class CsvParser(CriteoParser):
    """CSV rows (``data/csv.py``) into the batch being filled, as Criteo's: every row has
    the same number of keys, set by the file's header."""

    def __init__(self, fmt: DataFormat, batch_size: int, columns: csv.Columns):
        self.columns = columns
        super().__init__(fmt, batch_size)

    def _new(self) -> None:
        self.labels = np.empty(self.size, np.float32)
        self.keys = np.empty((self.size, self.columns.keys_per_row), np.uint64)
        self.filled = 0

    def _batch(self) -> Batch:
        n, k = self.filled, self.columns.keys_per_row
        return Batch(self.labels[:n], np.arange(0, (n + 1) * k, k, dtype=np.int64),
                     self.keys[:n].reshape(-1), None, ones=True)

    def _parse(self, arr: np.ndarray, f: int) -> tuple[Any, ...]:
        out: tuple[Any, ...] = csv.parse_csv(arr, self.size - f, self.fmt.skip_bad, self.fmt.mask, self.columns.roles,
                                             self.columns.namespaces, self.labels[f:], self.keys[f:], self.line_end)
        return out


class LibsvmParser:
    """Parses each chunk into buffers sized for it (a line's feature count is unknown
    until parsed) and yields the chunk's rows as one batch; the reader cuts them."""

    def __init__(self, fmt: DataFormat, batch_size: int):
        self.fmt = fmt

    def feed(self, arr: np.ndarray, base: int, shard: Shard, stats: dict[str, Any]) -> Iterator[Batch]:
        offset, size = 0, arr.shape[0]
        rows = min(size // 2 + 1, 1 << 16)  # a line takes >= 2 bytes; the loop goes on if more
        labels, line_end = np.empty(rows, np.float32), np.empty(rows, np.int64)
        indptr = np.empty(rows + 1, np.int64)
        cap = size // 2 + rows + 1  # a feature takes >= 2 bytes ("1:" at least ... "1:1 ")
        keys, vals = np.empty(cap, np.uint64), np.empty(cap, np.float32)
        seen = np.empty(cap, np.int64)  # each row's indices, to find a duplicate in an unsorted row
        while offset < size:
            n, used, bad, err, err_at = parse.parse_libsvm(
                arr[offset:], rows, self.fmt.skip_bad, self.fmt.mask, parse.LABEL_FORMATS[self.fmt.label_format],
                labels, indptr, keys, vals, line_end, self.fmt.unlabeled, seen)
            stats["bad_lines"] += bad
            if err != parse.ERR_NONE:
                raise_bad_line(shard, self.fmt, arr, offset + err_at, base, err)
            if n:
                nnz = int(indptr[n])
                stats["examples"] += n
                yield Batch(labels[:n].copy(), indptr[: n + 1].copy(), keys[:nnz].copy(), vals[:nnz].copy())
            offset += used

    def flush(self) -> Iterator[Batch]:
        return iter(())



LABELS_ALLOWED = {"01": "0 or 1", "pm1": "-1 or +1", "12": "1 or 2"}


def what_is_wrong(fmt: DataFormat, err: int, columns: csv.Columns | None) -> str:
    if err == csv.ERR_QUOTE:
        return "a quoted field (quoted CSV is not supported: remove the quotes)"
    if err == csv.ERR_NUMBER:
        numeric = ", ".join(fmt.numeric_columns)
        return f"a value of a numeric column ({numeric}: --numeric-columns) is not a number"
    if fmt.name in ("csv", "avazu") and columns is not None:
        if err == parse.ERR_FIELDS:
            return f"expected {len(columns.names)} comma-separated fields, as the header has"
        if err == parse.ERR_LABEL:
            label = columns.names[int(np.flatnonzero(columns.roles == csv.ROLE_LABEL)[0])]
            return f"the label (column {label!r}) must be 0 or 1"
    if err == parse.ERR_LABEL:
        allowed = LABELS_ALLOWED[fmt.label_format] if fmt.name == "libsvm" else "0 or 1"
        return f"the label must be {allowed}"
    return parse.ERRORS[err]



def _binary(head: bytes) -> str | None:
    """What to say of a first line that is not text: compressed data under a plain name, or
    bytes with NULs; None for text."""
    if (compressed := compressed_as(head)) is not None:
        kind, suffix = compressed
        return f"the file is {kind} data: name it with {suffix} at the end, which is how it is read decompressed"
    if b"\x00" in head:
        return "the file holds NUL bytes: it is binary, not text (give the data file itself)"
    return None


def raise_bad_line(shard: Shard, fmt: DataFormat, arr: np.ndarray, at: int, base: int, err: int,
                    columns: csv.Columns | None = None) -> None:
    stop = at
    while stop < arr.shape[0] and arr[stop] != parse.NL:
        stop += 1
    text = bytes(arr[at:stop]).decode("utf-8", errors="replace")
    if len(text) > 200:
        text = text[:200] + "..."
    line = _line_number(shard.path, base + at) if shard.path != STDIN and not shard.source else f"byte {base + at}"
    first = line == 1 or (fmt.name in ("csv", "avazu") and line == 2) or line == "byte 0"
    fix = (f"is the file really in this format? (--format {'|'.join(FORMATS)})" if first else
           "fix or drop the line, or pass --skip-bad-lines to skip and count such lines")
    if err == parse.ERR_LABEL and fmt.name == "libsvm" and first:
        fix = "pass --label-format 01|pm1|12, or check --format"
    if first and (binary := _binary(bytes(arr[at:at + 4096]))):
        fix, text = binary, text[:40] + "..."
    where = f"{shard.where()}:{line}"
    if shard.source:  # a stream's row: named as its source names it (Redis: the entry id, to XDEL it)
        from paramserver.data.sources import locate_row

        if (found := locate_row(shard, base + at)) is not None:
            where, fix = found[0], f"fix: {found[1]}, or pass --skip-bad-lines to skip and count such rows"
    raise DataError(f"{where}: {what_is_wrong(fmt, err, columns)} ({fmt.name} format): {text!r}; {fix}")
