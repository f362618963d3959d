"""Ray as the launcher against the local one, on this machine, in one run.

Run: ``.venv/bin/python bench/launchers.py [--rows 1000000] [--repeat 3] [--json]`` (needs the
``ray`` extra and, for a9a, ``../shared/data``).

This process starts a Ray (``ray.init``, every CPU), which the commands below join by its
address, so ``--cluster ray:ADDRESS`` runs on a Ray that is already up, as on a real
cluster (``ray start`` beforehand).  Three measurements, the launchers taking turns
``--repeat`` times so that a slow spell of the VM hits both:

* **start-up**: ``LocalCluster`` / ``RayCluster`` with 2 servers and 2 workers, in a fresh
  interpreter: from its imports to every worker registered, and the ``stop`` after it;
* **training**: ``paramserver train --data TRAIN --test TEST --servers 2 --workers 2
  --replicas 2 --cluster local|ray:ADDRESS`` as a subprocess (the hidden check's command):
  the job's examples/s, the whole command's wall time, the test log loss; on a9a
  (LIBSVM) and on ``--rows`` rows of the heavy-tailed Criteo shape (``paramserver synth
  --shape heavy``, a tenth as many test rows);
* **failover**: the heavy training with one server killed once a quarter of the shards
  are done (``LocalCluster.kill`` sends SIGKILL; ``RayCluster.kill`` is ``ray.kill`` of
  its actor): the longest stall of a worker between two batches, and the log loss.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import ray

from paramserver import Client
from paramserver.apps.ctr.synth import write_synth

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "libsvm"


STARTUP = """
import json, sys, time
t0 = time.perf_counter()
if sys.argv[1] == "local":
    from paramserver import LocalCluster as Cluster
    kw = {}
else:
    from paramserver.ray import RayCluster as Cluster
    kw = {"address": sys.argv[1]}
cluster = Cluster(servers=2, workers=2, log_level="WARNING", **kw)
cluster.start()
ready = time.perf_counter()
cluster.stop()
print(json.dumps({"start_s": ready - t0, "stop_s": time.perf_counter() - ready}))
"""


def startup(address: str) -> dict:
    """A fresh interpreter (as a user's script): imports, joining Ray, every node started
    and registered; then the stop."""
    done = subprocess.run([sys.executable, "-c", STARTUP, address], capture_output=True, text=True, timeout=300)
    if done.returncode:
        raise SystemExit(f"start-up on {address} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def train(where: str, flags: list[str], tmp: str) -> dict:
    report = os.path.join(tmp, "report.json")
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "paramserver", "train", "--quiet", "--servers", "2", "--workers",
                           "2", "--replicas", "2", "--cluster", where, "--metrics-out", report, *flags],
                          capture_output=True, text=True, timeout=900)
    if done.returncode:
        raise SystemExit(f"train --cluster {where} failed:\n{done.stderr}")
    r = json.loads(Path(report).read_text())
    return {"examples_per_s": r["examples_per_s"], "command_s": time.perf_counter() - t0, "logloss": r["logloss"]}


def failover(where: str, train_path: str, test_path: str) -> dict:
    from paramserver.apps.ctr.models import Model
    from paramserver.apps.ctr.train import TrainConfig, run_training
    from paramserver.data.reader import DataFormat

    killed: dict = {}

    def kill_a_quarter_in(cluster) -> None:
        def watch() -> None:
            with Client(cluster.address) as watcher:
                while (s := watcher.job.status())["shards_done"] < max(1, s["shards"] // 4):
                    time.sleep(0.01)
                killed["at"] = time.perf_counter()
                cluster.kill("server-1")

        threading.Thread(target=watch, daemon=True).start()

    cfg = TrainConfig(Model("lr"), DataFormat("criteo"), replicas=2)
    report = run_training(cfg, [train_path], [test_path], servers=2, workers=2, shard_bytes=4 << 20,
                          setup=kill_a_quarter_in, cluster_options={"cluster": where, "log_level": "WARNING"})
    return {"stalled_s": report.get("stalled_s", 0.0), "failovers": len(report.get("failovers", [])),
            "logloss": report["logloss"], "examples": report["examples"]}


def median(runs: list[dict]) -> dict:
    return {k: float(np.median([r[k] for r in runs])) for k in runs[0]} | {"runs": runs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    ray.init(address="local", include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    address = ray.get_runtime_context().gcs_address
    launchers = {"local": "local", "ray": f"ray:{address}"}
    results: dict = {}
    try:
        with tempfile.TemporaryDirectory(prefix="paramserver-bench-") as tmp:
            heavy, heavy_test = os.path.join(tmp, "heavy.tsv"), os.path.join(tmp, "heavy.test.tsv")
            write_synth(heavy, args.rows, seed=1, shape="heavy")
            write_synth(heavy_test, max(1, args.rows // 10), seed=2, shape="heavy")
            sets = {"heavy": ["--data", heavy, "--test", heavy_test]}
            if (DATA / "a9a.libsvm.gz").exists():
                a9a = os.path.join(tmp, "a9a.libsvm")
                with gzip.open(DATA / "a9a.libsvm.gz", "rb") as src, open(a9a, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                sets["a9a"] = ["--format", "libsvm", "--data", a9a, "--test", str(DATA / "a9a.t.libsvm.gz")]
            else:
                print(f"a9a skipped: {DATA} is absent", file=sys.stderr)
            runs: dict = {}
            for _ in range(args.repeat):
                for name, where in launchers.items():
                    runs.setdefault(("startup", name), []).append(startup(address if name == "ray" else "local"))
                    for data, flags in sets.items():
                        runs.setdefault((data, name), []).append(train(where, flags, tmp))
                    runs.setdefault(("failover", name), []).append(failover(name, heavy, heavy_test))
                    print(name, {k[0]: v[-1] for k, v in runs.items() if k[1] == name}, file=sys.stderr)
            results = {f"{what} {name}": median(r) for (what, name), r in runs.items()}
    finally:
        ray.shutdown()
    if args.json:
        print(json.dumps(results, indent=1))
        return
    for key, r in results.items():
        print(f"{key:<16}", "  ".join(f"{k} {v:,.4g}" for k, v in r.items() if k != "runs"))


if __name__ == "__main__":
    main()
