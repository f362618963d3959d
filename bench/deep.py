"""Deep CTR models at DEFAULT flags beside LR and FM, and beside a single-process PyTorch
model with an ``nn.EmbeddingBag`` of the same hashed size, in one run.

Run: ``.venv/bin/python bench/deep.py [--rows 1000000] [--json]`` (needs the ``torch`` extra).

Data sets (one pass each):

* ``criteo``: the Criteo sample in ../shared/data (7 200 training rows; dev + test, 800
  rows, scored); skipped with a message where it is absent.
* ``heavy``: ``--rows`` rows of ``paramserver synth --shape heavy`` (Criteo's own
  cardinalities, Zipf values) and a test file of ``rows / 5`` rows from another seed.

Learners:

* ``paramserver <model>``: ``run_training`` with the CLI's defaults (1 server, 1 worker,
  ``--hash-bits 24``); examples/s is the job's (training only).
* ``torch <model> (1 process)``: the same model in one PyTorch process: the rows of all
  keys in one ``nn.EmbeddingBag(2**24, k + 1, mode="sum")`` (sparse gradients, AdaGrad
  0.01), the MLP (Adam 1e-4) of the same shape, the batches of the job's default
  schedule (from 1 example, growing as sqrt(examples), to 4 000: ``train.ramped``) read
  by the same parser; examples/s counts parsing and training, as the job's does.

Each row runs in a process of its own, so that this one never loads torch (a process
that has loaded torch spawns its cluster's nodes instead of forking them) and so that
peak RSS is the row's: its largest process.  The torch model holds the whole table and
its AdaGrad state in one process; a paramserver process holds the rows it was sent.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "criteo"
MODELS = ("lr", "fm", "deepfm", "wdl")


def sets(tmp: str, rows: int) -> dict[str, tuple[list[str], list[str]]]:
    from paramserver.apps.ctr.synth import write_synth

    out: dict[str, tuple[list[str], list[str]]] = {}
    train = DATA / "criteo_kaggle_wideresdnn_train.tsv.gz"
    if train.exists():
        out["criteo"] = ([str(train)], [str(DATA / "criteo_kaggle_wideresdnn_dev.tsv.gz"),
                                        str(DATA / "criteo_kaggle_wideresdnn_test.tsv.gz")])
    else:
        print(f"criteo: skipped, the sample is not at {train}", file=sys.stderr)
    heavy, heavy_test = os.path.join(tmp, "heavy.tsv"), os.path.join(tmp, "heavy_test.tsv")
    write_synth(heavy, rows, seed=0, shape="heavy")
    write_synth(heavy_test, max(rows // 5, 1000), seed=1, shape="heavy")
    out["heavy"] = ([heavy], [heavy_test])
    return out


def paramserver_row(model: str, train: list[str], test: list[str]) -> dict:
    from paramserver.apps.ctr.models import Model
    from paramserver.apps.ctr.train import TrainConfig, run_training

    r = run_training(TrainConfig(Model(model)), train, test, servers=1, workers=1)
    return {"learner": f"paramserver {model}", "logloss": r["logloss"], "auc": r["auc"],
            "examples_per_s": r["examples_per_s"], "examples": r["examples"],
            # the largest of the cluster's processes (this one only scores the test rows)
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}


def row(kind: str, model: str, train: list[str], test: list[str]) -> dict:
    """One learner's row, measured in a process of its own (peak RSS is that run's)."""
    proc = subprocess.run([sys.executable, __file__, "--row", kind, model, "--train", *train, "--test", *test],
                          capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} {model} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _torch_model(model: str, k: int, rows: int, hidden: tuple[int, ...]) -> tuple[Any, Any]:
    """The EmbeddingBag (column 0 the linear weight, then the k factors) and, for the deep
    models, the MLP on top (its last layer zero, as paramserver's)."""
    import torch
    from torch import nn

    deep = model in ("deepfm", "wdl")
    bag = nn.EmbeddingBag(rows, 1 + (k if model != "lr" else 0), mode="sum", sparse=True)
    with torch.no_grad():
        bag.weight.normal_(0.0, 0.001)
        bag.weight[:, 0] = 0.0
    layers: list[nn.Module] = []
    width = 2 * k if model == "deepfm" else k
    for h in hidden if deep else ():
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    mlp = nn.Sequential(*layers, nn.Linear(width, 1)) if deep else None
    if mlp is not None:
        nn.init.zeros_(mlp[-1].weight)
        nn.init.zeros_(mlp[-1].bias)
    return bag, mlp


def _torch_forward(model: str, bag: Any, mlp: Any) -> Any:
    """The model's logits for a batch."""
    import numpy as np
    import torch
    from torch import nn

    fm = model in ("fm", "deepfm")

    def forward(batch):
        keys = torch.from_numpy(batch.keys.astype(np.int64))
        vals = torch.from_numpy(batch.vals)
        offsets = torch.from_numpy(batch.indptr[:-1].astype(np.int64))
        pooled = bag(keys, offsets, per_sample_weights=vals)
        z = pooled[:, 0]
        if model == "lr":
            return z
        s = pooled[:, 1:]
        if fm:  # Σ_j (v_j x_j)²: the rows the batch touches, through the same weight
            xv = nn.functional.embedding(keys, bag.weight, sparse=True)[:, 1:] * vals[:, None]
            seg = torch.repeat_interleave(torch.arange(len(batch)), torch.from_numpy(np.diff(batch.indptr)))
            q = torch.zeros_like(s).index_add_(0, seg, xv * xv)
            b = 0.5 * (s * s - q)
            z = z + b.sum(1)
        if mlp is not None:
            z = z + mlp(torch.cat([s, b], 1) if model == "deepfm" else s)[:, 0]
        return z

    return forward


def torch_reference(model: str, train: list[str], test: list[str]) -> dict:
    """One PyTorch process: the model with an EmbeddingBag of the same hashed size."""
    import torch
    from torch import nn

    from paramserver.apps.ctr.models import Model, auc, logloss
    from paramserver.apps.ctr.ramp import ramped
    from paramserver.data.reader import DataFormat, Shard, expand, read_all, read_batches

    torch.manual_seed(0)
    spec, fmt = Model(model), DataFormat("criteo")
    bag, mlp = _torch_model(model, spec.k, 1 << fmt.hash_bits, tuple(spec.hidden))
    sparse_opt = torch.optim.Adagrad(bag.parameters(), lr=0.01)
    dense_opt = torch.optim.Adam(mlp.parameters(), lr=1e-4) if mlp is not None else None
    forward = _torch_forward(model, bag, mlp)
    t0 = time.perf_counter()
    n = 0
    for file in expand(train):
        for batch in ramped(read_batches(Shard(file, 0, -1), fmt, 4000), 4000, 1.0, n):
            z = forward(batch)
            loss = nn.functional.binary_cross_entropy_with_logits(z, torch.from_numpy(batch.labels),
                                                                  reduction="sum")
            sparse_opt.zero_grad()
            if dense_opt is not None:
                dense_opt.zero_grad()
            loss.backward()
            sparse_opt.step()
            if dense_opt is not None:
                dense_opt.step()
            n += len(batch)
    seconds = time.perf_counter() - t0
    tb = read_all(test, fmt)
    with torch.no_grad():
        p = torch.sigmoid(forward(tb)).double().numpy()
    return {"learner": f"torch {model} (1 process)", "logloss": logloss(tb.labels, p), "auc": auc(tb.labels, p),
            "examples_per_s": n / seconds, "examples": n,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000, help="heavy-tailed training rows")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--row", nargs=2, metavar=("KIND", "MODEL"), help=argparse.SUPPRESS)
    ap.add_argument("--train", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--test", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.row:
        kind, model = args.row
        measure = paramserver_row if kind == "paramserver" else torch_reference
        print(json.dumps(measure(model, args.train, args.test)))
        return
    results = []
    with tempfile.TemporaryDirectory(prefix="paramserver-bench-deep-") as tmp:
        for name, (train, test) in sets(tmp, args.rows).items():
            for model in MODELS:
                results.append({"set": name, **row("paramserver", model, train, test)})
            for model in ("deepfm", "wdl"):
                results.append({"set": name, **row("torch", model, train, test)})
    if args.json:
        print(json.dumps(results, indent=1))
        return
    print(f"{'set':8} {'learner':28} {'test logloss':>12} {'AUC':>7} {'examples/s':>11} {'peak RSS MB':>11}")
    for r in results:
        print(f"{r['set']:8} {r['learner']:28} {r['logloss']:12.5f} {r['auc']:7.4f} {r['examples_per_s']:11,.0f} "
              f"{r['peak_rss_mb']:11,.0f}")


if __name__ == "__main__":
    main()
