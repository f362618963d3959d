"""Numba parsers: a buffer of whole text lines → labels and hashed feature keys (CSR).

Both formats produce the same batch layout: ``labels float32[n]``, ``indptr int64[n+1]``,
``keys uint64[nnz]``, ``vals float32[nnz]``.  Every example starts with a bias key.

Feature keys: ``feature_key(field, token_hash)`` mixes a field namespace into the token's
hash, so the same token in two fields gives two keys.  ``hash_bits > 0`` folds keys into
``2**hash_bits`` buckets (to compare with hashed learners such as Vowpal Wabbit).

A parser never raises on bad input: it stops at the first malformed line and reports
its byte offset and what is wrong (``ERR_*``), or, with ``skip_bad``, skips and counts
it.  Python turns that into a message naming the file, the line and the text.
"""

from __future__ import annotations

import math
import sys

import numpy as np
from numba import njit
from numba.cpython.unsafe.numbers import trailing_zeros

from paramserver._runtime.intrinsics import load_u64
from paramserver.routing.hashing import hash64

CRITEO_INTS, CRITEO_CATS = 13, 26
CRITEO_FIELDS = 1 + CRITEO_INTS + CRITEO_CATS  # label + features
CRITEO_KEYS = 1 + CRITEO_INTS + CRITEO_CATS  # bias + features

# label encodings for LIBSVM
LABELS_01, LABELS_PM1, LABELS_12 = 0, 1, 2
LABEL_FORMATS = {"01": LABELS_01, "pm1": LABELS_PM1, "12": LABELS_12}

# what was wrong with a line
ERR_NONE, ERR_FIELDS, ERR_LABEL, ERR_INT, ERR_PAIR, ERR_INDEX, ERR_VALUE, ERR_DUPLICATE = range(8)
ERRORS = {
    ERR_FIELDS: "expected 40 tab-separated fields (label, 13 integers, 26 categorical)",
    ERR_LABEL: "the label is not one of the format's labels",
    ERR_INT: "an integer feature is not an integer",
    ERR_PAIR: "a feature is not of the form index:value",
    ERR_INDEX: "a feature index is not a whole number from 0 to 10^18 - 1 (18 digits at most)",
    ERR_VALUE: "a feature value is not a finite number",
    ERR_DUPLICATE: "a feature index appears twice in the line (LIBSVM indices must be distinct)",
}

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_MISSING = np.uint64(0xFFFFFFFFFFFFFFF1)
_BIAS = np.uint64(0)
TAB, NL, CR, SPACE, COLON, MINUS, PLUS, DOT = 9, 10, 13, 32, 58, 45, 43, 46
HASH = 35  # '#' starts a LIBSVM (svmlight) comment
QID_BYTES = (113, 105, 100)  # 'qid', svmlight's query id after the label


@njit(inline="always", nogil=True, cache=True)
def feature_key(field, token, mask):
    k = hash64(token ^ (np.uint64(field + 1) * _GOLDEN))
    return k & mask if mask != 0 else k


@njit(inline="always", nogil=True, cache=True)
def bytes_hash(buf, a, b):
    """FNV-1a, 64 bits, of ``buf[a:b]``: a token's key before its field is mixed in, and a
    name's id (``apps/rounds/ratings``)."""
    h = _FNV_OFFSET
    for i in range(a, b):
        h = (h ^ np.uint64(buf[i])) * _FNV_PRIME
    return h


@njit(inline="always", nogil=True, cache=True)
def _blank(c):
    return c == SPACE or c == TAB or c == CR


@njit(inline="always", nogil=True, cache=True)
def next_token(buf, a, end):
    """(start, end, its first colon or -1) of the next blank-separated token of ``buf[a:end]``;
    start is ``end`` when none is left.  Inlined: a reader's byte loop pays no call."""
    while a < end and _blank(buf[a]):
        a += 1
    b, colon = a, -1
    while b < end and not _blank(buf[b]):
        if buf[b] == COLON and colon < 0:
            colon = b
        b += 1
    return a, b, colon


@njit(inline="always", nogil=True, cache=True)
def line_head(buf, pos):
    """(start, end, newline) of the first token of the line that starts at ``pos``; start is
    the newline for a blank line (``buf`` ends with a newline)."""
    end = pos
    while buf[end] != NL:
        end += 1
    a, b, _ = next_token(buf, pos, end)
    return a, b, end


@njit(inline="always", nogil=True, cache=True)
def _sign(buf, a, b):
    """(negative, first digit's offset) of a number in buf[a:b] (``a < b``)."""
    neg = buf[a] == MINUS
    return neg, a + 1 if neg or buf[a] == PLUS else a


@njit(inline="always", nogil=True, cache=True)
def parse_int(buf, a, b):
    """(ok, value) of the decimal integer in buf[a:b] (optional sign)."""
    if a >= b:
        return False, 0
    neg, a = _sign(buf, a, b)
    if a >= b or b - a > 18:
        return False, 0
    v = 0
    for i in range(a, b):
        c = buf[i]
        if c < 48 or c > 57:
            return False, 0
        v = v * 10 + (c - 48)
    return True, -v if neg else v


@njit(inline="always", nogil=True, cache=True)
def parse_float(buf, a, b):
    """(ok, value) of a decimal number ``[-+]digits[.digits][e[-+]digits]`` in buf[a:b]."""
    if a >= b:
        return False, 0.0
    neg, a = _sign(buf, a, b)
    mant, scale, digits, i = 0.0, 0, 0, a
    while i < b and 48 <= buf[i] <= 57:
        mant = mant * 10.0 + (buf[i] - 48)
        digits += 1
        i += 1
    if i < b and buf[i] == DOT:
        i += 1
        while i < b and 48 <= buf[i] <= 57:
            mant = mant * 10.0 + (buf[i] - 48)
            scale -= 1
            digits += 1
            i += 1
    if digits == 0:
        return False, 0.0
    if i < b and (buf[i] == 101 or buf[i] == 69):  # e / E
        ok, e = parse_int(buf, i + 1, b)
        if not ok:
            return False, 0.0
        scale += e
        i = b
    if i != b:
        return False, 0.0
    v = mant * 10.0**scale
    if not math.isfinite(v):
        return False, 0.0
    return True, -v if neg else v


@njit(inline="always", nogil=True, cache=True)
def _bucket_int(v):
    if v <= 2:
        return np.uint64(v + 8)  # negatives too: small, distinct
    return np.uint64(int(math.log(v) ** 2) + 16)


_SMALL_INTS = 4096
_BUCKETS = np.array([_bucket_int.py_func(v) for v in range(_SMALL_INTS)], np.uint64)


@njit(inline="always", nogil=True, cache=True)
def bucket_int(v):
    """Criteo integer feature → bucket: v itself up to 2, then ⌊ln(v)²⌋ (offset past 2).
    Most values are small: those read a table (a log is ~20 cycles, 13 a line)."""
    if 0 <= v < _SMALL_INTS:
        return _BUCKETS[v]
    return _bucket_int(v)


# 8 characters at a time (SWAR: SIMD within a register).  Criteo lines are ~200 bytes of
# short fields; a byte loop pays a mispredicted branch at every field's end.  Reading a
# word finds the field's separator with a few ALU operations and `tzcnt`, and gives an
# integer's digits or a categorical's 8 hex characters without a loop.
_LITTLE = sys.byteorder == "little"  # the word tricks read byte 0 as the lowest
_ONES = np.uint64(0x0101010101010101)
_HIGHS = np.uint64(0x8080808080808080)
_TABS = np.uint64(0x0909090909090909)
_NLS = np.uint64(0x0A0A0A0A0A0A0A0A)
_HASHES = np.uint64(0x2323232323232323)  # eight '#'
_ZEROS = np.uint64(0x3030303030303030)  # eight '0'
_NIBBLES = np.uint64(0xF0F0F0F0F0F0F0F0)
_SIXES = np.uint64(0x0606060606060606)


@njit(inline="always", nogil=True, cache=True)
def _separators(w):
    """High bit set in each byte of ``w`` that is a TAB or NL; exact for the lowest one
    (bytes above a match may be marked too, which the callers never look at)."""
    t, n = w ^ _TABS, w ^ _NLS
    return ((t - _ONES) & ~t | (n - _ONES) & ~n) & _HIGHS


@njit(inline="always", nogil=True, cache=True)
def _field_end(buf, a, size):
    """Offset of the first TAB or NL at or after ``a`` (``buf`` ends in NL)."""
    if _LITTLE:
        while a + 8 <= size:
            m = _separators(load_u64(buf, a))
            if m != 0:
                return a + (trailing_zeros(m) >> 3)
            a += 8
    while buf[a] != TAB and buf[a] != NL:
        a += 1
    return a


@njit(inline="always", nogil=True, cache=True)
def _byte_end(buf, a, comment):
    """Offset of the first NL at or after ``a`` (``buf`` ends in NL), or of the first ``#``
    before it with ``comment``: a word at a time, as ``_field_end``."""
    size = buf.shape[0]
    if _LITTLE:
        while a + 8 <= size:
            w = load_u64(buf, a)
            n = w ^ _NLS
            m = (n - _ONES) & ~n
            if comment:
                h = w ^ _HASHES
                m |= (h - _ONES) & ~h
            m &= _HIGHS
            if m != 0:
                return a + (trailing_zeros(m) >> 3)
            a += 8
    while buf[a] != NL and not (comment and buf[a] == HASH):
        a += 1
    return a


@njit(inline="always", nogil=True, cache=True)
def svm_line(buf, pos):
    """(start, end, content's end, newline) of the first token of the LIBSVM line at ``pos``:
    its content ends at a ``#`` (svmlight's comment, to the line's end) or the newline; start is
    the content's end for a line of nothing else (``buf`` ends with a newline)."""
    stop = _byte_end(buf, pos, True)
    end = stop if buf[stop] == NL else _byte_end(buf, stop, False)
    a, b, _ = next_token(buf, pos, stop)
    return a, b, stop, end


#: what ``next_pair`` found: an ``index:value`` pair, the line's end, a token with no colon,
#: svmlight's ``qid:`` (to skip), an index that is not a whole number >= 0
PAIR, LINE_END, NOT_PAIR, QID, BAD_INDEX = range(5)


@njit(inline="always", nogil=True, cache=True)
def next_pair(buf, b, stop, first):
    """The LIBSVM token after ``b`` in a line's content (up to ``stop``): ``(what it is, start,
    end, colon, index)``; ``first``: no feature has come yet in the line (where a ``qid:`` may
    stand).  The value, ``buf[colon + 1:end]``, is the caller's to read."""
    a, b, colon = next_token(buf, b, stop)
    if a >= stop:
        return LINE_END, a, b, colon, 0
    if colon < 0:
        return NOT_PAIR, a, b, colon, 0
    if first and is_qid(buf, a, colon):
        return QID, a, b, colon, 0
    ok, idx = parse_int(buf, a, colon)
    if not ok or idx < 0:
        return BAD_INDEX, a, b, colon, 0
    return PAIR, a, b, colon, idx


@njit(inline="always", nogil=True, cache=True)
def is_qid(buf, a, colon):
    """Whether the token at ``a`` with its colon at ``colon`` is svmlight's ``qid:``: a query's
    id after the target, which a pointwise learner skips."""
    return colon == a + 3 and buf[a] == QID_BYTES[0] and buf[a + 1] == QID_BYTES[1] and buf[a + 2] == QID_BYTES[2]


@njit(inline="always", nogil=True, cache=True)
def _digits(w, n):
    """(ok, value) of the ``n`` (1..7) characters in the low bytes of ``w`` read as an
    unsigned decimal: ok when every one is '0'..'9'."""
    lanes = (np.uint64(1) << np.uint64(8 * n)) - np.uint64(1)
    zeros = _ZEROS & lanes
    ok = (w & _NIBBLES & lanes) == zeros and ((w & lanes) + _SIXES) & _NIBBLES & lanes == zeros
    v = ((w << np.uint64(64 - 8 * n)) | (_ZEROS >> np.uint64(8 * n))) - _ZEROS  # 8 digits, 0-padded
    v = v * np.uint64(10) + (v >> np.uint64(8))  # pairs
    v = ((v & np.uint64(0x000000FF000000FF)) * np.uint64(100 + (1000000 << 32))
         + ((v >> np.uint64(16)) & np.uint64(0x000000FF000000FF)) * np.uint64(1 + (10000 << 32))) >> np.uint64(32)
    return ok, np.int64(v & np.uint64(0xFFFFFFFF))


@njit(inline="always", nogil=True, cache=True)
def _word_hash(w):
    """``bytes_hash`` of the 8 characters in ``w``."""
    h = _FNV_OFFSET
    for i in range(8):
        h = (h ^ ((w >> np.uint64(8 * i)) & np.uint64(0xFF))) * _FNV_PRIME
    return h


@njit(inline="always", nogil=True, cache=True)
def _finish_row(keys, n, words, mask):
    """Row ``n``'s keys from its tokens as the byte loop left them in ``keys[n]``: the words of
    the fields ``words`` marks (8 characters, read as one uint64) hashed (``_word_hash``),
    then every token's ``feature_key``.  A loop of its own over the row, with no branch: the
    compiler runs it on vector registers, several fields at once, where in the byte loop
    each token's 8 + 2 dependent multiplications ran one field at a time (a Criteo row: 260
    ns parsed that way, 195 so; the same keys)."""
    for f in range(CRITEO_KEYS):
        t = keys[n, f]
        h = _word_hash(t)
        tok = h if (words >> np.uint64(f)) & np.uint64(1) else t
        keys[n, f] = feature_key(f, tok, mask)


@njit(nogil=True, cache=True)
def parse_criteo(buf, max_rows, skip_bad, mask, labels, keys, line_end, unlabeled=False):  # noqa: C901  (one numba kernel: a byte loop)
    """Parse up to ``max_rows`` lines of ``buf`` (whole lines, each ending in \\n).

    Fills ``labels[:n]``, ``keys[:n, :40]`` and ``line_end[:n]`` (offset just past each
    parsed line).  Returns ``(n, consumed, bad, err, err_at)``: rows parsed, bytes used,
    lines skipped, and the first error code with the offset of its line (``err`` is
    ``ERR_NONE`` when there was none, or when ``skip_bad``).  ``unlabeled``: the lines
    have no label field (39 fields, as Criteo's own test.txt); their labels read 0.

    One pass: each field ends at the first TAB or NL after it; the last field must end
    at the NL (a CR before it is not part of the field), every other at a TAB.
    """
    n, pos, bad, size = 0, 0, 0, buf.shape[0]
    while pos < size and n < max_rows:
        c = buf[pos]
        if c == NL or (c == CR and buf[pos + 1] == NL):  # blank line: skip silently
            pos += 1 if c == NL else 2
            continue
        err, end, label = ERR_NONE, -1, 0 if unlabeled else c - 48
        words = np.uint64(0)  # the fields whose token is an 8-character word, hashed by _finish_row
        if not unlabeled and (buf[pos + 1] != TAB or (label != 0 and label != 1)):
            err = ERR_LABEL
        else:
            keys[n, 0] = _BIAS
            a = pos if unlabeled else pos + 2
            for field in range(1, CRITEO_FIELDS):
                b = _field_end(buf, a, size)
                at_nl = buf[b] == NL
                if at_nl != (field == CRITEO_FIELDS - 1):  # a tab after the last field, or too few
                    err = ERR_FIELDS
                    break
                if at_nl:
                    end = b
                    if buf[b - 1] == CR:
                        b -= 1
                if a == b:
                    keys[n, field] = _MISSING
                elif field <= CRITEO_INTS:
                    ok = False
                    if _LITTLE and b - a <= 7 and a + 8 <= size:
                        ok, v = _digits(load_u64(buf, a), b - a)
                    if not ok:  # a sign, 8+ digits, the buffer's last bytes, or not a number
                        ok, v = parse_int(buf, a, b)
                        if not ok:
                            err = ERR_INT
                            break
                    keys[n, field] = bucket_int(v)
                elif _LITTLE and b - a == 8:  # the usual hex token
                    keys[n, field] = load_u64(buf, a)
                    words |= np.uint64(1) << np.uint64(field)
                else:
                    keys[n, field] = bytes_hash(buf, a, b)
                a = b + 1
        if err != ERR_NONE:
            if not skip_bad:
                return n, pos, bad, err, pos
            bad += 1
            end = pos
            while buf[end] != NL:
                end += 1
        else:
            _finish_row(keys, n, words, mask)
            labels[n] = label
            line_end[n] = end + 1
            n += 1
        pos = end + 1
    return n, pos, bad, ERR_NONE, -1


@njit(nogil=True, cache=True)
def parse_libsvm(buf, max_rows, skip_bad, mask, label_format, labels, indptr, keys, vals, line_end, unlabeled=False,  # noqa: C901  (one numba kernel: a byte loop)
                 seen=np.zeros(0, np.int64)):  # noqa: B008 (numba: a default must be a constant array)
    """LIBSVM lines ``label idx:val ...`` → CSR rows with a bias key first.  An index is a
    whole number >= 0 (hashed, so 0-based files read as they are); svmlight's ``qid:`` after
    the label and a comment from ``#`` to the line's end are skipped.

    ``keys``/``vals`` must have room for every feature of ``buf`` plus one a row.
    Returns like ``parse_criteo``.
    """
    n, pos, bad, size, nnz = 0, 0, 0, buf.shape[0], 0
    indptr[0] = 0
    while pos < size and n < max_rows:
        a, b, stop, end = svm_line(buf, pos)
        if a == stop:  # a blank line, or a comment's
            pos = end + 1
            continue
        err = ERR_NONE
        if unlabeled:
            b = a
        ok, raw = parse_float(buf, a, b)
        label = 0.0 if unlabeled else -1.0  # unlabeled: no label token, features from the start
        if ok and not unlabeled:
            if label_format == LABELS_01 and (raw == 0.0 or raw == 1.0):
                label = raw
            elif label_format == LABELS_PM1 and (raw == -1.0 or raw == 1.0):
                label = (raw + 1.0) / 2.0
            elif label_format == LABELS_12 and (raw == 1.0 or raw == 2.0):
                label = raw - 1.0
        if label < 0:
            err = ERR_LABEL
        row_nnz = nnz
        if err == ERR_NONE:
            keys[row_nnz] = feature_key(0, _BIAS, mask)
            vals[row_nnz] = 1.0
            row_nnz += 1
            a = b
            prev, ordered, first = -1, True, row_nnz  # duplicates: free to see when ascending, else sorted
            while True:
                what, a, b, colon, idx = next_pair(buf, a, stop, row_nnz == first)
                if what == LINE_END:
                    break
                if what == NOT_PAIR or what == BAD_INDEX:
                    err = ERR_PAIR if what == NOT_PAIR else ERR_INDEX
                    break
                if what == QID:  # the query's id: skipped
                    a = b
                    continue
                ok, v = parse_float(buf, colon + 1, b)
                if not ok:
                    err = ERR_VALUE
                    break
                if idx == prev:
                    err = ERR_DUPLICATE
                    break
                ordered = ordered and idx > prev
                prev = idx
                if seen.shape[0] > row_nnz:
                    seen[row_nnz] = idx
                keys[row_nnz] = feature_key(1, np.uint64(idx), mask)
                vals[row_nnz] = v
                row_nnz += 1
                a = b
            if err == ERR_NONE and not ordered and seen.shape[0] >= row_nnz:
                row = np.sort(seen[first:row_nnz])
                for i in range(1, row.shape[0]):
                    if row[i] == row[i - 1]:
                        err = ERR_DUPLICATE
                        break
        if err != ERR_NONE:
            if not skip_bad:
                return n, pos, bad, err, pos
            bad += 1
        else:
            labels[n] = label
            nnz = row_nnz
            n += 1
            indptr[n] = nnz
            line_end[n - 1] = end + 1
        pos = end + 1
    return n, pos, bad, ERR_NONE, -1
