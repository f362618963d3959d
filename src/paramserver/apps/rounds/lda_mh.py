"""``paramserver lda --sampler mh``: a Metropolis–Hastings sampler whose cost a token does
not grow with the number of topics (LightLDA's cycle of word and document proposals, with
WarpLDA's word proposal), on the same word-by-word segments and scheduled word blocks as
SparseLDA's ``lda_sampler._sample``.

A token (d, w) of topic ``old`` targets the collapsed conditional, the token left out
(``⁻``), ``π(k) ∝ (n⁻_dk + α)(n⁻_wk + β)/(n⁻_k + Vβ)``.  Each of ``steps`` cycles proposes
twice, each proposal accepted with ``min(1, π(t) q(s) / (π(s) q(t)))``:

- from the word: ``q_w(k) ∝ n⁻_wk + β``, drawn in O(1) as a mixture of its three parts:
  the counts of the word's tokens in other workers' documents (fixed while the worker holds
  the word's row: an alias table over their non-zero topics, built once a word in O(K)),
  the topic of a random other token of the word here (the segment's ``z``, current), or a
  uniform topic.  Its acceptance is ``(n⁻_dt + α)(n⁻_s + Vβ) / ((n⁻_ds + α)(n⁻_t + Vβ))``;
- from the document: ``q_d(k) ∝ n⁻_dk + α``, the topic of a random other token of the
  document (``zd``, each document's tokens' topics in a row, kept beside ``z``) or a
  uniform topic; its acceptance ``W_t / W_s``, ``W_k = (n⁻_wk + β)/(n⁻_k + Vβ)``, reads no
  ``n_dk``.

Both proposals are functions of the other tokens' current topics only, never of the
token's own or of counts from before it moved: every step is an exact MH step for the
token's conditional, so the sweep keeps the posterior (a table built once a word from
counts the sampling moves, as LightLDA's, does not: ``tests/unit/test_lda_mh.py`` measured
it off by χ² = 157 on 15 degrees of freedom).  The conditional reads ``n_k`` as the worker
sees it, a round stale for other workers' changes, as SparseLDA's does.

Nothing is kept between rounds that ``z`` does not give back: the document index is
rebuilt from ``z`` (``MHIndex``) when a worker takes its parts, after a death or from a
checkpoint, and the word's table is built afresh at its segment.  The documents' topic
lists, which only SparseLDA reads, are not kept while MH samples; ``MHIndex.lists``
rebuilds them from ``n_dk`` before a checkpoint saves them.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from paramserver._runtime.intrinsics import prefetch_row
from paramserver.apps.rounds.lda_counts import TOP, big_count, big_down, big_up
from paramserver.apps.rounds.lda_sampler import _GOLD, DOC_AHEAD, _mix, _uniform

#: the stream of the document proposals' uniforms, apart from the generator's (``_doc_uniform``): a
#: token's are a function of the sweep's seed and the token's place alone, so the sampler can read them
#: ``DOC_AHEAD`` tokens early and fetch the topic each will read
DOC_STREAM = np.uint64(0xD1B54A32D192ED03)


@njit(inline="always", nogil=True, cache=True)
def _doc_uniform(xd, n):  # type: ignore[no-untyped-def]
    """Uniform ``n`` of the stream ``xd``: ``_uniform``'s from the state ``n`` steps on (SplitMix64
    is a counter: any draw of it at once)."""
    return _uniform(xd + n * _GOLD)[1]


@njit(inline="always", nogil=True, cache=True)
def _doc_pick(u, dlo, nd, own, kalpha, alpha, K):  # type: ignore[no-untyped-def]
    """The document proposal at uniform ``u``: another token's place in ``zd`` (>= 0), or ``-1 - k``
    for topic k drawn uniformly."""
    u *= nd + kalpha
    if u < nd:
        p = dlo + min(int(u), nd - 1)
        return p + 1 if p >= own else p
    return -1 - min(int((u - nd) / alpha), K - 1)


@njit(nogil=True, cache=True)
def _alias(weight, top, n, total, prob, alt, small, large):  # type: ignore[no-untyped-def]
    """Vose's alias table over slots ``[0, n)``, slot j standing for topic ``top[j]`` of
    weight ``weight[j]`` (``total`` their sum): a draw is slot j = ⌊x⌋ of x uniform in
    [0, n), then ``top[j]`` if x − j < ``prob[j]``, else ``alt[j]``."""
    scale = n / total
    ns = nl = 0
    for j in range(n):
        p = weight[j] * scale
        prob[j] = p
        alt[j] = top[j]
        if p < 1.0:
            small[ns] = j
            ns += 1
        else:
            large[nl] = j
            nl += 1
    while ns > 0 and nl > 0:
        ns -= 1
        j, g = small[ns], large[nl - 1]
        alt[j] = top[g]
        prob[g] += prob[j] - 1.0
        if prob[g] < 1.0:
            nl -= 1
            small[ns] = g
            ns += 1
    for i in range(nl):  # what rounding left over is full
        prob[large[i]] = 1.0
    for i in range(ns):
        prob[small[i]] = 1.0


@njit(nogil=True, cache=True)
def _segment(x, lo, hi, last, nw, ad, tdoc, z, nk, ndk, dptr, zd, tpos, alpha, beta, vbeta, steps, atab, asum, am,  # type: ignore[no-untyped-def]  # noqa: C901
             big, xd):
    """Tokens ``[lo, hi)`` of one word (counts ``nw``, of which ``ad`` in other workers'
    documents; ``atab`` their alias table over ``am`` topics): ``steps`` cycles of a word
    then a document proposal each; the generator's state after.  One function, no calls a
    token that take arrays: such calls cost their arrays' reference counts (2.5x slower).
    The document of the token ``DOC_AHEAD`` on (up to ``last``) is fetched meanwhile: every
    line of its ``n_dk`` row, which the proposals read at random topics, and the first of its
    tokens' topics (20 Newsgroups, one thread, mh2, the two interleaved: K = 1 000 7.0 ->
    10.7-11.2 M token-iterations/s, K = 50 15.6-15.8 -> 15.8-16.1, K = 200 15.7 -> 15.4; the
    same draws; every line of the tokens' topics too cost K = 50 15 %).  ``big``: the counts
    past a byte where ``ndk`` holds a byte a count (``lda_counts``), read and moved only at
    a byte's top.  The proposals read their arrays at unsigned indices (``np.uint64``): numba
    adds an array's length to a signed index it cannot prove non-negative, on every load of
    a proposal's chain (K = 1 000, one thread, the two in turn from one state: 20 Newsgroups
    70.1 -> 63.6 ns a token, NYT 70.1 -> 62.4; the same draws).  The document proposal's
    uniform comes from a stream of its own (``xd``, ``_doc_uniform``: uniform ``t·steps + i`` for
    the token at ``t``), so the token ``DOC_AHEAD`` on has its proposals' places fetched too: the
    read of another token's topic at a random place in its document (``zd``) was a quarter of
    the sampler's time in a 2-worker job at K = 1 000 (``perf``, one instruction), a miss
    wherever the document runs past its first line."""
    K = nk.shape[0]
    atop, aprob, aalt = atab
    here = hi - lo - 1  # the word's other tokens in this worker's documents
    ascale, zw, kalpha = am / asum if am else 0.0, asum + here + K * beta, K * alpha
    flat, rstep = ndk.reshape(-1), 64 // ndk.itemsize
    for t in range(lo, hi):
        if t + DOC_AHEAD < last:
            ahead = tdoc[np.uint64(t + DOC_AHEAD)]
            for off in range(0, K, rstep):
                prefetch_row(flat, ahead * K + off)  # type: ignore[call-arg]
            prefetch_row(zd, dptr[np.uint64(ahead)])  # type: ignore[call-arg]
            ua = np.uint64(t + DOC_AHEAD)
            alo = dptr[np.uint64(ahead)]
            anb = dptr[np.uint64(ahead) + np.uint64(1)] - alo - 1
            for i in range(steps):  # the places the token's document proposals will read
                p = _doc_pick(_doc_uniform(xd, ua * np.uint64(steps) + np.uint64(i)), alo, anb, tpos[ua], kalpha,
                              alpha, K)
                if p >= 0:
                    prefetch_row(zd, p)
        ut = np.uint64(t)
        d, old, own = tdoc[ut], z[ut], tpos[ut]
        ud, uold = np.uint64(d), np.uint64(old)
        dlo, nd = dptr[ud], dptr[ud + np.uint64(1)] - dptr[ud] - 1  # the document's other tokens
        # the state s: D_s = n⁻_ds + α, E_s = n⁻_s + Vβ, W_s = (n⁻_ws + β)/E_s, G_s = π_s/q_w(s)·(n⁻_ws + β + A⁻)
        c = ndk[ud, uold]
        if big is not None and c == TOP:
            c = big_count(big, d, old, K)
        s, ds, es = old, c - 1 + alpha, nk[uold] - 1 + vbeta
        ws = (nw[uold] - 1 + beta) / es
        qs = nw[uold] - 1 + beta - min(ad[uold], 0)  # q_w(s) × its normaliser (ad < 0: rows a round stale)
        for i in range(steps):
            x, u = _uniform(x)  # the word's proposal: other workers' tokens, this worker's, or any topic
            u *= zw
            if u < asum:
                y = u * ascale
                j = min(int(y), am - 1)
                uj = np.uint64(j)
                k = atop[uj] if y - j < aprob[uj] else aalt[uj]
            elif u < asum + here:
                p = lo + min(int(u - asum), here - 1)
                k = z[np.uint64(p + 1 if p >= t else p)]
            else:
                k = min(int((u - asum - here) / beta), K - 1)
            if k != s:
                o = 1 if k == old else 0
                uk = np.uint64(k)
                c = ndk[ud, uk]
                if big is not None and c == TOP:
                    c = big_count(big, d, k, K)
                dk, ek = c - o + alpha, nk[uk] - o + vbeta
                wk, qk = (nw[uk] - o + beta) / ek, nw[uk] - o + beta - min(ad[uk], 0)
                x, u = _uniform(x)
                if u * ds * ws * qk < dk * wk * qs:
                    s, ds, es, ws, qs = k, dk, ek, wk, qk
            # the document's: another token's topic, or any (its uniform from ``xd``, its place fetched ahead)
            p = _doc_pick(_doc_uniform(xd, ut * np.uint64(steps) + np.uint64(i)), dlo, nd, own, kalpha, alpha, K)
            k = zd[np.uint64(p)] if p >= 0 else -1 - p
            if k != s:
                o = 1 if k == old else 0
                uk = np.uint64(k)
                ek = nk[uk] - o + vbeta
                wk = (nw[uk] - o + beta) / ek
                x, u = _uniform(x)
                if u * ws < wk:
                    c = ndk[ud, uk]
                    if big is not None and c == TOP:
                        c = big_count(big, d, k, K)
                    s, ds, es, ws, qs = k, c - o + alpha, ek, wk, nw[uk] - o + beta - min(ad[uk], 0)
        if s != old:
            nw[old] -= 1
            nk[old] -= 1
            if big is not None and ndk[d, old] == TOP:
                big_down(ndk, big, d, old, K)
            else:
                ndk[d, old] -= 1
            nw[s] += 1
            nk[s] += 1
            if big is not None and ndk[d, s] >= TOP - 1:
                big_up(ndk, big, d, s, K)
            else:
                ndk[d, s] += 1
            z[t] = s
            zd[own] = s
    return x


@njit(nogil=True, cache=True)
def _mh_sample(seg_row, seg_ptr, s_lo, s_hi, tdoc, z, nwk, nk, ndk, dptr, zd, tpos, alpha, beta, vbeta, steps,  # type: ignore[no-untyped-def]
               seed, ad, aw, atab, small, large, big):
    """MH-sample the tokens of segments ``[s_lo, s_hi)`` (one word each, its counts row
    ``seg_row[s]`` of ``nwk``) in place: ``z``, ``zd``, ``nwk``, ``nk`` and ``ndk``; the
    draws are ``seed``'s.  ``ad`` must be all zero on entry (it is on return); ``big``: as ``_segment``'s."""
    K = nk.shape[0]
    x = _mix(np.uint64(seed))  # seeds 1, 2, 3 start far apart
    xd = _mix(x ^ DOC_STREAM)
    atop = atab[0]
    for s in range(s_lo, s_hi):
        nw = nwk[seg_row[s]]
        lo, hi = seg_ptr[s], seg_ptr[s + 1]
        for t in range(lo, hi):  # the word's counts in other workers' documents: its row less its tokens here
            ad[z[t]] -= 1
        am, asum = 0, 0.0
        for k in range(K):
            a = ad[k] + nw[k]
            ad[k] = a
            if a > 0:
                atop[am], aw[am] = k, a
                asum += a
                am += 1
        if am:
            _alias(aw, atop, am, asum, atab[1], atab[2], small, large)
        x = _segment(x, lo, hi, seg_ptr[s_hi], nw, ad, tdoc, z, nk, ndk, dptr, zd, tpos, alpha, beta, vbeta, steps,
                     atab, asum, am, big, xd)
        ad[:] = 0


@njit(nogil=True, cache=True)
def _doc_index(tdoc, z, dptr, zd, tpos):  # type: ignore[no-untyped-def]
    """Each token's place among its document's (``tpos``) and the topics in that order (``zd``)."""
    fill = dptr[:-1].copy()
    for t in range(z.shape[0]):
        d = tdoc[t]
        tpos[t] = fill[d]
        zd[fill[d]] = z[t]
        fill[d] += 1


@njit(nogil=True, cache=True)
def _lists_from_counts(ndk, dtop, doff, dcnt):  # type: ignore[no-untyped-def]
    """The documents' non-zero topic lists (SparseLDA's) from ``n_dk``, in topic order (a byte
    at ``lda_counts.TOP`` is a count, not zero: the list is the same)."""
    for d in range(ndk.shape[0]):
        n = 0
        for k in range(ndk.shape[1]):
            if ndk[d, k] != 0:
                dtop[doff[d] + n] = k
                n += 1
        dcnt[d] = n


class MHIndex:
    """What the MH sampler keeps beside a worker's tokens, all of it rebuilt from their
    topics: each document's tokens' topics in a row (``zd``, where ``dptr[d]`` starts
    document d's) and each token's place there (``tpos``); the tables' scratch space."""

    def __init__(self, docs: np.ndarray, z: np.ndarray, doc_len: np.ndarray, topics: int, steps: int):
        self.steps = steps
        self.dptr = np.zeros(doc_len.size + 1, np.int64)
        np.cumsum(doc_len, out=self.dptr[1:])
        self.zd = np.zeros(z.size, np.uint16 if topics <= 1 << 16 else np.int32)
        self.tpos = np.zeros(z.size, np.int32 if z.size < 1 << 31 else np.int64)
        _doc_index(docs, z, self.dptr, self.zd, self.tpos)
        K = topics
        self.ad, self.aw = np.zeros(K, np.int64), np.zeros(K)  # a word's counts in other workers' documents
        self.atab = (np.zeros(K, np.int32), np.zeros(K), np.zeros(K, np.int32))  # their alias table
        self.small, self.large = np.zeros(K, np.int32), np.zeros(K, np.int32)

    def sample(self, seg_row: np.ndarray, seg_ptr: np.ndarray, lo: int, hi: int, docs: np.ndarray, z: np.ndarray,
               nwk: np.ndarray, nk: np.ndarray, ndk: np.ndarray, alpha: float, beta: float, vbeta: float,
               seed: int, big: np.ndarray | None = None) -> None:
        """Segments ``[lo, hi)`` sampled in place (``_mh_sample``), the draws ``seed``'s; ``big``:
        the counts past a byte where ``ndk`` holds a byte a count (``lda_counts.DocTopics``)."""
        _mh_sample(seg_row, seg_ptr, lo, hi, docs, z, nwk, nk, ndk, self.dptr, self.zd, self.tpos, alpha, beta,
                   vbeta, self.steps, seed, self.ad, self.aw, self.atab, self.small, self.large, big)

    @staticmethod
    def lists(ndk: np.ndarray, dtop: np.ndarray, doff: np.ndarray, dcnt: np.ndarray) -> None:
        """SparseLDA's topic lists of the documents, rebuilt from ``n_dk`` (MH does not keep them)."""
        _lists_from_counts(ndk, dtop, doff, dcnt)
