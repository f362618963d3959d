"""The scheduler's fan-out to every server: answers collected, the dead and the late given up on."""

import time

import pytest

from paramserver.config import load_config
from paramserver.scheduler.node import NodeInfo, SchedulerNode
from paramserver.wire.message import Message, Op


@pytest.fixture
def scheduler():
    node = SchedulerNode(load_config(host="127.0.0.1", port=0, servers=3))
    for i, identity in ((1, b"s1"), (2, b"s2"), (3, b"s3")):  # servers that are never reached
        node.nodes[i] = NodeInfo(i, "server", identity, f"tcp://x:{i}", time.monotonic())
        node.by_identity[identity] = i
    yield node
    node.sock.close(linger=0)


def test_answers_errors_deaths_and_deadlines_each_finish_a_fan_out(scheduler):
    finished = []
    op_id = scheduler.fan_out({"op": Op.CHECKPOINT.value, "url": "u"}, finished.append, timeout_s=30)
    scheduler.on_ack(b"s1", Message({"op": "ok", "id": op_id, "files": {}}, []))
    scheduler.on_ack(b"s1", Message({"op": "ok", "id": op_id}, []))  # a duplicate is ignored
    scheduler.on_ack(b"s2", Message({"op": "error", "id": op_id, "error": "disk full"}, []))
    assert not finished
    scheduler._remove(3, "dead")
    (op,) = finished
    assert op.replies == {1: {"op": "ok", "id": op_id, "files": {}}} and op.errors == {2: "disk full"}
    assert op.lost == {3} and op_id not in scheduler.fanouts.open

    late = []
    op_id = scheduler.fan_out({"op": Op.CHECKPOINT.value, "url": "v"}, late.append, timeout_s=5)
    scheduler.on_ack(b"s1", Message({"op": "ok", "id": op_id}, []))
    scheduler.fanouts.expire(time.monotonic())  # before the deadline: still waiting
    assert not late
    scheduler.fanouts.expire(time.monotonic() + 10)
    (op,) = late
    assert set(op.replies) == {1} and op.lost == {2}
