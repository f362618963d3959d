"""What ``ps`` and ``top`` call a process: ``paramserver: server 2``, not a dozen lines of
``python -m paramserver.cli.main server --scheduler ...`` alike (setproctitle).

setproctitle takes the memory of the process's command line and environment for the
title: it must look at them (``prepare``) before anything changes the environment, as a
forked node's start does."""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def prepare() -> None:
    """Let setproctitle find the command line's memory now (a forked node, before it sets
    its environment)."""
    try:
        from setproctitle import getproctitle
    except ImportError:
        return
    getproctitle()


def set_title(what: str, short: str = "") -> None:
    """Name this process ``paramserver: WHAT`` for ``ps``, and ``short`` (15 characters,
    e.g. ``ps-server-2``) for ``top``'s default column; a no-op where setproctitle is missing."""
    try:
        from setproctitle import setproctitle, setthreadtitle
    except ImportError:  # a dependency, but a broken install must not stop a node
        logger.debug("setproctitle is not installed: the process keeps its command line as its name")
        return
    setproctitle(f"paramserver: {what}")
    setthreadtitle((short or f"ps-{what.split()[0]}")[:15])  # the main thread's name is the process's
