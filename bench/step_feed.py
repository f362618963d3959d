"""The default ``paramserver train`` job's steps with no reader: what the step path alone (the
client's routing and sending, the server's loop) bounds (issue 44).

Run: ``.venv/bin/python bench/step_feed.py [--data TRAIN.tsv] [--rows 1000000] [--repeat 3]
[--depth 16] [--envelope 4] [--json F]``

Before the clock, the training file is read in 16 MiB shards as ``train`` reads it, each batch
re-cut by the √n ramp and deduplicated, as the worker's reader thread does, and kept in memory.
Then each repeat starts a real local cluster of one server (forked, on 127.0.0.1, the job's
table: ``TrainConfig().table_spec()``) and this process sends every batch as a step
(``client.steps.take``), ``--depth`` unanswered at most, up to ``--envelope`` in one message,
as ``apps/ctr/train_loop.py`` does.  Timed: the whole feed, and the CPU the server's process
and this one spent meanwhile (``/proc``), so that a server busy all the time says the server
bounds it.  Compare the job's own examples/s (``bench/train.py``): where they match, parsing
and deduplication (the reader) are not what the job waits on.

Without ``--data`` it writes 10^6 heavy rows (``paramserver synth --shape heavy``, seed 1, as
``bench/headline.py`` does) into a temporary folder.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

from paramserver._runtime.malloc import tune_allocator
from paramserver.apps.ctr.ramp import ramped
from paramserver.apps.ctr.synth import write_synth
from paramserver.apps.ctr.train_config import TrainConfig
from paramserver.apps.ctr.warmup import warm_job
from paramserver.cluster.local import LocalCluster
from paramserver.data.reader import make_shards, read_batches

SHARD_BYTES = 16 << 20  # train's default --shard-mb


def batches(path: str, cfg: TrainConfig) -> list[tuple[Any, Any, Any]]:
    """Every mini-batch of the job's one worker, in order: (batch, its distinct keys, each
    occurrence's index among them), as its reader thread hands them over."""
    out: list[tuple[Any, Any, Any]] = []
    seen, distinct, last = 0, 0, 1
    for shard in make_shards([path], SHARD_BYTES):
        for batch in ramped(read_batches(shard, cfg.data, cfg.batch_size), cfg.batch_size, cfg.batch_ramp, seen):
            seen += len(batch)
            uniq, inverse = batch.unique(distinct * len(batch) // max(1, last))
            distinct, last = uniq.size, len(batch)
            out.append((batch, uniq, inverse))
    return out


def cpu_seconds(pid: int) -> float:
    """User and system CPU of process ``pid`` so far (Linux ``/proc``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def feed(items: list[tuple[Any, Any, Any]], cfg: TrainConfig, spec: Any, depth: int, envelope: int) -> dict[str, Any]:
    """One fresh cluster, every batch stepped through it: seconds, examples/s, CPU of each side."""
    examples = sum(len(b) for b, _, _ in items)
    with LocalCluster(servers=1, workers=0, warm=warm_job(cfg.data.name, cfg.model, spec),
                      log_level="WARNING") as cluster:
        client = cluster.client
        client.admin.create_table_spec(spec)
        server = next(p.popen.pid for name, p in cluster.procs.items() if name.startswith("server"))
        server_cpu, own_cpu = cpu_seconds(server), time.process_time()
        t0 = time.perf_counter()
        inflight: collections.deque[Any] = collections.deque()
        loss, i = 0.0, 0
        while i < len(items) or inflight:
            while inflight and (len(inflight) >= depth or i == len(items)):
                loss += inflight.popleft().result(timeout=120)[1]
            with client.together():
                for _ in range(min(envelope, depth - len(inflight), len(items) - i)):
                    batch, uniq, inverse = items[i]
                    i += 1
                    inflight.append(client.steps.take(spec.name, uniq, inverse, batch.indptr, batch.vals,
                                                      batch.labels, model=cfg.model.name, l2=cfg.model.l2))
        seconds = time.perf_counter() - t0
        return {"seconds": seconds, "examples_per_s": examples / seconds, "train_logloss": loss / examples,
                "server_cpu_s": cpu_seconds(server) - server_cpu, "feeder_cpu_s": time.process_time() - own_cpu}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", help="a Criteo-format training file (default: 10^6 heavy rows written here)")
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows written without --data")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--depth", type=int, default=16, help="steps unanswered at most (the job's on one machine: 16)")
    ap.add_argument("--envelope", type=int, default=4, help="steps a message at most (the job's: a quarter of 16)")
    ap.add_argument("--json", help="write every run's figures here")
    args = ap.parse_args(argv)
    tune_allocator()
    cfg = TrainConfig()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.data
        if path is None:
            path = os.path.join(tmp, "heavy.tsv")
            write_synth(path, args.rows, seed=1, shape="heavy")
        spec = cfg.table_spec(os.path.getsize(path))
        items = batches(path, cfg)
        print(f"{len(items):,} steps, {sum(len(b) for b, _, _ in items):,} examples, read before the clock",
              file=sys.stderr)
        runs = [feed(items, cfg, spec, args.depth, args.envelope) for _ in range(args.repeat)]
    for r in runs:
        print(f"{r['seconds']:.3f} s  {r['examples_per_s']:,.0f} examples/s  server CPU {r['server_cpu_s']:.2f} s "
              f"({r['server_cpu_s'] / r['seconds']:.0%} of the feed)  feeder CPU {r['feeder_cpu_s']:.2f} s  "
              f"train log loss {r['train_logloss']:.5f}")
    print(f"median {statistics.median(r['examples_per_s'] for r in runs):,.0f} examples/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"depth": args.depth, "envelope": args.envelope, "runs": runs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
