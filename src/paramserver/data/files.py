"""Where data and output files are opened: local paths with ``os``, URLs and compressed
files through fsspec.

fsspec takes 0.05 s to import (asyncio among its imports): a job on local files does not
load it before its first example.  ``LocalFiles`` answers the few filesystem calls the
checks and writers make (``exists``, ``isdir``, ``size``, ``makedirs``, ``open``, ``rm``,
``ls``) as fsspec's filesystems do, so those callers have one body for both.
"""

from __future__ import annotations

import os
from typing import IO

COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".lz4")
# what fsspec infers a compression from (and zstd, lz4 where their packages are installed)
_INFERRED = (*COMPRESSED, ".zip", ".lzma")


def is_plain_local(path: str) -> bool:
    """A local file that needs no fsspec: no URL, no compression."""
    path = os.fspath(path)  # a pathlib.Path too
    return "://" not in path and not path.endswith(_INFERRED)


def open_input(path: str) -> IO[bytes]:
    """``path`` opened for reading bytes, decompressed by its extension (fsspec's
    ``compression="infer"``)."""
    if is_plain_local(path):
        return open(os.path.expanduser(os.fspath(path)), "rb")
    import fsspec

    return fsspec.open(path, "rb", compression="infer").open()


class LocalFiles:
    """The calls of an fsspec filesystem that checking and writing files makes, with ``os``."""

    exists = staticmethod(os.path.exists)
    isdir = staticmethod(os.path.isdir)
    size = staticmethod(os.path.getsize)
    rm = staticmethod(os.remove)
    open = staticmethod(open)

    @staticmethod
    def makedirs(path: str, exist_ok: bool = False) -> None:
        os.makedirs(path, exist_ok=exist_ok)

    @staticmethod
    def ls(path: str, detail: bool = False) -> list[str]:
        return [os.path.join(path, name) for name in sorted(os.listdir(path))]


def local_files(path: str) -> tuple[LocalFiles, str] | None:
    """``(LocalFiles(), the path)`` for a local path (no URL; ``~`` expanded), else None:
    the caller gets fsspec's filesystem for it."""
    path = os.fspath(path)
    return (LocalFiles(), os.path.expanduser(path)) if "://" not in path else None
