"""``paramserver serve``: an HTTP prediction service over a saved model (``--model``) or the
model a training job publishes (``--follow``), kept current as deltas arrive
(``serving/``)."""

from __future__ import annotations

import argparse
import importlib.util
from typing import TYPE_CHECKING

from paramserver.errors import ConfigError

if TYPE_CHECKING:
    from paramserver.cli.parser import Subparsers


def add_serve(sub: Subparsers) -> None:
    p = sub.add_parser("serve", help="answer predictions over HTTP from a saved or published model",
                       description="POST /predict takes rows in the model's format (as predict reads a file), or "
                                   "JSON {\"rows\": [...]}.  A body is JSON when its Content-Type is "
                                   "application/json; rows of text when it is text/... (text/plain, text/csv); with "
                                   "any other type or none (curl --data-binary sends "
                                   "application/x-www-form-urlencoded), JSON exactly when its first byte that is not "
                                   "blank is { or [ (no LIBSVM or Criteo row starts so).  GET /healthz, /readyz, "
                                   "/metrics.")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", metavar="URL",
                       help="a saved model (train --save), a training checkpoint or a published folder, loaded once")
    which.add_argument("--follow", metavar="URL",
                       help="a folder train --publish writes: its model is served and kept current, each new delta "
                            "swapped in whole (not ready until something is published)")
    p.add_argument("--host", default="127.0.0.1", help="the interface to listen on")
    p.add_argument("--port", type=int, default=8080, help="the port to listen on (0: any free one)")
    p.add_argument("--secret-file", metavar="FILE",
                   help="the cluster's keys (paramserver keygen): every endpoint but /healthz asks for its HTTP "
                        "token, as ?token=T or Authorization: Bearer T [PARAMSERVER_SECRET_FILE]")
    p.add_argument("--poll", type=float, default=1.0, metavar="S",
                   help="seconds between two looks at --follow's index")
    p.add_argument("--max-age", type=float, default=0.0, metavar="S",
                   help="with --follow: /readyz answers 503 while the served model is older than S seconds (nothing "
                        "newer published, or polls failing), e.g. 3600 for a model published every minute; 0 (the "
                        "default): no bound, as every replica following one folder would turn unready at once when "
                        "training pauses; a failing poll is reported as degraded either way")
    p.add_argument("--allow-rollback", action="store_true",
                   help="with --follow: follow the index back when its newest part is older than the one served (a "
                        "restored backup of the folder, a job publishing into an emptied one); without it such an "
                        "index is refused, counted and logged, and the served model kept")
    bounds = p.add_argument_group("bounds", "what one client may hold of the service (production defaults)")
    bounds.add_argument("--header-timeout", type=float, default=10.0, metavar="S",
                        help="a request's headers must arrive whole within S seconds of its first byte (or of the "
                             "connection), else 408 and the connection is closed (default: %(default)g)")
    bounds.add_argument("--body-timeout", type=float, default=60.0, metavar="S",
                        help="a request's whole body must arrive within S seconds of its headers, else 408 and the "
                             "connection is closed (default: %(default)g)")
    bounds.add_argument("--max-connections", type=int, default=1000, metavar="N",
                        help="connections open at once; one more is answered 503 with Retry-After and closed (idle "
                             "keep-alive connections close after 15 s) (default: %(default)d)")
    bounds.add_argument("--max-rows", type=int, default=100_000, metavar="N",
                        help="rows a request; more is a 413 (default: %(default)d)")
    bounds.add_argument("--max-body-mb", type=int, default=256, metavar="MB",
                        help="a request's body, in MiB; larger is a 413 (default: %(default)d)")
    bounds.add_argument("--max-held-mb", type=int, default=1024, metavar="MB",
                        help="request bodies held at once (being read or scored), in MiB; a body that would pass it "
                             "is a 503 with Retry-After (default: %(default)d).  The process needs about this, plus "
                             "the model, plus ~2x the largest JSON body")


def installed() -> bool:
    """Whether ``serve`` can run here: the ``serve`` extra's aiohttp, which the serving layer
    imports (``prewarm`` asks too: an install without it has no ``serve`` to warm)."""
    return importlib.util.find_spec("aiohttp") is not None


def serve(args: argparse.Namespace) -> int:
    if not installed():
        raise ConfigError("paramserver serve needs aiohttp: pip install 'paramserver[serve]'")
    from paramserver.config import load_config
    from paramserver.serving.limits import MIB, Limits
    from paramserver.serving.run import ServeConfig
    from paramserver.serving.run import serve as run
    from paramserver.wire.security import http_token, load_keys

    secret = load_config(secret_file=args.secret_file).secret_file
    token = http_token(load_keys(secret)) if secret else ""
    return run(ServeConfig(model=args.model or "", follow=args.follow or "", host=args.host, port=args.port,
                           token=token, poll_s=args.poll, max_age_s=args.max_age, allow_rollback=args.allow_rollback,
                           limits=Limits(header_timeout_s=args.header_timeout, body_timeout_s=args.body_timeout,
                                         max_connections=args.max_connections, max_rows=args.max_rows,
                                         max_body_bytes=args.max_body_mb * MIB, max_held_bytes=args.max_held_mb * MIB)))
