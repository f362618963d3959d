"""What fuzzed messages cost a server's and the scheduler's memory (issue 28.6).

Run: ``.venv/bin/python bench/fuzz_memory.py [--messages 100000] [--json]``

A local cluster (1 server, no secret: anyone may send anything); raw DEALERs on
127.0.0.1 send ``--messages`` messages each to the server and to the scheduler: random
ops (every op of the protocol, and unknown ones), random header fields of random types,
random frames, and now and then bytes that are not a message at all (less the ops that
do what they say, like ``shutdown``: without a secret anyone may send them).  Half of them come
from one connection, the rest from new connections of 100 messages each; replies are
read as they come.  Reported: each node's resident memory before, after, and after 10 s
of quiet, that both still serve, and the scheduler's node count after the quiet.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

import numpy as np
import zmq

from paramserver import LocalCluster
from paramserver.wire.message import Op, encode


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return 0.0


def value(rng: random.Random) -> object:
    kind = rng.randrange(8)
    if kind == 0:
        return rng.randrange(-2**40, 2**40)
    if kind == 1:
        return rng.choice(["", "t", "tcp://127.0.0.1:1", "x" * rng.randrange(300), "server", "worker", "driver"])
    if kind == 2:
        return [rng.randrange(100) for _ in range(rng.randrange(5))]
    if kind == 3:
        return {"name": "t", "dim": rng.randrange(-1, 4)}
    if kind == 4:
        return None
    if kind == 5:
        return rng.random() * 1e9
    if kind == 6:
        return True
    return {str(rng.randrange(10)): rng.randrange(10)}


#: ops that do what they say when well formed (without a secret anyone may send them): a
#: fuzzer that shuts the cluster down or drops its table measures nothing after
DOING = ("shutdown", "remove_server", "drop_table", "drop_namespace", "leave", "stop")
FIELDS = ("table", "name", "spec", "keys", "clock", "worker", "sender", "seq", "acked", "ring_version", "role",
          "address", "node_id", "url", "migration", "moves", "generation", "count", "shard_id", "epoch",
          "vnode", "from", "seqs", "buffered", "metrics", "pid", "process", "token", "op")


def message(rng: random.Random, i: int) -> list[bytes]:
    if rng.random() < 0.05:
        return [os.urandom(rng.randrange(1, 64)) for _ in range(rng.randrange(1, 4))]
    ops = [o.value for o in Op if o.value not in DOING] + ["nonsense"]
    header = {"op": rng.choice(ops), "id": i}
    for _ in range(rng.randrange(6)):
        header[rng.choice(FIELDS)] = value(rng)
    arrays = [np.frombuffer(os.urandom(8 * rng.randrange(0, 64)), np.uint8) for _ in range(rng.randrange(4))]
    return [bytes(f) for f in encode(header, arrays)]


def fuzz(address: str, n: int, seed: int, ctx: zmq.Context) -> int:
    rng = random.Random(seed)
    sent = 0
    sock = None
    for i in range(n):
        if sock is None or (i >= n // 2 and i % 100 == 0):  # half from one peer, then many short-lived ones
            if sock is not None:
                sock.close(linger=0)
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(address)
        sock.send_multipart(message(rng, i))
        sent += 1
        while sock.poll(0):
            sock.recv_multipart()
    if sock is not None:
        sock.close(linger=0)
    return sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with LocalCluster(servers=1, workers=0, log_level="ERROR") as cluster:
        client = cluster.client
        client.create_table("t", dim=1)
        server = client.stats.server_stats()[0]
        scheduler_pid = cluster.procs["scheduler"].popen.pid
        address = client._servers[server["node_id"]]
        before = {"server": rss_mb(server["pid"]), "scheduler": rss_mb(scheduler_pid)}
        ctx = zmq.Context()
        t0 = time.monotonic()
        fuzz(address, args.messages, 1, ctx)
        fuzz(cluster.address, args.messages, 2, ctx)
        ctx.destroy(linger=0)
        after = {"server": rss_mb(server["pid"]), "scheduler": rss_mb(scheduler_pid)}
        time.sleep(10)
        quiet = {"server": rss_mb(server["pid"]), "scheduler": rss_mb(scheduler_pid)}
        client.push("t", np.arange(10, dtype=np.uint64), np.ones((10, 1), np.float32)).result(timeout=60)
        serves = client.pull("t", np.arange(10, dtype=np.uint64)).result(timeout=60).shape == (10, 1)
        nodes = len(client.admin.cluster_info().get("workers", {}))
        result = {"messages_each": args.messages, "seconds": round(time.monotonic() - t0, 1), "rss_mb_before": before,
                  "rss_mb_after": after, "rss_mb_after_10s": quiet, "still_serves": serves,
                  "workers_registered_after": nodes}
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
