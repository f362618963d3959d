"""Where a job's CPU goes while it trains: every process and thread of it, sampled by ``perf``,
the samples in numba's compiled code named by kernel (issues 44, 49).

Run: ``.venv/bin/python bench/job_profile.py [--command train] [--rate 2999] [--json F] -- ARGS``:
the arguments after ``--`` are the command's (``train``, by default: without ``--data``, 10^6
heavy rows written here; ``lda``, ``mf``, ``lasso``: their own, ``--data`` among them), e.g.
``--command lda -- --data docword.train.txt.gz --topics 1000 --iterations 200 --workers 2``.

``perf record -a`` samples every core while the job runs; a perf map written by each of the job's
processes as it exits (``/tmp/perf-PID.map``: the address of every numba kernel it loaded, its
module and name) lets ``perf script`` name the samples that fall in compiled code, which it would
otherwise show as ``[unknown]``.  The training window runs from 0.15 s after the worker's first
sample (its start-up left out) to its last; within it, each process's CPU seconds are split by
kernel, the interpreter (``[python]``), the kernel's own (``[kernel]``) and other libraries, and
the worker's by thread.  Also counted: the cores' idle time in the window.  It needs ``perf`` and
the right to sample the whole machine (``kernel.perf_event_paranoid`` at most 0, or root).
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any

WARM_S = 0.15  # the worker's first samples left out of the window (its start-up)


def _write_map() -> None:
    """This process's perf map: every numba kernel it loaded (``CPUDispatcher`` overloads), by
    address, each sized to the next one's address (perf needs a size; the gap covers the code)."""
    from numba.core.registry import CPUDispatcher

    gc.unfreeze()  # start-up's objects were frozen out of the collector: their dispatchers with them
    entries = []
    for obj in gc.get_objects():
        if not isinstance(obj, CPUDispatcher):
            continue
        for cres in list(obj.overloads.values()):
            try:
                address = cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name)
            except Exception:  # noqa: BLE001 - a kernel without code here: nothing to name
                continue
            if address:
                name = f"{obj.py_func.__module__.rsplit('.', 1)[-1]}.{obj.py_func.__name__.split('__')[0]}"
                entries.append((address, name))
    entries.sort()
    with open(f"/tmp/perf-{os.getpid()}.map", "w") as f:
        for i, (address, name) in enumerate(entries):
            size = min(entries[i + 1][0] - address if i + 1 < len(entries) else 1 << 16, 1 << 20)
            f.write(f"{address:x} {size:x} {name}\n")


#: the jobs it profiles: their workers are named ``ps-worker`` (the training window's clock)
COMMANDS = ("train", "lda", "mf", "lasso")


def child(name: str, argv: list[str]) -> None:
    """Run ``paramserver NAME ARGV`` in this process, each of its processes writing its perf map as it ends."""
    exit_now = os._exit

    def mapped_exit(code: int) -> None:
        try:
            _write_map()
        finally:
            exit_now(code)

    os._exit = mapped_exit  # type: ignore[assignment]  # every process of the job ends through it
    # the command's argv before the package loads: it then sets up as the command does (one BLAS
    # thread; with OpenBLAS's own two, the driver's helper threads spun 0.04-0.06 s in the window)
    sys.argv = ["paramserver", name, *argv]
    from paramserver.cli.main import command

    command()  # ends with os._exit: the driver's map too


def _samples(data: str) -> list[tuple[int, int, float, str, str]]:
    """``perf script``'s samples: (process, thread, seconds, what, thread name)."""
    out = subprocess.run(["perf", "script", "-i", data, "-F", "comm,pid,tid,time,ip,sym,dso"], capture_output=True,
                         text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        head, _, rest = line.partition(":")
        parts, fields = head.split(), rest.split()
        if len(parts) < 3 or "/" not in parts[-2] or not fields:
            continue
        pid, tid = (int(x) for x in parts[-2].split("/"))
        dso = fields[-1].strip("()").rsplit("/", 1)[-1]
        sym = " ".join(fields[1:-1])
        what = ("[kernel]" if "kallsyms" in dso else "[python]" if "libpython" in dso
                else sym if dso.startswith("perf-") else f"[{dso.split('.')[0]}]")
        rows.append((pid, tid, float(parts[-1]), what, " ".join(parts[:-2])))
    return rows


def breakdown(rows: list[tuple[int, int, float, str, str]], rate: int, top: int = 8) -> dict[str, Any]:
    """The training window's CPU seconds: by process (named by its main thread) and what (its
    ``top`` biggest), the worker's by thread, and the idle cores'."""
    names = {pid: comm for pid, tid, _, _, comm in rows if pid == tid}
    workers = [pid for pid, name in names.items() if name.startswith("ps-worker")]
    if not workers:
        raise SystemExit("job_profile: no worker process among the samples (was the job too short?)")
    times = [t for pid, _, t, _, _ in rows if pid in workers]
    start, end = min(times) + WARM_S, max(times)
    by_process: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    threads: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for pid, tid, t, what, comm in rows:
        if start <= t <= end:
            process = "idle" if pid == 0 else f"{names.get(pid, '?')} ({pid})"
            by_process[process][what] += 1
            if pid in workers:
                threads[f"{comm} ({tid})"][what] += 1

    def seconds(c: collections.Counter[str], top: int) -> dict[str, float]:
        return {k: round(v / rate, 3) for k, v in c.most_common(top)}

    return {"window_s": round(end - start, 3),
            "processes": {p: {"cpu_s": round(sum(c.values()) / rate, 3), "top": seconds(c, top)}
                          for p, c in sorted(by_process.items(), key=lambda x: -sum(x[1].values()))},
            "worker_threads": {t: {"cpu_s": round(sum(c.values()) / rate, 3), "top": seconds(c, 4)}
                               for t, c in sorted(threads.items(), key=lambda x: -sum(x[1].values()))[:8]}}


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["--child"]:
        child(args_in[1], args_in[2:])
    cut = args_in.index("--") if "--" in args_in else len(args_in)
    ours, job = args_in[:cut], args_in[cut + 1:]  # ours, then the command's
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--command", choices=COMMANDS, default="train", help="the job profiled (default: train)")
    ap.add_argument("--rate", type=int, default=2999, help="samples a second a core (perf record -F)")
    ap.add_argument("--json", help="write the breakdown here")
    ap.add_argument("--top", type=int, default=8, help="what a process's CPU went to: its N biggest (default 8)")
    args = ap.parse_args(ours)
    if shutil.which("perf") is None:
        print("job_profile: skipped: no perf on this machine (linux-tools)", file=sys.stderr)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        if not any(a == "--data" or a.startswith("--data=") for a in job):
            if args.command != "train":
                ap.error(f"--command {args.command}: give its --data after --")
            from paramserver.apps.ctr.synth import write_synth

            path = os.path.join(tmp, "heavy.tsv")
            write_synth(path, 1_000_000, seed=1, shape="heavy")
            job = ["--data", path, *job]
        data = os.path.join(tmp, "perf.data")
        run = subprocess.run(["perf", "record", "-F", str(args.rate), "-a", "-o", data, "--", sys.executable,
                              os.path.abspath(__file__), "--child", args.command, "--quiet", *job],
                             capture_output=True, text=True)
        if run.returncode != 0:
            print(f"job_profile: perf record failed ({run.returncode}):\n{run.stderr[-2000:]}", file=sys.stderr)
            return 1
        rows = _samples(data)
        result = breakdown(rows, args.rate, args.top)
    for pid in {pid for pid, tid, _, _, comm in rows if pid == tid and (comm == "python" or comm.startswith("ps-"))}:
        try:  # the maps the job's processes wrote
            os.remove(f"/tmp/perf-{pid}.map")
        except FileNotFoundError:
            pass
    for line in run.stdout.splitlines():
        if "examples/s" in line or "first example" in line:
            print(" ".join(line.replace("│", " ").split()))
    print(f"training window {result['window_s']} s")
    for title, table in (("process", result["processes"]), ("worker thread", result["worker_threads"])):
        for name, row in table.items():
            top = ", ".join(f"{k} {v}" for k, v in row["top"].items())
            print(f"{title:13} {name:32} {row['cpu_s']:6.3f} s  {top}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
