"""What training data is read as: a format, a shard of files, a batch of examples.

``DataFormat`` says how lines parse (which format, how keys fold, how labels read,
what to do with a bad line); a ``Shard`` is the byte range of a file one reader reads;
a ``Batch`` is examples in CSR form (labels, row pointers, keys, values), and
``slice_batch``/``concat_batches`` cut and join batches without a per-row loop.  The reader
(``reader.py``), the per-format parsers (``parsers.py``) and the trainers all speak in
these, so they live apart from any of them.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import numpy as np

from paramserver.data import parse
from paramserver.errors import ConfigError, ParamServerError
from paramserver.routing.dedup import unique_inverse
from paramserver.wire.step_arrays import NO_VALUES

FORMATS = ("criteo", "libsvm", "avazu", "csv")
STDIN = "-"  # --data -: standard input
CHANGED_FILES = ("fail", "skip")  # --changed-files: a stream's file changed after it was taken


class DataError(ParamServerError):
    """Training data cannot be read: missing, empty, or a malformed line."""


@dataclass(frozen=True)
class FileStamp:
    """A file as a stream took it: its size and modification time (seconds), and where its
    filesystem says them its inode and device (local) or ETag (an object store); 0 and ""
    are "not known", and are not compared."""

    size: int
    mtime: float = 0.0
    ino: int = 0
    dev: int = 0
    etag: str = ""

    def to_wire(self) -> dict[str, Any]:
        return {"size": self.size, **{k: v for k, v in (("mtime", self.mtime), ("ino", self.ino), ("dev", self.dev),
                                                         ("etag", self.etag)) if v}}

    @classmethod
    def from_wire(cls, w: Any) -> FileStamp:
        if not isinstance(w, dict) or not isinstance(w.get("size"), int):
            raise DataError(f"a shard's file stamp must be a map with its size, got {w!r}")
        return cls(int(w["size"]), float(w.get("mtime", 0.0)), int(w.get("ino", 0)), int(w.get("dev", 0)),
                   str(w.get("etag", "")))

    def changes(self, now: FileStamp | None) -> str:
        """How the file is no longer the one taken, said in a few words ("": it is)."""
        if now is None:
            return "it is gone (deleted, or moved away)"
        if any(a and b and a != b for a, b in ((self.ino, now.ino), (self.dev, now.dev), (self.etag, now.etag))):
            return "it was replaced: another file has its name"
        if now.size > self.size:
            return f"it grew by {now.size - self.size:,} bytes (appended to, or rewritten)"
        if now.size < self.size:
            return f"it shrank by {self.size - now.size:,} bytes (truncated, or rewritten)"
        if self.mtime and now.mtime and self.mtime != now.mtime:
            return "it was rewritten in place (its size is the same, its modification time is not)"
        return ""

    def describe(self) -> str:
        """``4,088,895 bytes, modified 2026-11-28 19:14:03.731 UTC``."""
        when = dt.datetime.fromtimestamp(self.mtime, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] \
            if self.mtime else "?"
        return f"{self.size:,} bytes, modified {when} UTC"


@dataclass(frozen=True)
class Shard:
    """The lines of ``path`` whose first byte lies in ``[start, end)``; or, cut from a
    stream by a source plug-in (``source``, ``module:Class``, see ``streams.py``), the
    entries ``span`` names in the source's own words (``start`` and ``end`` unused).
    ``stamp``: the file as a stream took it (a folder's), checked when the shard is read."""

    path: str
    start: int
    end: int  # -1: to the end of the file
    span: str = ""  # a stream's entries, as its source says them (e.g. Redis ids "(FIRST LAST")
    source: str = ""  # the source plug-in that reads them ("": a file)
    stamp: FileStamp | None = None  # the file when taken (None: not checked, a --data file's)

    def to_wire(self) -> list[Any]:
        if self.stamp is not None:
            return [self.path, self.start, self.end, self.span, self.source, self.stamp.to_wire()]
        return [self.path, self.start, self.end, self.span, self.source] if self.source else \
            [self.path, self.start, self.end]

    @classmethod
    def from_wire(cls, w: list[Any]) -> Shard:
        """A shard as ``to_wire`` wrote it, or as earlier versions did (3 or 5 items, no stamp)."""
        if len(w) == 6:
            return cls(str(w[0]), int(w[1]), int(w[2]), str(w[3]), str(w[4]), FileStamp.from_wire(w[5]))
        if len(w) == 5:
            return cls(str(w[0]), int(w[1]), int(w[2]), str(w[3]), str(w[4]))
        return cls(str(w[0]), int(w[1]), int(w[2]))

    def where(self) -> str:
        """The shard as an error names it."""
        return f"{self.path} (entries {self.span})" if self.source else self.path

    def taken_bytes(self) -> int:
        """The bytes of the file this shard covers (its stamp's size bounds an open end)."""
        end = self.end if self.end >= 0 else (self.stamp.size if self.stamp is not None else self.start)
        return max(0, end - self.start)


class Batch:
    """Examples in CSR form: ``labels`` float32[n], ``indptr`` int64[n + 1], ``keys``
    uint64[nnz] and ``vals`` float32[nnz].

    ``ones``: every value is 1, as the parser that made the batch knows (a CTR row's
    features): a step then sends none without reading them (``values``), and ``vals`` may be
    given as None, made only if something reads it (the default job's steps never do: its
    4·10^7 ones, made, re-cut by the ramp and dropped, cost its worker ~0.03 s).  False: not
    known, read to see."""

    __slots__ = ("labels", "indptr", "keys", "_vals", "ones")

    def __init__(self, labels: np.ndarray, indptr: np.ndarray, keys: np.ndarray, vals: np.ndarray | None,
                 ones: bool = False):
        if vals is None and not ones:
            raise ValueError("a batch's values may be left out (None) only where every one is 1 (ones=True)")
        self.labels, self.indptr, self.keys, self._vals, self.ones = labels, indptr, keys, vals, ones

    @property
    def vals(self) -> np.ndarray:
        """The values (made on first read where they were left out: all ones)."""
        if self._vals is None:
            self._vals = np.ones(self.keys.shape[0], np.float32)
        return self._vals

    @property
    def held_vals(self) -> np.ndarray | None:
        """The values as held: None where left out (all ones, none made yet)."""
        return self._vals

    def values(self) -> np.ndarray:
        """``vals``, or none at all (an empty array: every value 1, as a step's arithmetic
        takes it) where the batch is known to be all ones."""
        return NO_VALUES if self.ones else self.vals

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def unique(self, expect: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """The batch's distinct keys and, per key occurrence, its index among them
        (``expect``: about how many distinct keys there are, e.g. the last batch's count).

        A CTR batch repeats keys a lot (bias, missing values, frequent categories:
        40 000 occurrences are ~7 600 distinct keys in a Criteo-like batch of 1 000), so
        models pull and push distinct keys only.
        """
        pair: tuple[np.ndarray, np.ndarray] = unique_inverse(self.keys, expect)
        return pair


@dataclass(frozen=True)
class DataFormat:
    """How to parse: format name, hash bits (0 = full 64), LIBSVM label encoding."""

    name: str = "criteo"
    hash_bits: int = 24  # the CLI's default: 2^24 buckets (a dense table of 256 MiB for LR)
    label_format: str = "01"
    skip_bad: bool = False
    cache_dir: str = ""  # parsed shards are kept here and reused by later epochs
    label_column: str = ""  # csv: the 0/1 label's column (avazu: click)
    ignore_columns: tuple[str, ...] = ()  # csv/avazu: columns that are not features (avazu: id too)
    numeric_columns: tuple[str, ...] = ()  # csv/avazu: columns of numbers, bucketed by size (as Criteo's integers)
    unlabeled: bool = False  # criteo/libsvm lines without a label (to predict; see sniff_unlabeled)
    max_bad_fraction: float = 0.01  # with skip_bad: more malformed lines than this fails the job
    changed_files: str = "fail"  # a stream's file changed after it was taken: fail, or skip what is left of it

    def __post_init__(self) -> None:
        if self.name not in FORMATS:
            raise ConfigError(f"--format must be one of {FORMATS}, got {self.name!r}")
        if not 0 <= self.hash_bits <= 64:
            raise ConfigError(f"--hash-bits must be in [0, 64] (0: no folding), got {self.hash_bits}")
        if self.changed_files not in CHANGED_FILES:
            raise ConfigError(f"--changed-files must be one of {CHANGED_FILES}, got {self.changed_files!r}")
        if not 0 <= self.max_bad_fraction <= 1:
            raise ConfigError(f"--max-bad-fraction must be in [0, 1], got {self.max_bad_fraction}")
        if self.label_column and self.name not in ("csv", "avazu"):
            raise ConfigError(f"--label names a CSV column; --format {self.name} has its label in a fixed place")
        object.__setattr__(self, "ignore_columns", tuple(self.ignore_columns))  # a list from JSON
        object.__setattr__(self, "numeric_columns", tuple(self.numeric_columns))
        if self.numeric_columns and self.name not in ("csv", "avazu"):
            raise ConfigError(f"--numeric-columns names CSV columns; --format {self.name} has its own fields "
                              "(criteo's 13 integer fields are numeric already)")
        if self.label_format not in parse.LABEL_FORMATS:
            raise ConfigError(f"label format must be one of {sorted(parse.LABEL_FORMATS)}, "
                              f"got {self.label_format!r}")
        if self.label_format != "01" and self.name != "libsvm":
            raise ConfigError(f"--label-format {self.label_format} applies to --format libsvm; --format {self.name}'s "
                              "labels are 0/1: drop --label-format")

    @property
    def mask(self) -> np.uint64:
        return np.uint64(0 if self.hash_bits in (0, 64) else (1 << self.hash_bits) - 1)




def slice_batch(b: Batch, lo: int, hi: int) -> Batch:
    a, z = int(b.indptr[lo]), int(b.indptr[hi])
    vals = b.held_vals
    return Batch(b.labels[lo:hi], b.indptr[lo: hi + 1] - a, b.keys[a:z], None if vals is None else vals[a:z], b.ones)


def concat_batches(batches: list[Batch]) -> Batch:
    if len(batches) == 1:
        return batches[0]
    offsets = np.cumsum([0] + [int(b.indptr[-1]) for b in batches[:-1]])
    indptr = np.concatenate([batches[0].indptr[:1]] + [b.indptr[1:] + o for b, o in zip(batches, offsets)])
    ones = all(b.ones for b in batches)
    vals = None if ones and any(b.held_vals is None for b in batches) else np.concatenate([b.vals for b in batches])
    return Batch(np.concatenate([b.labels for b in batches]), indptr,
                 np.concatenate([b.keys for b in batches]), vals, ones)


_slice, _concat = slice_batch, concat_batches  # the reader's spellings (inside data/)
