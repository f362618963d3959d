"""A worker's document–topic counts a byte each (``lda_counts``, issue 49): counts past a byte
move exactly through the overflow table and back, whatever its collisions; both samplers and
the α and likelihood sums give, with byte counts, what 16-bit counts gave, to the bit, on
documents long enough for some counts to pass 255."""

from __future__ import annotations

import numpy as np
import pytest

from paramserver.apps.rounds.lda_counts import (
    BYTE_TOPICS,
    TOP,
    DocTopics,
    big_count,
    big_down,
    big_up,
    dense_counts,
    doc_topic_counts,
)
from paramserver.apps.rounds.lda_mh import MHIndex
from paramserver.apps.rounds.lda_sampler import _doc_lists, _doc_loglik, _sample, alpha_sums, doc_joined, doc_left


class _Docs:
    """Documents' counts and topic lists as the kernels keep them, moved by the kernels' own
    helpers (``doc_joined``, ``doc_left``): in the byte, or through ``big`` at its top."""

    def __init__(self, D, K, tokens):
        self.counts, self.K = DocTopics(D, K, tokens), K
        self.dtop, self.dcnt = np.zeros(D * K, np.uint16), np.zeros(D, np.int32)

    def move(self, d, k, up):
        step = doc_joined if up else doc_left
        step(self.counts.rows, self.counts.big, self.dtop, self.dcnt, d, d * self.K, k, self.K)

    def topics(self, d):
        return sorted(self.dtop[d * self.K:d * self.K + self.dcnt[d]].tolist())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_counts_past_a_byte_go_through_the_table_and_come_back(seed):
    """Random walks of counts around 255 in a few documents, moved by the kernels' helpers,
    against plain int counts: the topic lists right, every count read back exactly (the byte,
    or the table at ``TOP``), the table holding exactly the counts of ``TOP`` or more, however
    its rows collided and were shifted back on removal."""
    rng = np.random.default_rng(seed)
    D, K = 3, 40
    docs = _Docs(D, K, tokens=D * 2000)
    counts = docs.counts
    assert counts.big.shape[0] == 64  # twice 2000 * 3 / 255 (23) + 16, a power of two: collisions happen
    ndk, big = counts.rows, counts.big
    ref = np.zeros((D, K), np.int64)
    cells = [(d, k) for d in range(D) for k in range(0, K, 3)]  # 42 counts, each near a byte's top at times
    for d, k in cells:
        for _ in range(int(rng.integers(200, 300))):
            docs.move(d, k, True)
            ref[d, k] += 1
    for _ in range(30_000):
        d, k = cells[int(rng.integers(len(cells)))]
        up = ref[d, k] == 0 or rng.random() < 0.5
        docs.move(d, k, up)
        ref[d, k] += 1 if up else -1
        if rng.random() < 0.01:
            np.testing.assert_array_equal(dense_counts(ndk, big), ref)
            assert all(docs.topics(d2) == np.flatnonzero(ref[d2]).tolist() for d2 in range(D))
            for d2, k2 in zip(*np.nonzero(ref >= TOP)):  # each found where a probe looks
                assert big_count(big, d2, k2, K) == ref[d2, k2]
    np.testing.assert_array_equal(counts.dense(), ref)
    held = big[big[:, 0] >= 0]
    assert sorted(held[:, 0].tolist()) == sorted((d * K + k) for d, k in zip(*np.nonzero(ref >= TOP)))
    for d, k in zip(*np.nonzero(ref >= TOP)):
        assert ndk[d, k] == TOP and big_count(big, d, k, K) == ref[d, k]
    assert (ndk[ref < TOP] == ref[ref < TOP]).all()


def test_a_count_leaving_a_cluster_of_the_table_leaves_the_others_found():
    """Counts whose probes start at the same row, one after the other in the table: the first
    and a middle one fall back into their bytes, and the rest are still found (their rows
    shifted back over the holes), then leave too."""
    D, K = 4000, 1
    counts = DocTopics(D, K, tokens=0)
    ndk, big = counts.rows, counts.big
    home = [((d * 0x9E3779B97F4A7C15) % (1 << 64)) >> 32 & (big.shape[0] - 1) for d in range(D)]  # _home's
    same = [d for d in range(D) if home[d] == home[0]][:5]
    assert len(same) == 5
    for d in same:
        ndk[d, 0] = TOP - 1
        big_up(ndk, big, d, 0, K)  # to TOP: into the table
        big_up(ndk, big, d, 0, K)  # TOP + 1
    for gone in (same[0], same[2]):
        big_down(ndk, big, gone, 0, K)
        big_down(ndk, big, gone, 0, K)
        assert ndk[gone, 0] == TOP - 1
    for d in (same[1], same[3], same[4]):
        assert ndk[d, 0] == TOP and big_count(big, d, 0, K) == TOP + 1
        big_down(ndk, big, d, 0, K)
        big_down(ndk, big, d, 0, K)
    assert (big[:, 0] == -1).all()


def _corpus(seed, K):
    """Tokens sorted by (word, document) as a worker holds them, two documents of 700 tokens
    mostly of one word, so that counts pass 255, among short ones."""
    rng = np.random.default_rng(seed)
    lengths = np.r_[700, 700, rng.integers(3, 40, 30)]
    docs = np.repeat(np.arange(lengths.size), lengths)
    V = 12
    words = np.where(docs < 2, rng.integers(0, 2, docs.size), rng.integers(0, V, docs.size))
    order = np.lexsort((docs, words))
    words, docs = words[order], docs[order].astype(np.int32)
    z = np.where(docs < 2, 0, rng.integers(0, K, docs.size)).astype(np.int32)  # start past the byte
    starts = np.flatnonzero(np.r_[True, words[1:] != words[:-1]])
    return words, docs, z, lengths, np.r_[starts, words.size].astype(np.int64), words[starts].astype(np.int64), V


@pytest.mark.parametrize("sampler", ["sparse", "mh"])
def test_the_samplers_draw_the_same_with_byte_counts(sampler):
    """Ten sweeps from the same state with 16-bit counts (no table) and with byte counts: the
    same topics, the same counts, the same α sums and document likelihood."""
    K, alpha, beta = 8, 0.1, 0.01
    words, docs, z0, lengths, seg_ptr, seg_row, V = _corpus(3, K)
    runs = []
    for wide in (True, False):
        z = z0.copy()
        nwk = np.zeros((V, K), np.int32)
        np.add.at(nwk, (words, z), 1)
        nk = nwk.sum(0).astype(np.int64)
        cap = np.minimum(lengths, K)
        doff = np.r_[0, np.cumsum(cap)].astype(np.int64)
        dtop, dcnt = np.zeros(doff[-1], np.uint16), np.zeros(lengths.size, np.int32)
        if wide:
            ndk, big = np.zeros((lengths.size, K), np.uint16), None
        else:
            counts = DocTopics(lengths.size, K, int(z.size))
            ndk, big = counts.rows, counts.big
        _doc_lists(docs, z, ndk, dtop, doff, dcnt, big)
        index = MHIndex(docs, z, lengths, K, 2)
        for sweep in range(10):
            if sampler == "mh":
                index.sample(seg_row, seg_ptr, 0, seg_row.size, docs, z, nwk, nk, ndk, alpha, beta, V * beta, sweep,
                             big)
            else:
                _sample(seg_row, seg_ptr, 0, seg_row.size, docs, z, nwk, nk, ndk, dtop, doff, dcnt, alpha, beta,
                        V * beta, np.zeros(K), np.zeros(K), sweep, big)
        dense = ndk.astype(np.int64) if big is None else dense_counts(ndk, big)
        runs.append((z, dense, alpha_sums(ndk, lengths, 0.3, big), _doc_loglik(ndk, lengths, alpha, big),
                     0 if big is None else int((big[:, 0] >= 0).sum())))
    (z16, n16, sums16, ll16, _), (z8, n8, sums8, ll8, passed) = runs
    assert passed > 0, "no count passed a byte: the test would not reach the table"
    np.testing.assert_array_equal(z8, z16)
    np.testing.assert_array_equal(n8, n16)
    expected = np.zeros_like(n16)
    np.add.at(expected, (docs, z16), 1)
    np.testing.assert_array_equal(n8, expected)
    assert sums8 == sums16 and ll8 == ll16


def test_bytes_from_many_topics_and_sixteen_bits_below():
    rows, big = doc_topic_counts(5, BYTE_TOPICS, tokens=10_000, longest=9_000)
    assert rows.dtype == np.uint8 and rows.shape == (5, BYTE_TOPICS) and big is not None
    assert big.shape[0] >= 2 * (10_000 // TOP)  # never fills: a count there holds TOP tokens or more
    rows, big = doc_topic_counts(5, BYTE_TOPICS - 1, tokens=10_000, longest=9_000)
    assert rows.dtype == np.uint16 and big is None
    rows, big = doc_topic_counts(5, 50, tokens=100_000, longest=70_000)  # a document past 16 bits
    assert rows.dtype == np.int32 and big is None
