"""Training data: shards of files and a streaming reader of mini-batches.

A shard is ``(path, start, end)``: the lines whose first byte lies in ``[start, end)``
(Hadoop's convention), so shards of one file never share or lose a line.  A compressed
file cannot be split and is one shard.  Paths go through fsspec (``s3://``, ``gs://``,
``hdfs://`` work once the user installs the driver); ``.gz`` is read transparently.

``read_batches`` reads a shard in chunks of whole lines, parses each chunk with the
numba parser of its format (``parsers.py``) and yields ``Batch``es (``batch.py``: the
shard, batch and format types, re-exported here).  A malformed line raises
``DataError`` naming the file, the line number and the text, unless ``skip_bad``.  A
shard of a file a stream took (``Shard.stamp``) is read only if the file is still the one
taken (``taken.py``); else ``FileChangedError``, or with ``--changed-files skip`` no rows
and the shard counted as skipped.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import sys
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np

from paramserver.data import csv, parse
from paramserver.data.batch import FORMATS, STDIN, Batch, DataError, DataFormat, FileStamp, Shard, _concat, _slice
from paramserver.data.files import COMPRESSED, fsspec_filesystem, local_files, open_input, reading
from paramserver.data.parsers import CriteoParser, CsvParser, LibsvmParser
from paramserver.data.sources import open_shard
from paramserver.errors import ConfigError

#: What importers take from here: the reader's own names, and the vocabulary of batch.py
#: (``Batch``, ``DataFormat``, ``Shard``, ``DataError``) that it reads in.
__all__ = ["CHUNK_BYTES", "FORMATS", "STDIN", "Batch", "DataError", "DataFormat", "Shard", "expand", "make_shards",
           "cut_file", "read_all", "read_batches", "sniff_label_format", "sniff_unlabeled"]

CHUNK_BYTES = 4 << 20

logger = logging.getLogger(__name__)


def expand(paths: list[str]) -> list[str]:
    """``paths`` with glob patterns (``*``, ``?``, ``[``) expanded, each in sorted order;
    a pattern that matches nothing is an error."""
    out = []
    for path in map(os.fspath, paths):  # pathlib.Paths too
        if path == "-" or not any(c in path for c in "*?["):
            out.append(path)
            continue
        fs, pattern = fsspec_filesystem(path)
        protocol = path.split("://", 1)[0] + "://" if "://" in path else ""
        found = sorted(p for p in fs.glob(pattern) if not fs.isdir(p))
        if not found:
            raise DataError(f"no file matches {path}")
        out += [protocol + p if protocol and not p.startswith(protocol) else p for p in found]
    return out


def _file_problem(path: str) -> tuple[str | None, int]:
    """What keeps ``path`` from being read as a file of data ("no such file", "a folder",
    "empty", or None), and its size."""
    fs, p = local_files(path) or fsspec_filesystem(path)
    if not fs.exists(p):
        return "no such file", 0
    if fs.isdir(p):
        return "a folder", 0
    size = int(fs.size(p) or 0)
    return ("empty" if size == 0 else None), size


def _check_exists(path: str) -> int:
    problem, size = _file_problem(path)
    if problem == "no such file":
        raise DataError(f"no such file: {path}")
    if problem == "a folder":
        raise DataError(f"{path} is a directory; pass the files in it")
    if problem:
        raise DataError(f"{path} is empty")
    return size


#: how much text a compressed file of a byte holds, about (gzip on CTR rows: 4-6x)
COMPRESSION_RATIO = 4


def input_bytes(paths: list[str]) -> int | None:
    """About how many bytes of text ``paths`` hold (a compressed file's size times
    ``COMPRESSION_RATIO``); None for standard input, whose size is not known."""
    total = 0
    for path in expand(paths):
        if path == STDIN:
            return None
        size = _check_exists(path)
        total += size * COMPRESSION_RATIO if path.endswith(COMPRESSED) else size
    return total


def shard_bytes(megabytes: float) -> int:
    """``--shard-mb``'s bytes: a finite number of megabytes that is at least a byte (nan
    crashed train converting it, inf overflowed, 1e-9 was said as 'got 0')."""
    if not (isinstance(megabytes, (int, float)) and math.isfinite(megabytes) and megabytes * (1 << 20) >= 1):
        raise ConfigError(f"--shard-mb must be > 0 (megabytes of input per shard), a finite number of at least one "
                          f"byte, like 16 or 0.5; got {megabytes!r}")
    return int(megabytes * (1 << 20))


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
        shards += cut_file(path, _check_exists(path), shard_bytes)
    return shards


def cut_file(path: str, size: int, shard_bytes: int, stamp: FileStamp | None = None) -> list[Shard]:
    """The shards of a file of ``size`` bytes (compressed: one).  With its ``stamp`` (a
    stream took it) every shard carries it and ends at ``size``: bytes appended later are
    not read into the last one (``data/taken.py`` says they were appended)."""
    if path.endswith(COMPRESSED) or size <= shard_bytes:
        return [Shard(path, 0, size if stamp is not None and not path.endswith(COMPRESSED) else -1, stamp=stamp)]
    return [Shard(path, start, min(start + shard_bytes, size), stamp=stamp) for start in range(0, size, shard_bytes)]


def sniff_unlabeled(path: str, fmt: DataFormat) -> bool:
    """Whether ``path``'s first line has no label: 39 tab-separated fields in a Criteo file
    (its test.txt), a first token ``index:value`` in a LIBSVM one.  (Training and
    evaluation need labels; ``predict`` scores either.)"""
    if fmt.name not in ("criteo", "libsvm"):
        return False
    if path == STDIN:
        head = sys.stdin.buffer.peek(1 << 16)  # type: ignore[union-attr]  # buffered, not consumed
    else:
        with open_input(path) as f, reading(path):
            head = f.read(1 << 16)
    if fmt.name == "criteo":
        line = next((x for x in head.split(b"\n") if x.strip()), b"")
        return line.rstrip(b"\r").count(b"\t") == parse.CRITEO_FIELDS - 2
    # LIBSVM: the first line with more than a comment (svmlight's, from '#')
    line = next((x for x in (y.split(b"#", 1)[0] for y in head.split(b"\n")) if x.strip()), b"")
    first = line.split(None, 1)[0] if line.split() else b""
    return b":" in first


def sniff_label_format(path: str) -> str:
    """LIBSVM label encoding from the first lines of ``path``: ``01``, ``pm1`` or ``12``, the
    one whose negative label (0, -1 or 2) the most lines have: a stray 2 among 0/1 labels
    took the file for 1/2, and the error then named a good line (a 0), not the stray one."""
    with open_input(path) as f, reading(path):
        head = f.read(1 << 20)
    seen: dict[float, int] = {}
    for line in head.split(b"\n")[:-1] or head.split(b"\n"):
        line = line.split(b"#", 1)[0]  # svmlight's comment
        token = line.split(None, 1)[0] if line.strip() else b""
        try:
            value = float(token) if token else None
        except ValueError:
            value = None
        if value is not None:
            seen[value] = seen.get(value, 0) + 1
    votes = {"01": seen.get(0.0, 0), "pm1": seen.get(-1.0, 0), "12": seen.get(2.0, 0)}
    return max(votes, key=lambda k: votes[k])  # a tie: the first (01, then pm1)


def read_batches(shard: Shard, fmt: DataFormat, batch_size: int,
                 stats: dict[str, Any] | None = None) -> Iterator[Batch]:
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
    # a stream's file (stamped) is read once: a cache of it would never be read back
    pieces = (_cached_chunks(shard, fmt, stats, batch_size) if fmt.cache_dir and shard.stamp is None else
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
    _check_bad_fraction(shard, fmt, stats)  # a shard of only bad lines yields no piece to check at
    if pending_rows:
        yield _concat(list(pending))


def _check_bad_fraction(shard: Shard, fmt: DataFormat, stats: dict[str, Any]) -> None:
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
                      list(fmt.ignore_columns), list(fmt.numeric_columns)], default=str)
    return os.path.join(fmt.cache_dir, hashlib.sha1(key.encode()).hexdigest() + ".npz")


def _cached_chunks(shard: Shard, fmt: DataFormat, stats: dict[str, Any], batch_size: int) -> Iterator[Batch]:
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


BOM = b"\xef\xbb\xbf"


def _read_chunks(shard: Shard, fmt: DataFormat, stats: dict[str, Any], batch_size: int) -> Iterator[Batch]:
    """The shard's examples, parsed a chunk of whole lines at a time (batches of any size;
    Criteo's are ``batch_size`` but the last)."""
    path = shard.path
    try:
        if shard.source:  # cut from a stream: its source plug-in reads it
            f: Any = open_shard(shard)
        elif shard.stamp is not None:  # a file a stream took: read only if it is still that file
            f = _open_taken(shard, fmt, stats)
            if f is None:
                return
        else:
            f = _Unclosed(sys.stdin.buffer) if path == STDIN else open_input(path)
    except FileNotFoundError:
        raise DataError(f"no such file: {path}") from None
    stats.setdefault("bytes", 0)
    with f:
        with reading(path):  # a CSV header or a byte-order mark read
            parser, pos, carry = _start(f, shard, fmt, batch_size)
        yield from _parse_lines(f, shard, stats, parser, pos, carry)
        yield from parser.flush()


def _open_taken(shard: Shard, fmt: DataFormat, stats: dict[str, Any]) -> Any:
    """The shard's file if it is still the one taken; else ``FileChangedError``, or with
    ``--changed-files skip`` None and the shard counted as skipped in ``stats``
    (``skipped_shards``, ``skipped_bytes``, ``skipped``: the file and what changed)."""
    from paramserver.data.taken import FileChangedError, open_taken

    assert shard.stamp is not None
    try:
        return open_taken(shard.path, shard.stamp)
    except FileChangedError as exc:
        if fmt.changed_files != "skip":
            raise
        logger.warning("%s: skipped %s of it (--changed-files skip): %s", shard.path,
                       f"bytes {shard.start:,}-{shard.start + shard.taken_bytes():,}", exc.what)
        stats["skipped_shards"] = stats.get("skipped_shards", 0) + 1
        stats["skipped_bytes"] = stats.get("skipped_bytes", 0) + shard.taken_bytes()
        stats["skipped"] = {"file": shard.path, "what": exc.what}
        return None


def _start(f: Any, shard: Shard, fmt: DataFormat, batch_size: int) -> tuple[Any, int, bytes]:
    """The shard's parser, the offset of its first line (``f`` is there), and the bytes
    read ahead that are data (standard input cannot seek back)."""
    path, pos, carry = shard.path, shard.start, b""
    if fmt.name in ("csv", "avazu"):  # the header: the file's first line, wherever the shard starts
        header = f.readline()
        bom = len(BOM) if header.startswith(BOM) else 0  # Excel's "CSV UTF-8" starts so (header_names drops it)
        columns = csv.columns_of(header.decode("utf-8", errors="replace"), path, fmt.name, fmt.label_column,
                                 fmt.ignore_columns, fmt.numeric_columns)
        parser: Any = CsvParser(fmt, batch_size, columns)
        pos = max(pos, len(header) if columns.header else bom)
        if path != STDIN and not shard.source:
            f.seek(pos)
        elif not columns.header:
            carry = header[bom:]
    else:
        parser = (CriteoParser if fmt.name == "criteo" else LibsvmParser)(fmt, batch_size)
        if pos == 0 and path != STDIN and not shard.source:  # some editors start a file with a UTF-8 byte-order mark
            pos = len(BOM) if f.read(len(BOM)) == BOM else 0
            f.seek(pos)
    if 0 < pos == shard.start:  # the line straddling start belongs to the previous shard
        f.seek(shard.start - 1)
        skipped = f.readline()
        pos = shard.start - 1 + len(skipped)
    return parser, pos, carry


def _parse_lines(f: Any, shard: Shard, stats: dict[str, Any], parser: Any, pos: int, carry: bytes) -> Iterator[Batch]:
    """Read ``f`` from ``pos`` (after ``carry``) into one reused buffer and feed ``parser``
    the whole lines of each read that start before the shard's end."""
    path, end = shard.path, (shard.end if shard.end >= 0 else None)
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


class _Unclosed:
    """Standard input as the reader uses a file (``with``, ``readinto``, ``readline``), left open."""

    def __init__(self, raw: Any):
        self.raw = raw

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def readinto(self, view: memoryview) -> int:
        n: int = self.raw.readinto(view)
        return n

    def readline(self) -> bytes:
        line: bytes = self.raw.readline()
        return line

    def seek(self, pos: int) -> None:
        raise DataError("standard input cannot be read from the middle: pass a file to split it into shards")


def _read_into(f: Any, view: memoryview, path: str, offset: int) -> int:
    """``f.readinto``, with a damaged compressed file named, not a bare zlib traceback."""
    with reading(path, offset):
        return f.readinto(view) or 0

def check_flag_file(path: str, flag: str, fix: str) -> None:
    """``path``, given by ``flag``, is a file that is there and not empty, else a
    ``ConfigError`` that names the flag, what is wrong and ``fix``."""
    problem, _ = _file_problem(path)
    if problem:
        raise ConfigError(f"{flag} {path}: {problem}; {fix}")


def check_inputs(paths: list[str]) -> list[str]:
    """``paths`` with globs expanded, each a file that is there and not empty, else a
    ``DataError`` that says so (a folder: pass the files in it)."""
    found = expand(paths)
    for path in found:
        if path != STDIN:
            _check_exists(path)
    return found


def read_all(paths: list[str], fmt: DataFormat, batch_size: int = 1 << 16,
             stats: dict[str, Any] | None = None) -> Batch:
    """Every example of ``paths`` (globs expanded) in one batch (for test sets); the bad
    lines skipped (``fmt.skip_bad``) are added to ``stats["bad_lines"]``."""
    return _concat(read_parts(paths, fmt, batch_size, stats))


def read_parts(paths: list[str], fmt: DataFormat, batch_size: int = 1 << 16,
               stats: dict[str, Any] | None = None) -> list[Batch]:
    """``read_all``'s examples in parts of about ``batch_size`` rows, never copied into one
    (``train --test`` scores a part at a time: a 10^5-row test set's peak was twice its size)."""
    return list(iter_parts(paths, fmt, batch_size, stats))


def iter_parts(paths: list[str], fmt: DataFormat, batch_size: int = 1 << 16,
               stats: dict[str, Any] | None = None) -> Iterator[Batch]:
    """``read_parts``, a part at a time as each is parsed (a consumer scores one while the
    next is read: ``Prefetch``)."""
    paths, found = check_inputs(paths), False
    for p in paths:
        seen: dict[str, Any] = {}
        for part in read_batches(Shard(p, 0, -1), fmt, batch_size, seen):
            found = True
            yield part
        if stats is not None:
            stats["bad_lines"] = stats.get("bad_lines", 0) + int(seen.get("bad_lines", 0))
    if not found:
        raise no_examples(paths, int((stats or {}).get("bad_lines", 0)))


def no_examples(paths: list[str], bad_lines: int = 0) -> DataError:
    """What a job says when ``paths`` gave it no example: every line blank, a header, a
    comment, or malformed and skipped (``bad_lines``)."""
    where = ", ".join(paths)
    if bad_lines:
        return DataError(f"no examples in {where}: its {bad_lines:,} lines with data are all malformed, skipped by "
                         "--skip-bad-lines; check --format (and --label) against the file")
    return DataError(f"no examples in {where}: every line is blank, a header or a comment; give files with data rows")

