"""The client's calls on its tables' filters (``paramserver.filters``): pushing what they
still owe (``flush``, and every N clocks for the significantly-modified filter); what
they took off is ``client.stats``' (``filter_stats``, ``wire_totals``).  ``Client`` inherits them; the
filters' state is ``ClientState.filters`` (``client/filtering.py``)."""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from paramserver.client.state import ClientState
    from paramserver.tables.spec import TableSpec


class FilterCalls:
    """Filter calls of a ``Client`` (it provides the pushes underneath)."""

    if TYPE_CHECKING:
        _state: ClientState

        def _spec(self, table: str) -> TableSpec: ...

        def _push(self, spec: TableSpec, keys: np.ndarray, grads: np.ndarray, op: str, distinct: bool,
                  flushing: bool = False) -> Future[Any]: ...

    def flush(self, table: str | None = None, timeout_s: float | None = None, rounding: bool = False) -> int:
        """Push what this client's filters still owe (``table``'s, or every table's): the
        updates the significantly-modified filter held back, and with ``rounding`` also
        the codecs' rounding (under half a step a key: it goes with the next push of each
        key; flushing it pushes every key ever rounded, once).  ``paramserver train`` calls
        it when a worker's part ends; returns the keys pushed.  A worker that dies first
        loses what it owed (``filter_stats``)."""
        pushed = 0
        for name in [table] if table is not None else list(self._state.filters.residuals):
            owed = self._state.filters.drain(name, held_only=not rounding)
            if owed is not None:
                keys, rows = owed
                self._push(self._spec(name), keys, rows, "update", True, flushing=True).result(timeout=timeout_s)
                pushed += int(keys.shape[0])
        return pushed

    def _flush_due(self, clock: int) -> None:
        """At the clocks a table's significantly-modified filter says (every N), push what
        it held back (not waited on: it goes before the clock's tick, on the same links)."""
        filters = self._state.filters
        for name in list(filters.residuals):
            every = filters.sigmod_every(self._spec(name))
            due = every and (clock % every == 0 or filters.must_flush(name))
            owed = filters.drain(name, held_only=True) if due else None
            if owed is not None:
                self._push(self._spec(name), owed[0], owed[1], "update", True, flushing=True)
