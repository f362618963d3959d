"""One nemesis run: real ``paramserver scheduler`` and ``server`` processes and the counters'
client, each on an emulated host of its own; the plan's faults applied one by one and healed;
then the counters read back and checked (``check``).

A server that stops (SIGKILLed by the plan, or one that learns it was declared dead while cut off)
is started again by the run's supervisor, as a service manager would, except while the plan holds
it down.  Every wait has a deadline; what a run waited on when it ran out is named in its verdict.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

from paramserver.testing.nemesis import check
from paramserver.testing.nemesis.check import Stuck
from paramserver.testing.nemesis.hosts import Emulated, Undo
from paramserver.testing.nemesis.plan import Fault, Plan
from paramserver.testing.nemesis.proxied import emulated

PORT = 7700
SETTLE_S = 60.0  # the longest a run waits for the cluster, the first add, or the last one after the heal
STUCK_S = 30.0  # no add acknowledged this long after a heal: stuck


@dataclass
class Node:
    role: str
    host: int
    log: IO[bytes]
    proc: subprocess.Popen[bytes] | None = None
    held: bool = False  # the plan keeps it down (a kill, until its restart)
    starts: int = 0


@dataclass
class Outcome:
    plan: Plan
    verdict: check.Verdict
    seconds: float
    restarts: int
    folder: str
    events: list[str] = field(default_factory=list)
    network: str = ""  # what the hosts were: "namespaces" or "proxy"

    def summary(self) -> dict[str, Any]:
        return {"seed": self.plan.seed, **self.verdict.summary(), "network": self.network,
                "seconds": round(self.seconds, 1),
                "restarts": self.restarts, "events": self.events, "folder": self.folder,
                "plan": json.loads(self.plan.to_json())}


class Workload(Protocol):
    """What a run puts on the client host and checks afterwards (``jobs.py``): the counters, or a
    training job.  Its lines (``log``, in the run's folder) carry ``t`` and, for each step of
    progress, ``"ok": true``: a heal is followed by progress (``check.progress``)."""

    log: str
    ended_at: float | None  # when it ended by itself (monotonic), if it did
    looks: bool  # its log also says, with ``"copying"``, whether the cluster has vnode copies in flight

    def start(self, run: Run) -> None: ...

    def ended(self, run: Run) -> bool:
        """It finished by itself (a job that ran to its end): the plan's later faults are not struck.
        Raises ``Stuck`` if it ended in a way it must not have."""

    def finish(self, run: Run, heals: list[float], verdict: check.Verdict) -> None:
        """After the last heal: progress seen, the workload ended, what it left checked."""

    def stop(self) -> None:
        """Whatever of it still runs, killed (the run is over, or failed)."""


class Run:
    def __init__(self, hosts: Emulated, plan: Plan, folder: str, workload: Workload) -> None:
        self.hosts, self.plan, self.folder, self.workload = hosts, plan, folder, workload
        self.scheduler = f"tcp://{hosts.address(0)}:{PORT}"
        self.env = {**os.environ, "PARAMSERVER_LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1"}
        self.nodes = [self._node("scheduler", 0)] + [self._node(f"server{h}", h) for h in range(1, plan.servers + 1)]
        self.events: list[str] = []
        self._lines: list[dict[str, Any]] = []  # the workload's log, read up to byte _read_to
        self._read_to = 0
        self.t0 = time.monotonic()

    def _node(self, role: str, host: int) -> Node:
        return Node(role, host, open(os.path.join(self.folder, f"{role}.log"), "ab"))

    def spawn(self, host: int, args: list[str], log: IO[bytes]) -> subprocess.Popen[bytes]:
        """``python ARGS`` on emulated host ``host``, its output to ``log``."""
        return subprocess.Popen([*self.hosts.exec(host), sys.executable, *args], env=self.env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def _start(self, node: Node) -> None:
        if node.role == "scheduler":
            args = ["-m", "paramserver", "scheduler", *self.hosts.listen(node.host, PORT),
                    "--servers", str(self.plan.servers)]
        else:
            args = ["-m", "paramserver", "server", *self.hosts.listen(node.host), "--scheduler", self.scheduler]
        node.proc = self.spawn(node.host, args, node.log)
        node.starts += 1
        if node.starts > 1:
            self.note(f"{node.role} started again")

    def note(self, what: str) -> None:
        self.events.append(f"{time.monotonic() - self.t0:7.2f} {what}")

    def supervise(self) -> None:
        """Start again a server that stopped, unless the plan holds it down."""
        for node in self.nodes[1:]:
            if node.proc is not None and node.proc.poll() is not None and not node.held:
                self.note(f"{node.role} exited ({node.proc.returncode})")
                self._start(node)

    def wait(self, until: float) -> None:
        while time.monotonic() < until:
            self.supervise()
            self.workload.ended(self)
            time.sleep(0.05)

    # -- faults --------------------------------------------------------------------------
    def apply(self, f: Fault) -> Undo:
        """Strike ``f``; what undoes it on the network (nothing for a pause or a kill)."""
        h, everyone = self.hosts, range(self.plan.hosts)
        self.note(f"{f.kind} {list(f.hosts)} for {f.duration:g} s" + (f" ({f.arg})" if f.arg else ""))
        others = [x for x in everyone if x not in f.hosts]
        if f.kind in ("isolate", "isolate-client", "halves"):
            return h.partition(f.hosts, others)
        if f.kind == "oneway":
            return h.partition(f.hosts, others, both=False)
        if f.kind == "oneway-in":
            return h.partition(others, f.hosts, both=False)
        if f.kind == "scheduler-cut":
            return h.partition([0], range(1, self.plan.servers + 1))
        if f.kind == "loss":
            return [u for o in others for u in h.lose(f.hosts[0], o, f.arg) + h.lose(o, f.hosts[0], f.arg)]
        if f.kind == "slow":
            return h.slow(f.hosts[0], "200kbit")
        if f.kind == "delay":
            return h.delay(f.hosts[0], f.arg, f.arg / 5)
        if f.kind == "kill":
            self.nodes[f.hosts[0]].held = True
        self._signal(f.hosts[0], signal.SIGSTOP if f.kind == "pause" else signal.SIGKILL)
        return []

    def heal(self, f: Fault, undo: Undo) -> None:
        self.note(f"heal {f.kind} {list(f.hosts)}")
        if f.kind == "pause":
            self._signal(f.hosts[0], signal.SIGCONT)
        elif f.kind == "kill":
            self.nodes[f.hosts[0]].held = False
        self.hosts.undo(undo)

    def _signal(self, host: int, sig: signal.Signals) -> None:
        proc = self.nodes[host].proc
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, sig)

    # -- the run -------------------------------------------------------------------------
    def start(self) -> None:
        for node in self.nodes:
            self._start(node)
        self.workload.start(self)

    def acks(self) -> list[dict[str, Any]]:
        """The workload's log so far: what was read before, and its complete lines written since."""
        try:
            with open(os.path.join(self.folder, self.workload.log), "rb") as f:
                f.seek(self._read_to)
                more = f.read()
        except FileNotFoundError:
            return self._lines
        whole = more[:more.rfind(b"\n") + 1]  # a line being written is read next time
        self._read_to += len(whole)
        self._lines += check.read_log(whole.decode())
        return self._lines

    def first_ack_after(self, t: float, what: str) -> float:
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline:
            first = check.first_progress(self.acks(), t)
            if first is not None:
                return first
            self.wait(time.monotonic() + 0.2)
        raise Stuck(f"no progress (an add acknowledged, examples trained) within {SETTLE_S:g} s {what}")

    def settled(self) -> bool:
        """Before a kill: wait, up to ``SETTLE_S``, for a look of the workload's (taken since) that
        saw no vnode copy in flight or unconfirmed; False (the kill is not struck) if the job
        trained its last rows first, as for any fault due after its end (the watch stops looking
        then).  A server killed while a failover's repair still copies what it holds is a second
        failure within the first, which replicas 2 loses by design (``plan.KILL_SPACING_S``): a
        plan means one failure at a time, and on a loaded machine the repair after a failover
        can outlast the plan's gap (make test on two cores: killed 1.5 s after the failover, 64
        vnodes lost).  A workload that does not look (the counters: their plans space kills
        apart) is not waited for."""
        if not self.workload.looks:
            return True
        since = time.monotonic()
        while True:
            lines = self.acks()
            if any(x.get("finished") for x in lines) or self.workload.ended(self):
                return False
            if any(not x["copying"] for x in lines if "copying" in x and x["t"] >= since):
                break
            if time.monotonic() - since > SETTLE_S:
                raise Stuck(f"the cluster still copied vnodes {SETTLE_S:g} s after a kill was due (a repair that "
                            "never ends)")
            self.wait(time.monotonic() + 0.1)
        if time.monotonic() - since >= 0.05:
            self.note(f"the kill waited {time.monotonic() - since:.2f} s for the cluster's copies")
        return True

    def faults(self) -> tuple[list[float], list[float]]:
        """Apply the plan, faults that overlap included; the times at which no fault was left
        (heals) and, for each, when the next fault began."""
        start = self.first_ack_after(0.0, "of the cluster's start")
        self.t0 = start
        faults = self.plan.faults
        events = sorted([(f.at, 1, i) for i, f in enumerate(faults)] + [(f.at + f.duration, 0, i)
                                                                         for i, f in enumerate(faults)])
        undo: dict[int, Undo] = {}
        heals: list[float] = []
        nexts: list[float] = []
        for at, strike, i in events:
            self.wait(start + at)
            if strike and (self.workload.ended(self) or (faults[i].kind == "kill" and not self.settled())):
                continue  # a job that finished: the rest of the plan is not struck
            if not strike and i not in undo:
                continue
            if strike:
                if not undo and len(nexts) < len(heals):
                    nexts.append(time.monotonic())
                undo[i] = self.apply(faults[i])
            else:
                self.heal(faults[i], undo.pop(i))
                if not undo:
                    heals.append(time.monotonic())
        nexts.append(time.monotonic() + STUCK_S)
        return heals, nexts

    def stop(self) -> None:
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.proc.send_signal(signal.SIGCONT)
                node.proc.kill()
                node.proc.wait(timeout=10)
            node.log.close()
        self.workload.stop()


def run(plan: Plan, workload: Workload, keep: str | None = None, network: str = "auto") -> Outcome:
    """One run of ``plan`` with ``workload`` (``jobs.Counters``, ``jobs.Training``) on hosts made as
    ``network`` says (``proxied.emulated``); its logs stay in a folder of ``keep`` (default: a
    temporary one, removed when the run passed)."""
    folder = tempfile.mkdtemp(prefix=f"nemesis-{plan.seed}-", dir=keep)
    started = time.monotonic()
    verdict = check.Verdict()
    with emulated(plan.hosts, network, delays=any(f.kind == "delay" for f in plan.faults)) as hosts:
        r = Run(hosts, plan, folder, workload)
        try:
            r.start()
            heals, nexts = r.faults()
            r.workload.finish(r, heals, verdict)
            ended = r.workload.ended_at
            if ended is not None:  # a job that finished has no progress to make after it
                nexts = [n for h, n in zip(heals, nexts) if h < ended]
                heals = heals[:len(nexts)]
            check.progress(r.acks(), heals, nexts, STUCK_S, verdict)
        except Stuck as e:
            verdict.violations.append(f"stuck: {e}")
        finally:
            r.stop()
    restarts = sum(n.starts - 1 for n in r.nodes)
    out = Outcome(plan, verdict, time.monotonic() - started, restarts, folder, r.events, hosts.kind)
    if verdict.ok and keep is None:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
    return out
