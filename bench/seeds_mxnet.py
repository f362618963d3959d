#!/usr/bin/env python3
"""MXNet KVStore (dist_sync/dist_async) one-pass logistic regression baseline.

Usage: seeds_mxnet.py lr --train F --test F --num-features N --out OUT.npz
                        [--mode dist_sync|dist_async] [--workers W]
Launches its own scheduler/server/worker processes on 127.0.0.1 (DMLC_* env),
weights live on the server as a row_sparse (D,1) array, the optimizer (FTRL)
is set on the kvstore; workers row_sparse_pull the rows a batch touches and
push row_sparse gradients. Needs mxnet 1.9.1 with numpy<1.24, in a venv of its own (`make seeds` makes .venv-mxnet).
"""
import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from bench_harness.procs import free_port


def read_libsvm(path):
    op = gzip.open if path.endswith(".gz") else open
    ys, idx, val, ptr = [], [], [], [0]
    with op(path, "rt") as f:
        for line in f:
            parts = line.split()
            if not parts:
                continue
            ys.append(1.0 if float(parts[0]) > 0 else 0.0)
            for tok in parts[1:]:
                k, v = tok.split(":")
                idx.append(int(k))
                val.append(float(v))
            ptr.append(len(idx))
    return (np.array(ys), np.array(idx, dtype=np.int64),
            np.array(val, dtype=np.float64), np.array(ptr, dtype=np.int64))


def batch_parts(idx, val, ptr, rows, bias):
    starts, ends = ptr[rows], ptr[rows + 1]
    lens = ends - starts
    sel = np.concatenate([np.arange(s, e) for s, e in zip(starts, ends)]) if len(rows) else np.zeros(0, np.int64)
    bi = np.concatenate([idx[sel], np.full(len(rows), bias)])
    bv = np.concatenate([val[sel], np.ones(len(rows))])
    br = np.concatenate([np.repeat(np.arange(len(rows)), lens), np.arange(len(rows))])
    return bi, bv, br


def worker(a):
    import mxnet as mx
    kv = mx.kv.create(a.mode)
    rank, W = kv.rank, kv.num_workers
    D = a.num_features + 2          # 1-based features + bias row
    bias = a.num_features + 1
    y, idx, val, ptr = read_libsvm(a.train)
    if idx.max() > a.num_features:
        raise SystemExit(f"feature index {idx.max()} > --num-features")
    kv.set_optimizer(mx.optimizer.Ftrl(learning_rate=a.lr, lamda1=a.l1, beta=1.0,
                                       wd=a.l2, rescale_grad=1.0 / a.batch))
    kv.init("w", mx.nd.sparse.row_sparse_array(
        (np.zeros((D, 1), np.float32), np.arange(D)), shape=(D, 1)))
    my = np.arange(len(y))[rank::W]
    out = mx.nd.sparse.zeros("row_sparse", (D, 1))
    t0 = time.time()
    n = 0

    def pull(uniq):
        kv.row_sparse_pull("w", out=out, row_ids=mx.nd.array(uniq, dtype="int64"))
        ind = out.indices.asnumpy()
        dat = out.data.asnumpy().ravel()
        w = np.zeros(len(uniq))
        if len(ind):
            pos = np.minimum(np.searchsorted(ind, uniq), len(ind) - 1)
            ok = ind[pos] == uniq
            w[ok] = dat[pos[ok]]
        return w

    for s in range(0, len(my), a.batch):
        rows = my[s:s + a.batch]
        bi, bv, br = batch_parts(idx, val, ptr, rows, bias)
        uniq, inv = np.unique(bi, return_inverse=True)
        w = pull(uniq)
        m = np.bincount(br, weights=w[inv] * bv, minlength=len(rows))
        p = 1.0 / (1.0 + np.exp(-np.clip(m, -35, 35)))
        g = np.bincount(inv, weights=bv * (p - y[rows])[br], minlength=len(uniq))
        kv.push("w", mx.nd.sparse.row_sparse_array(
            (g.reshape(-1, 1).astype(np.float32), uniq), shape=(D, 1)))
        n += len(rows)
    kv._barrier()
    train_s = time.time() - t0
    res = {"rank": rank, "train_seconds": train_s, "examples": n}
    if rank == 0:
        w = pull(np.arange(D))
        yt, ti, tv, tp = read_libsvm(a.test)
        keep = ti <= a.num_features
        rows = np.repeat(np.arange(len(yt)), np.diff(tp))
        m = np.bincount(rows[keep], weights=w[ti[keep]] * tv[keep], minlength=len(yt)) + w[bias]
        p = 1.0 / (1.0 + np.exp(-m))
        np.savez(a.out, p=p.astype(np.float64), y=yt.astype(np.int64))
        res["rows"] = int(len(yt))
    kv._barrier()
    with open(os.path.join(a.tmpdir, f"w{rank}.json"), "w") as f:
        json.dump(res, f)


def launch(a):
    tmp = tempfile.mkdtemp(prefix="seeds_mxnet_")
    env = dict(os.environ, DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(free_port()),
               DMLC_NUM_SERVER="1", DMLC_NUM_WORKER=str(a.workers), OMP_NUM_THREADS="1",
               DMLC_INTERFACE="lo")
    py = sys.executable
    procs = []
    t0 = time.time()
    try:
        for role in ("scheduler", "server"):
            procs.append(subprocess.Popen([py, "-c", "import mxnet"], env=dict(env, DMLC_ROLE=role),
                                          stdout=subprocess.DEVNULL,
                                          stderr=open(os.path.join(tmp, role + ".log"), "w")))
        wargs = [py, os.path.abspath(__file__), "lr", "--train", a.train, "--test", a.test,
                 "--num-features", str(a.num_features), "--out", a.out, "--mode", a.mode,
                 "--workers", str(a.workers), "--batch", str(a.batch), "--lr", str(a.lr),
                 "--l1", str(a.l1), "--l2", str(a.l2), "--role", "worker", "--tmpdir", tmp]
        ws = [subprocess.Popen(wargs, env=dict(env, DMLC_ROLE="worker"),
                               stderr=open(os.path.join(tmp, f"worker{i}.log"), "w")) for i in range(a.workers)]
        procs += ws
        deadline = time.time() + a.timeout
        for w in ws:
            rc = w.wait(timeout=max(1, deadline - time.time()))
            if rc != 0:
                with open(os.path.join(tmp, f"worker{ws.index(w)}.log")) as log:
                    raise RuntimeError(f"worker exit {rc}: {log.read()[-500:]}")
        res = [json.load(open(os.path.join(tmp, f"w{i}.json"))) for i in range(a.workers)]
        wall = time.time() - t0
        r0 = [r for r in res if r["rank"] == 0][0]
        out = {"train_seconds": max(r["train_seconds"] for r in res),
               "examples": sum(r["examples"] for r in res), "rows": r0["rows"],
               "settings": {"system": "mxnet kvstore",
                            "mode": a.mode, "workers": a.workers, "servers": 1, "batch": a.batch,
                            "optimizer": "ftrl", "lr": a.lr, "lamda1": a.l1, "wd": a.l2, "beta": 1.0,
                            "passes": 1, "wall_seconds": wall}}
        print("RESULT " + json.dumps(out))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["lr"])
    ap.add_argument("--train", required=True)
    ap.add_argument("--test", required=True)
    ap.add_argument("--num-features", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--mode", default="dist_sync", choices=["dist_sync", "dist_async"])
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--l1", type=float, default=0.0)
    ap.add_argument("--l2", type=float, default=0.0)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--role", default="launcher")
    ap.add_argument("--tmpdir")
    a = ap.parse_args()
    if a.role == "worker":
        worker(a)
        return
    try:
        launch(a)
    except BaseException as e:
        print("RESULT " + json.dumps({"error": f"{type(e).__name__}: {e}"}))
        sys.exit(1)


if __name__ == "__main__":
    main()
