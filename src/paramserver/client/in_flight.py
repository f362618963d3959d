"""The requests a client has sent and not had answered (``InFlight``), each with who answers
its reply; those sent with ``answer_within_s`` also with the time they fail unanswered.

The I/O thread owns it (``client/io_thread.py``): it registers a request once its frames are
on their way, takes it back out when an answer with its id comes, and fails what expired, what
a dead node held and, when the client closes, everything.  A reply that comes after its request
left (expired, failed) finds nothing here and is dropped.

The deadlines are a heap of ``(due, id)``; an answered request's entry stays in the heap until
it comes to the top (answers are the common case: a ``del`` from a heap is a search), and the
heap is rebuilt from the calls still open once it holds four times as many entries as there are
calls (plus 1 024), so that a client whose requests are all answered keeps it small.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

from paramserver.wire.message import Message

OnReply = Callable[[Message | None, BaseException | None], None]


@dataclass
class Call:
    """A request in flight: where it went, whom its answer goes to, when it fails unanswered
    (never, by default) and the wait it was given."""

    address: str
    on_reply: OnReply
    due: float = float("inf")
    within_s: float = 0.0


class InFlight:
    """The requests in flight, by id (see the module's doc)."""

    def __init__(self) -> None:
        self._calls: dict[int, Call] = {}
        self._dues: list[tuple[float, int]] = []  # heap of (due, request id): the requests that must be answered

    def __len__(self) -> int:
        return len(self._calls)

    def add(self, request_id: int, address: str, on_reply: OnReply, within_s: float | None, now: float) -> None:
        """Request ``request_id``, sent to ``address``: ``on_reply`` takes its answer, or its
        failure once ``within_s`` (if given) passed from ``now`` without one."""
        call = self._calls[request_id] = Call(address, on_reply)
        if within_s is None:
            return
        call.due, call.within_s = now + within_s, within_s
        heapq.heappush(self._dues, (call.due, request_id))
        if len(self._dues) > 4 * len(self._calls) + 1024:  # answered ones: dropped in bulk
            self._dues = [(c.due, r) for r, c in self._calls.items() if c.due != float("inf")]
            heapq.heapify(self._dues)

    def answered(self, request_id: object) -> Call | None:
        """The call an answer with id ``request_id`` is for, taken out (None: none is open,
        or the id is not a request's)."""
        return self._calls.pop(request_id, None) if isinstance(request_id, int) else None

    def expired(self, now: float) -> tuple[list[Call], float]:
        """The calls past their due time at ``now``, taken out; and the seconds until the next
        one is due (infinity: none is)."""
        out: list[Call] = []
        while self._dues:
            due, request_id = self._dues[0]
            if due > now:
                return out, due - now
            heapq.heappop(self._dues)
            call = self._calls.get(request_id)
            if call is not None and call.due == due:
                del self._calls[request_id]
                out.append(call)
        return out, float("inf")

    def to(self, address: str) -> list[Call]:
        """The calls open to ``address`` (a node declared dead), taken out."""
        gone = [rid for rid, call in self._calls.items() if call.address == address]
        return [self._calls.pop(rid) for rid in gone]

    def drain(self) -> list[Call]:
        """Every call open, taken out (the client closes)."""
        calls, self._calls = list(self._calls.values()), {}
        self._dues.clear()
        return calls
