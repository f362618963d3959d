"""Online learning end to end: Redis Streams in, a model published while it trains, served.

Run: ``PYTHONPATH=src .venv/bin/python bench/online.py [--quick] [--sections stream,fresh,latency,recovery]
[--rows 1000000] [--kills 20] [--json out.json]`` (``--quick``: small sizes, a smoke run of
about 3 minutes; the defaults take about 40 minutes on 2 cores, 30 of them the freshness
runs, whose "hours" arrive in real time).  Needs ``redis-server`` and ``wrk`` on PATH and the
redis extra (``pip install 'paramserver[redis]'``).

It starts its own ``redis-server`` (a free port, ``--save '' --appendonly no``, its data in a
temporary folder) and every ``paramserver`` command it measures as a subprocess with the
default flags (headline rows), all stopped in ``finally`` (SIGTERM to the process group, a
bounded wait, then SIGKILL); the temporary folder is removed (``--keep``: kept, with every
command's stderr in ``logs/``).  The jobs make their own consumer groups.  Sections:

1. ``stream`` -- stream vs file throughput: ``--rows`` rows of drift data (day 0 of
   ``paramserver synth --shape drift``) are XADDed to a stream (pipelined; the feed rate is
   reported), then ``train --stream redis://.../s?group=runI --max-examples N`` and
   ``train --data FILE``, interleaved, ``--repeat`` runs each (each stream run its own consumer
   group, so each reads the stream from its start): the report's ``examples_per_s`` and the
   whole command's wall time (after one untimed warm-up run of each on 20,000 rows: a first run
   after the data is written was 15x slower once).  Goal: stream >= 0.8 x file examples/s
   (medians).
2. ``fresh`` -- freshness: ``--hours`` drift days used as hours of ``--hour-rows`` rows.  An
   hour's rows arrive at a steady pace over ``--hour-seconds`` T seconds (time compressed by
   3600/T), so a sync interval of S s becomes ``--publish-every S*T/3600``.  For S in
   10, 60, 600 s: ``train --stream --publish DIR`` and ``serve --follow DIR --poll T/3600``
   (its default 1 s poll, compressed alike); each arriving chunk of rows is first POSTed to
   ``/predict`` (scored by the model served at that moment, which never saw them), then
   XADDed for training: the served model's AUC per hour (hours 1.., hour 0 warms up) is what a
   deployment syncing every S s would see.  "never" is the model published at the end of
   hour 0 (taken with ``load_model`` from the 10 s run's folder at that moment), scoring hours
   1.. .  The trainer's progressive AUC (the report's ``progressive``, each example scored
   before its update) is shown next to them: over the whole run, and over its last window
   (``window_examples``) next to the served model's AUC on the same last rows.  The training
   loop looks at ``--publish-every`` every 0.5 s, so short intervals are floored there: the interval
   achieved (run seconds / parts published) is reported, in real-time seconds too.  Goals:
   10 s sync within 0.002 AUC of the trainer's progressive AUC (on the last window's rows);
   10 s sync's AUC at least 0.001 above never-synced (mean over hours 1..).
3. ``latency`` -- ``serve --follow DIR`` of a model trained on ``--latency-rows`` rows, and
   ``wrk`` (Lua scripts written to the temporary folder) POSTing (a) one Criteo row paced to
   ~1,000 req/s (``-t1 -c4``, a Lua ``delay()`` of 3 or 4 ms at random, whole milliseconds
   being all wrk takes, 3.5 ms on average, a connection; Debian's wrk has no -R),
   and unpaced (``-t1 -c8``: the maximum), (b) 1,000 rows unpaced (``-t1 -c4``); p50/p99 from
   wrk's ``--latency`` output, p99.9 and max from a Lua ``done()``; req/s and rows/s.  Each
   first with training idle, then with ``train --stream --resume --publish DIR --publish-every 1``
   running on rows XADDed at ``--busy-rate`` rows/s, whose deltas ``serve`` swaps in while
   wrk runs (the swaps counted from ``/metrics``).  Goals: idle single-row p99 <= 5 ms at
   ~1,000 req/s; idle 1,000-row >= 500k rows/s; while deltas are swapped in (busy, paced
   single-row and 1,000-row runs) no request over 50 ms.
4. ``recovery`` -- exactly once over SIGKILLs: rows ``0 i:1`` (libsvm), XADDed at
   ``--recovery-rate`` rows/s while the job runs, dies and resumes (so it cannot finish before
   the kills), counted by an update rule that adds each example's gradient (0.5: the weight
   stays 0) to a counter;
   ``train --stream --checkpoint-dir C --checkpoint-seconds 1 --max-examples N`` started in its
   own session, and ``--kills`` times: once it has made progress, a random 0-2 s more, then
   SIGKILL of its whole process group and ``--resume C``.  Recovery time, from the SIGKILL to
   (a) the resumed job's first read of the stream (Redis ``INFO commandstats``: the XRANGE
   calls, which only the job's workers make, polled every 10 ms), and (b) its first
   checkpoint holding more examples than the one it resumed from (polled every 20 ms: up to
   the 1 s checkpoint period more).  The last run goes to the end; the final checkpoint's
   counters give the examples lost (an id counted 0 times) and doubled (counted more than
   once), and the bias key must count exactly N.  Goals: 0 lost and 0 doubled over all kills.

Printed: a markdown table per section (stdout), the goals as PASS/FAIL lines with their
numbers; progress on stderr; ``--json FILE`` keeps every number.

Section 1 is here; sections 2-4 are ``online_fresh.py``, ``online_latency.py`` and
``online_recovery.py``; the Redis side is ``online_redis.py``, the processes ``bench_harness/procs.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

import numpy as np

from bench_harness.markdown import md_table
from bench_harness.procs import PS, Procs, finish, log
from bench_harness.timing import median
from online_fresh import section_fresh
from online_latency import section_latency
from online_recovery import section_recovery
from online_redis import feed, read_lines, read_report, redis_server
from paramserver.apps.ctr.drift import write_day

SECTIONS = ("stream", "fresh", "latency", "recovery")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke run of a few minutes")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma list of {', '.join(SECTIONS)}")
    p.add_argument("--rows", type=int, default=None, help="section stream: rows (default 10^6, quick 10^5)")
    p.add_argument("--repeat", type=int, default=None, help="section stream: runs of each (default 3, quick 1)")
    p.add_argument("--hours", type=int, default=None, help="section fresh: hours (drift days; default 6, quick 3)")
    p.add_argument("--hour-rows", type=int, default=None,
                   help="section fresh: rows an hour (default 200000, quick 60000)")
    p.add_argument("--hour-seconds", type=float, default=None,
                   help="section fresh: wall seconds an hour's rows take to arrive (default 90, quick 12)")
    p.add_argument("--latency-rows", type=int, default=None,
                   help="section latency: rows the served model is trained on (default 10^6, quick 10^5)")
    p.add_argument("--wrk-seconds", type=float, default=None,
                   help="section latency: each wrk run (default 15, quick 4)")
    p.add_argument("--busy-rate", type=float, default=20000,
                   help="section latency: rows/s XADDed for the training job of the busy runs (default 20000)")
    p.add_argument("--kills", type=int, default=None, help="section recovery: SIGKILLs (default 20, quick 3)")
    p.add_argument("--recovery-rate", type=float, default=10000,
                   help="section recovery: rows/s XADDed while the job runs, is killed and resumes (default 10000)")
    p.add_argument("--recovery-rows", type=int, default=None,
                   help="section recovery: N, the stream's rows (default: the rate x (8 s a kill + 10 s))")
    p.add_argument("--seed", type=int, default=0, help="data and kill-time seed (default 0)")
    p.add_argument("--json", default="", help="write every number to this file")
    p.add_argument("--keep", action="store_true", help="keep the temporary folder (the commands' logs)")
    a = p.parse_args(argv)
    q = a.quick
    a.sections = [s.strip() for s in a.sections.split(",") if s.strip()]
    if bad := [s for s in a.sections if s not in SECTIONS]:
        p.error(f"unknown sections {bad}; known: {', '.join(SECTIONS)}")
    defaults = {"rows": (10**5, 10**6), "repeat": (1, 3), "hours": (3, 6), "hour_rows": (60_000, 200_000),
                "hour_seconds": (12.0, 90.0), "latency_rows": (10**5, 10**6), "wrk_seconds": (4.0, 15.0),
                "kills": (3, 20)}
    for name, (quick, full) in defaults.items():
        if getattr(a, name) is None:
            setattr(a, name, quick if q else full)
    if a.recovery_rows is None:
        a.recovery_rows = int(a.recovery_rate * (8 * a.kills + 10))
    if a.hours < 2:
        p.error("--hours must be >= 2 (hour 0 warms up, hours 1.. are scored)")
    return a


def section_stream(args: argparse.Namespace, tmp: str, url: str, client: Any, procs: Procs) -> dict[str, Any]:
    path = os.path.join(tmp, "stream-rows.tsv")
    t0 = time.time()
    write_day(path, args.rows, 0, args.seed)
    log(f"[stream] wrote {args.rows:,} drift rows in {time.time() - t0:.1f} s")
    lines = read_lines(path)
    fed_s = feed(client, "s", lines)
    del lines
    feed_rate = args.rows / fed_s
    log(f"[stream] XADDed {args.rows:,} rows in {fed_s:.1f} s ({feed_rate:,.0f} rows/s)")
    runs: dict[str, list[dict[str, Any]]] = {"stream": [], "file": []}
    report = os.path.join(tmp, "stream-report.json")
    # untimed warm-up of both (numba's caches, the files in the page cache): a first run after the
    # data is written can be many times slower
    warm = min(args.rows, 20_000)
    for src in (["--stream", f"{url}/s?group=warmup", "--max-examples", str(warm)], ["--data", path]):
        finish(procs.start(PS + ["train", *src, "--quiet"]), 1800, "train (warm-up)")
    log("[stream] warmed up")
    for i in range(args.repeat):
        for kind in ("stream", "file"):
            src = (["--stream", f"{url}/s?group=run{i}", "--max-examples", str(args.rows)] if kind == "stream"
                   else ["--data", path])
            with contextlib.suppress(FileNotFoundError):
                os.remove(report)
            t = time.perf_counter()
            proc = procs.start(PS + ["train", *src, "--quiet", "--metrics-out", report])
            finish(proc, 3600, f"train ({kind})")
            wall = time.perf_counter() - t
            r = read_report(report)
            run = {"examples": r["examples"], "examples_per_s": r["examples_per_s"], "wall_s": wall,
                   "first_example_s": r.get("first_example_s")}
            runs[kind].append(run)
            log(f"[stream] run {i + 1}/{args.repeat} {kind}: {r['examples']:,} examples, "
                f"{r['examples_per_s']:,.0f}/s, command {wall:.1f} s")
    client.delete("s")
    summary = {k: {"examples_per_s": median([r["examples_per_s"] for r in v]),
                   "wall_s": median([r["wall_s"] for r in v]),
                   "examples": v[0]["examples"] if v else 0} for k, v in runs.items()}
    ratio = summary["stream"]["examples_per_s"] / summary["file"]["examples_per_s"]
    ok = ratio >= 0.8 and summary["stream"]["examples"] == args.rows
    rows = [[k, s["examples"], s["examples_per_s"], ", ".join(f"{r['examples_per_s']:,.0f}" for r in runs[k]),
             s["wall_s"], ", ".join(f"{r['wall_s']:.1f}" for r in runs[k])] for k, s in summary.items()]
    text = (f"## 1. Stream vs file throughput ({args.rows:,} drift rows, {args.repeat} run(s) each, interleaved; "
            f"default flags)\n\nfeed: {args.rows:,} rows XADDed (pipelined, 2,000 a round trip) in {fed_s:.2f} s = "
            f"{feed_rate:,.0f} rows/s\n\n"
            + md_table(["source", "examples", "examples/s (median)", "runs", "command s (median)", "runs"], rows,
                       [0, 0, 0, 0, 2, 0]))
    goal = (ok, f"(1) stream/file examples/s (medians) = {summary['stream']['examples_per_s']:,.0f} / "
                f"{summary['file']['examples_per_s']:,.0f} = {ratio:.3f} (goal >= 0.8); stream examples "
                f"{summary['stream']['examples']:,} of {args.rows:,}")
    return {"text": text, "goals": [goal], "feed_s": fed_s, "feed_rows_per_s": feed_rate, "runs": runs,
            "summary": summary, "ratio": ratio}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.time()
    tmp = tempfile.mkdtemp(prefix="onlinebench-")
    procs = Procs(os.path.join(tmp, "logs"))
    done: dict[str, dict[str, Any]] = {}
    failed: dict[str, str] = {}
    funcs = {"stream": section_stream, "fresh": section_fresh, "latency": section_latency,
             "recovery": section_recovery}
    try:
        with redis_server(tmp, procs) as (url, client):
            for name in args.sections:
                log(f"== section {name}")
                t0 = time.time()
                try:
                    done[name] = funcs[name](args, tmp, url, client, procs)
                    done[name]["wall_s"] = time.time() - t0
                except Exception as exc:  # noqa: BLE001 -- the section fails, the others still run
                    failed[name] = f"{type(exc).__name__}: {exc}"
                    log(f"section {name} failed: {failed[name]}")
    finally:
        procs.stop_all()
        if args.keep:
            log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"# Online learning: Redis Streams, publish and serve{' (--quick: small sizes)' if args.quick else ''}\n")
    for res in done.values():
        print(res["text"] + "\n")
    print("## Goals\n")
    for res in done.values():
        for ok, line in res["goals"]:
            print(f"- {'PASS' if ok else 'FAIL'} {line}")
    for name, why in failed.items():
        print(f"- FAIL section {name} did not complete: {why}")
    wall = time.time() - start
    print(f"\nwall time {wall:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "sections": {n: {k: v for k, v in r.items() if k != "text"}
                                                          for n, r in done.items()},
                       "failed": failed, "wall_s": wall}, f, indent=1, default=_jsonable)
    return 1 if failed else 0


def _jsonable(v: Any) -> Any:
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    if isinstance(v, tuple):
        return list(v)
    return str(v)


if __name__ == "__main__":
    sys.exit(main())
