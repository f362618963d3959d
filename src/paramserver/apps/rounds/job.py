"""The driver's side of a scheduled app (``paramserver lasso``, ``mf``, ``lda``): the steps
the three take alike around their own.

Each driver checks its flags and that every output is writable (``check_outputs``), before
any long work; reads and lays out its data; then, in a ``RoundsJob`` (a cluster whose
server losses the driver decides on, with a scratch folder for the workers' parts if the
app needs one), restores its tables from a round checkpoint or creates them
(``RoundsJob.tables``), runs its workers (``RoundsJob.run``: a worker that dies is survived
when the app can regroup, one that joins midway leaves), and reads its tables back.  What
it computes from them is its own; the report goes to ``--metrics-out`` (``write_metrics``).
"""

from __future__ import annotations

import functools
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import ExitStack
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from paramserver.apps.rounds.program import RoundResume, took_part
from paramserver.client.filtering import merge_stats
from paramserver.client.losses import surfacing_losses, tolerating_loss
from paramserver.filters.chain import FilterSpec


def check_outputs(save: str | None, metrics_out: str | None, *more: tuple[str | None, str]) -> None:
    """Every output of the job writable, said now and not after the work: ``save`` (a
    folder), ``metrics_out`` and each ``(path, flag)`` of ``more`` (files).

    Raises:
        ConfigError: one that cannot be written, with its flag."""
    from paramserver.data.files import check_output

    check_output(save, "--save", folder=True)
    check_output(metrics_out, "--metrics-out", folder=False)
    for path, flag in more:
        check_output(path, flag, folder=False)


def write_metrics(metrics_out: str | None, report: dict[str, Any]) -> None:
    """The report, as JSON, to ``--metrics-out`` (if given)."""
    from paramserver.data.files import report_json, write_text

    if metrics_out:
        write_text(metrics_out, report_json(report, indent=1))


@dataclass(frozen=True)
class Watch:
    """What the command line watches a scheduled job with: ``announce(cluster)`` once its
    nodes are up (where to look: the scheduler, the logs, the dashboard), and
    ``progress(status, seconds)`` twice a second while the workers run."""

    announce: Callable[[Any], Any] | None = None
    progress: Callable[[dict[str, Any], float], None] | None = None


def rounds_warmup(filters: FilterSpec) -> Any:
    """What a scheduled app's cluster loads before it forks its nodes: the servers' dense
    tables (every scheduled app's are dense), the kernels of its tables' filters, if any,
    and the client's routing; not the hash tables' nor training's parsers and models, nor
    other filters' kernels, which a local cluster otherwise loads for every job (~0.2 s
    each)."""
    from paramserver._runtime.warm import Warmup
    from paramserver.client.warmup import warm_client
    from paramserver.server.warmup import warm_server

    return Warmup(servers=functools.partial(warm_server, ("dense",), filters),
                  workers=functools.partial(warm_client, filters=filters))


@dataclass(frozen=True)
class Ran:
    """What the workers of a scheduled job returned, and how the run went."""

    per_worker: list[dict[str, Any]]  # of the workers that took part, in rank order
    lost: list[str]  # a line for each worker that died (the others went on)
    joined: int  # workers that joined midway and left at once (``joined_midway``)
    seconds: float  # from the workers' start to the last one's end


class RoundsJob:
    """A scheduled app's cluster, as a context manager: ``servers`` and ``workers`` started
    (``cluster_options``: more ``open_cluster`` arguments; the log level WARNING unless
    they say otherwise), the losses of dying servers surfaced in one line unless
    ``allow_loss`` (``surfacing_losses``), and with ``scratch_prefix`` a temporary folder
    (``scratch``) for the parts the driver writes and the workers read, removed last."""

    def __init__(self, *, servers: int, workers: int, cluster_options: dict[str, Any] | None, allow_loss: bool,
                 scratch_prefix: str | None = None, replicas: int = 1, filters: Any = None,
                 watch: Watch | None = None) -> None:
        self.servers, self.workers, self.allow_loss = servers, workers, allow_loss
        self.watch = watch or Watch()
        # what every table of the job is created with: its copies, and its filters (``paramserver.filters``)
        self.table_options: dict[str, Any] = {"replicas": replicas, "filters": filters}
        self.options = {"log_level": "WARNING", "warm": rounds_warmup(FilterSpec.parse(filters)),
                        **(cluster_options or {})}
        self.scratch_prefix = scratch_prefix
        self.scratch = ""
        self._stack = ExitStack()

    def __enter__(self) -> RoundsJob:
        from paramserver.cluster.launch import open_cluster

        with self._stack as stack:
            if self.scratch_prefix is not None:
                self.scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix=self.scratch_prefix))
            self.cluster = stack.enter_context(open_cluster(servers=self.servers, workers=self.workers,
                                                            **self.options))
            self.losses = stack.enter_context(surfacing_losses(self.cluster, self.allow_loss))
            if self.watch.announce is not None:
                self.watch.announce(self.cluster)
            self._stack = stack.pop_all()  # entered: they are left in __exit__
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> bool | None:
        return self._stack.__exit__(kind, error, tb)

    @property
    def client(self) -> Any:
        """The driver's client of the cluster."""
        return self.cluster.client

    def tables(self, resume: RoundResume | None, create: Callable[[Any], None]) -> None:
        """The job's tables: restored (with their specs) from the checkpoint ``resume`` goes
        on from, else made by ``create(client)``."""
        if resume is not None:
            self.client.restore(resume.step, allow_unverified=resume.allow_unverified)
        else:
            create(self.client)

    def run(self, worker: Callable[..., dict[str, Any]], *args: Any) -> Ran:
        """``worker(client, *args)`` on every worker, a dead one survived (``run_elastic``);
        with ``allow_loss`` the workers go on through a server's loss of data, and the
        driver's report lists it (the driver decides, in ``surfacing_losses``)."""
        t = time.perf_counter()
        fn = functools.partial(_with_bytes, tolerating_loss(worker) if self.allow_loss else worker)
        per_worker, lost = self._watched(fn, *args)
        per_worker, joined = took_part(per_worker)
        return Ran(per_worker, lost, joined, time.perf_counter() - t)

    def _watched(self, fn: Callable[..., dict[str, Any]], *args: Any) -> tuple[list[Any], list[str]]:
        """``run_elastic``, and while it runs the cluster's progress handed to the watch
        (the rounds done, twice a second)."""
        show = self.watch.progress
        if show is None:
            found: tuple[list[Any], list[str]] = self.cluster.run_elastic(fn, *args)
            return found
        t0 = time.perf_counter()
        with ThreadPoolExecutor(1, thread_name_prefix="paramserver-rounds") as pool:
            running = pool.submit(self.cluster.run_elastic, fn, *args)
            while not running.done():
                show(self.client.job.status(), time.perf_counter() - t0)
                wait([running], timeout=0.5)
            show(self.client.job.status(), time.perf_counter() - t0)
            done: tuple[list[Any], list[str]] = running.result()
            return done

    def wire(self, ran: Ran) -> dict[str, Any]:
        """The report's lines on the wire: the workers' bytes each way, and with filters
        each one's bytes in and out per table and direction (``Client.filter_stats``)."""
        out: dict[str, Any] = {"bytes_sent": sum(r.get("bytes_sent", 0) for r in ran.per_worker),
                               "bytes_received": sum(r.get("bytes_received", 0) for r in ran.per_worker)}
        if self.table_options.get("filters"):
            out["filters"] = str(FilterSpec.parse(self.table_options["filters"]))
            out["filter_bytes"] = merge_stats([r.get("filters", {}) for r in ran.per_worker])
        return out


def _with_bytes(worker: Callable[..., dict[str, Any]], client: Any, *args: Any) -> dict[str, Any]:
    """``worker``'s result, with the bytes its client moved and what its filters took off."""
    result = worker(client, *args)
    return {**result, "bytes_sent": client.stats.bytes_sent, "bytes_received": client.stats.bytes_received,
            "filters": client.stats.filter_stats()}
