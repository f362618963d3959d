"""A table's key lifecycle on one server (``TableSpec.lifecycle``): admission, the life
rows' stamps, eviction sweeps, tombstones and delta exports.

Only a vnode's primary decides.  It admits (``lifecycle/policies.py``) before applying a
push, and forwards to its backups only the keys it stores; it sweeps (TTL, decayed
score, caps) and forwards what it evicted as a ``REPLICATE`` marked ``evict``, on the
same link and so in the same order as the pushes.  A backup applies both as told and
never decides, so the copies of a vnode hold the same keys whatever fails.

Eviction frees memory: keys are removed in place (backward-shift deletion), their slots
reused by new keys, and a vnode left under ``SHRINK_LOAD`` of its slots is rebuilt in
arrays sized for what it keeps (``VnodeTable.keep``).  A cap is held per server: its
share of the cap (as its share of the vnodes it is primary of) over all those vnodes,
the least recently (or frequently) pushed keys of any of them going first.

Every change is stamped with the server's export epoch; ``delta`` returns the keys whose
stamp is at least a token's, and the keys evicted since (tombstones), then starts a new
epoch.  Tombstones are kept for at most a quarter of the keys held (2 bytes a key): a
token older than the oldest kept, or a delta larger than the table, gets a full export.

``TableLife`` works on the hash vnodes' slots and life rows (``protocol.LifeRows``: the
``VnodeSet`` passes itself as such), not on the whole set; the life rows' columns and
their loops are in ``loops/life.py``.
"""

from __future__ import annotations

import ctypes
import logging
import secrets
from dataclasses import dataclass

import numpy as np

from paramserver.lifecycle.policies import AdmissionPolicy, load_policy
from paramserver.lifecycle.spec import Lifecycle
from paramserver.store.loops.life import SCORE, STAMP, VER
from paramserver.store.protocol import LifeRows, LifeVnode
from paramserver.store.table import MAX_LOAD

logger = logging.getLogger(__name__)

TOMBSTONE_MIN = 1 << 16  # tombstones kept, at least ...
TOMBSTONES_PER_KEY = 0.25  # ... and at most this many a key held (2 bytes a key): deleting more, a delta is a base
CAP_SLACK = 0.05  # over a cap, a server sweeps down to (1 - CAP_SLACK) of its share
SHRINK_LOAD = 0.3  # a vnode this empty after evictions is rebuilt smaller (its memory given back) ...
CAPPED_SHRINK_LOAD = 0.6  # ... and under a cap, where it grew while filling up: sized for its share then
SWEEPS_PER_TTL = 8  # a TTL or score sweep runs when time moved on by ttl / SWEEPS_PER_TTL


@dataclass
class LifeStats:
    """What the lifecycle did on this server (``STATS``' ``lifecycle``)."""

    admitted: int = 0  # keys stored at their admission
    refused: int = 0  # key updates not applied: the key was not admitted (yet)
    evicted: int = 0  # keys evicted (here as primary, or as told by it)
    sweeps: int = 0


class TableLife:
    """The lifecycle of one table on one server.

    Args:
        spec: the table's ``Lifecycle``.
        dim: the table's values a key (a push row carries the shows and clicks after them).
        rows: its hash vnodes' slots and life rows (a ``VnodeSet``).
    """

    def __init__(self, spec: Lifecycle, dim: int, rows: LifeRows) -> None:
        self.rows = rows
        self.dim = dim
        self.spec = spec
        self.policy: AdmissionPolicy | None = load_policy(self.spec.admit) if self.spec.admit else None
        self.counted = self.spec.stats  # pushes carry shows and clicks after their values
        self.now = 0.0  # the latest push time seen
        self.epoch = 1  # changes now are stamped with it; an export starts the next
        self.origin = secrets.randbits(62)  # names this run of the epochs: a token from another is not continued
        self.floor = 1  # tombstones are whole from this epoch on
        self.tombstones: list[tuple[int, np.ndarray]] = []
        self.tomb_keys = 0
        self.last_sweep = 0.0
        self.stats = LifeStats()

    # ---- the hot path ---------------------------------------------------------------------
    def values(self, grads: np.ndarray) -> np.ndarray:
        """A client's push rows without the shows and clicks they carry for admission."""
        return np.ascontiguousarray(grads[:, :self.dim]) if self.counted else grads

    def admit(self, keys: np.ndarray, grads: np.ndarray, vnodes: np.ndarray,
              counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The part of a push (fresh, on vnodes this server is primary of) to apply: keys
        stored already, and the new ones the policy admits now (their rows' values: the
        shows and clicks some carry are the policy's)."""
        stats = grads[:, self.dim:] if self.counted else None
        grads = self.values(grads)
        if self.policy is None or keys.size == 0:
            return keys, grads, vnodes, counts
        new = ~self.rows.stored(vnodes, counts, keys)
        if not new.any():
            return keys, grads, vnodes, counts
        keep = np.ones(keys.shape[0], bool)
        keep[new] = self.policy.admit(keys[new], self.now, stats[new]) if stats is not None else \
            self.policy.admit(keys[new], self.now)
        admitted = int(keep[new].sum())
        self.stats.admitted += admitted
        self.stats.refused += int(new.sum()) - admitted
        return subset(keep, keys, grads, vnodes, counts)

    def touched(self, vnodes: np.ndarray, counts: np.ndarray, keys: np.ndarray, time: float | None) -> None:
        """A push was applied: stamp its keys with this epoch and its time."""
        t = self.now if time is None else float(time)
        self.now = max(self.now, t)
        self.rows.touch(vnodes, counts, keys, self.epoch, t, self.spec.half_life)

    def loaded(self, vnode: int, keys: np.ndarray) -> None:
        """Rows set whole (a copy installed, a restore): changed now, seen now."""
        vt = self.rows.hash_vnodes.get(vnode)
        if vt is not None and vt.life is not None and keys.size:
            life = np.zeros((keys.shape[0], self.rows.life_width), np.float32)
            touched_life(life, self.epoch, self.now, self.spec.scored)
            vt.set_life(keys, life)

    # ---- eviction --------------------------------------------------------------------------
    def cap(self, primary: np.ndarray) -> int:
        """Keys this server may hold as primary under the table's caps (0: no cap): its
        share of the cap, as its share of the vnodes."""
        spec, n = self.spec, self.rows.n_vnodes
        fraction = float(primary.sum()) / n
        caps = []
        if spec.cap_keys:
            caps.append(spec.cap_keys * fraction)
        if spec.cap_bytes:  # arrays sized for the keys kept, with the room a sweep leaves them (``sweep``)
            slot = 8 + 4 * self.rows.width + 4 * self.rows.life_width
            caps.append(spec.cap_bytes * fraction / slot * MAX_LOAD * (1 - CAP_SLACK))
        return max(1, int(min(caps))) if caps else 0

    def due(self, primary: np.ndarray) -> bool:
        """Whether a sweep should run now (after a push)."""
        spec = self.spec
        if not spec.evicts:
            return False
        period = min(p for p in (spec.ttl, spec.half_life if spec.min_score else 0.0) if p) / SWEEPS_PER_TTL \
            if (spec.ttl or spec.min_score) else 0.0
        if period and self.now - self.last_sweep >= period:
            return True
        cap = self.cap(primary)
        return bool(cap) and (sum(len(vt) for v, vt in self.rows.hash_vnodes.items() if primary[v]) > cap
                              or self._over_bytes(primary))

    def _over_bytes(self, primary: np.ndarray) -> bool:
        """Whether the arrays of the vnodes this server is primary of take more than its
        share of ``cap_bytes`` (their slots grew past what the keys need)."""
        if not self.spec.cap_bytes:
            return False
        share = self.spec.cap_bytes * float(primary.sum()) / self.rows.n_vnodes
        return bool(sum(vt.nbytes for v, vt in self.rows.hash_vnodes.items() if primary[v]) > share)

    def sweep(self, primary: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """Evict, from the vnodes this server is primary of, what the lifecycle says: keys
        past their TTL or below the score, then, over the cap, the least recently (or
        frequently) pushed of all of them, down to ``1 - CAP_SLACK`` of it.  The keys
        evicted, per vnode (to forward to the backups).  Read from the life rows in
        place; the keys are removed in place (``VnodeTable.remove``)."""
        self.last_sweep = self.now
        self.stats.sweeps += 1
        mine = [(v, vt) for v, vt in self.rows.hash_vnodes.items() if primary[v] and len(vt)]
        slots = [_slots(vt) for _, vt in mine]  # per vnode: occupied, life rows (the last: key 0's)
        drops, ranks = zip(*[self._expired(occupied, life) for occupied, life in slots]) if mine else ((), ())
        cap = self.cap(primary)
        if cap and mine:
            self._over_cap(list(drops), list(ranks), cap)
        out = []
        for (v, vt), drop in zip(mine, drops, strict=True):
            where = np.flatnonzero(drop)
            if where.size:
                keys = np.where(where == vt.capacity, np.uint64(0), vt.keys[np.minimum(where, vt.capacity - 1)])
                self._remove(v, keys)
                out.append((v, keys))
        if out:
            self._buried(np.concatenate([k for _, k in out]), sum(len(vt) for _, vt in mine))
        if self._over_bytes(primary):  # slots grown past the keys: every vnode sized for what it keeps
            for v, vt in mine:
                self.rows.keep(v, np.ones(len(vt), bool), room=self._room(len(vt)))
        if out:
            release_memory()  # the heap's free pages (arrays outgrown, rebuilt) go back to the system
        return out

    def _remove(self, vnode: int, keys: np.ndarray) -> int:
        """Remove ``keys`` from ``vnode`` in place; a vnode left far emptier than its arrays
        (under ``SHRINK_LOAD``) is rebuilt smaller, so its memory is given back."""
        vt = self.rows.hash_vnodes[vnode]
        removed = vt.remove(keys)
        capped = self.spec.cap_keys or self.spec.cap_bytes  # sized for its share, grown slots are given back
        if vt.capacity > 64 and len(vt) < (CAPPED_SHRINK_LOAD if capped else SHRINK_LOAD) * vt.capacity:
            self.rows.keep(vnode, np.ones(len(vt), bool), room=self._room(len(vt)))
        return removed

    def _room(self, kept: int) -> int:
        """Keys a vnode rebuilt with ``kept`` keys has room for: under a cap, as many as it
        may grow back to before the next sweep (primary and copies alike)."""
        return int(kept / (1 - CAP_SLACK)) + 1 if self.spec.cap_keys or self.spec.cap_bytes else kept

    def _expired(self, occupied: np.ndarray, life: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Which slots (their life rows) hold keys past their TTL or below the score, and
        each slot's rank for a cap (lower goes first: the stamp, or with ``lfu`` the decayed
        score; empty slots never)."""
        spec, now = self.spec, np.float32(self.now)
        drop = np.zeros(occupied.shape[0], bool)
        if spec.ttl:
            drop |= life[:, STAMP] < now - np.float32(spec.ttl)
        rank = life[:, STAMP]
        if spec.half_life:
            score = life[:, SCORE] * np.exp2(-(now - life[:, STAMP]) / np.float32(spec.half_life))
            if spec.min_score:
                drop |= score < spec.min_score
            if spec.victim == "lfu":
                rank = score
        drop &= occupied
        return drop, np.where(occupied, rank, np.inf)

    def _over_cap(self, drops: list[np.ndarray], ranks: list[np.ndarray], cap: int) -> None:
        """Mark, in ``drops``, the lowest-ranked keys of all the vnodes (not yet dropped)
        beyond ``(1 - CAP_SLACK)`` of ``cap``."""
        drop, rank = np.concatenate(drops), np.concatenate(ranks)
        alive = int(np.isfinite(rank).sum()) - int(drop.sum())
        over = alive - cap
        if over <= 0:
            return
        excess = min(over + int(cap * CAP_SLACK), alive)
        rank = np.where(drop, -np.inf, rank)
        drop[np.argpartition(rank, excess - 1)[:excess]] = True
        ends = np.cumsum([d.size for d in drops])
        for i, part in enumerate(np.split(drop, ends[:-1])):
            drops[i][:] = part

    def evict(self, vnode: int, keys: np.ndarray) -> int:
        """Drop ``keys`` of ``vnode`` (a backup, as its primary said); how many were held.
        A backup keeps no tombstones: after a failover the ring changed, and every delta
        starts from a base."""
        vt = self.rows.hash_vnodes.get(vnode)
        if vt is None or not len(vt) or not keys.size:
            return 0
        removed = self._remove(vnode, keys)
        self.stats.evicted += removed
        return removed

    def _buried(self, keys: np.ndarray, held: int) -> None:
        """Keep ``keys`` as this epoch's tombstones, at most ``TOMBSTONES_PER_KEY`` of the
        keys ``held`` here (and ``TOMBSTONE_MIN``): older ones go, and a token older than
        those kept gets a base."""
        self.stats.evicted += int(keys.size)
        self.tombstones.append((self.epoch, keys))
        self.tomb_keys += int(keys.size)
        limit = max(TOMBSTONE_MIN, int(held * TOMBSTONES_PER_KEY))
        while self.tomb_keys > limit and self.tombstones:
            epoch, old = self.tombstones.pop(0)
            self.tomb_keys -= int(old.size)
            self.floor = epoch + 1

    # ---- delta export ----------------------------------------------------------------------
    def delta(self, primary: np.ndarray, since: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
        """Keys (primary here) changed at epoch >= ``since`` with their values, the keys
        evicted since, and whether that is whole (False: ``since`` predates the tombstones
        kept, or the delta outweighs the table); then a new epoch starts.  ``since`` 0:
        every key."""
        dim = self.dim
        parts, deleted, whole = self.changes(primary, since)
        keys = np.concatenate([k for _, k, _ in parts]) if parts else np.zeros(0, np.uint64)
        values = np.concatenate([r[:, :dim] for _, _, r in parts]) if parts else np.zeros((0, dim), np.float32)
        return keys, np.ascontiguousarray(values), deleted, whole

    def changes(self, primary: np.ndarray, since: int) -> tuple[list[tuple[int, np.ndarray, np.ndarray]],
                                                                   np.ndarray, bool]:
        """Per vnode this server is primary of, the keys changed at epoch >= ``since`` and
        their whole rows (values and state: an incremental checkpoint's); the keys evicted
        since; whether that is whole; then a new epoch starts."""
        parts = []
        for tier in (self.rows.hash_vnodes, self.rows.cold_vnodes):  # a tiered table's rows on disk too
            for v, vt in tier.items():
                if primary[v] and len(vt):
                    keys, rows = vt.changed(VER, float(since)) if since else vt.items()
                    parts.append((v, keys, rows))
        changed = sum(k.size for _, k, _ in parts)
        tombs = [k for e, k in self.tombstones if e >= since] if since else []
        deleted = np.zeros(0, np.uint64)
        if tombs:  # a key evicted, then pushed again since, is a change, not a deletion
            kept = np.concatenate([k for _, k, _ in parts]) if parts else deleted
            deleted = np.setdiff1d(np.concatenate(tombs), kept)
        held = sum(len(vt) for tier in (self.rows.hash_vnodes, self.rows.cold_vnodes)
                   for v, vt in tier.items() if primary[v])
        # a delta larger than the table (or missing tombstones it needs) is worth less than a base
        row = 8 + 4 * self.dim
        whole = since == 0 or (since >= self.floor and changed * row + deleted.size * 8 <= held * row)
        self.epoch += 1
        release_memory()
        return parts, deleted, whole

    @property
    def nbytes(self) -> int:
        """Memory the lifecycle holds besides the life rows: the policy's, the tombstones."""
        return (self.policy.nbytes if self.policy is not None else 0) + 8 * self.tomb_keys

    def figures(self) -> dict[str, float]:
        s = self.stats
        return {"admitted": s.admitted, "refused": s.refused, "evicted": s.evicted, "sweeps": s.sweeps,
                "epoch": self.epoch, "now": self.now, "tombstones": self.tomb_keys,
                "tombstone_bytes": 8 * self.tomb_keys,
                "policy_bytes": self.policy.nbytes if self.policy is not None else 0}


def subset(keep: np.ndarray, keys: np.ndarray, grads: np.ndarray, vnodes: np.ndarray,
           counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The keys of a push ``keep`` marks, with their rows, its vnode segments recounted."""
    if keep.all():
        return keys, grads, vnodes, counts
    segment = np.repeat(np.arange(counts.shape[0]), counts)
    return keys[keep], grads[keep], vnodes, np.bincount(segment[keep], minlength=counts.shape[0]).astype(np.int64)


def _slots(vt: LifeVnode) -> tuple[np.ndarray, np.ndarray]:
    """A hash vnode's slots as a sweep reads them: which hold a key, and the life rows
    (both ``capacity + 1`` long, the last being key 0's), without copying the rows."""
    keys, life = vt.keys, vt.life
    assert life is not None, "a lifecycle's vnodes have life rows"
    occupied = np.empty(keys.shape[0] + 1, bool)
    np.not_equal(keys, 0, out=occupied[:-1])
    occupied[-1] = vt.has_zero
    return occupied, life


def release_memory() -> None:
    """Give the C heap's free pages back to the system (glibc's ``malloc_trim``), so the
    RSS follows the arrays an eviction freed; nothing where there is no glibc."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def life_width(lifecycle: Lifecycle | None) -> int:
    """Columns of a life row: none without a lifecycle, 3 with a score, else 2."""
    if not lifecycle:
        return 0
    return 3 if lifecycle.scored else 2


def touched_life(life: np.ndarray, epoch: float, time: float, scored: bool) -> None:
    """Life rows of keys set whole (a restore, a copy installed): changed now, seen now."""
    life[:, VER] = epoch
    life[:, STAMP] = time
    if scored:
        life[:, SCORE] = np.maximum(life[:, SCORE], 1.0)
