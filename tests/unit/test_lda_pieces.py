"""A word block in two pieces (``lda_pieces``, issue 49): every worker cuts a block at the same
word, the first piece holding about half its tokens; a worker's segments split there, each
piece's rows and segments naming the same words; an empty piece is no request."""

from __future__ import annotations

import numpy as np
import pytest

from paramserver.apps.rounds.lda_pieces import Pieces, block_cuts
from paramserver.apps.rounds.lda_sampler import block_changes
from paramserver.apps.rounds.program import balanced_groups


def test_a_cut_takes_the_fewest_words_that_reach_half_the_blocks_tokens():
    rng = np.random.default_rng(3)
    freq = (1e5 / np.arange(1, 2001) ** 1.1).astype(np.int64) + 1  # Zipf: a few words hold most tokens
    rng.shuffle(freq)
    word_block = balanced_groups(freq, 3)
    cuts = block_cuts(freq, word_block, 3)
    for b in range(3):
        words = np.flatnonzero(word_block == b)
        tokens, cut = freq[words], int(cuts[b])
        assert 1 <= cut < words.size
        assert tokens[:cut].sum() >= tokens.sum() / 2 > tokens[:cut - 1].sum()
    assert np.array_equal(cuts, block_cuts(freq, word_block, 3))  # every worker's the same


def test_the_last_word_always_makes_a_second_piece_and_tiny_blocks_have_one():
    freq = np.array([1, 1, 1000, 5, 7])
    # block 0: words 0, 2 (the second holds nearly every token); block 1: word 1; block 2: none
    word_block = np.array([0, 1, 0, 3, 3])
    cuts = block_cuts(freq, word_block, 3)
    assert cuts.tolist() == [1, 1, 0]


@pytest.mark.parametrize("seed", [0, 1])
def test_a_workers_segments_split_where_its_blocks_words_do(seed):
    rng = np.random.default_rng(seed)
    V, blocks, K = 300, 2, 4
    freq = rng.integers(1, 50, V)
    word_block = balanced_groups(freq, blocks)
    cuts = block_cuts(freq, word_block, blocks)
    # this worker's tokens, sorted by (block, word) as its part file holds them; some words absent
    words = rng.choice(np.flatnonzero(rng.random(V) < 0.7), 2000)
    words = words[np.lexsort((words, word_block[words]))]
    starts = np.flatnonzero(np.r_[True, words[1:] != words[:-1]])
    seg_word = words[starts]
    seg_lo = np.searchsorted(word_block[seg_word], np.arange(blocks + 1))
    block_words = [np.flatnonzero(word_block == b).astype(np.uint64) for b in range(blocks)]
    seg_row = np.empty(seg_word.size, np.int64)
    for b in range(blocks):
        seg_row[seg_lo[b]:seg_lo[b + 1]] = np.searchsorted(block_words[b], seg_word[seg_lo[b]:seg_lo[b + 1]])
    pieces = Pieces(cuts, block_words, seg_lo, seg_row, K)
    for b in range(blocks):
        (a0, z0), (a1, z1) = pieces.segments(b, 0), pieces.segments(b, 1)
        assert (a0, z1) == (seg_lo[b], seg_lo[b + 1]) and z0 == a1
        for piece, (lo, hi) in enumerate([(a0, z0), (a1, z1)]):
            rows = pieces.rows(b, piece)
            assert ((seg_row[lo:hi] >= rows.start) & (seg_row[lo:hi] < rows.stop)).all()
            assert np.array_equal(pieces.keys(b, piece)[seg_row[lo:hi] - rows.start], seg_word[lo:hi])
        assert pieces.keys(b, 0).size + pieces.keys(b, 1).size == block_words[b].size


def test_a_piece_of_no_words_is_answered_without_a_request():
    block_words = [np.array([7], np.uint64)]
    pieces = Pieces(np.array([1]), block_words, np.array([0, 1]), np.array([0]), 3)

    class NoClient:
        def pull(self, *args):
            raise AssertionError("an empty piece sent a request")

    rows = pieces.pull(NoClient(), "t", 0, 1).result(timeout=1)
    assert rows.shape == (0, 3) and rows.dtype == np.int32


@pytest.mark.parametrize("K", [1, 50, 1000])
def test_a_blocks_changes_are_the_rows_that_moved_and_by_how_much(K):
    rng = np.random.default_rng(K)
    pulled = np.where(rng.random((300, K)) < 0.1, rng.integers(1, 1 << 20, (300, K)), 0).astype(np.int32)
    counts = pulled.copy()
    moved = np.sort(rng.choice(300, 40, replace=False))
    for i in moved:  # -1 at one topic, +2 at one: never a row left as it was
        counts[i, rng.integers(K)] -= 1
        counts[i, rng.integers(K)] += 2
    changed, delta = block_changes(counts, pulled)
    assert np.array_equal(changed, moved) and delta.dtype == np.float32
    assert np.array_equal(delta, (counts - pulled)[moved].astype(np.float32))
