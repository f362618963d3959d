"""``paramserver serve``: an HTTP prediction service over a saved model (``--model``) or the
model a training job publishes (``--follow``), kept current as deltas arrive
(``serving/``)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from paramserver.errors import ConfigError

if TYPE_CHECKING:
    from paramserver.cli.parser import Subparsers


def add_serve(sub: Subparsers) -> None:
    p = sub.add_parser("serve", help="answer predictions over HTTP from a saved or published model")
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


def serve(args: argparse.Namespace) -> int:
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        raise ConfigError("paramserver serve needs aiohttp: pip install 'paramserver[serve]'") from None
    from paramserver.config import load_config
    from paramserver.serving.run import ServeConfig
    from paramserver.serving.run import serve as run
    from paramserver.wire.security import http_token, load_keys

    secret = load_config(secret_file=args.secret_file).secret_file
    token = http_token(load_keys(secret)) if secret else ""
    return run(ServeConfig(model=args.model or "", follow=args.follow or "", host=args.host, port=args.port,
                           token=token, poll_s=args.poll))
