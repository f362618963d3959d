"""The scheduler's ring changes, with fake servers (notifications recorded, not sent):
removals that would empty the ring, the last server dying, copies left unconfirmed."""

from __future__ import annotations

import numpy as np
import pytest

from paramserver.config import load_config
from paramserver.routing.ring import Ring, plan_moves
from paramserver.scheduler.node import NodeInfo, SchedulerNode
from paramserver.tables.spec import TableSpec
from paramserver.testing.sim import SimNetwork
from paramserver.wire.message import Message, Op, encode


@pytest.fixture
def make():
    made = []

    def make(servers, tables=(), vnodes_per_server=4):
        s = SchedulerNode(load_config(host="127.0.0.1", port=0, servers=len(servers)),
                          transport=SimNetwork(0).host("scheduler").transport())
        s.notes = []
        s._notify = lambda node, header: s.notes.append((node.id, header))
        for i in servers:
            s.nodes[i] = NodeInfo(i, "server", b"s%d" % i, f"tcp://127.0.0.1:{i}", s.clock())
            s.by_identity[b"s%d" % i] = i
        s.registry.next_id = max(servers) + 1
        s.ring = Ring.create(list(servers), vnodes_per_server)
        for t in tables:
            s.tables[t.name] = t
        made.append(s)
        return s

    yield make
    for s in made:
        s.sock.close(linger=0)


def _migrated(s, node_id, **fields):
    s.on_migrated(b"s%d" % node_id, Message({"op": "migrated", "migration": s.migration.id,
                                             "node_id": node_id, **fields}, []))


def test_removals_never_empty_the_ring(make):
    s = make([1, 2, 3], [TableSpec("t", 1)])
    for node_id in (1, 2):
        s.on_remove_server(b"driver", Message({"op": "remove_server", "id": node_id, "node_id": node_id}, []))
    with pytest.raises(Exception, match="cannot remove the last server"):
        s.on_remove_server(b"driver", Message({"op": "remove_server", "id": 3, "node_id": 3}, []))
    s.nodes[1].last_seen -= 100  # the server being removed dies meanwhile
    s._check_heartbeats(s.clock())
    assert s.ring.servers and 3 in s.ring.servers


def test_the_last_server_dying_then_a_new_one_starts_a_ring(make):
    s = make([1], [TableSpec("t", 1)])
    ring_version = s.ring.version
    s._remove(1, "dead")
    assert s.ring is None and s.migration is None
    s.handlers[Op.REGISTER](b"new", Message({"op": "register", "id": 1, "role": "server",
                                             "address": "sim://new-server"}, []))
    new_id = s.by_identity[b"new"]
    assert s.ring.servers == [new_id] and s.ring.version > ring_version and s.migration is None
    s.handlers[Op.CREATE_TABLE](b"driver", Message({"op": "create_table", "id": 2,
                                                    "spec": TableSpec("u", 1).to_wire()}, []))
    assert not s.catalog.deferred and "u" in s.tables


def test_copies_unconfirmed_when_a_migration_is_abandoned_are_redone(make):
    s = make([1, 2, 3, 4], [TableSpec("t", 1, replicas=2)])
    s._remove(4, "dead")  # failover: repair copies planned to the new backups
    repair = s.migration
    assert repair is not None and not repair.flip and s.membership.incomplete
    pending = set(s.membership.incomplete)
    first_source = sorted(repair.waiting)[0]
    _migrated(s, first_source)  # one source confirms its copies ...
    done = {(t, v, d) for t, v, d in repair.moves[first_source]}
    assert s.membership.incomplete == pending - done
    before = s.ring
    s.nodes[3].last_seen -= 100  # ... then another server dies: the repair is abandoned
    s._check_heartbeats(s.clock())
    again = s.migration
    assert again is not None and again.id != repair.id
    planned = {(t, v, d) for moves in again.moves.values() for t, v, d in moves}
    unconfirmed = pending - done
    # every copy still unconfirmed to a live holder is made again, from a complete holder
    # (where server 3 held the only complete copy, that data is gone: two failures at once)
    left = {(t, v, d) for t, v, d in unconfirmed if d != 3 and d in s.ring.chains[v, :2]
            and any(h not in (3, -1) and (t, v, h) not in unconfirmed for h in before.chains[v, :2])}
    assert left and left <= planned
    for source in list(again.waiting):
        _migrated(s, source)
    assert not s.membership.incomplete and s.migration is None and s.ring.version == before.version + 1


def test_a_refused_copy_fails_the_migration_and_the_ring_does_not_flip(make):
    s = make([1, 2], [TableSpec("t", 1)])
    s.handlers[Op.REGISTER](b"new", Message({"op": "register", "id": 1, "role": "server",
                                             "address": "sim://new-server"}, []))
    assert s.migration is not None and s.migration.flip
    ring_version = s.ring.version
    _migrated(s, sorted(s.migration.waiting)[0], failed="server 3 refused: too big")
    assert s.ring.version == ring_version and s.migration is None or not s.migration.flip


def test_plan_moves_redoes_unconfirmed_copies_from_a_complete_holder():
    ring = Ring.create([1, 2, 3], 4)
    v = 0
    primary, backup = ring.replicas(v, 2)
    moves = plan_moves(ring, ring, {"t": 2}, incomplete={("t", v, backup)})
    assert moves == [(primary, "t", v, backup)]
    # the unconfirmed holder is never a source, even when it comes first in the chain
    assert plan_moves(ring, ring, {"t": 2}, incomplete={("t", v, primary)}) == [(backup, "t", v, primary)]
    assert np.all(ring.chains[:, 0] >= 0)


def test_a_worker_asking_ahead_for_a_shard_still_counts_in_the_clocks(make):
    """Workers ask for their next shard while they finish one; only a worker that waits
    and holds no shard is idle, and left out of the servers' vector clocks."""
    from paramserver.scheduler.tasks import TaskQueue

    s = make([1])
    for w in (10, 11):
        s.nodes[w] = NodeInfo(w, "worker", b"w%d" % w, "", s.clock())
        s.by_identity[b"w%d" % w] = w
    s.jobs.job = TaskQueue([["a", 0, 10], ["b", 10, 20]], 1)

    def announced():
        return [h["workers"] for _, h in s.notes if h["op"] == "workers"][-1]

    s.handlers[Op.NEXT_SHARD](b"w10", Message({"op": "next_shard", "id": 1}, []))
    s.handlers[Op.NEXT_SHARD](b"w11", Message({"op": "next_shard", "id": 1}, []))
    assert sorted(s.jobs.job.running.values()) == [10, 11] and announced() == [10, 11]
    s.handlers[Op.NEXT_SHARD](b"w10", Message({"op": "next_shard", "id": 2}, []))  # none left: it waits, holding one
    assert [w[2] for w in s.jobs.waiters] == [10] and announced() == [10, 11]
    sid = next(k for k, v in s.jobs.job.running.items() if v == 10)
    done = Message({"op": "shard_done", "id": 3, "shard_id": sid, "epoch": 0, "stats": {}}, [])
    s.handlers[Op.SHARD_DONE](b"w10", done)
    assert announced() == [11]  # waiting with nothing in hand: idle


def test_no_shard_ahead_when_the_running_ones_bring_a_checkpoint(make):
    from paramserver.scheduler.jobs import JobCheckpoints
    from paramserver.scheduler.tasks import TaskQueue

    s = make([1])
    for w in (10, 11):
        s.nodes[w] = NodeInfo(w, "worker", b"w%d" % w, "", s.clock())
        s.by_identity[b"w%d" % w] = w
    s.jobs.job = TaskQueue([["f", i, i + 1] for i in range(8)], 1)
    s.jobs.checkpoints = JobCheckpoints("unused", every=3, timeout_s=1)
    s.handlers[Op.NEXT_SHARD](b"w10", Message({"op": "next_shard", "id": 1}, []))
    s.handlers[Op.NEXT_SHARD](b"w10", Message({"op": "next_shard", "id": 2}, []))  # ahead: 0 done + 1 running < 3
    assert list(s.jobs.job.running.values()) == [10, 10]
    s.handlers[Op.NEXT_SHARD](b"w11", Message({"op": "next_shard", "id": 1}, []))  # holds none: always served
    s.handlers[Op.NEXT_SHARD](b"w11", Message({"op": "next_shard", "id": 2}, []))  # 0 done + 3 running >= 3: held back
    assert list(s.jobs.job.running.values()) == [10, 10, 11] and [w[2] for w in s.jobs.waiters] == [11]


def test_a_stalled_loop_blames_no_node_for_its_own_stall(make):
    """Issue 12, bug 10: the loop's previous turn was 10 s ago (SIGSTOP, swap): the nodes'
    heartbeats of those 10 s are unread, not missing; deadlines move back by the stall."""
    s = make([1, 2])
    now = s.clock()
    for node in s.nodes.values():
        node.last_seen = now - 10.0  # heard last just before the stall
    s._after_stall(now - 10.0, poll_s=0.5)
    s._check_heartbeats(s.clock())
    assert sorted(s.nodes) == [1, 2] and s.ring.servers == [1, 2]
    s.nodes[2].last_seen -= 100  # a node silent *while the loop runs* is still declared dead
    s._after_stall(s.clock(), poll_s=0.5)
    s._check_heartbeats(s.clock())
    assert sorted(s.nodes) == [1]


def test_worker_ranks_stay_dense_and_a_dead_workers_rank_goes_to_its_replacement(make):
    """Issue 12, bug 8: later workers got ranks 3, 4, 5 while one worker was alive."""
    s = make([1])

    def join(tag):
        s.handlers[Op.REGISTER](tag, Message({"op": "register", "id": 1, "role": "worker"}, []))
        return s.nodes[s.by_identity[tag]]

    a, b, c = join(b"wa"), join(b"wb"), join(b"wc")
    assert [a.rank, b.rank, c.rank] == [0, 1, 2]
    s._remove(b.id, "dead")
    assert join(b"wd").rank == 1  # the replacement takes the dead worker's rank
    s._remove(a.id, "dead")
    s._remove(c.id, "dead")
    assert join(b"we").rank == 0 and join(b"wf").rank == 2
    ranks = sorted(n.rank for n in s.nodes.values() if n.role == "worker")
    assert ranks == [0, 1, 2]


def test_a_barrier_short_of_workers_says_who_is_missing(make, caplog):
    import logging
    s = make([1])
    s.config = s.config.__class__(**{**s.config.__dict__, "workers": 3})
    for tag in (b"wa", b"wb"):
        s.handlers[Op.REGISTER](tag, Message({"op": "register", "id": 1, "role": "worker"}, []))
    s.on_barrier(b"wa", Message({"op": "barrier", "id": 7}, []))
    with caplog.at_level(logging.WARNING, logger="paramserver.scheduler.node"):
        s._say_who_is_missing(s.clock())  # too soon: quiet
        assert not caplog.records
        s._say_who_is_missing(s.clock() + 6)
    (record,) = caplog.records
    assert "1 of 3 worker(s) waiting" in record.getMessage() and "not there yet: ranks [1]" in record.getMessage()


class _Recorder:
    """A scheduler socket that records every reply: (identity, header)."""

    def __init__(self):
        self.sent = []

    def send(self, frames, identity=None):
        import msgpack

        self.sent.append((identity, msgpack.unpackb(bytes(frames[0]))))

    def close(self, linger=0):
        pass


def test_waiting_for_servers_fails_when_the_joiner_dies_mid_copy(make):
    """Issue 13: wait_for_servers (and so LocalCluster.add_server) hung when the server
    joining died while its vnodes were being copied: the abandoned join never came back."""
    s = make([1, 2], [TableSpec("t", 1)])
    s.sock = _Recorder()
    answers = s.sock.sent  # (identity, header) of every reply the scheduler sends
    s.nodes[3] = NodeInfo(3, "server", b"s3", "tcp://127.0.0.1:3", s.clock())
    s.by_identity[b"s3"] = 3
    s.membership.changes.append(("join", 3, None))
    s.membership.next_change()
    assert s.migration is not None and 3 in s.migration.target.servers
    s.handlers[Op.WAIT_SERVERS](b"three", Message({"op": "wait_servers", "id": 7, "count": 3}, []))
    s.handlers[Op.WAIT_SERVERS](b"two", Message({"op": "wait_servers", "id": 8, "count": 2}, []))
    assert not [a for a in answers if a[0] in (b"three", b"two")]  # both wait while the copy runs
    s._remove(3, "dead")  # the joiner dies mid-copy: the join is abandoned
    three = [h for i, h in answers if i == b"three"]
    assert len(three) == 1 and three[0]["op"] == "error" and three[0]["code"] == "node_lost"
    assert "server 3 died" in three[0]["error"] and three[0]["id"] == 7
    two = [h for i, h in answers if i == b"two"]
    assert len(two) == 1 and two[0]["op"] == "ok" and two[0]["servers"] == [1, 2]  # the ring it has


def test_a_restore_waits_for_copies_holds_joins_and_loads_again_after_a_failover(make):
    s = make([1, 2, 3], [TableSpec("t", 1, replicas=2)])
    answers = []
    s.answer = lambda identity, frames: answers.append(frames)
    restore = Message({"op": "restore", "id": 7, "table": "t", "step": "memory://c/000000000000001",
                       "entries": []}, [])

    def commands():
        return [(n, h) for n, h in s.notes if h.get("op") == "restore"]

    def answer_all(loaded=1):
        for node_id, header in commands():
            s.on_ack(b"s%d" % node_id, Message({"op": "ok", "id": header["id"], "loaded": loaded}, []))
        s.notes.clear()

    s.handlers[Op.REGISTER](b"s4", Message({"op": "register", "id": 1, "role": "server", "address": "sim://new"}, []))
    assert s.migration is not None and s.migration.flip
    s.handlers[Op.RESTORE](b"driver", restore)
    assert not commands()  # vnodes are moving: it waits for the flip
    for source in sorted(s.migration.waiting):
        _migrated(s, source)
    assert s.migration is None and sorted(n for n, _ in commands()) == [1, 2, 3, 4]

    s.handlers[Op.REGISTER](b"s5", Message({"op": "register", "id": 2, "role": "server", "address": "sim://late"}, []))
    assert s.migration is None and s.membership.changes  # a join waits for the restore
    s.nodes[2].last_seen -= 100  # and a server dies before it answers: failover, repair copies
    s._check_heartbeats(s.clock())
    answer_all()
    assert not answers and s.migration is not None and not s.migration.flip  # the repair runs first
    for source in sorted(s.migration.waiting):
        _migrated(s, source)
    assert sorted(n for n, _ in commands()) == [1, 3, 4] and not answers  # loaded again
    answer_all(loaded=5)
    assert len(answers) == 1 and b"loaded" in answers[0][0] and not s.restores.busy
    assert s.migration is not None and s.migration.flip  # the held join starts now


def test_a_restore_of_an_unknown_table_is_refused(make):
    s = make([1, 2])
    with pytest.raises(Exception, match="unknown table 'nope': create it before restoring it"):
        s.handlers[Op.RESTORE](b"driver", Message({"op": "restore", "id": 1, "table": "nope", "step": "x",
                                                   "entries": []}, []))


def test_a_scheduler_stopped_in_the_middle_of_a_turn_declares_nobody_dead(make):
    """Found by CI (test_a_client_takes_the_scheduler_back_once_it_answers_again, 1 run in
    3): a SIGSTOP that lands after a turn has started, while it handles messages, used to
    be blamed on every node, whose heartbeats sent meanwhile were still unread."""
    s = make([1, 2], [TableSpec("t", 1)])
    t = {"now": 100.0}
    s.clock = lambda: t["now"]
    for node in s.nodes.values():
        node.last_seen = 100.0
    s._last_turn = 100.0
    handle = s._handle

    def stopped_while_handling(frames):
        handle(frames)
        t["now"] += 10 * s.config.heartbeat_timeout_s  # the process was stopped here

    s._handle = stopped_while_handling
    s.sock.try_recv = iter([[b"driver", *encode({"op": "table_info", "id": 1})], None]).__next__
    s.sock.send = lambda *a, **k: None
    s.turn()
    assert set(s.nodes) == {1, 2}  # their heartbeats are in the socket, unread: nobody is dead
    s.sock.try_recv = lambda: None
    # silent turns, on time: now they are dead (each holds the last copy of its vnodes of a
    # table of replicas 1, so it is fenced and waited for up to last_copy_timeout_s first)
    for _ in range(int((s.config.last_copy_timeout_s + s.config.heartbeat_timeout_s) / s.poll_s)):
        t["now"] += s.poll_s
        s.turn()
    assert not any(n.role == "server" for n in s.nodes.values())


def test_a_repair_source_cut_off_then_back_gets_the_ring_again_and_the_repair_is_planned_again(make):
    """A repair's source cut off past the heartbeat timeout while it holds the last copy of
    some vnodes is fenced, not declared dead; what went to it meanwhile (the ring, its
    MIGRATE, copies and their answers) may be lost on the cut link, so once it beats again
    it is sent the ring again and the repair is planned again: waiting on the old one
    waited for ever, the ring naming backups that never got their vnodes (chaos
    restart-isolate; seeds 256 and 313 of an earlier filters draw)."""
    s = make([1, 2, 3, 4], [TableSpec("t", 1, replicas=2)])
    s._remove(4, "dead")  # failover: the repair's copies go to the new backups
    repair = s.migration
    assert repair is not None and not repair.flip
    cut = next(x for x in sorted(repair.waiting) if s.membership.last_copies(x))
    unconfirmed = set(s.membership.incomplete)
    s.nodes[cut].last_seen -= s.config.heartbeat_timeout_s + 1  # cut off
    s._check_heartbeats(s.clock())
    assert cut in s.nodes and cut in s.detector.fenced and s.migration is repair  # waited for
    s.notes.clear()
    s.nodes[cut].last_seen = s.clock()  # it beats again
    s._check_heartbeats(s.clock())
    assert not s.detector.fenced
    assert (cut, Op.RING.value) in [(n, h["op"]) for n, h in s.notes]  # the ring it may have missed
    again = s.migration
    assert again is not None and again.id != repair.id and not again.flip  # planned again
    assert unconfirmed <= s.membership.incomplete  # nothing counts as copied that was not confirmed
    redone = {(t, v, d) for todo in again.moves.values() for t, v, d in todo}
    assert unconfirmed <= redone
    migrate = [n for n, h in s.notes if h["op"] == Op.MIGRATE.value and h["migration"] == again.id]
    assert sorted(migrate) == sorted(again.waiting)


def test_a_server_whose_lease_came_back_gets_the_ring_again(make):
    """Heartbeats kept coming but the scheduler's messages were cut (its answers too, so
    the server's lease ran out): a beat saying the lease was regained makes the scheduler
    send the ring again and plan again a migration the server takes part in."""
    s = make([1, 2, 3, 4], [TableSpec("t", 1, replicas=2)])
    s._remove(4, "dead")
    repair = s.migration
    assert repair is not None
    source = sorted(repair.waiting)[0]
    s.notes.clear()
    beat = {"op": "heartbeat", "node_id": source, "seq": 7}
    s.registry.heartbeat(b"s%d" % source, Message(beat, []))
    assert s.migration is repair and not s.notes  # an ordinary beat changes nothing
    s.registry.heartbeat(b"s%d" % source, Message({**beat, "regained": 1}, []))
    assert (source, Op.RING.value) in [(n, h["op"]) for n, h in s.notes]
    assert s.migration is not None and s.migration.id != repair.id
    s.notes.clear()
    again = s.migration
    s.registry.heartbeat(b"s%d" % source, Message({**beat, "regained": 1}, []))  # said again: once is enough
    assert s.migration is again and not s.notes


def test_a_returning_server_is_told_the_live_workers_again(make):
    """Issue 47: ``WORKERS`` sent while a server was cut off is lost with the link; the
    server that regains its lease is sent the last list again, with the ring."""
    s = make([1, 2], [TableSpec("t", 1)])
    s._announced = [7, 9]
    s.notes.clear()
    beat = {"op": "heartbeat", "node_id": 2, "seq": 3, "regained": 1}
    s.registry.heartbeat(b"s2", Message(beat, []))
    sent = [(n, h["op"], h.get("workers")) for n, h in s.notes]
    assert (2, Op.RING.value, None) in sent and (2, Op.WORKERS.value, [7, 9]) in sent
