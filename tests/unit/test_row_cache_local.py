"""A row cache that trains its rows (``apply=local``): a server merges a row's change
(``tables/push_ops.py``) to the row its steps would have left, and the cache reads, trains,
sends and refreshes its rows as the table's rule would (``client/row_cache.py``,
``store/loops/cache.py``)."""

import numpy as np
import pytest

from paramserver.client.row_cache import RowCache, RowCacheSpec
from paramserver.errors import ConfigError, ProtocolError
from paramserver.server.requests import merge_op, state_read
from paramserver.store.vnodes import VnodeSet
from paramserver.tables.optim import FTRL, SGD, AdaGrad, Adam, FtrlAdagrad, Normal, Zeros
from paramserver.tables.push_ops import OP_MERGE, merge_refusal
from paramserver.tables.spec import TableSpec
from paramserver.wire.message import Message, Op

SERVER = 3
RULES = [(1, SGD(lr=0.1)), (3, AdaGrad(lr=0.1)), (1, FTRL(l1=0.05)), (2, FTRL(l1=0.05)),
         (4, FtrlAdagrad(l1=0.01, lr=0.05))]


def _table(dim, optimizer, key_bits=0):
    init = Zeros() if isinstance(optimizer, FTRL) or dim == 1 else Normal(std=0.01)
    return VnodeSet(TableSpec("t", dim, optimizer=optimizer, initializer=init, key_bits=key_bits), 1, [0])


def _seg(keys):
    return np.zeros(1, np.int32), np.array([keys.shape[0]], np.int64)


def _whole(table, keys):
    out = np.empty((keys.shape[0], table.spec.width), np.float32)
    table.lookup(*_seg(keys), keys, out)
    return out


def _values(table, keys):
    out = np.empty((keys.shape[0], table.spec.dim), np.float32)
    table.lookup(*_seg(keys), keys, out)
    return out


def _grads(rng, keys, dim, steps):
    return [rng.standard_normal((keys.shape[0], dim)).astype(np.float32) for _ in range(steps)]


@pytest.mark.parametrize("key_bits", [0, 8])
@pytest.mark.parametrize(("dim", "optimizer"), RULES)
def test_a_merged_change_leaves_the_row_the_steps_left(dim, optimizer, key_bits):
    keys = np.array([3, 7, 11, 200], np.uint64)
    stepped, merged = _table(dim, optimizer, key_bits), _table(dim, optimizer, key_bits)
    rng = np.random.default_rng(dim)
    start = _whole(merged, keys)  # never pushed: each row as it would start
    for g in _grads(rng, keys, dim, 6):
        stepped.apply(*_seg(keys), keys, g)
    change = _whole(stepped, keys) - start
    merged.apply(*_seg(keys), keys, change, OP_MERGE)
    np.testing.assert_allclose(_whole(merged, keys), _whole(stepped, keys), rtol=2e-6, atol=2e-7)
    np.testing.assert_allclose(_values(merged, keys), _values(stepped, keys), rtol=2e-6, atol=2e-7)


def test_two_workers_changes_add_up():
    keys = np.array([5, 6], np.uint64)
    table = _table(1, SGD(lr=1.0))
    table.apply(*_seg(keys), keys, np.array([[1.0], [2.0]], np.float32), OP_MERGE)
    table.apply(*_seg(keys), keys, np.array([[0.5], [-2.0]], np.float32), OP_MERGE)
    assert _values(table, keys).ravel().tolist() == [1.5, 0.0]


@pytest.mark.parametrize(("spec", "said"), [
    (TableSpec("t", 1, optimizer=Adam()), "does not add"),
    (TableSpec("t", 1, optimizer=FTRL(), storage="bf16"), "rows are bf16"),
    (TableSpec("t", 1, optimizer=FTRL(), lifecycle="track"), "lifecycle"),
    (TableSpec("t", 1, optimizer=FTRL(), aggregate=True, consistency="bsp"), "aggregates"),
])
def test_a_table_whose_rows_do_not_merge_is_refused_saying_why(spec, said):
    assert said in merge_refusal(spec)

    class Held:  # what the server's checks read of a table
        pass

    held = Held()
    held.spec = spec  # type: ignore[attr-defined]
    with pytest.raises(ProtocolError, match=f"cannot merge.*{said}"):
        merge_op(held)  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match="cannot merge"):
        state_read(held, Message({"op": Op.PULL.value, "table": "t", "state": True}, []))  # type: ignore[arg-type]
    assert merge_refusal(TableSpec("t", 3, optimizer=AdaGrad())) == ""


@pytest.mark.parametrize("filters", ["keys", "lossless", "compact", "push=sigmod,int8;reply=fp16"])
def test_filters_do_not_refuse_a_cache_that_trains_its_rows(filters):
    assert merge_refusal(TableSpec("t", 1, optimizer=FTRL(), filters=filters)) == ""


def _local(s, dim, optimizer, rows=64):
    return RowCache(RowCacheSpec(s=s, rows=rows, apply="local"), dim, dim + optimizer.state_width(dim),
                    (dim, optimizer.kind, optimizer.params()))


def _pull(cache, keys, server, version):
    """A pull through ``cache``: the misses answered with ``server``'s whole rows at ``version``."""
    out = np.full((keys.size, cache.store.rule[0]), np.nan, np.float32)
    read = cache.read(keys, out, 1)
    miss = np.flatnonzero(read.slots < 0)
    whole = _whole(server, keys[miss])
    cache.answered(read, SERVER, version, keys[miss], whole)
    out[miss] = whole[:, :out.shape[1]]
    cache.refresh(keys, out)
    return out


@pytest.mark.parametrize(("dim", "optimizer"), RULES)
def test_a_cache_trains_its_rows_by_the_rule_and_sends_their_change_every_s_uses(dim, optimizer):
    s = 3
    keys = np.array([4, 8, 15], np.uint64)
    server, stepped = _table(dim, optimizer), _table(dim, optimizer)
    cache = _local(s, dim, optimizer)
    for _ in range(2):  # the second pull admits them
        _pull(cache, keys, server, version=0)
    rng = np.random.default_rng(7)
    for step, g in enumerate(_grads(rng, keys, dim, 2 * s + 1)):
        read = _pull(cache, keys, server, version=0)
        np.testing.assert_allclose(read, _values(stepped, keys), rtol=2e-6, atol=2e-7,
                                   err_msg="a held row reads as the steps so far left it")
        sends = cache.write(keys, g, None)
        stepped.apply(*_seg(keys), keys, g)
        if (step + 1) % s:
            assert sends == [], "gathered until s uses"
            continue
        ((op, sent, change, _),) = sends
        assert op == "merge" and sorted(sent.tolist()) == keys.tolist() and change.shape == (3, server.spec.width)
        server.apply(*_seg(sent), sent, change, OP_MERGE)
        np.testing.assert_allclose(_whole(server, keys), _whole(stepped, keys), rtol=5e-6, atol=5e-7)
    ((op, sent, change, _),) = cache.take()  # the last step's change, at a flush
    assert op == "merge"
    server.apply(*_seg(sent), sent, change, OP_MERGE)
    np.testing.assert_allclose(_values(server, keys), _values(stepped, keys), rtol=5e-6, atol=5e-7)
    assert cache.take() == [] and cache.stats()["sums_held"] == 0


def test_a_row_read_again_keeps_the_change_not_sent_and_a_key_not_held_is_pushed_as_its_gradient():
    opt = FTRL(l1=0.0)
    keys = np.array([1, 2], np.uint64)
    server, own, expected = _table(1, opt), _table(1, opt), _table(1, opt)
    cache = _local(10, 1, opt)
    for _ in range(2):
        _pull(cache, keys, server, version=0)
    g = np.array([[0.5], [-1.0]], np.float32)
    assert cache.write(keys, g, None) == []
    start = _whole(own, keys)
    own.apply(*_seg(keys), keys, g)
    other = np.array([[0.25], [0.25]], np.float32)  # another worker's step, on the server meanwhile
    for table in (server, expected):
        table.apply(*_seg(keys), keys, other)
    expected.apply(*_seg(keys), keys, _whole(own, keys) - start, OP_MERGE)
    cache.versions.answered(0, 11, cache.pushes)  # 11 versions on: the rows are read again
    got = _pull(cache, keys, server, version=11)
    assert cache.stats()["misses"] >= 2
    # the server's row with this worker's change not sent merged in: the other's step and its own
    np.testing.assert_allclose(got, _values(expected, keys), rtol=2e-6)
    assert not np.allclose(got, _values(server, keys)) and not np.allclose(got, _values(own, keys))
    sends = {op: (sent, rows) for op, sent, rows, _ in
             cache.write(np.array([99], np.uint64), np.array([[2.0]], np.float32), None)}
    assert sends["update"][0].tolist() == [99] and sends["update"][1].tolist() == [[2.0]]
    assert sorted(sends["merge"][0].tolist()) == [1, 2], "their change is 11 versions old: due"


def test_the_spec_takes_apply_and_names_the_fix():
    assert RowCacheSpec.parse("s=4,apply=local").apply == "local"
    assert RowCacheSpec.parse("s=4").apply == "auto" and str(RowCacheSpec.parse("s=4,rows=64")) == "s=4,rows=64"
    assert str(RowCacheSpec.parse("s=4,rows=64,apply=server")) == "s=4,rows=64,apply=server"
    with pytest.raises(ConfigError, match="apply must be one of"):
        RowCacheSpec.parse("s=4,apply=remote")


def test_a_merges_answer_refreshes_the_rows_still_held_keeping_their_change_since():
    opt = FTRL(l1=0.0)
    keys = np.array([1, 2], np.uint64)
    server, expected = _table(1, opt), _table(1, opt)
    cache = _local(2, 1, opt)
    for _ in range(2):  # the second pull admits them
        _pull(cache, keys, server, version=0)
    g = np.array([[0.5], [-1.0]], np.float32)
    assert cache.write(keys, g, None) == []
    ((op, sent, change, _),) = cache.write(keys, g, None)  # s = 2 uses: the change goes out
    assert op == "merge"
    pushes = cache.pushes
    other = np.array([[0.25], [0.25]], np.float32)  # another worker's step, applied first
    for table in (server, expected):
        table.apply(*_seg(keys), keys, other)
        table.apply(*_seg(sent), sent, change, OP_MERGE)
    since = np.array([[2.0], [0.0]], np.float32)  # a step taken while the merge was away
    before = _whole(expected, keys)
    assert cache.write(keys, since, None) == []
    own = _table(1, opt)
    own.apply(*_seg(keys), keys, g)
    own.apply(*_seg(keys), keys, g)
    start = _whole(own, keys)
    own.apply(*_seg(keys), keys, since)
    expected.apply(*_seg(keys), keys, _whole(own, keys) - start, OP_MERGE)
    answer_keys = np.array([1, 2, 77], np.uint64)  # 77: never held, not admitted by an answer
    rows = np.concatenate([before, np.zeros((1, before.shape[1]), np.float32)])
    cache.merged(SERVER, 5, answer_keys, rows, pushes, cache.ring_version)
    misses = cache.stats()["misses"]
    got = _pull(cache, keys, server, version=5)
    assert cache.stats()["misses"] == misses, "the refreshed rows are hits: no pull of their own"
    np.testing.assert_allclose(got, _values(expected, keys), rtol=2e-6,
                               err_msg="the server's merged row plus the step taken since")
    out = np.full((1, 1), np.nan, np.float32)
    assert cache.read(np.array([77], np.uint64), out, cache.ring_version).slots[0] < 0
    stale = np.full_like(rows, 9.0)  # an answer older than the rows held is not taken
    cache.merged(SERVER, 4, answer_keys, stale, pushes, cache.ring_version)
    np.testing.assert_allclose(_pull(cache, keys, server, version=5), got)
    cache.merged(SERVER, 6, answer_keys, stale, pushes, cache.ring_version + 1)  # another ring's
    np.testing.assert_allclose(_pull(cache, keys, server, version=6), got)


def test_merges_ask_for_their_rows_back_only_while_another_writer_pushed_within_s():
    keys = np.array([1, 2], np.uint64)
    cache = _local(4, 1, FTRL(l1=0.0))
    assert cache.wants_rows(), "nothing heard yet: as if others wrote"
    out = np.empty((2, 3), np.float32)
    rows = np.zeros((2, 3), np.float32)

    def answer(version, foreign):
        cache.answered(cache.read(keys, out[:, :1], 0), SERVER, version, keys, rows, foreign)

    answer(10, 0)  # no one else ever pushed there: alone, the rows a merge leaves are its own
    assert not cache.wants_rows()
    answer(12, 9)  # another writer, 3 versions ago: within s = 4
    assert cache.wants_rows()
    cache.merged(SERVER, 20, keys, rows, cache.pushes, cache.ring_version, 15)  # 5 versions quiet
    assert not cache.wants_rows()
    answer(21, None)  # a server that does not say: as if others wrote
    assert cache.wants_rows()
    assert not _cache_by_sums().wants_rows(), "a cache of sums has no rows to read back"


def _cache_by_sums():
    return RowCache(RowCacheSpec(s=4, rows=64, apply="server"), 1, 1)


def test_a_server_says_for_any_writer_the_last_version_another_made_in_constant_room():
    from paramserver.server.state import LastWrites

    last = LastWrites()
    assert last.foreign(7) == 0, "no push yet"
    seen = {}  # writer -> its last version: what the two slots stand for
    pushes = [7, 7, 8, 7, 9, 9, -1, 7, 7, 8]
    for version, writer in enumerate(pushes, start=1):
        last.wrote(writer, version)
        seen[writer] = version
        for asking in (7, 8, 9, 10, -1):
            expected = max([v for w, v in seen.items() if w != asking or w < 0], default=0)
            assert last.foreign(asking) == expected, (version, writer, asking)
