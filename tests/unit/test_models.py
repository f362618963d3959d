"""Model gradients against finite differences; AUC against its definition."""

import numpy as np
import pytest

from paramserver.apps.ctr.models import Model, auc, logloss
from paramserver.data.reader import Batch


def batch_and_rows(dim, seed=0):
    rng = np.random.default_rng(seed)
    indptr = np.array([0, 3, 7, 9], np.int64)
    keys = rng.integers(0, 5, 9).astype(np.uint64)
    vals = rng.uniform(0.5, 2, 9).astype(np.float32)
    rows = (rng.standard_normal((9, dim)) * 0.3).astype(np.float32)
    return Batch(np.array([1, 0, 1], np.float32), indptr, keys, vals), rows


@pytest.mark.parametrize("name,dim", [("lr", 1), ("fm", 4)])
def test_gradient_matches_finite_differences(name, dim):
    model = Model(name, k=dim - 1, l2=0.0) if name == "fm" else Model(name)
    batch, _ = batch_and_rows(dim)
    uniq, inverse = batch.unique()
    assert uniq.size < batch.keys.size  # the batch repeats keys: gradients must add up
    rows = (np.random.default_rng(5).standard_normal((uniq.size, dim)) * 0.3).astype(np.float32)
    grads, loss, _ = model.step(batch, inverse, rows)
    eps = 1e-3
    for j in range(rows.shape[0]):
        for f in range(dim):
            up, down = rows.astype(np.float64), rows.astype(np.float64)
            up[j, f] += eps
            down[j, f] -= eps
            numeric = (model.step(batch, inverse, up.astype(np.float32))[1] -
                       model.step(batch, inverse, down.astype(np.float32))[1]) / (2 * eps)
            assert grads[j, f] == pytest.approx(numeric, rel=2e-2, abs=2e-3)
    preds = model.predict(batch, inverse, rows)
    assert loss == pytest.approx(logloss(batch.labels, preds) * 3, rel=1e-5)


def test_auc_matches_pair_counting_with_ties():
    rng = np.random.default_rng(1)
    y = rng.random(300) < 0.3
    p = np.round(rng.random(300), 1)  # many ties
    pos, neg = p[y], p[~y]
    pairs = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    assert auc(y, p) == pytest.approx(pairs / (pos.size * neg.size))
    assert np.isnan(auc(np.zeros(3), np.ones(3)))


@pytest.mark.parametrize("z,y", [(0.7, 1.0), (-1.3, 0.0), (2.0, 0.0)])
def test_an_examples_output_is_one_piece_for_every_model(z, y):
    """``output`` (tables/steps.py), which lr and fm share: the probability kept in ``preds``, the log loss,
    and its derivative in the margin (against a central difference)."""
    from paramserver.tables.steps import output

    preds, labels = np.zeros(2), np.array([0.0, y])
    loss, grad = output(z, labels, 1, preds)
    assert preds[1] == pytest.approx(1 / (1 + np.exp(-z)))
    assert loss == pytest.approx(logloss(np.array([y]), preds[1:]))
    h = 1e-6
    up, _ = output(z + h, labels, 1, np.zeros(2))
    down, _ = output(z - h, labels, 1, np.zeros(2))
    assert grad == pytest.approx((up - down) / (2 * h), rel=1e-5)
