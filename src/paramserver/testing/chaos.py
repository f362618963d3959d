"""The fault-injection campaign: randomized workloads under random faults, on the
simulated cluster, with the invariants checked as they run (``paramserver chaos``).

A scenario draws everything from its seed: the cluster's shape, the workload, the
faults and when they strike.  ``run(scenario, seed)`` returns the violations, and with
``trace=True`` the run's event trace, the same for the same seed, bit for bit.

``mutations.MUTATIONS`` switch one safety mechanism off for a run, to prove the
campaign notices: a campaign that cannot fail checks nothing.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from paramserver.tables.spec import TableSpec
from paramserver.testing.campaign import SCENARIO_NAMES
from paramserver.testing.cluster import SimCluster, SimServer, SimWorker
from paramserver.testing.invariants import Invariants, Violation
from paramserver.testing.mutations import mutated
from paramserver.testing.restore import CheckpointRestore
from paramserver.testing.sim import Faults
from paramserver.wire.message import Op

KEYS = 48  # counters per table: few, so that pushes collide and retries matter
RUN_S = 24.0  # virtual seconds of workload
SETTLE_S = 60.0  # then faults heal, and the cluster gets this long to finish every call


# ---- scenarios ---------------------------------------------------------------------------
@dataclass
class Plan:
    """What one seed of a scenario does."""

    servers: int = 3
    workers: int = 2
    replicas: int = 2
    staleness: int | None = None  # a table of bounded staleness (workers tick their clocks)
    failures: list[tuple[float, str]] = field(default_factory=list)  # (when, kind)
    faults: Faults = field(default_factory=Faults)
    rates: dict[str, float] = field(default_factory=dict)  # host -> clock rate
    speeds: list[float] = field(default_factory=list)  # per worker: mean think time between calls
    shards: int = 0  # a training job of this many shards (workers take them from the scheduler)
    epochs: int = 1
    checkpoint_every: int = 0  # the job checkpoints every N shards done (0: never)
    lossless: bool = False  # no fault of the plan may cost data: any loss the scheduler records is a violation


def _client_links(a: str, b: str) -> bool:
    """Requests and answers between workers and servers: lost, late, twice or out of order,
    they must still apply every push once (a push is resent with its seq)."""
    return (a.startswith("worker") and b.startswith("server")) or (a.startswith("server") and b.startswith("worker"))


def _counters(r: int) -> Callable[[random.Random], Plan]:
    def plan(rng: random.Random) -> Plan:
        p = Plan(servers=r + 1 + rng.randint(0, 1), workers=rng.randint(2, 3), replicas=r)
        p.faults = Faults(drop=0.01, duplicate=0.03, delay=0.1, delay_s=0.3, reorder=0.05, only=_client_links)
        kinds = ["crash", "restart", "pause", "cut-beats", "isolate"]
        for _ in range(max(1, r - 1)):  # at r = 1 one failure loses data, and must say so
            p.failures.append((rng.uniform(2, RUN_S - 6), rng.choice(kinds)))
        if rng.random() < 0.5:
            p.failures.append((rng.uniform(2, RUN_S - 4), rng.choice(["join", "leave"])))
        p.failures.append((rng.uniform(1, RUN_S - 2), "short-pause"))
        p.rates = {f"server-{i + 1}": rng.uniform(0.9, 1.1) for i in range(p.servers)}
        p.speeds = [rng.choice([0.02, 0.1, 0.3]) for _ in range(p.workers)]
        return p
    return plan


def _ssp(rng: random.Random) -> Plan:
    p = Plan(servers=3, workers=3, replicas=rng.choice([1, 2]), staleness=rng.randint(0, 2))
    p.faults = Faults(delay=0.2, delay_s=0.4, only=_client_links)
    p.speeds = [0.01, rng.choice([0.2, 0.5]), rng.choice([0.05, 0.3])]
    if rng.random() < 0.5:
        p.failures.append((rng.uniform(2, RUN_S - 4), "short-pause"))
    return p


def _membership(rng: random.Random) -> Plan:
    p = Plan(servers=3, workers=2, replicas=2)
    p.faults = Faults(delay=0.1, delay_s=0.2, only=_client_links)
    for _ in range(rng.randint(2, 4)):
        p.failures.append((rng.uniform(1, RUN_S - 4), rng.choice(["join", "join", "leave", "joiner-crash"])))
    p.speeds = [0.05, 0.1]
    return p


def _stalled_scheduler(rng: random.Random) -> Plan:
    p = Plan(servers=3, workers=2, replicas=2)
    p.failures = [(rng.uniform(2, 8), "stall-scheduler")]
    p.speeds = [0.05, 0.1]
    return p


def _stalled_server(rng: random.Random) -> Plan:
    p = Plan(servers=3, workers=2, replicas=2)
    p.failures = [(rng.uniform(2, 8), rng.choice(["pause", "short-pause"]))]
    p.speeds = [0.02, 0.1]
    return p


def _repair_pause(rng: random.Random) -> Plan:
    """A server crashes; while the repair copies its vnodes to new backups, a server that
    holds their last complete copy stops past the heartbeat timeout, as a JIT compile, a
    long collection or a swapped-out VM would.  It must be fenced and waited for, not
    written off: no data may be lost (``scheduler/detector.py``)."""
    p = Plan(servers=3 + rng.randint(0, 1), workers=2, replicas=2, lossless=True)
    p.faults = Faults(delay=0.1, delay_s=0.3, only=_client_links)
    p.failures = [(rng.uniform(2, 10), "crash-then-pause-source")]
    p.speeds = [0.02, 0.1]
    return p


def _partition(rng: random.Random) -> Plan:
    p = Plan(servers=3, workers=2, replicas=2)
    p.failures = [(rng.uniform(2, 8), rng.choice(["cut-beats", "cut-answers", "isolate"]))]
    p.speeds = [0.02, 0.1]
    return p


def _restore(rng: random.Random) -> Plan:
    """Checkpoint mid-run, go on (pushes, a crash, a join, or nothing), restore."""
    p = Plan(servers=3 + rng.randint(0, 1), workers=2, replicas=rng.choice([1, 2]))
    p.faults = Faults(drop=0.01, duplicate=0.02, delay=0.1, delay_s=0.3, reorder=0.05, only=_client_links)
    p.failures = [(rng.uniform(2, 8), "checkpoint-restore")]
    p.speeds = [rng.choice([0.02, 0.1]), rng.choice([0.05, 0.3])]
    return p


def _job(rng: random.Random) -> Plan:
    p = Plan(servers=3, workers=3, replicas=2, shards=rng.randint(6, 16), epochs=rng.randint(1, 3))
    p.checkpoint_every = rng.choice([0, 3, 5])
    p.faults = Faults(delay=0.1, delay_s=0.3, only=_client_links)
    for _ in range(rng.randint(1, 2)):
        p.failures.append((rng.uniform(0.5, 5), rng.choice(["worker-crash", "worker-pause", "crash", "short-pause"])))
    p.speeds = [0.05, 0.1, 0.2]
    return p


def _job_ssp(rng: random.Random) -> Plan:
    """A training job under BSP or SSP with coordinated checkpoints, through failures: each
    checkpoint drains the workers (idle ones leave the servers' vector clocks), and they
    must come back where their clocks were (issue 28.3: they came back at 0, and parked
    pulls waited for ever)."""
    p = Plan(servers=3, workers=rng.randint(1, 3), replicas=2, staleness=rng.randint(0, 2),
             shards=rng.randint(6, 12), epochs=rng.randint(1, 2))
    p.checkpoint_every = rng.choice([1, 2, 3])
    p.faults = Faults(delay=0.1, delay_s=0.3, only=_client_links)
    if rng.random() < 0.7:
        p.failures.append((rng.uniform(0.5, 5), rng.choice(["worker-crash", "crash", "short-pause"])))
    p.speeds = [0.05, 0.1, 0.2]
    return p


SCENARIOS: dict[str, Callable[[random.Random], Plan]] = {
    "counters-r1": _counters(1),
    "counters-r2": _counters(2),
    "counters-r3": _counters(3),
    "ssp": _ssp,
    "membership": _membership,
    "stalled-scheduler": _stalled_scheduler,
    "stalled-server": _stalled_server,
    "repair-pause": _repair_pause,
    "partition": _partition,
    "restore": _restore,
    "job": _job,
    "job-ssp": _job_ssp,
}
assert sorted(SCENARIOS) == sorted(SCENARIO_NAMES), "campaign.SCENARIO_NAMES lists the scenarios for --help"


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
        self.cluster = SimCluster(seed, servers=self.plan.servers, faults=self.plan.faults, trace=trace)
        for name, rate in self.plan.rates.items():
            if name in self.cluster.net.hosts:
                self.cluster.net.hosts[name].set_rate(rate)
        self.check = Invariants(self.cluster, KEYS)
        self.tables = {"counts": self.plan.replicas}
        if self.plan.staleness is not None:
            self.tables["ssp"] = self.plan.replicas
        self.ready = False
        self.stopping = False
        self.paused = False  # the workload waits (a checkpoint and restore is under way)
        self.restore: CheckpointRestore | None = None
        self.calls = 0
        self.limit_s = self.cluster.config.retry_timeout_s + 10.0
        self.sizes: list[int] = []  # the job's shards: examples in each

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
        for when, kind in self.plan.failures:
            c.net.at(when, self._failure, kind)
        c.net.every(c.sched_host, 1.0, self._watchdog)
        c.run(RUN_S)
        self.stopping = True
        self._heal()
        c.settle(lambda: not self.check.calls and c.ring_settled() and not self._copies_open()
                 and (not self.plan.shards or self._job_over()) and not (self.restore and self.restore.busy),
                 SETTLE_S)
        c.run(2 * c.config.heartbeat_timeout_s)  # repairs and late messages land
        self.check.overdue()
        for what, _ in self.check.calls.values():
            self.check.fail("hang", f"{what} never returned")
        if self.ready:
            self.check.final(self.tables)
            if self.plan.shards:
                self.check.job(self.sizes, self.plan.epochs)
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
                             consistency=self.plan.staleness if name == "ssp" else "asp")
            worker.create_table(spec, made)

        create()

    # ---- the workload -------------------------------------------------------------------
    def _next(self, w: SimWorker) -> None:
        if self.stopping or self.paused or not w.live or w.ring is None or not all(t in w.specs for t in self.tables):
            if not self.stopping and w.live:
                w.host.after(0.2, self._next, w)
            return
        i = self.cluster.workers.index(w)
        think = self.rng.expovariate(1 / self.plan.speeds[i % len(self.plan.speeds)])
        again = lambda: w.host.after(think, self._next, w)  # noqa: E731
        if self.plan.staleness is not None:
            self._ssp_step(w, again)
        elif self.rng.random() < 0.6:
            self._push(w, "counts", again)
        else:
            self._pull(w, "counts", again)

    def _keys(self) -> np.ndarray:
        return np.array(sorted(self.rng.sample(range(KEYS), self.rng.randint(1, 8))), np.uint64)

    def _push(self, w: SimWorker, table: str, then: Callable[[], None], keys: np.ndarray | None = None) -> None:
        keys = self._keys() if keys is None else keys
        ks = keys.astype(np.int64)
        call = self.check.call(f"{w.name} push to {table!r}", self.limit_s, w.name)
        self.check.pushed(call, table, ks)
        self.calls += 1

        def done(_: Any, error: str | None) -> None:
            self.check.push_done(call, w.name, table, ks, error)
            self.check.returned(call)
            then()

        if self.ops.random() < 0.5:  # +1 each: sgd at lr 1 on -1, or a plain add (both exactly once)
            w.push(table, keys, -np.ones((keys.shape[0], 1), np.float32), done)
        else:
            w.push(table, keys, np.ones((keys.shape[0], 1), np.float32), done, op="add")

    def _pull(self, w: SimWorker, table: str, then: Callable[[], None]) -> None:
        keys = self._keys()
        ks = keys.astype(np.int64)
        floor = self.check.floor(w.name, table, ks)
        call = self.check.call(f"{w.name} pull from {table!r}", self.limit_s, w.name)
        self.calls += 1

        def done(values: Any, error: str | None) -> None:
            self.check.returned(call)
            if error is None:
                self.check.read(w.name, table, ks, values, floor)
            then()

        w.pull(table, keys, done, clock=False)

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
    def _victim(self, spare: int = 1) -> SimServer | None:
        """A live server of the ring, if more than ``r + spare - 1`` are live: a fault takes
        one server, and the plan's later faults must not find the ring below r (a removal
        keeps a spare for them: it is no failure, and may be followed by one)."""
        live = [s for s in self.cluster.servers if s.live and s.id >= 0 and self.cluster.scheduler.ring is not None
                and s.id in self.cluster.scheduler.ring.servers]
        return self.rng.choice(live) if len(live) >= max(self.tables.values()) + spare else None

    def _failure(self, kind: str) -> None:
        c, net, timeout = self.cluster, self.cluster.net, self.cluster.config.heartbeat_timeout_s
        if kind == "checkpoint-restore":
            self.restore = CheckpointRestore(self)
            self.restore.start()
            return
        if kind == "stall-scheduler":
            c.sched_host.pause()
            net.after(self.rng.uniform(1.0, 2.0) * timeout, c.sched_host.resume)
            return
        if kind in ("worker-crash", "worker-pause"):
            live = [w for w in c.workers[1:] if w.live]
            if not live:
                return
            w = self.rng.choice(live)
            net.log(f"fault {kind} {w.name}")
            if kind == "worker-crash":
                w.host.crash()
                self.check.abandon(w.name)
            else:
                w.host.pause()
                net.after(self.rng.uniform(1.5, 3.0) * timeout, w.host.resume)
            return
        if kind == "crash-then-pause-source":
            self._crash_then_pause_source()
            return
        if kind in ("join", "joiner-crash"):
            server = c.add_server()
            self.check.servers_by_host[server.name] = server
            if kind == "joiner-crash":
                net.after(self.rng.uniform(0.05, 1.0), server.host.crash)
            return
        victim = self._victim(2 if kind == "leave" else 1)
        if victim is None:
            return
        net.log(f"fault {kind} server {victim.id}")
        if kind in ("crash", "restart"):
            victim.host.crash()
            if kind == "restart":  # the machine comes back without its memory: a new server joins
                net.after(self.rng.uniform(0.2, 2.0), self._failure, "join")
        elif kind == "pause":  # past the heartbeat timeout: declared dead, then it resumes
            victim.host.pause()
            net.after(self.rng.uniform(1.5, 3.0) * timeout, victim.host.resume)
        elif kind == "short-pause":
            victim.host.pause()
            net.after(self.rng.uniform(0.1, 0.6) * timeout, victim.host.resume)
        elif kind in ("cut-beats", "cut-answers", "isolate"):
            pairs = {("cut-beats", True), ("cut-answers", False), ("isolate", True), ("isolate", False)}
            for k, out in pairs:
                if k == kind:
                    c.net.faults.cut.add((victim.name, "scheduler") if out else ("scheduler", victim.name))
            if kind == "isolate":
                for h in net.hosts:
                    c.net.faults.cut |= {(victim.name, h), (h, victim.name)}
            net.after(self.rng.uniform(1.5, 3.0) * timeout, self._heal_cuts)
        elif kind == "leave":
            worker = c.workers[0]
            worker._ask_scheduler({"op": Op.REMOVE_SERVER.value, "node_id": victim.id}, lambda m: None)

    def _crash_then_pause_source(self) -> None:
        """Crash a server, then pause a source of the repair that follows, before it has
        confirmed its copies: it then holds the last complete copy of some vnodes."""
        c, net, timeout = self.cluster, self.cluster.net, self.cluster.config.heartbeat_timeout_s
        victim = self._victim()
        if victim is None:
            return
        net.log(f"fault crash server {victim.id}")
        victim.host.crash()
        give_up = net.time + 3 * timeout

        def watch() -> bool:
            m = c.scheduler.membership.migration
            sources = [s for s in c.servers if m is not None and not m.flip and s.id in m.waiting and s.live]
            if not sources:
                return net.time < give_up
            source = self.rng.choice(sources)
            net.log(f"fault pause server {source.id} (a source of repair {m.id if m else '?'})")
            source.host.pause()
            net.after(self.rng.uniform(1.5, 3.0) * timeout, source.host.resume)
            return False

        net.every(c.sched_host, 0.01, watch)

    def _heal_cuts(self) -> None:
        self.cluster.net.faults.cut.clear()

    def _heal(self) -> None:
        net = self.cluster.net
        net.faults = Faults()
        for host in net.hosts.values():
            host.resume()


def run(scenario: str, seed: int, mutation: str | None = None, trace: bool = False) -> Result:
    """One seed of one scenario (``mutation``: a safety mechanism switched off)."""
    with mutated(mutation):
        return Run(scenario, seed, trace).go()
