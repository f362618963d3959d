"""`paramserver lda` against tomotopy's `LDAModel` (same K, iterations, α, β; 2 threads),
one run each (issue 15), on 20 Newsgroups (its own train/test files) and NYT (every
10th document held out), from ../shared/data/lda:

- document-completion perplexity on the held-out documents, computed here the same way
  from each model's topic-word counts: φ = (n_kw + β)/(n_k + Vβ); a document's tokens
  shuffled, the first half folds θ in (50 EM steps with φ fixed, prior α), the second
  half is scored;
- topic coherence: mean NPMI of each topic's 10 top words, over the held-out documents;
- token-iterations/s: `paramserver lda` timed as a whole command (default flags apart
  from `--workers 2`), tomotopy from its `train` call alone;
- what the scheduling buys: the log-likelihood per token after the same number of
  token updates, word blocks rotated (default) against unscheduled (`--schedule none`,
  AD-LDA: every worker samples every word from counts a round stale).

    .venv/bin/python bench/lda.py [--iterations 200] [--topics 50] [--corpora 20ng nyt]
        [--sampler auto sparse mh hybrid] [--mh-steps 2] [--no-unscheduled]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))
LDA = os.path.join(HERE, "..", "..", "shared", "data", "lda")

from paramserver.apps.rounds.corpus import Corpus, read_corpus  # noqa: E402


def split_every(c: Corpus, k: int) -> tuple[Corpus, Corpus]:
    test = np.arange(c.docs) % k == k - 1
    def part(mask: np.ndarray) -> Corpus:
        docs = np.flatnonzero(mask)
        lens = np.diff(c.doc_ptr)[docs]
        ptr = np.r_[0, np.cumsum(lens)]
        words = np.concatenate([c.words[c.doc_ptr[d]:c.doc_ptr[d + 1]] for d in docs])
        return Corpus(ptr.astype(np.int64), words.astype(np.int32), c.vocabulary)
    return part(~test), part(test)


def write_ldac(c: Corpus, path: str) -> None:
    with open(path, "w") as f:
        for d in range(c.docs):
            w, n = np.unique(c.words[c.doc_ptr[d]:c.doc_ptr[d + 1]], return_counts=True)
            f.write(f"{w.size} " + " ".join(f"{a}:{b}" for a, b in zip(w.tolist(), n.tolist())) + "\n")


def perplexity(n_kw: np.ndarray, test: Corpus, alpha: float, beta: float, seed: int = 0) -> float:
    K, V = n_kw.shape
    return fold_in_perplexity((n_kw + beta) / (n_kw.sum(1, keepdims=True) + V * beta), test, alpha, seed)


def fold_in_perplexity(phi: np.ndarray, test: Corpus, alpha: float, seed: int = 0) -> float:
    """Document completion: a test document's tokens shuffled, the first half folds θ in
    (50 EM steps with φ, K × V, fixed; prior α), the second half is scored."""
    K = phi.shape[0]
    rng = np.random.default_rng(seed)
    total, count = 0.0, 0
    for d in range(test.docs):
        w = test.words[test.doc_ptr[d]:test.doc_ptr[d + 1]].astype(np.int64)
        if w.size < 2:
            continue
        w = w[rng.permutation(w.size)]
        fold, score = w[: w.size // 2], w[w.size // 2:]
        theta = np.full(K, 1.0 / K)
        pf = phi[:, fold]
        for _ in range(50):
            resp = theta[:, None] * pf
            resp /= resp.sum(0, keepdims=True)
            theta = resp.sum(1) + alpha
            theta /= theta.sum()
        total += float(np.log(theta @ phi[:, score]).sum())
        count += score.size
    return float(np.exp(-total / count))


def npmi(n_kw: np.ndarray, ref: Corpus, top: int = 10) -> float:
    V = n_kw.shape[1]
    present = np.zeros((ref.docs, V), bool)
    for d in range(ref.docs):
        present[d, ref.words[ref.doc_ptr[d]:ref.doc_ptr[d + 1]]] = True
    D = ref.docs
    scores = []
    for k in range(n_kw.shape[0]):
        words = np.argsort(-n_kw[k])[:top]
        cols = present[:, words].astype(np.float64)
        p = cols.mean(0)
        joint = (cols.T @ cols) / D
        for i in range(top):
            for j in range(i + 1, top):
                if joint[i, j] == 0 or p[i] == 0 or p[j] == 0:
                    scores.append(-1.0)
                elif joint[i, j] == 1:
                    scores.append(1.0)
                else:
                    scores.append(float(np.log(joint[i, j] / (p[i] * p[j])) / -np.log(joint[i, j])))
    return float(np.mean(scores))


def tomotopy_run(train: Corpus, K: int, iterations: int, alpha: float, beta: float,
                 workers: int = 2) -> tuple[np.ndarray, float]:
    import tomotopy as tp

    mdl = tp.LDAModel(k=K, alpha=alpha, eta=beta, seed=0)
    for d in range(train.docs):
        w = train.words[train.doc_ptr[d]:train.doc_ptr[d + 1]]
        if w.size:
            mdl.add_doc([str(x) for x in w.tolist()])
    t = time.perf_counter()
    mdl.train(iterations, workers=workers)
    seconds = time.perf_counter() - t
    n_kw = np.zeros((K, train.vocabulary))
    cols = np.array([int(v) for v in mdl.used_vocabs])
    for k in range(K):
        n_kw[k, cols] = np.asarray(mdl.get_topic_word_dist(k, normalize=False)) - beta
    return np.maximum(np.rint(n_kw), 0), seconds


def ours(path: str, K: int, iterations: int, tmp: str, extra: list[str]) -> tuple[np.ndarray, float, dict]:
    out = os.path.join(tmp, "model")
    t = time.perf_counter()
    run = subprocess.run([sys.executable, "-m", "paramserver", "lda", "--json", "--data", path, "--topics", str(K),
                          "--iterations", str(iterations), "--workers", "2", "--save", out, *extra],
                         capture_output=True, text=True, timeout=3600)
    seconds = time.perf_counter() - t
    if run.returncode:
        raise SystemExit(f"paramserver lda failed:\n{run.stderr}")
    return np.load(os.path.join(out, "topic_word.npy")), seconds, json.loads(run.stdout.strip().splitlines()[-1])


def load_corpus(name: str, tmp: str) -> tuple[str, Corpus, Corpus] | None:
    """Corpus ``name`` (20ng: its own train and test files; nyt: every 10th document held out, the rest
    written to ``tmp``): the training file's path, the training and the test corpus; None, said, where absent."""
    if name == "20ng":
        src = os.path.join(LDA, "20newsgroups_etm", "docword.train.txt.gz")
        if not os.path.exists(src):
            print(f"skipped 20ng: {src} is absent (see ../shared/data/SOURCES.md)")
            return None
        return src, read_corpus(src), read_corpus(os.path.join(LDA, "20newsgroups_etm", "docword.test.txt.gz"))
    src = os.path.join(LDA, "nyt", "nyt.ldac.gz")
    if not os.path.exists(src):
        print(f"skipped nyt: {src} is absent (see ../shared/data/SOURCES.md)")
        return None
    train, test = split_every(read_corpus(src), 10)
    path = os.path.join(tmp, "nyt.train.ldac")
    write_ldac(train, path)
    return path, train, test


def _ours_row(name: str, path: str, train: Corpus, test: Corpus, K: int, it: int, tmp: str, flags: list[str],
              n_tp: np.ndarray, s_tp: float, unscheduled: bool) -> dict:
    """``paramserver lda`` with ``flags`` against the tomotopy run (``n_tp``, ``s_tp``): the row, printed."""
    alpha, beta, tokens = 0.1, 0.01, train.tokens * it
    n_ps, s_ps, rep = ours(path, K, it, tmp, flags)
    row = {"corpus": name, "tokens": train.tokens, "iterations": it, "sampler": rep["sampler"],
           "tomotopy": {"perplexity": perplexity(n_tp, test, alpha, beta), "npmi": npmi(n_tp, test),
                        "seconds": s_tp, "token_iterations_per_s": tokens / s_tp},
           "paramserver": {"perplexity": perplexity(n_ps, test, alpha, beta), "npmi": npmi(n_ps, test),
                           "seconds": s_ps, "token_iterations_per_s": tokens / s_ps,
                           "log_likelihood_per_token": rep["log_likelihood_per_token"]}}
    none = ours(path, K, it, tmp, ["--schedule", "none", *flags])[2] if unscheduled else None
    row["unscheduled_log_likelihood_per_token"] = none["log_likelihood_per_token"] if none else math.nan
    t, p = row["tomotopy"], row["paramserver"]
    print(f"{name}: {train.tokens:,} tokens, K={K}, {it} iterations | tomotopy (2 threads): perplexity "
          f"{t['perplexity']:.1f} NPMI {t['npmi']:.3f} {t['seconds']:.1f} s "
          f"{t['token_iterations_per_s'] / 1e6:.1f} M tok-it/s | paramserver lda ({' '.join(flags)}: "
          f"{rep['sampler']}, --workers 2, whole command): perplexity {p['perplexity']:.1f} "
          f"({p['perplexity'] / t['perplexity']:.3f}x) "
          f"NPMI {p['npmi']:.3f} {p['seconds']:.1f} s {p['token_iterations_per_s'] / 1e6:.1f} M tok-it/s "
          f"({p['token_iterations_per_s'] / t['token_iterations_per_s']:.2f}x) | log-lik/token after "
          f"{it} iterations: rotated {p['log_likelihood_per_token']:.4f}, unscheduled "
          f"{row['unscheduled_log_likelihood_per_token']:.4f}", flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--topics", type=int, default=50)
    ap.add_argument("--corpora", nargs="+", default=["20ng", "nyt"])
    ap.add_argument("--sampler", nargs="+", default=["auto"], choices=("auto", "sparse", "mh", "hybrid"),
                    help="paramserver lda's --sampler, each run against the same tomotopy run (default: auto, "
                         "its default)")
    ap.add_argument("--mh-steps", type=int, default=None, help="paramserver lda's --mh-steps (default: its own)")
    ap.add_argument("--no-unscheduled", action="store_true", help="skip the --schedule none run")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    steps = [] if args.mh_steps is None else ["--mh-steps", str(args.mh_steps)]
    alpha, beta, K, it = 0.1, 0.01, args.topics, args.iterations
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.corpora:
            found = load_corpus(name, tmp)
            if found is None:
                continue
            path, train, test = found
            n_tp, s_tp = tomotopy_run(train, K, it, alpha, beta)
            for sampler in args.sampler:
                rows.append(_ours_row(name, path, train, test, K, it, tmp, ["--sampler", sampler, *steps],
                                      n_tp, s_tp, not args.no_unscheduled))
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
