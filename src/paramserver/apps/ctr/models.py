"""Models: logistic regression, a factorization machine, DeepFM and Wide & Deep over
hashed sparse features.

A model is a table layout plus two numba kernels over a CSR mini-batch.  The batch's
distinct keys are pulled once (``rows[m, width]``) and ``inverse[j]`` says which row key
occurrence ``j`` uses; ``step`` returns one summed gradient row per distinct key and the
batch's summed log loss; ``predict`` returns probabilities.

* ``lr``: one weight a key; ``p = σ(Σ w_j x_j)``.
* ``fm``: a weight and a k-vector a key (one row ``[w, v_1..v_k]``, so one pull);
  ``p = σ(Σ w_j x_j + ½ Σ_f ((Σ_j v_jf x_j)² − Σ_j v_jf² x_j²))`` (Rendle 2010).
* ``deepfm`` and ``wdl``: an FM's rows, and an MLP (the *dense* part, in a table of its
  own) over each example's pooled embeddings (``apps/deep.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from paramserver.apps.ctr.deep import DENSE_BLOCK, Deep
from paramserver.data.batch import Batch
from paramserver.errors import ConfigError
from paramserver.tables.steps import step

MODELS = ("lr", "fm", "deepfm", "wdl")
DEEP = ("deepfm", "wdl")


@dataclass(frozen=True)
class Model:
    """A model's table layout and kernels.

    Args:
        name: ``"lr"``, ``"fm"``, ``"deepfm"`` or ``"wdl"``.
        k: the FM factor width, a deep model's embedding width (ignored by ``lr``).
        l2: L2 penalty on the factors (embeddings), added to their gradients.
        hidden: a deep model's hidden layer widths.
    """

    name: str = "lr"
    k: int = 8
    l2: float = 1e-2
    hidden: tuple[int, ...] = (256, 128)

    def __post_init__(self) -> None:
        if self.name not in MODELS:
            raise ConfigError(f"--model must be one of {', '.join(MODELS)}, got {self.name!r}")
        if self.name != "lr" and (isinstance(self.k, bool) or not isinstance(self.k, int) or not 1 <= self.k <= 1024):
            raise ConfigError(f"--k / --embedding-dim (the factor width) must be in [1, 1024], got {self.k!r}")
        if not (self.l2 >= 0 and math.isfinite(self.l2)):
            raise ConfigError(f"--fm-l2 must be >= 0, got {self.l2}")
        hidden = tuple(self.hidden) if isinstance(self.hidden, (list, tuple)) else self.hidden
        if not isinstance(hidden, tuple) or not hidden or not all(
                isinstance(h, int) and not isinstance(h, bool) and 1 <= h <= 65536 for h in hidden):
            raise ConfigError(f"--hidden must be one or more layer widths in [1, 65536], e.g. 256,128; "
                              f"got {self.hidden!r}")
        object.__setattr__(self, "hidden", hidden)  # a list from model.json is the same model

    @property
    def table(self) -> str:
        return f"model/{self.name}"

    @property
    def dim(self) -> int:
        return 1 if self.name == "lr" else 1 + self.k

    @property
    def dense_table(self) -> str:
        """A deep model's MLP: ``dense_rows`` rows of ``DENSE_BLOCK`` floats."""
        return f"{self.table}/mlp"

    @cached_property
    def deep(self) -> Deep | None:
        return Deep(self.k, self.hidden, self.name == "deepfm", self.l2) if self.name in DEEP else None

    @property
    def dense_rows(self) -> int:
        return 0 if self.deep is None else -(-self.deep.mlp.size // DENSE_BLOCK)

    def dense_initial(self, seed: int) -> np.ndarray:
        """The MLP's starting rows (``[dense_rows, DENSE_BLOCK]``, zero padded)."""
        assert self.deep is not None
        return to_rows(self.deep.mlp.initial(seed), self.dense_rows)

    def default_optimizer(self) -> dict[str, Any]:
        """FTRL-Proximal on the linear weights, without regularisation, as Vowpal Wabbit
        learns by default, its α and β chosen from the job's first rows (``auto``:
        ``apps/ctr/step_size.py``); an FM's (and a deep model's) factors by AdaGrad.  With the batch
        ramp of the training loop these hold from 6 500 examples to millions; how they were
        chosen, and what else was tried: docs/benchmarks.md, "Defaults that hold without
        flags" and "FM's defaults"."""
        linear = {"alpha": 0.115, "beta": 0.5, "l1": 0.0, "l2": 0.0}
        auto = {"alpha": "auto", "beta": "auto"}  # from the data (apps/ctr/step_size.py): no one α holds on every set
        if self.name == "lr":
            return {"name": "ftrl", **linear, **auto}
        # an FM's (and a deep model's) linear weights as LR's
        return {"name": "ftrl_adagrad", **linear, **auto, "lr": FACTOR_LR, "initial_accumulator": FACTOR_ACCUMULATOR}

    def dense_optimizer(self) -> dict[str, Any]:
        """The MLP's rule, on the servers: Adam on the batch's summed gradient."""
        return {"name": "adam", "lr": DENSE_LR}

    def initializer(self) -> dict[str, Any]:
        # an FM's linear weight starts at 0 (FTRL's does) and its factors start small: their
        # products start at ~k * 1e-6, so the model starts as the linear one and the
        # factors grow where the data asks for them (at the rate FACTOR_ACCUMULATOR sets)
        return {"name": "zeros"} if self.name == "lr" else {"name": "normal", "std": 0.001, "zero_columns": 1}

    def step(self, batch: Batch, inverse: np.ndarray, rows: np.ndarray,
             dense: np.ndarray | None = None) -> tuple[np.ndarray, float, np.ndarray | None]:
        """One summed gradient row per distinct key, the batch's summed log loss and, for a
        deep model (``dense``: its MLP, flat), the MLP's summed gradient (flat)."""
        grads, loss, dense_grads, _ = self.scored_step(batch, inverse, rows, dense)
        return grads, loss, dense_grads

    def scored_step(self, batch: Batch, inverse: np.ndarray, rows: np.ndarray, dense: np.ndarray | None = None
                    ) -> tuple[np.ndarray, float, np.ndarray | None, np.ndarray]:
        """``step``, and each example's probability under the rows it was given (before its
        own update: progressive validation)."""
        if self.deep is not None:
            return self.deep.scored_step(batch, inverse, rows, _flat(dense, self.deep.mlp.size))
        grads, loss, p = step(self.name, batch.indptr, batch.values(), batch.labels, inverse, rows, self.l2)
        return grads, loss, None, p

    def predict(self, batch: Batch, inverse: np.ndarray, rows: np.ndarray,
                dense: np.ndarray | None = None) -> np.ndarray:
        if self.deep is not None:
            return self.deep.predict(batch, inverse, rows, _flat(dense, self.deep.mlp.size))
        return step(self.name, batch.indptr, batch.values(), batch.labels, inverse, rows, self.l2,
                    want_grads=False)[2]


# AdaGrad on the factors: v -= lr * g / sqrt(G0 + the sum of g² so far).  A factor's
# first steps are lr / sqrt(G0) = 0.013 of its gradient, close to the earlier default's
# 0.01 (lr 0.01, G0 = 1), so on a few thousand rows an FM stays at its linear model's log
# loss; but the rate falls only once the squared gradients a factor has received outweigh
# G0 = 20 (not 1), so on 10^5-10^6 rows with pairwise interactions the factors keep
# growing and learn them in one pass.  Chosen on five real sets and planted sets of five
# kinds (bench/fm_pairs.py; docs/benchmarks.md, "FM's defaults"): never worse than LR on
# the real sets, 0.008-0.11 under it on the learnable planted ones.  G0 = 10 (lr 0.05)
# lost to LR on w8a; G0 = 100 (lr 0.1) learnt less (3 * 10^5 planted rows: 0.4693
# against 0.4595, in the offline replica).
FACTOR_LR = 0.06
FACTOR_ACCUMULATOR = 20.0

# Adam's rate on the MLP.  Its output layer starts at zero, so the rate says how fast the
# deep part departs from the FM (the linear model).  Test log loss, one pass, default
# flags (docs/benchmarks.md, "Deep models"): 1e-4 gave DeepFM 0.490600 on the Criteo
# sample (FM 0.490604; 1e-3: 0.490651) and 0.42009 on 10^6 heavy-tailed rows (FM
# 0.42025; 1e-3: 0.42015; 3e-5: 0.42026).
DENSE_LR = 1e-4


def to_rows(flat: np.ndarray, rows: int) -> np.ndarray:
    """A flat vector as ``rows`` zero-padded rows of ``DENSE_BLOCK``."""
    out = np.zeros(rows * DENSE_BLOCK, np.float32)
    out[:flat.size] = flat
    return out.reshape(rows, DENSE_BLOCK)


def _flat(dense: np.ndarray | None, size: int) -> np.ndarray:
    if dense is None:
        raise ValueError("a deep model's step and predict need its dense parameters (dense=)")
    return np.ascontiguousarray(dense, np.float32).reshape(-1)[:size]


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
    p = np.asarray(p)
    order = np.argsort(p)  # any order within ties: they share a rank (a stable sort and np.unique's second
    sorted_p = p[order]  # one cost the default job's end 0.006 s more for its 10^5 test rows)
    new = np.empty(sorted_p.shape[0], bool)
    new[0] = True
    np.not_equal(sorted_p[1:], sorted_p[:-1], out=new[1:])
    first = np.flatnonzero(new)  # each run of tied scores: where it starts (0-based), how long it is
    counts = np.diff(np.append(first, sorted_p.shape[0]))
    positives = np.add.reduceat(y[order].astype(np.int64), first)
    ranks = first + (counts + 1) / 2.0  # each run's 1-based average rank
    return float((float(positives @ ranks) - npos * (npos + 1) / 2.0) / (npos * nneg))
