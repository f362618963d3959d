"""Stream sources as plug-ins: what a source implements (``StreamSource``), its kind in
the plug-in table, and how a shard a source cut is opened and its rows named where it is
read (``open_shard``, ``locate_row``; ``Shard.source`` names the source).

This is what the reader, the parsers, the built-in sources and ``streams.py`` (the
driver's side: ``open_source``, a folder, standard input) share, so that none of them
imports another to reach it.  A source is named ``module:Class`` (``--stream
module:Class=URL``; ``docs/plugins.md``); the built-ins are registered by name.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

from paramserver.data.batch import Shard
from paramserver.plugins import Kind, declare, load_object, register

_METHODS = ("start", "poll", "commit", "close", "open_shard")


@runtime_checkable
class StreamSource(Protocol):
    """What a source plug-in implements (``module:Class=URL``: ``Class(URL, shard_bytes)``).

    Driver side: ``start`` once, then ``poll`` and ``commit`` from one thread, ``close``
    at the end.  Worker side: the class method ``open_shard``, in any process."""

    url: str
    resumable: bool  # its positions can be read again (standard input's cannot)

    def start(self, position: Any | None) -> None:
        """Begin after ``position`` (a checkpoint's), or None: where the source says a new
        reader starts (the beginning, or what the source last committed)."""

    def poll(self, max_rows: int | None) -> tuple[list[Shard], Any, int | None, bool]:
        """The shards arrived since the last poll (at most ``max_rows`` rows where the
        source counts them, None: no limit), the position after them, the rows in them
        (None: the source cannot count them before they are read), and whether the source
        has ended (standard input at its end)."""

    def commit(self, position: Any, pending: list[Shard]) -> None:
        """Everything before ``position`` but ``pending`` is applied and saved: the source
        may forget it (acknowledge it, move its group)."""

    def close(self) -> None:
        """Release the driver's connections."""

    @classmethod
    def open_shard(cls, shard: Shard) -> Any:
        """A shard's rows as a binary file (``readinto``, ``readline``), whole lines."""


SOURCE = declare(Kind(
    "source", "stream source", f"a class with the StreamSource methods ({', '.join(_METHODS)}; "
    "paramserver.data.sources), built as Class(URL, shard_bytes)",
    lambda obj: isinstance(obj, type) and all(callable(getattr(obj, m, None)) for m in _METHODS),
    "the driver and every worker", "mypkg.sources:Kafka"))
register("source", "redis", "paramserver.data.redis_source:RedisSource")  # imported when a shard of it is read


def source_class(name: str) -> Any:
    """The source class ``module:Class`` (or a built-in's name) stands for, imported."""
    return load_object(SOURCE, name)


def open_shard(shard: Shard) -> Any:
    """A stream shard's rows, opened by the source plug-in that cut it (``Shard.source``)."""
    return source_class(shard.source).open_shard(shard)


def locate_row(shard: Shard, offset: int) -> tuple[str, str] | None:
    """Where the row at byte ``offset`` of a stream shard is, in the source's words (Redis:
    ``URL entry ID, row R``), and the fix that drops it; None where the source cannot say
    (an optional ``locate`` class method of a plug-in)."""
    locate = getattr(source_class(shard.source), "locate", None)
    return locate(shard, offset) if locate is not None else None


class ChunkFile:
    """Chunks of bytes (whole lines) read as a binary file: what a source's ``open_shard``
    may return for ``read_batches`` to read."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks, self.head, self.at = chunks, b"", 0

    def __enter__(self) -> ChunkFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        close = getattr(self.chunks, "close", None)
        if close is not None:
            close()

    def _fill(self) -> bool:
        while self.at >= len(self.head):
            nxt = next(self.chunks, None)
            if nxt is None:
                return False
            self.head, self.at = nxt, 0
        return True

    def readinto(self, view: memoryview) -> int:
        if not self._fill():
            return 0
        n = min(len(view), len(self.head) - self.at)
        view[:n] = self.head[self.at:self.at + n]
        self.at += n
        return n

    def readline(self) -> bytes:
        parts = []
        while self._fill():
            end = self.head.find(b"\n", self.at)
            stop = len(self.head) if end < 0 else end + 1
            parts.append(self.head[self.at:stop])
            self.at = stop
            if end >= 0:
                break
        return b"".join(parts)
