"""The exact draw over the word's topics at many topics (``lda_words``, issue 49): a token's
draw follows the collapsed conditional, whichever of the three buckets it falls in (the
document's by rejection under its bound); sweeps keep every count that of the tokens'
topics, byte counts past 255 included; below ``WORD_TOPICS`` the draw is ``_sample``'s."""

from __future__ import annotations

import numpy as np
import pytest

from paramserver.apps.rounds.lda_counts import DocTopics, dense_counts
from paramserver.apps.rounds.lda_sampler import _doc_lists, _sample
from paramserver.apps.rounds.lda_words import WORD_TOPICS, sample_exact


@pytest.mark.parametrize("case", ["spread", "smallest total"])
def test_a_draw_follows_the_collapsed_conditional_in_every_bucket(case):
    """One token (word 4, topic 3) of a 30-token document, K = 400: the word's counts in 25
    topics (A), the document's in its own (B: β large, so its bound is often reached and
    sometimes passed, a redraw), every topic's smoothing (C).  "smallest total": a 3-token
    document all in topic 3, the smallest total, so that B's bound holds only with the total
    as it falls when the token leaves (most of the mass is B's topic 3).  40 000 draws, each
    of its own seed, against (n⁻_dk + α)(n⁻_wk + β)/(n⁻_k + Vβ): χ² over the bins expected 5
    or more, and the likeliest topic's count within 5 standard deviations."""
    K, V = WORD_TOPICS + 16, 9
    n = 30 if case == "spread" else 3
    alpha, beta = (0.2, 0.4) if case == "spread" else (0.01, 0.1)
    rng = np.random.default_rng(5)
    others = np.zeros((V, K), np.int32)
    for w in range(8):  # each word's counts in other documents: a few topics each
        others[w, rng.choice(K, 25, replace=False)] = rng.integers(1, 30, 25)
    doc_words = np.r_[4, rng.integers(0, V - 1, n - 1)]
    z0 = np.r_[3, rng.integers(0, K, n - 1)].astype(np.int32)
    if case != "spread":
        others[:, 3] = 0
        others[8] = 100  # every topic but 3 far above it
        others[8, 3] = 0
        z0[:] = 3
    order = np.lexsort((np.arange(n), doc_words))  # the worker's tokens by word: the first of word 4 first
    words, z0 = doc_words[order], z0[order]
    first = int(np.flatnonzero(words == 4)[0])
    assert z0[first] == 3
    nwk0 = others.copy()
    np.add.at(nwk0, (words, z0), 1)
    nk0 = nwk0.sum(0).astype(np.int64)
    ndk = np.bincount(z0, minlength=K).astype(np.float64)
    nw, nk = nwk0[4].astype(np.float64), nk0.astype(np.float64)
    ndk[3], nw[3], nk[3] = ndk[3] - 1, nw[3] - 1, nk[3] - 1
    p = (ndk + alpha) * (nw + beta) / (nk + V * beta)
    p /= p.sum()
    seg = np.flatnonzero(np.r_[True, words[1:] != words[:-1]])
    seg_ptr, seg_row = np.r_[seg, words.size].astype(np.int64), words[seg].astype(np.int64)
    s4 = int(np.flatnonzero(seg_row == 4)[0])
    ptr4 = np.array([seg_ptr[s4], seg_ptr[s4] + 1], np.int64)  # the segment of the one token
    draws, counts = 40_000, np.zeros(K)
    docs = np.zeros(words.size, np.int32)
    for i in range(draws):
        z, nwk, nk_ = z0.copy(), nwk0.copy(), nk0.copy()
        ndk_, dtop, doff, dcnt = np.zeros((1, K), np.uint16), np.zeros(n, np.uint16), np.array([0, n]), \
            np.zeros(1, np.int32)
        _doc_lists(docs, z, ndk_, dtop, doff, dcnt)
        sample_exact(np.array([4]), np.r_[ptr4[0], ptr4[1]].astype(np.int64) - ptr4[0] + first, 0, 1, docs, z, nwk,
                     nk_, ndk_, dtop, doff, dcnt, np.array([n]), alpha, beta, V * beta, np.zeros(K), np.zeros(K),
                     3 + i)
        counts[z[first]] += 1
    expected = p * draws
    if case == "spread":
        assert (expected >= 5).sum() > 100  # the test reaches far into C: most topics hold no count here
    keep = expected >= 5
    chi2 = float((((counts - expected) ** 2 / expected)[keep]).sum())
    rest_e, rest_c = expected[~keep].sum(), counts[~keep].sum()
    chi2 += (rest_c - rest_e) ** 2 / rest_e
    dof = int(keep.sum())  # the bins kept and the rest lumped, less one
    assert chi2 < dof + 4.5 * np.sqrt(2 * dof), (chi2, dof)
    top = int(np.argmax(p))
    sd = np.sqrt(draws * p[top] * (1 - p[top]))
    assert abs(counts[top] - expected[top]) < 5 * sd, (top, counts[top], expected[top])


@pytest.mark.parametrize("K,byte_counts", [(WORD_TOPICS, False), (1000, True), (1000, False)])
def test_sweeps_keep_every_count(K, byte_counts):
    """Sweeps over a random corpus with two documents long enough for byte counts to pass
    255: ``n_wk``, ``n_k``, ``n_dk`` (through the table) and the topic lists stay the tokens'."""
    rng = np.random.default_rng(7)
    V, alpha, beta = 30, 0.1, 0.01
    lens = np.r_[800, 700, rng.integers(1, 120, 25)]
    D = lens.size
    docs = np.repeat(np.arange(D), lens).astype(np.int32)
    words = np.where(docs < 2, rng.integers(0, 3, docs.size), rng.integers(0, V, docs.size)).astype(np.int32)
    order = np.lexsort((docs, words))
    words, docs = words[order], docs[order]
    z = np.where(docs < 2, 5, rng.integers(0, K, docs.size)).astype(np.int32)
    nwk = np.zeros((V, K), np.int32)
    np.add.at(nwk, (words, z), 1)
    nk = nwk.sum(0).astype(np.int64)
    doff = np.r_[0, np.cumsum(np.minimum(lens, K))].astype(np.int64)
    dtop, dcnt = np.zeros(doff[-1], np.uint16), np.zeros(D, np.int32)
    if byte_counts:
        counts = DocTopics(D, K, int(z.size))
        ndk, big = counts.rows, counts.big
    else:
        ndk, big = np.zeros((D, K), np.uint16), None
    _doc_lists(docs, z, ndk, dtop, doff, dcnt, big)
    seg = np.flatnonzero(np.r_[True, words[1:] != words[:-1]])
    seg_ptr, seg_row = np.r_[seg, words.size].astype(np.int64), words[seg].astype(np.int64)
    for sweep in range(6):
        sample_exact(seg_row, seg_ptr, 0, seg_row.size, docs, z, nwk, nk, ndk, dtop, doff, dcnt, lens, alpha, beta,
                     V * beta, np.zeros(K), np.zeros(K), sweep, big)
    expect_wk = np.zeros((V, K), np.int64)
    np.add.at(expect_wk, (words, z), 1)
    expect_dk = np.zeros((D, K), np.int64)
    np.add.at(expect_dk, (docs, z), 1)
    np.testing.assert_array_equal(nwk, expect_wk)
    np.testing.assert_array_equal(nk, expect_wk.sum(0))
    np.testing.assert_array_equal(ndk if big is None else dense_counts(ndk, big), expect_dk)
    if big is not None:
        assert (big[:, 0] >= 0).any(), "no count passed a byte: the table was not reached"
    for d in range(D):
        assert sorted(dtop[doff[d]:doff[d] + dcnt[d]].tolist()) == np.flatnonzero(expect_dk[d]).tolist()
    assert len(set(z.tolist())) > 20  # the tokens moved


def test_below_word_topics_the_draw_is_the_sparse_kernels():
    rng = np.random.default_rng(2)
    K, V, D = WORD_TOPICS - 1, 20, 15
    lens = rng.integers(5, 60, D)
    docs = np.repeat(np.arange(D), lens).astype(np.int32)
    words = rng.integers(0, V, docs.size).astype(np.int32)
    order = np.lexsort((docs, words))
    words, docs = words[order], docs[order]
    z0 = rng.integers(0, K, docs.size).astype(np.int32)
    seg = np.flatnonzero(np.r_[True, words[1:] != words[:-1]])
    seg_ptr, seg_row = np.r_[seg, words.size].astype(np.int64), words[seg].astype(np.int64)
    out = []
    for fn in ("exact", "sparse"):
        z = z0.copy()
        nwk = np.zeros((V, K), np.int32)
        np.add.at(nwk, (words, z), 1)
        nk = nwk.sum(0).astype(np.int64)
        doff = np.r_[0, np.cumsum(np.minimum(lens, K))].astype(np.int64)
        dtop, dcnt, ndk = np.zeros(doff[-1], np.uint16), np.zeros(D, np.int32), np.zeros((D, K), np.uint16)
        _doc_lists(docs, z, ndk, dtop, doff, dcnt)
        args = (seg_row, seg_ptr, 0, seg_row.size, docs, z, nwk, nk, ndk, dtop, doff, dcnt)
        if fn == "exact":
            sample_exact(*args, lens, 0.1, 0.01, V * 0.01, np.zeros(K), np.zeros(K), 9)
        else:
            _sample(*args, 0.1, 0.01, V * 0.01, np.zeros(K), np.zeros(K), 9)
        out.append(z)
    np.testing.assert_array_equal(out[0], out[1])


def test_a_words_next_token_draws_from_the_counts_its_last_token_left():
    """Two tokens of word 4, both in topic 3, in documents 0 and 1 that hold mostly topic 7 (K =
    400): the first token often moves to topic 7, new to the word's list, and the second's draw
    must then read ``n_wk`` and ``n_k`` as that move left them (the word's ``n_wk inv_k`` kept
    beside its list: ``qw``), not as they stood at the word's start.  25 000 sweeps of the
    word's segment, each of its own seed; the second token's topics against the sum, over the
    sweeps, of its conditional given where the first went: χ² over the bins expected 5 or more."""
    K, V, alpha, beta = WORD_TOPICS + 16, 9, 0.1, 0.05
    rng = np.random.default_rng(11)
    others = np.zeros((V, K), np.int32)
    others[4, [3, 20, 50]] = [1, 2, 1]  # word 4's counts in other workers' documents: few, so a move shows
    for w in range(4):
        others[w, rng.choice(K, 10, replace=False)] = rng.integers(1, 20, 10)
    others[5:] = rng.integers(3, 8, (V - 5, K))  # every topic's total well above 0: the smoothing bucket is small
    lens = np.array([12, 9])
    docs_of = np.repeat(np.arange(2), lens)
    words_of = np.where(np.arange(lens.sum()) % 12 == 0, 4, rng.integers(0, 4, lens.sum()))
    words_of[lens[0]] = 4  # document 1's first token: word 4's second
    z_of = np.where(words_of == 4, 3, 7).astype(np.int32)
    z_of[[1, lens[0] + 1]] = 20
    order = np.lexsort((docs_of, words_of))
    words, docs, z0 = words_of[order], docs_of[order].astype(np.int32), z_of[order]
    first = int(np.flatnonzero(words == 4)[0])
    assert words[first + 1] == 4 and docs[first] == 0 and docs[first + 1] == 1
    nwk0 = others.copy()
    np.add.at(nwk0, (words, z0), 1)
    nk0 = nwk0.sum(0).astype(np.int64)
    doff = np.r_[0, np.cumsum(np.minimum(lens, K))].astype(np.int64)
    draws = 25_000
    seen, expected = np.zeros(K), np.zeros(K)
    for i in range(draws):
        z, nwk, nk = z0.copy(), nwk0.copy(), nk0.copy()
        ndk, dtop, dcnt = np.zeros((2, K), np.uint16), np.zeros(doff[-1], np.uint16), np.zeros(2, np.int32)
        _doc_lists(docs, z, ndk, dtop, doff, dcnt)
        sample_exact(np.array([4]), np.array([first, first + 2], np.int64), 0, 1, docs, z, nwk, nk, ndk, dtop, doff,
                     dcnt, lens, alpha, beta, V * beta, np.zeros(K), np.zeros(K), 1000 + i)
        nw, nk1 = nwk0[4].astype(np.float64), nk0.astype(np.float64)  # after the first token's move
        nw[3] -= 1
        nk1[3] -= 1
        nw[z[first]] += 1
        nk1[z[first]] += 1
        nw[3] -= 1  # the second token left out
        nk1[3] -= 1
        nd = np.bincount(z_of[docs_of == 1], minlength=K).astype(np.float64)
        nd[3] -= 1
        p = (nd + alpha) * (nw + beta) / (nk1 + V * beta)
        expected += p / p.sum()
        seen[z[first + 1]] += 1
    assert expected[7] > 0.05 * draws and seen[7] > 0  # the second token's draw depends on the first's move
    keep = expected >= 5
    chi2 = float((((seen - expected) ** 2 / expected)[keep]).sum())
    rest_e, rest_c = expected[~keep].sum(), seen[~keep].sum()
    if rest_e > 0:
        chi2 += (rest_c - rest_e) ** 2 / rest_e
    dof = int(keep.sum()) - (rest_e == 0)
    assert chi2 < dof + 4.5 * np.sqrt(2 * dof), (chi2, dof)
