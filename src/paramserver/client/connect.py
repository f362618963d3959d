"""A node's first answer from the scheduler (its registration), and why it did not come.

With keys (``--secret-file``), a scheduler that refuses them gives no answer at all; so a
registration not answered within ``CHECK_AFTER_S`` is looked into with a handshake apart
(``wire/handshake.py``): a refused key, or a cluster without keys, fails in about a second
with the key file named and the fix, instead of after the whole connect timeout with a
question about whether the scheduler runs.  A key accepted goes on waiting.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any

from paramserver.config import Config
from paramserver.errors import ConnectError
from paramserver.wire.handshake import CHECK_AFTER_S, refusal, unanswered
from paramserver.wire.message import Message
from paramserver.wire.sockets import listens


def registered(reply: Future[Message], address: str, config: Config, role: str, timeout_s: float) -> dict[str, Any]:
    """The header of the scheduler's ``reply`` to a ``role``'s registration, waited for at
    most ``timeout_s``; ``ConnectError`` saying why it did not come (see the module)."""
    started = time.monotonic()
    if config.secret_file and timeout_s > CHECK_AFTER_S:
        try:
            return reply.result(timeout=CHECK_AFTER_S).header
        except TimeoutError:
            said = refusal(address, config.secret_file, role, min(2.0, timeout_s - CHECK_AFTER_S))
            if said:
                raise ConnectError(said) from None
    try:
        return reply.result(timeout=max(0.0, timeout_s - (time.monotonic() - started))).header
    except TimeoutError:
        raise ConnectError(unanswered(address, config.secret_file, role, timeout_s, listens(address))) from None
