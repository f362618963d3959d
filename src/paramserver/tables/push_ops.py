"""What a pushed row does to a stored one: the push operations (``Client.push(op=...)``).

``update`` applies the table's rule to a gradient (``update_rules.update_row``); ``add``,
``assign``, ``max`` and ``min`` set the value columns from the pushed ones and leave the
rule's state alone.  ``merge`` is no user's: a worker's row cache that trains its rows
itself (``RowCacheSpec.apply == "local"``, ``client/row_cache.py``) pushes what its rule
did to a row since the server's copy was read, the whole row (value and state) wide, and
the server adds it: the state's columns, and the value's where the rule's value is a sum
of its steps (SGD, AdaGrad); where it is a function of the state (FTRL's weight of its
``z`` and ``n``) the value is computed from the merged state, as the rule computes it.
So two workers' changes to one row add up, and the server's row is, to rounding, the row
the sequence of their steps would have left where each worker saw the other's steps late.
Rules whose state does not add (Adam's and RMSProp's moving averages, a user's rule) take
no ``merge``: their caches push gradient sums.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from numba import njit

from paramserver.tables.optim import (
    ADAGRAD_KIND,
    FTRL_ADAGRAD_INV_ALPHA,
    FTRL_ADAGRAD_KIND,
    FTRL_INV_ALPHA,
    FTRL_KIND,
    SGD_KIND,
)
from paramserver.tables.update_rules import update_row

if TYPE_CHECKING:
    from paramserver.tables.spec import TableSpec

OP_UPDATE, OP_ADD, OP_ASSIGN, OP_MAX, OP_MIN, OP_MERGE = 0, 1, 2, 3, 4, 5
#: the operations a client's push may name
PUSH_OPS = {"update": OP_UPDATE, "add": OP_ADD, "assign": OP_ASSIGN, "max": OP_MAX, "min": OP_MIN}
#: the row cache's merge of a row's change (its pushes are whole rows: ``TableSpec.width``)
MERGE = "merge"
#: the built-in rules whose rows merge (``merge_row``)
MERGEABLE_KINDS = (SGD_KIND, ADAGRAD_KIND, FTRL_KIND, FTRL_ADAGRAD_KIND)


def merge_refusal(spec: TableSpec) -> str:
    """Why ``spec``'s rows cannot be read whole and merged (a cache's ``apply=local``), or ""
    where they can: a built-in rule whose state adds, float32 rows in memory, and nothing
    that decides what is stored.  Filters do not refuse: a merge and a whole row's reply
    go through their chain's lossless filters alone (``client/filtering.py``'s ``wire``,
    ``server/data.py``'s ``serve_pull``), a cache's gradients of keys it does not hold
    through the whole chain, as any push's."""
    reasons = [(spec.optimizer.kind not in MERGEABLE_KINDS,
                f"its rule ({spec.optimizer.name}) keeps a state that does not add (sgd, adagrad, ftrl and "
                "ftrl_adagrad do)"),
               (spec.aggregate, "it aggregates a clock's pushes (BSP)"),
               (spec.storage != "float32", f"its rows are {spec.storage}"),
               (spec.memory != 0, "it has a memory budget (rows on disk)"),
               (bool(spec.lifecycle), "it has a key lifecycle")]
    return "; ".join(why for refused, why in reasons if refused)


@njit(inline="always", nogil=True, cache=True)
def ftrl_weight(z, n, inv_alpha, beta, l1, l2):  # type: ignore[no-untyped-def]
    """FTRL-Proximal's weight of state ``z``, ``n`` (``update_rules._ftrl``'s last step)."""
    if abs(z) <= l1:
        return 0.0
    sign = 1.0 if z > 0 else -1.0
    return -(z - sign * l1) / ((beta + math.sqrt(n)) * inv_alpha + l2)


@njit(inline="always", nogil=True, cache=True)
def merge_row(rows, s, delta, i, dim, okind, ohp):  # type: ignore[no-untyped-def]
    """Row ``s`` (value and state) plus the change ``delta[i]`` a cache's rule made to it."""
    for j in range(delta.shape[1]):  # a row's value and state (a dense row's flag after them is not pushed)
        rows[s, j] = rows[s, j] + delta[i, j]
    if okind == FTRL_KIND:
        for j in range(dim):
            rows[s, j] = ftrl_weight(float(rows[s, dim + j]), float(rows[s, 2 * dim + j]),
                                     ohp[FTRL_INV_ALPHA], ohp[1], ohp[2], ohp[3])
    elif okind == FTRL_ADAGRAD_KIND:  # FTRL on the linear weight ([z, n] first), AdaGrad on the factors
        rows[s, 0] = ftrl_weight(float(rows[s, dim]), float(rows[s, dim + 1]), ohp[FTRL_ADAGRAD_INV_ALPHA],
                                 ohp[1], ohp[2], ohp[3])


@njit(inline="always", nogil=True, cache=True)
def push_row(rows, s, grads, i, dim, op, okind, ohp):  # type: ignore[no-untyped-def]
    """Row ``s`` takes ``grads[i]`` as push operation ``op`` says."""
    if op == OP_UPDATE:
        update_row(rows, s, grads, i, dim, okind, ohp)
    elif op == OP_ADD:
        for j in range(dim):
            rows[s, j] = rows[s, j] + grads[i, j]
    elif op == OP_ASSIGN:
        for j in range(dim):
            rows[s, j] = grads[i, j]
    elif op == OP_MAX:
        for j in range(dim):
            if grads[i, j] > rows[s, j]:
                rows[s, j] = grads[i, j]
    elif op == OP_MIN:
        for j in range(dim):
            if grads[i, j] < rows[s, j]:
                rows[s, j] = grads[i, j]
    else:  # OP_MERGE
        merge_row(rows, s, grads, i, dim, okind, ohp)
