"""The LDA samplers' kernels side by side in one process (issue 49): SparseLDA's split
(``lda_sampler._sample``, the default) against LightLDA's Metropolis–Hastings cycle
(``lda_mh``, ``--sampler mh``), and optionally tomotopy, on one thread each, the whole
vocabulary one block.  Their iterations interleave (one sweep of each in turn), so a
busy machine slows both alike: the ratio is what to read, not the absolute speed.

Held-out perplexity after the same sweeps is ``bench/lda.py``'s document completion.

    .venv/bin/python bench/lda_kernels.py [--corpus 20ng|nyt] [--topics 50 200 1000] [--iterations 200]
        [--mh-steps 2] [--mh-iterations N] [--tomotopy]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))
sys.path.insert(0, HERE)

from lda import load_corpus, perplexity, tomotopy_run  # noqa: E402
from paramserver.apps.rounds.corpus import Corpus  # noqa: E402
from paramserver.apps.rounds.lda_mh import MHIndex  # noqa: E402
from paramserver.apps.rounds.lda_sampler import _doc_lists, _sample  # noqa: E402

ALPHA, BETA = 0.1, 0.01


class Chain:
    """One sampler's state over the whole corpus: tokens sorted by (word, doc), a segment a word."""

    def __init__(self, c: Corpus, K: int, sampler: str, steps: int, seed: int = 0):
        lens = np.diff(c.doc_ptr)
        docs = np.repeat(np.arange(c.docs), lens)
        order = np.lexsort((docs, c.words))
        self.words, self.docs = c.words[order].astype(np.int32), docs[order].astype(np.int32)
        self.z = np.random.default_rng(seed).integers(0, K, self.words.size).astype(np.int32)
        self.V, self.K, self.sampler = c.vocabulary, K, sampler
        self.nwk = np.zeros((c.vocabulary, K), np.int32)
        np.add.at(self.nwk, (self.words, self.z), 1)
        self.nk = np.bincount(self.z, minlength=K).astype(np.int64)
        self.ndk = np.zeros((c.docs, K), np.uint16)
        self.doff = np.r_[0, np.cumsum(np.minimum(lens, K))].astype(np.int64)
        self.dtop = np.zeros(max(int(self.doff[-1]), 1), np.uint16)
        self.dcnt = np.zeros(c.docs, np.int32)
        _doc_lists(self.docs, self.z, self.ndk, self.dtop, self.doff, self.dcnt)
        starts = np.flatnonzero(np.r_[True, self.words[1:] != self.words[:-1]])
        self.seg_ptr = np.r_[starts, self.words.size].astype(np.int64)
        self.seg_row = self.words[starts].astype(np.int64)
        self.Y, self.cum = np.zeros(K), np.zeros(K)
        self.mh = MHIndex(self.docs, self.z, lens, K, steps) if sampler == "mh" else None
        self.seconds, self.sweeps = 0.0, 0

    def sweep(self, seed: int) -> None:
        t = time.perf_counter()
        n = self.seg_row.size
        if self.mh is not None:
            self.mh.sample(self.seg_row, self.seg_ptr, 0, n, self.docs, self.z, self.nwk, self.nk, self.ndk, ALPHA,
                           BETA, self.V * BETA, seed)
        else:
            _sample(self.seg_row, self.seg_ptr, 0, n, self.docs, self.z, self.nwk, self.nk, self.ndk, self.dtop,
                    self.doff, self.dcnt, ALPHA, BETA, self.V * BETA, self.Y, self.cum, seed)
        self.seconds += time.perf_counter() - t
        self.sweeps += 1

    def loglik_per_token(self) -> float:
        from paramserver.apps.rounds.lda_sampler import _doc_loglik, word_loglik

        lens = np.bincount(self.docs, minlength=self.ndk.shape[0])
        total = word_loglik(self.nwk.T.astype(np.int64), BETA) + _doc_loglik(self.ndk, lens, ALPHA)
        return float(total / self.z.size)


def run(train: Corpus, test: Corpus, K: int, iterations: int, steps: list[int], tomotopy: bool,
        mh_iterations: int) -> list[dict]:
    chains = {"sparse": Chain(train, K, "sparse", 0)} | {f"mh{s}": Chain(train, K, "mh", s) for s in steps}
    for c in chains.values():  # compile outside the clock
        c.sweep(0)
        c.seconds, c.sweeps = 0.0, 0
    for i in range(1, max(iterations, mh_iterations)):  # one sweep already done
        for name, c in chains.items():
            if i < (iterations if name == "sparse" else mh_iterations):
                c.sweep(i)
    rows = []
    for name, c in chains.items():
        rate = train.tokens * c.sweeps / c.seconds
        rows.append({"K": K, "sampler": name, "sweeps": c.sweeps + 1, "seconds": c.seconds,
                     "token_iterations_per_s": rate,
                     "perplexity": perplexity(c.nwk.T.astype(np.float64), test, ALPHA, BETA),
                     "log_likelihood_per_token": c.loglik_per_token()})
    if tomotopy:
        n_kw, seconds = tomotopy_run(train, K, iterations, ALPHA, BETA, workers=1)
        rows.append({"K": K, "sampler": "tomotopy (1 thread)", "token_iterations_per_s": train.tokens * iterations /
                     seconds, "perplexity": perplexity(n_kw, test, ALPHA, BETA)})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default="20ng", choices=("20ng", "nyt"))
    ap.add_argument("--topics", type=int, nargs="+", default=[50, 200, 1000])
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--mh-steps", type=int, nargs="+", default=[2])
    ap.add_argument("--mh-iterations", type=int, help="the MH chains' sweeps (default --iterations): time to a "
                    "perplexity")
    ap.add_argument("--tomotopy", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        found = load_corpus(args.corpus, tmp)
        if found is None:
            return 1
        _, train, test = found
        for K in args.topics:
            print(f"uptime: {os.getloadavg()}", flush=True)
            for row in run(train, test, K, args.iterations, args.mh_steps, args.tomotopy,
                           args.mh_iterations or args.iterations):
                print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
