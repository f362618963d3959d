"""A link: one process talking to exactly one other, on the wire's own stack.

The pipeline's processes (``integrations/pipeline``: a coordinator and its stages, each
stage and the next) talk over links.  A link is not a server answering many clients:
it carries one conversation, and every message on it matters (an activation dropped
would leave a stage waiting for ever).  So it takes the nodes' transport, encoding and
security, and none of a server's reply policy:

* one end binds (``ZmqTransport.bind``: a ROUTER, a CurveZMQ server when the transport
  has keys, ``security.py``), the other connects (a DEALER, a CurveZMQ client with
  them).  The bound end answers the peer that last wrote to it: the connecting end
  always speaks first (a stage says it is ready, a stage sends its first activation);
* a message is ``message.encode``d (a msgpack header of op ``link``, raw arrays after
  it) and ``message.decode``d on arrival: nothing is unpickled;
* a send is never dropped: it goes, or waits, or (``try_send``) says it cannot go now
  (the peer has not finished its handshake, is at its high-water mark, or is gone), so
  the caller can look for something else meanwhile (an abort from its coordinator).

Messages may be as large as ``LINK_MAX_BYTES`` (a mini-batch's activations at once).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import zmq

from paramserver.wire.message import Message, Op, decode, encode
from paramserver.wire.security import load_keys
from paramserver.wire.transport import ZmqSocket, ZmqTransport

logger = logging.getLogger(__name__)

#: The largest message a link takes: its peer is a process of the same program, and an
#: activation or a gradient is as large as the model and the micro-batch make it.
LINK_MAX_BYTES = 1 << 40


class Link:
    """One end of a link (see the module): ``send``/``try_send`` a header and arrays,
    ``recv`` a ``Message``; ``sock`` is the transport's socket, for a poller."""

    __slots__ = ("sock", "address", "_peer")

    def __init__(self, sock: ZmqSocket, address: str = "") -> None:
        self.sock, self.address = sock, address
        self._peer: bytes | None = None  # the bound end's: who to answer

    @classmethod
    def bind(cls, transport: ZmqTransport, host: str = "127.0.0.1") -> Link:
        """A link's bound end on a free port of ``host``; peers connect to ``address``."""
        sock, address = transport.bind(host, 0, LINK_MAX_BYTES)
        return cls(sock, address)

    @classmethod
    def connect(cls, transport: ZmqTransport, address: str) -> Link:
        return cls(transport.connect(address, LINK_MAX_BYTES), address)

    def _frames(self, header: dict[str, Any], arrays: Sequence[np.ndarray]) -> list[Any]:
        frames = encode({"op": Op.LINK.value, **header}, arrays)
        if self.sock.bound:
            if self._peer is None:
                raise RuntimeError("a link's bound end speaks only once its peer has")
            frames.insert(0, self._peer)
        return frames

    def send(self, header: dict[str, Any], arrays: Sequence[np.ndarray] = ()) -> None:
        """Send, waiting while the peer cannot take it; to a peer that is gone, nothing."""
        try:
            self.sock.raw.send_multipart(self._frames(header, arrays), copy=False)
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EHOSTUNREACH:
                raise

    def try_send(self, header: dict[str, Any], arrays: Sequence[np.ndarray] = ()) -> bool:
        """Send unless it cannot go now (then False, and nothing is sent)."""
        try:
            self.sock.raw.send_multipart(self._frames(header, arrays), zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EHOSTUNREACH:
                raise
            return False
        return True

    def recv(self) -> Message:
        frames = self.sock.recv()
        if self.sock.bound:
            self._peer = frames[0]
            frames = frames[1:]
        return decode(frames, LINK_MAX_BYTES)

    def poll(self, timeout_ms: int = 0) -> bool:
        return self.sock.poll(timeout_ms)

    def close(self) -> None:
        self.sock.close()


def link_transport(secret_file: str = "") -> ZmqTransport:
    """The transport of a process's links: CurveZMQ with the keys of ``secret_file`` if
    it is the cluster's file (a bound end serves with the cluster's server key), on the
    process's shared context, whose ZAP handler lives as long as the process; plain TCP
    on a context of its own otherwise.  A worker's or a driver's key file cannot serve a
    link: the links then run plain, as they did before they went through the wire, and
    the log says so."""
    if secret_file and load_keys(secret_file).server_secret:
        return ZmqTransport(zmq.Context.instance(), secret_file=secret_file)
    if secret_file:
        logger.warning("the pipeline's links are not encrypted: %s holds a %s key, which cannot serve a link "
                       "(give the stages the cluster's key file to encrypt them)", secret_file,
                       load_keys(secret_file).role)
    return ZmqTransport(zmq.Context(), secret_file="")


def release(transport: ZmqTransport, links: Sequence[Link | None]) -> None:
    """Close ``links`` and what ``link_transport`` made: its context, unless it is the
    process's shared one (the ZAP handler's thread reads a socket of it: closing that
    under it aborts the process)."""
    for link in links:
        if link is not None:
            link.close()
    if transport.ctx is not zmq.Context.instance():
        transport.ctx.destroy(linger=0)
