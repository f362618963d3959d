"""The model a server answers with: replicas of its table, immutable snapshots of them, and
the holder that swaps one snapshot for the next while requests go on.

A *replica* is one copy of the model's table (a ``VnodeTable``) and a deep model's MLP.
A *snapshot* names a replica at one model version (the part of the published chain it
ends with, and when that part was published).  A request takes the holder's current
snapshot (``acquire``), scores with it and gives it back (``release``): it sees one
model version from start to end.  ``swap`` makes another snapshot current, then waits
until no request still reads the replica it replaced, so that the caller may change
that one (``follow.py`` keeps two replicas: a delta goes into the idle one, which is
swapped in, then into the other).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from paramserver.apps.ctr.models import Model
from paramserver.data.reader import Batch, DataFormat
from paramserver.store.table import VnodeTable
from paramserver.tables.optim import SGD, Initializer
from paramserver.tables.spec import TableSpec

FLAT_BYTES = 256 << 20  # a model's rows up to this size are also kept as one array indexed by key


@dataclass(eq=False)
class Replica:
    """One copy of a model's table and MLP; ``readers``: the requests scoring with it now.

    ``flat`` (with ``seen``): where every key is below ``2^hash_bits`` (``--hash-bits`` up
    to 24, the default) and a key never stored reads zeros (LR's initialiser), the rows as
    one array indexed by the key itself.  A request then gathers each feature's row in one
    numpy call, with no sort for distinct keys and no hash probe: 1,000 rows' lookups took
    1.1 ms through the table (sorting the keys, probing them) and about 0.1 ms this way."""

    model: Model
    data: DataFormat
    table: VnodeTable
    dense: np.ndarray | None
    readers: int = 0
    flat: np.ndarray | None = None  # float32 [2^hash_bits, dim]
    seen: np.ndarray | None = None  # bool [2^hash_bits]: the key is stored


@dataclass(frozen=True, eq=False)
class Snapshot:
    """A replica at one model version: ``version`` (a part's path, or the model's folder),
    ``seq`` (the part's number, 0 for a model loaded once), ``published_at`` (Unix time)."""

    replica: Replica
    version: str
    seq: int
    published_at: float

    @property
    def age_s(self) -> float:
        return max(0.0, time.time() - self.published_at)


@dataclass
class Scored:
    """A request's probabilities and what it counts towards the unseen feature share."""

    probabilities: np.ndarray
    features: int
    unseen: int


def new_replica(meta: dict[str, Any], keys: np.ndarray, values: np.ndarray, dense: np.ndarray | None) -> Replica:
    """A replica of a model folder's ``model.json`` (``meta``), keys, values and MLP, with a
    table whose keys can be removed (a delta's deleted keys)."""
    model = Model(**meta["model"])
    data = DataFormat(**meta["data"])
    spec = TableSpec.from_wire(meta["table"])
    table = VnodeTable(spec.dim, SGD(), Initializer.parse(spec.initializer), spec.seed,
                       capacity=int(keys.shape[0] / 0.7) + 8, life_width=1)
    rows = np.ascontiguousarray(values[:, :spec.dim], np.float32)  # a checkpoint's rows carry state too
    table.load(keys, rows)
    return flattened(Replica(model, data, table, dense), keys, rows)


def flattened(replica: Replica, keys: np.ndarray, rows: np.ndarray) -> Replica:
    """``replica`` with its rows (``keys``, ``rows``) also as one array by key, where that
    is right (see ``Replica``)."""
    bits, dim = replica.data.hash_bits, replica.table.dim
    if 0 < bits <= 24 and replica.model.initializer().get("name") == "zeros" and (dim << bits) * 4 <= FLAT_BYTES \
            and (keys.size == 0 or int(keys.max()) < (1 << bits)):
        replica.flat, replica.seen = np.zeros((1 << bits, dim), np.float32), np.zeros(1 << bits, np.bool_)
        replica.flat[keys], replica.seen[keys] = rows, True
    return replica


def apply_to(replica: Replica, keys: np.ndarray, values: np.ndarray, deleted: np.ndarray,
             dense: np.ndarray | None) -> None:
    """A delta into ``replica`` (no request may be reading it): ``deleted`` removed, then
    ``keys`` set; a delta's MLP replaces the replica's.  Work in the delta's size (the
    table grows now and then, as any table does)."""
    table = replica.table
    if deleted.size:
        table.remove(np.ascontiguousarray(deleted, np.uint64))
    if keys.size:
        rows = np.asarray(values, np.float32).reshape(keys.shape[0], -1)[:, :table.dim]
        table.load(np.ascontiguousarray(keys, np.uint64), np.ascontiguousarray(rows))
    if replica.flat is not None and replica.seen is not None:
        if deleted.size:
            replica.flat[deleted], replica.seen[deleted] = 0.0, False
        if keys.size:
            replica.flat[keys], replica.seen[keys] = rows, True
    if dense is not None:
        replica.dense = dense


def score(replica: Replica, batch: Batch, count_unseen: bool = True) -> Scored:
    """Probabilities of a parsed batch, as ``LocalModel.proba`` gives them; with
    ``count_unseen``, how many of its features the model never saw (a second probe of the
    table for every key: a quarter of a 1,000-row request's time, so the service samples)."""
    if replica.flat is not None and replica.seen is not None:  # a row per feature, gathered by key
        features = int(batch.keys.shape[0])
        unseen = features - int(np.count_nonzero(replica.seen[batch.keys])) if count_unseen else 0
        every = np.arange(features, dtype=np.int64)
        return Scored(replica.model.predict(batch, every, replica.flat[batch.keys], replica.dense),
                      features if count_unseen else 0, unseen)
    uniq, inverse = batch.unique()
    rows = np.empty((uniq.shape[0], replica.model.dim), np.float32)
    replica.table.lookup(uniq, rows)
    features = int(inverse.shape[0]) if count_unseen else 0
    unseen = features - int(np.count_nonzero(replica.table.stored(uniq)[inverse])) if count_unseen else 0
    return Scored(replica.model.predict(batch, inverse, rows, replica.dense), features, unseen)


@dataclass(eq=False)
class Holder:
    """The current snapshot (None until a model is loaded), swapped atomically."""

    current: Snapshot | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def acquire(self) -> Snapshot | None:
        """The current snapshot, its replica counted as read until ``release``."""
        with self._lock:
            snap = self.current
            if snap is not None:
                snap.replica.readers += 1
            return snap

    def release(self, snap: Snapshot) -> None:
        with self._lock:
            snap.replica.readers -= 1

    def swap(self, snap: Snapshot, timeout_s: float = 30.0) -> Snapshot | None:
        """Make ``snap`` current; the one it replaced, once no request reads its replica
        (unless it is ``snap``'s own)."""
        with self._lock:
            old, self.current = self.current, snap
        if old is not None and old.replica is not snap.replica:
            self.wait_idle(old.replica, timeout_s)
        return old

    def wait_idle(self, replica: Replica, timeout_s: float = 30.0) -> None:
        """Until no request reads ``replica`` (a request takes a few milliseconds)."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                if replica.readers <= 0:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"requests held a replaced model for {timeout_s:g} s")
            time.sleep(0.0005)


def written_at(path: str) -> float | None:
    """When the file or folder at ``path`` (local or any fsspec URL) was written; None where
    it is missing or its filesystem does not say."""
    try:
        if os.path.exists(path):
            return os.path.getmtime(path)
        import fsspec

        info = fsspec.core.url_to_fs(path)[0].info(path)
    except (OSError, ValueError, ImportError):
        return None
    for key in ("mtime", "LastModified", "updated", "created"):
        value = info.get(key)
        if isinstance(value, (int, float)):
            return float(value)
        if hasattr(value, "timestamp"):
            return float(value.timestamp())
    return None
