"""The demo job: sparse logistic regression trained by W workers against S servers.

Run: ``paramserver demo --servers 2 --workers 2`` (what ``make demo`` does).

Each worker makes its own share of a synthetic click-through data set (20 categorical
fields with Zipf-like value frequencies, hashed to uint64 keys, labels from a planted
logistic model), then for every mini-batch: pull the weights its keys touch, compute the
logistic-loss gradient, push it (the client merges duplicate keys), and tick its clock.
The servers apply FTRL-Proximal.  The driver then scores a held-out set.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from paramserver.client.client import Client
from paramserver.routing.hashing import hash64_array

FIELDS = 20
TABLE = "demo/lr"


@dataclass(frozen=True)
class DemoConfig:
    examples_per_worker: int = 200_000
    batch_size: int = 2_000
    epochs: int = 2
    seed: int = 0


def make_data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` examples: keys ``uint64[n, FIELDS]`` and labels ``float32[n]``."""
    rng = np.random.default_rng(seed)
    cardinality = np.geomspace(10, 200_000, FIELDS).astype(np.int64)
    values = np.minimum(rng.zipf(1.3, size=(n, FIELDS)) - 1, cardinality - 1).astype(np.uint64)
    keys = hash64_array((values + (np.arange(FIELDS, dtype=np.uint64) << np.uint64(40))).ravel())
    keys = keys.reshape(n, FIELDS)
    # planted model: a weight per key that depends only on the key
    truth = (hash64_array(keys.ravel() ^ np.uint64(0xABCDEF)) >> np.uint64(11)).astype(np.float64)
    truth = (truth / 2.0**53 - 0.5).reshape(n, FIELDS) * 1.6
    p = 1.0 / (1.0 + np.exp(-(truth.sum(axis=1) - 1.0)))
    labels = (rng.random(n) < p).astype(np.float32)
    return keys, labels


def logloss(p: np.ndarray, y: np.ndarray) -> float:
    p = np.clip(p, 1e-7, 1 - 1e-7)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def predict(client: Client, keys: np.ndarray) -> np.ndarray:
    w = client.pull(TABLE, keys.ravel()).result(timeout=60).reshape(keys.shape)
    return 1.0 / (1.0 + np.exp(-w.sum(axis=1)))


def train_worker(client: Client, cfg: DemoConfig) -> dict[str, float]:
    """The user code: what every worker runs."""
    keys, labels = make_data(cfg.examples_per_worker, cfg.seed + 1 + client.rank)
    n_batches = len(labels) // cfg.batch_size
    t0 = time.perf_counter()
    losses = []
    pushed = None
    for epoch in range(cfg.epochs):
        batches = [slice(b * cfg.batch_size, (b + 1) * cfg.batch_size) for b in range(n_batches)]
        ahead = client.pull(TABLE, keys[batches[0]].ravel())  # prefetch: overlap pull and compute
        for i, sl in enumerate(batches):
            w = ahead.result(timeout=60).reshape(-1, FIELDS)
            if i + 1 < len(batches):
                ahead = client.pull(TABLE, keys[batches[i + 1]].ravel())
            p = 1.0 / (1.0 + np.exp(-w.sum(axis=1)))
            y = labels[sl]
            losses.append(logloss(p, y))
            grad = np.repeat((p - y)[:, None], FIELDS, axis=1).astype(np.float32)
            if pushed is not None:
                pushed.result(timeout=60)  # surfaces errors; keeps one push in flight
            pushed = client.push(TABLE, keys[sl].ravel(), grad.reshape(-1, 1))
            client.clock()
    if pushed is not None:
        pushed.result(timeout=60)
    client.barrier(timeout_s=120)
    seconds = time.perf_counter() - t0
    return {"rank": client.rank, "examples": cfg.epochs * n_batches * cfg.batch_size,
            "seconds": seconds, "first_loss": float(np.mean(losses[:10])),
            "last_loss": float(np.mean(losses[-10:]))}


def run_demo(servers: int, workers: int, cfg: DemoConfig, log=print) -> dict[str, float]:
    from paramserver.cluster.local import LocalCluster

    log(f"starting a local cluster: 1 scheduler, {servers} server(s), {workers} worker(s)")
    with LocalCluster(servers=servers, workers=workers, log_level="WARNING") as cluster:
        cluster.client.create_table(TABLE, dim=1, optimizer={"name": "ftrl", "alpha": 0.1, "l1": 0.5})
        log(f"training FTRL logistic regression: {cfg.epochs} epoch(s) of "
            f"{cfg.examples_per_worker:,} examples per worker, batch {cfg.batch_size}")
        results = cluster.run(train_worker, cfg)
        test_keys, test_labels = make_data(50_000, cfg.seed + 10_000)
        test_loss = logloss(predict(cluster.client, test_keys), test_labels)
        base = float(test_labels.mean())
        base_loss = logloss(np.full(len(test_labels), base), test_labels)
        stats = cluster.client.server_stats()
    examples = sum(r["examples"] for r in results)
    seconds = max(r["seconds"] for r in results)
    report = {"test_logloss": test_loss, "baseline_logloss": base_loss,
              "examples": examples, "examples_per_s": examples / seconds,
              "stored_keys": sum(s["tables"][TABLE]["keys"] for s in stats)}
    for r in sorted(results, key=lambda r: r["rank"]):
        log(f"worker {r['rank']}: train logloss {r['first_loss']:.4f} -> {r['last_loss']:.4f}")
    log(f"test logloss {test_loss:.4f} (constant predictor: {base_loss:.4f}); "
        f"{examples:,} examples in {seconds:.1f} s = {examples / seconds:,.0f} examples/s; "
        f"{report['stored_keys']:,} keys on {len(stats)} server(s)")
    return report
