"""How the lines of a ratings file are read (``ratings.read_ratings``): ``user item rating``
triples from a buffer of its bytes, a column of names hashed, each bad line said by its
offset and what is wrong.

Two paths give the same triples: the general one takes any line (its end found, its fields
split at runs of separators, the runs checked for an empty field, each field parsed), and a
plain numeric line, ``digits SEP digits SEP digits[.digits]`` as MovieLens writes them, is read
in one pass (``_plain_line``), every other line falling back to the general path.  A file of
numbers is parsed in two halves on two threads (``parse_numbers``): the triples of the first
half, then the second's, as one pass would give them, and the first bad line's complaint.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from paramserver._runtime.threads import on_two
from paramserver.apps.rounds.fields import NL, line_end, separators, split_fields
from paramserver.data.parse import bytes_hash, parse_float, parse_int

_SEPS = separators(b"\t, :\r")  # tab, comma, space, colon (the '::' files), CR
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
def _parse_numbers(buf, start, stop, users, items, ratings):  # type: ignore[no-untyped-def]
    """``_parse`` of a file whose ids are all numbers, compiled apart: no test a field (it cost
    9 % of the parse: 4 M MovieLens-like lines, 0.193 s against 0.177); a plain line's three
    fields found in one pass (``_plain_line``), the general path's three (the line's end, its
    fields, the separators between them) for any other: 3.6 M lines of ``bench/mf.py``'s
    ratings 0.30 s -> 0.14 s on this VM, the same numbers."""
    return _parse(buf, start, stop, users, items, ratings, False, False, True)


@njit(nogil=True, cache=True)
def parse_names(buf, start, users, items, ratings, named_users, named_items):  # type: ignore[no-untyped-def]
    """``_parse`` of a file with a column of names (or, with neither ``named_*``, a numeric file
    read by the general path alone: what ``_parse_numbers``' plain lines are checked against)."""
    return _parse(buf, start, buf.shape[0], users, items, ratings, named_users, named_items, False)


@njit(inline="always", nogil=True, cache=True)
def _parse(buf, start, stop, users, items, ratings, named_users, named_items, plain):  # type: ignore[no-untyped-def]
    """Lines from ``start`` to ``stop`` (a line's start, or the buffer's end) → triples, a
    column of names hashed (``named_*``); with ``plain`` (numbers only), each plain line in one
    pass (``_plain_line``).  Returns ``(n, what is wrong or "", its line's offset)``; ``buf``
    ends with a newline; blank lines are skipped."""
    n, pos = 0, start
    bounds = np.empty(6, np.int64)
    while pos < stop:
        if plain:
            scanned, u, i, r = _plain_line(buf, pos)
            if scanned >= 0:
                users[n] = u
                items[n] = i
                ratings[n] = r
                n += 1
                pos = (scanned if buf[scanned] == NL else line_end(buf, scanned)) + 1
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


#: a file of at least this many bytes is parsed in two halves on two threads
PARALLEL_BYTES = 1 << 20


@njit(nogil=True, cache=True)
def _lines_in(buf, start, stop):  # type: ignore[no-untyped-def]
    """The newlines in ``buf[start:stop]``."""
    n = 0
    for p in range(start, stop):
        if buf[p] == NL:
            n += 1
    return n


def parse_numbers(buf: np.ndarray, start: int, users: np.ndarray, items: np.ndarray,
                  ratings: np.ndarray) -> tuple[int, str, int]:
    """The triples of a file of numbers from ``start`` into the arrays (room for a triple a
    line); ``(how many, what is wrong or "", the bad line's offset)`` as one pass gives them.
    A big file's second half (from the first line start past its middle) is parsed on a thread
    of its own into the places after the first half's lines, which it counts first (3.6 M
    ratings: 0.15 s -> 0.09 s on this VM); a first half with blank lines leaves a gap, which the
    second half's triples close."""
    size = buf.shape[0]
    mid = start + (size - start) // 2
    while mid < size and buf[mid - 1] != NL:
        mid += 1
    if size - start < PARALLEL_BYTES or mid >= size:
        n, err, at = _parse_numbers(buf, start, size, users, items, ratings)
        return int(n), str(err), int(at)

    def second() -> tuple[int, int, str, int]:
        first_lines = int(_lines_in(buf, start, mid))
        n2, err2, at2 = _parse_numbers(buf, mid, size, users[first_lines:], items[first_lines:],
                                       ratings[first_lines:])
        return first_lines, int(n2), str(err2), int(at2)

    (n1, err1, at1), (first_lines, n2, err2, at2) = on_two(
        lambda: _parse_numbers(buf, start, mid, users, items, ratings), second, "paramserver-ratings")
    if err1:
        return int(n1), str(err1), int(at1)
    if n1 < first_lines:  # blank lines in the first half: the second's triples move down to follow
        for column in (users, items, ratings):
            column[n1:n1 + n2] = column[first_lines:first_lines + n2]
    return int(n1) + n2, err2, at2
