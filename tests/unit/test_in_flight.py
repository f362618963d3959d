"""The requests a client has in flight (``client/in_flight.py``): an answer takes its call out
once, deadlines fail what is late in the order due, a dead node's calls and a closing client's
are all handed back, and a long run of answered requests leaves no stale deadline behind."""

from __future__ import annotations

import math

from paramserver.client.in_flight import InFlight


def _nothing(msg, exc):  # type: ignore[no-untyped-def]
    pass


def test_an_answer_takes_its_call_out_once_and_a_stray_id_finds_nothing():
    flight = InFlight()
    flight.add(1, "tcp://a", _nothing, None, now=0.0)
    flight.add(2, "tcp://b", _nothing, 5.0, now=0.0)
    assert len(flight) == 2
    call = flight.answered(1)
    assert call is not None and call.address == "tcp://a" and call.due == math.inf
    assert flight.answered(1) is None  # a duplicate answer: nothing open any more
    assert flight.answered("1") is None and flight.answered(None) is None  # not a request's id
    assert len(flight) == 1


def test_deadlines_fail_the_late_in_the_order_due_and_say_when_the_next_is():
    flight = InFlight()
    flight.add(1, "tcp://a", _nothing, 3.0, now=10.0)  # due 13
    flight.add(2, "tcp://a", _nothing, 1.0, now=10.0)  # due 11
    flight.add(3, "tcp://b", _nothing, None, now=10.0)  # never
    assert flight.expired(10.5) == ([], 0.5)
    late, next_s = flight.expired(12.0)
    assert [c.within_s for c in late] == [1.0] and next_s == 1.0
    assert flight.answered(1) is not None  # answered in time: its deadline no longer fails anything
    late, next_s = flight.expired(100.0)
    assert late == [] and next_s == math.inf
    assert len(flight) == 1 and flight.answered(3) is not None


def test_a_dead_nodes_calls_and_a_closing_clients_are_handed_back():
    flight = InFlight()
    for rid, address in enumerate(["tcp://a", "tcp://b", "tcp://a"]):
        flight.add(rid, address, _nothing, 1.0, now=0.0)
    assert sorted(c.address for c in flight.to("tcp://a")) == ["tcp://a", "tcp://a"]
    assert flight.to("tcp://a") == []
    assert [c.address for c in flight.drain()] == ["tcp://b"]
    assert len(flight) == 0 and flight.expired(5.0) == ([], math.inf)  # no deadline outlives its call


def test_many_answered_requests_keep_the_deadlines_small_and_right():
    flight = InFlight()
    for rid in range(10_000):
        flight.add(rid, "tcp://a", _nothing, 1.0, now=float(rid))
        if rid != 9_000:
            assert flight.answered(rid) is not None
    assert len(flight._dues) <= 4 * len(flight) + 1024 + 1  # rebuilt from the calls still open
    late, _ = flight.expired(9_000.5)
    assert late == []
    late, _ = flight.expired(9_001.5)  # the next "due" may be an answered request's: one wake for nothing
    assert [c.due for c in late] == [9_001.0]
    assert flight.expired(1e9) == ([], math.inf) and len(flight) == 0
