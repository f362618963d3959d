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
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from paramserver.apps.ctr.drift import day_path, write_day
from paramserver.apps.ctr.models import auc, logloss

PS = [sys.executable, "-m", "paramserver"]
SECTIONS = ("stream", "fresh", "latency", "recovery")
RULE = '''import paramserver


@paramserver.rule(state_width=1)
def count(value, state, grad, hp):
    state[0] += grad[0]  # the weight stays 0: p = 0.5, a label-0 example's gradient 0.5
'''


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


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


# ---- processes ----------------------------------------------------------------------------
class Procs:
    """Every process this script starts, each in its own session; ``stop_all`` in finally."""

    def __init__(self, logs: str) -> None:
        self.procs: list[subprocess.Popen] = []
        self.logs = logs  # each process's stderr goes to a file here (a pipe nobody reads could fill)
        os.makedirs(logs, exist_ok=True)

    def start(self, argv: list[str], env: dict[str, str] | None = None, **kw: Any) -> subprocess.Popen:
        kw.setdefault("stdout", subprocess.DEVNULL)
        name = os.path.basename(argv[0]) if argv[0] != sys.executable else argv[3]
        path = os.path.join(self.logs, f"{len(self.procs):03d}-{name}.log")
        with open(path, "wb") as err:
            proc = subprocess.Popen(argv, env=env, start_new_session=True, stderr=err, **kw)
        proc.log_path = path  # type: ignore[attr-defined]
        self.procs.append(proc)
        return proc

    @staticmethod
    def stop(proc: subprocess.Popen, grace: float = 15.0) -> None:
        """SIGTERM to its process group, a bounded wait, then SIGKILL of the group."""
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # what is left of its group (nodes it forked)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        if proc.stdout is not None:
            with contextlib.suppress(Exception):
                proc.stdout.close()

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            with contextlib.suppress(Exception):
                self.stop(proc, grace=10.0)
        self.procs.clear()


def wait_for(cond: Callable[[], Any], timeout: float, what: str, every: float = 0.02,
             proc: subprocess.Popen | None = None) -> Any:
    """Poll ``cond()`` until true (bounded); fail early if ``proc`` exits."""
    deadline = time.monotonic() + timeout
    while not (value := cond()):
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the process exited ({proc.returncode}) while waiting for {what}: "
                               f"{_tail(proc)}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)
    return value


def _tail(proc: subprocess.Popen) -> str:
    """The end of a process's stderr (its log file)."""
    with contextlib.suppress(Exception), open(proc.log_path, "rb") as f:  # type: ignore[attr-defined]
        return f.read()[-3000:].decode(errors="replace")
    return ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env_with(*paths: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}


def finish(proc: subprocess.Popen, timeout: float, what: str) -> None:
    """Wait for a command that ends on its own; its stderr's tail if it failed."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        Procs.stop(proc)
        raise TimeoutError(f"{what} did not finish in {timeout:g} s") from None
    if proc.returncode:
        raise RuntimeError(f"{what} failed ({proc.returncode}): {_tail(proc)}")


@contextlib.contextmanager
def redis_server(tmp: str, procs: Procs) -> Iterator[tuple[str, Any]]:
    import redis

    port = free_port()
    folder = os.path.join(tmp, "redis")
    os.makedirs(folder, exist_ok=True)
    proc = procs.start(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                        "no", "--dir", folder])
    client = redis.Redis(port=port)

    def up() -> bool:
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False

    try:
        wait_for(up, 20, "redis-server to answer", proc=proc)
        log(f"redis-server on port {port}")
        yield f"redis://127.0.0.1:{port}", client
    finally:
        client.close()
        procs.stop(proc)


def read_lines(path: str) -> list[bytes]:
    with open(path, "rb") as f:
        return f.read().splitlines()


def feed(client: Any, stream: str, lines: list[bytes], chunk: int = 2000) -> float:
    """XADD every line (field ``line``), pipelined; seconds taken."""
    t0 = time.perf_counter()
    pipe = client.pipeline(transaction=False)
    for i in range(0, len(lines), chunk):
        for row in lines[i:i + chunk]:
            pipe.xadd(stream, {"line": row})
        pipe.execute()
    return time.perf_counter() - t0


def read_report(path: str) -> dict[str, Any]:
    with open(path) as f:
        return json.load(f)


def median(xs: list[float]) -> float:
    return float(np.median(xs)) if xs else math.nan


def fmt(v: Any, digits: int = 4) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def md_table(head: list[str], rows: list[list[Any]], digits: list[int] | None = None) -> str:
    digits = digits or [4] * len(head)
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(fmt(c, d) for c, d in zip(r, digits)) + " |" for r in rows]
    return "\n".join(out)


# ---- 1. stream vs file ----------------------------------------------------------------------
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


# ---- 2. freshness ---------------------------------------------------------------------------
def labels_of(lines: list[bytes]) -> np.ndarray:
    return np.fromiter((ln[:1] == b"1" for ln in lines), np.float64, len(lines))


def http_ready(port: int) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", "/readyz")
        ok = conn.getresponse().status == 200
        conn.close()
        return ok
    except OSError:
        return False


def metrics_value(port: int, name: str) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", "/metrics")
    body = conn.getresponse().read().decode()
    conn.close()
    m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", body, re.M)
    return float(m.group(1)) if m else math.nan


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


def fresh_run(args: argparse.Namespace, tmp: str, url: str, client: Any, procs: Procs, sync_s: float,
              hours: list[str], snapshot_hour0: bool) -> dict[str, Any]:
    """One training job publishing every ``sync_s`` (real-time seconds, compressed), its
    model followed by ``serve``; every row scored by the served model as it arrives."""
    from paramserver import load_model

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
    scored: list[dict[str, Any]] = []
    all_y: list[np.ndarray] = []  # every scored row's label and served probability, in arrival order
    all_p: list[np.ndarray] = []
    try:
        wait_for(lambda: serve.poll() is None and _listening(port), 60, "serve to listen", proc=serve)
        scorer = Scorer(port)
        pipe = client.pipeline(transaction=False)
        tick = 0.05
        t_start = time.monotonic()
        unscored = 0
        for h, path in enumerate(hours):
            lines = read_lines(path)
            labels = labels_of(lines)
            ys, ps, ages = [], [], []
            sent = 0
            h0 = t_start + h * T
            if h == 1 and snapshot_hour0:  # the model published by the end of hour 0: "never synced"
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
            while sent < len(lines):
                if train.poll() is not None:
                    raise RuntimeError(f"train (sync {sync_s:g} s) exited early ({train.returncode}): {_tail(train)}")
                now = time.monotonic()
                due = min(len(lines), int(len(lines) * (now - h0) / T) + 1)
                if due > sent:
                    chunk = lines[sent:due]
                    got = scorer.score(b"\n".join(chunk) + b"\n")
                    if got is None:
                        unscored += len(chunk)
                    else:
                        ps.append(got[0])
                        ys.append(labels[sent:due])
                        ages.append(np.full(len(chunk), got[1]))
                    for row in chunk:
                        pipe.xadd(stream, {"line": row})
                    pipe.execute()
                    sent = due
                time.sleep(max(0.0, min(tick, h0 + T * sent / len(lines) - time.monotonic())))
            y = np.concatenate(ys) if ys else np.zeros(0)
            p = np.concatenate(ps) if ps else np.zeros(0)
            age = np.concatenate(ages) if ages else np.zeros(0)
            rec = {"hour": h, "rows": len(lines), "scored": int(y.size),
                   "auc": auc(y, p) if y.size and 0 < y.sum() < y.size else math.nan,
                   "logloss": logloss(y, p) if y.size else math.nan,
                   "model_age_s_mean": float(age.mean()) if age.size else math.nan}
            scored.append(rec)
            all_y.append(y)
            all_p.append(p)
            log(f"[fresh] sync {sync_s:g} s hour {h}: scored {rec['scored']:,}/{len(lines):,} rows, served AUC "
                f"{rec['auc']:.4f}, served model age {rec['model_age_s_mean']:.2f} s (compressed)")
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
    pub_stats = r.get("publish", {})
    parts = int(pub_stats.get("bases", 0)) + int(pub_stats.get("deltas", 0))
    achieved = r["seconds"] / parts if parts else math.nan
    evaluated = [s for s in scored if s["hour"] >= 1]
    # the trainer's last-examples window, and the served model on the same last rows: like for like
    window = r.get("progressive", {}).get("window_examples", {})
    w = int(window.get("examples", 0))
    y_all, p_all = np.concatenate(all_y), np.concatenate(all_p)
    y_w, p_w = y_all[-w:] if w else y_all[:0], p_all[-w:] if w else p_all[:0]
    served_window = auc(y_w, p_w) if y_w.size and 0 < y_w.sum() < y_w.size else math.nan
    out = {"sync_s": sync_s, "publish_every": every, "serve_poll": poll, "hours": scored,
           "served_auc_mean": float(np.mean([s["auc"] for s in evaluated])),
           "served_logloss_mean": float(np.mean([s["logloss"] for s in evaluated])),
           "served_age_real_s": float(np.mean([s["model_age_s_mean"] for s in evaluated])) / scale,
           "progressive": r.get("progressive", {}), "examples": r["examples"], "seconds": r["seconds"],
           "parts_published": parts, "achieved_every_s": achieved, "achieved_every_real_s": achieved / scale,
           "unscored_rows": unscored, "window_rows": int(y_w.size), "served_window_auc": served_window,
           "progressive_window_auc": float(window.get("auc", math.nan)),
           # like for like only when the window's rows were all scored (it does not reach back
           # into the first rows, which arrived before anything was published)
           "window_like_for_like": 0 < w <= y_all.size}
    if snapshot_hour0:
        out["m0"] = m0
    return out


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


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
    for sync_s in (10.0, 60.0, 600.0):
        run = fresh_run(args, tmp, url, client, procs, sync_s, hours, snapshot_hour0=(sync_s == 10.0))
        m0 = run.pop("m0", None)
        if m0 is not None:
            if "model" not in m0:
                raise RuntimeError(f"no model published by the end of hour 0: {m0.get('error')}")
            model = m0["model"]
            per = []
            for h in range(1, args.hours):
                y = labels_of(read_lines(hours[h]))
                p = model.predict_proba(hours[h])
                per.append({"hour": h, "rows": int(y.size), "scored": int(y.size), "auc": auc(y, p),
                            "logloss": logloss(y, p)})
            never = {"sync_s": math.inf, "hours": per, "served_auc_mean": float(np.mean([x["auc"] for x in per])),
                     "served_logloss_mean": float(np.mean([x["logloss"] for x in per]))}
        runs.append(run)
        log(f"[fresh] sync {sync_s:g} s: served AUC (hours 1..) {run['served_auc_mean']:.4f}, trainer progressive "
            f"AUC {run['progressive'].get('all', {}).get('auc', math.nan):.4f}; published every "
            f"{run['achieved_every_s']:.2f} s (asked {run['publish_every']:.3f} s)")
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
    ten = runs[0]
    prog10 = ten["progressive_window_auc"]
    gap = prog10 - ten["served_window_auc"]
    lift = ten["served_auc_mean"] - never["served_auc_mean"]
    wins = sum(a["auc"] > b["auc"] for a, b in zip(ten["hours"][1:], never["hours"]))
    text = (f"## 2. Freshness ({args.hours} hours x {args.hour_rows:,} drift rows; an hour arrives in {T:g} s, time "
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
    unlike = "" if ten["window_like_for_like"] else (" (NOT like for like: the window reaches back before the "
                                                     "first publication; raise --hour-rows)")
    like = bool(ten["window_like_for_like"])
    all_auc = ten["progressive"].get("all", {}).get("auc", math.nan)
    goals = [(gap <= 0.002 and like, f"(2a) 10 s sync: served AUC {ten['served_window_auc']:.4f} vs the trainer's "
                            f"progressive AUC {prog10:.4f} on the last {ten['window_rows']:,} rows: served - "
                            f"progressive = {-gap:+.4f}{unlike} (goal >= -0.002; achieved sync "
                            f"{ten['achieved_every_real_s']:.0f} s real-time; over hours 1.. served "
                            f"{ten['served_auc_mean']:.4f}, progressive all hours {all_auc:.4f})"),
             (lift >= 0.001, f"(2b) 10 s sync served AUC {ten['served_auc_mean']:.4f} vs never-synced "
                             f"{never['served_auc_mean']:.4f}: {lift:+.4f} (goal >= +0.001); higher in {wins} of "
                             f"{len(never['hours'])} hours")]
    return {"text": text, "goals": goals, "runs": runs, "never": never, "hour_seconds": T}


# ---- 3. serving latency ---------------------------------------------------------------------
LUA = """local f = io.open("{body}", "rb")
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "text/plain"
{delay}
function done(summary, latency, requests)
  io.write(string.format("BENCH {{\\"p50\\": %d, \\"p99\\": %d, \\"p999\\": %d, \\"max\\": %d, \\"mean\\": %f, "
    .. "\\"requests\\": %d, \\"duration_us\\": %d, \\"non2xx\\": %d, \\"errors\\": %d}}\\n",
    latency:percentile(50), latency:percentile(99), latency:percentile(99.9), latency.max, latency.mean,
    summary.requests, summary.duration, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
end
"""


def lua_script(tmp: str, name: str, body: bytes, delay_ms: float | None) -> str:
    body_path = os.path.join(tmp, f"{name}.body")
    with open(body_path, "wb") as f:
        f.write(body)
    path = os.path.join(tmp, f"{name}.lua")
    # wrk's delay() is whole milliseconds: 3 or 4 at random, 3.5 ms on average (with -c4 and
    # ~0.5 ms a request: about 1,000 req/s)
    delay = "function delay()\n  if math.random() < 0.5 then return 3 end\n  return 4\nend" if delay_ms else ""
    with open(path, "w") as f:
        f.write(LUA.format(body=body_path, delay=delay))
    return path


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}


def _ms(text: str) -> float:
    m = re.match(r"([0-9.]+)(us|ms|s|m)$", text)
    return float(m.group(1)) * _UNITS[m.group(2)] if m else math.nan


def run_wrk(procs: Procs, port: int, script: str, conns: int, seconds: float, rows: int) -> dict[str, Any]:
    proc = procs.start(["wrk", "-t1", f"-c{conns}", f"-d{max(1, round(seconds))}s", "--latency", "--timeout", "5s",
                        "-s", script, f"http://127.0.0.1:{port}/predict"], stdout=subprocess.PIPE)
    try:
        out, _ = proc.communicate(timeout=seconds + 60)
    finally:
        procs.stop(proc)
    text, err = out.decode(errors="replace"), _tail(proc)
    m = re.search(r"^BENCH (\{.*\})$", text, re.M)
    if proc.returncode or not m:
        raise RuntimeError(f"wrk failed ({proc.returncode}): {text[-2000:]} {err}")
    done = json.loads(m.group(1))
    dist = dict(re.findall(r"^\s+(50|75|90|99)%\s+(\S+)$", text, re.M))
    secs = done["duration_us"] / 1e6
    return {"conns": conns, "rows_per_request": rows, "p50_ms": _ms(dist.get("50", "")),
            "p99_ms": _ms(dist.get("99", "")), "p999_ms": done["p999"] / 1e3, "max_ms": done["max"] / 1e3,
            "mean_ms": done["mean"] / 1e3, "requests": done["requests"], "req_per_s": done["requests"] / secs,
            "rows_per_s": done["requests"] * rows / secs, "non2xx": done["non2xx"], "errors": done["errors"],
            "seconds": secs}


class RateFeeder(threading.Thread):
    """XADDs ``lines`` round and round at ``rate`` rows/s until stopped (the busy runs' stream)."""

    def __init__(self, client: Any, stream: str, lines: list[bytes], rate: float, limit: int | None = None) -> None:
        super().__init__(daemon=True, name="bench-feeder")
        self.client, self.stream, self.lines, self.rate, self.limit = client, stream, lines, rate, limit
        self.halt = threading.Event()
        self.sent = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            pipe = self.client.pipeline(transaction=False)
            t0 = time.monotonic()
            while not self.halt.is_set():
                due = int(self.rate * (time.monotonic() - t0))
                n = min(due - self.sent, 5000)
                if self.limit is not None:
                    n = min(n, self.limit - self.sent)
                    if n <= 0 and self.sent >= self.limit:
                        return
                for k in range(n):
                    pipe.xadd(self.stream, {"line": self.lines[(self.sent + k) % len(self.lines)]})
                if n > 0:
                    pipe.execute()
                    self.sent += n
                self.halt.wait(0.02)
        except BaseException as exc:  # noqa: BLE001 -- reported by the section
            self.error = exc


def section_latency(args: argparse.Namespace, tmp: str, url: str, client: Any, procs: Procs) -> dict[str, Any]:
    folder = os.path.join(tmp, "latency")
    os.makedirs(folder, exist_ok=True)
    base_path = os.path.join(folder, "base.tsv")
    more_path = os.path.join(folder, "more.tsv")
    write_day(base_path, args.latency_rows, 0, args.seed)
    write_day(more_path, max(100_000, args.latency_rows // 4), 1, args.seed)
    base = read_lines(base_path)
    fed_s = feed(client, "lat", base)
    log(f"[latency] XADDed {len(base):,} rows in {fed_s:.1f} s; training the served model")
    pub, ckpt = os.path.join(tmp, "pub-lat"), os.path.join(tmp, "ckpt-lat")
    common = ["--stream", f"{url}/lat", "--publish", pub, "--publish-every", "1", "--checkpoint-dir", ckpt, "--quiet"]
    first = procs.start(PS + ["train", *common, "--max-examples", str(len(base)),
                              "--metrics-out", os.path.join(folder, "r0.json")])
    finish(first, 1800, "train (the served model)")
    trained = read_report(os.path.join(folder, "r0.json"))
    more = read_lines(more_path)
    one = more[0] + b"\n"
    thousand = b"\n".join(more[1:1001]) + b"\n"
    scripts = {"single paced": (lua_script(folder, "one-paced", one, 3.5), 4, 1),
               "single unpaced": (lua_script(folder, "one", one, None), 8, 1),
               "1000 rows unpaced": (lua_script(folder, "thousand", thousand, None), 4, 1000)}
    port = free_port()
    serve = procs.start(PS + ["serve", "--follow", pub, "--port", str(port)])
    results: dict[str, dict[str, Any]] = {}
    feeder: RateFeeder | None = None
    busy: subprocess.Popen | None = None
    try:
        wait_for(lambda: http_ready(port), 120, "serve --follow to load the model", every=0.05, proc=serve)
        log(f"[latency] serve --follow ready on port {port} ({trained.get('keys', '?')} keys)")
        for name, (script, conns, rows) in scripts.items():
            r = run_wrk(procs, port, script, conns, args.wrk_seconds, rows)
            results[f"idle / {name}"] = r
            log(f"[latency] idle {name}: {r['req_per_s']:,.0f} req/s p50 {r['p50_ms']:.2f} p99 {r['p99_ms']:.2f} "
                f"p99.9 {r['p999_ms']:.2f} max {r['max_ms']:.2f} ms")
        feeder = RateFeeder(client, "lat", more, args.busy_rate)
        feeder.start()
        busy = procs.start(PS + ["train", *common, "--resume", ckpt,
                                 "--metrics-out", os.path.join(folder, "r1.json")])
        swaps0 = metrics_value(port, "paramserver_serve_deltas_applied_total")
        bases0 = metrics_value(port, "paramserver_serve_bases_loaded_total")
        # the busy job is up and publishing once serve swaps in something new
        wait_for(lambda: metrics_value(port, "paramserver_serve_deltas_applied_total") > swaps0
                 or metrics_value(port, "paramserver_serve_bases_loaded_total") > bases0, 180,
                 "the busy training job's first publication to be swapped in", every=0.1, proc=busy)
        for name, (script, conns, rows) in scripts.items():
            before = metrics_value(port, "paramserver_serve_deltas_applied_total")
            bases_before = metrics_value(port, "paramserver_serve_bases_loaded_total")
            r = run_wrk(procs, port, script, conns, args.wrk_seconds, rows)
            r["deltas_swapped"] = int(metrics_value(port, "paramserver_serve_deltas_applied_total") - before)
            r["bases_loaded"] = int(metrics_value(port, "paramserver_serve_bases_loaded_total") - bases_before)
            results[f"training / {name}"] = r
            log(f"[latency] training {name}: {r['req_per_s']:,.0f} req/s p50 {r['p50_ms']:.2f} p99 "
                f"{r['p99_ms']:.2f} p99.9 {r['p999_ms']:.2f} max {r['max_ms']:.2f} ms; {r['deltas_swapped']} "
                f"deltas swapped in")
        if feeder.error is not None:
            raise RuntimeError(f"the busy feeder failed: {feeder.error!r}")
        fed_busy = feeder.sent
        feeder.halt.set()
        feeder.join(30)
        procs.stop(busy, grace=120)  # SIGTERM: closes the stream gracefully
        busy_report = read_report(os.path.join(folder, "r1.json")) if os.path.exists(
            os.path.join(folder, "r1.json")) else {}
        client.delete("lat")
    finally:
        if feeder is not None:
            feeder.halt.set()
            feeder.join(30)
        if busy is not None:
            procs.stop(busy)
        procs.stop(serve)
    table_rows = [[k, r["conns"], r["rows_per_request"], r["req_per_s"], r["rows_per_s"], r["p50_ms"], r["p99_ms"],
             r["p999_ms"], r["max_ms"], r["non2xx"] + r["errors"], r.get("deltas_swapped", "-")]
            for k, r in results.items()]
    text = (f"## 3. Serving latency (serve --follow, a model trained on {args.latency_rows:,} drift rows; wrk -t1, "
            f"{args.wrk_seconds:g} s a run; 'training': train --stream --resume --publish-every 1 on "
            f"{args.busy_rate:,.0f} rows/s XADDed, {fed_busy:,} rows, "
            f"{busy_report.get('examples', '?')} examples trained over both jobs, publishing to the followed "
            "folder)\n\n"
            + md_table(["run", "conns", "rows/request", "req/s", "rows/s", "p50 ms", "p99 ms", "p99.9 ms", "max ms",
                        "errors", "deltas swapped in during it"], table_rows, [0, 0, 0, 0, 0, 2, 2, 2, 2, 0, 0]))
    paced = results["idle / single paced"]
    thousand_idle = results["idle / 1000 rows unpaced"]
    swap_runs = [results["training / single paced"], results["training / 1000 rows unpaced"]]
    swap_max = max(r["max_ms"] for r in swap_runs)
    swapped = sum(r["deltas_swapped"] for r in swap_runs)
    goals = [(paced["p99_ms"] <= 5.0 and paced["non2xx"] + paced["errors"] == 0,
              f"(3a) idle single-row p99 {paced['p99_ms']:.2f} ms at {paced['req_per_s']:,.0f} req/s (goal <= 5 ms at "
              f"~1,000 req/s)"),
             (thousand_idle["rows_per_s"] >= 500_000,
              f"(3b) idle 1,000-row requests: {thousand_idle['rows_per_s']:,.0f} rows/s (goal >= 500,000)"),
             (swap_max <= 50.0 and swapped > 0,
              f"(3c) while deltas are swapped in (training runs): max latency {swap_max:.1f} ms (paced single-row "
              f"{swap_runs[0]['max_ms']:.1f} ms, 1,000-row unpaced {swap_runs[1]['max_ms']:.1f} ms) with {swapped} "
              f"deltas swapped in (goal <= 50 ms, and at least one swap)")]
    return {"text": text, "goals": goals, "runs": results, "trained": {k: trained.get(k) for k in
                                                                      ("examples", "examples_per_s", "keys")},
            "busy_fed_rows": fed_busy, "busy_report": {k: busy_report.get(k) for k in ("examples", "publish")}}


# ---- 4. recovery ----------------------------------------------------------------------------
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


def section_recovery(args: argparse.Namespace, tmp: str, url: str, client: Any, procs: Procs) -> dict[str, Any]:
    n = args.recovery_rows
    mod_dir = os.path.join(tmp, "rules")
    os.makedirs(mod_dir, exist_ok=True)
    with open(os.path.join(mod_dir, "bench_count_rule.py"), "w") as f:
        f.write(RULE)
    feeder = RateFeeder(client, "rec", [f"0 {i + 1}:1".encode() for i in range(n)], args.recovery_rate, limit=n)
    log(f"[recovery] XADDing {n:,} rows at {args.recovery_rate:,.0f} rows/s while the job runs")
    ckpt = os.path.join(tmp, "ckpt-rec")
    report = os.path.join(tmp, "rec.json")
    argv = PS + ["train", "--stream", f"{url}/rec", "--format", "libsvm", "--label-format", "01", "--hash-bits", "64",
                 "--optimizer", "bench_count_rule:count", "--checkpoint-dir", ckpt, "--checkpoint-seconds", "1",
                 "--max-examples", str(n), "--quiet", "--metrics-out", report]
    env = env_with(mod_dir)
    rng = random.Random(args.seed)
    kills: list[dict[str, Any]] = []
    pending: dict[str, Any] | None = None  # the last kill, its recovery not yet measured
    finished_early = False
    proc: subprocess.Popen | None = None
    feeder.start()
    try:
        for k in range(args.kills + 1):
            resume = ["--resume", ckpt] if checkpoint_examples(ckpt)[0] else []
            step0, ex0 = checkpoint_examples(ckpt)
            calls0 = xrange_calls(client)
            proc = procs.start(argv + resume, env=env)
            first_read, first_ckpt = _first_progress(proc, client, ckpt, calls0, step0, ex0)
            if pending is not None:
                pending["to_first_read_s"] = first_read - pending["at"] if first_read else math.nan
                pending["to_first_checkpoint_s"] = first_ckpt - pending["at"] if first_ckpt else math.nan
                pending.pop("at")
                kills.append(pending)
                log(f"[recovery] kill {len(kills)}: resumed, first read after {pending['to_first_read_s']:.2f} s, "
                    f"first new checkpoint after {pending['to_first_checkpoint_s']:.2f} s")
                pending = None
            if proc.poll() is not None:
                if proc.returncode == 0:
                    finished_early = k < args.kills
                    break
                raise RuntimeError(f"train (recovery) failed ({proc.returncode}): {_tail(proc)}")
            if k == args.kills:
                break
            if first_ckpt is None:
                raise TimeoutError("the recovery job made no progress in 300 s")
            try:
                proc.wait(timeout=rng.uniform(0.0, 2.0))
            except subprocess.TimeoutExpired:
                before = checkpoint_examples(ckpt)[1]
                os.killpg(proc.pid, signal.SIGKILL)
                pending = {"at": time.monotonic(), "checkpointed_examples": before}
                proc.wait(timeout=30)
                procs.stop(proc)
                continue
            if proc.returncode == 0:
                finished_early = True
                break
            raise RuntimeError(f"train (recovery) failed ({proc.returncode}): {_tail(proc)}")
        if proc is not None and proc.poll() is None:
            finish(proc, 1800, "train (recovery, the last run)")
        elif proc is not None and proc.returncode:
            raise RuntimeError(f"train (recovery) failed ({proc.returncode})")
        if feeder.error is not None:
            raise RuntimeError(f"the feeder failed: {feeder.error!r}")
    finally:
        feeder.halt.set()
        feeder.join(30)
        if proc is not None:
            procs.stop(proc)
    r = read_report(report)
    bias, ids, lost, doubled, extra_ids = _counted(ckpt, n)
    group: dict[str, Any] = next((g for g in client.xinfo_groups("rec")), {})
    client.delete("rec")
    rec_read = [x["to_first_read_s"] for x in kills if not math.isnan(x["to_first_read_s"])]
    rec_ckpt = [x["to_first_checkpoint_s"] for x in kills if not math.isnan(x["to_first_checkpoint_s"])]
    rows_t = [[i + 1, x["checkpointed_examples"], x["to_first_read_s"], x["to_first_checkpoint_s"]]
              for i, x in enumerate(kills)]
    text = (f"## 4. Recovery ({n:,} rows '0 i:1' XADDed at {args.recovery_rate:,.0f} rows/s, {len(kills)} SIGKILLs "
            f"of the whole job, each once it made progress + U(0, 2) s; --checkpoint-seconds 1, --resume)\n\n"
            "Recovery: from the SIGKILL to (a) the resumed job's first read of the stream (the first XRANGE in "
            "Redis' INFO commandstats, polled every 10 ms), (b) its first checkpoint with more examples than the "
            "one it resumed from (polled every 20 ms; includes up to the 1 s checkpoint period).\n\n"
            + md_table(["kill", "examples checkpointed at the kill", "to first read s", "to first new checkpoint s"],
                       rows_t, [0, 0, 2, 2])
            + f"\n\nrecovery to first read: median {median(rec_read):.2f} s, max "
            f"{max(rec_read, default=math.nan):.2f} s; to first new checkpoint: median {median(rec_ckpt):.2f} s, "
            f"max {max(rec_ckpt, default=math.nan):.2f} s\n"
            f"final: report examples {r['examples']:,}; bias key counted {bias:,}; ids counted once "
            f"{int(np.sum(ids == 1)):,}, lost {lost:,}, doubled {doubled:,}; consumer group lag "
            f"{group.get('lag')}, pending {group.get('pending')}")
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


# ---- main -----------------------------------------------------------------------------------
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
