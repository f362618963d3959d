"""``serve --follow URL``: the model a training job publishes (``train --publish URL``),
kept current while it trains.

A thread reads the folder's ``PUBLISH.json`` every ``poll`` seconds.  A new base (or a
chain that is not the one being served) is loaded whole, with its deltas, into two
replicas; new deltas are read, checked against their sha256, applied to the idle
replica, which is then swapped in, and applied to the other once no request reads it:
the work is the delta's, twice, never the table's.  A part that is damaged or missing (a
half-written copy, a chain replaced under the reader) is logged and tried again at the
next poll; the model served stays the last whole one.
"""

from __future__ import annotations

import hashlib
import io
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from paramserver.checkpoint.publish import INDEX, apply_delta, read_index, read_table_folder
from paramserver.errors import CheckpointError
from paramserver.serving.model import Holder, Replica, Snapshot, apply_to, new_replica, warm, written_at
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


class Follower:
    """Keeps ``holder`` at the newest model published under ``url`` (``start``, ``stop``;
    ``poll_once`` does one look, for tests)."""

    def __init__(self, url: str, holder: Holder, stats: Stats, poll_s: float = 1.0) -> None:
        self.url, self.holder, self.stats, self.poll_s = url.rstrip("/"), holder, stats, poll_s
        self.base: Part | None = None
        self.applied: list[Part] = []
        self.replicas: list[Replica] = []  # [serving, idle] once a base is loaded
        self.last_error = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="paramserver-serve-follow", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        waiting_logged = False
        while not self._stop.is_set():
            try:
                found = self.poll_once()
                self.last_error = ""
                if not found and not waiting_logged:
                    logger.info("nothing is published under %s yet: waiting for it", self.url)
                    waiting_logged = True
            except (CheckpointError, OSError, ValueError, KeyError, TypeError) as exc:
                message = str(exc) if isinstance(exc, CheckpointError) else f"{type(exc).__name__}: {exc}"
                if message != self.last_error:
                    logger.warning("%s: %s; still serving %s, trying again in %g s", self.url, message,
                                   self.holder.current.version if self.holder.current else "no model", self.poll_s)
                self.last_error = message
                self.stats.follow_errors += 1
            self._stop.wait(self.poll_s)

    def poll_once(self) -> bool:
        """Read the index and bring the model up to it; False while nothing is published.
        Raises what was wrong with a part after applying the whole ones before it."""
        index = read_index(self.url)
        if index is None or not index.get("parts"):
            return False
        base, *deltas = index["parts"]
        chain = [(str(p["path"]), str(p["sha256"])) for p in deltas]
        if self.base != (str(base["path"]), str(base["sha256"])) or chain[:len(self.applied)] != self.applied:
            self._load_chain(index)
            return True
        new = deltas[len(self.applied):]
        if new:
            read, error = self._read_deltas(new)
            if read:
                self._apply(read, index)
            if error is not None:
                raise error
        return True

    def _load_chain(self, index: dict[str, Any]) -> None:
        """A new base and its deltas, into two fresh replicas, swapped in."""
        t0 = time.perf_counter()
        base, *deltas = index["parts"]
        folder = f"{self.url}/{base['path']}"
        if _digest(f"{folder}/table.npz") != base["sha256"]:
            raise CheckpointError(f"{folder}/table.npz does not match its sha256 in {INDEX}: damaged or half "
                                  "written")
        meta, keys, values, dense = read_table_folder(folder)
        read, error = self._read_deltas(deltas)
        for d in read:
            keys, values = apply_delta(keys, values, d.keys, d.values, d.deleted)
            dense = d.dense if d.dense is not None else dense
        replicas = [new_replica(meta, keys, values, dense), new_replica(meta, keys, values, dense)]
        for replica in replicas:
            warm(replica)
        last = read[-1].part if read else base
        self.holder.swap(_snapshot(self.url, replicas[0], last, index, len(read) == len(deltas)))
        self.replicas = replicas
        self.base = (str(base["path"]), str(base["sha256"]))
        self.applied = [(str(d.part["path"]), str(d.part["sha256"])) for d in read]
        self.stats.bases_loaded += 1
        self.stats.last_swap_s = time.perf_counter() - t0
        logger.info("serving %s (%d keys) from %s", last["path"], keys.shape[0], self.url)
        if error is not None:
            raise error

    def _read_deltas(self, parts: list[dict[str, Any]]) -> tuple[list[Delta], CheckpointError | None]:
        """The parts read and checked, up to the first that is not whole, and what was wrong with it."""
        out: list[Delta] = []
        for part in parts:
            path = f"{self.url}/{part['path']}/delta.npz"
            try:
                body = _read(path)
                if hashlib.sha256(body).hexdigest() != part["sha256"]:
                    raise CheckpointError(f"{path} does not match its sha256 in {INDEX}: damaged or half written")
                d = np.load(io.BytesIO(body))
                out.append(Delta(part, d["keys"], d["values"], d["deleted"], d["dense"] if "dense" in d.files
                                 else None))
            except FileNotFoundError:
                return out, CheckpointError(f"{path} is missing (the chain was replaced, or a copy is partial)")
            except CheckpointError as exc:
                return out, exc
            except (OSError, ValueError, KeyError) as exc:
                return out, CheckpointError(f"{path} is damaged ({exc})")
        return out, None

    def _apply(self, deltas: list[Delta], index: dict[str, Any]) -> None:
        """``deltas`` into the idle replica, swapped in, then into the other (once idle)."""
        t0 = time.perf_counter()
        serving, idle = self.replicas
        for d in deltas:
            apply_to(idle, d.keys, d.values, d.deleted, d.dense)
        last = deltas[-1].part
        self.holder.swap(_snapshot(self.url, idle, last, index, last is index["parts"][-1]))  # waits: serving idle
        self.stats.last_swap_s = time.perf_counter() - t0
        for d in deltas:
            apply_to(serving, d.keys, d.values, d.deleted, d.dense)
        self.replicas = [idle, serving]
        self.applied += [(str(d.part["path"]), str(d.part["sha256"])) for d in deltas]
        self.stats.deltas_applied += len(deltas)
        logger.info("serving %s (%d delta(s) applied in %.3f s)", last["path"], len(deltas), self.stats.last_swap_s)


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


def _read(path: str) -> bytes:
    import fsspec

    with fsspec.open(path, "rb") as f:
        body: bytes = f.read()
    return body


def _digest(path: str) -> str:
    return hashlib.sha256(_read(path)).hexdigest()
