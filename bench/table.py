"""Server table kernels alone: lookup and optimiser update, ns a key, hash vs dense layout.

Run: ``.venv/bin/python bench/table.py [--rows 1000000] [--hash-bits 24] [--json]``

The key stream is real: a synthetic Criteo file (``paramserver synth``) parsed in
mini-batches of ``--batch-size``, each batch's distinct keys routed to one server's 64
vnodes as a worker routes them, and passed through the wire codec (requests arrive as
read-only frames).  Calls come in a worker's pipelined order: the pull of batch t+1 is
served between the pull and the push of batch t.  Dim-1 FTRL by default
(``--optimizers ftrl,sgd,adagrad,adam,rmsprop`` for more built-in update rules, or a
user's rule by its ``module:function`` name; ``--storages float32,fp16,bf16`` for compact
rows, ``TableSpec.storage``),
in this process, no sockets: this is the part of a server's time that the table layout
and the update rule decide.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np

from paramserver._runtime.malloc import tune_allocator
from paramserver.apps.ctr.synth import write_synth
from paramserver.data.reader import DataFormat, Shard, read_batches
from paramserver.routing.partition import route_pull, route_push
from paramserver.routing.ring import Ring
from paramserver.store.vnodes import VnodeSet
from paramserver.tables.spec import TableSpec
from paramserver.wire.message import Op, decode, encode

OPTIMIZERS = {"ftrl": {"name": "ftrl", "alpha": 0.15, "beta": 1.0, "l1": 1.0, "l2": 1.0},
              "sgd": {"name": "sgd", "lr": 0.05}, "adagrad": {"name": "adagrad", "lr": 0.05},
              "adam": {"name": "adam", "lr": 0.001}, "rmsprop": {"name": "rmsprop", "lr": 0.001}}


def frames(arrays: list[np.ndarray]) -> list[np.ndarray]:
    return decode([bytes(f) for f in encode({"op": Op.PUSH.value}, arrays)]).arrays


def run(batches, bits: int, seed: int = 0, optimizer: str = "ftrl", storage: str = "float32") -> dict:
    ring = Ring.create([1], 64)
    rng = np.random.default_rng(seed)
    requests = []
    for b in batches:
        uniq, _ = b.unique()
        pull = route_pull(ring, uniq, bits)
        push = route_push(ring, uniq, (rng.standard_normal((uniq.size, 1)) * 0.1).astype(np.float32), bits)
        requests.append((frames([pull.keys, pull.parts[0].vnodes, pull.parts[0].counts]),
                         frames([push.keys, push.grads, push.parts[0].vnodes, push.parts[0].counts])))
    t0 = time.perf_counter()
    compact = {"storage": storage} if storage != "float32" else {}  # (runs on a tree without storage too)
    table = VnodeSet(TableSpec("t", 1, optimizer=OPTIMIZERS.get(optimizer, optimizer), key_bits=bits, **compact),
                     ring.n_vnodes, range(ring.n_vnodes))
    create = time.perf_counter() - t0
    lookup = update = 0.0
    keys = 0

    def serve_pull(i: int) -> int:
        k, v, c = requests[i][0]
        table.lookup(v, c, k, np.empty((k.size, 1), np.float32))
        return int(k.size)

    for i in range(len(requests)):
        t0 = time.perf_counter()
        if i == 0:
            keys += serve_pull(0)
        if i + 1 < len(requests):
            keys += serve_pull(i + 1)
        t1 = time.perf_counter()
        k, g, v, c = requests[i][1]
        table.apply(v, c, k, g)
        update += time.perf_counter() - t1
        lookup += t1 - t0
    return {"layout": "dense" if bits else "hash", "optimizer": optimizer, "storage": storage, "keys": keys,
            "create_s": create,
            "lookup_ns": lookup / keys * 1e9, "update_ns": update / keys * 1e9, "stored": len(table)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--hash-bits", type=int, default=24)
    ap.add_argument("--batch-size", type=int, default=4000)
    ap.add_argument("--repeat", type=int, default=2, help="runs of each layout (alternating)")
    ap.add_argument("--optimizers", default="ftrl",
                    help="comma-separated rules to time: built-in names, or a user's rule as module:function "
                         "(default: ftrl)")
    ap.add_argument("--storages", default="float32", help="comma-separated TableSpec.storage values to time")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    tune_allocator()  # as servers do
    with tempfile.TemporaryDirectory(prefix="paramserver-bench-") as tmp:
        path = os.path.join(tmp, "train.tsv")
        write_synth(path, args.rows, seed=1)
        batches = list(read_batches(Shard(path, 0, -1), DataFormat("criteo", hash_bits=args.hash_bits),
                                    args.batch_size))
    optimizers = [o.strip() for o in args.optimizers.split(",") if o.strip()]
    storages = [s.strip() for s in args.storages.split(",") if s.strip()]
    for opt in optimizers:  # compile
        for st in storages:
            run(batches[:4], 0, optimizer=opt, storage=st)
            run(batches[:4], args.hash_bits, optimizer=opt, storage=st)
    rows = [run(batches, bits, optimizer=opt, storage=st) for _ in range(args.repeat) for opt in optimizers
            for st in storages for bits in (0, args.hash_bits)]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'layout':<7} {'optimizer':<9} {'storage':<8} {'keys':>10} {'create s':>9} {'lookup ns/key':>14} "
          f"{'update ns/key':>14}")
    for r in rows:
        print(f"{r['layout']:<7} {r['optimizer']:<9} {r['storage']:<8} {r['keys']:>10,} {r['create_s']:>9.3f} "
              f"{r['lookup_ns']:>14.1f} {r['update_ns']:>14.1f}")


if __name__ == "__main__":
    main()
