"""The exact Gibbs draw at many topics over the word's topics, not the document's
(``sample_exact``; SparseLDA's word bucket, taken word by word, issue 49).

``lda_sampler._gibbs`` splits a token's conditional as ``n_dk·Y_k + α·Y_k`` and walks the
document's non-zero topics a token.  At many topics a document holds far more topics than a
word does: 20 Newsgroups at K = 1 000, after the hybrid's MH sweeps, 72 topics a token's
document against 26 its word's (both weighted by tokens), and a third of the draws fell in
the smoothing bucket, whose walk took another ~40 steps.  The same conditional, the token
left out (``⁻``), split SparseLDA's way with the word's counts first:

    p(k) ∝ n⁻_wk (n⁻_dk + α) / (n⁻_k + Vβ)      A: over the word's topics (a list a word)
         + β n⁻_dk / (n⁻_k + Vβ)               B: over the document's topics
         + αβ / (n⁻_k + Vβ)                    C: over every topic (span sums, as ``_gibbs``)

A is summed a token over the word's list; C is kept up to date as the totals move.  B is
not summed: it is bounded by ``β (n_d − 1) / (L + Vβ)``, ``L`` the smallest ``n_k`` (taken at
the word's start, then lowered as a total falls), and a draw that falls in the bound sums B
then, and is redrawn where it falls past B (rejection: the draw is the conditional's,
exactly).  The bound is a few per cent of the mass, so a token costs its word's topics,
and the document's only now and then.  The word's list holds each topic once (a flag a
topic): one that falls to zero stays, adding nothing.  A's sum reads the document's counts
with the token in (its topic's term less ``own`` afterwards), and the counts move only when
the topic does.

The helpers a token calls take arrays, and a numba function that takes an array counts a
reference to it on the way in and out (``NRT_incref``/``NRT_decref``, an atomic add each):
inlined (``inline="always"``) they cost ``_words`` four such pairs a moved token, 15 % of its
time, which LLVM's pruning of the pairs could not take out across their loops and branches.
So they are compiled without reference counts (``uncounted``: they allocate nothing), and
called.  One thread, 20 Newsgroups at K = 1 000 after 60 MH sweeps: ``_gibbs`` 5.5-6.0 M
token-iterations/s, this with inlined helpers 6.5-7.1, without the counts 7.8-8.1.

A's term a topic is ``n_wk inv_k (n⁻_dk + α)``, and of its three factors only the document's
changes from one token to the next: ``n_wk inv_k`` is kept beside the word's list (``qw``), set
afresh for the two topics a token moves between, so a term reads two arrays, not four (the
document's row and ``qw`` in order, against ``n_wk`` and ``inv`` at the list's topics).  One
thread, the same state after 60 MH sweeps, the two in turn: 7.0-7.4 M token-iterations/s
before, 7.9-8.6 after, and the same draws (``z`` hashed after 6 sweeps; the product is rounded
in another order, so a draw can differ only where a uniform falls within a rounding of a bound).

The document's counts a term reads are indexed unsigned (``flat`` at ``d * K + k``): numba checks
a signed index it cannot prove non-negative for wrapping at every access.  One thread, 20
Newsgroups at K = 1 000 after 60 MH sweeps, 21 sweeps each in turn, both orders: 106.5-107.3 ns
a token before, 103.5-104.5 after (least 103.1-104.1 against 100.6-101.2), the same draws.

A's sum and a word's span sums are each added in four chains (``_chains_sum``), not one: an
addition waits 3-4 cycles on the one before it, so one chain a term (and the span sums'
load-add-store a topic, K of them at every word's start) held the loop to one term every 3-4
cycles.  The draw then walks A's terms adding them up as it goes, in the order the one chain
added them, to where the uniform falls.  The sum's rounding differs from one chain's, so a draw
can differ only where a uniform falls within a rounding of a bound.  One thread, one worker's
documents (every other one), 20 Newsgroups at K = 1 000 after 60 MH sweeps, 48 sweeps each in
turn, three runs: 88.0, 83.1, 82.8 -> 85.7, 79.1, 79.5 ns a token, the same draws; in a 2-worker
job a word's start is twice the share (each worker starts every word on half the tokens).

Below ``WORD_TOPICS`` topics ``_gibbs`` draws, as before, to the bit.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from paramserver._runtime.intrinsics import prefetch_row, uncounted
from paramserver.apps.rounds.lda_counts import TOP, big_count
from paramserver.apps.rounds.lda_sampler import (
    DOC_AHEAD,
    ROW_SWEEP_BYTES,
    _mix,
    _sample,
    _span_shift,
    _uniform,
    doc_joined,
    doc_left,
)

#: topics from which the exact draw goes over the word's topics (``_words``)
WORD_TOPICS = 384


def sample_exact(seg_row: np.ndarray, seg_ptr: np.ndarray, s_lo: int, s_hi: int, tdoc: np.ndarray, z: np.ndarray,
                 nwk: np.ndarray, nk: np.ndarray, ndk: np.ndarray, dtop: np.ndarray, doff: np.ndarray,
                 dcnt: np.ndarray, dlen: np.ndarray, alpha: float, beta: float, vbeta: float, Y: np.ndarray,
                 cum: np.ndarray, seed: int, big: np.ndarray | None = None) -> None:
    """Gibbs-sample segments ``[s_lo, s_hi)`` in place, as ``lda_sampler._sample`` does (its
    arguments; ``dlen``: each document's tokens): from ``WORD_TOPICS`` topics over each
    word's topics (``_words``), below by ``_sample``.  For topics that sweeps have already
    concentrated (the hybrid's exact sweeps, after MH's): from random topics a word holds
    more topics than its documents do, and ``_sample`` was faster (20 Newsgroups, K = 1 000,
    the first 8 sweeps from random topics: 1.27 s against 2.11; K = 400, 12 sweeps: 1.26 against 1.95)."""
    K = nk.shape[0]
    if K < WORD_TOPICS:
        sample_sparse(seg_row, seg_ptr, s_lo, s_hi, tdoc, z, nwk, nk, ndk, dtop, doff, dcnt, dlen, alpha, beta, vbeta,
                      Y, cum, seed, big)
        return
    shift = _span_shift(K)
    step = 64 // ndk.itemsize if K * ndk.itemsize >= ROW_SWEEP_BYTES else 0
    _words(seg_row, seg_ptr, s_lo, s_hi, tdoc, z, nwk, nk, ndk, ndk.reshape(-1), dtop, doff, dcnt, dlen, alpha,
           beta, vbeta, seed, big, Y, np.zeros(((K - 1) >> shift) + 1), shift, cum, np.zeros(K, np.int32),
           np.zeros(K, np.int32), np.zeros(K, np.uint8), np.zeros(K), step)


def sample_sparse(seg_row: np.ndarray, seg_ptr: np.ndarray, s_lo: int, s_hi: int, tdoc: np.ndarray, z: np.ndarray,
                  nwk: np.ndarray, nk: np.ndarray, ndk: np.ndarray, dtop: np.ndarray, doff: np.ndarray,
                  dcnt: np.ndarray, dlen: np.ndarray, alpha: float, beta: float, vbeta: float, Y: np.ndarray,
                  cum: np.ndarray, seed: int, big: np.ndarray | None = None) -> None:
    """``lda_sampler._sample`` with ``sample_exact``'s arguments (``dlen`` unread): the exact draw
    over the document's topics, for topics not yet concentrated (``--sampler sparse``)."""
    _sample(seg_row, seg_ptr, s_lo, s_hi, tdoc, z, nwk, nk, ndk, dtop, doff, dcnt, alpha, beta, vbeta, Y, cum, seed,
            big)


@uncounted
def _chains_sum(a, lo, hi):  # type: ignore[no-untyped-def]
    """``a[lo:hi]``'s sum in four chains of additions, not one: a chain's every addition waits
    on the one before (3-4 cycles), four overlap."""
    a0 = a1 = a2 = a3 = 0.0
    for j in range(lo, hi - 3, 4):
        a0, a1, a2, a3 = a0 + a[j], a1 + a[j + 1], a2 + a[j + 2], a3 + a[j + 3]
    for j in range(hi - (hi - lo) % 4, hi):
        a0 += a[j]
    return (a0 + a1) + (a2 + a3)


@uncounted
def _total_moved(nk, k, by, vbeta, inv, isum, shift):  # type: ignore[no-untyped-def]
    """``n_k += by`` and its ``1/(n_k + Vβ)`` with its span's sum; the change to their total."""
    nk[k] += by
    y = 1.0 / (nk[k] + vbeta)
    dy = y - inv[k]
    inv[k] = y
    isum[k >> shift] += dy
    return dy


@uncounted
def _in_doc(u, ndk, big, dtop, base, n, d, old, beta, inv, K):  # type: ignore[no-untyped-def]
    """B's topic at ``u`` (β n⁻_dk inv_k over the document's topics, ``old`` less the token), or
    -1 past B (a redraw)."""
    acc = 0.0
    for j in range(n):
        k = dtop[base + j]
        c = ndk[d, k]
        if big is not None and c == TOP:
            c = big_count(big, d, k, K)
        acc += beta * (c - (k == old)) * inv[k]
        if u < acc:
            return k
    return -1


@uncounted
def _smoothing(u, inv, isum, shift, K):  # type: ignore[no-untyped-def]
    """C's topic at ``u`` (inv_k over every topic), span by span."""
    acc = 0.0
    for b in range(isum.shape[0]):
        if u < acc + isum[b]:
            lo = b << shift
            hi = min(lo + (1 << shift), K)
            for k in range(lo, hi):
                acc += inv[k]
                if u < acc:
                    return k
            return hi - 1
        acc += isum[b]
    return K - 1


@uncounted
def _word_start(nw, nk, inv, isum, shift, wtop, wpos, inw, qw):  # type: ignore[no-untyped-def]
    """A word's start: the span sums of ``inv`` afresh (no drift past a word: ``inv`` itself is
    exact, each ``1/(n_k + Vβ)`` set whole as its total moves), the word's topics listed with
    their ``n_wk/(n_k + Vβ)`` (``qw``, beside them); ``(Σ inv, the smallest n_k, the topics listed)``."""
    K = nk.shape[0]
    total = 0.0
    for b in range(isum.shape[0]):
        isum[b] = _chains_sum(inv, b << shift, min((b + 1) << shift, K))
        total += isum[b]
    floor, m = nk[0], 0
    for k in range(K):
        floor = min(floor, nk[k])
    for k in range(K):
        if nw[k] > 0:
            wtop[m], wpos[k], inw[k], qw[m] = k, m, 1, nw[k] * inv[k]
            m += 1
    return total, floor, m


@uncounted
def _fetch_doc(t, last, tdoc, ndk, flat, dtop, doff, step, K):  # type: ignore[no-untyped-def]
    """The state of the document of token ``t`` (a token further on; none at ``last`` or past
    it), fetched meanwhile (as ``_gibbs``): its counts' row (every line of it where ``step``)
    and its topic list."""
    if t >= last:
        return
    d = tdoc[t]
    prefetch_row(ndk, d)  # type: ignore[call-arg]
    prefetch_row(dtop, doff[d])
    for off in range(step, K if step else 0, max(step, 1)):
        prefetch_row(flat, d * K + off)


@njit(nogil=True, cache=True)
def _words(seg_row, seg_ptr, s_lo, s_hi, tdoc, z, nwk, nk, ndk, flat, dtop, doff, dcnt, dlen, alpha, beta,  # type: ignore[no-untyped-def]  # noqa: C901  (one numba kernel: a helper a token that takes arrays cost it a third)
           vbeta, seed, big, inv, isum, shift, cum, wtop, wpos, inw, qw, step):
    """``sample_exact``'s kernel: ``inv[k]`` is ``1/(n_k + Vβ)``, ``isum`` its sums over spans of
    ``2^shift`` topics, ``wtop[:m]`` the word's topics (``inw[k]``: k is there, at ``wpos[k]``),
    ``qw[j]`` topic ``wtop[j]``'s ``n_wk inv_k``, kept as the two move, ``cum`` A's terms;
    ``step``: fetch every line of a document's row ahead (``_gibbs``'s)."""
    K, x = nk.shape[0], _mix(np.uint64(seed))
    last, ab = seg_ptr[s_hi], alpha * beta
    inv[:] = 1.0 / (nk + vbeta)  # once a call, not K divisions a word: ``_total_moved`` keeps each exact
    for s in range(s_lo, s_hi):
        nw = nwk[seg_row[s]]
        total, floor, m = _word_start(nw, nk, inv, isum, shift, wtop, wpos, inw, qw)
        for t in range(seg_ptr[s], seg_ptr[s + 1]):
            _fetch_doc(t + DOC_AHEAD, last, tdoc, ndk, flat, dtop, doff, step, K)
            d, old = tdoc[t], z[t]
            base = doff[d]
            nw[old] -= 1
            total += _total_moved(nk, old, -1, vbeta, inv, isum, shift)
            floor = min(floor, nk[old])  # no n_k is below it (a total falls only here)
            own, at = nw[old] * inv[old], wpos[old]
            qw[at] = own
            row = np.uint64(d * K)  # the document's counts in ``flat``: an unsigned index, never checked for wrapping
            for j in range(m):  # A's terms: the word's topics (n_dk with the token's own: ``own`` less later)
                c = flat[row + np.uint64(wtop[j])]
                if big is not None and c == TOP:
                    c = big_count(big, d, wtop[j], K)
                cum[j] = qw[j] * (c + alpha)
            a0 = a1 = a2 = a3 = 0.0  # their sum in four chains, as ``_chains_sum`` adds (inline: a call cost 4 %)
            for q in range(m >> 2):
                a0, a1, a2, a3 = a0 + cum[4 * q], a1 + cum[4 * q + 1], a2 + cum[4 * q + 2], a3 + cum[4 * q + 3]
            for j in range(m & ~3, m):
                a0 += cum[j]
            a = (a0 + a1) + (a2 + a3) - own
            bmax = beta * (dlen[d] - 1) / (max(floor, 0) + vbeta)
            new = -1
            while new < 0:
                x, r = _uniform(x)
                u = r * (a + bmax + ab * total)
                if u < a:
                    new, run = wtop[m - 1], 0.0
                    for j in range(m):  # A's running sum, added in the order one chain would have
                        run += cum[j]
                        if u < run - (own if j >= at else 0.0):
                            new = wtop[j]
                            break
                elif u < a + bmax:  # B's bound: B summed now, the draw kept where it falls in B
                    new = _in_doc(u - a, ndk, big, dtop, base, dcnt[d], d, old, beta, inv, K)
                else:
                    new = _smoothing((u - a - bmax) / ab, inv, isum, shift, K)
            nw[new] += 1
            if not inw[new]:
                wtop[m], wpos[new], inw[new], m = new, m, 1, m + 1
            total += _total_moved(nk, new, 1, vbeta, inv, isum, shift)
            qw[wpos[new]] = nw[new] * inv[new]
            if new != old:  # the document's counts move only now: the draw read them less the token
                doc_left(ndk, big, dtop, dcnt, d, base, old, K)
                doc_joined(ndk, big, dtop, dcnt, d, base, new, K)
            z[t] = new
        inw[wtop[:m]] = 0
