"""``paramserver nemesis``: seeded runs of real nodes on emulated hosts under network faults.

    paramserver nemesis --seeds 100                 # the long campaign (about 45 s a run)
    paramserver nemesis --seeds 3 --window 12       # a short one
    paramserver nemesis --replay plan.json          # a failing run's schedule, again
    paramserver nemesis --seed 17 --print-plan      # what seed 17 would do
    paramserver nemesis --workload train --seeds 10 # a real `paramserver train` job under the faults

The hosts are network namespaces on a bridge where the machine can make them (root, ``ip``/``tc``
from iproute2, ``nft`` from nftables); elsewhere, or with ``--network proxy``, loopback addresses
with a userspace proxy between them that puts the same faults on every connection
(``proxied.py``).  Runs go one at a time: each has
its scheduler, three servers and a client on hosts of its own.  The client host runs the counters
(every acknowledged add checked), or with ``--workload train`` a ``paramserver train`` job joined
to the cluster, whose model must be the fault-free run's (``jobs.py``).  A run that fails keeps its logs and
its schedule (``plan.json``) in a folder it names; one that passes removes them unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from typing import Any

from paramserver.testing.nemesis.jobs import TrainingData
from paramserver.testing.nemesis.plan import KINDS, TRAINING_KINDS, WORKLOADS, Plan, draw


def add_parser(sub: Any) -> None:
    p = sub.add_parser("nemesis", help="real nodes on emulated hosts (network namespaces) under partitions, loss, "
                                       "bandwidth collapse, delay, pauses and kills; every acknowledged add (or a "
                                       "training job's rows and model) checked")
    p.add_argument("--seeds", type=int, default=10, help="runs, seeds FIRST.. FIRST+SEEDS-1")
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--seed", type=int, help="run this seed alone")
    p.add_argument("--replay", metavar="FILE", help="run the schedule a failed run wrote (its plan.json)")
    p.add_argument("--window", type=float, default=30.0, help="seconds of faults a run (default 30)")
    p.add_argument("--longest", type=float, default=6.0,
                   help="longest fault in seconds (a pause: up to 2.5x this, at most 15; default 6)")
    p.add_argument("--kinds", help=f"faults to draw from (default: all of {','.join(KINDS)}; with --workload train "
                                   f"{','.join(TRAINING_KINDS)})")
    p.add_argument("--workload", choices=WORKLOADS, default="counters",
                   help="what the client host runs: counters (acknowledged adds, each checked; default), train "
                        "(a paramserver train job joined to the cluster: it must end, every row trained once, and "
                        "its model be the fault-free run's within what its consistency allows) or stream (the "
                        "same job reading its rows as a stream, --stream FOLDER --max-examples ROWS)")
    p.add_argument("--rows", type=int, default=1_000_000,
                   help="with --workload train or stream: heavy-tailed rows it trains on (default 10^6)")
    p.add_argument("--workers", type=int, default=1,
                   help="with --workload train or stream: the job's worker processes (default 1)")
    p.add_argument("--servers", type=int, default=3,
                   help="servers, at least 3 (the replicas-3 counter then keeps a copy on each)")
    p.add_argument("--keep", metavar="DIR", help="keep every run's logs under DIR (default: only failed runs', "
                                                 "in the temporary folder)")
    p.add_argument("--network", choices=("auto", "namespaces", "proxy"), default="auto",
                   help="how the hosts are made: network namespaces, cut and thinned by nftables and tc (needs root); "
                        "proxy, loopback addresses with a userspace proxy between them that injects the faults "
                        "(no root); auto (default): namespaces where this machine can make them, else the proxy")
    p.add_argument("--print-plan", action="store_true", help="print the schedules and run nothing")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def plans(args: argparse.Namespace) -> list[Plan]:
    if args.replay:
        with open(args.replay) as f:
            return [Plan.from_json(f.read())]
    given = args.kinds or ",".join(KINDS if args.workload == "counters" else TRAINING_KINDS)
    kinds = tuple(k.strip() for k in given.split(",") if k.strip())
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise SystemExit(f"paramserver nemesis: --kinds {given!r}: unknown {bad}; choose from {','.join(KINDS)}")
    if args.rows < 1000 or args.workers < 1:
        raise SystemExit(f"paramserver nemesis: --rows {args.rows} --workers {args.workers}: a training job needs "
                         "at least 1000 rows and 1 worker")
    if args.servers < 3:
        raise SystemExit(f"paramserver nemesis: --servers {args.servers}: needs at least 3 (the counters are a "
                         "replicas-2 and a replicas-3 table)")
    seeds = [args.seed] if args.seed is not None else range(args.first_seed, args.first_seed + args.seeds)
    return [draw(s, args.servers, args.window, args.longest, kinds, workload=args.workload) for s in seeds]


def main(args: argparse.Namespace) -> int:
    from paramserver.testing.nemesis.hosts import missing

    todo = plans(args)
    if args.print_plan:
        for p in todo:
            print(p.to_json())
        return 0
    problem = keep_folder(args.keep)
    if problem:
        print(f"paramserver nemesis: {problem}", file=sys.stderr)
        return 2
    why = missing() if args.network != "proxy" else None
    if why and args.network == "namespaces":
        print(f"paramserver nemesis: {why}; or run without it: --network proxy", file=sys.stderr)
        return 2
    if why:
        print(f"paramserver nemesis: {why}; the faults go through a userspace proxy between the nodes instead "
              "(--network proxy)", file=sys.stderr)
    signal.signal(signal.SIGTERM, _interrupted)  # hosts and nodes are removed on the way out
    signal.signal(signal.SIGHUP, _interrupted)
    with tempfile.TemporaryDirectory(prefix="nemesis-data-") as scratch:
        data = _training_data(todo, args, scratch)
        return report([_one(p, args.keep, data, args.network) for p in todo], args.json)


def keep_folder(keep: str | None) -> str | None:
    """``--keep DIR`` made if absent and checked writable before any run (``check_output``, as
    every command's output folders are): None, or why not, with the fix.  A campaign that found
    it missing failed after it had made its rows."""
    from paramserver.data.files import check_output
    from paramserver.errors import ConfigError

    try:
        check_output(keep, "--keep", folder=True)
    except ConfigError as e:
        return str(e)
    return None


def _training_data(plans: list[Plan], args: argparse.Namespace, scratch: str) -> TrainingData | None:
    """The rows and the fault-free run of the plans' training job, made once a campaign."""
    jobs = [p for p in plans if p.workload != "counters"]
    if not jobs:
        return None
    if len({(p.workload, p.servers) for p in jobs}) > 1:
        raise SystemExit("paramserver nemesis: the schedules train different jobs; replay one workload at a time")
    servers, stream = jobs[0].servers, jobs[0].workload == "stream"
    print(f"making {args.rows:,} rows and the fault-free run ({args.workers} worker(s), {servers} servers"
          f"{', as a stream' if stream else ''}) ...", file=sys.stderr, flush=True)
    return TrainingData.make(scratch, args.rows, args.workers, servers, stream=stream)


def _interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _one(plan: Plan, keep: str | None, data: TrainingData | None, network: str) -> dict[str, Any]:
    from paramserver.testing.nemesis.jobs import Counters, Training
    from paramserver.testing.nemesis.run import run

    out = run(plan, Training(data) if plan.workload != "counters" and data is not None else Counters(), keep,
              network)
    if not out.verdict.ok:
        with open(os.path.join(out.folder, "plan.json"), "w") as f:
            f.write(plan.to_json())
    s = out.summary()
    mark = "ok  " if out.verdict.ok else "FAIL"
    model = s.get("model")
    trained = "" if not model else (f"model {model['logloss']:.6f}, {abs(model['logloss'] - model['fault_free']):.2g} "
                                    f"from the fault-free run's (allowed {model['allowed']:.2g}), ")
    print(f"{mark} seed {plan.seed} ({s['network']}): {len(plan.faults)} faults, {trained}{s['acked']} acked, "
          f"{s['unknown']} unknown, "
          f"max recovery {s['max_recovery_s']} s, {s['restarts']} restarts, {s['seconds']} s"
          + ("" if out.verdict.ok else f"\n     {'; '.join(out.verdict.violations)}\n     logs: {out.folder}"
                                       f"\n     again: {_replay(out.folder, data, network)}"),
          file=sys.stderr, flush=True)
    return s


def _replay(folder: str, data: TrainingData | None, network: str) -> str:
    """The command that runs a failed run's schedule again (a training job's rows and workers, and
    the network, too)."""
    job = "" if data is None else f" --rows {data.rows} --workers {data.workers}"
    return f"paramserver nemesis --replay {folder}/plan.json{job}" + ("" if network == "auto" else
                                                                       f" --network {network}")


def report(runs: list[dict[str, Any]], as_json: bool) -> int:
    failed = [r for r in runs if not r["ok"]]
    gaps = [g for r in runs for g in r["recovery_s"] if g is not None]
    over = sum(1 for g in gaps if g > 5.0)
    summary = {"runs": len(runs), "failed": len(failed), "heals": len(gaps), "recovery_over_5s": over,
               "max_recovery_s": max(gaps, default=None), "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if as_json:
        print(json.dumps({**summary, "runs": runs}, indent=1))
    else:
        print(f"{len(runs)} runs, {len(failed)} failed; {len(gaps)} heals, progress again within "
              f"{summary['max_recovery_s']} s at most ({over} over 5 s)")
        for r in failed:
            print(f"  seed {r['seed']}: {'; '.join(r['violations'])} (logs and plan.json: {r['folder']})")
    return 1 if failed else 0
