"""``paramserver lda``: latent Dirichlet allocation by collapsed Gibbs sampling, the
word–topic counts on the servers, word blocks scheduled so that no two workers ever
sample the same word at once (STRADS' LDA; LightLDA's model-parallel blocks).

Documents are cut into W parts (one a worker, balanced by tokens) and the vocabulary
into W word blocks (balanced by tokens).  The servers hold ``n_wk`` (table
``lda/word_topic``, a row of K counts a word).  An iteration is W rounds; in round s,
worker q pulls word block ``(q + s) mod W``, samples every token of those words in its
documents, and pushes what changed with ``add``.  A word's counts are thus exact while it
is sampled; only the topic totals ``n_k`` are a round stale (each worker's change to
them is exchanged at every round's end, exactly, through ``lda/topic_delta``).

The sampler is SparseLDA's split, taken word by word: for token (d, w),
``p(k) ∝ n_dk·Y_k + α·Y_k`` with ``Y_k = (n_wk + β)/(n_k + Vβ)``.  ``Y`` is built once
a word and kept up to date in O(1) a token; the first bucket runs over the document's
non-zero topics only (a list a document), the second (``α Σ Y``, a few per cent of the
mass) is scanned only when the draw falls in it.  So a token costs O(K_d), not O(K).

A worker that dies is survived: the others adopt its documents from its last
round-boundary snapshot, and the counts on the servers are rebuilt from every
document's topics, so ``Σ_k n_wk`` stays each word's count in the corpus.

This module holds the sampler's kernels and the driver (``run_lda``); a worker's side, the
program and the parts it holds, is in ``lda_program``.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from numba import njit

from paramserver.apps.rounds.corpus import Corpus, read_corpus, top_words, vocabulary_size
from paramserver.apps.rounds.job import Ran, RoundsJob, Watch, check_outputs, write_metrics
from paramserver.apps.rounds.program import NO_CHECKPOINTS, CheckpointOptions, RoundResume, balanced_groups
from paramserver.errors import ConfigError, check_flags

WORD_TOPIC, TOPIC_DELTA = "lda/word_topic", "lda/topic_delta"
MAX_COUNT = 1 << 24  # a word–topic count is a float32 on the servers: exact below this


@njit(cache=True)
def _seed(seed):  # type: ignore[no-untyped-def]
    np.random.seed(seed)


@njit(nogil=True, cache=True)
def _sample(seg_row, seg_ptr, s_lo, s_hi, tdoc, z, nwk, nk, ndk, dtop, doff, dcnt, alpha, beta, vbeta, Y, cum):  # type: ignore[no-untyped-def]
    """Gibbs-sample the tokens of segments ``[s_lo, s_hi)`` (one word each; the word's
    counts are row ``seg_row[s]`` of ``nwk``) in place: ``z``, ``nwk``, ``nk``, ``ndk``
    and the documents' non-zero topic lists ``dtop[doff[d]:doff[d] + dcnt[d]]``."""
    K = nk.shape[0]
    for s in range(s_lo, s_hi):
        nw = nwk[seg_row[s]]
        wsum = 0.0
        for k in range(K):
            Y[k] = (nw[k] + beta) / (nk[k] + vbeta)
            wsum += Y[k]
        wsum *= alpha
        for t in range(seg_ptr[s], seg_ptr[s + 1]):
            d, old = tdoc[t], z[t]
            base = doff[d]
            nw[old] -= 1
            nk[old] -= 1
            c = ndk[d, old] - 1
            ndk[d, old] = c
            if c == 0:  # the topic leaves the document's list
                n = dcnt[d]
                for j in range(n):
                    if dtop[base + j] == old:
                        dtop[base + j] = dtop[base + n - 1]
                        break
                dcnt[d] = n - 1
            y = (nw[old] + beta) / (nk[old] + vbeta)
            wsum += alpha * (y - Y[old])
            Y[old] = y
            dsum = 0.0
            n = dcnt[d]
            for j in range(n):
                k = dtop[base + j]
                dsum += ndk[d, k] * Y[k]
                cum[j] = dsum
            u = np.random.random() * (dsum + wsum)
            new = -1
            if u < dsum:
                for j in range(n):
                    if u < cum[j]:
                        new = dtop[base + j]
                        break
            if new < 0:  # the smoothing bucket: α·Y_k
                u -= dsum
                acc = 0.0
                new = K - 1
                for k in range(K):
                    acc += alpha * Y[k]
                    if u < acc:
                        new = k
                        break
            nw[new] += 1
            nk[new] += 1
            c = ndk[d, new] + 1
            ndk[d, new] = c
            if c == 1:
                dtop[base + dcnt[d]] = new
                dcnt[d] += 1
            y = (nw[new] + beta) / (nk[new] + vbeta)
            wsum += alpha * (y - Y[new])
            Y[new] = y
            z[t] = new


@njit(nogil=True, cache=True)
def _doc_lists(tdoc, z, ndk, dtop, doff, dcnt):  # type: ignore[no-untyped-def]
    """``ndk`` and the non-zero topic lists from the tokens' topics (all zero on entry)."""
    for t in range(z.shape[0]):
        d, k = tdoc[t], z[t]
        ndk[d, k] += 1
        if ndk[d, k] == 1:
            dtop[doff[d] + dcnt[d]] = k
            dcnt[d] += 1


@njit(nogil=True, cache=True)
def _doc_loglik(ndk, dlen, alpha):  # type: ignore[no-untyped-def]
    """Σ_d [Σ_k lgamma(n_dk + α) − lgamma(n_d + Kα)] + D·[lgamma(Kα) − K·lgamma(α)]."""
    K = ndk.shape[1]
    total = 0.0
    for d in range(ndk.shape[0]):
        for k in range(K):
            if ndk[d, k]:
                total += math.lgamma(ndk[d, k] + alpha) - math.lgamma(alpha)
        total += math.lgamma(K * alpha) - math.lgamma(dlen[d] + K * alpha)
    return total


@njit(nogil=True, cache=True)
def word_loglik(n_kw, beta):  # type: ignore[no-untyped-def]
    """log p(w | z) = Σ_k [Σ_w lgamma(n_kw + β) − lgamma(n_k + Vβ)] + K·[lgamma(Vβ) − V·lgamma(β)]."""
    K, V = n_kw.shape
    total = 0.0
    for k in range(K):
        n = 0
        for w in range(V):
            c = n_kw[k, w]
            if c:
                total += math.lgamma(c + beta) - math.lgamma(beta)
                n += c
        total += math.lgamma(V * beta) - math.lgamma(n + V * beta)
    return total


@dataclass(frozen=True)
class LDAConfig:
    topics: int = 50
    iterations: int = 200
    alpha: float = 0.1
    beta: float = 0.01
    seed: int = 0
    schedule: str = "rotate"  # or "none": every worker samples every word each round (AD-LDA), to compare
    staleness: int = 0  # rounds a worker may run ahead of the slowest (SSP); 0: BSP rounds

    @property
    def regions(self) -> int:
        """Slots of ``lda/topic_delta`` a worker has: 2s + 2 for the rounds, one for the
        start, one for a recount after a death or a resume.  Round q's slot is written
        again by round q + 2s + 2: a worker takes round q's pull before it arrives at
        round q + s + 1, and nobody starts round q + 2s + 2 before all have arrived there."""
        return 2 * self.staleness + 4

    @property
    def round_regions(self) -> int:
        return 2 * self.staleness + 2


def check_config(cfg: LDAConfig, workers: int, servers: int) -> None:
    check_flags([
        ("--topics", cfg.topics, 2 <= cfg.topics <= 65_535, "a whole number in [2, 65535]"),
        ("--iterations", cfg.iterations, cfg.iterations >= 1, "a whole number >= 1"),
        ("--alpha", cfg.alpha, math.isfinite(cfg.alpha) and cfg.alpha > 0, "a number > 0"),
        ("--beta", cfg.beta, math.isfinite(cfg.beta) and cfg.beta > 0, "a number > 0"),
        ("--schedule", cfg.schedule, cfg.schedule in ("rotate", "none"), "rotate or none"),
        ("--staleness", cfg.staleness, isinstance(cfg.staleness, int) and 0 <= cfg.staleness <= 64,
         "a whole number in [0, 64] (rounds a worker may run ahead; 0: BSP)"),
        ("--workers", workers, workers >= 1, "a whole number >= 1"),
        ("--servers", servers, servers >= 1, "a whole number >= 1"),
    ])


def run_lda(data: str, *, cfg: LDAConfig, workers: int, servers: int, save: str | None = None,
            metrics_out: str | None = None, vocabulary: str | None = None,
            checkpoints: CheckpointOptions = NO_CHECKPOINTS,
            cluster_options: dict[str, Any] | None = None, replicas: int = 1,
            allow_loss: bool = False, filters: Any = None, watch: Watch | None = None) -> dict[str, Any]:
    """``paramserver lda``: sample, write ``save/topic_word.npy`` and the metrics; the report.
    ``checkpoints.every`` counts iterations.  ``replicas``: copies of every vnode; a server's
    death that loses data fails the run (``DataLossError``) unless ``allow_loss``."""
    # the workers' side builds on the kernels here: it is loaded once the job runs
    from paramserver.apps.rounds.lda_program import lda_worker, write_parts

    check_config(cfg, workers, servers)
    check_outputs(save, metrics_out)
    checkpoints.check()
    t0 = time.perf_counter()
    corpus = read_corpus(data)
    V, vocabulary = vocabulary_size(data, corpus, vocabulary)
    K = cfg.topics
    freq = word_counts(data, corpus, V)
    word_block = balanced_groups(freq, workers)
    # what the parts and the tables depend on; --iterations may change on a resume
    meta = {"app": "lda", "workers": workers, "topics": K, "seed": cfg.seed, "schedule": cfg.schedule,
            "staleness": cfg.staleness,
            "tokens": int(corpus.tokens), "docs": int(corpus.docs), "vocabulary": int(V)}
    cps, resume = checkpoints.plan(meta, rounds_a_unit=workers if cfg.schedule == "rotate" else 1)
    with RoundsJob(servers=servers, workers=workers, cluster_options=cluster_options, allow_loss=allow_loss,
                   replicas=replicas, filters=filters, watch=watch,
                   scratch_prefix="paramserver-lda-") as job:
        paths = write_parts(job.scratch, corpus, word_block, workers)
        job.tables(resume, lambda client: _create_tables(client, cfg, V, workers, job.table_options))
        ran = job.run(lda_worker, paths, word_block, cfg, V, job.scratch, cps, resume)
        keys, rows = job.client.export_table(WORD_TOPIC)
    n_kw = np.zeros((K, V), np.int64)
    inside = keys < V
    n_kw[:, keys[inside].astype(np.int64)] = np.rint(rows[inside]).astype(np.int64).T
    loglik = word_loglik(n_kw, cfg.beta) + sum(r["doc_loglik"] for r in ran.per_worker)
    words = top_words(n_kw, data, vocabulary)
    if save:
        os.makedirs(save, exist_ok=True)
        np.save(os.path.join(save, "topic_word.npy"), n_kw)
        if words is not None:  # what a person reads first: a topic a line, its 10 most frequent words
            with open(os.path.join(save, "topics.txt"), "w", encoding="utf-8") as f:
                f.writelines(f"{t}\t{' '.join(w)}\n" for t, w in enumerate(words))
    report = {"log_likelihood_per_token": loglik / corpus.tokens, "tokens": corpus.tokens, "docs": corpus.docs,
              "vocabulary": V, "vocabulary_file": vocabulary, "top_words": words,
              **_run_report(cfg, corpus, n_kw, freq, ran, resume, time.perf_counter() - t0, workers, servers),
              **job.losses.report(), **job.wire(ran)}
    write_metrics(metrics_out, report)
    return report


def word_counts(data: str, corpus: Corpus, vocabulary: int) -> np.ndarray:
    """How often each word occurs in ``corpus`` (read from ``data``).

    Raises:
        ConfigError: a word too frequent for its word–topic counts to stay exact."""
    freq = np.bincount(corpus.words, minlength=vocabulary)
    if freq.max() >= MAX_COUNT:
        w = int(freq.argmax())
        raise ConfigError(f"{data}: word {w} occurs {int(freq.max()):,} times; a word–topic count is kept exactly "
                          f"only below {MAX_COUNT:,} (2^24, float32 on the servers): drop stop words or split the "
                          "corpus")
    return freq


def _create_tables(client: Any, cfg: LDAConfig, vocabulary: int, workers: int, options: dict[str, Any]) -> None:
    """A fresh job's tables, empty: the word–topic counts (a row of K a word), and the
    slots through which the workers exchange their changes to the topic totals."""
    K = cfg.topics
    client.create_table(WORD_TOPIC, dim=K, optimizer="sgd", key_bits=max(int(vocabulary - 1).bit_length(), 1),
                        **options)
    client.create_table(TOPIC_DELTA, dim=2 * K, optimizer="sgd", **options,
                        key_bits=max(int(cfg.regions * workers - 1).bit_length(), 1))


def _run_report(cfg: LDAConfig, corpus: Corpus, n_kw: np.ndarray, freq: np.ndarray, ran: Ran,
                resume: RoundResume | None, seconds: float, workers: int, servers: int) -> dict[str, Any]:
    """The report's lines on the run: the work done (in this run, when resumed) and its
    speed, whether the counts are consistent, the cluster, the settings."""
    per_iteration = workers if cfg.schedule == "rotate" else 1
    done = max(cfg.iterations - (resume.round // per_iteration if resume else 0), 0)  # in this run
    token_iterations = corpus.tokens * done
    return {"token_iterations": token_iterations, "seconds": seconds, "sampling_seconds": ran.seconds,
            "token_iterations_per_s": token_iterations / seconds,
            # Σ n_kw is the corpus, word by word; every worker's topic totals are the table's
            "counts_consistent": bool(n_kw.sum() == corpus.tokens and (n_kw.sum(0) == freq).all() and all(
                r["topic_totals"] == n_kw.sum(1).tolist() for r in ran.per_worker)),
            "workers": workers, "servers": servers, "workers_lost": ran.lost, "workers_joined_midway": ran.joined,
            "resumed_at_iteration": resume.round // per_iteration if resume else None,
            "checkpoints": ran.per_worker[0]["checkpoints"], **asdict(cfg),
            "phase_seconds": ran.per_worker[0]["phase_seconds"]}
