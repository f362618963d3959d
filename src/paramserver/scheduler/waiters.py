"""Requests waiting for servers (``wait_servers``): for a number of servers on the settled
ring, or for one joining server (the one a launcher started) to be on it.

A count waiter fails when a server dies and the cluster no longer heads for that count.
A joiner waiter fails only when the joiner itself dies: another server's death during
the join re-plans it, and the join still completes (``LocalCluster.add_server`` waits so,
and reports a completed join as done whatever else died meanwhile).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from paramserver.errors import Code, ProtocolError
from paramserver.scheduler.membership import Membership, NodeInfo
from paramserver.wire.message import Message, Op, encode, error_reply
from paramserver.wire.message import field as hfield


def is_joiner(node: NodeInfo, joiner: dict[str, Any]) -> bool:
    """Whether ``node`` is the server ``joiner`` (``{"pid": P}`` and/or ``{"address": A}``) names."""
    if "pid" in joiner and (node.pid == 0 or node.pid != joiner["pid"]):
        return False
    return "address" not in joiner or node.address == joiner["address"]


class ServerWaiters:
    def __init__(self) -> None:
        self.waiting: list[tuple[bytes, Any, int | dict[str, Any]]] = []  # (identity, request id, count or joiner)

    def add(self, identity: bytes, msg: Message) -> None:
        joiner = msg.header.get("joiner")
        if joiner is None:
            self.waiting.append((identity, msg.id, hfield(msg, "count", int)))
            return
        if (not isinstance(joiner, dict) or not joiner or set(joiner) - {"pid", "address"}
                or isinstance(joiner.get("pid"), bool) or not isinstance(joiner.get("pid", 1), int)
                or not isinstance(joiner.get("address", ""), str)):
            raise ProtocolError(f"joiner must be {{'pid': P}} and/or {{'address': A}} (the server a launcher "
                                f"started), got {str(joiner)[:100]!r}")
        self.waiting.append((identity, msg.id, dict(joiner)))

    def serve(self, membership: Membership, nodes: dict[int, NodeInfo], send: Callable[[list[Any], bytes], None],
              lost: NodeInfo | None = None) -> None:
        """Answer the waiters whose count the settled ring has, or whose joiner it holds.
        After server ``lost`` died, fail the count waiters the cluster no longer heads for
        (a joiner that died mid-copy is not coming) and the waiters for ``lost`` itself:
        they would otherwise wait for ever."""
        ring = membership.ring if membership.settled else None
        heading = membership.heading()
        waiting, self.waiting = self.waiting, []
        for identity, request_id, want in waiting:
            if isinstance(want, dict):
                ok = ring is not None and any(n.id in ring.servers for n in nodes.values()
                                              if n.role == "server" and is_joiner(n, want))
                failed = lost is not None and is_joiner(lost, want)
            else:
                ok = ring is not None and len(ring.servers) == want
                failed = lost is not None and want > len(heading)
            if ok:
                assert ring is not None
                send(encode({"op": Op.OK.value, "id": request_id, "ring_version": ring.version,
                             "servers": ring.servers}), identity)
            elif failed:
                assert lost is not None
                what = (f"the joining server {lost.id} ({lost.address}) died before its join completed"
                        if isinstance(want, dict) else f"server {lost.id} died while this waited for {want} "
                        f"server(s); the ring heads for {len(heading)} ({sorted(heading)})")
                send(error_reply(request_id, Code.NODE_LOST, f"{what}: start another server and wait again"), identity)
            else:
                self.waiting.append((identity, request_id, want))
