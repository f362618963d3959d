"""Progressive validation: every example scored by the model before it trains on it (as
Vowpal Wabbit reports it), summed over sliding windows.

A worker keeps, for the examples it trained since its last progress report, the count,
the log loss summed, and two histograms of the scores (``Scores``: positives and
negatives, ``BINS`` bins of the logit over [-``SPAN``, ``SPAN``]), and sends them with the
report, sparse.  The scheduler keeps the reports of the last while (``Scoreboard``) and
answers, in the job's status, log loss and AUC over

* the last ``window_examples`` examples (whole reports: at least that many),
* the last ``window_seconds`` seconds,
* the whole run,

and the trend: the time window's log loss and AUC minus the window's before it (a value
that cannot be had, an empty window or one class only, is None).
The AUC of a histogram counts a tie (one bin: 0.008 of a logit) as half, as the exact
AUC counts equal scores; on CTR scores it is within 1e-4 of the exact one.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numba import njit

BINS = 4096
SPAN = 16.0
WINDOW_EXAMPLES = 100_000
WINDOW_SECONDS = 60.0
KEEP_REPORTS = 4096  # reports kept at most, whatever the windows say
CACHE_S = 0.25  # a summary is worked out at most this often (the driver, the feeder and the dashboard ask)


def bins_of(p: np.ndarray) -> np.ndarray:
    """Each probability's bin: its logit's place in [-SPAN, SPAN]."""
    q = np.clip(np.asarray(p, np.float64), 1e-12, 1 - 1e-12)
    z = np.log(q) - np.log1p(-q)
    return np.clip(((z + SPAN) * (BINS / (2 * SPAN))).astype(np.int64), 0, BINS - 1)


@njit(cache=True)  # keeps the GIL: a batch's few hundred scores take a few µs
def _count_bins(p: np.ndarray, labels: np.ndarray, pos: np.ndarray, neg: np.ndarray) -> None:
    """``bins_of`` and the two histograms' counts in one pass: the dozen NumPy calls it
    took (two 4 096-bin ``bincount`` among them) cost ~50 µs of every training batch."""
    scale = BINS / (2 * SPAN)
    for i in range(p.shape[0]):
        q = float(p[i])
        q = 1e-12 if q < 1e-12 else (1 - 1e-12 if q > 1 - 1e-12 else q)
        z = (np.log(q) - np.log1p(-q) + SPAN) * scale
        b = 0  # NaN and below the span: bin 0, as NumPy's clip of them
        if z >= BINS - 1:
            b = BINS - 1
        elif z > 0:
            b = int(z)
        if labels[i] > 0:
            pos[b] += 1
        else:
            neg[b] += 1


@dataclass
class Scores:
    """A worker's scores since its last report: count, log loss, the two histograms."""

    n: int = 0
    loss: float = 0.0
    pos: np.ndarray = field(default_factory=lambda: np.zeros(BINS, np.int64))
    neg: np.ndarray = field(default_factory=lambda: np.zeros(BINS, np.int64))

    def add(self, p: np.ndarray, labels: np.ndarray, loss_sum: float) -> None:
        """A batch's probabilities (before its own update), labels and summed log loss."""
        p, labels = np.asarray(p), np.asarray(labels)
        _count_bins(p, labels, self.pos, self.neg)
        self.n += int(p.shape[0])
        self.loss += float(loss_sum)

    def take(self) -> dict[str, Any] | None:
        """The report's part (sparse), and start again; None when nothing was scored."""
        if not self.n:
            return None
        pi, ni = np.flatnonzero(self.pos), np.flatnonzero(self.neg)
        out = {"n": self.n, "loss": self.loss, "pos": [pi.tolist(), self.pos[pi].tolist()],
               "neg": [ni.tolist(), self.neg[ni].tolist()]}
        self.n, self.loss = 0, 0.0
        self.pos[:] = 0
        self.neg[:] = 0
        return out


def auc_of(pos: np.ndarray, neg: np.ndarray) -> float:
    """The AUC of the two histograms (a tie counts half); NaN without both classes."""
    npos, nneg = float(pos.sum()), float(neg.sum())
    if not npos or not nneg:
        return float("nan")
    below = np.cumsum(neg) - neg
    return float((pos * (below + 0.5 * neg)).sum() / (npos * nneg))


@dataclass
class _Report:
    at: float
    n: int
    loss: float
    pos: tuple[np.ndarray, np.ndarray]
    neg: tuple[np.ndarray, np.ndarray]


def _sparse(pair: Any) -> tuple[np.ndarray, np.ndarray]:
    idx, counts = (np.asarray(x, np.int64) for x in pair)
    if idx.shape != counts.shape or idx.ndim != 1 or (idx.size and (idx.min() < 0 or idx.max() >= BINS)) \
            or (counts.size and counts.min() < 0):
        raise ValueError("a histogram is [bins, counts] of equal length, bins in [0, BINS), counts >= 0")
    return idx, counts


class Scoreboard:
    """The scheduler's: the workers' reports of the last while, and their windows."""

    def __init__(self, window_examples: int = WINDOW_EXAMPLES, window_seconds: float = WINDOW_SECONDS) -> None:
        self.window_examples, self.window_seconds = window_examples, window_seconds
        self.reports: deque[_Report] = deque()
        self.all_n, self.all_loss = 0, 0.0
        self.all_pos, self.all_neg = np.zeros(BINS, np.int64), np.zeros(BINS, np.int64)
        self._cached: tuple[tuple[int, int], float, dict[str, Any]] | None = None

    def add(self, part: Any, now: float | None = None) -> None:
        """A worker's report (``Scores.take``); a malformed one is dropped (ValueError)."""
        if not isinstance(part, dict):
            raise ValueError(f"scores must be a map, got {type(part).__name__}")
        n, loss = int(part["n"]), float(part["loss"])
        if n <= 0 or not math.isfinite(loss):
            raise ValueError(f"scores need n > 0 and a finite loss, got {n}, {loss}")
        report = _Report(time.monotonic() if now is None else now, n, loss, _sparse(part["pos"]), _sparse(part["neg"]))
        self.reports.append(report)
        self.all_n += n
        self.all_loss += loss
        np.add.at(self.all_pos, report.pos[0], report.pos[1])
        np.add.at(self.all_neg, report.neg[0], report.neg[1])
        self._forget(report.at)

    def _forget(self, now: float) -> None:
        """Keep two time windows' reports and at least two example windows' (the trend's too)."""
        while len(self.reports) > 1:
            first = self.reports[0]
            old = now - first.at > 2 * self.window_seconds
            beyond = sum(r.n for r in self.reports) - first.n >= 2 * self.window_examples
            if not ((old and beyond) or len(self.reports) > KEEP_REPORTS):
                break
            self.reports.popleft()

    @staticmethod
    def _summary(reports: list[_Report]) -> dict[str, Any]:
        pos, neg = np.zeros(BINS, np.int64), np.zeros(BINS, np.int64)
        n, loss = 0, 0.0
        for r in reports:
            np.add.at(pos, r.pos[0], r.pos[1])
            np.add.at(neg, r.neg[0], r.neg[1])
            n, loss = n + r.n, loss + r.loss
        return {"examples": n, "logloss": loss / n if n else float("nan"), "auc": auc_of(pos, neg)}

    def summary(self, now: float | None = None) -> dict[str, Any]:
        """Log loss and AUC over the windows, the whole run, and the trend (see the module);
        asked again within ``CACHE_S`` with no new report, the last answer."""
        at = time.monotonic() if now is None else now
        key = (len(self.reports), self.all_n)
        if self._cached is not None and self._cached[0] == key and at - self._cached[1] < CACHE_S:
            return self._cached[2]
        answer = _nan_free(self._summarise(at))
        self._cached = (key, at, answer)
        return answer

    def _summarise(self, now: float) -> dict[str, Any]:
        newest: list[_Report] = []
        n = 0
        for r in reversed(self.reports):
            if n >= self.window_examples:
                break
            newest.append(r)
            n += r.n
        recent = [r for r in self.reports if now - r.at <= self.window_seconds]
        before = [r for r in self.reports if self.window_seconds < now - r.at <= 2 * self.window_seconds]
        by_time, earlier = self._summary(recent), self._summary(before)
        all_runs = {"examples": self.all_n, "logloss": self.all_loss / self.all_n if self.all_n else float("nan"),
                    "auc": auc_of(self.all_pos, self.all_neg)}
        return {"window_examples": {"size": self.window_examples, **self._summary(newest)},
                "window_seconds": {"size": self.window_seconds, **by_time},
                "all": all_runs,
                "trend": {"logloss": by_time["logloss"] - earlier["logloss"], "auc": by_time["auc"] - earlier["auc"],
                          "over_seconds": self.window_seconds}}


def _nan_free(summary: dict[str, Any]) -> dict[str, Any]:
    """NaN (an empty window, one class only) as None: the status goes out as JSON too,
    where NaN is no number a browser reads."""
    return {k: _nan_free(v) if isinstance(v, dict) else (None if isinstance(v, float) and math.isnan(v) else v)
            for k, v in summary.items()}
