"""Push and pull across a veth link between two network namespaces, against loopback.

Run (as root): ``.venv/bin/python bench/netns.py [--keys 100000] [--rounds 30]``

Host A (a namespace) runs the scheduler and one server, host B a client; a veth pair joins
them (10.x.y.1 and .2).  The same client workload then runs on loopback (everything in
one namespace).  Every node is bound on 0.0.0.0 and advertises its route to the scheduler.
Printed: M keys/s for pulls and pushes of ``--keys`` dim-1 keys, ``--rounds`` each,
one request at a time.  The namespaces are removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from bench_harness.namespaces import VethPair
from bench_harness.procs import stop

CLIENT = r"""
import json, sys, time
import numpy as np
from paramserver import Client
keys = np.arange(int(sys.argv[2]), dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
rounds = int(sys.argv[3])
with Client(sys.argv[1], connect_timeout_s=30) as c:
    c.create_table("bench", dim=1, optimizer={"name": "sgd", "lr": 0.1})
    grads = np.ones((keys.size, 1), np.float32)
    c.push("bench", keys, grads).result(timeout=60)
    out = {}
    for op in ("pull", "push"):
        t = time.perf_counter()
        for _ in range(rounds):
            (c.pull("bench", keys) if op == "pull" else c.push("bench", keys, grads)).result(timeout=60)
        out[op] = keys.size * rounds / (time.perf_counter() - t) / 1e6
    c.admin.shutdown_cluster()
print(json.dumps(out))
"""


def run(ns_server: str, ns_client: str, host: str, keys: int, rounds: int) -> dict:
    port = str(7600 + os.getpid() % 300)
    wrap = (lambda ns: ["ip", "netns", "exec", ns]) if ns_server else (lambda ns: [])
    env = {**os.environ, "PARAMSERVER_LOG_LEVEL": "WARNING"}
    procs = [subprocess.Popen([*wrap(ns_server), sys.executable, "-m", "paramserver", "scheduler", "--host",
                               "0.0.0.0", "--port", port], env=env),
             subprocess.Popen([*wrap(ns_server), sys.executable, "-m", "paramserver", "server", "--host", "0.0.0.0",
                               "--scheduler", f"tcp://{host}:{port}"], env=env)]
    try:
        done = subprocess.run([*wrap(ns_client), sys.executable, "-c", CLIENT, f"tcp://{host}:{port}", str(keys),
                               str(rounds)], env=env, capture_output=True, text=True, timeout=300)
        if done.returncode:
            raise SystemExit(done.stderr)
        return json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        stop(procs, 20)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    with VethPair("psb", 20) as pair:  # removed at the end, whatever happens
        veth = run(pair.a, pair.b, f"{pair.net}.1", args.keys, args.rounds)
        loopback = run("", "", "127.0.0.1", args.keys, args.rounds)
    print(f"{'link':<10} {'pull M keys/s':>14} {'push M keys/s':>14}   ({args.keys:,} keys x {args.rounds})")
    for name, r in (("veth", veth), ("loopback", loopback)):
        print(f"{name:<10} {r['pull']:>14.2f} {r['push']:>14.2f}")


if __name__ == "__main__":
    main()
