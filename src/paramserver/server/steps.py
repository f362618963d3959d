"""``Op.STEP``: a mini-batch's gradient computed and applied where its rows are
(``tables/steps.py`` has the arithmetic, ``client/step_calls.py`` the sender).

A step is a pull and a push in one request, the gradient computed between them here: the
request is checked whole (the table, its vnode segments, this server their primary, the
batch's offsets and indices) before any row is read; the rows are read as an ASP pull
reads them; the gradient goes the push's way (``DataPlane.pushed``: applied once whatever
the retries, its seq's, admitted by the lifecycle, forwarded to the copies), and the reply,
once every copy has it, carries each example's probability and the batch's summed log loss.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from paramserver.errors import ProtocolError
from paramserver.server.data import DataPlane, read_rows
from paramserver.server.install import check_grads
from paramserver.server.requests import checked_table
from paramserver.tables.steps import check_batch, step, unsuited
from paramserver.wire.message import Message, field
from paramserver.wire.step_arrays import read_step_arrays


def on_step(plane: DataPlane, msg: Message, identity: bytes = b"") -> list[Any] | None:
    """Take a step: read the rows, compute the batch's gradient (``model``: ``lr``, or ``fm``
    with its ``l2``), push it; the reply carries the examples' probabilities (``float32[n]``)
    and ``loss``, their summed log loss."""
    # the keys grouped by vnode, then the batch (CSR, occurrences indexing the keys), widened
    keys, vnodes, counts, inverse, indptr, vals, labels = read_step_arrays(msg)
    table = checked_table(plane.state, msg, keys.shape[0], vnodes, counts)
    spec, model = table.spec, field(msg, "model", str)
    why = unsuited(spec, model)
    if why is not None:
        raise ProtocolError(f"step on {spec.name!r}: {why}")
    l2 = msg.header.get("l2", 0.0)
    if isinstance(l2, bool) or not isinstance(l2, (int, float)) or not l2 >= 0 or not np.isfinite(l2):
        raise ProtocolError(f"step on {spec.name!r}: l2 must be a finite number >= 0, got {l2!r}")
    check_batch(spec.name, keys.shape[0], inverse, indptr, vals, labels)
    rows = read_rows(plane.state, table, keys, vnodes, counts)
    grads, loss, preds = step(model, indptr, vals, labels, inverse, rows, float(l2))
    check_grads(table, keys, grads)
    answer = ([preds.astype(np.float32)], {"loss": loss})
    return plane.pushed(table, msg, keys, grads, vnodes, counts, identity, answer)
