"""TensorFlow logistic-regression runner for ``bench/seeds.py``.

Two subcommands, the same flags:

* ``keras``: a single-process Keras model, ``model.fit`` from a ``tf.data`` pipeline;
* ``ps``: the same model under ``tf.distribute.ParameterServerStrategy`` with an in-process
  cluster, as TF's tutorial "Parameter server training with ParameterServerStrategy" builds it
  (``tf.distribute.Server`` objects for W workers and P parameter servers in this process, a
  ``SimpleClusterResolver``, the variables partitioned over the P servers with
  ``tf.distribute.experimental.partitioners.MinSizePartitioner``, and ``model.fit`` driven by
  the coordinator from a ``DatasetCreator`` of per-worker ``tf.data`` pipelines).

Keras 3 (what ``tf.keras`` is since TF 2.16) does not support ParameterServerStrategy; the
tutorial's API is Keras 2, which TF ships as ``tf_keras`` (``TF_USE_LEGACY_KERAS=1``).  Both
subcommands use it so the single process and the cluster run the same model and optimizer.

The model: one weight per feature (``Embedding(N, 1)`` looked up by a row's ragged feature
ids, so each step reads and updates only the rows' weights; its gradient is IndexedSlices),
times the feature values, summed, then a bias and a sigmoid.  LIBSVM lines (plain or .gz) are
read with ``tf.data.TextLineDataset`` and split with ``tf.strings``.

Defaults: Keras ``fit``'s (1 epoch, batch 32) and Adagrad at Keras's default learning rate
0.001 -- the optimizer the docs of Keras's premade ``LinearModel`` compile with.  With so
small a step one pass barely moves the weights (test log loss stays near the prior's);
``--batch-size`` / ``--learning-rate`` give a usable setting.

Run::

    /work/seedsvenv/bin/python bench/seeds_tf.py keras|ps --train A --test B \
        --num-features N --out P.npz [--workers W --ps P] [--epochs E] \
        [--batch-size B] [--optimizer adagrad] [--learning-rate X]

The last stdout line is ``RESULT {json}`` (``train_seconds`` = the ``fit`` call alone) or
``RESULT {"error": ...}`` (exit 1).  Test probabilities ``p`` and labels ``y`` (file order)
are written to ``--out``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import sys
import time
import traceback
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from bench_harness.procs import free_port  # noqa: E402

tf.get_logger().setLevel("ERROR")


def parse_lines(lines: tf.Tensor) -> tuple[tf.Tensor, tf.RaggedTensor, tf.RaggedTensor]:
    """A batch of LIBSVM lines -> (labels 0/1, ragged 0-based ids, ragged values)."""
    lines = tf.strings.strip(lines)
    head = tf.strings.regex_replace(lines, " .*", "")
    label = tf.cast(tf.strings.to_number(head) > 0, tf.float32)
    rest = tf.strings.strip(tf.strings.regex_replace(lines, "^[^ ]*", ""))
    tokens = tf.strings.split(rest, " ")
    tokens = tf.ragged.boolean_mask(tokens, tf.strings.length(tokens) > 0)  # rows with no features
    pairs = tf.strings.split(tokens.flat_values, ":").to_tensor(shape=[None, 2])
    ids = tokens.with_flat_values(tf.strings.to_number(pairs[:, 0], tf.int64) - 1)
    vals = tokens.with_flat_values(tf.strings.to_number(pairs[:, 1], tf.float32))
    return label, ids, vals


def dataset(path: str, batch: int, shard: tuple[int, int] | None = None) -> tf.data.Dataset:
    """((ids, values), label) batches of a LIBSVM file, in file order."""
    ds = tf.data.TextLineDataset(path, compression_type="GZIP" if path.endswith(".gz") else "")
    ds = ds.filter(lambda s: tf.strings.length(tf.strings.strip(s)) > 0)
    if shard is not None:
        ds = ds.shard(*shard)
    ds = ds.batch(batch).map(parse_lines, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.map(lambda y, i, v: ((i, v), y)).prefetch(tf.data.AUTOTUNE)


def build(n: int, optimizer: str, lr: float | None, steps_per_execution: int = 1) -> Any:
    """Logistic regression: sum of Embedding(N, 1)[id] * value over a row, + bias, sigmoid."""
    keras = tf.keras
    ids = keras.Input(shape=(None,), dtype="int64", ragged=True, name="ids")
    vals = keras.Input(shape=(None,), dtype="float32", ragged=True, name="vals")
    w = keras.layers.Embedding(n, 1, embeddings_initializer="zeros", name="w")(ids)
    logit = keras.layers.Lambda(
        lambda t: tf.reduce_sum(t[0][..., 0] * t[1], axis=1, keepdims=True), name="dot")([w, vals])
    out = keras.layers.Dense(1, activation="sigmoid", kernel_initializer="ones",
                             bias_initializer="zeros", name="bias")(logit)
    model = keras.Model([ids, vals], out)
    opt = keras.optimizers.get(optimizer)
    if lr is not None:
        opt.learning_rate = lr
    model.compile(optimizer=opt, loss="binary_crossentropy", steps_per_execution=steps_per_execution)
    return model


def count_rows(path: str) -> int:
    """Non-blank lines of a (possibly gzipped) file."""
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def _weights(model: Any) -> tuple[np.ndarray, float, float]:
    """(per-feature weights, the Dense kernel, bias).  Under ParameterServerStrategy the
    embedding is a ShardedVariable, which ``model.weights`` may list as it is or as its
    ``.../part_K`` shards; either way the parts are concatenated in shard order."""
    emb_parts: list[tuple[int, np.ndarray]] = []
    kernel, bias = 1.0, 0.0
    for v in model.weights:
        for k, x in enumerate(getattr(v, "variables", [v])):
            value = np.asarray(x.numpy())
            name = x.name
            if name.startswith("w/"):
                part = re.search(r"part_(\d+)", name)
                emb_parts.append((int(part.group(1)) if part else k, value[:, 0].astype(np.float64)))
            elif name.startswith("bias/kernel"):
                kernel = float(value.reshape(-1)[0])
            elif name.startswith("bias/bias"):
                bias = float(value.reshape(-1)[0])
    if not emb_parts:
        raise RuntimeError(f"no embedding among the weights: {[v.name for v in model.weights]}")
    emb_parts.sort(key=lambda t: t[0])
    return np.concatenate([e for _, e in emb_parts]), kernel, bias


def score(model: Any, path: str) -> tuple[np.ndarray, np.ndarray]:
    """Test labels and probabilities in file order, computed from the trained weights in numpy
    (the model's own arithmetic; the PS coordinator has no ``predict``)."""
    emb, kernel, bias = _weights(model)
    ys, ps = [], []
    for (ids, vals), y in dataset(path, 8192):
        flat = emb[ids.flat_values.numpy()] * vals.flat_values.numpy()
        splits = ids.row_splits.numpy()
        csum = np.concatenate([[0.0], np.cumsum(flat)])
        s = csum[splits[1:]] - csum[splits[:-1]]
        z = np.clip(kernel * s + bias, -500.0, 500.0)
        ps.append(1.0 / (1.0 + np.exp(-z)))
        ys.append(y.numpy())
    return np.concatenate(ys).astype(np.float64), np.concatenate(ps).astype(np.float64)


def in_process_cluster(workers: int, ps: int) -> tuple[Any, list[Any]]:
    """The tutorial's ``create_in_process_cluster``: every server lives in this process."""
    spec = tf.train.ClusterSpec({"worker": [f"localhost:{free_port()}" for _ in range(workers)],
                                 "ps": [f"localhost:{free_port()}" for _ in range(ps)]})
    config = tf.compat.v1.ConfigProto()
    if (os.cpu_count() or 1) < workers + 1:  # as the tutorial does; fewer threads deadlock 2+2
        config.inter_op_parallelism_threads = workers + 1
    servers = [tf.distribute.Server(spec, job_name="worker", task_index=i, config=config,
                                    protocol="grpc") for i in range(workers)]
    servers += [tf.distribute.Server(spec, job_name="ps", task_index=i, protocol="grpc")
                for i in range(ps)]
    return tf.distribute.cluster_resolver.SimpleClusterResolver(spec, rpc_layer="grpc"), servers


def train_keras(a: argparse.Namespace, rows: int) -> tuple[Any, float]:
    model = build(a.num_features, a.optimizer, a.learning_rate)
    data = dataset(a.train, a.batch_size)
    t = time.perf_counter()
    model.fit(data, epochs=a.epochs, verbose=0)
    return model, time.perf_counter() - t


def train_ps(a: argparse.Namespace, rows: int) -> tuple[Any, float]:
    resolver, servers = in_process_cluster(a.workers, a.ps)
    a.servers = servers  # keep them referenced until exit
    strategy = tf.distribute.ParameterServerStrategy(
        resolver, variable_partitioner=tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=256 << 10, max_shards=a.ps))
    with strategy.scope():
        model = build(a.num_features, a.optimizer, a.learning_rate, steps_per_execution=10)

    def per_worker(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        batch = ctx.get_per_replica_batch_size(a.batch_size)
        return dataset(a.train, batch, (ctx.num_input_pipelines, ctx.input_pipeline_id)).repeat()

    steps = max(1, -(-rows // a.batch_size))  # one pass per epoch; the coordinator needs a count
    creator = tf.keras.utils.experimental.DatasetCreator(per_worker)
    t = time.perf_counter()
    model.fit(creator, epochs=a.epochs, steps_per_epoch=steps, verbose=0)  # joins at epoch end
    return model, time.perf_counter() - t


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("mode", choices=["keras", "ps"])
    ap.add_argument("--train", required=True)
    ap.add_argument("--test", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--num-features", type=int, required=True)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--ps", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=1, help="Keras fit's default: 1")
    ap.add_argument("--batch-size", type=int, default=32, help="Keras fit's default: 32")
    ap.add_argument("--optimizer", default="adagrad",
                    help="default adagrad, as the docs of Keras's premade LinearModel compile it")
    ap.add_argument("--learning-rate", type=float, help="default: the optimizer's own (adagrad 0.001)")
    return ap.parse_args()


def run(a: argparse.Namespace) -> dict[str, Any]:
    rows = count_rows(a.train)
    model, seconds = (train_keras if a.mode == "keras" else train_ps)(a, rows)
    y, p = score(model, a.test)
    expected = count_rows(a.test)
    if len(p) != expected:
        raise RuntimeError(f"scored {len(p)} test rows, the file has {expected}")
    np.savez(a.out, p=p, y=y)
    opt = model.optimizer
    lr = opt.learning_rate
    lr = float(lr.numpy()) if hasattr(lr, "numpy") else float(lr)
    where = f", {a.workers} workers + {a.ps} PS in-process" if a.mode == "ps" else ""
    return {"train_seconds": seconds, "examples": rows * a.epochs, "rows": rows,
            "settings": f"tf_keras fit ({a.epochs} epoch{'s' if a.epochs != 1 else ''}), "
                        f"{type(opt).__name__} lr={lr:g}, batch {a.batch_size}{where}"}


def main() -> None:
    a = parse()
    code = 0
    try:
        result = run(a)
    except Exception as exc:  # noqa: BLE001  (the driver reports every failure with its reason)
        traceback.print_exc()
        first = (str(exc).strip().splitlines() or [""])[0]
        result, code = {"error": f"{type(exc).__name__}: {first[:300]}"}, 1
    print("RESULT " + json.dumps(result), flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    # os._exit: the in-process gRPC tf.distribute.Server threads never return, so a normal
    # interpreter exit would block; everything has been written and flushed by now.
    os._exit(code)


if __name__ == "__main__":
    main()
