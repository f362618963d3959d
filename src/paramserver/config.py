"""Node configuration: defaults < ``DMLC_*`` < ``PARAMSERVER_*`` environment < explicit arguments.

Every environment variable paramserver reads is in ``ENV`` (each ``Config`` field names its
own, with its help, beside its default), ``NODE_ENV`` and ``DMLC_ENV`` below; the CLI flags
have the same names (``PARAMSERVER_HEARTBEAT_INTERVAL_S`` is ``--heartbeat-interval-s``).
This is the seam launchers use: a Ray actor or a Kubernetes
pod sets the variables and runs ``paramserver node`` (docs/deploy.md).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

from paramserver.errors import ConfigError

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


_BYTE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_bytes(what: str, value: Any) -> int:
    """A size in bytes given as an int or as text: ``"512M"``, ``"2G"``, ``"1.5GiB"``,
    ``"4096"`` (units are powers of 1024); ``ConfigError`` naming ``what`` and the rule."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ConfigError(f"{what} must be a size >= 0 in bytes (0: none), got {value}")
        return value
    text = value.strip().lower() if isinstance(value, str) else None
    if text is not None:
        text = text.removesuffix("b").removesuffix("i")
        unit = text[-1:] if text[-1:] in _BYTE_UNITS else ""
        try:
            number = float(text[:len(text) - len(unit)])
        except ValueError:
            number = -1.0
        if math.isfinite(number) and number >= 0:
            return int(number * _BYTE_UNITS[unit])
    raise ConfigError(f"{what} must be a size in bytes like 512M, 2G or 1073741824 (0: none), got {value!r}")


def _env(default: Any, var: str, text: str) -> Any:
    """A ``Config`` field that the environment variable ``var`` sets (``ENV``): ``text`` says what it is."""
    return field(default=default, metadata={"env": var, "help": text})


@dataclass(frozen=True)
class Config:
    scheduler: str = _env("", "PARAMSERVER_SCHEDULER", "scheduler address, e.g. tcp://10.0.0.5:7000")
    host: str = _env("127.0.0.1", "PARAMSERVER_HOST", "interface a scheduler or server binds (default 127.0.0.1)")
    port: int = _env(0, "PARAMSERVER_PORT", "port a scheduler or server binds (0: the OS picks)")
    advertise_host: str = _env("", "PARAMSERVER_ADVERTISE_HOST",
                               "the host a server tells peers to reach it at (NAT, containers; default: its bound "
                               "host, or with --host 0.0.0.0 the address of the interface that reaches the scheduler)")
    servers: int = _env(1, "PARAMSERVER_NUM_SERVERS", "servers the scheduler waits for before forming the ring")
    workers: int = _env(0, "PARAMSERVER_NUM_WORKERS", "workers a barrier waits for (0: whoever registered)")
    vnodes_per_server: int = _env(64, "PARAMSERVER_VNODES_PER_SERVER", "ring vnodes per initial server")
    heartbeat_interval_s: float = _env(0.5, "PARAMSERVER_HEARTBEAT_INTERVAL_S", "seconds between heartbeats")
    heartbeat_timeout_s: float = _env(5.0, "PARAMSERVER_HEARTBEAT_TIMEOUT_S", "silence after which a node is dead")
    connect_timeout_s: float = _env(30.0, "PARAMSERVER_CONNECT_TIMEOUT_S",
                                    "how long a node tries to reach the scheduler")
    last_copy_timeout_s: float = _env(30.0, "PARAMSERVER_LAST_COPY_TIMEOUT_S",
                                      "silence after which a server holding the last complete copy of some vnodes "
                                      "is dead (until then it is fenced and waited for); a node waits as long for a "
                                      "silent scheduler, which holds the only copy of the cluster's control state")
    max_message_bytes: int = _env(1 << 30, "PARAMSERVER_MAX_MESSAGE_BYTES", "largest message a node accepts")
    server_threads: int = _env(0, "PARAMSERVER_SERVER_THREADS", "threads a server applies vnodes with (0: one a core)")
    key_cache_bytes: int = _env(64 << 20, "PARAMSERVER_KEY_CACHE_BYTES",
                                "bytes of key lists a server keeps for the keycache filter (least recently used "
                                "dropped first; default 64 MiB)")
    retry_timeout_s: float = _env(60.0, "PARAMSERVER_RETRY_TIMEOUT_S",
                                  "how long a pull or push is retried across ring changes")
    metrics_port: int = _env(-1, "PARAMSERVER_METRICS_PORT",
                             "serve this node's Prometheus metrics on this port (0: any free one; -1: off, the "
                             "default)")
    http_port: int = _env(-1, "PARAMSERVER_HTTP_PORT",
                          "the scheduler's dashboard and the cluster's /metrics on this port (0: any free one; -1: "
                          "off, the default)")
    http_host: str = _env("127.0.0.1", "PARAMSERVER_HTTP_HOST",
                          "the interface metrics and the dashboard bind (default 127.0.0.1)")
    secret_file: str = _env("", "PARAMSERVER_SECRET_FILE",
                            "the cluster's keys (paramserver keygen): every link is CurveZMQ, authenticated and "
                            "encrypted")
    checkpoint_root: str = _env("", "PARAMSERVER_CHECKPOINT_ROOT",
                                "servers write and read checkpoints only under this folder or URL (default: "
                                "anywhere; '..' is always refused)")
    table_memory: int = _env(0, "PARAMSERVER_TABLE_MEMORY",
                             "bytes of memory each hash table's rows may take on this server, like 512M: the "
                             "least recently used go to its cold directory, and come back when asked for (0: "
                             "tables without a budget of their own take what they need; dense tables and "
                             "tables whose lifecycle drops keys are left as they are)")
    cold_dir: str = _env("", "PARAMSERVER_COLD_DIR",
                         "the local directory a server keeps cold rows in (tables over a memory budget; "
                         "default: $TMPDIR, else /var/tmp; never tmpfs, whose pages are memory)")
    allow_loss: bool = _env(False, "PARAMSERVER_ALLOW_LOSS",
                            "1: a client logs a server's death with data no backup held and goes on (Client.losses) "
                            "instead of raising DataLossError on its next call")

    def __post_init__(self) -> None:
        for name, lo in (("port", 0), ("servers", 1), ("workers", 0), ("vnodes_per_server", 1),
                         ("max_message_bytes", 1024), ("server_threads", 0), ("key_cache_bytes", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ConfigError(f"{name} must be an int >= {lo}, got {v!r}")
        parse_bytes("table_memory", self.table_memory)
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


#: every ``PARAMSERVER_*`` variable a node reads, one a ``Config`` field: variable -> (field, help)
ENV: dict[str, tuple[str, str]] = {f.metadata["env"]: (f.name, f.metadata["help"]) for f in fields(Config)}


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
        if name == "table_memory":
            values[name] = parse_bytes(var, raw)
            continue
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
