"""An FM at default flags learns pairwise interactions in one pass where they exist
(issue 33.6): on rows whose clicks come from an interaction of two fields, with no main
effect a linear model could see, it beats LR's test log loss by a clear margin."""

import numpy as np

from paramserver.apps.ctr.models import Model
from paramserver.apps.ctr.train import TrainConfig, run_training


def write_planted_pairs(path: str, rows: int, seed: int) -> None:
    """Criteo rows whose click logit is a bias, plus ⟨u_a, u_b⟩ for the values of two
    10-value fields (rank 8, mean zero: no main effect), plus main effects of two 100-value
    fields; the 22 other categorical fields are Zipf(1.2) noise, the integers empty.  The
    hidden model is the same for every seed (bench/fm_pairs.py writes larger sets)."""
    hidden = np.random.default_rng(0)
    u = hidden.normal(0, 0.9, (2, 10, 8))
    main = hidden.normal(0, 0.5, (2, 100))
    rng = np.random.default_rng(seed)
    pair = rng.integers(0, 10, (rows, 2))
    mains = rng.integers(0, 100, (rows, 2))
    noise = (rng.zipf(1.2, (rows, 22)) - 1) % 1000
    logit = (-1.9 + np.einsum("ij,ij->i", u[0][pair[:, 0]], u[1][pair[:, 1]])
             + main[0][mains[:, 0]] + main[1][mains[:, 1]])
    labels = rng.random(rows) < 1 / (1 + np.exp(-logit))
    values = np.concatenate([pair, mains, noise], axis=1) + np.arange(26) * 1000  # a field's own values
    with open(path, "w") as f:
        for y, vals in zip(labels, values, strict=True):
            f.write(f"{int(y)}" + "\t" * 14 + "\t".join(f"{v:08x}" for v in vals) + "\n")


def test_fm_at_default_flags_learns_a_planted_interaction_in_one_pass(tmp_path):
    train, test = str(tmp_path / "train.tsv"), str(tmp_path / "test.tsv")
    write_planted_pairs(train, 60_000, seed=1)
    write_planted_pairs(test, 5_000, seed=2)
    lr = run_training(TrainConfig(Model("lr")), [train], [test], servers=1, workers=1)
    fm = run_training(TrainConfig(Model("fm")), [train], [test], servers=1, workers=1)
    assert lr["examples"] == fm["examples"] == 60_000 and fm["test_examples"] == 5_000
    # measured: LR 0.522, FM 0.453 (FM at the earlier defaults: 0.504, which this fails)
    assert fm["logloss"] <= lr["logloss"] - 0.03, (fm["logloss"], lr["logloss"])
    assert fm["auc"] >= lr["auc"] + 0.05, (fm["auc"], lr["auc"])
