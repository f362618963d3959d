"""Real processes on 127.0.0.1: exact sums, bad messages, errors, roles started by hand."""

import os
import re
import shutil
import subprocess
import sys
import time

import msgpack
import numpy as np
import pytest
import zmq

import paramserver
from paramserver import Client, ConfigError, ConnectError, LocalCluster, UnknownTableError, WorkerError
from paramserver.routing.partition import route_pull

ROUNDS = 15
EDGE = np.array([0, 2**64 - 1], np.uint64)


def overlapping_pushes(client, rounds):
    """Each worker pushes integer deltas (exact in float32) to keys that overlap the others'."""
    rng = np.random.default_rng(client.rank)
    for _ in range(rounds):
        keys = np.concatenate([rng.integers(0, 3000, 4000).astype(np.uint64), EDGE])  # duplicates too
        deltas = rng.integers(-3, 4, (keys.size, 4)).astype(np.float32)
        client.push("sums", keys, -deltas).result(timeout=30)  # sgd lr=1: value -= -delta
        client.clock()
    client.barrier(timeout_s=30)
    return client.rank


def expected_sums(n_workers, rounds):
    total: dict[int, np.ndarray] = {}
    for rank in range(n_workers):
        rng = np.random.default_rng(rank)
        for _ in range(rounds):
            keys = np.concatenate([rng.integers(0, 3000, 4000).astype(np.uint64), EDGE])
            deltas = rng.integers(-3, 4, (keys.size, 4)).astype(np.float32)
            for k, d in zip(keys.tolist(), deltas):
                total[k] = total.get(k, 0) + d
    return total


def test_overlapping_pushes_from_three_workers_sum_exactly(cluster):
    cluster.client.create_table("sums", dim=4, optimizer={"name": "sgd", "lr": 1.0})
    assert sorted(cluster.run(overlapping_pushes, ROUNDS, timeout_s=120)) == [0, 1, 2]
    expected = expected_sums(3, ROUNDS)
    keys = np.array(list(expected), np.uint64)
    got = cluster.client.pull("sums", np.concatenate([keys, keys[:10]])).result(timeout=30)
    want = np.array([expected[k] for k in keys.tolist()], np.float32)
    np.testing.assert_array_equal(got[: keys.size], want)
    np.testing.assert_array_equal(got[keys.size:], want[:10])  # duplicates in a pull
    stats = cluster.client.stats.server_stats()
    assert sum(s["tables"]["sums"]["keys"] for s in stats) == keys.size
    assert all(s["tables"]["sums"]["keys"] > 0 for s in stats)  # both servers hold a share
    assert all(sorted(s["clocks"].values()) == [ROUNDS] * 3 for s in stats)


def _raw_request(sock, frames, timeout_ms=10_000):
    sock.send_multipart(frames)
    assert sock.poll(timeout_ms), "the server did not answer"
    reply = sock.recv_multipart()
    return msgpack.unpackb(reply[0]), reply[1:]


def test_malformed_messages_get_error_replies_and_the_server_keeps_serving(cluster):
    client = cluster.client
    client.create_table("fuzz", dim=2, optimizer="adagrad")
    keys = np.arange(50, dtype=np.uint64)
    routed = route_pull(client.admin.ring, keys)
    part = routed.parts[0]
    address = client._servers[part.server]
    good_keys = routed.keys[part.start:part.stop]
    head = {"op": "pull", "id": 1, "table": "fuzz", "ring_version": client.admin.ring.version,
            "arrays": [["<u8", [good_keys.size]], ["<i4", [part.vnodes.size]], ["<i8", [part.counts.size]]]}
    body = [good_keys.tobytes(), part.vnodes.tobytes(), part.counts.tobytes()]
    other_vnode = np.array([np.flatnonzero(client.admin.ring.owners != part.server)[0]], np.int32)
    cases = {
        "not msgpack": [b"\xc1\xc1", *body],
        "unknown op": [msgpack.packb({**head, "op": "explode"}), *body],
        "wrong dtype": [msgpack.packb({**head, "arrays": [["<f8", [good_keys.size]], *head["arrays"][1:]]}), *body],
        "size mismatch": [msgpack.packb(head), body[0][:-3], *body[1:]],
        "missing frame": [msgpack.packb(head), *body[:2]],
        "unknown table": [msgpack.packb({**head, "table": "nope"}), *body],
        "bad counts": [msgpack.packb(head), body[0], body[1], (part.counts + 1).tobytes()],
        "not my vnode": [msgpack.packb({**head, "arrays": [head["arrays"][0], ["<i4", [1]], ["<i8", [1]]]}),
                         body[0], other_vnode.tobytes(), np.array([good_keys.size], np.int64).tobytes()],
        "ring_version not an int": [msgpack.packb({**head, "ring_version": "99"}), *body],
        "vnode out of range": [msgpack.packb({**head, "arrays": [head["arrays"][0], ["<i4", [1]], ["<i8", [1]]]}),
                               body[0], np.array([1 << 30], np.int32).tobytes(),
                               np.array([good_keys.size], np.int64).tobytes()],
        "counts that wrap around": [
            msgpack.packb({**head, "arrays": [head["arrays"][0], ["<i4", [3]], ["<i8", [3]]]}), body[0],
            np.repeat(part.vnodes[:1], 3).astype(np.int32).tobytes(),
            np.array([2**63 - 1, 2**63 - 1, good_keys.size + 2], np.int64).tobytes()],
        "a vnode twice": [
            msgpack.packb({**head, "arrays": [head["arrays"][0], ["<i4", [2]], ["<i8", [2]]]}), body[0],
            np.repeat(part.vnodes[:1], 2).astype(np.int32).tobytes(),
            np.array([good_keys.size - 1, 1], np.int64).tobytes()],
        "random bytes": [os.urandom(64), os.urandom(7)],
    }
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    try:
        for name, frames in cases.items():
            header, _ = _raw_request(sock, frames)
            assert header["op"] == "error", name
            assert header["error"], name
            if name not in ("not msgpack", "random bytes"):
                assert header["id"] == 1, name  # the caller can tell which request failed
        header, arrays = _raw_request(sock, [msgpack.packb(head), *body])
        assert header["op"] == "ok" and len(arrays) == 1
        # random mutations of a valid push: every one is answered, none kills the server
        rng = np.random.default_rng(7)
        client.create_table("fuzz-push", dim=2, optimizer="adagrad")  # mutated pushes may land: not in "fuzz"
        arrays = [head["arrays"][0], ["<f4", [good_keys.size, 2]], *head["arrays"][1:]]
        push_head = {**head, "op": "push", "table": "fuzz-push", "arrays": arrays}
        push = [msgpack.packb(push_head), body[0], np.ones((good_keys.size, 2), np.float32).tobytes(), *body[1:]]
        answers = set()
        for _ in range(300):
            frames = [bytearray(f) for f in push]
            i = int(rng.integers(len(frames)))
            if frames[i] and rng.random() < 0.7:
                for _ in range(int(rng.integers(1, 4))):
                    frames[i][int(rng.integers(len(frames[i])))] = int(rng.integers(256))
            else:
                frames[i] = frames[i][: int(rng.integers(len(frames[i]) + 1))]
            header, _ = _raw_request(sock, [bytes(f) for f in frames])
            answers.add(header["op"])
        assert "error" in answers
        header, arrays = _raw_request(sock, [msgpack.packb(head), *body])
        assert header["op"] == "ok" and len(arrays) == 1
    finally:
        sock.close()
    np.testing.assert_array_equal(client.pull("fuzz", keys).result(timeout=10), np.zeros((50, 2)))
    # the scheduler too answers garbage with errors and keeps serving
    sched = ctx.socket(zmq.DEALER)
    sched.setsockopt(zmq.LINGER, 0)
    sched.connect(cluster.address)
    try:
        for frames in ([b"\xc1"], [msgpack.packb({"op": "pull", "id": 5})],
                       [msgpack.packb({"op": "create_table", "id": 6, "spec": {"name": "x", "dim": -1}})],
                       [msgpack.packb({"op": "register", "id": 7, "role": "king"})]):
            header, _ = _raw_request(sched, frames)
            assert header["op"] == "error" and header["error"]
    finally:
        sched.close()
    assert "fuzz" in client.tables()


def test_user_errors_are_clear(cluster):
    client = cluster.client
    with pytest.raises(UnknownTableError, match="unknown table 'missing'"):
        client.pull("missing", [1, 2])
    client.create_table("shape", dim=3)
    with pytest.raises(ConfigError, match=r"grads must have shape \(2, 3\)"):
        client.push("shape", [1, 2], np.ones((2, 2)))
    with pytest.raises(ConfigError, match="NaN or inf"):
        client.push("shape", [1, 2], np.full((2, 3), np.nan))
    with pytest.raises(ConfigError, match="keys must be integers"):
        client.pull("shape", [1.5])
    with pytest.raises(ConfigError, match="exists with a different spec"):
        client.create_table("shape", dim=4)
    client.drop_table("shape")
    with pytest.raises(UnknownTableError):
        client.pull("shape", [1])


def raise_on_rank_one(client):
    if client.rank == 1:
        raise RuntimeError("boom from rank one")
    return "fine"


def test_a_worker_exception_comes_back_with_its_traceback(cluster):
    with pytest.raises(WorkerError, match="(?s)raised:.*RuntimeError: boom from rank one"):
        cluster.run(raise_on_rank_one, timeout_s=60)
    assert cluster.run(lambda c: c.rank * 10, timeout_s=60) == [0, 10, 20]  # workers survive


def test_a_dead_worker_does_not_block_the_barrier():
    def die_or_wait(client):
        if client.rank == 1:
            os._exit(3)
        client.barrier(timeout_s=30)
        return "passed"

    with LocalCluster(servers=1, workers=2, heartbeat_interval_s=0.2, heartbeat_timeout_s=1.5,
                      log_level="WARNING") as cluster:
        t0 = time.monotonic()
        with pytest.raises(WorkerError, match=r"worker-\d died \(exit code 3\)") as err:
            cluster.run(die_or_wait, timeout_s=60)
        assert str(err.value).count("died") == 1 and "raised" not in str(err.value)
        assert time.monotonic() - t0 < 20


def test_released_workers_leave_while_the_servers_still_answer_the_driver():
    """``release_workers`` (a job's end, before its test rows are scored): every worker
    process exits, the driver still pulls what the workers pushed, and ``stop`` ends the
    rest; during a run it is refused, and no worker is let go."""
    def pushed(client):
        client.push("w", np.arange(10, dtype=np.uint64) + np.uint64(10 * client.rank),
                    np.full((10, 1), -1.0, np.float32)).result(timeout=30)
        return client.rank

    with LocalCluster(servers=1, workers=2, log_level="WARNING") as cluster:
        cluster.client.create_table("w", dim=1, optimizer={"name": "sgd", "lr": 1.0})
        assert sorted(cluster.run(pushed, timeout_s=60)) == [0, 1]
        workers = [p for name, p in cluster.procs.items() if name.startswith("worker")]
        cluster.release_workers()
        for proc in workers:
            assert proc.popen.wait(timeout=20) == 0  # each leaves on its own: no signal, no stop
        rows = cluster.client.pull("w", np.arange(20, dtype=np.uint64)).result(timeout=30)
        assert (rows == 1.0).all()


def test_workers_are_not_released_during_a_run():
    def waits(client):
        time.sleep(1.5)
        return client.rank

    with LocalCluster(servers=1, workers=1, log_level="WARNING") as cluster:
        import threading
        done: list = []
        runner = threading.Thread(target=lambda: done.append(cluster.run(waits, timeout_s=60)))
        runner.start()
        deadline = time.monotonic() + 10
        while cluster._active is None and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(WorkerError, match="a function is running"):
            cluster.release_workers()
        runner.join(30)
        assert done == [[0]]


def test_unreachable_scheduler_is_a_clear_error():
    t0 = time.monotonic()
    with pytest.raises(ConnectError, match=r"nothing listens at tcp://127.0.0.1:9 \(connection refused for 3 s\)"):
        Client("tcp://127.0.0.1:9", connect_timeout_s=30)  # a person waits seconds, not the connect timeout
    assert time.monotonic() - t0 < 15
    proc = subprocess.run([sys.executable, "-m", "paramserver", "server", "--scheduler", "tcp://127.0.0.1:9",
                           "--connect-timeout-s", "0.5", "--log-level", "ERROR"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "could not reach the scheduler" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("bind", [[], ["--host", "0.0.0.0"], ["--host", "0.0.0.0", "--advertise-host", "127.0.0.1"]])
def test_roles_started_by_hand(tmp_path, bind):
    """Also bound on every interface: a server then advertises an address peers can reach
    (issue 12, bug 3), never tcp://0.0.0.0."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), *sys.path]),
           "PARAMSERVER_HEARTBEAT_INTERVAL_S": "0.2", "PARAMSERVER_LOG_LEVEL": "WARNING"}
    addr_file = tmp_path / "addr"

    def start(*args):
        return subprocess.Popen([sys.executable, "-m", "paramserver", *args], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    procs = [start("scheduler", "--servers", "2", "--workers", "1", "--address-file", str(addr_file), *bind)]
    try:
        deadline = time.monotonic() + 30
        while not addr_file.exists():
            assert time.monotonic() < deadline and procs[0].poll() is None, "scheduler did not start"
            time.sleep(0.02)
        address = addr_file.read_text().replace("0.0.0.0", "127.0.0.1")  # how a client names the host
        env["PARAMSERVER_SCHEDULER"] = address  # the environment seam
        procs += [start("server", *bind), start("server", *bind)]
        worker = start("worker", "--fn", "jobs:push_ones")
        out, err = worker.communicate(timeout=60)
        assert worker.returncode == 0, err
        assert out.strip() == "pushed"
        with Client(address) as driver:
            got = driver.pull("by-hand", np.arange(100)).result(timeout=10)
            np.testing.assert_array_equal(got, np.ones((100, 2)))
            servers = driver.admin.cluster_info()["servers"].values()
            assert len(servers) == 2 and all(a.startswith("tcp://127.0.0.1:") for a in servers), servers
            driver.admin.shutdown_cluster()
        for p in procs:
            assert p.wait(timeout=20) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_roles_started_by_one_command_from_ps_lites_environment_alone():
    """`paramserver node` with only ps-lite's DMLC_* variables (as Kubeflow's MXJob-style
    operators set them, deploy/kubernetes/paramserver.yaml): the roles find each other,
    and PARAMSERVER_HOST (binding 127.0.0.1 here) wins over the contract's 0.0.0.0."""
    import socket

    with socket.socket() as probe:  # a free port for the scheduler, as a Service would name one
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PARAMSERVER_", "DMLC_"))}
    base.update({"PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), *sys.path]),
                 "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(port), "DMLC_NUM_SERVER": "2",
                 "DMLC_NUM_WORKER": "1", "PARAMSERVER_HOST": "127.0.0.1", "PARAMSERVER_LOG_LEVEL": "WARNING",
                 "PARAMSERVER_HEARTBEAT_INTERVAL_S": "0.2"})

    def start(role, **extra):
        return subprocess.Popen([sys.executable, "-m", "paramserver", "node"], env={**base, "DMLC_ROLE": role, **extra},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    procs = [start("scheduler"), start("server"), start("server")]
    try:
        worker = start("worker", PARAMSERVER_FN="jobs:push_ones")
        out, err = worker.communicate(timeout=60)
        assert worker.returncode == 0, err
        assert out.strip() == "pushed"
        with Client(f"tcp://127.0.0.1:{port}") as driver:
            got = driver.pull("by-hand", np.arange(100)).result(timeout=10)
            np.testing.assert_array_equal(got, np.ones((100, 2)))
            assert len(driver.admin.cluster_info()["servers"]) == 2
            driver.admin.shutdown_cluster()
        for p in procs:
            assert p.wait(timeout=20) == 0
        no_fn = start("worker")
        assert no_fn.wait(timeout=30) == 2 and "needs its function: --fn or PARAMSERVER_FN" in no_fn.stderr.read()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_run_starts_a_cluster_runs_a_closure_on_every_worker_and_stops_it():
    import paramserver

    offset = 100  # captured by the closure: shipped by value to the workers

    def train(client):
        keys = np.array([1, 2, 2], np.uint64)
        client.push("w", keys, np.ones((3, 1), np.float32)).result(timeout=30)
        client.barrier(timeout_s=30)
        return offset + client.rank, client.pull("w", keys).result(timeout=30)[:, 0].tolist()

    results = paramserver.run(train, servers=2, workers=2, log_level="WARNING",
                              setup=lambda c: c.create_table("w", optimizer={"name": "sgd", "lr": 1.0}))
    assert [r[0] for r in results] == [100, 101]
    # after the barrier both workers' pushes are in: key 1 got 1 from each, key 2 got 2 from each
    assert all(r[1] == [-2.0, -4.0, -4.0] for r in results)


@paramserver.server_function()
def collector_on(keys, values, args):
    import gc

    return float(gc.isenabled())


def test_nodes_and_the_driver_collect_cycles_after_start_up():
    """Start-up pauses the cyclic collector (cli.main, LocalCluster.start) and the nodes are
    forked meanwhile: every node turns it back on, and the driver has it on again."""
    import gc

    def collecting(client):
        return gc.isenabled()

    assert gc.isenabled()
    with LocalCluster(servers=2, workers=2, log_level="WARNING") as cluster:
        assert gc.isenabled()
        cluster.client.create_table("w")
        assert cluster.client.call("w", f"{__name__}:collector_on").result(timeout=30) == 2.0  # both servers
        assert cluster.run(collecting) == [True, True]


def test_a_dead_scheduler_fails_waiting_calls_instead_of_hanging():
    import dataclasses

    from paramserver import NodeLostError

    with LocalCluster(servers=1, workers=0, heartbeat_interval_s=0.2, heartbeat_timeout_s=1.5,
                      log_level="WARNING") as cluster:
        client = cluster.client
        client.create_table("t")
        cluster.kill("scheduler")
        t0 = time.monotonic()
        with pytest.raises(NodeLostError, match="scheduler"):
            client.job.start([], 1)  # would otherwise wait for an answer forever
        assert time.monotonic() - t0 < 10
        with pytest.raises(NodeLostError):  # and later calls fail at once
            client.tables()
        # The data plane works on, but only under the servers' leases (issue 13: a server
        # cut off from the scheduler served for ever, though it may have been declared
        # dead and its backups promoted); once a lease runs out, pulls and pushes are
        # refused, and nothing is applied.  (This test asserted that serving went on
        # without a scheduler: that was the bug.)  The call fails naming the scheduler, at
        # once since its process is known gone (issue 28.8: it took retry_timeout_s, and
        # named a stale ring).
        client.config = dataclasses.replace(client.config, retry_timeout_s=30.0)
        t0 = time.monotonic()
        with pytest.raises(NodeLostError, match=r"the scheduler at .* stopped answering .* lease ran out"):
            client.push("t", [1], [[1.0]]).result(timeout=30)
        assert time.monotonic() - t0 < 10


def test_nodes_exit_when_the_process_that_started_them_is_killed():
    """A driver killed outright cannot stop its cluster; the nodes notice and exit."""
    script = ("import json, os, signal, paramserver\n"
              "c = paramserver.LocalCluster(servers=1, workers=1).__enter__()\n"
              "print(json.dumps([p.popen.pid for p in c.procs.values()]), flush=True)\n"
              "os.kill(os.getpid(), signal.SIGKILL)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    pids = [int(p) for p in out.stdout.strip("[]\n").split(",")]
    assert len(pids) == 3, out.stderr

    def alive(pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 20
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)  # polling /proc: a non-child's exit sends us nothing
    left = [p for p in pids if alive(p)]
    for p in left:  # never leave them running, even when the test fails
        os.kill(p, 9)
    assert not left, f"nodes {left} outlived the process that started them"


def _wait_for_file(client, path):
    from support import wait_for
    wait_for(lambda: os.path.exists(path), 60, f"{path} to appear")
    return "slow"


def test_a_late_result_of_a_run_that_timed_out_is_never_another_runs(tmp_path):
    """run(slow, timeout) gives up; slow finishes later; the next run gets its own results."""
    gate = str(tmp_path / "gate")
    with LocalCluster(servers=1, workers=1, log_level="WARNING") as cluster:
        with pytest.raises(WorkerError, match="did not finish within 1"):
            cluster.run(_wait_for_file, gate, timeout_s=1)
        open(gate, "w").close()  # now the slow run returns, late
        assert cluster.run(lambda c: "fast", timeout_s=60) == ["fast"]
        assert cluster.run(lambda c: "again", timeout_s=60) == ["again"]


@pytest.mark.parametrize("address", ["not-an-endpoint", "tcp://0.0.0.0:5000", "tcp://host:99999", 17,
                                     "tcp://a b:1"])
def test_a_server_registering_a_bad_address_is_refused_and_the_ring_is_untouched(address):
    """Issue 12, bug 14: one such register killed both servers (a ZMQError in the copy path)
    and the ring formed on the fake node."""
    with LocalCluster(servers=2, workers=0, log_level="WARNING") as cluster:
        client = cluster.client
        client.create_table("kept", dim=1, optimizer={"name": "sgd", "lr": 1.0})
        keys = np.arange(500, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        client.push("kept", keys, -np.ones((keys.size, 1), np.float32)).result(timeout=30)
        before = client.admin.cluster_info()
        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(cluster.address)
        try:
            answer, _ = _raw_request(sock, [msgpack.packb({"op": "register", "id": 1, "role": "server",
                                                           "address": address})])
        finally:
            sock.close()
        assert answer["op"] == "error" and answer["code"] == "protocol", answer
        after = client.admin.cluster_info()
        assert after["ring_servers"] == before["ring_servers"] and after["ring_version"] == before["ring_version"]
        assert all(p.popen.poll() is None for n, p in cluster.procs.items() if n.startswith("server"))
        np.testing.assert_array_equal(client.pull("kept", keys).result(timeout=30), np.ones((keys.size, 1)))


def test_cluster_status_shows_servers_tables_keys_memory_and_workers():
    with LocalCluster(servers=2, workers=1, log_level="WARNING") as cluster:
        cluster.client.create_table("seen", dim=1, optimizer="sgd")
        cluster.client.push("seen", np.arange(300, dtype=np.uint64), np.ones((300, 1), np.float32)).result(timeout=30)
        proc = subprocess.run([sys.executable, "-m", "paramserver", "cluster", "status",
                               "--scheduler", cluster.address],
                              capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert text.count("  server ") == 2 and "RSS" in text and "table bytes" in text
    assert "table seen: dim 1, sgd, replicas 1, hash, 300 keys" in text
    assert re.search(r"workers: 1 \(node \d+ rank 0\)", text), text


def test_a_bad_fn_is_said_before_connecting():
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "paramserver", "worker", "--fn", "no_such_module:main",
                           "--scheduler", "tcp://127.0.0.1:9", "--connect-timeout-s", "30"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "--fn 'no_such_module:main': module 'no_such_module' does not import here" in proc.stderr
    assert time.monotonic() - t0 < 20  # not after a 30 s connect timeout


def test_a_dense_table_the_servers_cannot_hold_is_refused_and_not_listed():
    """Issue 12, bug 15: it stayed listed, and later pushes got UnknownTableError."""
    from paramserver import ParamServerError
    with LocalCluster(servers=2, workers=0, log_level="WARNING") as cluster:
        client = cluster.client
        with pytest.raises(ParamServerError, match=r"dense table 'huge' .* needs [\d,.]+ GiB on this server"):
            client.create_table("huge", dim=64, optimizer="adam", key_bits=32)  # ~2 TiB
        wait_for_condition = time.monotonic() + 30
        while "huge" in client.tables():
            assert time.monotonic() < wait_for_condition, "the failed table is still listed"
            time.sleep(0.05)
        client.create_table("small", dim=1, optimizer="sgd")  # the cluster goes on
        client.push("small", np.arange(10, dtype=np.uint64), np.ones((10, 1), np.float32)).result(timeout=30)
        assert all(p.popen.poll() is None for n, p in cluster.procs.items() if n.startswith("server"))


def test_a_failed_job_keeps_the_logs_its_progress_line_named():
    """Issue 33.2: the folder printed as "logs DIR" was gone when the job failed, though
    --log-dir's help says a failed job keeps it; a job that ends well removes it."""
    from paramserver.data.reader import DataError

    with pytest.raises(DataError):
        with LocalCluster(servers=1, workers=0, log_level="WARNING") as failed:
            raise DataError("a bad line")
    assert os.path.isdir(failed.log_dir) and os.listdir(failed.log_dir)
    shutil.rmtree(failed.log_dir)
    with LocalCluster(servers=1, workers=0, log_level="WARNING") as fine:
        pass
    assert not os.path.exists(fine.log_dir)


def test_every_node_is_named_for_ps_and_top(cluster):
    """``ps`` shows ``paramserver: server 2 ADDRESS``, ``top`` ``ps-server-2`` (issue 33.11):
    not a dozen identical python command lines."""
    from tests.process.support import wait_for

    def names():
        out = {}
        for name, proc in cluster.procs.items():
            with open(f"/proc/{proc.popen.pid}/cmdline", "rb") as f:
                out[name] = (f.read().split(b"\0")[0].decode(), open(f"/proc/{proc.popen.pid}/comm").read().strip())
        return out

    seen = wait_for(lambda: (n := names()) and all(t.startswith("paramserver: ") and "(starting)" not in t
                                                   for t, _ in n.values()) and n, 30, "every node named")
    for name, (title, comm) in seen.items():
        role = name.split("-")[0]
        assert title.startswith(f"paramserver: {role} ") and comm.startswith(f"ps-{role}"), (name, title, comm)
    servers = {title.split()[2] for name, (title, _) in seen.items() if name.startswith("server")}
    assert len(servers) == len([n for n in seen if n.startswith("server")])  # each its own id
