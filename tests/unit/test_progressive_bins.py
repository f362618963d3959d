"""``Scores.add`` counts each score in the bin ``bins_of`` gives it (one compiled pass in
place of NumPy's calls): the edges, NaN and the clipped ends included."""

import numpy as np

from paramserver.observe.progressive import BINS, Scores, bins_of


def test_scores_count_the_bins_bins_of_gives() -> None:
    rng = np.random.default_rng(3)
    p = rng.random(5000).astype(np.float32)
    p[:6] = [0.0, 1.0, np.nan, 0.5, 1e-30, 1 - 1e-9]
    labels = (rng.random(5000) < 0.3).astype(np.float32)
    scores = Scores()
    scores.add(p[:100], labels[:100], 1.5)
    scores.add(p[100:], labels[100:], 2.5)
    with np.errstate(invalid="ignore"):
        bins = bins_of(p)
    assert np.array_equal(scores.pos, np.bincount(bins[labels > 0], minlength=BINS))
    assert np.array_equal(scores.neg, np.bincount(bins[labels <= 0], minlength=BINS))
    assert scores.n == 5000 and scores.loss == 4.0
    assert scores.pos[BINS - 1] + scores.neg[BINS - 1] >= 1 and scores.pos[0] + scores.neg[0] >= 2  # the ends
