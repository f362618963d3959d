"""Training data: shards of files and a streaming reader of mini-batches.

A shard is ``(path, start, end)``: the lines whose first byte lies in ``[start, end)``
(Hadoop's convention), so shards of one file never share or lose a line.  A compressed
file cannot be split and is one shard.  Paths go through fsspec (``s3://``, ``gs://``,
``hdfs://`` work once the user installs the driver); ``.gz`` is read transparently.

``read_batches`` reads a shard in chunks of whole lines, parses each chunk with the
numba parser of its format and yields ``Batch``es.  A malformed line raises
``DataError`` naming the file, the line number and the text, unless ``skip_bad``.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import lzma
import os
import sys
import zlib
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from paramserver.data import csv, parse
from paramserver.data.files import COMPRESSED, local_files, open_input
from paramserver.errors import ConfigError, ParamServerError
from paramserver.routing.partition import unique_inverse

FORMATS = ("criteo", "libsvm", "avazu", "csv")
STDIN = "-"  # --data -: standard input
CHUNK_BYTES = 4 << 20


class DataError(ParamServerError):
    """Training data cannot be read: missing, empty, or a malformed line."""


@dataclass(frozen=True)
class Shard:
    path: str
    start: int
    end: int  # -1: to the end of the file

    def to_wire(self) -> list:
        return [self.path, self.start, self.end]

    @classmethod
    def from_wire(cls, w: list) -> Shard:
        return cls(str(w[0]), int(w[1]), int(w[2]))


@dataclass
class Batch:
    labels: np.ndarray  # float32[n]
    indptr: np.ndarray  # int64[n + 1]
    keys: np.ndarray  # uint64[nnz]
    vals: np.ndarray  # float32[nnz]

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def unique(self, expect: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """The batch's distinct keys and, per key occurrence, its index among them
        (``expect``: about how many distinct keys there are, e.g. the last batch's count).

        A CTR batch repeats keys a lot (bias, missing values, frequent categories:
        40 000 occurrences are ~7 600 distinct keys in a Criteo-like batch of 1 000), so
        models pull and push distinct keys only.
        """
        return unique_inverse(self.keys, expect)


@dataclass(frozen=True)
class DataFormat:
    """How to parse: format name, hash bits (0 = full 64), LIBSVM label encoding."""

    name: str = "criteo"
    hash_bits: int = 24  # the CLI's default: 2^24 buckets (a dense table of 256 MiB for LR)
    label_format: str = "01"
    skip_bad: bool = False
    cache_dir: str = ""  # parsed shards are kept here and reused by later epochs
    label_column: str = ""  # csv: the 0/1 label's column (avazu: click)
    ignore_columns: tuple[str, ...] = ()  # csv/avazu: columns that are not features (avazu: id too)
    unlabeled: bool = False  # criteo/libsvm lines without a label (to predict; see sniff_unlabeled)
    max_bad_fraction: float = 0.01  # with skip_bad: more malformed lines than this fails the job

    def __post_init__(self) -> None:
        if self.name not in FORMATS:
            raise ConfigError(f"--format must be one of {FORMATS}, got {self.name!r}")
        if not 0 <= self.hash_bits <= 64:
            raise ConfigError(f"--hash-bits must be in [0, 64] (0: no folding), got {self.hash_bits}")
        if not 0 <= self.max_bad_fraction <= 1:
            raise ConfigError(f"--max-bad-fraction must be in [0, 1], got {self.max_bad_fraction}")
        if self.label_column and self.name not in ("csv", "avazu"):
            raise ConfigError(f"--label names a CSV column; --format {self.name} has its label in a fixed place")
        object.__setattr__(self, "ignore_columns", tuple(self.ignore_columns))  # a list from JSON
        if self.label_format not in parse.LABEL_FORMATS:
            raise ConfigError(f"label format must be one of {sorted(parse.LABEL_FORMATS)}, "
                              f"got {self.label_format!r}")

    @property
    def mask(self) -> np.uint64:
        return np.uint64(0 if self.hash_bits in (0, 64) else (1 << self.hash_bits) - 1)


def _filesystem(path: str) -> tuple[Any, str]:
    """The fsspec filesystem of ``path`` and its path there; a missing driver (s3fs for
    s3://, gcsfs for gs://, ...) is a one-line error naming the package."""
    import fsspec

    try:
        return fsspec.core.url_to_fs(path)  # no glob expansion here (get_fs_token_paths would)
    except ImportError as exc:
        raise DataError(f"{path}: {exc} (pip install it, or copy the data to a local path)") from None
    except ValueError as exc:  # an unknown protocol
        raise DataError(f"{path}: {exc}") from None


def expand(paths: list[str]) -> list[str]:
    """``paths`` with glob patterns (``*``, ``?``, ``[``) expanded, each in sorted order;
    a pattern that matches nothing is an error."""
    out = []
    for path in map(os.fspath, paths):  # pathlib.Paths too
        if path == "-" or not any(c in path for c in "*?["):
            out.append(path)
            continue
        fs, pattern = _filesystem(path)
        protocol = path.split("://", 1)[0] + "://" if "://" in path else ""
        found = sorted(p for p in fs.glob(pattern) if not fs.isdir(p))
        if not found:
            raise DataError(f"no file matches {path}")
        out += [protocol + p if protocol and not p.startswith(protocol) else p for p in found]
    return out


def _check_exists(path: str) -> int:
    fs, p = local_files(path) or _filesystem(path)
    if not fs.exists(p):
        raise DataError(f"no such file: {path}")
    if fs.isdir(p):
        raise DataError(f"{path} is a directory; pass the files in it")
    size = int(fs.size(p) or 0)
    if size == 0:
        raise DataError(f"{path} is empty")
    return size


def make_shards(paths: list[str], shard_bytes: int = 64 << 20) -> list[Shard]:
    """Cut ``paths`` into shards of about ``shard_bytes`` (compressed files: one each)."""
    if not paths:
        raise DataError("no input files given")
    if not shard_bytes >= 1:
        raise ConfigError(f"--shard-mb must be > 0 (megabytes of input per shard), got {shard_bytes / (1 << 20):g}")
    shards = []
    for path in expand(paths):
        if path == STDIN:  # one shard, read once, in order
            shards.append(Shard(path, 0, -1))
            continue
        size = _check_exists(path)
        if path.endswith(COMPRESSED) or size <= shard_bytes:
            shards.append(Shard(path, 0, -1))
            continue
        for start in range(0, size, shard_bytes):
            shards.append(Shard(path, start, min(start + shard_bytes, size)))
    return shards


def sniff_unlabeled(path: str, fmt: DataFormat) -> bool:
    """Whether ``path``'s first line has no label: 39 tab-separated fields in a Criteo file
    (its test.txt), a first token ``index:value`` in a LIBSVM one.  (Training and
    evaluation need labels; ``predict`` scores either.)"""
    if fmt.name not in ("criteo", "libsvm"):
        return False
    if path == STDIN:
        head = sys.stdin.buffer.peek(1 << 16)  # type: ignore[union-attr]  # buffered, not consumed
    else:
        with open_input(path) as f:
            head = f.read(1 << 16)
    line = next((x for x in head.split(b"\n") if x.strip()), b"")
    if fmt.name == "criteo":
        return line.rstrip(b"\r").count(b"\t") == parse.CRITEO_FIELDS - 2
    first = line.split(None, 1)[0] if line.split() else b""
    return b":" in first


def sniff_label_format(path: str) -> str:
    """LIBSVM label encoding from the first lines of ``path``: ``01``, ``pm1`` or ``12``."""
    with open_input(path) as f:
        head = f.read(1 << 20)
    labels = set()
    for line in head.split(b"\n")[:-1] or head.split(b"\n"):
        token = line.split(None, 1)[0] if line.strip() else b""
        if token:
            labels.add(token.decode(errors="replace"))
    values = set()
    for t in labels:
        try:
            values.add(float(t))
        except ValueError:
            pass
    if -1.0 in values:
        return "pm1"
    if 2.0 in values:
        return "12"
    return "01"


def _line_number(path: str, offset: int) -> int:
    """1-based number of the line starting at byte ``offset`` (counted on demand)."""
    with open_input(path) as f:
        count, done = 0, 0
        while done < offset:
            chunk = f.read(min(CHUNK_BYTES, offset - done))
            if not chunk:
                break
            count += chunk.count(b"\n")
            done += len(chunk)
    return count + 1


class _CriteoParser:
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
                     self.keys[:n].reshape(-1), np.ones(n * k, np.float32))

    def feed(self, arr: np.ndarray, base: int, shard: Shard, stats: dict) -> Iterator[Batch]:
        offset = 0
        while offset < arr.shape[0]:
            n, used, bad, err, err_at = self._parse(arr[offset:], self.filled)
            stats["bad_lines"] += bad
            stats["examples"] += n
            if err != parse.ERR_NONE:
                _raise_bad_line(shard, self.fmt, arr, offset + err_at, base, err, getattr(self, "columns", None))
            self.filled += n
            offset += used
            if self.filled == self.size:
                yield self._batch()
                self._new()

    def _parse(self, arr: np.ndarray, f: int) -> tuple:
        return parse.parse_criteo(arr, self.size - f, self.fmt.skip_bad, self.fmt.mask, self.labels[f:],
                                  self.keys[f:], self.line_end, self.fmt.unlabeled)

    def flush(self) -> Iterator[Batch]:
        if self.filled:
            yield self._batch()
            self._new()


class _CsvParser(_CriteoParser):
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
                     self.keys[:n].reshape(-1), np.ones(n * k, np.float32))

    def _parse(self, arr: np.ndarray, f: int) -> tuple:
        return csv.parse_csv(arr, self.size - f, self.fmt.skip_bad, self.fmt.mask, self.columns.roles,
                             self.columns.namespaces, self.labels[f:], self.keys[f:], self.line_end)


class _LibsvmParser:
    """Parses each chunk into buffers sized for it (a line's feature count is unknown
    until parsed) and yields the chunk's rows as one batch; ``read_batches`` cuts them."""

    def __init__(self, fmt: DataFormat, batch_size: int):
        self.fmt = fmt

    def feed(self, arr: np.ndarray, base: int, shard: Shard, stats: dict) -> Iterator[Batch]:
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
                _raise_bad_line(shard, self.fmt, arr, offset + err_at, base, err)
            if n:
                nnz = int(indptr[n])
                stats["examples"] += n
                yield Batch(labels[:n].copy(), indptr[: n + 1].copy(), keys[:nnz].copy(), vals[:nnz].copy())
            offset += used

    def flush(self) -> Iterator[Batch]:
        return iter(())


def read_batches(shard: Shard, fmt: DataFormat, batch_size: int,
                 stats: dict | None = None) -> Iterator[Batch]:
    """Yield mini-batches of ``batch_size`` examples (the last may be smaller).

    ``stats`` (if given) receives ``bad_lines``, ``examples`` and ``bytes``.
    """
    if batch_size < 1:
        raise ConfigError(f"batch size must be >= 1, got {batch_size}")
    stats = stats if stats is not None else {}
    stats.setdefault("bad_lines", 0)
    stats.setdefault("examples", 0)
    pending: deque[Batch] = deque()
    pending_rows = 0
    pieces = (_cached_chunks(shard, fmt, stats, batch_size) if fmt.cache_dir else
              _read_chunks(shard, fmt, stats, batch_size))
    for piece in pieces:  # Criteo's come whole: taken as they are, no copy
        _check_bad_fraction(shard, fmt, stats)
        pending.append(piece)
        pending_rows += len(piece)
        while pending_rows >= batch_size:
            take, need = [], batch_size
            while need:
                head = pending[0]
                if len(head) <= need:
                    take.append(pending.popleft())
                    need -= len(head)
                else:  # views: only the rows of this batch get copied, by _concat
                    take.append(_slice(head, 0, need))
                    pending[0] = _slice(head, need, len(head))
                    need = 0
            pending_rows -= batch_size
            yield _concat(take)
    if pending_rows:
        yield _concat(list(pending))


def _check_bad_fraction(shard: Shard, fmt: DataFormat, stats: dict) -> None:
    """With ``--skip-bad-lines``, more than ``max_bad_fraction`` of the lines read so far
    malformed (once 100 are) means the wrong format, not a few damaged lines: fail, early."""
    bad, good = stats["bad_lines"], stats["examples"]
    if fmt.skip_bad and bad >= 100 and bad > fmt.max_bad_fraction * (bad + good):
        raise DataError(f"{shard.path}: {bad:,} of the {bad + good:,} lines read so far are malformed, more than "
                        f"--max-bad-fraction {fmt.max_bad_fraction:g}: is --format {fmt.name} right"
                        f"{' (and --label-format; a multiclass file has other labels)' if fmt.name == 'libsvm' else ''}"
                        "? Drop --skip-bad-lines to see the first bad line, or raise --max-bad-fraction")


def _cache_path(shard: Shard, fmt: DataFormat) -> str:
    """A cache file named by everything the parse depends on, the file's size and mtime too."""
    import fsspec

    fs, _, (p,) = fsspec.get_fs_token_paths(shard.path)
    info = fs.info(p)
    key = json.dumps([shard.path, shard.start, shard.end, info.get("size"), info.get("mtime"),
                      fmt.name, fmt.hash_bits, fmt.label_format, fmt.skip_bad, fmt.unlabeled, fmt.label_column,
                      list(fmt.ignore_columns)], default=str)
    return os.path.join(fmt.cache_dir, hashlib.sha1(key.encode()).hexdigest() + ".npz")


def _cached_chunks(shard: Shard, fmt: DataFormat, stats: dict, batch_size: int) -> Iterator[Batch]:
    """Like ``_read_chunks``, but a shard parsed once is read back from ``fmt.cache_dir``
    (like Vowpal Wabbit's --cache: later epochs skip parsing and hashing)."""
    path = _cache_path(shard, fmt)
    if os.path.exists(path):
        with np.load(path) as data:
            stats["bad_lines"] += int(data["bad_lines"])
            stats["bytes"] = stats.get("bytes", 0) + int(data["bytes"])
            batch = Batch(data["labels"], data["indptr"], data["keys"], data["vals"])
        stats["examples"] += len(batch)
        yield batch
        return
    parts = []
    before_bad, before_bytes = stats["bad_lines"], stats.get("bytes", 0)
    for batch in _read_chunks(shard, fmt, stats, batch_size):
        parts.append(batch)
        yield batch
    whole = _concat(parts) if parts else Batch(np.zeros(0, np.float32), np.zeros(1, np.int64),
                                               np.zeros(0, np.uint64), np.zeros(0, np.float32))
    os.makedirs(fmt.cache_dir, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp.npz"
    np.savez(tmp, labels=whole.labels, indptr=whole.indptr, keys=whole.keys, vals=whole.vals,
             bad_lines=stats["bad_lines"] - before_bad, bytes=stats.get("bytes", 0) - before_bytes)
    os.replace(tmp, path)  # whole or absent: a reader never sees half a cache file


def _read_chunks(shard: Shard, fmt: DataFormat, stats: dict, batch_size: int) -> Iterator[Batch]:
    """The shard's examples, parsed a chunk of whole lines at a time (batches of any size;
    Criteo's are ``batch_size`` but the last)."""
    path = shard.path
    try:
        f = _Unclosed(sys.stdin.buffer) if path == STDIN else open_input(path)
    except FileNotFoundError:
        raise DataError(f"no such file: {path}") from None
    stats.setdefault("bytes", 0)
    carry = b""  # bytes read ahead that are data (standard input cannot seek back)
    with f:
        pos = shard.start
        if fmt.name in ("csv", "avazu"):  # the header: the file's first line, wherever the shard starts
            header = f.readline()
            columns = csv.columns_of(header.decode("utf-8", errors="replace"), path, fmt.name, fmt.label_column,
                                     fmt.ignore_columns)
            parser: Any = _CsvParser(fmt, batch_size, columns)
            pos = max(pos, len(header) if columns.header else 0)
            if path != STDIN:
                f.seek(pos)
            elif not columns.header:
                carry = header
        else:
            parser = (_CriteoParser if fmt.name == "criteo" else _LibsvmParser)(fmt, batch_size)
        if 0 < pos == shard.start:  # the line straddling start belongs to the previous shard
            f.seek(shard.start - 1)
            skipped = f.readline()
            pos = shard.start - 1 + len(skipped)
        end = shard.end if shard.end >= 0 else None
        buf, have = bytearray(max(CHUNK_BYTES, 2 * len(carry))), len(carry)  # buf[:have]: read, not parsed;
        buf[:have] = carry  # it starts at file offset pos
        eof, added = False, 0
        while not eof and (end is None or pos < end):
            if have == len(buf):  # a line longer than the buffer: grow it
                buf.extend(bytes(len(buf)))
            got = _read_into(f, memoryview(buf)[have:], path, pos + have)
            eof, have = got == 0, have + got
            if eof:
                if not have:
                    break
                if buf[have - 1] != parse.NL:  # the last line has no newline: give it one
                    if have == len(buf):
                        buf.append(0)
                    buf[have] = parse.NL
                    have, added = have + 1, 1
                cut = have
            else:
                cut = buf.rfind(b"\n", 0, have) + 1
                if cut == 0:  # no whole line yet: read on
                    continue
            arr = np.frombuffer(buf, np.uint8, count=cut)
            if end is not None and end - pos < cut:  # keep only lines starting before `end`
                limit = end - pos
                arr = arr[: buf.find(b"\n", limit - 1, cut) + 1] if limit > 0 else arr[:0]
            yield from parser.feed(arr, pos, shard, stats)
            stats["bytes"] += arr.shape[0] - added  # the shard's own lines
            del arr  # no view of buf may outlive the chunk: the next read reuses it
            pos += cut
            buf[: have - cut] = buf[cut:have]
            have -= cut
        yield from parser.flush()


LABELS_ALLOWED = {"01": "0 or 1", "pm1": "-1 or +1", "12": "1 or 2"}


def _what_is_wrong(fmt: DataFormat, err: int, columns: csv.Columns | None) -> str:
    if err == csv.ERR_QUOTE:
        return "a quoted field (quoted CSV is not supported: remove the quotes)"
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


class _Unclosed:
    """Standard input as the reader uses a file (``with``, ``readinto``, ``readline``), left open."""

    def __init__(self, raw: Any):
        self.raw = raw

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def readinto(self, view: memoryview) -> int:
        return self.raw.readinto(view)

    def readline(self) -> bytes:
        return self.raw.readline()

    def seek(self, pos: int) -> None:
        raise DataError("standard input cannot be read from the middle: pass a file to split it into shards")


def _read_into(f: Any, view: memoryview, path: str, offset: int) -> int:
    """``f.readinto``, with a damaged compressed file named, not a bare zlib traceback."""
    try:
        return f.readinto(view) or 0
    except (EOFError, zlib.error, gzip.BadGzipFile, lzma.LZMAError) as exc:
        raise DataError(f"{path}: cannot decompress it (after {offset:,} bytes of content) ({exc}); is the file "
                        "whole (an interrupted download or copy?) and really in the format its name says?") from None


def _raise_bad_line(shard: Shard, fmt: DataFormat, arr: np.ndarray, at: int, base: int, err: int,
                    columns: csv.Columns | None = None) -> None:
    stop = at
    while stop < arr.shape[0] and arr[stop] != parse.NL:
        stop += 1
    text = bytes(arr[at:stop]).decode("utf-8", errors="replace")
    if len(text) > 200:
        text = text[:200] + "..."
    line = _line_number(shard.path, base + at) if shard.path != STDIN else f"byte {base + at}"
    first = line == 1 or (fmt.name in ("csv", "avazu") and line == 2) or line == "byte 0"
    fix = (f"is the file really in this format? (--format {'|'.join(FORMATS)})" if first else
           "fix or drop the line, or pass --skip-bad-lines to skip and count such lines")
    if err == parse.ERR_LABEL and fmt.name == "libsvm" and first:
        fix = "pass --label-format 01|pm1|12, or check --format"
    raise DataError(f"{shard.path}:{line}: {_what_is_wrong(fmt, err, columns)} ({fmt.name} format): {text!r}; {fix}")


def _slice(b: Batch, lo: int, hi: int) -> Batch:
    a, z = int(b.indptr[lo]), int(b.indptr[hi])
    return Batch(b.labels[lo:hi], b.indptr[lo: hi + 1] - a, b.keys[a:z], b.vals[a:z])


def _concat(batches: list[Batch]) -> Batch:
    if len(batches) == 1:
        return batches[0]
    offsets = np.cumsum([0] + [int(b.indptr[-1]) for b in batches[:-1]])
    indptr = np.concatenate([batches[0].indptr[:1]] + [b.indptr[1:] + o for b, o in zip(batches, offsets)])
    return Batch(np.concatenate([b.labels for b in batches]), indptr,
                 np.concatenate([b.keys for b in batches]), np.concatenate([b.vals for b in batches]))


def read_all(paths: list[str], fmt: DataFormat, batch_size: int = 1 << 16) -> Batch:
    """Every example of ``paths`` (globs expanded) in one batch (for test sets)."""
    paths = expand(paths)
    parts = [b for p in paths for b in read_batches(Shard(p, 0, -1), fmt, batch_size)]
    if not parts:
        raise DataError(f"no examples in {', '.join(paths)}")
    return _concat(parts)

