"""A cluster with a secret: every link is CurveZMQ.  Peers without the cluster's keys cannot
register, read, write, drop, stop or spoof anything; a key made for workers cannot register
a server; checkpoints stay under the cluster's checkpoint root, with no '..'."""

import json
import os
import stat
import subprocess
import sys
import time

import numpy as np
import pytest
import zmq

from paramserver import LocalCluster
from paramserver.client.client import Client
from paramserver.config import load_config
from paramserver.errors import CheckpointError, ConfigError, ConnectError
from paramserver.wire.message import Op, decode, encode
from paramserver.wire.security import keygen, load_keys

KEYS = np.arange(2000, dtype=np.uint64)


def _attacks(table: str) -> list[dict]:
    """What an unauthenticated peer could once do (the issue's list), as wire messages."""
    keys = np.array([1, 2, 3], np.uint64)
    return [
        {"op": Op.SHUTDOWN.value, "id": 1},
        {"op": Op.DROP_TABLE.value, "id": 2, "name": table},
        {"op": Op.REGISTER.value, "id": 3, "role": "server", "address": "tcp://127.0.0.1:1"},
        {"op": Op.HEARTBEAT.value, "id": 4, "node_id": 2, "seq": 1},
        {"op": Op.EXPORT.value, "id": 5, "table": table},
        {"op": Op.STATS.value, "id": 6},
        {"op": Op.CHECKPOINT.value, "id": 7, "url": "/tmp/../tmp/paramserver-attack"},
        {"op": Op.PUSH.value, "id": 8, "table": table, "seq": 1, "acked": 5000, "ring_version": 1,
         "_arrays": [keys, np.ones((3, 1), np.float32), np.zeros(1, np.int32), np.array([3], np.int64)]},
        {"op": Op.INSTALL.value, "id": 9, "table": table, "vnode": 0, "ring_version": 1},
        {"op": Op.REMOVE_SERVER.value, "id": 10, "node_id": 2},
    ]


def _any_answer(sock: zmq.Socket, attacks: list[dict]) -> bool:
    """Try to send every message; True if anything came back within a second after.  (A
    peer whose handshake was refused has no link to queue on: its send fails at once.)"""
    for header in attacks:
        arrays = header.pop("_arrays", [])
        try:
            sock.send_multipart(encode(header, arrays), zmq.NOBLOCK)
        except zmq.Again:
            pass
    return bool(sock.poll(1000))


def _cluster_unchanged(cluster: LocalCluster, servers: set) -> None:
    client = cluster.client
    assert "t" in client.tables()
    np.testing.assert_array_equal(client.pull("t", KEYS).result(timeout=30), np.full((KEYS.size, 1), 2.0, np.float32))
    assert set(client.admin.cluster_info()["ring_servers"]) == servers


@pytest.fixture()
def keyfile(tmp_path):
    path = str(tmp_path / "cluster.key")
    proc = subprocess.run([sys.executable, "-m", "paramserver", "keygen", "--out", path], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600  # readable by its owner only
    return path


def test_peers_without_the_clusters_keys_change_nothing_and_are_logged(tmp_path, keyfile):
    other = str(tmp_path / "other.key")
    keygen(other)
    # spawned: a forked node under pytest would log into pytest's capture, not its log file
    with LocalCluster(servers=2, secret_file=keyfile, log_level="INFO", start_method="spawn") as cluster:
        client = cluster.client
        client.create_table("t", dim=1, optimizer={"name": "sgd", "lr": 1.0}, replicas=2)
        client.push("t", KEYS, np.full((KEYS.size, 1), -2.0, np.float32)).result(timeout=30)  # every value 2
        servers = set(client.admin.cluster_info()["ring_servers"])
        addresses = [cluster.address, *client.admin.cluster_info()["servers"].values()]
        # a client without the keys, or with another cluster's: refused within its connect timeout
        # (one without keys is told the cluster may need them: something listens, nothing answers; one
        # with another cluster's, that the scheduler did not accept its key, issue 43.20)
        for secret, said in ((None, "give --secret-file FILE"), (other, f"did not accept the key of --secret-file "
                                                                      f"{other}")):
            started = time.monotonic()
            with pytest.raises(ConnectError, match=said):
                Client(config=load_config(scheduler=cluster.address, connect_timeout_s=2.0, secret_file=secret))
            assert time.monotonic() - started < 2.0 + 1.0  # within its connect timeout
        ctx = zmq.Context()
        try:
            # a raw ZeroMQ peer (no CurveZMQ), and a CurveZMQ peer that knows the server key but holds no
            # key of the cluster: every attack, at the scheduler and at every server, gets no answer
            server_public = load_keys(keyfile).server_public
            for curve in (False, True):
                for address in addresses:
                    sock = ctx.socket(zmq.DEALER)
                    sock.linger = 0
                    if curve:
                        sock.curve_serverkey = server_public
                        sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
                    sock.connect(address)
                    assert not _any_answer(sock, _attacks("t")), (address, curve)
                    sock.close()
        finally:
            ctx.destroy(linger=0)
        _cluster_unchanged(cluster, servers)  # nothing dropped, stopped, poisoned or replaced
        assert not os.path.exists("/tmp/paramserver-attack")
        refusals = [line for f in os.listdir(cluster.log_dir) if f.endswith(".log")
                    for line in open(os.path.join(cluster.log_dir, f)) if "refused a connection from 127.0.0.1" in line]
        assert len(refusals) == 3, refusals  # once for the address, in each node it knocked at (scheduler, 2 servers)


def test_a_worker_key_runs_workers_but_cannot_register_a_server(tmp_path, keyfile):
    worker_key = str(tmp_path / "worker.key")
    proc = subprocess.run([sys.executable, "-m", "paramserver", "keygen", "--from", keyfile, "--role", "worker",
                           "--out", worker_key], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "server_secret" not in json.load(open(worker_key))  # it cannot serve
    with LocalCluster(servers=1, secret_file=keyfile, log_level="WARNING") as cluster:
        cluster.client.create_table("t", dim=1)
        with Client(config=load_config(scheduler=cluster.address, secret_file=worker_key)) as worker_client:
            worker_client.push("t", KEYS, np.ones((KEYS.size, 1), np.float32)).result(timeout=30)
            assert worker_client.pull("t", KEYS[:3]).result(timeout=30).shape == (3, 1)
        keys = load_keys(worker_key)
        ctx = zmq.Context()
        try:
            sock = ctx.socket(zmq.DEALER)
            sock.linger = 0
            sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = (keys.server_public, keys.public,
                                                                                 keys.secret)
            sock.connect(cluster.address)
            sock.send_multipart(encode({"op": Op.REGISTER.value, "id": 1, "role": "server",
                                        "address": "tcp://127.0.0.1:1"}))
            assert sock.poll(10_000)
            answer = decode(sock.recv_multipart())
            assert answer.op is Op.ERROR and "a worker key cannot register as a server" in answer.header["error"]
        finally:
            ctx.destroy(linger=0)
        assert len(cluster.client.admin.cluster_info()["ring_servers"]) == 1
    # a worker's file cannot start a server either
    with pytest.raises(ConfigError, match="only the cluster's file"):
        LocalCluster(servers=1, secret_file=worker_key)
    proc = subprocess.run([sys.executable, "-m", "paramserver", "scheduler", "--secret-file", worker_key],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "only the cluster's file" in proc.stderr and "Traceback" not in proc.stderr


def test_every_privileged_call_is_refused_to_every_lesser_key(tmp_path, keyfile):
    """Issue 28.4: a worker key could remove a server, drop a table, shut the cluster down
    and export the model.  Each role may ask only what ``wire/security.py`` lists: every
    privileged call, sent with every lesser key, to the scheduler and to a server, is
    refused with a protocol error and changes nothing."""
    from paramserver.wire.security import DRIVER_OPS, WORKER_OPS

    files = {}
    for role in ("worker", "driver"):
        files[role] = str(tmp_path / f"{role}.key")
        proc = subprocess.run([sys.executable, "-m", "paramserver", "keygen", "--from", keyfile, "--role", role,
                               "--out", files[role]], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
    to_scheduler = {"remove_server": {"node_id": 1}, "shutdown": {}, "migrated": {"migration": 1},
                    "drop_table": {"name": "t"}, "create_table": {"spec": {"name": "u", "dim": 1}},
                    "drop_namespace": {"name": "t"}, "create_namespace": {"name": "n", "quota": {}},
                    "job_start": {"shards": [[0, 1]]}, "restore": {"url": str(tmp_path / "r")}}
    to_server = {"export": {"table": "t"}, "call": {"table": "t", "function": "paramserver.functions:l2"},
                 "install": {"table": "t", "vnode": 0}, "replicate": {"table": "t"}}
    with LocalCluster(servers=1, secret_file=keyfile, log_level="WARNING") as cluster:
        cluster.client.create_table("t", dim=1)
        cluster.client.push("t", KEYS, -np.ones((KEYS.size, 1), np.float32)).result(timeout=30)
        before = cluster.client.pull("t", KEYS).result(timeout=30)
        server = cluster.client._servers[cluster.client.admin.ring.servers[0]]
        ctx = zmq.Context()
        try:
            for role, allowed in (("worker", WORKER_OPS), ("driver", DRIVER_OPS)):
                keys = load_keys(files[role])
                for address, calls in ((cluster.address, to_scheduler), (server, to_server)):
                    sock = ctx.socket(zmq.DEALER)
                    sock.linger = 0
                    sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = (
                        keys.server_public, keys.public, keys.secret)
                    sock.connect(address)
                    for i, (op, header) in enumerate(sorted(calls.items())):
                        if op in allowed:
                            continue
                        sock.send_multipart(encode({"op": op, "id": i, **header}))
                        assert sock.poll(10_000), f"{op} with a {role} key: no answer"
                        answer = decode(sock.recv_multipart())
                        assert answer.op is Op.ERROR and answer.header["code"] == "protocol", (role, op, answer.header)
                        assert f"a {role} key cannot ask this" in answer.header["error"], answer.header
                    sock.close()
        finally:
            ctx.destroy(linger=0)
        # nothing changed: the server, the table and its values are there
        assert len(cluster.client.admin.cluster_info()["ring_servers"]) == 1
        assert "t" in cluster.client.tables()
        np.testing.assert_array_equal(cluster.client.pull("t", KEYS).result(timeout=30), before)


def test_key_files_are_checked_and_never_overwritten(tmp_path, keyfile):
    proc = subprocess.run([sys.executable, "-m", "paramserver", "keygen", "--out", keyfile], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "exists: keygen does not overwrite keys" in proc.stderr
    bad = tmp_path / "bad.key"
    bad.write_text("{not json")
    for path, message in ((str(bad), "not a paramserver key file"), (str(tmp_path / "none.key"), "no such file")):
        with pytest.raises(ConfigError, match=message):
            LocalCluster(servers=1, secret_file=path)
        proc = subprocess.run([sys.executable, "-m", "paramserver", "server", "--scheduler", "tcp://127.0.0.1:1",
                               "--secret-file", path], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def test_checkpoints_stay_under_the_checkpoint_root_and_never_take_dotdot(tmp_path, monkeypatch):
    root = tmp_path / "root"
    root.mkdir()
    with LocalCluster(servers=1, log_level="WARNING") as cluster:  # no root: anywhere, but never '..'
        cluster.client.create_table("t", dim=1)
        cluster.client.push("t", KEYS, np.ones((KEYS.size, 1), np.float32)).result(timeout=30)
        outside = cluster.client.checkpoint(str(tmp_path / "outside"))
        with pytest.raises(CheckpointError, match="has a '..' in it"):
            cluster.client.checkpoint(f"{tmp_path}/outside/../../escape")
    monkeypatch.setenv("PARAMSERVER_CHECKPOINT_ROOT", str(root))  # every node of the cluster reads it
    with LocalCluster(servers=2, log_level="WARNING") as cluster:
        client = cluster.client
        client.create_table("t", dim=1)
        client.push("t", KEYS, np.ones((KEYS.size, 1), np.float32)).result(timeout=30)
        for url, message in ((str(tmp_path / "elsewhere"), "outside the cluster's checkpoint root"),
                             (f"{root}/../escape", "has a '..' in it")):
            with pytest.raises(CheckpointError, match=message):
                client.checkpoint(url)
        assert not (tmp_path / "elsewhere").exists() and not (tmp_path / "escape").exists()
        (tmp_path / "linked").mkdir()
        (root / "link").symlink_to(tmp_path / "linked")  # inside the root, to a folder outside it
        with pytest.raises(CheckpointError, match="through a symlink.* is outside the cluster's checkpoint root"):
            client.checkpoint(str(root / "link" / "ck"))
        assert not any((tmp_path / "linked").rglob("*.npz"))
        (root / "old").symlink_to(os.path.dirname(outside))
        step = client.checkpoint(str(root / "ok"))
        assert step.startswith(str(root))
        client.drop_table("t")
        with pytest.raises(ConfigError, match="could not restore 't': CheckpointError: .* outside the cluster's "
                                              "checkpoint root"):
            client.restore(outside)  # the servers refuse to read there
        assert "t" not in client.tables()
        with pytest.raises(ConfigError, match="could not restore 't': CheckpointError: .* outside the cluster's "
                                              "checkpoint root"):
            client.restore(str(root / "old" / os.path.basename(outside)))  # nor through a link in the root
        assert "t" not in client.tables()


def test_with_a_secret_the_http_endpoints_ask_for_the_token(keyfile, monkeypatch):
    import urllib.error
    import urllib.request

    monkeypatch.setenv("PARAMSERVER_METRICS_PORT", "0")  # every node's own endpoint too
    with LocalCluster(servers=1, secret_file=keyfile, http_port=0, log_level="WARNING") as cluster:
        client = cluster.client
        client.create_table("t", dim=1)
        client.push("t", KEYS, np.ones((KEYS.size, 1), np.float32)).result(timeout=30)
        token = cluster.http_token
        assert token == json.load(open(keyfile))["http_token"]
        urls = [cluster.http_url + "metrics", cluster.http_url + "api/state",
                *client.admin.cluster_info()["metrics"].values()]
        assert len(urls) == 4  # the dashboard's two, the scheduler's and the server's own
        for url in urls:
            with pytest.raises(urllib.error.HTTPError, match="401"):
                urllib.request.urlopen(url, timeout=30)
            with pytest.raises(urllib.error.HTTPError, match="401"):
                urllib.request.urlopen(f"{url}?token=wrong", timeout=30)
            assert urllib.request.urlopen(f"{url}?token={token}", timeout=30).status == 200
            request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
            assert urllib.request.urlopen(request, timeout=30).status == 200
        page = urllib.request.urlopen(cluster.http_url, timeout=30).read().decode()  # holds no data itself
        assert "<title>paramserver</title>" in page


def test_a_member_acts_only_as_the_node_it_registered_as(tmp_path, keyfile):
    """Holders of a worker's key cannot spoof another node: a push naming another sender (to
    ack its seqs away), a heartbeat naming a server, an install over a vnode."""
    worker_key = str(tmp_path / "worker.key")
    keygen(worker_key, "worker", keyfile)
    with LocalCluster(servers=2, workers=1, secret_file=keyfile, log_level="WARNING") as cluster:
        client = cluster.client
        client.create_table("t", dim=1, optimizer={"name": "sgd", "lr": 1.0}, replicas=2)
        client.push("t", KEYS, np.full((KEYS.size, 1), -2.0, np.float32)).result(timeout=30)  # replicated, proven
        info = client.admin.cluster_info()
        servers = set(info["ring_servers"])
        victim = int(next(iter(info["workers"])))
        keys = load_keys(worker_key)
        ctx = zmq.Context()
        try:
            def ask(address: str, header: dict, arrays=()) -> str:
                sock = ctx.socket(zmq.DEALER)
                sock.linger = 0
                sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = (keys.server_public, keys.public,
                                                                                     keys.secret)
                sock.connect(address)
                sock.send_multipart(encode(header, list(arrays)))
                assert sock.poll(10_000), header["op"]
                answer = decode(sock.recv_multipart())
                sock.close()
                assert answer.op is Op.ERROR, (header["op"], answer.header)
                return answer.header["error"]

            server = info["servers"][str(min(servers))]
            ring = client.admin.ring
            vnode = int(np.flatnonzero(ring.owners == min(servers))[0])
            push = {"op": Op.PUSH.value, "id": 1, "table": "t", "sender": victim, "seq": 5001, "acked": 5000,
                    "ring_version": ring.version, "sender_token": "0" * 32}
            assert "without its token" in ask(server, push, [np.zeros(1, np.uint64), np.ones((1, 1), np.float32),
                                                             np.array([vnode], np.int32), np.array([1], np.int64)])
            assert "without its token" in ask(server, {"op": Op.CLOCK.value, "id": 2, "worker": victim,
                                                       "clock": 99})
            assert "a worker key cannot ask this" in ask(server, {"op": Op.INSTALL.value, "id": 3, "table": "t"})
            assert "without its token" in ask(cluster.address, {"op": Op.HEARTBEAT.value, "id": 4,
                                                                "node_id": min(servers), "seq": 1})
        finally:
            ctx.destroy(linger=0)
        _cluster_unchanged(cluster, servers)
        # the victim's own pushes still apply: nothing acknowledged them away
        assert cluster.run(_push_twice, timeout_s=60) == [True]


def _push_twice(client):
    keys = np.arange(10, dtype=np.uint64) + np.uint64(1 << 40)
    client.push("t", keys, np.full((10, 1), -1.0, np.float32)).result(timeout=30)
    client.push("t", keys, np.full((10, 1), -1.0, np.float32)).result(timeout=30)
    return bool((client.pull("t", keys).result(timeout=30) == 2.0).all())


def test_the_secret_from_the_environment_secures_a_cluster_and_its_clients(tmp_path, monkeypatch):
    key = str(tmp_path / "env.key")
    proc = subprocess.run([sys.executable, "-m", "paramserver", "keygen", key], capture_output=True, text=True,
                          timeout=60)  # the file as a plain argument
    assert proc.returncode == 0 and os.path.exists(key), proc.stderr
    monkeypatch.setenv("PARAMSERVER_SECRET_FILE", key)
    with LocalCluster(servers=1, log_level="WARNING") as cluster:
        assert cluster.http_token == load_keys(key).http_token
        cluster.client.create_table("t", dim=1)
        with Client(cluster.address) as client:  # the environment's keys
            client.push("t", KEYS, np.ones((KEYS.size, 1), np.float32)).result(timeout=30)
        monkeypatch.delenv("PARAMSERVER_SECRET_FILE")
        with pytest.raises(ConnectError):
            Client(cluster.address, connect_timeout_s=1.0)
        with Client(cluster.address, secret_file=key) as client:  # or given
            assert client.pull("t", KEYS[:2]).result(timeout=30).shape == (2, 1)


def test_the_training_commands_take_the_secret_file_flag_as_the_role_commands_do(tmp_path, keyfile):
    """Issue 33.7: train, mf, lda and lasso refused --secret-file (only the variable worked).
    What the flag does, seen from outside: train's local cluster serves with the file's keys
    (its dashboard's token is the file's), and a file the local cluster cannot serve with (a
    worker's) stops each of the four before it starts, the file named."""
    from paramserver.apps.ctr.synth import write_synth

    data = str(tmp_path / "d.tsv")
    write_synth(data, 2_000, seed=1)
    env = {k: v for k, v in os.environ.items() if k != "PARAMSERVER_SECRET_FILE"}
    proc = subprocess.run([sys.executable, "-m", "paramserver", "train", "--data", data, "--quiet", "--dashboard", "0",
                           "--secret-file", keyfile], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"?token={load_keys(keyfile).http_token}" in proc.stdout + proc.stderr  # keyed with this file
    worker = str(tmp_path / "worker.key")
    made = subprocess.run([sys.executable, "-m", "paramserver", "keygen", "--role", "worker", "--from", keyfile,
                           "--out", worker], capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    (tmp_path / "reg.svm").write_text("1 1:1 2:1\n0 1:1\n")
    (tmp_path / "u.data").write_text("1 1 5\n1 2 3\n2 1 4\n2 2 1\n")
    (tmp_path / "docs.ldac").write_text("2 1:3 2:1\n2 2:1 3:4\n")
    for command in (["train", "--data", data], ["lasso", "--lambda-ratio", "2", "--data", str(tmp_path / "reg.svm")],
                    ["mf", "--data", str(tmp_path / "u.data")], ["lda", "--data", str(tmp_path / "docs.ldac")]):
        out = subprocess.run([sys.executable, "-m", "paramserver", *command, "--quiet", "--secret-file", worker],
                             capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode == 2, (command, out.stderr)
        assert f"secret_file {worker} is a worker key file" in out.stderr, (command, out.stderr)
