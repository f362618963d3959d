"""The failure detector: which silent nodes the scheduler declares dead, and when.

A node silent for ``heartbeat_timeout_s`` is dead, with two exceptions.  A server whose
copies are held by servers not heard from since its deadline waits until they beat
(``Detector._unconfirmed``): one that died a moment before is not counted on.  And a server
that holds the last complete copy of some vnodes (``Membership.last_copies``: ``replicas=1``,
or its backups died, are still being filled by a repair, are declared dead in the same
turn, or are on servers silent for two heartbeats themselves).  Declaring it dead would make
those vnodes restart from their initial values, and silence does not prove death: a JIT
compile, a long collection or a swapped-out VM stop the heartbeats of a process that will
answer again.  Such a server is **fenced** instead: its lease runs out on its own (¾ of
the heartbeat timeout, ``server/lease.py``), so it serves no client, and nothing else
changes; the scheduler waits for it up to ``last_copy_timeout_s`` of silence.  If it beats
again it is un-fenced and nothing was lost (what was sent to it, or by it, while it was
cut off may be: the scheduler sends it the ring again and plans again a migration it
took part in, ``Membership.server_returned``); only after that bound, or at once when its
process is known to be gone (same machine: ``wire/liveness.py``), is it declared dead,
and the loss is recorded and logged as such (``Membership._record_losses``).
"""

from __future__ import annotations

import logging
from typing import Protocol

from paramserver.config import Config
from paramserver.scheduler.membership import Membership, NodeInfo

logger = logging.getLogger("paramserver.scheduler.node")  # one log for the scheduler


class DetectorHost(Protocol):
    config: Config
    nodes: dict[int, NodeInfo]
    membership: Membership

    def alive(self, process: str) -> bool | None: ...


class Detector:
    """Decides, each turn, which silent nodes are dead; remembers the fenced ones."""

    SUSPECT_BEATS = 2.0  # a server that missed this many heartbeats holds no copy another may count on

    def __init__(self, host: DetectorHost) -> None:
        self.host = host
        self.fenced: dict[int, float] = {}  # server -> when its silence began
        self.returned: list[int] = []  # un-fenced servers the host has not resynced yet (``take_returned``)
        self.unconfirmed: set[int] = set()  # silent servers said to wait for their copies' holders to beat

    def dead(self, now: float, waiting_on_us: set[int]) -> list[int]:
        """The nodes to declare dead now: silent past the heartbeat timeout, less the fenced
        servers still within ``last_copy_timeout_s`` (``waiting_on_us``: never dead for
        silence, they wait on the scheduler)."""
        cfg = self.host.config
        deadline = now - cfg.heartbeat_timeout_s
        for server in [s for s in self.fenced if s in self.host.nodes and self.host.nodes[s].last_seen >= deadline]:
            silent = self.host.nodes[server].last_seen - self.fenced.pop(server)
            logger.warning("server %d answered again after %.1f s of silence: un-fenced, nothing was lost",
                           server, silent)
            self.returned.append(server)
        nodes = self.host.nodes
        self.unconfirmed = {n for n in self.unconfirmed if n in nodes and nodes[n].last_seen < deadline}
        dead: list[int] = []
        suspect = now - self.SUSPECT_BEATS * cfg.heartbeat_interval_s  # their copies are not counted on
        quiet = [n.id for n in self.host.nodes.values() if n.role == "server" and n.last_seen < suspect]
        for node in [n for n in self.host.nodes.values() if n.last_seen < deadline and n.id not in waiting_on_us]:
            if node.role == "server" and self._wait_for(node, now, dead, quiet):
                continue
            logger.warning("%s %d missed its heartbeat deadline (%.1f s): declared dead", node.role, node.id,
                           now - node.last_seen)
            self.fenced.pop(node.id, None)
            dead.append(node.id)
        return dead

    def _wait_for(self, node: NodeInfo, now: float, dead: list[int], quiet: list[int]) -> bool:
        """Whether a silent server is waited for (fenced, or for a turn) rather than declared
        dead.  ``dead``, ``quiet``: the servers this turn declares dead already and those that
        missed two beats; their copies are not counted on.  So servers silent together (a
        scheduler cut off from all of them; one paused, another killed a moment later) are not
        declared dead one after another, each for having its backups on the others: one whose
        every other copy is on a silent server is fenced, and judged again each turn."""
        last = self.host.membership.last_copies(node.id, gone=dead + quiet)
        alive = self.host.alive(node.process)
        bound = max(self.host.config.last_copy_timeout_s, self.host.config.heartbeat_timeout_s)
        silent = now - node.last_seen
        if not last:
            return alive is not False and silent < bound and self._unconfirmed(node, dead)
        vnodes = sorted({v for vs in last.values() for v in vs})
        if alive is False:
            logger.error("server %d's process is gone (silent %.1f s) and it held the last complete copy of %d "
                         "vnode(s) of %s", node.id, silent, len(vnodes), sorted(last))
            return False
        if silent >= bound:
            logger.error("server %d stayed silent for %.1f s (last_copy_timeout_s %g) holding the last complete "
                         "copy of %d vnode(s) of %s: declared dead, and that data is lost", node.id, silent,
                         bound, len(vnodes), sorted(last))
            return False
        if node.id not in self.fenced:
            self.fenced[node.id] = node.last_seen
            logger.warning("server %d is silent (%.1f s) but holds the last complete copy of %d vnode(s) of %s: "
                           "fenced (its lease has run out, it serves nobody) and waited for up to %g s of silence "
                           "before that data is written off (PARAMSERVER_LAST_COPY_TIMEOUT_S)", node.id, silent,
                           len(vnodes), sorted(last), bound)
        return True

    def _unconfirmed(self, node: NodeInfo, dead: list[int]) -> bool:
        """Whether a silent server that holds no last copy on the count above waits one more
        turn: some server holding the copies it counts on has not beaten since its deadline.
        A server killed a moment before that deadline has missed no two beats yet (it is not
        ``quiet``) and would be counted on, and what the two shared lost (the nemesis's seed
        801: one paused 5.2 s, another killed 0.07 s before the paused one's deadline).  Within
        a heartbeat interval a live one beats and the verdict comes; a dead one does not, is
        quiet a beat later, and the silent server is then fenced, as a last copy's holder."""
        since = node.last_seen + self.host.config.heartbeat_timeout_s  # its deadline
        unheard = [n.id for n in self.host.nodes.values()
                   if n.role == "server" and n.id != node.id and n.last_seen < since]
        if not unheard:
            return False
        waits = bool(self.host.membership.last_copies(node.id, gone=dead + unheard))
        if waits and node.id not in self.unconfirmed:  # said once, not each turn it waits
            self.unconfirmed.add(node.id)
            logger.info("server %d is past its deadline; its copies on server(s) %s are judged once they beat again",
                        node.id, sorted(unheard))
        return waits

    def take_returned(self) -> list[int]:
        """The fenced servers that beat again since the last call: messages to and from
        them during their silence may be lost (a cut link), so the scheduler resyncs them
        (``Membership.server_returned``)."""
        returned, self.returned = self.returned, []
        return returned

    def forget(self, node_id: int) -> None:
        self.fenced.pop(node_id, None)
        self.unconfirmed.discard(node_id)
