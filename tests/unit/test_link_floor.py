"""The link's floor, which ``--pipeline link`` sets its depth from: a server answers a
``ping`` at once and changes nothing; a client times pings one at a time to each server and
takes the least of each server's, the longest of those; a server that does not answer leaves
the floor unknown."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace

from harness import Harness

from paramserver.client import stats as stats_module
from paramserver.client.stats import Stats
from paramserver.errors import RemoteError
from paramserver.wire.security import refused_op


def test_a_server_answers_a_ping_at_once_and_any_key_may_send_one():
    h = Harness()
    (node,) = h.make(0)
    h.deliver(node, {"op": "ping", "id": 7})
    assert h.replies == [(0, {"op": "ok", "id": 7, "arrays": []})]  # no field, no array
    assert node.tables == {}  # nothing else happened
    assert refused_op("worker", "ping") is None and refused_op("driver", "ping") is None


class _Clock:
    """perf_counter for the client's timing: each ping's answer takes the time its server's
    next delay says."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _stats(delays: dict[str, list[float]], clock: _Clock, fail: str = "") -> tuple[Stats, list[str]]:
    sent: list[str] = []

    def request(address: str, header: dict) -> Future:
        assert header == {"op": "ping"}
        sent.append(address)
        future: Future = Future()
        if address == fail:
            future.set_exception(RemoteError("a server does not serve op 'ping'"))
            return future
        clock.now += delays[address].pop(0)
        future.set_result(None)
        return future

    state = SimpleNamespace(view=SimpleNamespace(servers={1: "a", 2: "b"}))
    return Stats(SimpleNamespace(request=request), None, state, None), sent  # type: ignore[arg-type]


def test_the_floor_is_the_least_round_trip_of_each_server_and_the_longest_of_those(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(stats_module.time, "perf_counter", clock)
    stats, sent = _stats({"a": [0.004, 0.0011, 0.0030], "b": [0.0020, 0.0009, 0.0015]}, clock)
    assert abs(stats.round_trip_floor(3, 1.0) - 0.0011) < 1e-12  # a's least; b's (0.9 ms) is shorter
    assert sent == ["a", "a", "a", "b", "b", "b"]  # one at a time: nothing else in flight


def test_a_server_that_does_not_answer_leaves_the_floor_unknown(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(stats_module.time, "perf_counter", clock)
    stats, _ = _stats({"a": [0.001] * 3}, clock, fail="b")
    assert stats.round_trip_floor(3, 1.0) is None
    none = Stats(SimpleNamespace(request=None), None, SimpleNamespace(view=SimpleNamespace(servers={})),  # type: ignore[arg-type]
                 None)  # type: ignore[arg-type]
    assert none.round_trip_floor(3, 1.0) is None  # no server: nothing to time
