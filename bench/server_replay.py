"""The server's side of a default ``paramserver train`` job, alone (issue 44): the job's steps,
cut as its worker cuts them, replayed into one ``ServerNode`` in this process.

Run: ``.venv/bin/python bench/server_replay.py [--data TRAIN.tsv] [--rows 1000000] [--repeat 5] [--json F]``
(``--group N``: batches a request at most, 16 by default as the job's worker groups them, 1 a
step a batch; ``--codec``: the requests' decoding and encoding alone, microseconds a request)

The worker's side is done once, before the clock: the training file read in 16 MiB shards as
``train`` reads it, each batch re-cut by the √n ramp (``apps/ctr/ramp.ramped``), deduplicated,
routed and narrowed as ``client/step_calls.py`` does, and encoded.  Then each repeat makes a
fresh server on the simulated network (``testing/sim.py``: no sockets, no scheduler, no
timers), gives it the job's table (``TrainConfig().table_spec()``, the defaults), and hands it
every request as its socket would (``ServerNode._handle_data``), a request a message, timing the
whole and, by wrapping them, the kernels (a step of several batches taken whole: its one call;
batch by batch: the rows' read and the update with the growth it needs; the growth alone).
What is left is the server's Python: decoding, checking, the exactly-once bookkeeping, the reply.

On a busy two-core machine a job's own figures move ±10 % from run to run: this one process,
with nothing beside it, moves less, so a change to the server's per-step path shows here first.
Without ``--data`` it writes 10^6 heavy rows (``paramserver synth --shape heavy``, seed 1, as
``bench/headline.py`` does) into a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from paramserver._runtime.malloc import tune_allocator
from paramserver.apps.ctr.ramp import ramped
from paramserver.apps.ctr.synth import write_synth
from paramserver.apps.ctr.train_config import TrainConfig
from paramserver.config import load_config
from paramserver.data.reader import make_shards, read_batches
from paramserver.routing.ring import Ring
from paramserver.routing.steps import route_steps
from paramserver.server.node import ServerNode
from paramserver.store import table as store_table
from paramserver.store import vnodes as store_vnodes
from paramserver.testing.sim import SimNetwork
from paramserver.wire.message import Message, decode, encode
from paramserver.wire.step_arrays import index_type, key_type, step_arrays
from paramserver.wire.step_groups import group_arrays

SHARD_BYTES = 16 << 20  # train's default --shard-mb
CLIENT = b"client-1"
#: what is timed apart inside a step: (the object, its attribute, the label)
PARTS = ((store_vnodes.VnodeSet, "steps", "whole steps (with growth)"), (store_vnodes.VnodeSet, "lookup", "read rows"),
         (store_vnodes.VnodeSet, "apply", "update (with growth)"),
         (store_table.VnodeTable, "_grow", "growth"))


def requests(path: str, cfg: TrainConfig, ring: Ring, layout: int, group: int = 1) -> list[list[bytes]]:
    """The frames of every step the job's one worker would send, in order: ``group`` batches a
    request at most (a step of several batches, ``wire/step_groups.py``, as the worker groups
    the batches its depth has room for; 1: a step a batch)."""
    frames, seen, seq, held = [], 0, 1, []
    for shard in make_shards([path], SHARD_BYTES):
        for batch in ramped(read_batches(shard, cfg.data, cfg.batch_size), cfg.batch_size, cfg.batch_ramp, seen):
            seen += len(batch)
            held.append((batch, *batch.unique()))
            if len(held) == group:
                frames.append(_request(held, cfg, ring, layout, seq))
                seq, held = seq + len(held), []
    if held:
        frames.append(_request(held, cfg, ring, layout, seq))
    return frames


def _request(batches: list[tuple[Any, np.ndarray, np.ndarray]], cfg: TrainConfig, ring: Ring, layout: int,
             seq: int) -> list[bytes]:
    """One step request of ``batches`` (each ``(batch, distinct keys, inverse)``), numbered ``seq`` on."""
    keys = np.concatenate([u for _, u, _ in batches])
    routed = route_steps(ring, [u for _, u, _ in batches], [inv for _, _, inv in batches], layout, key_type(keys),
                         index_type(max(u.size for _, u, _ in batches)))
    assert not isinstance(routed, int)
    grouped, rank, vnodes, counts, seg_ends = routed
    header = {"op": "step", "table": cfg.model.table, "ring_version": ring.version, "id": seq,
              "model": cfg.model.name, "sender": 3, "seq": seq, "acked": seq - 1}
    indptr, vals, labels = (np.concatenate([getattr(b, name) for b, _, _ in batches])
                            for name in ("indptr", "vals", "labels"))
    if len(batches) == 1:
        arrays = step_arrays(grouped, vnodes, counts, rank, indptr, vals, labels)
    else:
        header["steps"] = len(batches)
        sizes = np.column_stack([[u.size for _, u, _ in batches], np.diff(seg_ends, prepend=0),
                                 [len(b) for b, _, _ in batches]]).astype(np.int64).reshape(-1)
        ones = bool((vals == 1).all())
        arrays = group_arrays(grouped, vnodes, counts, rank, indptr, vals[:0] if ones else vals, labels, sizes)
    return [CLIENT, *(bytes(f) for f in encode(header, arrays))]


def fresh_server(ring: Ring, spec: Any) -> tuple[ServerNode, SimNetwork]:
    """One server holding every vnode of ``ring`` and the job's table."""
    net = SimNetwork(0)
    node = ServerNode(load_config(scheduler="sim://scheduler", server_threads=1), net.host("server-1").transport())
    node.node_id = 1
    node.state.lease.granted(float("inf"))  # no scheduler to renew it
    node.on_ring(Message({"op": "ring", "ring": ring.to_wire(), "servers": {"1": node.address},
                          "tables": {spec.name: spec.to_wire()}}, []))
    return node, net


def timed(spent: dict[str, float]) -> Callable[[], None]:
    """Wrap ``PARTS`` so that their seconds add up in ``spent``; the returned call unwraps them."""
    saved = []
    for owner, name, label in PARTS:
        fn = getattr(owner, name)
        saved.append((owner, name, fn))

        def wrapper(*a: Any, _fn: Any = fn, _label: str = label, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                spent[_label] = spent.get(_label, 0.0) + time.perf_counter() - t

        setattr(owner, name, wrapper)

    def undo() -> None:
        for owner, name, fn in saved:
            setattr(owner, name, fn)

    return undo


def replay(frames: list[list[bytes]], ring: Ring, spec: Any, split: bool) -> dict[str, Any]:
    node, net = fresh_server(ring, spec)
    spent: dict[str, float] = {}
    undo = timed(spent) if split else None
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        for i, f in enumerate(frames):
            node._handle_data(f)
            if i % 64 == 63:
                net.run_until(net.time + 1.0)  # the replies leave: no queue grows with the job
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        if undo is not None:
            undo()
    keys = sum(len(v) for v in node.tables[spec.name].tables.values())
    node.close()
    return {"seconds": wall, "cpu_seconds": cpu, "keys": keys, **spent}


def codec(frames: list[list[bytes]], rounds: int = 5) -> dict[str, float]:
    """The wire's share of a request, both ways: microseconds to decode a request's frames and to
    encode its header and arrays again (the best of ``rounds`` passes over the job's steps)."""
    msgs = [decode(f[1:]) for f in frames]
    best = {"decode_us": float("inf"), "encode_us": float("inf")}
    for _ in range(rounds):
        t = time.perf_counter()
        for f in frames:
            decode(f[1:])
        best["decode_us"] = min(best["decode_us"], (time.perf_counter() - t) / len(frames) * 1e6)
        t = time.perf_counter()
        for m in msgs:
            encode({k: v for k, v in m.header.items() if k != "arrays"}, m.arrays)
        best["encode_us"] = min(best["encode_us"], (time.perf_counter() - t) / len(frames) * 1e6)
    return best


def training_file(args: argparse.Namespace, tmp: str) -> str:
    """``--data``, or ``--rows`` heavy rows written into ``tmp``."""
    if args.data:
        return str(args.data)
    path = os.path.join(tmp, "heavy.train.tsv")
    print(f"writing {args.rows:,} heavy rows to {path}", file=sys.stderr)
    write_synth(path, args.rows, seed=1, shape="heavy")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", help="a Criteo-format training file (default: 10^6 heavy rows written here)")
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows written without --data")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--codec", action="store_true", help="time the requests' decoding and encoding alone, no server")
    ap.add_argument("--group", type=int, default=16,
                    help="batches a request at most, as the default job's worker groups them (1: a step a batch)")
    args = ap.parse_args(argv)
    tune_allocator()  # as servers do
    cfg = TrainConfig()
    ring = Ring.create([1], 64)
    with tempfile.TemporaryDirectory() as tmp:
        path = training_file(args, tmp)
        spec = cfg.table_spec(os.path.getsize(path))
        frames = requests(path, cfg, ring, spec.layout, args.group)
    print(f"{len(frames):,} requests (up to {args.group} batches each), "
          f"{sum(sum(map(len, f)) for f in frames) / 1e6:.1f} MB; "
          f"the table: {spec.name} ({'hash' if not spec.key_bits else f'dense, key_bits {spec.key_bits}'})")
    if args.codec:
        wire = codec(frames)
        print(f"a request: decoded in {wire['decode_us']:.1f} us, encoded in {wire['encode_us']:.1f} us")
        return 0
    replay(frames, ring, spec, split=False)  # compiled, and the allocator's pages touched
    runs = []
    for r in range(args.repeat):
        runs.append(replay(frames, ring, spec, split=r % 2 == 1))  # every other run split: wrappers cost a little
        row = runs[-1]
        parts = "  ".join(f"{label} {row[label]:.3f}" for _, _, label in PARTS if label in row)
        print(f"run {r + 1}: {row['seconds']:.3f} s ({row['cpu_seconds']:.3f} s CPU), {row['keys']:,} keys"
              f"{'  ' + parts if parts else ''}", flush=True)
    whole = [r["seconds"] for r in runs if not any(label in r for _, _, label in PARTS)] or [r["seconds"] for r in runs]
    print(f"median {statistics.median(whole):.3f} s, min {min(whole):.3f} s "
          f"({statistics.median(whole) / len(frames) * 1e6:.0f} us a request)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"steps": len(frames), "runs": runs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
