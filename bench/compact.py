"""Compact rows (``TableSpec.storage``): memory a key and model quality, float32 vs fp16 vs bf16.

Run: ``.venv/bin/python bench/compact.py [--keys 2000000] [--criteo DIR] [--synth-rows 300000]``

* bytes a key: a 64-vnode hash table (as one server holds it) filled with ``--keys``
  random keys, dim-1 FTRL and dim-16 ftrl_adagrad: ``nbytes / keys``, and the growth of
  the process's resident set while it was filled (a fresh process each);
* log loss: logistic regression (dim-1 FTRL, rows hashed to 2**24 buckets) trained one
  pass in mini-batches of 1000 on the Criteo sample (``criteo_kaggle_wideresdnn_*``:
  7 200 rows to train, dev + test's 800 to test) and on synthetic Criteo rows, with
  the server's own hash-table kernels (no sockets).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from paramserver.data.reader import DataFormat, Shard, read_batches
from paramserver.store.table import VnodeTable
from paramserver.tables.optim import FTRL, Zeros

STORAGES = ("float32", "fp16", "bf16")
LR = FTRL(alpha=0.115, beta=0.5, l1=0.0, l2=0.0)  # the CTR app's linear model


def memory(storage: str, dim: int, optimizer: str, n: int) -> dict:
    """Fill a 64-vnode table with ``n`` keys; bytes a key by ``nbytes`` and by RSS."""
    from paramserver.routing.partition import route_push
    from paramserver.routing.ring import Ring
    from paramserver.server.storage import rss_bytes
    from paramserver.store.vnodes import VnodeSet
    from paramserver.tables.spec import TableSpec

    ring = Ring.create([1], 64)
    table = VnodeSet(TableSpec("t", dim, optimizer=optimizer, storage=storage), ring.n_vnodes, range(ring.n_vnodes))
    rng = np.random.default_rng(0)
    batch = 100_000
    routed = [route_push(ring, rng.integers(1, 2**63, batch).astype(np.uint64),
                         np.full((batch, dim), 0.1, np.float32)) for _ in range(n // batch)]
    rss0 = rss_bytes()
    for r in routed:
        table.apply(r.parts[0].vnodes, r.parts[0].counts, r.keys, r.grads)
    return {"storage": storage, "dim": dim, "optimizer": optimizer, "keys": len(table),
            "nbytes_per_key": table.nbytes / len(table), "rss_per_key": (rss_bytes() - rss0) / len(table),
            "row_bytes": table.row_bytes}


def log_loss(storage: str, train, test) -> float:
    table = VnodeTable(1, LR, Zeros(), 0, storage=storage)
    for b in train:
        table.apply(*_grads(table, b))
    loss = n = 0.0
    for b in test:
        p = _predict(table, b)[0]
        y = b.labels.astype(np.float64)
        p = np.clip(p, 1e-15, 1 - 1e-15)
        loss -= float(np.sum(y * np.log(p) + (1 - y) * np.log(1 - p)))
        n += len(b)
    return loss / n


def _predict(table: VnodeTable, b):
    uniq, inv = b.unique()
    w = np.empty((uniq.size, 1), np.float32)
    table.lookup(uniq, w)
    rows = np.repeat(np.arange(len(b)), np.diff(b.indptr))
    z = np.bincount(rows, weights=w[inv, 0] * b.vals, minlength=len(b))
    return 1.0 / (1.0 + np.exp(-z)), uniq, inv, rows


def _grads(table: VnodeTable, b):
    p, uniq, inv, rows = _predict(table, b)
    g = np.bincount(inv, weights=(p - b.labels)[rows] * b.vals, minlength=uniq.size)
    return uniq, g.astype(np.float32).reshape(-1, 1)


def _batches(paths: list[str]) -> list:
    fmt = DataFormat("criteo", hash_bits=24)
    return [b for p in paths for b in read_batches(Shard(p, 0, -1), fmt, 1000)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=2_000_000)
    ap.add_argument("--criteo", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "criteo"))
    ap.add_argument("--synth-rows", type=int, default=300_000)
    ap.add_argument("--memory-one", nargs=3, help=argparse.SUPPRESS)  # storage dim optimizer: the child process
    args = ap.parse_args()
    if args.memory_one:
        storage, dim, opt = args.memory_one
        print(json.dumps(memory(storage, int(dim), opt, args.keys)))
        return
    for dim, opt in ((1, "ftrl"), (16, "ftrl_adagrad")):
        for storage in STORAGES:
            out = subprocess.run([sys.executable, __file__, "--keys", str(args.keys), "--memory-one", storage,
                                  str(dim), opt], check=True, capture_output=True, text=True).stdout
            r = json.loads(out)
            print(f"memory  dim {dim:>2} {opt:<12} {storage:<7} keys {r['keys']:>9,}  nbytes/key "
                  f"{r['nbytes_per_key']:6.2f}  rss/key {r['rss_per_key']:6.2f}  row_bytes {r['row_bytes']}")
    from paramserver.apps.ctr.synth import write_synth

    data = []
    crit = os.path.abspath(args.criteo)
    if os.path.isdir(crit):
        name = os.path.join(crit, "criteo_kaggle_wideresdnn_{}.tsv.gz")
        data.append(("criteo sample", _batches([name.format("train")]),
                     _batches([name.format("dev"), name.format("test")])))
    with tempfile.TemporaryDirectory() as tmp:
        write_synth(os.path.join(tmp, "train.tsv"), args.synth_rows, seed=1)
        write_synth(os.path.join(tmp, "test.tsv"), args.synth_rows // 10, seed=2)
        data.append((f"synth {args.synth_rows}", _batches([os.path.join(tmp, "train.tsv")]),
                     _batches([os.path.join(tmp, "test.tsv")])))
    for what, train, test in data:
        base = log_loss("float32", train, test)
        for storage in STORAGES:
            loss = log_loss(storage, train, test)
            print(f"logloss {what:<14} {storage:<7} {loss:.6f}  ({loss - base:+.6f} vs float32)")


if __name__ == "__main__":
    main()
