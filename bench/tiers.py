"""Tables larger than memory (issue 48): ``paramserver train`` with a memory budget far
below the table, against the same job without one, and against the same budget spent on
eviction (``--lifecycle cap_bytes=B``, which drops what it learnt).

Run: ``PYTHONPATH=src .venv/bin/python bench/tiers.py [--rows 1000000] [--ratios 4,16]
[--drift-rows 250000 --drift-days 4] [--cgroup] [--json out.json]`` (about 5 minutes at the
defaults on 2 cores).

* **Heavy-tailed stream**: ``paramserver synth --shape heavy`` rows (train) and a tenth as
  many of another seed (test).  The job runs at its default flags once without a budget;
  its table's bytes (one server: all of it) fix the budgets, ``bytes / ratio`` for each
  ``--ratios``.  Each budget runs ``--table-memory B`` (tiers) and ``--lifecycle
  cap_bytes=B`` (eviction).  Each run's model is saved and compared with the unbudgeted
  one key by key, bit for bit.
* **Bytes a key in memory**: at the first ratio's budget, ``--storage bf16`` with full keys
  and with ``--hot-keys fingerprint``; "hot B/key" is the hot tier's bytes over the keys it
  holds at the end, against the goal of 12 at a test log loss within +0.0005 of the
  unbudgeted float32 job.
* **Drifting stream**: ``synth --shape drift`` days; train on all but the last, test on the
  last, at the first ratio's share of that table: tiers against eviction.
* **Memory**: the server's ``VmRSS``, ``RssAnon`` (the process's own memory: what the
  budget bounds) and ``RssFile`` (mapped file pages: the cold tier's, reclaimable page
  cache) are sampled every 50 ms.  With ``--cgroup`` (root, cgroup v1 or v2) the server is
  moved, once it is up, into a memory cgroup whose limit is ``budget + --overhead``: what it
  allocates from then on (table, buffers, cold pages) is charged, and an overrun kills it.
  The unbudgeted job runs under the first ratio's budget plus ``--bite-overhead`` (24M) too,
  to show the limit bites: its process alone fits 96 MiB over the budget.

Printed: markdown tables (stdout), then the issue's goals as PASS/FAIL lines; progress on
stderr; ``--json FILE`` keeps everything.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import numpy as np

from bench_harness.markdown import md_table
from bench_harness.procs import PS, log
from paramserver.config import parse_bytes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000, help="heavy-tailed training rows (default 1000000)")
    p.add_argument("--ratios", default="4,16", help="the table's size over the budget, comma separated (default 4,16)")
    p.add_argument("--drift-rows", type=int, default=250_000, help="rows a drifting day (default 250000; 0: skip)")
    p.add_argument("--drift-days", type=int, default=4, help="drifting days, the last one tested (default 4)")
    p.add_argument("--cgroup", action="store_true", help="run each server under a memory cgroup (root)")
    p.add_argument("--overhead", default="96M", help="the cgroup's allowance over the budget (default 96M)")
    p.add_argument("--bite-overhead", default="24M",
                   help="the allowance over the first budget under which the unbudgeted job runs, to show that "
                        "the limit kills a server that overruns (default 24M: the unbudgeted table alone is 4x "
                        "the budget)")
    p.add_argument("--run-timeout", type=float, default=900, help="seconds a job may take (default 900)")
    p.add_argument("--no-prefetch-too", action="store_true",
                   help="also run each budget's tiers with --no-prefetch (what reading ahead saves)")
    p.add_argument("--data", default="", help="a folder to keep the data in (reused when there)")
    p.add_argument("--json", default="", help="write every number to this file")
    return p.parse_args(argv)


# ---- the server's memory ------------------------------------------------------------------
def _server_pid(parent: int) -> int | None:
    """The ``paramserver: server`` process under ``parent`` (the job's local cluster), if up."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if not f.read().startswith(b"paramserver: server"):
                    continue
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        if ppid == parent or _ancestor(ppid, parent):
            return int(pid)
    return None


def _ancestor(pid: int, of: int) -> bool:
    for _ in range(8):
        if pid <= 1:
            return False
        if pid == of:
            return True
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            return False
    return False


def _status(pid: int) -> dict[str, int]:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key = line.split(":")[0]
                if key in ("VmRSS", "RssAnon", "RssFile"):
                    out[key] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out


class Sampler(threading.Thread):
    """The server's memory every 50 ms while the job runs; optionally its cgroup."""

    def __init__(self, parent: int, limit: int) -> None:
        super().__init__(daemon=True)
        self.parent, self.limit = parent, limit
        self.samples: list[tuple[float, dict[str, int]]] = []
        self.stop = threading.Event()
        self.group = ""
        self.start_rss: dict[str, int] = {}

    def run(self) -> None:
        t0, pid = time.monotonic(), None
        while not self.stop.wait(0.05):
            pid = pid or _server_pid(self.parent)
            if pid is None:
                continue
            if self.limit and not self.group:
                self.group = cgroup_join(pid, self.limit)
                self.start_rss = _status(pid)
            s = _status(pid)
            if s:
                self.samples.append((time.monotonic() - t0, s))

    def peak(self, key: str, until: float = float("inf")) -> int:
        """The highest ``key`` sampled (up to ``until`` seconds after the command started)."""
        return max((s.get(key, 0) for t, s in self.samples if t <= until), default=0)


def cgroup_join(pid: int, limit: int) -> str:
    """Move ``pid`` into a new memory cgroup of ``limit`` bytes (v2, else v1); its path."""
    name = f"paramserver-tiers-{os.getpid()}-{pid}"
    for root, limit_file in (("/sys/fs/cgroup", "memory.max"), ("/sys/fs/cgroup/memory", "memory.limit_in_bytes")):
        if not os.path.exists(os.path.join(root, limit_file if root.endswith("memory") else "cgroup.controllers")):
            continue
        path = os.path.join(root, name)
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, limit_file), "w") as f:
            f.write(str(limit))
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(pid))
        return path
    raise SystemExit("--cgroup: no memory cgroup (v2 or v1) to use here")


def cgroup_remove(path: str) -> None:
    if path:
        for _ in range(50):  # the killed or finished server leaves it empty
            try:
                os.rmdir(path)
                return
            except OSError:
                time.sleep(0.1)


# ---- one job ------------------------------------------------------------------------------
RUN_TIMEOUT = [900.0]  # --run-timeout


def train(data: list[str], test: list[str], out: str, flags: list[str], limit: int = 0) -> dict[str, Any]:
    """``paramserver train`` at its defaults plus ``flags``; its report, the server's memory.
    Under a cgroup ``limit`` the model is not saved (``--save`` reads the whole table into
    the server's memory for one message: its own allowance, not the budget's)."""
    metrics, save = os.path.join(out, "metrics.json"), os.path.join(out, "model")
    cmd = [*PS, "train", *sum((["--data", d] for d in data), []), *sum((["--test", t] for t in test), []),
           "--metrics-out", metrics, *([] if limit else ["--save", save]), *flags]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    sampler = Sampler(proc.pid, limit)
    sampler.start()
    try:
        _, err = proc.communicate(timeout=RUN_TIMEOUT[0])
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        _, err = proc.communicate()
        err = b"timed out after %d s" % RUN_TIMEOUT[0]
    finally:
        sampler.stop.set()
        sampler.join()
        cgroup_remove(sampler.group)
    wall = time.monotonic() - t0
    rss = {k: sampler.peak(k) for k in ("VmRSS", "RssAnon", "RssFile")}
    if proc.returncode != 0:
        log(f"   failed ({proc.returncode}): {err.decode()[-400:]}")
        return {"failed": True, "code": proc.returncode, "wall": wall, "peak": rss, "flags": flags}
    with open(metrics) as f:
        report = json.load(f)
    trained = report.get("first_example_s", 0.0) + report["seconds"]  # then the test is scored, the model saved
    training = {k: sampler.peak(k, trained) for k in ("VmRSS", "RssAnon", "RssFile")}
    return {"failed": False, "wall": wall, "peak": rss, "training_peak": training, "start": sampler.start_rss,
            "report": report, "save": save, "flags": flags}


def same_model(a: str, b: str) -> bool:
    """Whether two saved models (``--save``) hold the same keys with the same values, bit for bit."""
    with np.load(os.path.join(a, "table.npz")) as fa, np.load(os.path.join(b, "table.npz")) as fb:
        ka, va, kb, vb = fa["keys"], fa["values"], fb["keys"], fb["values"]
    oa, ob = np.argsort(ka), np.argsort(kb)
    return bool(np.array_equal(ka[oa], kb[ob]) and np.array_equal(va[oa].view(np.uint32), vb[ob].view(np.uint32)))


def data_files(folder: str, args: argparse.Namespace) -> tuple[str, str, list[str]]:
    heavy, test = os.path.join(folder, f"heavy-{args.rows}.tsv"), os.path.join(folder, f"heavy-test-{args.rows}.tsv")
    for path, rows, seed in ((heavy, args.rows, 1), (test, max(args.rows // 10, 1000), 2)):
        if not os.path.exists(path):
            subprocess.run([*PS, "synth", "--rows", str(rows), "--shape", "heavy", "--seed", str(seed), "--out", path],
                           check=True, stdout=subprocess.DEVNULL)
    days: list[str] = []
    if args.drift_rows:
        drift = os.path.join(folder, f"drift-{args.drift_rows}-{args.drift_days}")
        days = [os.path.join(drift, f"day-{d:02d}.tsv") for d in range(args.drift_days)]
        if not all(os.path.exists(d) for d in days):
            subprocess.run([*PS, "synth", "--rows", str(args.drift_rows), "--shape", "drift", "--days",
                            str(args.drift_days), "--out", drift], check=True, stdout=subprocess.DEVNULL)
    return heavy, test, days


# ---- the runs -----------------------------------------------------------------------------
def row(name: str, run: dict[str, Any], base: dict[str, Any], budget: int) -> list[Any]:
    if run["failed"]:
        return [name, budget >> 10, "failed", "", "", "", "", "", "", "", run["peak"]["RssAnon"] >> 20, ""]
    r, b = run["report"], base["report"]
    tiers, train = r.get("tiers", {}), run["training_peak"]
    return [name, budget >> 10, r["examples_per_s"], r["examples_per_s"] / b["examples_per_s"], r["logloss"],
            r["keys"], f"{tiers['hit_rate']:.4f}" if tiers else "", f"{hot_bytes_a_key(r):.1f}" if tiers else "",
            train["RssAnon"] >> 20, train["RssFile"] >> 20, run["peak"]["RssAnon"] >> 20, run.get("same_model", "")]


def hot_bytes_a_key(report: dict[str, Any]) -> float:
    """The hot tier's bytes over the keys it holds, at the end of the job."""
    tiers = report["tiers"]
    return float(tiers["hot_bytes"]) / max(1.0, float(report["keys"]) - float(tiers["cold_keys"]))


def heavy_runs(heavy: str, test: str, out: str, args: argparse.Namespace) -> dict[str, Any]:
    ratios = [float(r) for r in args.ratios.split(",") if r.strip()]
    log("heavy: no budget")
    base = train([heavy], [test], os.path.join(out, "memory"), [])
    table = int(base["report"]["table_bytes"])
    runs: dict[str, Any] = {"memory": base, "table_bytes": table}
    overhead = parse_bytes("--overhead", args.overhead)
    for ratio in ratios:
        budget = int(table / ratio)
        limit = budget + overhead if args.cgroup else 0
        kinds = [("tiers", ["--table-memory", str(budget)])]
        if args.no_prefetch_too:
            kinds.append(("tiers-noprefetch", ["--table-memory", str(budget), "--no-prefetch"]))
        for kind, flags in (*kinds, ("evict", ["--lifecycle", f"cap_bytes={budget};victim=lru"])):
            log(f"heavy: {kind} at 1/{ratio:g} of the table ({budget:,} bytes)")
            run = train([heavy], [test], os.path.join(out, f"{kind}-{ratio:g}"), flags, limit)
            if not run["failed"]:  # under a cgroup, no model saved: the same test loss to the last bit, and keys
                r, b = run["report"], base["report"]
                run["same_model"] = (r["logloss"] == b["logloss"] and r["keys"] == b["keys"]) if limit else \
                    same_model(base["save"], run["save"])
            runs[f"{kind}-{ratio:g}"] = {**run, "budget": budget, "ratio": ratio}
    if ratios:  # bytes a key: 16-bit rows, with full keys and with fingerprints
        budget = int(table / ratios[0])
        limit = budget + overhead if args.cgroup else 0
        for kind, extra in (("bf16", []), ("bf16-fingerprint", ["--hot-keys", "fingerprint"])):
            log(f"heavy: {kind} at 1/{ratios[0]:g} of the table ({budget:,} bytes)")
            run = train([heavy], [test], os.path.join(out, kind), ["--table-memory", str(budget), "--storage", "bf16",
                                                                   *extra], limit)
            runs[kind] = {**run, "budget": budget, "ratio": ratios[0], "compact": True}
    if args.cgroup and ratios:
        budget = int(table / ratios[0])
        limit = budget + parse_bytes("--bite-overhead", args.bite_overhead)
        log(f"heavy: no budget, under a cgroup limit of the 1/{ratios[0]:g} budget + --bite-overhead ({limit:,} bytes)")
        runs["memory-limited"] = {**train([heavy], [test], os.path.join(out, "memory-limited"), [], limit),
                                  "budget": budget}
    return runs


def drift_runs(days: list[str], out: str, ratio: float) -> dict[str, Any]:
    log("drift: no budget")
    base = train(days[:-1], days[-1:], os.path.join(out, "drift-memory"), [])
    budget = int(base["report"]["table_bytes"] / ratio)
    runs = {"memory": base, "budget": budget}
    for kind, flags in (("tiers", ["--table-memory", str(budget)]),
                        ("evict", ["--lifecycle", f"cap_bytes={budget};victim=lru"])):
        log(f"drift: {kind} at 1/{ratio:g} of the table ({budget:,} bytes)")
        runs[kind] = train(days[:-1], days[-1:], os.path.join(out, f"drift-{kind}"), flags)
    return runs


def report(heavy: dict[str, Any], drift: dict[str, Any] | None) -> list[str]:
    head = ["run", "budget KiB", "examples/s", "vs memory", "test logloss", "keys", "hit rate", "hot B/key",
            "training: peak RssAnon MiB", "peak RssFile MiB", "whole run (save): peak RssAnon MiB", "same model"]
    base = heavy["memory"]
    rows = [row("no budget", base, base, heavy["table_bytes"])]
    for name, run in heavy.items():
        if isinstance(run, dict) and "budget" in run and name != "memory":
            rows.append(row(name, run, base, run["budget"]))
    print(md_table(head, rows, [0, 0, 0, 3, 5, 0, 4, 0, 0, 0, 0, 0]))
    goals = []
    for name, run in heavy.items():
        if not (isinstance(run, dict) and name.startswith("tiers-") and "noprefetch" not in name) or run["failed"]:
            continue
        speed = run["report"]["examples_per_s"] / base["report"]["examples_per_s"]
        line = f"1/{run['ratio']:g}: {speed:.2f}x the in-memory examples/s, same model {run['same_model']}"
        if run["ratio"] <= 4:
            goals.append(("PASS" if speed >= 0.5 and run["same_model"] else "FAIL") + f" key set 4x the budget: {line}")
        else:
            goals.append(("PASS" if run["same_model"] else "FAIL") + f" key set {run['ratio']:g}x the budget: {line}, "
                         f"hit rate {run['report']['tiers']['hit_rate']:.4f}")
    fp = heavy.get("bf16-fingerprint")
    if fp and not fp["failed"]:
        per_key, loss = hot_bytes_a_key(fp["report"]), fp["report"]["logloss"] - base["report"]["logloss"]
        goals.append(f"{'PASS' if per_key <= 12 and loss <= 5e-4 else 'FAIL'} hot tier {per_key:.1f} bytes a dim-1 "
                     f"FTRL key (bf16, fingerprints), test logloss {loss:+.5f} against float32 without a budget")
    if "memory-limited" in heavy:
        m = heavy["memory-limited"]
        goals.append(f"{'PASS' if m['failed'] else 'FAIL'} the cgroup limit bites: the unbudgeted job under it "
                     f"{'was killed' if m['failed'] else 'finished'}")
    if drift:
        d = {k: drift[k]["report"]["logloss"] for k in ("memory", "tiers", "evict") if not drift[k]["failed"]}
        if "tiers" in d and "evict" in d:
            print(md_table(["drift run", "test logloss"], [[k, v] for k, v in d.items()], [0, 5]))
            goals.append(f"{'PASS' if d['tiers'] < d['evict'] else 'FAIL'} drifting data at the same budget: tiers "
                         f"logloss {d['tiers']:.5f} against eviction {d['evict']:.5f}")
    return goals


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    RUN_TIMEOUT[0] = args.run_timeout
    folder = args.data or tempfile.mkdtemp(prefix="paramserver-tiers-")
    os.makedirs(folder, exist_ok=True)
    heavy, test, days = data_files(folder, args)
    out = tempfile.mkdtemp(prefix="runs-", dir=folder)
    runs = heavy_runs(heavy, test, out, args)
    drift = drift_runs(days, out, float(args.ratios.split(",")[0])) if days else None
    goals = report(runs, drift)
    for g in goals:
        print(g)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"heavy": runs, "drift": drift, "goals": goals, "argv": sys.argv}, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
