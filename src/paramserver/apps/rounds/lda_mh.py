"""``paramserver lda --sampler mh``: a Metropolis–Hastings sampler whose cost a token does
not grow with the number of topics (LightLDA's cycle proposals), on the same word-by-word
segments and scheduled word blocks as SparseLDA's ``lda_sampler._sample``.

A token (d, w) of topic ``old`` targets the collapsed conditional, the token left out,
``π(k) ∝ (n_dk + α)(n_wk + β)/(n_k + Vβ)``.  Each of ``steps`` cycles proposes twice:

- from the word: ``q_w(k) ∝ n_wk/(n_k + Vβ) + β/(n_k + Vβ)`` as it was when the word's
  segment started.  Its first part is an alias table over the word's non-zero topics,
  built once a word (a scan of its row, O(K_w) to build); the second an alias table over
  all K built once a block.  Both go stale as the counts move: the acceptance
  ``min(1, π(t) q_w(s) / (π(s) q_w(t)))`` reads ``q_w`` as the tables were drawn from, so
  the chain stays exact;
- from the document: ``q_d(k) ∝ n_dk + α``, drawn in O(1) by taking the topic of a random
  token of the document (an index of each document's tokens, ``zd``, kept beside ``z``),
  or with probability ``Kα/(n_d + Kα)`` a uniform topic; it is exact, so its acceptance is
  ``π(t)(n_ds + α) / (π(s)(n_dt + α))``.

Nothing is kept between rounds that ``z`` does not give back: the document index is
rebuilt from ``z`` (``MHIndex``) when a worker takes its parts, after a death or from a
checkpoint, and the tables are built afresh for each block.  The documents' topic lists,
which only SparseLDA reads, are not kept while MH samples; ``MHIndex.lists`` rebuilds them
from ``n_dk`` before a checkpoint saves them.
"""

from __future__ import annotations

import numpy as np
from numba import njit


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


_GOLD, _M1, _M2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S11, _S27, _S30, _S31 = np.uint64(11), np.uint64(27), np.uint64(30), np.uint64(31)


@njit(nogil=True, cache=True)
def _uniform(x):  # type: ignore[no-untyped-def]
    """SplitMix64: the state after ``x`` and a uniform in [0, 1) from it (np.random's Mersenne
    Twister took 8-12 ns a draw in numba, this 1.6: the draws were most of a step)."""
    x += _GOLD
    return x, (_mix(x) >> _S11) * (1.0 / 9007199254740992.0)


@njit(nogil=True, cache=True)
def _mix(x):  # type: ignore[no-untyped-def]
    r = (x ^ (x >> _S30)) * _M1
    r = (r ^ (r >> _S27)) * _M2
    return r ^ (r >> _S31)


@njit(nogil=True, cache=True)
def _segment(x, lo, hi, nw, tdoc, z, nk, ndk, dptr, zd, tpos, alpha, beta, vbeta, steps, Q, S, wtab, stab, qsum,  # type: ignore[no-untyped-def]
             ssum, m):
    """Tokens ``[lo, hi)`` of one word (counts ``nw``): ``steps`` cycles of a word then a
    document proposal each, accepted against π; the generator's state after.  One function,
    no calls that take arrays: a call a token cost its arrays' reference counts (2.5x)."""
    K = nk.shape[0]
    (wtop, wprob, walt), (stop, sprob, salt) = wtab, stab
    wscale, sscale, kalpha = m / qsum if m else 0.0, K / ssum, K * alpha
    for t in range(lo, hi):
        d, old = tdoc[t], z[t]
        dlo = dptr[d]
        nd = dptr[d + 1] - dlo
        # π(k) = D_k·W_k, the token left out: D_k = n_dk + α, W_k = (n_wk + β)/(n_k + Vβ)
        s, ds = old, ndk[d, old] - 1 + alpha
        ws = (nw[old] - 1 + beta) / (nk[old] - 1 + vbeta)
        cold = ds / (ds + 1)  # π/q_d at the old topic is W·cold, elsewhere W: no n_dk read for a doc proposal
        for _ in range(steps):
            x, u = _uniform(x)  # the word's proposal: its topics (alias), or the smoothing's
            u *= qsum + ssum
            y = u * wscale if u < qsum else (u - qsum) * sscale
            j = min(int(y), (m if u < qsum else K) - 1)
            if u < qsum:
                k = wtop[j] if y - j < wprob[j] else walt[j]
            else:
                k = stop[j] if y - j < sprob[j] else salt[j]
            if k != s:
                o = 1 if k == old else 0
                dk, wk = ndk[d, k] - o + alpha, (nw[k] - o + beta) / (nk[k] - o + vbeta)
                x, u = _uniform(x)
                if u * ds * ws * (Q[k] + S[k]) < dk * wk * (Q[s] + S[s]):
                    s, ds, ws = k, dk, wk
            x, u = _uniform(x)  # the document's: a random token's topic, or any
            u *= nd + kalpha
            k = zd[dlo + int(u)] if u < nd else min(int((u - nd) / alpha), K - 1)
            if k != s:
                o = 1 if k == old else 0
                wk = (nw[k] - o + beta) / (nk[k] - o + vbeta)
                x, u = _uniform(x)
                if u * ws * (cold if s == old else 1.0) < wk * (cold if o else 1.0):
                    s, ds, ws = k, ndk[d, k] - o + alpha, wk
        if s != old:
            nw[old] -= 1
            nk[old] -= 1
            ndk[d, old] -= 1
            nw[s] += 1
            nk[s] += 1
            ndk[d, s] += 1
            z[t] = s
            zd[tpos[t]] = s
    return x


@njit(nogil=True, cache=True)
def _mh_sample(seg_row, seg_ptr, s_lo, s_hi, tdoc, z, nwk, nk, ndk, dptr, zd, tpos, alpha, beta, vbeta, steps,  # type: ignore[no-untyped-def]
               seed, Q, S, wq, wtab, stab, small, large):
    """MH-sample the tokens of segments ``[s_lo, s_hi)`` (one word each, its counts row
    ``seg_row[s]`` of ``nwk``) in place: ``z``, ``zd``, ``nwk``, ``nk`` and ``ndk``; the
    draws are ``seed``'s.  ``Q`` must be all zero on entry (it is on return)."""
    K = nk.shape[0]
    x = _mix(np.uint64(seed))  # seeds 1, 2, 3 start far apart
    ssum = 0.0
    for k in range(K):  # the smoothing part of every word's proposal, a table for the block
        S[k] = beta / (nk[k] + vbeta)
        ssum += S[k]
    _alias(S, stab[0], K, ssum, stab[1], stab[2], small, large)
    wtop = wtab[0]
    for s in range(s_lo, s_hi):
        nw = nwk[seg_row[s]]
        m, qsum = 0, 0.0
        for k in range(K):  # the word's part: its non-zero topics, a table for its segment
            if nw[k] > 0:  # (< 0 only from counts a round stale: --schedule none with --staleness)
                q = nw[k] / (nk[k] + vbeta)
                Q[k], wtop[m], wq[m] = q, k, q
                qsum += q
                m += 1
        if m:
            _alias(wq, wtop, m, qsum, wtab[1], wtab[2], small, large)
        x = _segment(x, seg_ptr[s], seg_ptr[s + 1], nw, tdoc, z, nk, ndk, dptr, zd, tpos, alpha, beta, vbeta, steps,
                     Q, S, wtab, stab, qsum, ssum, m)
        for j in range(m):
            Q[wtop[j]] = 0.0


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
    """The documents' non-zero topic lists (SparseLDA's) from ``n_dk``, in topic order."""
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
        self.Q, self.S, self.wq = np.zeros(K), np.zeros(K), np.zeros(K)
        # the alias tables (topics, thresholds, alternatives): the word's, the smoothing's
        self.wtab = (np.zeros(K, np.int32), np.zeros(K), np.zeros(K, np.int32))
        self.stab = (np.arange(K, dtype=np.int32), np.zeros(K), np.zeros(K, np.int32))
        self.small, self.large = np.zeros(K, np.int32), np.zeros(K, np.int32)

    def sample(self, seg_row: np.ndarray, seg_ptr: np.ndarray, lo: int, hi: int, docs: np.ndarray, z: np.ndarray,
               nwk: np.ndarray, nk: np.ndarray, ndk: np.ndarray, alpha: float, beta: float, vbeta: float,
               seed: int) -> None:
        """Segments ``[lo, hi)`` sampled in place (``_mh_sample``), the draws ``seed``'s."""
        _mh_sample(seg_row, seg_ptr, lo, hi, docs, z, nwk, nk, ndk, self.dptr, self.zd, self.tpos, alpha, beta,
                   vbeta, self.steps, seed, self.Q, self.S, self.wq, self.wtab, self.stab, self.small, self.large)

    @staticmethod
    def lists(ndk: np.ndarray, dtop: np.ndarray, doff: np.ndarray, dcnt: np.ndarray) -> None:
        """SparseLDA's topic lists of the documents, rebuilt from ``n_dk`` (MH does not keep them)."""
        _lists_from_counts(ndk, dtop, doff, dcnt)
