"""Section 2 of ``bench/online.py``, freshness: hours of drift rows arrive in compressed real
time; each chunk is scored by the model ``serve --follow`` serves at that moment, then
XADDed for ``train --stream --publish`` to learn from; for syncs of 10, 60 and 600 s and for
never (hour 0's model), the served AUC per hour (the module docstring of ``online.py`` says
how, and the goals).
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import threading
import time
from typing import Any

import numpy as np

from bench_harness.markdown import md_table
from bench_harness.procs import PS, Procs, finish, free_port, listening, log, tail, wait_for
from online_redis import read_lines, read_report
from paramserver.apps.ctr.drift import day_path, write_day
from paramserver.apps.ctr.models import auc, logloss

SYNCS = (10.0, 60.0, 600.0)


def labels_of(lines: list[bytes]) -> np.ndarray:
    return np.fromiter((ln[:1] == b"1" for ln in lines), np.float64, len(lines))


class Scorer:
    """POSTs rows to ``serve``'s /predict over one kept-alive connection."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def score(self, body: bytes) -> tuple[np.ndarray, float] | None:
        """Probabilities and the model's age (None: no model yet)."""
        self.conn.request("POST", "/predict", body=body, headers={"Content-Type": "text/plain"})
        resp = self.conn.getresponse()
        data = resp.read()
        if resp.status == 503:
            return None
        if resp.status != 200:
            raise RuntimeError(f"/predict answered {resp.status}: {data[:300]!r}")
        doc = json.loads(data)
        return np.asarray(doc["probabilities"], np.float64), float(doc["model_age_s"])

    def close(self) -> None:
        self.conn.close()


class Served:
    """What the served model scored, hour by hour: each hour's record, and every scored
    row's label and probability in arrival order."""

    def __init__(self) -> None:
        self.hours: list[dict[str, Any]] = []
        self.y: list[np.ndarray] = []
        self.p: list[np.ndarray] = []
        self.unscored = 0

    def add_hour(self, h: int, rows: int, ys: list[np.ndarray], ps: list[np.ndarray], ages: list[np.ndarray],
                 sync_s: float) -> None:
        y = np.concatenate(ys) if ys else np.zeros(0)
        p = np.concatenate(ps) if ps else np.zeros(0)
        age = np.concatenate(ages) if ages else np.zeros(0)
        rec = {"hour": h, "rows": rows, "scored": int(y.size),
               "auc": auc(y, p) if y.size and 0 < y.sum() < y.size else math.nan,
               "logloss": logloss(y, p) if y.size else math.nan,
               "model_age_s_mean": float(age.mean()) if age.size else math.nan}
        self.hours.append(rec)
        self.y.append(y)
        self.p.append(p)
        log(f"[fresh] sync {sync_s:g} s hour {h}: scored {rec['scored']:,}/{rows:,} rows, served AUC "
            f"{rec['auc']:.4f}, served model age {rec['model_age_s_mean']:.2f} s (compressed)")


def _snapshot_hour0(pub: str, m0: dict[str, Any]) -> threading.Thread:
    """A thread taking the model published by the end of hour 0 ("never synced") into ``m0``."""
    from paramserver import load_model

    def take() -> None:
        for _ in range(20):  # a new base can replace the chain while it is read: again
            try:
                m0["model"] = load_model(pub)
                return
            except Exception as exc:  # noqa: BLE001 -- reported below
                m0["error"] = repr(exc)
                time.sleep(0.05)

    loader = threading.Thread(target=take, daemon=True)
    loader.start()
    return loader


def _arrive(lines: list[bytes], labels: np.ndarray, h0: float, T: float, scorer: Scorer, pipe: Any, stream: str,
            train: Any, sync_s: float, served: Served) -> tuple[list, list, list]:
    """One hour's rows arriving at a steady pace over ``T`` s from ``h0``: each chunk scored,
    then XADDed.  The scored chunks' labels, probabilities and model ages."""
    ys: list[np.ndarray] = []
    ps: list[np.ndarray] = []
    ages: list[np.ndarray] = []
    sent = 0
    tick = 0.05
    while sent < len(lines):
        if train.poll() is not None:
            raise RuntimeError(f"train (sync {sync_s:g} s) exited early ({train.returncode}): {tail(train)}")
        now = time.monotonic()
        due = min(len(lines), int(len(lines) * (now - h0) / T) + 1)
        if due > sent:
            chunk = lines[sent:due]
            got = scorer.score(b"\n".join(chunk) + b"\n")
            if got is None:
                served.unscored += len(chunk)
            else:
                ps.append(got[0])
                ys.append(labels[sent:due])
                ages.append(np.full(len(chunk), got[1]))
            for row in chunk:
                pipe.xadd(stream, {"line": row})
            pipe.execute()
            sent = due
        time.sleep(max(0.0, min(tick, h0 + T * sent / len(lines) - time.monotonic())))
    return ys, ps, ages


def fresh_run(args: argparse.Namespace, tmp: str, url: str, client: Any, procs: Procs, sync_s: float,
              hours: list[str], snapshot_hour0: bool) -> dict[str, Any]:
    """One training job publishing every ``sync_s`` (real-time seconds, compressed), its
    model followed by ``serve``; every row scored by the served model as it arrives."""
    T = args.hour_seconds
    scale = T / 3600.0
    every, poll = sync_s * scale, max(0.01, 1.0 * scale)
    stream = f"fresh{int(sync_s)}"
    pub = os.path.join(tmp, f"pub-{int(sync_s)}")
    report = os.path.join(tmp, f"fresh-{int(sync_s)}.json")
    total = args.hour_rows * len(hours)
    port = free_port()
    serve = procs.start(PS + ["serve", "--follow", pub, "--port", str(port), "--poll", f"{poll:g}"])
    train = procs.start(PS + ["train", "--stream", f"{url}/{stream}", "--max-examples", str(total), "--publish", pub,
                              "--publish-every", f"{every:g}", "--quiet", "--metrics-out", report])
    scorer: Scorer | None = None
    m0: dict[str, Any] = {}
    loader: threading.Thread | None = None
    served = Served()
    try:
        wait_for(lambda: serve.poll() is None and listening(port), 60, "serve to listen", proc=serve)
        scorer = Scorer(port)
        pipe = client.pipeline(transaction=False)
        t_start = time.monotonic()
        for h, path in enumerate(hours):
            lines = read_lines(path)
            labels = labels_of(lines)
            if h == 1 and snapshot_hour0:  # the model published by the end of hour 0: "never synced"
                loader = _snapshot_hour0(pub, m0)
            ys, ps, ages = _arrive(lines, labels, t_start + h * T, T, scorer, pipe, stream, train, sync_s, served)
            served.add_hour(h, len(lines), ys, ps, ages, sync_s)
        finish(train, 600, f"train (sync {sync_s:g} s)")
        r = read_report(report)
        client.delete(stream)  # its memory back
    finally:
        if scorer is not None:
            scorer.close()
        procs.stop(serve)
        procs.stop(train)
        if loader is not None:
            loader.join(120)
    out = _summary(r, served, sync_s, every, poll, scale)
    if snapshot_hour0:
        out["m0"] = m0
    return out


def _summary(r: dict[str, Any], served: Served, sync_s: float, every: float, poll: float,
             scale: float) -> dict[str, Any]:
    """One run's numbers: the served model's over hours 1.., the trainer's, and both on the
    trainer's last window of examples (like for like)."""
    pub_stats = r.get("publish", {})
    parts = int(pub_stats.get("bases", 0)) + int(pub_stats.get("deltas", 0))
    achieved = r["seconds"] / parts if parts else math.nan
    evaluated = [s for s in served.hours if s["hour"] >= 1]
    # the trainer's last-examples window, and the served model on the same last rows: like for like
    window = r.get("progressive", {}).get("window_examples", {})
    w = int(window.get("examples", 0))
    y_all, p_all = np.concatenate(served.y), np.concatenate(served.p)
    y_w, p_w = y_all[-w:] if w else y_all[:0], p_all[-w:] if w else p_all[:0]
    served_window = auc(y_w, p_w) if y_w.size and 0 < y_w.sum() < y_w.size else math.nan
    return {"sync_s": sync_s, "publish_every": every, "serve_poll": poll, "hours": served.hours,
            "served_auc_mean": float(np.mean([s["auc"] for s in evaluated])),
            "served_logloss_mean": float(np.mean([s["logloss"] for s in evaluated])),
            "served_age_real_s": float(np.mean([s["model_age_s_mean"] for s in evaluated])) / scale,
            "progressive": r.get("progressive", {}), "examples": r["examples"], "seconds": r["seconds"],
            "parts_published": parts, "achieved_every_s": achieved, "achieved_every_real_s": achieved / scale,
            "unscored_rows": served.unscored, "window_rows": int(y_w.size), "served_window_auc": served_window,
            "progressive_window_auc": float(window.get("auc", math.nan)),
            # like for like only when the window's rows were all scored (it does not reach back
            # into the first rows, which arrived before anything was published)
            "window_like_for_like": 0 < w <= y_all.size}


def _never_synced(m0: dict[str, Any], hours: list[str]) -> dict[str, Any]:
    """Hour 0's model (the 10 s run's, taken at the end of hour 0) scoring hours 1.."""
    if "model" not in m0:
        raise RuntimeError(f"no model published by the end of hour 0: {m0.get('error')}")
    model = m0["model"]
    per = []
    for h in range(1, len(hours)):
        y = labels_of(read_lines(hours[h]))
        p = model.predict_proba(hours[h])
        per.append({"hour": h, "rows": int(y.size), "scored": int(y.size), "auc": auc(y, p),
                    "logloss": logloss(y, p)})
    return {"sync_s": math.inf, "hours": per, "served_auc_mean": float(np.mean([x["auc"] for x in per])),
            "served_logloss_mean": float(np.mean([x["logloss"] for x in per]))}


def section_fresh(args: argparse.Namespace, tmp: str, url: str, client: Any, procs: Procs) -> dict[str, Any]:
    folder = os.path.join(tmp, "hours")
    os.makedirs(folder, exist_ok=True)
    t0 = time.time()
    hours = []
    for h in range(args.hours):
        write_day(day_path(folder, h), args.hour_rows, h, args.seed)
        hours.append(day_path(folder, h))
    T = args.hour_seconds
    log(f"[fresh] wrote {args.hours} hours x {args.hour_rows:,} rows in {time.time() - t0:.1f} s; an hour arrives in "
        f"{T:g} s (time compressed x{3600 / T:,.0f})")
    runs = []
    never: dict[str, Any] = {}
    for sync_s in SYNCS:
        run = fresh_run(args, tmp, url, client, procs, sync_s, hours, snapshot_hour0=(sync_s == 10.0))
        m0 = run.pop("m0", None)
        if m0 is not None:
            never = _never_synced(m0, hours)
        runs.append(run)
        log(f"[fresh] sync {sync_s:g} s: served AUC (hours 1..) {run['served_auc_mean']:.4f}, trainer progressive "
            f"AUC {run['progressive'].get('all', {}).get('auc', math.nan):.4f}; published every "
            f"{run['achieved_every_s']:.2f} s (asked {run['publish_every']:.3f} s)")
    return {"text": _text(args, runs, never), "goals": _goals(runs[0], never), "runs": runs, "never": never,
            "hour_seconds": T}


def _text(args: argparse.Namespace, runs: list[dict[str, Any]], never: dict[str, Any]) -> str:
    T = args.hour_seconds
    rows = []
    for r in runs:
        prog = r["progressive"].get("all", {})
        rows.append([f"{r['sync_s']:g} s", f"{r['publish_every']:.3f} / {r['achieved_every_s']:.2f}",
                     r["achieved_every_real_s"], r["served_age_real_s"], r["served_auc_mean"],
                     r["served_logloss_mean"], prog.get("auc", math.nan), prog.get("logloss", math.nan),
                     r["window_rows"], r["served_window_auc"], r["progressive_window_auc"],
                     " ".join(f"{h['auc']:.4f}" for h in r["hours"][1:]), r["unscored_rows"]])
    rows.append(["never (hour 0's model)", "-", math.inf, "-", never["served_auc_mean"], never["served_logloss_mean"],
                 "-", "-", "-", "-", "-", " ".join(f"{h['auc']:.4f}" for h in never["hours"]), 0])
    return (f"## 2. Freshness ({args.hours} hours x {args.hour_rows:,} drift rows; an hour arrives in {T:g} s, time "
            f"compressed x{3600 / T:,.0f}: a sync of S s is --publish-every S*{T:g}/3600, serve --poll "
            f"{max(0.01, T / 3600):.3f} s)\n\n"
            "Every row is POSTed to serve --follow as it arrives (scored by the model served then), then XADDed. "
            "Served AUC: mean over hours 1..; progressive: the trainer's report, all hours (hour 0's cold start "
            "included), each example scored before its update. Last window: the report's progressive "
            "window_examples (the last examples trained, at least 100,000) and the served model's AUC on the same "
            "number of last rows: the like-for-like comparison goal (2a) uses. The training loop checks "
            "--publish-every every 0.5 s, so short intervals are floored: 'achieved' is run seconds / parts "
            "published.\n\n"
            + md_table(["sync", "publish-every asked / achieved (s)", "achieved, real-time s",
                        "served model age, real-time s", "served AUC", "served logloss", "progressive AUC",
                        "progressive logloss", "last-window rows", "served AUC, last window",
                        "progressive AUC, last window", "served AUC per hour 1..", "rows not scored (no model yet)"],
                       rows, [0, 0, 0, 0, 4, 4, 4, 4, 0, 4, 4, 0, 0]))


def _goals(ten: dict[str, Any], never: dict[str, Any]) -> list[tuple[bool, str]]:
    """(2a) the 10 s sync's served model against the trainer, (2b) against never synced."""
    prog10 = ten["progressive_window_auc"]
    gap = prog10 - ten["served_window_auc"]
    lift = ten["served_auc_mean"] - never["served_auc_mean"]
    wins = sum(a["auc"] > b["auc"] for a, b in zip(ten["hours"][1:], never["hours"]))
    unlike = "" if ten["window_like_for_like"] else (" (NOT like for like: the window reaches back before the "
                                                     "first publication; raise --hour-rows)")
    like = bool(ten["window_like_for_like"])
    all_auc = ten["progressive"].get("all", {}).get("auc", math.nan)
    return [(gap <= 0.002 and like, f"(2a) 10 s sync: served AUC {ten['served_window_auc']:.4f} vs the trainer's "
                            f"progressive AUC {prog10:.4f} on the last {ten['window_rows']:,} rows: served - "
                            f"progressive = {-gap:+.4f}{unlike} (goal >= -0.002; achieved sync "
                            f"{ten['achieved_every_real_s']:.0f} s real-time; over hours 1.. served "
                            f"{ten['served_auc_mean']:.4f}, progressive all hours {all_auc:.4f})"),
            (lift >= 0.001, f"(2b) 10 s sync served AUC {ten['served_auc_mean']:.4f} vs never-synced "
                            f"{never['served_auc_mean']:.4f}: {lift:+.4f} (goal >= +0.001); higher in {wins} of "
                            f"{len(never['hours'])} hours")]
