"""A worker's document–topic counts ``n_dk`` a byte each at many topics, the few that pass a
byte kept exactly beside them (``DocTopics``, ``doc_topic_counts``).

Both samplers read a random document's row a token (the tokens go word by word), and at many
topics the row outgrows the caches: every line of it is fetched ahead (``DOC_AHEAD``), so a
token costs its row's bytes of memory traffic.  At 16 bits a count a row of K = 1 000 is 32
lines; at 8 bits 16, and the MH kernel alone went from 10.1-10.6 to 14.7 M token-iterations/s
(20 Newsgroups' documents of fewer than 255 tokens, one thread, the two in turn).

A byte holds a count up to ``TOP - 1``; ``TOP`` says the count is ``TOP`` or more and lives in
``big``, an open-addressing table of ``(d * K + k, count)`` rows (linear probing, a count that
falls back below ``TOP`` leaves it by backward shifting).  A document holds at most its length
of tokens, so only documents of ``TOP`` tokens or more ever reach it, and the table never holds
more than a worker's tokens / ``TOP`` counts at once: sized for twice that, it never fills.
The counts are exact, so the samples are the ones 16-bit counts gave, to the bit.  Below
``BYTE_TOPICS`` a row is a few lines, read from the caches, and the counts stay 16-bit (the
kernels as before: at K = 50 and 200 a byte a count was level or 1-5 % slower).

The kernels read a count as ``ndk[d, k]`` and, only where that is ``TOP``, ``big_count``; they
add and take away one in the byte, and only at its edge (``TOP - 1`` going up, ``TOP`` going
down) call ``big_up`` / ``big_down``: the hot path is the byte's, with one compare more.
Kernels given ``big=None`` (16-bit or wider counts, whose documents never reach their type's
top: the tests' small corpora) compile the compare away.
"""

from __future__ import annotations

import numpy as np
from numba import njit

#: a byte of this value: the count is ``TOP`` or more, and in ``big``
TOP = 255
#: topics from which the counts are a byte each: where a 16-bit row spans 768 bytes, the rows
#: that outgrow the caches (``lda_sampler.ROW_SWEEP_BYTES``)
BYTE_TOPICS = 384
_EMPTY = -1
_FIB = np.uint64(0x9E3779B97F4A7C15)


@njit(inline="always", nogil=True, cache=True)
def _home(big, key):  # type: ignore[no-untyped-def]
    """Where ``key``'s probe starts in ``big`` (a power of two of rows): Fibonacci hashing."""
    return np.int64((np.uint64(key) * _FIB) >> np.uint64(32)) & (big.shape[0] - 1)


@njit(nogil=True, cache=True)
def _find(big, key):  # type: ignore[no-untyped-def]
    """The row of ``key`` in ``big``, or the empty row where it would go."""
    mask = big.shape[0] - 1
    s = _home(big, key)
    while big[s, 0] != _EMPTY and big[s, 0] != key:
        s = (s + 1) & mask
    return s


@njit(nogil=True, cache=True)
def big_count(big, d, k, K):  # type: ignore[no-untyped-def]
    """``n_dk`` of a count whose byte is ``TOP``."""
    return big[_find(big, d * K + k), 1]


@njit(nogil=True, cache=True)
def big_up(ndk, big, d, k, K):  # type: ignore[no-untyped-def]
    """``n_dk += 1`` where its byte is ``TOP - 1`` or ``TOP``."""
    s = _find(big, d * K + k)
    if ndk[d, k] == TOP - 1:
        ndk[d, k] = TOP
        big[s, 0], big[s, 1] = d * K + k, TOP
    else:
        big[s, 1] += 1


@njit(nogil=True, cache=True)
def big_down(ndk, big, d, k, K):  # type: ignore[no-untyped-def]
    """``n_dk -= 1`` where its byte is ``TOP``: back into the byte once below ``TOP``."""
    s = _find(big, d * K + k)
    c = big[s, 1] - 1
    if c >= TOP:
        big[s, 1] = c
        return
    ndk[d, k] = c
    mask = big.shape[0] - 1
    j, i = s, s  # backward shifting: a later row whose probe passes the hole moves into it
    big[j, 0] = _EMPTY
    while True:
        i = (i + 1) & mask
        if big[i, 0] == _EMPTY:
            return
        h = _home(big, big[i, 0])
        if (i - h) & mask >= (i - j) & mask:  # its home is at or before the hole (cyclically)
            big[j, 0], big[j, 1] = big[i, 0], big[i, 1]
            big[i, 0] = _EMPTY
            j = i


@njit(nogil=True, cache=True)
def dense_counts(ndk, big):  # type: ignore[no-untyped-def]
    """Every ``n_dk`` as an int32 matrix (the checks' and the tests' view)."""
    D, K = ndk.shape
    out = ndk.astype(np.int32)
    if big is not None:
        for s in range(big.shape[0]):
            if big[s, 0] != _EMPTY:
                out[big[s, 0] // K, big[s, 0] % K] = big[s, 1]
    return out


def doc_topic_counts(docs: int, topics: int, tokens: int, longest: int) -> tuple[np.ndarray, np.ndarray | None]:
    """``(ndk, big)`` for ``docs`` documents of at most ``longest`` of the ``tokens`` tokens: a
    byte a count and its table from ``BYTE_TOPICS`` topics (``DocTopics``), else 16-bit counts
    where every document is shorter than 2^16 - 1 tokens, 32-bit where not, and no table."""
    if topics >= BYTE_TOPICS:
        counts = DocTopics(docs, topics, tokens)
        return counts.rows, counts.big
    return np.zeros((docs, topics), np.uint16 if longest < (1 << 16) - 1 else np.int32), None


class DocTopics:
    """A worker's ``n_dk`` (``rows``, a byte a count) and its overflow table (``big``) for
    ``docs`` documents and ``topics`` topics, sized for ``tokens`` tokens."""

    def __init__(self, docs: int, topics: int, tokens: int):
        self.rows = np.zeros((docs, topics), np.uint8)
        cap = 16
        while cap < 2 * (tokens // TOP) + 16:
            cap *= 2
        self.big = np.full((cap, 2), _EMPTY, np.int64)
        self.big[:, 1] = 0

    def dense(self) -> np.ndarray:
        """``n_dk`` as int32 (``dense_counts``)."""
        dense: np.ndarray = dense_counts(self.rows, self.big)
        return dense
