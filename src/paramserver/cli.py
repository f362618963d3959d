"""The ``paramserver`` command: parses arguments and calls library functions, no logic.

    paramserver scheduler --servers 2 --port 7000        # one per cluster
    paramserver server --scheduler tcp://HOST:7000       # one per server machine
    paramserver worker --scheduler tcp://HOST:7000 --fn mypkg.train:main
    paramserver demo --servers 2 --workers 2             # a whole local cluster

Every flag of a node also reads a ``PARAMSERVER_*`` variable (see config.ENV).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from paramserver.config import ENV, load_config
from paramserver.errors import ParamServerError


def _node_flags(p: argparse.ArgumentParser, *, bind: bool, scheduler: bool) -> None:
    if scheduler:
        p.add_argument("--scheduler", help="scheduler address tcp://HOST:PORT [PARAMSERVER_SCHEDULER]")
    if bind:
        p.add_argument("--host", help="interface to bind [PARAMSERVER_HOST, 127.0.0.1]")
        p.add_argument("--port", type=int, help="port to bind, 0 = any [PARAMSERVER_PORT]")
    p.add_argument("--heartbeat-interval-s", type=float, help="[PARAMSERVER_HEARTBEAT_INTERVAL_S, 1]")
    p.add_argument("--heartbeat-timeout-s", type=float, help="[PARAMSERVER_HEARTBEAT_TIMEOUT_S, 10]")
    p.add_argument("--connect-timeout-s", type=float, help="[PARAMSERVER_CONNECT_TIMEOUT_S, 30]")
    p.add_argument("--log-level", default=os.environ.get("PARAMSERVER_LOG_LEVEL", "INFO"),
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="[PARAMSERVER_LOG_LEVEL]")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="paramserver", description="A parameter server for large-scale machine learning.",
        epilog="environment: " + ", ".join(ENV))
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("scheduler", help="run the scheduler (membership, ring, tables, barriers)")
    _node_flags(p, bind=True, scheduler=False)
    p.add_argument("--servers", type=int, help="servers to wait for [PARAMSERVER_NUM_SERVERS, 1]")
    p.add_argument("--workers", type=int, help="workers a barrier waits for [PARAMSERVER_NUM_WORKERS]")
    p.add_argument("--vnodes-per-server", type=int, help="[PARAMSERVER_VNODES_PER_SERVER, 64]")
    p.add_argument("--address-file", help="write the bound address here once listening")

    p = sub.add_parser("server", help="run a server (holds vnodes of every table)")
    _node_flags(p, bind=True, scheduler=True)

    p = sub.add_parser("worker", help="run a worker function against a cluster")
    _node_flags(p, bind=False, scheduler=True)
    p.add_argument("--fn", help="package.module:function, called as function(client)")
    p.add_argument("--control-fds", help=argparse.SUPPRESS)

    p = sub.add_parser("demo", help="train a sparse logistic regression on a local cluster")
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--examples", type=int, default=200_000, help="examples per worker")
    p.add_argument("--batch-size", type=int, default=2_000)
    p.add_argument("--epochs", type=int, default=2)
    return parser


def _config(args: argparse.Namespace):
    keys = ("scheduler", "host", "port", "servers", "workers", "vnodes_per_server",
            "heartbeat_interval_s", "heartbeat_timeout_s", "connect_timeout_s")
    return load_config(**{k: getattr(args, k) for k in keys if hasattr(args, k)})


def _write_atomically(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = getattr(args, "log_level", "INFO")
    logging.basicConfig(level=level, stream=sys.stderr,
                        format=f"%(asctime)s {args.command} %(levelname)s %(name)s: %(message)s")
    if args.command in ("scheduler", "server", "worker"):
        from paramserver._malloc import tune_allocator

        tune_allocator()
    try:
        if args.command == "scheduler":
            from paramserver.scheduler.node import SchedulerNode

            on_ready = (lambda addr: _write_atomically(args.address_file, addr)) if args.address_file else None
            SchedulerNode(_config(args), on_ready=on_ready).run()
        elif args.command == "server":
            from paramserver.server.node import ServerNode

            ServerNode(_config(args)).run()
        elif args.command == "worker":
            from paramserver.cluster.worker import main as worker_main

            return worker_main(_config(args), args.fn, args.control_fds)
        elif args.command == "demo":
            from paramserver.apps.demo import DemoConfig, run_demo

            run_demo(args.servers, args.workers,
                     DemoConfig(args.examples, args.batch_size, args.epochs))
        return 0
    except ParamServerError as exc:
        print(f"paramserver {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
