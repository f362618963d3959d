"""A table's vnode arrays as views made from a directory of addresses, for the loops that
walk a request's vnodes in one compiled call.

A typed list of arrays costs a compiled call twice: unboxing it at the call (~1.5 µs a
list, three lists a call) and counting a reference at every item read (two atomic
operations a vnode a list, twice a call).  At a batch of 1 000 keys over 64 vnodes that
was half of the call (``bench/engine.py``).  The directory (``store/directory.py``) is one
``int64[vnodes, FIELDS]`` array: where each vnode's keys, rows, counts (``meta``) and life
rows start, how many slots and rows it has, the bytes from one slot to the next, its key
limit and (dense) its first position.  A loop makes views of a vnode's arrays from it
(``hash_arrays``, ``dense_arrays``, ``life_rows``) that own nothing: the directory's
keeper holds the arrays.

The views take their type, and every dimension and stride but the first, from the first
vnode's arrays (``keys0``, ``rows0``, ``meta0``, ``life0``): every vnode of a table has
rows of one width and storage, in slots of one size.
"""

from __future__ import annotations

from numba import njit

from paramserver._runtime.intrinsics import view_like

#: a vnode's entry: the addresses of its keys, rows, ``meta`` and life rows (0: none), its
#: key slots, its rows (a hash vnode has one more than slots, key 0's), the bytes from one
#: row to the next, the keys it may hold before it must grow, and a dense vnode's first
#: position
KEYS, ROWS, META, LIFE, SLOTS, N_ROWS, STRIDE, LIMIT, START = range(9)
FIELDS = 9


@njit(inline="always", nogil=True, cache=True)
def meta_of(d, t, meta0):
    return view_like(meta0, d[t, META], meta0.shape[0], meta0.strides[0])


@njit(inline="always", nogil=True, cache=True)
def hash_arrays(d, t, keys0, rows0, meta0):
    """Hash vnode ``t``'s keys, rows and ``meta``."""
    stride = d[t, STRIDE]
    return (view_like(keys0, d[t, KEYS], d[t, SLOTS], stride), view_like(rows0, d[t, ROWS], d[t, N_ROWS], stride),
            meta_of(d, t, meta0))


@njit(inline="always", nogil=True, cache=True)
def dense_arrays(d, t, rows0, meta0):
    """Dense vnode ``t``'s rows and ``meta``."""
    return view_like(rows0, d[t, ROWS], d[t, N_ROWS], d[t, STRIDE]), meta_of(d, t, meta0)


@njit(inline="always", nogil=True, cache=True)
def life_rows(d, t, life0):
    """Hash vnode ``t``'s life rows (``life.py``), one a row."""
    return view_like(life0, d[t, LIFE], d[t, N_ROWS], life0.strides[0])
