"""What each filter buys on a throttled link (issue 30): `paramserver train` with its
servers in one network namespace and its worker in another, joined by a veth pair shaped
with `tc` (tbf), against the same job unfiltered, in one run.

Run (as root): ``.venv/bin/python bench/filters.py [--rows 1000000] [--links none 1gbit 100mbit]
[--chains none lossless compact ...] [--row-caches off s=8,rows=32768 ...] [--model lr|fm] [--k 16]``

Each chain runs with each ``--row-caches`` spec (issue 46: the worker's row cache,
``train --row-cache``); the baseline of a link is its unfiltered run without a cache.

Namespace A runs the scheduler and ``--servers`` servers (``paramserver scheduler``,
``paramserver server``); namespace B runs the job's driver and one worker in one process:
``run_training`` as ``paramserver train`` runs it, with its cluster replaced by the
remote one (``RemoteCluster`` below), so every pull and push crosses the veth pair.
Both ends of the pair are shaped to the link's rate (``tc qdisc ... tbf``).  Printed per
link and chain: bytes per example each way as the kernel counted them on the worker's
veth interface (and as the report says), examples/s, job seconds, test log loss and AUC,
and the ratios against the unfiltered run on the same link.  Data: the heavy-tailed
Criteo shape (``paramserver synth --shape heavy``) written once to a temporary folder.
The namespaces are removed at the end, whatever happens.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench_harness.namespaces import VethPair
from bench_harness.procs import stop

WORKER = r"""
import json, sys, time
from paramserver.apps.ctr import train as train_mod
from paramserver.apps.ctr.models import Model
from paramserver.apps.ctr.train_config import TrainConfig
from paramserver.client.client import Client
from paramserver.cluster import launch

address, data, test, model, k, chain, servers, row_cache = sys.argv[1:9]
pipeline = sys.argv[9] if len(sys.argv) > 9 else "link"

class RemoteCluster:
    # the servers are in the other namespace: the driver and one worker run here
    def __init__(self, **_):
        self.client = Client(address, connect_timeout_s=60)
        self.n_servers, self.n_workers = int(servers), 1  # the report's (cluster/protocol.py)
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        self.client.admin.shutdown_cluster()
        self.client.close()
    def run_elastic(self, fn, *args):
        with Client(address, role="worker", connect_timeout_s=60) as w:
            return [fn(w, *args)], []
    def release_workers(self):  # the one worker ran in this process and has left
        pass

launch.open_cluster = lambda **kw: RemoteCluster(**kw)
cfg = TrainConfig(Model(model, int(k)), filters=None if chain == "none" else chain, row_cache=row_cache,
                  pipeline=pipeline)
t = time.perf_counter()
report = train_mod.run_training(cfg, [data], [test], servers=int(servers), workers=1)
report["wall_s"] = time.perf_counter() - t
report.pop("traces", None)
print("REPORT " + json.dumps(report, default=str))
"""

RATES = {"none": None, "1gbit": "1gbit", "100mbit": "100mbit"}
TARGET = 0.0005  # a filtered run reaches the unfiltered one's final test log loss within this
BEST = "push=int8,keycache,delta,zstd;pull=keycache,delta,zstd;reply=int8,zstd"  # compact, with int8 replies


def one(link: VethPair, data: str, test: str, model: str, k: int, chain: str, servers: int,
        row_cache: str) -> dict[str, Any]:
    port = str(7700 + os.getpid() % 200)
    host = f"{link.net}.1"
    env = {**os.environ, "PARAMSERVER_LOG_LEVEL": "WARNING"}
    in_a = ["ip", "netns", "exec", link.a, sys.executable, "-m", "paramserver"]
    nodes = [subprocess.Popen([*in_a, "scheduler", "--host", "0.0.0.0", "--port", port, "--servers", str(servers)],
                              env=env)]
    nodes += [subprocess.Popen([*in_a, "server", "--host", "0.0.0.0", "--scheduler", f"tcp://{host}:{port}"], env=env)
              for _ in range(servers)]
    try:
        tx0, rx0 = link.counters()
        done = subprocess.run(["ip", "netns", "exec", link.b, sys.executable, "-c", WORKER, f"tcp://{host}:{port}",
                               data, test, model, str(k), chain, str(servers), row_cache],
                              env=env, capture_output=True, text=True, timeout=3600)
        tx1, rx1 = link.counters()
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("REPORT ")]
        if done.returncode or not lines:
            raise SystemExit(f"{chain} on {link.rate}: {done.stderr[-3000:]}")
        report: dict[str, Any] = json.loads(lines[-1][7:])
        report["kernel_tx"], report["kernel_rx"] = tx1 - tx0, rx1 - rx0
        return report
    finally:
        stop(nodes, 30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--links", nargs="+", default=["none", "1gbit", "100mbit"], choices=sorted(RATES))
    ap.add_argument("--chains", nargs="+", default=["none", "keycache", "delta", "zstd", "fp16", "int8", "keys",
                                                    "lossless", "compact", "best"],
                    help="presets, single filters (each alone), best, or chain specs")
    ap.add_argument("--row-caches", nargs="+", default=["off"],
                    help="the worker's row cache for each chain (train --row-cache): off, hot, s=N,rows=N")
    ap.add_argument("--model", default="lr", choices=("lr", "fm"))
    ap.add_argument("--k", type=int, default=16, help="FM factor width")
    ap.add_argument("--servers", type=int, default=1)
    ap.add_argument("--data-dir", default="", help="reuse (or write) heavy.tsv and heavy_test.tsv here")
    ap.add_argument("--json", default="", help="write every run's figures here")
    ap.add_argument("--markdown", default="", metavar="JSON", help="print the table of a --json file, and stop")
    args = ap.parse_args()
    if args.markdown:
        with open(args.markdown) as f:
            markdown(json.load(f))
        return
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a kill still removes the namespaces
    from paramserver.apps.ctr.synth import write_synth

    folder = args.data_dir or tempfile.mkdtemp(prefix="psfilters-")
    data, test = os.path.join(folder, "heavy.tsv"), os.path.join(folder, "heavy_test.tsv")
    if not os.path.exists(data):
        write_synth(data, args.rows, seed=1, shape="heavy")
        write_synth(test, max(1, args.rows // 10), seed=2, shape="heavy")
    alone = {"keycache": "push=keycache;pull=keycache", "delta": "push=delta;pull=delta",
             "zstd": "push=zstd;pull=zstd;reply=zstd", "int8": "push=int8", "fp16": "push=fp16",
             "bf16": "push=bf16", "best": BEST}
    runs: list[dict[str, Any]] = []
    for rate in args.links:
        for chain in args.chains:
            for row_cache in args.row_caches:
                with VethPair("psf", 30, RATES[rate]) as link:
                    t = time.perf_counter()
                    r = one(link, data, test, args.model, args.k, alone.get(chain, chain), args.servers, row_cache)
                    r.update(link=rate, chain=chain, spec=alone.get(chain, chain), cache=row_cache,
                             bench_s=time.perf_counter() - t)
                    runs.append(r)
                    _line(r, runs)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=1, default=str)


def markdown(runs: list[dict[str, Any]]) -> None:
    """The runs of one --json file as docs/benchmarks.md's table."""
    print("| link | chain | row cache | sent B/ex | received B/ex | fewer bytes | examples/s | job s | to target "
          "| test logloss | AUC |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        base = _base(r, runs)
        n = float(r["examples"])
        fewer = (base["kernel_tx"] + base["kernel_rx"]) / max(r["kernel_tx"] + r["kernel_rx"], 1)
        reached = r["logloss"] <= base["logloss"] + TARGET
        target = f"{base['seconds'] / r['seconds']:.2f}x" if reached else "not reached"
        chain = "best" if r.get("spec") == BEST else r["chain"]
        print(f"| {r['link']} | {chain} | {r.get('cache', 'off')} |"
              f" {r['kernel_tx'] / n:.1f} | {r['kernel_rx'] / n:.1f} | {fewer:.2f}x | "
              f"{r['examples_per_s']:,.0f} | {r['seconds']:.1f} | {target} | {r['logloss']:.5f} | {r['auc']:.4f} |")


def _base(r: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run ``r`` is measured against: its link's, unfiltered and without a row cache."""
    return next((b for b in runs if b["link"] == r["link"] and b["chain"] == "none"
                 and b.get("cache", "off") == "off"), r)


def _line(r: dict[str, Any], runs: list[dict[str, Any]]) -> None:
    """One run's figures, and its ratios against the unfiltered run on the same link.  The
    time to the unfiltered run's final test loss is the job's time when its own final
    loss is within ``TARGET`` of it (the test set is scored once, at the end), else '-'."""
    base = _base(r, runs)
    n = float(r["examples"])
    sent, recv = r["kernel_tx"] / n, r["kernel_rx"] / n
    fewer = (base["kernel_tx"] + base["kernel_rx"]) / max(r["kernel_tx"] + r["kernel_rx"], 1)
    reached = r["logloss"] <= base["logloss"] + TARGET
    r.update(bytes_per_example_sent=sent, bytes_per_example_received=recv, fewer_bytes=fewer,
             time_to_target_s=r["seconds"] if reached else None, speedup=base["seconds"] / r["seconds"])
    target = f"{r['speedup']:.2f}x" if reached else "-"
    print(f"{r['link']:>8} {r['chain']:<12} {r.get('cache', 'off'):<16}"
          f" sent {sent:7.1f} B/ex  recv {recv:6.1f} B/ex  ({fewer:5.2f}x fewer)  "
          f"{r['examples_per_s']:>9,.0f} ex/s  job {r['seconds']:6.1f} s  "
          f"to target {target:>6}  "
          f"logloss {r['logloss']:.5f} ({r['logloss'] - base['logloss']:+.5f})  auc {r['auc']:.4f}", flush=True)


if __name__ == "__main__":
    main()
