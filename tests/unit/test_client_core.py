"""The client's sans-IO core (``client/core.py``): the decisions ``Client`` and the
simulation's workers both run, checked here without a network."""

import numpy as np
import pytest

from paramserver.client.core import (
    Gather,
    NoAnswerError,
    Piece,
    Scheduler,
    Sequencer,
    Verdict,
    View,
    call_header,
    decide,
    request,
    route,
)
from paramserver.errors import NodeLostError, QuotaError, StaleRingError
from paramserver.routing.ring import Ring
from paramserver.wire.message import Message, Op

SCHED = Scheduler("tcp://s:1", 3.0)


def _piece(version=1):
    keys = np.array([1, 2], np.uint64)
    return Piece(7, version, keys, np.zeros((2, 1), np.float32), np.zeros(1, np.int32), np.array([2], np.int64))


def _error(code, **fields):
    return Message({"op": Op.ERROR.value, "code": code, "error": "x", **fields}, [])


def test_a_retry_keeps_its_seq_and_carries_the_acked_watermark():
    seqs = Sequencer()
    first, second = seqs.take(), seqs.take()
    header = call_header(Op.PUSH, "t", node_id=4, worker_clock=2, seq=second, token="k")
    assert header == {"op": "push", "table": "t", "clock": 2, "reader": 4, "sender": 4, "seq": 2, "sender_token": "k"}
    out, arrays = request(Op.PUSH, header, _piece(3), 5, seqs)
    assert out["seq"] == second and out["ring_version"] == 3 and out["acked"] == first - 1 and len(arrays) == 4
    seqs.settled(first)  # the first is answered: the second still in flight holds the watermark below it
    assert request(Op.PUSH, header, _piece(), 6, seqs)[0]["acked"] == first
    seqs.settled(second)
    assert seqs.acked() == second
    pull, arrays = request(Op.PULL, call_header(Op.PULL, "t", node_id=4), _piece(), 0, seqs)
    assert "acked" not in pull and "seq" not in pull and len(arrays) == 3


@pytest.mark.parametrize("code", ["stale_ring", "node_lost"])
def test_a_moved_ring_resends_at_once_and_an_unmoved_one_backs_off(code):
    newer = decide(_piece(1), 0, _error(code), None, ring_version=2, now=0.0, deadline=30.0, scheduler=SCHED)
    assert newer.verdict is Verdict.RESEND and newer.delay_s == 0.0 and not newer.refresh
    same = [decide(_piece(2), t, _error(code), None, ring_version=2, now=0.0, deadline=30.0, scheduler=SCHED)
            for t in (0, 3, 10)]
    assert [d.delay_s for d in same] == [0.01, 0.08, 0.5] and all(d.verdict is Verdict.RESEND for d in same)
    ahead = decide(_piece(2), 0, _error(code, ring_version=5), None, ring_version=2, now=0.0, deadline=30.0,
                   scheduler=SCHED)
    assert ahead.refresh, "the server knows a newer ring: ask the scheduler for it"


def test_no_answer_is_resent_until_the_deadline_then_fails():
    lost = NoAnswerError("server 7 did not answer")
    assert isinstance(lost, NodeLostError)
    assert decide(_piece(), 1, None, lost, ring_version=1, now=29.0, deadline=30.0,
                  scheduler=SCHED).verdict is Verdict.RESEND
    late = decide(_piece(), 1, None, lost, ring_version=1, now=30.0, deadline=30.0, scheduler=SCHED)
    assert late.verdict is Verdict.FAIL and late.error is lost


def test_other_errors_fail_the_call_with_their_own_exception():
    d = decide(_piece(), 0, _error("quota"), None, ring_version=1, now=0.0, deadline=30.0, scheduler=SCHED)
    assert d.verdict is Verdict.FAIL and isinstance(d.error, QuotaError)
    ok = decide(_piece(), 0, Message({"op": "ok"}, []), None, ring_version=1, now=0.0, deadline=30.0, scheduler=SCHED)
    assert ok.verdict is Verdict.DONE


def test_a_lost_scheduler_fails_a_routing_error_once_its_process_is_gone():
    alive = Scheduler("tcp://s:1", 3.0, lost=True, gone=lambda: False)
    dead = Scheduler("tcp://s:1", 3.0, lost=True, gone=lambda: True)
    stale = StaleRingError("old ring")
    assert decide(_piece(), 0, None, stale, ring_version=1, now=0.0, deadline=30.0,
                  scheduler=alive).verdict is Verdict.RESEND
    d = decide(_piece(), 0, None, stale, ring_version=1, now=0.0, deadline=30.0, scheduler=dead)
    assert d.verdict is Verdict.FAIL and "stopped answering" in str(d.error)


def test_routing_and_gathering_cover_every_key_once():
    ring = Ring.create([1, 2, 3], vnodes_per_server=8)
    keys = np.arange(100, dtype=np.uint64)
    pieces = route(ring, Op.PULL, keys, None, 0)
    rows = np.concatenate([p.extra for p in pieces])
    assert sorted(rows.tolist()) == list(range(100)) and {p.ring_version for p in pieces} == {ring.version}
    g = Gather(len(pieces))
    assert not g.rerouted(2)  # one piece split in two: one more to wait for
    done = [g.answered() for _ in range(len(pieces) + 1)]
    assert done == [False] * len(pieces) + [True] and g.over and not g.fail(RuntimeError("late"))


def test_a_view_older_than_the_one_held_is_ignored():
    view = View()
    new, old = Ring.create([1, 2], 4), Ring.create([1], 4)
    assert view.apply({"ring": new.to_wire() | {"version": 3}, "servers": {"1": "a", "2": "b"}})
    assert not view.apply({"ring": old.to_wire() | {"version": 2}, "servers": {"1": "a"}})
    assert view.servers == {1: "a", 2: "b"} and view.ring is not None and view.ring.version == 3


def test_a_pull_or_push_waits_for_its_answer_a_time_by_its_size_a_gated_pull_or_a_function_as_long_as_it_takes():
    """Issue 47: a reply a server dropped (its slow-peer budget), or a request lost on a
    link that stays up, held the call for ever: a pull or push now fails with NoAnswerError
    past its time, and is routed again and resent (a push with its seq)."""
    from paramserver.client.core import ANSWER_WITHIN_S, SLOWEST_LINK_BPS, answer_within
    from paramserver.tables.spec import TableSpec

    asp, ssp = TableSpec("a", 4), TableSpec("b", 4, consistency="ssp:2")
    keys = np.arange(1000, dtype=np.uint64)
    pull = answer_within({"op": Op.PULL.value, "table": "a"}, [keys, np.zeros(1, np.int32)], asp)
    assert pull == pytest.approx(ANSWER_WITHIN_S + (8000 + 4 + 16_000) / SLOWEST_LINK_BPS)
    grads = np.zeros((1000, 4), np.float32)
    push = answer_within({"op": Op.PUSH.value, "table": "b"}, [keys, grads], ssp)
    assert push == pytest.approx(ANSWER_WITHIN_S + 24_000 / SLOWEST_LINK_BPS)
    assert answer_within({"op": Op.PULL.value, "table": "b"}, [keys], ssp) is None, "a gate may park it"
    assert answer_within({"op": Op.CALL.value, "table": "a"}, [keys], asp) is None, "a function may compute long"
    assert answer_within({"op": Op.PULL.value, "table": "x"}, [keys], None) is None
