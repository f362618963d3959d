"""A push that adds rows its filter packed as a mask of their non-zero values and those
values (``sparse``), added where it lands (``VnodeStore.add_masked``), never made dense: a
topic model's changes, ~5 % non-zero a round at 1 000 topics, which the general way decoded
into a zeroed dense array, checked value by value and added value by value, zeros too.

It answers as the general way would (it adds only the values sent: a row's -0.0 stays
-0.0, where adding the +0.0 not sent made it +0.0), and steps aside (None) for anything
else: a table with a lifecycle, tiers, copies to forward to, compact rows or a rule of a
user's; a retry some vnode has applied; or a push the general way refuses, which then says
why.

Tried and not kept: a pull's rows read straight into the filter's packing (no dense copy
for the filter to read again): 15 % less time alone, level inside ``paramserver lda``, where
reading the rows from memory is the cost either way (``docs/benchmarks.md``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from paramserver.filters.base import Context
from paramserver.filters.chain import chains, unpack_masked
from paramserver.server.admin import check_quota
from paramserver.server.requests import checked_table, push_op, writer
from paramserver.server.state import ServerState
from paramserver.tables.push_ops import OP_ADD
from paramserver.wire.message import KEY_TYPES, Message, expect, reply


def added(state: ServerState, msg: Message,
          numbered: Callable[[Message], tuple[int, int, int] | None]) -> list[Any] | None:
    """The reply to a push taken as a mask (see the module's doc), applied once per vnode
    (``numbered``: the push's sender, number and acked, checked); None where it goes the
    general way."""
    name = msg.header.get("table")
    table = state.tables.get(name) if isinstance(name, str) and "filters" in msg.header else None
    if (table is None or table.life is not None or state.targets.get(table.spec.name) is not None
            or push_op(msg, table) != OP_ADD):
        return None
    got = unpack_masked(chains(table.spec.filters)["push"], msg.header, msg.arrays,
                        Context(store=state.key_store, layout=table.spec.layout), table.spec.dim)
    if got is None:
        return None
    arrays, mask, words = got
    keys, _, vnodes, counts = expect(Message(msg.header, arrays), ("keys", KEY_TYPES, 1), ("grads", "<f4", 2),
                                     ("vnodes", "<i4", 1), ("counts", "<i8", 1))  # as the general way checks them
    checked_table(state, msg, keys.shape[0], vnodes, counts)
    number = numbered(msg)
    dedup = state.dedup[table.spec.name]
    if number is not None and not dedup.fresh(*number, vnodes).all():  # a retry: the general way sorts it
        return None
    check_quota(state, table, vnodes, counts, keys)
    if not table.add_masked(vnodes, counts, keys, mask, words):
        return None
    if number is not None:
        dedup.mark(number[0], number[1], vnodes)
    if keys.shape[0]:
        state.counted(table, writer(msg))
    table.settle()
    return reply(msg)
