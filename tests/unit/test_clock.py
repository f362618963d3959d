"""Vector clock and staleness gate, without sockets or time."""

import math

import pytest

from paramserver import ConfigError
from paramserver.consistency.clock import StalenessGate, VectorClock, parse_consistency


def test_parse_consistency():
    assert parse_consistency("bsp") == 0 and parse_consistency("ssp:3") == 3
    assert math.isinf(parse_consistency("asp")) and math.isinf(parse_consistency(None))
    for bad in ("ssp:-1", "ssp:x", "fast", 1.5, -2):
        with pytest.raises(ConfigError):
            parse_consistency(bad)


def test_joiners_start_at_the_minimum_and_the_dead_leave():
    v = VectorClock()
    v.set_members([1, 2])
    v.tick(1, 5)
    v.tick(2, 3)
    assert v.min() == 3
    v.set_members([1, 2, 3])
    assert v.clocks[3] == 3  # cannot drag the others back to 0
    v.leave(2)
    v.leave(3)
    assert v.min() == 5


@pytest.mark.parametrize("s", [0, 1, 3])
def test_gate_parks_until_the_slowest_is_within_s(s):
    gate = StalenessGate()
    gate.vector.set_members([1, 2])
    gate.vector.tick(1, 5)  # worker 2 is still at 0
    assert gate.admit(5, s, "early", now=0.0) is (5 - s <= 0)
    released = []
    for c in range(1, 6):
        gate.vector.tick(2, c)
        released += gate.release(now=float(c))
        if c >= 5 - s:
            break
    assert released == ["early"] or s >= 5
    assert gate.max_gap <= s


def test_asp_never_parks_and_records_what_it_saw():
    gate = StalenessGate()
    gate.vector.set_members([1, 2])
    gate.vector.tick(1, 9)
    assert gate.admit(9, math.inf, "x", now=0.0)
    assert gate.parked_count == 0 and gate.staleness_seen[9] == 1


def test_a_late_tick_does_not_bring_a_departed_worker_back():
    v = VectorClock()
    v.set_members([1, 2])
    v.tick(1, 4)
    v.set_members([2])  # worker 1 left; its last tick was still on the way
    v.tick(1, 5)
    assert 1 not in v.clocks and v.min() == 0



def test_workers_that_all_went_idle_come_back_where_they_were_not_at_0():
    """A coordinated checkpoint drains every worker: the vector is left empty.  Back at 0,
    or a worker ahead back at the others' minimum, their pulls (at their own clocks)
    waited for ever for ticks they had already sent (seen: {4: 127, 5: 131}, worker 4's
    pulls at 130 parked, worker 5's at 131 too)."""
    gate = StalenessGate()
    gate.vector.set_members([4, 5])
    gate.vector.tick(4, 130)  # ahead, within S=2 of its pulls
    gate.vector.tick(5, 127)
    gate.vector.set_members([5])  # 4 finished its shard first
    gate.vector.set_members([])  # 5 too: the checkpoint is written
    assert math.isinf(gate.vector.min()) and gate.vector.low() == 127
    gate.vector.set_members([4, 5])
    assert gate.vector.clocks == {4: 130, 5: 127}
    assert gate.admit(127, 2, "5's pull", now=0.0) and not gate.admit(130, 2, "4's pull", now=0.0)
    gate.vector.tick(5, 128)
    assert gate.release(now=1.0) == ["4's pull"] and gate.max_gap == 2  # not 130 clocks stale
    v = VectorClock()
    v.set_members([3])
    assert v.clocks == {3: 0}  # the first ever starts at 0


def test_a_tick_that_comes_after_an_idle_worker_left_is_kept_for_its_return():
    v = VectorClock()
    v.set_members([1, 2])
    v.tick(1, 4)
    v.tick(2, 4)
    v.set_members([2])  # 1 waits for a shard; its last tick was still on the way
    v.tick(1, 5)
    assert 1 not in v.clocks
    v.set_members([1, 2])
    assert v.clocks == {1: 5, 2: 4}
    v.leave(1)  # declared dead: forgotten
    v.tick(1, 9)
    v.set_members([1, 2])
    assert v.clocks == {1: 4, 2: 4}


def test_a_peer_cannot_park_pulls_without_bound():
    """Issue 28.6: a pull with a clock far ahead waited for ever, holding its arrays; a peer
    sending such pulls grew the server without bound."""
    import pytest

    from paramserver.consistency.clock import MAX_PARKED_PER_PEER, StalenessGate
    from paramserver.errors import ProtocolError

    gate = StalenessGate()
    gate.vector.set_members([1])
    for i in range(MAX_PARKED_PER_PEER):
        assert not gate.admit(10**9, 0, ("hostile", i), 0.0, b"hostile")
    with pytest.raises(ProtocolError, match="far ahead"):
        gate.admit(10**9, 0, ("hostile", -1), 0.0, b"hostile")
    assert not gate.admit(5, 0, ("reader", 0), 0.0, b"reader")  # another peer still parks
    gate.vector.tick(1, 5)
    assert gate.release(1.0) == [("reader", 0)]


def test_a_dead_readers_parked_pulls_are_forgotten():
    from paramserver.consistency.clock import StalenessGate

    gate = StalenessGate()
    gate.vector.set_members([1, 2])
    assert not gate.admit(9, 0, {"reader": 2}, 0.0, b"two")
    assert not gate.admit(9, 0, {"reader": 1}, 0.0, b"one")
    assert gate.drop_reader(2, lambda request: request["reader"]) == 1
    assert [p.request for p in gate.parked] == [{"reader": 1}]
