"""The topic totals and α's sums on their tables (``lda/topic_delta``, ``lda/alpha_sums``): float32
rows that carry int64 counts and float64 sums exactly, each as two float32 halves; and the
topic totals as a worker samples with them (``TopicTotals``)."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import numpy as np


def encode(counts: np.ndarray) -> np.ndarray:
    """int64 counts → float32 ``[hi, lo]`` halves, each exact (|count| < 2^48)."""
    hi = np.floor_divide(counts, 1 << 24)
    return np.concatenate([hi, counts - hi * (1 << 24)]).astype(np.float32)


def decode(rows: np.ndarray) -> np.ndarray:
    K = rows.shape[-1] // 2
    return (rows[..., :K].astype(np.int64) << 24) + rows[..., K:].astype(np.int64)


def alpha_row(num: float, den: float, round_: int) -> np.ndarray:
    """``alpha_sums``' row: each sum as a float32 and what float32 lost of it (so that the sum of
    the halves is the float64 to ~1e-14), and the round it is of (exact below 2^24)."""
    sums = np.array([num, den])
    hi = sums.astype(np.float32)
    lo = (sums - hi).astype(np.float32)
    return np.array([[hi[0], lo[0], hi[1], lo[1], round_]], np.float32)


class TopicTotals:
    """The topic totals ``n_k`` as one worker samples with them (``nk``, which the sampler
    changes in place): every worker's changes through the rounds observed (``seen``), and
    this worker's own of the rounds not observed yet (``own``)."""

    def __init__(self, topics: int) -> None:
        self.reset(np.zeros(topics, np.int64))

    def reset(self, nk: np.ndarray) -> None:
        """``nk`` is every worker's whole count, nothing in flight."""
        self.nk, self.seen = nk, nk.copy()
        self.own: dict[int, np.ndarray] = {}
        self.pending: list[tuple[int, Any]] = []  # (round observed, the pull of every live worker's changes to it)

    def observe(self, round_: int, pull: Any) -> None:
        self.pending.append((round_, pull))

    def take(self) -> None:
        """The rounds observed: every live worker's changes to them, in ``seen``."""
        for round_, future in self.pending:
            self.seen += decode(future.result(timeout=600)).sum(0)
            self.own.pop(round_, None)
        self.pending = []
        self._sum()

    def behind(self, round_: int, rows: np.ndarray, me: int) -> None:
        """``nk`` is every worker's whole count after ``round_``, but the next round starts as
        it would have without a stop: the others' changes of ``round_`` not taken yet (``rows``:
        every live worker's, this worker's at ``me``), to be taken as observed."""
        changes = decode(rows)
        self.seen = self.nk - changes.sum(0)
        self.own = {round_: changes[me]}
        taken: Future[np.ndarray] = Future()
        taken.set_result(rows)
        self.pending = [(round_, taken)]
        self._sum()

    def _sum(self) -> None:
        self.nk = self.seen + sum(self.own.values(), np.zeros_like(self.seen))
