"""FTRL's α chosen from the data (``apps/ctr/step_size.py``, ``--optimizer ftrl:alpha=auto``, LR's
default): the replay is the job's learner, it picks the α the data wants, and the flags around it
(a partial ``--optimizer``, ``auto`` where it cannot be) say what they do."""

from __future__ import annotations

import math

import numpy as np
import pytest

from paramserver.apps.ctr import step_size
from paramserver.apps.ctr.models import Model
from paramserver.apps.ctr.step_size import (
    ALPHAS,
    BETA_FALLBACK,
    BETAS,
    FALLBACK,
    StepSize,
    choose,
    for_job,
    progressive,
)
from paramserver.apps.ctr.train_config import TrainConfig
from paramserver.cli.ctr_flags import parse_optimizer
from paramserver.data.batch import DataFormat
from paramserver.errors import ConfigError
from paramserver.tables.optim import FTRL

AUTO_BOTH = {"alpha": "auto", "beta": "auto"}


def _reference(labels, indptr, ids, alpha, beta, l1, l2, ramp, largest, first):
    """FTRL-Proximal as tables/update_rules.py writes it, one α, float64, dicts: the mean log loss of
    examples ``first`` on, each scored before its batch's update."""
    w, z, n = {}, {}, {}
    seen, loss, total = 0, 0.0, len(labels)
    while seen < total:
        b = max(1, min(largest, int(ramp * math.sqrt(seen)))) if ramp > 0 else largest
        hi, g = min(total, seen + b), {}
        for i in range(seen, hi):
            keys = ids[indptr[i]:indptr[i + 1]]
            p = 1 / (1 + math.exp(-sum(w.get(k, 0.0) for k in keys)))
            if i >= first:
                p_ = min(max(p, 1e-15), 1 - 1e-15)
                loss -= labels[i] * math.log(p_) + (1 - labels[i]) * math.log(1 - p_)
            for k in keys:
                g[k] = g.get(k, 0.0) + p - labels[i]
        for k, gk in g.items():
            old, grown = n.get(k, 0.0), n.get(k, 0.0) + gk * gk
            z[k] = z.get(k, 0.0) + gk - (math.sqrt(grown) - math.sqrt(old)) / alpha * w.get(k, 0.0)
            n[k] = grown
            w[k] = 0.0 if abs(z[k]) <= l1 else -(z[k] - math.copysign(l1, z[k])) / ((beta + math.sqrt(grown)) / alpha
                                                                                   + l2)
        seen = hi
    return loss / (total - first)


def _rows(seed, n, effect, fields=6, vocabulary=80):
    """``n`` rows of one key in each of ``fields`` fields of ``vocabulary`` values (Zipf-like),
    each value with an effect of ``effect`` times a normal draw on the label's log-odds, a
    bias key first: ``labels, indptr, ids, ids' count``."""
    rng = np.random.default_rng(seed)
    weights = rng.normal(0, effect, fields * vocabulary)
    keys = np.minimum(rng.zipf(1.3, (n, fields)), vocabulary) - 1 + np.arange(fields) * vocabulary
    ids = np.concatenate([np.zeros((n, 1), np.int64), keys + 1], axis=1)
    margin = weights[keys].sum(axis=1) - 0.5
    labels = (rng.random(n) < 1 / (1 + np.exp(-margin))).astype(np.float64)
    return labels, np.arange(0, ids.size + 1, ids.shape[1], dtype=np.int64), ids.reshape(-1), fields * vocabulary + 1


def test_the_replay_is_ftrl_as_the_job_learns_it_for_every_alpha_and_beta_at_once():
    labels, indptr, ids, n_ids = _rows(1, 600, 0.8)
    pairs = [(a, b) for b in BETAS for a in ALPHAS]
    args = (0.3, 0.1, 1.0, 64, 300)  # L1, L2, ramp, largest batch, first scored
    got = progressive(labels, indptr, ids, np.zeros(0), n_ids, np.array([a for a, _ in pairs]),
                      np.array([b for _, b in pairs]), *args)
    want = [_reference(labels, indptr, ids, a, b, *args) for a, b in pairs]
    np.testing.assert_allclose(got, want, rtol=1e-5)  # its state is float32, the reference's float64


def test_values_scale_each_occurrence():
    labels, indptr, ids, n_ids = _rows(2, 300, 0.8)
    alphas, betas = np.array(ALPHAS), np.full(len(ALPHAS), 0.5)
    ones = progressive(labels, indptr, ids, np.zeros(0), n_ids, alphas, betas, 0.0, 0.0, 1.0, 64, 0)
    same = progressive(labels, indptr, ids, np.ones(ids.size), n_ids, alphas, betas, 0.0, 0.0, 1.0, 64, 0)
    halved = progressive(labels, indptr, ids, np.full(ids.size, 0.5), n_ids, alphas, betas, 0.0, 0.0, 1.0, 64, 0)
    np.testing.assert_allclose(ones, same, rtol=1e-6)
    assert not np.allclose(ones, halved, rtol=1e-3)


def _write(path, labels, indptr, ids):
    with open(path, "w") as f:
        for i, y in enumerate(labels):
            f.write(f"{int(y)} " + " ".join(f"{k}:1" for k in ids[indptr[i] + 1:indptr[i + 1]]) + "\n")
    return str(path)


def test_strong_effects_take_a_bigger_step_than_faint_ones(tmp_path):
    """Keys with big effects want big steps; keys whose effects are faint against the labels'
    noise want small ones (the two generators of docs/benchmarks.md, in miniature)."""
    fmt, ftrl = DataFormat("libsvm"), {"name": "ftrl", "alpha": "auto", "beta": 0.5, "l1": 0.0, "l2": 0.0}
    strong = choose([_write(tmp_path / "strong.svm", *_rows(3, 6000, 2.0)[:3])], fmt, ftrl, 1.0, 4000)
    faint = choose([_write(tmp_path / "faint.svm", *_rows(4, 6000, 0.05)[:3])], fmt, ftrl, 1.0, 4000)
    assert strong.how == faint.how == "auto" and strong.rows == faint.rows == 6000
    assert strong.alpha > faint.alpha, (strong, faint)
    for found in (strong, faint):  # the one chosen is the lowest of those replayed, all α at the β given
        assert found.tried == tuple((a, 0.5) for a in ALPHAS) and found.beta == 0.5
        assert found.alpha == ALPHAS[int(np.argmin(found.losses))]


def test_a_prefix_is_all_that_is_read(tmp_path):
    path = _write(tmp_path / "rows.svm", *_rows(5, 3000, 1.0)[:3])
    found = choose([path], DataFormat("libsvm"), {**AUTO_BOTH, "l1": 0.0, "l2": 0.0}, 1.0, 4000, rows=1000)
    assert len(found.tried) == len(ALPHAS) * len(BETAS) and (found.alpha, found.beta) in found.tried
    assert found.rows == 1000


def test_too_few_rows_keep_the_fallback_and_say_why(tmp_path):
    path = _write(tmp_path / "rows.svm", *_rows(6, 10, 1.0)[:3])
    found = choose([path], DataFormat("libsvm"), {**AUTO_BOTH, "l1": 0.0, "l2": 0.0}, 1.0, 4000)
    assert found == StepSize(FALLBACK, "fallback", why="10 rows, fewer than the 64 a choice needs", beta=BETA_FALLBACK)
    given = choose([path], DataFormat("libsvm"), {"alpha": 0.2, "beta": "auto", "l1": 0.0, "l2": 0.0}, 1.0, 4000)
    assert (given.alpha, given.beta) == (0.2, BETA_FALLBACK)  # what is given stays given


def test_how_a_job_finds_its_alpha():
    auto = {"name": "ftrl", "alpha": "auto", "beta": 0.5, "l1": 0.0, "l2": 0.0}
    fmt = DataFormat()
    assert for_job({**auto, "alpha": 0.1}, ["a.tsv"], fmt, 1.0, 4000, stream=False, resume=False) is None
    assert for_job(auto, ["a.tsv"], fmt, 1.0, 4000, stream=False, resume=False).how == "auto"
    assert for_job(auto, ["a.tsv"], fmt, 1.0, 4000, stream=False, resume=True).how == "resumed"
    assert for_job(auto, ["a.tsv"], fmt, 1.0, 4000, stream=True, resume=False).how == "fallback"
    assert for_job(auto, ["-"], fmt, 1.0, 4000, stream=False, resume=False).how == "fallback"


def test_the_replay_in_its_thread_says_what_stopped_it(tmp_path):
    bad = tmp_path / "bad.svm"
    bad.write_text("1 1:1\n" * 100 + "7 1:1\n")  # a label the format does not take, as the job would say it
    with pytest.raises(Exception, match="bad.svm:101"):
        step_size.Choosing(step_size.Replay([str(bad)], DataFormat("libsvm"), {**AUTO_BOTH, "l1": 0.0, "l2": 0.0},
                                            1.0, 4000)).result()


def test_lr_defaults_to_auto_and_its_spec_stands_in_the_fallback_until_chosen():
    cfg = TrainConfig(model=Model("lr"))
    assert cfg.optimizer_wire()["alpha"] == cfg.optimizer_wire()["beta"] == "auto"
    assert (cfg.table_spec().optimizer.alpha, cfg.table_spec().optimizer.beta) == (FALLBACK, BETA_FALLBACK)
    assert cfg.with_step(0.065, 0.1).table_spec().optimizer.to_wire()["beta"] == 0.1
    for model in ("fm", "deepfm", "wdl"):  # their linear weights too
        assert TrainConfig(model=Model(model)).optimizer_wire()["alpha"] == "auto"


def test_a_partial_optimizer_keeps_the_models_defaults():
    """``--optimizer ftrl:alpha=0.2`` for LR keeps its β 0.5 and no L1 (FTRL's own defaults, β 1
    and L1 1, came with it before); another rule is as given."""
    lr = TrainConfig(model=Model("lr"), optimizer=parse_optimizer("ftrl:alpha=0.2"))
    assert lr.table_spec().optimizer.to_wire() == {"name": "ftrl", "alpha": 0.2, "beta": 0.5, "l1": 0.0, "l2": 0.0}
    assert TrainConfig(model=Model("lr"), optimizer=parse_optimizer("FTRL:l1=2")).optimizer_wire()["l1"] == 2.0
    api = TrainConfig(model=Model("lr"), optimizer="ftrl:alpha=0.2")  # the API's text (PSClassifier's) alike
    assert api.table_spec().optimizer == lr.table_spec().optimizer
    whole = TrainConfig(model=Model("lr"), optimizer=FTRL(alpha=0.2))  # a rule object: every value its own
    assert whole.table_spec().optimizer == FTRL(alpha=0.2) and FTRL(alpha=0.2).l1 == 1.0
    adagrad = TrainConfig(model=Model("lr"), optimizer=parse_optimizer("adagrad:lr=0.1")).table_spec().optimizer
    assert adagrad.to_wire()["name"] == "adagrad" and adagrad.to_wire()["lr"] == 0.1
    fm = TrainConfig(model=Model("fm"), optimizer=parse_optimizer("ftrl_adagrad:lr=0.02")).optimizer_wire()
    assert fm["alpha"] == "auto" and fm["lr"] == 0.02 and fm["initial_accumulator"] == 20.0


def test_auto_is_for_logistic_regressions_ftrl():
    assert parse_optimizer("ftrl:alpha=auto,l1=1") == {"name": "ftrl", "alpha": "auto", "l1": 1.0}
    TrainConfig(model=Model("fm"), optimizer=parse_optimizer("ftrl_adagrad:alpha=auto")).table_spec()
    for model, rule in (("fm", "ftrl"), ("deepfm", "ftrl"), ("lr", "ftrl_adagrad")):
        with pytest.raises(ConfigError, match="for the linear weights of --model lr with ftrl"):
            TrainConfig(model=Model(model), optimizer=parse_optimizer(f"{rule}:alpha=auto")).table_spec()
    assert parse_optimizer("ftrl:beta=auto,alpha=0.1") == {"name": "ftrl", "alpha": 0.1, "beta": "auto"}
    with pytest.raises(ConfigError, match="only alpha and beta may be auto.*give l1 a number"):
        parse_optimizer("ftrl:l1=auto")
    with pytest.raises(ConfigError, match="alpha is given twice"):
        parse_optimizer("ftrl:alpha=auto,alpha=0.1")


def test_a_resumed_auto_job_goes_on_with_the_checkpoints_alpha_and_a_given_one_is_checked():
    """``--resume`` of a job whose α was chosen: this run's ``auto`` takes the checkpoint's α (as
    ``auto``'s layout does); an α given that differs from it is refused, naming the flag."""
    from paramserver.apps.ctr.resume import _check_tables

    cfg = TrainConfig(model=Model("lr"))
    theirs = cfg.with_step(0.22, 0.1).table_spec()
    manifest = {"tables": {theirs.name: theirs.to_wire()}}
    spec = _check_tables("step-1", manifest, cfg.table_spec(), cfg)
    assert spec.optimizer.alpha == 0.22 and spec.optimizer.beta == 0.1
    given = cfg.with_step(0.09, 0.5)
    with pytest.raises(ConfigError, match="--optimizer"):
        _check_tables("step-1", manifest, given.table_spec(), given)


def test_wide_rows_are_replayed_up_to_a_bound_of_features(tmp_path, monkeypatch):
    monkeypatch.setattr(step_size, "PREFIX_OCCURRENCES", 700)
    path = _write(tmp_path / "rows.svm", *_rows(7, 3000, 1.0)[:3])  # 7 features a row, the bias among them
    found = choose([path], DataFormat("libsvm"), {**AUTO_BOTH, "l1": 0.0, "l2": 0.0}, 1.0, 4000)
    assert found.how == "auto" and found.rows == 100  # 100 rows of 7: 700 features
