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

from paramserver.apps.rounds.fields import line_end, separators, split_fields
from paramserver.data.parse import bytes_hash, parse_float, parse_int
from paramserver.data.reader import DataError
from paramserver.data.whole import bad_line, read_whole

_SEPS = separators(b"\t, :\r")  # tab, comma, space, colon (the '::' files), CR
_SPLIT, _VISIBLE = re.compile(rb"[\t, :\r]+"), re.compile(rb"\S")
_KIND = ("a column holds numbers or names throughout, as its first data line says; a test file's, as its training "
         "file's)")


@njit(inline="always", nogil=True, cache=True)
def _id(buf, a, b, named):  # type: ignore[no-untyped-def]
    """(ok, the id) of a field: its whole number, or with ``named`` its bytes' FNV-1a hash."""
    if named:
        return True, np.int64(bytes_hash(buf, a, b))
    return parse_int(buf, a, b)


@njit(inline="always", nogil=True, cache=True)
def _separators_in(buf, a, b):  # type: ignore[no-untyped-def]
    """The separators the run ``buf[a:b]`` between two fields holds: a tab or comma each, a
    '::' one (spaces and CR none).  More than one is an empty field: '1<tab>2<tab><tab>0'
    would read the timestamp as the rating."""
    n, colons = 0, 0
    for j in range(a, b):
        c = buf[j]
        if c == 9 or c == 44:
            n += 1
        elif c == 58:
            colons += 1
    return n + (colons + 1) // 2


@njit(nogil=True, cache=True)
def _parse_numbers(buf, start, users, items, ratings):  # type: ignore[no-untyped-def]
    """``_parse`` of a file whose ids are all numbers, compiled apart: no test a field (it cost
    9 % of the parse: 4 M MovieLens-like lines, 0.193 s against 0.177)."""
    return _parse(buf, start, users, items, ratings, False, False)


@njit(nogil=True, cache=True)
def _parse_names(buf, start, users, items, ratings, named_users, named_items):  # type: ignore[no-untyped-def]
    return _parse(buf, start, users, items, ratings, named_users, named_items)


@njit(inline="always", nogil=True, cache=True)
def _parse(buf, start, users, items, ratings, named_users, named_items):  # type: ignore[no-untyped-def]
    """Lines from ``start`` → triples, a column of names hashed (``named_*``).  Returns ``(n,
    what is wrong or "", its line's offset)``; ``buf`` ends with a newline; blank lines are skipped."""
    n, pos, size = 0, start, buf.shape[0]
    bounds = np.empty(6, np.int64)
    while pos < size:
        end = line_end(buf, pos)
        fields = split_fields(buf, pos, end, _SEPS, bounds, 3)
        if fields == 0:
            pos = end + 1
            continue
        if fields < 3:
            return (n, "expected at least 3 fields (user, item, rating) separated by tabs, commas, spaces or '::'",
                    pos)
        if (bounds[0] > pos or bounds[2] - bounds[1] > 1 or bounds[4] - bounds[3] > 1) and (  # a run of one: fine
                _separators_in(buf, pos, bounds[0]) or _separators_in(buf, bounds[1], bounds[2]) > 1
                or _separators_in(buf, bounds[3], bounds[4]) > 1):
            return (n, "a field of the first three (user, item, rating) is empty (two separators in a row, or one "
                    "that starts the line)", pos)
        ok, u = _id(buf, bounds[0], bounds[1], named_users)
        if not ok:
            return (n, "the user id (first field) is not a whole number below 10^18, as the column's first is ("
                    + _KIND, pos)
        ok, i = _id(buf, bounds[2], bounds[3], named_items)
        if not ok:
            return (n, "the item id (second field) is not a whole number below 10^18, as the column's first is ("
                    + _KIND, pos)
        ok, r = parse_float(buf, bounds[4], bounds[5])
        if not ok or not np.isfinite(r):
            return n, "the rating (third field) is not a finite number", pos
        users[n] = u
        items[n] = i
        ratings[n] = r
        n += 1
        pos = end + 1
    return n, "", -1


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
    n, err, at = (_parse_names(buf, start, users, items, ratings, *named) if any(named) else
                  _parse_numbers(buf, start, users, items, ratings))
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
    lo, hi = (int(ids.min()), int(ids.max())) if ids.size else (-1, -1)
    if lo < 0 or hi >= max(4 * ids.size, 1 << 20):
        found, inverse = np.unique(ids, return_inverse=True)
        return found, inverse.reshape(-1)
    present = np.zeros(hi + 1, np.bool_)
    present[ids] = True
    found = np.flatnonzero(present).astype(ids.dtype)
    index = np.empty(present.size, np.intp)
    index[found] = np.arange(found.size)
    return found, index[ids]

