"""The client's calls on its tables' filters (``paramserver.filters``): pushing what they
still owe (``flush``, and every N clocks for the significantly-modified filter); what
they took off is ``client.stats``' (``filter_stats``, ``wire_totals``).  Built on the
client's ``Caller``; the filters' state is ``ClientState.filters``
(``client/filtering.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from paramserver.client.caller import Caller


class Flushes:
    """A client's pushes of what its filters owe, on its ``caller``."""

    def __init__(self, caller: Caller) -> None:
        self.caller = caller

    def flush(self, table: str | None = None, timeout_s: float | None = None, rounding: bool = False) -> int:
        """Push what this client's filters still owe (``table``'s, or every table's): the
        updates the significantly-modified filter held back, and with ``rounding`` also
        the codecs' rounding (under half a step a key: it goes with the next push of each
        key; flushing it pushes every key ever rounded, once).  ``paramserver train`` calls
        it when a worker's part ends; returns the keys pushed.  A worker that dies first
        loses what it owed (``filter_stats``)."""
        c, pushed = self.caller, 0
        for name in [table] if table is not None else list(c.state.filters.residuals):
            owed = c.state.filters.drain(name, held_only=not rounding)
            if owed is not None:
                keys, rows = owed
                c.push(c.spec(name), keys, rows, "update", True, flushing=True).result(timeout=timeout_s)
                pushed += int(keys.shape[0])
        return pushed

    def due(self, clock: int) -> None:
        """At the clocks a table's significantly-modified filter says (every N), push what
        it held back (not waited on: it goes before the clock's tick, on the same links)."""
        c = self.caller
        filters = c.state.filters
        for name in list(filters.residuals):
            every = filters.sigmod_every(c.spec(name))
            due = every and (clock % every == 0 or filters.must_flush(name))
            owed = filters.drain(name, held_only=True) if due else None
            if owed is not None:
                c.push(c.spec(name), owed[0], owed[1], "update", True, flushing=True)
