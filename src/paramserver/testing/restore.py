"""Checkpoint and restore in the middle of a run (the ``restore`` chaos scenario).

The workload pauses and drains; a worker writes a checkpoint as ``Client.checkpoint``
does (every server writes its vnodes, then the manifest); the cluster goes on, and may
lose a server (at r = 1, with its data), gain one, or take more pushes; then the table is
dropped and restored from the checkpoint as ``checkpoint.restore_tables`` does, and the
workload resumes.  What must hold:

* every live replica of every vnode holds exactly the values checkpointed (pushes made
  after the checkpoint are gone, data lost with a server is back), and a worker's pull
  reads them;
* every call returns within its deadline;
* from then on the usual invariants hold, counted from the restored values.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from paramserver.checkpoint import store as ckpt
from paramserver.tables.spec import TableSpec
from paramserver.testing.sim import Faults
from paramserver.wire.message import Message, Op

if TYPE_CHECKING:
    from paramserver.testing.cluster import SimCluster
    from paramserver.testing.invariants import Invariants
    from paramserver.testing.scenarios import Plan

TABLE = "counts"
DISTURBANCES = ("none", "pushes", "crash", "join", "pushes-and-crash", "join-while-restoring", "crash-while-restoring")


class Striker(Protocol):
    def strike(self, kind: str) -> None: ...


class RestoreHost(Protocol):
    """What a restore (and a fault, ``faults.FaultsHost``) uses of the run that holds it,
    ``chaos.Run``: named here, not imported, for the run imports the faults it strikes."""

    paused: bool
    stopping: bool
    rng: random.Random
    plan: Plan
    cluster: SimCluster
    check: Invariants
    tables: dict[str, int]
    limit_s: float

    @property
    def checkpoint_url(self) -> str: ...

    @property
    def failures(self) -> Striker: ...  # the faults: they strike during a restore too

    def _copies_open(self) -> bool: ...


class CheckpointRestore:
    """One checkpoint-then-restore, driven by callbacks on the simulated cluster."""

    def __init__(self, run: RestoreHost) -> None:
        self.run, self.cluster = run, run.cluster
        self.worker = run.cluster.workers[0]
        # at r = 1 a server lost while it restores loses restored rows, and that is no restore's fault
        self.disturbance = run.rng.choice([d for d in DISTURBANCES
                                           if run.plan.replicas > 1 or d != "crash-while-restoring"])
        self.url = run.checkpoint_url
        self.step = f"{self.url}/{1:015d}"  # a fixed name: the trace must not depend on the wall clock
        self.saved = np.zeros(0)
        self.mine: dict[tuple[str, str], np.ndarray] = {}
        self.call = -1
        self.busy = False

    # ---- driving ------------------------------------------------------------------------
    def start(self) -> None:
        if self.run.stopping or not self.worker.live:
            return
        self.busy = True
        self.call = self.run.check.call("checkpoint and restore", 4 * self.run.limit_s)
        self.cluster.net.log(f"restore: checkpoint, then {self.disturbance}, then restore")
        self.run.paused = True
        self._when(self._quiet, self._checkpoint, "the workload to drain before the checkpoint")

    def _when(self, cond: Callable[[], bool], then: Callable[[], None], what: str, waited: float = 0.0) -> None:
        if cond():
            then()
        elif waited > 2 * self.run.limit_s:
            self._fail("hang", f"waited {waited:.0f} s for {what}")
        else:
            self.cluster.net.after(0.1, self._when, cond, then, what, waited + 0.1)

    def _quiet(self) -> bool:
        calls = self.run.check.calls
        return (not self.run.check.pushing and all(c == self.call for c in calls)
                and self.cluster.ring_settled() and not self.run._copies_open())

    def _fail(self, kind: str, detail: str) -> None:
        """One violation, and the run ends: what it would check next follows from this one."""
        self.run.check.fail(kind, f"restore ({self.disturbance}): {detail}")
        self.run.stopping = True
        self.run.tables.pop(TABLE, None)
        self._finish()

    def _finish(self) -> None:
        self.cluster.net.faults = self.run.plan.faults
        self.run.check.returned(self.call)
        self.run.paused = False
        self.busy = False

    # ---- the checkpoint -----------------------------------------------------------------
    def _checkpoint(self) -> None:
        self.saved = self._replica_values()[0]
        self.mine = {k: v.copy() for k, v in self.run.check.mine.items() if k[1] == TABLE}
        self.cluster.net.faults = Faults(delay=0.1, delay_s=0.3, only=self.run.plan.faults.only)

        def written(answers: Any, error: str | None) -> None:
            if error is not None:
                self._fail("checkpoint", f"a server failed to write its vnodes: {error}")
                return
            self.worker._ask_scheduler({"op": Op.TABLE_INFO.value}, lambda msg: manifest(answers, msg))

        def manifest(answers: list[dict[str, Any]], msg: Message) -> None:
            assert self.cluster.scheduler.ring is not None
            tables = {n: TableSpec.from_wire(w).to_wire() for n, w in msg.header["tables"].items()}
            ckpt.write_manifest(self.step, ckpt.assemble_manifest(answers, self.worker.ring.to_wire()
                                                                  if self.worker.ring else {}, tables))
            self._disturb()

        self.worker.refresh()
        self.worker.ask_servers({"op": Op.CHECKPOINT.value, "url": self.step}, written)

    def _disturb(self) -> None:
        """The cluster goes on after the checkpoint, as the plan says."""
        self.cluster.net.faults = self.run.plan.faults
        kind = self.disturbance
        if kind in ("none", "join-while-restoring", "crash-while-restoring"):
            self._restore()
            return
        if "pushes" in kind:
            self.run.paused = False
        if "crash" in kind:
            self.cluster.net.after(self.run.rng.uniform(0.1, 1.0), self.run.failures.strike, "crash")
        if kind == "join":
            self.run.failures.strike("join")

        def pause() -> None:
            self.run.paused = True
            self._when(self._quiet, self._restore, f"the cluster to settle after {kind}")

        self.cluster.net.after(self.run.rng.uniform(1.0, 3.0) + 2 * self.cluster.config.heartbeat_timeout_s, pause)

    # ---- the restore --------------------------------------------------------------------
    def _restore(self) -> None:
        self.cluster.net.faults = Faults(delay=0.1, delay_s=0.3, only=self.run.plan.faults.only)
        manifest = ckpt.read_manifest(self.step)
        spec = TableSpec.from_wire(manifest["tables"][TABLE])
        entries = list(manifest["files"].get(TABLE, {}).values())
        expected = sum(int(e[1]) for e in entries)
        w = self.worker

        def dropped(msg: Message) -> None:
            if msg.op is not Op.OK:
                self._fail("restore", f"drop_table failed: {msg.header.get('error')}")
                return
            ring = self.cluster.scheduler.ring
            servers = len(ring.servers) if ring is not None else 1
            w.create_table(replace(spec, replicas=min(spec.replicas, servers)), created)

        def created(_: Any, error: str | None) -> None:
            if error is not None:
                self._fail("restore", f"create_table failed: {error}")
                return
            if self.disturbance == "join-while-restoring":
                self.run.failures.strike("join")
            w._ask_scheduler({"op": Op.RESTORE.value, "table": TABLE, "step": self.step, "entries": entries},
                             loaded)

        def loaded(msg: Message) -> None:
            if msg.op is not Op.OK:
                self._fail("restore", f"the restore failed: {msg.header.get('error')}")
                return
            got = int(msg.header["loaded"])
            if got != expected:
                self._fail("restore", f"the servers loaded {got} keys; the manifest lists {expected}")
                return
            self._when(self._quiet, self._verify, "the cluster to settle after the restore")

        w._ask_scheduler({"op": Op.DROP_TABLE.value, "name": TABLE}, dropped)
        if self.disturbance == "crash-while-restoring":
            self.cluster.net.after(self.run.rng.uniform(0.0, 0.5), self.run.failures.strike, "crash")

    def _verify(self) -> None:
        """Every live replica, and a pull, read exactly what was checkpointed."""
        values, where = self._replica_values()
        bad = np.flatnonzero(values != self.saved)
        if bad.size:
            k = int(bad[0])
            self._fail("restore-mismatch", f"key {k} reads {values[k]:g} on {where[k]} after the restore; "
                       f"{self.saved[k]:g} was checkpointed ({bad.size} key(s) differ)")
            return
        keys = np.arange(self.run.check.keys, dtype=np.uint64)

        def pulled(got: Any, error: str | None) -> None:
            if error is not None:
                self._fail("restore", f"a pull after the restore failed: {error}")
                return
            differ = np.flatnonzero(got[:, 0] != self.saved)
            if differ.size:
                k = int(differ[0])
                self._fail("restore-mismatch", f"a pull of key {k} read {got[k, 0]:g} after the restore; "
                           f"{self.saved[k]:g} was checkpointed")
                return
            self.run.check.restored(TABLE, self.saved.astype(np.int64), self.mine)
            self._finish()

        self.worker.pull(TABLE, keys, pulled)

    def _replica_values(self) -> tuple[np.ndarray, list[str]]:
        """Each key's value, checked equal on every live replica of its vnode (a key a
        replica does not hold, or holds otherwise, is NaN there, and named)."""
        c = self.cluster
        ring = c.scheduler.ring
        n = self.run.check.keys
        out, where = np.full(n, np.nan), ["no live replica"] * n
        if ring is None or TABLE not in c.scheduler.tables:
            return out, where
        spec = c.scheduler.tables[TABLE]
        vnodes = ring.vnodes(np.arange(n, dtype=np.uint64), spec.layout)
        for key in range(n):
            seen: list[tuple[int, float | None]] = []
            for server_id in ring.chains[int(vnodes[key]), :spec.replicas].tolist():
                server = c.server(int(server_id))
                if server is not None and server.live:
                    seen.append((int(server_id), c.value(server, TABLE, key)))
            if seen and all(v == seen[0][1] for _, v in seen) and seen[0][1] is not None:
                out[key], where[key] = seen[0][1], f"servers {[s for s, _ in seen]}"
            elif seen:
                where[key] = "replicas " + ", ".join(f"{s}: {v}" for s, v in seen)
        return out, where
