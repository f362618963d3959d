"""Criteo-format rows whose clicks come from planted pairwise interactions: a set on which
a factorization machine has something to find that logistic regression cannot.

Run: ``python bench/fm_pairs.py --rows 1000000 --seed 1 --out /tmp/pairs.tsv
[--variant a|b] [--model-seed 0] [--no-noise]``

How a row is made (``--model-seed`` fixes the hidden model, ``--seed`` the rows, so a
train and a test file drawn with two seeds share one model):

* ``P`` of the 26 categorical fields are *pair fields*.  Each value ``v`` of pair field
  ``a`` has a hidden vector ``u_{a,v}`` in R^r, drawn N(0, σ²/ sqrt(r)) per coordinate.
  For each planted pair of fields ``(a, b)`` the logit gets ``<u_{a,x_a}, u_{b,x_b}>``.
  The vectors have mean zero, so a pair's term has no main effect: a linear model sees
  none of it.  Where every pair of the pair fields is planted (variants b, c, d, e) the
  logit is a factorization machine's own, which an FM of k >= r can fit exactly; where
  only some pairs are (variant a), an FM, with one vector a value for all its pairs, needs
  k >= r * (pairs) to leave the others out, and k = 8 cannot.
* ``M`` further fields have main effects only: a weight a value, N(0, 0.5²).
* The remaining categorical fields (1 000 values each, drawn Zipf(1.2)) and the 13
  integer fields (log-normal counts, 10 % missing) are noise: they do not enter the logit.
  ``--no-noise`` leaves them empty (the same draws, so the same labels), for a set with
  the informative fields only.
* ``logit = bias + Σ pairs + Σ main effects``; the bias is chosen (bisection on a
  sample) for a click rate of about 20 %; the label is drawn Bernoulli(σ(logit)).

Pair and main-effect values are drawn uniformly (variant ``a``) or the pair values
Zipf-like (variant ``b``); every value is written as 8 hex digits, as Criteo's are.

Variants (the noise fields fill the 26 categorical fields up):

* ``a``: 6 pair fields of 50-200 values, 6 pairs (a chain of five and one chord), r = 4,
  σ = 0.6 (the pairs' sum has sd ~0.9); 4 main-effect fields of 1 000 values.
* ``b``: 8 pair fields of 300-3 000 values drawn Zipf(1.1), all 28 pairs among them,
  r = 2, σ = 0.4 (sd ~0.85); 6 main-effect fields of 10 000 values.
* ``c``: 4 pair fields of 20-200 values, all 6 pairs, r = 4, σ = 0.71 (0.5 a coordinate);
  4 main-effect fields of 1 000 values.
* ``d``: 2 pair fields of 10 values, their one pair at r = 8, σ = 1.51 (0.9 a coordinate):
  a strong interaction of two small fields, XOR-like; 2 main-effect fields of 100 values.
* ``e``: 5 pair fields of 200-5 000 values drawn Zipf(1.1), all 10 pairs, r = 4, σ = 0.71;
  4 main-effect fields of 10 000 values.

On a and b a one-pass FM learns little even example by example (an offline per-example
AdaGrad FM: 0.004-0.005 under LR's test log loss at 10^6 rows), so they test that an FM
does no harm; c, d and e are where one pass can learn the interactions.
"""

from __future__ import annotations

import argparse
import gzip
import itertools

import numpy as np

from paramserver.apps.ctr.synth import _HEX, N_CAT, N_INT, _write_rows, bias_for
from paramserver.routing.hashing import hash64_array

VARIANTS = {
    "a": {"pair_cards": [50, 80, 100, 120, 150, 200], "pairs": [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (0, 3)],
          "rank": 4, "sigma": 0.6, "main_cards": [1000] * 4, "zipf": 0.0},
    "b": {"pair_cards": [300, 500, 800, 1000, 1500, 2000, 2500, 3000],
          "pairs": list(itertools.combinations(range(8), 2)),
          "rank": 2, "sigma": 0.4, "main_cards": [10_000] * 6, "zipf": 1.1},
    "c": {"pair_cards": [20, 50, 100, 200], "pairs": list(itertools.combinations(range(4), 2)),
          "rank": 4, "sigma": 0.5 * 4 ** 0.25, "main_cards": [1000] * 4, "zipf": 0.0},
    "d": {"pair_cards": [10, 10], "pairs": [(0, 1)], "rank": 8, "sigma": 0.9 * 8 ** 0.25,
          "main_cards": [100] * 2, "zipf": 0.0},
    "e": {"pair_cards": [200, 500, 1000, 2000, 5000], "pairs": list(itertools.combinations(range(5), 2)),
          "rank": 4, "sigma": 0.5 * 4 ** 0.25, "main_cards": [10_000] * 4, "zipf": 1.1},
}
NOISE_CARD = 1000
NOISE_ZIPF = 1.2  # noise values are drawn Zipf(1.2), as real logs' are heavy tailed
CHUNK = 100_000


class PlantedModel:
    """The hidden model of a variant: factor vectors, main effects, cardinalities."""

    def __init__(self, variant: str, seed: int, click_rate: float = 0.2):
        spec = VARIANTS[variant]
        rng = np.random.default_rng(10_000 + seed)
        self.pairs = spec["pairs"]
        self.zipf = spec["zipf"]
        n_pair, n_main = len(spec["pair_cards"]), len(spec["main_cards"])
        noise = [NOISE_CARD] * (N_CAT - n_pair - n_main)
        self.cards = np.array(spec["pair_cards"] + spec["main_cards"] + noise, np.int64)
        self.n_pair, self.n_main = n_pair, n_main
        r = spec["rank"]
        self.factors = [rng.normal(0, spec["sigma"] / r ** 0.25, (c, r)) for c in spec["pair_cards"]]
        self.mains = [rng.normal(0, 0.5, c) for c in spec["main_cards"]]
        self.bias = 0.0
        self.bias = bias_for(self.logit(self.draw(np.random.default_rng(seed + 99), 50_000)), click_rate)

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Each row's value index in each of the 26 categorical fields."""
        values = np.empty((n, N_CAT), np.int64)
        for f, card in enumerate(self.cards):
            if f >= self.n_pair + self.n_main:
                values[:, f] = (rng.zipf(NOISE_ZIPF, n) - 1) % card
            elif self.zipf > 0 and f < self.n_pair:
                values[:, f] = (rng.zipf(self.zipf, n) - 1) % card
            else:
                values[:, f] = rng.integers(0, card, n)
        return values

    def logit(self, values: np.ndarray) -> np.ndarray:
        z = np.full(values.shape[0], self.bias)
        for a, b in self.pairs:
            z += np.einsum("ij,ij->i", self.factors[a][values[:, a]], self.factors[b][values[:, b]])
        for m, w in enumerate(self.mains):
            z += w[values[:, self.n_pair + m]]
        return z


def write(path: str, rows: int, seed: int, variant: str = "a", model_seed: int = 0,
          noise: bool = True) -> dict[str, float]:
    """Write ``rows`` Criteo-format lines to ``path`` (gzip if it ends in .gz); return the
    click rate and the Bayes log loss (the planted model's own) of the rows written."""
    model = PlantedModel(variant, model_seed)
    rng = np.random.default_rng(seed)
    salt = np.arange(N_CAT, dtype=np.uint64) << np.uint64(40)
    cat_missing = np.zeros(N_CAT, np.bool_)
    cat_missing[model.n_pair + model.n_main:] = not noise
    clicks, bayes = 0, 0.0
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wb") as f:
        for start in range(0, rows, CHUNK):
            n = min(CHUNK, rows - start)
            values = model.draw(rng, n)
            p = 1 / (1 + np.exp(-model.logit(values)))
            labels = (rng.random(n) < p).astype(np.int64)
            clicks += int(labels.sum())
            bayes -= float(np.sum(np.where(labels == 1, np.log(p), np.log1p(-p))))
            ints = np.floor(rng.lognormal(1.0, 1.5, (n, N_INT))).astype(np.int64)
            int_missing = (rng.random((n, N_INT)) < 0.1) | (not noise)
            tokens = hash64_array((values.astype(np.uint64) + salt).ravel()).reshape(n, N_CAT) & np.uint64(0xFFFFFFFF)
            out = np.empty(n * (2 + N_INT * 21 + N_CAT * 9 + 1), np.uint8)
            size = _write_rows(labels, ints, int_missing, tokens, np.broadcast_to(cat_missing, (n, N_CAT)).copy(), _HEX,
                              out)
            f.write(out[:size].tobytes())
    return {"click_rate": clicks / rows, "bayes_logloss": bayes / rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, required=True)
    ap.add_argument("--seed", type=int, default=0, help="the rows' seed (a test file: another seed)")
    ap.add_argument("--out", required=True, help="output file (.gz: gzip)")
    ap.add_argument("--variant", choices=sorted(VARIANTS), default="a")
    ap.add_argument("--model-seed", type=int, default=0, help="the hidden model's seed (keep it for train and test)")
    ap.add_argument("--no-noise", action="store_true", help="leave the noise fields (and the integers) empty")
    args = ap.parse_args()
    stats = write(args.out, args.rows, args.seed, args.variant, args.model_seed, not args.no_noise)
    print(f"{args.out}: {args.rows} rows, click rate {stats['click_rate']:.4f}, "
          f"Bayes log loss {stats['bayes_logloss']:.5f}")


if __name__ == "__main__":
    main()
