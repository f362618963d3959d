"""A training job on a stream (``paramserver train --stream SOURCE``): the driver's feeder.

The feeder thread polls the source (``data/streams.py``) every ``POLL_S``, adds the
shards that arrived to the scheduler's stream queue with the source's position after
them, and commits to the source what is applied and saved: the position of the last
checkpoint written (with its pending shards), or without checkpoints what the workers
have done.  It closes the stream (the workers finish what was cut, then the job ends)
at ``--max-examples``, at ``--until``, when the source ends (standard input), or when
asked to stop (the first Ctrl-C or SIGTERM).

The feeder also measures the job's training time: the seconds it had rows in hand (cut,
not done), so that a job that waited 75 s for rows does not read as a slow trainer.  The
report gives examples/s over that time and over the wall time (``stream_rates``).

The position the scheduler keeps is ``{"source": the source's, "rows": rows cut so
far}`` (``rows`` None where the source cannot count them before they are read: then
``--max-examples`` counts the examples trained, and the job stops at the end of the
shard that reaches it; from Redis, which counts each entry's rows, it stops at the N-th
row exactly, inside an entry if need be).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from paramserver.data.batch import Shard
from paramserver.data.streams import StreamSource
from paramserver.errors import ConfigError

logger = logging.getLogger(__name__)

POLL_S = 0.2  # how often the source is asked what arrived
COMMIT_S = 1.0  # without checkpoints: how often what the workers did is committed to the source

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*(s|m|h|d)\s*$")


def parse_until(text: str | None, now: float | None = None) -> float | None:
    """``--until``: a duration from now (``90s``, ``10m``, ``2h``, ``1d``) or an ISO time
    (``2026-11-27T06:00``, local unless it names a zone), as a wall-clock time."""
    if text is None:
        return None
    now = time.time() if now is None else now
    if m := _DURATION.match(text):
        return now + float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    try:
        return dt.datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise ConfigError(f"--until {text!r}: give a duration (90s, 10m, 2h, 1d) or a time (2026-11-27T06:00)") \
            from None


@dataclass(frozen=True)
class StreamJob:
    """``train --stream``: the source (``data/streams.open_source``: a folder whose files
    arrive, ``redis://HOST:PORT/STREAM``, ``-``, ``module:Class=URL``) and when to stop:
    after ``max_examples`` rows, at the time ``until`` (``parse_until``); else at the
    source's end or a stop (``stop_streams``)."""

    source: str
    max_examples: int | None = None
    until: str | None = None


def stream_limits(max_examples: int | None, until: str | None) -> float | None:
    """``--max-examples`` checked, and ``--until`` as a wall-clock time (None: no end)."""
    if max_examples is not None and (isinstance(max_examples, bool) or not isinstance(max_examples, int)
                                     or max_examples < 1):
        raise ConfigError(f"--max-examples must be a whole number >= 1, got {max_examples!r}")
    return parse_until(until)


def stream_rates(examples: int, seconds: float, busy_s: float) -> dict[str, Any]:
    """The report's rates of a stream job: ``examples_per_s`` over ``busy_s``, the time it
    had rows in hand (what its trainers do), ``examples_per_s_wall`` over ``seconds``, the
    wall time (what the stream gave), and ``idle_seconds``, the time it waited for rows."""
    busy = min(busy_s, seconds)
    return {"examples_per_s": examples / busy if busy > 0 else 0.0, "busy_seconds": busy,
            "examples_per_s_wall": examples / seconds if seconds > 0 else 0.0, "idle_seconds": seconds - busy}


#: the feeders of the stream jobs running in this process: ``stop_streams`` closes them
STOPS: list[Feeder] = []


def stop_streams() -> bool:
    """Close every stream job of this process (the first Ctrl-C): each finishes what was
    cut, checkpoints and reports.  False if none runs."""
    for feeder in STOPS:
        feeder.stop()
    return bool(STOPS)


@contextlib.contextmanager
def fed(client: Any, source: StreamSource | None, stream: StreamJob | None, **options: Any) -> Iterator[Feeder | None]:
    """A feeder for ``source`` (None: a job on files, nothing to feed), stopping as
    ``stream`` says, while the job runs, ``stop_streams`` able to close it; once the job is
    done, its end committed."""
    if source is None or stream is None:
        yield None
        return
    feeder = Feeder(client, source, max_examples=stream.max_examples, until=parse_until(stream.until),
                    **options).start()
    STOPS.append(feeder)
    try:
        yield feeder
    finally:
        STOPS.remove(feeder)
    feeder.finish()


class Feeder:
    """The feeder thread (see the module); ``error`` holds what stopped it, for the driver."""

    def __init__(self, client: Any, source: StreamSource, *, max_examples: int | None, until: float | None,
                 checkpoints: bool, position: Any = None) -> None:
        self.client, self.source, self.checkpoints = client, source, checkpoints
        self.max_examples, self.until = max_examples, until
        resumed = position if isinstance(position, dict) else {}
        self.rows: int | None = resumed.get("rows", 0) if position is not None else 0
        self.source.start(resumed.get("source") if position is not None else None)
        self.stop_asked = threading.Event()
        self.closed = False
        self.error: BaseException | None = None
        self.committed_at = 0.0
        self.busy_s = 0.0  # seconds the job had rows in hand (cut, not done): its training time
        self.ticked_at, self.in_hand = time.monotonic(), False
        self.thread = threading.Thread(target=self._run, name="paramserver-stream-feeder", daemon=True)

    def start(self) -> Feeder:
        self.thread.start()
        return self

    def stop(self) -> None:
        """Close the stream at the next poll: the job finishes what was cut."""
        self.stop_asked.set()

    def join(self, timeout: float | None = None) -> None:
        self.thread.join(timeout)

    def _run(self) -> None:
        try:
            while not self.closed:
                self._feed_once()
                self._commit()
                self._tick(bool(self.client.job.status().get("stream", {}).get("pending")))
                if not self.closed:
                    self.stop_asked.wait(POLL_S)
        except BaseException as exc:  # the driver's loop raises it
            self.error = exc

    def _tick(self, in_hand: bool) -> None:
        """Count the time since the last tick as training time if the job had rows in hand."""
        now = time.monotonic()
        if self.in_hand:
            self.busy_s += now - self.ticked_at
        self.ticked_at, self.in_hand = now, in_hand

    def training_seconds(self) -> float:
        """Once the job is done: the seconds it had rows in hand (once the stream is closed,
        the workers finish what was cut: the job ends when they have)."""
        self._tick(False)
        return self.busy_s

    def finish(self) -> None:
        """Once the job is done: commit its end to the source, and let the source go."""
        self.join()
        try:
            self._commit(final=True)
        finally:
            self.source.close()

    def _limit(self) -> int | None:
        """The rows the source may still cut (None: no limit, or it cannot count them)."""
        if self.max_examples is None or self.rows is None:
            return None
        return max(0, self.max_examples - self.rows)

    def _feed_once(self) -> None:
        if self._must_close():
            self._add([], None, close=True)
            return
        shards, position, rows, ended = self.source.poll(self._limit())
        if rows is None:
            self.rows = None
        elif self.rows is not None:
            self.rows += rows
        close = ended or (self.max_examples is not None and self.rows is not None and self.rows >= self.max_examples)
        if shards or close:
            self._add(shards, {"source": position, "rows": self.rows}, close)

    def _must_close(self) -> bool:
        if self.stop_asked.is_set() or (self.until is not None and time.time() >= self.until):
            return True
        if self.max_examples is not None and self.rows is None:  # a source that cannot count: what was trained
            return int(self.client.job.status().get("examples", 0)) >= self.max_examples
        return False

    def _add(self, shards: list[Shard], position: Any, close: bool) -> None:
        if position is None:  # closing only: the position stays what it is
            position = self.client.job.status().get("stream", {}).get("position")
        self.client.job.add(shards, position, close=close)
        self.closed = close
        if close:
            logger.info("the stream is closed: the workers finish the %d shard(s) cut", len(shards))

    def _commit(self, final: bool = False) -> None:
        """Tell the source what is applied and saved (see the module)."""
        if not final and time.monotonic() - self.committed_at < (POLL_S if self.checkpoints else COMMIT_S):
            return
        self.committed_at = time.monotonic()
        status = self.client.job.status()
        state = (status.get("checkpoints") or {}).get("stream") if self.checkpoints else status.get("stream")
        if not state or not isinstance(state.get("position"), dict):
            return
        pending = [Shard.from_wire(w) for w in state.get("pending", [])]  # not done: cut, queued or running
        self.source.commit(state["position"].get("source"), pending)
