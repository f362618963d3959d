"""What must hold in every simulated run, checked as it goes and at the end.

* Exactly once: a counter's value never exceeds the pushes sent to it (a push applied
  twice shows), a worker reads back every push it had acknowledged (a lost one shows),
  and once the run is over every live replica of a vnode holds exactly the acknowledged
  pushes (plus, at most, those whose caller got an error).  A server lost at r = 1 may
  lose data, and the scheduler must report it (``losses``).
* Staleness: a pull at clock ``c`` of a table of staleness ``s`` sees every push of the
  clocks the slowest worker finished, ``c - s`` of them.
* No zombie: a server declared dead never answers a client's pull again.
* No hang: every call returns or raises within its deadline.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np

from paramserver.testing.cluster import SimCluster, SimServer
from paramserver.testing.sim import SimSocket
from paramserver.wire.message import Op, decode


@dataclass
class Violation:
    kind: str
    detail: str
    at: float  # virtual time

    def line(self) -> str:
        return f"[{self.at:.3f}s] {self.kind}: {self.detail}"


class Invariants:
    """The bookkeeping of one run: what was sent, acknowledged and read."""

    def __init__(self, cluster: SimCluster, keys: int, lives: frozenset[str] = frozenset()) -> None:
        self.lives = lives  # tables with a lifecycle: their copies must agree (``_copies_agree``)
        self.cluster = cluster
        self.keys = keys
        self.sent: dict[str, np.ndarray] = defaultdict(lambda: np.zeros(keys, np.int64))
        self.acked: dict[str, np.ndarray] = defaultdict(lambda: np.zeros(keys, np.int64))
        self.doubtful: dict[str, np.ndarray] = defaultdict(lambda: np.zeros(keys, np.int64))  # errored pushes
        self.mine: dict[tuple[str, str], np.ndarray] = {}  # (worker, table) -> its acknowledged pushes
        self.violations: list[Violation] = []
        self.dead_at: dict[int, float] = {}  # server id -> when the scheduler declared it dead
        self.calls: dict[int, tuple[str, float]] = {}  # open call -> (what, deadline)
        self.owners: dict[int, str] = {}  # open call -> the worker that made it
        self.pushing: dict[int, tuple[str, np.ndarray, np.ndarray]] = {}  # open push call -> (table, keys, amounts)
        self._next_call = 0
        self.servers_by_host: dict[str, SimServer] = {}
        self.read_backs: set[tuple[str, Any]] = set()  # (worker, request id): a merge asking for its rows
        self.losses_before: dict[str, int] = {}  # table -> scheduler losses that its restore made good
        cluster.net.watchers.append(self._watch)
        sched = cluster.scheduler
        remove = sched._remove

        def removed(node_id: int, why: str) -> None:
            node = sched.nodes.get(node_id)
            if why == "dead" and node is not None and node.role == "server":
                self.dead_at[node_id] = cluster.net.time
            remove(node_id, why)

        sched._remove = removed  # type: ignore[method-assign]

    def fail(self, kind: str, detail: str) -> None:
        self.violations.append(Violation(kind, detail, self.cluster.net.time))
        self.cluster.net.log(f"VIOLATION {kind}: {detail}")

    # ---- calls --------------------------------------------------------------------------
    def call(self, what: str, limit_s: float, owner: str = "") -> int:
        self._next_call += 1
        self.calls[self._next_call] = (what, self.cluster.net.time + limit_s)
        self.owners[self._next_call] = owner
        return self._next_call

    def abandon(self, owner: str) -> None:
        """``owner`` died: its calls will never return, and need not."""
        for call in [c for c, o in self.owners.items() if o == owner]:
            self.calls.pop(call, None)
            del self.owners[call]
            if call in self.pushing:  # applied or not: nobody will know
                table, keys, amounts = self.pushing.pop(call)
                np.add.at(self.doubtful[table], keys, amounts)

    def returned(self, call: int) -> None:
        self.owners.pop(call, None)
        if call not in self.calls:  # abandoned: its worker was declared dead meanwhile
            return
        what, deadline = self.calls.pop(call)
        if self.cluster.net.time > deadline:
            self.fail("hang", f"{what} returned after its deadline ({self.cluster.net.time - deadline:.1f} s late)")

    def overdue(self) -> None:
        now = self.cluster.net.time
        for call, (what, deadline) in list(self.calls.items()):
            if now > deadline:
                del self.calls[call]
                self.owners.pop(call, None)
                self.fail("hang", f"{what} has not returned {now - deadline:.1f} s past its deadline")

    # ---- pushes and reads ---------------------------------------------------------------
    def pushed(self, call: int, table: str, keys: np.ndarray, amounts: np.ndarray | None = None) -> None:
        """A push of ``amounts`` (default 1 each) to ``keys`` went out as ``call``."""
        amounts = np.ones(keys.shape[0], np.int64) if amounts is None else amounts
        np.add.at(self.sent[table], keys, amounts)
        self.pushing[call] = (table, keys, amounts)

    def push_done(self, call: int, worker: str, table: str, error: str | None) -> None:
        held = self.pushing.pop(call, None)
        if held is None:
            return  # abandoned (its worker died), and counted as doubtful then
        _, keys, amounts = held
        if error is None:
            np.add.at(self.acked[table], keys, amounts)
            np.add.at(self.mine.setdefault((worker, table), np.zeros(self.keys, np.int64)), keys, amounts)
        else:
            np.add.at(self.doubtful[table], keys, amounts)

    def floor(self, worker: str, table: str, keys: np.ndarray) -> np.ndarray:
        """What ``worker`` must read back: its pushes acknowledged so far."""
        mine = self.mine.get((worker, table))
        return mine[keys].copy() if mine is not None else np.zeros(keys.shape[0], np.int64)

    def read(self, worker: str, table: str, keys: np.ndarray, values: np.ndarray, floor: np.ndarray) -> None:
        got = values[:, 0]
        if not np.array_equal(got, np.round(got)):
            self.fail("corrupt", f"{worker} read non-integer counters {got[got != np.round(got)][:4]} from {table!r}")
            return
        high = got > self.sent[table][keys]
        if high.any():
            i = int(np.flatnonzero(high)[0])
            self.fail("applied-twice", f"{worker} read {got[i]:g} for key {keys[i]} of {table!r}, but only "
                      f"{self.sent[table][keys[i]]} pushes were ever sent to it")
        low = got < floor
        if low.any() and not self.lost(table, keys[low]):
            i = int(np.flatnonzero(low)[0])
            self.fail("lost-update", f"{worker} read {got[i]:g} for key {keys[i]} of {table!r} after {floor[i]} of "
                      "its own pushes to it were acknowledged")

    def lost(self, table: str, keys: np.ndarray) -> bool:
        """Whether the scheduler reported losing (r = 1) a vnode of one of ``keys``."""
        vnodes = self.lost_vnodes(table)
        if not vnodes:
            return False
        ring = self.cluster.scheduler.ring
        if ring is None:
            return True
        bits = self.cluster.scheduler.tables[table].layout if table in self.cluster.scheduler.tables else 0
        return bool(np.isin(ring.vnodes(keys.astype(np.uint64), bits), list(vnodes)).any())

    def lost_vnodes(self, table: str) -> set[int]:
        losses = self.cluster.scheduler.losses[self.losses_before.get(table, 0):]
        return {int(v) for loss in losses if table in loss.get("tables", [])
                for v in loss.get("by_table", {}).get(table, loss.get("vnode_ids", []))}

    def restored(self, table: str, values: np.ndarray, mine: dict[tuple[str, str], np.ndarray]) -> None:
        """``table`` was restored to ``values`` from a checkpoint taken when each worker's
        acknowledged pushes were ``mine``: count from there (later pushes were undone, and
        data lost before the restore is back)."""
        self.sent[table] = values.copy()
        self.acked[table] = values.copy()
        self.doubtful[table] = np.zeros(self.keys, np.int64)
        for key in [k for k in self.mine if k[1] == table]:
            self.mine[key] = mine.get(key, np.zeros(self.keys, np.int64)).copy()
        self.losses_before[table] = len(self.cluster.scheduler.losses)

    def staleness(self, worker: str, table: str, clock: int, staleness: int, keys: np.ndarray,
                  values: np.ndarray, least: np.ndarray) -> None:
        """``least[i]``: pushes to ``keys[i]`` of the clocks every worker finished."""
        short = values[:, 0] < least
        if short.any():
            i = int(np.flatnonzero(short)[0])
            self.fail("stale-read", f"{worker} at clock {clock} read {values[i, 0]:g} for key {keys[i]} of "
                      f"{table!r} (staleness {staleness}): the clocks every worker finished pushed {least[i]}")

    # ---- zombies ------------------------------------------------------------------------
    def _watch(self, src: SimSocket, dest: SimSocket, frames: list[Any]) -> None:
        server = self.servers_by_host.get(src.host.name)
        if server is None and src.host.name.startswith("worker") and dest.bound:
            sent = decode(frames[1:]).header  # after the identity the listener sees
            if sent.get("op") == Op.PUSH.value and sent.get("read_back") is True:
                self.read_backs.add((src.host.name, sent.get("id")))
            return
        if server is None or not src.bound or not dest.host.name.startswith("worker"):
            return
        died = self.dead_at.get(server.id)
        if died is None or self.cluster.net.time < died:
            return
        header = decode(frames).header
        if header.get("op") == Op.OK.value and header.get("arrays") \
                and (dest.host.name, header.get("id")) not in self.read_backs:  # values read: a pull served
            # (a push's acknowledgement may come late and truthfully: applied here and on
            # every backup before this server's death, its backups' answers were queued; a
            # merge's rows, read once it was applied, with it)
            self.fail("zombie", f"server {server.id} answered a pull at {self.cluster.net.time:.3f} s, "
                      f"after it was declared dead at {died:.3f} s")

    def job(self, sizes: list[int], epochs: int) -> None:
        """The job finished, and counted every example once per epoch."""
        job = self.cluster.scheduler.jobs.job
        if job is None or not job.finished:
            where = "" if job is None else f": {job.describe()}, {len(job.running)} running"
            self.fail("job-unfinished", "the job did not finish" + where)
            return
        want = [sum(sizes)] * epochs
        if list(job.epoch_examples) != want or job.totals.get("examples") != sum(want):
            self.fail("job-count", f"the job counted {list(job.epoch_examples)} examples per epoch "
                      f"({job.totals.get('examples')} in all); its shards hold {want}")

    # ---- the end ------------------------------------------------------------------------
    def _copies_agree(self, table: str, replicas: int) -> None:
        """A table with a lifecycle (keys admitted late, evicted): no key holds more than
        was pushed to it, and the live copies of a vnode hold the same keys with the same
        values, wherever no push to the key is in doubt."""
        ring = self.cluster.scheduler.ring
        assert ring is not None
        lost = self.lost_vnodes(table)
        for key, v in zip(range(self.keys), ring.vnodes(np.arange(self.keys, dtype=np.uint64), 0).tolist()):
            if v in lost:
                continue
            hi = self.acked[table][key] + self.doubtful[table][key]
            copies = {}
            for server_id in ring.chains[v, :replicas].tolist():
                server = self.cluster.server(int(server_id))
                if server is not None and server.live:
                    copies[int(server_id)] = self.cluster.stored(server, table, key)
            for server_id, got in copies.items():
                if got is not None and got > hi:
                    self.fail("applied-twice", f"server {server_id} holds {got:g} for key {key} of {table!r}, "
                              f"more than the {hi} pushes sent to it")
            if self.doubtful[table][key] == 0 and len(set(copies.values())) > 1:
                self.fail("copies-differ", f"the copies of key {key} of {table!r} (vnode {v}) differ: "
                          + ", ".join(f"server {s}: {'absent' if g is None else f'{g:g}'}" for s, g in copies.items()))

    def final(self, tables: dict[str, int]) -> None:
        """Every live replica holds exactly the acknowledged pushes (``tables``: name -> r)."""
        sched = self.cluster.scheduler
        ring = sched.ring
        if ring is None:
            self.fail("no-ring", "the cluster has no ring at the end of the run")
            return
        keys = np.arange(self.keys, dtype=np.uint64)
        for table, replicas in tables.items():
            if table in self.lives:
                self._copies_agree(table, replicas)
                continue
            lost = self.lost_vnodes(table)
            vnodes = ring.vnodes(keys, 0)
            for key, v in zip(keys.tolist(), vnodes.tolist()):
                if v in lost:
                    continue
                lo, hi = self.acked[table][key], self.acked[table][key] + self.doubtful[table][key]
                for server_id in ring.chains[v, :replicas].tolist():
                    server = self.cluster.server(int(server_id))
                    if server is None or not server.live:
                        continue
                    got = self.cluster.value(server, table, key)
                    if got is None:
                        self.fail("missing-replica", f"server {server_id} is in the chain of vnode {v} of "
                                  f"{table!r} but does not hold it")
                    elif not lo <= got <= hi:
                        kind = "lost-update" if got < lo else "applied-twice"
                        self.fail(kind, f"server {server_id} holds {got:g} for key {key} of {table!r} "
                                  f"(vnode {v}); {lo} pushes were acknowledged"
                                  + (f", {hi - lo} more failed" if hi > lo else ""))
        for loss in sched.losses:
            if not loss.get("tables"):
                self.fail("silent-loss", f"server {loss.get('server')} died with data and no table was named")
