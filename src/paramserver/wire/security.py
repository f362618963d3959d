"""CurveZMQ: authenticated, encrypted links, when a cluster secret is configured.

``paramserver keygen --out cluster.key`` writes a cluster's keys; every node and client given
``--secret-file cluster.key`` (``PARAMSERVER_SECRET_FILE``) then talks CurveZMQ:

* every bound socket (the scheduler's, each server's) is a CURVE server with the cluster's
  server key pair; every connecting socket is a CURVE client that knows the server's public
  key and holds a client key pair of its own;
* a ZAP handler in each process that binds lets in only the client keys the cluster file
  lists, and tells the application which *role* a key was made for (its ZAP User-Id):
  ``cluster`` (scheduler and servers: anything), ``worker`` (a worker or a driver) or
  ``driver`` (a driver script only).  The scheduler refuses a ``REGISTER`` whose role the
  key does not allow, so only a cluster key registers a server;
* a peer without a listed key never completes the handshake: its connection is refused,
  no message of it reaches the application, and the refusal is logged once for its address.

``paramserver keygen --from cluster.key --role worker --out worker.key`` writes a file for
machines that should only run workers: it has the server's public key and the worker key
pair, and no server secret.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import threading
from dataclasses import dataclass, field
from typing import Any

import zmq
from zmq.utils import z85

from paramserver.errors import ConfigError

logger = logging.getLogger(__name__)

FORMAT = "paramserver-keys-1"
ROLES = ("cluster", "worker", "driver")
#: the node roles a key's role may register as
MAY_REGISTER = {"cluster": {"scheduler", "server", "worker", "driver"}, "worker": {"worker", "driver"},
                "driver": {"driver"}}
#: what a key's role may ask of the scheduler and the servers, by op name (a cluster key: anything).
#: A worker: its own registration and heartbeats, the data plane (pull, push, step, clock, a round's
#: checkpoint of what it trained), barriers and its job's shard calls, reading the cluster's
#: state and timing its round trips (``ping``).  A driver: that, and tables, namespaces, jobs,
#: restores, exports and server-side functions.  Only the cluster's key: membership (a server's
#: registration, its removal, migrations, copies, replication) and shutdown.
WORKER_OPS = frozenset({"register", "heartbeat", "leave", "table_info", "cluster_info", "barrier", "wait_workers",
                        "wait_servers", "next_shard", "shard_done", "progress", "job_status", "pull", "push",
                        "step", "prefetch", "clock", "stats", "ping", "checkpoint"})
DRIVER_OPS = WORKER_OPS | {"create_table", "drop_table", "create_namespace", "drop_namespace", "job_start",
                           "job_add", "restore", "export", "call"}
MAY_SEND = {"worker": WORKER_OPS, "driver": DRIVER_OPS}


def refused_op(key_role: str | None, op: str) -> str | None:
    """Why a message of ``op`` sent with a ``key_role`` key is refused, or None if it may be
    sent (a plain link, without a secret, proves no role: everything goes)."""
    if key_role is None or key_role == "cluster":
        return None
    if op in MAY_SEND.get(key_role, frozenset()):
        return None
    may = ", ".join(sorted(MAY_SEND.get(key_role, ())))
    other = "a driver key file or " if key_role == "worker" and op in DRIVER_OPS else ""
    return f"{op}: a {key_role} key cannot ask this (a {key_role} key may: {may}); use {other}the cluster's key file"


ZAP_ENDPOINT = "inproc://zeromq.zap.01"
DOMAIN = "paramserver"


@dataclass(frozen=True)
class Keys:
    """What one key file holds (see the module)."""

    role: str
    server_public: bytes
    public: bytes
    secret: bytes
    server_secret: bytes = b""  # a cluster file's: what bound sockets serve with
    http_token: str = ""  # what the HTTP endpoints ask for (every file of the cluster has it)
    allowed: dict[bytes, str] = field(default_factory=dict)  # a cluster file's: client public key -> its role

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "role": self.role, "http_token": self.http_token,
                "server_public": self.server_public.decode(),
                "public": self.public.decode(), "secret": self.secret.decode(),
                **({"server_secret": self.server_secret.decode(),
                    "allowed": {k.decode(): r for k, r in self.allowed.items()}} if self.server_secret else {})}


def keygen(path: str, role: str = "cluster", base: str | None = None) -> Keys:
    """Write a new cluster's keys to ``path`` (``role`` cluster), or, from the cluster file
    ``base``, a file for one role (``worker`` or ``driver``) with no server secret."""
    if role not in ROLES:
        raise ConfigError(f"--role must be one of {', '.join(ROLES)}, got {role!r}")
    if os.path.exists(path):
        raise ConfigError(f"{path} exists: keygen does not overwrite keys; remove it or pick another --out")
    if role == "cluster":
        if base:
            raise ConfigError("--from makes a worker's or a driver's file from a cluster's: pass --role worker")
        server_public, server_secret = zmq.curve_keypair()
        pairs = {r: zmq.curve_keypair() for r in ROLES}
        keys = Keys("cluster", server_public, *pairs["cluster"], server_secret=server_secret,
                    http_token=secrets.token_hex(16), allowed={pub: r for r, (pub, _) in pairs.items()})
        _write(path, keys, {r: [pub.decode(), sec.decode()] for r, (pub, sec) in pairs.items()})
        return keys
    if not base:
        raise ConfigError(f"--role {role} needs --from CLUSTER_KEY_FILE (the cluster's keys it is made from)")
    cluster = load_keys(base)
    stored = _pairs(base)
    if cluster.role != "cluster" or role not in stored:
        raise ConfigError(f"--from {base} is a {cluster.role} key file; a {role} file is made from the cluster's")
    pub, sec = stored[role]
    keys = Keys(role, cluster.server_public, pub.encode(), sec.encode(), http_token=cluster.http_token)
    _write(path, keys, None)
    return keys


def _write(path: str, keys: Keys, pairs: dict[str, list[str]] | None) -> None:
    data = keys.to_json() | ({"pairs": pairs} if pairs else {})
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # readable by its owner only
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1)


def _pairs(path: str) -> dict[str, list[str]]:
    with open(path) as f:
        pairs: dict[str, list[str]] = json.load(f).get("pairs") or {}
        return pairs


_loaded: dict[str, Keys] = {}


def load_keys(path: str) -> Keys:
    """The keys of ``path`` (read once a process), checked."""
    if path in _loaded:
        return _loaded[path]
    fix = "write one with paramserver keygen --out FILE"
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"--secret-file {path}: no such file; {fix}") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--secret-file {path}: not a paramserver key file ({exc}); {fix}") from None
    try:
        if data.get("format") != FORMAT or data.get("role") not in ROLES:
            raise ValueError(f"format {data.get('format')!r}, role {data.get('role')!r}")
        keys = Keys(data["role"], data["server_public"].encode(), data["public"].encode(), data["secret"].encode(),
                    data.get("server_secret", "").encode(), str(data["http_token"]),
                    {k.encode(): r for k, r in (data.get("allowed") or {}).items()})
        if len(keys.http_token) < 16:
            raise ValueError("its http_token is too short")
        for key in (keys.server_public, keys.public, keys.secret, *( [keys.server_secret] if keys.server_secret
                                                                     else [])):
            if len(key) != 40:
                raise ValueError("a key is not 40 Z85 characters")
        if zmq.curve_public(keys.secret) != keys.public:
            raise ValueError("its public key is not its secret key's")
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"--secret-file {path}: a damaged key file ({exc}); {fix}") from None
    _loaded[path] = keys
    return keys


def http_token(keys: Keys) -> str:
    """The token a cluster's HTTP endpoints (its dashboard, every node's /metrics) ask for,
    as ``?token=`` or ``Authorization: Bearer``: written by keygen into every file of the
    cluster, so every holder of one has it, and nobody else."""
    return keys.http_token


class NodeTokens:
    """A node's proof of its id: ``token(id)`` is an HMAC of the id under a key derived from
    the server secret.  The scheduler hands each node its own when it registers; a node
    sends it with every message that names its id (a push's ``sender``, a clock's
    ``worker``, a server's heartbeat), and the scheduler and servers check it.  A worker's
    key file has no server secret, so its holder cannot make another node's token."""

    def __init__(self, keys: Keys):
        self._key = hmac.new(keys.server_secret, b"paramserver-node-ids", hashlib.sha256).digest()
        self._known: dict[int, str] = {}

    def token(self, node_id: int) -> str:
        t = self._known.get(node_id)
        if t is None:
            t = self._known[node_id] = hmac.new(self._key, str(node_id).encode(), hashlib.sha256).hexdigest()[:32]
        return t

    def check(self, node_id: Any, token: Any, what: str) -> None:
        """ProtocolError unless ``token`` is ``node_id``'s."""
        from paramserver.errors import ProtocolError

        if not isinstance(node_id, int) or not isinstance(token, str) or \
                not hmac.compare_digest(token, self.token(node_id)):
            raise ProtocolError(f"{what} names node {node_id!r} without its token: refused (a node acts only as "
                                "the node it registered as)")


def tokens_of(transport: Any) -> NodeTokens | None:
    """The node tokens of a transport whose keys can make them (a cluster file's), else None."""
    keys = getattr(transport, "keys", None)
    return NodeTokens(keys) if keys is not None and keys.server_secret else None


def authorized(query: str, headers: Any, token: str) -> bool:
    """Whether a request carries ``token`` (``?token=`` or ``Authorization: Bearer``); any
    request does when there is none.

    The two are compared as UTF-8 bytes, in constant time: ``hmac.compare_digest`` refuses a
    ``str`` that is not ASCII with a ``TypeError``, so a token like ``?token=%C3%A9`` (or a
    header byte the HTTP parser kept as a surrogate) must be a plain "no", never an error."""
    if not token:
        return True
    from urllib.parse import parse_qs

    given = parse_qs(query).get("token", [""])[0] or str(headers.get("Authorization", "")).removeprefix(
        "Bearer ").strip()
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), token.encode("utf-8", "surrogatepass"))


def secure_server(sock: zmq.Socket[Any], keys: Keys) -> None:
    """Make a socket about to bind a CURVE server whose clients the ZAP handler checks."""
    if not keys.server_secret:
        raise ConfigError(f"a {keys.role} key file cannot serve: only the cluster's file (paramserver keygen) "
                          "has the server key that a scheduler and servers bind with")
    Zap.running(sock.context, keys)
    sock.setsockopt(zmq.ZAP_DOMAIN, DOMAIN.encode())
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys.server_secret)


def secure_client(sock: zmq.Socket[Any], keys: Keys) -> None:
    sock.setsockopt(zmq.CURVE_SERVERKEY, keys.server_public)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)


def user_role(frame: Any) -> str | None:
    """The role the ZAP handler gave the key a message came with (None on a plain link)."""
    try:
        role = frame.get("User-Id")
    except (AttributeError, zmq.ZMQError):
        return None
    return str(role) if role else None


class Zap:
    """The ZAP handler of one ZeroMQ context: lets in the cluster's listed client keys."""

    _by_context: dict[tuple[int, int], Zap] = {}  # (pid, context id): a forked child starts its own
    _lock = threading.Lock()

    def __init__(self, ctx: zmq.Context[Any], keys: Keys):
        self.allowed = dict(keys.allowed)
        self.refused: set[str] = set()  # addresses whose refusal was logged
        self.sock = ctx.socket(zmq.REP)
        self.sock.linger = 0
        self.sock.bind(ZAP_ENDPOINT)
        threading.Thread(target=self._serve, name="paramserver-zap", daemon=True).start()

    @classmethod
    def running(cls, ctx: zmq.Context[Any], keys: Keys) -> Zap:
        with cls._lock:
            key = (os.getpid(), id(ctx))
            zap = cls._by_context.get(key)
            if zap is None:
                zap = cls._by_context[key] = cls(ctx, keys)
            return zap

    def _serve(self) -> None:
        while True:
            try:
                frames = self.sock.recv_multipart()
                self.sock.send_multipart(self.answer(frames))
            except zmq.ZMQError:  # the context is ending: its term waits for this socket to close
                self.sock.close(linger=0)
                return

    def answer(self, frames: list[bytes]) -> list[bytes]:
        """ZAP (RFC 27): version, request id, domain, address, identity, mechanism, credentials."""
        if len(frames) < 6:
            return [b"1.0", frames[1] if len(frames) > 1 else b"", b"500", b"bad ZAP request", b"", b""]
        version, request_id, _domain, address, _identity, mechanism = frames[:6]
        key = z85.encode(frames[6]) if mechanism == b"CURVE" and len(frames) > 6 and len(frames[6]) == 32 else b""
        role = self.allowed.get(key)
        if role is None:
            where = address.decode(errors="replace")
            if where not in self.refused:
                self.refused.add(where)
                logger.warning("refused a connection from %s: %s", where,
                               "its key is not one of this cluster's (paramserver keygen)" if key else
                               f"it did not use CurveZMQ ({mechanism.decode(errors='replace')})")
            return [version, request_id, b"400", b"not a key of this cluster", b"", b""]
        return [version, request_id, b"200", b"OK", role.encode(), b""]
