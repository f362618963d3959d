"""The cold tier's store, chosen by measurement (issue 48): our hash vnode mapped from a file
(``store/disk.py``, probed by the compiled loops) against LMDB (``lmdb``) and RocksDB
(``rocksdict``), each driven from Python as a server would: batches of 10 000 keys.

Run: ``PYTHONPATH=src .venv/bin/python bench/cold_stores.py [--rows 2000000]`` (a minute).
``lmdb`` and ``rocksdict`` come with the bench extra (``pip install -e ".[bench]"``); the
project does not depend on them otherwise, and a store whose package is missing is
skipped (said on stderr).

Rows are dim-1 FTRL's (12 bytes: value, z, n), keys random uint64.  Measured, in keys a
second: ``put`` (every row, in batches), ``get`` (20 batches of random keys, copied out),
``delete`` (20 batches of other random keys), and the bytes the store took on disk.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from bench_harness.markdown import md_table
from bench_harness.procs import log
from paramserver._runtime.intrinsics import frozen
from paramserver.store.directory import Directory
from paramserver.store.disk import DiskArena
from paramserver.store.loops import tiers as tier_loops
from paramserver.store.table import COLD_LOAD, VnodeTable
from paramserver.tables.optim import FTRL, Zeros

BATCH, ROUNDS, WIDTH = 10_000, 20, 3


def timed(keys: np.ndarray, rows: np.ndarray, put: Callable[[np.ndarray, np.ndarray], None],
          get: Callable[[np.ndarray], None], delete: Callable[[np.ndarray], None], seed: int) -> list[float]:
    """Keys a second put, got and deleted (as the module says)."""
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    for i in range(0, keys.size, BATCH):
        put(keys[i:i + BATCH], rows[i:i + BATCH])
    put_s = time.perf_counter() - t0
    picked = rng.choice(keys.size, 2 * BATCH * ROUNDS, replace=False)
    t0 = time.perf_counter()
    for j in range(ROUNDS):
        get(keys[np.sort(picked[j * BATCH:(j + 1) * BATCH])])
    get_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for j in range(ROUNDS, 2 * ROUNDS):
        delete(keys[picked[j * BATCH:(j + 1) * BATCH]])
    del_s = time.perf_counter() - t0
    n = BATCH * ROUNDS
    return [keys.size / put_s, n / get_s, n / del_s]


def own(keys: np.ndarray, rows: np.ndarray, folder: str) -> list[Any]:
    """A cold vnode as the tiers make it: one vnode, sized for the rows at ``COLD_LOAD``."""
    arena = DiskArena(folder, "bench")
    vt = VnodeTable(1, FTRL(), Zeros(), 0, capacity=int(keys.size / COLD_LOAD) + 2, arena=arena)
    d, slot, no_life = Directory([vt]), np.zeros(1, np.int64), np.zeros((BATCH, 0), np.float32)

    def segment(k: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return frozen(np.zeros(1, np.int32)), frozen(np.array([k.size], np.int64)), frozen(k)

    def put(k: np.ndarray, r: np.ndarray) -> None:
        tier_loops.put_many(*d.hash_args, d.life0, slot, *segment(k), r, no_life[:k.size], np.ones(k.size, bool), -1,
                            np.float32(0), 0, 0)

    def take(k: np.ndarray, remove: bool) -> None:
        out, found = np.empty((k.size, WIDTH), np.float32), np.empty(k.size, np.bool_)
        tier_loops.take_many(*d.hash_args, d.life0, slot, *segment(k), np.zeros(k.size, bool), out,
                             no_life[:k.size], found, remove)

    take(keys[:10], False)  # compiled or loaded before the clock starts
    rates = timed(keys, rows, put, lambda k: take(k, False), lambda k: take(k, True), 1)
    return ["mapped hash vnode (ours)", *rates, arena.nbytes]


def lmdb_store(keys: np.ndarray, rows: np.ndarray, folder: str) -> list[Any] | None:
    try:
        import lmdb
    except ImportError:
        log("lmdb is not installed: skipped (pip install -e '.[bench]')")
        return None
    env = lmdb.open(os.path.join(folder, "lmdb"), map_size=1 << 36, sync=False, metasync=False, readahead=False)
    names = [k.tobytes() for k in keys.byteswap()]  # big-endian: sorted keys are sorted bytes
    index = {k: i for i, k in enumerate(keys.tolist())}

    def put(k: np.ndarray, r: np.ndarray) -> None:
        with env.begin(write=True) as tx:
            tx.cursor().putmulti(zip([names[index[x]] for x in k.tolist()], [x.tobytes() for x in r], strict=True))

    def get(k: np.ndarray) -> None:
        with env.begin() as tx:
            tx.cursor().getmulti([names[index[x]] for x in k.tolist()])

    def delete(k: np.ndarray) -> None:
        with env.begin(write=True) as tx:
            for x in k.tolist():
                tx.delete(names[index[x]])

    rates = timed(keys, rows, put, get, delete, 1)
    env.close()
    return ["LMDB (lmdb)", *rates, _du(os.path.join(folder, "lmdb"))]


def rocks_store(keys: np.ndarray, rows: np.ndarray, folder: str) -> list[Any] | None:
    try:
        import rocksdict
    except ImportError:
        log("rocksdict is not installed: skipped (pip install -e '.[bench]')")
        return None
    db = rocksdict.Rdict(os.path.join(folder, "rocks"), rocksdict.Options(raw_mode=True))

    def put(k: np.ndarray, r: np.ndarray) -> None:
        batch = rocksdict.WriteBatch(raw_mode=True)
        for x, row in zip(k.byteswap(), r, strict=True):
            batch.put(x.tobytes(), row.tobytes())
        db.write(batch)

    def get(k: np.ndarray) -> None:
        db[[x.tobytes() for x in k.byteswap()]]

    def delete(k: np.ndarray) -> None:
        batch = rocksdict.WriteBatch(raw_mode=True)
        for x in k.byteswap():
            batch.delete(x.tobytes())
        db.write(batch)

    rates = timed(keys, rows, put, get, delete, 1)
    db.close()
    return ["RocksDB (rocksdict)", *rates, _du(os.path.join(folder, "rocks"))]


def _du(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=2_000_000, help="rows in the store (default 2000000)")
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    keys = np.unique(rng.integers(1, 2**63, args.rows, dtype=np.uint64))
    rows = rng.random((keys.size, WIDTH), dtype=np.float32)
    folder = tempfile.mkdtemp(prefix="paramserver-cold-stores-", dir="/var/tmp")
    try:
        results = [r for f in (own, lmdb_store, rocks_store) if (r := f(keys, rows, folder)) is not None]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(md_table(["store", "put keys/s", "get keys/s", "delete keys/s", "bytes on disk"],
                   [[n, f"{p / 1e6:.2f} M", f"{g / 1e6:.2f} M", f"{d / 1e6:.2f} M", f"{b:,}"]
                    for n, p, g, d, b in results]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
