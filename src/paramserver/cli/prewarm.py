"""``paramserver prewarm``: every command's kernels compiled into numba's disk cache once, so
that none compiles at its first run (``apps/prewarm.py``).

``make demo`` and ``make test`` run it as they install.  An install by hand (``pip install``)
or a container image runs it once after (an image's build: then no pod compiles as it
starts, which a server's first heartbeats would wait for).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING

from paramserver.cli.parser import Help
from paramserver.cli.serve import installed

if TYPE_CHECKING:
    from paramserver.cli.parser import Subparsers

DESCRIPTION = """\
Compile paramserver's numba kernels into their disk cache, once: about two minutes on a fresh
machine, a line a group of kernels as it goes.  A command whose kernels are not cached
compiles them at its first run (a first `paramserver lasso` took 15 s instead of 1, a first
`train` 5 s longer); after this, none does.

By default: the quick start's kernels, train's jobs at their default flags (Criteo, LIBSVM
and Avazu rows; LR, FM and DeepFM), a saved model's predict, eval and serve, and the round apps
(lasso, mf, lda).  --all: also the 16-bit row storages, every built-in rule at several
row widths, and split-columns (what make test compiles first).
"""


def add_prewarm(sub: Subparsers) -> None:
    p = sub.add_parser("prewarm", help="compile the kernels into numba's disk cache once (about two minutes on a "
                                       "fresh machine), so that no command's first run compiles them",
                       description=DESCRIPTION)
    p.formatter_class = _Help  # the description's paragraphs keep their lines
    p.add_argument("--all", action="store_true",
                   help="also the 16-bit row storages, every built-in rule at several widths, and split-columns")


class _Help(argparse.RawDescriptionHelpFormatter, Help):
    """The flags' help as every command's (defaults shown), the description as written."""


def prewarm(args: argparse.Namespace) -> int:
    from paramserver.apps.prewarm import groups, run

    run(groups(everything=args.all, served=served()))
    return 0


def served() -> Callable[[str], object] | None:
    """``serve --model``'s load and warm-up (no socket), where ``serve`` is installed
    (``serve.installed``): an install without the ``serve`` extra has none to warm, and its
    prewarm must not fail."""
    if not installed():
        return None
    from paramserver.serving.loading import load_once

    return load_once
