"""``Client.prefetch``: keys a worker names before it pulls or pushes them, so that a
table with a memory budget (``TableSpec.memory``; ``store/tiers.py``) reads their rows
on disk in the background while the worker computes (``Tiers.prefetch``), where reading
them is slow (``store/readahead.py``).  A hint: no value, clock or order changes, and a
table without tiers answers that it has none.

The keys are routed once: a later pull of the very same array takes the routing the
prefetch made (``core.RouteMemo``), and a push of it after that too.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from paramserver.wire.message import Message, Op

if TYPE_CHECKING:
    from paramserver.client.caller import Caller
    from paramserver.client.core import Piece


@dataclass
class Prefetched:
    """What a prefetch found: ``tiered``: some server holds the table in tiers (False:
    naming its keys ahead is of no use); ``reading``: some server reads ahead for it now
    (its rows on disk are slow to read: ``readahead.Policy``; False: name keys again only
    now and then); ``cold``: keys the servers reading ahead did not hold in memory (their
    rows on disk are being read, or the keys are new)."""

    cold: int = 0
    tiered: bool = False
    reading: bool = False


def prefetch(caller: Caller, table: str, keys: np.ndarray) -> Future[Prefetched]:
    """Send ``keys`` of ``table`` (checked) to their servers as a prefetch."""
    found = Prefetched()

    def on_piece(piece: Piece, msg: Message) -> None:
        cold = msg.header.get("cold")
        if isinstance(cold, int):
            found.cold += cold
            found.tiered = True
        if msg.header.get("reading") is True:
            found.reading = True

    return caller.scatter(Op.PREFETCH, table, keys, None, on_piece, result=found)
