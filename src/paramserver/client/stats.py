"""``client.stats``: what a client and the servers it talks to measured: the servers'
table sizes, clocks and memory, the staleness readers saw, the filters' bytes, the bytes
and calls of this client, and the data losses it was told of."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from paramserver.errors import ParamServerError
from paramserver.wire.message import Op

if TYPE_CHECKING:
    from paramserver.client.io_thread import IOThread
    from paramserver.client.losses import Losses
    from paramserver.client.rpc import Rpc
    from paramserver.client.state import ClientState


class Stats:
    """The measuring calls of a client, through its ``rpc``, its I/O thread, its ``state``."""

    def __init__(self, rpc: Rpc, io: IOThread, state: ClientState, losses: Losses) -> None:
        self._rpc, self._io, self._state, self._losses = rpc, io, state, losses

    def server_stats(self, samples: bool = False) -> list[dict[str, Any]]:
        """Per-server table sizes, clocks and resident memory; with ``samples`` also each
        server's metric families (``metrics.py``)."""
        return [m.header for m in self._rpc.on_every_server({"op": Op.STATS.value, "samples": samples})]

    def round_trip_floor(self, probes: int, timeout_s: float) -> float | None:
        """The round trip of this client's link to its servers, seconds: ``probes`` pings sent
        to each server one at a time, the least of each server's, the longest of those (a
        request that spans them waits for the furthest).  Sent with nothing else of this
        client's in flight, each times the link and the two ends' threads alone, not a queue
        of requests ahead of it or a server's first call of a kernel.  None where a server
        does not answer a ping in ``timeout_s`` (one of a version without it, or gone)."""
        floors = []
        for address in self._state.view.servers.values():
            least = float("inf")
            for _ in range(probes):
                sent = time.perf_counter()
                try:
                    self._rpc.request(address, {"op": Op.PING.value}).result(timeout=timeout_s)
                except (ParamServerError, TimeoutError):
                    return None
                least = min(least, time.perf_counter() - sent)
            floors.append(least)
        return max(floors) if floors else None

    def consistency_stats(self) -> list[dict[str, Any]]:
        """Per server: the staleness readers saw (histogram of c - min clock at answer
        time), pulls parked and seconds spent parked, and the vector clock."""
        return [s["consistency"] for s in self.server_stats()]

    def filter_stats(self) -> dict[str, Any]:
        """Per table and direction, each filter's bytes in and out (this client's
        requests), and what its residuals owe (``owed``: keys, sum of |value|)."""
        return self._state.filters.stats()

    def wire_totals(self) -> tuple[int, int]:
        """Bytes of this client's filtered requests before their filters and after, in all."""
        return self._state.filters.totals()  # cheap: a training loop asks twice a second

    @property
    def bytes_sent(self) -> int:
        """Bytes this client sent, every frame of every request."""
        return self._io.bytes_sent

    @property
    def bytes_received(self) -> int:
        """Bytes this client received, every frame of every answer."""
        return self._io.bytes_received

    @property
    def counts(self) -> dict[str, int]:
        """Calls by op, and ``retries`` (pieces routed again): ``metrics.client_families``."""
        return self._state.counts

    @property
    def keys(self) -> dict[str, int]:
        """Keys this client sent by op (``pull``, ``push``): each one a server's key-operation."""
        return dict(self._state.keys)

    def sums_held(self) -> int | None:
        """The row caches' gradient sums not pushed yet, over every table (None: no cache)."""
        caches = list(self._state.row_caches.values())
        return sum(cache.held() for cache in caches) if caches else None

    def row_cache_stats(self) -> dict[str, dict[str, object]]:
        """Per cached table: hits, misses, reads found stale, sums held and pushed, and how
        many versions behind a hit was (p50, p99, histogram): ``client/row_cache.py``."""
        return {name: cache.stats() for name, cache in list(self._state.row_caches.items())}

    @property
    def losses(self) -> list[dict[str, Any]]:
        """The servers' deaths that lost data, as this client was told (each: ``server``,
        ``tables``, ``by_table`` vnode ids, ``vnodes``)."""
        return list(self._losses.seen)

    @property
    def allow_loss(self) -> bool:
        """Whether a loss is only logged and kept in ``losses`` (else the next call raises)."""
        return self._losses.allow

    @allow_loss.setter
    def allow_loss(self, allow: bool) -> None:
        self._losses.allow = bool(allow)
