"""A text file read whole into bytes for a numba parser, and the error that names a bad
line of it: the shared first and last steps of the whole-file readers (``matrix``,
``ratings``, ``corpus``)."""

from __future__ import annotations

import fsspec
import numpy as np

from paramserver.data.reader import DataError, _check_exists

NL = 10


def read_whole(path: str) -> tuple[bytes, np.ndarray]:
    """``path`` (gz/bz2/xz by extension, any fsspec URL) as bytes ending in a newline, and
    a uint8 view of them.

    Raises:
        DataError: the file is missing or empty.
    """
    _check_exists(path)
    with fsspec.open(path, "rb", compression="infer") as f:
        raw = f.read()
    if not raw.endswith(b"\n"):
        raw += b"\n"
    return raw, np.frombuffer(raw, np.uint8)


def bad_line(path: str, raw: bytes, buf: np.ndarray, at: int, what: str, fix: str) -> DataError:
    """The error for the line that starts at byte ``at``: ``path:line: what: 'text'; fix``."""
    line = int(np.count_nonzero(buf[:at] == NL)) + 1
    text = raw[at:raw.index(b"\n", at)][:120].decode("utf-8", "replace")
    return DataError(f"{path}:{line}: {what}: {text!r}; {fix}")
