"""A LIBSVM (svmlight) file read whole as a sparse matrix with its real-valued targets, for the
model-parallel apps (``paramserver lasso``) that need features by their own index, not
hashed, and labels as numbers, not classes.

``read_libsvm_matrix`` parses in one numba pass (GIL released) into CSR arrays, then
builds the CSC copy that coordinate descent walks column by column.  A malformed line is
an error naming the file, the line, what is wrong and the fix; nothing is skipped
silently.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from paramserver.data.parse import BAD_INDEX, LINE_END, NOT_PAIR, QID, next_pair, parse_float, svm_line
from paramserver.data.reader import DataError
from paramserver.data.whole import bad_line, check_fits, read_whole


@njit(nogil=True, cache=True)
def _parse(buf, labels, indptr, cols, vals):  # type: ignore[no-untyped-def]
    """Lines ``target idx:val ...`` → CSR with each column the index less one (indices ``0``
    or more; svmlight's ``qid:`` after the target and a comment from ``#`` skipped).  Returns
    ``(rows, what is wrong or "", its line's offset, the least index)``; ``buf`` ends with a
    newline."""
    n, nnz, pos, size, least = 0, 0, 0, buf.shape[0], -1
    indptr[0] = 0
    while pos < size:
        a, b, stop, end = svm_line(buf, pos)
        if a == stop:
            pos = end + 1
            continue
        ok, y = parse_float(buf, a, b)
        if not ok or not np.isfinite(y):
            return n, "the target (first token) is not a number", pos, least
        row = nnz
        while True:
            what, a, b, colon, idx = next_pair(buf, b, stop, nnz == row)
            if what == LINE_END:
                break
            if what == NOT_PAIR:
                return n, "a feature is not index:value", pos, least
            if what == BAD_INDEX:
                return n, "a feature index is not a whole number from 0 to 10^18 - 1 (18 digits at most)", pos, least
            if what == QID:
                continue
            ok, v = parse_float(buf, colon + 1, b)
            if not ok or not np.isfinite(v):
                return n, "a feature value is not a number", pos, least
            if least < 0 or idx < least:
                least = idx
            cols[nnz] = idx - 1  # as LIBSVM numbers them; a 0-based file's are moved back after
            vals[nnz] = v
            nnz += 1
        labels[n] = y
        n += 1
        indptr[n] = nnz
        pos = end + 1
    return n, "", -1, least


@njit(nogil=True, cache=True)
def _first_duplicate(indptr, cols, width):  # type: ignore[no-untyped-def]
    """The first data row holding a column twice and that column, or (-1, -1): one pass,
    each column marked with the last row it was seen in (sorting every entry's (row, column)
    key for this took 0.13 s of news20's 0.2 s read)."""
    seen = np.full(width, -1, np.int64)
    for i in range(indptr.shape[0] - 1):
        for k in range(indptr[i], indptr[i + 1]):
            c = cols[k]
            if seen[c] == i:
                return i, c
            seen[c] = i
    return -1, -1


@njit(nogil=True, cache=True)
def _to_csc(indptr, cols, vals, n_cols):  # type: ignore[no-untyped-def]
    """The CSC form of a CSR matrix: column pointers, row of each entry, values."""
    counts = np.zeros(n_cols + 1, np.int64)
    for k in range(cols.shape[0]):
        counts[cols[k] + 1] += 1
    for j in range(n_cols):
        counts[j + 1] += counts[j]
    fill = counts[:-1].copy()
    rows = np.empty(cols.shape[0], np.int64)
    out = np.empty(cols.shape[0], np.float64)
    for i in range(indptr.shape[0] - 1):
        for k in range(indptr[i], indptr[i + 1]):
            p = fill[cols[k]]
            rows[p] = i
            out[p] = vals[k]
            fill[cols[k]] = p + 1
    return counts, rows, out


#: bytes a column costs whether any row has it: its pointer here, and a solver's arrays of one
#: float a feature (coefficient, priority, norm, curvature, gradient, ...: ``coordinate.py``)
COLUMN_BYTES = 128


#: the largest target or feature value taken: squared and summed over the rows, as the objective
#: and the solver's column norms are, a larger one overflows float64 (1.8e308)
LARGEST_VALUE = 1e150


def _check_magnitudes(path: str, labels: np.ndarray, indptr: np.ndarray, vals: np.ndarray) -> None:
    """Refuse a target or value so large that its square overflows: the objective came out
    as inf and its duality gap NaN, after the whole job."""
    for what, values in (("target", labels), ("feature value", vals)):
        # the extremes, not np.abs: no copy of news20's 9 * 10^6 values (9 ms against 24)
        if values.size and (big := max(float(values.max()), -float(values.min()))) > LARGEST_VALUE:
            at = int(np.argmax(np.abs(values) > LARGEST_VALUE))
            row = at if what == "target" else int(np.searchsorted(indptr[1:], at, side="right"))
            raise DataError(f"{path}: data line {row + 1} has the {what} {values[at]:g}, above {LARGEST_VALUE:g} in "
                            f"magnitude (the largest is {big:g}): its square overflows float64 in the objective; "
                            "scale the targets and feature values")


def _check_width(path: str, width: int, indptr: np.ndarray, cols: np.ndarray) -> None:
    """Refuse a feature index so large that a column up to it would not fit in memory:
    indices are column numbers (every one up to the largest gets a coefficient), and a
    hashed feature's 64-bit index is not one."""
    row = int(np.searchsorted(indptr[1:], int(np.argmax(cols)), side="right"))
    check_fits(f"{path}: data line {row + 1} has feature index {width:,}, and every feature up to it gets a "
               "coefficient", width, COLUMN_BYTES, "number the features from 1 without gaps (or hash them into fewer)")


#: bytes a column costs in each worker of a job (its copy of the data's pointers and the solver's
#: arrays): 10^7 columns took 1.41 GB more a worker (news20-like rows, 1 to 4 workers, peak RSS)
WORKER_COLUMN_BYTES = 144


def check_job_fits(path: str, width: int, workers: int, table_bytes: int) -> None:
    """Refuse a job whose ``width`` columns, in the driver, in each of ``workers`` and in the
    coefficients' table (``table_bytes`` on the servers), would not fit in this machine's
    free memory: a worker killed by the kernel otherwise, and the rest going on without it."""
    check_fits(f"{path}: the feature index {width:,} gives every feature up to it a coefficient, in the driver, "
               f"in each of the {workers} workers and in the servers' table", width,
               16 + WORKER_COLUMN_BYTES * workers + -(-table_bytes // max(width, 1)),
               "number the features from 1 without gaps (or hash them into fewer), or run fewer --workers")


@dataclass(frozen=True)
class Matrix:
    """``n_rows × n_cols`` sparse data by column (``colptr``, ``rows``, ``values``: CSC)
    and the targets ``y``."""

    y: np.ndarray  # float64[n_rows]
    colptr: np.ndarray  # int64[n_cols + 1]
    rows: np.ndarray  # int64[nnz]
    values: np.ndarray  # float64[nnz]
    base: int = 1  # the file's first feature index: column j is its feature j + base

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.y.shape[0]), int(self.colptr.shape[0] - 1)

    @property
    def nnz(self) -> int:
        return int(self.rows.shape[0])


def read_libsvm_matrix(path: str, n_features: int | None = None) -> Matrix:
    """Read LIBSVM ``path`` (gz/bz2/xz by extension, any fsspec URL) whole.

    Indices start at 1, as LIBSVM's do, unless an index 0 appears: then at 0, as
    scikit-learn's ``dump_svmlight_file`` writes them by default and its
    ``load_svmlight_file`` reads them (``Matrix.base``).  svmlight's ``qid:`` after the
    target and comments from ``#`` are skipped.  ``n_features``: the number of columns
    (default: up to the largest index seen); an index past it is an error.  Duplicate
    indices in a line are an error too (LIBSVM has one value a feature).

    Raises:
        DataError: missing or empty file, or a malformed line (file and line named).
    """
    raw, buf = read_whole(path)
    lines = raw.count(b"\n")
    tokens = raw.count(b":")  # an upper bound on the entries
    labels, indptr = np.empty(lines, np.float64), np.empty(lines + 1, np.int64)
    cols, vals = np.empty(tokens, np.int64), np.empty(tokens, np.float64)
    n, err, at, least = _parse(buf, labels, indptr, cols, vals)
    if err:
        raise bad_line(path, raw, buf, at, err, "each line must be 'target index:value ...' with numeric "
                       "values (fix or remove the line)")
    if n == 0:
        raise DataError(f"{path} has no data lines; expected LIBSVM lines 'target index:value ...'")
    nnz = int(indptr[n])
    if nnz == 0:
        raise DataError(f"{path}: none of its {n:,} lines has a feature (only targets); expected LIBSVM lines "
                        "'target index:value ...'")
    cols, vals = cols[:nnz], vals[:nnz]
    _check_magnitudes(path, labels[:n], indptr[:n + 1], vals)
    base = 1 if least > 0 else 0  # as scikit-learn's load_svmlight_file reads: 0-based once an index 0 is seen
    if base == 0:
        cols += 1
    seen = int(cols.max()) + 1
    width = seen if n_features is None else n_features
    if seen > width:
        row = int(np.searchsorted(indptr[1:n + 1], int(np.argmax(cols >= width)), side="right"))
        raise DataError(f"{path}: data line {row + 1} has feature index {int(cols.max()) + base}, above the "
                        f"{width} features expected; give a larger number of features or fix the file")
    _check_width(path, width, indptr[:n + 1], cols)
    row, col = _first_duplicate(indptr[:n + 1], cols, width)
    if row >= 0:
        raise DataError(f"{path}: data line {row + 1} has feature {col + base} twice; LIBSVM has one value a "
                        "feature (sum or drop the duplicates)")
    colptr, rows, values = _to_csc(indptr[:n + 1], cols, vals, width)
    return Matrix(labels[:n].copy(), colptr, rows, values, base)
