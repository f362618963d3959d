"""The ring: balance, minimal movement on joins and leaves, replicas, wire form."""

import numpy as np
import pytest

from paramserver import ConfigError, Ring

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
    assert bigger.epoch == ring.epoch + 1
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
    assert back.epoch == ring.epoch
    with pytest.raises(ConfigError, match="at least one server"):
        Ring.create([])
    with pytest.raises(ConfigError, match="already on the ring"):
        ring.with_server(4)
    with pytest.raises(ConfigError, match="last server"):
        Ring.create([1]).without_server(1)
