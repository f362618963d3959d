"""Synthetic Criteo-format data of two shapes, for benchmarks at any size.

Run: ``paramserver synth --rows 1000000 --out /tmp/synth.tsv [--shape simple|heavy]``

``simple`` (the default): a label, 13 integer features (log-normal counts, a few
negatives, 0–45 % missing per field) and 26 categorical features (8 hex digits) whose
cardinalities run from 10 to 5 000 000 with Zipf-like frequencies (s 1.15–1.23) and
0–40 % missing.

``heavy``: the 26 categorical fields have the Criteo Kaggle set's own cardinalities
(3 to 10 131 227 distinct values), every value drawn from Zipf(1.15) and none missing,
and the 13 integer fields are log-normal with 20 % missing.  Most batches then touch many
keys seen once or never before, and the model grows to millions of keys: the shape of
real CTR logs, and a harder one for a parameter server than ``simple``.

In both, labels come from a planted logistic model over the same features (about 25 %
positives), so a learner has something real to find.  Deterministic for a given seed.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import lzma
import os
import sys
from typing import IO, Any

import numpy as np
from numba import njit

from paramserver.errors import ConfigError
from paramserver.routing.hashing import hash64, hash64_array

N_INT, N_CAT = 13, 26
SHAPES = ("simple", "heavy")
# distinct values of each categorical field in the Criteo Kaggle display-ad set (C1..C26)
CRITEO_CARDINALITIES = (1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27,
                        14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572)
_HEX = np.frombuffer(b"0123456789abcdef", np.uint8)
CHUNK_ROWS = 100_000


@njit(inline="always", nogil=True, cache=True)
def _put_int(out, pos, v, digits):  # type: ignore[no-untyped-def]
    """``v`` in decimal at ``out[pos:]``; returns the position after it."""
    if v < 0:
        out[pos] = 45
        pos += 1
        v = -v
    nd = 0
    while True:
        digits[nd] = 48 + v % 10
        nd += 1
        v //= 10
        if v == 0:
            break
    for d in range(nd - 1, -1, -1):
        out[pos] = digits[d]
        pos += 1
    return pos


@njit(inline="always", nogil=True, cache=True)
def _put_hex(out, pos, t, hexdigits):  # type: ignore[no-untyped-def]
    """``t``'s low 32 bits as 8 hex digits at ``out[pos:]``; returns the position after them."""
    for d in range(7, -1, -1):
        out[pos + d] = hexdigits[t & np.uint64(15)]
        t >>= np.uint64(4)
    return pos + 8


@njit(nogil=True, cache=True)
def _write_rows(labels, ints, int_missing, tokens, cat_missing, hexdigits, out):  # type: ignore[no-untyped-def]
    """Format rows as Criteo TSV into ``out``; return the bytes written."""
    pos = 0
    digits = np.empty(24, np.uint8)
    n_int = ints.shape[1]
    for i in range(labels.shape[0]):
        out[pos] = 48 + labels[i]
        pos += 1
        for f in range(n_int + tokens.shape[1]):  # the integer columns, then the categorical ones
            out[pos] = 9  # every column has its tab, a missing one too
            pos += 1
            if f < n_int:
                if not int_missing[i, f]:
                    pos = _put_int(out, pos, ints[i, f], digits)
            elif not cat_missing[i, f - n_int]:
                pos = _put_hex(out, pos, tokens[i, f - n_int], hexdigits)
        out[pos] = 10
        pos += 1
    return pos


@njit(nogil=True, cache=True)
def _planted_weight(field, value, scale):  # type: ignore[no-untyped-def]
    h = hash64(value * np.uint64(0x9E3779B97F4A7C15) + np.uint64(field) + np.uint64(0xC0FFEE))
    return scale * (np.float64(h >> np.uint64(11)) / 9007199254740992.0 * 2.0 - 1.0)


@njit(nogil=True, cache=True)
def _margins(ranks, cat_missing, buckets, int_missing, cat_scale, int_scale):  # type: ignore[no-untyped-def]
    n = ranks.shape[0]
    out = np.zeros(n, np.float64)
    for i in range(n):
        z = 0.0
        for f in range(ranks.shape[1]):
            if not cat_missing[i, f]:
                z += _planted_weight(f, np.uint64(ranks[i, f]), cat_scale[f])
        for f in range(buckets.shape[1]):
            if not int_missing[i, f]:
                z += _planted_weight(100 + f, np.uint64(buckets[i, f]), int_scale)
        out[i] = z
    return out


def _features(rng: np.random.Generator, n: int, cards: np.ndarray, cat_p: np.ndarray,
              int_p: np.ndarray, zipf_s: np.ndarray) -> tuple[np.ndarray, ...]:
    """Category ranks, integer values and their missing masks for ``n`` rows."""
    ranks = np.empty((n, N_CAT), np.int64)
    for f, card in enumerate(cards):
        ranks[:, f] = (rng.zipf(zipf_s[f], n) - 1) % card
    cat_missing = rng.random((n, N_CAT)) < cat_p
    ints, int_missing = _int_features(rng, n, int_p)
    return ranks, cat_missing, ints, int_missing


def _int_features(rng: np.random.Generator, n: int, int_p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Integer values (log-normal counts) and their missing mask for ``n`` rows."""
    ints = np.floor(rng.lognormal(1.0, 1.6, (n, N_INT))).astype(np.int64)
    ints[:, 1] -= (rng.random(n) < 0.05).astype(np.int64) * 3  # field 2 has small negatives, as in Criteo
    int_missing = rng.random((n, N_INT)) < int_p
    return ints, int_missing


def _margin(ranks: np.ndarray, cat_missing: np.ndarray, ints: np.ndarray, int_missing: np.ndarray) -> np.ndarray:
    """The planted model's logit (without bias)."""
    buckets = np.where(ints > 2, np.floor(np.log(np.maximum(ints, 1)) ** 2) + 3, ints + 1).astype(np.int64)
    margin: np.ndarray = _margins(ranks, cat_missing, buckets, int_missing, np.linspace(0.9, 0.3, N_CAT), 0.25)
    return margin


def _chunk(rng: np.random.Generator, n: int, cards: np.ndarray, cat_p: np.ndarray, int_p: np.ndarray,
           zipf_s: np.ndarray, bias: float) -> tuple[np.ndarray, ...]:
    ranks, cat_missing, ints, int_missing = _features(rng, n, cards, cat_p, int_p, zipf_s)
    z = _margin(ranks, cat_missing, ints, int_missing) + bias
    labels = (rng.random(n) < 1.0 / (1.0 + np.exp(-z))).astype(np.int64)
    field_salt = np.arange(N_CAT, dtype=np.uint64) << np.uint64(40)
    tokens = hash64_array((ranks.astype(np.uint64) + field_salt).ravel()).reshape(n, N_CAT) & np.uint64(0xFFFFFFFF)
    return labels, ints, int_missing, tokens, cat_missing


def check_seed(seed: int) -> None:
    """``--seed``: numpy's generators take a whole number >= 0."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 1 << 63:
        raise ConfigError(f"--seed must be a whole number in [0, 2^63), got {seed!r}")


def write_synth(path: str, rows: int, seed: int = 0, shape: str = "simple") -> int:
    """Write ``rows`` Criteo-format lines of ``shape`` (``SHAPES``) to ``path`` (``_output``:
    ``-`` standard output, compressed by a .gz, .bz2 or .xz name); return bytes."""
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise ConfigError(f"--rows must be an int >= 1, got {rows!r}")
    if shape not in SHAPES:
        raise ConfigError(f"--shape must be one of {', '.join(SHAPES)}, got {shape!r}")
    check_seed(seed)
    rng = np.random.default_rng(seed)
    if shape == "heavy":
        cards = np.array(CRITEO_CARDINALITIES, np.int64)
        cat_p, int_p, zipf_s = np.zeros(N_CAT), np.full(N_INT, 0.2), np.full(N_CAT, 1.15)
    else:
        cards = np.geomspace(10, 5_000_000, N_CAT).astype(np.int64)
        cat_p = rng.uniform(0.0, 0.4, N_CAT)
        int_p = rng.uniform(0.0, 0.45, N_INT)
        zipf_s = 1.15 + 0.02 * (np.arange(N_CAT) % 5)
    bias = _calibrate_bias(seed, cards, cat_p, int_p, zipf_s)
    written = 0
    with _output(path) as f:
        for start in range(0, rows, CHUNK_ROWS):
            n = min(CHUNK_ROWS, rows - start)
            labels, ints, int_missing, tokens, cat_missing = _chunk(rng, n, cards, cat_p, int_p, zipf_s, bias)
            out = np.empty(n * (2 + N_INT * 21 + N_CAT * 9 + 1), np.uint8)
            size = _write_rows(labels, ints, int_missing, tokens, cat_missing, _HEX, out)
            f.write(out[:size].tobytes())
            written += size
    return written


#: the names synth compresses by, as --data reads them back
_COMPRESSORS: dict[str, Any] = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}


def _output(path: str) -> contextlib.AbstractContextManager[IO[bytes]]:
    """Where ``--out`` writes: standard output for ``-``, compressed by a ``.gz``, ``.bz2`` or
    ``.xz`` name, else plain; a folder or another archive's name refused (a ``.zip`` got plain
    text under its name, which ``--data`` then refused as not zip data)."""
    if path == "-":
        return contextlib.nullcontext(sys.stdout.buffer)
    if os.path.isdir(path):
        raise ConfigError(f"--out {path} is a folder; give a file name (.gz, .bz2 or .xz to compress)")
    suffix = os.path.splitext(path)[1].lower()
    if suffix in _COMPRESSORS:
        return _COMPRESSORS[suffix](path, "wb")  # type: ignore[no-any-return]
    if suffix in (".zip", ".zst", ".lz4", ".tar", ".tgz", ".7z", ".lzma"):
        raise ConfigError(f"--out {path}: synth writes plain text, or compressed by a name ending in .gz, .bz2 or "
                          f".xz, not {suffix}")
    return open(path, "wb")


def _calibrate_bias(seed: int, cards: np.ndarray, cat_p: np.ndarray, int_p: np.ndarray, zipf_s: np.ndarray,
                    target: float = 0.25) -> float:
    """The bias giving about ``target`` positives (bisection on a sample)."""
    return bias_for(_margin(*_features(np.random.default_rng(seed + 1), 20_000, cards, cat_p, int_p, zipf_s)),
                    target)


def bias_for(z: np.ndarray, target: float) -> float:
    """The bias ``b`` whose logistic model ``sigmoid(z + b)`` has mean ``target`` (bisection)."""
    lo, hi = -10.0, 10.0
    for _ in range(40):
        mid = (lo + hi) / 2
        if np.mean(1 / (1 + np.exp(-(z + mid)))) > target:
            hi = mid
        else:
            lo = mid
    return (lo + hi) / 2
