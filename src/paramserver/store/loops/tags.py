"""What a hash vnode's key column holds, by its type: the key itself, or a fingerprint.

A vnode's slots are ``[key | row]`` (``store/table.py``).  Its key column is either

* ``uint64``: the key itself (every table's, by default).  ``tag_of`` is the key, and
  ``key_at`` reads it back: the loops compile to what they were before there were tags;
* ``uint32``: the key itself in 4 bytes (``TableSpec.key_bytes=4``: every key < 2**32, which
  the client and the server check before a key reaches a loop): ``tag_of`` its low 32 bits,
  ``key_at`` the key widened back;
* ``uint16``: a 16-bit fingerprint of the key (``TableSpec.hot_keys="fingerprint"``: a
  memory budget's hot tier, ``store/fingerprints.py``).  The full keys are kept aside, one
  a slot, in an array the vnode's ``meta[SIDE]`` holds the address of (a file of the cold
  tier's: off the process's own memory).  A probe compares fingerprints only and never
  reads that array; ``record_key`` writes a key there when its slot is taken, and
  ``key_at`` reads it back where a key's identity is needed: moving slots, demotion,
  exports.

A fingerprint is 16 bits of ``hash64(key)`` that neither the vnode (its high bits) nor the
home slot (its low 32 bits) is chosen by, 0 taken as 1 (0 marks an empty slot).  Two keys
whose fingerprints are equal, and where one lies on the other's probe, share a row: a
probe that meets a slot of the same fingerprint takes it for its key.  At a probe of 2-4
slots for a stored key and ~20 for a missing one, about 1 key in 10^4 shares its row (the
hashing trick's collision, at a far lower rate); ``docs/tiers.md`` has the measured cost.

The loops call these as plain functions; numba picks the body by the key column's type
when it compiles them.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload

from paramserver._runtime.intrinsics import view_like
from paramserver.routing.hashing import hash64

#: ``meta[SIDE]``: a fingerprinted vnode's address of its full keys (``uint64[capacity]``)
SIDE = 2
#: the width of ``meta`` for a fingerprinted vnode (``COUNT``, ``HAS_ZERO``, ``SIDE``)
FP_META = 3

_SHIFT = np.uint64(32)
_MASK = np.uint64(0xFFFF)


def fingerprints(keys: np.ndarray) -> np.ndarray:
    """``uint16`` fingerprints of ``keys``, as the loops take them (``tag_of``)."""
    out = np.empty(keys.shape[0], np.uint16)
    _fingerprints(np.ascontiguousarray(keys, np.uint64), out)
    return out


def tag_of(tkeys, key):
    """What ``tkeys`` holds for ``key`` (compiled code only)."""
    raise NotImplementedError("compiled code only")


def key_at(tkeys, meta, s):
    """The key of occupied slot ``s`` (compiled code only)."""
    raise NotImplementedError("compiled code only")


def record_key(tkeys, meta, s, key):
    """``key`` took slot ``s``: kept where ``key_at`` finds it (compiled code only)."""
    raise NotImplementedError("compiled code only")


def move_key(tkeys, meta, dst, src):
    """Slot ``src``'s key moves to ``dst`` (compiled code only)."""
    raise NotImplementedError("compiled code only")


def _full(tkeys: types.Type) -> bool:
    if not isinstance(tkeys, types.Array) or tkeys.dtype not in (types.uint64, types.uint32, types.uint16):
        raise TypeError(f"a key column is uint64 or uint32 (keys) or uint16 (fingerprints), got {tkeys}")
    return bool(tkeys.dtype != types.uint16)


@overload(tag_of)
def _tag_of(tkeys, key):
    if _full(tkeys):
        if tkeys.dtype == types.uint32:
            return lambda tkeys, key: np.uint32(key)
        return lambda tkeys, key: np.uint64(key)

    def fp(tkeys, key):
        f = np.uint16((hash64(key) >> _SHIFT) & _MASK)
        return f if f != 0 else np.uint16(1)

    return fp


@njit(nogil=True, cache=True)
def _fingerprints(keys, out):
    for i in range(keys.shape[0]):
        out[i] = tag_of(out, keys[i])


@njit(inline="always", nogil=True, cache=True)
def _side(tkeys, meta):
    """A fingerprinted vnode's full keys (as int64), one a slot."""
    return view_like(meta, meta[SIDE], tkeys.shape[0], 8)


@overload(key_at)
def _key_at(tkeys, meta, s):
    if _full(tkeys):
        return lambda tkeys, meta, s: np.uint64(tkeys[s])
    return lambda tkeys, meta, s: np.uint64(_side(tkeys, meta)[s])


@overload(record_key)
def _record_key(tkeys, meta, s, key):
    if _full(tkeys):
        return lambda tkeys, meta, s, key: None

    def aside(tkeys, meta, s, key):
        _side(tkeys, meta)[s] = np.int64(key)

    return aside


@overload(move_key)
def _move_key(tkeys, meta, dst, src):
    if _full(tkeys):
        def full(tkeys, meta, dst, src):
            tkeys[dst] = tkeys[src]
        return full

    def aside(tkeys, meta, dst, src):
        tkeys[dst] = tkeys[src]
        side = _side(tkeys, meta)
        side[dst] = side[src]

    return aside


def exact(tkeys, meta, key, s):
    """The slot that holds ``key`` itself, from ``s``, the one a probe found for it
    (compiled code only): where a key moves or leaves by its identity (demotion, removal)."""
    raise NotImplementedError("compiled code only")


@overload(exact)
def _exact(tkeys, meta, key, s):
    if _full(tkeys):
        return lambda tkeys, meta, key, s: s

    def aside(tkeys, meta, key, s):
        # a key sharing this fingerprint lies before ``key`` on its probe (moved there by a
        # removal's backward shift): ``key``'s own slot is further on in the run, if anywhere
        if s < 0 or s == tkeys.shape[0] or key_at(tkeys, meta, s) == key:
            return s
        side = _side(tkeys, meta)
        tag = tkeys[s]
        j = s
        while True:
            j += 1
            if j == tkeys.shape[0]:
                j = 0
            if tkeys[j] == 0 or j == s:
                return s
            if tkeys[j] == tag and np.uint64(side[j]) == key:
                return j

    return aside
