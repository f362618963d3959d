"""A ROUTER's replies to a peer that does not read are bounded (``wire/transport.py``)."""

import time

import numpy as np
import pytest
import zmq

from paramserver.wire import sockets, transport
from paramserver.wire.transport import PEER_REPLY_BYTES, PEER_REPLY_BYTES_MAX, ZmqTransport

HWM = 64


@pytest.fixture(autouse=True)
def _small_mark(monkeypatch):
    monkeypatch.setattr(sockets, "ROUTER_SNDHWM", HWM)  # 4096 in production: too many 0.8 MB replies for a test


def _pair(ctx):
    router, address = ZmqTransport(ctx).bind("127.0.0.1", 0, 1 << 30)
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.RCVHWM, 1)
    dealer.setsockopt(zmq.RCVBUF, 4096)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(address)
    dealer.send(b"hello")
    assert router.poll(5000)
    return router, dealer, router.recv()[0]


def test_big_replies_to_a_peer_that_does_not_read_are_dropped_past_the_budget():
    ctx = zmq.Context()
    router, dealer, peer = _pair(ctx)
    try:
        big = np.ones(400_000, np.float32)  # 1.6 MB: zero-copy, tracked
        for _ in range(200):  # a burst: bounded by the hard budget at once
            router.send([b"h", big.data.cast("B")], peer)
        assert router.dropped > 0
        assert router.pending_bytes(peer) <= PEER_REPLY_BYTES_MAX + big.nbytes
    finally:
        router.close()
        dealer.close()
        ctx.term()


def test_once_a_peer_has_stalled_its_budget_is_the_smaller_one(monkeypatch):
    monkeypatch.setattr(transport, "PEER_STALLED_S", 0.0)
    ctx = zmq.Context()
    router, dealer, peer = _pair(ctx)
    try:
        big = np.ones(400_000, np.float32)
        for _ in range(100):
            router.send([b"h", big.data.cast("B")], peer)
        assert router.dropped > 0
        assert router.pending_bytes(peer) <= PEER_REPLY_BYTES + big.nbytes
    finally:
        router.close()
        dealer.close()
        ctx.term()


def test_small_replies_stop_at_the_high_water_mark_and_the_send_never_blocks():
    ctx = zmq.Context()
    router, dealer, peer = _pair(ctx)
    try:
        small = np.ones(200_000, np.float32)  # 0.8 MB: copied, bounded by the SNDHWM
        started = time.monotonic()
        for _ in range(10 * HWM):
            router.send([b"h", small.data.cast("B")], peer)
        assert time.monotonic() - started < 10
        assert router.dropped > 0
    finally:
        router.close()
        dealer.close()
        ctx.term()


def test_a_reading_peer_gets_every_large_reply_and_a_gone_one_is_forgotten():
    ctx = zmq.Context()
    router, dealer, peer = _pair(ctx)
    try:
        dealer.setsockopt(zmq.RCVHWM, 0)
        big = np.ones(4_000_000, np.float32)  # 16 MB each, 5 of them: more than the budget over time
        got = 0
        for _ in range(5):
            router.send([b"h", big.data.cast("B")], peer)
            if dealer.poll(5000):
                dealer.recv_multipart()
                got += 1
        assert got == 5 and router.dropped == 0
        router.send([b"h"], b"\x00no-such-peer")  # a vanished peer: dropped, not raised
    finally:
        router.close()
        dealer.close()
        ctx.term()
