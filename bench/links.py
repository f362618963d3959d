"""``paramserver train`` over links of a given rate and round trip (issue 47.5), against the
same job on loopback, in one run.

    .venv/bin/python bench/links.py [--rows 1000000] [--rates none 1000 100] [--rtts 0.05 1 10]
        [--chains none compact] [--pipelines link 2 auto] [--json FILE]

The scheduler and one server are processes on 127.0.0.1; every connection to them goes
through a relay on 127.0.0.2 (the server advertises 127.0.0.2), which holds each
direction's bytes half the round trip and caps its rate (``--rates`` in Mbit/s, ``none``: no
cap): ``bench_harness/delayrelay.c`` where a C compiler is, else ``delayproxy.py``
(``bench_harness/relays.py``; ``PARAMSERVER_RELAY=python`` asks for the Python one).
Userspace, so it needs no root and no ``netem`` (this kernel has none); its own cost shows
in the row ``relay alone`` (no hold, no cap: the job through the relay, which takes its share
of the two cores a real link would not), which each row is also divided by, and in each row's
relay CPU seconds.  The job's driver and worker are
one process (``bench/filters.py``'s), at default flags but ``--filters`` (``--pipelines``:
default ``link``, the default's; the loopback run each row is against is at the default too).  Each row: its
examples/s and the ratio to loopback's (the same chain, no relay) and to the relay alone's,
job seconds, bytes sent per example, the relay's CPU seconds, the test log loss, and whether
it reached loopback's loss (within 0.0005).
Data: ``paramserver synth --shape heavy`` (``--rows``, a tenth to test).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

from bench_harness.procs import PS, Procs, free_port, listening, wait_for
from bench_harness.relays import relay_command
from filters import WORKER

TARGET = 0.0005  # a row reaches loopback's log loss within this
CHAINS = {"none": "none", "compact": "compact"}


def one(data: str, test: str, chain: str, rate: str | None, rtt_ms: float | None, logs: str,
        pipeline: str = "link") -> dict[str, Any]:
    """The job once: on loopback (``rtt_ms`` None), or through the relay."""
    procs = Procs(logs)
    sched_port, server_port = free_port(), free_port()
    relayed = rtt_ms is not None
    front = "127.0.0.2" if relayed else "127.0.0.1"
    env = {**os.environ, "PARAMSERVER_LOG_LEVEL": "WARNING"}
    try:
        if relayed:
            pairs = [f"{front}:{p}=127.0.0.1:{p}" for p in (sched_port, server_port)]
            proxy = procs.start(relay_command(rtt_ms / 2, 0.0 if rate is None else float(rate), pairs),
                                stdout=subprocess.PIPE)
            assert proxy.stdout is not None and proxy.stdout.readline().strip() == b"ready", "the relay did not start"
        procs.start([*PS, "scheduler", "--host", "127.0.0.1", "--port", str(sched_port), "--servers", "1"], env=env)
        wait_for(lambda: listening(sched_port), 60, "the scheduler")
        procs.start([*PS, "server", "--host", "127.0.0.1", "--port", str(server_port), "--advertise-host", front,
                     "--scheduler", f"tcp://{front}:{sched_port}"], env=env)
        done = subprocess.run([sys.executable, "-c", WORKER, f"tcp://{front}:{sched_port}", data, test, "lr", "8",
                               CHAINS[chain], "1", "off", pipeline], env=env, capture_output=True, text=True,
                              timeout=3600)
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("REPORT ")]
        if done.returncode or not lines:
            raise SystemExit(f"{chain} at {rate} Mbit/s, {rtt_ms} ms: {done.stderr[-3000:]}")
        report: dict[str, Any] = json.loads(lines[-1][7:])
        report["relay_cpu_s"] = _cpu_s(proxy.pid) if relayed else 0.0
        return report
    finally:
        procs.stop_all()


def _cpu_s(pid: int) -> float:
    """The CPU seconds (user and system) process ``pid`` took so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rates", nargs="+", default=["none", "1000", "100"], help="Mbit/s a direction, or none")
    ap.add_argument("--rtts", nargs="+", type=float, default=[0.05, 1.0, 10.0], help="round trips, ms")
    ap.add_argument("--chains", nargs="+", default=["none", "compact"], choices=sorted(CHAINS))
    ap.add_argument("--pipelines", nargs="+", default=["link"],
                    help="--pipeline of each run: link (the default's), N, auto or auto:N")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    folder = tempfile.mkdtemp(prefix="pslinks-")
    data, test = os.path.join(folder, "heavy.tsv"), os.path.join(folder, "heavy_test.tsv")
    from paramserver.apps.ctr.synth import write_synth

    write_synth(data, args.rows, seed=1, shape="heavy")
    write_synth(test, max(1, args.rows // 10), seed=2, shape="heavy")
    runs: list[dict[str, Any]] = []
    print("| chain | pipeline | rate Mbit/s | RTT ms | examples/s | ÷ loopback | ÷ relay alone | job s | sent B/ex "
          "| relay CPU s | test logloss | reached |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    logs = os.path.join(folder, "logs")
    for chain in args.chains:
        base = one(data, test, chain, None, None, logs)  # loopback at the default depth: what each row is against
        runs.append(_row(chain, "link", "loopback", "—", base, base, base))
        alone = one(data, test, chain, None, 0.0, logs)  # and the relay's own cost: no hold, no cap
        runs.append(_row(chain, "link", "relay alone", 0, alone, base, alone))
        for pipeline in args.pipelines:
            for rate in args.rates:
                for rtt in args.rtts:
                    r = one(data, test, chain, None if rate == "none" else rate, rtt, logs, pipeline)
                    runs.append(_row(chain, pipeline, rate, rtt, r, base, alone))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=1)


def _row(chain: str, pipeline: str, rate: str, rtt: Any, r: dict[str, Any], base: dict[str, Any],
         alone: dict[str, Any]) -> dict[str, Any]:
    ratio = r["examples_per_s"] / base["examples_per_s"]
    to_alone = r["examples_per_s"] / alone["examples_per_s"]
    reached = r["logloss"] <= base["logloss"] + TARGET
    sent = r["bytes_sent"] / max(r["examples"], 1)
    depth = f"{pipeline} (reached {r.get('pipeline_depth')})" if pipeline.startswith(("auto", "link")) else pipeline
    print(f"| {chain} | {depth} | {rate} | {rtt} | {r['examples_per_s']:,.0f} | {ratio:.2f} | {to_alone:.2f} | "
          f"{r['seconds']:.1f} | {sent:.1f} | {r['relay_cpu_s']:.2f} | {r['logloss']:.5f} | "
          f"{'yes' if reached else 'no'} |", flush=True)
    return {"chain": chain, "pipeline": pipeline, "depth": r.get("pipeline_depth"), "rate": rate, "rtt_ms": rtt,
            "examples_per_s": r["examples_per_s"], "ratio": ratio, "ratio_to_relay_alone": to_alone,
            "seconds": r["seconds"], "sent_per_example": sent, "relay_cpu_s": r["relay_cpu_s"],
            "logloss": r["logloss"], "reached": reached, "floor_ms": r.get("round_trip_floor_ms")}


if __name__ == "__main__":
    main()
