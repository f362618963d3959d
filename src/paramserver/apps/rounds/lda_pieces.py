"""A word block sampled in two pieces, so that a gated round's exchange hides behind sampling.

In a gated round (``run_rounds``: BSP on the servers) a worker cannot start round r + 1
before the worker that held its next block in round r has pushed it, the server has
applied it and answered the pull: on 20 Newsgroups at K = 50 (2 workers, 400 rounds of
~15 ms sampling) that was 5 ms a round after the later worker's last token, plus the
earlier worker's wait for the later one, a third of the job.  So each block is cut, by
word, into two pieces of about half its tokens (``block_cuts``, the same cut for every
worker), and a round goes:

1. sample the first piece of the block;
2. push what changed of it, finish a clock (the round's first), and ask for the first
   piece of the next round's block: the server answers once every worker has finished
   that clock, i.e. pushed its own first piece;
3. take every worker's topic-total changes of the round before (``observe``'s pull,
   answered long since), sample the second piece, push what changed, finish the round's
   second clock; ``observe`` asks for the next block's second piece.

A word's counts are still exact while it is sampled: a piece's rows are read once every
change of the round before to them is in, and only the block's worker changes them in a
round.  What moves is when the topic totals ``n_k`` of the other workers' last round are
taken: at the middle of the next round instead of its start, so the first piece samples
on totals a round staler (AD-LDA's and LightLDA's samplers run on much staler ones).
A worker that reaches the next round early starts on its first piece while the other
finishes its second: the rounds' imbalance hides too.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import numpy as np

#: a worker's round of this many tokens or more is sampled in pieces (``pieces_for``): below, the
#: piece's extra message costs what its hidden exchange saves (DBLP, BBC News: 60 000 tokens a
#: worker's round, level; 20 Newsgroups and NYT: 230 000 and 300 000, 4 % and 7.5 % faster at K = 50)
PIECE_TOKENS = 100_000


def pieces_for(setting: str, tokens: int, workers: int, gated: bool, rotate: bool) -> bool:
    """Whether a job's rounds sample their blocks in two pieces (``--pieces``: ``1``, ``2`` or
    ``auto``): rounds gated on the servers, blocks rotating over two workers or more, and with
    ``auto`` ``PIECE_TOKENS`` or more a worker's round (a worker holds 1/W of the documents and
    samples 1/W of the words a round)."""
    if setting == "1" or not (gated and rotate and workers > 1):
        return False
    return setting == "2" or tokens >= PIECE_TOKENS * workers * workers


def block_cuts(freq: np.ndarray, word_block: np.ndarray, blocks: int) -> np.ndarray:
    """For each block, how many of its words (in increasing order) make its first piece: the
    fewest whose tokens reach half the block's (``freq``: each word's count in the corpus),
    and never every word of a block of two or more."""
    cuts = np.zeros(blocks, np.int64)
    for b in range(blocks):
        words = np.flatnonzero(word_block == b)
        if words.size < 2:
            cuts[b] = words.size
            continue
        tokens = np.cumsum(freq[words])
        cuts[b] = min(int(np.searchsorted(tokens, tokens[-1] / 2)) + 1, words.size - 1)
    return cuts


class Pieces:
    """The pieces of every block as one worker's tokens lie: block ``b``'s first piece is
    its words ``[0, cuts[b])``, the rows ``[0, cuts[b])`` of its pull and its segments
    ``[seg_lo[b], mid[b])`` (a segment is a word's tokens, in the block's word order)."""

    def __init__(self, cuts: np.ndarray, block_words: list[np.ndarray], seg_lo: np.ndarray, seg_row: np.ndarray,
                 topics: int):
        self.cuts, self.block_words, self.seg_lo = cuts, block_words, seg_lo
        # each piece's keys, the same array every round: a pull of it reuses its routing (``client.core.RouteMemo``)
        self._keys = [(bw[:cut], bw[cut:]) for bw, cut in zip(block_words, cuts.tolist())]
        self.mid = np.array([int(seg_lo[b]) + int(np.searchsorted(seg_row[seg_lo[b]:seg_lo[b + 1]], cuts[b]))
                             for b in range(len(block_words))], np.int64)
        self.topics = topics

    def rows(self, b: int, piece: int) -> slice:
        """Where piece ``piece`` of block ``b`` is among the block's rows (and words)."""
        cut = int(self.cuts[b])
        return slice(0, cut) if piece == 0 else slice(cut, self.block_words[b].size)

    def keys(self, b: int, piece: int) -> np.ndarray:
        return self._keys[b][piece]

    def segments(self, b: int, piece: int) -> tuple[int, int]:
        """The segments of piece ``piece`` of block ``b``: ``[lo, hi)``."""
        return (int(self.seg_lo[b]), int(self.mid[b])) if piece == 0 else (int(self.mid[b]), int(self.seg_lo[b + 1]))

    def pull(self, client: Any, table: str, b: int, piece: int) -> Future[np.ndarray]:
        """The rows of a piece, pulled as int32 counts (a sparse answer is decoded straight
        into them: no float rows to cast); a piece of no words: none, with no request."""
        keys = self.keys(b, piece)
        counts = np.empty((keys.size, self.topics), np.int32)
        if keys.size:
            return client.pull(table, keys, out=counts)  # type: ignore[no-any-return]
        done: Future[np.ndarray] = Future()
        done.set_result(counts)
        return done
