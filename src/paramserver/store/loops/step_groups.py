"""A step of several batches in one compiled call (``Op.STEP`` with ``steps``: N,
``wire/step_groups.py``): each batch's rows read, its gradient computed and applied through
the table's rule, one batch after the other, with no Python between them.

Taken batch by batch, a batch cost the server ~70 µs of Python besides its kernels (its
rows' read, the gradient, the finite check and the update each called from Python, each
with its own checks and arrays): 0.15 s of the default job's 2 016 batches.  Here the
server checks the whole request first (``server/steps.py``), then calls this once; it
returns only when a vnode must grow (the caller grows it and calls again, resuming the
batch's update where it stopped, its gradient kept) or when a batch's gradient is not finite
(the batches before it are applied; it and those after it are not).

The arithmetic is the batch-by-batch path's, to the bit: the same request loops, rebound
per row with the table's rule (``store/specialize.py``), and the same gradient kernels
(``tables/steps.py``: logistic regression on rows of one column, a factorization machine on
wider ones), in the same order.  A batch's keys are probed once: ``lookup_request`` answers
the slots it found, and ``apply_request`` given them updates those slots and claims only the
keys not stored, from their homes, as it would without them (the same slots, the same bits);
after a growth the slots have moved, and the rest of the batch is probed for again.  The
server's side of the default job (``bench/server_replay.py``, four runs each way in turn):
0.654 s with two probes a key, 0.613 s with one.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from paramserver.store.loops.slots import AHEAD, apply_request, lookup_request
from paramserver.tables.steps import fm_step, logistic_step

#: rebound per table (``store/specialize.py``): the value columns of a row (1: a logistic
#: regression's weight; more: a factorization machine's ``[w, v_1..v_k]``)
DIM = 1

#: the columns of a group's ``ends``: where batch b's keys, vnode segments, occurrences and
#: examples start (row b) and end (row b + 1)
KEYS, SEGMENTS, OCCURRENCES, EXAMPLES = range(4)

#: what ``step_batches`` stopped at: every batch applied; a vnode to grow; a gradient not finite
DONE, GROW, NOT_FINITE = 0, 1, 2


@njit(nogil=True, cache=True)
def step_batches(d, keys0, rows0, meta0, slot, vnodes, counts, keys, inverse, indptr, vals, labels, ends,  # noqa: C901
                 b, seg, start, grads, preds, losses, l2, ohp, ikind, ihp, seed):
    """Take batches ``b`` on of a group (its arrays as the request brings them: keys,
    segments and occurrences end to end, batch b's offsets from ``ends[b, EXAMPLES] + b``),
    each batch's probabilities into ``preds`` and its summed log loss into ``losses[b]``.
    ``seg < 0``: batch b from its start; else its gradient is in ``grads`` already and its
    update resumes at key ``start`` of its segment ``seg``.  Returns ``(b, status, seg,
    start)``: ``DONE`` (b = the batches), ``GROW`` (batch b's segment ``seg`` must grow, then
    call again with these), or ``NOT_FINITE`` (batch b's gradient; batches before it applied)."""
    n = ends.shape[0] - 1
    while b < n:
        ka, kb = ends[b, KEYS], ends[b + 1, KEYS]
        sa, sb = ends[b, SEGMENTS], ends[b + 1, SEGMENTS]
        if seg < 0:  # the batch's rows, its gradient and its outputs
            ja, jb = ends[b, OCCURRENCES], ends[b + 1, OCCURRENCES]
            ra, rb = ends[b, EXAMPLES], ends[b + 1, EXAMPLES]
            rows = np.empty((kb - ka, DIM), np.float32)
            found, home, address = np.empty(kb - ka, np.int64), np.empty(kb - ka, np.int64), \
                np.zeros(kb - ka + AHEAD, np.int64)
            lookup_request(d, keys0, rows0, meta0, slot, vnodes[sa:sb], counts[sa:sb], keys[ka:kb], rows, found, home,
                           address, ikind, ihp, seed)
            offsets, occurs = indptr[ra + b:rb + b + 1], inverse[ja:jb]
            values = vals[ja:jb] if vals.shape[0] else vals
            if DIM == 1:
                g, loss, p = logistic_step(offsets, values, labels[ra:rb], occurs, rows, True)
            else:
                g, loss, p = fm_step(offsets, values, labels[ra:rb], occurs, rows, True, l2)
            for i in range(kb - ka):
                for j in range(DIM):
                    if not math.isfinite(g[i, j]):
                        return b, NOT_FINITE, 0, 0
                    grads[ka + i, j] = g[i, j]
            for i in range(rb - ra):
                preds[ra + i] = p[i]
            losses[b] = loss
            sg, at = apply_request(d, keys0, rows0, meta0, slot, vnodes[sa:sb], counts[sa:sb], keys[ka:kb],
                                   grads[ka:kb], 0, 0, found, home, address, ohp, ikind, ihp, seed)
        else:  # after a growth: the slots the read found have moved
            none = np.empty(0, np.int64)
            sg, at = apply_request(d, keys0, rows0, meta0, slot, vnodes[sa:sb], counts[sa:sb], keys[ka:kb],
                                   grads[ka:kb], seg, start, none, none, none, ohp, ikind, ihp, seed)
        if sg < sb - sa:
            return b, GROW, sg, at
        b, seg, start = b + 1, -1, 0
    return b, DONE, 0, 0
