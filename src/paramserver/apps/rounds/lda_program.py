"""One worker's side of ``paramserver lda`` (the driver is in
``paramserver.apps.rounds.lda``, the sampler in ``lda_sampler``): ``LDAProgram``, the
scheduled program that holds parts of the corpus (the driver writes them: ``lda.write_parts``),
samples them word block by word block (in two pieces a block when the rounds are gated:
``lda_pieces``), keeps its documents' topic counts and its copy of the topic totals
(exchanged through ``lda/topic_delta``: ``lda_totals``), saves its parts' topics for a
restart and takes over a dead worker's.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from typing import Any

import fsspec
import numpy as np

from paramserver.apps.rounds.lda_counts import doc_topic_counts
from paramserver.apps.rounds.lda_mh import MHIndex
from paramserver.apps.rounds.lda_pieces import Pieces
from paramserver.apps.rounds.lda_sampler import (
    ALPHA_SUMS,
    TOPIC_DELTA,
    WORD_TOPIC,
    LDAConfig,
    _doc_lists,
    _doc_loglik,
    alpha_step,
    alpha_sums,
    block_changes,
    packed_changes,
)
from paramserver.apps.rounds.lda_totals import TopicTotals, alpha_row, decode, encode
from paramserver.apps.rounds.lda_words import sample_exact, sample_sparse
from paramserver.apps.rounds.program import (
    Push,
    RoundCheckpoints,
    RoundResume,
    WorkersLost,
    adopt,
    gated,
    joined_midway,
    run_rounds,
)

SNAPSHOT_S = 5.0  # a worker saves its documents' topics at most this often (a dead worker's lost work)


class LDAProgram:
    """One worker's side (see the module's doc): the parts it holds, their tokens'
    topics, the documents' topic counts, its copy of the topic totals."""

    def __init__(self, client: Any, paths: list[str], word_block: np.ndarray, cfg: LDAConfig, vocabulary: int,
                 rank: int, workers: int, scratch: str, fresh: bool = True, cuts: np.ndarray | None = None):
        self.client, self.paths, self.cfg, self.V = client, paths, cfg, vocabulary
        self.rank, self.parts, self.scratch = rank, len(paths), scratch
        self.live, self.owner = list(range(workers)), list(range(workers))  # part p is held by owner[p]
        blocks = len(paths)
        self.block_words = [np.flatnonzero(word_block == b).astype(np.uint64) for b in range(blocks)]
        self.word_block = word_block
        self.cuts = cuts  # each block's first piece (``lda_pieces``): its words [0, cuts[b])
        self.pieces: Pieces | None = None  # where those pieces are among this worker's tokens (``_hold``)
        self.split = False  # gated rounds sample a block in two pieces (``lda_worker`` decides)
        self._pending_first: tuple[int, list[Any]] = (-1, [])  # (round they are for, the pulls of its first pieces)
        self.held: list[int] = []
        self.tokens = self.words = self.docs = self.z = np.zeros(0, np.int32)
        self.totals = TopicTotals(cfg.topics)  # n_k as this worker samples with it
        self.Y, self.cum = np.zeros(cfg.topics), np.zeros(cfg.topics)
        self.rounds = cfg.iterations * (blocks if cfg.schedule == "rotate" else 1)
        self.alpha = cfg.alpha  # the document-topic prior now: learnt every cfg.optimize_alpha sweeps (resolved)
        self._pending_alpha: list[tuple[int, Any]] = []  # (round, the pull of every worker's alpha_sums)
        self.sampled = 0
        self._pending_blocks: tuple[int, list[Any]] = (-1, [])  # (round they are for, the pulls of its blocks)
        self._saved = -math.inf
        self.mh: MHIndex | None = None  # MH's index while MH samples (``_sampler``), made afresh from the topics
        self.gated = False  # the tables are BSP on the servers: run_rounds then needs no barrier before a pull
        # a block's changes go packed from the sampler to the wire where the table's push filters pack values
        self.packed = client.admin.takes_packed(WORD_TOPIC)
        self.observe_sends_only = True  # observe's pulls are taken in the next update (run_rounds)
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
        # the sampler reads a random document's row a token: 16 bits a count against 32 made it about a
        # quarter faster (NYT, 161 -> 124 ns a token), and a byte where the rows outgrow the caches (``lda_counts``)
        self.ndk, self.big = doc_topic_counts(self.doc_len.size, K, int(self.z.size), int(self.doc_len.max(initial=0)))
        self.dtop = np.zeros(max(int(self.doff[-1]), 1), np.uint16)
        self.dcnt = np.zeros(self.doc_len.size, np.int32)
        _doc_lists(self.docs, self.z, self.ndk, self.dtop, self.doff, self.dcnt, self.big)
        self.mh = None  # MH's index of the documents' tokens: made from the topics by the next MH round (``_sampler``)
        self.part_docs = np.cumsum([0] + [n.size for n in lens])  # part i's documents: part_docs[i]:[i + 1]
        if folder is not None:  # the topic lists in their saved order too: the sampler walks them in order
            for i, p in enumerate(parts):
                with fsspec.open(f"{folder.rstrip('/')}/lists-{p}.npz", "rb") as f, np.load(f) as saved:
                    self.dtop[self._list_slots(i)] = saved["dtop"]
                    self.dcnt[self.part_docs[i]:self.part_docs[i + 1]] = saved["dcnt"]
                    if "alpha" in saved.files:  # a checkpoint from before α was learnt: --alpha
                        self.alpha = float(saved["alpha"])
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
        if self.cuts is not None:
            self.pieces = Pieces(self.cuts, self.block_words, self.seg_lo, self.seg_row, K)

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
        self.totals.reset(decode(rows).sum(0))

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
        self.totals.pending, self._pending_blocks, self._pending_alpha, self._pending_first = [], (-1, []), [], (-1, [])
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
        self._take_alpha()  # α as the next round samples with, whether or not the job stops here
        if self.mh is not None:  # MH does not keep the lists: a resume with --sampler sparse reads them
            self.mh.lists(self.ndk, self.dtop, self.doff, self.dcnt)
        for i, p in enumerate(self.held):
            with fsspec.open(self._snapshot(p, step), "wb") as f:
                np.save(f, self._part_z(p))
            with fsspec.open(f"{step.rstrip('/')}/lists-{p}.npz", "wb") as f:
                np.savez(f, dtop=self.dtop[self._list_slots(i)],
                         dcnt=self.dcnt[self.part_docs[i]:self.part_docs[i + 1]], alpha=np.float64(self.alpha))

    def resume(self, round_: int, step: str) -> None:
        """Go on from a round checkpoint (the tables restored, so ``n_wk`` matches the
        topics saved with it): take this worker's parts' topics from the step and the
        topic totals from everyone's; the rounds go on exactly as if never stopped."""
        self._hold(self._parts_of(self.rank), fresh=False, folder=step)
        self._exchange(self.cfg.regions - 1, np.bincount(self.z, minlength=self.cfg.topics).astype(np.int64))
        if self.split and round_ > 0:
            self._behind(round_ - 1)

    def _behind(self, q: int) -> None:
        """Split rounds resumed after round ``q``: the topic totals as the next round's first
        pieces saw them uninterrupted, without the others' changes of round ``q`` (taken half
        way through the round, as ever: ``_in_pieces``), from the round's slots the checkpoint kept."""
        slot = (q % self.cfg.round_regions) * self.parts
        rows = self.client.pull(TOPIC_DELTA, np.array([slot + r for r in self.live], np.uint64)).result(timeout=600)
        self.totals.behind(q, rows, self.live.index(self.rank))

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

    def update(self, round_: int, mine: np.ndarray) -> list[Push]:
        self._sampler(round_)
        blocks = mine.tolist()
        if self.split:
            pushes = self._in_pieces(round_, blocks)
        else:
            self._take_observed()
            start = self.totals.nk.copy()
            pulls = self._pending_blocks[1] if self._pending_blocks[0] == round_ else [
                self._pull_block(b) for b in blocks]
            self._pending_blocks = (-1, [])
            pushes = []
            for b, future in zip(blocks, pulls):
                nwk = future.result(timeout=600)  # the sampler's counts, pulled as int32
                segments = (int(self.seg_lo[b]), int(self.seg_lo[b + 1]))
                pushes.append(self._sampled(round_, b, nwk, nwk.copy(), slice(None), segments, 0))
            self.totals.own[round_] = self.totals.nk - start
        slot = (round_ % self.cfg.round_regions) * self.parts
        pushes.append((TOPIC_DELTA, np.array([slot + self.rank], np.uint64), encode(self.totals.own[round_])[None],
                       "assign"))
        if self._alpha_round(round_):  # this worker's share of the step, at the α every worker has now
            num, den = alpha_sums(self.ndk, self.doc_len, self.alpha, self.big)
            pushes.append((ALPHA_SUMS, np.array([slot + self.rank], np.uint64), alpha_row(num, den, round_), "assign"))
        return pushes

    def _in_pieces(self, round_: int, blocks: list[int]) -> list[Push]:
        """Round ``round_`` a piece at a time (``lda_pieces``): the first pieces' changes pushed
        and a clock finished half way, the next round's first pieces asked for then; the
        other workers' topic totals of the round before taken before the second pieces.  The
        second pieces' changes are returned, pushed with the round's end."""
        client, pieces, totals = self.client, self.pieces, self.totals
        assert pieces is not None
        self._take_alpha()  # a step of α (gated, as the round before's ends): the whole round samples with it
        first, second = (self._pending_first[1] if self._pending_first[0] == round_ else  # (the round's start is
                         [pieces.pull(client, WORD_TOPIC, b, 0) for b in blocks],  # final for both pieces)
                         self._pending_blocks[1] if self._pending_blocks[0] == round_ else
                         [pieces.pull(client, WORD_TOPIC, b, 1) for b in blocks])
        self._pending_first = self._pending_blocks = (-1, [])
        start = totals.nk.copy()
        nwks = [np.empty((self.block_words[b].size, self.cfg.topics), np.int32) for b in blocks]
        pushes = [self._piece_sampled(round_, b, nwk, f, 0) for b, nwk, f in zip(blocks, nwks, first)]
        totals.own[round_] = totals.nk - start
        with client.together():
            acks = [client.push(t, k, v, op=op, distinct=True) for t, k, v, op in pushes if len(k)]
            client.clock()  # the round's first: a pull of these pieces is answered once every worker's are in
            if round_ + 1 < self.rounds:
                self._pending_first = (round_ + 1, [pieces.pull(client, WORD_TOPIC, b, 0)
                                                    for b in self._blocks_of(round_ + 1)])
        self._take_observed()  # every worker's topic-total changes of the round before, half a round late
        start = totals.nk.copy()
        pushes = [self._piece_sampled(round_, b, nwk, f, 1) for b, nwk, f in zip(blocks, nwks, second)]
        for ack in acks:
            ack.result(timeout=600)
        totals.own[round_] += totals.nk - start
        return pushes

    def _piece_sampled(self, round_: int, b: int, nwk: np.ndarray, future: Any,
                       piece: int) -> Push:
        """Piece ``piece`` of block ``b`` sampled into ``nwk`` (the block's counts) from its pulled rows (int32)."""
        assert self.pieces is not None
        rows = future.result(timeout=600)
        where = self.pieces.rows(b, piece)
        nwk[where] = rows
        return self._sampled(round_, b, nwk, rows, where, self.pieces.segments(b, piece), piece)

    def _sampled(self, round_: int, b: int, nwk: np.ndarray, rows: np.ndarray, where: slice,
                 segments: tuple[int, int], piece: int) -> Push:
        """Sample ``segments`` of block ``b`` (``nwk``: its counts; ``nwk[where]`` were ``rows``
        as pulled, int32 both); the push of what changed of those rows."""
        cfg, (lo, hi) = self.cfg, segments
        seed = hash((cfg.seed, round_, self.rank, b, *((piece,) if piece else ()))) & 0x7FFFFFFF
        if self.mh is not None:
            self.mh.sample(self.seg_row, self.seg_ptr, lo, hi, self.docs, self.z, nwk, self.totals.nk, self.ndk,
                           self.alpha, cfg.beta, self.V * cfg.beta, seed, self.big)
        else:  # after MH's sweeps (hybrid) the words' topics are few: the exact draw goes over them (``lda_words``)
            sample = sample_exact if cfg.runs == "hybrid" else sample_sparse
            sample(self.seg_row, self.seg_ptr, lo, hi, self.docs, self.z, nwk, self.totals.nk, self.ndk, self.dtop,
                   self.doff, self.dcnt, self.doc_len, self.alpha, cfg.beta, self.V * cfg.beta, self.Y, self.cum, seed,
                   self.big)
        self.sampled += int(self.seg_ptr[hi] - self.seg_ptr[lo])
        changed, delta = (packed_changes if self.packed else block_changes)(nwk[where], rows)
        return WORD_TOPIC, self.block_words[b][where][changed], delta, "add"

    def _second_pull(self, b: int) -> Any:
        """The pull ``observe`` asks for of block ``b``: its second piece when split, else the whole block."""
        if self.split and self.pieces is not None:
            return self.pieces.pull(self.client, WORD_TOPIC, b, 1)
        return self._pull_block(b)

    def _pull_block(self, b: int) -> Any:
        """The pull of block ``b``'s rows as int32 counts (a sparse answer is decoded straight into them)."""
        words = self.block_words[b]
        return self.client.pull(WORD_TOPIC, words, out=np.empty((words.size, self.cfg.topics), np.int32))

    def _blocks_of(self, round_: int) -> list[int]:
        """The blocks this worker samples in ``round_``."""
        return list(self.schedule(round_, len(self.live))[self.live.index(self.rank)].tolist())

    def _alpha_round(self, round_: int) -> bool:
        """Whether ``round_`` ends a sweep after which α takes a step (every ``optimize_alpha``
        sweeps, not after the last)."""
        every, per_sweep = self.cfg.alpha_sweeps, self.rounds // self.cfg.iterations
        done = round_ + 1
        return bool(every) and done % per_sweep == 0 and (done // per_sweep) % every == 0 and done < self.rounds

    def _take_alpha(self) -> None:
        """α's steps observed: each from the sums every live worker pushed at the end of its
        sweep (a slot still holding an older round's, a worker that died meanwhile, is left out)."""
        for round_, future in self._pending_alpha:
            rows = future.result(timeout=600).astype(np.float64)
            rows = rows[rows[:, 4] == round_]
            self.alpha = alpha_step(self.alpha, self.cfg.topics, float((rows[:, 0] + rows[:, 1]).sum()),
                                    float((rows[:, 2] + rows[:, 3]).sum()))
        self._pending_alpha = []

    def _sampler(self, round_: int) -> None:
        """MH samples the first ``cfg.mh_sweeps`` sweeps (all with ``mh``, none with ``sparse``).
        Its index of each document's tokens is made from the topics when it starts (and after
        parts were taken: a regroup, a resume), as every count is; when the exact sweeps take
        over, SparseLDA's topic lists, which MH does not keep, are rebuilt from ``n_dk``."""
        per_sweep = self.rounds // self.cfg.iterations
        if round_ < self.cfg.mh_sweeps * per_sweep:
            if self.mh is None:
                self.mh = MHIndex(self.docs, self.z, self.doc_len, self.cfg.topics, self.cfg.steps)
        elif self.mh is not None:
            self.mh.lists(self.ndk, self.dtop, self.doff, self.dcnt)
            self.mh = None

    def observe(self, round_: int, assignment: Sequence[np.ndarray]) -> None:
        """Once every worker has finished ``round_`` (BSP: this round; SSP: the round s
        before the one just run): pull its topic-total changes, and the blocks of the
        next round to run (final for every round observed); both are taken in the next
        ``update``."""
        slot = (round_ % self.cfg.round_regions) * self.parts
        self.totals.observe(round_, self.client.pull(TOPIC_DELTA, np.array([slot + r for r in self.live], np.uint64)))
        if self._alpha_round(round_):
            self._pending_alpha.append((round_, self.client.pull(ALPHA_SUMS, np.array([slot + r for r in self.live],
                                                                                        np.uint64))))
        nxt = round_ + 1 + self.cfg.staleness
        if nxt < self.rounds:  # its blocks (their second pieces, when split)
            self._pending_blocks = (nxt, [self._second_pull(b) for b in self._blocks_of(nxt)])
        if time.monotonic() - self._saved >= SNAPSHOT_S:
            self._save()

    def _take_observed(self) -> None:
        """n_k from the rounds observed (every worker's changes to them), and α's steps."""
        self.totals.take()
        self._take_alpha()

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
        return float(_doc_loglik(self.ndk, self.doc_len, self.alpha, self.big))


def lda_worker(client: Any, paths: list[str], word_block: np.ndarray, cfg: LDAConfig, vocabulary: int,
               scratch: str, checkpoints: RoundCheckpoints | None = None, resume: RoundResume | None = None,
               cuts: np.ndarray | None = None) -> dict[str, Any]:
    """One worker's job; ``cuts``: each block's first piece (``lda_pieces.block_cuts``), to
    sample a block in two pieces when the rounds are gated (without, a block at once)."""
    if joined_midway(client):
        return {"rank": client.rank, "joined_midway": True}
    workers = len(paths)
    program = LDAProgram(client, paths, word_block, cfg, vocabulary, client.rank, workers, scratch,
                         fresh=resume is None, cuts=cuts)
    program.gated = cfg.staleness == 0 and gated(client, WORD_TOPIC, TOPIC_DELTA,
                                                 *([ALPHA_SUMS] if cfg.alpha_sweeps else []))
    program.split = program.gated and cuts is not None and cfg.schedule == "rotate" and workers > 1
    if resume is None:
        program.start()
    stats = run_rounds(client, program, rank=client.rank, workers=workers, max_rounds=program.rounds,
                       checkpoints=checkpoints, resume=resume, staleness=cfg.staleness)
    program.finish()
    return {"rank": client.rank, "rounds": stats.rounds, "regroups": stats.regroups, "sampled": program.sampled,
            "gated": program.gated, "split": program.split,
            "checkpoints": stats.checkpoints, "topic_totals": program.totals.nk.tolist(), "alpha": program.alpha,
            "doc_loglik": program.doc_loglik(), "docs": int(program.doc_len.size),
            "phase_seconds": {k: round(v, 3) for k, v in stats.seconds.items()}}
