"""Learners run side by side in one run: taking turns, so that a slow spell of this shared
VM hits each of them alike (``bench/train.py``, ``bench/headline.py``); and the median of
the runs.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Callable, Mapping
from typing import Any

Learner = Callable[[], dict[str, Any]]


def interleave(learners: Mapping[str, Learner], repeat: int, warmup: int = 0, tag: str = "",
               warm: tuple[str, ...] = ()) -> dict[str, list[dict]]:
    """Every learner ``warmup`` times untimed (and those named in ``warm`` once more, first),
    then ``repeat`` rounds of each in turn.  ``warm``: learners whose first run pays a
    one-off cost the others do not, such as numba compiling a fresh checkout's kernels into
    its cache (a first ``paramserver lasso`` took 35 s, the next 9.6 s).

    Returns:
        Each learner's timed runs, by its name in ``learners``.
    """
    for name in warm:  # untimed: what a first run of this learner alone pays
        learners[name]()
        print(tag, "warm-up", name, file=sys.stderr)
    for _ in range(warmup):  # untimed: files just written, the machine settling after the set-up
        for name, learner in learners.items():
            learner()
            print(tag, "warm-up", name, file=sys.stderr)
    runs: dict[str, list[dict]] = {name: [] for name in learners}
    for _ in range(repeat):
        for name, learner in learners.items():
            run = learner()
            runs[name].append(run)
            print(tag, name, run, file=sys.stderr, flush=True)
    return runs


def median(xs: list[float]) -> float:
    """The median, NaN for no runs."""
    return float(statistics.median(xs)) if xs else math.nan
