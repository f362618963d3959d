"""Redis Streams as a training source: ``train --stream redis://HOST:PORT/STREAM``.

Each entry holds rows of the job's ``--format`` (criteo or libsvm: a stream has no CSV
header) in its field ``line`` (``?field=NAME``: that one; else its first field); a value
may hold several rows, one a line (``paramserver feed`` writes them so).  The driver
counts each new entry's rows in Redis (``redis_rows.COUNT_ROWS``: ids and counts come
back, not rows) and cuts the entries into shards of about ``shard_bytes / 256`` rows; ``--max-examples N`` cuts at the
N-th row exactly, inside an entry if it falls there (``redis_rows.py``).  Workers read
their shard's entries with ``XRANGE`` in pages (``resp.py``).

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
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import numpy as np

from paramserver.data.batch import DataError, Shard
from paramserver.data.redis_outage import retrying
from paramserver.data.redis_rows import COUNT_ROWS, FIELD, Id, Span, before, entry_rows, id_text, joined, parse_id
from paramserver.errors import ConfigError

logger = logging.getLogger(__name__)

SOURCE = "paramserver.data.redis_source:RedisSource"
PAGE = 2000  # entries a worker reads (or the driver counts) a call
ROW_BYTES = 256  # what a shard's size in rows assumes of a row
COUNT_ROWS_A_CALL = 20_000  # rows the driver counts a call, about (see _count)
FIRST_COUNT_PAGE = 256  # entries of the first call of a poll, before their rows are known
POLL_ENTRIES = 200_000  # at most this many entries are counted (and cut) a poll: a backlog takes a few

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
    if not path or not parts.hostname and parts.scheme != "unix":
        raise ConfigError(f"--stream {url}: a Redis stream is redis://HOST:PORT/STREAM (or redis://HOST:PORT/DB/STREAM,"
                          " ?group=NAME for the consumer group, default paramserver; &field=NAME for the entries' "
                          "field, default line)")
    stream, db = path[-1], "/".join(path[:-1])
    group = parse_qs(parts.query).get("group", ["paramserver"])[0]
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}" if db else "", "", "")), stream, group


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
        last, added = self._info()
        if max_rows == 0 or (last == self.cursor and not self.part):
            return [], self.position(), 0, False
        ids, rows, whole = self._count(last, max_rows)
        take = 0
        if max_rows is not None and rows.size and int(rows.sum()) >= max_rows:  # stop at the max_rows-th row
            k = int(np.searchsorted(np.cumsum(rows), max_rows))
            need = max_rows - int(rows[:k].sum())
            if need < rows[k]:  # inside the entry: the rows before take
                take = need + (self.part if k == 0 and self._partial(ids) else 0)
            ids, rows, whole = ids[:k + 1], rows[:k + 1].copy(), whole and k == rows.size - 1 and not take
            rows[k] = need
        shards = self._cut(ids, rows, last if whole else parse_id(ids[-1]), take)
        new = len(ids) - (1 if self._partial(ids) else 0)
        self.cursor, self.part = (parse_id(ids[-1]), take) if take else (last if whole else parse_id(ids[-1]), 0)
        if self.added is not None:
            self.added = added if whole else self.added + new
        return shards, self.position(), int(rows.sum()), False

    def _partial(self, ids: list[bytes]) -> bool:
        """Whether the first entry counted is the cursor's, cut in part before."""
        return bool(self.part and ids and parse_id(ids[0]) == self.cursor)

    def _count(self, last: Id, max_rows: int | None) -> tuple[list[bytes], np.ndarray, bool]:
        """The ids of the entries after the cursor (the cursor's own first, if cut in part)
        through ``last``, their rows (the cursor's not cut yet), and whether they reach
        ``last``: counted in pages until ``max_rows`` rows or ``POLL_ENTRIES`` entries.  A
        page is sized to about ``COUNT_ROWS_A_CALL`` rows: the script blocks Redis while it
        runs (2,000 entries of 100 Criteo rows took 158 ms here; 20,000 rows take ~15)."""
        start = id_text(self.cursor) if self.part else "(" + id_text(self.cursor)
        ids: list[bytes] = []
        counts: list[int] = []
        page, total = FIRST_COUNT_PAGE, 0
        while True:
            got = self._call("XRANGE", self.redis.eval, COUNT_ROWS, 1, self.stream, start, id_text(last), page,
                             self.field)
            ids += got[::2]
            counts += got[1::2]
            here = sum(got[1::2])
            total += here
            if len(got) < 2 * page:
                whole = True
                break
            if max_rows is not None and total >= max_rows + self.part or len(ids) >= POLL_ENTRIES:
                whole = False
                break
            start = "(" + bytes(got[-2]).decode()
            page = max(16, min(PAGE, COUNT_ROWS_A_CALL * page // max(here, 1)))
        rows = np.array(counts, np.int64)
        if self._partial(ids):
            rows[0] = max(0, rows[0] - self.part)
        return ids, rows, whole

    def _cut(self, ids: list[bytes], rows: np.ndarray, end: Id, take: int) -> list[Shard]:
        """Shards of about ``per_shard`` rows (whole entries, the last one's rows before ``take``)."""
        if not ids:  # none left between the cursor and the end (deleted): nothing to read
            return []
        group = (np.cumsum(rows) - rows) // self.per_shard
        ends = [int(i) for i in np.flatnonzero(np.diff(group))] + [len(ids) - 1]
        shards, start, skip = [], self.cursor, self.part
        for n, i in enumerate(ends):
            final = n == len(ends) - 1
            stop = end if final else parse_id(ids[i])
            span = Span(start, stop, skip, take if final else 0)
            shards.append(Shard(self.url, 0, -1, span.text(), SOURCE))
            start, skip = stop, 0
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
        from paramserver.data.streams import ChunkFile

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
    from paramserver.data.resp import xrange_page

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
