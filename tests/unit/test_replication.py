"""Replication corner cases, with real ServerNodes in this process driven message by
message (no scheduler, no timing): a retried push after a failover, BSP buffers that
move with their vnode, malformed copies that change nothing."""

from __future__ import annotations

import numpy as np

from paramserver.routing.ring import Ring, plan_moves
from paramserver.tables.spec import TableSpec
from paramserver.wire.message import Message


def _key_of_vnode(ring: Ring, v: int) -> np.uint64:
    keys = np.arange(1, 100_000, dtype=np.uint64)
    return keys[ring.vnodes(keys) == v][0]


def test_a_retry_after_failover_reaches_the_backup_the_dead_primary_missed(h):
    h.make(1, 2, 3, 4)
    spec = TableSpec("t", 1, optimizer={"name": "sgd", "lr": 1.0}, replicas=3)
    ring = Ring.create([1, 2, 3, 4], 2)
    h.ring(ring, [spec])
    v = int(np.flatnonzero(ring.owners == 1)[0])
    chain = ring.replicas(v, 3)
    key = _key_of_vnode(ring, v)
    keys, grads = np.array([key], np.uint64), -np.ones((1, 1), np.float32)
    b, c = h.by_id(chain[1]), h.by_id(chain[2])
    h.push(ring, "t", keys, grads, sender=77, seq=10, acked=9)  # the primary applies, forwards to b and c
    assert c.router.poll(0)
    c.router.recv()  # ... and dies before c gets its copy
    h.pump([b])
    assert (h.value(b, "t", key), h.value(c, "t", key)) == (1.0, 0.0)
    survivors = [n for n in h.nodes if n.node_id != 1]
    for n in survivors:
        n.control_plane.server_lost(1)
    new = Ring(ring.without_server(1).refilled().chains, ring.version + 1)
    h.ring(new, [spec], survivors)
    h.replies.clear()
    h.push(new, "t", keys, grads, sender=77, seq=10, acked=9)  # the client's retry, at b now
    h.pump(survivors)
    assert [r["op"] for _, r in h.replies] == ["ok"]
    assert [h.value(n, "t", key) for n in survivors if n.node_id in new.replicas(v, 3)] == [1.0, 1.0, 1.0]


def test_bsp_buffers_move_with_their_vnode(h):
    a, n = h.make(1, 2)
    spec = TableSpec("agg", 1, optimizer={"name": "sgd", "lr": 1.0}, consistency="bsp", aggregate=True)
    ring = Ring.create([1], 4)
    h.ring(ring, [spec])
    for node in (a, n):
        node.clocks.on_workers(Message({"op": "workers", "workers": [100]}, []))
    keys = np.arange(1, 1001, dtype=np.uint64)
    h.push(ring, "agg", keys, -np.ones((keys.size, 1), np.float32), sender=100, seq=1, acked=0, clock=0)
    target = ring.with_server(2)
    moves = plan_moves(ring, target, {"agg": 1})
    a.control_plane.on_migrate(Message({"op": "migrate", "migration": 7,
                                        "moves": [[t, v, d] for _, t, v, d in moves]}, []))
    h.pump()
    assert h.control[-1][1]["op"] == "migrated" and not h.control[-1][1]["failed"]
    h.ring(target, [spec])  # the flip, before clock 0 is over
    for node in (a, n):
        h.deliver(node, {"op": "clock", "id": 2, "worker": 100, "clock": 1})
    owner = target.owner_of_keys(keys)
    for node in (a, n):
        assert node.state.primary.any()
        assert all(h.value(node, "agg", k) == 1.0 for k in keys[owner == node.node_id])


def test_a_malformed_copy_changes_nothing_and_unknown_tables_are_refused(h):
    (a,) = h.make(1)
    spec = TableSpec("t", 3, optimizer="sgd")
    ring = Ring.create([1], 2)
    h.ring(ring, [spec])
    keys = np.arange(1, 200, dtype=np.uint64)
    h.push(ring, "t", keys, np.ones((keys.size, 3), np.float32))
    before = len(a.tables["t"])
    good = {"op": "install", "id": 5, "table": "t", "vnode": 0, "from": 9, "seqs": [], "buffered": [],
            "clocks": {}}
    arrays = [np.array([1], np.uint64), np.zeros((1, 3), np.float32)]
    for bad in ({"seqs": "oops"}, {"seqs": [[1, 2]]}, {"clocks": [1, 2]}, {"table": "ghost"}, {"buffered": [3]}):
        h.replies.clear()
        h.deliver(a, {**good, **bad}, arrays)
        assert h.replies[-1][1]["op"] == "error", bad
        assert len(a.tables["t"]) == before and sorted(a.tables) == ["t"]


def test_a_push_with_a_nonsense_watermark_is_refused_whole(h):
    (a,) = h.make(1)
    ring = Ring.create([1], 2)
    h.ring(ring, [TableSpec("t", 1, optimizer={"name": "sgd", "lr": 1.0})])
    keys = np.arange(1, 50, dtype=np.uint64)
    for acked in (5, 99, "x"):
        h.replies.clear()
        h.push(ring, "t", keys, -np.ones((keys.size, 1), np.float32), sender=3, seq=5, acked=acked)
        assert h.replies[-1][1]["op"] == "error"
    assert len(a.tables["t"]) == 0


def test_a_copy_that_overtakes_the_joiners_first_ring_waits_for_it(h):
    """The copies a joiner receives come from the other servers, its first ring from the
    scheduler, on another socket: a copy that came first failed the whole join
    (``assert self.ring``), and the ring never grew.  It is now kept until the ring."""
    (joiner,) = h.make(9)
    spec = TableSpec("t", 1, optimizer={"name": "sgd", "lr": 1.0})
    ring = Ring.create([1, 2], 2)
    keys = np.array([_key_of_vnode(ring, 0)], np.uint64)
    rows = np.array([[5.0]], np.float32)  # sgd: the row is the value
    h.deliver(joiner, {"op": "install", "id": 3, "table": "t", "vnode": 0, "from": 1, "seqs": [],
                       "buffered": [], "clocks": {}, "append": False}, [keys, rows])
    assert joiner.ring is None and len(joiner._before_ring) == 1  # kept, not refused
    h.ring(ring, [spec], [joiner])  # its first ring (it joins later: it holds nothing on it yet)
    assert not joiner._before_ring
    assert 0 in joiner.tables["t"].tables and h.value(joiner, "t", keys[0]) == 5.0


def test_a_death_heard_before_the_first_ring_is_kept_for_it(h):
    """A server started again hears NODE_LOST before its first ring: ``refresh_targets``
    asserted a ring, and the message was logged as bad and dropped (seen in the nemesis suite,
    a kill then an isolation).  The dead server is now remembered, and never forwarded to."""
    (joiner,) = h.make(9)
    joiner.control_plane.server_lost(2)
    assert joiner.ring is None and joiner.state.dead == {2}
    spec = TableSpec("t", 1, optimizer={"name": "sgd", "lr": 1.0}, replicas=3)
    h.ring(Ring.create([1, 2, 9], 4), [spec], [joiner])
    targets = joiner.state.targets["t"]
    assert (targets >= 0).any() and not (targets == 2).any()


def test_a_pull_parked_under_the_lease_is_refused_if_released_after_it_ran_out(h):
    """The lease is checked where a client's request is served: a BSP pull parked while
    the lease ran (worker 100 behind) and released by a clock after it ran out (a pause)
    must get a stale-ring error, not the values."""
    from paramserver.server.lease import Lease

    (a,) = h.make(1)
    spec = TableSpec("t", 1, optimizer={"name": "sgd", "lr": 1.0}, consistency="bsp")
    ring = Ring.create([1], 4)
    h.ring(ring, [spec])
    a.clocks.on_workers(Message({"op": "workers", "workers": [100, 101]}, []))
    keys = np.array([_key_of_vnode(ring, 0)], np.uint64)
    v, counts = ring.vnodes(keys).astype(np.int32), np.array([1], np.int64)
    h.deliver(a, {"op": "pull", "id": 5, "table": "t", "ring_version": ring.version, "clock": 1}, [keys, v, counts])
    assert not h.replies  # parked: worker 101 has not finished clock 0
    now = [1000.0]
    a.state.lease = Lease(1.0, clock=lambda: now[0])
    a.state.lease.granted(now[0])
    now[0] += 5.0  # the lease ran out meanwhile
    for worker in (100, 101):
        h.deliver(a, {"op": "clock", "id": 6, "worker": worker, "clock": 1})
    pulls = [r for _, r in h.replies if r.get("id") == 5]
    assert len(pulls) == 1 and pulls[0]["op"] == "error" and pulls[0]["code"] == "stale_ring", pulls
    assert "lease ran out" in pulls[0]["error"]


def test_a_new_migration_voids_the_unanswered_copies_of_the_one_before():
    """Copies (or their answers) lost on a cut link held their ``COPIES_IN_FLIGHT`` places
    for ever: the migration that followed (the scheduler abandoned that one) never sent a
    copy.  A new ``MIGRATE`` voids the old copies, and a late answer to one is ignored."""
    from paramserver.server.copies import COPIES_IN_FLIGHT, Copies
    from paramserver.server.peers import Acks

    class FakePeers:
        def __init__(self) -> None:
            self.awaiting: dict[int, Acks] = {}
            self.finished: list[Acks] = []

        def acked(self, acks: Acks, error: str | None = None) -> None:
            acks.pending -= 1
            if acks.pending <= 0:
                self.finished.append(acks)

        def drop(self, waiting: set[Acks]) -> None:
            self.awaiting = {r: a for r, a in self.awaiting.items() if a not in waiting}

    class FakePort:
        peers = FakePeers()

    copies = Copies(state=None, port=FakePort())  # type: ignore[arg-type]  # no copy is sent here
    done: list[str | None] = []
    copies.plan([("t", v, 9) for v in range(4)], done.append)
    old = Acks(done=done.append)  # the first migration's, as plan made it
    lost = []
    for i in range(COPIES_IN_FLIGHT):  # as send_next does; then the copies, or their answers, are lost
        copy = Acks()
        copy.done = lambda failed, c=copy: copies._copied(old, c, failed, 1)
        copies.in_flight += 1
        copies.unanswered.add(copy)
        FakePort.peers.awaiting[i] = copy
        lost.append(copy)
    assert not copies.ready()  # stuck, before the next migration
    copies.plan([("t", 0, 9)], done.append)
    assert copies.ready() and copies.in_flight == 0 and len(copies.queue) == 2
    assert not FakePort.peers.awaiting  # no answer is waited for any more
    lost[0].done(None)  # a late answer to a voided copy holds no place
    assert copies.in_flight == 0


def test_a_forward_lost_between_two_live_servers_fails_the_push_and_its_retry_lands_once(h):
    from paramserver.server.peers import ANSWER_WITHIN_S

    a, b = h.make(1, 2)
    spec = TableSpec("t", 1, optimizer={"name": "sgd", "lr": 1.0}, replicas=2)
    ring = Ring.create([1, 2], 2)
    h.ring(ring, [spec])
    v = int(np.flatnonzero(ring.owners == 1)[0])
    key = _key_of_vnode(ring, v)
    keys, grads = np.array([key], np.uint64), -np.ones((1, 1), np.float32)
    h.push(ring, "t", keys, grads, sender=77, seq=10, acked=9)  # the primary applies, forwards to b ...
    assert b.router.poll(0)
    b.router.recv()  # ... and the forward is lost on the way; both servers go on beating
    assert a.peers.awaiting and not h.replies, "the client's push waits for the backup's answer"
    h.net.run_until(h.net.time + ANSWER_WITHIN_S + 1)
    a.turn()
    h.flush()
    assert [r["op"] for _, r in h.replies] == ["error"] and "did not answer" in h.replies[0][1]["error"]
    assert not a.peers.awaiting, "nothing waits on the lost forward any more"
    h.replies.clear()
    h.push(ring, "t", keys, grads, sender=77, seq=10, acked=9)  # the client's retry, with its seq
    h.pump()
    assert [r["op"] for _, r in h.replies] == ["ok"]
    assert (h.value(a, "t", key), h.value(b, "t", key)) == (1.0, 1.0), "applied once on each copy"


def test_a_ring_without_a_table_or_a_server_drops_the_one_and_forgets_the_other(h):
    """Issue 47: a server cut off while a table was dropped and a peer died missed
    ``DROP_TABLE`` and ``NODE_LOST``; the ring it is sent again (``resync``) says both."""
    a = h.make(1, 2, 3)[0]
    kept, dropped = TableSpec("kept", 1, replicas=2), TableSpec("gone", 1, replicas=2)
    ring = Ring.create([1, 2, 3], 2)
    h.ring(ring, [kept, dropped])
    v = int(np.flatnonzero(ring.owners == 1)[0])
    key = _key_of_vnode(ring, v)
    backup = h.by_id(ring.replicas(v, 2)[1])
    h.push(ring, "kept", np.array([key], np.uint64), -np.ones((1, 1), np.float32), sender=5, seq=1, acked=0)
    backup.router.recv()  # the forward never arrives: the backup is about to die
    assert a.peers.awaiting
    h.replies.clear()
    view = Ring(ring.without_server(backup.node_id).refilled().chains, ring.version + 1)
    h.nodes.remove(backup)
    h.ring(view, [kept], [a])  # no NODE_LOST and no DROP_TABLE reached server 1
    h.flush()
    assert "gone" not in a.tables and "kept" in a.tables
    assert backup.node_id in a.state.dead and not a.peers.awaiting, "the lost peer's answer is no longer awaited"
    assert [r["op"] for _, r in h.replies] == ["ok"], "the push it held is answered"
    h.nodes.append(backup)


def test_a_vnode_copy_lost_between_two_live_servers_fails_its_migration_in_time(h):
    """Issue 47: a copy (or its answer) lost on a link between two servers that both keep
    beating held the migration for ever; past its deadline it fails, and the scheduler's
    repair plans the copy again (``Membership.migrated``)."""
    from paramserver.server.peers import ANSWER_WITHIN_S

    a, n = h.make(1, 2)
    spec = TableSpec("t", 1, optimizer={"name": "sgd", "lr": 1.0})
    ring = Ring.create([1], 4)
    h.ring(ring, [spec])
    h.push(ring, "t", np.arange(1, 101, dtype=np.uint64), -np.ones((100, 1), np.float32), sender=5, seq=1, acked=0)
    moves = plan_moves(ring, ring.with_server(2), {"t": 1})
    a.control_plane.on_migrate(Message({"op": "migrate", "migration": 9,
                                        "moves": [[t, v, d] for _, t, v, d in moves]}, []))
    while a.wants_turn():
        a.turn()
    h.flush()
    while n.router.poll(0):
        n.router.recv()  # every copy is lost on the way
    assert a.peers.awaiting and not [c for _, c in h.control if c["op"] == "migrated"]
    h.net.run_until(h.net.time + ANSWER_WITHIN_S + 1)
    a.turn()
    h.flush()
    done = [c for _, c in h.control if c["op"] == "migrated"]
    assert len(done) == 1 and done[0]["migration"] == 9 and "did not answer" in done[0]["failed"]


def _held_forward(h, ring):
    """A push applied by its primary (server 1), whose forward to the backup is taken off the
    link before the backup reads it (a cut link holds it; TCP delivers it once it heals)."""
    spec = TableSpec("t", 1, optimizer={"name": "sgd", "lr": 1.0}, replicas=2)
    h.ring(ring, [spec])
    v = int(np.flatnonzero(ring.owners == 1)[0])
    b = h.by_id(ring.replicas(v, 2)[1])
    key = _key_of_vnode(ring, v)
    keys, grads = np.array([key], np.uint64), -np.ones((1, 1), np.float32)
    h.push(ring, "t", keys, grads, sender=77, seq=10, acked=9)
    assert b.router.poll(0)
    return spec, b, key, keys, grads, b.router.recv()


def test_a_forward_from_a_server_declared_dead_is_refused_once_its_push_was_resent(h):
    """Found on emulated hosts: a primary cut off sending (one way) is declared dead; its
    client resends the push to the new primary and then leaves, so servers forget its
    applied pushes; the link heals and the dead primary's queued forward arrives.  Applied,
    the add counted twice."""
    h.make(1, 2, 3)
    ring = Ring.create([1, 2, 3], 2)
    spec, b, key, keys, grads, held = _held_forward(h, ring)
    survivors = [n for n in h.nodes if n.node_id != 1]
    for n in survivors:
        n.control_plane.server_lost(1)
    new = Ring(ring.without_server(1).refilled().chains, ring.version + 1)
    h.ring(new, [spec], survivors)
    h.push(new, "t", keys, grads, sender=77, seq=10, acked=9)  # the client's resend, at b now
    h.pump(survivors)
    assert h.value(b, "t", key) == 1.0
    for n in survivors:
        n.state.dedup["t"].forget(77)  # the client left: its record goes
    b._handle_data(held)  # the dead primary's forward, delivered once the link healed
    h.pump(survivors)
    assert h.value(b, "t", key) == 1.0


def test_a_forward_for_a_vnode_this_server_is_now_primary_of_is_refused(h):
    """The same late forward from a primary the scheduler has not told this server about:
    the ring already made this server the vnode's primary, so the forward is stale."""
    h.make(1, 2, 3)
    ring = Ring.create([1, 2, 3], 2)
    spec, b, key, keys, grads, held = _held_forward(h, ring)
    new = Ring(ring.without_server(1).refilled().chains, ring.version + 1)
    h.ring(new, [spec], [n for n in h.nodes if n.node_id != 1])
    b._handle_data(held)
    h.flush()
    assert h.value(b, "t", key) == 0.0  # refused: the client resends it to b under the new ring
