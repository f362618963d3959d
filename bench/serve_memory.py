"""Peak memory of ``paramserver serve --model`` answering large ``/predict`` bodies.

    PYTHONPATH=src python bench/serve_memory.py --mb 250 --clients 1 -- --max-rows 2000000

writes a Criteo LR model (2 000 synthetic rows' keys, rows by key: 2^24) and a body of
``--mb`` MB of its unlabelled rows, repeated, under ``--dir``; starts ``serve --model``
(with the flags after ``--``); posts the body (``--json``: as JSON) from ``--clients`` clients at once; and prints
the serving process's RSS before and its peak (``VmHWM`` of ``/proc/PID/status``) after.
Run it with ``PYTHONPATH`` on another checkout's ``src`` to measure that one.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request


def _model(folder: str) -> tuple[str, bytes]:
    import numpy as np

    from paramserver.apps.ctr.modelfile import save_model
    from paramserver.apps.ctr.models import Model
    from paramserver.apps.ctr.synth import write_synth
    from paramserver.data.reader import DataFormat
    from paramserver.serving.rows import text_batch
    from paramserver.tables.spec import TableSpec

    os.makedirs(folder, exist_ok=True)
    path, url = f"{folder}/rows.tsv", f"{folder}/model"
    if not os.path.exists(path):
        write_synth(path, 2000, seed=1)
    with open(path, "rb") as f:
        rows = b"".join(line.split(b"\t", 1)[1] for line in f)
    if not os.path.exists(url):
        m, fmt = Model("lr"), DataFormat("criteo")
        keys = np.unique(text_batch(rows, fmt).keys)
        values = np.random.default_rng(0).normal(0, 0.1, (keys.size, 1)).astype(np.float32)
        save_model(url, m, fmt, TableSpec(m.table, m.dim, initializer=m.initializer(), seed=7), keys, values)
    return url, rows


def _memory_mb(pid: int, key: str) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith(key))


def _post(port: int, body: bytes, out: list[tuple[int, float]], kind: str) -> None:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/predict", data=body, headers={"Content-Type": kind})
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=600) as r:
            r.read()
            out.append((r.status, time.monotonic() - t0))
    except urllib.error.HTTPError as exc:
        out.append((exc.code, time.monotonic() - t0))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=int, default=250, help="the body's size, in MB")
    p.add_argument("--clients", type=int, default=1, help="clients posting it at once")
    p.add_argument("--json", action="store_true", help="the rows as JSON {\"rows\": [line, ...]}")
    p.add_argument("--dir", default="/tmp/paramserver-serve-memory", help="where the model and rows are kept")
    p.add_argument("serve", nargs=argparse.REMAINDER, help="-- then flags for serve")
    args = p.parse_args()
    url, rows = _model(args.dir)
    body = rows * max(1, args.mb * 1_000_000 // len(rows))
    if args.json:
        import json

        body = json.dumps({"rows": body.decode().splitlines()}).encode()
    kind = "application/json" if args.json else "text/plain"
    print(f"body: {len(body) / 1e6:.1f} MB{' of JSON' if args.json else ''}, {args.clients} client(s)")
    proc = subprocess.Popen([sys.executable, "-m", "paramserver", "serve", "--model", url, "--port", "0",
                             *[a for a in args.serve if a != "--"]], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline().split()[2].rsplit(":", 1)[1])
        idle = _memory_mb(proc.pid, "VmRSS")
        out: list[tuple[int, float]] = []
        clients = [threading.Thread(target=_post, args=(port, body, out, kind)) for _ in range(args.clients)]
        for c in clients:
            c.start()
        for c in clients:
            c.join()
        peak = _memory_mb(proc.pid, "VmHWM")
        print(f"answers (status, seconds): {[(s, round(t, 2)) for s, t in out]}")
        print(f"RSS idle {idle:.0f} MB, peak {peak:.0f} MB: {peak - idle:.0f} MB over idle, "
              f"{(peak - idle) / (len(body) / 2**20):.2f} x the body")
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main()
