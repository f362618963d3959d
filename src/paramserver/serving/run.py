"""Running the service: the model loaded (``--model``) or followed (``--follow``), the HTTP
server bound, and a clean stop on Ctrl-C or SIGTERM (exit 0, within about a second)."""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass

from aiohttp import web

from paramserver.errors import ConfigError
from paramserver.serving.app import make_app
from paramserver.serving.follow import Follower
from paramserver.serving.model import Holder, load_once
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

    def __post_init__(self) -> None:
        if bool(self.model) == bool(self.follow):
            raise ConfigError("serve needs one of --model DIR (a model loaded once) and --follow URL (a folder "
                              "train --publish writes, followed)")
        if not self.poll_s > 0:
            raise ConfigError(f"--poll must be > 0 seconds, got {self.poll_s:g}")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port must be in [0, 65535] (0: any free port), got {self.port}")


def serve(cfg: ServeConfig) -> int:
    """Serve until SIGINT or SIGTERM; 0.  A ``--model`` that cannot be read fails before binding."""
    holder, stats = Holder(), Stats()
    follower = None
    signal.signal(signal.SIGTERM, _interrupt)  # while loading too: a stop, not a kill
    try:
        if cfg.model:
            holder.swap(load_once(cfg.model))
        else:
            follower = Follower(cfg.follow, holder, stats, cfg.poll_s)
            follower.start()
        asyncio.run(_serve(cfg, make_app(holder, stats, cfg.token)))
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
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, cfg.host, cfg.port, backlog=1024)
        try:
            await site.start()
        except OSError as exc:
            raise ConfigError(f"--port {cfg.port}: cannot listen on {cfg.host}:{cfg.port} ({exc.strerror}); pick "
                              "a free port, or 0 for any") from None
        port = _bound_port(runner)
        print(f"serving on http://{cfg.host}:{port} (POST /predict, GET /healthz /readyz /metrics)", flush=True)
        logger.info("serving on http://%s:%d", cfg.host, port)
        await stop.wait()
    finally:
        await runner.cleanup()


def _bound_port(runner: web.AppRunner) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    return 0
