"""The batch ramp of a training worker: its mini-batches start at one example and grow
with the examples it has trained on (``ramp_size``), re-cut from the reader's batches
(``ramped``), so that the first steps of a model that still changes fast stay within
reach of a per-example learner (see ``ramp_size``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from paramserver.data.batch import Batch, concat_batches, slice_batch


def ramp_size(seen: int, batch_size: int, ramp: float) -> int:
    """The mini-batch size after ``seen`` examples: ``ramp * sqrt(seen)``, from 1 up to
    ``batch_size`` (``ramp`` 0: always ``batch_size``).

    A batch's examples are all computed on the same (stale) weights, and its summed
    gradient is applied as one step.  Early on the model changes fast and one step of
    1000 examples overshoots what 1000 per-example steps would do; with per-coordinate
    rates that fall like 1/sqrt(examples) (AdaGrad, FTRL), a batch stays within the
    per-example learner's reach while it grows no faster than sqrt(examples seen).  So
    the first examples are learnt one at a time, a batch reaches 100 after 10^4
    examples, 1 000 after 10^6 and the default ``--batch-size`` 4 000 after 1.6 * 10^7.

    A batch that grows faster breaks that bound, and every key present in many rows
    (a field of few values) then overshoots at once.  The floor this rule once had (at
    least 1/16 of the examples seen past 65 536: ``--batch-size`` at once) looked free on
    heavy-tailed data, but at default flags it took LR's test log loss on 10^5 rows of
    planted-interaction data from 0.487 to 0.526 (0.445 to 0.754 on 3 * 10^5 rows with
    the floor moved to 2^18), and it stopped an FM's factors from growing (0.486 against
    0.408 at 10^6 rows, the same factor rates).  Without it a 10^6-row job makes ~2 000
    batches instead of ~750: ~35 % fewer examples a second and ~50 % more bytes an
    example on the heavy shape (docs/benchmarks.md, "FM's defaults").
    """
    if ramp <= 0:
        return batch_size
    return max(1, min(batch_size, int(ramp * math.sqrt(seen))))


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
                held.append(slice_batch(batch, lo, n))
                have, lo = have + n - lo, n
                continue
            else:
                tail = slice_batch(batch, lo, lo + size - have)
                piece = concat_batches([*held, tail]) if held else tail
                held, have, lo = [], 0, lo + size - have
            seen += len(piece)
            yield piece
    if held:
        yield concat_batches(held)
