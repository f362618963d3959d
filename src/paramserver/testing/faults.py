"""The failures a chaos run injects, each at the time its plan drew (``Failures.strike``):
crashes, restarts, pauses long and short, cut links, joins and removals of servers,
workers crashed or paused, a stalled scheduler, a checkpoint and restore, and a repair
source paused mid-copy.  Every choice is drawn from the run's random stream, in the
order the plan's failures strike, so that a seed gives the same run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from paramserver.testing.cluster import SimServer
from paramserver.testing.restore import CheckpointRestore, RestoreHost
from paramserver.testing.sim import Faults
from paramserver.wire.message import Op


class FaultsHost(RestoreHost, Protocol):
    """What the faults use of the run that strikes them (``chaos.Run``): a restore's view, and
    the restore under way."""

    restore: CheckpointRestore | None


class Failures:
    """What strikes the cluster of one run."""

    def __init__(self, run: FaultsHost) -> None:
        self.run, self.cluster, self.rng = run, run.cluster, run.rng
        self.timeout = run.cluster.config.heartbeat_timeout_s
        self._kinds: dict[str, Callable[[str], None]] = {
            "checkpoint-restore": self._checkpoint_restore, "stall-scheduler": self._stall_scheduler,
            "worker-crash": self._worker, "worker-pause": self._worker,
            "crash-then-pause-source": self._crash_then_pause_source, "join": self._join, "joiner-crash": self._join,
            "crash": self._crash, "restart": self._crash, "pause": self._pause, "short-pause": self._pause,
            "cut-beats": self._cut, "cut-answers": self._cut, "isolate": self._cut, "leave": self._leave,
            "cut-scheduler": self._cut_scheduler, "pause-then-crash": self._pause_then_crash,
            "zombie-forwards": self._zombie_forwards}
        self._on_victim = {"crash", "restart", "pause", "short-pause", "cut-beats", "cut-answers", "isolate", "leave"}

    def strike(self, kind: str) -> None:
        if kind not in self._on_victim:
            self._kinds[kind](kind)
            return
        victim = self._victim(2 if kind == "leave" else 1)
        if victim is None:
            return
        self.cluster.net.log(f"fault {kind} server {victim.id}")
        self.victim = victim
        self._kinds[kind](kind)

    def _victim(self, spare: int = 1) -> SimServer | None:
        """A live server of the ring, if more than ``r + spare - 1`` are live: a fault takes
        one server, and the plan's later faults must not find the ring below r (a removal
        keeps a spare for them: it is no failure, and may be followed by one)."""
        ring = self.cluster.scheduler.ring
        live = [s for s in self.cluster.servers if s.live and s.id >= 0 and ring is not None and s.id in ring.servers]
        return self.rng.choice(live) if len(live) >= max(self.run.tables.values()) + spare else None

    # ---- not on a server of the ring ----------------------------------------------------
    def _checkpoint_restore(self, kind: str) -> None:
        self.run.restore = CheckpointRestore(self.run)
        self.run.restore.start()

    def _stall_scheduler(self, kind: str) -> None:
        c = self.cluster
        c.sched_host.pause()
        c.net.after(self.rng.uniform(1.0, 2.0) * self.timeout, c.sched_host.resume)

    def _worker(self, kind: str) -> None:
        c = self.cluster
        live = [w for w in c.workers[1:] if w.live]
        if not live:
            return
        w = self.rng.choice(live)
        c.net.log(f"fault {kind} {w.name}")
        if kind == "worker-crash":
            w.host.crash()
            self.run.check.abandon(w.name)
        else:
            w.host.pause()
            c.net.after(self.rng.uniform(1.5, 3.0) * self.timeout, w.host.resume)

    def _join(self, kind: str) -> None:
        server = self.cluster.add_server()
        self.run.check.servers_by_host[server.name] = server
        if kind == "joiner-crash":
            self.cluster.net.after(self.rng.uniform(0.05, 1.0), server.host.crash)

    def _crash_then_pause_source(self, kind: str) -> None:
        """Crash a server, then pause a source of the repair that follows, before it has
        confirmed its copies: it then holds the last complete copy of some vnodes."""
        c, net, timeout = self.cluster, self.cluster.net, self.timeout
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

    # ---- on a server of the ring (``self.victim``) --------------------------------------
    def _crash(self, kind: str) -> None:
        self.victim.host.crash()
        if kind == "restart":  # the machine comes back without its memory: a new server joins
            self.cluster.net.after(self.rng.uniform(0.2, 2.0), self.strike, "join")

    def _pause(self, kind: str) -> None:
        """``pause``: past the heartbeat timeout (declared dead, then it resumes); ``short-pause``: within it."""
        self.victim.host.pause()
        low, high = (1.5, 3.0) if kind == "pause" else (0.1, 0.6)
        self.cluster.net.after(self.rng.uniform(low, high) * self.timeout, self.victim.host.resume)

    def _cut(self, kind: str) -> None:
        net, name = self.cluster.net, self.victim.name
        pairs = {("cut-beats", True), ("cut-answers", False), ("isolate", True), ("isolate", False)}
        for k, out in pairs:
            if k == kind:
                net.faults.cut.add((name, "scheduler") if out else ("scheduler", name))
        if kind == "isolate":
            for h in net.hosts:
                net.faults.cut |= {(name, h), (h, name)}
        net.after(self.rng.uniform(1.5, 3.0) * self.timeout, self.heal_cuts)

    def _cut_scheduler(self, kind: str) -> None:
        """The scheduler cut off from every server at once, both ways, past the heartbeat
        timeout: all of them are silent in the same turn of its detector."""
        net = self.cluster.net
        net.log("fault cut-scheduler")
        for server in self.cluster.servers:
            net.faults.cut |= {(server.name, "scheduler"), ("scheduler", server.name)}
        net.after(self.rng.uniform(1.5, 3.0) * self.timeout, self.heal_cuts)

    def _pause_then_crash(self, kind: str) -> None:
        """One server paused past the heartbeat timeout; another crashes while it is paused:
        half a timeout or more before the paused one's deadline (two heartbeats missed by then:
        what the detector can see, nemesis seed 214), or within the last two heartbeats before
        it (none missed yet, nemesis seed 801).  The first holds the last copy of what the two
        shared, and must be waited for, not written off for a backup that is itself dead."""
        live = [s for s in self.cluster.servers if s.live and s.id >= 0]
        if len(live) < 3:
            return
        paused, crashed = self.rng.sample(live, 2)
        self.cluster.net.log(f"fault pause-then-crash: pause server {paused.id}, crash server {crashed.id}")
        paused.host.pause()
        self.cluster.net.after(self.rng.uniform(1.5, 2.5) * self.timeout, paused.host.resume)
        # late: its last beat is before the paused one's deadline (which is its last beat's, up to
        # a beat before the pause, plus the timeout), so the detector can tell it is not heard from
        beat = self.cluster.config.heartbeat_interval_s
        late = (self.timeout - 1.9 * beat, self.timeout - 1.0 * beat)
        at = self.rng.uniform(*late) if self.rng.random() < 0.5 else self.rng.uniform(0.05, 0.5) * self.timeout
        self.cluster.net.after(at, crashed.host.crash)

    def _zombie_forwards(self, kind: str) -> None:
        """What one server sends is held, not lost (a TCP link cut one way), past the heartbeat
        timeout: it is declared dead and its clients resend to the new primaries.  A worker then
        dies, so the servers forget its applied pushes; then the link heals and the dead
        server's held forwards arrive.  They must be refused, not applied a second time."""
        victim = self._victim()
        if victim is None or not self.cluster.workers:
            return
        net, timeout = self.cluster.net, self.timeout
        net.log(f"fault zombie-forwards: server {victim.id}'s links held")
        net.faults.stall |= {(victim.name, h) for h in net.hosts if h != victim.name}
        worker = self.rng.choice(self.cluster.workers[1:] or self.cluster.workers)

        def crash() -> None:
            worker.host.crash()
            self.run.check.abandon(worker.name)

        net.after(self.rng.uniform(1.3, 1.6) * timeout, crash)
        net.after(self.rng.uniform(2.9, 3.2) * timeout, self._unstall)

    def _unstall(self) -> None:
        net = self.cluster.net
        net.faults.stall.clear()
        net.unstall()

    def _leave(self, kind: str) -> None:
        worker = self.cluster.workers[0]
        worker._ask_scheduler({"op": Op.REMOVE_SERVER.value, "node_id": self.victim.id}, lambda m: None)

    # ---- healing ------------------------------------------------------------------------
    def heal_cuts(self) -> None:
        self.cluster.net.faults.cut.clear()
        self._unstall()

    def heal(self) -> None:
        net = self.cluster.net
        net.faults = Faults()
        for host in net.hosts.values():
            host.resume()
