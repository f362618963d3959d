"""Redis Streams as a training source: ``train --stream redis://HOST:PORT/STREAM``.

Each entry holds rows of the job's ``--format`` (criteo or libsvm: a stream has no CSV
header) in its field ``line`` (``?field=NAME``: that one; else its first field); a value
may hold several rows, one a line (``paramserver feed`` writes them so).  The driver
cuts the new entries into shards of about ``shard_bytes / 256`` rows by interpolating
their ids (the rows an entry guessed from a few), reading none of them.  With
``--max-examples N`` it counts their rows first, a page of ``XRANGE`` at a time read by
``resp.py``'s kernel (Redis's work the same as a worker's read: a Lua script that
counted each entry cost Redis six times as much, and the stream job a fifth of its
examples a second), and cuts at the N-th row exactly, inside an entry if it falls there
(``redis_rows.COUNT_ROWS`` finds which, in that page alone).  Workers read their shard's
entries with ``XRANGE`` in pages (``resp.py``).

The job's consumer group (``?group=NAME``, default ``paramserver``) holds what the job
committed: after each checkpoint (or, without checkpoints, as shards are done) its
last-delivered id is moved to the end of what is applied and saved, so ``XINFO GROUPS``
shows the job's lag, and a new job without ``--resume`` starts there.  An entry applied
in part (a job stopped at ``--max-examples`` inside it) leaves the group just before it,
and the key ``paramserver:STREAM:GROUP:row`` says ``ID ROW``: its rows before ROW were
applied (set with the group's id in one transaction).  The entries in flight are the
scheduler's shards, not the group's pending list: a pending entry costs Redis an insert
and an acknowledgement each (half this machine's throughput), and the exactly-once
position must be the checkpoint's anyway (as EasyRec keeps Kafka's offsets in its
checkpoints).  A worker that dies has its shard read again by another.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import numpy as np

from paramserver.data.batch import DataError, Shard
from paramserver.data.redis_outage import retrying
from paramserver.data.redis_rows import (
    COUNT_ROWS,
    FIELD,
    Id,
    Span,
    before,
    entry_rows,
    id_text,
    joined,
    parse_id,
    split_ids,
)
from paramserver.data.resp import xrange_page
from paramserver.data.row_count import count_lines
from paramserver.data.sources import ChunkFile
from paramserver.errors import ConfigError

logger = logging.getLogger(__name__)

SOURCE = "paramserver.data.redis_source:RedisSource"
PAGE = 2000  # entries a worker reads (or the driver counts) a call
ROW_BYTES = 256  # what a shard's size in rows assumes of a row
SAMPLE = 64  # entries read to guess an entry's rows, where they are not counted
POLL_ENTRIES = 200_000  # at most this many entries are counted (and cut) a poll: a backlog takes a few

SCHEMES = ("redis", "rediss", "unix")  # what redis-py's from_url takes
_clients: dict[str, Any] = {}  # a worker's connection per Redis, reused across shards

# the entries after an id, and the stream's entries-added, at one moment (once, where the
# group does not know how many entries it has read)
_AFTER = """local n = #redis.call('XRANGE', KEYS[1], ARGV[1], '+')
local info = redis.call('XINFO', 'STREAM', KEYS[1])
for i = 1, #info, 2 do if info[i] == 'entries-added' then return {n, info[i + 1]} end end
return {n, -1}"""


def parse_url(url: str) -> tuple[str, str, str]:
    """``(the Redis server's URL, the stream, the group)`` of
    ``redis://HOST:PORT[/DB]/STREAM[?group=G][&field=F]``."""
    parts = urlsplit(url)
    path = [p for p in parts.path.split("/") if p]
    if parts.scheme not in SCHEMES or not path or not parts.hostname and parts.scheme != "unix":
        raise ConfigError(f"--stream {url}: a Redis stream is redis://HOST:PORT/STREAM (or redis://HOST:PORT/DB/STREAM,"
                          " ?group=NAME for the consumer group, default paramserver; &field=NAME for the entries' "
                          "field, default line; rediss:// for TLS)")
    _check_port(parts, url)
    stream, db = path[-1], "/".join(path[:-1])
    group = parse_qs(parts.query).get("group", ["paramserver"])[0]
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}" if db else "", "", "")), stream, group


def _check_port(parts: Any, url: str) -> None:
    """A port out of 0-65535 (or not a number) named, not urllib's ValueError traceback."""
    try:
        _ = parts.port  # urllib checks the port when it is asked for
    except ValueError:
        raise ConfigError(f"--stream {url}: the port must be a number in 1-65535 (redis-server's default is 6379); "
                          "fix the URL's HOST:PORT") from None


def field_of(url: str) -> str:
    """The field an entry's rows are in: ``?field=NAME`` (default ``line``; else the entry's first field)."""
    return parse_qs(urlsplit(url).query).get("field", [FIELD])[0]


def connect_to(server: str, url: str) -> Any:
    """A client of ``server`` of the caller's own (it closes it), checked to answer
    (``url``: the stream, as errors name it)."""
    import redis

    client = _new_client(server)
    try:
        client.ping()
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        client.close()
        raise ConfigError(f"{url}: cannot reach Redis ({exc}); is redis-server running there?") from None
    except redis.ResponseError as exc:  # the DB's number past the server's databases, a password refused
        client.close()
        raise ConfigError(f"{url}: Redis refused the connection ({exc}); check the URL's /DB (0 up to the server's "
                          "databases setting, 16 by default) and its password") from None
    return client


def _connect(server: str) -> Any:
    client = _clients.get(server)
    if client is None:
        client = _clients[server] = _new_client(server)
    return client


def _new_client(server: str) -> Any:
    try:
        import redis
    except ImportError:
        raise ConfigError("redis://...: Redis Streams need the redis package: pip install 'paramserver[redis]'") \
            from None
    return redis.Redis.from_url(server, socket_timeout=30, socket_connect_timeout=5)


class RedisSource:
    """See the module.  Position: ``{"id": the last entry cut, "added": the stream's
    entries-added then, "row": T}`` (``row``, when the entry was cut at a row: its rows
    before T were cut)."""

    resumable = True

    def __init__(self, url: str, shard_bytes: int, fmt_name: str = "criteo") -> None:
        if fmt_name in ("csv", "avazu"):
            raise ConfigError(f"--stream {url} with --format {fmt_name}: a stream's rows have no CSV header; send "
                              "criteo or libsvm rows, or stream a folder of CSV files")
        self.url = url
        self.server, self.stream, self.group = parse_url(url)
        self.field = field_of(url)
        self.per_shard = max(1, int(shard_bytes) // ROW_BYTES)
        self.redis = _connect(self.server)
        from paramserver.data.resp import warm

        warm()  # the workers are forked from this process: they inherit the page kernel
        self.cursor: Id = (0, 0)
        self.part = 0  # the rows of the cursor's entry cut (0: all of them)
        self.added: int | None = 0
        self.committed: tuple[Id, int] | None = None
        self.row_key = f"paramserver:{self.stream}:{self.group}:row"

    def _call(self, what: str, fn: Any, *args: Any, **kw: Any) -> Any:
        return retrying(self.url, what, fn, *args, **kw)

    def start(self, position: Any | None) -> None:
        import redis

        try:
            self._call("XGROUP CREATE", self.redis.xgroup_create, self.stream, self.group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise DataError(f"{self.url}: cannot create the consumer group {self.group!r}: {exc}") from None
        if position is None:  # where the group's last job committed (the stream's start for a new group)
            self._start_at_group()
            return
        if not isinstance(position, dict) or "id" not in position:
            raise ConfigError(f"--resume: the checkpoint's position {position!r} is not a Redis stream's: pass the "
                              "--stream of the checkpointed job")
        self.cursor, self.added = parse_id(position["id"]), position.get("added")
        self.part = int(position.get("row") or 0)

    def _start_at_group(self) -> None:
        group = next(g for g in self._call("XINFO GROUPS", self.redis.xinfo_groups, self.stream)
                     if (g["name"].decode() if isinstance(g["name"], bytes) else g["name"]) == self.group)
        self.cursor, self.added = parse_id(group["last-delivered-id"]), group.get("entries-read")
        mark = self._call("GET", self.redis.get, self.row_key)
        ident, _, row = (mark.decode() if mark else "").partition(" ")
        if ident and before(parse_id(ident)) == self.cursor:  # the entry after the group's, applied in part
            self.cursor, self.part = parse_id(ident), int(row)
            self.added = None if self.added is None else int(self.added) + 1
        if self.added is None:  # Redis does not know (a group made on an empty stream, or moved by id)
            self.added = 0 if self.cursor == (0, 0) else self._added_at_cursor()

    def _added_at_cursor(self) -> int | None:
        """The stream's entries-added when the entry at the cursor was added: counted (once)."""
        after, added = self._call("XRANGE", self.redis.eval, _AFTER, 1, self.stream, f"({id_text(self.cursor)}")
        return int(added) - int(after) if int(added) >= 0 else None

    def _info(self) -> tuple[tuple[int, int], int]:
        import redis

        try:
            info = self._call("XINFO STREAM", self.redis.xinfo_stream, self.stream)
        except redis.ResponseError as exc:
            raise DataError(f"{self.url}: the stream is gone ({exc}): deleted, or Redis restarted without "
                            f"persistence; training stopped after entry {id_text(self.cursor)}, and what the last "
                            "checkpoint holds is kept") from None
        last, added = parse_id(info["last-generated-id"]), int(info.get("entries-added") or info["length"])
        if last < self.cursor:
            raise DataError(f"{self.url}: the stream's last id {id_text(last)} is before the job's position "
                            f"{id_text(self.cursor)}: the stream was recreated (Redis restarted without persistence?); "
                            "start a new job on it, or resume from a checkpoint of this stream")
        return last, added

    def poll(self, max_rows: int | None) -> tuple[list[Shard], Any, int | None, bool]:
        """The entries after the cursor, cut into shards.  With ``max_rows`` (``--max-examples``:
        the rows still to train) their rows are counted first, a page of ``XRANGE`` at a time
        read by ``resp.py``'s kernel (the entry holding the ``max_rows``-th row found by
        ``COUNT_ROWS`` in its page alone, and cut there); without, nothing is read here: the
        shards are cut by interpolating the entries' ids, and the rows are not known (None)."""
        last, added = self._info()
        if max_rows == 0 or (last == self.cursor and not self.part):
            return [], self.position(), 0, False
        if max_rows is None:
            return self._cut_by_ids(last, added), self.position(), None, False
        pages, take, whole, new = self._count(last, max_rows)
        end = last if whole else pages[-1][0] if pages else self.cursor
        shards = self._cut(pages, end, take)
        self.cursor, self.part = (pages[-1][0], take) if take else (end, 0)
        if self.added is not None:
            self.added = added if whole else self.added + new
        return shards, self.position(), sum(r for _, r in pages), False

    def _cut_by_ids(self, last: Id, added: int) -> list[Shard]:
        """The entries after the cursor through ``last``, uncounted, in shards of about
        ``per_shard`` rows: the entries' ids interpolated, the rows an entry guessed from a
        few at the cursor."""
        count = added - self.added if self.added is not None else added
        sample, _, n = self._call("XRANGE", xrange_page, self.redis, self.stream, "(" + id_text(self.cursor),
                                  id_text(last), SAMPLE, self.field)
        per_entry = max(1.0, count_lines(sample, None)[0] / n) if n else 1.0
        ends = split_ids(self.cursor, last, math.ceil(max(count, 1) * per_entry / self.per_shard))
        shards, start, skip = [], self.cursor, self.part
        for end in ends:
            shards.append(Shard(self.url, 0, -1, Span(start, end, skip).text(), SOURCE))
            start, skip = end, 0
        self.cursor, self.part = last, 0
        self.added = added if self.added is not None else None
        return shards

    def _count(self, last: Id, max_rows: int) -> tuple[list[tuple[Id, int]], int, bool, int]:
        """Pages of the entries after the cursor (the cursor's own first, if cut in part),
        each ``(its last id, its rows)``, until ``max_rows`` rows, ``POLL_ENTRIES`` entries or
        ``last``; the rows of the last page's last entry to take (0: all), whether they reach
        ``last``, and the entries new to the group."""
        start = id_text(self.cursor) if self.part else "(" + id_text(self.cursor)
        pages: list[tuple[Id, int]] = []
        total = new = 0
        skip = self.part  # the first entry's rows cut before
        while True:
            data, last_id, n = self._call("XRANGE", xrange_page, self.redis, self.stream, start, id_text(last), PAGE,
                                          self.field)
            if not n:
                return pages, 0, True, new
            rows = count_lines(data, None)[0] - skip
            if total + rows >= max_rows:  # the limit falls in this page: which entry, which row
                end, rows, take, entries = self._nth(start, last_id, n, max_rows - total, skip)
                return [*pages, (end, rows)], take, False, new + entries
            pages.append((parse_id(last_id), rows))
            total, new, skip = total + rows, new + n - (1 if skip else 0), 0
            if n < PAGE:
                return pages, 0, True, new
            if new >= POLL_ENTRIES:
                return pages, 0, False, new
            start = "(" + last_id.decode()

    def _nth(self, start: str, last_id: bytes, n: int, need: int, skip: int) -> tuple[Id, int, int, int]:
        """In the page from ``start`` through ``last_id`` (``n`` entries, the first's first
        ``skip`` rows cut before): the entry holding its ``need``-th row, the rows up to it,
        the rows of that entry to take (0: all of it) and the entries new to the group."""
        got = self._call("XRANGE", self.redis.eval, COUNT_ROWS, 1, self.stream, start, last_id.decode(), n, self.field)
        ids, counts = got[::2], np.array(got[1::2], np.int64)
        if skip and counts.size:
            counts[0] = max(0, counts[0] - skip)
        k = min(int(np.searchsorted(np.cumsum(counts), need)), counts.size - 1)
        before_k = int(counts[:k].sum())
        rows = min(need - before_k, int(counts[k]))
        take = rows + (skip if k == 0 else 0) if rows < counts[k] else 0
        return parse_id(ids[k]), before_k + rows, take, k + 1 - (1 if skip else 0)

    def _cut(self, pages: list[tuple[Id, int]], end: Id, take: int) -> list[Shard]:
        """Shards of about ``per_shard`` rows, whole pages each, from the cursor through
        ``end`` (its rows before ``take``, when cut at a row)."""
        if not pages:  # none left between the cursor and the end (deleted): nothing to read
            return []
        shards, start, skip, held = [], self.cursor, self.part, 0
        for i, (stop, rows) in enumerate(pages):
            held += rows
            final = i == len(pages) - 1
            if final or held >= self.per_shard:
                stop = end if final else stop
                shards.append(Shard(self.url, 0, -1, Span(start, stop, skip, take if final else 0).text(), SOURCE))
                start, skip, held = stop, 0, 0
        return shards

    def position(self) -> dict[str, Any]:
        return {"id": id_text(self.cursor), "added": self.added, **({"row": self.part} if self.part else {})}

    def commit(self, position: Any, pending: list[Shard]) -> None:
        """Move the group to the end of what is applied: the first pending shard's start,
        else the position (an entry applied in part: see the module)."""
        if pending:
            span = Span.parse(pending[0].span)
            upto, part, read = span.start, span.skip, None
        else:
            upto, part, read = parse_id(position["id"]), int(position.get("row") or 0), position.get("added")
        if self.committed is not None and (upto, part) <= self.committed:
            return
        self._call("XGROUP SETID", self._set_group, upto, part, read)
        self.committed = (upto, part)

    def _set_group(self, upto: Id, part: int, read: int | None) -> None:
        pipe = self.redis.pipeline(transaction=True)
        at, read = (before(upto), None if read is None else read - 1) if part else (upto, read)
        pipe.xgroup_setid(self.stream, self.group, id_text(at), **({"entries_read": read} if read is not None else {}))
        if part:
            pipe.set(self.row_key, f"{id_text(upto)} {part}")
        else:
            pipe.delete(self.row_key)
        pipe.execute()

    def close(self) -> None:
        self.redis.close()
        _clients.pop(self.server, None)

    @classmethod
    def open_shard(cls, shard: Shard) -> Any:
        return ChunkFile(_entries(shard))

    @classmethod
    def locate(cls, shard: Shard, offset: int) -> tuple[str, str] | None:
        """The entry id and row at byte ``offset`` of what a worker read of ``shard`` (to name
        a bad row), and the command that deletes it; None if it cannot be found."""
        from paramserver.data.redis_rows import locate

        server, stream, _ = parse_url(shard.path)
        try:
            found = locate(_connect(server), stream, Span.parse(shard.span), offset, PAGE, field_of(shard.path))
        except Exception:  # noqa: BLE001  (naming the row is best effort: the error is said anyway)
            logger.debug("cannot locate byte %d of %s", offset, shard.where(), exc_info=True)
            return None
        if found is None:
            return None
        ident, row = found
        return f"{shard.path} entry {ident}, row {row}", f"XDEL {stream} {ident}"


def _entries(shard: Shard) -> Iterator[bytes]:
    """The rows of a shard's entries, a page of ``XRANGE`` at a time (read off the socket
    by ``resp.py``'s kernel), each value a line; an entry cut at a row read alone."""
    server, stream, _ = parse_url(shard.path)
    client = _connect(server)
    span, field = Span.parse(shard.span), field_of(shard.path)
    if span.skip:
        rows = retrying(shard.path, "XRANGE", entry_rows, client, stream, span.start, field)
        yield joined(rows[span.skip:span.take or None] if span.start == span.end else rows[span.skip:])
        if span.start == span.end:
            return
    start, end = b"(" + id_text(span.start).encode(), ("(" if span.take else "") + id_text(span.end)
    while True:
        page, last, n = retrying(shard.path, "XRANGE", xrange_page, client, stream, start, end, PAGE, field)
        if n:
            yield page
        if n < PAGE:
            break
        start = b"(" + last
    if span.take:
        yield joined(retrying(shard.path, "XRANGE", entry_rows, client, stream, span.end, field)[:span.take])
