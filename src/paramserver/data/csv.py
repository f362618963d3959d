"""CSV with a header line: Avazu's CTR logs (``--format avazu``) and any such file
(``--format csv --label COLUMN``).

Every column but the label (and those ignored) is a categorical field: its value is
hashed as a token with the column's *name* as namespace, as Criteo's categorical fields
are, so files whose columns come in another order give the same keys.  An empty value is
the field's "missing" token.

A numeric column (``--numeric-columns``) is bucketed by size instead, so that 17 and 18
share a key as Criteo's integer fields do: a whole number by Criteo's buckets (itself up
to 2, then ⌊ln(v)²⌋), any other number by ⌊16·ln(1 + |v|)⌋ and its sign; a value that
is not a number is a malformed line.

Avazu's ``hour`` (YYMMDDHH) becomes two features, the hour of the day and the day of the
week (the raw value is unique to each hour of the log and so never seen again at test
time); its ``id`` (unique per row) is ignored.

Quoted fields are not supported (the parser stops at the first ``"`` and says so): CTR
logs do not quote, and a quote-aware parser costs every file the time.  Lines end in
``\\n`` (a ``\\r`` before it is dropped).  The header is the first line of the *file*: a
shard that starts mid-file reads it from byte 0.  Avazu's files come with a header or
without one (the Kaggle split's dev and test files): a first line of 24 fields that does
not name ``click`` is data, in Avazu's column order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import njit

from paramserver._runtime.intrinsics import load_u64
from paramserver.data.parse import (
    _BIAS,
    _GOLDEN,
    _LITTLE,
    _MISSING,
    CR,
    ERR_FIELDS,
    ERR_LABEL,
    ERR_NONE,
    NL,
    _word_hash,
    bucket_int,
    bytes_hash,
    parse_float,
)
from paramserver.errors import ConfigError
from paramserver.routing.hashing import hash64

ROLE_FEATURE, ROLE_LABEL, ROLE_IGNORE, ROLE_HOUR, ROLE_NUMERIC = 0, 1, 2, 3, 4
COMMA, QUOTE = 44, 34
ERR_QUOTE, ERR_NUMBER = 100, 101  # past parse.py's codes
AVAZU_LABEL, AVAZU_IGNORE, AVAZU_HOUR = "click", ("id",), "hour"
AVAZU_COLUMNS = ("id", "click", "hour", "C1", "banner_pos", "site_id", "site_domain", "site_category", "app_id",
                 "app_domain", "app_category", "device_id", "device_ip", "device_model", "device_type",
                 "device_conn_type", "C14", "C15", "C16", "C17", "C18", "C19", "C20", "C21")


@dataclass(frozen=True)
class Columns:
    """What each column of a file is: ``roles`` (``ROLE_*``), the namespace of each
    column (from its name), and the keys a row makes (bias + features)."""

    names: tuple[str, ...]
    roles: np.ndarray  # int8[ncols]
    namespaces: np.ndarray  # uint64[ncols]
    keys_per_row: int
    header: bool  # the first line names the columns (else it is data: Avazu's files without a header)


def header_names(header: str, fmt_name: str) -> tuple[tuple[str, ...], bool]:
    """A first line's column names, and whether it is a header: an Avazu file whose first
    line is data (24 fields, no ``click``) has Avazu's columns."""
    names = tuple(c.strip() for c in header.removeprefix("\ufeff").rstrip("\r\n").split(","))
    if fmt_name == "avazu" and AVAZU_LABEL not in names and len(names) == len(AVAZU_COLUMNS):
        return AVAZU_COLUMNS, False
    return names, True


def check_same_columns(first: str, paths: list[str], fmt_name: str) -> None:
    """Every file of ``paths`` (test files, more training files) with the columns of
    ``first``, the first training file: a feature is its column's name and value, so a file
    of other columns scored features the model never saw, without a word."""
    from paramserver.data.files import open_input, reading

    def names(path: str) -> tuple[str, ...]:
        with open_input(path) as f, reading(path):
            return header_names(f.readline(4 << 20).decode("utf-8", "replace"), fmt_name)[0]

    want = set(names(first))  # in any order: a row's columns are read by name
    for path in paths:
        if (got := set(names(path))) != want:
            differ = sorted(got ^ want)
            raise ConfigError(f"{path}:1: its columns are not those of {first} (the first training file): "
                              f"{', '.join(differ[:10])} {'is' if len(differ) == 1 else 'are'} in one and not the "
                              "other; give files of the same columns")


def columns_of(header: str, path: str, fmt_name: str, label: str, ignore: tuple[str, ...],
               numeric: tuple[str, ...] = ()) -> Columns:
    """The roles of a header's columns (``header_names``), checked: the label column must be there."""
    names, has_header = header_names(header, fmt_name)
    shown = ", ".join(names)
    shown = shown if len(shown) <= 300 else shown[:300] + "..."  # in messages
    if '"' in header:
        raise ConfigError(f"{path}:1: the header has quotes ({header.strip()[:200]!r}); quoted CSV is not "
                          "supported: remove the quotes")
    if fmt_name == "avazu":
        label, ignore, hour = AVAZU_LABEL, AVAZU_IGNORE + tuple(ignore), AVAZU_HOUR
    else:
        hour = ""
    if not label:
        raise ConfigError(f"--format csv needs --label COLUMN, the column with the 0/1 label; {path} has "
                          f"columns {shown}")
    if label not in names:
        raise ConfigError(f"{path}:1: no column {label!r} for the label (columns: {shown}); "
                          f"{'is this an Avazu file? ' if fmt_name == 'avazu' else ''}pass --label with one "
                          "of the header's names")
    missing = [c for c in ignore if c not in names and c not in AVAZU_IGNORE]
    if missing:
        raise ConfigError(f"--ignore-columns {', '.join(missing)}: not in the header of {path} "
                          f"(columns: {shown})")
    _check_numeric(numeric, names, label, ignore, path, shown)
    if len(set(names)) != len(names):
        dup = sorted({c for c in names if names.count(c) > 1})
        raise ConfigError(f"{path}:1: the header names columns more than once ({', '.join(dup)}); rename them")
    roles = np.array([ROLE_LABEL if c == label else ROLE_IGNORE if c in ignore else ROLE_NUMERIC if c in numeric
                      else ROLE_HOUR if c == hour else ROLE_FEATURE for c in names], np.int8)
    namespaces = np.array([_name_hash(c.encode()) for c in names], np.uint64)
    keys = 1 + int(np.isin(roles, (ROLE_FEATURE, ROLE_NUMERIC)).sum()) + 2 * int((roles == ROLE_HOUR).sum())
    if keys == 1:
        raise ConfigError(f"{path}: no feature column left (columns: {shown}; label {label!r}, "
                          f"ignored {', '.join(ignore) or 'none'})")
    return Columns(names, roles, namespaces, keys, has_header)


def _check_numeric(numeric: tuple[str, ...], names: tuple[str, ...], label: str, ignore: tuple[str, ...],
                   path: str, shown: str) -> None:
    """``--numeric-columns``: columns of the header, neither the label nor ignored."""
    missing = [c for c in numeric if c not in names]
    if missing:
        raise ConfigError(f"--numeric-columns {', '.join(missing)}: not in the header of {path} (columns: {shown})")
    clash = [c for c in numeric if c == label or c in ignore]
    if clash:
        raise ConfigError(f"--numeric-columns {', '.join(clash)}: the label or an ignored column, not a feature")


@njit(inline="always", nogil=True, cache=True)
def numeric_bucket(v):
    """A number's bucket: a whole number's as Criteo's integers, any other by
    ⌊16·ln(1 + |v|)⌋ with its sign, apart (bit 40)."""
    if v == math.floor(v) and abs(v) < 9.0e15:
        return bucket_int(np.int64(v))
    b = np.uint64(int(math.floor(16.0 * math.log1p(abs(v)))))
    return (np.uint64(1) << np.uint64(40)) | (b << np.uint64(1)) | np.uint64(1 if v < 0 else 0)


def _name_hash(name: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in name:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


@njit(inline="always", nogil=True, cache=True)
def _ns_key(ns, token, mask):
    k = hash64(token ^ (ns * _GOLDEN))
    return k & mask if mask != 0 else k


@njit(inline="always", nogil=True, cache=True)
def _weekday(y, m, d):
    """Day of the week (0..6) of a Gregorian date (days-from-civil, Hinnant)."""
    if m <= 2:
        y -= 1
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return (era * 146097 + doe - 719468 + 3) % 7  # 1970-01-01 (day 0) was a Thursday


@njit(nogil=True, cache=True)
def _key_spaces(roles, namespaces, width):
    """Each key's namespace in a row of ``width`` keys: the bias's (``feature_key``'s field
    0), then each feature column's, a numeric's, and an hour column's two (the hour's, and
    the weekday's: the hour's with its low bit flipped), in the columns' order."""
    spaces = np.zeros(width, np.uint64)
    spaces[0] = np.uint64(1)
    k = 1
    for col in range(roles.shape[0]):
        if k >= width:
            break
        if roles[col] == ROLE_FEATURE or roles[col] == ROLE_NUMERIC:
            spaces[k] = namespaces[col]
            k += 1
        elif roles[col] == ROLE_HOUR and k + 1 < width:
            spaces[k], spaces[k + 1] = namespaces[col], namespaces[col] ^ np.uint64(1)
            k += 2
    return spaces


@njit(inline="always", nogil=True, cache=True)
def _finish_row(keys, n, spaces, words, mask):
    """Row ``n``'s keys from the tokens the byte loop left in ``keys[n]``: the marked words
    (8 characters read as one uint64, keys below 64) hashed, every token mixed into its
    key's namespace, in a loop with no branch the compiler runs on vector registers (as
    ``parse._finish_row`` does for Criteo rows)."""
    for k in range(keys.shape[1]):
        t = keys[n, k]
        h = _word_hash(t)
        tok = h if (words >> np.uint64(k & 63)) & np.uint64(1) and k < 64 else t
        keys[n, k] = _ns_key(spaces[k], tok, mask)


@njit(nogil=True, cache=True)
def parse_csv(buf, max_rows, skip_bad, mask, roles, namespaces, labels, keys, line_end):  # noqa: C901  (one numba kernel: a byte loop)
    """Parse up to ``max_rows`` lines of ``buf`` (whole lines, each ending in \\n) into
    ``labels[:n]`` and ``keys[:n, :K]``.  Returns ``(n, consumed, bad, err, err_at)`` as
    ``parse_criteo`` does."""
    ncols = roles.shape[0]
    n, pos, bad, size = 0, 0, 0, buf.shape[0]
    spaces = _key_spaces(roles, namespaces, keys.shape[1])
    while pos < size and n < max_rows:
        c = buf[pos]
        if c == NL or (c == CR and buf[pos + 1] == NL):  # blank line
            pos += 1 if c == NL else 2
            continue
        err, label, k, col, a = ERR_NONE, -1.0, 1, 0, pos
        keys[n, 0] = _BIAS
        words = np.uint64(0)  # the keys whose token is an 8-character word, hashed by _finish_row
        while True:
            b = a
            while buf[b] != COMMA and buf[b] != NL and buf[b] != QUOTE:
                b += 1
            if buf[b] == QUOTE:
                err = ERR_QUOTE
                break
            e = b - 1 if buf[b] == NL and b > a and buf[b - 1] == CR else b
            if col >= ncols:
                err = ERR_FIELDS
                break
            role = roles[col]
            if role == ROLE_LABEL:
                if e - a == 1 and (buf[a] == 48 or buf[a] == 49):
                    label = np.float32(buf[a] - 48)
                else:
                    err = ERR_LABEL
                    break
            elif role == ROLE_FEATURE:
                if _LITTLE and e - a == 8 and k < 64:
                    keys[n, k] = load_u64(buf, a)
                    words |= np.uint64(1) << np.uint64(k)
                else:
                    keys[n, k] = _MISSING if e == a else bytes_hash(buf, a, e)
                k += 1
            elif role == ROLE_NUMERIC:
                if e == a:
                    keys[n, k] = _MISSING
                else:
                    ok, v = parse_float(buf, a, e)
                    if not ok:
                        err = ERR_NUMBER
                        break
                    keys[n, k] = numeric_bucket(v)
                k += 1
            elif role == ROLE_HOUR:
                ok = e - a == 8
                v = 0
                for i in range(a, e):
                    ok = ok and 48 <= buf[i] <= 57
                    v = v * 10 + (buf[i] - 48)
                yy, mm, dd, hh = v // 1000000, v // 10000 % 100, v // 100 % 100, v % 100
                if ok and 1 <= mm <= 12 and 1 <= dd <= 31 and hh <= 23:
                    keys[n, k] = np.uint64(hh)
                    keys[n, k + 1] = np.uint64(_weekday(2000 + yy, mm, dd))
                else:  # not YYMMDDHH: the value as a token, no weekday
                    keys[n, k] = _MISSING if e == a else bytes_hash(buf, a, e)
                    keys[n, k + 1] = _MISSING
                k += 2
            col += 1
            if buf[b] == NL:
                break
            a = b + 1
        if err == ERR_NONE and col != ncols:
            err = ERR_FIELDS
        end = pos
        while buf[end] != NL:
            end += 1
        if err != ERR_NONE:
            if not skip_bad:
                return n, pos, bad, err, pos
            bad += 1
            pos = end + 1
            continue
        _finish_row(keys, n, spaces, words, mask)
        labels[n] = label
        line_end[n] = end + 1
        n += 1
        pos = end + 1
    return n, pos, bad, ERR_NONE, 0
