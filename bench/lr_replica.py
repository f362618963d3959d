"""What ``paramserver train``'s default LR learns, replayed in one process: the same keys (the
Criteo parser at 24 hash bits), the same batch ramp (``ramp * sqrt(examples seen)``, at most
``--batch-size``), FTRL-Proximal on each batch's summed gradient, then the test log loss.  No
cluster: a variant of the rule that is not a flag (how a batch feeds the accumulator) is tried in
seconds.  Its weights are float64 where the job keeps float32 rows, so its log loss is the job's
to about 1e-4 (10^6 heavy rows: 0.42237 here, 0.42227 the job).

    .venv/bin/python bench/lr_replica.py --data train.tsv --test test.tsv [--alpha 0.115 0.1]
        [--beta 0.5] [--l1 0] [--l2 0] [--ramp 1] [--accumulate summed|squares]

``--accumulate squares`` adds each example's squared gradient to a key's accumulator instead of
the square of the batch's sum (``summed``, what the job does); ``--ramp 0`` trains one example
at a time (batches of 1).  Every combination of the lists given is run, one line each.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import sys

import numpy as np
from numba import njit

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from paramserver.data.parse import parse_criteo  # noqa: E402

BITS = 24


def load(path: str) -> tuple[np.ndarray, np.ndarray]:
    """A Criteo TSV file's labels and keys (``[rows, 40]``, below 2^24), as the job parses them."""
    buf = np.fromfile(path, np.uint8)
    n = int((buf == 10).sum())
    labels, keys, ends = np.zeros(n, np.float32), np.zeros((n, 40), np.uint64), np.zeros(n, np.int64)
    rows = parse_criteo(buf, n, True, np.uint64((1 << BITS) - 1), labels, keys, ends)[0]
    return labels[:rows].astype(np.float64), (keys[:rows] & np.uint64((1 << BITS) - 1)).astype(np.int64)


@njit(inline="always", cache=True)
def _p(z):  # type: ignore[no-untyped-def]
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


@njit(cache=True)
def train(labels, keys, alpha, beta, l1, l2, ramp, largest, squares):  # type: ignore[no-untyped-def]
    """One pass; the weights and the progressive log loss (each example scored before its step)."""
    n, fields = keys.shape
    size = 1 << BITS
    w, z, acc = np.zeros(size), np.zeros(size), np.zeros(size)
    g, g2, seen_in = np.zeros(size), np.zeros(size), np.zeros(size, np.bool_)
    touched = np.empty(largest * fields, np.int64)
    seen, loss = 0, 0.0
    while seen < n:
        b = max(1, min(largest, int(ramp * math.sqrt(seen)))) if ramp > 0 else 1
        hi, nt = min(n, seen + b), 0
        for i in range(seen, hi):
            m = 0.0
            for f in range(fields):
                m += w[keys[i, f]]
            p = min(max(_p(m), 1e-15), 1 - 1e-15)
            loss -= labels[i] * math.log(p) + (1 - labels[i]) * math.log(1 - p)
            e = _p(m) - labels[i]
            for f in range(fields):
                k = keys[i, f]
                if not seen_in[k]:
                    seen_in[k] = True
                    touched[nt] = k
                    nt += 1
                g[k] += e
                g2[k] += e * e
        for t in range(nt):
            k = touched[t]
            step = g2[k] if squares else g[k] * g[k]
            grown = acc[k] + step
            z[k] += g[k] - (math.sqrt(grown) - math.sqrt(acc[k])) / alpha * w[k]
            acc[k] = grown
            w[k] = 0.0 if abs(z[k]) <= l1 else -(z[k] - math.copysign(l1, z[k])) / ((beta + math.sqrt(grown)) / alpha
                                                                                   + l2)
            g[k], g2[k], seen_in[k] = 0.0, 0.0, False
        seen = hi
    return w, loss / n


@njit(cache=True)
def test_loss(w, labels, keys):  # type: ignore[no-untyped-def]
    loss = 0.0
    for i in range(labels.shape[0]):
        m = 0.0
        for f in range(keys.shape[1]):
            m += w[keys[i, f]]
        p = min(max(_p(m), 1e-15), 1 - 1e-15)
        loss -= labels[i] * math.log(p) + (1 - labels[i]) * math.log(1 - p)
    return loss / labels.shape[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--test", required=True)
    ap.add_argument("--alpha", type=float, nargs="+", default=[0.115])
    ap.add_argument("--beta", type=float, nargs="+", default=[0.5])
    ap.add_argument("--l1", type=float, nargs="+", default=[0.0])
    ap.add_argument("--l2", type=float, nargs="+", default=[0.0])
    ap.add_argument("--ramp", type=float, nargs="+", default=[1.0], help="0: one example at a time")
    ap.add_argument("--batch-size", type=int, default=4000)
    ap.add_argument("--accumulate", nargs="+", default=["summed"], choices=("summed", "squares"))
    args = ap.parse_args()
    (y, x), (ty, tx) = load(args.data), load(args.test)
    for alpha, beta, l1, l2, ramp, how in itertools.product(args.alpha, args.beta, args.l1, args.l2, args.ramp,
                                                             args.accumulate):
        w, progressive = train(y, x, alpha, beta, l1, l2, ramp, args.batch_size, how == "squares")
        print(f"alpha {alpha} beta {beta} l1 {l1} l2 {l2} ramp {ramp} accumulate {how}: "
              f"progressive {progressive:.5f} test {test_loss(w, ty, tx):.5f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
