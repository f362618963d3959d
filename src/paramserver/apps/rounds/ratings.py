"""Rating triples ``user item rating`` for ``paramserver mf``, read whole.

Accepted, one rating a line, extra fields (a timestamp) ignored:

- MovieLens ``u.data`` TSV: ``user<TAB>item<TAB>rating<TAB>ts`` (ml-100k);
- MovieLens CSV with a header: ``userId,movieId,rating,timestamp`` (the ml-latest
  releases, ml-20m, ml-25m, ml-32m);
- MovieLens ``::`` files: ``UserID::MovieID::Rating::Timestamp`` (ml-1m, ml-10m);
- any of these gz/bz2/xz compressed (by extension), local or an fsspec URL.

- the same lines with names for ids (Amazon's ratings files, ``A2SUAM1J3GNN3B,0132793040,5.0,…``),
  as Surprise takes raw ids.

Ids are whole numbers (any, not necessarily dense) or, where the first data line's are not
(or pass 18 digits), names: a column is one or the other file-wide, and a name is its
bytes' 64-bit FNV-1a hash, its text kept for ``--save``.  Ratings are real numbers.  The
first line may be a header (it is skipped if its third field, the rating, is not a
number); any other line that is not ``id, id, number`` is an error naming the file, the
line and the fix.  Parsing is one numba pass over the bytes, GIL released.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
from numba import njit

from paramserver.apps.rounds.fields import line_end, split_fields
from paramserver.apps.rounds.ratings_lines import _SEPS, parse_names, parse_numbers
from paramserver.data.reader import DataError
from paramserver.data.whole import bad_line, read_whole

_SPLIT, _VISIBLE = re.compile(rb"[\t, :\r]+"), re.compile(rb"\S")


@njit(nogil=True, cache=True)
def _spans(buf, start, rows, column):  # type: ignore[no-untyped-def]
    """Where field ``column`` of each data line in ``rows`` (ascending) starts and ends."""
    out = np.empty((rows.shape[0], 2), np.int64)
    bounds = np.empty(2 * (column + 1), np.int64)
    n, pos, k = 0, start, 0
    while k < rows.shape[0]:
        end = line_end(buf, pos)
        if split_fields(buf, pos, end, _SEPS, bounds, column + 1) > 0:
            if n == rows[k]:
                out[k, 0], out[k, 1] = bounds[2 * column], bounds[2 * column + 1]
                k += 1
            n += 1
        pos = end + 1
    return out


@dataclass(frozen=True)
class Ratings:
    """Parallel arrays, in file order: ids (as in the file, or a name's hash), ratings as
    float32; for a column of names, each distinct hash's name in the hashes' sorted order
    (``distinct_ids``'), else None."""

    users: np.ndarray  # int64[n]
    items: np.ndarray  # int64[n]
    ratings: np.ndarray  # float32[n]
    user_names: np.ndarray | None = None  # str[distinct users]
    item_names: np.ndarray | None = None
    #: a column's ``distinct_ids``, where reading its names found them already
    found: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict, compare=False, repr=False)

    @property
    def named(self) -> tuple[bool, bool]:
        return self.user_names is not None, self.item_names is not None

    def distinct(self, col: int) -> tuple[np.ndarray, np.ndarray]:
        """``distinct_ids`` of the users (``col`` 0) or the items (1), sorted once."""
        if col not in self.found:
            self.found[col] = distinct_ids(self.users if col == 0 else self.items)
        return self.found[col]

    def __len__(self) -> int:
        return int(self.ratings.shape[0])


def read_ratings(path: str, named: tuple[bool, bool] | None = None) -> Ratings:
    """Read ``path`` whole (see the module's doc for the formats).  ``named``: whether the user
    and the item ids are names (a test file is read as its training file was); default: as
    the first data line says.

    Raises:
        DataError: a missing or empty file, or a malformed line (file and line named).
    """
    raw, buf = read_whole(path)
    start, first = _header_end(raw)
    if named is None:
        named = (not _is_int(first[0]), not _is_int(first[1])) if len(first) >= 3 else (False, False)
    lines = raw.count(b"\n", start)  # memchr's speed, and no array of a byte a byte to count over
    # the ratings parsed straight into float32 (each rounded as ``astype`` rounds it): no copy of 3.6 M
    # of them, whose fresh pages cost more than the parse's time at MovieLens' sizes
    users, items, ratings = np.empty(lines, np.int64), np.empty(lines, np.int64), np.empty(lines, np.float32)
    n, err, at = (parse_names(buf, start, users, items, ratings, *named) if any(named) else
                  parse_numbers(buf, start, users, items, ratings))
    if err:
        raise bad_line(path, raw, buf, at, err, "each line must be 'user item rating [timestamp]' (MovieLens "
                       "u.data, ratings.csv or ratings.dat; ids are whole numbers, or names in a file whose first "
                       "line has names); fix or remove the line")
    if n == 0:
        raise DataError(f"{path} has no ratings; expected lines 'user item rating [timestamp]' (tab, comma or "
                        "'::' separated, an optional header first)")
    if n < lines:  # blank lines: let the tail go
        users, items, ratings = users[:n].copy(), items[:n].copy(), ratings[:n].copy()
    got = Ratings(users, items, ratings)
    user_names, item_names = (_names(raw, buf, start, *got.distinct(col), col) if named[col] else None
                              for col in (0, 1))
    return Ratings(users, items, ratings, user_names, item_names, got.found)


def _is_int(field: bytes) -> bool:
    """Whether a first line's id reads as a whole number (``parse_int``'s: 18 digits at most)."""
    digits = field.lstrip(b"+-")
    return digits.isdigit() and len(digits) <= 18


def _header_end(raw: bytes) -> tuple[int, list[bytes]]:
    """Where the data lines start (after a header: a first line whose rating, its third field,
    is not a number, as ``userId,movieId,rating,timestamp``), and the first data line's fields."""
    first = _VISIBLE.search(raw)  # not len(raw.lstrip()): a copy of the whole file
    start = first.start() if first else len(raw)
    end = raw.find(b"\n", start)
    fields = _fields(raw[start:end if end >= 0 else len(raw)])
    if len(fields) >= 3 and not _is_number(fields[2]):  # a header
        if end < 0:
            return len(raw), []
        start = end + 1
        end = raw.find(b"\n", start)
        fields = _fields(raw[start:end if end >= 0 else len(raw)])
    return start, fields


def _fields(line: bytes) -> list[bytes]:
    return _SPLIT.split(line.strip(b"\t, :\r"))


def _is_number(field: bytes) -> bool:
    try:
        float(field)
    except ValueError:
        return False
    return True


def _names(raw: bytes, buf: np.ndarray, start: int, found: np.ndarray, inverse: np.ndarray, col: int) -> np.ndarray:
    """The name of each distinct hash ``found`` (column ``col``; ``inverse``: each line's index
    among them), in the hashes' sorted order."""
    first = _first_lines(inverse, found.size)
    order = np.argsort(first, kind="stable")  # first[order] is sorted: spans[j] belongs to order[j]
    spans = _spans(buf, start, first[order], col)
    width = max(int((spans[:, 1] - spans[:, 0]).max()), 1)
    cells: np.ndarray = _cells(buf, spans, width)
    if (cells < 128).all():  # ASCII, the usual case: numpy widens the bytes to text in one pass
        text = cells.view(f"S{width}").reshape(-1).astype(f"U{width}")
    else:
        text = np.array([raw[a:b].decode("utf-8", "replace") for a, b in spans.tolist()])
    out: np.ndarray = np.empty_like(text)
    out[order] = text
    return out


@njit(nogil=True, cache=True)
def _first_lines(inverse, k):  # type: ignore[no-untyped-def]
    """The first data line of each of the ``k`` distinct ids."""
    first = np.full(k, -1, np.int64)
    for i in range(inverse.shape[0]):
        if first[inverse[i]] < 0:
            first[inverse[i]] = i
    return first


@njit(nogil=True, cache=True)
def _cells(buf, spans, width):  # type: ignore[no-untyped-def]
    """Each span's bytes in a row of ``width`` (zero-padded)."""
    out = np.zeros((spans.shape[0], width), np.uint8)
    for j in range(spans.shape[0]):
        for k in range(spans[j, 0], spans[j, 1]):
            out[j, k - spans[j, 0]] = buf[k]
    return out


def distinct_ids(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(ids, return_inverse=True)``: the distinct ids, sorted, and each id's
    index among them.  Ids that are small non-negative integers (MovieLens', a dense
    numbering) are found by marking them in an array as long as the largest: 0.01 s for
    3.6 M ids against 0.6 s to sort them; others (sparse or negative) are sorted."""
    lo, hi = _bounds(ids) if ids.size else (-1, -1)
    if lo < 0 or hi >= max(4 * ids.size, 1 << 20):
        found, inverse = np.unique(ids, return_inverse=True)
        return found, inverse.reshape(-1)
    return _marked(ids, hi)  # type: ignore[no-any-return]


@njit(nogil=True, cache=True)
def _bounds(ids):  # type: ignore[no-untyped-def]
    """(least, largest) of a non-empty ``ids``, in one pass."""
    lo = hi = ids[0]
    for x in ids:
        lo, hi = min(lo, x), max(hi, x)
    return int(lo), int(hi)


@njit(nogil=True, cache=True)
def _marked(ids, hi):  # type: ignore[no-untyped-def]
    """``distinct_ids`` of ids in ``[0, hi]``: each marked in an array of ``hi + 1`` flags, the
    marked numbered in order, then each id looked up (numpy's three passes of fancy indexing
    took 0.077 s for 3.6 M ids on this VM, these 0.025 s).  Only the marked ids' numbers are
    written: a sparse numbering touches few of its pages."""
    present = np.zeros(hi + 1, np.bool_)
    k = 0
    for x in ids:
        if not present[x]:
            present[x] = True
            k += 1
    found = np.empty(k, ids.dtype)
    index = np.empty(hi + 1, np.intp)
    k = 0
    for v in range(hi + 1):
        if present[v]:
            index[v] = k
            found[k] = v
            k += 1
    inverse = np.empty(ids.shape[0], np.intp)
    for j in range(ids.shape[0]):
        inverse[j] = index[ids[j]]
    return found, inverse

