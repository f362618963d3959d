"""Arrays on local disk, for a table's cold tier (``tiers.py``): each one a file mapped
into memory, laid out as the hot tier's arrays are, so the same loops read and write both.

A file is created in the server's cold directory, its blocks reserved at once
(``posix_fallocate``: a full disk is an ``OSError`` here, where the caller can keep its
rows, never a ``SIGBUS`` at a later write through the mapping), mapped shared and
unlinked: its blocks go back to the disk when the array is dropped, or when the process
dies, whatever way it dies.

The kernel keeps the pages read or written in its page cache, reclaimable, and writes
dirty ones back under pressure: a cgroup's memory limit reclaims them rather than kill
the process.  Pages mapped in count in a process's resident set (``RssFile``), so the
tiers call ``release`` once their moves may have touched ``RELEASE_BYTES`` of pages (a
page a row moved): the pages are unmapped from the process, stay cached, and the next
touch maps one back in without I/O.
"""

from __future__ import annotations

import errno
import functools
import itertools
import mmap
import os
import threading
import weakref
from typing import Any

import numpy as np

from paramserver._runtime.pages import MADVISE
from paramserver.errors import ConfigError

#: cold bytes read or written between two releases of the mapped pages (``DiskArena.release``)
RELEASE_BYTES = 256 << 20
MADV_DONTNEED = 4  # <sys/mman.h>

_names = itertools.count()


def default_cold_dir() -> str:
    """Where cold rows go without ``--cold-dir``: under ``$TMPDIR``, else ``/var/tmp``
    (which, unlike ``/tmp`` on many systems, is a disk)."""
    return os.path.join(os.environ.get("TMPDIR") or "/var/tmp", "paramserver-cold")


def usable_cold_dir(directory: str) -> str:
    """``directory`` made if absent and writable (``ConfigError`` naming ``--cold-dir`` otherwise)."""
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cold directory {directory!r} cannot be created ({exc.strerror}): give a writable "
                          "local directory with --cold-dir") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ConfigError(f"cold directory {directory!r} is not writable by this user: give a writable local "
                          "directory with --cold-dir")
    return directory


class DiskFullError(OSError):
    """The cold directory has no room for a cold array: the rows stay in memory."""


class DiskArena:
    """Where a table's cold arrays are made: files in ``directory`` (created if absent).

    Args:
        directory: a local directory (not tmpfs: its pages would be memory).
        label: names the files (for ``ls`` while they are open, before the unlink).
    """

    def __init__(self, directory: str, label: str) -> None:
        self.directory = usable_cold_dir(directory)
        self.label = label.replace("/", "_")
        self._arrays: dict[int, weakref.ref[np.ndarray]] = {}  # the live arrays (``release`` walks them)
        self._lock = threading.RLock()  # an array may die (``_dropped``) while it is held
        self.nbytes = 0  # bytes of the arrays made and not yet dropped (their files' blocks)

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype[Any] | type) -> np.ndarray:
        """A zeroed array on disk (``DiskFullError`` when the disk has no room for it)."""
        nbytes = max(1, int(np.prod(shape)) * np.dtype(dtype).itemsize)
        path = os.path.join(self.directory, f"{self.label}.{os.getpid()}.{next(_names)}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.unlink(path)
            try:
                os.posix_fallocate(fd, 0, nbytes)
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise DiskFullError(exc.errno, f"the cold directory {self.directory!r} has no room for "
                                        f"{nbytes:,} more bytes of cold rows ({exc.strerror}): free space there, "
                                        "give another with --cold-dir, or raise the table's memory budget") from None
                os.ftruncate(fd, nbytes)  # a filesystem without fallocate: sparse, as before
            area = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        array = np.frombuffer(area, np.uint8, nbytes)  # holds the mapping (closing the descriptor did not)
        out = array[:int(np.prod(shape)) * np.dtype(dtype).itemsize].view(dtype).reshape(shape)
        with self._lock:
            self._arrays[id(out)] = weakref.ref(out, functools.partial(self._dropped, id(out), nbytes))
            self.nbytes += nbytes
        return out

    def _dropped(self, key: int, nbytes: int, _ref: Any) -> None:
        with self._lock:
            self._arrays.pop(key, None)
            self.nbytes -= nbytes

    def release(self) -> None:
        """Unmap the cold pages from this process (they stay in the page cache, dirty or not)."""
        with self._lock:
            arrays = [a for r in self._arrays.values() if (a := r()) is not None]
        for a in arrays:
            address = a.ctypes.data
            start = address - address % mmap.PAGESIZE
            if MADVISE is not None:
                MADVISE(start, address + a.nbytes - start, MADV_DONTNEED)
