"""The fault-injection campaign: randomized workloads under random faults, on the
simulated cluster, with the invariants checked as they run (``paramserver chaos``).

A scenario draws everything from its seed: the cluster's shape, the workload, the
faults and when they strike.  ``run(scenario, seed)`` returns the violations, and with
``trace=True`` the run's event trace, the same for the same seed, bit for bit.

``mutations.MUTATIONS`` switch one safety mechanism off for a run, to prove the
campaign notices: a campaign that cannot fail checks nothing.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from paramserver.client.row_cache import RowCacheSpec
from paramserver.tables.spec import TableSpec
from paramserver.testing.cache_ledger import CacheLedger
from paramserver.testing.cluster import SimCluster
from paramserver.testing.faults import Failures
from paramserver.testing.invariants import Invariants, Violation
from paramserver.testing.mutations import mutated
from paramserver.testing.restore import CheckpointRestore
from paramserver.testing.scenarios import RUN_S, SCENARIOS
from paramserver.testing.worker import SimWorker
from paramserver.wire.message import Op

KEYS = 48  # counters per table: few, so that pushes collide and retries matter
SETTLE_S = 60.0  # then faults heal, and the cluster gets this long to finish every call


# ---- one run -------------------------------------------------------------------------------
@dataclass
class Result:
    scenario: str
    seed: int
    violations: list[Violation]
    trace: list[str] | None
    calls: int
    virtual_s: float


class Run:
    """One scenario, one seed: the cluster, the workload, the faults, the checks."""

    def __init__(self, scenario: str, seed: int, trace: bool = False) -> None:
        self.scenario, self.seed = scenario, seed
        self.rng = random.Random(f"{scenario}/{seed}")
        self.ops = random.Random(f"{scenario}/{seed}/ops")  # a push's op: its own stream, so the rest
        # of a seed's run (and the regression seeds) stay what they were before ops were drawn
        self.plan = SCENARIOS[scenario](self.rng)
        self.cluster = SimCluster(seed, servers=self.plan.servers, faults=self.plan.faults, trace=trace,
                                  key_cache_bytes=self.plan.key_cache_bytes)
        for name, rate in self.plan.rates.items():
            if name in self.cluster.net.hosts:
                self.cluster.net.hosts[name].set_rate(rate)
        self.check = Invariants(self.cluster, KEYS, frozenset({"life"}) if self.plan.lifecycle else frozenset())
        self.tables = {"counts": self.plan.replicas}
        if self.plan.staleness is not None:
            self.tables["ssp"] = self.plan.replicas
        if self.plan.lifecycle:  # a second table whose keys come and go: copies must agree
            self.tables["life"] = self.plan.replicas
        self.ready = False
        self.stopping = False
        self.paused = False  # the workload waits (a checkpoint and restore is under way)
        self.restore: CheckpointRestore | None = None
        self.failures = Failures(self)
        self.calls = 0
        self.limit_s = self.cluster.config.retry_timeout_s + 10.0
        self.ledger = (CacheLedger(self.check, "counts", RowCacheSpec.parse(self.plan.row_cache).s, KEYS,
                                   self.limit_s) if self.plan.row_cache else None)
        self.sizes: list[int] = []  # the job's shards: examples in each
        lists = random.Random(f"{scenario}/{seed}/lists")  # own stream: other scenarios' runs unchanged
        self.key_lists = [np.array(sorted(lists.sample(range(KEYS), lists.randint(1, 12))), np.uint64)
                          for _ in range(self.plan.key_lists)]

    def go(self) -> Result:
        c = self.cluster
        for server in c.servers:
            self.check.servers_by_host[server.name] = server
        first = c.add_worker()
        first.registered = lambda: self._create_tables(first)
        for _ in range(self.plan.workers - 1):
            c.add_worker()
        for w in c.workers:
            w.on_exit = lambda w=w: self.check.abandon(w.name)
            if self.ledger is not None:
                w.cache_port.watch = self.ledger.watch
        for when, kind in self.plan.failures:
            c.net.at(when, self.failures.strike, kind)
        c.net.every(c.sched_host, 1.0, self._watchdog)
        c.run(RUN_S)
        self.stopping = True
        self.failures.heal()
        settled = lambda: (not self.check.calls and c.ring_settled() and not self._copies_open()  # noqa: E731
                           and (not self.plan.shards or self._job_over()) and not (self.restore and self.restore.busy))
        c.settle(settled, SETTLE_S)
        if self.ledger is not None:  # every live worker pushes what its row cache holds
            self._push_held()
            c.settle(settled, SETTLE_S)
        c.run(2 * c.config.heartbeat_timeout_s)  # repairs and late messages land
        self._stuck()
        self.check.overdue()
        for what, _ in self.check.calls.values():
            self.check.fail("hang", f"{what} never returned")
        if self.ready:
            self.check.final(self.tables)
            if self.plan.shards:
                self.check.job(self.sizes, self.plan.epochs)
            if self.ledger is not None:
                self.ledger.final(c.workers)
        else:
            self.check.fail("no-start", "the tables were never created")
        if self.plan.lossless:
            for loss in c.scheduler.losses:
                self.check.fail("lost-on-pause", f"server {loss.get('server')} was written off with the last copy "
                                f"of {loss.get('vnodes')} vnode(s) of {loss.get('tables')}, though it was alive")
        self._forget_checkpoints()
        return Result(self.scenario, self.seed, self.check.violations, c.net.trace, self.calls, c.net.time)

    def _job_over(self) -> bool:
        job = self.cluster.scheduler.jobs.job
        return job is not None and job.finished

    def _forget_checkpoints(self) -> None:
        import fsspec

        fs = fsspec.filesystem("memory")
        if fs.exists(self.checkpoint_url):
            fs.rm(self.checkpoint_url, recursive=True)

    def _watchdog(self) -> bool:
        self.check.overdue()
        return True

    def _stuck(self) -> None:
        """Faults healed long ago: a server still waiting on another (a forward, a vnode
        copy), or a membership change still under way, waits on something lost."""
        for server in self.cluster.servers:
            if server.live and server.node.peers.awaiting:
                self.check.fail("stuck", f"{server.name} still waits on {len(server.node.peers.awaiting)} "
                                         "request(s) to other servers after the faults healed")
        if not self.cluster.ring_settled():
            self.check.fail("stuck", "a membership change never finished after the faults healed")

    def _copies_open(self) -> bool:
        return any(s.live and (s.node.copies.queue or s.node.peers.awaiting) for s in self.cluster.servers)

    def _create_tables(self, worker: SimWorker) -> None:
        names = list(self.tables)

        def made(_: Any, error: str | None) -> None:
            if error is not None:
                self.check.fail("setup", f"create_table failed: {error}")
                return
            names.pop(0)
            if names:
                create()
                return
            self.ready = True
            for w in self.cluster.workers:
                w.refresh()
            if self.plan.shards:
                self._start_job(worker)
                return
            for w in self.cluster.workers:
                w.host.after(0.1, self._next, w)

        def create() -> None:
            name = names[0]
            spec = TableSpec(name, dim=1, optimizer={"name": "sgd", "lr": 1.0}, replicas=self.tables[name],
                             consistency=self.plan.staleness if name == "ssp" else "asp",
                             filters=self.plan.filters or None,
                             lifecycle=self.plan.lifecycle if name == "life" else None,
                             memory=self.plan.memory if name == "counts" else 0)
            worker.create_table(spec, made)

        create()

    # ---- the workload -------------------------------------------------------------------
    def _next(self, w: SimWorker) -> None:
        if self.stopping or self.paused or not w.live or w.ring is None or not all(t in w.specs for t in self.tables):
            if not self.stopping and w.live:
                w.host.after(0.2, self._next, w)
            return
        if self.plan.row_cache and "counts" not in w.row_caches:
            w.cache_rows("counts", self.plan.row_cache)
        i = self.cluster.workers.index(w)
        think = self.rng.expovariate(1 / self.plan.speeds[i % len(self.plan.speeds)])
        again = lambda: w.host.after(think, self._next, w)  # noqa: E731
        table = "life" if self.plan.lifecycle and self.rng.random() < 0.5 else "counts"
        if self.plan.staleness is not None:
            self._ssp_step(w, again)
        elif self.rng.random() < 0.6:
            self._push(w, table, again)
        else:
            self._pull(w, table, again)

    def _keys(self) -> np.ndarray:
        if self.plan.cache_keys:
            return np.array(sorted(self.rng.sample(range(self.plan.cache_keys), self.rng.randint(1, 4))), np.uint64)
        if self.key_lists:
            return self.key_lists[self.rng.randrange(len(self.key_lists))]
        return np.array(sorted(self.rng.sample(range(KEYS), self.rng.randint(1, 8))), np.uint64)

    def _push(self, w: SimWorker, table: str, then: Callable[[], None], keys: np.ndarray | None = None) -> None:
        keys = self._keys() if keys is None else keys
        ks = keys.astype(np.int64)
        if table in w.row_caches:
            self._push_cached(w, table, keys, then)
            return
        call = self.check.call(f"{w.name} push to {table!r}", self.limit_s, w.name)
        self.check.pushed(call, table, ks)
        self.calls += 1

        def done(_: Any, error: str | None) -> None:
            self.check.push_done(call, w.name, table, error)
            self.check.returned(call)
            then()

        if self.ops.random() < 0.5:  # +1 each: sgd at lr 1 on -1, or a plain add (both exactly once)
            w.push(table, keys, -np.ones((keys.shape[0], 1), np.float32), done)
        else:
            w.push(table, keys, np.ones((keys.shape[0], 1), np.float32), done, op="add")

    def _push_cached(self, w: SimWorker, table: str, keys: np.ndarray, then: Callable[[], None]) -> None:
        """A push through ``w``'s row cache: -1 to each key (sgd at lr 1: +1), gathered
        or sent; what reaches the servers is counted by the ledger (``watch``)."""
        assert self.ledger is not None
        self.ledger.hand(w.name, keys.astype(np.int64))
        call = self.check.call(f"{w.name} push to {table!r}", self.limit_s, w.name)
        self.calls += 1

        def done(_: Any, error: str | None) -> None:
            self.check.returned(call)
            then()

        w.push(table, keys, -np.ones((keys.shape[0], 1), np.float32), done)

    def _push_held(self) -> None:
        """Every live worker pushes what its row caches hold (``Client.push_held``)."""
        for w in self.cluster.workers:
            for table in list(w.row_caches) if w.live else []:
                call = self.check.call(f"{w.name} push_held of {table!r}", self.limit_s, w.name)
                w.push_held(table, functools.partial(self._held_pushed, call))

    def _held_pushed(self, call: int, _: Any, error: str | None) -> None:
        self.check.returned(call)

    def _pull(self, w: SimWorker, table: str, then: Callable[[], None]) -> None:
        keys = self._keys()
        ks = keys.astype(np.int64)
        if table in w.row_caches:
            self._pull_cached(w, table, keys, then)
            return
        # a key's own pushes are a floor unless the table may drop its updates (admission) or the key (eviction)
        floor = self.check.floor(w.name, table, ks) if table != "life" else np.zeros(ks.shape[0], np.int64)
        call = self.check.call(f"{w.name} pull from {table!r}", self.limit_s, w.name)
        self.calls += 1

        def done(values: Any, error: str | None) -> None:
            self.check.returned(call)
            if error is None:
                self.check.read(w.name, table, ks, values, floor)
            then()

        w.pull(table, keys, done)

    def _pull_cached(self, w: SimWorker, table: str, keys: np.ndarray, then: Callable[[], None]) -> None:
        """A pull through ``w``'s row cache: no more than ``s`` of a key's pushes missed."""
        assert self.ledger is not None
        ks = keys.astype(np.int64)
        floor = self.ledger.floor(ks)
        call = self.check.call(f"{w.name} pull from {table!r}", self.limit_s, w.name)
        self.calls += 1

        def done(values: Any, error: str | None) -> None:
            self.check.returned(call)
            if error is None and self.ledger is not None:
                # a cache that trains its rows may read its own gradients not sent yet besides the servers'
                # (those of a row it holds, not those it gave up): none is counted twice, none is a floor
                local = w.row_caches[table].local
                own = self.ledger.unsent(w.name, ks) if local else 0
                self.check.read(w.name, table, ks, values - own, np.full(ks.shape[0], -1 << 62 if local else 0))
                self.ledger.read(w.name, ks, values, floor)
            then()

        w.pull(table, keys, done)

    def _ssp_step(self, w: SimWorker, then: Callable[[], None], read_after: bool = True) -> None:
        """Each worker pushes +1 to its own key once a clock, then ticks; pulls (at its
        clock) every worker's key, which must show the clocks all of them finished."""
        i = self.cluster.workers.index(w)
        mine = np.array([i], np.uint64)

        def ticked(_: Any, error: str | None) -> None:
            self.check.returned(calls.pop())
            if read_after:
                read()
            else:
                then()

        def pushed() -> None:
            calls.append(self.check.call(f"{w.name} clock", self.limit_s, w.name))  # a crash abandons it
            w.tick(ticked)

        def read() -> None:
            keys = np.arange(len(self.cluster.workers), dtype=np.uint64)
            clock, s = w.clock, int(self.plan.staleness or 0)
            least = np.full(keys.shape[0], max(0, clock - s), np.int64)
            pull_call = self.check.call(f"{w.name} ssp pull", self.limit_s, w.name)

            def done(values: Any, error: str | None) -> None:
                self.check.returned(pull_call)
                if error is None:
                    self.check.staleness(w.name, "ssp", clock, s, keys.astype(np.int64), values, least)
                then()

            w.pull("ssp", keys, done)

        calls: list[int] = []
        self._push(w, "ssp", pushed, mine)

    def _batch(self, w: SimWorker, then: Callable[[], None]) -> None:
        """A training worker's batch under BSP/SSP: pull at its clock (gated by the slowest
        worker holding a shard), push +1 to its own key, tick.  The pull comes first, as a
        worker's next batch's does after a checkpoint drained every worker."""
        keys = np.arange(len(self.cluster.workers), dtype=np.uint64)
        pull_call = self.check.call(f"{w.name} batch pull", self.limit_s, w.name)

        def pulled(_: Any, error: str | None) -> None:
            self.check.returned(pull_call)
            self._ssp_step(w, then, read_after=False)

        w.pull("ssp", keys, pulled)

    # ---- a training job ------------------------------------------------------------------
    def _start_job(self, w: SimWorker) -> None:
        self.sizes = [self.rng.randint(3, 12) for _ in range(self.plan.shards)]
        header: dict[str, Any] = {"op": Op.JOB_START.value, "shards": [[i, n] for i, n in enumerate(self.sizes)],
                                  "epochs": self.plan.epochs}
        if self.plan.checkpoint_every:
            header["checkpoint"] = {"url": self.checkpoint_url, "every": self.plan.checkpoint_every,
                                    "timeout_s": 20.0}
        call = self.check.call(f"{w.name} job_start", self.limit_s, w.name)

        def started(msg: Any) -> None:
            self.check.returned(call)
            if msg.op is not Op.OK:
                self.check.fail("setup", f"job_start failed: {msg.header.get('error')}")
                return
            for worker in self.cluster.workers:
                worker.host.after(0.1, self._next_shard, worker)

        w._ask_scheduler(header, started)

    @property
    def checkpoint_url(self) -> str:
        return f"memory://paramserver-chaos/{self.scenario}/{self.seed}"

    def _job_call(self, w: SimWorker, header: dict[str, Any], on_ok: Callable[[Any], None]) -> None:
        """Ask the scheduler a job call; an answer other than OK must come from a worker
        it declared dead."""
        if not w.live:
            return
        call = self.check.call(f"{w.name} {header['op']}", self.limit_s, w.name)

        def answered(msg: Any) -> None:
            self.check.returned(call)
            if msg.op is not Op.OK:
                self._declared_dead(w, msg)
            else:
                on_ok(msg)

        w._ask_scheduler(header, answered)

    def _next_shard(self, w: SimWorker) -> None:
        def got(msg: Any) -> None:
            if not msg.header.get("done"):
                sid, shard, epoch = msg.header["shard_id"], msg.header["shard"], msg.header["epoch"]
                self._work(w, sid, epoch, int(shard[1]), self.rng.randint(2, 6))

        self._job_call(w, {"op": Op.NEXT_SHARD.value}, got)

    def _work(self, w: SimWorker, sid: int, epoch: int, examples: int, pushes: int) -> None:
        """Train on a shard (a few pushes), then report it done with its examples."""
        if not w.live:
            return
        if pushes:
            i = self.cluster.workers.index(w)
            think = self.rng.expovariate(1 / self.plan.speeds[i % len(self.plan.speeds)])
            then = lambda: w.host.after(think, self._work, w, sid, epoch, examples, pushes - 1)  # noqa: E731
            if self.plan.staleness is not None:  # a clock a batch, as a training worker: pull, push, tick
                self._batch(w, then)
            else:
                self._push(w, "counts", then)
            return
        self._job_call(w, {"op": Op.SHARD_DONE.value, "shard_id": sid, "epoch": epoch,
                           "stats": {"examples": examples}}, lambda msg: self._next_shard(w))

    def _declared_dead(self, w: SimWorker, msg: Any) -> None:
        """The scheduler refused a job call: fine only for a worker it declared dead (a
        paused one, resumed), which then exits as a real worker does."""
        if w.node_id in self.cluster.scheduler.nodes:
            self.check.fail("job", f"{w.name}: {msg.header.get('error')}")
            return
        self.cluster.net.log(f"exit {w.name} (declared dead: {msg.header.get('error')})")
        w.host.crash()
        self.check.abandon(w.name)

    # ---- faults -------------------------------------------------------------------------


def run(scenario: str, seed: int, mutation: str | None = None, trace: bool = False) -> Result:
    """One seed of one scenario (``mutation``: a safety mechanism switched off)."""
    with mutated(mutation):
        return Run(scenario, seed, trace).go()
