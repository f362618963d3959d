"""``VnodeSet``: the vnodes of one table on one server, worked many vnodes per kernel call.

A request carries its keys grouped by vnode (``routing/partition.py``); one numba call
walks all its segments, over typed lists of the vnodes' arrays (hash: ``table.py``;
dense: ``dense.py``; the loops: ``store/loops/many.py`` and ``loops/dense.py``).  It is
the ``VnodeStore`` (``protocol.py``) a server types against.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import cast

import numpy as np

from paramserver._runtime.intrinsics import frozen
from paramserver.errors import ProtocolError
from paramserver.routing.hashing import dense_range
from paramserver.store import exercise
from paramserver.store.compact import ROW_DTYPES
from paramserver.store.dense import DenseVnode
from paramserver.store.directory import Directory
from paramserver.store.disk import DiskArena, default_cold_dir
from paramserver.store.exercise import GENERIC_DIM as GENERIC_DIM  # a warm-up's generic width (server/warmup.py)
from paramserver.store.fingerprints import FingerprintTable, Generations
from paramserver.store.kernels import kernels_for
from paramserver.store.life import TableLife, life_width
from paramserver.store.loops import life as life_loops
from paramserver.store.loops import many
from paramserver.store.loops.dense import (
    dense_check_many,
    dense_lookup_many,
    dense_lookup_whole_many,
    dense_missing_many,
)
from paramserver.store.loops.masked import dense_add_masked_many
from paramserver.store.loops.slots import NOT_FOUND
from paramserver.store.loops.step_groups import EXAMPLES, GROW, KEYS, OCCURRENCES, SEGMENTS
from paramserver.store.memory import available_memory, heap_released, populating_later
from paramserver.store.table import COLD_LOAD, VnodeTable
from paramserver.store.tiers import Tiers
from paramserver.tables.optim import CUSTOM_KIND
from paramserver.tables.push_ops import OP_UPDATE
from paramserver.tables.spec import TableSpec


class VnodeSet:
    """The ``VnodeTable``s (or ``DenseVnode``s) of one table on one server, worked many
    vnodes per kernel call.

    A request carries its keys grouped by vnode; one numba call walks all its segments
    (a Python call per vnode cost ~3.7 µs, 60 % of serving a 7 600-key pull).

    Args:
        spec: the table's ``TableSpec``.
        n_vnodes: vnodes on the ring.
        vnodes: the vnodes this server owns.
        memory: bytes of memory the rows may take here when the spec sets no budget
            (a server's ``--table-memory``; 0: none).
        cold_dir: where rows over the budget go (``tiers.py``).
    """

    def __init__(self, spec: TableSpec, n_vnodes: int, vnodes: Iterable[int], memory: int = 0,
                 cold_dir: str = "") -> None:
        self.spec = spec
        self.width = spec.width
        self.tables: dict[int, VnodeTable | DenseVnode] = {}
        self.n_vnodes = n_vnodes
        self.bits = spec.key_bits
        self.layout = spec.layout  # how keys map to vnodes (``hashing.layout_code``)
        self.slot = np.full(n_vnodes, -1, np.int64)
        # pushes applied to this table here (a request's, a forwarded copy's, a clock's sum):
        # a pull that asks is answered with it, by which workers' row caches bound staleness
        self.version = 0
        opt, init = spec.optimizer, spec.initializer
        self._okind, self._ohp, self._ikind, self._ihp = opt.kind, opt.params(), init.kind, init.params()
        self._seed = np.uint64(spec.seed)
        self._kernels = kernels_for(opt, spec.dim, spec.storage)  # the built-in rules' (cached), or a user rule's own
        # a table's requests in one call compiled for its row (``store/specialize.py``), where there is one
        self._loops = self._kernels.request
        self.life_width = life_width(spec.lifecycle)  # the lifecycle's columns a slot (``loops/life.py``)
        self.life: TableLife | None = None
        if spec.lifecycle:
            self.life = TableLife(spec.lifecycle, spec.dim, self)
        self.tiers: Tiers | None = None
        # a server's default budget: hash tables whose lifecycle does not drop keys (one that
        # does holds its own memory; a dense table's is fixed)
        budget = spec.memory or (memory if not spec.key_bits and not spec.lifecycle.evicts else 0)
        if budget:  # one more life column: when each key was last seen
            arena = DiskArena(cold_dir or default_cold_dir(), spec.name)
            self.tiers = Tiers(self, budget, self.life_width, n_vnodes, self._new_cold, arena,
                               Generations() if spec.hot_keys == "fingerprint" else None)
            self.life_width += 1
        self.set_vnodes(vnodes)
        if self._loops is not None:
            exercise.loops(spec, VnodeSet)
        if self.tiers is not None:
            exercise.tiers(spec, cold_dir, VnodeSet)

    def _new_table(self, vnode: int) -> VnodeTable | DenseVnode:
        if self.bits:
            return DenseVnode(self.spec, self.n_vnodes, vnode)
        if self.tiers is not None and self.tiers.generations is not None:
            return FingerprintTable(self.spec.dim, self.spec.optimizer, self.spec.initializer, self.spec.seed,
                                    keys_arena=self.tiers.arena, kernels=self._kernels, storage=self.spec.storage)
        return VnodeTable(self.spec.dim, self.spec.optimizer, self.spec.initializer, self.spec.seed,
                          kernels=self._kernels, life_width=self.life_width, storage=self.spec.storage,
                          key_bytes=self.spec.key_bytes)

    def _new_cold(self, vnode: int, room: int) -> VnodeTable:
        assert self.tiers is not None, "a cold vnode belongs to a tiered table"
        # without the ``seen`` column (the last): a cold row's page holds all there is of it
        return VnodeTable(self.spec.dim, self.spec.optimizer, self.spec.initializer, self.spec.seed,
                          capacity=int(room / COLD_LOAD) + 2, kernels=self._kernels, life_width=self.tiers.column,
                          storage=self.spec.storage, arena=self.tiers.arena)

    def set_vnodes(self, vnodes: Iterable[int]) -> None:
        """Hold exactly ``vnodes``: keep the ones held already, start the others empty,
        drop the rest (the ring changed)."""
        wanted = sorted({int(v) for v in vnodes})
        if self.bits:  # dense vnodes are mapped whole: refuse what this machine cannot hold, before any
            new = [v for v in wanted if v not in self.tables]
            need = sum(int(np.subtract(*dense_range(v, self.n_vnodes, self.layout)[::-1])) for v in new) * \
                (self.width + 1) * self.itemsize
            free = available_memory()
            if need and free and need > 0.9 * free:
                raise MemoryError(f"dense table {self.spec.name!r} (key_bits={self.bits}, dim={self.spec.dim}) needs "
                                  f"{need / 2**30:,.1f} GiB on this server, {free / 2**30:,.1f} GiB are available: "
                                  "use fewer key_bits, more servers, or key_bits=0 (a hash table grows with the keys)")
        with populating_later():  # every vnode's array mapped (and listed) first, its pages after
            self.tables = {v: self.tables[v] if v in self.tables else self._new_table(v) for v in wanted}
            self._rebuild()
        if self.tiers is not None:
            self.tiers.keep_only(set(wanted))

    def install(self, vnode: int, keys: np.ndarray, rows: np.ndarray, replace: bool = True) -> None:
        """Replace ``vnode`` whole by a copy of it (keys, values and state) from another
        server, or (``replace=False``) add more of such a copy's rows."""
        keys, rows = frozen(keys), frozen(rows)
        self._install(int(vnode), keys, rows, replace)
        if self.life is not None:
            self.life.loaded(int(vnode), keys)
        self.settle()

    def _install(self, vnode: int, keys: np.ndarray, rows: np.ndarray, replace: bool) -> None:
        if self.tiers is not None:
            if replace:
                self.tiers.drop(vnode)
            elif int(vnode) in self.tables:  # rows of the copy replace those held here, in whichever tier
                self.tiers.before(*_one_vnode(vnode, keys))
            self.tiers.dirty = True
        if replace or int(vnode) not in self.tables:
            vt = self._new_table(int(vnode))
            vt.load(keys, rows)
            self.tables[int(vnode)] = vt
            self._rebuild()
        else:
            vt = self.tables[int(vnode)]
            vt.load(keys, rows)
            self._reset(int(vnode))

    def _rebuild(self) -> None:
        self.slot[:] = -1
        for t, v in enumerate(self.tables):
            self.slot[v] = t
        self._dir = Directory(list(self.tables.values()))

    def _reset(self, vnode: int) -> None:
        """Re-read ``vnode``'s arrays into the directory (it grew, or was rebuilt)."""
        self._dir.enter(int(self.slot[vnode]), self.tables[vnode])

    enter = _reset  # as the tiers call it (``tiers.TierRows``)

    def __len__(self) -> int:
        return sum(len(t) for t in self.tables.values()) + (self.tiers.cold_keys if self.tiers is not None else 0)

    def held(self, vnode: int) -> int:
        """Keys of ``vnode`` stored here, in memory and on disk."""
        vt, cold = self.tables.get(vnode), self.tiers.cold.tables.get(vnode) if self.tiers is not None else None
        return (len(vt) if vt is not None else 0) + (len(cold) if cold is not None else 0)

    def rows(self, vnode: int) -> tuple[np.ndarray, np.ndarray]:
        """Every key of ``vnode`` stored here, in memory and on disk, and its float32 row
        (value and state): what an export, a checkpoint or a copy of the vnode reads."""
        vt = self.tables.get(vnode)
        keys, rows = vt.items() if vt is not None else (np.zeros(0, np.uint64), np.zeros((0, self.width), np.float32))
        cold = self.tiers.cold.tables.get(vnode) if self.tiers is not None else None
        if cold is not None and len(cold):
            ck, cr = cold.items()
            keys, rows = np.concatenate([keys, ck]), np.concatenate([rows, cr])
        return keys, rows

    @property
    def tiered(self) -> bool:
        """Whether the table has a memory budget here (``tiers.py``)."""
        return self.tiers is not None

    def prefetch(self, vnodes: np.ndarray, counts: np.ndarray, keys: np.ndarray) -> tuple[int, bool] | None:
        """Keys a later request will ask for (``Tiers.prefetch``): how many are not in
        memory, and whether their pages are read in the background; None for a table
        without tiers."""
        if self.tiers is None:
            return None
        return self.tiers.prefetch(frozen(vnodes), frozen(counts), frozen(keys))

    def settle(self) -> None:
        """After a request: a tiered table moves rows over its memory budget to disk."""
        if self.tiers is not None and self.tiers.dirty:
            self.tiers.settle()

    @property
    def directory(self) -> Directory:
        """The vnodes' arrays by address, as the many-vnode loops read them."""
        return self._dir

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tables.values())

    def holds(self, vnodes: np.ndarray) -> np.ndarray:
        """``bool[len(vnodes)]``: which of ``vnodes`` this set stores."""
        inside = (vnodes >= 0) & (vnodes < self.slot.size)
        out = np.zeros(vnodes.shape[0], bool)
        out[inside] = self.slot[vnodes[inside]] >= 0
        return out

    def check(self, vnodes: np.ndarray, counts: np.ndarray, keys: np.ndarray) -> int:
        """Dense tables: the index of the first key outside its segment's vnode (or the
        key space), -1 when all are in place.  Hash tables take any key (-1), but for a
        table of 4-byte keys, the first past 2**32."""
        if not self.bits:
            if self.spec.key_bytes == 8 or not keys.size or keys.dtype.itemsize <= 4 or int(keys.max()) >> 32 == 0:
                return -1
            return int(np.flatnonzero(keys >> np.uint64(32))[0])
        vnodes, counts, keys = frozen(vnodes), frozen(counts), frozen(keys)
        return int(dense_check_many(self.n_vnodes, self.layout, vnodes, counts, keys))

    def _misplaced(self, bad: int, keys: np.ndarray) -> None:
        if bad >= 0:
            raise ProtocolError(f"table {self.spec.name!r}: key {int(keys[bad])} is not in its vnode of this "
                                f"dense table (key_bits={self.bits})")

    def lookup(self, vnodes: np.ndarray, counts: np.ndarray, keys: np.ndarray, out: np.ndarray) -> None:
        """Rows of ``keys``, grouped by ``vnodes`` (``counts`` keys each), into ``out``."""
        vnodes, counts, keys = frozen(vnodes), frozen(counts), frozen(keys)
        if out.shape[1] != self.spec.dim:
            self._lookup_whole(vnodes, counts, keys, out)
            return
        if self.tiers is not None:
            self.tiers.before(vnodes, counts, keys)
        if self.tables and self.bits:
            self._misplaced(dense_lookup_many(*self._dir.dense_args, self.slot, vnodes, counts, keys, out,
                                              self.spec.dim, self.layout, self._ikind, self._ihp, self._seed), keys)
        elif self.tables and self._loops is not None:
            self._loops.lookup(*self._dir.hash_args, self.slot, vnodes, counts, keys, out, NOT_FOUND, NOT_FOUND,
                               NOT_FOUND, self._ikind, self._ihp, self._seed)
        elif self.tables:
            many.lookup_many(*self._dir.hash_args, self.slot, vnodes, counts, keys, out,
                             self.spec.dim, self._ikind, self._ihp, self._seed)

    def _lookup_whole(self, vnodes: np.ndarray, counts: np.ndarray, keys: np.ndarray, out: np.ndarray) -> None:
        """``lookup``'s rows whole (value and state, ``out`` a row's width) from a table in
        memory (``push_ops.merge_refusal`` says which tables a row cache reads so)."""
        if out.shape[1] != self.width or self.tiers is not None:
            raise ProtocolError(f"table {self.spec.name!r}: whole rows are {self.width} floats of a table in "
                                f"memory; asked for {out.shape[1]}{' of a tiered one' if self.tiers else ''}")
        if self.tables and self.bits:
            self._misplaced(dense_lookup_whole_many(*self._dir.dense_args, self.slot, vnodes, counts, keys, out,
                                                    self.spec.dim, self.layout, self._okind, self._ohp, self._ikind,
                                                    self._ihp, self._seed), keys)
        elif self.tables:
            many.lookup_whole_many(*self._dir.hash_args, self.slot, vnodes, counts, keys, out, self.spec.dim,
                                   self._okind, self._ohp, self._ikind, self._ihp, self._seed)

    @property
    def row_bytes(self) -> int:
        """Bytes a stored key takes, counted by quotas: its key and its row (value and state)."""
        return 8 + self.itemsize * self.width

    @property
    def itemsize(self) -> int:
        """Bytes a row's column takes: 4 (float32) or 2 (``TableSpec.storage`` fp16, bf16)."""
        return int(ROW_DTYPES[self.spec.storage].itemsize)

    def missing(self, vnodes: np.ndarray, counts: np.ndarray, keys: np.ndarray) -> int:
        """How many of ``keys`` (grouped like ``lookup``'s) are not stored yet."""
        if not self.tables:
            return 0
        vnodes, counts, keys = frozen(vnodes), frozen(counts), frozen(keys)
        if self.tiers is not None:
            self.tiers.before(vnodes, counts, keys)
        if self.bits:
            missing, bad = dense_missing_many(*self._dir.dense_args, self.slot, vnodes, counts, keys, self.layout)
            self._misplaced(bad, keys)
            return int(missing)
        return int(many.missing_many(*self._dir.hash_args, self.slot, vnodes, counts, keys))

    def refresh(self) -> None:
        """Re-read every vnode's arrays (after a vnode grew outside ``apply``, e.g. ``load``)."""
        for v in self.tables:
            self._reset(v)

    def apply(self, vnodes: np.ndarray, counts: np.ndarray, keys: np.ndarray, grads: np.ndarray,
              op: int = OP_UPDATE) -> None:
        """Apply ``grads`` to ``keys`` as push operation ``op`` (``push_ops.PUSH_OPS``; the
        table's rule by default), grouped like ``lookup``'s; vnodes grow as needed."""
        k = self._kernels
        vnodes, counts, keys, grads = frozen(vnodes), frozen(counts), frozen(keys), frozen(grads)
        if self.tiers is not None:
            self.tiers.before(vnodes, counts, keys)
        if self.tables and self.bits:  # dense vnodes never grow
            if self._loops is not None and op == OP_UPDATE:
                bad = self._loops.dense_apply(*self._dir.dense_args, self.slot, vnodes, counts, keys, grads,
                                              self.layout, self._ohp, self._ikind, self._ihp, self._seed)
            else:
                bad = k.dense_apply_many(*self._dir.dense_args, self.slot, vnodes, counts, keys, grads,
                                         self.spec.dim, self.layout, op, self._okind, self._ohp, self._ikind,
                                         self._ihp, self._seed)
            self._misplaced(bad, keys)
            return
        seg, start = 0, 0
        loops = self._loops if op == OP_UPDATE else None
        while self.tables:
            if loops is not None:
                seg, start = loops.apply(*self._dir.hash_args, self.slot, vnodes, counts, keys, grads, seg, start,
                                         NOT_FOUND, NOT_FOUND, NOT_FOUND, self._ohp, self._ikind, self._ihp,
                                         self._seed)
            else:
                seg, start = k.apply_many(*self._dir.hash_args, self.slot, vnodes, counts, keys, grads, seg, start,
                                          self.spec.dim, op, self._okind, self._ohp, self._ikind, self._ihp, self._seed)
            if seg == vnodes.shape[0]:
                return
            self._grow_vnode(int(vnodes[seg]))

    def add_masked(self, vnodes: np.ndarray, counts: np.ndarray, keys: np.ndarray, mask: np.ndarray,
                   words: np.ndarray) -> bool:
        """Add rows given as a mask of their non-zero values and those values (the ``sparse``
        filter's packing; ``words`` a float32 array's uint32 view) to ``keys``' rows, grouped
        like ``lookup``'s, as ``apply`` with op add would (``loops/masked.py``).  False, and
        nothing written, where this table does not take them so: a hash or tiered table,
        compact rows, a rule of a user's own; or a key outside its vnode, a mask that does not
        fit the rows, a value that is not finite (``apply`` then says what is wrong)."""
        if not (self.tables and self.bits) or self.tiers is not None or self.itemsize != 4 \
                or self._okind == CUSTOM_KIND or self.check(vnodes, counts, keys) >= 0:
            return False
        status = dense_add_masked_many(*self._dir.dense_args, self.slot, frozen(vnodes), frozen(counts), frozen(keys),
                                       frozen(mask), frozen(words), self.spec.dim, self.layout, self._okind,
                                       self._ohp, self._ikind, self._ihp, self._seed)
        return bool(status == 0)

    def _grow_vnode(self, v: int) -> None:
        """Room for one key more in hash vnode ``v`` (a request loop stopped there)."""
        vt = self.tables[v]
        assert isinstance(vt, VnodeTable), "a dense vnode never asks to grow"
        released = vt._grow(len(vt) + 1)
        self._reset(v)  # the directory lets the old slots go: then their heap pages can be
        heap_released(released)
        if self.tiers is not None:
            self.tiers.dirty = True

    def steps(self, vnodes: np.ndarray, counts: np.ndarray, keys: np.ndarray, inverse: np.ndarray,
              indptr: np.ndarray, vals: np.ndarray, labels: np.ndarray, sizes: np.ndarray, occurrences: np.ndarray,
              l2: float, applied: Callable[[int], None]) -> tuple[np.ndarray, np.ndarray] | None:
        """A step of several batches (``wire/step_groups.py``: the batches' arrays end to end,
        ``sizes`` each one's keys, vnode segments and examples, ``occurrences`` its
        occurrences) in one compiled call (``loops/step_groups.py``): every example's
        probability and each batch's summed log loss.  ``applied(n)``: the first ``n``
        batches are in, said as they come (before a vnode grows, which may fail) and once
        at the end: all of them, or those before the first whose gradient is not finite.
        None where this table's batches go one by one: no request loops for its row, dense
        vnodes, or tiers (their reads and writes go through the tiers' bookkeeping)."""
        loops = self._loops
        if loops is None or self.bits or self.tiers is not None or not self.tables:
            return None
        per = sizes.reshape(-1, 3)
        ends = np.zeros((per.shape[0] + 1, 4), np.int64)
        for column, counted in ((KEYS, per[:, 0]), (SEGMENTS, per[:, 1]), (OCCURRENCES, occurrences),
                                (EXAMPLES, per[:, 2])):
            np.cumsum(counted, out=ends[1:, column])
        preds, losses = np.empty(labels.shape[0], np.float32), np.zeros(per.shape[0], np.float64)
        grads = np.empty((keys.shape[0], self.spec.dim), np.float32)
        args = tuple(frozen(a) for a in (vnodes, counts, keys, inverse, indptr, vals, labels, ends))
        b, seg, start = 0, -1, 0
        while True:
            b, status, seg, start = loops.steps(*self._dir.hash_args, self.slot, *args, b, seg, start, grads, preds,
                                                losses, float(l2), self._ohp, self._ikind, self._ihp, self._seed)
            applied(b)
            if status != GROW:
                return preds, losses
            self._grow_vnode(int(vnodes[ends[b, SEGMENTS] + seg]))

    # ---- the key lifecycle (``store/life.py``) --------------------------------------------
    def touch(self, vnodes: np.ndarray, counts: np.ndarray, keys: np.ndarray, epoch: float, time: float,
              half_life: float) -> None:
        """Stamp the life rows of ``keys`` (grouped like ``lookup``'s) that are stored."""
        if self.tables and self.life_width:
            life_loops.touch_many(*self._dir.hash_args, self._dir.life0, self.slot, frozen(vnodes), frozen(counts),
                                  frozen(keys), np.float32(epoch), np.float32(time), float(half_life))

    def stored(self, vnodes: np.ndarray, counts: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """``bool[len(keys)]``: which of ``keys`` (grouped like ``lookup``'s) are stored."""
        out = np.zeros(keys.shape[0], np.bool_)
        if self.tiers is not None:
            self.tiers.before(frozen(vnodes), frozen(counts), frozen(keys))
        if self.tables and not self.bits:
            life_loops.stored_many(*self._dir.hash_args, self.slot, frozen(vnodes), frozen(counts), frozen(keys), out)
        return out

    def keep(self, vnode: int, mask: np.ndarray, room: int = 0) -> None:
        """Keep only the keys of ``vnode`` that ``mask`` marks (``VnodeTable.keep``)."""
        vt = self.tables[vnode]
        assert isinstance(vt, VnodeTable), "a lifecycle needs hash vnodes"
        vt.keep(mask, room)
        self._reset(vnode)

    @property
    def hash_vnodes(self) -> Mapping[int, VnodeTable]:
        """The vnodes as the lifecycle works them (``protocol.LifeRows``): a table with a
        lifecycle has hash vnodes only (``TableSpec`` refuses ``key_bits`` with one)."""
        return cast(Mapping[int, VnodeTable], self.tables)

    @property
    def cold_vnodes(self) -> Mapping[int, VnodeTable]:
        """A tiered table's cold vnodes (``tiers.py``); none for others."""
        return self.tiers.cold.tables if self.tiers is not None else {}

    def figures(self) -> dict[str, float]:
        return self.tiers.figures() if self.tiers is not None else {}


def _one_vnode(vnode: int, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``keys`` of one vnode as a request's arrays: vnodes, counts, keys."""
    return (frozen(np.array([vnode], np.int32)), frozen(np.array([keys.shape[0]], np.int64)),
            frozen(np.ascontiguousarray(keys, np.uint64)))


def exercise_steps(spec: TableSpec) -> None:
    """Run a table's steps once on a scratch ``VnodeSet`` (``exercise.steps``): what a training
    job's servers load before they register (``server/warmup.py``)."""
    exercise.steps(spec, VnodeSet)
