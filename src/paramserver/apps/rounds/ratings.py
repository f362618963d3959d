"""Rating triples ``user item rating`` for ``paramserver mf``, read whole.

Accepted, one rating a line, extra fields (a timestamp) ignored:

- MovieLens ``u.data`` TSV: ``user<TAB>item<TAB>rating<TAB>ts`` (ml-100k);
- MovieLens CSV with a header: ``userId,movieId,rating,timestamp`` (the ml-latest
  releases, ml-20m, ml-25m, ml-32m);
- MovieLens ``::`` files: ``UserID::MovieID::Rating::Timestamp`` (ml-1m, ml-10m);
- any of these gz/bz2/xz compressed (by extension), local or an fsspec URL.

Ids are whole numbers (any, not necessarily dense); ratings are real numbers.  The first
line may be a header (it is skipped if its first field is not a number); any other line
that is not ``integer, integer, number`` is an error naming the file, the line and the
fix.  Parsing is one numba pass over the bytes, GIL released.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from paramserver.apps.rounds.fields import line_end, separators, split_fields
from paramserver.data.parse import parse_float, parse_int
from paramserver.data.reader import DataError
from paramserver.data.whole import bad_line, read_whole

_SEPS = separators(b"\t, :\r")  # tab, comma, space, colon (the '::' files), CR

@njit(nogil=True, cache=True)
def _parse(buf, start, users, items, ratings):  # type: ignore[no-untyped-def]
    """Lines from ``start`` → triples.  Returns ``(n, what is wrong or "", its line's offset)``; ``buf``
    ends with a newline; blank lines are skipped."""
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
        ok, u = parse_int(buf, bounds[0], bounds[1])
        if not ok:
            return n, "the user id (first field) is not a whole number", pos
        ok, i = parse_int(buf, bounds[2], bounds[3])
        if not ok:
            return n, "the item id (second field) is not a whole number", pos
        ok, r = parse_float(buf, bounds[4], bounds[5])
        if not ok or not np.isfinite(r):
            return n, "the rating (third field) is not a finite number", pos
        users[n] = u
        items[n] = i
        ratings[n] = r
        n += 1
        pos = end + 1
    return n, "", -1


@dataclass(frozen=True)
class Ratings:
    """Parallel arrays, in file order: raw ids as in the file, ratings as float32."""

    users: np.ndarray  # int64[n]
    items: np.ndarray  # int64[n]
    ratings: np.ndarray  # float32[n]

    def __len__(self) -> int:
        return int(self.ratings.shape[0])


def read_ratings(path: str) -> Ratings:
    """Read ``path`` whole (see the module's doc for the formats).

    Raises:
        DataError: a missing or empty file, or a malformed line (file and line named).
    """
    raw, buf = read_whole(path)
    start = 0
    first = raw.lstrip()[:1]
    if first and not (first.isdigit() or first in b"+-"):  # a header line: userId,movieId,rating,timestamp
        start = raw.index(b"\n", len(raw) - len(raw.lstrip())) + 1
    lines = raw.count(b"\n", start)  # memchr's speed, and no array of a byte a byte to count over
    # the ratings parsed straight into float32 (each rounded as ``astype`` rounds it): no copy of 3.6 M
    # of them, whose fresh pages cost more than the parse's time at MovieLens' sizes
    users, items, ratings = np.empty(lines, np.int64), np.empty(lines, np.int64), np.empty(lines, np.float32)
    n, err, at = _parse(buf, start, users, items, ratings)
    if err:
        raise bad_line(path, raw, buf, at, err, "each line must be 'user item rating [timestamp]' (MovieLens "
                       "u.data, ratings.csv or ratings.dat); fix or remove the line")
    if n == 0:
        raise DataError(f"{path} has no ratings; expected lines 'user item rating [timestamp]' (tab, comma or "
                        "'::' separated, an optional header first)")
    if n < lines:  # blank lines: let the tail go
        users, items, ratings = users[:n].copy(), items[:n].copy(), ratings[:n].copy()
    return Ratings(users, items, ratings)


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

