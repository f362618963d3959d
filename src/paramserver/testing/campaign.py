"""``paramserver chaos``: many seeds of the chaos scenarios, on every core, and a report.

    paramserver chaos --seeds 500 --json          # the campaign: seeds spread over every scenario
    paramserver chaos --seeds 50 --scenario ssp   # one scenario
    paramserver chaos --seed 17 --scenario partition --trace   # replay one run, event by event
    paramserver chaos --list-mutations
    paramserver chaos --seeds 100 --mutate no-dedup            # must report violations

Runs are independent processes' work (``multiprocessing``, one per core), each seeded,
so a campaign's result does not depend on how they were spread.  Hashing of ``str`` and
``bytes`` is pinned (``PYTHONHASHSEED=0``, re-executing once if needed), so that a
replayed seed gives the same trace, bit for bit, as the run that found the violation.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterable
from typing import Any

from paramserver.testing.names import SCENARIO_NAMES


def add_parser(sub: Any) -> None:
    p = sub.add_parser("chaos", help="fault-injection campaign on a simulated cluster (deterministic, seeded)")
    p.add_argument("--seeds", type=int, default=100, help="runs (spread over the scenarios unless --scenario)")
    p.add_argument("--seed", type=int, help="run this one seed (with --scenario: a replay)")
    p.add_argument("--first-seed", type=int, default=0, help="the campaign's seeds are FIRST.. FIRST+SEEDS-1")
    p.add_argument("--scenario", choices=SCENARIO_NAMES, help="only this scenario (default: every one)")
    p.add_argument("--mutate", metavar="NAME", help="switch one safety mechanism off (--list-mutations)")
    p.add_argument("--list-mutations", action="store_true", help="print the mutation names, one a line")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--trace", action="store_true",
                   help="print each run's event trace, up to its first violation (use with --seed)")
    p.add_argument("--jobs", type=int, default=0, help="processes (0: one a core)")


def _pin_hashing() -> None:
    """Re-run this command with ``PYTHONHASHSEED=0`` unless it already is."""
    if os.environ.get("PYTHONHASHSEED") != "0":
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        os.execve(sys.executable, [sys.executable, "-m", "paramserver", *sys.argv[1:]], env)


def _one(task: tuple[str, int, str | None, bool]) -> dict[str, Any]:
    import logging

    from paramserver.testing.chaos import run

    logging.disable(logging.CRITICAL)  # the nodes' own logs: the trace says what happened
    scenario, seed, mutation, trace = task
    started = time.perf_counter()
    r = run(scenario, seed, mutation, trace)
    return {"scenario": scenario, "seed": seed, "calls": r.calls, "virtual_s": round(r.virtual_s, 3),
            "seconds": round(time.perf_counter() - started, 3), "trace": r.trace,
            "violations": [{"kind": v.kind, "detail": v.detail, "at": round(v.at, 6)} for v in r.violations]}


def _tasks(args: argparse.Namespace) -> list[tuple[str, int, str | None, bool]]:
    from paramserver.testing.scenarios import SCENARIOS

    names = [args.scenario] if args.scenario else sorted(SCENARIOS)
    if args.seed is not None:
        return [(name, args.seed, args.mutate, args.trace) for name in names]
    return [(names[i % len(names)], args.first_seed + i, args.mutate, args.trace) for i in range(args.seeds)]


def _results(tasks: list[tuple[str, int, str | None, bool]], jobs: int) -> Iterable[dict[str, Any]]:
    if jobs <= 1 or len(tasks) <= 1:
        yield from map(_one, tasks)
        return
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        yield from pool.imap(_one, tasks, chunksize=1)


def _up_to_failure(trace: list[str]) -> list[str]:
    """The trace up to and with the first violation (all of it if there is none)."""
    for i, line in enumerate(trace):
        if " VIOLATION " in line:
            return trace[:i + 1]
    return trace


def main(args: argparse.Namespace) -> int:
    from paramserver.errors import ConfigError
    from paramserver.testing.mutations import MUTATIONS

    if args.list_mutations:
        width = max(map(len, MUTATIONS))
        print("\n".join(f"{name:<{width}}  {what}" for name, (what, _) in MUTATIONS.items()))
        return 0
    if args.mutate is not None and args.mutate not in MUTATIONS:
        raise ConfigError(f"--mutate {args.mutate!r} is not a mutation; known: {', '.join(MUTATIONS)}")
    if args.seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {args.seeds}")
    if args.jobs < 0:
        raise ConfigError(f"--jobs must be >= 0 (0: one process a core), got {args.jobs}")
    _pin_hashing()
    tasks = _tasks(args)
    jobs = args.jobs or os.cpu_count() or 1
    started = time.perf_counter()
    report: dict[str, Any] = {"runs": 0, "violations": [], "scenarios": {}, "mutation": args.mutate}
    for res in _results(tasks, jobs):
        report["runs"] += 1
        stats = report["scenarios"].setdefault(res["scenario"], {"runs": 0, "violations": 0, "calls": 0,
                                                                 "virtual_s": 0.0, "seconds": 0.0})
        stats["runs"] += 1
        stats["calls"] += res["calls"]
        stats["virtual_s"] = round(stats["virtual_s"] + res["virtual_s"], 3)
        stats["seconds"] = round(stats["seconds"] + res["seconds"], 3)
        stats["violations"] += len(res["violations"])
        replay = f"paramserver chaos --seed {res['seed']} --scenario {res['scenario']} --trace" + (
            f" --mutate {args.mutate}" if args.mutate else "")
        for v in res["violations"]:
            report["violations"].append({"scenario": res["scenario"], "seed": res["seed"], **v, "replay": replay})
        if args.trace and res["trace"] is not None:
            print("\n".join(_up_to_failure(res["trace"])))
        if not args.json and not args.trace and res["violations"]:
            first = res["violations"][0]
            print(f"VIOLATION {res['scenario']} seed {res['seed']}: {first['kind']}: {first['detail']}\n"
                  f"  replay: {replay}", file=sys.stderr)
    report["seconds"] = round(time.perf_counter() - started, 1)
    if args.json:
        print(json.dumps(report, indent=1))
    elif not args.trace:
        for name, stats in sorted(report["scenarios"].items()):
            print(f"{name:18s} {stats['runs']:5d} runs {stats['calls']:8d} calls "
                  f"{stats['virtual_s']:9.0f} s simulated  {stats['violations']:4d} violations")
        print(f"{report['runs']} runs in {report['seconds']} s: {len(report['violations'])} violations"
              + (f" (mutation {args.mutate})" if args.mutate else ""))
    return 1 if report["violations"] else 0
