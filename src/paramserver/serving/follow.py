"""``serve --follow URL``: the model a training job publishes (``train --publish URL``),
kept current while it trains.

A thread reads the folder's ``PUBLISH.json`` every ``poll`` seconds.  A new base (or a
chain that is not the one being served) is loaded whole, with its deltas, into two
replicas; new deltas are read, checked against their sha256 and against the model (keys
inside its hash space, rows of its width), applied to the idle replica, which is then
swapped in, and applied to the other once no request reads it: the work is the delta's,
twice, never the table's.

A follower that cannot follow says so and serves the last whole model meanwhile.  Any
error of a poll (a damaged or missing part, a part that does not fit the model, an index
that goes back, a bug) is caught, logged once per distinct message, counted
(``follow_errors``) and tried again at the next poll; ``Stats.follow_*`` tell ``/readyz``
and ``/metrics`` whether the loop lives and when it last succeeded.  A replica is never
served half written: a delta is checked whole before any of it is applied, and a replica
an apply failed on is dropped, the chain loaded afresh into new replicas at the next poll.
The sequence numbers served only go forward: an index whose newest part is older than
the one served (a stale copy of ``PUBLISH.json``, a restored backup) is refused unless
the service was started with ``allow_rollback`` (``serve --allow-rollback``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from paramserver.checkpoint.publish import INDEX, apply_delta, parse_base, parse_delta, read_index, read_part
from paramserver.errors import CheckpointError, ConfigError
from paramserver.serving.loading import warm
from paramserver.serving.model import Holder, Replica, Snapshot, apply_to, new_replica, written_at
from paramserver.serving.stats import Stats

logger = logging.getLogger(__name__)

Part = tuple[str, str]  # (path, sha256): a part of the chain as the index names it


@dataclass
class Delta:
    """A delta part, read and checked."""

    part: dict[str, Any]
    keys: np.ndarray
    values: np.ndarray
    deleted: np.ndarray
    dense: np.ndarray | None


@dataclass(frozen=True)
class Shape:
    """What a delta must fit: the model's hash bits (0: keys not folded), its rows' width
    and its MLP's size (None: no MLP)."""

    hash_bits: int
    dim: int
    dense: int | None


def followable(url: str) -> None:
    """Refuse a local ``--follow`` that can never be published into, which the loop would
    wait on for ever: a file, or a model ``train --save`` wrote (its ``model.json`` and no
    ``PUBLISH.json``).  A folder not there yet, or empty, is waited for (a job may publish
    into it later); a URL with another scheme is the poll's to read."""
    path = url[len("file://"):] if url.startswith("file://") else url
    if "://" in path:
        return
    if os.path.isfile(path):
        raise ConfigError(f"--follow {url}: a file, not a folder; --follow takes the folder a job publishes "
                          f"into (train --publish DIR writes DIR/{INDEX} and its parts), and a model train "
                          "--save wrote is served with --model DIR")
    if os.path.isfile(os.path.join(path, "model.json")) and not os.path.exists(os.path.join(path, INDEX)):
        raise ConfigError(f"--follow {url}: a model train --save wrote (model.json), which is never published "
                          f"into (no {INDEX}); serve it with --model {url} (loaded once), or --follow the folder a "
                          "job publishes into (train --publish DIR)")


class Follower:
    """Keeps ``holder`` at the newest model published under ``url`` (``start``, ``stop``;
    ``poll_once`` does one look, for tests)."""

    def __init__(self, url: str, holder: Holder, stats: Stats, poll_s: float = 1.0,
                 allow_rollback: bool = False) -> None:
        self.url, self.holder, self.stats, self.poll_s = url.rstrip("/"), holder, stats, poll_s
        self.allow_rollback = allow_rollback
        self.base: Part | None = None
        self.applied: list[Part] = []
        self.replicas: list[Replica] = []  # [serving, idle] once a base is loaded
        self.seq, self.served = 0, ("", "")  # the newest part served: its number, (path, sha256)
        self.last_error = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.stats.follow_url = self.url  # following from now: readiness asks whether the loop lives
        self.stats.follow_alive = True  # ... and must not see a loop that has not begun as dead
        self._thread = threading.Thread(target=self._run, name="paramserver-serve-follow", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        waiting_logged = False
        self.stats.follow_alive = True
        try:
            while not self._stop.is_set():
                try:
                    found = self.poll_once()
                except Exception as exc:  # noqa: BLE001 - any failure: said, counted, tried again; never the loop's end
                    self._failed(exc)
                else:
                    self.last_error = self.stats.follow_last_error = ""
                    self.stats.follow_last_ok_at = time.time()
                    if not found and not waiting_logged:
                        logger.info("nothing is published under %s yet: waiting for it", self.url)
                        waiting_logged = True
                self._stop.wait(self.poll_s)
        finally:
            self.stats.follow_alive = False

    def _failed(self, exc: Exception) -> None:
        known = isinstance(exc, (CheckpointError, OSError, ValueError, KeyError, TypeError))
        message = str(exc) if isinstance(exc, CheckpointError) else f"{type(exc).__name__}: {exc}"
        if message != self.last_error:
            current = self.holder.current
            logger.warning("%s: %s; still serving %s, trying again every %g s", self.url, message,
                           current.version if current else "no model", self.poll_s, exc_info=not known)
        self.last_error = self.stats.follow_last_error = message
        self.stats.follow_errors += 1

    def _settle(self, error: CheckpointError | None) -> None:
        """What this poll found wrong with its parts (None: nothing), said before the model
        they make is swapped in: ``/readyz`` never shows the model a poll brings beside the
        failure it ended (the loop itself clears the failure only once the poll returns).  A
        failure after the swap is said by ``_failed``, as ever."""
        self.stats.follow_last_error = "" if error is None else str(error)

    def poll_once(self) -> bool:
        """Read the index and bring the model up to it; False while nothing is published.
        Raises what was wrong with a part after applying the whole ones before it."""
        index = read_index(self.url)
        if index is None or not index.get("parts"):
            return False
        base, *deltas = index["parts"]
        chain = [(str(p["path"]), str(p["sha256"])) for p in deltas]
        same = self.base == (str(base["path"]), str(base["sha256"])) and chain[:len(self.applied)] == self.applied
        last = index["parts"][-1]
        newest = int(last["seq"])
        back = newest < self.seq or (newest == self.seq and (str(last["path"]), str(last["sha256"])) != self.served)
        if back and not same and not self.allow_rollback:
            raise CheckpointError(f"{INDEX} now ends at seq {newest} ({index['parts'][-1]['path']}), not after the "
                                  f"seq {self.seq} served: an older or replaced index, refused (serve "
                                  "--allow-rollback to follow it back)")
        if not same or not self.replicas:
            self._load_chain(index)
            return True
        new = deltas[len(self.applied):]
        if new:
            read, error = self._read_deltas(new, _shape(self.replicas[0]))
            if read:
                self._apply(read, index, error)
            if error is not None:
                raise error
        return True

    def _load_chain(self, index: dict[str, Any]) -> None:
        """A new base and its deltas, into two fresh replicas, swapped in."""
        t0 = time.perf_counter()
        base, *deltas = index["parts"]
        meta, keys, values, dense = parse_base(f"{self.url}/{base['path']}", read_part(self.url, base))
        if not isinstance(meta, dict) or not {"model", "data", "table"} <= set(meta):
            raise CheckpointError(f"{self.url}/{base['path']} holds a table, not a model (its model.json is missing "
                                  "or lacks the model): serve follows what paramserver train --publish writes")
        shape = Shape(int(meta["data"].get("hash_bits", 0)), int(meta["table"]["dim"]),
                      None if dense is None else int(np.asarray(dense).size))
        if values.ndim != 2 or values.shape[1] < shape.dim or values.shape[0] != keys.shape[0]:
            raise CheckpointError(f"{self.url}/{base['path']}: its values of shape {values.shape} do not fit "
                                  f"{keys.shape[0]} keys of dim {shape.dim}: damaged")
        read, error = self._read_deltas(deltas, shape)
        for d in read:
            keys, values = apply_delta(keys, values, d.keys, d.values, d.deleted)
            dense = d.dense if d.dense is not None else dense
        replicas = [new_replica(meta, keys, values, dense), new_replica(meta, keys, values, dense)]
        for replica in replicas:
            warm(replica)
        last = read[-1].part if read else base
        self._settle(error)
        self.holder.swap(_snapshot(self.url, replicas[0], last, index, len(read) == len(deltas)))
        self.replicas = replicas
        self.base = (str(base["path"]), str(base["sha256"]))
        self.applied = [(str(d.part["path"]), str(d.part["sha256"])) for d in read]
        self.seq, self.served = int(last["seq"]), (str(last["path"]), str(last["sha256"]))
        self.stats.bases_loaded += 1
        self.stats.last_swap_s = time.perf_counter() - t0
        logger.info("serving %s (%d keys) from %s", last["path"], keys.shape[0], self.url)
        if error is not None:
            raise error

    def _read_deltas(self, parts: list[dict[str, Any]], shape: Shape) -> tuple[list[Delta], CheckpointError | None]:
        """The parts read and checked whole (files, then fit), up to the first that is
        not, and what was wrong with it."""
        out: list[Delta] = []
        for part in parts:
            where = f"{self.url}/{part['path']}"
            try:
                keys, values, deleted, dense = parse_delta(where, read_part(self.url, part))
                out.append(_fitted(where, Delta(part, keys, values, deleted, dense), shape))
            except CheckpointError as exc:
                return out, exc
        return out, None

    def _apply(self, deltas: list[Delta], index: dict[str, Any], error: CheckpointError | None = None) -> None:
        """``deltas`` into the idle replica, swapped in, then into the other (once idle);
        ``error``: what was wrong with the part after them, if anything.  Should anything
        fail on the way, both replicas are dropped: the next poll loads the chain afresh
        rather than serve or patch a replica written in part."""
        t0 = time.perf_counter()
        serving, idle = self.replicas
        try:
            for d in deltas:
                apply_to(idle, d.keys, d.values, d.deleted, d.dense)
            last = deltas[-1].part
            self._settle(error)
            self.holder.swap(_snapshot(self.url, idle, last, index, last is index["parts"][-1]))  # waits: serving idle
            self.stats.last_swap_s = time.perf_counter() - t0
            for d in deltas:
                apply_to(serving, d.keys, d.values, d.deleted, d.dense)
        except BaseException:
            self.replicas, self.base, self.applied = [], None, []
            raise
        self.replicas = [idle, serving]
        self.applied += [(str(d.part["path"]), str(d.part["sha256"])) for d in deltas]
        self.seq, self.served = int(last["seq"]), (str(last["path"]), str(last["sha256"]))
        self.stats.deltas_applied += len(deltas)
        logger.info("serving %s (%d delta(s) applied in %.3f s)", last["path"], len(deltas), self.stats.last_swap_s)


def _shape(replica: Replica) -> Shape:
    return Shape(replica.data.hash_bits, replica.table.dim, None if replica.dense is None else replica.dense.size)


def _fitted(where: str, d: Delta, shape: Shape) -> Delta:
    """``d`` with its arrays as the model takes them, or ``CheckpointError`` saying how it
    does not fit the model being served (nothing of it applied)."""
    keys, deleted = np.asarray(d.keys), np.asarray(d.deleted)
    for name, a in (("keys", keys), ("deleted", deleted)):
        if a.ndim != 1 or a.dtype.kind not in "ui" or (a.dtype.kind == "i" and a.size and int(a.min()) < 0):
            raise CheckpointError(f"{where}: its {name} are {a.dtype} of shape {a.shape}, not keys (whole numbers "
                                  ">= 0): not applied; the part is damaged or not a delta of this model")
    values = np.asarray(d.values)
    if values.dtype.kind != "f" or values.size % max(keys.size, 1) or (
            keys.size and values.size // keys.size < shape.dim):
        raise CheckpointError(f"{where}: its values ({values.dtype}, shape {values.shape}) are not {keys.size} rows "
                              f"of at least {shape.dim} numbers: not applied; not a delta of this model")
    if shape.hash_bits:
        top = max(int(keys.max()) if keys.size else 0, int(deleted.max()) if deleted.size else 0)
        if top >= 1 << shape.hash_bits:
            raise CheckpointError(f"{where}: key {top} lies outside the model's hash space (2^{shape.hash_bits}, "
                                  f"--hash-bits {shape.hash_bits}): not applied; was it published by another "
                                  "model's job?")
    dense = d.dense
    if dense is not None and (shape.dense is None or np.asarray(dense).size != shape.dense):
        raise CheckpointError(f"{where}: its MLP has {np.asarray(dense).size} numbers, the model's "
                              f"{shape.dense or 0}: not applied; not a delta of this model")
    return Delta(d.part, keys.astype(np.uint64), values.reshape(keys.size, -1) if keys.size else values,
                 deleted.astype(np.uint64), dense)


def _snapshot(url: str, replica: Replica, part: dict[str, Any], index: dict[str, Any], newest: bool) -> Snapshot:
    """``replica`` at ``part``: published at the index's time when it is the index's last
    part (the index records one time, its last part's), else at its file's time."""
    at = float(index.get("at") or index.get("written_at") or time.time())
    if not newest:
        at = _part_time(f"{url}/{part['path']}/{'table' if part['kind'] == 'base' else 'delta'}.npz", at)
    return Snapshot(replica, str(part["path"]), int(part["seq"]), at)


def _part_time(path: str, default: float) -> float:
    """When the file at ``path`` was written (``default`` where the filesystem does not say)."""
    at = written_at(path)
    return default if at is None else at
