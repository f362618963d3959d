"""Streaming sources: where ``paramserver train --stream SOURCE`` reads rows that keep arriving.

A source is cut on the driver and read on the workers.  The driver asks it for the
shards that arrived (``poll``) with the source's position after them, hands them to the
scheduler's ``StreamQueue``, and tells it what a checkpoint (or, without checkpoints,
the shards done) committed (``commit``).  A worker reads a shard with ``read_batches``,
as a file's: a shard cut by a plug-in names it (``Shard.source``) and the reader opens it
through ``open_shard``.  The position is the source's own JSON; a checkpoint records it
with the shards cut before it and not done, so a job resumed from it reads every row
exactly once.

Built in:
    a folder (any fsspec URL)   its files, in name order, each read once when complete:
                                its size and modification time unchanged for
                                ``SETTLE_S`` (names starting with '.' or '_', or ending in
                                .tmp, .part or ._COPYING_ are being written: skipped);
                                each file is cut into shards as ``--data`` files are,
                                each shard stamped with the file as taken and read only
                                if it is still that file (``taken.py``; else the job
                                fails, or ``--changed-files skip`` skips and counts)
    ``-``                       standard input, spooled into files of whole lines as it
                                arrives (not resumable)
    ``redis://HOST:PORT/STREAM``  Redis Streams (``redis_source.py``)
    ``module:Class=URL``        a user's source class, given URL: a plug-in of kind
                                ``source`` (the protocol, ``StreamSource``, and how a
                                shard is opened by its source are in ``sources.py``)
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from paramserver.data.batch import STDIN, DataError, FileStamp, Shard
from paramserver.data.files import fsspec_filesystem
from paramserver.data.row_count import HEADERS, count_lines, rows_until
from paramserver.data.sources import ChunkFile, StreamSource, locate_row, open_shard, source_class
from paramserver.data.taken import stamp_from_info, stamp_of
from paramserver.errors import ConfigError
from paramserver.plugins import register

#: what other modules took from here before the source plug-in moved to sources.py
__all__ = ["ChunkFile", "FolderSource", "StdinSource", "StreamSource", "locate_row", "open_shard", "open_source"]

logger = logging.getLogger(__name__)

SETTLE_S = 1.0  # a folder's file is complete once unchanged this long
SPOOL_S = 0.5  # standard input is cut into a shard at least this often while lines arrive
_WRITING = (".tmp", ".part", "._COPYING_")


def open_source(spec: str, shard_bytes: int, fmt_name: str) -> StreamSource:
    """The source ``--stream SPEC`` names (see the module)."""
    if not spec:
        raise ConfigError("--stream needs a source: a folder, redis://HOST:PORT/STREAM, - or module:Class=URL")
    if spec == STDIN:
        return StdinSource(shard_bytes, header=HEADERS.get(fmt_name))
    if spec.startswith(("redis://", "rediss://", "unix://")):
        from paramserver.data.redis_source import RedisSource

        return RedisSource(spec, shard_bytes, fmt_name)
    head, eq, url = spec.partition("=")
    if eq and ":" in head and "://" not in head:
        source = source_class(head)(url, shard_bytes)
        if not isinstance(source, StreamSource):
            raise ConfigError(f"--stream {spec}: {head} does not implement the source protocol "
                              "(paramserver.data.streams.StreamSource)")
        return source
    return FolderSource(spec, shard_bytes, fmt_name)


class StdinSource:
    """Standard input, as it arrives: a thread spools it into files of whole lines (at most
    ``shard_bytes``, or what came in ``SPOOL_S``), each a shard, in a temporary folder
    removed at the end (the workers are other processes: they read the files).  Not
    resumable: what was read cannot be read again."""

    url, resumable = STDIN, False

    def __init__(self, shard_bytes: int = 16 << 20, fd: int = 0, header: Callable[[bytes], bool] | None = None
                 ) -> None:
        import tempfile

        self.shard_bytes, self.fd = max(1, int(shard_bytes)), fd
        self.header = header  # the format's test of a first line that is a header (csv), or None
        self.folder = tempfile.mkdtemp(prefix="paramserver-stdin-")
        self.ready: list[tuple[str, int, bool]] = []  # chunk files written, not yet cut: (path, rows, header)
        self.lock = threading.Lock()
        self.ended = False
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None

    def start(self, position: Any | None) -> None:
        if position is not None:
            raise ConfigError("--stream -: standard input cannot be read again, so a job that read it cannot be "
                              "resumed; stream from a folder or redis:// to resume")
        self.thread = threading.Thread(target=self._spool, name="paramserver-stdin", daemon=True)
        self.thread.start()

    def _spool(self) -> None:
        buf, since, n = bytearray(), 0.0, 0
        try:
            while True:
                data = os.read(self.fd, 1 << 20)
                if data and not buf:
                    since = time.monotonic()
                buf += data
                cut = buf.rfind(b"\n") + 1 if data else len(buf)
                if cut and (not data or len(buf) >= self.shard_bytes or time.monotonic() - since >= SPOOL_S):
                    chunk = bytes(buf[:cut]) + (b"" if buf[cut - 1:cut] == b"\n" else b"\n")
                    del buf[:cut]
                    self._write(n, chunk)
                    n, since = n + 1, time.monotonic()
                if not data:
                    break
        except BaseException as exc:  # said by the next poll
            self.error = exc
        self.ended = True

    def _write(self, n: int, chunk: bytes) -> None:
        path = os.path.join(self.folder, f"{n:09d}.txt")
        with open(path + ".tmp", "wb") as f:
            f.write(chunk)
        os.replace(path + ".tmp", path)
        header = n == 0 and self.header is not None and self.header(chunk[:chunk.find(b"\n") + 1])
        rows = count_lines(chunk, None)[0] - (1 if header and chunk.strip(b"\r\n") else 0)
        with self.lock:
            self.ready.append((path, rows, header))

    def poll(self, max_rows: int | None) -> tuple[list[Shard], Any, int | None, bool]:
        if self.error is not None:
            raise DataError(f"standard input could not be read: {self.error}")
        ended = self.ended  # read first: the files written before it are all in ready
        with self.lock:
            chunks, self.ready = self.ready, []
        shards, counted = [], 0
        for path, rows, header in chunks:  # rows counted as spooled: --max-examples cuts the chunk that reaches it
            left = None if max_rows is None else max_rows - counted
            if left is not None and left <= 0:
                break  # standard input is read once: the rows past the limit are not trained
            if left is not None and rows > left:
                counted, stop = counted + left, rows_until(path, 0, left, header)[1]
                shards.append(Shard(path, 0, stop))
                break
            shards.append(Shard(path, 0, -1))
            counted += rows
        return shards, None, counted, ended and not self.ready

    def commit(self, position: Any, pending: list[Shard]) -> None:
        """The spooled files before the first pending one are trained: removed."""
        first = min((s.path for s in pending), default=None)
        with self.lock:
            waiting = {path for path, _, _ in self.ready}
        for name in sorted(os.listdir(self.folder)):
            path = os.path.join(self.folder, name)
            if name.endswith(".txt") and (first is None or path < first) and path not in waiting:
                os.remove(path)

    def close(self) -> None:
        import shutil

        shutil.rmtree(self.folder, ignore_errors=True)

    @classmethod
    def open_shard(cls, shard: Shard) -> Any:
        raise DataError("standard input's shards are files, read as --data files are")


class FolderSource:
    """A folder's files as they arrive (see the module): position ``{"taken": [names],
    "stamps": {name: FileStamp wire}, "cut_at": {name: byte}}`` (a position without stamps,
    an earlier version's: the files as they are when the job resumes; ``cut_at``: a file
    ``--max-examples`` cut after a row, its rows from that byte not yet taken).

    Each shard carries its file's stamp, checked by the worker that reads it
    (``data/taken.py``).  A file taken that changes later is said at the next look, once it
    has settled, with a WARNING (and ``changed``, for the report): a folder's file is read
    once, so its new bytes are never read (write new rows to a new file)."""

    resumable = True

    def __init__(self, url: str, shard_bytes: int, fmt_name: str = "criteo") -> None:
        self.url, self.shard_bytes = url.rstrip("/"), shard_bytes
        self.header = HEADERS.get(fmt_name)  # a file's first line may be a header, not a row
        self.cut_at: dict[str, int] = {}  # name -> where its rows taken end (--max-examples cut it there)
        self.fs, self.root = fsspec_filesystem(self.url)
        self.protocol = self.url.split("://", 1)[0] + "://" if "://" in self.url else ""
        if not self.fs.exists(self.root) or not self.fs.isdir(self.root):
            raise ConfigError(f"--stream {url}: no such folder (a folder whose files arrive, "
                              "redis://HOST:PORT/STREAM, or - for standard input)")
        self.taken: set[str] = set()
        self.stamps: dict[str, FileStamp] = {}  # name -> the file as taken (not known: taken before stamps)
        self.seen: dict[str, tuple[Any, Any, float]] = {}  # name -> (size, mtime, since when unchanged)
        self.changed: dict[str, dict[str, Any]] = {}  # name -> what changed after it was taken, bytes ignored
        self._said: dict[str, tuple[FileStamp, float]] = {}  # name -> its changed stamp, since when (said: -1)
        self._position: dict[str, Any] | None = None

    def start(self, position: Any | None) -> None:
        if position is not None:
            taken = position.get("taken") if isinstance(position, dict) else None
            if not isinstance(taken, list) or not all(isinstance(n, str) for n in taken):
                raise ConfigError(f"--resume: the checkpoint's position in {self.url} is not a folder's "
                                  f"({position!r}): pass the --stream of the checkpointed job")
            self.taken = set(taken)
            self.cut_at = {str(n): int(at) for n, at in (position.get("cut_at") or {}).items() if n in self.taken}
            stamps = position.get("stamps") or {}
            self.stamps = {n: FileStamp.from_wire(w) for n, w in stamps.items() if n in self.taken}
            for name in self.taken - set(self.stamps):  # taken before stamps: as they are now
                if (now := stamp_of(self.path_of(name))) is not None:
                    self.stamps[name] = now

    def path_of(self, name: str) -> str:
        return f"{self.protocol}{self.root}/{name}" if self.protocol else f"{self.root}/{name}"

    def _files(self) -> dict[str, dict[str, Any]]:
        """The folder's files by name (what fsspec's ``ls`` says of each)."""
        found = {}
        for info in self.fs.ls(self.root, detail=True):
            if info.get("type") == "file":
                found[info["name"].rstrip("/").rsplit("/", 1)[-1]] = info
        return found

    def _complete(self, files: dict[str, dict[str, Any]], now: float) -> list[str]:
        """The files not taken yet whose size and mtime have not changed for SETTLE_S, by name."""
        ready = []
        for name, info in files.items():
            if name in self.taken or name.startswith((".", "_")) or name.endswith(_WRITING):
                continue
            stamp = (info.get("size"), info.get("mtime") or info.get("LastModified") or info.get("created"))
            last = self.seen.get(name)
            if last is None or last[:2] != stamp:
                self.seen[name] = (*stamp, now)
            elif now - last[2] >= SETTLE_S and (stamp[0] or 0) > 0:
                ready.append(name)
        return sorted(ready)

    def _watch_taken(self, files: dict[str, dict[str, Any]], now: float) -> None:
        """Say (once it settled) each file taken that changed since: its new bytes are not read."""
        for name, info in sorted(files.items()):
            taken = self.stamps.get(name)
            if taken is None:
                continue
            current = stamp_from_info(info)
            if not taken.changes(current):
                self._said.pop(name, None)
                continue
            last = self._said.get(name)
            if last is None or last[0] != current:
                self._said[name] = (current, now)
            elif last[1] >= 0 and now - last[1] >= SETTLE_S:
                self._said[name] = (current, -1.0)
                self._say_changed(name, taken, current)

    def _say_changed(self, name: str, taken: FileStamp, now: FileStamp) -> None:
        what = taken.changes(now)
        grew = what.startswith("it grew")
        ignored = now.size - taken.size if grew else now.size
        self.changed[name] = {"what": what, "bytes_ignored": ignored}
        logger.warning("%s changed after the stream took it: %s (taken: %s; now: %s). A folder's file is read "
                       "once: %s are not trained. Write new rows to a new file (under a temporary name, "
                       "renamed when whole)", self.path_of(name), what, taken.describe(), now.describe(),
                       f"the {ignored:,} bytes appended" if grew else f"its {ignored:,} bytes now")

    def poll(self, max_rows: int | None) -> tuple[list[Shard], Any, int | None, bool]:
        """With ``max_rows`` (``--max-examples``: the rows still to train) the files' rows
        are counted as they are taken, and the file that reaches it is cut after its
        ``max_rows``-th row (the rest of it stays for a job resumed with a larger limit);
        without, they are not read here, and the rows are not known (None)."""
        now, files = time.monotonic(), self._files()
        self._watch_taken(files, now)
        shards: list[Shard] = []
        left = max_rows
        for name in sorted(self.cut_at):  # the rest of a file cut at an earlier limit
            if left is not None and left <= 0:
                break
            if (stamp := self.stamps.get(name)) is not None:
                left = self._take(name, stamp, self.cut_at.pop(name), left, shards)
                self._position = None
        for name in self._complete(files, now):
            if left is not None and left <= 0:
                break  # taken by a later job (or this one resumed with a larger limit)
            self.seen.pop(name, None)
            path = self.path_of(name)
            stamp = stamp_of(path) if not self.protocol else stamp_from_info(files[name])
            if stamp is None or stamp.size == 0:  # gone (or emptied) since the look: not taken
                continue
            self.taken.add(name)
            self.stamps[name] = stamp
            left = self._take(name, stamp, 0, left, shards)
        return shards, self.position(), None if max_rows is None else max_rows - (left or 0), False

    def _take(self, name: str, stamp: FileStamp, start: int, left: int | None, shards: list[Shard]) -> int | None:
        """``name``'s shards from byte ``start``, up to ``left`` rows (None: all, uncounted),
        into ``shards``; the rows still to take after it."""
        from paramserver.data.reader import cut_file

        path = self.path_of(name)
        rows, stop = 0, stamp.size
        if left is not None:
            header = self.header is not None and start == 0 and self.header(_first_line(path))
            rows, stop = rows_until(path, start, left, header)
        end = stamp.size if stop < 0 else stop
        if start == 0:
            shards += cut_file(path, end, self.shard_bytes, stamp)
        else:
            shards += [Shard(path, at, min(at + self.shard_bytes, end), stamp=stamp)
                       for at in range(start, end, self.shard_bytes)]
        if left is None:
            return None
        if 0 <= stop < stamp.size and rows >= left:
            self.cut_at[name] = stop
            self._position = None
        return left - rows

    def position(self) -> dict[str, Any]:
        """The names taken, their stamps, and where a file cut at ``--max-examples`` was
        cut (made again only once a file is taken: a folder of 10^5 files is polled five
        times a second)."""
        if self._position is None or len(self._position["taken"]) != len(self.taken):
            self._position = {"taken": sorted(self.taken),
                              "stamps": {n: self.stamps[n].to_wire() for n in sorted(self.stamps)}}
            if self.cut_at:
                self._position["cut_at"] = dict(sorted(self.cut_at.items()))
        return self._position

    def commit(self, position: Any, pending: list[Shard]) -> None:
        pass  # the files stay: what was read is in the position

    def close(self) -> None:
        pass

    @classmethod
    def open_shard(cls, shard: Shard) -> Any:
        raise DataError("a folder's shards are files, read as --data files are")


def _first_line(path: str) -> bytes:
    """The first line of the file at ``path`` (at most 1 MiB of it), decompressed."""
    from paramserver.data.files import open_input

    with open_input(path) as f:
        return f.readline(1 << 20)


register("source", "folder", FolderSource)
register("source", "stdin", StdinSource)
