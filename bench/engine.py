"""The storage engine alone (issue 44.3): key updates and reads a second on one core, and
the nanoseconds of a key split into probe, miss and arithmetic.  No sockets, no wire.

Run: ``.venv/bin/python bench/engine.py [--keys 10000000] [--batches 1000,100000] [--repeat 5] [--json F]``

Each case is a table of one server's 64 vnodes (``VnodeSet``) filled with ``--keys`` keys,
then worked by batches of ``--batches`` Zipf(1.1) draws over those keys, deduplicated and
grouped by vnode as a worker sends them (``route_push``; the request's arrays read-only,
as frames arrive).  Cases:

* FTRL on a dim-1 table of ``--keys`` keys (the goal: 50 M key updates/s, batches of 1 000);
* AdaGrad on a dim-16 table of ``--keys16`` keys (a 136-byte slot: 10^6 keys by default,
  1.4 GB at 10^7);
* (``--cases adagrad33``) AdaGrad on a dim-33 table of ``--keys16`` keys: a row wider than
  the request loops take, so both columns are the generic loops;
* (``--cases ftrl-4``) FTRL on a dim-1 table of ``--keys`` keys kept in 4 bytes
  (``TableSpec.key_bytes=4``, the layout of ``paramserver train``'s default model: a 16-byte
  slot, four to a cache line), its keys scattered below 2^32;
* (``--cases ftrl-dense``) FTRL on a dim-1 dense table (``key_bits=24``, the layout of
  ``paramserver train``'s default model) holding ``--keys`` keys: a dense table's pushes
  take a request loop (``slots.dense_apply_request``), its reads the generic dense loop.

Each is run with the request loops compiled for its row (``store/specialize.py``, the
default) and with the generic kernels (``generic``), alternating, so the two see the same
machine.  The split of a key's time, from three runs of the same batches:

* ``probe``: a read (pull) of the batch on a table of 2^14 keys that stays in cache,
  the batch's keys folded into its key space: hashing, probing and copying, no misses;
* ``arithmetic``: an update on that table less its read: the rule;
* ``miss``: an update on the big table less the update on the small one: waiting for memory.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from paramserver._runtime.malloc import tune_allocator
from paramserver.routing.partition import route_push
from paramserver.routing.ring import Ring
from paramserver.store.vnodes import VnodeSet
from paramserver.tables.spec import TableSpec

FTRL = {"name": "ftrl", "alpha": 0.1, "beta": 1.0, "l1": 1.0, "l2": 1.0}
DENSE_BITS = 24
#: a case: its row's width, its rule, its key_bits (0: a hash table) and its key_bytes
CASES = {"ftrl": (1, FTRL, 0, 8),
         "ftrl-4": (1, FTRL, 0, 4),
         "adagrad16": (16, {"name": "adagrad", "lr": 0.05}, 0, 8),
         "adagrad33": (33, {"name": "adagrad", "lr": 0.05}, 0, 8),  # wider than request loops take: generic loops
         "ftrl-dense": (1, FTRL, DENSE_BITS, 8)}
SMALL = 1 << 14
SCRAMBLE = np.uint64(0x9E3779B97F4A7C15)
LOW32 = np.uint64(0xFFFFFFFF)


def key_ids(ids: np.ndarray, bits: int = 0, key_bytes: int = 8) -> np.ndarray:
    """Key ids 1..N as scattered uint64 keys (hot keys are not neighbours), below 2^32 for a
    table of 4-byte keys (an odd multiplier is one-to-one modulo 2^32); for a dense table
    (``bits``) the ids themselves, which its layout scatters over its rows."""
    if bits:
        return ids.astype(np.uint64)
    keys = ids.astype(np.uint64) * SCRAMBLE + np.uint64(1)
    return keys & LOW32 if key_bytes == 4 else keys


def zipf_batches(n_keys: int, batch: int, total: int, seed: int = 0) -> list[np.ndarray]:
    """Batches of ``batch`` Zipf(1.1) draws over ids 1..n_keys, each deduplicated."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(max(4, total // batch)):
        ids = np.zeros(0, np.int64)
        while ids.size < batch:
            draw = rng.zipf(1.1, 2 * batch)
            ids = np.concatenate([ids, draw[draw <= n_keys]])
        out.append(np.unique(ids[:batch]))
    return out


def frozen_request(ring: Ring, keys: np.ndarray, dim: int, layout: int = 0) -> tuple[np.ndarray, ...]:
    grads = np.full((keys.size, dim), 0.01, np.float32)
    r = route_push(ring, keys, grads, layout, distinct=True)
    arrays = (r.keys, r.grads, r.parts[0].vnodes, r.parts[0].counts)
    for a in arrays:
        a.flags.writeable = False
    return arrays


def filled(ring: Ring, name: str, n_keys: int, generic: bool) -> VnodeSet:
    dim, optimizer, bits, key_bytes = CASES[name]
    spec = TableSpec("t", dim, optimizer=optimizer, key_bits=bits, key_bytes=key_bytes)
    table = VnodeSet(spec, ring.n_vnodes, range(ring.n_vnodes))
    if generic:
        table._loops = None
    step = 1 << 20
    for a in range(1, n_keys + 1, step):
        ids = np.arange(a, min(a + step, n_keys + 1))
        k, g, v, c = frozen_request(ring, key_ids(ids, bits, key_bytes), dim, spec.layout)
        table.apply(v, c, k, g)
    return table


def timed(table: VnodeSet, requests: list[tuple[np.ndarray, ...]], dim: int, read: bool) -> float:
    """Seconds for every request: an update, or (``read``) a read of its keys."""
    out = np.empty((max(r[0].size for r in requests), dim), np.float32)
    t0 = time.perf_counter()
    for k, g, v, c in requests:
        if read:
            table.lookup(v, c, k, out[:k.size])
        else:
            table.apply(v, c, k, g)
    return time.perf_counter() - t0


def median_ns(table: VnodeSet, requests: list[tuple[np.ndarray, ...]], dim: int, read: bool, keys: int,
              repeat: int) -> float:
    """ns a key of ``timed``, the median of ``repeat`` passes: on a shared VM one pass can
    land in a slow spell (single passes of one tree swung 17-37 M updates a second in an
    hour; docs/benchmarks.md, "The storage engine alone")."""
    return float(np.median([timed(table, requests, dim, read) for _ in range(repeat)])) / keys * 1e9


def case(name: str, n_keys: int, batch: int, total: int, generic: bool, repeat: int = 5) -> dict:
    dim, _, bits, key_bytes = CASES[name]
    layout = TableSpec("t", dim, key_bits=bits).layout
    ring = Ring.create([1], 64)
    ids = zipf_batches(n_keys, batch, total)
    big = [frozen_request(ring, key_ids(b, bits, key_bytes), dim, layout) for b in ids]
    small = [frozen_request(ring, key_ids(np.unique((b - 1) % SMALL + 1), bits, key_bytes), dim, layout)
             for b in ids]
    table = filled(ring, name, n_keys, generic)
    cache = filled(ring, name, SMALL, generic)
    for read in (False, True):  # compiled, and the first pages touched
        timed(table, big[:2], dim, read)
        timed(cache, small[:2], dim, read)
    keys, small_keys = sum(r[0].size for r in big), sum(r[0].size for r in small)
    update = median_ns(table, big, dim, False, keys, repeat)
    read = median_ns(table, big, dim, True, keys, repeat)
    small_update = median_ns(cache, small, dim, False, small_keys, repeat)
    probe = median_ns(cache, small, dim, True, small_keys, repeat)
    return {"case": name, "kernels": "generic" if generic else "request loops", "keys": n_keys, "batch": batch,
            "distinct_per_batch": keys / len(big), "update_ns": update, "read_ns": read,
            "updates_per_s": 1e9 / update, "reads_per_s": 1e9 / read, "probe_ns": probe,
            "arithmetic_ns": small_update - probe, "miss_ns": update - small_update}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=10_000_000, help="keys of the dim-1 FTRL table")
    ap.add_argument("--keys16", type=int, default=1_000_000, help="keys of the dim-16 AdaGrad table")
    ap.add_argument("--batches", default="1000,100000", help="Zipf draws a batch, comma-separated")
    ap.add_argument("--updates", type=int, default=2_000_000, help="draws a case, over all its batches")
    ap.add_argument("--cases", default="ftrl,ftrl-4,adagrad16")
    ap.add_argument("--repeat", type=int, default=5, help="passes a figure, its median reported")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    tune_allocator()  # as servers do
    rows = []
    for name in args.cases.split(","):
        if name not in CASES:
            raise SystemExit(f"--cases: {name!r} is not one of {sorted(CASES)}")
        n_keys = args.keys if name.startswith("ftrl") else args.keys16
        if CASES[name][2] and n_keys >= 1 << DENSE_BITS:
            raise SystemExit(f"--keys: a dense table of key_bits={DENSE_BITS} holds fewer than "
                             f"{1 << DENSE_BITS:,} keys")
        for batch in (int(b) for b in args.batches.split(",")):
            for generic in (False, True):
                rows.append(case(name, n_keys, batch, args.updates, generic, args.repeat))
                r = rows[-1]
                print(f"{r['case']:<10} {r['kernels']:<14} {n_keys:>11,} keys  batch {batch:>7,} "
                      f"({r['distinct_per_batch']:>8,.0f} distinct)  update {r['updates_per_s'] / 1e6:6.1f} M/s "
                      f"({r['update_ns']:5.1f} ns = probe {r['probe_ns']:4.1f} + arithmetic "
                      f"{r['arithmetic_ns']:4.1f} + miss {r['miss_ns']:5.1f})  read {r['reads_per_s'] / 1e6:6.1f} M/s",
                      flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
