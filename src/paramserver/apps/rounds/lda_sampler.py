"""The model ``paramserver lda`` trains, shared by the driver (``lda``) and a worker's program
(``lda_program``): its two tables, its settings (``LDAConfig``, from ``settings``) and the collapsed Gibbs
sampler's numba kernels (SparseLDA's split, taken word by word: see ``lda``'s docstring).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from paramserver._runtime.intrinsics import prefetch_row
from paramserver.apps.rounds.settings import LDAConfig as LDAConfig  # its old home

WORD_TOPIC, TOPIC_DELTA = "lda/word_topic", "lda/topic_delta"
MAX_COUNT = 1 << 24  # a word–topic count is a float32 on the servers: exact below this
#: the token whose document's counts and topic list are fetched ahead while one is sampled: a
#: word's tokens visit its documents in order but far apart, so each token's document state was
#: a miss to L3 (20 Newsgroups, K = 50, one thread: 14.1 M token-iterations/s without, 15.8 with)
DOC_AHEAD = 8


#: SplitMix64's constants (``_uniform``, ``_mix``)
_GOLD, _M1, _M2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S11, _S27, _S30, _S31 = np.uint64(11), np.uint64(27), np.uint64(30), np.uint64(31)


@njit(nogil=True, cache=True)
def _uniform(x):  # type: ignore[no-untyped-def]
    """SplitMix64: the state after ``x`` and a uniform in [0, 1) from it (np.random's Mersenne
    Twister took 8-12 ns a draw in numba, this 1.6 ns: the sparse kernel went from 15.7 to 19.0 M
    token-iterations/s on one thread, 20 Newsgroups at K = 50; an MH token draws up to 4 a cycle)."""
    x += _GOLD
    return x, (_mix(x) >> _S11) * (1.0 / 9007199254740992.0)


@njit(nogil=True, cache=True)
def _mix(x):  # type: ignore[no-untyped-def]
    """SplitMix64's output function: 64 bits well mixed from ``x``."""
    r = (x ^ (x >> _S30)) * _M1
    r = (r ^ (r >> _S27)) * _M2
    return r ^ (r >> _S31)


@njit(inline="always", nogil=True, cache=True)
def _drop_topic(dtop, base, n, old):  # type: ignore[no-untyped-def]
    """Take topic ``old`` out of the document's list ``dtop[base:base + n]`` (the last takes its place)."""
    for j in range(n):
        if dtop[base + j] == old:
            dtop[base + j] = dtop[base + n - 1]
            break


@njit(inline="always", nogil=True, cache=True)
def _span_shift(K):  # type: ignore[no-untyped-def]
    """log2 of the topics a span of the smoothing bucket's index holds: 64, or about √K past
    4 096 topics, so that a draw walks about √K spans and topics, never K."""
    shift = 6
    while (1 << (2 * shift)) < K:
        shift += 1
    return shift


@njit(inline="always", nogil=True, cache=True)
def _word_weights(nw, nk, beta, vbeta, Y, bsum, shift):  # type: ignore[no-untyped-def]
    """A word's ``Y_k = (n_wk + β)/(n_k + Vβ)`` for every topic, their spans' sums where there
    is more than one span (K > 64), and Σ Y.  Once a word: a helper that takes arrays, called
    once a token, cost K = 50 a third of its speed (their reference counts), so the token's
    own updates of ``Y`` and the spans stay in ``_sample``."""
    wsum = 0.0
    for k in range(Y.shape[0]):
        Y[k] = (nw[k] + beta) / (nk[k] + vbeta)
        wsum += Y[k]
    if bsum.shape[0] > 1:
        bsum[:] = 0.0
        for k in range(Y.shape[0]):
            bsum[k >> shift] += Y[k]
    return wsum


@njit(inline="always", nogil=True, cache=True)
def _smoothing_draw(u, Y, bsum, shift, alpha):  # type: ignore[no-untyped-def]
    """The topic of the smoothing bucket (weights α·Y_k) at ``u``: the span whose running sum
    passes ``u``, then the topic inside it.  A draw falls here often at large K (a third of
    the tokens at K = 1 000 on 20 Newsgroups), and a walk over every topic took 500 steps;
    over the spans' sums it takes about 8 + 32.  With one span (K ≤ 64) it is the plain walk,
    draw for draw."""
    K = Y.shape[0]
    acc, lo = 0.0, 0
    if bsum.shape[0] > 1:
        lo = -1
        for b in range(bsum.shape[0]):
            nxt = acc + alpha * bsum[b]
            if u < nxt:
                lo = b << shift
                break
            acc = nxt
        if lo < 0:  # past the last span's sum: rounding
            return K - 1
    hi = min(lo + (1 << shift), K)
    for k in range(lo, hi):
        acc += alpha * Y[k]
        if u < acc:
            return k
    return hi - 1


@njit(nogil=True, cache=True)
def _sample(seg_row, seg_ptr, s_lo, s_hi, tdoc, z, nwk, nk, ndk, dtop, doff, dcnt, alpha, beta, vbeta, Y, cum,  # type: ignore[no-untyped-def]
            seed):
    """Gibbs-sample the tokens of segments ``[s_lo, s_hi)`` (one word each; the word's
    counts are row ``seg_row[s]`` of ``nwk``) in place: ``z``, ``nwk``, ``nk``, ``ndk``
    and the documents' non-zero topic lists ``dtop[doff[d]:doff[d] + dcnt[d]]``; the draws
    come from SplitMix64 seeded with ``seed``."""
    K = nk.shape[0]
    x = _mix(np.uint64(seed))
    last = seg_ptr[s_hi]  # the block's tokens end here: nothing past it is fetched
    shift = _span_shift(K)
    bsum = np.zeros(((K - 1) >> shift) + 1)  # Σ Y over each span of 2^shift topics: the smoothing bucket's index
    spans = bsum.shape[0] > 1  # else (K ≤ 64) the walk is over Y itself, and nothing is kept
    for s in range(s_lo, s_hi):
        nw = nwk[seg_row[s]]
        wsum = alpha * _word_weights(nw, nk, beta, vbeta, Y, bsum, shift)
        for t in range(seg_ptr[s], seg_ptr[s + 1]):
            if t + DOC_AHEAD < last:  # the document state of a token further on: fetched meanwhile
                ahead = tdoc[t + DOC_AHEAD]
                prefetch_row(ndk, ahead)  # type: ignore[call-arg]
                prefetch_row(dtop, doff[ahead])
            d, old = tdoc[t], z[t]
            base = doff[d]
            nw[old] -= 1
            nk[old] -= 1
            c = ndk[d, old] - 1
            ndk[d, old] = c
            if c == 0:  # the topic leaves the document's list
                _drop_topic(dtop, base, dcnt[d], old)
                dcnt[d] -= 1
            y = (nw[old] + beta) / (nk[old] + vbeta)
            wsum += alpha * (y - Y[old])
            if spans:
                bsum[old >> shift] += y - Y[old]
            Y[old] = y
            dsum = 0.0
            n = dcnt[d]
            for j in range(n):
                k = dtop[base + j]
                dsum += ndk[d, k] * Y[k]
                cum[j] = dsum
            x, r = _uniform(x)
            u = r * (dsum + wsum)
            new = -1
            if u < dsum:
                for j in range(n):
                    if u < cum[j]:
                        new = dtop[base + j]
                        break
            if new < 0:  # the smoothing bucket: α·Y_k
                new = _smoothing_draw(u - dsum, Y, bsum, shift, alpha)
            nw[new] += 1
            nk[new] += 1
            c = ndk[d, new] + 1
            ndk[d, new] = c
            if c == 1:
                dtop[base + dcnt[d]] = new
                dcnt[d] += 1
            y = (nw[new] + beta) / (nk[new] + vbeta)
            wsum += alpha * (y - Y[new])
            if spans:
                bsum[new >> shift] += y - Y[new]
            Y[new] = y
            z[t] = new


@njit(nogil=True, cache=True)
def block_counts(rows):  # type: ignore[no-untyped-def]
    """A pulled word block's rows (float32 counts, exact below 2^24) as int32 twice, in one
    pass: the counts the sampler moves, and the counts before it, which ``block_changes``
    subtracts (at K = 1 000 a block is 6 MB: numpy's astype, then a copy, read it twice)."""
    n, K = rows.shape
    counts, before = np.empty((n, K), np.int32), np.empty((n, K), np.int32)
    for i in range(n):
        for k in range(K):
            c = np.int32(rows[i, k])
            counts[i, k] = c
            before[i, k] = c
    return counts, before


@njit(nogil=True, cache=True)
def block_changes(counts, before):  # type: ignore[no-untyped-def]
    """The rows that changed (their indices) and by how much (float32: what ``add`` pushes),
    in one pass over each: numpy's ``(counts != before).any(1)`` and two fancy indexings made
    temporaries of the whole block."""
    n, K = counts.shape
    changed = np.empty(n, np.int64)
    m = 0
    for i in range(n):
        for k in range(K):
            if counts[i, k] != before[i, k]:
                changed[m] = i
                m += 1
                break
    delta = np.empty((m, K), np.float32)
    for j in range(m):
        i = changed[j]
        for k in range(K):
            delta[j, k] = counts[i, k] - before[i, k]
    return changed[:m], delta


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
