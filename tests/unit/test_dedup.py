"""Exactly-once bookkeeping: retried pushes are applied once per vnode, whatever the order."""

import numpy as np

from paramserver.server.dedup import Dedup


def test_a_retry_is_applied_only_where_it_was_not():
    d = Dedup(8)
    first = np.array([1, 2, 3], np.int32)
    assert d.fresh(7, 5, 4, first).all()
    d.mark(7, 5, first)
    # the retry, routed again, covers vnodes 2..5: only 4 and 5 are new
    again = np.array([2, 3, 4, 5], np.int32)
    np.testing.assert_array_equal(d.fresh(7, 5, 4, again), [False, False, True, True])
    # another sender's push with the same number is its own
    assert d.fresh(8, 5, 4, first).all()


def test_out_of_order_retries_are_not_mistaken_for_duplicates():
    d = Dedup(4)
    v = np.array([0], np.int32)
    d.mark(1, 11, v)  # seq 11 reached vnode 0 before the retry of seq 10 did
    assert d.fresh(1, 10, 9, v).all()


def test_acknowledged_pushes_are_forgotten_and_refused():
    d = Dedup(4)
    v = np.array([0, 1], np.int32)
    for seq in range(1, 6):
        d.mark(3, seq, v)
    assert len(d.senders[3].seen) == 5
    assert not d.fresh(3, 2, 4, v).any()  # acked up to 4: seq 2 can only be a stale duplicate
    assert sorted(d.senders[3].seen) == [5]


def test_the_record_travels_with_a_vnode():
    src, dst = Dedup(4), Dedup(4)
    src.mark(2, 9, np.array([1, 3], np.int32))
    src.mark(2, 10, np.array([3], np.int32))
    src.fresh(2, 11, 8, np.array([0], np.int32))  # sets acked = 8
    dst.merge(3, src.export(3))
    np.testing.assert_array_equal(dst.fresh(2, 9, 8, np.array([1, 3], np.int32)), [True, False])
    assert not dst.fresh(2, 10, 8, np.array([3], np.int32)).any()
    assert not dst.fresh(2, 7, 8, np.array([3], np.int32)).any()


def test_senders_that_never_come_back_are_forgotten_but_not_within_the_retry_window():
    """Issue 12, bug 15: 200 000 distinct senders cost +117 MB, kept forever."""
    import paramserver.server.dedup as dedup_module
    now = [1000.0]
    d = dedup_module.Dedup(8, horizon_s=120.0, clock=lambda: now[0])
    vnodes = np.array([1, 2])
    for sender in range(5000):
        d.mark(sender, 1, vnodes)
    assert len(d.senders) == 5000
    now[0] += 60  # within the retry window: a retry is still recognised
    assert not d.fresh(7, 1, -1, vnodes).any()
    now[0] += 100  # past it for all but sender 7, seen 100 s ago
    for sender in range(5000, 5000 + 2 * dedup_module.EXPIRE_EVERY):
        d.mark(sender, 1, vnodes)
    assert 7 in d.senders and 0 not in d.senders
    assert len(d.senders) <= 1 + 2 * dedup_module.EXPIRE_EVERY
    d.forget(7)  # it left: forgotten at once
    assert 7 not in d.senders


def test_a_sender_that_never_acknowledges_is_bounded(monkeypatch):
    """Issue 28.6: rising seqs with acked = -1 grew a sender's record without end."""
    import numpy as np
    import pytest

    from paramserver.errors import ProtocolError
    from paramserver.server import dedup as dedup_module

    monkeypatch.setattr(dedup_module, "MAX_UNACKED", 100)
    d = dedup_module.Dedup(8)
    v = np.array([0])
    for seq in range(100):
        assert d.fresh(7, seq, -1, v).all()
        d.mark(7, seq, v)
    with pytest.raises(ProtocolError, match="on record already"):
        d.fresh(7, 100, -1, v)
    assert not d.fresh(7, 50, -1, v).any()  # a retry of one on record is still recognised
    assert d.fresh(7, 100, 99, v).all()  # once it acknowledges, the record shrinks and it goes on


def test_a_steps_batches_are_unseen_until_one_is_on_record_and_marked_each_where_it_went():
    """A step's batches (pushes ``first`` on, ``server/steps._whole``): taken whole only while
    none is on record, and recorded each at its own vnodes."""
    d = Dedup(8)
    assert d.unseen(3, 9, 10, 4)  # pushes 10-13, all newer than acked 9
    d.mark(3, 12, np.array([5], np.int32))  # a retry of push 12 reached vnode 5 before
    assert not d.unseen(3, 9, 10, 4) and d.unseen(3, 9, 10, 2) and d.unseen(3, 9, 13, 3)
    d.mark_many(3, 20, [np.array([0, 1], np.int32), np.array([], np.int32), np.array([7], np.int32)])
    np.testing.assert_array_equal(d.fresh(3, 20, 9, np.arange(8, dtype=np.int32)), [0, 0, 1, 1, 1, 1, 1, 1])
    assert d.fresh(3, 21, 9, np.arange(8, dtype=np.int32)).all()  # on record, applied nowhere
    np.testing.assert_array_equal(d.fresh(3, 22, 9, np.array([6, 7], np.int32)), [True, False])
    assert not d.unseen(3, 9, 19, 2) and d.unseen(3, 9, 23, 5)
    assert not d.unseen(3, 23, 23, 5)  # push 23 acknowledged: not new
