"""The client's I/O thread fails a data request that gets no answer in time, so that its
caller routes it again and resends it (a message lost on the way, a reply a server
dropped for a slow link): before, such a request waited for ever."""

import threading
from dataclasses import replace

import zmq

from paramserver.client.core import NoAnswerError
from paramserver.client.io_thread import IOThread
from paramserver.config import Config
from paramserver.wire.transport import ZmqTransport


def test_a_request_unanswered_in_time_fails_with_no_answer_and_a_late_reply_is_dropped():
    ctx = zmq.Context.instance()
    silent = ctx.socket(zmq.ROUTER)  # takes requests, answers when told
    port = silent.bind_to_random_port("tcp://127.0.0.1")
    io = IOThread(replace(Config(), scheduler=f"tcp://127.0.0.1:{port}"))
    io.start()
    answers: list[tuple[object, object]] = []
    got = threading.Event()
    try:
        def on_reply(msg, exc):
            answers.append((msg, exc))
            got.set()

        io.submit(io.scheduler, {"op": "stats"}, (), on_reply, answer_within_s=0.3)
        assert silent.poll(5000), "the request never left"
        identity, *frames = silent.recv_multipart()
        assert got.wait(5.0), "an unanswered request waited past its time"
        (msg, exc), = answers
        assert msg is None and isinstance(exc, NoAnswerError) and "0.3 s" in str(exc)
        silent.send_multipart([identity, *frames])  # the late answer: nobody waits for it any more
        io.submit(io.scheduler, {"op": "stats"}, (), on_reply)  # no time limit: waits
        assert silent.poll(5000)
        assert len(answers) == 1
    finally:
        io.close()
        silent.close(linger=0)


class _CountingPoller:
    """A poller that counts the polls that returned at once with nothing ready."""

    def __init__(self, inner, counts):
        self.inner, self.counts = inner, counts

    def register(self, sock):
        self.inner.register(sock)

    def unregister(self, sock):
        self.inner.unregister(sock)

    def poll(self, timeout_ms):
        ready = self.inner.poll(timeout_ms)
        self.counts["polls"] += 1
        if timeout_ms == 0 and not ready:
            self.counts["spins"] += 1
        return ready


class _CountingTransport(ZmqTransport):
    def __init__(self, counts):
        super().__init__()
        self.counts = counts

    def poller(self):
        return _CountingPoller(super().poller(), self.counts)


def test_a_timer_less_than_a_millisecond_away_is_waited_for_not_spun_on():
    """A timer due in under 1 ms gave the loop a poll timeout of int(0.5) = 0 ms, so it
    polled in vain until the timer was due (~25 000 polls a 10^6-row training job)."""
    counts = {"polls": 0, "spins": 0}
    io = IOThread(replace(Config(), scheduler="tcp://127.0.0.1:9"), _CountingTransport(counts))  # never dialled
    io.start()
    try:
        timers = 40
        for _ in range(timers):
            fired = threading.Event()
            io.call_later(0.0008, fired.set)
            assert fired.wait(5.0), "a timer never ran"
        assert counts["spins"] <= timers, f"{counts['spins']} polls returned at once with nothing to do"
    finally:
        io.close()
