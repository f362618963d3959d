"""One request from a client to a node, as a future or blocking, and one to every server
at once: what the client's groups of calls (``client.admin``, ``client.stats``) and its
own calls share, instead of each reaching into the client's state."""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from paramserver.client.connect import registered
from paramserver.client.core import remote_error
from paramserver.errors import RemoteError
from paramserver.wire.message import Message, Op

if TYPE_CHECKING:
    from paramserver.client.io_thread import IOThread
    from paramserver.client.state import ClientState
    from paramserver.config import Config


class Rpc:
    """Requests through a client's I/O thread (``io``), to the nodes its ``state`` knows."""

    def __init__(self, config: Config, io: IOThread, state: ClientState, role: str) -> None:
        self.config, self.io, self.state, self.role = config, io, state, role

    def request(self, address: str, header: dict[str, Any]) -> Future[Any]:
        """Send one request; the future holds the reply ``Message`` or the error it carried."""
        fut: Future[Any] = Future()

        def done(msg: Message | None, exc: BaseException | None) -> None:
            if exc is not None:
                fut.set_exception(exc)
            elif msg is None:
                fut.set_exception(RemoteError(f"no reply from {address}"))
            elif msg.op is Op.ERROR:
                fut.set_exception(remote_error(msg))
            else:
                fut.set_result(msg)

        self.io.submit(address, header, (), done)
        return fut

    def call(self, address: str, header: dict[str, Any], timeout_s: float | None = None,
             connecting: bool = False) -> dict[str, Any]:
        """One request, blocking: the reply's header (``connecting``: a registration, whose
        timeout is a ``ConnectError`` saying why, ``client/connect.py``)."""
        reply = self.request(address, header)
        if connecting:
            return registered(reply, address, self.config, self.role, timeout_s or self.config.connect_timeout_s)
        answer: dict[str, Any] = reply.result(timeout=timeout_s).header
        return answer

    def scheduler(self, header: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
        """``call`` to the scheduler."""
        return self.call(self.config.scheduler, header, timeout_s)

    def on_every_server(self, header: dict[str, Any], timeout_s: float | None = None) -> list[Message]:
        """Send ``header`` to every server at once; their replies, in server order."""
        futures = [self.request(address, header) for address in self.state.view.servers.values()]
        return [f.result(timeout=timeout_s) for f in futures]
