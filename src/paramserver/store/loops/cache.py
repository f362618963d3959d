"""A worker's row cache in compiled loops (``store/rowcache.py`` holds its arrays).

A set-associative table of ``WAYS`` slots a set.  ``keys`` holds the slots' keys, a
set's ways side by side (32 bytes: half a cache line), ``EMPTY`` where a way is free (a
key equal to ``EMPTY`` is never cached); ``rec`` holds one record a slot, in as few cache
lines as its row allows (32 bytes for a dim-1 row): the server's version when the row
was fetched (``STAMP``), the version when the slot's sum took its first gradient
(``BORN``), the pushes gathered and the server (``PACKED``), then, as float32 columns
(``recf``, a view of the same memory), the row and the sum of the gradients not pushed.
A key found costs two lines (and the byte of its uses), fetched keys ahead.

Admission is TinyLFU's: a key that misses is counted in a sketch of 4-bit counters (two
a key, in one 64-byte block, the smaller read), a key found counts its uses (``freq``, a
byte a slot beside the keys), and both are halved every ``AGE_EVERY`` slots' worth of
fills.  A key that misses takes a free way of its set, or the way used least if the
sketch counts the new key more: a one-off key of a click log's long tail never replaces
a key read twice.  The read itself hashes a key once and touches no sketch.

A slot's sum goes out once ``s`` pushes gathered, or once it is ``s`` versions old: the
slots that start a sum are queued (``pend``) in the order they did, and each push takes
from the queue's head those now due.  ``est[server]`` is the version the worker expects
of each server (``client/row_cache.py``): a row is read while ``est - stamp <= s``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from paramserver._runtime.intrinsics import prefetch_row
from paramserver.routing.hashing import hash64
from paramserver.tables.push_ops import merge_row
from paramserver.tables.update_rules import update_row

WAYS = 4
EMPTY = np.uint64(0xFFFFFFFFFFFFFFFF)
#: a record's words: the stamp, the born version, uses | server << 32; then float32 columns
STAMP, BORN, PACKED, HEAD_WORDS = 0, 1, 2, 3
FLOATS = 2 * HEAD_WORDS  # the first float32 column of the row
#: the sketch and the uses counted are halved after this many fills a slot (TinyLFU's reset)
AGE_EVERY = 8
#: meta's cells: fills since the sketch was halved; the pending queue's head and tail
META_READS, META_HEAD, META_TAIL = 0, 1, 2
#: keys between the one prefetched and the one worked (a read: between each of its stages)
AHEAD = 8
HALF = 6
_LOW = np.uint64(0xFFFFFFFF)


@njit(inline="always", nogil=True, cache=True)
def set_of(h, keys):
    return np.int64(h & np.uint64(keys.shape[0] // WAYS - 1)) * WAYS


@njit(inline="always", nogil=True, cache=True)
def _cells(h, sketch):
    """Two 4-bit counters of one 64-byte block (128 counters)."""
    block = np.int64((h >> np.uint64(20)) & np.uint64(sketch.shape[0] // 64 - 1)) * 128
    low = np.uint64(127)
    return block + np.int64((h >> np.uint64(44)) & low), block + np.int64((h >> np.uint64(51)) & low)


@njit(inline="always", nogil=True, cache=True)
def _count(sketch, cell):
    byte = sketch[cell >> 1]
    return (byte >> 4) if cell & 1 else (byte & 15)


@njit(inline="always", nogil=True, cache=True)
def _bump(sketch, cell):
    if _count(sketch, cell) < 15:
        sketch[cell >> 1] += np.uint8(16 if cell & 1 else 1)


@njit(nogil=True, cache=True)
def _age(sketch, freq):
    for i in range(sketch.shape[0]):
        b = sketch[i]
        sketch[i] = ((b >> 5) << 4) | ((b & 15) >> 1)
    for i in range(freq.shape[0]):
        freq[i] >>= 1


@njit(inline="always", nogil=True, cache=True)
def find(keys, base, k):
    """The slot holding key ``k`` in the set starting at ``base``, or -1."""
    for w in range(WAYS):
        if keys[base + w] == k:
            return base + w
    return -1


@njit(inline="always", nogil=True, cache=True)
def server_of(rec, j):
    return np.int64(rec[j, PACKED] >> np.uint64(32))


@njit(inline="always", nogil=True, cache=True)
def uses_of(rec, j):
    return np.int64(rec[j, PACKED] & _LOW)


@njit(nogil=True, cache=True)
def read(want, out, slot_of, stamp_of, col_of, keys, freq, rec, recf, est, s):
    """Copy into ``out`` the rows of ``want`` the cache holds within ``s`` versions of
    ``est``; each key's slot (``slot_of``, -1 for a miss), and a hit's stamp and server
    (``stamp_of``, ``col_of``).  A key found counts a use (``freq``).  Returns the hits
    and a bit mask of the servers the hits came from (bit ``min(server, 63)``)."""
    n = want.shape[0]
    dim = out.shape[1]
    hits, servers = 0, np.uint64(0)
    # three stages: a key's set is fetched 2 HALF keys ahead (its home kept in slot_of),
    # its slot found and its record fetched HALF keys ahead, its record read at its turn
    for i in range(min(2 * HALF, n)):
        slot_of[i] = set_of(hash64(want[i]), keys)
        prefetch_row(keys, slot_of[i])
    for i in range(min(HALF, n)):
        slot_of[i] = _slot_ahead(want[i], slot_of[i], keys, rec)
    for i in range(n):
        if i + 2 * HALF < n:
            home = set_of(hash64(want[i + 2 * HALF]), keys)
            slot_of[i + 2 * HALF] = home
            prefetch_row(keys, home)
        if i + HALF < n:
            slot_of[i + HALF] = _slot_ahead(want[i + HALF], slot_of[i + HALF], keys, rec)
        j = slot_of[i]
        slot_of[i] = -1
        if j < 0:
            continue
        if freq[j] < 255:
            freq[j] += 1
        srv = server_of(rec, j)
        stamp = np.int64(rec[j, STAMP])
        if est[srv] - stamp <= s:
            for c in range(dim):
                out[i, c] = recf[j, FLOATS + c]
            slot_of[i] = j
            stamp_of[i] = stamp
            col_of[i] = srv
            servers |= np.uint64(1) << np.uint64(min(srv, 63))
            hits += 1
    return hits, servers


@njit(nogil=True, cache=True)
def refresh(want, out, keys, recf):
    """The rows of ``want`` the cache holds now, copied into ``out`` over what a read or a
    server's answer put there (a cache that trains its rows: its rows only get newer); how many."""
    dim = out.shape[1]
    found = 0
    for i in range(want.shape[0]):
        k = want[i]
        j = find(keys, set_of(hash64(k), keys), k) if k != EMPTY else -1
        if j >= 0:
            for c in range(dim):
                out[i, c] = recf[j, FLOATS + c]
            found += 1
    return found


@njit(inline="always", nogil=True, cache=True)
def _slot_ahead(k, home, keys, rec):
    j = find(keys, home, k) if k != EMPTY else -1
    if j >= 0:
        prefetch_row(rec, j)
    return j


@njit(nogil=True, cache=True)
def fill(got, got_rows, version, server, keys, freq, rec, recf, sketch, meta, owed_keys, owed_sums, vdim, okind,
         ohp):
    """Keep the rows a server answered at ``version``: a key held is refreshed (its sum
    kept; a cache that trains its rows, ``okind`` >= 0, adds its own change since to the
    row, ``merge_row``); another is counted in the sketch and admitted to a free way, or
    over the way used least if the sketch counts it more (TinyLFU).  A slot given up that
    held a sum writes it to ``owed_keys``/``owed_sums`` (room for one a key); returns how
    many."""
    owed = 0
    dim = got_rows.shape[1]
    width = owed_sums.shape[1]
    rowv, sumv = recf[:, FLOATS:FLOATS + dim], recf[:, FLOATS + dim:FLOATS + dim + width]
    for i in range(got.shape[0]):
        k = got[i]
        if k == EMPTY:
            continue
        h = hash64(k)
        base = set_of(h, keys)
        j = find(keys, base, k)
        kept = np.uint64(0)  # a refreshed slot keeps the uses of its sum
        if j >= 0:
            kept = rec[j, PACKED] & _LOW
        else:
            a, b = _cells(h, sketch)
            _bump(sketch, a)
            _bump(sketch, b)
            j = base
            for w in range(WAYS):  # a free way, else the way used least
                if keys[base + w] == EMPTY:
                    j = base + w
                    break
                if freq[base + w] < freq[j]:
                    j = base + w
            seen = min(_count(sketch, a), _count(sketch, b))
            if keys[j] != EMPTY:
                if seen <= freq[j]:
                    continue  # not admitted: missed no more often than the key it would replace was used
                if uses_of(rec, j) > 0:
                    owed_keys[owed] = keys[j]
                    for c in range(width):
                        owed_sums[owed, c] = recf[j, FLOATS + dim + c]
                    owed += 1
            keys[j] = k
            freq[j] = seen
            for c in range(width):
                recf[j, FLOATS + dim + c] = 0.0
        for c in range(dim):
            recf[j, FLOATS + c] = got_rows[i, c]
        if kept and okind >= 0:
            merge_row(rowv, j, sumv, j, vdim, okind, ohp)
        rec[j, STAMP] = np.uint64(version)
        rec[j, PACKED] = (np.uint64(server) << np.uint64(32)) | kept
    meta[META_READS] += got.shape[0]
    if meta[META_READS] >= AGE_EVERY * keys.shape[0]:
        meta[META_READS] = 0
        _age(sketch, freq)
    return owed


@njit(nogil=True, cache=True)
def refill(got, got_rows, version, server, keys, rec, recf, vdim, okind, ohp):
    """A merge's answer (``got_rows`` of ``got`` as the server left them at ``version``): a
    key still held from that server, stamped at or before ``version``, takes its row, with
    its change since added (``merge_row``) and its sum kept; how many did.  No key is admitted."""
    dim = got_rows.shape[1]
    rowv, sumv = recf[:, FLOATS:FLOATS + dim], recf[:, FLOATS + dim:FLOATS + 2 * dim]
    done = 0
    for i in range(got.shape[0]):
        k = got[i]
        j = find(keys, set_of(hash64(k), keys), k) if k != EMPTY else -1
        if j < 0 or server_of(rec, j) != server or np.int64(rec[j, STAMP]) > version:
            continue
        for c in range(dim):
            recf[j, FLOATS + c] = got_rows[i, c]
        if uses_of(rec, j) > 0:
            merge_row(rowv, j, sumv, j, vdim, okind, ohp)
        rec[j, STAMP] = np.uint64(version)
        done += 1
    return done


@njit(inline="always", nogil=True, cache=True)
def _emit(j, keys, rec, recf, dim, width, out_keys, out_grads, n):
    out_keys[n] = keys[j]
    for c in range(width):
        out_grads[n, c] = recf[j, FLOATS + dim + c]
        recf[j, FLOATS + dim + c] = 0.0
    rec[j, PACKED] &= ~_LOW  # no use gathered


@njit(nogil=True, cache=True)
def write(pushed, grads, slot_hint, keys, rec, recf, pend, meta, est, s, dim, out_keys, out_grads):
    """A push of ``pushed`` (distinct keys) through the cache: a key held adds its
    gradient to its sum, which goes out once ``s`` pushes gathered; a key not held goes
    out as it is.  Then the sums the queue says are ``s`` versions old go out.
    ``slot_hint``: each key's slot when it was read (-1: look it up).  Returns the keys
    written to ``out_keys``/``out_grads``."""
    n = 0
    width = grads.shape[1]
    m = pushed.shape[0]
    for i in range(m):
        k = pushed[i]
        j = _pushed_slot(i, pushed, slot_hint, keys, rec)
        if j < 0:
            out_keys[n] = k
            for c in range(width):
                out_grads[n, c] = grads[i, c]
            n += 1
            continue
        uses = _gathered(j, k, rec, pend, meta, est)
        for c in range(width):
            recf[j, FLOATS + dim + c] += grads[i, c]
        n = _counted(j, uses, s, keys, rec, recf, dim, width, out_keys, out_grads, n)
    return _due(keys, rec, recf, pend, meta, est, s, dim, width, out_keys, out_grads, n)


@njit(nogil=True, cache=True)
def write_local(pushed, grads, slot_hint, keys, rec, recf, pend, meta, est, s, vdim, okind, ohp, out_keys, out_rows,
                pass_keys, pass_grads):
    """``write`` for a cache that trains its rows: a key held takes its gradient by the
    table's rule (``okind``, ``ohp``) on its row here, and its row's change since the server's
    copy is what it gathers and sends (``out_keys``/``out_rows``, whole rows: ``push_ops``'
    ``merge``); a key not held goes out as its gradient (``pass_keys``/``pass_grads``).
    Returns how many of each."""
    n, m = 0, 0
    width = out_rows.shape[1]
    rowv = recf[:, FLOATS:FLOATS + width]
    before = np.empty(width, np.float32)
    for i in range(pushed.shape[0]):
        k = pushed[i]
        j = _pushed_slot(i, pushed, slot_hint, keys, rec)
        if j < 0:
            pass_keys[m] = k
            for c in range(vdim):
                pass_grads[m, c] = grads[i, c]
            m += 1
            continue
        uses = _gathered(j, k, rec, pend, meta, est)
        for c in range(width):
            before[c] = recf[j, FLOATS + c]
        update_row(rowv, j, grads, i, vdim, okind, ohp)
        for c in range(width):
            recf[j, FLOATS + width + c] += recf[j, FLOATS + c] - before[c]
        n = _counted(j, uses, s, keys, rec, recf, width, width, out_keys, out_rows, n)
    return _due(keys, rec, recf, pend, meta, est, s, width, width, out_keys, out_rows, n), m


@njit(inline="always", nogil=True, cache=True)
def _pushed_slot(i, pushed, slot_hint, keys, rec):
    """The slot holding pushed key ``i`` (its read's, ``slot_hint``, where it still does), or
    -1; the slot of the key ``AHEAD`` on fetched."""
    if i + AHEAD < pushed.shape[0] and slot_hint[i + AHEAD] >= 0:
        prefetch_row(rec, slot_hint[i + AHEAD])
        prefetch_row(keys, slot_hint[i + AHEAD])
    k = pushed[i]
    j = slot_hint[i]
    if j < 0 or keys[j] != k:
        j = find(keys, set_of(hash64(k), keys), k) if k != EMPTY else -1
    return j


@njit(inline="always", nogil=True, cache=True)
def _gathered(j, k, rec, pend, meta, est):
    """Slot ``j`` (key ``k``) gathers one more push: its uses before it; a sum's first is
    queued, to go out ``s`` versions on."""
    uses = uses_of(rec, j)
    if uses == 0:
        cap = pend.shape[0]
        born = est[server_of(rec, j)]
        rec[j, BORN] = np.uint64(born)
        tail = meta[META_TAIL]
        if tail - meta[META_HEAD] < cap:
            pend[tail % cap, 0] = np.int64(j)
            pend[tail % cap, 1] = born
            pend[tail % cap, 2] = np.int64(k)
            meta[META_TAIL] = tail + 1
    return uses


@njit(inline="always", nogil=True, cache=True)
def _counted(j, uses, s, keys, rec, recf, dim, width, out_keys, out_grads, n):
    """Slot ``j``'s sum out once ``s`` pushes gathered, else one use more; the sums written."""
    if uses + 1 >= s:
        _emit(j, keys, rec, recf, dim, width, out_keys, out_grads, n)
        return n + 1
    rec[j, PACKED] += np.uint64(1)
    return n


@njit(inline="always", nogil=True, cache=True)
def _due(keys, rec, recf, pend, meta, est, s, dim, width, out_keys, out_grads, n):
    """The queued sums now ``s`` versions old, out after the ``n`` written; the sums written."""
    cap = pend.shape[0]
    head, tail = meta[META_HEAD], meta[META_TAIL]
    while head < tail and n < out_keys.shape[0]:
        q = head % cap
        j, born, k = pend[q, 0], pend[q, 1], np.uint64(pend[q, 2])
        if keys[j] == k and uses_of(rec, j) > 0 and np.int64(rec[j, BORN]) == born:
            if est[server_of(rec, j)] - born < s:
                break  # the queue is in the order the sums started: the rest are younger
            _emit(j, keys, rec, recf, dim, width, out_keys, out_grads, n)
            n += 1
        head += 1
    meta[META_HEAD] = head
    return n


@njit(nogil=True, cache=True)
def drain(keys, rec, recf, dim, out_keys, out_grads):
    """Every sum held, written out and zeroed; returns how many."""
    n = 0
    width = out_grads.shape[1]
    for j in range(keys.shape[0]):
        if keys[j] != EMPTY and uses_of(rec, j) > 0:
            _emit(j, keys, rec, recf, dim, width, out_keys, out_grads, n)
            n += 1
    return n
