"""What the rest of the code may use of the storage engine: ``VnodeStore``, the vnodes of
one table on one server as a server works them, and ``LifeRows``, the part of them a
table's key lifecycle (``life.py``) works on.

``VnodeSet`` (``vnodes.py``) is the one implementation; a server's modules type against
``VnodeStore`` and construct a ``VnodeSet`` only where a table is created, so what a
server needs of the engine is written down here, and the engine may change behind it
(issue 44: ``server/`` had grown into the engine's private names).  A vnode's own store
(``Vnode``: a hash ``VnodeTable`` or a ``DenseVnode``) is read whole: its rows exported,
copied or checkpointed, and rows loaded into it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

import numpy as np

from paramserver.lifecycle.policies import AdmissionPolicy
from paramserver.tables.spec import TableSpec

#: a push's arrays: keys, grads, vnodes, counts
Push = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


class Life(Protocol):
    """What a server asks of a table's key lifecycle (``store/life.TableLife``): the part
    of a push it admits, the keys it stamps, evicts and sweeps, its deltas and figures."""

    epoch: int  # changes now are stamped with it; an export starts the next
    origin: int  # names this run of the epochs
    policy: AdmissionPolicy | None

    def values(self, grads: np.ndarray) -> np.ndarray: ...

    def admit(self, keys: np.ndarray, grads: np.ndarray, vnodes: np.ndarray, counts: np.ndarray) -> Push: ...

    def touched(self, vnodes: np.ndarray, counts: np.ndarray, keys: np.ndarray, time: float | None) -> None: ...

    def loaded(self, vnode: int, keys: np.ndarray) -> None: ...

    def due(self, primary: np.ndarray) -> bool: ...

    def sweep(self, primary: np.ndarray) -> list[tuple[int, np.ndarray]]: ...

    def evict(self, vnode: int, keys: np.ndarray) -> int: ...

    def delta(self, primary: np.ndarray, since: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]: ...

    def changes(self, primary: np.ndarray, since: int) -> tuple[list[tuple[int, np.ndarray, np.ndarray]],
                                                                   np.ndarray, bool]: ...

    @property
    def nbytes(self) -> int: ...

    def figures(self) -> dict[str, float]: ...


class Vnode(Protocol):
    """One vnode's rows, read and written whole (exports, copies, checkpoints)."""

    def __len__(self) -> int: ...

    @property
    def capacity(self) -> int: ...

    @property
    def nbytes(self) -> int: ...

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """Every stored key and its float32 row (value and state)."""
        ...

    def load(self, keys: np.ndarray, rows: np.ndarray) -> None:
        """Set whole float32 rows (value and state) for ``keys``."""
        ...


class VnodeStore(Protocol):
    """The vnodes of one table on one server: requests' keys arrive grouped by vnode
    (``vnodes`` segments of ``counts`` keys each) and are worked all at once."""

    @property
    def spec(self) -> TableSpec: ...

    @property
    def width(self) -> int:
        """Columns of a row: the value (``spec.dim``) and the optimiser's state."""
        ...

    @property
    def bits(self) -> int:
        """``spec.key_bits``: a dense table's key bits, 0 for a hash table."""
        ...

    @property
    def layout(self) -> int:
        """How keys map to vnodes (``hashing.layout_code``)."""
        ...

    @property
    def slot(self) -> np.ndarray:
        """``int64[n_vnodes]``: each vnode's index among those held, -1 where not held."""
        ...

    @property
    def n_vnodes(self) -> int: ...

    @property
    def tables(self) -> Mapping[int, Vnode]:
        """The vnodes held, each's own store."""
        ...

    @property
    def life(self) -> Life | None:
        """The table's key lifecycle on this server, if it has one."""
        ...

    #: pushes applied to the table here, counted by the server's data plane (a pull that
    #: asks for it, ``versions``, is answered with it: ``client/row_cache.py``)
    version: int

    def __len__(self) -> int: ...

    @property
    def nbytes(self) -> int: ...

    @property
    def row_bytes(self) -> int:
        """Bytes a stored key takes, as quotas count them."""
        ...

    @property
    def itemsize(self) -> int: ...

    def set_vnodes(self, vnodes: Iterable[int]) -> None:
        """Hold exactly ``vnodes`` (the ring changed)."""
        ...

    def install(self, vnode: int, keys: np.ndarray, rows: np.ndarray, replace: bool = True) -> None:
        """A copy of ``vnode`` from another server (or more of its rows)."""
        ...

    def refresh(self) -> None:
        """Re-read every vnode's arrays (one grew outside ``apply``)."""
        ...

    def holds(self, vnodes: np.ndarray) -> np.ndarray: ...

    def check(self, vnodes: np.ndarray, counts: np.ndarray, keys: np.ndarray) -> int:
        """The index of the first key outside its vnode (dense tables) or past 2**32 (a table of
        4-byte keys), else -1."""
        ...

    def lookup(self, vnodes: np.ndarray, counts: np.ndarray, keys: np.ndarray, out: np.ndarray) -> None: ...

    def apply(self, vnodes: np.ndarray, counts: np.ndarray, keys: np.ndarray, grads: np.ndarray,
              op: int = ...) -> None: ...

    def add_masked(self, vnodes: np.ndarray, counts: np.ndarray, keys: np.ndarray, mask: np.ndarray,
                   words: np.ndarray) -> bool:
        """Rows packed as a mask and their non-zero values, added where they land; False (none
        added) where the table does not take them so (``VnodeSet.add_masked``)."""
        ...

    def steps(self, vnodes: np.ndarray, counts: np.ndarray, keys: np.ndarray, inverse: np.ndarray,
              indptr: np.ndarray, vals: np.ndarray, labels: np.ndarray, sizes: np.ndarray, occurrences: np.ndarray,
              l2: float, applied: Callable[[int], None]) -> tuple[np.ndarray, np.ndarray] | None:
        """A step of several batches in one call: probabilities and each batch's log loss,
        ``applied(n)`` as batches go in; None where they go one by one (``VnodeSet.steps``)."""
        ...

    def missing(self, vnodes: np.ndarray, counts: np.ndarray, keys: np.ndarray) -> int: ...

    def stored(self, vnodes: np.ndarray, counts: np.ndarray, keys: np.ndarray) -> np.ndarray: ...

    def touch(self, vnodes: np.ndarray, counts: np.ndarray, keys: np.ndarray, epoch: float, time: float,
              half_life: float) -> None: ...

    def keep(self, vnode: int, mask: np.ndarray, room: int = 0) -> None: ...

    def held(self, vnode: int) -> int:
        """Keys of ``vnode`` stored here, in memory and (a tiered table) on disk."""
        ...

    def rows(self, vnode: int) -> tuple[np.ndarray, np.ndarray]:
        """Every key of ``vnode`` stored here, wherever it is, and its float32 row (value
        and state): what exports, checkpoints and copies of the vnode read."""
        ...

    @property
    def tiered(self) -> bool:
        """Whether the table has a memory budget here (``tiers.py``)."""
        ...

    def prefetch(self, vnodes: np.ndarray, counts: np.ndarray, keys: np.ndarray) -> tuple[int, bool] | None:
        """Keys a later request will ask for, as a request's arrays: a tiered table reads
        their cold rows' pages in the background where that pays; how many were not in
        memory and whether it read ahead (None: the table has no tiers)."""
        ...

    def settle(self) -> None:
        """After a request: hold the table's memory budget (``tiers.py``), if it has one."""
        ...

    def figures(self) -> dict[str, float]:
        """The tiers' figures (empty for a table without a memory budget)."""
        ...


class LifeVnode(Protocol):
    """A hash vnode as the lifecycle reads and evicts it: its slots and their life rows."""

    @property
    def keys(self) -> np.ndarray:
        """``uint64[capacity]``: each slot's key, 0 where empty."""
        ...

    @property
    def life(self) -> np.ndarray | None:
        """``float32[capacity + 1, life_width]``: each slot's life row, the last key 0's."""
        ...

    @property
    def has_zero(self) -> bool: ...

    def __len__(self) -> int: ...

    @property
    def capacity(self) -> int: ...

    @property
    def nbytes(self) -> int: ...

    def items(self) -> tuple[np.ndarray, np.ndarray]: ...

    def changed(self, column: int, since: float) -> tuple[np.ndarray, np.ndarray]: ...

    def remove(self, keys: np.ndarray) -> int: ...

    def set_life(self, keys: np.ndarray, life: np.ndarray) -> None: ...


class LifeRows(Protocol):
    """What a table's lifecycle (``TableLife``) works on: its hash vnodes' slots and life
    rows, and the compiled walks over all of them."""

    @property
    def n_vnodes(self) -> int: ...

    @property
    def width(self) -> int: ...

    @property
    def life_width(self) -> int: ...

    @property
    def hash_vnodes(self) -> Mapping[int, LifeVnode]: ...

    @property
    def cold_vnodes(self) -> Mapping[int, LifeVnode]:
        """A tiered table's vnodes' rows on disk (``tiers.py``); empty for others."""
        ...

    def stored(self, vnodes: np.ndarray, counts: np.ndarray, keys: np.ndarray) -> np.ndarray: ...

    def touch(self, vnodes: np.ndarray, counts: np.ndarray, keys: np.ndarray, epoch: float, time: float,
              half_life: float) -> None: ...

    def keep(self, vnode: int, mask: np.ndarray, room: int = 0) -> None:
        """Keep the keys of ``vnode`` that ``mask`` marks, in arrays with room for ``room``."""
        ...
