"""Model steps a server can take itself: a mini-batch's gradient of logistic regression or of a
factorization machine, computed where the weights are (``Op.STEP``, ``client.steps``).

A worker that pulls a batch's rows, computes the gradient and pushes it pays a round trip a
batch, and reads rows a push or more stale while batches overlap.  A step sends the batch
instead (its distinct keys, each occurrence's index among them, the examples' offsets,
values and labels): the server reads the rows, computes the gradient here, and applies it
through the table's rule as the push would, in one request.  The worker gets back each
example's probability under the rows it was scored with (progressive validation) and the
batch's summed log loss.

The arithmetic is the worker's, to the bit (``apps/ctr/models.py`` calls the same kernels):
a step on rows ``w`` applies the gradient a push computed from the same ``w`` would carry.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from paramserver.errors import ProtocolError
from paramserver.tables.spec import TableSpec

#: the models a server steps: their name on the wire and the row width they read (0: any from 2,
#: a factorization machine's ``[w, v_1..v_k]``)
STEP_MODELS = {"lr": 1, "fm": 0}


@njit(inline="always", nogil=True, cache=True)
def sigmoid(z: float) -> float:
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


@njit(inline="always", nogil=True, cache=True)
def logloss(p: float, y: float) -> float:
    p = min(max(p, 1e-15), 1.0 - 1e-15)
    return -(y * math.log(p) + (1.0 - y) * math.log(1.0 - p))


@njit(inline="always", nogil=True, cache=True)
def output(z, labels, i, preds):  # type: ignore[no-untyped-def]
    """Example ``i``'s output, the same for every model: its probability ``σ(z)`` (kept in
    ``preds``), its log loss, and the loss's gradient in the margin ``z``."""
    p = sigmoid(z)
    preds[i] = p
    return logloss(p, labels[i]), p - labels[i]


@njit(nogil=True, cache=True)
def logistic_step(indptr, vals, labels, inverse, rows, want_grads):  # type: ignore[no-untyped-def]
    """A CSR batch's logistic regression on ``rows[m, 1]`` (occurrence j reads row
    ``inverse[j]``, with value ``vals[j]``, or 1 where ``vals`` is empty): the summed gradient
    row of each of the m keys (none unless ``want_grads``), the summed log loss and each
    example's probability.  The occurrences are read at unsigned indices, which numba need
    not check for wrapping as it does a signed one it cannot prove non-negative (512 rows of
    39: 3.1 -> 2.3 ns an occurrence, the same bits; ``fm_step`` reads them so too)."""
    n = labels.shape[0]
    grads = np.zeros((rows.shape[0] if want_grads else 0, 1), np.float32)
    preds = np.empty(n, np.float64)
    ones = vals.shape[0] == 0  # every value 1 (a step's request leaves them out)
    loss = 0.0
    for i in range(n):
        z = 0.0
        for j in range(np.uint64(indptr[i]), np.uint64(indptr[i + 1])):
            z += rows[np.uint64(inverse[j]), 0] * (np.float32(1.0) if ones else vals[j])
        ell, e = output(z, labels, i, preds)
        loss += ell
        if want_grads:
            for j in range(np.uint64(indptr[i]), np.uint64(indptr[i + 1])):
                grads[np.uint64(inverse[j]), 0] += e * (np.float32(1.0) if ones else vals[j])
    return grads, loss, preds


@njit(nogil=True, cache=True)
def fm_step(indptr, vals, labels, inverse, rows, want_grads, l2):  # type: ignore[no-untyped-def]
    """A factorization machine's ``logistic_step``: rows ``[w, v_1..v_k]``, ``p = σ(Σ w_j x_j +
    ½ Σ_f ((Σ_j v_jf x_j)² − Σ_j v_jf² x_j²))`` (Rendle 2010), ``l2`` on the factors' gradients."""
    n = labels.shape[0]
    k = rows.shape[1] - 1
    grads = np.zeros((rows.shape[0] if want_grads else 0, k + 1), np.float32)
    preds = np.empty(n, np.float64)
    s = np.empty(k, np.float64)
    ones = vals.shape[0] == 0  # every value 1 (a step's request leaves them out)
    loss = 0.0
    for i in range(n):
        z = 0.0
        s[:] = 0.0
        sq = 0.0
        for j in range(np.uint64(indptr[i]), np.uint64(indptr[i + 1])):
            x = np.float32(1.0) if ones else vals[j]
            u = np.uint64(inverse[j])
            z += rows[u, 0] * x
            for f in range(k):
                v = rows[u, 1 + f] * x
                s[f] += v
                sq += v * v
        inter = 0.0
        for f in range(k):
            inter += s[f] * s[f]
        z += 0.5 * (inter - sq)
        ell, e = output(z, labels, i, preds)
        loss += ell
        if want_grads:
            for j in range(np.uint64(indptr[i]), np.uint64(indptr[i + 1])):
                x = np.float32(1.0) if ones else vals[j]
                u = np.uint64(inverse[j])
                grads[u, 0] += e * x
                for f in range(k):
                    v = rows[u, 1 + f]
                    grads[u, 1 + f] += e * (x * s[f] - v * x * x) + l2 * v
    return grads, loss, preds


@njit(nogil=True, cache=True)
def _batch_fault(m: int, inverse: np.ndarray, indptr: np.ndarray, vals: np.ndarray, labels: np.ndarray) -> int:
    """0, or what is wrong with a step's batch (one pass each): 1 the offsets (or values
    neither none nor one an occurrence), 2 an index out of the keys, 3 a value or label not finite."""
    n = labels.shape[0]
    if (indptr.shape[0] != n + 1 or indptr[0] != 0 or indptr[n] != inverse.shape[0]
            or vals.shape[0] not in (0, inverse.shape[0])):
        return 1
    for i in range(n):
        if indptr[i + 1] < indptr[i]:
            return 1
        if not math.isfinite(labels[i]):
            return 3
    for j in range(inverse.shape[0]):
        if inverse[j] < 0 or inverse[j] >= m:
            return 2
    for j in range(vals.shape[0]):
        if not math.isfinite(vals[j]):
            return 3
    return 0


def check_batch(table: str, m: int, inverse: np.ndarray, indptr: np.ndarray, vals: np.ndarray,
                labels: np.ndarray) -> None:
    """Refuse a step whose batch is malformed, before any row is read."""
    fault = _batch_fault(m, inverse, indptr, vals, labels)
    if fault == 1:
        raise ProtocolError(f"step on {table!r}: the offsets must start at 0, never fall and end at the "
                            f"{inverse.shape[0]} occurrences (as many values, or none: all 1), one more than the "
                            f"{labels.shape[0]} "
                            f"labels; got {indptr.shape[0]} offsets and {vals.shape[0]} values")
    if fault == 2:
        raise ProtocolError(f"step on {table!r}: an occurrence names a key outside the request's {m} keys")
    if fault == 3:
        raise ProtocolError(f"step on {table!r}: a value or a label is NaN or inf")


def fits(model: str, dim: int) -> bool:
    """Whether ``model``'s steps read rows of ``dim`` floats."""
    width = STEP_MODELS.get(model)
    return width is not None and (dim == width if width else dim >= 2)


def unsuited(spec: TableSpec, model: str) -> str | None:
    """Why a server cannot take ``model``'s steps on ``spec``'s table (None: it can): the
    server refuses with it, and a client does not send them (``client/step_calls.steppable``)."""
    if model not in STEP_MODELS:
        return f"model must be one of {sorted(STEP_MODELS)}, got {model!r}"
    if not fits(model, spec.dim) or spec.push_width != spec.dim:
        wants = "rows of 1 float" if model == "lr" else "rows of 2 floats or more ([w, v_1..v_k])"
        return (f"model {model!r} reads {wants} and pushes no stats; the table's rows have {spec.dim} and its "
                f"pushes {spec.push_width}: pull and push instead")
    if spec.aggregate or spec.staleness != float("inf"):
        return (f"a step reads its rows as an ASP pull does, and the table is gated by clocks (staleness "
                f"{spec.staleness:g}): pull and push instead")
    return None


def step(model: str, indptr: np.ndarray, vals: np.ndarray, labels: np.ndarray, inverse: np.ndarray,
         rows: np.ndarray, l2: float, want_grads: bool = True) -> tuple[np.ndarray, float, np.ndarray]:
    """``model``'s gradient rows (none unless ``want_grads``), summed log loss and
    probabilities on ``rows`` (``l2``: an FM's, on its factors' gradients)."""
    if model == "lr":
        grads, loss, preds = logistic_step(indptr, vals, labels, inverse, rows, want_grads)
    else:
        grads, loss, preds = fm_step(indptr, vals, labels, inverse, rows, want_grads, l2)
    return grads, float(loss), preds
