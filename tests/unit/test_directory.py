"""The directory of a table's vnodes by address (``store/directory.py``): the compiled
loops read every vnode's arrays where its entry says, so an entry must follow its vnode's
arrays through growth, loads, installs and a lifecycle's compaction, and the memory it
points into must stay alive until the vnode is entered again, and no longer."""

import gc
import weakref

import numpy as np
import pytest

from paramserver.errors import ProtocolError
from paramserver.routing.partition import route_push
from paramserver.routing.ring import Ring
from paramserver.store.loops import views
from paramserver.store.table import VnodeTable
from paramserver.store.vnodes import VnodeSet
from paramserver.tables.spec import TableSpec

RING = Ring.create([1], 8)
FTRL = {"name": "ftrl", "alpha": 0.1, "beta": 1.0, "l1": 0.5, "l2": 0.1}


def request(keys: np.ndarray, dim: int, layout: int = 0) -> tuple[np.ndarray, ...]:
    r = route_push(RING, keys, np.full((keys.size, dim), 0.25, np.float32), layout=layout, distinct=True)
    return r.parts[0].vnodes, r.parts[0].counts, r.keys, r.grads


def entries_follow_the_arrays(table: VnodeSet) -> None:
    d = table._dir.d
    for v, vt in table.tables.items():
        t = int(table.slot[v])
        assert d[t, views.KEYS] == vt.keys.ctypes.data and d[t, views.ROWS] == vt.rows.ctypes.data, v
        assert d[t, views.META] == vt._meta.ctypes.data and d[t, views.N_ROWS] == vt.rows.shape[0], v
        assert d[t, views.STRIDE] == vt.rows.strides[0] and d[t, views.LIMIT] == vt._limit(), v
        if vt.life is not None:
            assert d[t, views.LIFE] == vt.life.ctypes.data, v


def test_entries_follow_growth_loads_installs_and_compaction() -> None:
    spec = TableSpec("t", 2, optimizer=FTRL, lifecycle="track")
    table = VnodeSet(spec, RING.n_vnodes, range(RING.n_vnodes))
    rng = np.random.default_rng(1)
    reference: dict[int, np.ndarray] = {}
    for size in (3, 100, 5000, 30000):  # every vnode grows several times, some mid-request
        keys = np.unique(rng.integers(1, 2**63, size).astype(np.uint64))
        table.apply(*request(keys, 2))
        entries_follow_the_arrays(table)
    out = np.empty((keys.size, 2), np.float32)
    vnodes, counts, rkeys, _ = request(keys, 2)
    table.lookup(vnodes, counts, rkeys, out)
    reference = {int(k): out[i].copy() for i, k in enumerate(rkeys)}
    v = next(iter(table.tables))
    vt = table.tables[v]
    assert isinstance(vt, VnodeTable)
    stored, rows = vt.items()
    table.install(v, stored, rows)  # replaced whole by a copy of itself
    table.install(v, np.array([7], np.uint64), np.zeros((1, vt.width), np.float32), replace=False)
    table.keep(v, np.ones(len(table.tables[v]), bool), room=10 * len(table.tables[v]))  # compacted with room
    entries_follow_the_arrays(table)
    table.lookup(vnodes, counts, rkeys, out)
    assert all(np.array_equal(out[i], reference[int(k)]) for i, k in enumerate(rkeys))
    table.touch(vnodes, counts, rkeys, 1.0, 1.0, 0.0)  # the life rows are written through the directory too
    assert table.stored(vnodes, counts, rkeys).all()


def test_replaced_arrays_stay_alive_until_entered_and_are_let_go_after() -> None:
    table = VnodeSet(TableSpec("t", 1), RING.n_vnodes, range(RING.n_vnodes))
    table.apply(*request(np.arange(1, 200, dtype=np.uint64), 1))
    v = next(iter(table.tables))
    vt = table.tables[v]
    assert isinstance(vt, VnodeTable)
    old = weakref.ref(vt.slots)
    vt._grow(4 * vt.capacity)  # new arrays, not entered yet: the directory still points at the old ones
    gc.collect()
    assert old() is not None, "the directory must hold the arrays its addresses are in"
    table.refresh()
    gc.collect()
    assert old() is None, "a vnode's old arrays must be freed once it is entered again"
    entries_follow_the_arrays(table)


def test_dense_vnodes_are_read_through_the_directory() -> None:
    spec = TableSpec("d", 3, key_bits=12, optimizer={"name": "sgd", "lr": 1.0}, initializer={"name": "zeros"})
    table = VnodeSet(spec, RING.n_vnodes, range(RING.n_vnodes))
    keys = np.arange(0, 4096, 5, dtype=np.uint64)
    vnodes, counts, rkeys, grads = request(keys, 3, spec.layout)  # a dense table's keys are placed by range
    assert table.check(vnodes, counts, rkeys) < 0
    assert table.missing(vnodes, counts, rkeys) == keys.size
    table.apply(vnodes, counts, rkeys, grads)
    out = np.empty((keys.size, 3), np.float32)
    table.lookup(vnodes, counts, rkeys, out)
    np.testing.assert_array_equal(out, np.full((keys.size, 3), -0.25, np.float32))
    assert table.missing(vnodes, counts, rkeys) == 0


def test_a_dense_table_refuses_keys_outside_their_vnode_before_it_reads_for_them() -> None:
    """Keys routed by the hash layout are in the wrong vnodes of a dense table: every call
    that reads rows for them says so (a ``ProtocolError`` naming the key), none reads outside
    a vnode's rows (``missing`` did: a bus error, found while writing the test above)."""
    spec = TableSpec("d", 1, key_bits=12)
    table = VnodeSet(spec, RING.n_vnodes, range(RING.n_vnodes))
    vnodes, counts, rkeys, grads = request(np.arange(0, 4096, 3, dtype=np.uint64), 1)  # hash layout: misplaced
    out = np.empty((rkeys.size, 1), np.float32)
    for call in (lambda: table.missing(vnodes, counts, rkeys), lambda: table.lookup(vnodes, counts, rkeys, out),
                 lambda: table.apply(vnodes, counts, rkeys, grads)):
        with pytest.raises(ProtocolError, match="is not in its vnode of this dense table"):
            call()
