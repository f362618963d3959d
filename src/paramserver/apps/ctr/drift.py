"""Synthetic Criteo-format data that drifts from day to day: feature admission and eviction
measured over simulated days.

Run: ``paramserver synth --shape drift --days 7 --rows 1000000 --out /tmp/days [--seed S]``
writes ``/tmp/days/day-00.tsv`` … ``day-06.tsv``, ``--rows`` lines each, in the Criteo TSV of
the other shapes (a 0/1 label, 13 integer fields, 26 categorical fields of 8 hex digits), so
``paramserver train --format criteo`` reads them.

The shape, per day ``d = 0, 1, …``:

* Categorical field ``f`` draws a *rank* ``k`` with P(k) ~ k^-s_f (a continuous power law,
  floored: Zipf-like), folded onto the field's window
  (``s_f`` = 1.10, 1.125, 1.15, 1.175, 1.20 in turn; the windows are the Criteo Kaggle set's
  cardinalities, 3 to 10 131 227, ``synth.CRITEO_CARDINALITIES``), none missing.  Most of a
  day's distinct ids are then seen once: the long tail that admission after 2 sightings drops.
* Each rank is a *slot* holding one id at a time.  On every day ``d >= 1`` each slot, at every
  rank alike, retires its id with probability ``RETIRE_RATE`` = 0.25 (an independent coin per
  slot and day, hashed from the seed) and takes a fresh id born that day: a quarter of
  yesterday's ids, popular ones included, never appear again, and as many new ids (at the
  same ranks, so about a quarter of the popular ones too) appear.  An id lives a geometric
  number of days (mean 4); the ids of day 0 still alive on day ``k`` are 0.75^k of them.
* The 13 integer fields are log-normal with 20 % missing, as in ``heavy``; they do not drift.
* Labels come from a planted logistic model: every id has a weight (hashed from the id, so it
  holds while the id lives and yesterday's model helps today; a new id has a new weight) and
  integer buckets have fixed weights (``synth._margin``).  The intercept is set, by bisection
  on a 20 000-row sample of the day, to give the day's click rate
  ``0.25 + 0.04 sin(2 pi d / 7 + phi) + 0.02 u_d`` (``phi`` from the seed, ``u_d`` uniform in
  [-1, 1] from the seed and day): 0.19 to 0.31, moving by up to ~5 points a day.

Deterministic: day ``d``'s file depends only on (seed, d, rows), so any day can be written
alone (``write_day``).
"""

from __future__ import annotations

import math
import os

import numpy as np
from numba import njit

from paramserver.apps.ctr.synth import (
    _HEX,
    CHUNK_ROWS,
    CRITEO_CARDINALITIES,
    N_CAT,
    N_INT,
    _int_features,
    _margin,
    _write_rows,
    bias_for,
    check_seed,
)
from paramserver.errors import ConfigError
from paramserver.routing.hashing import hash64

RETIRE_RATE = 0.25
BASE_CTR, CTR_WAVE, CTR_NOISE = 0.25, 0.04, 0.02
DEFAULT_DAYS = 7
ZIPF_S = 1.10 + 0.025 * (np.arange(N_CAT) % 5)
_CARDS = np.array(CRITEO_CARDINALITIES, np.int64)
_INT_P = np.full(N_INT, 0.2)
_ROW_BYTES = 2 + N_INT * 21 + N_CAT * 9 + 1
_DAY_SALT = np.uint64(0x9E3779B97F4A7C15)
_BIRTH_SALT = np.uint64(0xD1B54A32D192ED03)


def day_path(out_dir: str, day: int) -> str:
    return os.path.join(out_dir, f"day-{day:02d}.tsv")


@njit(nogil=True, cache=True)
def _day_ids(ranks, day, seed_key, retire_below):  # type: ignore[no-untyped-def]
    """The id each slot (field, rank) holds on ``day``: a 64-bit hash of the slot and the day
    its id was born (the last day in 1..day whose coin retired the slot's previous id, else 0)."""
    n, m = ranks.shape
    ids = np.empty((n, m), np.uint64)
    for f in range(m):
        field_key = hash64(seed_key + np.uint64(f))
        for i in range(n):
            slot = hash64(field_key ^ hash64(np.uint64(ranks[i, f])))
            birth = np.uint64(0)
            for k in range(day, 0, -1):
                if hash64(slot + np.uint64(k) * _DAY_SALT) < retire_below:
                    birth = np.uint64(k)
                    break
            ids[i, f] = hash64(slot ^ (birth * _BIRTH_SALT + np.uint64(1)))
    return ids


def _seed_key(seed: int) -> np.uint64:
    return np.uint64(hash64(np.uint64(seed & 0xFFFFFFFFFFFFFFFF)))


def _ids(ranks: np.ndarray, day: int, seed: int) -> np.ndarray:
    retire_below = np.uint64(int(RETIRE_RATE * 2.0**64))
    ids: np.ndarray = _day_ids(ranks, day, _seed_key(seed), retire_below)
    return ids


def day_ctr(seed: int, day: int) -> float:
    """The click rate the day's intercept is set for (see the module's docstring)."""
    phase = np.random.default_rng([seed, 0xC7]).uniform(0.0, 2 * math.pi)
    noise = np.random.default_rng([seed, day, 0xC7]).uniform(-1.0, 1.0)
    return float(BASE_CTR + CTR_WAVE * math.sin(2 * math.pi * day / 7 + phase) + CTR_NOISE * noise)


def _ranks(rng: np.random.Generator, n: int) -> np.ndarray:
    """Zipf-like ranks of ``n`` rows: ``floor(x) - 1`` for ``x`` of density ``x^-s`` on [1, inf)
    (``P(rank = k) ~ (s - 1) k^-s``; the inverse CDF, 10x faster than ``Generator.zipf`` at
    ``s`` near 1), folded onto each field's window."""
    u = 1.0 - rng.random((n, N_CAT))  # (0, 1]
    x = np.minimum(u ** (-1.0 / (ZIPF_S - 1.0)), 2.0**62)
    ranks: np.ndarray = (x.astype(np.int64) - 1) % _CARDS
    return ranks


def _rows(rng: np.random.Generator, n: int, day: int, seed: int) -> tuple[np.ndarray, ...]:
    """Features of ``n`` rows of ``day`` and the planted margin (without intercept)."""
    ranks = _ranks(rng, n)
    cat_missing = np.zeros((n, N_CAT), np.bool_)
    ints, int_missing = _int_features(rng, n, _INT_P)
    ids = _ids(ranks, day, seed)
    z = _margin(ids, cat_missing, ints, int_missing)
    return ids, cat_missing, ints, int_missing, z


def _intercept(seed: int, day: int) -> float:
    """The intercept giving about ``day_ctr`` positives (bisection on a sample of the day)."""
    return bias_for(_rows(np.random.default_rng([seed, day, 0xB1A5]), 20_000, day, seed)[-1], day_ctr(seed, day))


def write_day(path: str, rows: int, day: int, seed: int = 0) -> int:
    """Write day ``day``'s ``rows`` lines to ``path``; return bytes."""
    _check_int("--rows", rows, 1)
    _check_int("day", day, 0)
    bias = _intercept(seed, day)
    rng = np.random.default_rng([seed, day])
    written = 0
    with open(path, "wb") as f:
        for start in range(0, rows, CHUNK_ROWS):
            n = min(CHUNK_ROWS, rows - start)
            ids, cat_missing, ints, int_missing, z = _rows(rng, n, day, seed)
            labels = (rng.random(n) < 1.0 / (1.0 + np.exp(-(z + bias)))).astype(np.int64)
            tokens = ids & np.uint64(0xFFFFFFFF)
            out = np.empty(n * _ROW_BYTES, np.uint8)
            size = _write_rows(labels, ints, int_missing, tokens, cat_missing, _HEX, out)
            f.write(out[:size].tobytes())
            written += size
    return written


def write_drift(out_dir: str, rows: int, days: int = DEFAULT_DAYS, seed: int = 0) -> int:
    """Write ``days`` files ``out_dir/day-DD.tsv`` of ``rows`` lines each (the folder is made
    if missing); return bytes."""
    _check_int("--rows", rows, 1)
    _check_int("--days", days, 1)
    check_seed(seed)
    if out_dir.endswith(".gz"):
        raise ConfigError(f"--shape drift writes a folder of day files; --out {out_dir!r} names a .gz file")
    if os.path.isfile(out_dir):
        raise ConfigError(f"--shape drift writes a folder of day files; --out {out_dir!r} is a file")
    os.makedirs(out_dir, exist_ok=True)
    return sum(write_day(day_path(out_dir, d), rows, d, seed) for d in range(days))


def _check_int(name: str, value: int, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"{name} must be an int >= {least}, got {value!r}")
