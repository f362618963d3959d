"""The batch ramp of a training worker: its mini-batches start at one example and grow
with the examples it has trained on (``ramp_size``), re-cut from the reader's batches
(``ramped``), so that the first steps of a model that still changes fast stay within
reach of a per-example learner (see ``ramp_size``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from paramserver.data.batch import Batch, _concat, _slice

RAMP_FROM = 1 << 16  # past 65 536 examples ...
RAMP_FLOOR = 16  # ... a batch is at least 1/16 of the examples seen: big jobs reach --batch-size at once


def ramp_size(seen: int, batch_size: int, ramp: float) -> int:
    """The mini-batch size after ``seen`` examples: ``ramp * sqrt(seen)`` (and past 65 536
    examples at least ``seen / 16``), from 1 up to ``batch_size`` (``ramp`` 0: always
    ``batch_size``).

    A batch's examples are all computed on the same (stale) weights, and its summed
    gradient is applied as one step.  Early on the model changes fast and one step of
    1000 examples overshoots what 1000 per-example steps would do; with per-coordinate
    rates that fall like 1/sqrt(examples) (AdaGrad, FTRL), a batch stays within the
    per-example learner's reach while it grows no faster than sqrt(examples seen).  So
    the first examples are learnt one at a time and a batch reaches 100 after 10 000
    examples.  Past 65 536 examples (where the model has settled) the floor seen/16
    takes over: a batch of 4096 there (the default ``--batch-size`` 4000 at once), and a
    larger ``--batch-size`` is reached growing by 1/16 a batch.  A job of 10^6 examples
    then takes ~750 batches (~510 of them in its first 65 536 examples), against ~1 200
    with the earlier floor seen/256, for 20-30 % more examples a second and the same test
    log loss (heavy-tailed shape, docs/benchmarks.md); the small data sets, where the sqrt
    rule matters, never reach the floor.
    """
    if ramp <= 0:
        return batch_size
    floor = seen / RAMP_FLOOR if seen >= RAMP_FROM else 0
    return max(1, min(batch_size, int(max(ramp * math.sqrt(seen), floor))))


def ramped(batches: Iterator[Batch], batch_size: int, ramp: float, seen: int = 0) -> Iterator[Batch]:
    """``batches`` re-cut to ``ramp_size``: the sizes depend on the examples seen alone, not
    on where the reader's batches end (a piece may join the end of one and the start of
    the next); once the ramp reaches ``batch_size`` the reader's batches pass unchanged."""
    held: list[Batch] = []  # the start of the next piece, from earlier batches
    have = 0
    for batch in batches:
        lo, n = 0, len(batch)
        while lo < n:
            size = ramp_size(seen, batch_size, ramp)
            if not held and lo == 0 and size == n:
                piece, lo = batch, n  # no copy
            elif have + n - lo < size:  # too few here: they start the next piece
                held.append(_slice(batch, lo, n))
                have, lo = have + n - lo, n
                continue
            else:
                tail = _slice(batch, lo, lo + size - have)
                piece = _concat([*held, tail]) if held else tail
                held, have, lo = [], 0, lo + size - have
            seen += len(piece)
            yield piece
    if held:
        yield _concat(held)
