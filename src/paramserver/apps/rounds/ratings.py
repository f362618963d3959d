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

import math
import re
from dataclasses import dataclass, field

import numpy as np
from numba import njit

from paramserver.apps.rounds.fields import NL, line_end, separators, split_fields
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


#: what a plain line's byte is (``_plain_line``): 1 a single separator (tab, comma, space), 2 a
#: colon (of '::'), 3 a rating's end (those, CR or the newline), 0 anything else
_PLAIN = np.zeros(256, np.uint8)
_PLAIN[[9, 44, 32]] = 1
_PLAIN[58] = 2


@njit(inline="always", nogil=True, cache=True)
def _digit(c):  # type: ignore[no-untyped-def]
    """``c - '0'`` as an unsigned byte: below 10 for a decimal digit (one compare, no branch pair)."""
    return np.uint8(c - 48)


@njit(inline="always", nogil=True, cache=True)
def _whole(buf, p):  # type: ignore[no-untyped-def]
    """(value, end) of the decimal digits at ``p`` (the caller bounds how many)."""
    v = 0
    d = _digit(buf[p])
    while d < 10:
        v = v * 10 + d
        p += 1
        d = _digit(buf[p])
    return v, p


@njit(inline="always", nogil=True, cache=True)
def _one_separator(buf, p):  # type: ignore[no-untyped-def]
    """The offset just past a single separator at ``p`` that a digit follows (a tab, comma or
    space, or '::'), or -1: anything else is the general path's to read."""
    kind = _PLAIN[buf[p]]
    if kind == 1:
        p += 1
    elif kind == 2 and buf[p + 1] == 58:
        p += 2
    else:
        return -1
    return p if _digit(buf[p]) < 10 else -1


@njit(inline="always", nogil=True, cache=True)
def _plain_line(buf, pos):  # type: ignore[no-untyped-def]
    """A plain numeric line at ``pos`` read in one pass: ``digits SEP digits SEP
    digits[.digits]`` then a separator, CR or the newline, where SEP is one tab, comma or
    space, or '::' (MovieLens' u.data, ratings.csv and ratings.dat lines).  Returns
    ``(where the scan stopped, user, item, rating)``, the stop -1 for any other line (a sign,
    an exponent, a run of separators, 19 digits, a blank or bad line), which the general path
    reads.  The numbers are ``parse_int``'s and ``parse_float``'s to the bit: the same digits
    of the same fields (those ``split_fields`` gives such a line), the rating's accumulated in
    float64 and scaled by ``10.0**scale`` as ``parse_float`` does."""
    user, p = _whole(buf, pos)
    if p == pos or p - pos > 18:
        return -1, 0, 0, 0.0
    q = _one_separator(buf, p)
    if q < 0:
        return -1, 0, 0, 0.0
    item, p = _whole(buf, q)
    if p - q > 18:
        return -1, 0, 0, 0.0
    q = _one_separator(buf, p)
    if q < 0:
        return -1, 0, 0, 0.0
    mant, scale, p = 0.0, 0, q
    d = _digit(buf[p])
    while d < 10:
        mant = mant * 10.0 + d
        p += 1
        d = _digit(buf[p])
    if buf[p] == 46:  # '.'
        p += 1
        d = _digit(buf[p])
        while d < 10:
            mant = mant * 10.0 + d
            scale -= 1
            p += 1
            d = _digit(buf[p])
    c = buf[p]
    if not (c == NL or c == 13 or _PLAIN[c] != 0):
        return -1, 0, 0, 0.0
    rating = mant * 10.0**scale
    if not math.isfinite(rating):
        return -1, 0, 0, 0.0
    return p, user, item, rating


@njit(nogil=True, cache=True)
def _parse_numbers(buf, start, users, items, ratings):  # type: ignore[no-untyped-def]
    """``_parse`` of a file whose ids are all numbers, compiled apart: no test a field (it cost
    9 % of the parse: 4 M MovieLens-like lines, 0.193 s against 0.177); a plain line's three
    fields found in one pass (``_plain_line``), the general path's three (the line's end, its
    fields, the separators between them) for any other: 3.6 M lines of ``bench/mf.py``'s
    ratings 0.30 s -> 0.14 s on this VM, the same numbers."""
    return _parse(buf, start, users, items, ratings, False, False, True)


@njit(nogil=True, cache=True)
def _parse_names(buf, start, users, items, ratings, named_users, named_items):  # type: ignore[no-untyped-def]
    """``_parse`` of a file with a column of names (or, with neither ``named_*``, a numeric file
    read by the general path alone: what ``_parse_numbers``' plain lines are checked against)."""
    return _parse(buf, start, users, items, ratings, named_users, named_items, False)


@njit(inline="always", nogil=True, cache=True)
def _parse(buf, start, users, items, ratings, named_users, named_items, plain):  # type: ignore[no-untyped-def]
    """Lines from ``start`` → triples, a column of names hashed (``named_*``); with ``plain``
    (numbers only), each plain line in one pass (``_plain_line``).  Returns ``(n, what is wrong
    or "", its line's offset)``; ``buf`` ends with a newline; blank lines are skipped."""
    n, pos, size = 0, start, buf.shape[0]
    bounds = np.empty(6, np.int64)
    while pos < size:
        if plain:
            stop, u, i, r = _plain_line(buf, pos)
            if stop >= 0:
                users[n] = u
                items[n] = i
                ratings[n] = r
                n += 1
                pos = (stop if buf[stop] == NL else line_end(buf, stop)) + 1
                continue
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

