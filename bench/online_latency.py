"""Section 3 of ``bench/online.py``, serving latency: ``serve --follow`` of a trained model
under ``wrk`` (Lua scripts written to the run's folder), first with training idle, then
while a job trains on rows XADDed at a steady rate and ``serve`` swaps its deltas in (the
module docstring of ``online.py`` says how, and the goals).
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import re
import subprocess
from typing import Any

from bench_harness.markdown import md_table
from bench_harness.procs import PS, Procs, finish, free_port, log, tail, wait_for
from online_redis import RateFeeder, feed, read_lines, read_report
from paramserver.apps.ctr.drift import write_day

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
    text, err = out.decode(errors="replace"), tail(proc)
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

SWAPS, BASES = "paramserver_serve_deltas_applied_total", "paramserver_serve_bases_loaded_total"


def _served_model(args: argparse.Namespace, tmp: str, url: str, client: Any, procs: Procs
                  ) -> tuple[str, list[str], dict[str, Any], list[bytes], dict[str, tuple[str, int, int]]]:
    """The model ``serve`` follows, trained on ``--latency-rows`` XADDed rows; the training
    flags the busy job resumes with, the rows it is fed and the wrk runs' scripts."""
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
    return pub, common, trained, more, scripts


def _busy_runs(procs: Procs, port: int, scripts: dict[str, tuple[str, int, int]], seconds: float,
               results: dict[str, dict[str, Any]]) -> None:
    """Each wrk run again while the busy job's deltas are swapped in, the swaps counted."""
    for name, (script, conns, rows) in scripts.items():
        before = metrics_value(port, SWAPS)
        bases_before = metrics_value(port, BASES)
        r = run_wrk(procs, port, script, conns, seconds, rows)
        r["deltas_swapped"] = int(metrics_value(port, SWAPS) - before)
        r["bases_loaded"] = int(metrics_value(port, BASES) - bases_before)
        results[f"training / {name}"] = r
        log(f"[latency] training {name}: {r['req_per_s']:,.0f} req/s p50 {r['p50_ms']:.2f} p99 "
            f"{r['p99_ms']:.2f} p99.9 {r['p999_ms']:.2f} max {r['max_ms']:.2f} ms; {r['deltas_swapped']} "
            f"deltas swapped in")


def section_latency(args: argparse.Namespace, tmp: str, url: str, client: Any, procs: Procs) -> dict[str, Any]:
    folder = os.path.join(tmp, "latency")
    pub, common, trained, more, scripts = _served_model(args, tmp, url, client, procs)
    ckpt = common[common.index("--checkpoint-dir") + 1]
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
        swaps0, bases0 = metrics_value(port, SWAPS), metrics_value(port, BASES)
        # the busy job is up and publishing once serve swaps in something new
        wait_for(lambda: metrics_value(port, SWAPS) > swaps0 or metrics_value(port, BASES) > bases0, 180,
                 "the busy training job's first publication to be swapped in", every=0.1, proc=busy)
        _busy_runs(procs, port, scripts, args.wrk_seconds, results)
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
    return {"text": _text(args, results, fed_busy, busy_report), "goals": _goals(results), "runs": results,
            "trained": {k: trained.get(k) for k in ("examples", "examples_per_s", "keys")},
            "busy_fed_rows": fed_busy, "busy_report": {k: busy_report.get(k) for k in ("examples", "publish")}}


def _text(args: argparse.Namespace, results: dict[str, dict[str, Any]], fed_busy: int,
          busy_report: dict[str, Any]) -> str:
    table_rows = [[k, r["conns"], r["rows_per_request"], r["req_per_s"], r["rows_per_s"], r["p50_ms"], r["p99_ms"],
                   r["p999_ms"], r["max_ms"], r["non2xx"] + r["errors"], r.get("deltas_swapped", "-")]
                  for k, r in results.items()]
    return (f"## 3. Serving latency (serve --follow, a model trained on {args.latency_rows:,} drift rows; wrk -t1, "
            f"{args.wrk_seconds:g} s a run; 'training': train --stream --resume --publish-every 1 on "
            f"{args.busy_rate:,.0f} rows/s XADDed, {fed_busy:,} rows, "
            f"{busy_report.get('examples', '?')} examples trained over both jobs, publishing to the followed "
            "folder)\n\n"
            + md_table(["run", "conns", "rows/request", "req/s", "rows/s", "p50 ms", "p99 ms", "p99.9 ms", "max ms",
                        "errors", "deltas swapped in during it"], table_rows, [0, 0, 0, 0, 0, 2, 2, 2, 2, 0, 0]))


def _goals(results: dict[str, dict[str, Any]]) -> list[tuple[bool, str]]:
    paced = results["idle / single paced"]
    thousand_idle = results["idle / 1000 rows unpaced"]
    swap_runs = [results["training / single paced"], results["training / 1000 rows unpaced"]]
    swap_max = max(r["max_ms"] for r in swap_runs)
    swapped = sum(r["deltas_swapped"] for r in swap_runs)
    return [(paced["p99_ms"] <= 5.0 and paced["non2xx"] + paced["errors"] == 0,
             f"(3a) idle single-row p99 {paced['p99_ms']:.2f} ms at {paced['req_per_s']:,.0f} req/s (goal <= 5 ms at "
             f"~1,000 req/s)"),
            (thousand_idle["rows_per_s"] >= 500_000,
             f"(3b) idle 1,000-row requests: {thousand_idle['rows_per_s']:,.0f} rows/s (goal >= 500,000)"),
            (swap_max <= 50.0 and swapped > 0,
             f"(3c) while deltas are swapped in (training runs): max latency {swap_max:.1f} ms (paced single-row "
             f"{swap_runs[0]['max_ms']:.1f} ms, 1,000-row unpaced {swap_runs[1]['max_ms']:.1f} ms) with {swapped} "
             f"deltas swapped in (goal <= 50 ms, and at least one swap)")]
