"""How a local cluster starts its nodes (``LocalCluster``, ``StandingCluster``): each forked
from the driver while that is sound, so that it inherits what the driver loaded, else spawned
as a fresh interpreter; and what a forked node loads itself.

The driver loads the kernels its nodes run before it forks them (``warm.Warmup``), the
servers' then the workers', and a forked node skips its own warm-up (``warmed``).  Where the
servers load apart (``warm.servers_load_apart``: the ``paramserver`` command's one cluster),
a server is forked at once and loads its own kernels (``server_warmup``), then waits for the
scheduler's address, while the driver loads the workers': the scheduler's start, the
servers' kernels and the workers' take their time side by side: on a first run, when they
compile, on two cores (docs/architecture.md, "Start-up": a first `train` on 10^5 rows 17.5 s
against 24.4 s; from the disk cache, level).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from paramserver.cluster.process import NodeProcess, fork_node, fork_safe, read_when_written, spawn_node
from paramserver.errors import ConnectError


@dataclass
class NodeStarts:
    """How this driver starts a node, and what the nodes forked from now on have loaded."""

    start_method: str  # "fork" (while sound, else spawned) or "spawn"
    memory_limit_mb: int | None
    secret_file: str
    startup_timeout_s: float
    warmed: bool = False  # the nodes forked from now on inherit their kernels: they skip their warm-up
    server_warmup: Callable[[], None] | None = None  # or a server forked from now on loads its own
    address_file: str = ""  # where the scheduler writes its address once it listens

    @property
    def fork_ok(self) -> bool:
        return self.start_method == "fork" and fork_safe()

    def node(self, name: str, args: list[str], log_dir: str, env: dict[str, str],
             pass_fds: tuple[int, ...] = ()) -> NodeProcess:
        """Start node ``name`` (``paramserver ARGS``, its output in ``log_dir/name.log``):
        forked while that is sound, else spawned.  A server without ``--scheduler`` learns
        the address once forked (``server_warmup``)."""
        if self.secret_file:
            args = [*args, "--secret-file", self.secret_file]
        log_path = os.path.join(log_dir, f"{name}.log")
        if not self.fork_ok:
            return spawn_node(name, args, log_path, env, pass_fds, self.memory_limit_mb)
        prepare = self._server_prepare(self.server_warmup) if args[0] == "server" and self.server_warmup else None
        return fork_node(name, args, log_path, env, pass_fds, self.memory_limit_mb, self.warmed, prepare)

    def _server_prepare(self, warm: Callable[[], None]) -> Callable[[list[str]], list[str]]:
        """A forked server's first steps (``fork_node``'s ``prepare``): its kernels loaded, then
        the scheduler's address where its arguments lack it (a server forked at the cluster's
        start, before the scheduler listened)."""
        addr_file, timeout_s = self.address_file, self.startup_timeout_s

        def prepare(argv: list[str]) -> list[str]:
            warm()
            if "--scheduler" in argv:
                return argv
            address = read_when_written(addr_file, timeout_s)
            if address is None:
                raise ConnectError(f"the scheduler did not write its address to {addr_file} within {timeout_s:g} s")
            return [*argv, "--scheduler", address]

        return prepare

    def scheduler_address(self, scheduler: NodeProcess) -> str:
        """The address ``scheduler`` writes to ``address_file`` once it listens."""
        text = read_when_written(self.address_file, self.startup_timeout_s, lambda: scheduler.popen.poll() is None)
        if text is not None:
            return text
        if scheduler.popen.poll() is not None:
            raise ConnectError(f"{scheduler.name} exited with code {scheduler.popen.returncode}")
        raise ConnectError(f"{scheduler.name} did not report its address within {self.startup_timeout_s:g} s")
