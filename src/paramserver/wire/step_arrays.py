"""A step's arrays on the wire (``Op.STEP``: ``client/step_calls.py`` sends them,
``server/steps.py`` reads them), each as narrow as its values allow.

A step carries its batch whole, and on a link of 1 Gbit/s the bytes, not the server, bound
it: a CTR example of 40 features is ~10 distinct keys and 40 occurrences, 178 bytes at the
canonical types.  So each array that can goes narrower, chosen by the sender from its
values, and the receiver widens it back: keys below 2^32 (a table of up to 32 hash bits) as
``<u4``, an occurrence's index as ``<u2`` up to 65 536 keys, the offsets as ``<i4`` while
they fit, labels that are all 0 or 1 as ``|u1``, values that are all 1 not at all.  The
arithmetic is the same to the bit: every narrow form is exact.
"""

from __future__ import annotations

import numpy as np

from paramserver.errors import ProtocolError
from paramserver.wire.message import Message

#: a step's arrays in order, and the types each may go as (the first is the one it is read as)
STEP_ARRAYS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("keys", ("<u8", "<u4")), ("vnodes", ("<i4",)), ("counts", ("<i8",)), ("inverse", ("<i4", "<u2")),
    ("indptr", ("<i8", "<i4")), ("vals", ("<f4",)), ("labels", ("<f4", "|u1")))

_U32 = 1 << 32
#: a batch's values where every one is 1: none (``Batch.values``), and none go (the step kernels
#: read an empty array as all ones).  Writable, as a batch's own values are: one array type for
#: the kernels either way (a read-only one would be another specialisation, compiled in use)
NO_VALUES = np.zeros(0, np.float32)


def key_type(keys: np.ndarray) -> np.dtype:
    """What a step's ``keys`` go as: ``<u4`` where every one is below 2^32, else ``<u8``."""
    if keys.dtype.itemsize <= 4 or not keys.shape[0] or int(keys.max()) < _U32:
        return np.dtype("<u4")
    return np.dtype("<u8")


def index_type(m: int) -> np.dtype:
    """What the indices of a step's occurrences into its ``m`` keys go as: 16 bits up to 65 536 keys, else 32."""
    return np.dtype("<u2" if m <= 1 << 16 else "<i4")


def step_arrays(keys: np.ndarray, vnodes: np.ndarray, counts: np.ndarray, inverse: np.ndarray, indptr: np.ndarray,
                vals: np.ndarray, labels: np.ndarray, index: np.dtype | None = None) -> list[np.ndarray]:
    """The arrays a step goes out as: ``keys`` (distinct, grouped by ``vnodes`` and
    ``counts`` as a pull's), each occurrence's index among them (``inverse``), the batch's
    offsets, values and labels, each in the narrowest type that holds it exactly (no copy of
    keys and indices already as narrow: ``routing/steps.route_steps`` makes them so); ``index``: the
    indices' type where they index fewer keys than ``keys`` (a step of several batches)."""
    nnz = inverse.shape[0]
    ones = bool((vals == 1).all())  # a CTR row's features: then none go
    binary = bool(((labels == 0) | (labels == 1)).all())
    return [keys.astype(key_type(keys), copy=False), vnodes, counts,
            inverse.astype(index or index_type(keys.shape[0]), copy=False),
            np.ascontiguousarray(indptr, "<i4" if nnz < 1 << 31 else "<i8"),
            NO_VALUES if ones else np.ascontiguousarray(vals, np.float32),
            labels.astype("|u1") if binary else np.ascontiguousarray(labels, np.float32)]


def read_step_arrays(msg: Message, grouped: bool = False) -> list[np.ndarray]:
    """A step request's arrays at their canonical types (``keys <u8``, ``vnodes <i4``,
    ``counts <i8``, ``inverse`` as sent, ``<u2`` or ``<i4``: the kernels take both,
    ``indptr <i8``, ``vals <f4``, ``labels <f4``).

    Raises:
        ProtocolError: not seven arrays (eight, ``sizes`` last, for a step of several batches:
            ``grouped``, ``wire/step_groups.py``), or one of a type or a shape it may not go as."""
    names = STEP_ARRAYS + ((("sizes", ("<i8",)),) if grouped else ())
    if len(msg.arrays) != len(names):
        raise ProtocolError(f"{'a step of several batches' if grouped else 'step'} takes {len(names)} arrays "
                            f"({', '.join(n for n, _ in names)}), got {len(msg.arrays)}")
    out = []
    for a, (name, types) in zip(msg.arrays, names, strict=True):
        if a.dtype.str not in types or a.ndim != 1:
            raise ProtocolError(f"step: {name} must be 1-d {' or '.join(types)}, got {a.ndim}-d {a.dtype.str}")
        if name != "inverse" and a.dtype.str != types[0]:
            a = a.astype(types[0])
            a.setflags(write=False)  # read-only as a received frame is: the kernels are compiled for those
        out.append(a)
    return out
