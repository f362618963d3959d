"""A step's arrays on the wire (``Op.STEP``: ``client/step_calls.py`` sends them,
``server/steps.py`` reads them), each as narrow as its values allow.

A step carries its batch whole, and on a link of 1 Gbit/s the bytes, not the server, bound
it: a CTR example of 40 features is ~10 distinct keys and 40 occurrences, 178 bytes at the
canonical types.  So each array that can goes narrower, chosen by the sender from its
values, and the receiver widens it back: keys below 2^24 (a table of up to 24 hash bits,
``train``'s default) as three bytes each (``|u1[n, 3]``, little-endian), below 2^32 as
``<u4``; an occurrence's index as ``<u2`` up to 65 536 keys; the offsets as the rows' lengths
(``|u1``, one an example) where no row has more than 255 occurrences, else as ``<i4`` while
they fit; the segments' counts as ``<i4``; labels that are all 0 or 1 as ``|u1``; values
that are all 1 not at all.  The arithmetic is the same to the bit: every narrow form is
exact.  The default job's steps went from 128.7 to 114.7 bytes an example as its report counts
them (keys 41.9 -> 31.5, offsets 4.0 -> 1.0, counts 1.0 -> 0.5; the indices' 80 unchanged).
"""

from __future__ import annotations

import numpy as np

from paramserver._runtime.intrinsics import frozen
from paramserver.errors import ProtocolError
from paramserver.wire.message import Message
from paramserver.wire.packing import pack_keys, row_lengths, row_offsets, unpack_keys

#: a step's arrays in order, and the types each may go as (the first is the one it is read as)
STEP_ARRAYS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("keys", ("<u8", "<u4", "|u1")), ("vnodes", ("<i4",)), ("counts", ("<i8", "<i4")), ("inverse", ("<i4", "<u2")),
    ("indptr", ("<i8", "<i4", "|u1")), ("vals", ("<f4",)), ("labels", ("<f4", "|u1")))
#: a key's bytes in its narrowest form (``|u1[n, 3]``, the one array that goes 2-d)
_KEY_BYTES = 3

_U24, _U32 = 1 << 24, 1 << 32
#: the forms an array goes as that are not its values in another type, as a refusal says them
_FORMS = {"|u1": {"keys": " or |u1[n, 3] (three bytes a key)", "indptr": " or 1-d |u1 (the rows' lengths)",
                  "labels": " or |u1"}}
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
                vals: np.ndarray, labels: np.ndarray, index: np.dtype | None = None,
                examples: np.ndarray | None = None) -> list[np.ndarray]:
    """The arrays a step goes out as: ``keys`` (distinct, grouped by ``vnodes`` and
    ``counts`` as a pull's), each occurrence's index among them (``inverse``), the batch's
    offsets, values and labels, each in the narrowest form that holds it exactly (no copy of
    indices already as narrow: ``routing/steps.route_steps`` makes them so); ``index``: the
    indices' type where they index fewer keys than ``keys`` (a step of several batches);
    ``examples``: a step of several batches' examples a batch (its ``indptr`` is each batch's
    offsets end to end, each from 0)."""
    nnz = inverse.shape[0]
    ones = bool((vals == 1).all())  # a CTR row's features: then none go
    binary = bool(((labels == 0) | (labels == 1)).all())
    return [_narrow_keys(keys), vnodes, counts.astype("<i4") if keys.shape[0] < 1 << 31 else counts,
            inverse.astype(index or index_type(keys.shape[0]), copy=False), _narrow_offsets(indptr, nnz, examples),
            NO_VALUES if ones else np.ascontiguousarray(vals, np.float32),
            labels.astype("|u1") if binary else np.ascontiguousarray(labels, np.float32)]


def _narrow_keys(keys: np.ndarray) -> np.ndarray:
    """``keys`` as three bytes each (``|u1[n, 3]``) where all are below 2^24, else as ``key_type`` says."""
    wide = keys.astype(key_type(keys), copy=False)
    if wide.dtype.itemsize != 4 or (keys.shape[0] and int(wide.max()) >= _U24):
        return wide
    three = np.empty((keys.shape[0], _KEY_BYTES), np.uint8)
    pack_keys(wide, three)
    return three


def _narrow_offsets(indptr: np.ndarray, nnz: int, examples: np.ndarray | None) -> np.ndarray:
    """A step's offsets as its rows' lengths (``|u1``, batches end to end) where none passes
    ``packing.ROW_BYTE``, else as ``<i4`` while they fit (``<i8`` past)."""
    per = np.array([indptr.shape[0] - 1], np.int64) if examples is None else np.ascontiguousarray(examples, np.int64)
    lengths = np.empty(int(per.sum()), np.uint8)
    if row_lengths(np.ascontiguousarray(indptr, np.int64), per, lengths):
        return lengths
    return np.ascontiguousarray(indptr, "<i4" if nnz < 1 << 31 else "<i8")


def read_step_arrays(msg: Message, steps: int | None = None) -> list[np.ndarray]:
    """A step request's arrays at their canonical types (``keys <u8``, ``vnodes <i4``,
    ``counts <i8``, ``inverse`` as sent, ``<u2`` or ``<i4``: the kernels take both,
    ``indptr <i8``, ``vals <f4``, ``labels <f4``).

    Raises:
        ProtocolError: not seven arrays (eight, ``sizes`` last, for a step of ``steps`` batches,
            ``wire/step_groups.py``), or one of a type or a shape it may not go as."""
    grouped = steps is not None
    names = STEP_ARRAYS + ((("sizes", ("<i8",)),) if grouped else ())
    if len(msg.arrays) != len(names):
        raise ProtocolError(f"{'a step of several batches' if grouped else 'step'} takes {len(names)} arrays "
                            f"({', '.join(n for n, _ in names)}), got {len(msg.arrays)}")
    out = []
    for a, (name, types) in zip(msg.arrays, names, strict=True):
        three = name == "keys" and a.dtype.str == "|u1"
        if a.dtype.str not in types or a.ndim != (2 if three else 1) or (three and a.shape[1] != _KEY_BYTES):
            raise ProtocolError(f"step: {name} must be 1-d {' or '.join(t for t in types if t not in _FORMS)}"
                                f"{''.join(_FORMS[t][name] for t in types if t in _FORMS)}, got {a.ndim}-d "
                                f"{a.dtype.str}{list(a.shape) if three else ''}")
        if three:
            a = _widen_keys(a)
        elif name == "indptr" and a.dtype.str == "|u1":
            a = _offsets(a, None if steps is None else (msg.arrays[-1], steps))
        elif name != "inverse" and a.dtype.str != types[0]:
            a = a.astype(types[0])
        a.setflags(write=False)  # read-only as a received frame is: the kernels are compiled for those
        out.append(a)
    return out


def _widen_keys(three: np.ndarray) -> np.ndarray:
    """Keys sent as three little-endian bytes each, as ``<u8``."""
    out = np.empty(three.shape[0], np.uint64)
    unpack_keys(frozen(three), out)  # read-only, as a frame is: one compiled kernel
    return out


def _offsets(lengths: np.ndarray, group: tuple[np.ndarray, int] | None) -> np.ndarray:
    """The offsets (``<i8``) of rows sent as their lengths: each batch's from 0 (``group``: a
    step of several batches' ``sizes`` and its batches).

    Raises:
        ProtocolError: ``sizes`` that do not cut the lengths into the batches."""
    if group is None:
        examples = np.array([lengths.shape[0]], np.int64)
    else:
        sizes, steps = group
        sizes_fault(sizes, steps)
        examples = sizes[2::3].astype(np.int64)  # a copy, writable: one compiled kernel
        # each at most the rows there are: their sum cannot wrap around to the count (four of 2^62 summed to 0)
        if (examples < 0).any() or (examples > lengths.shape[0]).any() or int(examples.sum()) != lengths.shape[0]:
            raise ProtocolError(f"a step of {steps} batches: its sizes name {int(examples.sum())} examples, its "
                                f"rows' lengths {lengths.shape[0]}")
    out = np.empty(lengths.shape[0] + examples.shape[0], np.int64)
    row_offsets(frozen(lengths), examples, out)
    return out


def sizes_fault(sizes: np.ndarray, steps: int) -> None:
    """Refuse a step of ``steps`` batches whose ``sizes`` are not three a batch.

    Raises:
        ProtocolError: saying what they must be."""
    if sizes.dtype.str != "<i8" or sizes.shape != (3 * steps,):
        raise ProtocolError(f"a step of {steps} batches takes sizes <i8[{3 * steps}]: each batch's keys, vnode "
                            f"segments and examples; got {sizes.shape[0] if sizes.ndim == 1 else sizes.shape} "
                            f"{sizes.dtype.str} sizes")
