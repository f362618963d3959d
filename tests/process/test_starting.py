"""How a local cluster starts its nodes (``cluster/starting.py``).  The servers-apart start
runs in an interpreter of its own: a cluster forks its nodes only from a process with no
other thread, which this test process, with other modules' clusters and clients behind it,
need not be."""

import json
import os
import subprocess
import sys

SCRIPT = r'''
import json, os, sys
import numpy as np
from paramserver import LocalCluster
from paramserver._runtime import warm

tmp = sys.argv[1]
warm.servers_load_apart()  # as cli/main does for the command's one cluster
ran = os.path.join(tmp, "ran")
os.makedirs(ran)


def servers():  # in each server's process, once forked
    open(os.path.join(ran, f"servers-{os.getpid()}"), "w").close()


def workers():  # in the driver, before the workers are forked
    open(os.path.join(ran, f"workers-{os.getpid()}"), "w").close()


def pushed_and_pulled(client):
    keys = np.array([1, 2, 2], np.uint64)
    client.push("w", keys, np.ones((3, 1), np.float32)).result(timeout=30)
    client.barrier(timeout_s=30)
    return client.pull("w", keys).result(timeout=30)[:, 0].tolist()


logs = os.path.join(tmp, "logs")
os.makedirs(logs)
with open(os.path.join(logs, "scheduler.addr"), "w") as f:
    f.write("tcp://127.0.0.1:9")  # a dead scheduler's, from a run before
with LocalCluster(servers=2, workers=2, log_level="WARNING", log_dir=logs,
                  warm=warm.Warmup(servers=servers, workers=workers)) as cluster:
    cluster.client.create_table("w", optimizer={"name": "sgd", "lr": 1.0})
    pulled = cluster.run(pushed_and_pulled, timeout_s=60)
    servers_pids = sorted(p.popen.pid for name, p in cluster.procs.items() if name.startswith("server-"))
    cluster.add_server(timeout_s=60)
    after = cluster.client.pull("w", np.array([1, 2], np.uint64)).result(timeout=30)[:, 0].tolist()
    print(json.dumps({"pulled": pulled, "servers": servers_pids, "driver": os.getpid(), "ran": sorted(os.listdir(ran)),
                      "serving": len(cluster.client.stats.server_stats()), "after_join": after}))
'''


def test_servers_loading_apart_warm_up_themselves_learn_the_address_and_take_a_joiner(tmp_path):
    """The command's one cluster (``warm.servers_load_apart``): each server is forked before
    the scheduler listens, runs the server warm-up itself (never the driver, which runs the
    workers') and reads the scheduler's address from its file; a stale address file of a
    log folder used before is never read; a server added later (spawned: the driver has
    threads by then) joins with the rows intact."""
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=180,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["pulled"] == [[-2.0, -4.0, -4.0]] * 2
    assert got["ran"] == sorted([f"servers-{pid}" for pid in got["servers"]] + [f"workers-{got['driver']}"])
    assert got["serving"] == 3
    assert got["after_join"] == [-2.0, -4.0]
