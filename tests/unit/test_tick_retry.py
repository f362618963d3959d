"""The clock a worker sends on its own (``client/ticks.py``, issue 45's decision): a
refused tick goes again while its server is on the ring, until the call deadline; the
client and the simulated worker run this one function."""

from __future__ import annotations

from typing import Any

from paramserver.client.ticks import TICK_RETRY_S, send_tick
from paramserver.errors import ClosedError, StaleRingError
from paramserver.wire.message import Message, Op


class _Port:
    """A port whose server answers with ``answers`` in turn, on a clock moved by hand."""

    retry_timeout_s = 1.0

    def __init__(self, answers: list[str]) -> None:
        self.answers, self.t, self.sent, self.later = answers, 0.0, 0, []

    def now(self) -> float:
        return self.t

    def submit(self, address: str, header: dict[str, Any], arrays: list[Any], on_reply: Any) -> None:
        assert header["op"] == Op.CLOCK.value and address == "tcp://s1"
        self.sent += 1
        answer = self.answers.pop(0) if self.answers else "ok"
        if answer == "closed":
            raise ClosedError("the client is closed")
        if answer == "ok":
            on_reply(Message({"op": Op.OK.value}, []), None)
        else:
            on_reply(Message({"op": Op.ERROR.value, "code": "stale_ring", "error": "lease ran out"}, []), None)

    def call_later(self, delay_s: float, fn: Any) -> None:
        assert delay_s == TICK_RETRY_S
        self.later.append(fn)

    def run_timers(self, step: float = TICK_RETRY_S) -> None:
        while self.later:
            self.t += step
            self.later.pop(0)()


def _send(port: _Port, on_ring: bool = True) -> list[BaseException | None]:
    outcome: list[BaseException | None] = []
    send_tick(port, "tcp://s1", {"op": Op.CLOCK.value, "worker": 3, "clock": 7}, outcome.append, lambda: on_ring)
    port.run_timers()
    return outcome


def test_a_refused_tick_goes_again_until_the_server_takes_it() -> None:
    port = _Port(["refused", "refused", "ok"])
    assert _send(port) == [None] and port.sent == 3


def test_a_tick_refused_past_its_deadline_fails_loudly() -> None:
    port = _Port(["refused"] * 1000)
    outcome = _send(port)
    assert len(outcome) == 1 and isinstance(outcome[0], StaleRingError)
    assert port.sent == int(port.retry_timeout_s / TICK_RETRY_S) + 1  # tried until the deadline, not for ever


def test_a_tick_to_a_server_that_left_the_ring_is_given_up_quietly() -> None:
    port = _Port(["refused"] * 10)
    assert _send(port, on_ring=False) == [None] and port.sent == 1


def test_a_closed_client_ends_the_tick_at_once() -> None:
    port = _Port(["refused", "closed"])
    outcome = _send(port)
    assert len(outcome) == 1 and isinstance(outcome[0], ClosedError) and port.sent == 2
