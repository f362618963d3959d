"""What every command that runs a job on a local cluster shares (train, lasso, mf, lda):
the cluster's options from its flags, the live line on stderr and where to look under it,
and the console both go to.
"""

from __future__ import annotations

import argparse
import functools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from paramserver._runtime import collector
from paramserver.errors import ConfigError

if TYPE_CHECKING:
    from rich.console import Console
    from rich.live import Live


@functools.cache
def console(stderr: bool) -> Console:
    """rich's console (imported on first use: 0.015 s a job need not spend before its first example)."""
    from rich.console import Console

    return Console(stderr=stderr)


def _warm_report() -> None:
    """rich's console and table imported, and a table drawn once, while the job runs (the
    nodes are forked): the report the job ends with took 0.036-0.047 s after it, 0.03 of
    them importing rich and its first drawing's own imports."""
    import io

    from rich.console import Console
    from rich.table import Table

    table = Table(title="warm-up")
    table.add_column("a")
    table.add_row("b")
    Console(file=io.StringIO(), width=80).print(table)


class Progress:
    """What a job shows while it runs: a live progress line on stderr (none when quiet), and
    under it where to look (the scheduler, the logs, the dashboard)."""

    def __init__(self, quiet: bool, line: Callable[[dict[str, Any], float], str]) -> None:
        self.quiet, self.line = quiet, line
        self.live: Live | None = None  # started with the first progress line: once the nodes are started (forked
        # from this process while it has no other thread: Live's refresh thread would be one)
        self.where: list[str] = []
        self.last: tuple[dict[str, Any], float] | None = None  # the last status shown (quiet or not)

    def show(self, status: dict[str, Any], seconds: float) -> None:
        self.last = (status, seconds)
        if self.quiet:
            return
        if self.live is None:
            from rich.live import Live

            self.live = Live(console=console(True), refresh_per_second=4, transient=False)
            self.live.start()
        self.live.update(self.line(status, seconds) + "".join(f"\n{w}" for w in self.where))

    def announce(self, cluster: Any) -> None:  # where to look while it runs: on the progress line
        collector.resume()  # the nodes are up: start-up is over (cli.main)
        threading.Thread(target=_warm_report, name="paramserver-warm-report", daemon=True).start()
        self.where.append(f"scheduler {cluster.address}, logs {cluster.log_dir}")
        if getattr(cluster, "http_url", ""):
            token = f"?token={cluster.http_token}" if getattr(cluster, "http_token", "") else ""
            self.where.append(f"dashboard {cluster.http_url}{token}   metrics {cluster.http_url}metrics{token}")
            console(True).print(self.where[-1])  # said once, whatever the progress line does

    def stop(self) -> None:
        """End the live line; the next output starts on a line of its own, even off a
        terminal (an error was once glued to the "scheduler ..., logs DIR" line)."""
        if self.live is not None:
            self.live.stop()
            if not console(True).is_terminal:
                console(True).print()
            self.live = None


def cluster_options(args: argparse.Namespace) -> dict[str, Any]:
    """The launcher (``--cluster``, checked now, before any data is read) and its options."""
    from paramserver.cluster.launch import parse_cluster
    from paramserver.store.disk import usable_cold_dir

    options: dict[str, Any] = {}
    where = getattr(args, "cluster", None) or "local"
    if parse_cluster(where)[0] != "local":
        options["cluster"] = where
    if getattr(args, "log_dir", None):
        options["log_dir"] = args.log_dir
    if getattr(args, "secret_file", None):
        if "cluster" in options and not where.startswith("tcp://"):  # a job's driver and workers on a running one
            raise ConfigError(f"--secret-file keys a local cluster; with --cluster {where} give the nodes "
                              "PARAMSERVER_SECRET_FILE")
        options["secret_file"] = args.secret_file
    if getattr(args, "cold_dir", None):
        if "cluster" in options:
            raise ConfigError(f"--cold-dir is where a local cluster's servers keep cold rows; with --cluster {where} "
                              "give the nodes PARAMSERVER_COLD_DIR")
        options["cold_dir"] = usable_cold_dir(args.cold_dir)
    dashboard = getattr(args, "dashboard", None)
    if dashboard is None and getattr(args, "keep_dashboard", False):
        dashboard = 0  # any free port
    if dashboard is not None:
        if "cluster" in options:
            raise ConfigError(f"--dashboard serves from a local cluster's scheduler; with --cluster {where} set "
                              "PARAMSERVER_HTTP_PORT for the scheduler instead")
        if not 0 <= dashboard <= 65535:
            raise ConfigError(f"--dashboard {dashboard}: a port must be in [0, 65535] (0 or none: any free one)")
        options["http_port"] = dashboard
    return options
