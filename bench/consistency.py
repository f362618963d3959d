"""Statistical against hardware performance of BSP, SSP(1), SSP(3) and ASP, with a straggler.

Run: ``.venv/bin/python bench/consistency.py [--rows 1000000] [--out bench/out]``  (needs ``.[bench]``)

Logistic regression (FTRL, batch 1000 on synthetic data, 100 on a9a), 1 server and
``--workers`` workers, worker 0 slowed 2x (it sleeps as long as each of its batches took),
``--pipeline 1`` so that the only staleness is the one the consistency model allows.
Quality is the progressive log loss (each batch is scored before its update, so it is a
held-out estimate), averaged over a window of batches from all workers, against wall time
and against clock.  Writes ``consistency.png`` and prints a table: seconds and clocks to
reach the target log loss (the smoothed loss that every mode reaches, + 0.001), final test
log loss, pulls parked and time parked.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from paramserver.apps.ctr.models import Model
from paramserver.apps.ctr.synth import write_synth
from paramserver.apps.ctr.train import TrainConfig, run_training
from paramserver.data.reader import DataFormat

MODES = ["bsp", "ssp:1", "ssp:3", "asp"]
DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def curve(traces: dict, window: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(seconds, clock, moving-average loss) over every worker's batches in time order."""
    rows = sorted(t for trace in traces.values() for t in trace)
    secs = np.array([r[0] for r in rows])
    clocks = np.array([r[1] for r in rows])
    n = np.array([r[2] for r in rows], np.float64)
    loss = np.array([r[3] for r in rows])
    k = np.ones(window)
    avg = np.convolve(loss, k, "full")[: len(loss)] / np.convolve(n, k, "full")[: len(n)]
    return secs, clocks, avg


def by_clock(per_batch: list) -> tuple[np.ndarray, np.ndarray]:
    """Mean log loss of all workers' batches at each clock, smoothed over 3 clocks."""
    clocks = np.array([c for c, _, _ in per_batch])
    ratio = np.array([loss / n for _, n, loss in per_batch])
    xs = np.unique(clocks)
    ys = np.array([ratio[clocks == c].mean() for c in xs])
    return xs, np.convolve(ys, np.ones(3) / 3, "same") if ys.size >= 3 else ys


def run(name: str, train: list[str], test: list[str], fmt: DataFormat, batch: int, workers: int,
        shard_bytes: int, window: int) -> tuple[list[dict], float]:
    """Train once per mode; the target is the loss every mode's smoothed curve reaches."""
    rows = []
    for mode in MODES:
        cfg = TrainConfig(Model("lr"), fmt, batch_size=batch, pipeline=1, consistency=mode,
                          slow_rank=0, slow_factor=2.0)
        report = run_training(cfg, train, test, servers=1, workers=workers, shard_bytes=shard_bytes)
        secs, clocks, avg = curve(report["traces"], window)
        rows.append({"data": name, "mode": mode, "seconds": report["seconds"], "test_logloss": report["logloss"],
                     "parked_pulls": report["consistency"]["parked_pulls"],
                     "parked_seconds": report["consistency"]["parked_seconds"],
                     "curve": (secs.tolist(), clocks.tolist(), avg.tolist()),
                     "per_batch": [(t[1], t[2], t[3]) for trace in report["traces"].values() for t in trace]})
        print(f"  {name} {mode}: {report['seconds']:.2f} s, test logloss {report['logloss']:.4f}", file=sys.stderr)
    target = max(min(r["curve"][2][window:] or r["curve"][2]) for r in rows) + 0.001
    for r in rows:
        secs, clocks, avg = (np.asarray(x) for x in r["curve"])
        hit = np.flatnonzero(avg[window:] <= target) + window  # after the window has filled
        r["target"] = target
        r["seconds_to_target"] = float(secs[hit[0]]) if hit.size else None
        xs, ys = by_clock(r["per_batch"])
        reached = np.flatnonzero(ys <= target)
        r["clock_to_target"] = int(xs[reached[0]]) if reached.size else None
    return rows, target


def plot(rows: list[dict], path: str, targets: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted({r["data"] for r in rows})
    fig, axes = plt.subplots(len(names), 2, figsize=(12, 4.2 * len(names)), squeeze=False)
    for i, name in enumerate(names):
        for r in (r for r in rows if r["data"] == name):
            secs, clocks, avg = r["curve"]
            axes[i][0].plot(secs, avg, label=r["mode"])
            axes[i][1].plot(*by_clock(r["per_batch"]), label=r["mode"])
        for j, xlabel in enumerate(("wall time (s)", "clock (mean over the workers' batches at it)")):
            ax = axes[i][j]
            ax.axhline(targets[name], color="grey", linestyle=":", linewidth=1)
            ax.set_xlabel(xlabel)
            ax.set_ylabel("progressive log loss")
            ax.set_title(f"{name}: worker 0 slowed 2x")
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--out", default="bench/out")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rows, targets = [], {}
    a9a = DATA / "libsvm" / "a9a.libsvm.gz"
    with tempfile.TemporaryDirectory(prefix="paramserver-consistency-") as tmp:
        if a9a.exists():  # uncompressed in a temporary folder, so that it splits into shards
            plain = os.path.join(tmp, "a9a.libsvm")
            with gzip.open(a9a) as src, open(plain, "wb") as dst:
                dst.write(src.read())
            got, targets["a9a"] = run("a9a", [plain], [str(DATA / "libsvm" / "a9a.t.libsvm.gz")],
                                      DataFormat("libsvm", label_format="pm1"), 100, args.workers, 128 << 10, 20)
            rows += got
        else:
            print(f"skipping a9a: {a9a} not found", file=sys.stderr)
        train, test = os.path.join(tmp, "train.tsv"), os.path.join(tmp, "test.tsv")
        write_synth(train, args.rows, seed=1)
        write_synth(test, max(1000, args.rows // 20), seed=2)
        got, targets["synthetic"] = run("synthetic", [train], [test], DataFormat("criteo", hash_bits=24), 1000,
                                        args.workers, 8 << 20, 30)
        rows += got
    png = os.path.join(args.out, "consistency.png")
    plot(rows, png, targets)
    table = [{k: v for k, v in r.items() if k not in ("curve", "per_batch")} for r in rows]
    if args.json:
        print(json.dumps(table, indent=1))
        return
    print(f"plot: {png}")
    print(f"{'data':<10} {'mode':<6} {'seconds':>8} {'target':>7} {'s to target':>12} {'clock to target':>16} "
          f"{'test logloss':>13} {'parked':>7} {'parked s':>9}")
    for r in table:
        s2t = f"{r['seconds_to_target']:.2f}" if r["seconds_to_target"] is not None else "never"
        c2t = str(r["clock_to_target"]) if r["clock_to_target"] is not None else "never"
        print(f"{r['data']:<10} {r['mode']:<6} {r['seconds']:>8.2f} {r['target']:>7.4f} {s2t:>12} {c2t:>16} "
              f"{r['test_logloss']:>13.4f} {r['parked_pulls']:>7} {r['parked_seconds']:>9.2f}")


if __name__ == "__main__":
    main()
