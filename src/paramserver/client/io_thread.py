"""The client's I/O thread: it works the client's sockets, and whoever holds its lock may too.

Callers hand it requests through a queue (``submit``) and get their answer through a
callback run on this thread; the client builds futures on top.  A caller whose request
finds the sockets free sends it itself (``_send_now``): the hand-off to this thread was the
largest single wait of a training worker's batch (~365 us median on 2 cores,
docs/benchmarks.md).  The thread sleeps in the OS's ``poll`` on ZeroMQ's descriptors
without the lock, so a sender never waits for it; ZeroMQ's descriptor is an edge that any
use of its socket may take, so whoever used a socket last looks at ``readable`` before it
lets the thread sleep, and wakes it if a message waits.  Replies are matched to
requests by id, so any number of requests can be in flight to any number of peers, and
a pull's reply is scattered into the caller's output array here, while the caller
computes.  The thread also sends the heartbeats and takes the scheduler's notifications
(``NODE_LOST`` fails the requests open to that node; ``STOP`` closes the client).  A
request sent with ``answer_within_s`` (no request is, by default) that gets no answer in
that time fails with ``NoAnswerError`` (its caller routes it again and resends it: a
message lost on the way); its answer, should it come later, is dropped.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import math
import select
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import zmq

from paramserver.client.core import NoAnswerError
from paramserver.client.in_flight import Call, InFlight, OnReply
from paramserver.client.scheduler_watch import SchedulerWatch
from paramserver.client.timers import Timers
from paramserver.config import Config
from paramserver.errors import ClosedError, Code, NodeLostError
from paramserver.wire import batch
from paramserver.wire.message import Message, Op, decode, encode, failed_request
from paramserver.wire.transport import Transport, ZmqSocket, transport_for

logger = logging.getLogger(__name__)
RESEND_S = 0.01  # a request no link could take yet is tried again after this
_WAKE_NAMES = itertools.count(1)  # each I/O thread's wake-up pair has a name of its own


def _nothing() -> None:
    """A timer that only wakes the loop."""


def _poll_ms(wait_s: float) -> int:
    """The poll's timeout for a timer due in ``wait_s``: whole milliseconds rounded up, so
    the loop sleeps until the timer is due (at most 1 ms late).  Rounded down, a timer
    less than 1 ms away made the loop spin on ``poll(0)`` until it was due: a training
    worker's I/O thread polled ~25 000 times in vain per 10^6-row job, on the cores
    (and under the GIL) its training needs."""
    return max(0, math.ceil(wait_s * 1000))

#: a request handed to the thread: address, header, arrays, on_reply, answer_within_s
_Queued = tuple[str, dict[str, Any], Sequence[np.ndarray], OnReply | None, float | None]
#: the requests that may share an envelope with the others to their server (``wire/batch.py``)
ENVELOPED = frozenset({Op.PULL.value, Op.PUSH.value, Op.PREFETCH.value, Op.STEP.value})


def _passes(header: dict[str, Any]) -> bool:
    """Whether a request goes out through a ``together`` block: any call but a pull or a
    push (a table's spec fetched for the block's first push to it, a barrier), so that the
    client's own calls inside the block are answered."""
    return header.get("op") not in ENVELOPED


def _uncorked(queue: collections.deque[_Queued]) -> tuple[collections.deque[_Queued], collections.deque[_Queued]]:
    """What goes out of a corked queue now, and what stays, both in order: the calls that
    pass (``_passes``) and no held pull or push to their node is ahead of (a node takes its
    requests in the order sent: a clock tick must not overtake a push)."""
    out: collections.deque[_Queued] = collections.deque()
    kept: collections.deque[_Queued] = collections.deque()
    held: set[str] = set()
    for item in queue:
        if item[0] not in held and _passes(item[1]):
            out.append(item)
        else:
            held.add(item[0])
            kept.append(item)
    return out, kept


class _Out:
    """A request encoded, waiting to go (alone or in an envelope)."""

    __slots__ = ("item", "request_id", "frames", "nbytes")

    def __init__(self, item: _Queued, request_id: int, frames: list[Any]) -> None:
        self.item, self.request_id, self.frames = item, request_id, frames
        self.nbytes = sum(memoryview(f).nbytes for f in frames)


class IOThread(threading.Thread):
    """Background thread owning a connection to the scheduler and one to each server
    (through the transport: ``wire/transport.py``)."""

    def __init__(self, config: Config, transport: Transport | None = None):
        super().__init__(name="paramserver-io", daemon=True)
        self.config = config
        self.transport = transport_for(config.scheduler, transport, config.secret_file)
        self.clock = self.transport.now
        # for the wake-up pair: other threads -> this one
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._ids = itertools.count(1)
        self._queue: collections.deque[_Queued] = collections.deque()
        self._corked = 0  # ``together`` blocks open: what they submit waits for the last to close
        self._envelope_bytes = config.max_message_bytes - batch.HEADER_ROOM  # an envelope's parts at most
        self._lock = threading.Lock()
        self._io = threading.Lock()  # whoever holds it works the sockets and what is in flight
        # the callbacks due (answers, failures), told by the I/O thread with the sockets free (``_tell``)
        self._told: list[tuple[OnReply, Message | None, BaseException | None]] = []
        # a name no other I/O thread of this process had: an object's id is reused once it is
        # freed, while the closed socket's inproc name may still be bound (zmq unbinds it later)
        wake_addr = f"inproc://paramserver-wake-{next(_WAKE_NAMES)}"
        self._wake_recv = ZmqSocket(self.ctx.socket(zmq.PAIR), False)
        self._wake_recv.raw.bind(wake_addr)
        self._wake_send = self.ctx.socket(zmq.PAIR)
        self._wake_send.connect(wake_addr)
        self._peers: dict[str, Any] = {}
        self._by_socket: dict[Any, str] = {}
        self._in_flight = InFlight()  # what was sent and not answered (``client/in_flight.py``)
        self._closed = threading.Event()
        self.notifications: list[Callable[[Message], None]] = []
        self.scheduler = config.scheduler
        self._peer(self.scheduler)
        self._heartbeats = False
        self.bytes_sent = 0
        self.bytes_received = 0
        self._lost: set[str] = set()  # addresses of nodes declared dead
        self._timers = Timers(self.clock, self._lock)
        self.watch = SchedulerWatch(self.scheduler, config, self.clock)  # its silence: lost, dead
        self._close_reason: str | None = None  # why the client closed itself (declared dead)

    # ---- called from any thread ----------------------------------------------------
    def submit(self, address: str, header: dict[str, Any], arrays: Sequence[np.ndarray] = (),
               on_reply: OnReply | None = None, answer_within_s: float | None = None) -> None:
        """Send ``header`` + ``arrays`` to ``address``; ``on_reply(msg, exc)`` gets the answer
        (``NoAnswerError`` once ``answer_within_s`` passed without one, if given)."""
        with self._lock:  # the I/O thread sets _closed under this lock before failing the queue
            if self._closed.is_set():
                raise ClosedError(self._close_reason or "the client is closed; create a new one")
            # a non-empty queue: the I/O thread is already due; a corked one: only a call the cork lets by
            wake = (not self._queue and not self._corked) or (self._corked > 0 and _passes(header))
            self._queue.append((address, header, arrays, on_reply, answer_within_s))
        if wake and not self._send_now():
            self._wake()

    @contextlib.contextmanager
    def together(self) -> Iterator[None]:
        """The requests submitted inside the block go out when it ends, those to one server
        as one envelope (``wire/batch.py``): a worker's push and its next pull cost one
        wake-up of this thread, one message each way and one turn of the server's loop,
        not two.  Nothing inside may wait on a pull's or a push's answer: its request has
        not gone yet.  Other calls go at once, behind any held request to their node (``_uncorked``)."""
        with self._lock:
            self._corked += 1
        try:
            yield
        finally:
            with self._lock:
                self._corked -= 1
                due = not self._corked and self._queue and not self._closed.is_set()
            if due and not self._send_now():
                self._wake()

    def _wake(self) -> None:
        """Wake the thread, unless the client closed (nothing would read it)."""
        with self._lock:
            if not self._closed.is_set():
                self._wake_send.send(b"", zmq.NOBLOCK)

    def _send_now(self) -> bool:
        """Send what is queued from the calling thread, if no thread works the sockets now:
        no hand-off.  False: the I/O thread must be woken, to send it (the sockets were
        busy), to watch a new peer, to tell a failure (callbacks run on the I/O thread: the
        caller may hold locks they take) or to read an answer that waits (a send may have
        taken the edge that would have woken it).  The thread tells the answers it read with
        the sockets free (``_tell``): a caller woken by one sends its next request itself."""
        if threading.current_thread() is self or not self._io.acquire(blocking=False):
            return False
        try:
            if self._closed.is_set():
                return False
            peers = len(self._peers)
            self._send_queued()
            return (len(self._peers) == peers and not self._told
                    and not any(sock.readable() for sock in self._peers.values()))
        finally:
            self._io.release()

    def _failed(self, on_reply: OnReply, exc: BaseException) -> None:
        """A request that could not go: its callback is told by the I/O thread."""
        self._told.append((on_reply, None, exc))

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` on this thread after ``delay_s`` (retries use it: never blocks)."""
        if not self._timers.add(delay_s, fn, self._closed):
            fn()  # nothing will run it later: run it now (a retry then fails its future)
        elif threading.current_thread() is not self:
            self._wake()

    def start_heartbeats(self) -> None:
        self.watch.restart()
        self._heartbeats = True

    def close(self, timeout_s: float = 5.0) -> None:
        with self._lock:
            if self._closed.is_set():
                return
            self._closed.set()
            self._wake_send.send(b"", zmq.NOBLOCK)
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout_s)

    # ---- the thread ----------------------------------------------------------------
    def _peer(self, address: str) -> Any:
        sock = self._peers.get(address)
        if sock is None:
            sock = self.transport.connect(address, self.config.max_message_bytes)
            self._peers[address] = sock
            self._by_socket[sock] = address
        return sock

    def run(self) -> None:
        fds = select.poll()
        fds.register(self._wake_recv.fd(), select.POLLIN)
        registered: set[Any] = set()
        next_beat = self.clock()
        self._io.acquire()
        try:
            while not self._closed.is_set():
                for sock in self._peers.values():
                    if sock not in registered:
                        fds.register(sock.fd(), select.POLLIN)
                        registered.add(sock)
                next_timer = self._expire_unanswered()
                if self._wake_recv.readable():
                    self._drain_wakeups()
                self._send_queued()  # what was submitted while the sockets were busy, and what the timers resent
                self._receive_ready()
                told, self._told = self._told, []
                self._io.release()  # callers send their next requests themselves meanwhile
                try:
                    self._tell(told)
                    next_timer = min(next_timer, self._timers.run_due())
                finally:
                    self._io.acquire()
                wait_s = min(next_beat - self.clock() if self._heartbeats else 1.0, next_timer)
                if not (self._told or self._wake_recv.readable() or any(s.readable() for s in self._peers.values())):
                    self._io.release()  # a caller may send meanwhile (``_send_now``)
                    try:
                        self._wait(fds, _poll_ms(wait_s))
                    finally:
                        self._io.acquire()
                if self._heartbeats and self.clock() >= next_beat:
                    self._peers[self.scheduler].try_send(encode({"op": Op.HEARTBEAT.value}))  # a missed one is fine
                    next_beat = self.clock() + self.config.heartbeat_interval_s
                    if self.watch.check():  # silent past its grace: what waits on it fails
                        self._notify(Message({"op": Op.NODE_LOST.value, "role": "scheduler", "node_id": 0,
                                              "address": self.scheduler}, []))
        except Exception:  # pragma: no cover - a bug here must not hang callers
            logger.exception("client I/O thread failed")
        finally:
            with self._lock:
                self._closed.set()
            self._fail_all(ClosedError(self._close_reason or "the client was closed with this request in flight"))
            told, self._told = self._told, []
            self._tell(told)
            self._timers.drain()
            for sock in (*self._peers.values(), self._wake_recv):
                sock.close()
            self._wake_send.close(linger=0)
            self._io.release()

    def _wait(self, fds: select.poll, timeout_ms: int) -> list[tuple[int, int]]:
        """Sleep until a socket may have something to say, the thread is woken, or ``timeout_ms``."""
        return fds.poll(timeout_ms)

    def _receive_ready(self) -> None:
        """Read every message that waits on any socket (``readable``: a descriptor's edge says little)."""
        for sock in list(self._peers.values()):
            while sock.readable():
                self._receive(sock)

    def _drain_wakeups(self) -> None:
        while True:
            try:
                self._wake_recv.raw.recv(zmq.NOBLOCK)
            except zmq.Again:
                return

    def _send_queued(self) -> None:
        """Send what was submitted, in order: the pulls and pushes that wait together for one
        server go as one envelope; a request to a server that no link takes yet waits, with
        every later one to it, for the next try (``RESEND_S``)."""
        with self._lock:  # taken under the lock that submit() checks emptiness under
            if self._corked:  # the block that corked the queue wakes this thread when it ends
                queued, self._queue = _uncorked(self._queue)
                if not queued:
                    return
            else:
                queued, self._queue = self._queue, collections.deque()
        held: dict[str, list[_Out]] = {}  # requests that may share an envelope, not sent yet, by server
        sizes: dict[str, int] = {}  # their bytes
        waiting: list[_Queued] = []  # for a server no link takes yet
        for item in queued:
            address, header, arrays, on_reply, _ = item
            if address in self._lost:  # it died: nobody would ever answer
                if on_reply:
                    self._failed(on_reply, NodeLostError(f"{address} was declared dead; the request was not sent"))
                continue
            request_id = next(self._ids)
            try:
                out = _Out(item, request_id, encode({**header, "id": request_id}, arrays))
            except Exception as exc:
                if on_reply:
                    self._failed(on_reply, exc)
                continue
            group = held.setdefault(address, [])
            alone = header.get("op") not in ENVELOPED
            full = len(group) == batch.MAX_PARTS or sizes.get(address, 0) + out.nbytes > self._envelope_bytes
            if group and (alone or full):
                self._flush(address, group, waiting)
                sizes[address] = 0
            group.append(out)
            sizes[address] = sizes.get(address, 0) + out.nbytes
            if alone:
                self._flush(address, group, waiting)
                sizes[address] = 0
        for address, group in held.items():
            self._flush(address, group, waiting)
        if waiting:
            with self._lock:
                self._queue.extendleft(reversed(waiting))
            self.call_later(RESEND_S, _nothing)  # the loop comes back to the queue then

    def _flush(self, address: str, group: list[_Out], waiting: list[_Queued]) -> None:
        """Send ``group`` (one request, or an envelope of several) to ``address``, and empty it.
        A server no link takes yet keeps this turn's later requests waiting too (in order)."""
        sent, group[:] = list(group), []
        if not sent:
            return
        frames = sent[0].frames if len(sent) == 1 else batch.envelope([o.frames for o in sent])
        if any(w[0] == address for w in waiting) or not self._peer(address).try_send(frames):  # never block
            waiting.extend(o.item for o in sent)
            return
        self.bytes_sent += sum(o.nbytes for o in sent)
        now = self.clock()
        for out in sent:
            on_reply, within_s = out.item[3], out.item[4]
            if on_reply is not None:
                self._in_flight.add(out.request_id, address, on_reply, within_s, now)

    def _expire_unanswered(self) -> float:
        """Fail the requests unanswered past their due time; seconds until the next is due."""
        expired, next_s = self._in_flight.expired(self.clock())
        for call in expired:
            self._deliver(call, None, NoAnswerError(f"{call.address} did not answer within {call.within_s:g} s"))
        return next_s

    def scheduler_lost(self) -> bool:
        """Whether the scheduler is lost: silent past the heartbeat timeout (``SchedulerWatch``)."""
        return self.watch.lost or self.scheduler in self._lost

    def _receive(self, sock: Any) -> None:
        if sock is self._peers.get(self.scheduler) and self.watch.heard():  # it was stalled or cut off, not dead
            self._lost.discard(self.scheduler)
        for _ in range(64):
            frames = sock.try_recv()
            if frames is None:
                return
            self.bytes_received += sum(len(f) for f in frames)
            self._answered(sock, frames)

    def _answered(self, sock: Any, frames: Sequence[Any], in_batch: bool = False) -> None:
        """One message received: the answer to a request (an envelope's answers in order), or a notification."""
        try:
            msg = decode(frames, self.config.max_message_bytes)
            parts = batch.split(msg.header, frames) if msg.op is Op.BATCH and not in_batch else None
        except Exception as exc:  # fail the request it answered, when we can tell which
            logger.warning("undecodable message from %s: %s", self._by_socket.get(sock), exc)
            call = self._in_flight.answered(failed_request(exc))
            if call is not None:
                self._deliver(call, None, exc)
            return
        if parts is not None:
            for part in parts:
                self._answered(sock, part, True)
            return
        call = self._in_flight.answered(msg.id)
        if call is not None:
            self._deliver(call, msg, None)
        elif msg.op in (Op.NODE_LOST, Op.STOP, Op.RING, Op.ERROR):
            self._notify(msg)

    def _deliver(self, call: Call, msg: Message | None, exc: BaseException | None) -> None:
        """``call``'s answer or failure, told at the end of this turn (``_tell``)."""
        self._told.append((call.on_reply, msg, exc))

    def _tell(self, told: list[tuple[OnReply, Message | None, BaseException | None]]) -> None:
        """Run the callbacks of a turn's answers and failures, in order, on this thread."""
        for on_reply, msg, exc in told:
            try:
                on_reply(msg, exc)
            except Exception:
                logger.exception("reply callback failed")

    def _notify(self, msg: Message) -> None:
        if msg.op is Op.NODE_LOST:
            lost = msg.header.get("address")
            if lost:
                self._lost.add(lost)
            err = NodeLostError(f"{msg.header.get('role')} {msg.header.get('node_id')} at {lost} "
                                "died (missed its heartbeat deadline) with this request in flight")
            for call in self._in_flight.to(lost) if lost else ():
                self._deliver(call, None, err)
        elif msg.op is Op.STOP:
            logger.info("the scheduler stopped the cluster")
            self._closed.set()
        elif msg.op is Op.ERROR and msg.header.get("code") == Code.UNKNOWN_NODE and self._heartbeats:
            # the answer to a heartbeat: this client was declared dead (the servers have forgotten its
            # exactly-once record, its ring view and shards went on without it): it must not go on
            self._close_reason = ("the scheduler declared this client dead: it heard no heartbeat for "
                                  f"{self.config.heartbeat_timeout_s:g} s (the process was paused, swapped out or "
                                  "cut off); calls fail, a push in flight may or may not have been applied; "
                                  "start a new client")
            logger.error("%s", self._close_reason)
            self._closed.set()
        for fn in self.notifications:
            fn(msg)

    def _fail_all(self, exc: BaseException) -> None:
        for call in self._in_flight.drain():
            self._deliver(call, None, exc)
        while self._queue:
            _, _, _, on_reply, _ = self._queue.popleft()
            if on_reply:
                on_reply(None, exc)
