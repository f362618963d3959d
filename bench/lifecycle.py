"""Per-table key lifecycle on drifting data: admission, eviction and delta export.

Run: ``PYTHONPATH=src .venv/bin/python bench/lifecycle.py [--days 7] [--rows 1000000]
[--json out.json]`` (about 10-15 minutes at the defaults on 2 cores).

A drifting Criteo-format data set (``paramserver synth --shape drift``: a quarter of the
ids retire each day and as many are born; most ids of a day are seen once) is written to
a temporary folder.  For each configuration (``none``: no lifecycle; ``after2``:
``admit=after:2``; ``prob``: ``admit=prob:0.5``; ``ttl``: ``ttl=2`` days; ``cap``:
``cap_keys`` = 20 % of the distinct keys of the whole stream; ``combo``:
``admit=after:2;ttl=2``) one fresh ``LocalCluster`` of 2 servers trains LR (FTRL, the
model's defaults) day after day on one table, ``set_time(day)`` before each day, pull /
step / push per batch.  After day ``d`` it records: keys held (primary), table bytes and
bytes per key, the servers' summed RSS (and the empty cluster's, before the table), the
log loss and AUC on a sample of day ``d + 1`` (predicted before training on it), updates
refused and keys evicted (cumulative), and the delta since day ``d - 1`` (keys set,
deleted, ``np.savez`` bytes) against a full export's bytes.  At the end it checks that the
first full export plus the daily deltas, applied in order (``checkpoint.publish.apply_delta``),
equals a full export bit for bit, and measures a delta after 1 % of the keys changed.

Printed: a markdown table per configuration (stdout), then the issue's goals as PASS/FAIL
lines with their numbers; progress goes to stderr; ``--json FILE`` keeps everything.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import sys
import tempfile
import time
from typing import Any

import numpy as np

from bench_harness.procs import log
from paramserver.apps.ctr.drift import day_path, write_drift
from paramserver.apps.ctr.models import Model, auc, logloss
from paramserver.checkpoint.publish import apply_delta
from paramserver.cluster.local import LocalCluster
from paramserver.data.reader import DataFormat, Shard, read_batches

TABLE = "w"
MODEL = Model("lr")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--days", type=int, default=7, help="days of drifting data (default 7)")
    p.add_argument("--rows", type=int, default=1_000_000, help="examples per day (default 1000000)")
    p.add_argument("--test-rows", type=int, default=100_000,
                   help="examples of day d+1 scored after day d (its first ones; default 100000)")
    p.add_argument("--batch", type=int, default=4000, help="mini-batch size (default 4000)")
    p.add_argument("--servers", type=int, default=2, help="servers per cluster (default 2)")
    p.add_argument("--ttl", type=float, default=2.0, help="TTL of the ttl and combo runs, in days (default 2)")
    p.add_argument("--prob", type=float, default=0.5, help="admission probability of the prob run (default 0.5)")
    p.add_argument("--cap-fraction", type=float, default=0.2,
                   help="cap_keys as a fraction of the stream's distinct keys (default 0.2)")
    p.add_argument("--changed", type=float, default=0.01, help="fraction of keys changed for goal 4 (default 0.01)")
    p.add_argument("--configs", default="none,after2,prob,ttl,cap,combo", help="which runs, comma separated")
    p.add_argument("--seed", type=int, default=0, help="data seed (default 0)")
    p.add_argument("--data", default="", help="a folder of day files to reuse (written there if missing)")
    p.add_argument("--json", default="", help="write every number to this file")
    return p.parse_args(argv)


# ---- data ---------------------------------------------------------------------------------
def load_days(folder: str, args: argparse.Namespace) -> list[list[Any]]:
    """The day files (written if missing) as lists of batches, full 64-bit keys."""
    if not all(os.path.exists(day_path(folder, d)) for d in range(args.days)):
        t0 = time.time()
        write_drift(folder, args.rows, args.days, args.seed)
        log(f"wrote {args.days} days x {args.rows} rows to {folder} in {time.time() - t0:.1f} s")
    fmt = DataFormat(name="criteo", hash_bits=0)
    days = [list(read_batches(Shard(day_path(folder, d), 0, -1), fmt, args.batch)) for d in range(args.days)]
    log(f"read {sum(len(b) for day in days for b in day)} examples")
    return days


def distinct_keys(days: list[list[Any]]) -> tuple[int, list[int]]:
    """Distinct keys of the whole stream, and of each day."""
    uniques = [np.unique(np.concatenate([b.keys for b in day])) for day in days]
    return int(np.unique(np.concatenate(uniques)).size), [int(u.size) for u in uniques]


def configs(args: argparse.Namespace, stream_keys: int) -> dict[str, str | None]:
    ttl = f"ttl={args.ttl:g}"
    every = {"none": None, "after2": "admit=after:2", "prob": f"admit=prob:{args.prob:g}", "ttl": ttl,
             "cap": f"cap_keys={max(1, int(args.cap_fraction * stream_keys))};victim=lru",
             "combo": f"admit=after:2;{ttl}"}
    chosen = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in chosen if c not in every]
    if unknown:
        raise SystemExit(f"unknown configs {unknown}; known: {sorted(every)}")
    return {c: every[c] for c in chosen}


# ---- one cluster --------------------------------------------------------------------------
def stats(client: Any) -> dict[str, Any]:
    """The table's keys, bytes and lifecycle figures summed over the servers, and RSS."""
    out = {"keys": 0, "stored": 0, "bytes": 0, "rss": 0, "refused": 0, "evicted": 0, "admitted": 0,
           "tombstones": 0, "policy_bytes": 0}
    for s in client.stats.server_stats():
        out["rss"] += int(s.get("rss_bytes", 0))
        t = s.get("tables", {}).get(TABLE)
        if t is None:
            continue
        out["keys"] += int(t["primary_keys"])
        out["stored"] += int(t["keys"])
        out["bytes"] += int(t["bytes"])
        life = t.get("lifecycle", {})
        for k in ("refused", "evicted", "admitted", "tombstones", "policy_bytes"):
            out[k] += int(life.get(k, 0))
    return out


def train_day(client: Any, batches: list[Any]) -> float:
    """One pass over a day's batches (pull, step, push, synchronously); mean log loss."""
    total, n = 0.0, 0
    for b in batches:
        uniq, inverse = b.unique()
        rows = client.pull(TABLE, uniq).result()
        grads, loss, _ = MODEL.step(b, inverse, rows)
        client.push(TABLE, uniq, grads, distinct=True).result()
        total += loss
        n += len(b)
    return total / max(n, 1)


def evaluate(client: Any, batches: list[Any], rows: int) -> tuple[float, float]:
    """Log loss and AUC of the model on the first ``rows`` examples of ``batches``."""
    ys, ps, n = [], [], 0
    for b in batches:
        if n >= rows:
            break
        uniq, inverse = b.unique()
        pulled = client.pull(TABLE, uniq).result()
        ps.append(MODEL.predict(b, inverse, pulled))
        ys.append(b.labels)
        n += len(b)
    y, p = np.concatenate(ys), np.concatenate(ps)
    return logloss(y, p), auc(y, p)


def npz_bytes(**arrays: np.ndarray) -> int:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getbuffer().nbytes


def ordered(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(keys, kind="stable")
    return keys[order], values[order]


def run_config(name: str, spec: str | None, days: list[list[Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Train day after day on one fresh cluster; the per-day records and end checks."""
    log(f"== {name}: lifecycle={spec}")
    with LocalCluster(servers=args.servers, start_method="spawn") as cluster:  # no parent pages in RSS
        client = cluster.client
        time.sleep(0.5)
        empty_rss = stats(client)["rss"]
        client.create_table(TABLE, dim=MODEL.dim, optimizer=MODEL.default_optimizer(),
                            initializer=MODEL.initializer(), lifecycle=spec)
        track = Tracker(client) if spec else None
        records = []
        for d, batches in enumerate(days):
            t0 = time.time()
            client.set_time(float(d))
            train_loss = train_day(client, batches)
            rec: dict[str, Any] = {"day": d, "train_logloss": train_loss, **stats(client)}
            rec["bytes_per_key"] = rec["bytes"] / max(rec["keys"], 1)
            if track is not None:
                rec.update(track.after_day(d))
            if d + 1 < len(days):
                rec["next_logloss"], rec["next_auc"] = evaluate(client, days[d + 1], args.test_rows)
            rec["seconds"] = time.time() - t0
            records.append(rec)
            log(f"{name} day {d}: keys {rec['keys']} bytes {rec['bytes']} rss {rec['rss'] >> 20} MiB "
                f"refused {rec['refused']} evicted {rec['evicted']} next auc {rec.get('next_auc', math.nan):.4f} "
                f"({rec['seconds']:.1f} s)")
        out: dict[str, Any] = {"name": name, "lifecycle": spec, "empty_rss": empty_rss, "days": records}
        if track is not None:
            out["replay"] = track.replay_check()
            out["small_delta"] = small_delta(client, args.changed, float(len(days) - 1))
            log(f"{name}: replay {out['replay']}; small delta {out['small_delta']}")
    return out


class Tracker:
    """The daily deltas of a table: the first full export (the base), each day's delta
    since the day before, and a full export each day (to compare sizes and, at the end,
    to check base + deltas == full)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.token: str | None = None
        self.state: tuple[np.ndarray, np.ndarray] | None = None
        self.full: tuple[np.ndarray, np.ndarray] | None = None
        self.rebased = 0  # deltas that came back as a full export

    def after_day(self, day: int) -> dict[str, Any]:
        c = self.client
        delta = c.export_delta(TABLE, since=self.token)
        self.token = delta.token
        if delta.base or self.state is None:
            self.rebased += int(day > 0 and delta.base)
            self.state = (delta.keys, delta.values)
        else:
            self.state = apply_delta(self.state[0], self.state[1], delta.keys, delta.values, delta.deleted)
        full = c.export_delta(TABLE, since=None)
        self.full = (full.keys, full.values)
        rec = {"delta_keys": int(delta.keys.size), "delta_deleted": int(delta.deleted.size),
               "delta_base": bool(delta.base),
               "delta_bytes": npz_bytes(keys=delta.keys, values=delta.values, deleted=delta.deleted),
               "full_keys": int(full.keys.size), "full_bytes": npz_bytes(keys=full.keys, values=full.values)}
        rec["delta_ratio"] = rec["delta_bytes"] / max(rec["full_bytes"], 1)
        return rec

    def replay_check(self) -> dict[str, Any]:
        assert self.state is not None and self.full is not None
        ak, av = ordered(*self.state)
        fk, fv = ordered(*self.full)
        same_keys = ak.shape == fk.shape and bool(np.array_equal(ak, fk))
        same_values = same_keys and av.shape == fv.shape and av.tobytes() == fv.tobytes()
        return {"ok": bool(same_values), "keys_equal": same_keys, "values_bit_equal": same_values,
                "replayed_keys": int(ak.size), "full_keys": int(fk.size), "rebased": self.rebased}


def small_delta(client: Any, fraction: float, now: float) -> dict[str, Any]:
    """Change ``fraction`` of the keys (a push at the same time: no sweep), then compare the
    bytes of the delta since just before with a full export's."""
    full = client.export_delta(TABLE, since=None)
    if full.keys.size == 0:
        return {"changed": 0, "delta_bytes": 0, "full_bytes": 0, "ratio": math.nan}
    rng = np.random.default_rng(1)
    pick = np.sort(rng.choice(full.keys, max(1, int(fraction * full.keys.size)), replace=False))
    client.set_time(now)
    grads = rng.normal(0, 0.1, (pick.size, MODEL.dim)).astype(np.float32)
    client.push(TABLE, pick, grads, distinct=True).result()
    delta = client.export_delta(TABLE, since=full.token)
    full_bytes = npz_bytes(keys=full.keys, values=full.values)
    delta_bytes = npz_bytes(keys=delta.keys, values=delta.values, deleted=delta.deleted)
    return {"changed": int(pick.size), "delta_keys": int(delta.keys.size), "delta_deleted": int(delta.deleted.size),
            "delta_base": bool(delta.base), "delta_bytes": delta_bytes, "full_bytes": full_bytes,
            "ratio": delta_bytes / full_bytes}


# ---- report -------------------------------------------------------------------------------
def fmt_num(v: Any, digits: int = 4) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def table(run: dict[str, Any]) -> str:
    head = ["day", "keys", "table MiB", "B/key", "RSS MiB", "next logloss", "next AUC", "refused", "evicted",
            "delta keys", "deleted", "delta KiB", "full KiB", "delta/full"]
    lines = [f"### {run['name']} (lifecycle: {run['lifecycle'] or 'none'}; empty cluster RSS "
             f"{run['empty_rss'] / 2**20:.1f} MiB)", "", "| " + " | ".join(head) + " |",
             "|" + "---|" * len(head)]
    for r in run["days"]:
        cells = [r["day"], r["keys"], r["bytes"] / 2**20, r["bytes_per_key"], r["rss"] / 2**20,
                 r.get("next_logloss"), r.get("next_auc"), r["refused"], r["evicted"], r.get("delta_keys"),
                 r.get("delta_deleted"), r["delta_bytes"] / 1024 if "delta_bytes" in r else None,
                 r["full_bytes"] / 1024 if "full_bytes" in r else None, r.get("delta_ratio")]
        lines.append("| " + " | ".join(fmt_num(c, 1 if i in (2, 3, 4, 11, 12) else 4)
                                        for i, c in enumerate(cells)) + " |")
    if "replay" in run:
        rp, sd = run["replay"], run["small_delta"]
        lines += ["", f"replay (first full export + {len(run['days']) - 1} deltas == final full export): "
                      f"{'OK' if rp['ok'] else 'MISMATCH'} ({rp})",
                  f"delta after {sd['changed']:,} keys changed: {sd['delta_bytes']:,} B vs full "
                  f"{sd['full_bytes']:,} B = {100 * sd['ratio']:.2f} %"]
    return "\n".join(lines)


def mean_auc(run: dict[str, Any]) -> float:
    return float(np.mean([r["next_auc"] for r in run["days"] if "next_auc" in r]))


def last_auc(run: dict[str, Any]) -> float:
    return [r["next_auc"] for r in run["days"] if "next_auc" in r][-1]


def keys_of(run: dict[str, Any]) -> list[int]:
    return [r["keys"] for r in run["days"]]


def goals(runs: dict[str, dict[str, Any]], args: argparse.Namespace) -> list[tuple[bool, str]]:
    out: list[tuple[bool, str]] = []
    none = runs.get("none")
    if none and "after2" in runs:
        a = runs["after2"]
        frac = keys_of(a)[-1] / max(keys_of(none)[-1], 1)
        peak = max(x / max(y, 1) for x, y in zip(keys_of(a), keys_of(none)))
        d_auc = mean_auc(a) - mean_auc(none)
        out.append((peak <= 0.40 and d_auc >= -0.002,
                    f"(1) admit=after:2 keeps {100 * frac:.1f} % of none's keys on the last day (at most "
                    f"{100 * peak:.1f} % on any day; goal <= 40 %); mean next-day AUC {mean_auc(a):.4f} vs none "
                    f"{mean_auc(none):.4f} (diff {d_auc:+.4f}; goal >= -0.002)"))
    if none and "cap" in runs:
        out.append(cap_goal(runs["cap"], none))
    if none and "ttl" in runs:
        out.append(ttl_goal(runs["ttl"], none, args))
    smalls = {n: r["small_delta"] for n, r in runs.items() if "small_delta" in r}
    if smalls:
        worst = max(smalls, key=lambda n: smalls[n]["ratio"])
        ratios = ", ".join(f"{n} {100 * s['ratio']:.2f} %" for n, s in smalls.items())
        out.append((smalls[worst]["ratio"] <= 0.02,
                    f"(4) delta after {100 * args.changed:g} % of keys changed / full export (np.savez bytes): "
                    f"{ratios}; worst {worst} {smalls[worst]['delta_bytes']:,} B / {smalls[worst]['full_bytes']:,} "
                    f"B (goal <= 2 %)"))
    replays = {n: r["replay"]["ok"] for n, r in runs.items() if "replay" in r}
    if replays:
        out.append((all(replays.values()), "(check) base + daily deltas == final full export, bit-identical: "
                    + ", ".join(f"{n} {'OK' if ok else 'MISMATCH'}" for n, ok in replays.items())))
    return out


def cap_goal(cap: dict[str, Any], none: dict[str, Any]) -> tuple[bool, str]:
    base = cap["empty_rss"]
    worst = max((r["rss"] / (r["bytes"] + base) - 1 for r in cap["days"]), key=abs)
    per_day = ", ".join(f"{100 * (r['rss'] / (r['bytes'] + base) - 1):+.1f}" for r in cap["days"])
    d_auc = mean_auc(cap) - mean_auc(none)
    worst_day = min(r["next_auc"] - n["next_auc"] for r, n in zip(cap["days"], none["days"]) if "next_auc" in r)
    ok = abs(worst) <= 0.05 and abs(d_auc) <= 0.005 and abs(worst_day) <= 0.005
    return ok, (f"(2) cap ({cap['lifecycle']}): RSS vs table bytes + empty RSS ({base / 2**20:.1f} MiB) per day "
                f"[{per_day}] % (worst {100 * worst:+.1f} %; goal within 5 %); next-day AUC mean diff {d_auc:+.4f}, "
                f"worst day {worst_day:+.4f} (goal within 0.005); keys held {keys_of(cap)[-1]:,}")


def ttl_goal(ttl: dict[str, Any], none: dict[str, Any], args: argparse.Namespace) -> tuple[bool, str]:
    keys = keys_of(ttl)
    settle = min(int(math.ceil(args.ttl)) + 1, len(keys) - 1)
    early = (keys[settle] - keys[0]) / max(settle, 1)
    late_days = list(range(settle + 1, len(keys)))
    late = float(np.mean([keys[d] - keys[d - 1] for d in late_days])) if late_days else math.nan
    d_auc = last_auc(ttl) - last_auc(none)
    ok = bool(late_days) and late <= 0.1 * early and d_auc >= -0.001
    return ok, (f"(3) ttl ({ttl['lifecycle']}): keys per day {keys}; growth/day days 1-{settle} {early:,.0f}, "
                f"days {settle + 1}-{len(keys) - 1} {late:,.0f} (goal <= 10 % of early); last next-day AUC "
                f"{last_auc(ttl):.4f} vs none {last_auc(none):.4f} (diff {d_auc:+.4f}; goal >= -0.001)")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.time()
    with tempfile.TemporaryDirectory(prefix="lifebench-") as tmp:
        days = load_days(args.data or tmp, args)
    stream_keys, per_day = distinct_keys(days)
    log(f"distinct keys: stream {stream_keys:,}, per day {per_day}")
    runs = {name: run_config(name, spec, days, args) for name, spec in configs(args, stream_keys).items()}
    checks = goals(runs, args)
    print(f"# Key lifecycle on drifting data: {args.days} days x {args.rows:,} rows, batch {args.batch}, "
          f"{args.servers} servers, LR/FTRL; test = first {args.test_rows:,} rows of day d+1\n")
    print(f"distinct keys over the stream: {stream_keys:,}; per day: {per_day}\n")
    for run in runs.values():
        print(table(run) + "\n")
    print("## Goals\n")
    for ok, line in checks:
        print(f"- {'PASS' if ok else 'FAIL'} {line}")
    wall = time.time() - start
    print(f"\nwall time {wall:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "stream_keys": stream_keys, "per_day_keys": per_day, "runs": runs,
                       "goals": [{"pass": ok, "text": t} for ok, t in checks], "wall_s": wall}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
