"""Failover and migration costs, measured on a local cluster over loopback.

Run: ``.venv/bin/python bench/failover.py [--json]``

1. **Failover latency.**  3 servers, a table with replicas=2.  A client pushes a small
   batch of keys whose primary is one server, waiting for each acknowledgement; that
   server is SIGKILLed.  Reported: seconds from the SIGKILL to the first acknowledged
   push on its keys, against the heartbeat timeout (which runs from the victim's last
   beat, up to one interval before the kill; the rest is the ring flip, the client's
   retry and the promoted backup's answer), and that the values are exact.
2. **Migration dip.**  3 servers, a table of ``--keys`` keys (dim ``--dim``, AdaGrad,
   replicas=2); a client pushes 100 000-key batches back to back while a 4th server
   joins (its share of vnodes is copied, then the ring flips).  Reported: push
   throughput before, during (from starting the server process to the flip) and after,
   the slowest 100 ms window, the longest wait for an acknowledgement against the
   steady one, and the duration.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time

import numpy as np

from paramserver import Client, LocalCluster
from paramserver._runtime.malloc import tune_allocator
from paramserver.config import load_config


def failover_latency(timeout_s: float, interval_s: float) -> dict:
    with LocalCluster(servers=3, heartbeat_interval_s=interval_s, heartbeat_timeout_s=timeout_s,
                      log_level="WARNING") as cluster:
        client = cluster.client
        client.create_table("f", dim=1, optimizer={"name": "sgd", "lr": 1.0}, replicas=2)
        victim_id = client.admin.cluster_info()["ring_servers"][1]
        keys = np.random.default_rng(0).integers(0, 2**64 - 1, 200_000, dtype=np.uint64)
        keys = keys[client.admin.ring.owner_of_keys(keys) == victim_id][:1000]
        grads = np.ones((keys.size, 1), np.float32)
        for _ in range(50):  # warm: connections, JIT
            client.push("f", keys, grads).result(timeout=60)
        # which process is the victim? the one whose pid the server reports
        pid = next(s["pid"] for s in client.stats.server_stats() if s["node_id"] == victim_id)
        killed = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        client.push("f", keys, grads).result(timeout=120)
        first_ack = time.monotonic() - killed
        value = client.pull("f", keys).result(timeout=60)
        return {"bench": "failover", "heartbeat_timeout_s": timeout_s, "heartbeat_interval_s": interval_s,
                "seconds_to_first_ack": first_ack, "beyond_timeout_s": first_ack - timeout_s,
                "values_exact": bool((value == -51).all())}


def migration_dip(n_keys: int, dim: int) -> dict:
    rng = np.random.default_rng(1)
    with LocalCluster(servers=3, log_level="WARNING") as cluster:
        client = cluster.client
        client.create_table("m", dim=dim, optimizer="adagrad", replicas=2)
        keys = rng.integers(0, 2**64 - 1, n_keys, dtype=np.uint64)
        for start in range(0, n_keys, 1_000_000):
            part = keys[start:start + 1_000_000]
            client.push("m", part, np.ones((part.size, dim), np.float32)).result(timeout=300)
        stop = threading.Event()
        samples: list[tuple[float, int]] = []  # (time acked, keys)

        def load() -> None:
            with Client(config=load_config(scheduler=cluster.address)) as c:
                batch_rng = np.random.default_rng(2)
                while not stop.is_set():
                    batch = keys[batch_rng.integers(0, n_keys, 100_000)]
                    c.push("m", batch, np.full((batch.size, dim), 0.01, np.float32)).result(timeout=120)
                    samples.append((time.monotonic(), batch.size))

        loader = threading.Thread(target=load)
        loader.start()
        try:
            while len(samples) < 20:  # steady state first
                time.sleep(0.05)
            t_start = time.monotonic()
            cluster.add_server()
            t_end = time.monotonic()
            while not samples or samples[-1][0] < t_end + 3.0:
                time.sleep(0.05)
        finally:
            stop.set()
            loader.join(120)
        times = np.array([t for t, _ in samples])
        sizes = np.array([n for _, n in samples], float)

        def rate(lo: float, hi: float) -> float:
            sel = (times >= lo) & (times < hi)
            return float(sizes[sel].sum() / (hi - lo))

        windows = [rate(t, t + 0.1) for t in np.arange(t_start, t_end, 0.1)] or [rate(t_start, t_end)]
        during = times[(times >= t_start) & (times <= t_end + 1.0)]
        gaps = np.diff(np.concatenate([[t_start], during]))
        steady = np.diff(times[times < t_start])
        return {"bench": "migration", "keys": n_keys, "dim": dim, "migration_s": t_end - t_start,
                "longest_stall_s": float(gaps.max()) if gaps.size else t_end - t_start,
                "steady_gap_s": float(np.median(steady)) if steady.size else 0.0,
                "before_keys_per_s": rate(times[0], t_start), "during_keys_per_s": rate(t_start, t_end),
                "slowest_100ms_keys_per_s": min(windows), "after_keys_per_s": rate(t_end, times[-1])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--heartbeat-timeout-s", type=float, default=2.0)
    ap.add_argument("--heartbeat-interval-s", type=float, default=0.2)
    ap.add_argument("--keys", type=int, default=4_000_000)
    ap.add_argument("--dim", type=int, default=8)
    args = ap.parse_args()
    tune_allocator()
    rows = [failover_latency(args.heartbeat_timeout_s, args.heartbeat_interval_s),
            migration_dip(args.keys, args.dim)]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    f, m = rows
    print(f"failover: first acknowledged push {f['seconds_to_first_ack']:.2f} s after SIGKILL "
          f"(heartbeat timeout {f['heartbeat_timeout_s']:g} s, counted from the last beat before the kill: "
          f"{f['beyond_timeout_s'] * 1000:+.0f} ms beyond it); values exact: {f['values_exact']}")
    print(f"migration: {m['keys']:,} keys dim {m['dim']} (r=2), 4th server joined in {m['migration_s']:.2f} s; "
          f"push throughput before {m['before_keys_per_s'] / 1e6:.2f}, during {m['during_keys_per_s'] / 1e6:.2f} "
          f"(slowest 100 ms {m['slowest_100ms_keys_per_s'] / 1e6:.2f}), after {m['after_keys_per_s'] / 1e6:.2f} "
          f"M keys/s; longest wait for an ack {m['longest_stall_s'] * 1000:.0f} ms "
          f"(steady {m['steady_gap_s'] * 1000:.0f} ms)")


if __name__ == "__main__":
    main()
