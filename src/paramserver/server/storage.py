"""A server's tables to and from files and exports: the rows of the vnodes it is primary
of (one copy of each vnode cluster-wide), and restores under the current ring.

No sockets: ``ServerNode`` answers ``EXPORT``, ``CHECKPOINT``, ``RESTORE`` and ``STATS``
with what these return.
"""

from __future__ import annotations

import errno
import os
from typing import Any

import numpy as np

from paramserver.checkpoint import store as checkpoint
from paramserver.errors import CheckpointError, ProtocolError, UnknownTableError
from paramserver.routing.ring import Ring
from paramserver.store.protocol import VnodeStore


def export_rows(tables: dict[str, VnodeStore], primary: np.ndarray, name: str, max_bytes: int,
                node_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Every key of table ``name`` this server is primary of, with its value (state left out)."""
    table = tables.get(name)
    if table is None:
        raise UnknownTableError(f"unknown table {name!r} (tables: {sorted(tables)})")
    if len(table) * (8 + 4 * table.spec.dim) > max_bytes - (1 << 20):
        raise ProtocolError(f"table {name!r} ({len(table)} keys on server {node_id}) is too large "
                            "to export in one message; use checkpoint() instead")
    return primary_rows(table, primary)


def primary_rows(table: VnodeStore, primary: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every key of ``table`` this server is primary of, with its value (state left out)."""
    parts = [table.rows(v) for v in table.tables if primary[v]]
    keys = np.concatenate([k for k, _ in parts]) if parts else np.zeros(0, np.uint64)
    rows = np.concatenate([r[:, : table.spec.dim] for _, r in parts]) if parts else \
        np.zeros((0, table.spec.dim), np.float32)
    return keys, np.ascontiguousarray(rows)


def write_checkpoint(tables: dict[str, VnodeStore], primary: np.ndarray, url: str,
                     since: dict[str, int] | None = None, node_id: int = -1) -> dict[str, Any]:
    """Write every stored vnode this server is primary of (keys, values and optimiser
    state) under ``url``; the manifest entries, per table and vnode.  A table with a
    lifecycle starts a new epoch, said in ``epochs``; with ``since`` (table -> this
    server's epoch at the step before: an incremental checkpoint) only its keys changed
    since then are written, and the keys evicted since (``deleted``, one file), and
    ``whole`` says, per such table, whether that is everything that changed."""
    out: dict[str, Any] = {"files": {}, "deleted": {}, "epochs": {}, "whole": {}}
    try:
        for name, table in tables.items():
            for v, keys, rows in _checkpoint_parts(table, primary, name, (since or {}).get(name), out):
                if keys.size:
                    out["files"].setdefault(name, {})[str(v)] = checkpoint.write_vnode(url, name, v, keys, rows)
            if name in out["deleted"]:
                keys = out["deleted"][name]
                out["deleted"][name] = checkpoint.write_vnode(url, name, f"deleted-{node_id}", keys,
                                                              np.zeros((keys.size, 0), np.float32))
    except OSError as exc:  # a full disk, a quota, a permission: named, and what was written goes
        written = [entry[0] for vnodes in out["files"].values() for entry in vnodes.values()]
        removed = checkpoint.remove_files(url, written)
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        raise CheckpointError(f"could not write checkpoint files under {url}: {exc.strerror or exc}"
                              + (" (the disk is full: free space there, or checkpoint elsewhere)" if full else "")
                              + f"; the {removed} file(s) this server had written for it are removed") from None
    return out


def _checkpoint_parts(table: VnodeStore, primary: np.ndarray, name: str, since: int | None,
                      out: dict[str, Any]) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """What a checkpoint writes of ``table``: per vnode this server is primary of, its
    keys and rows (those changed since ``since``, for an incremental one of a table with
    a lifecycle, whose deletions and epoch go into ``out``)."""
    if table.life is None:
        return [(v, *table.rows(v)) for v in table.tables if primary[v]]
    parts, deleted, whole = table.life.changes(primary, since or 0)
    out["epochs"][name], out["whole"][name] = table.life.epoch, whole
    if since:
        out["deleted"][name] = deleted
    return parts


def restore_rows(tables: dict[str, VnodeStore], primary: np.ndarray, ring: Ring, name: str, step: str,
                 entries: list[Any], allow_unverified: bool = False, deleted: list[Any] | None = None) -> int:
    """Load the keys this server holds under ``ring`` from a checkpoint's files (each
    checked, size, sha256 and keys, before anything is kept); the keys it is primary of.
    First-format entries (no sha256) only with ``allow_unverified``."""
    table = tables.get(name)
    if table is None:
        raise UnknownTableError(f"unknown table {name!r}: create it before restoring it")
    # every entry well-formed first
    files = [(checkpoint.entry_path(step, entry, allow_unverified), entry) for entry in entries]
    loaded = 0
    for path, entry in files:
        keys, rows = checkpoint.read_vnode(path, entry)
        if keys.ndim != 1 or rows.shape != (keys.shape[0], table.width):
            raise CheckpointError(f"{path}: rows of shape {rows.shape} do not fit table "
                                  f"{name!r}; was it saved from another table?")
        if table.bits and (keys >> np.uint64(table.bits)).any():
            raise CheckpointError(f"{path}: keys >= 2**{table.bits} do not fit the dense table "
                                  f"{name!r}; was it saved from another table?")
        vnodes = ring.vnodes(keys, table.layout)
        for v in np.unique(vnodes).tolist():
            if v in table.tables:
                mine = vnodes == v
                table.install(v, keys[mine], rows[mine], replace=False)  # over the rows held, in any tier
                loaded += int(mine.sum()) if primary[v] else 0  # backups load too
    for entry in deleted or []:  # an incremental step's evictions: every copy drops them
        path = checkpoint.entry_path(step, entry, allow_unverified)
        keys, _ = checkpoint.read_vnode(path, entry)
        if table.life is None:
            raise CheckpointError(f"{path}: deletions for table {name!r}, which has no lifecycle")
        vnodes = ring.vnodes(keys, table.layout)
        for v in np.unique(vnodes).tolist():
            if v in table.tables:
                table.life.evict(v, keys[vnodes == v])
    return loaded


def table_stats(tables: dict[str, VnodeStore], primary: np.ndarray) -> dict[str, dict[str, Any]]:
    """Per table: keys and bytes stored here (rows, life rows, an admission policy's
    counts), vnodes held, keys this server is primary of, what its lifecycle did."""
    out: dict[str, dict[str, Any]] = {}
    for name, t in tables.items():
        policy = t.life.nbytes if t.life is not None else 0  # an admission policy's counts, tombstones
        out[name] = {"keys": len(t), "bytes": t.nbytes + policy, "vnodes": len(t.tables),
                     "primary_keys": primary_keys(t, primary)}
        if t.life is not None:
            out[name]["lifecycle"] = t.life.figures()
        if tiers := t.figures():
            out[name]["tiers"] = tiers
    return out


def export_delta(tables: dict[str, VnodeStore], primary: np.ndarray, name: str, since: int, max_bytes: int,
                 node_id: int, origin: int | None = None) -> tuple[list[np.ndarray], dict[str, Any]]:
    """The keys of table ``name`` this server is primary of that changed at epoch >=
    ``since``, their values and the keys evicted since (``TableLife.delta``).  ``origin``
    (the token's, None for an older token): epochs counted by another run of this table
    (a restarted or restored server, another cluster) cannot be continued, so nothing is
    exported and the answer is not whole (the client asks for a base); an epoch this run
    never reached is refused."""
    table = tables.get(name)
    if table is None:
        raise UnknownTableError(f"unknown table {name!r} (tables: {sorted(tables)})")
    if table.life is None:
        raise ProtocolError(f"table {name!r} tracks no changes: create it with a lifecycle (lifecycle='track', "
                            "or any admission or eviction) to export deltas")
    if isinstance(since, bool) or not isinstance(since, int) or since < 0:
        raise ProtocolError(f"export: since must be an epoch >= 0, got {since!r}")
    life = table.life
    if since and origin is not None and origin != life.origin:
        empty = np.zeros(0, np.uint64)
        return [empty, np.zeros((0, table.spec.dim), np.float32), empty], {"whole": False, "epoch": life.epoch,
                                                                           "origin": life.origin}
    if since > life.epoch:
        raise ProtocolError(f"the delta token names epoch {since} of table {name!r} on server {node_id}, which has "
                            f"reached epoch {life.epoch} only: the token was altered or comes from another cluster; "
                            "refused (export without --delta writes a new base, and deltas follow it)")
    keys, values, deleted, whole = life.delta(primary, since)
    if keys.nbytes + values.nbytes + deleted.nbytes > max_bytes - (1 << 20):
        raise ProtocolError(f"the delta of table {name!r} on server {node_id} ({keys.size} keys) is too large for "
                            "one message; export more often, or raise max_message_bytes")
    return [keys, values, deleted], {"whole": whole, "epoch": life.epoch, "origin": life.origin}


def rss_bytes() -> int:
    """Resident set size of this process (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def primary_keys(table: VnodeStore, primary: np.ndarray) -> int:
    """Keys of ``table`` stored in the vnodes this server is primary of."""
    return sum(table.held(v) for v in table.tables if primary[v])
