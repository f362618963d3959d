"""Hot backup: the counter workload survives a SIGKILLed server, a server joining and
one leaving, with every acknowledged push applied exactly once."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from support import shared, wait_for

from paramserver import LocalCluster
from paramserver.apps.ctr.modelfile import metrics
from paramserver.apps.ctr.models import Model
from paramserver.apps.ctr.test_set import score
from paramserver.apps.ctr.train import TrainConfig
from paramserver.apps.ctr.train_loop import train_worker
from paramserver.data.reader import DataFormat, make_shards, read_all

pytestmark = pytest.mark.timeout(180)

N_KEYS, CLOCKS, WORKERS = 1000, 60, 3
KEYS = np.arange(N_KEYS, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)  # spread over every vnode


def count(client, clocks, gate):
    """Each clock, +1 on every key (SGD lr 1 on gradient -1), acknowledged before the next;
    after a third of the clocks, wait for ``gate`` to exist (the disturbance happens then,
    whatever the machine's speed), then go on through it."""
    import os
    import time
    grads = -np.ones((N_KEYS, 1), np.float32)
    for c in range(clocks):
        if c == clocks // 3:
            deadline = time.monotonic() + 120
            while not os.path.exists(gate) and time.monotonic() < deadline:
                time.sleep(0.01)
        client.push("counter", KEYS, grads).result(timeout=120)
        client.clock()
    return client.rank


def _progress(client):
    return float(client.pull("counter", KEYS[:1]).result(timeout=60)[0, 0])


def _run_counting(cluster, disturb):
    """Start the workers, call ``disturb`` once a third of the clocks are done, wait, check."""
    import os
    import tempfile
    client = cluster.client
    client.create_table("counter", dim=1, optimizer={"name": "sgd", "lr": 1.0}, replicas=2)
    gate = os.path.join(tempfile.mkdtemp(prefix="paramserver-gate-"), "go")
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(cluster.run, count, CLOCKS, gate, timeout_s=150)
        wait_for(lambda: running.done() or _progress(client) >= WORKERS * (CLOCKS // 3), what="a third of the clocks")
        assert not running.done(), "the workers finished before the disturbance"
        disturb()
        open(gate, "w").close()  # the workers go on, through whatever the disturbance did
        assert sorted(running.result()) == list(range(WORKERS))
    values = client.pull("counter", KEYS).result(timeout=60)
    np.testing.assert_array_equal(values, np.full((N_KEYS, 1), WORKERS * CLOCKS, np.float32))
    return client


def test_a_killed_server_loses_no_acknowledged_push():
    with LocalCluster(servers=3, workers=WORKERS, heartbeat_interval_s=0.2, heartbeat_timeout_s=2.0,
                      log_level="WARNING") as cluster:
        version = cluster.client.admin.ring.version
        client = _run_counting(cluster, lambda: cluster.kill("server-1"))
        info = client.admin.cluster_info()
        assert len(info["ring_servers"]) == 2 and info["ring_version"] > version
        stats = client.stats.server_stats()  # both survivors hold every vnode again (r = 2 restored)
        assert sum(s["tables"]["counter"]["primary_keys"] for s in stats) == N_KEYS
        assert all(s["tables"]["counter"]["keys"] == N_KEYS for s in stats)


def test_a_server_joining_and_one_leaving_mid_run_lose_nothing():
    with LocalCluster(servers=3, workers=WORKERS, log_level="WARNING") as cluster:
        first = cluster.client.admin.cluster_info()["ring_servers"]

        def reshape():
            cluster.add_server()
            joined = [s for s in cluster.client.admin.cluster_info()["ring_servers"] if s not in first]
            assert len(joined) == 1
            cluster.remove_server(first[0])

        client = _run_counting(cluster, reshape)
        info = client.admin.cluster_info()
        assert sorted(info["ring_servers"]) == sorted([*first[1:], *[s for s in info["ring_servers"]
                                                                      if s not in first]])
        stats = client.stats.server_stats()
        assert len(stats) == 3
        assert sum(s["tables"]["counter"]["primary_keys"] for s in stats) == N_KEYS
        assert sum(s["tables"]["counter"]["keys"] for s in stats) == 2 * N_KEYS  # two copies of each


def _train_a9a(kill_at_examples: int | None) -> tuple[float, int]:
    """3 servers (r = 2), one worker, 3 epochs of a9a; optionally SIGKILL a server once
    ``kill_at_examples`` examples went by.  Returns test log loss and examples trained."""
    train, test = shared("libsvm/a9a.libsvm.gz"), shared("libsvm/a9a.t.libsvm.gz")
    cfg = TrainConfig(Model("lr"), DataFormat("libsvm", label_format="pm1"), epochs=3, batch_size=100,
                      pipeline=1, replicas=2)
    spec = cfg.table_spec()
    with LocalCluster(servers=3, workers=1, heartbeat_interval_s=0.2, heartbeat_timeout_s=2.0,
                      log_level="WARNING") as cluster:
        client = cluster.client
        client.create_table(spec.name, spec.dim, optimizer=spec.optimizer, initializer=spec.initializer,
                            replicas=spec.replicas)
        client.job.start(make_shards([train]), cfg.epochs)
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(cluster.run, train_worker, cfg, timeout_s=150)
            if kill_at_examples is not None:
                wait_for(lambda: running.done() or client.job.status()["live"]["examples"] >= kill_at_examples,
                          what=f"{kill_at_examples} examples")
                assert not running.done(), "training finished before the kill"
                cluster.kill("server-1")
            running.result()
        status = client.job.status()
        batch = read_all([test], cfg.data)
        return metrics(batch.labels, score(client, cfg.model, batch))["logloss"], int(status["examples"])


def test_training_with_a_server_killed_mid_epoch_matches_an_undisturbed_run():
    undisturbed, n = _train_a9a(None)
    disturbed, m = _train_a9a(kill_at_examples=45_000)  # in the second epoch
    assert n == m == 3 * 32_561
    assert abs(disturbed - undisturbed) <= 0.005 * undisturbed, (disturbed, undisturbed)


def test_a_stalled_scheduler_does_not_declare_the_servers_dead():
    """Issue 12, bug 10: SIGSTOP the scheduler past the heartbeat timeout, then SIGCONT:
    it declared every server dead, the servers stopped (zombie rule), the data was gone."""
    import signal
    import time

    from paramserver import Client
    with LocalCluster(servers=2, workers=0, heartbeat_interval_s=0.2, heartbeat_timeout_s=1.5,
                      log_level="WARNING") as cluster:
        client = cluster.client
        client.create_table("kept", dim=1, optimizer={"name": "sgd", "lr": 1.0}, replicas=2)
        client.push("kept", KEYS, -np.ones((N_KEYS, 1), np.float32)).result(timeout=30)
        before = client.admin.cluster_info()
        scheduler = cluster.procs["scheduler"].popen
        scheduler.send_signal(signal.SIGSTOP)
        time.sleep(3.0)  # the fault itself: a pause twice the heartbeat timeout
        scheduler.send_signal(signal.SIGCONT)
        with Client(cluster.address, connect_timeout_s=30) as fresh:
            wait_for(lambda: fresh.admin.cluster_info()["ring_version"] >= before["ring_version"], 30,
                     "the scheduler to answer")
            time.sleep(1.0)  # give a wrong verdict (deadline 1.5 s) the time it would need to show
            after = fresh.admin.cluster_info()
            assert after["ring_servers"] == before["ring_servers"], after
            assert after["ring_version"] == before["ring_version"], after
            assert all(p.popen.poll() is None for n, p in cluster.procs.items() if n.startswith("server"))
            np.testing.assert_array_equal(fresh.pull("kept", KEYS).result(timeout=30), np.ones((N_KEYS, 1)))


def test_a_call_made_while_the_scheduler_is_silent_waits_for_it_and_a_dead_one_is_taken_back(monkeypatch):
    """Issue 47 (a nemesis run, seed 507): a scheduler paused 7 s failed a training job, because
    its calls failed once the scheduler was silent past the heartbeat timeout.  The scheduler
    holds the cluster's only control state: a call to it now waits for it, up to
    ``last_copy_timeout_s``; past that it is declared dead and the call fails, and (issue 13) the
    client takes it back once it answers again."""
    import signal
    from concurrent.futures import ThreadPoolExecutor
    from concurrent.futures import TimeoutError as FutureTimeout

    from paramserver.errors import NodeLostError

    monkeypatch.setenv("PARAMSERVER_LAST_COPY_TIMEOUT_S", "4")
    with LocalCluster(servers=1, workers=0, heartbeat_interval_s=0.2, heartbeat_timeout_s=1.0,
                      log_level="WARNING") as cluster, ThreadPoolExecutor(1) as pool:
        client = cluster.client
        client.create_table("w", dim=1, optimizer={"name": "sgd", "lr": 1.0})
        scheduler = cluster.procs["scheduler"].popen
        scheduler.send_signal(signal.SIGSTOP)
        try:
            wait_for(client._io.scheduler_lost, 30, "the client to find the stopped scheduler silent")
            waiting = pool.submit(client.admin.cluster_info)  # past the heartbeat timeout, within the grace
            with pytest.raises(FutureTimeout):  # in flight while the scheduler is stopped: it waits, not fails
                waiting.result(timeout=0.5)
        finally:
            scheduler.send_signal(signal.SIGCONT)
        assert waiting.result(timeout=30)["ring_servers"]  # answered once the scheduler ran again

        scheduler.send_signal(signal.SIGSTOP)  # past the grace: declared dead, what waits fails
        try:
            with pytest.raises(NodeLostError, match="missed its heartbeat deadline"):
                client.admin.cluster_info()
        finally:
            scheduler.send_signal(signal.SIGCONT)

        def answers():
            try:
                return client.admin.cluster_info()
            except NodeLostError:
                return None

        info = wait_for(answers, 30, "the same client's calls to go through again")
        assert info["ring_servers"], info
        client.push("w", KEYS, -np.ones((N_KEYS, 1), np.float32)).result(timeout=30)
        np.testing.assert_array_equal(client.pull("w", KEYS).result(timeout=30), np.ones((N_KEYS, 1)))


def test_a_paused_server_does_not_answer_with_stale_values_once_its_backup_took_over():
    """Issue 13: a server paused past the heartbeat timeout, then resumed, answered the
    pulls that still reached it with values its promoted backup had moved past, until a
    heartbeat reply told it it was dead.  It now serves only under a lease."""
    import signal

    import zmq

    from paramserver.wire.message import Op, decode, encode

    with LocalCluster(servers=2, workers=0, heartbeat_interval_s=0.2, heartbeat_timeout_s=1.5,
                      log_level="WARNING") as cluster:
        client = cluster.client
        client.create_table("w", dim=1, optimizer={"name": "sgd", "lr": 1.0}, replicas=2)
        client.push("w", KEYS, -np.ones((N_KEYS, 1), np.float32)).result(timeout=30)  # every value 1
        piece = client._pieces(Op.PULL, KEYS, None, 0)[0]  # a pull as routed now, to its primary
        victim = piece.server
        address = client._servers[victim]
        pids = {s["node_id"]: s["pid"] for s in client.stats.server_stats()}
        name = next(n for n, p in cluster.procs.items() if p.popen.pid == pids[victim])
        proc = cluster.procs[name].popen
        proc.send_signal(signal.SIGSTOP)
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            wait_for(lambda: victim not in client.admin.cluster_info().get("ring_servers", [victim]), 30,
                     "the scheduler to declare the paused server dead")
            client.push("w", KEYS, -np.ones((N_KEYS, 1), np.float32)).result(timeout=30)  # now 2, on the backup
            sock.connect(address)  # a client that still routes to the old primary
            sock.send_multipart(encode({"op": Op.PULL.value, "id": 1, "table": "w", "ring_version": piece.ring_version},
                                       [piece.keys, piece.vnodes, piece.counts]))
        finally:
            proc.send_signal(signal.SIGCONT)
        try:
            answer = decode(sock.recv_multipart()) if sock.poll(10_000) else None  # it may also just stop
        finally:
            sock.close(linger=0)
        assert answer is None or (answer.op is Op.ERROR and answer.header["code"] == "stale_ring"), \
            (answer.header, answer.arrays[0][:5] if answer.arrays else None)
        np.testing.assert_array_equal(client.pull("w", KEYS).result(timeout=30), 2 * np.ones((N_KEYS, 1)))


def test_a_paused_server_with_the_last_copy_is_fenced_and_waited_for_not_written_off():
    """Issue 28: a server that stops past the heartbeat timeout (a JIT compile on a cold
    cache, a long collection) while it holds the last complete copy of some vnodes was
    declared dead, and those vnodes restarted from their initial values.  It is now
    fenced and waited for: once it runs again, every acknowledged push is there."""
    import signal

    with LocalCluster(servers=2, workers=0, heartbeat_interval_s=0.2, heartbeat_timeout_s=1.0,
                      log_level="WARNING") as cluster:
        client = cluster.client
        client.create_table("w", dim=1, optimizer={"name": "sgd", "lr": 1.0}, replicas=1)  # no backup at all
        client.push("w", KEYS, -np.ones((N_KEYS, 1), np.float32)).result(timeout=30)
        victim = client.stats.server_stats()[0]
        proc = next(p.popen for p in cluster.procs.values() if p.popen.pid == victim["pid"])
        proc.send_signal(signal.SIGSTOP)
        try:
            wait_for(lambda: victim["node_id"] in client.admin.cluster_info()["fenced"], 30,
                     "the scheduler to fence the silent server")
            pending = client.push("w", KEYS, -np.ones((N_KEYS, 1), np.float32))  # half of it waits for the victim
        finally:
            proc.send_signal(signal.SIGCONT)
        pending.result(timeout=30)
        info = client.admin.cluster_info()
        assert sorted(info["ring_servers"]) == sorted(s["node_id"] for s in client.stats.server_stats())
        assert len(info["ring_servers"]) == 2 and info["fenced"] == []
        np.testing.assert_array_equal(client.pull("w", KEYS).result(timeout=30), 2 * np.ones((N_KEYS, 1)))


def test_a_client_declared_dead_closes_instead_of_going_on_as_a_zombie():
    """Issue 13 (found by the chaos campaign's workers): a client whose heartbeats stopped
    long enough is declared dead, and the servers forget its exactly-once record; when it
    beats again the scheduler says so, and it must stop rather than retry pushes the
    servers could apply twice."""
    from paramserver.client.client import Client
    from paramserver.config import load_config
    from paramserver.errors import ClosedError

    with LocalCluster(servers=1, workers=0, heartbeat_interval_s=0.2, heartbeat_timeout_s=1.0,
                      log_level="WARNING") as cluster:
        cluster.client.create_table("w", dim=1)
        config = load_config(scheduler=cluster.address, heartbeat_interval_s=0.2, heartbeat_timeout_s=1.0)
        with Client(config=config, role="worker") as zombie:
            zombie.push("w", KEYS, np.ones((N_KEYS, 1), np.float32)).result(timeout=30)
            zombie._io._heartbeats = False  # as if the process were paused: no beat goes out
            wait_for(lambda: str(zombie.node_id) not in cluster.client.admin.cluster_info()["workers"], 30,
                     "the scheduler to declare the silent client dead")
            zombie._io.start_heartbeats()  # it resumes: its next beat is answered "unknown node"
            wait_for(lambda: zombie._io._closed.is_set(), 30, "the client to close itself")
            with pytest.raises(ClosedError, match="declared this client dead"):
                zombie.push("w", KEYS, np.ones((N_KEYS, 1), np.float32)).result(timeout=30)


def test_a_push_after_the_scheduler_was_killed_fails_fast_and_names_it():
    """Issue 28.8: with the scheduler SIGKILLed, a push blocked for retry_timeout_s (60 s),
    then raised a stale-ring error that did not mention the scheduler.  The client knows
    the scheduler's process is gone (same machine): the push fails at once, and says why."""
    import time

    from paramserver import NodeLostError

    with LocalCluster(servers=1, workers=0, heartbeat_interval_s=0.2, heartbeat_timeout_s=1.0,
                      log_level="WARNING") as cluster:
        client = cluster.client
        client.create_table("w", dim=1, optimizer={"name": "sgd", "lr": 1.0})
        client.push("w", KEYS, -np.ones((N_KEYS, 1), np.float32)).result(timeout=30)
        cluster.kill("scheduler")
        cluster.procs["scheduler"].popen.wait(10)
        wait_for(lambda: client._io.scheduler_lost(), 30, "the client to declare the scheduler lost")
        t0 = time.monotonic()
        with pytest.raises(NodeLostError, match="the scheduler at .* stopped answering"):
            client.push("w", KEYS, -np.ones((N_KEYS, 1), np.float32)).result(timeout=30)
        assert time.monotonic() - t0 < 10  # not retry_timeout_s
