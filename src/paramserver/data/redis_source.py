"""Redis Streams as a training source: ``train --stream redis://HOST:PORT/STREAM``.

Each entry holds rows of the job's ``--format`` (criteo or libsvm: a stream has no CSV
header) in its field ``line`` (or its first field); a value may hold several rows, one
a line.  The driver cuts the entries that arrived into shards by id, ``(FIRST LAST]``,
from ``XINFO STREAM`` alone (the last id and the count added): a backlog is split into
pieces of about ``shard_bytes / 256`` entries by interpolating between the ids, so
cutting reads no entry.  Workers read their shard's entries with ``XRANGE`` in pages.

The job's consumer group (``?group=NAME``, default ``paramserver``) holds what the job
committed: after each checkpoint (or, without checkpoints, as shards are done) its
last-delivered id is moved to the end of what is applied and saved, so ``XINFO GROUPS``
shows the job's lag, and a new job without ``--resume`` starts there.  The entries in
flight are the scheduler's shards, not the group's pending list: a pending entry costs
Redis an insert and an acknowledgement each (half this machine's throughput), and the
exactly-once position must be the checkpoint's anyway (as EasyRec keeps Kafka's offsets
in its checkpoints).  A worker that dies has its shard read again by another.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

from paramserver.data.batch import DataError, Shard
from paramserver.errors import ConfigError

logger = logging.getLogger(__name__)

SOURCE = "paramserver.data.redis_source:RedisSource"
PAGE = 2000  # entries a worker reads a call
ENTRY_BYTES = 256  # what a shard's size in entries assumes of an entry
RETRY_S = 60.0  # how long Redis may be unreachable before the job fails
MAX_SEQ = (1 << 64) - 1

_clients: dict[str, Any] = {}  # a worker's connection per Redis, reused across shards

# the id of the COUNT-th entry after an id (only to stop exactly at --max-examples)
_NTH = """local r = redis.call('XRANGE', KEYS[1], ARGV[1], '+', 'COUNT', ARGV[2])
if #r == 0 then return false end
return r[#r][1]"""

# the entries after an id, and the stream's entries-added, at one moment (once, where the
# group does not know how many entries it has read)
_AFTER = """local n = #redis.call('XRANGE', KEYS[1], ARGV[1], '+')
local info = redis.call('XINFO', 'STREAM', KEYS[1])
for i = 1, #info, 2 do if info[i] == 'entries-added' then return {n, info[i + 1]} end end
return {n, -1}"""


def parse_url(url: str) -> tuple[str, str, str]:
    """``(the Redis server's URL, the stream, the group)`` of ``redis://HOST:PORT[/DB]/STREAM[?group=G]``."""
    parts = urlsplit(url)
    path = [p for p in parts.path.split("/") if p]
    if not path or not parts.hostname and parts.scheme != "unix":
        raise ConfigError(f"--stream {url}: a Redis stream is redis://HOST:PORT/STREAM (or redis://HOST:PORT/DB/STREAM,"
                          " ?group=NAME for the consumer group, default paramserver)")
    stream, db = path[-1], "/".join(path[:-1])
    group = parse_qs(parts.query).get("group", ["paramserver"])[0]
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}" if db else "", "", "")), stream, group


def _connect(server: str) -> Any:
    try:
        import redis
    except ImportError:
        raise ConfigError("--stream redis://...: reading Redis Streams needs the redis package: "
                          "pip install 'paramserver[redis]'") from None
    client = _clients.get(server)
    if client is None:
        client = _clients[server] = redis.Redis.from_url(server, socket_timeout=30, socket_connect_timeout=5)
    return client


def _id(text: Any) -> tuple[int, int]:
    ms, _, seq = (text.decode() if isinstance(text, bytes) else str(text)).partition("-")
    return int(ms), int(seq or 0)


def _text(ident: tuple[int, int]) -> str:
    return f"{ident[0]}-{ident[1]}"


def split_ids(first: tuple[int, int], last: tuple[int, int], pieces: int) -> list[tuple[int, int]]:
    """``pieces`` ends of ranges that cut ``(first, last]``, by interpolating the ids'
    time (or their sequence, within one millisecond); the last end is ``last``."""
    if pieces <= 1 or first >= last:
        return [last]
    if first[0] == last[0]:
        ends = [(first[0], first[1] + (last[1] - first[1]) * i // pieces) for i in range(1, pieces)]
    else:
        ends = [(first[0] + (last[0] - first[0]) * i // pieces, MAX_SEQ) for i in range(1, pieces)]
    ends = [e for e in ends if first < e < last]
    return sorted(set(ends)) + [last]


class RedisSource:
    """See the module.  Position: ``{"id": the last entry cut, "added": the stream's
    entries-added then}``."""

    resumable = True

    def __init__(self, url: str, shard_bytes: int, fmt_name: str = "criteo") -> None:
        if fmt_name in ("csv", "avazu"):
            raise ConfigError(f"--stream {url} with --format {fmt_name}: a stream's rows have no CSV header; send "
                              "criteo or libsvm rows, or stream a folder of CSV files")
        self.url = url
        self.server, self.stream, self.group = parse_url(url)
        self.per_shard = max(1, int(shard_bytes) // ENTRY_BYTES)
        self.redis = _connect(self.server)
        from paramserver.data.resp import warm

        warm()  # the workers are forked from this process: they inherit the page kernel
        self.cursor: tuple[int, int] = (0, 0)
        self.added: int | None = 0
        self.committed: tuple[int, int] | None = None

    def _call(self, what: str, fn: Any, *args: Any, **kw: Any) -> Any:
        return _retrying(self.url, what, fn, *args, **kw)

    def start(self, position: Any | None) -> None:
        import redis

        try:
            self._call("XGROUP CREATE", self.redis.xgroup_create, self.stream, self.group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise DataError(f"{self.url}: cannot create the consumer group {self.group!r}: {exc}") from None
        if position is None:  # where the group's last job committed (the stream's start for a new group)
            group = next(g for g in self._call("XINFO GROUPS", self.redis.xinfo_groups, self.stream)
                         if (g["name"].decode() if isinstance(g["name"], bytes) else g["name"]) == self.group)
            self.cursor, self.added = _id(group["last-delivered-id"]), group.get("entries-read")
            if self.added is None:  # Redis does not know (a group made on an empty stream, or moved by id)
                self.added = 0 if self.cursor == (0, 0) else self._added_at_cursor()
            return
        if not isinstance(position, dict) or "id" not in position:
            raise ConfigError(f"--resume: the checkpoint's position {position!r} is not a Redis stream's: pass the "
                              "--stream of the checkpointed job")
        self.cursor, self.added = _id(position["id"]), position.get("added")

    def _added_at_cursor(self) -> int | None:
        """The stream's entries-added when the entry at the cursor was added: counted (once)."""
        after, added = self._call("XRANGE", self.redis.eval, _AFTER, 1, self.stream, f"({_text(self.cursor)}")
        return int(added) - int(after) if int(added) >= 0 else None

    def _info(self) -> tuple[tuple[int, int], int]:
        import redis

        try:
            info = self._call("XINFO STREAM", self.redis.xinfo_stream, self.stream)
        except redis.ResponseError as exc:
            raise DataError(f"{self.url}: the stream is gone ({exc}): deleted, or Redis restarted without "
                            f"persistence; training stopped after entry {_text(self.cursor)}, and what the last "
                            "checkpoint holds is kept") from None
        last, added = _id(info["last-generated-id"]), int(info.get("entries-added") or info["length"])
        if last < self.cursor:
            raise DataError(f"{self.url}: the stream's last id {_text(last)} is before the job's position "
                            f"{_text(self.cursor)}: the stream was recreated (Redis restarted without persistence?); "
                            "start a new job on it, or resume from a checkpoint of this stream")
        return last, added

    def poll(self, max_rows: int | None) -> tuple[list[Shard], Any, int | None, bool]:
        last, added = self._info()
        if last == self.cursor or max_rows == 0:
            return [], self.position(), 0, False
        count = added - self.added if self.added is not None else added
        if max_rows is not None and count > max_rows:  # stop exactly: the id of the max_rows-th entry
            nth = self._call("XRANGE", self.redis.eval, _NTH, 1, self.stream, f"({_text(self.cursor)}", max_rows)
            last, added, count = _id(nth), (self.added or 0) + max_rows, max_rows
        ends = split_ids(self.cursor, last, math.ceil(max(count, 1) / self.per_shard))
        shards, start = [], self.cursor
        for end in ends:
            shards.append(Shard(self.url, 0, -1, f"({_text(start)} {_text(end)}", SOURCE))
            start = end
        self.cursor, self.added = last, added if self.added is not None else None
        return shards, self.position(), count, False

    def position(self) -> dict[str, Any]:
        return {"id": _text(self.cursor), "added": self.added}

    def commit(self, position: Any, pending: list[Shard]) -> None:
        """Move the group to the end of what is applied: the first pending shard's start,
        else the position."""
        if pending:
            upto, read = _id(pending[0].span.split()[0].lstrip("(")), None
        else:
            upto, read = _id(position["id"]), position.get("added")
        if self.committed is not None and upto <= self.committed:
            return
        self._call("XGROUP SETID", self.redis.xgroup_setid, self.stream, self.group, _text(upto),
                   **({"entries_read": read} if read is not None else {}))
        self.committed = upto

    def close(self) -> None:
        self.redis.close()
        _clients.pop(self.server, None)

    @classmethod
    def open_shard(cls, shard: Shard) -> Any:
        from paramserver.data.streams import ChunkFile

        return ChunkFile(_entries(shard))


def _retrying(url: str, what: str, fn: Any, *args: Any, **kw: Any) -> Any:
    """A Redis call, retried while Redis is unreachable (a restart), up to RETRY_S."""
    import redis

    deadline = time.monotonic() + RETRY_S
    while True:
        try:
            return fn(*args, **kw)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            if time.monotonic() > deadline:
                raise DataError(f"{url}: Redis did not answer {what} for {RETRY_S:g} s ({exc}); the job stopped, "
                                "and what its last checkpoint holds is kept: --resume goes on from there") from None
            logger.warning("%s: Redis unreachable (%s), trying again", url, exc)
            time.sleep(0.5)


def _entries(shard: Shard) -> Iterator[bytes]:
    """The rows of a shard's entries, a page of ``XRANGE`` at a time (read off the socket
    by ``resp.py``'s kernel), each value a line."""
    from paramserver.data.resp import xrange_page

    server, stream, _ = parse_url(shard.path)
    client = _connect(server)
    start, end = shard.span.split()
    while True:
        rows, last, n = _retrying(shard.path, "XRANGE", xrange_page, client, stream, start, end, PAGE)
        if n:
            yield rows
        if n < PAGE:
            return
        start = b"(" + last
