"""What a worker process does: connect a client, then run user functions with it.

Two modes: ``--fn module:function`` runs one function and exits (the launcher seam for
Ray or Kubernetes); ``--control-fds R,W`` (used by ``LocalCluster``) takes functions,
cloudpickled by the parent process, from a pipe until it closes.  The pipe connects a
parent to the child it started itself; nothing from the network is ever unpickled.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle

from paramserver._runtime.proctitle import set_title
from paramserver.client.client import Client
from paramserver.config import Config
from paramserver.errors import ConfigError, ParamServerError
from paramserver.plugins import Kind, declare, load_plugin

logger = logging.getLogger(__name__)


FN = declare(Kind("fn", "--fn", "a function called with the connected Client", callable,
                   "the worker (its package on PYTHONPATH, or installed)", "mypkg.jobs:train", settings=False))


def load_function(spec: str) -> Callable[..., Any]:
    """``"package.module:function"`` → the function (a plug-in of kind ``fn``,
    ``docs/plugins.md``)."""
    function: Callable[..., Any] = load_plugin(FN, spec).obj
    return function


def serve_functions(client: Client, read_fd: int, write_fd: int) -> None:
    """Run ``fn(client, *args)`` for each payload ``(call, fn, args)`` on ``read_fd`` until
    EOF; each answer carries its ``call``, so that a parent that gave up waiting on one
    run can tell its late answer from the next run's.  A payload's first byte is ``J`` if
    this worker joins that run midway, else ``-``."""
    down, up = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    while True:
        try:
            payload = down.recv_bytes()
        except EOFError:
            return
        call = None
        try:
            client.joined_midway = payload[:1] == b"J"  # started after the others (LocalCluster.add_worker)
            call, fn, args = cloudpickle.loads(payload[1:])
            answer = (call, "ok", client.rank, fn(client, *args))
        except BaseException as exc:  # report everything, including SystemExit, to the parent
            summary = str(exc) if isinstance(exc, ParamServerError) else f"{type(exc).__name__}: {exc}"
            answer = (call, "error", client.rank, (summary, traceback.format_exc()))
        try:
            data = cloudpickle.dumps(answer)
        except Exception as exc:
            text = f"the function's result cannot be pickled: {exc}"
            data = cloudpickle.dumps((call, "error", client.rank, (text, text)))
        client.joined_midway = False
        client.send_ticks(wait=True, landed=True)  # its last clock taken by the servers before the driver hears
        up.send_bytes(data)


def main(config: Config, fn: str | None, control_fds: str | None, warm: Callable[[], None] = lambda: None) -> int:
    """Run the worker process: ``warm`` loads what its work runs (the command hands in the
    CTR app's), before it registers."""
    if not control_fds and not fn:
        raise ConfigError("a worker needs --fn package.module:function to run")
    function = load_function(fn) if fn else None  # a bad --fn is said now, before connecting
    warm()  # before registering: a job's clock starts once workers are ready
    metrics_url, ours = "", []  # type: str, list[Client]  # served before registering: cluster status lists it
    if config.metrics_port >= 0:
        from paramserver.observe.metrics import client_families, serve
        from paramserver.wire.security import http_token, load_keys

        metrics_url = serve(lambda: client_families(ours[0]) if ours else [], config.http_host, config.metrics_port,
                            http_token(load_keys(config.secret_file)) if config.secret_file else "")
    with Client(config=config, role="worker", metrics_url=metrics_url) as client:
        ours.append(client)
        logger.info("worker rank %d (node %d) connected", client.rank, client.node_id)
        set_title(f"worker {client.rank} (node {client.node_id})", f"ps-worker-{client.rank}")
        if control_fds:
            r, w = (int(x) for x in control_fds.split(","))
            serve_functions(client, r, w)
        elif function is not None:
            result = function(client)
            if result is not None:
                print(result, flush=True)
    return 0
