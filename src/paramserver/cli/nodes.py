"""The commands that run one node of a cluster: ``scheduler``, ``server``, ``worker``, and
``node``, the role the environment names (the one command of a launcher's pods).

Every flag of a node also reads a ``PARAMSERVER_*`` variable (config.ENV): the flags here are
turned into the node's ``Config`` by ``load_config``, which fills in the rest from there.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from paramserver.cli.parser import TABLE_MEMORY, log_level_flag
from paramserver.config import Config, load_config, node_role
from paramserver.errors import ConfigError

if TYPE_CHECKING:
    from paramserver.cli.parser import Subparsers

_CONFIG_KEYS = ("scheduler", "host", "port", "advertise_host", "servers", "workers", "vnodes_per_server",
                "heartbeat_interval_s", "heartbeat_timeout_s", "connect_timeout_s", "last_copy_timeout_s",
                "metrics_port", "http_port",
                "http_host", "secret_file", "checkpoint_root", "table_memory", "cold_dir")


def node_flags(p: argparse.ArgumentParser, *, bind: bool, scheduler: bool) -> None:
    """The flags of a node: where its scheduler is, what it serves and binds, its timeouts."""
    if scheduler:
        p.add_argument("--scheduler", help="scheduler address tcp://HOST:PORT [PARAMSERVER_SCHEDULER]")
    p.add_argument("--metrics-port", type=int, help="serve this node's Prometheus metrics on this port, 0 = any "
                                                    "free one (the scheduler's: the cluster's) "
                                                    "[PARAMSERVER_METRICS_PORT, off]")
    p.add_argument("--http-host", help="interface metrics and the dashboard bind [PARAMSERVER_HTTP_HOST, 127.0.0.1]")
    p.add_argument("--secret-file", help="the cluster's keys (paramserver keygen): every link is CurveZMQ, "
                                         "authenticated and encrypted [PARAMSERVER_SECRET_FILE]")
    p.add_argument("--checkpoint-root", help="a server writes and reads checkpoints only under this folder or URL "
                                             "[PARAMSERVER_CHECKPOINT_ROOT, anywhere; '..' always refused]")
    if bind:
        p.add_argument("--host", help="interface to bind [PARAMSERVER_HOST, 127.0.0.1]")
        p.add_argument("--port", type=int, help="port to bind, 0 = any [PARAMSERVER_PORT]")
        p.add_argument("--advertise-host", help="the host peers reach this node at (NAT, containers; default: "
                                                 "the bound host, or for 0.0.0.0 the interface that reaches the "
                                                 "scheduler) [PARAMSERVER_ADVERTISE_HOST]")
    p.add_argument("--heartbeat-interval-s", type=float, help="[PARAMSERVER_HEARTBEAT_INTERVAL_S, 0.5]")
    p.add_argument("--heartbeat-timeout-s", type=float, help="[PARAMSERVER_HEARTBEAT_TIMEOUT_S, 5]")
    p.add_argument("--connect-timeout-s", type=float, help="[PARAMSERVER_CONNECT_TIMEOUT_S, 30]")
    p.add_argument("--last-copy-timeout-s", type=float,
                   help="silence after which a server holding the last complete copy of some vnodes is declared "
                        "dead (until then it is fenced and waited for); workers and drivers wait as long for a "
                        "silent scheduler [PARAMSERVER_LAST_COPY_TIMEOUT_S, 30]")
    log_level_flag(p)
    p.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)  # LocalCluster's: exit with it


def node_config(args: argparse.Namespace, role: str | None = None) -> Config:
    """The node's configuration: its flags over its ``PARAMSERVER_*`` variables."""
    role = role or (args.command if args.command in ("scheduler", "server", "worker") else None)
    return load_config(role, **{k: getattr(args, k) for k in _CONFIG_KEYS if hasattr(args, k)})


def add_scheduler(sub: Subparsers) -> None:
    p = sub.add_parser("scheduler", help="run the scheduler (membership, ring, tables, barriers)")
    node_flags(p, bind=True, scheduler=False)
    p.add_argument("--servers", type=int, help="servers to wait for [PARAMSERVER_NUM_SERVERS, 1]")
    p.add_argument("--workers", type=int, help="workers a barrier waits for [PARAMSERVER_NUM_WORKERS]")
    p.add_argument("--vnodes-per-server", type=int, help="[PARAMSERVER_VNODES_PER_SERVER, 64]")
    p.add_argument("--address-file", help="write the bound address here once listening")
    p.add_argument("--http-port", type=int, help="serve the dashboard (/) and the cluster's metrics (/metrics) on "
                                                 "this port, 0 = any free one [PARAMSERVER_HTTP_PORT, off]")


def _write_atomically(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def scheduler(args: argparse.Namespace) -> int:
    from paramserver.dashboard.scheduler_run import run_scheduler

    on_ready = (lambda addr: _write_atomically(args.address_file, addr)) if args.address_file else None
    run_scheduler(node_config(args), on_ready=on_ready)
    return 0


def add_server(sub: Subparsers) -> None:
    p = sub.add_parser("server", help="run a server (holds vnodes of every table)")
    node_flags(p, bind=True, scheduler=True)
    memory_flags(p)


def memory_flags(p: argparse.ArgumentParser) -> None:
    """A server's memory budget for each table's rows, and where the rows over it go."""
    p.add_argument("--table-memory", type=TABLE_MEMORY,
                   help="bytes of memory each hash table's rows may take on this server, like 512M; the least "
                        "recently used rows go to --cold-dir and come back when asked for (a table's own "
                        "memory budget is used where it has one) [PARAMSERVER_TABLE_MEMORY, 0: no budget]")
    p.add_argument("--cold-dir", help="the local directory cold rows are kept in (not tmpfs) "
                                      "[PARAMSERVER_COLD_DIR, $TMPDIR or /var/tmp]")


def server(args: argparse.Namespace) -> int:
    from paramserver.server.node import ServerNode

    ServerNode(node_config(args)).run()
    return 0


def add_worker(sub: Subparsers) -> None:
    p = sub.add_parser("worker", help="run a worker function against a cluster")
    node_flags(p, bind=False, scheduler=True)
    p.add_argument("--fn", help="package.module:function, called as function(client)")
    p.add_argument("--control-fds", help=argparse.SUPPRESS)


def worker(args: argparse.Namespace) -> int:
    from paramserver.apps.ctr.warmup import warm_worker
    from paramserver.cluster.worker import main as worker_main

    return worker_main(node_config(args), args.fn, args.control_fds, warm_worker)


def add_node(sub: Subparsers) -> None:
    p = sub.add_parser("node", help="run the role the environment names (PARAMSERVER_ROLE or DMLC_ROLE): the one "
                                     "command of a launcher's pods (docs/deploy.md)")
    p.add_argument("--role", choices=("scheduler", "server", "worker"),
                   help="[PARAMSERVER_ROLE, DMLC_ROLE]")
    p.add_argument("--fn", help="a worker's package.module:function [PARAMSERVER_FN]")
    log_level_flag(p)


def node(args: argparse.Namespace) -> int:
    """``paramserver node``: the role the environment names, configured from it alone."""
    role = node_role(args.role)
    config = node_config(args, role)
    if role == "scheduler":
        from paramserver.dashboard.scheduler_run import run_scheduler

        run_scheduler(config)
        return 0
    if role == "server":
        from paramserver.server.node import ServerNode

        ServerNode(config).run()
        return 0
    from paramserver.apps.ctr.warmup import warm_worker
    from paramserver.cluster.worker import main as worker_main

    fn = args.fn or os.environ.get("PARAMSERVER_FN")
    if not fn:
        raise ConfigError("a worker started by paramserver node needs its function: --fn or PARAMSERVER_FN "
                          "(package.module:function)")
    return worker_main(config, fn, None, warm_worker)
