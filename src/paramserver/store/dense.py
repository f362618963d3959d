"""A dense vnode: a plain array with a row per key position, for tables whose keys are
folded into ``2**key_bits`` positions (``TableSpec.key_bits``).

``DenseVnode.rows`` is ``float32[positions, width + 1]``: the row of a key is its position
(``hashing.dense_pos``) minus the vnode's first position, and the extra last column is 1
once the key is stored (``width + 1`` is 4 floats for dim-1 FTRL: one aligned 16-byte
row; 8 bytes with ``TableSpec.storage`` fp16 or bf16: 16-bit columns, ``compact.py``).
No keys, no probing, no growth: a read or an update is one memory access where the hash
table (``table.py``) needs two or more.  The array is mapped whole when the vnode is
created (``memory.zeroed_rows``, which has a background thread map its pages): a dense
table's memory is known up front, and its page faults stay off the hot path.  The loops
are numba code in ``loops/dense.py``; its ``*_many`` loops walk every vnode segment of a
request in one call (``vnodes.py``).
"""

from __future__ import annotations

import numpy as np

from paramserver._runtime.intrinsics import frozen
from paramserver.errors import ProtocolError
from paramserver.routing.hashing import dense_keys_of, dense_range
from paramserver.store.compact import ROW_DTYPES, decode_rows, encode_rows
from paramserver.store.loops.dense import dense_load
from paramserver.store.loops.hash import COUNT
from paramserver.store.memory import zeroed_rows
from paramserver.tables.spec import TableSpec

_NO_KEYS = np.zeros(0, np.uint64)


class DenseVnode:
    """One vnode of a dense table (``TableSpec.key_bits > 0``): same interface as
    ``VnodeTable`` (``lookup``/``apply`` go through ``VnodeSet``)."""

    life: None = None  # a lifecycle needs hash vnodes (``TableSpec``): dense ones have no life rows

    def __init__(self, spec: TableSpec, n_vnodes: int, vnode: int) -> None:
        self.dim = spec.dim
        self.width = spec.width
        self.bits = spec.key_bits
        self.layout = spec.layout
        self.start, stop = dense_range(vnode, n_vnodes, self.layout)
        self.rows = zeroed_rows(stop - self.start, self.width + 1, ROW_DTYPES[spec.storage])
        self.keys = _NO_KEYS  # none: the directory (``store/directory.py``) reads every vnode's keys
        self._meta = np.zeros(2, np.int64)

    def __len__(self) -> int:
        return int(self._meta[COUNT])

    @property
    def capacity(self) -> int:
        return int(self.rows.shape[0])

    @property
    def nbytes(self) -> int:
        return int(self.rows.nbytes)

    def _limit(self) -> int:
        return self.capacity + 1  # never grows

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """All stored keys and their full rows (value and state), in position order."""
        stored = np.flatnonzero(self.rows[:, self.width])
        return dense_keys_of(self.start, stored, self.layout), decode_rows(self.rows[stored], self.dim, self.width)

    def load(self, keys: np.ndarray, rows: np.ndarray) -> None:
        """Set whole rows (value and state) for ``keys``; all must be in this vnode."""
        keys = np.ascontiguousarray(keys, np.uint64)
        bad = dense_load(self.rows, self._meta, self.start, frozen(keys),
                          frozen(encode_rows(rows, self.dim, keys, self.rows.dtype)), self.layout)
        if bad >= 0:
            raise ProtocolError(f"key {int(keys[bad])} is not in this dense vnode (positions {self.start}.."
                                f"{self.start + self.capacity - 1} of 2**{self.bits})")
