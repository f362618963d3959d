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
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import fsspec
import numpy as np
from numba import njit

from paramserver.apps.rounds.corpus import Corpus, read_corpus, vocabulary_size
from paramserver.apps.rounds.program import (
    NO_CHECKPOINTS,
    CheckpointOptions,
    Checkpoints,
    ResumePoint,
    WorkersLost,
    adopt,
    balanced_groups,
    joined_midway,
    run_rounds,
    took_part,
)
from paramserver.client.losses import surfacing_losses, tolerating_loss
from paramserver.errors import ConfigError, check_flags

WORD_TOPIC, TOPIC_DELTA = "lda/word_topic", "lda/topic_delta"
_SPLIT = float(1 << 24)  # a count travels as hi·2^24 + lo, both exact in float32
MAX_COUNT = 1 << 24  # a word–topic count is a float32 on the servers: exact below this
SNAPSHOT_S = 5.0  # a worker saves its documents' topics at most this often (a dead worker's lost work)


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


def encode(counts: np.ndarray) -> np.ndarray:
    """int64 counts → float32 ``[hi, lo]`` halves, each exact (|count| < 2^48)."""
    hi = np.floor_divide(counts, 1 << 24)
    return np.concatenate([hi, counts - hi * (1 << 24)]).astype(np.float32)


def decode(rows: np.ndarray) -> np.ndarray:
    K = rows.shape[-1] // 2
    return (rows[..., :K].astype(np.int64) << 24) + rows[..., K:].astype(np.int64)


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


class LDAProgram:
    """One worker's side (see the module's doc): the parts it holds, their tokens'
    topics, the documents' topic counts, its copy of the topic totals."""

    def __init__(self, client: Any, paths: list[str], word_block: np.ndarray, cfg: LDAConfig, vocabulary: int,
                 rank: int, workers: int, scratch: str, fresh: bool = True):
        self.client, self.paths, self.cfg, self.V = client, paths, cfg, vocabulary
        self.rank, self.parts, self.scratch = rank, len(paths), scratch
        self.live, self.owner = list(range(workers)), list(range(workers))  # part p is held by owner[p]
        blocks = len(paths)
        self.block_words = [np.flatnonzero(word_block == b).astype(np.uint64) for b in range(blocks)]
        self.word_block = word_block
        self.held: list[int] = []
        self.tokens = self.words = self.docs = self.z = np.zeros(0, np.int32)
        self.nk = np.zeros(cfg.topics, np.int64)  # n_k as this worker sees it: nk_seen + its own changes in flight
        self.nk_seen = self.nk.copy()  # every worker's changes through the last round observed
        self.own: dict[int, np.ndarray] = {}  # this worker's changes of the rounds not yet observed
        self.Y, self.cum = np.zeros(cfg.topics), np.zeros(cfg.topics)
        self.rounds = cfg.iterations * (blocks if cfg.schedule == "rotate" else 1)
        self.sampled = 0
        self._pending_nk: list[tuple[int, Any]] = []  # (round observed, the pull of its changes)
        self._pending_blocks: tuple[int, list[Any]] = (-1, [])  # (round they are for, the pulls of its blocks)
        self._saved = -math.inf
        if fresh:  # else resume() takes the parts from a checkpoint
            self._hold([rank], fresh=True)

    # -- the documents this worker holds ---------------------------------------------------------------
    def _hold(self, parts: list[int], fresh: bool, folder: str | None = None) -> None:
        """Take ``parts``: their tokens, and their topics (drawn at random if ``fresh`` or
        if the part was never saved, else its owner's last snapshot, in ``folder`` if
        given: a checkpoint's step)."""
        K = self.cfg.topics
        words, docs, lens, zs = [], [], [], []
        offset = 0
        for p in parts:
            with np.load(self.paths[p]) as f:
                words.append(f["words"])
                docs.append(f["docs"] + offset)
                lens.append(f["doc_len"])
                offset += f["doc_len"].size
            if folder is not None:
                with fsspec.open(self._snapshot(p, folder), "rb") as f:
                    zs.append(np.load(f))
            elif fresh or not os.path.exists(self._snapshot(p)):
                rng = np.random.default_rng([self.cfg.seed, p])
                zs.append(rng.integers(0, K, words[-1].size).astype(np.int32))
            else:
                zs.append(np.load(self._snapshot(p)))
        words_a, docs_a, z = np.concatenate(words), np.concatenate(docs), np.concatenate(zs)
        order = np.lexsort((docs_a, words_a, self.word_block[words_a]))
        self.order = order  # self.z[j] is token order[j] of the parts' files, one after another
        self.part_start = np.cumsum([0] + [w.size for w in words])
        self.words, self.docs, self.z = words_a[order], docs_a[order].astype(np.int32), z[order]
        self.held = list(parts)
        self.doc_len = np.concatenate(lens)
        cap = np.minimum(self.doc_len, K)
        self.doff = np.zeros(cap.size + 1, np.int64)
        np.cumsum(cap, out=self.doff[1:])
        # 16-bit counts and topic ids where they fit: the sampler reads a random document's row a
        # token, and half the bytes made it about a quarter faster (NYT, 161 -> 124 ns a token)
        small = int(self.doc_len.max(initial=0)) < (1 << 16) - 1
        self.ndk = np.zeros((self.doc_len.size, K), np.uint16 if small else np.int32)
        self.dtop = np.zeros(max(int(self.doff[-1]), 1), np.uint16)
        self.dcnt = np.zeros(self.doc_len.size, np.int32)
        _doc_lists(self.docs, self.z, self.ndk, self.dtop, self.doff, self.dcnt)
        self.part_docs = np.cumsum([0] + [n.size for n in lens])  # part i's documents: part_docs[i]:[i + 1]
        if folder is not None:  # the topic lists in their saved order too: the sampler walks them in order
            for i, p in enumerate(parts):
                with fsspec.open(f"{folder.rstrip('/')}/lists-{p}.npz", "rb") as f, np.load(f) as saved:
                    self.dtop[self._list_slots(i)] = saved["dtop"]
                    self.dcnt[self.part_docs[i]:self.part_docs[i + 1]] = saved["dcnt"]
        # segments: one a word; block b's are seg_lo[b]:seg_lo[b + 1]
        starts = np.flatnonzero(np.r_[True, self.words[1:] != self.words[:-1]]) if self.words.size else \
            np.zeros(0, np.int64)
        self.seg_ptr = np.r_[starts, self.words.size].astype(np.int64)
        seg_word = self.words[starts].astype(np.int64)
        seg_block = self.word_block[seg_word]
        self.seg_lo = np.searchsorted(seg_block, np.arange(len(self.block_words) + 1))
        self.seg_row = np.empty(seg_word.size, np.int64)
        for b, bw in enumerate(self.block_words):
            lo, hi = self.seg_lo[b], self.seg_lo[b + 1]
            self.seg_row[lo:hi] = np.searchsorted(bw, seg_word[lo:hi])

    def _counts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(words, their n_wk rows) and n_k, of the tokens this worker holds."""
        K = self.cfg.topics
        present, inverse = np.unique(self.words, return_inverse=True)
        rows = np.bincount(inverse * K + self.z, minlength=present.size * K).reshape(present.size, K)
        return present.astype(np.uint64), rows, np.bincount(self.z, minlength=K).astype(np.int64)

    def _snapshot(self, part: int, folder: str | None = None) -> str:
        return f"{(folder or self.scratch).rstrip('/')}/z-{part}.npy"

    def start(self, region: int | None = None) -> None:
        """Add this worker's counts to the servers' table, then wait for everyone's and
        take the topic totals: the rounds start from a consistent table."""
        words, rows, nk = self._counts()
        self.client.push(WORD_TOPIC, words, rows.astype(np.float32), op="add", distinct=True).result(timeout=600)
        self._exchange(self.cfg.regions - 2 if region is None else region, nk)

    def _exchange(self, region: int, mine: np.ndarray) -> None:
        """n_k = every live worker's ``mine``, through this worker's slot in ``region`` (not
        a round's: those may still be read; see ``LDAConfig.regions``)."""
        slot = region * self.parts
        self.client.push(TOPIC_DELTA, np.array([slot + self.rank], np.uint64), encode(mine)[None], op="assign",
                         distinct=True).result(timeout=600)
        self._barrier()
        rows = self.client.pull(TOPIC_DELTA, np.array([slot + r for r in self.live], np.uint64)).result(timeout=600)
        self.nk = decode(rows).sum(0)
        self.nk_seen, self.own, self._pending_nk = self.nk.copy(), {}, []

    def _barrier(self) -> None:
        present = self.client.barrier(timeout_s=600)
        if present and present != self.live:
            raise WorkersLost(f"worker(s) {sorted(set(self.live) - set(present))} died while the LDA workers were "
                              "rebuilding the counts; run again")

    def _save(self) -> None:
        """The restart point of this worker's parts, should it die."""
        for p in self.held:
            np.save(self._snapshot(p) + ".tmp.npy", self._part_z(p))
            os.replace(self._snapshot(p) + ".tmp.npy", self._snapshot(p))
        self._saved = time.monotonic()

    def regroup(self, round_: int, live: list[int]) -> None:
        """Workers died: deal their documents to the survivors and rebuild the counts.

        Every survivor saves its parts' topics and keeps them; a dead worker's parts go to
        the survivors (``schedule.adopt``), from its last snapshot (a fresh draw if it
        never saved one); then the lowest rank zeroes the word-topic table, each
        survivor adds its parts' counts, and the topic totals are exchanged whole.  Every
        count on the servers is then that of the topics the survivors hold, whatever the
        dead worker had pushed of its last round."""
        self._pending_nk, self._pending_blocks = [], (-1, [])
        self._save()
        self.live, self.owner = live, adopt(self.owner, live)
        self._barrier()  # every part's latest topics are on disk
        self._hold(self._parts_of(self.rank), fresh=False)
        if self.rank == live[0]:
            zeros = np.zeros((self.V, self.cfg.topics), np.float32)
            self.client.push(WORD_TOPIC, np.arange(self.V, dtype=np.uint64), zeros, op="assign",
                             distinct=True).result(timeout=600)
        self._barrier()
        self.start(region=self.cfg.regions - 1)  # not a round's region: those may still be read

    def _list_slots(self, i: int) -> slice:
        """Where the topic lists of the ``i``-th part held are in ``dtop``."""
        return slice(int(self.doff[self.part_docs[i]]), int(self.doff[self.part_docs[i + 1]]))

    def save(self, round_: int, step: str) -> None:
        """Into a round checkpoint's step: the topics of the parts this worker holds, and
        their documents' topic lists (in the order the sampler walks them)."""
        fs, _, (root,) = fsspec.get_fs_token_paths(step)
        fs.makedirs(root, exist_ok=True)
        for i, p in enumerate(self.held):
            with fsspec.open(self._snapshot(p, step), "wb") as f:
                np.save(f, self._part_z(p))
            with fsspec.open(f"{step.rstrip('/')}/lists-{p}.npz", "wb") as f:
                np.savez(f, dtop=self.dtop[self._list_slots(i)],
                         dcnt=self.dcnt[self.part_docs[i]:self.part_docs[i + 1]])

    def resume(self, round_: int, step: str) -> None:
        """Go on from a round checkpoint (the tables restored, so ``n_wk`` matches the
        topics saved with it): take this worker's parts' topics from the step and the
        topic totals from everyone's; the rounds go on exactly as if never stopped."""
        self._hold(self._parts_of(self.rank), fresh=False, folder=step)
        self._exchange(self.cfg.regions - 1, np.bincount(self.z, minlength=self.cfg.topics).astype(np.int64))

    # -- the scheduled program -------------------------------------------------------------------------
    def converged(self, round_: int) -> bool:
        return round_ >= self.rounds

    def schedule(self, round_: int, workers: int) -> list[np.ndarray]:
        """Part p samples word block (p + round) mod W: two parts never share a block
        (unscheduled, ``none``: every block, from counts a round stale)."""
        if self.cfg.schedule == "none":
            return [np.arange(self.parts) for _ in self.live]
        return [np.array([(p + round_) % self.parts for p in self._parts_of(r)], np.int64) for r in self.live]

    def _parts_of(self, rank: int) -> list[int]:
        return [p for p in range(self.parts) if self.owner[p] == rank]

    def update(self, round_: int, mine: np.ndarray) -> list[tuple[str, np.ndarray, np.ndarray, str]]:
        cfg = self.cfg
        pushes = []
        self._take_observed()
        start = self.nk.copy()
        pulls = self._pending_blocks[1] if self._pending_blocks[0] == round_ else [
            self.client.pull(WORD_TOPIC, self.block_words[b]) for b in mine.tolist()]
        self._pending_blocks = (-1, [])
        for b, future in zip(mine.tolist(), pulls):
            keys = self.block_words[b]
            nwk = future.result(timeout=600).astype(np.int32)
            before = nwk.copy()
            _seed(hash((cfg.seed, round_, self.rank, b)) & 0x7FFFFFFF)
            lo, hi = int(self.seg_lo[b]), int(self.seg_lo[b + 1])
            _sample(self.seg_row, self.seg_ptr, lo, hi, self.docs, self.z, nwk, self.nk, self.ndk, self.dtop,
                    self.doff, self.dcnt, cfg.alpha, cfg.beta, self.V * cfg.beta, self.Y, self.cum)
            self.sampled += int(self.seg_ptr[hi] - self.seg_ptr[lo])
            changed = np.flatnonzero((nwk != before).any(1))
            pushes.append((WORD_TOPIC, keys[changed], (nwk[changed] - before[changed]).astype(np.float32), "add"))
        self.own[round_] = self.nk - start
        slot = (round_ % self.cfg.round_regions) * self.parts
        pushes.append((TOPIC_DELTA, np.array([slot + self.rank], np.uint64), encode(self.own[round_])[None],
                       "assign"))
        return pushes

    def observe(self, round_: int, assignment: Sequence[np.ndarray]) -> None:
        """Once every worker has finished ``round_`` (BSP: this round; SSP: the round s
        before the one just run): pull its topic-total changes, and the blocks of the
        next round to run (final for every round observed); both are taken in the next
        ``update``."""
        slot = (round_ % self.cfg.round_regions) * self.parts
        self._pending_nk.append((round_, self.client.pull(TOPIC_DELTA, np.array([slot + r for r in self.live],
                                                                                  np.uint64))))
        nxt = round_ + 1 + self.cfg.staleness
        if nxt < self.rounds:
            blocks = self.schedule(nxt, len(self.live))[self.live.index(self.rank)].tolist()
            self._pending_blocks = (nxt, [self.client.pull(WORD_TOPIC, self.block_words[b]) for b in blocks])
        if time.monotonic() - self._saved >= SNAPSHOT_S:
            self._save()

    def _take_observed(self) -> None:
        """n_k from the rounds observed: every worker's changes to them, this worker's own
        changes since."""
        for round_, future in self._pending_nk:
            self.nk_seen += decode(future.result(timeout=600)).sum(0)
            self.own.pop(round_, None)
        self._pending_nk = []
        self.nk = self.nk_seen + sum(self.own.values(), np.zeros_like(self.nk_seen))

    def finish(self) -> None:
        """Take the last rounds' topic totals (for the report)."""
        self._take_observed()

    def _part_z(self, part: int) -> np.ndarray:
        """The topics of ``part``'s tokens in its file's order."""
        z = np.empty_like(self.z)
        z[self.order] = self.z
        i = self.held.index(part)
        return z[self.part_start[i]:self.part_start[i + 1]]

    def doc_loglik(self) -> float:
        return float(_doc_loglik(self.ndk, self.doc_len, self.cfg.alpha))


def lda_worker(client: Any, paths: list[str], word_block: np.ndarray, cfg: LDAConfig, vocabulary: int,
               scratch: str, checkpoints: Checkpoints | None = None, resume: ResumePoint | None = None
               ) -> dict[str, Any]:
    if joined_midway(client):
        return {"rank": client.rank, "joined_midway": True}
    workers = len(paths)
    program = LDAProgram(client, paths, word_block, cfg, vocabulary, client.rank, workers, scratch,
                         fresh=resume is None)
    if resume is None:
        program.start()
    stats = run_rounds(client, program, rank=client.rank, workers=workers, max_rounds=program.rounds,
                       checkpoints=checkpoints, resume=resume, staleness=cfg.staleness)
    program.finish()
    return {"rank": client.rank, "rounds": stats.rounds, "regroups": stats.regroups, "sampled": program.sampled,
            "checkpoints": stats.checkpoints, "topic_totals": program.nk.tolist(),
            "doc_loglik": program.doc_loglik(), "docs": int(program.doc_len.size),
            "phase_seconds": {k: round(v, 3) for k, v in stats.seconds.items()}}


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
            allow_loss: bool = False) -> dict[str, Any]:
    """``paramserver lda``: sample, write ``save/topic_word.npy`` and the metrics; the report.
    ``checkpoints.every`` counts iterations.  ``replicas``: copies of every vnode; a server's
    death that loses data fails the run (``DataLossError``) unless ``allow_loss``."""
    from paramserver.cluster.launch import open_cluster
    from paramserver.data.files import check_output, write_text

    check_config(cfg, workers, servers)
    check_output(save, "--save", folder=True)
    check_output(metrics_out, "--metrics-out", folder=False)
    checkpoints.check()
    t0 = time.perf_counter()
    corpus = read_corpus(data)
    V, vocabulary = vocabulary_size(data, corpus, vocabulary)
    K = cfg.topics
    freq = np.bincount(corpus.words, minlength=V)
    if freq.max() >= MAX_COUNT:
        w = int(freq.argmax())
        raise ConfigError(f"{data}: word {w} occurs {int(freq.max()):,} times; a word–topic count is kept exactly "
                          f"only below {MAX_COUNT:,} (2^24, float32 on the servers): drop stop words or split the "
                          "corpus")
    word_block = balanced_groups(freq, workers)
    # what the parts and the tables depend on; --iterations may change on a resume
    meta = {"app": "lda", "workers": workers, "topics": K, "seed": cfg.seed, "schedule": cfg.schedule,
            "staleness": cfg.staleness,
            "tokens": int(corpus.tokens), "docs": int(corpus.docs), "vocabulary": int(V)}
    cps, resume = checkpoints.plan(meta, rounds_a_unit=workers if cfg.schedule == "rotate" else 1)
    with tempfile.TemporaryDirectory(prefix="paramserver-lda-") as scratch, \
            open_cluster(servers=servers, workers=workers, **{"log_level": "WARNING", **(cluster_options or {})}) \
            as cluster, surfacing_losses(cluster, allow_loss) as losses:
        paths = write_parts(scratch, corpus, word_block, workers)
        client = cluster.client
        if resume is not None:
            client.restore(resume.step, allow_unverified=resume.allow_unverified)
        else:
            client.create_table(WORD_TOPIC, dim=K, optimizer="sgd", key_bits=max(int(V - 1).bit_length(), 1),
                                replicas=replicas)
            client.create_table(TOPIC_DELTA, dim=2 * K, optimizer="sgd", replicas=replicas,
                                key_bits=max(int(cfg.regions * workers - 1).bit_length(), 1))
        t_sample = time.perf_counter()
        worker = tolerating_loss(lda_worker) if allow_loss else lda_worker  # the driver decides (surfacing_losses)
        per_worker, lost = cluster.run_elastic(worker, paths, word_block, cfg, V, scratch, cps, resume)
        per_worker, joined = took_part(per_worker)
        t_sample = time.perf_counter() - t_sample
        keys, rows = client.export_table(WORD_TOPIC)
    n_kw = np.zeros((K, V), np.int64)
    inside = keys < V
    n_kw[:, keys[inside].astype(np.int64)] = np.rint(rows[inside]).astype(np.int64).T
    loglik = word_loglik(n_kw, cfg.beta) + sum(r["doc_loglik"] for r in per_worker)
    if save:
        os.makedirs(save, exist_ok=True)
        np.save(os.path.join(save, "topic_word.npy"), n_kw)
    seconds = time.perf_counter() - t0
    per_iteration = workers if cfg.schedule == "rotate" else 1
    done = max(cfg.iterations - (resume.round // per_iteration if resume else 0), 0)  # in this run
    token_iterations = corpus.tokens * done
    report = {"log_likelihood_per_token": loglik / corpus.tokens, "tokens": corpus.tokens, "docs": corpus.docs,
              "vocabulary": V, "vocabulary_file": vocabulary, "token_iterations": token_iterations, "seconds": seconds,
              "sampling_seconds": t_sample, "token_iterations_per_s": token_iterations / seconds,
              # Σ n_kw is the corpus, word by word; every worker's topic totals are the table's
              "counts_consistent": bool(n_kw.sum() == corpus.tokens and (n_kw.sum(0) == freq).all() and all(
                  r["topic_totals"] == n_kw.sum(1).tolist() for r in per_worker)),
              "workers": workers, "servers": servers, "workers_lost": lost, "workers_joined_midway": joined,
              "resumed_at_iteration": resume.round // per_iteration if resume else None,
              "checkpoints": per_worker[0]["checkpoints"], **asdict(cfg),
              "phase_seconds": per_worker[0]["phase_seconds"], **losses.report()}
    if metrics_out:
        write_text(metrics_out, json.dumps(report, indent=1))
    return report
