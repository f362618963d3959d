"""Models: logistic regression and a factorization machine over hashed sparse features.

A model is a table layout plus two numba kernels over a CSR mini-batch.  The batch's
distinct keys are pulled once (``rows[m, width]``) and ``inverse[j]`` says which row key
occurrence ``j`` uses; ``step`` returns one summed gradient row per distinct key and the
batch's summed log loss; ``predict`` returns probabilities.

* ``lr``: one weight a key; ``p = σ(Σ w_j x_j)``.
* ``fm``: a weight and a k-vector a key (one row ``[w, v_1..v_k]``, so one pull);
  ``p = σ(Σ w_j x_j + ½ Σ_f ((Σ_j v_jf x_j)² − Σ_j v_jf² x_j²))`` (Rendle 2010).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit

from paramserver.errors import ConfigError


@njit(inline="always", nogil=True, cache=True)
def _sigmoid(z):
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


@njit(inline="always", nogil=True, cache=True)
def _logloss(p, y):
    p = min(max(p, 1e-15), 1.0 - 1e-15)
    return -(y * math.log(p) + (1.0 - y) * math.log(1.0 - p))


@njit(nogil=True, cache=True)
def _lr(indptr, vals, labels, inverse, rows, want_grads):
    n = labels.shape[0]
    grads = np.zeros((rows.shape[0] if want_grads else 0, 1), np.float32)
    preds = np.empty(n, np.float64)
    loss = 0.0
    for i in range(n):
        z = 0.0
        for j in range(indptr[i], indptr[i + 1]):
            z += rows[inverse[j], 0] * vals[j]
        p = _sigmoid(z)
        preds[i] = p
        loss += _logloss(p, labels[i])
        if want_grads:
            e = p - labels[i]
            for j in range(indptr[i], indptr[i + 1]):
                grads[inverse[j], 0] += e * vals[j]
    return grads, loss, preds


@njit(nogil=True, cache=True)
def _fm(indptr, vals, labels, inverse, rows, want_grads, l2):
    n = labels.shape[0]
    k = rows.shape[1] - 1
    grads = np.zeros((rows.shape[0] if want_grads else 0, k + 1), np.float32)
    preds = np.empty(n, np.float64)
    s = np.empty(k, np.float64)
    loss = 0.0
    for i in range(n):
        z = 0.0
        s[:] = 0.0
        sq = 0.0
        for j in range(indptr[i], indptr[i + 1]):
            x = vals[j]
            u = inverse[j]
            z += rows[u, 0] * x
            for f in range(k):
                v = rows[u, 1 + f] * x
                s[f] += v
                sq += v * v
        inter = 0.0
        for f in range(k):
            inter += s[f] * s[f]
        z += 0.5 * (inter - sq)
        p = _sigmoid(z)
        preds[i] = p
        loss += _logloss(p, labels[i])
        if want_grads:
            e = p - labels[i]
            for j in range(indptr[i], indptr[i + 1]):
                x = vals[j]
                u = inverse[j]
                grads[u, 0] += e * x
                for f in range(k):
                    v = rows[u, 1 + f]
                    grads[u, 1 + f] += e * (x * s[f] - v * x * x) + l2 * v
    return grads, loss, preds


@dataclass(frozen=True)
class Model:
    """A model's table layout and kernels.

    Args:
        name: ``"lr"`` or ``"fm"``.
        k: FM factor width (ignored by ``lr``).
        l2: FM L2 penalty on the factors, added to their gradients.
    """

    name: str = "lr"
    k: int = 8
    l2: float = 1e-2

    def __post_init__(self) -> None:
        if self.name not in ("lr", "fm"):
            raise ConfigError(f"--model must be 'lr' or 'fm', got {self.name!r}")
        if self.name == "fm" and not 1 <= self.k <= 1024:
            raise ConfigError(f"--k (FM factor width) must be in [1, 1024], got {self.k}")
        if not (self.l2 >= 0 and math.isfinite(self.l2)):
            raise ConfigError(f"--fm-l2 must be >= 0, got {self.l2}")

    @property
    def table(self) -> str:
        return f"model/{self.name}"

    @property
    def dim(self) -> int:
        return 1 if self.name == "lr" else 1 + self.k

    def default_optimizer(self) -> dict[str, Any]:
        """FTRL-Proximal on the linear weights (AdaGrad on an FM's factors), without
        regularisation, as Vowpal Wabbit learns by default.  With the batch ramp of the
        training loop these hold from 6 500 examples to millions; how they were chosen,
        and what else was tried: docs/benchmarks.md, "Defaults that hold without flags"."""
        linear = {"alpha": 0.115, "beta": 0.5, "l1": 0.0, "l2": 0.0}
        if self.name == "lr":
            return {"name": "ftrl", **linear}
        return {"name": "ftrl_adagrad", **linear, "lr": 0.01, "initial_accumulator": 1.0}

    def initializer(self) -> dict[str, Any]:
        # an FM's linear weight starts at 0 (FTRL's does) and its factors start small: their
        # products start at ~k * 1e-6, so the model starts as the linear one and the
        # factors grow where the data asks for them
        return {"name": "zeros"} if self.name == "lr" else {"name": "normal", "std": 0.001, "zero_columns": 1}

    def step(self, batch, inverse: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, float]:
        """One summed gradient row per distinct key, and the batch's summed log loss."""
        if self.name == "lr":
            grads, loss, _ = _lr(batch.indptr, batch.vals, batch.labels, inverse, rows, True)
        else:
            grads, loss, _ = _fm(batch.indptr, batch.vals, batch.labels, inverse, rows, True, self.l2)
        return grads, float(loss)

    def predict(self, batch, inverse: np.ndarray, rows: np.ndarray) -> np.ndarray:
        if self.name == "lr":
            return _lr(batch.indptr, batch.vals, batch.labels, inverse, rows, False)[2]
        return _fm(batch.indptr, batch.vals, batch.labels, inverse, rows, False, 0.0)[2]


def logloss(y: np.ndarray, p: np.ndarray) -> float:
    p = np.clip(p, 1e-15, 1 - 1e-15)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def auc(y: np.ndarray, p: np.ndarray) -> float:
    """Area under the ROC curve (tied scores share their average rank)."""
    y = np.asarray(y, bool)
    npos = int(y.sum())
    nneg = y.size - npos
    if npos == 0 or nneg == 0:
        return float("nan")
    order = np.argsort(p, kind="mergesort")
    sorted_p = np.asarray(p)[order]
    _, first, counts = np.unique(sorted_p, return_index=True, return_counts=True)
    ranks = np.repeat(first + (counts + 1) / 2.0, counts)  # 1-based average ranks
    return float((ranks[y[order]].sum() - npos * (npos + 1) / 2.0) / (npos * nneg))
