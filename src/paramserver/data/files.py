"""Where data and output files are opened: local paths with ``os``, URLs and compressed
files through fsspec.

fsspec takes 0.05 s to import (asyncio among its imports): a job on local files does not
load it before its first example.  ``LocalFiles`` answers the few filesystem calls the
checks and writers make (``exists``, ``isdir``, ``size``, ``makedirs``, ``open``, ``rm``,
``ls``) as fsspec's filesystems do, so those callers have one body for both.
"""

from __future__ import annotations

import contextlib
import lzma
import os
import uuid
import zlib
from collections.abc import Iterator
from typing import IO, Any

from paramserver.errors import ConfigError

COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".lz4")
#: compressed data's first bytes, what it is, and the end of a name that has it read decompressed
MAGIC = ((b"\x1f\x8b", "gzip", ".gz"), (b"BZh", "bz2", ".bz2"), (b"\xfd7zXZ\x00", "xz", ".xz"))
# what fsspec infers a compression from (and zstd, lz4 where their packages are installed)
_INFERRED = (*COMPRESSED, ".zip", ".lzma")


def compressed_as(head: bytes) -> tuple[str, str] | None:
    """The compression a file's first bytes ``head`` say (gzip, bz2, xz) and the suffix that
    names it, or None: what a file whose name does not say so holds."""
    for magic, kind, suffix in MAGIC:
        if head.startswith(magic):
            return kind, suffix
    return None


def is_plain_local(path: str) -> bool:
    """A local file that needs no fsspec: no URL, no compression."""
    path = os.fspath(path)  # a pathlib.Path too
    return "://" not in path and not path.endswith(_INFERRED)


def open_input(path: str) -> IO[bytes]:
    """``path`` opened for reading bytes, decompressed by its extension (fsspec's
    ``compression="infer"``); a local file whose name says gzip, bz2 or xz and whose first
    bytes do not is refused by name (a plain file named ``.gz``), not at its first read."""
    if is_plain_local(path):
        return open(os.path.expanduser(os.fspath(path)), "rb")
    if "://" not in os.fspath(path):
        check_compressed_name(path)
    import fsspec

    opened: IO[bytes] = fsspec.open(path, "rb", compression="infer").open()
    return opened


@contextlib.contextmanager
def reading(path: str | os.PathLike[str], offset: int | None = None) -> Iterator[None]:
    """The reads of ``path`` in the block, a damaged compressed file (or a failing read)
    named as a ``DataError`` that says what to do, not a bare zlib, lzma, bz2 or EOF
    traceback; ``offset``: the bytes of content read before the block, if known."""
    try:
        yield
    except (EOFError, zlib.error, lzma.LZMAError, OSError) as exc:
        from paramserver.data.batch import DataError

        if isinstance(exc, OSError) and exc.errno is not None:  # the file system's, not a decompressor's
            raise DataError(f"{os.fspath(path)}: cannot read it ({exc.strerror or exc}); check the file and the "
                            "disk or store it is on") from None
        at = f" (after {offset:,} bytes of content)" if offset is not None else ""
        raise DataError(f"{os.fspath(path)}: cannot decompress it{at} ({exc}); is the file whole (an interrupted "
                        "download or copy?) and really in the format its name says?") from None


def check_compressed_name(path: str | os.PathLike[str]) -> None:
    """Refuse a local file named as compressed data (``MAGIC``'s) that does not start as it:
    a plain file named ``.gz`` (or gzip named ``.xz``) fails at its first read otherwise,
    with the decompressor's words and no file name."""
    path = os.fspath(path)
    for magic, kind, suffix in MAGIC:
        if path.endswith(suffix):
            with open(os.path.expanduser(path), "rb") as f:
                head = f.read(16)
            if head and not head.startswith(magic):
                from paramserver.data.batch import DataError

                found = compressed_as(head)
                said = f"{found[0]} data" if found else f"{head!r}, not {kind} data"
                raise DataError(f"{path}: its name ends in {suffix} but it starts as {said}; rename it to what it "
                                f"holds (without {suffix} if it is plain text), or compress it with {kind}")
            return


def fsspec_filesystem(path: str) -> tuple[Any, str]:
    """The fsspec filesystem of ``path`` and its path there; a missing driver (s3fs for
    s3://, gcsfs for gs://, ...) is a one-line error naming the package."""
    import fsspec

    from paramserver.data.batch import DataError

    try:
        found: tuple[Any, str] = fsspec.core.url_to_fs(path)  # no glob expansion here (get_fs_token_paths would)
        return found
    except ImportError as exc:
        raise DataError(f"{path}: {exc} (pip install it, or copy the data to a local path)") from None
    except ValueError as exc:  # an unknown protocol
        raise DataError(f"{path}: {exc}") from None


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


def filesystem(url: str, flag: str) -> tuple[Any, str]:
    """``LocalFiles`` for a local path (no fsspec before a job's first example), else fsspec's
    filesystem; a missing fsspec driver is a one-line error naming the flag."""
    if (local := local_files(url)) is not None:
        return local
    import fsspec

    try:
        found: tuple[Any, str] = fsspec.core.url_to_fs(url)
        return found
    except ImportError as exc:
        raise ConfigError(f"{flag} {url}: {exc} (pip install it, or write to a local path)") from None
    except ValueError as exc:
        raise ConfigError(f"{flag} {url}: {exc}") from None


def check_output(url: str | None, flag: str, folder: bool) -> None:
    """Fail now, in one line, if ``url`` cannot be written: a missing fsspec driver, a file
    where a folder is needed (or the reverse), a folder that cannot be made or written."""
    if url is None:
        return
    if not url:
        raise ConfigError(f"{flag} needs a path or URL, got an empty string")
    fs, path = filesystem(url, flag)
    if folder:
        if fs.exists(path) and not fs.isdir(path):
            raise ConfigError(f"{flag} {url} is a file; name a folder (it is created if missing)")
        probe = f"{path.rstrip('/')}/.paramserver-write-test-{uuid.uuid4().hex}"
    else:
        if fs.exists(path) and fs.isdir(path):
            raise ConfigError(f"{flag} {url} is a folder; name a file")
        parent = path.rsplit("/", 1)[0] if "/" in path.rstrip("/") else "."
        probe = f"{parent}/.paramserver-write-test-{uuid.uuid4().hex}"
    try:
        fs.makedirs(probe.rsplit("/", 1)[0], exist_ok=True)
        with fs.open(probe, "wb") as f:
            f.write(b"")
        fs.rm(probe)
    except (OSError, PermissionError) as exc:
        raise ConfigError(f"{flag} {url} cannot be written ({exc}); pick a writable "
                          f"{'folder' if folder else 'file'}") from None


def report_json(report: Any, indent: int | None = None) -> str:
    """A report as JSON that every parser reads: a NaN or infinite figure (the AUC of a test
    set of one class, the loss of an empty one) as null, where ``json.dumps`` writes the
    JavaScript words ``NaN`` and ``Infinity`` that JSON has not."""
    import json
    import math

    def finite(value: Any) -> Any:
        if isinstance(value, float):
            return value if math.isfinite(value) else None
        if isinstance(value, dict):
            return {k: finite(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [finite(v) for v in value]
        return value

    return json.dumps(finite(report), indent=indent, default=str, allow_nan=False)


def write_text(url: str, text: str) -> None:
    """``text`` into ``url`` whole (a local file through a rename; an object in one put)."""
    fs, path = filesystem(url, "output")
    if isinstance(fs, LocalFiles):
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
        return
    with fs.open(path, "w") as f:
        f.write(text)
