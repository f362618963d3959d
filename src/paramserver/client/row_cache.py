"""A worker's bounded-staleness row cache for one table (issue 46), without I/O: what a
pull reads from it and what it asks the servers for, what a push gathers in it and what
it sends, and when a row is too old to read.

The bound is in the servers' versions of the table: each server counts the pushes it
applied to the table (``VnodeSet.version``) and answers a pull that asks (``versions``)
with the count.  A row is read from the cache while the count of the server it came from
moved at most ``s`` since the row was fetched: then no read returns a row that missed
more than ``s`` of the server's updates, whatever the row, and the check costs no byte a
key (a version a key, as HET sends, would double a dim-1 pull).

A pull asks every server for its version, even a server none of its misses goes to (an
empty request), and the hits are checked against what the answers say once they are in;
a hit found too old is pulled again before the pull returns (``RowCache.stale``).  What
the worker expects of each version between pulls picks the hits (``Versions``: the newest
answer's, plus the versions a push of this worker's has moved it by lately, for every
push sent since that pull), so a hit is found too old only when the other workers sped up.

A push adds each cached key's gradient to its local sum; the sum goes out once ``s``
pushes gathered or ``s`` versions passed since its first gradient, when its slot is given
up to another key, at ``flush``, at every ``clock()`` of a BSP or SSP table, and when the
ring changes (the cache is then emptied: a failover or a join moves rows to servers whose
versions are other counts).  ``s = 0`` is no cache.

Who applies the table's rule to a cached row's gradients (``apply``):

* ``server``: the cache sums them and the server's rule takes the sum as one gradient.  A
  sum of ``s`` gradients is not ``s`` steps: the rule's step sizes (AdaGrad's and FTRL's
  accumulators) see one big gradient, and every gradient of the sum was computed on a
  row that missed the ones before it.  Test log loss grew with ``s`` (+0.03 at ``s=100``
  on heavy-tailed rows, +0.7 for an FM on the Criteo sample at ``s=10``).
* ``local``: the cache reads whole rows (value and rule state: a pull that asks
  ``state``), trains each held row by the table's rule as its gradients come, and pushes
  the row's change since (``merge``, ``tables/push_ops.py``), which the server adds.  A
  worker's reads of its rows see all its own steps (a pull's rows are read again from the
  cache when the batch takes them, ``refresh``: a batch pulled ahead of the one before it
  still sees that one's step), so one worker trains exactly the uncached model, to
  rounding, whatever ``s``; what ``s`` bounds is how late it sees the other workers' steps.
  For the rules whose state adds (SGD, AdaGrad, FTRL, an FM's FTRL-AdaGrad), on float32
  rows in memory with no key lifecycle (``push_ops.merge_refusal``); a table's filters
  carry its whole rows and their changes through their lossless filters alone.
* ``auto`` (the default): ``local`` where the table allows it, else ``server``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from paramserver.errors import ConfigError
from paramserver.store.rowcache import RowStore

#: ``--row-cache`` presets; ``"off"`` (or ``""``) is no cache
PRESETS = {"hot": "s=8,rows=262144"}
#: the largest staleness bound taken
MAX_S = 1 << 20
#: ``apply=``: who applies the table's rule to a cached row's gradients (``RowCacheSpec.apply``)
APPLIES = ("auto", "server", "local")
#: what a push through a cache sends: its op (``update``, or a trained row's ``merge``), keys,
#: rows, and whether the keys are distinct
Send = tuple[str, np.ndarray, np.ndarray, bool]
#: a cache that trains its rows: the table's value columns, its rule's kind and hyper-parameters
Rule = tuple[int, int, np.ndarray]
#: a version histogram's last bucket holds every lag from here on
LAG_BUCKETS = 64


def store_columns(dim: int, width: int, rule: Rule | None) -> tuple[int, int]:
    """A cache's ``RowStore`` columns (its rows', its sums'): a cache that trains its rows
    (``rule``) holds whole rows and their changes, ``width`` each; one that sums gradients
    holds the ``dim`` values and sums ``width`` wide."""
    return (width if rule is not None else dim), width


@dataclass(frozen=True)
class RowCacheSpec:
    """What ``--row-cache`` or ``create_table(row_cache=...)`` says: ``s`` (the staleness
    bound, in server versions; 0: no cache) and ``rows`` (slots, rounded up to a power
    of two)."""

    s: int = 0
    rows: int = 262_144
    apply: str = "auto"  # "server": gradient sums pushed; "local": rows trained here, their changes merged;
    # "auto": local where the table's rows merge (``push_ops.merge_refusal``), else server

    @classmethod
    def parse(cls, text: object) -> RowCacheSpec:
        """``"s=8,rows=262144"``, a preset (``hot``), or ``off``/``""``/None."""
        if isinstance(text, RowCacheSpec):
            return text
        if text is None or text in ("", "off", "none"):
            return cls()
        if not isinstance(text, str):
            raise ConfigError(f"row_cache must be a string such as 's=8,rows=262144', got {text!r}")
        spec = PRESETS.get(text, text)
        fields: dict[str, int | str] = {}
        for part in spec.split(","):
            name, eq, value = part.partition("=")
            name = name.strip()
            if not eq or name not in ("s", "rows", "apply"):
                raise ConfigError(f"row cache {text!r}: {part!r} is not s=N, rows=N or apply=auto|server|local (e.g. "
                                  f"'s=8,rows=262144', or a preset: {sorted(PRESETS)}, or 'off')")
            if name in fields:
                raise ConfigError(f"row cache {text!r}: {name} is given twice; give it once")
            fields[name] = _applied(text, value) if name == "apply" else _whole(text, name, value)
        made = cls(**fields)  # type: ignore[arg-type]
        if not 0 <= made.s <= MAX_S:
            raise ConfigError(f"row cache {text!r}: s must be in [0, {MAX_S}] (0: no cache), got {made.s}")
        if not 4 <= made.rows <= 1 << 31:
            raise ConfigError(f"row cache {text!r}: rows must be in [4, 2**31], got {made.rows}")
        return made

    def __bool__(self) -> bool:
        return self.s > 0

    def __str__(self) -> str:
        if not self:
            return "off"
        return f"s={self.s},rows={self.rows}" + (f",apply={self.apply}" if self.apply != "auto" else "")


def _applied(text: str, value: str) -> str:
    """``apply``'s value: ``auto``, ``server`` or ``local``."""
    value = value.strip()
    if value not in APPLIES:
        raise ConfigError(f"row cache {text!r}: apply must be one of {APPLIES} (server: the cache sums gradients "
                          "and the server's rule applies them; local: the cache trains its rows by the table's rule; "
                          f"auto: local where the table's rule allows), got {value!r}")
    return value


def _whole(text: str, name: str, value: str) -> int:
    """``value`` as a whole number (``262144``, ``1e6``)."""
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if not number.is_integer():
        raise ConfigError(f"row cache {text!r}: {name} must be a whole number, got {value!r}")
    return int(number)


@dataclass
class Read:
    """One pull through the cache: its keys' slots (-1: asked of a server), a hit's
    stamp and server column as read, the hits, and each server's version as its answer
    said (``versions``)."""

    slots: np.ndarray
    stamps: np.ndarray
    cols: np.ndarray
    hits: int
    servers: int  # a mask of the columns the hits came from (bit min(column, 63))
    ring_version: int
    pushes: int  # this worker's pushes through the cache when the pull went out
    versions: dict[int, int] = field(default_factory=dict)


class Versions:
    """What a worker expects of each server's version of a table: the newest answer's
    (``base``, to a pull sent after ``at`` pushes of this worker's), and ``rate``, the
    versions one push of this worker's has moved it by (its own, and the other workers'
    meanwhile; at least 1), for every push since."""

    def __init__(self) -> None:
        self.base = np.zeros(0, np.int64)
        self.at = np.zeros(0, np.int64)
        self.rate = np.zeros(0, np.float64)

    def add(self) -> None:
        self.base, self.at = np.append(self.base, 0), np.append(self.at, -1)
        self.rate = np.append(self.rate, 1.0)

    def answered(self, col: int, version: int, at: int) -> None:
        if at < self.at[col]:
            return  # an older pull's answer, arrived late
        if at == self.at[col]:
            self.base[col] = max(self.base[col], version)
            return
        if self.at[col] >= 0:
            seen = (version - self.base[col]) / (at - self.at[col])
            self.rate[col] = max(1.0, 0.5 * self.rate[col] + 0.5 * seen)
        self.base[col], self.at[col] = version, at

    def expected(self, pushes: int) -> np.ndarray:
        """Each server's version as expected after this worker's ``pushes`` pushes (rounded up)."""
        return self.base + np.ceil(self.rate * np.maximum(0, pushes - self.at)).astype(np.int64)


class RowCache:
    """One table's cache on one worker; every method takes its lock (a pull's answers
    fill it on the I/O thread while the worker reads and pushes)."""

    def __init__(self, spec: RowCacheSpec, dim: int, width: int, rule: Rule | None = None) -> None:
        """``rule`` (a cache that trains its rows, ``apply=local``): the table's value columns,
        its rule's kind and hyper-parameters; ``width`` is then a whole row's."""
        self.spec, self.s = spec, spec.s
        self.local = rule is not None
        self.store = RowStore(spec.rows, *store_columns(dim, width, rule), rule)
        self.lock = threading.Lock()
        self.ring_version = -1
        self.index: dict[int, int] = {}  # a server's node id -> its column of ``versions``
        self.versions = Versions()  # what this worker expects of each server's version
        self.quiet: dict[int, int] = {}  # a column -> versions since another writer's last push, as last answered
        self.pushes = 0  # this worker's pushes that sent keys through the cache
        self.owed: list[tuple[np.ndarray, np.ndarray]] = []  # sums out of the cache, for the next push
        self.lags = np.zeros(LAG_BUCKETS, np.int64)  # how many versions behind each hit was, when served
        self.counts = {"hits": 0, "misses": 0, "stale": 0, "sums_pushed": 0, "grads_gathered": 0, "rows_read_back": 0}

    def _column(self, server: int) -> int:
        col = self.index.get(server)
        if col is None:
            col = self.index[server] = len(self.index)
            self.versions.add()
        return col

    def _est(self) -> np.ndarray:
        return self.versions.expected(self.pushes)

    def _ring(self, ring_version: int) -> None:
        """A new ring: every sum out, every row and version forgotten."""
        if ring_version != self.ring_version:
            self._take_all()
            self.store.clear()
            self.index.clear()
            self.versions = Versions()
            self.quiet.clear()
            self.ring_version = ring_version

    def _take_all(self) -> None:
        keys, sums = self.store.drain()
        if keys.size:
            self.owed.append((keys, sums))

    def read(self, keys: np.ndarray, out: np.ndarray, ring_version: int) -> Read:
        """Copy the rows held within ``s`` into ``out``; what to ask the servers for is
        ``Read.slots < 0``."""
        with self.lock:
            self._ring(ring_version)
            slots, stamps, cols, hits, servers = self.store.read(keys, out, self._est(), self.s)
            self.counts["hits"] += hits
            self.counts["misses"] += keys.shape[0] - hits
            return Read(slots, stamps, cols, hits, servers, ring_version, self.pushes)

    def refresh(self, keys: np.ndarray, out: np.ndarray) -> None:
        """A cache that trains its rows: ``out`` (a pull's rows of ``keys``, as it read them)
        takes the rows held now, its own pushes since applied: a row read ahead of the push
        before it (the pipeline) is read again as that push left it."""
        with self.lock:
            if self.local:
                self.store.refresh(keys, out)

    def servers(self, read: Read) -> list[int]:
        """The servers the hits of ``read`` came from: each must say its version."""
        with self.lock:
            if not read.hits:
                return []
            return [server for server, col in self.index.items() if col >= 63 or read.servers >> col & 1]

    def answered(self, read: Read, server: int, version: int, keys: np.ndarray, rows: np.ndarray,
                 foreign: int | None = None) -> None:
        """Server ``server`` answered at ``version`` with ``rows`` for ``keys``: kept (on this ring).
        ``foreign``: the last version another writer made there."""
        with self.lock:
            read.versions[server] = version
            if read.ring_version != self.ring_version:
                return
            col = self._column(server)
            self.versions.answered(col, version, read.pushes)
            self._heard(col, version, foreign)
            keys_out, sums = self.store.fill(keys, rows, version, col)
            if keys_out.size:
                self.owed.append((keys_out, sums))

    def _heard(self, col: int, version: int, foreign: int | None) -> None:
        self.quiet[col] = version - foreign if foreign is not None else 0  # an older server: as if others wrote

    def wants_rows(self) -> bool:
        """Whether a merge should bring back the rows it leaves (``read_back``): while another
        writer pushed to one of the servers within the last ``s`` versions.  Alone, the rows
        a merge leaves are this cache's own (its row is the server's plus its change), and
        reading them back would only spend bytes; with others, a hot row's own write then
        refreshes it with their steps, with no pull of its own."""
        with self.lock:
            return self.local and (not self.quiet or min(self.quiet.values()) <= self.s)

    def merged(self, server: int, version: int, keys: np.ndarray, rows: np.ndarray, pushes: int,
               ring_version: int, foreign: int | None = None) -> None:
        """Server ``server`` merged this cache's changes to ``keys`` (sent after ``pushes`` pushes,
        on ``ring_version``'s ring) and answered with the rows they left, at ``version``: the
        rows still held take them, as a pull's answer (their change since, kept), unless a newer
        answer of that server's came first.  A key given up meanwhile is not taken back."""
        with self.lock:
            if ring_version != self.ring_version or server not in self.index:
                return
            col = self.index[server]
            self.versions.answered(col, version, pushes)
            self._heard(col, version, foreign)
            self.counts["rows_read_back"] += int(keys.shape[0])
            self.store.refill(keys, rows, version, col)

    def stale(self, read: Read, keys: np.ndarray) -> np.ndarray:
        """The positions of the hits of ``read`` (of ``keys``) that the servers' answers
        show more than ``s`` versions old: pulled again.  The others' lags are counted."""
        hit = np.flatnonzero(read.slots >= 0)
        with self.lock:
            if read.ring_version != self.ring_version:
                return hit  # the ring moved under the read: its rows are of other servers' versions
            now = np.full(len(self.index), np.iinfo(np.int64).max, np.int64)  # unanswered: too old
            for server, version in read.versions.items():
                col = self.index.get(server)
                if col is not None:
                    now[col] = version
            lag = now[read.cols[hit]] - read.stamps[hit]
            old = lag > self.s
            self.lags += np.bincount(np.clip(lag[~old], 0, LAG_BUCKETS - 1), minlength=LAG_BUCKETS)
            self.counts["stale"] += int(old.sum())
            again: np.ndarray = hit[old]
            return again

    def write(self, keys: np.ndarray, grads: np.ndarray, slots: np.ndarray | None) -> list[Send]:
        """What a push of distinct ``keys`` sends (``Send``s with keys): the keys not held,
        the sums due, and the sums owed (given up since); a cache that trains its rows sends
        the gradients of the keys it does not hold apart from its rows' changes (``merge``)."""
        with self.lock:
            hint = slots if slots is not None and slots.shape[0] == keys.shape[0] else np.full(keys.shape[0], -1)
            self.counts["grads_gathered"] += keys.shape[0]
            if not self.local:
                out_keys, out_grads = self.store.write(keys, grads, hint, self._est(), self.s)
                self.counts["sums_pushed"] += out_keys.shape[0]
                return self._sent([("update", *self._with_owed(out_keys, out_grads))])
            keys_out, rows, pass_keys, pass_grads = self.store.write_local(keys, grads, hint, self._est(), self.s)
            self.counts["sums_pushed"] += keys_out.shape[0] + pass_keys.shape[0]
            return self._sent([("update", pass_keys, pass_grads, True), ("merge", *self._with_owed(keys_out, rows))])

    def _sent(self, sends: list[Send]) -> list[Send]:
        """The sends with keys; one push more of this worker's where there is one (it moves
        the versions of the servers it reaches)."""
        sent = [send for send in sends if send[1].size]
        if sent:
            self.pushes += 1
        return sent

    def _with_owed(self, keys: np.ndarray, grads: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
        if not self.owed:
            return keys, grads, True
        owed, self.owed = self.owed, []
        return (np.concatenate([keys, *[k for k, _ in owed]]), np.concatenate([grads, *[g for _, g in owed]]),
                False)

    def take(self) -> list[Send]:
        """Every sum held or owed, taken out to be pushed (flush, a clock, a part's end)."""
        with self.lock:
            self._take_all()
            held = self._with_owed(np.zeros(0, np.uint64), np.zeros((0, self.store.width), np.float32))
            return self._sent([("merge" if self.local else "update", *held)])

    def expire(self) -> None:
        """Forget every row (a BSP or SSP clock: the next pull reads what the gate allows)."""
        with self.lock:
            self._take_all()
            self.store.clear()

    def held(self) -> int:
        """Keys whose gradient sums are not pushed yet (held in a slot, or owed)."""
        with self.lock:
            return self._held()

    def _held(self) -> int:
        return self.store.held() + sum(int(k.shape[0]) for k, _ in self.owed)

    def stats(self) -> dict[str, Any]:
        """Hits, misses, reads found stale, sums held and pushed, and the lag histogram's p50/p99."""
        with self.lock:
            return {**self.counts, "sums_held": self._held(), "s": self.s, "rows": self.store.capacity,
                    "apply": "local" if self.local else "server",
                    "bytes": self.store.nbytes, **percentiles(self.lags), "lag_histogram": self.lags.tolist()}


def percentiles(histogram: np.ndarray) -> dict[str, int]:
    """The p50 and p99 of a histogram of lags (bucket i: i versions behind)."""
    total = int(histogram.sum())
    cum = np.cumsum(histogram)
    return {f"lag_p{q}": int(np.searchsorted(cum, q / 100 * total)) if total else 0 for q in (50, 99)}


def merge_caches(per_worker: list[dict[str, Any]]) -> dict[str, Any]:
    """The row cache stats of several workers' (``RowCache.stats``) as one: counts summed,
    lags from the summed histogram, the hit rate."""
    merged: dict[str, Any] = {k: sum(c.get(k, 0) for c in per_worker)
                              for k in ("hits", "misses", "stale", "sums_pushed", "grads_gathered", "sums_held",
                                        "rows_read_back")}
    lags = np.sum([np.asarray(c["lag_histogram"], np.int64) for c in per_worker], axis=0)
    reads = merged["hits"] + merged["misses"]
    merged.update(s=per_worker[0]["s"], rows=per_worker[0]["rows"], apply=per_worker[0].get("apply", "server"),
                  hit_rate=merged["hits"] / reads if reads else 0.0,
                  **percentiles(lags))
    return merged
