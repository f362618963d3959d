"""Node configuration: defaults < ``DMLC_*`` < ``PARAMSERVER_*`` environment < explicit arguments.

Every environment variable paramserver reads is in ``ENV``, ``NODE_ENV`` and ``DMLC_ENV``
below; the CLI flags have the same names (``PARAMSERVER_HEARTBEAT_INTERVAL_S`` is
``--heartbeat-interval-s``).  This is the seam launchers use: a Ray actor or a Kubernetes
pod sets the variables and runs ``paramserver node`` (docs/deploy.md).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

from paramserver.errors import ConfigError

#: variable -> (Config field, help)
ENV: dict[str, tuple[str, str]] = {
    "PARAMSERVER_SCHEDULER": ("scheduler", "scheduler address, e.g. tcp://10.0.0.5:7000"),
    "PARAMSERVER_HOST": ("host", "interface a scheduler or server binds (default 127.0.0.1)"),
    "PARAMSERVER_PORT": ("port", "port a scheduler or server binds (0: the OS picks)"),
    "PARAMSERVER_ADVERTISE_HOST": ("advertise_host", "the host a server tells peers to reach it at (NAT, containers; "
                                                     "default: its bound host, or with --host 0.0.0.0 the address "
                                                     "of the interface that reaches the scheduler)"),
    "PARAMSERVER_NUM_SERVERS": ("servers", "servers the scheduler waits for before forming the ring"),
    "PARAMSERVER_NUM_WORKERS": ("workers", "workers a barrier waits for (0: whoever registered)"),
    "PARAMSERVER_VNODES_PER_SERVER": ("vnodes_per_server", "ring vnodes per initial server"),
    "PARAMSERVER_HEARTBEAT_INTERVAL_S": ("heartbeat_interval_s", "seconds between heartbeats"),
    "PARAMSERVER_HEARTBEAT_TIMEOUT_S": ("heartbeat_timeout_s", "silence after which a node is dead"),
    "PARAMSERVER_CONNECT_TIMEOUT_S": ("connect_timeout_s", "how long a node tries to reach the scheduler"),
    "PARAMSERVER_LAST_COPY_TIMEOUT_S": ("last_copy_timeout_s", "silence after which a server holding the last "
                                                               "complete copy of some vnodes is dead (until then "
                                                               "it is fenced and waited for)"),
    "PARAMSERVER_MAX_MESSAGE_BYTES": ("max_message_bytes", "largest message a node accepts"),
    "PARAMSERVER_KEY_CACHE_BYTES": ("key_cache_bytes", "bytes of key lists a server keeps for the keycache filter "
                                                       "(least recently used dropped first; default 64 MiB)"),
    "PARAMSERVER_SERVER_THREADS": ("server_threads", "threads a server applies vnodes with (0: one a core)"),
    "PARAMSERVER_RETRY_TIMEOUT_S": ("retry_timeout_s", "how long a pull or push is retried across ring changes"),
    "PARAMSERVER_METRICS_PORT": ("metrics_port", "serve this node's Prometheus metrics on this port (0: any free "
                                                 "one; -1: off, the default)"),
    "PARAMSERVER_HTTP_PORT": ("http_port", "the scheduler's dashboard and the cluster's /metrics on this port (0: "
                                           "any free one; -1: off, the default)"),
    "PARAMSERVER_HTTP_HOST": ("http_host", "the interface metrics and the dashboard bind (default 127.0.0.1)"),
    "PARAMSERVER_CHECKPOINT_ROOT": ("checkpoint_root", "servers write and read checkpoints only under this folder "
                                                       "or URL (default: anywhere; '..' is always refused)"),
    "PARAMSERVER_ALLOW_LOSS": ("allow_loss", "1: a client logs a server's death with data no backup held and goes on "
                                             "(Client.losses) instead of raising DataLossError on its next call"),
    "PARAMSERVER_SECRET_FILE": ("secret_file", "the cluster's keys (paramserver keygen): every link is CurveZMQ, "
                                               "authenticated and encrypted"),
}

#: what ``paramserver node`` reads to know what to run (a launcher's pod or actor sets them)
NODE_ENV: dict[str, str] = {
    "PARAMSERVER_ROLE": "the role ``paramserver node`` runs: scheduler, server or worker",
    "PARAMSERVER_FN": "a worker's function, package.module:function (``--fn``)",
}

#: ps-lite's variables (``DMLC_*``), read where the ``PARAMSERVER_*`` one is not set, so that
#: launchers written for ps-lite and MXNet (Kubeflow's MXJob operator) start paramserver as is
DMLC_ENV: dict[str, str] = {
    "DMLC_ROLE": "PARAMSERVER_ROLE",
    "DMLC_PS_ROOT_URI": "the scheduler's host: servers and workers reach tcp://URI:PORT (PARAMSERVER_SCHEDULER)",
    "DMLC_PS_ROOT_PORT": "the scheduler's port: it binds it (PARAMSERVER_PORT); see DMLC_PS_ROOT_URI",
    "DMLC_NUM_SERVER": "PARAMSERVER_NUM_SERVERS",
    "DMLC_NUM_WORKER": "PARAMSERVER_NUM_WORKERS",
    "DMLC_NODE_HOST": "PARAMSERVER_ADVERTISE_HOST",
}
ROLES = ("scheduler", "server", "worker")


def node_role(flag: str | None = None) -> str:
    """The role of ``paramserver node``: ``--role``, else ``PARAMSERVER_ROLE``, else ``DMLC_ROLE``.

    Raises:
        ConfigError: none given, or not one of scheduler, server, worker."""
    for source, value in (("--role", flag), ("PARAMSERVER_ROLE", os.environ.get("PARAMSERVER_ROLE")),
                          ("DMLC_ROLE", os.environ.get("DMLC_ROLE"))):
        if value:
            if value not in ROLES:
                raise ConfigError(f"{source}={value!r} is not a role: use scheduler, server or worker")
            return value
    raise ConfigError("paramserver node needs its role: --role, PARAMSERVER_ROLE or DMLC_ROLE (scheduler, server "
                      "or worker)")


def _dmlc(values: dict[str, Any], role: str | None) -> None:
    """Fill what ``DMLC_*`` variables say and ``PARAMSERVER_*`` ones did not (``DMLC_ENV``)."""
    def number(var: str) -> int | None:
        raw = os.environ.get(var, "")
        if not raw:
            return None
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(f"{var}={raw!r} is not a whole number") from None

    for var, name in (("DMLC_NUM_SERVER", "servers"), ("DMLC_NUM_WORKER", "workers")):
        n = number(var)
        if n is not None:
            values.setdefault(name, n)
    if os.environ.get("DMLC_NODE_HOST"):
        values.setdefault("advertise_host", os.environ["DMLC_NODE_HOST"])
    uri, port = os.environ.get("DMLC_PS_ROOT_URI", ""), number("DMLC_PS_ROOT_PORT")
    if bool(uri) != (port is not None):
        raise ConfigError("DMLC_PS_ROOT_URI and DMLC_PS_ROOT_PORT go together (the scheduler's host and port): "
                          f"got {'DMLC_PS_ROOT_URI=' + repr(uri) if uri else 'DMLC_PS_ROOT_PORT only'}; set both")
    if port is None:
        return
    if role == "scheduler":
        values.setdefault("port", port)
    else:
        values.setdefault("scheduler", f"tcp://{uri}:{port}")
    if role in ("scheduler", "server"):  # others reach it from other machines (pods): every interface
        values.setdefault("host", "0.0.0.0")


@dataclass(frozen=True)
class Config:
    scheduler: str = ""
    host: str = "127.0.0.1"
    port: int = 0
    advertise_host: str = ""
    servers: int = 1
    workers: int = 0
    vnodes_per_server: int = 64
    heartbeat_interval_s: float = 0.5
    heartbeat_timeout_s: float = 5.0
    connect_timeout_s: float = 30.0
    last_copy_timeout_s: float = 30.0
    max_message_bytes: int = 1 << 30
    server_threads: int = 0
    key_cache_bytes: int = 64 << 20
    retry_timeout_s: float = 60.0
    metrics_port: int = -1
    http_port: int = -1
    http_host: str = "127.0.0.1"
    secret_file: str = ""
    checkpoint_root: str = ""
    allow_loss: bool = False

    def __post_init__(self) -> None:
        for name, lo in (("port", 0), ("servers", 1), ("workers", 0), ("vnodes_per_server", 1),
                         ("max_message_bytes", 1024), ("server_threads", 0), ("key_cache_bytes", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ConfigError(f"{name} must be an int >= {lo}, got {v!r}")
        if self.port > 65535:
            raise ConfigError(f"port must be <= 65535, got {self.port}")
        for name in ("metrics_port", "http_port"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not -1 <= v <= 65535:
                raise ConfigError(f"{name} must be a port in [0, 65535] (0: any free one) or -1 (off), got {v!r}")
        for name in ("heartbeat_interval_s", "heartbeat_timeout_s", "connect_timeout_s", "retry_timeout_s",
                     "last_copy_timeout_s"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ConfigError(f"{name} must be a number > 0, got {v!r}")
        if self.heartbeat_timeout_s <= self.heartbeat_interval_s:
            raise ConfigError(f"heartbeat_timeout_s ({self.heartbeat_timeout_s}) must exceed "
                              f"heartbeat_interval_s ({self.heartbeat_interval_s}); try 10x")
        if self.scheduler:
            from paramserver.wire.transport import scheme_of

            scheme_of(self.scheduler)  # names the known schemes


def _flag(raw: str) -> bool:
    """A yes/no variable: 1/true/yes/on or 0/false/no/off."""
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(raw)


def load_config(role: str | None = None, **overrides: Any) -> Config:
    """Defaults, then ``DMLC_*`` variables (ps-lite's, for ``role``), then ``PARAMSERVER_*``
    ones, then ``overrides`` that are not None."""
    types = {f.name: f.type for f in fields(Config)}
    values: dict[str, Any] = {}
    for var, (name, _) in ENV.items():
        raw = os.environ.get(var)
        if raw is None or raw == "":
            continue
        kinds: dict[str, Callable[[str], Any]] = {"int": int, "float": float, "bool": _flag}
        kind = kinds.get(str(types[name]), str)
        try:
            values[name] = kind(raw)
        except ValueError:
            what = "yes/no (1 or 0)" if kind is _flag else str(types[name])
            raise ConfigError(f"{var}={raw!r} is not a valid {what}") from None
    _dmlc(values, role)
    values.update({k: v for k, v in overrides.items() if v is not None})
    unknown = set(values) - set(types)
    if unknown:
        raise ConfigError(f"unknown config keys {sorted(unknown)} (known: {sorted(types)})")
    return replace(Config(), **values)
