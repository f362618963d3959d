"""Pull and push throughput over loopback, and server memory per stored key.

Run: ``.venv/bin/python bench/pushpull.py [--json] [--quick] [--secret] [--pslite | --no-pslite]``

For 1 and 2 servers (``--replicas R``: each vnode on R of them), dim 1 and 16, batches of 1e3, 1e5 and 1e6
random uint64 keys, one
client (in this process) issues pulls, then pushes, against keys that already exist.
``--window W`` keeps W requests in flight (default 1: issue, wait, issue: the same loop
as ps-lite's benchmark, which waits on every request).  Bytes counted are the payload:
8 bytes a key plus 4·dim bytes of values or gradients.

``--secret``: the cluster has a secret, so every link is CurveZMQ (encrypted and
authenticated): what encryption costs.

ps-lite (issue 44.3): where ``make pslite`` has built it (bench/pslite/), ps-lite's stock server
(``KVServer<float>`` with ``KVServerDefaultHandle``) runs in the same run, after ours, with the
same batch sizes, window and time budget, for 1 server and dim 1 (its stock handle stores one
float a key); the ratio ours ÷ ps-lite's is printed for each direction.  Its worker is C++ and
sends sorted keys (ps-lite requires them), by ZPush/ZPull, its zero-copy calls.  ``--pslite``
makes it required (an error where it is not built), ``--no-pslite`` leaves it out.

Memory: one server, a dim-1 FTRL table, 1e7 unique keys pushed in batches of 1e6; the
server's resident set size after minus before, divided by the keys stored.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import deque

import numpy as np

from paramserver import LocalCluster
from paramserver._runtime.malloc import tune_allocator
from pslite.driver import NotBuilt, PsliteError, find_driver, ratios
from pslite.driver import run as run_pslite


def measure(fn, keys_per_op: int, min_keys: float, max_s: float, window: int) -> float:
    """Keys per second of ``fn`` (returns a future), with ``window`` ops in flight."""
    fn().result(timeout=120)  # warm-up (JIT, connections, allocator)
    done_keys, t0 = 0, time.perf_counter()
    inflight: deque = deque()
    while True:
        while len(inflight) < window:
            inflight.append(fn())
        inflight.popleft().result(timeout=120)
        done_keys += keys_per_op
        elapsed = time.perf_counter() - t0
        if done_keys >= min_keys and elapsed >= 0.2 or elapsed >= max_s:
            break
    for f in inflight:
        f.result(timeout=120)
        done_keys += keys_per_op
    return done_keys / (time.perf_counter() - t0)


def budget(quick: bool) -> tuple[float, float]:
    """Keys each measurement sends at least, and the seconds it may take: ours and ps-lite's alike."""
    return (2e6, 3.0) if quick else (2e7, 10.0)


def throughput_rows(servers: int, batches: list[int], dims: list[int], window: int, quick: bool,
                    replicas: int = 1, secret_file: str | None = None) -> list[dict]:
    rows = []
    rng = np.random.default_rng(0)
    with LocalCluster(servers=servers, workers=0, log_level="WARNING", secret_file=secret_file) as cluster:
        client = cluster.client
        for dim in dims:
            table = f"bench-d{dim}"
            client.create_table(table, dim=dim, optimizer="sgd", replicas=min(replicas, servers))
            for n in batches:
                keys = rng.integers(0, 2**64 - 1, n, dtype=np.uint64)
                grads = rng.standard_normal((n, dim)).astype(np.float32) * 1e-3
                client.push(table, keys, grads).result(timeout=120)  # keys exist: steady state
                min_keys, max_s = budget(quick)
                for op, fn in (("pull", lambda t=table, k=keys: client.pull(t, k)),
                               ("push", lambda t=table, k=keys, g=grads: client.push(t, k, g))):
                    kps = measure(fn, n, min_keys, max_s, window)
                    rows.append({"system": "paramserver", "op": op, "keys": n, "dim": dim, "servers": servers,
                                 "replicas": min(replicas, servers), "curve": bool(secret_file),
                                 "keys_per_s": kps, "mb_per_s": kps * (8 + 4 * dim) / 1e6})
                    print(f"  {op} servers={servers} r={min(replicas, servers)} dim={dim:>2} keys={n:>9,}: "
                          f"{kps / 1e6:8.2f} M keys/s {kps * (8 + 4 * dim) / 1e6:9.1f} MB/s",
                          file=sys.stderr)
            client.drop_table(table)
    return rows


def memory_row(n_keys: int) -> dict:
    rng = np.random.default_rng(1)
    with LocalCluster(servers=1, workers=0, log_level="WARNING") as cluster:
        client = cluster.client
        client.create_table("mem", dim=1, optimizer="ftrl")
        before = client.stats.server_stats()[0]["rss_bytes"]
        batch = 1_000_000
        for start in range(0, n_keys, batch):
            keys = rng.integers(0, 2**64 - 1, min(batch, n_keys - start), dtype=np.uint64)
            client.push("mem", keys, np.full((keys.size, 1), 0.5, np.float32)).result(timeout=300)
        stats = client.stats.server_stats()[0]
        stored = stats["tables"]["mem"]["keys"]
        row = {"op": "memory", "keys": stored, "dim": 1, "optimizer": "ftrl",
               "bytes_per_key": (stats["rss_bytes"] - before) / stored,
               "table_bytes_per_key": stats["tables"]["mem"]["bytes"] / stored}
        print(f"  memory: {stored:,} keys, {row['bytes_per_key']:.1f} resident bytes/key "
              f"({row['table_bytes_per_key']:.1f} in the tables)", file=sys.stderr)
        return row


def pslite_unfit(args: argparse.Namespace) -> str | None:
    """Why ps-lite's figures would not compare with this run's, or None where they would."""
    if 1 not in args.servers or 1 not in args.dims:
        return "it is run for 1 server and dim 1 (its stock handle stores one float a key): add 1 to --servers, --dims"
    if args.secret:
        return "ps-lite has no encryption: a ratio against --secret (CurveZMQ) would not compare like with like"
    return None


def pslite_rows(args: argparse.Namespace, ours: list[dict]) -> tuple[list[dict], bool]:
    """ps-lite's rows and the ratios ours ÷ ps-lite's, or none (and why, on stderr) where it is not
    built or not comparable; False where ps-lite was asked for, or built, and failed."""
    if args.pslite is False:
        return [], True
    why = pslite_unfit(args)
    if why is None:
        try:
            peer = run_pslite(args.batches, *budget(args.quick), window=args.window)
        except NotBuilt as exc:
            why = str(exc)
        except PsliteError as exc:
            print(f"pushpull: ps-lite failed: {exc}", file=sys.stderr)
            return [], False
    if why is not None:
        if args.pslite:
            sys.exit(f"pushpull: --pslite: {why}")
        print(f"  ps-lite: not run, so no ratio: {why}", file=sys.stderr)
        return [], True
    for r in peer:
        print(f"  {r['op']} ps-lite {r['pslite_commit']} dim= 1 keys={r['keys']:>9,}: "
              f"{r['keys_per_s'] / 1e6:8.2f} M keys/s {r['mb_per_s']:9.1f} MB/s", file=sys.stderr)
    return peer + [{"op": "ratio", "direction": r.pop("op"), **r} for r in ratios(ours, peer)], True


def print_rows(rows: list[dict]) -> None:
    print(f"{'op':<6} {'servers':>7} {'dim':>4} {'keys':>10} {'M keys/s':>9} {'MB/s':>9}")
    for r in rows:
        if r["op"] == "memory":
            print(f"memory: {r['keys']:,} keys (dim 1, ftrl): {r['bytes_per_key']:.1f} resident "
                  f"bytes/key, {r['table_bytes_per_key']:.1f} in the tables")
        elif r.get("system") == "paramserver":
            print(f"{r['op']:<6} {r['servers']:>7} {r['dim']:>4} {r['keys']:>10,} "
                  f"{r['keys_per_s'] / 1e6:>9.2f} {r['mb_per_s']:>9.1f}")
    peer = [r for r in rows if r.get("system") == "ps-lite"]
    if peer:
        print(f"\nps-lite {peer[0]['pslite_commit']}'s stock server beside ours (1 server, dim 1, "
              f"window {peer[0]['window']}): ours ÷ ps-lite's keys/s")
        print(f"{'op':<6} {'keys':>10} {'ps-lite':>9} {'ours':>9} {'ratio':>7}")
        for r in rows:
            if r["op"] == "ratio":
                print(f"{r['direction']:<6} {r['keys']:>10,} {r['pslite_keys_per_s'] / 1e6:>9.2f} "
                      f"{r['paramserver_keys_per_s'] / 1e6:>9.2f} {r['ratio']:>6.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print the rows as one JSON list")
    ap.add_argument("--quick", action="store_true", help="short runs and 1e6 keys for memory")
    ap.add_argument("--window", type=int, default=1, help="requests in flight (default 1)")
    ap.add_argument("--servers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--dims", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--batches", type=int, nargs="+", default=[1_000, 100_000, 1_000_000])
    ap.add_argument("--memory-keys", type=int, default=10_000_000)
    ap.add_argument("--replicas", type=int, default=1, help="copies of each vnode (capped at servers)")
    ap.add_argument("--secret", action="store_true", help="a cluster with a secret: every link CurveZMQ-encrypted")
    ap.add_argument("--pslite", action=argparse.BooleanOptionalAction, default=None,
                    help="ps-lite's stock server in the same run, 1 server, dim 1, with the ratios: by default "
                         "where it is built (make pslite); --pslite requires it, --no-pslite leaves it out")
    args = ap.parse_args()
    if args.pslite:  # checked before ours runs for minutes
        try:
            find_driver()
        except NotBuilt as exc:
            ap.error(f"--pslite: {exc}")
        if pslite_unfit(args):
            ap.error(f"--pslite: {pslite_unfit(args)}")
    tune_allocator()  # this process plays the worker: tune it as worker processes are
    rows = []
    with tempfile.TemporaryDirectory(prefix="paramserver-bench-keys-") as keys:
        secret_file = None
        if args.secret:
            from paramserver.wire.security import keygen

            secret_file = os.path.join(keys, "cluster.key")
            keygen(secret_file)
        for s in args.servers:
            rows += throughput_rows(s, args.batches, args.dims, args.window, args.quick, args.replicas, secret_file)
    peer, ok = pslite_rows(args, rows)
    rows += peer
    if args.memory_keys:
        rows.append(memory_row(1_000_000 if args.quick else args.memory_keys))
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print_rows(rows)
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
