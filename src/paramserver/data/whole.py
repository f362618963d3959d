"""A text file read whole into bytes for a numba parser, and the error that names a bad
line of it: the shared first and last steps of the whole-file readers (``matrix``,
``ratings``, ``corpus``)."""

from __future__ import annotations

import os

import fsspec
import numpy as np

from paramserver.data.files import check_compressed_name, compressed_as, reading
from paramserver.data.reader import BOM, DataError, _check_exists
from paramserver.store.memory import available_memory

NL = 10


def read_whole(path: str) -> tuple[bytes, np.ndarray]:
    """``path`` (gz/bz2/xz by extension or by its first bytes, any fsspec URL) as bytes
    ending in a newline, and a uint8 view of them.

    Raises:
        DataError: the file is missing or empty, or binary (a NUL byte in its first MiB).
    """
    _check_exists(path)
    if "://" not in os.fspath(path):
        check_compressed_name(path)
    with fsspec.open(path, "rb", compression="infer") as f, reading(path):
        raw = f.read()
    raw = _uncompressed(path, raw).removeprefix(BOM)  # a UTF-8 byte-order mark is no part of the first line
    nul = raw.find(b"\x00", 0, 1 << 20)
    if nul >= 0:
        raise DataError(f"{path} holds NUL bytes (the first at byte {nul:,}): it is binary, not text (a .npz, an "
                        "image, a truncated archive?); give the text file")
    if not raw.endswith(b"\n"):
        raw += b"\n"
    return raw, np.frombuffer(raw, np.uint8)


def _uncompressed(path: str, raw: bytes) -> bytes:
    """``raw`` decompressed when its first bytes say gzip, bz2 or xz (a ``.gz`` file renamed
    ``.txt``: ``files.compressed_as``), else as it is.

    Raises:
        DataError: it starts as compressed data but does not decompress whole."""
    import bz2
    import gzip
    import lzma

    if (compressed := compressed_as(raw)) is None:
        return raw
    kind = compressed[0]
    try:
        return bytes({"gzip": gzip.decompress, "bz2": bz2.decompress, "xz": lzma.decompress}[kind](raw))
    except (OSError, EOFError, ValueError, lzma.LZMAError) as exc:
        raise DataError(f"{path} starts as {kind} data but does not decompress ({exc}): a truncated or damaged "
                        "file; give it whole") from None


def check_fits(where: str, count: int, each: int, fix: str) -> None:
    """Refuse ``count`` things of ``each`` bytes (a column for every feature index up to the
    largest, a row for every word id) that would not fit in this machine's free memory, as
    ``where`` (the file, and the line or header that asks for them) says; else the arrays'
    allocation fails with a bare MemoryError."""
    free = available_memory()
    if free and count * each > free:
        raise DataError(f"{where}: that takes about {count * each / 2**30:,.1f} GiB, and this machine has "
                        f"{free / 2**30:,.1f} GiB free; {fix}")


def bad_line(path: str, raw: bytes, buf: np.ndarray, at: int, what: str, fix: str) -> DataError:
    """The error for the line that starts at byte ``at``: ``path:line: what: 'text'; fix``."""
    line = int(np.count_nonzero(buf[:at] == NL)) + 1
    text = raw[at:raw.index(b"\n", at)][:120].decode("utf-8", "replace")
    return DataError(f"{path}:{line}: {what}: {text!r}; {fix}")
