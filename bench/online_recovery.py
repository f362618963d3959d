"""Section 4 of ``bench/online.py``, recovery: a streaming job counting each example with an
update rule of its own is SIGKILLed ``--kills`` times while rows arrive, and resumed from its
checkpoints; the time to recover, and the final counters (nothing lost, nothing doubled; the
module docstring of ``online.py`` says how, and the goal).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import signal
import subprocess
import time
from typing import Any

import numpy as np

from bench_harness.markdown import md_table
from bench_harness.procs import PS, Procs, env_with, finish, log, tail
from bench_harness.timing import median
from online_redis import RateFeeder, read_report

RULE = '''import paramserver


@paramserver.rule(state_width=1)
def count(value, state, grad, hp):
    state[0] += grad[0]  # the weight stays 0: p = 0.5, a label-0 example's gradient 0.5
'''

def checkpoint_examples(ckpt: str) -> tuple[str, int]:
    """The newest complete checkpoint's step and examples (("", 0) before the first)."""
    from paramserver.checkpoint import store

    try:
        step = store.resolve_step(ckpt)
        return step, int(store.read_manifest(step)["job"]["totals"]["examples"])
    except Exception:  # noqa: BLE001 -- none yet, or being written
        return "", 0


def xrange_calls(client: Any) -> int:
    return int(client.info("commandstats").get("cmdstat_xrange", {}).get("calls", 0))


def _job(args: argparse.Namespace, tmp: str, url: str, n: int) -> tuple[list[str], dict[str, str], str, str]:
    """The recovery job's command, its environment (the counting rule on its path), its
    checkpoint folder and report."""
    mod_dir = os.path.join(tmp, "rules")
    os.makedirs(mod_dir, exist_ok=True)
    with open(os.path.join(mod_dir, "bench_count_rule.py"), "w") as f:
        f.write(RULE)
    ckpt = os.path.join(tmp, "ckpt-rec")
    report = os.path.join(tmp, "rec.json")
    argv = PS + ["train", "--stream", f"{url}/rec", "--format", "libsvm", "--label-format", "01", "--hash-bits", "64",
                 "--optimizer", "bench_count_rule:count", "--checkpoint-dir", ckpt, "--checkpoint-seconds", "1",
                 "--max-examples", str(n), "--quiet", "--metrics-out", report]
    return argv, env_with(mod_dir), ckpt, report


def _recovered(pending: dict[str, Any], first_read: float | None, first_ckpt: float | None,
               kills: list[dict[str, Any]]) -> None:
    """The last kill's recovery times, now that the resumed job has read and checkpointed."""
    pending["to_first_read_s"] = first_read - pending["at"] if first_read else math.nan
    pending["to_first_checkpoint_s"] = first_ckpt - pending["at"] if first_ckpt else math.nan
    pending.pop("at")
    kills.append(pending)
    log(f"[recovery] kill {len(kills)}: resumed, first read after {pending['to_first_read_s']:.2f} s, "
        f"first new checkpoint after {pending['to_first_checkpoint_s']:.2f} s")


def _kill(proc: subprocess.Popen, ckpt: str, procs: Procs) -> dict[str, Any]:
    """SIGKILL of the job's whole process group; the kill's time and what was checkpointed."""
    before = checkpoint_examples(ckpt)[1]
    os.killpg(proc.pid, signal.SIGKILL)
    pending = {"at": time.monotonic(), "checkpointed_examples": before}
    proc.wait(timeout=30)
    procs.stop(proc)
    return pending


def _kill_and_resume(args: argparse.Namespace, argv: list[str], env: dict[str, str], ckpt: str, client: Any,
                     procs: Procs) -> tuple[list[dict[str, Any]], bool]:
    """The job started, killed once it made progress (and a random 0-2 s more) and resumed,
    ``--kills`` times, then run to its end: each kill's recovery, and whether the job
    finished before all the kills were made."""
    rng = random.Random(args.seed)
    kills: list[dict[str, Any]] = []
    pending: dict[str, Any] | None = None  # the last kill, its recovery not yet measured
    proc: subprocess.Popen | None = None
    try:
        for k in range(args.kills + 1):
            resume = ["--resume", ckpt] if checkpoint_examples(ckpt)[0] else []
            step0, ex0 = checkpoint_examples(ckpt)
            calls0 = xrange_calls(client)
            proc = procs.start(argv + resume, env=env)
            first_read, first_ckpt = _first_progress(proc, client, ckpt, calls0, step0, ex0)
            if pending is not None:
                _recovered(pending, first_read, first_ckpt, kills)
                pending = None
            if proc.poll() is not None:
                if proc.returncode == 0:
                    return kills, k < args.kills
                raise RuntimeError(f"train (recovery) failed ({proc.returncode}): {tail(proc)}")
            if k == args.kills:
                break
            if first_ckpt is None:
                raise TimeoutError("the recovery job made no progress in 300 s")
            try:
                proc.wait(timeout=rng.uniform(0.0, 2.0))
            except subprocess.TimeoutExpired:
                pending = _kill(proc, ckpt, procs)
                continue
            if proc.returncode == 0:
                return kills, True
            raise RuntimeError(f"train (recovery) failed ({proc.returncode}): {tail(proc)}")
        if proc is not None and proc.poll() is None:
            finish(proc, 1800, "train (recovery, the last run)")
        elif proc is not None and proc.returncode:
            raise RuntimeError(f"train (recovery) failed ({proc.returncode})")
        return kills, False
    finally:
        if proc is not None:
            procs.stop(proc)


def section_recovery(args: argparse.Namespace, tmp: str, url: str, client: Any, procs: Procs) -> dict[str, Any]:
    n = args.recovery_rows
    argv, env, ckpt, report = _job(args, tmp, url, n)
    feeder = RateFeeder(client, "rec", [f"0 {i + 1}:1".encode() for i in range(n)], args.recovery_rate, limit=n)
    log(f"[recovery] XADDing {n:,} rows at {args.recovery_rate:,.0f} rows/s while the job runs")
    feeder.start()
    try:
        kills, finished_early = _kill_and_resume(args, argv, env, ckpt, client, procs)
        if feeder.error is not None:
            raise RuntimeError(f"the feeder failed: {feeder.error!r}")
    finally:
        feeder.halt.set()
        feeder.join(30)
    r = read_report(report)
    bias, ids, lost, doubled, extra_ids = _counted(ckpt, n)
    group: dict[str, Any] = next((g for g in client.xinfo_groups("rec")), {})
    client.delete("rec")
    rec_read = [x["to_first_read_s"] for x in kills if not math.isnan(x["to_first_read_s"])]
    rec_ckpt = [x["to_first_checkpoint_s"] for x in kills if not math.isnan(x["to_first_checkpoint_s"])]
    counted = {"bias": bias, "ids_once": int(np.sum(ids == 1)), "lost": lost, "doubled": doubled}
    text = _text(args, n, kills, rec_read, rec_ckpt, r, counted, group)
    ok = lost == 0 and doubled == 0 and bias == n and r["examples"] == n and extra_ids == 0
    early = ", the job finished early: raise --recovery-rows" if finished_early else ""
    goals = [(ok and len(kills) >= args.kills and not finished_early,
              f"(4) exactly once over {len(kills)} SIGKILLs (asked {args.kills}{early}): "
              f"lost {lost}, doubled {doubled}, bias {bias:,} of {n:,}, report {r['examples']:,} (goal 0 and 0); "
              f"recovery to first read median {median(rec_read):.2f} s max {max(rec_read, default=math.nan):.2f} s, "
              f"to first new checkpoint median {median(rec_ckpt):.2f} s max {max(rec_ckpt, default=math.nan):.2f} s")]
    return {"text": text, "goals": goals, "kills": kills, "lost": lost, "doubled": doubled, "bias": bias,
            "examples": r["examples"], "rows": n, "finished_early": finished_early,
            "recovery_first_read_s": {"median": median(rec_read), "max": max(rec_read, default=math.nan)},
            "recovery_first_checkpoint_s": {"median": median(rec_ckpt), "max": max(rec_ckpt, default=math.nan)},
            "group": {k: group.get(k) for k in ("lag", "pending")}}


def _text(args: argparse.Namespace, n: int, kills: list[dict[str, Any]], rec_read: list[float],
          rec_ckpt: list[float], r: dict[str, Any], counted: dict[str, int], group: dict[str, Any]) -> str:
    rows_t = [[i + 1, x["checkpointed_examples"], x["to_first_read_s"], x["to_first_checkpoint_s"]]
              for i, x in enumerate(kills)]
    return (f"## 4. Recovery ({n:,} rows '0 i:1' XADDed at {args.recovery_rate:,.0f} rows/s, {len(kills)} SIGKILLs "
            f"of the whole job, each once it made progress + U(0, 2) s; --checkpoint-seconds 1, --resume)\n\n"
            "Recovery: from the SIGKILL to (a) the resumed job's first read of the stream (the first XRANGE in "
            "Redis' INFO commandstats, polled every 10 ms), (b) its first checkpoint with more examples than the "
            "one it resumed from (polled every 20 ms; includes up to the 1 s checkpoint period).\n\n"
            + md_table(["kill", "examples checkpointed at the kill", "to first read s", "to first new checkpoint s"],
                       rows_t, [0, 0, 2, 2])
            + f"\n\nrecovery to first read: median {median(rec_read):.2f} s, max "
            f"{max(rec_read, default=math.nan):.2f} s; to first new checkpoint: median {median(rec_ckpt):.2f} s, "
            f"max {max(rec_ckpt, default=math.nan):.2f} s\n"
            f"final: report examples {r['examples']:,}; bias key counted {counted['bias']:,}; ids counted once "
            f"{counted['ids_once']:,}, lost {counted['lost']:,}, doubled {counted['doubled']:,}; consumer group lag "
            f"{group.get('lag')}, pending {group.get('pending')}")


def _first_progress(proc: subprocess.Popen, client: Any, ckpt: str, calls0: int, step0: str,
                    ex0: int) -> tuple[float | None, float | None]:
    """When (monotonic) a (resumed) job first read the stream, and first wrote a checkpoint
    holding more examples than ``ex0`` (None: it exited first, or 300 s passed)."""
    first_read = first_ckpt = None
    deadline = time.monotonic() + 300
    while first_read is None or first_ckpt is None:
        now = time.monotonic()
        if first_read is None and xrange_calls(client) > calls0:
            first_read = now
        if first_ckpt is None:
            step, ex = checkpoint_examples(ckpt)
            if step and step != step0 and ex > ex0:
                first_ckpt = now
        if proc.poll() is not None or now > deadline:
            break
        time.sleep(0.01 if first_read is None else 0.02)
    return first_read, first_ckpt


def _counted(ckpt: str, n: int) -> tuple[int, np.ndarray, int, int, int]:
    """From the final checkpoint's counters: the bias key's count (every example: the
    largest), the ids' counts, ids lost (never counted), examples doubled (counts above 1)
    and keys beyond the n ids (none expected)."""
    from paramserver.apps.ctr.modelfile import _from_checkpoint

    _, _, rows, _ = _from_checkpoint(ckpt)
    counts = np.rint(rows[:, 1] * 2).astype(np.int64)  # the rule's counter: 0.5 an example
    if not counts.size:
        return 0, counts, n, 0, 0
    at = int(np.argmax(counts))
    bias, ids = int(counts[at]), np.delete(counts, at)
    doubled = int(np.sum(np.maximum(ids - 1, 0)))
    lost = int(n - np.sum(ids >= 1))
    return bias, ids, lost, doubled, max(0, int(ids.size) - n)
