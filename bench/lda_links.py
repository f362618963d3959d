"""``paramserver lda`` over a link of a given rate and round trip, each ``--filters`` in turn
(issue 49: what LDA's counts cost on a network, not only on loopback).

    .venv/bin/python bench/lda_links.py [--topics 1000] [--iterations 50] [--rate 1000] [--rtt 1]
        [--chains default none] [--corpus PATH]

A scheduler and one server are processes on 127.0.0.1; every connection to them crosses
a relay on 127.0.0.2 (``bench_harness/relays.py``: half the round trip each way, the rate a
direction capped), as ``bench/links.py`` does for ``train``.  The job runs on that cluster
(``--cluster tcp://``, its 2 workers here), so its default filters are those of a cluster
of hosts.  Printed: the whole command's seconds, the bytes its workers sent and received,
and the log-likelihood per token (the same model whatever the chain: ``sparse`` is lossless).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time

from bench_harness.procs import PS, Procs, free_port, listening, wait_for
from bench_harness.relays import relay_command

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "..", "..", "shared", "data", "lda", "20newsgroups_etm", "docword.train.txt.gz")


def one(args: argparse.Namespace, chain: str, logs: str) -> dict[str, float]:
    """The job once through the relay; ``chain`` ``default`` gives no ``--filters``."""
    procs = Procs(logs)
    sched, server = free_port(), free_port()
    env = {**os.environ, "PARAMSERVER_LOG_LEVEL": "WARNING"}
    try:
        pairs = [f"127.0.0.2:{p}=127.0.0.1:{p}" for p in (sched, server)]
        proxy = procs.start(relay_command(args.rtt / 2, float(args.rate), pairs), stdout=subprocess.PIPE)
        assert proxy.stdout is not None and proxy.stdout.readline().strip() == b"ready", "the relay did not start"
        procs.start([*PS, "scheduler", "--host", "127.0.0.1", "--port", str(sched), "--servers", "1"], env=env)
        wait_for(lambda: listening(sched), 60, "the scheduler")
        procs.start([*PS, "server", "--host", "127.0.0.1", "--port", str(server), "--advertise-host", "127.0.0.2",
                     "--scheduler", f"tcp://127.0.0.2:{sched}"], env=env)
        flags = [] if chain == "default" else ["--filters", chain]
        start = time.perf_counter()
        done = subprocess.run([*PS, "lda", "--data", args.corpus, "--topics", str(args.topics), "--iterations",
                               str(args.iterations), "--cluster", f"tcp://127.0.0.2:{sched}", "--json", *flags],
                              env=env, capture_output=True, text=True, timeout=7200)
        seconds = time.perf_counter() - start
        if done.returncode:
            raise SystemExit(f"lda with --filters {chain}: {done.stderr[-3000:]}")
        report = json.loads(done.stdout.strip().splitlines()[-1])
        return {"seconds": seconds, "bytes_sent": report["bytes_sent"], "bytes_received": report["bytes_received"],
                "loglik": report["log_likelihood_per_token"], "filters": report.get("filters", "none")}
    finally:
        procs.stop_all()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default=CORPUS)
    ap.add_argument("--topics", type=int, default=1000)
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--rate", type=float, default=1000, help="Mbit/s a direction")
    ap.add_argument("--rtt", type=float, default=1.0, help="round trip, ms")
    ap.add_argument("--chains", nargs="+", default=["default", "none"])
    args = ap.parse_args()
    if not os.path.exists(args.corpus):
        raise SystemExit(f"no corpus at {os.path.normpath(args.corpus)} (see ../shared/data/SOURCES.md)")
    print("| --filters | rate Mbit/s | RTT ms | K | iterations | command s | sent MB | received MB | log-lik/token |")
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as logs:
        for chain in args.chains:
            r = one(args, chain, logs)
            print(f"| {chain} ({r['filters']}) | {args.rate:g} | {args.rtt:g} | {args.topics} | {args.iterations} | "
                  f"{r['seconds']:.1f} | {r['bytes_sent'] / 1e6:,.0f} | {r['bytes_received'] / 1e6:,.0f} | "
                  f"{r['loglik']:.6f} |", flush=True)


if __name__ == "__main__":
    main()
