"""A client's side of its tables' filters (``paramserver.filters``): the links to each
server (the key lists each was sent whole), the residuals a worker owes (error feedback,
the significantly-modified filter), and the bytes each filter took off, per table and
direction (``Client.filter_stats``, the report, ``/metrics``).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from paramserver.client.core import Piece, Wire
from paramserver.errors import ConfigError
from paramserver.filters.base import Link
from paramserver.filters.chain import Chain, chains
from paramserver.filters.packed import PackedRows
from paramserver.filters.residual import Owed, after_routing, before_routing
from paramserver.routing.partition import combine_duplicates
from paramserver.tables.spec import TableSpec

#: what a push's routed pieces go through before they are sent
Prepare = Callable[[list[Piece]], list[Piece]]

#: push operations a lossy codec may round: linear ones, whose rounding the next push makes good
ROUNDED_OPS = ("update", "add")


class ClientFilters:
    """One client's filter state (its methods lock it: pushes come from any thread)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.links: dict[int, Link] = {}
        self.sizes: dict[tuple[str, str], dict[str, list[int]]] = {}  # (table, direction) -> filter -> [in, out]
        self.residuals: dict[str, Owed] = {}
        self.counts: dict[str, dict[str, int]] = {}  # table -> sigmod_in/out, flushes

    def wire(self, spec: TableSpec, direction: str, op: str = "update") -> Wire | None:
        """What a call's requests go through (None: the table has no filters that way).  A
        push that assigns, or keeps the max or min, is never rounded."""
        if not spec.filters:  # every call asks: a table without filters (the default) costs a truth test
            return None
        chain = chains(spec.filters)[direction]
        if direction == "push" and op not in ROUNDED_OPS and chain.lossy:
            chain = chain.exact()
        if not chain.wire:
            return None
        return Wire(chain, self.links, self.sizes.setdefault((spec.name, direction), {}), spec.layout)

    def takes_packed(self, spec: TableSpec) -> bool:
        """Whether a push's ``PackedRows`` go out as they are: the table's push filters pack
        values first (``sparse``), and none rounds or holds back what a worker pushes."""
        if not spec.filters:
            return False
        chain = chains(spec.filters)["push"]
        first = next((f for f in chain.wire if f.stage == "values"), None)
        return first is not None and first.takes_packed and chain.select is None and not chain.lossy

    def reply_chain(self, spec: TableSpec) -> Chain | None:
        if not spec.filters:
            return None
        chain = chains(spec.filters)["reply"]
        return chain if chain else None

    def owes(self, spec: TableSpec, op: str) -> bool:
        if not spec.filters:
            return False
        chain = chains(spec.filters)["push"]
        return op in ROUNDED_OPS and (chain.select is not None or bool(chain.lossy))

    def before_routing(self, spec: TableSpec, keys: np.ndarray, grads: np.ndarray,
                       select: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """A push's distinct keys and gradients with what is owed added, less what the
        significantly-modified filter keeps back (unless not ``select``: a flush)."""
        with self.lock:
            store = self._store(spec)
            return before_routing(chains(spec.filters)["push"], store, keys, grads,
                                  self.counts.setdefault(spec.name, {}), select)

    def push_steps(self, spec: TableSpec, keys: np.ndarray, grads: np.ndarray, op: str, distinct: bool,
                   flushing: bool = False) -> tuple[np.ndarray, np.ndarray, bool, Prepare | None]:
        """A push through its table's filters before it is routed, and what its routed
        pieces go through after (None: nothing): what is owed added (duplicates summed
        first: owed rows are a key's), less what the significantly-modified filter holds
        back unless ``flushing``; each piece's rounding owed.  Returns the keys, the
        gradients, whether they are distinct now, and that last step."""
        if not self.owes(spec, op):
            return keys, grads, distinct, None
        if not distinct:
            keys, grads = combine_duplicates(keys, grads, "add")
        keys, grads = self.before_routing(spec, keys, grads, select=not flushing)
        return keys, grads, True, functools.partial(self.after_routing, spec)

    def after_routing(self, spec: TableSpec, pieces: list[Piece]) -> list[Piece]:
        """Each piece rounded as its server will decode it; the rounding is owed."""
        chain = chains(spec.filters)["push"]
        if not chain.lossy:
            return pieces
        with self.lock:
            store = self._store(spec)
            return [replace(p, extra=after_routing(chain, store, p.keys, p.extra, p.counts)) for p in pieces]

    def drain(self, table: str, held_only: bool = False) -> tuple[np.ndarray, np.ndarray] | None:
        """What ``table`` is owed (only what sigmod held back, with ``held_only``), taken
        (to push); None when nothing is."""
        with self.lock:
            store = self.residuals.get(table)
            if store is None:
                return None
            keys, rows = store.drain(held_only)
            c = self.counts.setdefault(table, {})
            c["flushes"] = c.get("flushes", 0) + 1
        return (keys, rows) if keys.size else None

    def must_flush(self, table: str) -> bool:
        """Whether ``table``'s held-back updates fill their store (pushed at the next clock)."""
        with self.lock:
            store = self.residuals.get(table)
            return store is not None and store.must_flush()

    def sigmod_every(self, spec: TableSpec) -> int:
        select = chains(spec.filters)["push"].select
        return int(getattr(select, "every", 0)) if select is not None else 0

    def _store(self, spec: TableSpec) -> Owed:
        store = self.residuals.get(spec.name)
        if store is None:
            store = self.residuals[spec.name] = Owed(spec.dim)
        return store

    def totals(self) -> tuple[int, int]:
        """Bytes of the filtered requests before their first filter and after their last."""
        before = after = 0
        with self.lock:
            for by_filter in self.sizes.values():
                sizes = list(by_filter.values())
                if sizes:
                    before, after = before + sizes[0][0], after + sizes[-1][1]
        return before, after

    def stats(self) -> dict[str, Any]:
        """Per table: per direction, each filter's bytes in and out; what is owed."""
        out: dict[str, Any] = {}
        with self.lock:
            for (table, direction), by_filter in self.sizes.items():
                out.setdefault(table, {})[direction] = {f: {"bytes_in": b, "bytes_out": a}
                                                        for f, (b, a) in by_filter.items()}
            for table, store in self.residuals.items():
                keys, mass = store.pending()
                out.setdefault(table, {})["owed"] = {"keys": keys, "sum_abs": mass,
                                                     "rounding_dropped_keys": store.rounding.dropped_keys,
                                                     "rounding_dropped_sum_abs": store.rounding.dropped,
                                                     **self.counts.get(table, {})}
        return out


def merge_stats(per_worker: list[dict[str, Any]]) -> dict[str, Any]:
    """Every worker's ``Client.filter_stats`` summed: per table and direction, each
    filter's bytes in and out; what was owed at the end (nothing, once flushed)."""
    out: dict[str, Any] = {}
    for stats in per_worker:
        for table, by_direction in stats.items():
            for direction, by_filter in by_direction.items():
                into = out.setdefault(table, {}).setdefault(direction, {})
                for name, value in by_filter.items():
                    if isinstance(value, dict):
                        seen = into.setdefault(name, {})
                        for k, v in value.items():
                            seen[k] = seen.get(k, 0) + v
                    else:
                        into[name] = into.get(name, 0) + value
    return out


def packed_push(table: str, spec: TableSpec, keys: np.ndarray, rows: PackedRows, op: str,
                packed: bool) -> PackedRows | np.ndarray:
    """A push's ``PackedRows`` checked (``Client.push``): as they are where they go out
    packed (``packed``: distinct keys, the table's filters take them), else made dense.

    Raises:
        ConfigError: an op other than ``add`` (a value a packing leaves out is not added:
            what another op would do to it is not), rows of the wrong shape or not as the
            packing says, a value that is not finite."""
    if op != "add":
        raise ConfigError(f"push to {table!r}: packed rows are pushed with op='add' (a value not marked is a "
                          f"zero, and adds nothing), got op={op!r}: push them dense (PackedRows.dense())")
    if rows.shape != (keys.shape[0], spec.dim) or not rows.fits():
        raise ConfigError(f"push to {table!r}: packed rows of shape {rows.shape} whose mask marks "
                          f"{rows.words.size} words and their starts must be ({keys.shape[0]}, {spec.dim}) "
                          "rows as PackedRows.from_dense packs them")
    if not rows.finite():
        raise ConfigError(f"push to {table!r}: grads contain NaN or inf (check the learning rate and the loss)")
    return rows if packed else rows.dense()
