"""The ``paramserver`` command: parses arguments and calls library functions, no logic.

    paramserver scheduler --servers 2 --port 7000        # one per cluster
    paramserver server --scheduler tcp://HOST:7000       # one per server machine
    paramserver worker --scheduler tcp://HOST:7000 --fn mypkg.train:main
    paramserver demo --servers 2 --workers 2             # a whole local cluster
    paramserver cluster add-server --scheduler tcp://HOST:7000   # grow a running ring
    paramserver cluster remove-server --id 3 --scheduler ...     # shrink it, live
    paramserver cluster status --scheduler ...
    paramserver chaos --seeds 500 --json                 # fault-injection campaign (simulated)
    paramserver nemesis --seeds 100                      # real nodes on emulated hosts under network faults
    paramserver feed rows.tsv.gz --stream redis://HOST:6379/clicks   # rows into a Redis stream

Every flag of a node also reads a ``PARAMSERVER_*`` variable (see config.ENV).

The commands are a table, name to (builder, handler), by family: cli/nodes.py (the nodes),
cli/cluster.py (a running cluster's operator), cli/ctr_flags.py and cli/rounds.py (the jobs,
run by cli/ctr.py). This module parses with the one builder asked for, then dispatches.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import logging
import os
import select
import sys
import threading
from typing import TYPE_CHECKING

from paramserver._runtime import collector
from paramserver._runtime.proctitle import set_title
from paramserver.cli import cluster, ctr_flags, export, feed, nodes, prewarm, rounds, serve
from paramserver.cli.parser import Command, root_parser
from paramserver.errors import ParamServerError, WorkerError
from paramserver.wire.ending import deliver_queued

if TYPE_CHECKING:
    from paramserver.cli.parser import Subparsers


def _add_chaos(sub: Subparsers) -> None:
    from paramserver.testing import campaign

    campaign.add_parser(sub)


def _chaos(args: argparse.Namespace) -> int:
    from paramserver.testing import campaign

    return campaign.main(args)


def _add_nemesis(sub: Subparsers) -> None:
    from paramserver.testing.nemesis import campaign

    campaign.add_parser(sub)


def _nemesis(args: argparse.Namespace) -> int:
    from paramserver.testing.nemesis import campaign

    return campaign.main(args)


# in the order ``paramserver --help`` lists them
COMMANDS: dict[str, Command] = {
    "scheduler": Command(nodes.add_scheduler, nodes.scheduler),
    "server": Command(nodes.add_server, nodes.server),
    "worker": Command(nodes.add_worker, nodes.worker),
    "node": Command(nodes.add_node, nodes.node),
    "cluster": Command(cluster.add_cluster, cluster.cluster),
    "keygen": Command(cluster.add_keygen, cluster.keygen),
    "top": Command(cluster.add_top, cluster.top),
    "export": Command(export.add_export, export.export),
    "serve": Command(serve.add_serve, serve.serve),
    "feed": Command(feed.add_feed, feed.feed),
    "train": Command(ctr_flags.add_train, ctr_flags.run_ctr),
    "predict": Command(ctr_flags.add_predict, ctr_flags.run_ctr),
    "eval": Command(ctr_flags.add_eval, ctr_flags.run_ctr),
    "split-columns": Command(ctr_flags.add_split_columns, ctr_flags.run_ctr),
    "lasso": Command(rounds.add_lasso, rounds.lasso),
    "mf": Command(rounds.add_mf, rounds.mf),
    "lda": Command(rounds.add_lda, rounds.lda),
    "synth": Command(ctr_flags.add_synth, ctr_flags.run_ctr),
    "demo": Command(ctr_flags.add_demo, ctr_flags.run_ctr),
    "chaos": Command(_add_chaos, _chaos),
    "nemesis": Command(_add_nemesis, _nemesis),
    "prewarm": Command(prewarm.add_prewarm, prewarm.prewarm),
}
# log warnings and up, not INFO
_QUIET = frozenset({"train", "demo", "predict", "eval", "synth", "chaos", "nemesis", "prewarm"})
_NODES = frozenset({"scheduler", "server", "worker", "node"})  # they serve: the allocator is tuned for it
_COMPILES = frozenset({"train", "predict", "eval", "demo", "lasso", "mf", "lda", "serve", "split-columns", "synth"})
_JOBS = frozenset({"train", "demo"})  # a job turns the collector back on once its nodes are up


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; with ``command``, only that subcommand's is built (see cli/parser.py)."""
    return root_parser(COMMANDS, command)


def command() -> None:
    """The ``paramserver`` console script (and ``python -m paramserver``): ``main``, then the
    process ends without Python's teardown of its modules.  Every command has closed what it
    opened and stopped what it started by then, and the exit handlers (``atexit``, which
    ``weakref.finalize`` and logging use) still run; what is skipped is the freeing of the
    ~175 000 objects numba and the package made, 0.05 s of every command's end (the time from
    ``main``'s return to the process's exit: 63 ms against 14, 5 runs each of ``train``).  A
    thread still running (none does when a command returns) is waited for as by Python's exit."""
    try:
        code: int | None = main()
    except SystemExit as exc:  # argparse's --help and its usage errors
        if exc.code is not None and not isinstance(exc.code, int):
            raise
        code = exc.code
    code = code or 0
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(code)  # Python's own exit joins it first
    deliver_queued()  # what ZeroMQ still holds (a scheduler's reply to SHUTDOWN): os._exit would drop it
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (``paramserver ... | head``): nothing more to say
            pass
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    # Start-up makes ~175 000 objects that live as long as the process (numba's kernels and types): the
    # cyclic collector is off until a node serves or a job's nodes are up, then they are frozen out of it
    # (a full collection over them took 0.03-0.08 s, whenever it struck)
    gc.disable()
    try:
        return _main(argv)
    finally:
        gc.enable()


def _main(argv: list[str] | None) -> int:
    words = sys.argv[1:] if argv is None else argv
    command = next((w for w in words if not w.startswith("-")), None)
    args = build_parser(command).parse_args(argv)  # a mistyped command, or none: the whole parser says which exist
    _start(args)
    try:
        return COMMANDS[args.command].run(args)
    except WorkerError as exc:  # a worker's own error: its message, not the traceback
        print(f"paramserver {args.command}: error: {exc.summary}", file=sys.stderr)
        logging.getLogger("paramserver").debug("%s", exc)
        return 2
    except ParamServerError as exc:
        print(f"paramserver {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        if isinstance(exc, BrokenPipeError) and stdout_gone():  # ``paramserver ... | head``: the reader took
            return SIGPIPE_EXIT  # what it wanted; no error to print, as ``yes | head`` prints none
        print(f"paramserver {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


#: a command whose standard output's reader went away: a shell's code for a process SIGPIPE ended
SIGPIPE_EXIT = 128 + 13


def stdout_gone() -> bool:
    """Whether standard output is a pipe whose reader has closed it (``poll`` says so of its
    writing end), as against a broken pipe or socket the command itself wrote to."""
    try:
        fd = sys.stdout.fileno()
        poll = select.poll()
        poll.register(fd, select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poll.poll(0))
    except (OSError, ValueError, AttributeError):  # no real stdout (replaced, closed): not a reader gone
        return False


def _start(args: argparse.Namespace) -> None:
    """What the process sets up before the command runs: logging, the allocator of a node,
    the cyclic collector, the watch on a parent that started it."""
    if args.command in _JOBS:  # before any thread: the job's nodes fork from here (``share_one_arena``)
        from paramserver._runtime.malloc import share_one_arena

        share_one_arena()
    level = getattr(args, "log_level", "WARNING" if args.command in _QUIET else "INFO")
    logging.basicConfig(level=level, stream=sys.stderr,
                        format=f"%(asctime)s {args.command} %(levelname)s %(name)s: %(message)s")
    if args.command in _NODES:  # a command a user typed keeps its line; a node is named for ps and top
        set_title(f"{args.command} (starting)")
    elif args.command in _COMPILES:  # a first run compiles for tens of seconds: said, not silent
        from paramserver._runtime.compiling import announce_compiles

        announce_compiles(lambda text: print(text, file=sys.stderr, flush=True))
        # numba's target now, without its BLAS probe, which imports SciPy's linalg (0.09-0.18 s of the
        # command here): else the first kernel called (a reader's, a synthesiser's) would load it with
        from paramserver._runtime.warm import load_numba, servers_load_apart

        load_numba()
        servers_load_apart()  # the command's one cluster: its servers load their kernels beside the driver
    if args.command in _NODES or getattr(args, "action", "") == "add-server":
        from paramserver._runtime.malloc import tune_allocator

        tune_allocator()
    if args.command not in _JOBS:
        collector.resume()
    if getattr(args, "parent_pid", None):
        from paramserver.cluster.local import exit_with_parent

        exit_with_parent(args.parent_pid)
