"""Rows into a Redis stream, as ``train --stream redis://HOST:PORT/STREAM`` reads them
(``paramserver feed``).

A file (local or fsspec, ``.gz`` and the like decompressed, as ``--data``) or standard
input is read a chunk at a time; its rows (lines, a blank one not a row) go
``rows_per_entry`` to an entry, joined by newlines, in the entry's one field (``line``,
or the one the URL names, ``?field=``), as ``redis_source.py`` reads them back.  The
entries go ``pipeline`` to a round trip (``XADD`` in a redis-py pipeline, not a
transaction), each with ``MAXLEN ~ N`` if asked.  Measured here (200,000 libsvm rows of 4
features, a local redis-server): 100 rows an entry and 100 entries a round trip fed 3.5
million rows/s; an entry a row, pipelined, 135,000; an entry a row, a round trip each,
17,500.  Cutting a chunk into entries is numpy over its newlines, no Python a row; an
entry holds fewer rows at the end of a chunk (up to 4 MiB: what one read gave, so rows
trickling in from a pipe go on as they come) and of the input.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from paramserver.data.batch import STDIN, DataError
from paramserver.data.row_count import lines
from paramserver.errors import ConfigError

CHUNK_BYTES = 4 << 20  # read a time


@dataclass
class Fed:
    """What a feed wrote so far: rows, entries, bytes of rows, and since when (monotonic)."""

    rows: int = 0
    entries: int = 0
    bytes: int = 0
    started: float = 0.0

    def seconds(self, now: float | None = None) -> float:
        return (time.monotonic() if now is None else now) - self.started

    def line(self) -> str:
        s = self.seconds()
        return (f"{self.rows:,} rows in {self.entries:,} entries, {s:.1f} s "
                f"({self.rows / s if s > 0 else 0.0:,.0f} rows/s)")


def check_feed(rows_per_entry: Any, pipeline: Any, maxlen: Any) -> None:
    """The numbers of a feed, checked before anything is read or connected."""
    for flag, value in (("--rows-per-entry", rows_per_entry), ("--pipeline", pipeline)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{flag} must be a whole number >= 1, got {value!r}")
    if maxlen is not None and (isinstance(maxlen, bool) or not isinstance(maxlen, int) or maxlen < 1):
        raise ConfigError(f"--maxlen must be a whole number >= 1 (entries the stream keeps), got {maxlen!r}")


def entries_of(chunk: bytes, rows_per_entry: int) -> tuple[list[bytes], list[int]]:
    """A chunk of whole lines cut into entries' values of ``rows_per_entry`` rows (the last
    may hold fewer), and the rows of each: the ends found by numpy, a slice an entry."""
    if not chunk:
        return [], []
    starts, ends, is_row = lines(np.frombuffer(chunk, np.uint8))  # a row: a line that is not blank
    rows = np.flatnonzero(is_row)
    if rows.size == 0:
        return [], []
    firsts = rows[::rows_per_entry]  # the first row of each entry
    lasts = rows[np.minimum(np.arange(firsts.size) * rows_per_entry + rows_per_entry, rows.size) - 1]
    values = [chunk[starts[a]:ends[b]] for a, b in zip(firsts.tolist(), lasts.tolist())]
    counts = np.diff(np.append(np.arange(0, rows.size, rows_per_entry), rows.size)).tolist()
    return values, counts


def chunks(f: IO[bytes]) -> Iterator[bytes]:
    """``f`` read as chunks of whole lines (the last line given its newline), each as soon as
    it is there (``read1``: a pipe's rows go on when they arrive, not once 4 MiB have)."""
    carry = b""
    read = getattr(f, "read1", f.read)
    while True:
        data = read(CHUNK_BYTES)
        if not data:
            break
        data = carry + data
        cut = data.rfind(b"\n") + 1
        carry = data[cut:]
        if cut:
            yield data[:cut]
    if carry:
        yield carry + b"\n"


def feed_files(paths: list[str], url: str, *, field: str | None = None, rows_per_entry: int = 100,
               pipeline: int = 100, maxlen: int | None = None,
               on_progress: Callable[[Fed], None] | None = None) -> Fed:
    """Write the rows of ``paths`` (``-``: standard input) into the stream ``url`` names
    (``redis://HOST:PORT[/DB]/STREAM[?field=F]``), in order (see the module).

    Raises:
        ConfigError: the URL is not a Redis stream's, or Redis cannot be reached.
        DataError: a file cannot be read or decompressed, or Redis stopped the feed (what was
            written said)."""
    from paramserver.data.files import open_input, reading
    from paramserver.data.redis_source import connect_to, field_of, parse_url

    server, stream, _ = parse_url(url)
    client = connect_to(server, url)
    done = Fed(started=time.monotonic())
    try:
        for path in paths:
            try:
                f = sys.stdin.buffer if path == STDIN else open_input(path)
            except FileNotFoundError:
                raise DataError(f"no such file: {path}") from None
            with contextlib.ExitStack() as stack:
                if path != STDIN:
                    stack.enter_context(f)
                stack.enter_context(reading(path))  # a damaged .gz named, not an EOFError traceback
                feed(f, client, stream, field=field or field_of(url), rows_per_entry=rows_per_entry,
                     pipeline=pipeline, maxlen=maxlen, on_progress=on_progress, done=done, url=url)
    finally:
        client.close()
    return done


def feed(f: IO[bytes], client: Any, stream: str, *, field: str = "line", rows_per_entry: int = 100,
         pipeline: int = 100, maxlen: int | None = None, on_progress: Callable[[Fed], None] | None = None,
         progress_s: float = 1.0, url: str = "", done: Fed | None = None) -> Fed:
    """Write ``f``'s rows into ``stream`` (see the module), counted in ``done`` (a new
    ``Fed``: none); ``on_progress`` is called every ``progress_s`` and at the end.

    Raises:
        DataError: Redis refused an entry or stopped answering (what was written said)."""
    import redis

    done = Fed(started=time.monotonic()) if done is None else done
    said = time.monotonic()
    pipe = client.pipeline(transaction=False)
    queued: list[int] = []  # the rows of each entry in the pipeline
    extra = {"maxlen": maxlen, "approximate": True} if maxlen else {}
    try:
        for chunk in chunks(f):
            values, counts = entries_of(chunk, rows_per_entry)
            for value, count in zip(values, counts):
                pipe.xadd(stream, {field: value}, **extra)
                queued.append(count)
                if len(queued) >= pipeline:
                    _flush(pipe, queued, done)
            _flush(pipe, queued, done)  # what was read is in Redis before the next read waits
            done.bytes += len(chunk)
            if on_progress is not None and time.monotonic() - said >= progress_s:
                on_progress(done)
                said = time.monotonic()
        _flush(pipe, queued, done)
    except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError) as exc:
        raise DataError(f"{url or stream}: Redis stopped the feed ({exc}) after {done.rows:,} rows in "
                        f"{done.entries:,} entries were added (up to {sum(queued):,} more may have been); "
                        "feed the rows after those again") from None
    if on_progress is not None:
        on_progress(done)
    return done


def _flush(pipe: Any, queued: list[int], done: Fed) -> None:
    if queued:
        pipe.execute()
        done.rows += sum(queued)
        done.entries += len(queued)
        queued.clear()
