"""The model ``paramserver lda`` trains, shared by the driver (``lda``) and a worker's program
(``lda_program``): its two tables, its settings (``LDAConfig``, from ``settings``) and the collapsed Gibbs
sampler's numba kernels (SparseLDA's split, taken word by word: see ``lda``'s docstring).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit
from numba.cpython.unsafe.numbers import trailing_zeros

from paramserver._runtime.intrinsics import prefetch_row, uncounted
from paramserver.apps.rounds.lda_counts import TOP, big_count, big_down, big_up
from paramserver.apps.rounds.settings import LDAConfig as LDAConfig  # its old home
from paramserver.filters.packed import PackedRows

WORD_TOPIC, TOPIC_DELTA = "lda/word_topic", "lda/topic_delta"
#: each worker's two sums of Minka's fixed point for α (``alpha_sums``), as the round slots of
#: ``TOPIC_DELTA``: a row of [Σ num in two float32 halves, Σ den in two, the round]
ALPHA_SUMS = "lda/alpha_sums"
ALPHA_MIN, ALPHA_MAX = 1e-4, 1e3  # where a learnt α stops: a corpus of one-topic documents drives it to 0
MAX_COUNT = 1 << 24  # a word–topic count is a float32 on the servers: exact below this
#: the token whose document's counts and topic list are fetched ahead while one is sampled: a
#: word's tokens visit its documents in order but far apart, so each token's document state was
#: a miss to L3 (20 Newsgroups, K = 50, one thread: 14.1 M token-iterations/s without, 15.8 with)
DOC_AHEAD = 8
#: a document's counts span this many bytes or more (K ≥ 384 at 16 bits): the sampler fetches every
#: line of them ahead, not the first alone.  The tokens' documents then hold tens of topics spread
#: over the row, and the rows outgrow the caches (20 Newsgroups, one thread, with the span walk:
#: K = 500 6.4 -> 8.9 M token-iterations/s, K = 1 000 3.0 -> 6.2); at K = 200 (rows of 400 bytes,
#: in the cache) it cost 7 %
ROW_SWEEP_BYTES = 768


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


@uncounted
def doc_left(ndk, big, dtop, dcnt, d, base, old, K):  # type: ignore[no-untyped-def]
    """A token of document ``d`` leaves topic ``old``: ``n_dk`` (a count past a byte, in the table
    of ``lda_counts``, stays above 0) and the document's topic list (a topic left at 0 drops out)."""
    c = ndk[d, old]
    if big is not None and c == TOP:
        big_down(ndk, big, d, old, K)
    else:
        ndk[d, old] = c - 1
        if c == 1:
            _drop_topic(dtop, base, dcnt[d], old)
            dcnt[d] -= 1


@uncounted
def doc_joined(ndk, big, dtop, dcnt, d, base, new, K):  # type: ignore[no-untyped-def]
    """A token of document ``d`` joins topic ``new``: ``n_dk`` (its byte, or the table at its
    top) and the document's topic list (a topic new to it goes at the end)."""
    c = ndk[d, new]
    if big is not None and c >= TOP - 1:
        big_up(ndk, big, d, new, K)
    else:
        ndk[d, new] = c + 1
        if c == 0:
            dtop[base + dcnt[d]] = new
            dcnt[d] += 1


@njit(inline="always", nogil=True, cache=True)
def _drop_topic(dtop, base, n, old):  # type: ignore[no-untyped-def]
    """Take topic ``old`` out of the document's list ``dtop[base:base + n]`` (the last takes its place)."""
    for j in range(n):
        if dtop[base + j] == old:
            dtop[base + j] = dtop[base + n - 1]
            break


def _span_shift(K: int) -> int:
    """log2 of the topics a span of the smoothing bucket's index holds: 64, or about √K past
    4 096 topics, so that a draw walks about √K spans and topics, never K."""
    shift = 6
    while (1 << (2 * shift)) < K:
        shift += 1
    return shift


@njit(inline="always", nogil=True, cache=True)
def _smoothing_draw(u, Y, bsum, shift, alpha):  # type: ignore[no-untyped-def]
    """The topic of the smoothing bucket (weights α·Y_k) at ``u``: the span whose running sum
    passes ``u``, then the topic inside it.  A draw falls here often at large K (a third of
    the tokens at K = 1 000 on 20 Newsgroups), and a walk over every topic took 500 steps;
    over the spans' sums it takes about 8 + 32 (``_gibbs`` walks K ≤ 64 topics inline)."""
    K = Y.shape[0]
    acc, lo = 0.0, -1
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


def _sample(seg_row: np.ndarray, seg_ptr: np.ndarray, s_lo: int, s_hi: int, tdoc: np.ndarray, z: np.ndarray,
            nwk: np.ndarray, nk: np.ndarray, ndk: np.ndarray, dtop: np.ndarray, doff: np.ndarray, dcnt: np.ndarray,
            alpha: float, beta: float, vbeta: float, Y: np.ndarray, cum: np.ndarray, seed: int,
            big: np.ndarray | None = None) -> None:
    """Gibbs-sample the tokens of segments ``[s_lo, s_hi)`` (one word each; the word's
    counts are row ``seg_row[s]`` of ``nwk``) in place: ``z``, ``nwk``, ``nk``, ``ndk``
    and the documents' non-zero topic lists ``dtop[doff[d]:doff[d] + dcnt[d]]``; the draws
    come from SplitMix64 seeded with ``seed``; ``big``: the counts past a byte where ``ndk``
    holds a byte a count (``lda_counts.DocTopics``).  Past 64 topics the smoothing bucket is walked
    span by span (``_smoothing_draw``), and from ``ROW_SWEEP_BYTES`` a document's counts are
    fetched whole; below, neither is kept (``_gibbs``)."""
    K = nk.shape[0]
    shift = _span_shift(K)
    bsum = np.zeros(((K - 1) >> shift) + 1) if K > 64 else None  # Σ Y over each span of 2^shift topics
    step = 64 // ndk.itemsize if K * ndk.itemsize >= ROW_SWEEP_BYTES else 0  # a row's lines: all fetched, or the first
    _gibbs(seg_row, seg_ptr, s_lo, s_hi, tdoc, z, nwk, nk, ndk, ndk.reshape(-1), dtop, doff, dcnt, alpha, beta, vbeta,
           Y, cum, seed, bsum, shift, step, big)


@njit(nogil=True, cache=True)
def _gibbs(seg_row, seg_ptr, s_lo, s_hi, tdoc, z, nwk, nk, ndk, flat, dtop, doff, dcnt, alpha, beta, vbeta, Y, cum,  # type: ignore[no-untyped-def]  # noqa: C901
           seed, bsum, shift, step, big):
    """``_sample``'s kernel (one numba kernel: a helper that takes arrays, called a token, cost
    K = 50 a third of its speed in their reference counts, so the token's loop calls only
    helpers compiled without them: ``doc_left`` and ``doc_joined``, shared with ``lda_words``;
    one called a word cost 2-3 %).  It is compiled twice: with ``bsum`` an
    array (K > 64) it keeps the smoothing bucket's span sums and, with ``step``, fetches every
    line of a document's row; with ``bsum`` None (K ≤ 64), numba prunes both, tests and all,
    and walks the smoothing bucket inline (its helper cost 1 %).  The token's arrays are read at
    unsigned indices (``np.uint64``), which numba need not check for wrapping as it does a
    signed one it cannot prove non-negative (one thread, the two in turn from one state: 20
    Newsgroups K = 50 62.4 -> 52.2 ns a token, K = 200 136.7 -> 115.9, NYT K = 50 53.2 -> 50.5;
    the same draws)."""
    K = nk.shape[0]
    x = _mix(np.uint64(seed))
    last = seg_ptr[s_hi]  # the block's tokens end here: nothing past it is fetched
    for s in range(s_lo, s_hi):
        nw = nwk[seg_row[s]]
        wsum = 0.0
        for k in range(K):
            Y[k] = (nw[k] + beta) / (nk[k] + vbeta)
            wsum += Y[k]
        if bsum is not None:
            bsum[:] = 0.0
            for k in range(K):
                bsum[k >> shift] += Y[k]
        wsum *= alpha
        for t in range(seg_ptr[s], seg_ptr[s + 1]):
            if t + DOC_AHEAD < last:  # the document state of a token further on: fetched meanwhile
                ahead = tdoc[t + DOC_AHEAD]
                prefetch_row(ndk, ahead)  # type: ignore[call-arg]
                prefetch_row(dtop, doff[ahead])
                if bsum is not None:  # K > 64
                    if step:  # its every line (ROW_SWEEP_BYTES)
                        for off in range(step, K, step):
                            prefetch_row(flat, ahead * K + off)
                        for off in range(step, dcnt[ahead], step):
                            prefetch_row(dtop, doff[ahead] + off)
            ut = np.uint64(t)
            d, old = tdoc[ut], z[ut]
            ud, uold = np.uint64(d), np.uint64(old)
            base = doff[ud]
            ub = np.uint64(base)
            nw[uold] -= 1
            nk[uold] -= 1
            doc_left(ndk, big, dtop, dcnt, d, base, old, K)
            y = (nw[uold] + beta) / (nk[uold] + vbeta)
            wsum += alpha * (y - Y[uold])
            if bsum is not None:
                bsum[old >> shift] += y - Y[uold]
            Y[uold] = y
            dsum = 0.0
            n = dcnt[ud]
            for j in range(n):
                k = dtop[ub + np.uint64(j)]
                uk = np.uint64(k)
                c = ndk[ud, uk]
                if big is not None and c == TOP:
                    c = big_count(big, d, k, K)
                dsum += c * Y[uk]
                cum[j] = dsum
            x, r = _uniform(x)
            u = r * (dsum + wsum)
            new = -1
            if u < dsum:
                for j in range(n):
                    if u < cum[j]:
                        new = dtop[ub + np.uint64(j)]
                        break
            if new < 0:  # the smoothing bucket: α·Y_k
                if bsum is not None:
                    new = _smoothing_draw(u - dsum, Y, bsum, shift, alpha)
                else:
                    u -= dsum
                    acc = 0.0
                    new = K - 1
                    for k in range(K):
                        acc += alpha * Y[k]
                        if u < acc:
                            new = k
                            break
            unew = np.uint64(new)
            nw[unew] += 1
            nk[unew] += 1
            doc_joined(ndk, big, dtop, dcnt, d, base, new, K)
            y = (nw[unew] + beta) / (nk[unew] + vbeta)
            wsum += alpha * (y - Y[unew])
            if bsum is not None:
                bsum[new >> shift] += y - Y[unew]
            Y[unew] = y
            z[ut] = new


@njit(nogil=True, cache=True)
def block_changes(counts, rows):  # type: ignore[no-untyped-def]
    """The rows of a block that changed (their indices) and by how much (float32: what ``add``
    pushes): ``counts`` as the sampler left them against the ``rows`` pulled (int32 both), in
    one pass.  A row's words are compared all (their differences or-ed: no branch a word, so the
    loop vectorises), not up to the first that differs, and its change is written as it is
    compared, over the last unchanged row's (the next row takes the place of one that did not
    change): numpy's ``(counts != before).any(1)`` and two fancy indexings made temporaries of
    the whole block (6 MB at K = 1 000), and a compare pass then a pass over the changed rows
    read them twice (1 536 rows of 1 000, 90 % changed: 0.41-0.47 ms against 0.24 one pass)."""
    n, K = counts.shape
    changed = np.empty(n, np.int64)
    delta = np.empty((n, K), np.float32)
    m = 0
    for i in range(n):
        differ = 0
        for k in range(K):
            differ |= counts[i, k] ^ rows[i, k]
            delta[m, k] = np.float32(counts[i, k] - rows[i, k])
        changed[m] = i
        m += differ != 0
    return changed[:m], delta[:m]


def packed_changes(counts: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, PackedRows]:
    """``block_changes`` as ``sparse`` packs a push (``filters/packed.py``): the rows that
    changed, and their changes as ``PackedRows``, made in the same pass over the two blocks.
    No dense array of the changes is written, checked, grouped and read again on its way out:
    the server gets the same bytes (``client.admin.takes_packed``)."""
    n, K = counts.shape
    counts, rows = np.ascontiguousarray(counts), np.ascontiguousarray(rows)
    fast = not K & 7 and counts.ctypes.data % 8 == 0 and rows.ctypes.data % 8 == 0
    wide = (counts.reshape(-1).view(np.uint64), rows.reshape(-1).view(np.uint64)) if fast else (_NO_WORDS, _NO_WORDS)
    changed, mask, words, starts, m = _packed_changes(counts, rows, *wide)
    return changed[:m], PackedRows(int(m), K, mask[:(m * K + 7) >> 3], words.view(np.uint32), starts[:m + 1],
                                   known=True)


_NO_WORDS = np.zeros(0, np.uint64)


@njit(nogil=True, cache=True)
def _packed_changes(counts, rows, c64, r64):  # type: ignore[no-untyped-def]
    """``packed_changes``' pass, eight values at a time: compared as four 64-bit words (``c64``,
    ``r64``: the blocks' views, where a row is whole words; else value by value), and where
    any differs, the eight written as ``sparse_encode`` writes them, their byte of the mask at
    once.  A row that changed nowhere leaves nothing, and the next row takes its place."""
    n, K = counts.shape
    changed = np.empty(n, np.int64)
    mask = np.zeros((n * K + 7) >> 3, np.uint8)
    scratch = np.empty(n * K, np.float32)
    starts = np.zeros(n + 1, np.int64)
    m, w = 0, 0
    whole = K & ~7 if c64.shape[0] else 0
    one = np.uint64(1)
    for i in range(n):
        first, base = w, m * K
        for k0 in range(0, whole, 8):
            g = np.uint64((i * K + k0) >> 1)  # unsigned: numba checks a signed index for wrapping (4x the pass)
            x0, x1, x2, x3 = c64[g] ^ r64[g], c64[g + one] ^ r64[g + one], c64[g + 2 * one] ^ r64[g + 2 * one], \
                c64[g + 3 * one] ^ r64[g + 3 * one]
            if x0 | x1 | x2 | x3 == 0:
                continue
            byte = _differ(x0) | _differ(x1) << 2 | _differ(x2) << 4 | _differ(x3) << 6
            left = np.uint64(byte)
            while left:  # the values that differ (one or two of eight, mostly), in order
                at = np.uint64(k0) + trailing_zeros(left)  # type: ignore[call-arg]
                scratch[w] = np.float32(counts[i, at] - rows[i, at])
                w += 1
                left = np.uint64(left & (left - one))
            _mark(mask, base + k0, byte)
        for k in range(whole, K):
            d = counts[i, k] - rows[i, k]
            scratch[w] = np.float32(d)
            _mark(mask, base + k, int(d != 0))
            w += d != 0
        if w > first:
            changed[m] = i
            m += 1
            starts[m] = w
    return changed, mask, scratch[:w].copy(), starts, m


@njit(inline="always", nogil=True, cache=True)
def _differ(x):  # type: ignore[no-untyped-def]
    """Which of the two 32-bit values a 64-bit xor holds are not zero: bits 0 and 1."""
    return int((x & np.uint64(0xFFFFFFFF)) != 0) | int((x >> np.uint64(32)) != 0) << 1


@njit(inline="always", nogil=True, cache=True)
def _mark(mask, bit, byte):  # type: ignore[no-untyped-def]
    """Or the bits of ``byte`` into ``mask`` from bit ``bit`` on (over two bytes where it
    does not start one)."""
    o = bit & 7
    mask[bit >> 3] |= np.uint8((byte << o) & 0xFF)
    if o and byte >> (8 - o):
        mask[(bit >> 3) + 1] |= np.uint8(byte >> (8 - o))


@njit(nogil=True, cache=True)
def _doc_lists(tdoc, z, ndk, dtop, doff, dcnt, big=None):  # type: ignore[no-untyped-def]
    """``ndk`` (with ``big``: a byte a count, ``lda_counts``) and the non-zero topic lists
    from the tokens' topics (all zero on entry)."""
    K = ndk.shape[1]
    for t in range(z.shape[0]):
        d, k = tdoc[t], z[t]
        c = ndk[d, k]
        if big is not None and c >= TOP - 1:
            big_up(ndk, big, d, k, K)
            continue
        ndk[d, k] = c + 1
        if c == 0:
            dtop[doff[d] + dcnt[d]] = k
            dcnt[d] += 1


@njit(nogil=True, cache=True)
def alpha_sums(ndk, dlen, alpha, big=None):  # type: ignore[no-untyped-def]
    """A worker's share of one step of Minka's fixed point for a symmetric α (T. Minka,
    "Estimating a Dirichlet distribution", 2000): ``(Σ_d Σ_k [ψ(n_dk + α) − ψ(α)],
    Σ_d [ψ(n_d + Kα) − ψ(Kα)])`` over its documents; the step is α · Σ num / (K · Σ den)
    over every worker's.  ψ(c + a) − ψ(a) = Σ_{j<c} 1/(a + j), tabulated up to the longest
    document, so a count costs a lookup: one pass over ``ndk`` (``big``: as ``_doc_lists``)."""
    D, K = ndk.shape
    longest = 0
    for d in range(D):
        longest = max(longest, dlen[d])
    up, total = np.zeros(longest + 1), np.zeros(longest + 1)
    ka = K * alpha
    for c in range(1, longest + 1):
        up[c] = up[c - 1] + 1.0 / (alpha + c - 1)
        total[c] = total[c - 1] + 1.0 / (ka + c - 1)
    num = den = 0.0
    for d in range(D):
        row = 0.0
        for k in range(K):
            c = ndk[d, k]
            if big is not None and c == TOP:
                c = big_count(big, d, k, K)
            row += up[c]  # up[0] = 0: a topic the document does not hold adds nothing
        num += row
        den += total[dlen[d]]
    return num, den


def alpha_step(alpha: float, topics: int, num: float, den: float) -> float:
    """α after one fixed-point step from every worker's ``alpha_sums`` (unchanged where the
    documents hold no token), within [``ALPHA_MIN``, ``ALPHA_MAX``]."""
    if not den > 0 or not num > 0:
        return alpha
    return min(max(alpha * num / (topics * den), ALPHA_MIN), ALPHA_MAX)


@njit(nogil=True, cache=True)
def _doc_loglik(ndk, dlen, alpha, big=None):  # type: ignore[no-untyped-def]
    """Σ_d [Σ_k lgamma(n_dk + α) − lgamma(n_d + Kα)] + D·[lgamma(Kα) − K·lgamma(α)]."""
    K = ndk.shape[1]
    total = 0.0
    for d in range(ndk.shape[0]):
        for k in range(K):
            c = ndk[d, k]
            if big is not None and c == TOP:
                c = big_count(big, d, k, K)
            if c:
                total += math.lgamma(c + alpha) - math.lgamma(alpha)
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
