"""DeepFM and Wide & Deep: gradients against finite differences, a new model is its
shallow one, the MLP's layout, and the model's arguments."""

import numpy as np
import pytest

from paramserver.apps.ctr.deep import DENSE_BLOCK, MLP
from paramserver.apps.ctr.models import Model, logloss
from paramserver.data.reader import Batch
from paramserver.errors import ConfigError


def _batch(seed=0):
    rng = np.random.default_rng(seed)
    indptr = np.array([0, 3, 5, 9, 10, 13], np.int64)
    keys = rng.integers(0, 6, indptr[-1]).astype(np.uint64)
    vals = rng.uniform(0.5, 2, indptr[-1]).astype(np.float32)
    return Batch(np.array([1, 0, 1, 0, 1], np.float32), indptr, keys, vals)


@pytest.mark.parametrize("name", ["deepfm", "wdl"])
def test_gradients_match_finite_differences(name):
    model = Model(name, k=3, l2=0.0, hidden=(4, 3))
    deep = model.deep
    deep.dtype = np.float64  # the check's: float32 inputs would hide a difference of eps
    batch = _batch()
    uniq, inverse = batch.unique()
    assert uniq.size < batch.keys.size  # repeated keys: their gradients must add up
    rng = np.random.default_rng(1)
    rows = rng.normal(0, 0.5, (uniq.size, 4))
    dense = rng.normal(0, 0.5, deep.mlp.size)  # a nonzero output layer: every path carries gradient
    grads, loss, dense_grads = deep.step(batch, inverse, rows, dense)
    eps = 1e-6

    def loss_at(r, d):
        return deep.step(batch, inverse, r, d)[1]

    for idx in np.ndindex(rows.shape):
        up, down = rows.copy(), rows.copy()
        up[idx] += eps
        down[idx] -= eps
        assert grads[idx] == pytest.approx((loss_at(up, dense) - loss_at(down, dense)) / (2 * eps), abs=1e-5)
    for i in range(dense.size):
        up, down = dense.copy(), dense.copy()
        up[i] += eps
        down[i] -= eps
        assert dense_grads[i] == pytest.approx((loss_at(rows, up) - loss_at(rows, down)) / (2 * eps), abs=1e-5)
    preds = deep.predict(batch, inverse, rows, dense)
    assert loss == pytest.approx(logloss(batch.labels, preds) * len(batch), rel=1e-9)


@pytest.mark.parametrize("name,shallow", [("deepfm", "fm"), ("wdl", "lr")])
def test_a_new_deep_model_predicts_as_its_shallow_one(name, shallow):
    """The MLP's output layer starts at zero: DeepFM starts as an FM, Wide & Deep as LR."""
    model = Model(name, k=4, hidden=(8, 5))
    batch = _batch(2)
    uniq, inverse = batch.unique()
    rows = np.random.default_rng(3).normal(0, 0.3, (uniq.size, 5)).astype(np.float32)
    dense = model.dense_initial(seed=7)
    assert dense.shape == (model.dense_rows, DENSE_BLOCK)
    flat = dense.reshape(-1)[:model.deep.mlp.size]
    assert np.abs(flat).max() > 0  # the hidden layers are not zero ...
    w_out, b_out = model.deep.mlp.layers(flat)[-1]
    assert not w_out.any() and not b_out.any()  # ... the output layer is
    base = Model(shallow, k=4)
    want = base.predict(batch, inverse, rows if shallow == "fm" else rows[:, :1])
    np.testing.assert_allclose(model.predict(batch, inverse, rows, dense), want, rtol=1e-6)


def test_the_mlp_layout_and_a_bounded_predict_pass(monkeypatch):
    mlp = MLP(6, (5, 4))
    assert mlp.size == 6 * 5 + 5 + 5 * 4 + 4 + 4 + 1
    flat = np.arange(mlp.size, dtype=np.float32)
    (w0, b0), (w1, b1), (w2, b2) = mlp.layers(flat)
    assert w0.shape == (6, 5) and b0[0] == 30 and w2.shape == (4, 1) and b2[0] == mlp.size - 1
    # predict in chunks gives what one pass gives
    import paramserver.apps.ctr.deep as deep_module

    model = Model("deepfm", k=3, hidden=(4,))
    batch = _batch(4)
    uniq, inverse = batch.unique()
    rows = np.random.default_rng(5).normal(0, 0.3, (uniq.size, 4)).astype(np.float32)
    dense = np.random.default_rng(6).normal(0, 0.3, model.deep.mlp.size).astype(np.float32)
    whole = model.predict(batch, inverse, rows, dense)
    monkeypatch.setattr(deep_module, "PREDICT_ROWS", 2)
    np.testing.assert_array_equal(model.predict(batch, inverse, rows, dense), whole)


def test_bad_model_arguments_are_refused_with_the_rule():
    with pytest.raises(ConfigError, match="--model must be one of lr, fm, deepfm, wdl, got 'dnn'"):
        Model("dnn")
    with pytest.raises(ConfigError, match=r"--hidden must be one or more layer widths .* got \(\)"):
        Model("deepfm", hidden=())
    with pytest.raises(ConfigError, match="--hidden"):
        Model("wdl", hidden=(256, 0))
    with pytest.raises(ConfigError, match=r"--embedding-dim .* got 0"):
        Model("deepfm", k=0)
    assert Model("deepfm", hidden=[64, 32]) == Model("deepfm", hidden=(64, 32))  # as model.json gives it
    with pytest.raises(ValueError, match="dense parameters"):
        batch = _batch()
        Model("wdl").step(batch, batch.unique()[1], np.zeros((6, 9), np.float32))
