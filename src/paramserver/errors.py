"""Every error paramserver raises, and what each one means.

    ParamServerError            root: catch this to catch everything below
    ├── ConfigError             bad user input (a value breaks a rule); also a ValueError
    ├── UnknownTableError       a table name no one created; also a KeyError
    ├── ClosedError             *you* closed the client or cluster, then used it
    ├── ConnectError            a node could not reach the scheduler within its timeout
    ├── NodeLostError           a peer died (heartbeat deadline missed) with requests open
    ├── RemoteError             a peer answered a request with an error reply
    │   └── ProtocolError       ... because the request was malformed (bad op, dtype, size)
    ├── StaleRingError          a server no longer owns a vnode at the request's ring_version
    ├── QuotaError              a push would take a namespace past its quota (nothing was applied)
    ├── KeyCacheMissError       a request named a key list by signature the server no longer has (resent whole)
    ├── CheckpointError         a checkpoint is missing, incomplete or corrupt
    ├── DataLossError           a server died with vnodes no backup held: acknowledged updates are gone
    └── WorkerError             a user function raised on a worker; carries its traceback

Messages give the value, the rule and the fix.
"""

from __future__ import annotations

from enum import StrEnum


class ParamServerError(Exception):
    """Root of every paramserver error."""


class ConfigError(ParamServerError, ValueError):
    """A configuration or argument value breaks a rule."""


class UnknownTableError(ParamServerError, KeyError):
    """The table does not exist (it was never created, or was dropped)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class ClosedError(ParamServerError):
    """The object was closed by its owner and cannot be used any more."""


class ConnectError(ParamServerError):
    """A node could not reach the scheduler within its connect timeout."""


class NodeLostError(ParamServerError):
    """A peer node died while requests to it were outstanding."""


class RemoteError(ParamServerError):
    """A peer answered with an error reply."""


class ProtocolError(RemoteError):
    """A message broke the wire protocol (see docs/protocol.md)."""

    request_id: int | str | None = None  # the id of the request it broke, where it could be read


class StaleRingError(ParamServerError):
    """A request was routed with a ring version that no longer holds."""


class CheckpointError(ParamServerError):
    """A checkpoint cannot be written, or is missing, incomplete or corrupt."""


class DataLossError(ParamServerError):
    """A server died holding vnodes of a table without a backup (``replicas=1``): their keys
    restarted from initial values, so updates that were acknowledged are gone."""


class WorkerError(ParamServerError):
    """A user function failed on a worker; ``str()`` holds the remote traceback.

    ``summary`` is the failure in one line (for a paramserver error, its message).
    """

    def __init__(self, message: str, summary: str | None = None):
        super().__init__(message)
        self.summary = summary or message.strip().splitlines()[-1]


class QuotaError(ParamServerError):
    """A push would take a namespace past its key or byte quota; nothing of it was applied."""


class KeyCacheMissError(ParamServerError):
    """A request named its key list by signature (the ``keycache`` filter) and the server
    does not hold that list (evicted, restarted, replaced): nothing of it was applied, and
    the client sends it again with the list."""


def check_flags(rules: list[tuple[str, object, bool, str]]) -> None:
    """Raise ``ConfigError`` for the first ``(flag, value, ok, rule)`` that is not ok:
    "FLAG must be RULE, got VALUE"."""
    for flag, value, ok, rule in rules:
        if not ok:
            raise ConfigError(f"{flag} must be {rule}, got {value}")


class Code(StrEnum):
    """The machine-readable ``code`` of an ERROR reply, one table for the nodes that send
    them (``wire.message.error_reply``) and the clients that raise them (``raised``)."""

    STALE_RING = "stale_ring"  # routed with an old ring: route again with the newest
    UNKNOWN_TABLE = "unknown_table"
    PROTOCOL = "protocol"  # a malformed request
    CONFIG = "config"  # a request the cluster refuses as configured (a dropped table, a bad spec)
    NODE_LOST = "node_lost"  # a node the request needed died
    QUOTA = "quota"  # a namespace's quota is full
    CHECKPOINT = "checkpoint"
    SERVER = "server"  # a server failed a step the scheduler ran for the request (a migration)
    UNKNOWN_NODE = "unknown_node"  # the sender is not registered (declared dead)
    KEY_CACHE_MISS = "key_cache_miss"  # a key list named by signature is not held: resend it whole
    INTERNAL = "internal"  # a bug: the node logged it
    ERROR = "error"  # any other failure


#: the exception a client raises for an ERROR reply of each code (``RemoteError`` for the rest)
RAISED_AS: dict[str, type[ParamServerError]] = {
    Code.STALE_RING: StaleRingError, Code.UNKNOWN_TABLE: UnknownTableError, Code.PROTOCOL: ProtocolError,
    Code.CONFIG: ConfigError, Code.NODE_LOST: NodeLostError, Code.QUOTA: QuotaError, Code.CHECKPOINT: CheckpointError,
    Code.KEY_CACHE_MISS: KeyCacheMissError,
}


def code_of(exc: BaseException) -> Code:
    """The code a node answers ``exc`` with (a ``KeyError``: a table it does not know)."""
    for code, kind in (
            (Code.STALE_RING, StaleRingError), (Code.QUOTA, QuotaError), (Code.UNKNOWN_TABLE, KeyError),
            (Code.CHECKPOINT, CheckpointError), (Code.PROTOCOL, ProtocolError),
            (Code.KEY_CACHE_MISS, KeyCacheMissError)):
        if isinstance(exc, kind):
            return code
    return Code.ERROR


def raised(code: object, text: str) -> ParamServerError:
    """The exception for an ERROR reply: its code's (``RAISED_AS``), else ``RemoteError`` naming the code."""
    kind = RAISED_AS.get(str(code))
    return kind(text) if kind is not None else RemoteError(f"{code}: {text}")


#: what a NaN or infinite gradient says of the training that sent it, and what to do
DIVERGED = ("the training diverged: a feature value too large for the model (scale values such as 1e30 down, "
            "or hash them as categories), or a learning rate too high (lower it)")
