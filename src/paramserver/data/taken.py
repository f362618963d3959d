"""The files a stream took (``--stream FOLDER``), checked when they are read.

A folder's file is cut into shards when it is taken, and the workers read the shards
later.  Its ``FileStamp`` (``batch.py``: size, modification time, inode and device, or an
object store's ETag) travels in each shard; ``open_taken`` opens the file only if it is
still that file, else raises ``FileChangedError`` naming the file, what was taken, what is
there now and the fix.  Without it a file replaced in between was read as a mixture of the
two, and rows appended were dropped without a word (issue 43, items 12-14).
"""

from __future__ import annotations

import datetime as dt
import os
from typing import IO, Any

from paramserver.data.batch import DataError, FileStamp
from paramserver.data.files import fsspec_filesystem, is_plain_local, open_input

#: what ``--changed-files skip`` says when a file's shards are skipped
FIX = ("restore the file as it was taken and resume, or pass --changed-files skip to skip what is left of it "
       "(the file, its shards and bytes are counted in the report)")


class FileChangedError(DataError):
    """A file a stream took is no longer the one taken: replaced, grown, shrunk, rewritten
    or gone (``what``); ``taken`` and ``now`` are its stamps (``now`` None: gone)."""

    def __init__(self, path: str, taken: FileStamp, now: FileStamp | None, what: str) -> None:
        there = now.describe() if now is not None else "nothing"
        super().__init__(f"{path} changed after the stream took it: {what} (taken: {taken.describe()}; now: "
                         f"{there}); its rows not yet read would be another file's, or lost: {FIX}")
        self.path, self.taken, self.now, self.what = path, taken, now, what


def stamp_of_stat(st: os.stat_result) -> FileStamp:
    return FileStamp(int(st.st_size), float(st.st_mtime), int(st.st_ino), int(st.st_dev))


def _seconds(value: Any) -> float:
    """A modification time as fsspec's filesystems give it (seconds, a datetime, ISO text)."""
    if isinstance(value, dt.datetime):
        return value.timestamp()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return 0.0
    return 0.0


def stamp_from_info(info: dict[str, Any]) -> FileStamp:
    """The stamp of a file from what an fsspec ``ls``/``info`` says of it."""
    mtime = next((info[k] for k in ("mtime", "LastModified", "last_modified", "updated", "created")
                  if info.get(k) is not None), None)
    etag = next((str(info[k]) for k in ("ETag", "etag", "md5Hash", "generation", "VersionId") if info.get(k)), "")
    return FileStamp(int(info.get("size") or 0), _seconds(mtime), int(info.get("ino") or 0), 0, etag.strip('"'))


def stamp_of(path: str) -> FileStamp | None:
    """``path``'s stamp now (None: there is no such file)."""
    if "://" not in path:
        try:
            return stamp_of_stat(os.stat(os.path.expanduser(path)))
        except FileNotFoundError:
            return None
    fs, p = fsspec_filesystem(path)
    try:
        return stamp_from_info(fs.info(p))
    except FileNotFoundError:
        return None


def check_taken(path: str, taken: FileStamp) -> None:
    """Raise ``FileChangedError`` if ``path`` is no longer the file ``taken`` describes."""
    now = stamp_of(path)
    if what := taken.changes(now):
        raise FileChangedError(path, taken, now, what)


def open_taken(path: str, taken: FileStamp) -> IO[bytes]:
    """``path`` opened for reading if it is still the file ``taken`` describes (a local
    file: the one opened, by ``fstat``, so a rename after the check cannot slip in)."""
    if not is_plain_local(path):
        check_taken(path, taken)
        return open_input(path)
    try:
        f = open(os.path.expanduser(path), "rb")
    except FileNotFoundError:
        raise FileChangedError(path, taken, None, taken.changes(None)) from None
    now = stamp_of_stat(os.fstat(f.fileno()))
    if what := taken.changes(now):
        f.close()
        raise FileChangedError(path, taken, now, what)
    return f
