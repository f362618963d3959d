"""How ``paramserver mf`` deals its ratings (``mf``'s module doc says why): users and items
into ``W`` groups balanced by their number of ratings (``layout``: each one's group and row),
then the ratings, shuffled, into the ``W²`` strata of a user group and an item block
(``strata``), and each worker's share of them written for it to read alone (``save_strata``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit

from paramserver._runtime import intrinsics
from paramserver._runtime.threads import on_two
from paramserver.apps.rounds.program import balanced_groups

_prefetch: Any = intrinsics.prefetch_address  # (mypy reads an intrinsic's signature wrongly)

#: ratings ahead whose user and item rows are fetched into cache while this one is worked
PREFETCH_RATINGS = 8


@dataclass(frozen=True)
class Layout:
    """Where users and items are: dense index → (group, key), and each group's key range."""

    user_group: np.ndarray  # int64[n_users]
    user_key: np.ndarray  # int64[n_users]: the row in mf/users
    user_start: np.ndarray  # int64[W + 1]
    item_group: np.ndarray
    item_key: np.ndarray
    item_start: np.ndarray


def layout(user_counts: np.ndarray, item_counts: np.ndarray, parts: int) -> Layout:
    def keys(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        group = balanced_groups(counts, parts)
        order = np.argsort(group, kind="stable")
        key = np.empty(group.size, np.int64)
        key[order] = np.arange(group.size)
        start = np.zeros(parts + 1, np.int64)
        start[1:] = np.cumsum(np.bincount(group, minlength=parts))
        return group, key, start

    ug, uk, us = keys(user_counts)
    ig, ik, is_ = keys(item_counts)
    return Layout(ug, uk, us, ig, ik, is_)


@dataclass(frozen=True)
class Strata:
    """The ratings shuffled, then grouped by stratum (user group × item block), each as its
    row in its group and in its block; ``offsets``: where each of the ``parts**2`` strata starts."""

    users: np.ndarray  # int32
    items: np.ndarray  # int32
    ratings: np.ndarray  # float32
    offsets: np.ndarray  # int64[parts**2 + 1]
    parts: int


def drawn_order(n: int, seed: int) -> np.ndarray:
    """The order ``strata`` draws ``n`` ratings in (``seed``'s permutation; numpy lets go of the
    GIL while it shuffles, so a thread can draw it while the driver numbers the ids)."""
    return np.random.default_rng(seed).permutation(n)


def strata(u: np.ndarray, i: np.ndarray, r: np.ndarray, lay: Layout, parts: int, seed: int,
           perm: np.ndarray | None = None) -> Strata:
    """Each worker's ratings, shuffled (``seed``, or its order ``perm`` drawn already) then
    grouped by item block."""
    if perm is None:
        perm = drawn_order(r.size, seed)
    users, items, ratings, offsets = _strata(perm, u, i, r, lay.user_group, lay.item_group, lay.user_key,
                                             lay.item_key, lay.user_start, lay.item_start, parts)
    return Strata(users, items, ratings, offsets, parts)


def save_strata(folder: str, st: Strata) -> list[str]:
    """Worker q's strata as ``worker-q.npz``: ``users`` (row in its group), ``items`` (row
    in the block), ``ratings`` and ``start`` (W + 1 offsets, one stratum per item block)."""
    paths, parts, offsets = [], st.parts, st.offsets
    for q in range(parts):
        lo, hi = offsets[q * parts], offsets[(q + 1) * parts]
        path = os.path.join(folder, f"worker-{q}.npz")
        np.savez(path, users=st.users[lo:hi], items=st.items[lo:hi], ratings=st.ratings[lo:hi],
                 start=offsets[q * parts:(q + 1) * parts + 1] - lo)
        paths.append(path)
    return paths


def _strata(perm: np.ndarray, u: np.ndarray, i: np.ndarray, r: np.ndarray, user_group: np.ndarray,
            item_group: np.ndarray, user_key: np.ndarray, item_key: np.ndarray, user_start: np.ndarray,
            item_start: np.ndarray, parts: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The ratings in the order ``perm`` draws them, grouped by stratum (user group, then
    item block; a stable counting sort: in each stratum the drawn order), each as its
    row in its group and in its block; and where each stratum starts (``parts**2 + 1``
    offsets).  One pass to count, one to place (sorting the drawn ratings by stratum with
    numpy took 0.87 s for 3.6 M of them, in ten passes over random rows), each over the
    draw's two halves on two threads (0.22 s -> 0.12 s for 3.6 M on this VM's two cores): the
    first half's ratings of a stratum go before the second's, so the order is one thread's."""
    n = perm.shape[0]
    halves = ((0, n // 2), (n // 2, n)) if n >= PARALLEL_RATINGS else ((0, n),)
    drawn_users, drawn_items = np.empty(n, np.int32), np.empty(n, np.int32)
    drawn, stratum = np.empty(n, np.float32), np.empty(n, np.int32)
    counts = np.zeros((len(halves), parts * parts), np.int64)
    _on_halves(halves, lambda k, lo, hi: _draw(perm, lo, hi, u, i, r, user_group, item_group, user_key, item_key,
                                               user_start, item_start, parts, drawn_users, drawn_items, drawn,
                                               stratum, counts[k]))
    offsets = np.zeros(parts * parts + 1, np.int64)
    np.cumsum(counts.sum(axis=0), out=offsets[1:])
    fills = offsets[:-1] + np.cumsum(counts, axis=0) - counts  # each half's first place in each stratum
    users, items, ratings = np.empty(n, np.int32), np.empty(n, np.int32), np.empty(n, np.float32)
    _on_halves(halves, lambda k, lo, hi: _place(lo, hi, stratum, drawn_users, drawn_items, drawn, fills[k],
                                                users, items, ratings))
    return users, items, ratings, offsets


#: a draw of at least this many ratings is counted and placed on two threads
PARALLEL_RATINGS = 1 << 16


def _on_halves(halves: tuple[tuple[int, int], ...], work: Any) -> None:
    """``work(k, lo, hi)`` for each half, two halves at once (``on_two``: joined here, as the
    strata are drawn before the nodes are forked)."""
    if len(halves) == 1:
        work(0, *halves[0])
    else:
        on_two(lambda: work(0, *halves[0]), lambda: work(1, *halves[1]), "paramserver-mf-strata")


@njit(nogil=True, cache=True)
def _draw(perm, lo, hi, u, i, r, user_group, item_group, user_key, item_key, user_start,  # type: ignore[no-untyped-def]
          item_start, parts, drawn_users, drawn_items, drawn, stratum, counts):
    """Draws ``lo..hi-1``: each rating's user row, item row, value and stratum, in drawn order,
    each stratum's ratings counted in ``counts``: the only pass of random reads (fetched ahead)."""
    n = perm.shape[0]
    for t in range(lo, hi):
        if t + PREFETCH_RATINGS < n:
            ahead = perm[t + PREFETCH_RATINGS]
            _prefetch(u.ctypes.data + ahead * u.strides[0])
            _prefetch(i.ctypes.data + ahead * i.strides[0])
            _prefetch(r.ctypes.data + ahead * r.strides[0])
        j = perm[t]
        a, b = u[j], i[j]
        g, h = user_group[a], item_group[b]
        drawn_users[t] = user_key[a] - user_start[g]
        drawn_items[t] = item_key[b] - item_start[h]
        drawn[t] = r[j]
        stratum[t] = g * parts + h
        counts[g * parts + h] += 1


@njit(nogil=True, cache=True)
def _place(lo, hi, stratum, drawn_users, drawn_items, drawn, fill, users, items, ratings):  # type: ignore[no-untyped-def]
    """Draws ``lo..hi-1`` each to its stratum's next place (``fill``, moved on)."""
    for t in range(lo, hi):
        p = fill[stratum[t]]
        fill[stratum[t]] = p + 1
        users[p], items[p], ratings[p] = drawn_users[t], drawn_items[t], drawn[t]
