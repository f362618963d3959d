"""The pulls and pushes of a table this client caches rows of (``client/row_cache.py``),
built on a ``CachePort`` (the client's: ``CallerPort``, over its ``Caller``; the
simulation's worker has its own, over its ``Scatter`` and ``SimPort``): a pull reads the
rows held fresh enough and asks the servers for the rest (and every server a hit came
from for its version), checks the hits against the versions the answers carry and pulls
again the few found too old; a push sends what the cache does not gather.
``Client.pull`` and ``Client.push`` come here for a table with a cache
(``Client.cache_rows``), and so do ``SimWorker``'s."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from paramserver.client.core import ByArray, Piece, Wire, pull_rows
from paramserver.client.row_cache import Read, RowCache, RowCacheSpec, Rule, Send, store_columns
from paramserver.errors import ConfigError
from paramserver.routing.partition import combine_duplicates, scatter_rows
from paramserver.store.rowcache import check_fits
from paramserver.tables.push_ops import MERGE, merge_refusal
from paramserver.wire.message import Message, Op

if TYPE_CHECKING:
    from paramserver.client.caller import Caller
    from paramserver.filters.chain import Chain
    from paramserver.tables.spec import TableSpec

OnPiece = Callable[[Piece, Message], None]
Prepare = Callable[[list[Piece]], list[Piece]]


def _foreign(msg: Message) -> int | None:
    """The last version another writer made, as an answer says it (None: an older server's)."""
    foreign = msg.header.get("foreign")
    return foreign if isinstance(foreign, int) and not isinstance(foreign, bool) else None


class CachePort(Protocol):
    """What ``CachedCalls`` needs of whoever sends its calls: the client (``CallerPort``)
    or a simulated worker (``testing/cache_port.py``)."""

    def ring_version(self) -> int:
        """The version of the ring the calls are routed on."""

    def node_id(self) -> int:
        """This client's number (its pushes' ``sender``; -1 before it is registered)."""

    def spec(self, table: str) -> TableSpec:
        """``table``'s spec."""

    def reply_chain(self, spec: TableSpec) -> Chain | None:
        """The filters ``spec``'s pull replies come through (None: none)."""

    def pull_wire(self, spec: TableSpec) -> Wire | None:
        """The filters of ``spec``'s pulls on the wire (None: none)."""

    def scatter_pull(self, spec: TableSpec, keys: np.ndarray, positions: np.ndarray, on_piece: OnPiece,
                     result: np.ndarray, extra_header: dict[str, Any], prepare: Prepare | None) -> Future[Any]:
        """Pull ``keys`` (``positions``: where each goes in ``result``), one request a server,
        the pieces passed through ``prepare`` first; resolves to ``result``."""

    def push(self, spec: TableSpec, keys: np.ndarray, grads: np.ndarray, distinct: bool,
             op: str = "update", on_piece: OnPiece | None = None) -> Future[Any]:
        """Push ``update`` gradients (or ``merge`` a cache's trained rows' changes), numbered,
        as the table's pushes go; done once applied.  ``on_piece``: each server's answer to a
        merge, which then carries the rows it left (``read_back``)."""


class CallerPort:
    """The client's ``CachePort``: its ``Caller`` and shared state."""

    def __init__(self, caller: Caller) -> None:
        self.caller = caller

    def ring_version(self) -> int:
        return self.caller.state.ring().version

    def node_id(self) -> int:
        return self.caller.node_id

    def spec(self, table: str) -> TableSpec:
        return self.caller.spec(table)

    def reply_chain(self, spec: TableSpec) -> Chain | None:
        return self.caller.state.filters.reply_chain(spec)

    def pull_wire(self, spec: TableSpec) -> Wire | None:
        return self.caller.state.filters.wire(spec, "pull")

    def scatter_pull(self, spec: TableSpec, keys: np.ndarray, positions: np.ndarray, on_piece: OnPiece,
                     result: np.ndarray, extra_header: dict[str, Any], prepare: Prepare | None) -> Future[Any]:
        return self.caller.scatter(Op.PULL, spec.name, keys, positions, on_piece, result=result,
                                   reply_row_bytes=4 * (spec.width if extra_header.get("state") else spec.dim),
                                   wire=self.pull_wire(spec),
                                   extra_header=extra_header, prepare=prepare)

    def push(self, spec: TableSpec, keys: np.ndarray, grads: np.ndarray, distinct: bool,
             op: str = "update", on_piece: OnPiece | None = None) -> Future[Any]:
        return self.caller.push(spec, keys, grads, op, distinct, on_piece=on_piece)


class CachedCalls:
    """The row caches of one client (or simulated worker), by table, and their pulls and
    pushes through ``port``."""

    def __init__(self, port: CachePort, caches: dict[str, RowCache]) -> None:
        self.port = port
        self.caches = caches
        self.slots: ByArray[np.ndarray] = ByArray()  # the keys of the last pulls -> their slots, for the pushes

    def use(self, spec: TableSpec, row_cache: Any) -> RowCacheSpec:
        """Cache ``spec``'s rows on this client as ``row_cache`` says (``off``: stop, what it held pushed)."""
        parsed = RowCacheSpec.parse(row_cache)
        if parsed and spec.aggregate:
            raise ConfigError(f"table {spec.name!r} aggregates a clock's pushes (BSP aggregate=True): a row cache "
                              "would sum them a second time; cache a table without aggregate")
        if spec.name in self.caches:
            self.flush(spec.name)
            del self.caches[spec.name]
        if parsed:
            self.caches[spec.name] = _made(spec, parsed)
        return parsed

    def pull(self, spec: TableSpec, keys: np.ndarray, cache: RowCache, out: np.ndarray | None = None) -> Future[Any]:
        """``keys``' rows through ``cache`` (into ``out``, float32, where given)."""
        if out is None:
            out = np.empty((keys.shape[0], spec.dim), np.float32)
        read = cache.read(keys, out, self.port.ring_version())
        self.slots.keep(keys, read.slots)
        outer: Future[Any] = Fresh(functools.partial(cache.refresh, keys, out)) if cache.local else Future()
        missing = np.flatnonzero(read.slots < 0)
        self._fetch(spec, cache, keys, missing, out, read, outer, cache.servers(read))
        return outer

    def _fetch(self, spec: TableSpec, cache: RowCache, keys: np.ndarray, positions: np.ndarray, out: np.ndarray,
               read: Read, outer: Future[Any], ask: list[int]) -> None:
        """Pull ``keys[positions]`` into ``out`` (and a version from every server in ``ask``),
        then check the hits; ``outer`` gets ``out`` once no hit is too old."""
        port = self.port
        replies = port.reply_chain(spec)

        def on_piece(piece: Piece, msg: Message) -> None:
            rows = pull_rows(msg, piece, spec.width if cache.local else spec.dim, replies)
            scatter_rows(rows[:, :spec.dim] if cache.local else rows, piece.extra, out)
            version = msg.header.get("version")
            if not isinstance(version, int) or isinstance(version, bool):
                raise ConfigError(f"server {piece.server} answered a cached pull without its table's version: "
                                  "a server older than the row cache; run every node on one release")
            cache.answered(read, piece.server, version, piece.keys, rows, _foreign(msg))

        def asked(pieces: list[Piece]) -> list[Piece]:  # a server none of the misses goes to still says its version
            have = {p.server for p in pieces}
            ring_version = pieces[0].ring_version if pieces else port.ring_version()
            empty_keys, empty_pos = np.zeros(0, np.uint64), np.zeros(0, np.int64)
            return pieces + [Piece(server, ring_version, empty_keys, empty_pos, np.zeros(0, np.int32),
                                   np.zeros(0, np.int64)) for server in ask if server not in have]

        try:
            header = {"versions": True, "writer": port.node_id(), **({"state": True} if cache.local else {}),
                      **({"reply_filters": True} if replies else {})}
            inner = port.scatter_pull(spec, keys[positions], positions, on_piece, out, header,
                                      asked if ask else None)
        except BaseException as exc:
            outer.set_exception(exc)
            return
        inner.add_done_callback(functools.partial(self._checked, spec, cache, keys, out, read, outer))

    def _checked(self, spec: TableSpec, cache: RowCache, keys: np.ndarray, out: np.ndarray, read: Read,
                 outer: Future[Any], inner: Future[Any]) -> None:
        exc = inner.exception()
        if exc is not None:
            outer.set_exception(exc)
            return
        stale = cache.stale(read, keys)
        if not stale.size:
            outer.set_result(out)
            return
        read.slots[stale] = -1  # pulled again: no longer a hit
        again = Read(read.slots, read.stamps, read.cols, 0, 0, read.ring_version, read.pushes)
        self._fetch(spec, cache, keys, stale, out, again, outer, [])

    def push(self, spec: TableSpec, keys: np.ndarray, grads: np.ndarray, distinct: bool,
             cache: RowCache) -> Future[Any]:
        """A push of ``update`` gradients through ``cache``: what it does not gather goes out."""
        if not distinct:
            keys, grads = combine_duplicates(keys, grads, "update")
        return self._sends(spec, cache, cache.write(keys, grads, self.slots.get(keys)))

    def _sends(self, spec: TableSpec, cache: RowCache, sends: list[Send]) -> Future[Any]:
        """Push each of ``sends``; done once all are (at once: none).  A merge's answers
        refresh the rows it sent (``RowCache.merged``): a hot row's own write keeps it fresh,
        with no pull of its own."""
        wanted = any(op == MERGE for op, _, _, _ in sends) and cache.wants_rows()
        read_back = self._read_back(spec, cache) if wanted else None
        futures = [self.port.push(spec, keys, rows, distinct, op, read_back if op == MERGE else None)
                   for op, keys, rows, distinct in sends]
        return futures[0] if len(futures) == 1 else all_done(futures)

    def _read_back(self, spec: TableSpec, cache: RowCache) -> OnPiece:
        """What takes a merge's answers: the rows it left, into ``cache`` (``RowCache.merged``)."""
        pushes, ring_version, replies = cache.pushes, self.port.ring_version(), self.port.reply_chain(spec)

        def merged(piece: Piece, msg: Message) -> None:
            version = msg.header.get("version")
            if not msg.arrays or not isinstance(version, int) or isinstance(version, bool):
                return  # an older server's bare acknowledgement: the rows are pulled when due
            cache.merged(piece.server, version, piece.keys, pull_rows(msg, piece, spec.width, replies), pushes,
                         ring_version, _foreign(msg))
        return merged

    def flush(self, table: str | None = None, timeout_s: float | None = None) -> int:
        """Push every sum the caches hold (``table``'s, or all), waited on; the keys pushed."""
        pushed = 0
        for name in [table] if table is not None else list(self.caches):
            sent, future = self.push_held(name)
            if future is not None:
                future.result(timeout=timeout_s)
                pushed += sent
        return pushed

    def push_held(self, table: str) -> tuple[int, Future[Any] | None]:
        """Push every sum ``table``'s cache holds, not waited on: the keys pushed and the
        push's future (None: nothing held, or no cache)."""
        cache = self.caches.get(table)
        if cache is None:
            return 0, None
        sends = cache.take()
        if not sends:
            return 0, None
        return sum(int(keys.shape[0]) for _, keys, _, _ in sends), self._sends(self.port.spec(table), cache, sends)

    def on_clock(self) -> None:
        """A BSP or SSP table's clock ends here: its sums go out (not waited on, ahead of
        the clock's tick) and its rows are forgotten, so the next pull passes the gate."""
        for name, cache in self.caches.items():
            spec = self.port.spec(name)
            if spec.staleness == float("inf"):
                continue  # ASP: the cache's own bound holds across clocks
            cache.expire()
            self.push_held(name)


def _made(spec: TableSpec, parsed: RowCacheSpec) -> RowCache:
    """``spec``'s cache as ``parsed`` says: one that trains its rows where ``apply`` is
    ``local``, or ``auto`` and the table's rows merge; else one that sums gradients."""
    rule = _rule(spec, parsed)
    return RowCache(parsed, spec.dim, _sums_width(spec, rule), rule)


def _sums_width(spec: TableSpec, rule: Rule | None) -> int:
    """The width of a cache's sums: a push's row, or a whole row where the cache trains its rows."""
    return spec.push_width if rule is None else spec.width


def _rule(spec: TableSpec, parsed: RowCacheSpec) -> Rule | None:
    """The rule a cache of ``spec`` as ``parsed`` says trains its rows with (None: it sums gradients)."""
    refusal = "" if parsed.apply == "server" else merge_refusal(spec)
    if parsed.apply == "server" or parsed.apply == "auto" and refusal:
        return None
    if refusal:
        raise ConfigError(f"table {spec.name!r}: a row cache cannot train its rows (apply=local): {refusal}; "
                          "use apply=server (the cache sums gradients)")
    return spec.dim, spec.optimizer.kind, np.asarray(spec.optimizer.params(), np.float64)


def check_caches_fit(spec: TableSpec, row_cache: object, workers: int) -> None:
    """``workers`` caches of ``spec``'s rows as ``row_cache`` says, all on this machine (a
    local cluster's), refused before any node starts where together they would not fit
    (``RowStore``'s check, which each worker makes alone)."""
    parsed = RowCacheSpec.parse(row_cache)
    if parsed:
        rule = _rule(spec, parsed)
        check_fits(parsed.rows, *store_columns(spec.dim, _sums_width(spec, rule), rule), workers)


class Fresh(Future):  # type: ignore[type-arg]
    """A cache that trains its rows: a pull's future whose rows are read again from the
    cache each time its result is taken (``RowCache.refresh``), so that a batch pulled while
    the one before it trained reads the rows that batch left."""

    def __init__(self, refresh: Callable[[], None]) -> None:
        super().__init__()
        self._refresh = refresh

    def result(self, timeout: float | None = None) -> Any:
        out = super().result(timeout)
        self._refresh()
        return out


def all_done(futures: list[Future[Any]]) -> Future[Any]:
    """One future for ``futures``: done once every one is, failed with the first failure
    (none: done at once)."""
    done: Future[Any] = Future()
    left = [len(futures)]
    lock = threading.Lock()
    if not futures:
        done.set_result(None)
        return done

    def one(f: Future[Any]) -> None:
        exc = f.exception()
        with lock:
            if done.done():
                return
            left[0] -= 1
            if exc is not None:
                done.set_exception(exc)
            elif not left[0]:
                done.set_result(None)

    for f in futures:
        f.add_done_callback(one)
    return done
