"""The ring: balance, minimal movement on joins and leaves, replicas, wire form."""

import numpy as np
import pytest

from paramserver import ConfigError, Ring
from paramserver.routing.ring import plan_moves

KEYS = np.random.default_rng(0).integers(0, 2**64 - 1, 400_000, dtype=np.uint64, endpoint=True)


@pytest.mark.parametrize("n_servers", [1, 2, 3, 5, 8, 16])
def test_load_is_balanced_within_15_percent_at_64_vnodes(n_servers):
    ring = Ring.create(list(range(10, 10 + n_servers)), vnodes_per_server=64)
    counts = np.bincount(ring.owner_of_keys(KEYS) - 10, minlength=n_servers)
    share = counts / counts.mean()
    assert share.min() >= 0.85 and share.max() <= 1.15, share


def test_sequential_keys_are_balanced_too():
    ring = Ring.create([1, 2, 3, 4], 64)
    counts = np.bincount(ring.owner_of_keys(np.arange(100_000, dtype=np.uint64)))[1:]
    assert counts.min() / counts.mean() >= 0.85 and counts.max() / counts.mean() <= 1.15


@pytest.mark.parametrize("n_servers", [1, 2, 4, 7])
def test_adding_a_server_moves_only_keys_that_change_owner(n_servers):
    ring = Ring.create(list(range(n_servers)), 64)
    bigger = ring.with_server(99)
    before, after = ring.owner_of_keys(KEYS), bigger.owner_of_keys(KEYS)
    moved = before != after
    assert (after[moved] == 99).all()  # every moved key went to the new server, none shuffled
    assert (after == 99).sum() == moved.sum()
    assert abs(moved.mean() - 1 / (n_servers + 1)) < 0.03
    assert bigger.version == ring.version + 1
    counts = np.bincount(bigger.owners)
    counts = counts[counts > 0]
    assert counts.max() - counts.min() <= 1  # still balanced to one vnode


def test_removing_a_server_moves_only_its_keys():
    ring = Ring.create([1, 2, 3, 4], 64)
    smaller = ring.without_server(3)
    before, after = ring.owner_of_keys(KEYS), smaller.owner_of_keys(KEYS)
    moved = before != after
    assert (before[moved] == 3).all() and not (after == 3).any()
    counts = np.bincount(smaller.owners)[[1, 2, 4]]
    assert counts.max() - counts.min() <= 1


def test_replicas_are_distinct_servers_clockwise():
    ring = Ring.create([1, 2, 3], 64)
    for v in range(ring.n_vnodes):
        reps = ring.replicas(v, 3)
        assert reps[0] == ring.owners[v] and len(set(reps)) == 3
    assert Ring.create([5], 4).replicas(0, 3) == [5]  # cannot exceed the server count


def test_wire_round_trip_and_errors():
    ring = Ring.create([4, 9], 8).with_server(11)
    back = Ring.from_wire(ring.to_wire())
    np.testing.assert_array_equal(back.owners, ring.owners)
    assert back.version == ring.version
    with pytest.raises(ConfigError, match="at least one server"):
        Ring.create([])
    with pytest.raises(ConfigError, match="already on the ring"):
        ring.with_server(4)
    with pytest.raises(ConfigError, match="last server"):
        Ring.create([1]).without_server(1)


@pytest.mark.parametrize("n_servers", [2, 3, 5])
def test_chains_are_distinct_and_backups_spread_over_every_other_server(n_servers):
    ring = Ring.create(list(range(n_servers)), 60)
    width = min(3, n_servers)
    for v in range(ring.n_vnodes):
        chain = ring.replicas(v, 3)
        assert len(chain) == width and len(set(chain)) == width
    for server in range(n_servers):  # whose vnodes does each survivor back up? all of them, evenly
        backups = ring.chains[ring.vnodes_of(server), 1]
        counts = np.bincount(backups, minlength=n_servers)
        others = np.delete(counts, server)
        assert counts[server] == 0 and others.max() - others.min() <= 1


def test_failover_promotes_backups_then_refill_restores_the_chains():
    ring = Ring.create([1, 2, 3, 4], 64)
    promoted = ring.without_server(2)
    for v in ring.vnodes_of(2):  # the first backup takes over: it already holds the data
        assert promoted.owners[v] == ring.chains[v, 1]
    assert not (promoted.chains == 2).any() and promoted.version == ring.version + 1
    full = promoted.refilled()
    assert full.version == promoted.version + 1
    assert (full.chains >= 0).all() and all(len(set(full.replicas(v, 3))) == 3 for v in range(full.n_vnodes))
    np.testing.assert_array_equal(full.owners, promoted.owners)  # refilling never moves a primary
    assert full.refilled() is full
    per_server = np.bincount(full.chains.ravel())[[1, 3, 4]]
    assert per_server.max() - per_server.min() <= 3


def test_plan_moves_copies_only_what_a_new_holder_lacks():
    ring = Ring.create([1, 2, 3], 64)
    bigger = ring.with_server(4)
    moves = plan_moves(ring, bigger, {"r1": 1, "r2": 2})
    assert moves and all(dest == 4 for _, _, _, dest in moves)
    for source, table, v, _dest in moves:
        assert source == ring.owners[v]
        r = 1 if table == "r1" else 2
        assert 4 in bigger.chains[v, :r] and 4 not in ring.chains[v, :r]
    held = {(t, v) for _, t, v, _ in moves}
    assert held == {(t, v) for t, r in (("r1", 1), ("r2", 2)) for v in bigger.held_by(4, r)}
    # failover: the promoted ring needs no copy at all, the refilled one only new backups
    promoted = ring.without_server(2)
    assert plan_moves(ring, promoted, {"r3": 3}, lost={2}) == []
    full = promoted.refilled()
    moves = plan_moves(ring, full, {"r2": 2}, lost={2})
    assert moves
    for source, _, v, dest in moves:  # from the new primary to whoever lacks the data
        assert source == full.owners[v] != 2 and dest not in (2, source)
        assert 2 in ring.chains[v, :2] and dest not in ring.chains[v, :2]
