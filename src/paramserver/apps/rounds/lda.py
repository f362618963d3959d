"""``paramserver lda``: latent Dirichlet allocation by collapsed Gibbs sampling, the
word–topic counts on the servers, word blocks scheduled so that no two workers ever
sample the same word at once (STRADS' LDA; LightLDA's model-parallel blocks).

Documents are cut into W parts (one a worker, balanced by tokens) and the vocabulary
into W word blocks (balanced by tokens).  The servers hold ``n_wk`` (table
``lda/word_topic``, a row of K counts a word).  An iteration is W rounds; in round s,
worker q pulls word block ``(q + s) mod W``, samples every token of those words in its
documents, and pushes what changed with ``add``.  A word's counts are thus exact while it
is sampled; only the topic totals ``n_k`` are a round stale (each worker's change to
them is exchanged at every round's end, exactly, through ``lda/topic_delta``).  Where a
worker's round is long, each block is sampled in two pieces, the first's changes sent half
way, so that the next round's first piece is in before the round ends (``lda_pieces``).

The sampler is SparseLDA's split, taken word by word: for token (d, w),
``p(k) ∝ n_dk·Y_k + α·Y_k`` with ``Y_k = (n_wk + β)/(n_k + Vβ)``.  ``Y`` is built once
a word and kept up to date in O(1) a token; the first bucket runs over the document's
non-zero topics only (a list a document), the second (``α Σ Y``, a few per cent of the
mass) is scanned only when the draw falls in it.  So a token costs O(K_d), not O(K).

A worker that dies is survived: the others adopt its documents from its last
round-boundary snapshot, and the counts on the servers are rebuilt from every
document's topics, so ``Σ_k n_wk`` stays each word's count in the corpus.

This module holds the driver (``run_lda``); the tables, the settings and the sampler's
kernels are in ``lda_sampler``; a worker's side, the program and the parts it holds, is in
``lda_program``.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, replace
from typing import Any

import numpy as np

from paramserver.apps.rounds.corpus import Corpus, read_corpus, top_words, vocabulary_size
from paramserver.apps.rounds.job import Ran, RoundsJob, Watch, check_outputs, write_metrics
from paramserver.apps.rounds.lda_pieces import block_cuts, pieces_for
from paramserver.apps.rounds.lda_sampler import ALPHA_SUMS, MAX_COUNT, word_loglik
from paramserver.apps.rounds.lda_sampler import TOPIC_DELTA as TOPIC_DELTA  # the old spellings: lda.LDAConfig etc.
from paramserver.apps.rounds.lda_sampler import WORD_TOPIC as WORD_TOPIC
from paramserver.apps.rounds.lda_sampler import LDAConfig as LDAConfig
from paramserver.apps.rounds.program import NO_CHECKPOINTS, CheckpointOptions, RoundResume, balanced_groups
from paramserver.data.reader import check_flag_file
from paramserver.errors import ConfigError, check_flags

#: a word's row holds K counts, most of them zero past a few dozen topics, and so does a round's change to
#: it: ``sparse`` sends the non-zero counts and a bit a count, the same counts (docs/filters.md)
SPARSE_FILTERS = "push=sparse;reply=sparse"
#: topics from which packing the rows costs less than moving them between processes of one machine
#: (20 Newsgroups, the whole command: K = 50 4 % slower, 200 level, 500 2 % faster, 1 000 4-6 %)
SPARSE_TOPICS = 256


def check_config(cfg: LDAConfig, workers: int, servers: int) -> None:
    check_flags([
        ("--topics", cfg.topics, 2 <= cfg.topics <= 65_535, "a whole number in [2, 65535]"),
        ("--iterations", cfg.iterations, cfg.iterations >= 1, "a whole number >= 1"),
        ("--alpha", cfg.alpha, math.isfinite(cfg.alpha) and cfg.alpha > 0, "a number > 0"),
        ("--beta", cfg.beta, math.isfinite(cfg.beta) and cfg.beta > 0, "a number > 0"),
        ("--seed", cfg.seed, isinstance(cfg.seed, int) and 0 <= cfg.seed < 1 << 63, "a whole number in [0, 2^63)"),
        ("--optimize-alpha", cfg.optimize_alpha, cfg.optimize_alpha == "auto" or str(cfg.optimize_alpha).isdigit(),
         "auto or a whole number >= 0 (sweeps between α's steps; 0: α stays --alpha)"),
        ("--schedule", cfg.schedule, cfg.schedule in ("rotate", "none"), "rotate or none"),
        ("--staleness", cfg.staleness, isinstance(cfg.staleness, int) and 0 <= cfg.staleness <= 64,
         "a whole number in [0, 64] (rounds a worker may run ahead; 0: BSP)"),
        ("--sampler", cfg.sampler, cfg.sampler in ("auto", "sparse", "mh", "hybrid"), "auto (the default), sparse "
         "(the exact Gibbs draw), mh (Metropolis–Hastings, O(1) a token, for many --topics) or hybrid (mh, then "
         "sparse)"),
        ("--mh-steps", cfg.mh_steps,
         cfg.mh_steps is None or (isinstance(cfg.mh_steps, int) and 1 <= cfg.mh_steps <= 64),
         "a whole number in [1, 64] (cycles of a word then a document proposal a token in an MH sweep)"),
        ("--mh-share", cfg.mh_share, isinstance(cfg.mh_share, (int, float)) and 0 < cfg.mh_share <= 1,
         "a number in (0, 1] (the share of the sweeps hybrid samples with MH before the exact ones)"),
        ("--pieces", cfg.pieces, cfg.pieces in ("auto", "1", "2"), "auto (the default), 1 or 2 (pieces a word "
         "block is sampled in a round)"),
        ("--workers", workers, workers >= 1, "a whole number >= 1"),
        ("--servers", servers, servers >= 1, "a whole number >= 1"),
    ])


def resolved(cfg: LDAConfig) -> LDAConfig:
    """``cfg`` as the job runs it and reports it: the sampler (``auto`` resolved by the
    topics) and its MH steps a token (none for ``sparse``)."""
    runs = cfg.runs
    return replace(cfg, sampler=runs, mh_steps=cfg.steps if runs != "sparse" else None)


def _corpus(data: str, vocabulary: str | None, workers: int) -> Corpus:
    """The corpus (its words numbered by ``vocabulary``, a file that must be there), a part of
    its documents for each of ``workers``: refused where it has fewer."""
    if vocabulary is not None:
        check_flag_file(vocabulary, "--vocabulary", "give the vocabulary file, a word a line")
    corpus = read_corpus(data, vocabulary)
    if workers > corpus.docs:
        raise ConfigError(f"--workers {workers}: {data} has {corpus.docs:,} documents, and each worker samples a part "
                          f"of them; give at most {corpus.docs:,}")
    return corpus


def run_lda(data: str, *, cfg: LDAConfig, workers: int, servers: int, save: str | None = None,
            metrics_out: str | None = None, vocabulary: str | None = None,
            checkpoints: CheckpointOptions = NO_CHECKPOINTS,
            cluster_options: dict[str, Any] | None = None, replicas: int = 1,
            allow_loss: bool = False, filters: Any = None, watch: Watch | None = None) -> dict[str, Any]:
    """``paramserver lda``: sample, write ``save/topic_word.npy`` and the metrics; the report.
    ``checkpoints.every`` counts iterations.  ``replicas``: copies of every vnode; a server's
    death that loses data fails the run (``DataLossError``) unless ``allow_loss``."""
    # the workers' side (and fsspec, which it writes the parts with) is loaded once the job runs
    from paramserver.apps.rounds.lda_program import lda_worker

    check_config(cfg, workers, servers)
    cfg = resolved(cfg)
    check_outputs(save, metrics_out)
    checkpoints.check()
    t0 = time.perf_counter()
    corpus = _corpus(data, vocabulary, workers)
    cfg = replace(cfg, optimize_alpha=str(cfg.alpha_every(corpus.tokens / max(corpus.docs, 1))))  # auto resolved
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
                   replicas=replicas, filters=default_filters(K, cluster_options) if filters is None else filters,
                   watch=watch,
                   scratch_prefix="paramserver-lda-") as job:
        paths = write_parts(job.scratch, corpus, word_block, workers)
        pieces = pieces_for(cfg.pieces, corpus.tokens, workers, cfg.staleness == 0, cfg.schedule == "rotate")
        job.tables(resume, lambda client: _create_tables(client, cfg, V, workers, job.table_options))
        if resume is not None and cfg.alpha_sweeps and ALPHA_SUMS not in job.client.tables():
            _alpha_table(job.client, cfg, workers, job.table_options)  # a checkpoint from before α was learnt
        ran = job.run(lda_worker, paths, word_block, cfg, V, job.scratch, cps, resume,
                      block_cuts(freq, word_block, workers) if pieces else None)
        keys, rows = job.client.export_table(WORD_TOPIC)
    n_kw = np.zeros((K, V), np.int64)
    inside = keys < V
    n_kw[:, keys[inside].astype(np.int64)] = np.rint(rows[inside]).astype(np.int64).T
    loglik = word_loglik(n_kw, cfg.beta) + sum(r["doc_loglik"] for r in ran.per_worker)
    words = top_words(n_kw, data, vocabulary, names=corpus.names)
    if save:
        os.makedirs(save, exist_ok=True)
        np.save(os.path.join(save, "topic_word.npy"), n_kw)
        if corpus.names is not None:  # a text corpus numbered its own words: column j of topic_word is line j
            with open(os.path.join(save, "vocabulary.txt"), "wb") as f:
                f.writelines(w + b"\n" for w in corpus.names.tolist())
        if words is not None:  # what a person reads first: a topic a line, its 10 most frequent words
            with open(os.path.join(save, "topics.txt"), "w", encoding="utf-8") as f:
                f.writelines(f"{t}\t{' '.join(w)}\n" for t, w in enumerate(words))
    report = {"log_likelihood_per_token": loglik / corpus.tokens, "tokens": corpus.tokens, "docs": corpus.docs,
              "vocabulary": V, "vocabulary_file": vocabulary, "top_words": words,
              **_run_report(cfg, corpus, n_kw, freq, ran, resume, time.perf_counter() - t0, workers, servers),
              **job.losses.report(), **job.wire(ran)}
    write_metrics(metrics_out, report)
    return report


def default_filters(topics: int, cluster_options: dict[str, Any] | None) -> str | None:
    """The job's filters when ``--filters`` is not given: ``sparse`` wherever the counts cross
    a network (``--cluster`` other than local: 4x fewer bytes at K = 50, 18x at K = 1 000 on
    20 Newsgroups), and on one machine from ``SPARSE_TOPICS`` topics; none otherwise (None)."""
    local = "cluster" not in (cluster_options or {})
    return SPARSE_FILTERS if topics >= SPARSE_TOPICS or not local else None


def write_parts(folder: str, corpus: Corpus, word_block: np.ndarray, parts: int) -> list[str]:
    """Each part's documents as ``part-q.npz``: ``words`` and ``docs`` (local index) of its
    tokens sorted by (word block, word, doc), and ``doc_len``."""
    doc_len = np.diff(corpus.doc_ptr)
    doc_part = balanced_groups(doc_len, parts)
    doc_of = np.repeat(np.arange(corpus.docs), doc_len)
    paths = []
    for q in range(parts):
        mine = np.flatnonzero(doc_part == q)
        local = np.full(corpus.docs, -1, np.int64)
        local[mine] = np.arange(mine.size)
        take = np.flatnonzero(doc_part[doc_of] == q)
        words, docs = corpus.words[take], local[doc_of[take]]
        order = np.lexsort((docs, words, word_block[words]))
        path = os.path.join(folder, f"part-{q}.npz")
        np.savez(path, words=words[order].astype(np.int32), docs=docs[order].astype(np.int32),
                 doc_len=doc_len[mine].astype(np.int64), doc_ids=mine)
        paths.append(path)
    return paths


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
    slots through which the workers exchange their changes to the topic totals; BSP on
    the servers when the rounds are (``--staleness 0``)."""
    K = cfg.topics
    gate = _gate(cfg)
    client.create_table(WORD_TOPIC, dim=K, optimizer="sgd", key_bits=max(int(vocabulary - 1).bit_length(), 1),
                        consistency=gate, **options)
    client.create_table(TOPIC_DELTA, dim=2 * K, optimizer="sgd", consistency=gate, **options,
                        key_bits=max(int(cfg.regions * workers - 1).bit_length(), 1))
    if cfg.alpha_sweeps:
        _alpha_table(client, cfg, workers, options)


def _gate(cfg: LDAConfig) -> str:
    """The job's tables' consistency: BSP rounds gate their pulls on the servers
    (``LDAProgram.gated``), a round's pulls answered once every worker's pushes of the round
    before are in, with no wait for an acknowledgement and a barrier first."""
    return "bsp" if cfg.staleness == 0 else "asp"


def _alpha_table(client: Any, cfg: LDAConfig, workers: int, options: dict[str, Any]) -> None:
    """The slots through which the workers exchange their sums for α's steps (``alpha_sums``),
    as the round slots of the topic totals' and gated as they are."""
    client.create_table(ALPHA_SUMS, dim=5, optimizer="sgd", consistency=_gate(cfg), **options,
                        key_bits=max(int(cfg.round_regions * workers - 1).bit_length(), 1))


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
            # gated rounds sample a block in two pieces, the exchange hidden behind the sampling (lda_pieces)
            "blocks_in_pieces": all(r.get("split", False) for r in ran.per_worker),
            "alpha_learned": ran.per_worker[0]["alpha"] if cfg.alpha_sweeps else None,
            "phase_seconds": ran.per_worker[0]["phase_seconds"]}
