"""Envelopes (``wire/batch.py``): a worker's push and its next pull go to a server as one
message and come back as one, each part answered as if it had come alone, in order; a
malformed part is refused alone; the client's I/O thread sends what a ``together`` block
submitted to one server as one envelope, and only the pulls and pushes."""

from __future__ import annotations

import threading
from dataclasses import replace

import msgpack
import numpy as np
import pytest
import zmq

from paramserver.client.io_thread import IOThread
from paramserver.config import Config
from paramserver.errors import ProtocolError
from paramserver.routing.partition import route_pull, route_push
from paramserver.routing.ring import Ring
from paramserver.tables.spec import TableSpec
from paramserver.wire import batch
from paramserver.wire.message import decode, encode


def _parts(frames) -> list:
    msg = decode(frames)
    assert msg.op.value == "batch", msg
    return [decode(p) for p in batch.split(msg.header, frames)]


def test_an_envelope_splits_back_into_its_messages_in_order():
    a = encode({"op": "pull", "id": 1, "table": "t"}, [np.arange(3, dtype=np.uint64)])
    b = encode({"op": "push", "id": 2}, [np.ones((2, 1), np.float32), np.zeros(1, np.int32)])
    frames = [bytes(f) for f in batch.envelope([a, b])]
    got = _parts(frames)
    assert [m.id for m in got] == [1, 2]
    assert got[0].arrays[0].tolist() == [0, 1, 2] and got[1].arrays[0].shape == (2, 1)


@pytest.mark.parametrize("parts", [None, [], [0, 1], [True, True], [1, 1, 1], [3], "2", [1.0, 1.0],
                                   [1] * (batch.MAX_PARTS + 1)])
def test_an_envelope_whose_parts_do_not_add_up_is_refused_naming_them(parts):
    header = {"op": "batch", "parts": parts}
    frames = [msgpack.packb(header), msgpack.packb({"op": "ok"}), msgpack.packb({"op": "ok"})]
    with pytest.raises(ProtocolError, match="a batch's parts must be"):
        batch.split(decode(frames).header, frames)


def test_answers_are_packed_in_order_into_envelopes_a_receiver_takes():
    messages = [encode({"op": "ok", "id": i}, [np.zeros(100, np.float32)]) for i in range(5)]
    one = sum(memoryview(f).nbytes for f in messages[0])
    out = batch.packed(messages, 2 * one + batch.HEADER_ROOM)  # two answers an envelope
    assert [len(_parts(m)) if decode(m).op.value == "batch" else 1 for m in out] == [2, 2, 1]
    ids = [p.id for m in out for p in (_parts(m) if decode(m).op.value == "batch" else [decode(m)])]
    assert ids == [0, 1, 2, 3, 4]
    assert all(sum(memoryview(f).nbytes for f in m) <= 2 * one + batch.HEADER_ROOM for m in out)
    many = [encode({"op": "ok", "id": i}) for i in range(batch.MAX_PARTS + 3)]
    assert [len(_parts(m)) for m in batch.packed(many, 1 << 30)] == [batch.MAX_PARTS, 3]
    assert batch.packed(messages[:1], 10) == messages[:1]  # one answer goes as it is


def _one_server(h, dim=1):
    (node,) = h.make(1)
    ring = Ring.create([1], 4)
    h.ring(ring, [TableSpec("t", dim, optimizer={"name": "sgd", "lr": 1.0})])
    answers: list[list] = []
    h.net.watchers.append(lambda src, dest, frames: answers.append(list(frames)) if src is node.router else None)
    return node, ring, answers


def _push(ring, keys, grads, rid, **fields):
    r = route_push(ring, keys, grads)
    (p,) = r.parts
    return encode({"op": "push", "table": "t", "ring_version": ring.version, "id": rid, **fields},
                  [r.keys[p.start:p.stop], r.grads[p.start:p.stop], p.vnodes, p.counts])


def _pull(ring, keys, rid):
    r = route_pull(ring, keys)
    (p,) = r.parts
    return encode({"op": "pull", "table": "t", "ring_version": ring.version, "id": rid},
                  [r.keys[p.start:p.stop], p.vnodes, p.counts]), r.order[p.start:p.stop]


CLIENT = b"client"


def _deliver(h, node, frames):
    node._handle_data([CLIENT, *[bytes(f) for f in frames]])
    h.flush()


def test_a_push_and_a_pull_in_one_envelope_are_answered_in_one_in_order_the_pull_seeing_the_push(h):
    node, ring, answers = _one_server(h)
    keys = np.array([5, 9, 123], np.uint64)
    pull, order = _pull(ring, keys, 2)
    _deliver(h, node, batch.envelope([_push(ring, keys, -np.ones((3, 1), np.float32), 1, sender=7, seq=1, acked=0),
                                      pull]))
    (frames,) = answers  # one message back
    ack, rows = _parts(frames)
    assert (ack.op.value, ack.id, rows.op.value, rows.id) == ("ok", 1, "ok", 2)
    values = np.empty(3, np.float32)
    values[order] = rows.arrays[0][:, 0]
    assert values.tolist() == [1.0, 1.0, 1.0]  # sgd, lr 1, gradient -1: the push was applied before the pull


def test_a_malformed_part_is_refused_alone_and_the_others_are_answered(h):
    node, ring, answers = _one_server(h)
    keys = np.array([5, 9], np.uint64)
    pull, _ = _pull(ring, keys, 3)
    bad = encode({"op": "push", "table": "t", "ring_version": ring.version, "id": 2}, [keys])  # one array of four
    _deliver(h, node, batch.envelope([bad, pull]))
    (frames,) = answers
    refused, rows = _parts(frames)
    assert (refused.op.value, refused.id) == ("error", 2) and "push takes 4 arrays" in refused.header["error"]
    assert (rows.op.value, rows.id) == ("ok", 3) and rows.arrays[0].shape == (2, 1)


def test_an_envelope_inside_an_envelope_is_refused_and_a_broken_envelope_gets_an_error(h):
    node, ring, answers = _one_server(h)
    pull, _ = _pull(ring, np.array([5], np.uint64), 4)
    _deliver(h, node, batch.envelope([batch.envelope([pull])]))
    _deliver(h, node, [msgpack.packb({"op": "batch", "parts": [5]}), *pull])
    inner, broken = (decode(f) for f in answers)
    assert inner.op.value == "error" and "does not serve op 'batch'" in inner.header["error"]
    assert broken.op.value == "error" and "a batch's parts must be" in broken.header["error"]
    assert node.tables["t"] is not None  # the server serves on


def test_an_envelope_whose_answers_outgrow_a_message_is_answered_in_several(h):
    node, ring, answers = _one_server(h, dim=16)
    keys = np.arange(1, 201, dtype=np.uint64)  # 1.6 KB of keys a pull, 12.8 KB of rows an answer
    pulls = [_pull(ring, keys, rid)[0] for rid in (1, 2, 3)]
    limit = sum(memoryview(f).nbytes for f in batch.envelope(pulls)) + 20_000  # one answer fits, two do not
    object.__setattr__(node.config, "max_message_bytes", limit)
    _deliver(h, node, batch.envelope(pulls))
    assert len(answers) == 3 and all(sum(map(len, f)) <= limit for f in answers)
    assert [decode(f).id for f in answers] == [1, 2, 3]


def test_together_sends_a_servers_pulls_and_pushes_as_one_envelope_and_the_rest_alone_in_order():
    ctx = zmq.Context.instance()
    server = ctx.socket(zmq.ROUTER)
    port = server.bind_to_random_port("tcp://127.0.0.1")
    address = f"tcp://127.0.0.1:{port}"
    io = IOThread(replace(Config(), scheduler="tcp://127.0.0.1:9"))  # never dialled: nothing goes to it
    io.start()
    answered: dict[str, object] = {}
    done = threading.Event()

    def on(name):
        def on_reply(msg, exc):
            answered[name] = exc or msg.header["n"]
            if len(answered) == 4:
                done.set()
        return on_reply

    try:
        with io.together():
            io.submit(address, {"op": "push", "n": "push"}, (np.ones(2, np.float32),), on("push"))
            io.submit(address, {"op": "pull", "n": "pull"}, (), on("pull"))
            io.submit(address, {"op": "stats", "n": "stats"}, (), on("stats"))  # not enveloped: goes alone
            io.submit(address, {"op": "pull", "n": "last"}, (), on("last"))
            assert not server.poll(200), "a request went out before the block ended"
        got = []
        while len(got) < 3 and server.poll(5000):
            got.append(server.recv_multipart())
        assert len(got) == 3 and not server.poll(200)
        (identity, *first), (_, *second), (_, *third) = got
        assert [m.header["n"] for m in _parts(first)] == ["push", "pull"]
        assert decode(second).header["n"] == "stats" and decode(third).header["n"] == "last"
        replies = [encode({"op": "ok", "id": m.id, "n": m.header["n"]}) for m in _parts(first)]
        server.send_multipart([identity, *batch.envelope(replies)])
        for frames in (second, third):
            m = decode(frames)
            server.send_multipart([identity, *encode({"op": "ok", "id": m.id, "n": m.header["n"]})])
        assert done.wait(5.0), answered
        assert answered == {"push": "push", "pull": "pull", "stats": "stats", "last": "last"}
    finally:
        io.close()
        server.close(linger=0)


def test_more_requests_than_an_envelope_holds_go_in_several():
    ctx = zmq.Context.instance()
    server = ctx.socket(zmq.ROUTER)
    port = server.bind_to_random_port("tcp://127.0.0.1")
    address = f"tcp://127.0.0.1:{port}"
    io = IOThread(replace(Config(), scheduler="tcp://127.0.0.1:9"))
    io.start()
    try:
        n = batch.MAX_PARTS + 2
        with io.together():
            for i in range(n):
                io.submit(address, {"op": "pull", "n": i}, (), lambda msg, exc: None)
        got = []
        while sum(len(_parts(f)) for f in got) < n and server.poll(5000):
            got.append(server.recv_multipart()[1:])
        assert [len(_parts(f)) for f in got] == [batch.MAX_PARTS, 2]  # each one the server takes
        assert [m.header["n"] for f in got for m in _parts(f)] == list(range(n))
    finally:
        io.close()
        server.close(linger=0)


def test_a_call_inside_together_goes_at_once_unless_a_held_request_to_its_node_is_ahead():
    """The client's own calls in a block (a table's spec fetched for its first push) must be
    answered, or the block waits for ever; a clock tick still never overtakes a held push."""
    ctx = zmq.Context.instance()
    server, other = ctx.socket(zmq.ROUTER), ctx.socket(zmq.ROUTER)
    address = f"tcp://127.0.0.1:{server.bind_to_random_port('tcp://127.0.0.1')}"
    elsewhere = f"tcp://127.0.0.1:{other.bind_to_random_port('tcp://127.0.0.1')}"
    io = IOThread(replace(Config(), scheduler="tcp://127.0.0.1:9"))
    io.start()
    try:
        with io.together():
            io.submit(address, {"op": "push", "n": "push"}, (np.ones(2, np.float32),), lambda msg, exc: None)
            io.submit(elsewhere, {"op": "table_info", "n": "spec"}, (), lambda msg, exc: None)
            io.submit(address, {"op": "clock", "n": "tick"}, (), lambda msg, exc: None)
            assert other.poll(5000), "a call to another node waited for the block to end"
            assert decode(other.recv_multipart()[1:]).header["n"] == "spec"
            assert not server.poll(300), "a request to the held push's node went before the block ended"
        got = []
        while len(got) < 2 and server.poll(5000):
            got.append(server.recv_multipart()[1:])
        assert [decode(f).header["n"] for f in got] == ["push", "tick"]  # in the order submitted
    finally:
        io.close()
        server.close(linger=0)
        other.close(linger=0)
