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

from paramserver.errors import DIVERGED, ProtocolError
from paramserver.server.data import DataPlane, read_rows
from paramserver.server.install import check_grads
from paramserver.server.requests import PARALLEL_MIN_KEYS, check_segments, checked_table, push_op
from paramserver.store.protocol import VnodeStore
from paramserver.tables.namespaces import namespace_of
from paramserver.tables.push_ops import OP_UPDATE
from paramserver.tables.steps import check_batch, step, unsuited
from paramserver.wire.message import Message, field, reply
from paramserver.wire.step_arrays import read_step_arrays
from paramserver.wire.step_groups import MAX_STEPS, split_group


def on_step(plane: DataPlane, msg: Message, identity: bytes = b"") -> list[Any] | None:
    """Take a step: read the rows, compute the batch's gradient (``model``: ``lr``, or ``fm``
    with its ``l2``), push it; the reply carries the examples' probabilities (``float32[n]``)
    and ``loss``, their summed log loss.  A step of several batches (``steps``:
    ``wire/step_groups.py``) takes them in turn."""
    if "steps" in msg.header:
        return _on_steps(plane, msg)
    # the keys grouped by vnode, then the batch (CSR, occurrences indexing the keys), widened
    arrays = read_step_arrays(msg)
    table, model, l2 = _checked(plane, msg, arrays)
    keys, vnodes, counts = arrays[:3]
    if not _has_copies(plane, table, vnodes):  # as a step of one batch (a copy's answer waits: pushed below)
        sizes = np.array([keys.shape[0], vnodes.shape[0], arrays[6].shape[0]], np.int64)
        whole = _whole(plane, table, [msg], [(table, model, l2)], [*arrays, sizes])
        if whole is not None:
            return reply(msg, [whole[0]], loss=float(whole[1][0]))
    grads, loss, preds = _stepped(plane, table, model, l2, arrays)
    answer = ([preds.astype(np.float32)], {"loss": loss})
    return plane.pushed(table, msg, keys, grads, vnodes, counts, identity, answer)


def _checked(plane: DataPlane, msg: Message, arrays: list[np.ndarray]) -> tuple[VnodeStore, str, float]:
    """The step's table, model and ``l2``, once the request is checked whole (its table and
    segments, this server their primary, its batch) and before any row is read."""
    keys, vnodes, counts, inverse, indptr, vals, labels = arrays
    table = checked_table(plane.state, msg, keys.shape[0], vnodes, counts)
    spec, model = table.spec, field(msg, "model", str)
    why = unsuited(spec, model)
    if why is not None:
        raise ProtocolError(f"step on {spec.name!r}: {why}")
    l2 = msg.header.get("l2", 0.0)
    if isinstance(l2, bool) or not isinstance(l2, (int, float)) or not l2 >= 0 or not np.isfinite(l2):
        raise ProtocolError(f"step on {spec.name!r}: l2 must be a finite number >= 0, got {l2!r}")
    check_batch(spec.name, keys.shape[0], inverse, indptr, vals, labels)
    return table, model, float(l2)


def _checked_parts(plane: DataPlane, parts: list[Message]) -> list[tuple[VnodeStore, str, float]]:
    """``_checked`` for each batch of a step of several: their header is one (the table, the
    model, ``l2``, the ring version), checked with the first batch; each batch's own segments
    and arrays are checked in turn.  Checked whole for each batch, the header cost the
    server ~20 µs a batch of Python (0.04 s of the default job's 2 016)."""
    first = _checked(plane, parts[0], parts[0].arrays)
    table, state, version = first[0], plane.state, field(parts[0], "ring_version", int)
    assert state.ring is not None
    for part in parts[1:]:
        keys, vnodes, counts, inverse, indptr, vals, labels = part.arrays
        check_segments(table, state.ring, keys, vnodes, counts, state.primary, state.node_id, version)
        check_batch(table.spec.name, keys.shape[0], inverse, indptr, vals, labels)
    return [first] * len(parts)


def _stepped(plane: DataPlane, table: VnodeStore, model: str, l2: float,
             arrays: list[np.ndarray]) -> tuple[np.ndarray, float, np.ndarray]:
    """A checked step's gradient rows, summed log loss and probabilities, on its rows as they are."""
    keys, vnodes, counts, inverse, indptr, vals, labels = arrays
    rows = read_rows(plane.state, table, keys, vnodes, counts)
    grads, loss, preds = step(model, indptr, vals, labels, inverse, rows, l2)
    check_grads(table, keys, grads)
    return grads, loss, preds


def _on_steps(plane: DataPlane, msg: Message) -> list[Any]:
    """A step of several batches: each checked before any is applied, then each stepped and
    pushed in turn under its own number (``seq + k``), as that many steps in turn would be;
    one answer, every batch's probabilities end to end and each one's loss.  Refused where
    a vnode of it has copies to forward to (its backups, or a copy under way): each batch's
    answer would wait for theirs."""
    steps, seq = msg.header.get("steps"), msg.header.get("seq")
    if type(steps) is not int or not 1 <= steps <= MAX_STEPS or type(seq) is not int:
        raise ProtocolError(f"a step of several batches names 1 to {MAX_STEPS} batches (steps) and its first "
                            f"batch's seq (each next one is numbered one more); got steps={steps!r}, seq={seq!r}")
    header = {k: v for k, v in msg.header.items() if k not in ("steps", "tick", "tick_worker", "tick_token")}
    arrays = read_step_arrays(msg, steps)
    parts = [Message({**header, "seq": seq + k}, part) for k, part in enumerate(split_group(arrays, steps))]
    checked = _checked_parts(plane, parts)
    table = checked[0][0]
    if _has_copies(plane, table, np.concatenate([p.arrays[1] for p in parts])):
        raise ProtocolError(f"steps on {table.spec.name!r}: a step of several batches goes to vnodes without "
                            "copies to forward to (each batch's answer would wait for the copies'): send them "
                            "one step each")
    whole = _whole(plane, table, parts, checked, arrays)
    if whole is not None:
        return reply(msg, [whole[0]], losses=whole[1].tolist())
    preds, losses = [], []
    for part, (_, model, l2) in zip(parts, checked, strict=True):
        keys, vnodes, counts = part.arrays[:3]
        grads, loss, p = _stepped(plane, table, model, l2, part.arrays)
        waits = plane.applied(table, part, keys, grads, vnodes, counts, b"")
        assert not waits, "a table without copies answers at once"
        preds.append(p.astype(np.float32))
        losses.append(loss)
    return reply(msg, [np.concatenate(preds)], losses=losses)


def _has_copies(plane: DataPlane, table: VnodeStore, vnodes: np.ndarray) -> bool:
    """Whether a vnode of ``vnodes`` has copies to forward its pushes to (backups, or a copy under way)."""
    targets = plane.state.targets.get(table.spec.name)
    return targets is not None and bool((targets[vnodes] >= 0).any())


def _whole(plane: DataPlane, table: VnodeStore, parts: list[Message], checked: list[tuple[VnodeStore, str, float]],
           arrays: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray] | None:
    """A step's batches (one, or several: ``parts``, as ``wire/step_groups.py`` carries them:
    ``arrays``, their sizes last), checked, on vnodes without copies, taken in one compiled
    call (``VnodeStore.steps``, ``store/loops/step_groups.py``) where nothing of a push's path
    is needed between them: no key lifecycle, no quota, the table's own rule, one model, every
    batch new on all its vnodes (a retry goes batch by batch, which skips what it applied) and
    none big enough for the server's threads.  The same rows, updates and answers as batch by
    batch, each batch recorded applied (exactly once) as it is: every example's probability
    and each batch's log loss; None: batch by batch."""
    state = plane.state
    model, l2 = checked[0][1], checked[0][2]
    if (table.life is not None or namespace_of(table.spec.name) in state.quotas
            or any(c[1] != model or c[2] != l2 for c in checked) or push_op(parts[0], table) != OP_UPDATE
            or (state.pool is not None and max(p.arrays[0].shape[0] for p in parts) >= PARALLEL_MIN_KEYS)
            or not plane.unapplied(table, parts)):
        return None
    keys, vnodes, counts, inverse, indptr, vals, labels, sizes = arrays
    occurrences = np.array([p.arrays[3].shape[0] for p in parts], np.int64)
    marked = [0]

    def applied(upto: int) -> None:  # batches [marked, upto) are in: on record before anything else can fail
        plane.mark_applied(table, parts[marked[0]:upto])
        marked[0] = upto

    done = table.steps(vnodes, counts, keys, inverse, indptr, vals, labels, sizes, occurrences, l2, applied)
    if done is None:
        return None
    preds, losses = done
    if marked[0] < len(parts):  # as a push's check says it (``install.check_grads``)
        raise ProtocolError(f"push to {table.spec.name!r}: grads contain NaN or inf, so {DIVERGED}")
    return preds, losses
