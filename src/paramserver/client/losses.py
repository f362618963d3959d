"""What a client learns of lost data, and how it says so.

A server that dies holding the last complete copy of some vnodes (``replicas=1``, or its
backups died first) takes acknowledged updates with it: those keys restart from their
initial values.  The scheduler tells every client (``NODE_LOST`` with ``lost``: table ->
vnodes) and keeps the record (``job_status()["losses"]``).  A client never lets that pass
in silence: its next call (``pull``, ``push``, ``clock``, ``barrier``, ``arrive``,
``call``, ``export_table``, ``checkpoint``) raises ``DataLossError`` once for each loss,
naming what was lost and the fix, unless it was made with ``allow_loss=True`` (or
``PARAMSERVER_ALLOW_LOSS=1``): then the loss is logged, kept in ``Client.losses``, and the
calls go on.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

from paramserver.errors import DataLossError, WorkerError

logger = logging.getLogger(__name__)


def loss_line(losses: list[dict[str, Any]], fix: str) -> str:
    """One line: which servers died holding how much of which tables, why it is lost, the fix."""
    vnodes = sum(int(x.get("vnodes", 0)) for x in losses)
    tables = sorted({t for x in losses for t in x.get("tables", [])})
    servers = ", ".join(str(x.get("server")) for x in losses)
    return (f"server(s) {servers} died holding {vnodes} vnode(s) of table(s) {', '.join(tables)} with no backup left "
            "(replicas=1, or every replica died before the repair): their keys restarted from their initial values, "
            f"so acknowledged updates are lost and the model is not what the data trained; {fix}")


CLIENT_FIX = ("create the table with replicas=2 to survive a server's death, restore a checkpoint, or make the client "
              "with allow_loss=True (PARAMSERVER_ALLOW_LOSS=1) to go on and read Client.losses")


class Losses:
    """The losses a client was told of; ``check`` raises for those not raised yet."""

    def __init__(self, allow: bool) -> None:
        self.allow = allow
        self.seen: list[dict[str, Any]] = []
        self._unsaid: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def record(self, header: dict[str, Any]) -> None:
        """A server's ``NODE_LOST``: its ``lost`` (table -> vnode ids), if any, is a loss."""
        lost = header.get("lost")
        if not isinstance(lost, dict) or not lost:
            return
        by_table = {str(t): [int(v) for v in vs] for t, vs in lost.items() if isinstance(vs, list)}
        loss = {"server": header.get("node_id"), "tables": sorted(by_table), "by_table": by_table,
                "vnodes": len({v for vs in by_table.values() for v in vs})}
        with self._lock:
            self.seen.append(loss)
            self._unsaid.append(loss)
        logger.error("%s", loss_line([loss], "calls on this client raise DataLossError" if not self.allow
                                      else "kept in Client.losses (allow_loss: its caller decides)"))

    def check(self) -> None:
        """Raise ``DataLossError`` for the losses not raised yet, unless they are allowed."""
        if not self._unsaid or self.allow:
            return
        with self._lock:
            unsaid, self._unsaid = self._unsaid, []
        if unsaid:
            raise DataLossError(loss_line(unsaid, CLIENT_FIX))


COMMAND_FIX = ("rerun with --replicas 2 to survive a server's death, or pass --allow-loss to finish anyway and report "
               "the loss")


def tolerating_loss(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (a worker function, called with its ``Client`` first) run with the client's
    ``allow_loss`` on: for commands whose driver watches the losses and decides."""
    return functools.partial(_tolerant, fn)


def _tolerant(fn: Callable[..., Any], client: Any, *args: Any, **kwargs: Any) -> Any:
    client.stats.allow_loss = True
    return fn(client, *args, **kwargs)


class surfacing_losses:  # noqa: N801 (a context manager, used like a function)
    """Around a command's run on ``cluster`` (its workers raise ``DataLossError`` on their next
    call unless ``allow_loss``): a loss ends the command with one line, what was lost and the
    fix (``COMMAND_FIX``), not a worker's traceback; with ``allow_loss`` the command
    finishes and ``report()`` lists the losses for its report."""

    def __init__(self, cluster: Any, allow_loss: bool) -> None:
        self.cluster, self.allow_loss = cluster, allow_loss

    def __enter__(self) -> surfacing_losses:
        self.client = self.cluster.client
        self.client.stats.allow_loss = True  # the driver decides here, with the command's own words
        return self

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        losses = self.client.stats.losses
        if self.allow_loss or not (losses or isinstance(exc, DataLossError) or
                                   (isinstance(exc, WorkerError) and "DataLossError" in str(exc))):
            return
        if losses:
            raise DataLossError(loss_line(losses, COMMAND_FIX)) from None
        raise DataLossError(f"{str(exc).strip().splitlines()[-1]}; {COMMAND_FIX}") from None  # a worker heard first

    def report(self) -> dict[str, Any]:
        """``{"data_loss": [...]}`` when servers died with data (allowed), else nothing."""
        losses = self.client.stats.losses
        return {"data_loss": losses} if losses else {}
