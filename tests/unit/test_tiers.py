"""A table over its memory budget (``store/tiers.py``): the rows past it go to disk and
come back, and nothing a request, an export or a delta sees changes."""

from __future__ import annotations

import errno
import logging

import numpy as np
import pytest

from paramserver.config import parse_bytes
from paramserver.errors import ConfigError
from paramserver.server.data import TIER_PART, _parts
from paramserver.store import disk
from paramserver.store import readahead as read_policy
from paramserver.store.disk import DiskFullError
from paramserver.store.loops.life import VER
from paramserver.store.readahead import FAST_PAGE_S, PAGE_SHIFT, SLOW_ROW_S, Policy, readahead
from paramserver.store.vnodes import VnodeSet
from paramserver.tables.spec import TableSpec

N_VNODES = 8


def _requests(seed: int, n: int, batch: int = 3000, space: int = 60_000):
    """Requests of heavy-tailed keys spread over the vnodes (by their high bits, as the ring's)."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        keys = np.unique(rng.zipf(1.3, batch).astype(np.uint64) % np.uint64(space) * np.uint64(0x9E3779B97F4A7C15))
        vn = (keys >> np.uint64(61)).astype(np.int32)
        order = np.argsort(vn, kind="stable")
        keys, vn = keys[order], vn[order]
        vnodes, counts = np.unique(vn, return_counts=True)
        yield vnodes.astype(np.int32), counts.astype(np.int64), keys, rng.standard_normal((keys.size, 1))


def _drive(table: VnodeSet, seed: int = 0, n: int = 150, prefetch: bool = False) -> list[np.ndarray]:
    """Pull then push each request, as a worker does (``prefetch``: its keys named
    first, as a worker does a batch ahead); every pull's values."""
    pulls = []
    for vnodes, counts, keys, grads in _requests(seed, n):
        if prefetch:
            table.prefetch(vnodes, counts, keys)
        out = np.empty((keys.size, table.spec.dim), np.float32)
        table.lookup(vnodes, counts, keys, out)
        table.settle()
        pulls.append(out)
        table.apply(vnodes, counts, keys, np.repeat(grads, table.spec.dim, axis=1).astype(np.float32))
        if table.life is not None:  # as the data plane stamps a push's keys with the epoch, then settles
            table.life.touched(vnodes, counts, keys, None)
        table.settle()
    return pulls


def _rows(table: VnodeSet) -> dict[int, bytes]:
    out = {}
    for v in range(N_VNODES):
        keys, rows = table.rows(v)
        out.update({int(k): r.tobytes() for k, r in zip(keys, rows, strict=True)})
    return out


@pytest.mark.parametrize("spec", [TableSpec("t", optimizer="ftrl"),
                                  TableSpec("t", 4, optimizer="adagrad", initializer={"name": "normal", "std": 0.1},
                                            seed=3),
                                  TableSpec("t", optimizer="ftrl", storage="bf16")], ids=["ftrl", "adagrad4", "bf16"])
def test_every_pull_and_row_is_the_unbudgeted_tables_bit_for_bit(spec, tmp_path):
    plain = VnodeSet(spec, N_VNODES, range(N_VNODES))
    budget = 48 << 10
    tiered = VnodeSet(spec, N_VNODES, range(N_VNODES), memory=budget, cold_dir=str(tmp_path))
    expected, got = _drive(plain), _drive(tiered)
    for a, b in zip(expected, got, strict=True):
        np.testing.assert_array_equal(a, b)
    assert _rows(plain) == _rows(tiered)
    assert len(plain) == len(tiered) == sum(tiered.held(v) for v in range(N_VNODES))
    figures = tiered.figures()
    assert figures["cold_keys"] > len(tiered) / 2, figures  # most of the table was on disk ...
    assert figures["promoted"] > 0 and figures["demoted"] > figures["cold_keys"]  # ... and came back
    assert 0 < figures["hit_rate"] < 1
    assert tiered.tiers is not None and tiered.tiers.hot_bytes <= budget


def test_keys_named_ahead_have_their_cold_pages_read_and_change_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(read_policy, "SLOW_ROW_S", 0.0)  # as if every row read back came from the disk ...
    monkeypatch.setattr(read_policy, "FAST_PAGE_S", 0.0)  # ... and every page read ahead too
    spec = TableSpec("t", optimizer="ftrl", lifecycle="track")
    plain = VnodeSet(spec, N_VNODES, range(N_VNODES))
    tiered = VnodeSet(spec, N_VNODES, range(N_VNODES), memory=48 << 10, cold_dir=str(tmp_path))
    expected, got = _drive(plain), _drive(tiered, prefetch=True)
    for a, b in zip(expected, got, strict=True):
        np.testing.assert_array_equal(a, b)
    assert _rows(plain) == _rows(tiered)
    readahead.wait()
    figures = tiered.figures()
    assert figures["prefetched"] > figures["promoted"] > 0 and figures["prefetch_pages"] > 0, figures
    assert plain.prefetch(*next(_requests(0, 1))[:3]) is None  # a table without tiers: nothing to read
    named: list[np.ndarray] = []
    monkeypatch.setattr(readahead, "submit", lambda pages, held, policy: named.append(pages))
    vnodes, counts, keys, _ = next(_requests(7, 1))
    cold, reading = tiered.prefetch(vnodes, counts, keys)
    assert cold > 0 and reading and len(named) == 1
    pages, found = set(named[0].tolist()), 0
    for v, k in zip(np.repeat(vnodes, counts), keys, strict=True):  # each cold key's slot and life row were named
        cold = tiered.cold_vnodes.get(int(v))
        at = np.flatnonzero(cold.keys == k) if cold is not None else []
        if len(at):
            found += 1
            assert (cold.keys.ctypes.data + int(at[0]) * cold.keys.strides[0]) >> PAGE_SHIFT in pages
            assert (cold.life.ctypes.data + int(at[0]) * cold.life.strides[0]) >> PAGE_SHIFT in pages
    assert found > 0


def test_a_table_reads_ahead_while_its_rows_come_from_the_disk_and_stops_once_they_are_cached(tmp_path):
    policy = Policy()
    assert not policy.wanted()  # nothing measured: no reading ahead
    for _ in range(50):
        policy.promoted(100, 100 * SLOW_ROW_S / 4)  # rows read back from the page cache
    assert not policy.wanted()
    for _ in range(50):
        policy.promoted(100, 100 * SLOW_ROW_S * 4)  # from the disk: read ahead ...
    assert policy.wanted() and policy.wanted()
    policy.promoted(100, 100 * SLOW_ROW_S / 100)  # (rows read back fast because of it do not stop it)
    assert policy.wanted()
    for _ in range(50):
        policy.read(1000, 1000 * FAST_PAGE_S * 4)  # pages read ahead come from the disk: go on
    assert policy.wanted()
    for _ in range(50):
        policy.read(1000, 1000 * FAST_PAGE_S / 4)  # ... until they were cached already
    assert not policy.wanted() and policy.row_s is None  # the rows' cost is measured afresh
    tiered = VnodeSet(TableSpec("t", optimizer="ftrl"), N_VNODES, range(N_VNODES), memory=48 << 10,
                      cold_dir=str(tmp_path))
    _drive(tiered, n=30)
    assert tiered.prefetch(*next(_requests(0, 1))[:3]) == (0, False)  # cached rows: it does nothing


def test_a_table_without_a_budget_has_no_tiers_and_the_servers_default_applies(tmp_path):
    spec = TableSpec("t", optimizer="ftrl")
    assert VnodeSet(spec, 2, [0, 1]).tiers is None and VnodeSet(spec, 2, [0, 1]).figures() == {}
    served = VnodeSet(spec, 2, [0, 1], memory=1 << 20, cold_dir=str(tmp_path))
    assert served.tiers is not None and served.tiers.budget == 1 << 20
    own = VnodeSet(TableSpec("t", optimizer="ftrl", memory="2M"), 2, [0, 1], memory=1 << 20, cold_dir=str(tmp_path))
    assert own.tiers is not None and own.tiers.budget == 2 << 20  # the table's own budget wins
    dense = VnodeSet(TableSpec("d", key_bits=10), 2, [0, 1], memory=1 << 20)
    assert dense.tiers is None  # a server's default leaves dense tables in memory ...
    capped = VnodeSet(TableSpec("c", lifecycle="cap_keys=100"), 2, [0, 1], memory=1 << 20)
    assert capped.tiers is None  # ... and tables whose lifecycle drops keys


def test_deltas_and_full_exports_see_the_cold_rows(tmp_path):
    spec = TableSpec("t", optimizer="ftrl", lifecycle="track")
    plain = VnodeSet(spec, N_VNODES, range(N_VNODES))
    tiered = VnodeSet(spec, N_VNODES, range(N_VNODES), memory=48 << 10, cold_dir=str(tmp_path))
    primary = np.ones(N_VNODES, bool)
    for table in (plain, tiered):
        _drive(table, n=60)
        assert table.life is not None
        table.life.changes(primary, 0)  # a base: the next epoch starts
        _drive(table, seed=1, n=40)
    assert tiered.tiers is not None and tiered.tiers.cold_keys > 0
    deltas = []
    for table in (plain, tiered):
        assert table.life is not None
        parts, deleted, whole = table.life.changes(primary, 2)
        deltas.append({int(k): r.tobytes() for _, keys, rows in parts for k, r in zip(keys, rows, strict=True)})
        assert whole and deleted.size == 0
    assert deltas[0] == deltas[1] and 0 < len(deltas[0]) < len(plain)
    cold_changed = [vt.changed(VER, 2.0)[0].size for vt in tiered.cold_vnodes.values()]
    assert sum(cold_changed) > 0  # some of the delta was read from disk


def test_a_full_disk_keeps_the_rows_in_memory_and_says_so(tmp_path, monkeypatch, caplog):
    spec = TableSpec("t", optimizer="ftrl")
    plain = VnodeSet(spec, N_VNODES, range(N_VNODES))
    tiered = VnodeSet(spec, N_VNODES, range(N_VNODES), memory=48 << 10, cold_dir=str(tmp_path))

    def no_room(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(disk.os, "posix_fallocate", no_room)
    with caplog.at_level(logging.ERROR):
        expected, got = _drive(plain, n=60), _drive(tiered, n=60)
    for a, b in zip(expected, got, strict=True):
        np.testing.assert_array_equal(a, b)
    assert _rows(plain) == _rows(tiered)  # nothing lost: every row stayed in memory
    assert tiered.figures()["disk_full"] > 0 and tiered.figures()["cold_keys"] == 0
    assert "has no room" in caplog.text and "--cold-dir" in caplog.text


def test_a_cold_directory_that_cannot_be_made_is_said_with_the_flag(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="cold directory .* cannot be created.*--cold-dir"):
        VnodeSet(TableSpec("t", memory="1M"), 2, [0, 1], cold_dir=str(blocker / "sub"))


def test_vnodes_that_leave_or_are_replaced_take_their_cold_rows_with_them(tmp_path):
    spec = TableSpec("t", optimizer="ftrl")
    tiered = VnodeSet(spec, N_VNODES, range(N_VNODES), memory=48 << 10, cold_dir=str(tmp_path))
    _drive(tiered, n=60)
    tiers = tiered.tiers
    assert tiers is not None and tiers.cold.tables.get(3) is not None and len(tiers.cold.tables[3])
    total = len(tiered)
    held3 = tiered.held(3)
    tiered.set_vnodes([v for v in range(N_VNODES) if v != 3])
    assert 3 not in tiers.cold.tables and len(tiered) == total - held3
    keys, rows = tiered.rows(5)
    tiered.install(5, keys[:10], rows[:10])  # a copy replaces the vnode whole, in both tiers
    assert tiered.held(5) == 10 and 5 not in tiers.cold.tables


def test_memory_budgets_are_checked_with_their_rule():
    assert TableSpec("t", memory="512M").memory == 512 << 20
    assert TableSpec.from_wire(TableSpec("t", memory=4096).to_wire()).memory == 4096
    assert parse_bytes("x", "1.5G") == 3 << 29 and parse_bytes("x", "4096") == 4096
    for bad in ("lots", "-1", -5, "1.5Q"):
        with pytest.raises(ConfigError, match="must be a size"):
            TableSpec("t", memory=bad)
    with pytest.raises(ConfigError, match="needs a hash table"):
        TableSpec("t", memory="1M", key_bits=12)
    with pytest.raises(ConfigError, match="drops keys: keep one of them"):
        TableSpec("t", memory="1M", lifecycle="cap_keys=1000")


def test_a_full_disk_error_names_the_directory_and_the_fixes(tmp_path, monkeypatch):
    monkeypatch.setattr(disk.os, "posix_fallocate", lambda fd, o, n: (_ for _ in ()).throw(OSError(errno.EDQUOT, "q")))
    arena = disk.DiskArena(str(tmp_path), "t")
    with pytest.raises(DiskFullError, match=f"{tmp_path}.*free space there, give another with --cold-dir"):
        arena.zeros((100,), np.uint8)
    assert arena.nbytes == 0 and not list(tmp_path.iterdir())  # the file was unlinked at once


def test_a_tiered_pull_is_served_in_parts_that_cover_it_and_never_cut_a_vnode():
    counts = np.array([10_000, 3, 20_000, 1, 1, 40_000, 500], np.int64)
    total = int(counts.sum())
    assert _parts(counts[:2], 10_003) == [(0, 2, 0, 10_003)]  # a small pull: one part
    parts = _parts(counts, total)
    assert len(parts) > 2 and parts[0][0] == 0 and parts[-1][1] == 7 and parts[-1][3] == total
    ends = np.concatenate([[0], np.cumsum(counts)])
    for (lo, hi, a, b), after in zip(parts, parts[1:] + [None], strict=True):
        assert lo < hi and (a, b) == (ends[lo], ends[hi])  # whole segments, their keys
        assert after is None or after[0] == hi  # each part starts where the last ended
        assert b - a <= TIER_PART or hi - lo == 1  # at most a part's keys, or one segment bigger than that
