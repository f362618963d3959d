"""Running the service: the model loaded (``--model``) or followed (``--follow``), the HTTP
server bound with its bounds (``limits.py``: every connection behind a ``Guard``), and a
clean stop on Ctrl-C or SIGTERM (exit 0, within about a second)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import resource
import signal
import socket
from dataclasses import dataclass, field

from aiohttp import web

from paramserver.errors import ConfigError
from paramserver.serving.app import GUARDS, LIMITS, STATS, make_app
from paramserver.serving.follow import Follower, followable
from paramserver.serving.limits import KEEPALIVE_S, LINGER_S, Limits, guarded
from paramserver.serving.loading import load_once
from paramserver.serving.model import Holder
from paramserver.serving.stats import Stats

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServeConfig:
    """What ``paramserver serve`` was asked: one of ``model`` and ``follow``."""

    model: str = ""
    follow: str = ""
    host: str = "127.0.0.1"
    port: int = 8080
    token: str = ""
    poll_s: float = 1.0
    limits: Limits = field(default_factory=Limits)
    max_age_s: float = 0.0  # a followed model older than this is not ready (0: no bound)
    allow_rollback: bool = False  # --follow may go back to an older index (Follower)

    def __post_init__(self) -> None:
        if bool(self.model) == bool(self.follow):
            raise ConfigError("serve needs one of --model DIR (a model loaded once) and --follow URL (a folder "
                              "train --publish writes, followed)")
        if not self.poll_s > 0:
            raise ConfigError(f"--poll must be > 0 seconds, got {self.poll_s:g}")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port must be in [0, 65535] (0: any free port), got {self.port}")
        if not self.max_age_s >= 0:
            raise ConfigError(f"--max-age must be >= 0 seconds (0: no bound), got {self.max_age_s:g}")
        if self.allow_rollback and self.model:
            raise ConfigError("--allow-rollback lets --follow go back to an older published index; a --model is "
                              "loaded once: drop --allow-rollback")
        if self.max_age_s and self.model:
            raise ConfigError("--max-age bounds the age of a followed model (--follow); a --model is loaded once "
                              "and only grows older: drop --max-age, or --follow the folder train --publish writes")


def serve(cfg: ServeConfig) -> int:
    """Serve until SIGINT or SIGTERM; 0.  A ``--model`` that cannot be read fails before binding."""
    holder, stats = Holder(), Stats()
    follower = None
    signal.signal(signal.SIGTERM, _interrupt)  # while loading too: a stop, not a kill
    try:
        if cfg.model:
            holder.swap(load_once(cfg.model))
        else:
            followable(cfg.follow)
            follower = Follower(cfg.follow, holder, stats, cfg.poll_s, cfg.allow_rollback)
            follower.start()
        asyncio.run(_serve(cfg, make_app(holder, stats, cfg.token, _within_file_limit(cfg.limits), cfg.max_age_s)))
    except KeyboardInterrupt:
        pass
    finally:
        if follower is not None:
            follower.stop()
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


async def _serve(cfg: ServeConfig, app: web.Application) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    runner, server = await open_http(app, cfg.host, cfg.port)
    try:
        port = int(server.sockets[0].getsockname()[1])
        print(f"serving on http://{cfg.host}:{port} (POST /predict, GET /healthz /readyz /metrics)", flush=True)
        logger.info("serving on http://%s:%d", cfg.host, port)
        await stop.wait()
    finally:
        server.close()
        await runner.cleanup()


async def open_http(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, asyncio.Server]:
    """``app`` (``make_app``'s) listening on ``host:port``, each connection behind a ``Guard`` of
    the app's limits: aiohttp's
    protocol factory (its runner's ``server``) given to ``loop.create_server``, as aiohttp's
    low-level server is.  Close the server, then clean the runner up."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0,
                           keepalive_timeout=KEEPALIVE_S, lingering_time=LINGER_S)
    await runner.setup()
    assert runner.server is not None
    try:
        server = await asyncio.get_running_loop().create_server(
            guarded(runner.server, app[LIMITS], app[STATS], app[GUARDS]), host, port, backlog=1024)
    except socket.gaierror as exc:  # the host is no address of this machine's
        await runner.cleanup()
        raise ConfigError(f"--host {host}: not an address to listen on ({exc.strerror}); give an interface's address "
                          "or name, e.g. 127.0.0.1 or 0.0.0.0") from None
    except OSError as exc:
        await runner.cleanup()
        raise ConfigError(f"--port {port}: cannot listen on {host}:{port} ({exc.strerror}); pick a free port, or 0 "
                          "for any") from None
    return runner, server


def _within_file_limit(limits: Limits) -> Limits:
    """``limits``, its connections within what the process may open: the soft limit of open
    files is raised to the hard one if need be, and --max-connections lowered, with a warning,
    if even that is short (a process needs some 64 files of its own)."""
    need = limits.max_connections + 64
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        soft = need if hard == resource.RLIM_INFINITY else min(need, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    if soft != resource.RLIM_INFINITY and soft < need:
        logger.warning("--max-connections %d: the process may open only %d files (ulimit -n); serving at most %d "
                       "connections (raise ulimit -Hn, or lower --max-connections)", limits.max_connections, soft,
                       soft - 64)
        return dataclasses.replace(limits, max_connections=max(1, soft - 64))
    return limits
