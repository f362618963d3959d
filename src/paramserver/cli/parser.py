"""How the ``paramserver`` command line is parsed: the table of commands, the root parser built
with the subparser of the one command that runs (or of every one, to list them), the help
formatter, and the flags that more than one family of commands shares.

A command is a builder (it adds its subparser) and a handler (it runs it). Only the command
asked for is built: each parser argparse makes looks for translations on disk, and building all
21 of them took 0.02 s of every command's start-up, and of every node's.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from paramserver.config import DMLC_ENV, ENV, NODE_ENV, parse_bytes
from paramserver.tables.spec import HOT_KEYS

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


class Command(NamedTuple):
    """One ``paramserver COMMAND``: ``build`` adds its subparser (named, with its help line),
    ``run`` runs it on the parsed arguments and returns the exit status."""

    build: Callable[[Subparsers], None]
    run: Callable[[argparse.Namespace], int]


def checked(parse: Callable[[str], Any], name: str) -> Callable[[str], Any]:
    """``parse`` as an argparse ``type``: its ``ConfigError`` (a ``ValueError``, which argparse
    would print as "invalid <lambda> value") said as it is, the rule and the value."""
    from paramserver.errors import ConfigError

    def typed(text: str) -> Any:
        try:
            return parse(text)
        except ConfigError as exc:  # argparse names the flag first
            raise argparse.ArgumentTypeError(str(exc).removeprefix(f"{name} ")) from None

    typed.__name__ = name
    return typed


#: ``--table-memory``'s type (``train``'s and a server's): a size in bytes
TABLE_MEMORY = checked(lambda v: parse_bytes("--table-memory", v), "--table-memory")


class Help(argparse.HelpFormatter):
    """Every flag's help shows its default (where it has one and the text does not say it)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if ("default" in text or default is None or default is False or default is argparse.SUPPRESS
                or (isinstance(default, (str, list)) and not default) or not action.option_strings):
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"


def _subparser(**kw: Any) -> argparse.ArgumentParser:
    """A command's parser: its flags' help shows their defaults (a subparser's own subparsers,
    ``cluster``'s actions, are plain parsers: argparse makes them of the class of their parent)."""
    return argparse.ArgumentParser(formatter_class=Help, **kw)


def root_parser(commands: Mapping[str, Command], command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; for a ``command`` of ``commands``, with that subcommand's
    parser only (a mistyped command, or none: every one, so that the error lists them)."""
    from paramserver import __version__

    parser = argparse.ArgumentParser(
        prog="paramserver", description="A parameter server for large-scale machine learning.",
        epilog="environment: " + ", ".join([*ENV, *NODE_ENV, *DMLC_ENV]), formatter_class=Help)
    parser.add_argument("--version", action="version", version=f"paramserver {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                parser_class=_subparser)  # type: ignore[call-overload]
    for name, (build, _) in commands.items():
        if command not in commands or name == command:
            build(sub)
    return parser


def log_level_flag(p: argparse.ArgumentParser) -> None:
    """``--log-level`` of the commands that run a node (the others log warnings and up)."""
    p.add_argument("--log-level", default=os.environ.get("PARAMSERVER_LOG_LEVEL", "INFO"),
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="[PARAMSERVER_LOG_LEVEL]")


def cluster_flag(p: argparse.ArgumentParser) -> None:
    """``--cluster``: where a command that trains starts its cluster."""
    from paramserver.cluster.launch import CLUSTER_HELP

    p.add_argument("--cluster", default="local", metavar="local|ray[:ADDRESS]|tcp://HOST:PORT", help=CLUSTER_HELP)


def secret_flag(p: argparse.ArgumentParser) -> None:
    """``--secret-file``: the cluster's keys, the same flag as the role commands, top and cluster take."""
    p.add_argument("--secret-file", metavar="FILE",
                   help="the cluster's keys (paramserver keygen): every link of the job's local cluster is CurveZMQ "
                        "[PARAMSERVER_SECRET_FILE]")


def watch_flags(p: argparse.ArgumentParser) -> None:
    """How a job on a local cluster is watched, the same on every command that runs one
    (train, lasso, mf, lda): its live line, its dashboard, its nodes' logs."""
    p.add_argument("--dashboard", nargs="?", type=int, const=0, metavar="PORT",
                   help="serve a live dashboard and the cluster's Prometheus metrics on 127.0.0.1:PORT while it "
                        "runs (no PORT: any free one); the URL is printed")
    p.add_argument("--log-dir", metavar="DIR", help="keep the nodes' logs here (default: a temporary folder, "
                                                    "removed unless the job fails or is interrupted)")
    p.add_argument("--quiet", action="store_true", help="no live progress")


def lifecycle_flag(p: argparse.ArgumentParser) -> None:
    """``--lifecycle``: what happens to the model table's keys over time, the same on every command."""
    p.add_argument("--lifecycle", metavar="SPEC", default=None,
                   help="admission, eviction and change tracking of the model's keys (docs/lifecycle.md): items "
                        "joined by ';' such as 'admit=after:2' (store a key at its 2nd sighting), 'admit=prob:0.25', "
                        "'ttl=5e6' (drop keys unseen for 5e6 examples), 'half_life=1e6;min_score=0.5', "
                        "'cap_keys=10000000' or 'cap_bytes=2G' with 'victim=lru|lfu'; default: keys stay for ever")


def table_memory_flag(p: argparse.ArgumentParser) -> None:
    """``--table-memory`` (the memory the model table's rows may take on each server), and
    with it ``--cold-dir`` (where the local cluster's servers put the rest: ``paramserver
    server --cold-dir`` means the same for a server of one's own) and ``--no-prefetch``."""
    p.add_argument("--table-memory", metavar="BYTES", default=0, type=TABLE_MEMORY,
                   help="memory the model table's rows may take on each server, like 512M: the least recently "
                        "used rows go to the server's local disk ($PARAMSERVER_COLD_DIR, else /var/tmp) and come "
                        "back when a batch asks for them; the model is the same (docs/tiers.md) [0: all in memory]")
    p.add_argument("--hot-keys", choices=HOT_KEYS, default="full",
                   help="with --table-memory, what memory keeps of each key: the key, or a 16-bit fingerprint "
                        "(9 bytes a key's slot for dim-1 FTRL with --storage bf16, against 18; about 1 key in 10^4 "
                        "then shares another's row: docs/tiers.md) [full]")
    p.add_argument("--cold-dir", metavar="DIR",
                   help="where the local cluster's servers keep the rows over --table-memory: a local disk, not "
                        "tmpfs [PARAMSERVER_COLD_DIR, $TMPDIR or /var/tmp]")
    p.add_argument("--no-prefetch", dest="prefetch", action="store_false",
                   help="do not name each batch's keys to the servers a batch ahead (a table with a memory budget "
                        "reads those on disk meanwhile); for measuring what that saves")


def storage_flag(p: argparse.ArgumentParser) -> None:
    """``--storage``: how servers store the model table's rows."""
    p.add_argument("--storage", default="float32", choices=("float32", "fp16", "bf16"),
                   help="how servers store the model's rows: float32 (default), or 16 bits a column (fp16: 11 "
                        "significant bits; bf16: float32's range), the optimiser state in bf16 with stochastic "
                        "rounding: ~30 %% (dim 1) to ~47 %% (dim 16) fewer bytes a key (docs/lifecycle.md); the "
                        "report and --metrics-out state the storage and the bytes a key")


def filters_flag(p: argparse.ArgumentParser, default: str = "none (default)") -> None:
    """``--filters``: what the job's tables send on the wire, the same on every command that
    trains; ``default``: what the command sends without it (help text)."""
    p.add_argument("--filters", metavar="SPEC", default=None,
                   help="what pushes, pulls and pull replies go through on the wire (docs/filters.md): "
                        f"{default}, keys (key caching and delta keys: the same model), lossless (and zstd), compact "
                        "(and int8 pushes with error feedback, fp16 replies), or chains per direction such as "
                        "'push=int8,keycache,delta,zstd;pull=keycache,delta,zstd;reply=fp16' (sparse: values "
                        "mostly zero as a bit a value and the others, the same values)")


def loss_flags(p: argparse.ArgumentParser) -> None:
    """What a server's death may cost: the same two flags on every command that trains."""
    p.add_argument("--replicas", type=int, default=1,
                   help="copies of every vnode, on distinct servers (2 or 3 survive a server's death)")
    p.add_argument("--allow-loss", action="store_true",
                   help="when a server dies holding vnodes with no backup (replicas 1), finish and report "
                        "the loss instead of failing")


def unverified_flag(p: argparse.ArgumentParser) -> None:
    """The flag of every command that reads a checkpoint (to resume, or a model to score with)."""
    p.add_argument("--allow-unverified-checkpoint", action="store_true",
                   help="read a checkpoint (--resume, or a training checkpoint as --model) of the first format, "
                        "whose files have no sha256 to verify (refused otherwise: an edited file would be read "
                        "unnoticed)")
