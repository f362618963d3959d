"""Deep CTR models over hashed sparse features: DeepFM and Wide & Deep.

A key's row on the servers is an FM's ``[w, v_1..v_k]``: a linear weight and a
k-wide embedding.  The batch format has no field ids (LIBSVM has none; Criteo's and
Avazu's fields are hashed into the keys), so the deep part is field-free: it reads a
pooled vector of each example's embeddings, as NFM's bi-interaction pooling does.

* ``deepfm``: ``z = Σ w_j x_j + Σ_f b_f + MLP([s, b])`` where ``s_f = Σ_j v_jf x_j``
  (the bag sum) and ``b_f = ½(s_f² − Σ_j (v_jf x_j)²)`` (the FM's pairwise
  interactions, one per factor; their sum is the FM's second-order term).
* ``wdl``: ``z = Σ w_j x_j + MLP(s)``: the wide part is the linear model, the deep part
  an MLP over the bag of embeddings.

The MLP (ReLU hidden layers, one output) is the model's *dense* part: one flat vector,
kept on the servers in a dense table of ``DENSE_BLOCK``-wide rows, its gradient pushed
there each batch and applied by the table's rule (Adam), Downpour style.  Its output
layer starts at zero, so a new DeepFM is an FM and a new Wide & Deep is a linear
model: the deep part adds only what its gradient finds.

The pooling and the scatter of the embeddings' gradients are numba kernels over the
CSR batch; the MLP is a few float32 matrix products (BLAS).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from numba import njit

from paramserver.tables.steps import logloss, sigmoid

DENSE_BLOCK = 256  # floats a row of the dense table
PREDICT_ROWS = 1 << 15  # examples an MLP pass when scoring (activations: rows x widest layer)


@njit(nogil=True, cache=True)
def _pool(indptr: np.ndarray, vals: np.ndarray, inverse: np.ndarray,
          rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per example: the linear sum, the bag sum ``s`` and the sum of squares ``q``."""
    n = indptr.shape[0] - 1
    k = rows.shape[1] - 1
    lin = np.zeros(n, np.float64)
    s = np.zeros((n, k), np.float64)
    q = np.zeros((n, k), np.float64)
    for i in range(n):
        for j in range(indptr[i], indptr[i + 1]):
            x = vals[j]
            u = inverse[j]
            lin[i] += rows[u, 0] * x
            for f in range(k):
                v = rows[u, 1 + f] * x
                s[i, f] += v
                q[i, f] += v * v
    return lin, s, q


@njit(nogil=True, cache=True)
def _scatter(indptr: np.ndarray, vals: np.ndarray, inverse: np.ndarray, rows: np.ndarray, e: np.ndarray,
             a: np.ndarray, c: np.ndarray, l2: float) -> np.ndarray:
    """Summed gradient rows: ``∂z/∂w_j = x_j`` and ``∂z/∂v_jf = x_j c_f − a_f v_jf x_j²``
    (``c = a s + ∂MLP/∂s`` and ``a = ∂z/∂b``, both already times the example's error)."""
    k = rows.shape[1] - 1
    grads = np.zeros((rows.shape[0], k + 1), np.float32)
    for i in range(indptr.shape[0] - 1):
        for j in range(indptr[i], indptr[i + 1]):
            x = vals[j]
            u = inverse[j]
            grads[u, 0] += e[i] * x
            for f in range(k):
                v = rows[u, 1 + f]
                grads[u, 1 + f] += x * c[i, f] - a[i, f] * v * x * x + l2 * v
    return grads


@njit(nogil=True, cache=True)
def _probabilities(lin: np.ndarray, out: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, float]:
    n = lin.shape[0]
    p = np.empty(n, np.float64)
    loss = 0.0
    for i in range(n):
        p[i] = sigmoid(lin[i] + out[i])
        loss += logloss(p[i], labels[i])
    return p, loss


class MLP:
    """The dense part: layer sizes ``[inputs, *hidden, 1]``, its parameters one flat vector
    (each layer's weights ``[fan_in, fan_out]`` row-major, then its biases)."""

    def __init__(self, inputs: int, hidden: Sequence[int]):
        self.dims = [inputs, *hidden, 1]
        self.size = sum(a * b + b for a, b in zip(self.dims, self.dims[1:]))

    def layers(self, flat: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """Views of ``flat`` as ``(W, b)`` a layer."""
        out, at = [], 0
        for a, b in zip(self.dims, self.dims[1:]):
            w = flat[at:at + a * b].reshape(a, b)
            out.append((w, flat[at + a * b:at + a * b + b]))
            at += a * b + b
        return out

    def initial(self, seed: int) -> np.ndarray:
        """He-normal hidden weights, zero biases, and a zero output layer."""
        flat = np.zeros(self.size, np.float32)
        rng = np.random.default_rng(seed)
        for w, _ in self.layers(flat)[:-1]:
            w[:] = rng.normal(0.0, math.sqrt(2.0 / w.shape[0]), w.shape)
        return flat

    def forward(self, h: np.ndarray, flat: np.ndarray) -> list[np.ndarray]:
        """Every layer's activations, the input first and the output (``[n, 1]``) last."""
        acts = [h]
        layers = self.layers(flat)
        for i, (w, b) in enumerate(layers):
            a = acts[-1] @ w
            a += b
            if i < len(layers) - 1:
                np.maximum(a, 0.0, out=a)
            acts.append(a)
        return acts

    def backward(self, acts: list[np.ndarray], flat: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The flat gradient (summed over the batch) and the input's, from the output's ``g``."""
        grad = np.zeros_like(flat)
        layers, glayers = self.layers(flat), self.layers(grad)
        for i in range(len(layers) - 1, -1, -1):
            w = layers[i][0]
            gw, gb = glayers[i]
            np.matmul(acts[i].T, g, out=gw)
            gb[:] = g.sum(0)
            g = g @ w.T
            if i > 0:
                g *= acts[i] > 0
        return grad, g


class Deep:
    """A DeepFM (``fm=True``) or Wide & Deep model's computations over a CSR batch."""

    def __init__(self, k: int, hidden: Sequence[int], fm: bool, l2: float):
        self.k, self.fm, self.l2 = k, fm, l2
        self.mlp = MLP(2 * k if fm else k, hidden)
        self.dtype: type = np.float32  # the MLP's (float64: a gradient check's)

    def _inputs(self, s: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        if not self.fm:
            return s.astype(self.dtype), None
        b = 0.5 * (s * s - q)
        return np.concatenate([s, b], axis=1).astype(self.dtype), b

    def step(self, batch: Any, inverse: np.ndarray, rows: np.ndarray,
             dense: np.ndarray) -> tuple[np.ndarray, float, np.ndarray]:
        """Summed gradient rows a distinct key, the summed log loss, the dense gradient."""
        grads, loss, dense_grad, _ = self.scored_step(batch, inverse, rows, dense)
        return grads, loss, dense_grad

    def scored_step(self, batch: Any, inverse: np.ndarray, rows: np.ndarray,
                    dense: np.ndarray) -> tuple[np.ndarray, float, np.ndarray, np.ndarray]:
        """``step``, and each example's probability before its update."""
        lin, s, q = _pool(batch.indptr, batch.vals, inverse, rows)
        h, b = self._inputs(s, q)
        acts = self.mlp.forward(h, dense)
        out = acts[-1][:, 0].astype(np.float64)
        if b is not None:
            out += b.sum(1)
        p, loss = _probabilities(lin, out, batch.labels)
        e = (p - batch.labels).astype(self.dtype)
        dense_grad, gh = self.mlp.backward(acts, dense, e[:, None])
        if self.fm:
            a = e[:, None] + gh[:, self.k:]
            c = a * s + gh[:, :self.k]
        else:
            a = np.zeros_like(gh)
            c = gh
        grads = _scatter(batch.indptr, batch.vals, inverse, rows, e, a, c, self.l2)
        return grads, float(loss), dense_grad, p

    def predict(self, batch: Any, inverse: np.ndarray, rows: np.ndarray, dense: np.ndarray) -> np.ndarray:
        lin, s, q = _pool(batch.indptr, batch.vals, inverse, rows)
        p = np.empty(lin.shape[0], np.float64)
        for lo in range(0, lin.shape[0], PREDICT_ROWS):  # a bounded MLP pass, however large the batch
            hi = min(lo + PREDICT_ROWS, lin.shape[0])
            h, b = self._inputs(s[lo:hi], q[lo:hi])
            out = self.mlp.forward(h, dense)[-1][:, 0].astype(np.float64)
            if b is not None:
                out += b.sum(1)
            p[lo:hi] = _probabilities(lin[lo:hi], out, np.zeros(hi - lo, np.float32))[0]
        return p
