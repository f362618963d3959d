"""Each server-side optimiser against a ten-line numpy reference."""

import dataclasses

import numpy as np
import pytest

from paramserver import FTRL, SGD, AdaGrad, Adam, ConfigError, FtrlAdagrad, TableSpec
from paramserver.store.table import VnodeTable
from paramserver.tables.optim import Normal, RMSProp, Uniform, Zeros

STEPS, N, DIM = 6, 50, 3


def ref_sgd(g_seq, w, lr):
    for g in g_seq:
        w = w - lr * g
    return w


def ref_adagrad(g_seq, w, lr, eps, acc0):
    a = np.full_like(w, acc0)
    for g in g_seq:
        a = a + g * g
        w = w - lr * g / (np.sqrt(a) + eps)
    return w


def ref_ftrl(g_seq, alpha, beta, l1, l2):
    z = np.zeros_like(g_seq[0])
    n = np.zeros_like(z)
    w = np.zeros_like(z)
    for g in g_seq:
        sigma = (np.sqrt(n + g * g) - np.sqrt(n)) / alpha
        z = z + g - sigma * w
        n = n + g * g
        w = np.where(np.abs(z) <= l1, 0.0, -(z - np.sign(z) * l1) / ((beta + np.sqrt(n)) / alpha + l2))
    return w


def ref_adam(g_seq, w, lr, b1, b2, eps):
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    for t, g in enumerate(g_seq, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        w = w - lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
    return w


def run_table(opt, init=None, seed=3):
    init = Zeros() if init is None else init
    rng = np.random.default_rng(0)
    keys = rng.integers(0, 2**64 - 1, N, dtype=np.uint64, endpoint=True)
    grads = [rng.standard_normal((N, DIM)).astype(np.float32) for _ in range(STEPS)]
    table = VnodeTable(DIM, opt, init, seed)
    w0 = np.empty((N, DIM), np.float32)
    table.lookup(keys, w0)
    for g in grads:
        table.apply(keys, g)
    out = np.empty((N, DIM), np.float32)
    table.lookup(keys, out)
    return w0.astype(np.float64), [g.astype(np.float64) for g in grads], out


def test_sgd_matches_reference():
    w0, g, out = run_table(SGD(lr=0.1), Normal(0, 0.5))
    np.testing.assert_allclose(out, ref_sgd(g, w0, 0.1), rtol=1e-5, atol=1e-6)


def test_adagrad_matches_reference():
    w0, g, out = run_table(AdaGrad(lr=0.2, eps=1e-6, initial_accumulator=0.1), Uniform(-1, 1))
    np.testing.assert_allclose(out, ref_adagrad(g, w0, 0.2, 1e-6, 0.1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("l1,l2", [(0.0, 0.0), (0.5, 1.0), (3.0, 0.0)])
def test_ftrl_matches_reference(l1, l2):
    _, g, out = run_table(FTRL(alpha=0.3, beta=1.0, l1=l1, l2=l2))
    ref = ref_ftrl(g, 0.3, 1.0, l1, l2)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-6)
    # L1 gives exact zeros, exactly where the reference has them
    assert ((out == 0) == (ref == 0)).all()
    if l1 >= 3.0:
        assert (out == 0).mean() > 0.5


def test_adam_matches_reference():
    w0, g, out = run_table(Adam(lr=0.01), Normal(0, 0.1))
    np.testing.assert_allclose(out, ref_adam(g, w0, 0.01, 0.9, 0.999, 1e-8), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("spec,match", [
    ({"name": "sgd", "lr": -1}, "sgd lr must be > 0"),
    ({"name": "ftrl", "alpha": float("nan")}, "alpha"),
    ({"name": "adam", "beta1": 1.0}, r"beta1 must be in \[0, 1\)"),
    ({"name": "adagrad", "eps": 0, "initial_accumulator": 0}, "0/0"),
    ({"name": "ftrl", "beta": 0, "l2": 0}, "divides by 0"),
    ({"name": "nadam"}, "unknown optimizer .nadam."),
    ({"name": "rmsprop", "rho": 1.0}, r"rho must be in \[0, 1\)"),
    ({"name": "sgd", "momentum": 0.9}, "unknown"),
])
def test_bad_hyperparameters_are_refused_clearly(spec, match):
    with pytest.raises(ConfigError, match=match):
        TableSpec("t", optimizer=spec)


def test_ftrl_needs_zero_initializer():
    with pytest.raises(ConfigError, match="initializer must be 'zeros'"):
        TableSpec("t", optimizer="ftrl", initializer="normal")


def test_initial_value_depends_only_on_seed_and_key():
    keys = np.array([0, 1, 2**64 - 1, 12345], np.uint64)
    a, b, c = (np.empty((4, 8), np.float32) for _ in range(3))
    VnodeTable(8, SGD(), Normal(0, 1), seed=7).lookup(keys, a)
    VnodeTable(8, SGD(), Normal(0, 1), seed=7, capacity=1000).lookup(keys, b)
    VnodeTable(8, SGD(), Normal(0, 1), seed=8).lookup(keys, c)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)
    assert len(np.unique(a)) == a.size  # every column differs


def test_normal_and_uniform_initializers_have_the_right_moments():
    keys = np.arange(200_000, dtype=np.uint64)
    out = np.empty((keys.size, 1), np.float32)
    VnodeTable(1, SGD(), Normal(1.0, 2.0), seed=1).lookup(keys, out)
    assert abs(out.mean() - 1.0) < 0.02 and abs(out.std() - 2.0) < 0.02
    VnodeTable(1, SGD(), Uniform(-3.0, 5.0), seed=1).lookup(keys, out)
    assert out.min() >= -3.0 and out.max() < 5.0 and abs(out.mean() - 1.0) < 0.03


@pytest.mark.parametrize("name", ["../escape", "/abs", "a/../b", "x y", "", "a/.", "./a", "a//b", "a/", "."])
def test_table_names_cannot_escape_a_checkpoint_folder(name):
    with pytest.raises(ConfigError, match="table name"):
        TableSpec(name)


def test_ftrl_adagrad_is_ftrl_on_the_linear_weight_and_adagrad_on_the_factors():
    opt = FtrlAdagrad(alpha=0.3, beta=1.0, l1=0.5, l2=1.0, lr=0.2, eps=1e-6, initial_accumulator=0.1)
    assert opt.state_width(DIM) == 2 + (DIM - 1)
    w0, g, out = run_table(opt)
    np.testing.assert_allclose(out[:, 0], ref_ftrl([x[:, :1] for x in g], 0.3, 1.0, 0.5, 1.0)[:, 0],
                               rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(out[:, 1:], ref_adagrad([x[:, 1:] for x in g], w0[:, 1:], 0.2, 1e-6, 0.1),
                               rtol=1e-5, atol=1e-6)


def test_ftrl_adagrad_checks_both_halves():
    with pytest.raises(ConfigError, match="ftrl alpha"):
        TableSpec("t", dim=3, optimizer={"name": "ftrl_adagrad", "alpha": -1})
    with pytest.raises(ConfigError, match="adagrad lr"):
        TableSpec("t", dim=3, optimizer={"name": "ftrl_adagrad", "lr": 0})


@pytest.mark.parametrize("text,expected", [
    ("ftrl:alpha=0.1", FTRL(alpha=0.1)),
    ("ftrl:alpha=0.1, l1=2", FTRL(alpha=0.1, l1=2.0)),
    ("adagrad", AdaGrad()),
])
def test_the_cli_optimizer_syntax_works_everywhere(text, expected):
    assert TableSpec("t", optimizer=text).optimizer == expected


@pytest.mark.parametrize("text,match", [("ftrl:alpha", "parameters are key=value"), ("ftrl:alpha=x", "not a number"),
                                        ("nadam:lr=1", "unknown optimizer 'nadam'")])
def test_the_cli_optimizer_syntax_names_what_is_wrong(text, match):
    with pytest.raises(ConfigError, match=match):
        TableSpec("t", optimizer=text)


@pytest.mark.parametrize("cls", [SGD, AdaGrad, FTRL, Adam, RMSProp, Normal])
def test_each_hyper_parameter_is_declared_once_and_its_fix_is_its_default(cls):
    """Every float hyper-parameter has a declared rule (``bounds``), and a value that
    breaks it is refused naming the spec, the field, the rule and the fix, which is the
    field's default unless the spec says better (``fixes``)."""
    names = [f.name for f in dataclasses.fields(cls)]
    assert list(cls.bounds) == names
    for field in names:
        if cls.bounds[field] == "a number":
            continue
        fix = cls.fixes.get(field, f"try {field}={getattr(cls(), field)!r}")
        with pytest.raises(ConfigError) as info:
            cls(**{field: -1.5})
        assert str(info.value) == (f"{cls.name} {field} must be {cls.bounds[field]} and finite, got -1.5; {fix}")
