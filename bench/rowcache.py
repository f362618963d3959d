"""The worker's row cache against the same job without it (issue 46.5), in one run.

    .venv/bin/python bench/rowcache.py [--rows 1000000] [--caches off s=3 s=10 s=100]
        [--models lr fm] [--workers 1 2] [--datasets heavy criteo a9a] [--repeat N] [--json FILE]

Each run is ``paramserver train`` at default flags but ``--row-cache`` (``--k 16`` for FM),
1 server, read from its ``--metrics-out`` report: server key-operations per example (the
keys its pulls and pushes sent, over its examples), test log loss, examples/s, bytes sent
per example and the cache's hit rate and lags.  Each row is against the run without the
cache of the same data, model and workers.  Data: ``paramserver synth --shape heavy``
(``--rows`` to train, a tenth to test, written once to a temporary folder), the Criteo sample
and a9a from ``../shared/data`` (skipped, said, where absent).  A bare ``s=N`` takes the
default rows (``client/row_cache.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

SHARED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data")
GOAL_FEWER, GOAL_LOSS = 3.0, 0.001  # issue 46: >= 3x fewer key-operations an example, log loss within +0.001


def datasets(names: list[str], rows: int, folder: str) -> dict[str, tuple[list[str], list[str]]]:
    """Each data set's train files, then its test files and format flags, or a note where absent."""
    out: dict[str, tuple[list[str], list[str]]] = {}
    if "heavy" in names:
        train, test = os.path.join(folder, "heavy.tsv"), os.path.join(folder, "heavy_test.tsv")
        if not os.path.exists(train):
            from paramserver.apps.ctr.synth import write_synth

            write_synth(train, rows, seed=1, shape="heavy")
            write_synth(test, max(1, rows // 10), seed=2, shape="heavy")
        out["heavy"] = (["--data", train], ["--test", test])
    criteo = os.path.join(SHARED, "criteo")
    if "criteo" in names and os.path.isdir(criteo):
        out["criteo"] = (["--data", os.path.join(criteo, "criteo_kaggle_wideresdnn_train.tsv.gz")],
                         ["--test", os.path.join(criteo, "criteo_kaggle_wideresdnn_dev.tsv.gz"),
                          os.path.join(criteo, "criteo_kaggle_wideresdnn_test.tsv.gz")])
    a9a = os.path.join(SHARED, "libsvm", "a9a.libsvm.gz")
    if "a9a" in names and os.path.exists(a9a):
        out["a9a"] = (["--data", a9a, "--format", "libsvm", "--label-format", "pm1"],
                      ["--test", os.path.join(SHARED, "libsvm", "a9a.t.libsvm.gz")])
    for name in set(names) - set(out):
        print(f"{name}: not run (its data is not under {os.path.abspath(SHARED)})", file=sys.stderr)
    return out


def run(data: tuple[list[str], list[str]], model: str, workers: int, cache: str, folder: str) -> dict[str, Any]:
    metrics = os.path.join(folder, "r.json")
    argv = [sys.executable, "-m", "paramserver", "train", *data[0], *data[1], "--model", model,
            "--workers", str(workers), "--row-cache", cache, "--quiet", "--metrics-out", metrics]
    if model == "fm":
        argv += ["--k", "16"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    if done.returncode:
        raise SystemExit(f"{' '.join(argv)}: {done.stderr[-2000:]}")
    with open(metrics) as f:
        report: dict[str, Any] = json.load(f)
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--caches", nargs="+", default=["off", "s=3", "s=10", "s=100"])
    ap.add_argument("--models", nargs="+", default=["lr", "fm"], choices=("lr", "fm"))
    ap.add_argument("--workers", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--datasets", nargs="+", default=["heavy", "criteo", "a9a"])
    ap.add_argument("--repeat", type=int, default=1, help="runs of each cell, taking turns (Δ loss: the means')")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    folder = tempfile.mkdtemp(prefix="psrowcache-")
    rows: list[dict[str, Any]] = []
    print("| data | model | workers | row cache | runs | key-ops/ex | fewer | test logloss | Δ loss (spread) | "
          "examples/s | sent B/ex | hit rate | lag p50/p99 | goal |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    caches = ["off", *[c for c in args.caches if c != "off"]]
    for name, data in datasets(args.datasets, args.rows, folder).items():
        for model in args.models:
            for workers in args.workers:
                runs: dict[str, list[dict[str, Any]]] = {c: [] for c in caches}
                for _ in range(max(1, args.repeat)):
                    for cache in caches:
                        runs[cache].append(run(data, model, workers, cache, folder))
                for cache in caches:
                    rows.append(_row(name, model, workers, cache, runs[cache], runs["off"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def _mean(runs: list[dict[str, Any]], key: str) -> float:
    return sum(float(r[key]) for r in runs) / len(runs)


def _row(name: str, model: str, workers: int, cache: str, runs: list[dict[str, Any]],
         base: list[dict[str, Any]]) -> dict[str, Any]:
    """One cell: its runs' means against the uncached runs' (``base``)."""
    c = runs[-1].get("row_cache") or {}
    fewer = _mean(base, "key_ops_per_example") / max(_mean(runs, "key_ops_per_example"), 1e-9)
    base_loss = _mean(base, "logloss")
    deltas = [r["logloss"] - base_loss for r in runs]
    delta = sum(deltas) / len(deltas)
    ok = "PASS" if fewer >= GOAL_FEWER and delta <= GOAL_LOSS else "FAIL" if cache != "off" else ""
    row = {"data": name, "model": model, "workers": workers, "cache": cache, "runs": len(runs),
           "key_ops": _mean(runs, "key_ops_per_example"), "fewer": fewer, "logloss": _mean(runs, "logloss"),
           "losses": [r["logloss"] for r in runs], "delta": delta, "examples_per_s": _mean(runs, "examples_per_s"),
           "sent_per_example": sum(r["bytes_sent"] / max(r["examples"], 1) for r in runs) / len(runs),
           "hit_rate": c.get("hit_rate"), "lag": (c.get("lag_p50"), c.get("lag_p99")), "goal": ok}
    hit = f"{c['hit_rate']:.3f}" if c else "—"
    lag = f"{c['lag_p50']}/{c['lag_p99']}" if c else "—"
    spread = f" ({min(deltas):+.5f}..{max(deltas):+.5f})" if len(runs) > 1 else ""
    print(f"| {name} | {model} | {workers} | {cache} | {len(runs)} | {row['key_ops']:.2f} | {fewer:.2f}x | "
          f"{row['logloss']:.5f} | {delta:+.5f}{spread} | {row['examples_per_s']:,.0f} | "
          f"{row['sent_per_example']:.1f} | {hit} | {lag} | {ok} |", flush=True)
    return row


if __name__ == "__main__":
    main()
