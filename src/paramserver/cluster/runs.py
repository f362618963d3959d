"""``run``, ``run_elastic`` and ``client``, as every launcher has them (``LocalCluster``,
``RayCluster``): what a run's outcome means is the same whatever started the workers; a
launcher supplies ``_run``, which sends the function to its workers and collects what came
back (one run at a time: ``_begin_run`` and ``_end_run`` it), and its driver's client (``_client``,
``_closed`` once stopped)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import cloudpickle

from paramserver.errors import ClosedError, WorkerError

if TYPE_CHECKING:
    from paramserver.client.client import Client

logger = logging.getLogger(__name__)

Outcome = tuple[list[Any], list[str], list[str], list[str]]


@dataclass
class Tally:
    """What one run's workers gave back, whatever carried it: results by rank, errors (full
    text) and their one-line summaries, deaths among them."""

    results: dict[int, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    summaries: list[str] = field(default_factory=list)
    deaths: list[str] = field(default_factory=list)

    def answered(self, name: str, status: str, rank: int, value: Any) -> None:
        if status == "ok":
            self.results[rank] = value
        else:
            summary, trace = value
            self.errors.append(f"{name} (rank {rank}) raised:\n{trace}")
            self.summaries.append(summary)

    def died(self, line: str, detail: str = "") -> None:
        self.errors.append(f"{line}\n{detail}" if detail else line)
        self.summaries.append(line)
        self.deaths.append(line)

    @property
    def raised(self) -> bool:
        """A worker raised (a bug, bad data): the run has failed, and the others are not
        waited for, as they may never finish (a shard it held stays its own while it lives)."""
        return len(self.errors) > len(self.deaths)

    def outcome(self) -> Outcome:
        return [self.results[r] for r in sorted(self.results)], self.errors, self.summaries, self.deaths


class RunsFunctions:
    _client: Client | None  # the launcher's driver client, once its cluster is up
    _closed: bool
    _lock: threading.Lock  # guards the active run (and the launcher's nodes)
    _active: Any  # the launcher's record of the run going on, None between runs
    _calls: int  # runs started: each run's payload and replies carry its number

    def _begin_run(self, workers: list[Any], fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[int, bytes]:
        """A new run of ``fn(client, *args)`` on ``workers``, under ``_lock``: its number and
        what each worker is sent.  One run at a time, and it needs workers."""
        if self._active is not None:
            raise WorkerError("a function is already running on this cluster's workers; wait for it to return")
        if not workers:
            raise WorkerError(f"this cluster has no workers: {type(self).__name__}(workers=N) with N >= 1")
        self._calls += 1
        return self._calls, cloudpickle.dumps((self._calls, fn, args))

    def _end_run(self) -> None:
        """The run is over, however it ended: the next may start."""
        with self._lock:
            self._active = None

    @property
    def client(self) -> Client:
        """A driver client of this cluster (create tables, inspect, pull results)."""
        if self._closed or self._client is None:
            raise ClosedError("the cluster is stopped")
        return self._client

    def _run(self, fn: Callable[..., Any], args: tuple[Any, ...], timeout_s: float | None,
             elastic: bool) -> Outcome:
        """Results in rank order; errors (full text) and summaries, of deaths included; deaths.
        Stops waiting at the first worker that raised (the others may wait on it for ever)."""
        raise NotImplementedError

    def run(self, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None) -> list[Any]:
        """Run ``fn(client, *args)`` on every worker; return the results in rank order.

        Workers added with ``add_worker`` while it runs run ``fn`` too.

        Raises:
            WorkerError: a worker raised (the remote traceback is in the message) or died.
        """
        results, errors, summaries, _ = self._run(fn, args, timeout_s, False)
        if errors:
            raise WorkerError("\n".join(errors), summary=summaries[0])
        return results

    def run_elastic(self, fn: Callable[..., Any], *args: Any,
                    timeout_s: float | None = None) -> tuple[list[Any], list[str]]:
        """Like ``run``, but a worker that *dies* is tolerated while another finishes (the
        task queue hands a dead worker's shard to another); workers added meanwhile join
        (under Ray, so does the restart of a dead worker's actor).

        Returns:
            the survivors' results in rank order, and one line per worker that died.

        Raises:
            WorkerError: a worker raised (a bug or bad data, not a lost machine), or every
                worker died.
        """
        results, errors, summaries, deaths = self._run(fn, args, timeout_s, True)
        raised = [(e, s) for e, s in zip(errors, summaries) if s not in deaths]
        if raised:
            raise WorkerError("\n".join(e for e, _ in raised), summary=raised[0][1])
        if not results:
            raise WorkerError("every worker died:\n" + "\n".join(errors),
                              summary="every worker died: " + "; ".join(deaths))
        for line in deaths:
            logger.warning("%s; the others went on", line)
        return results, deaths
