"""The ``paramserver`` command: parses arguments and calls library functions, no logic.

    paramserver scheduler --servers 2 --port 7000        # one per cluster
    paramserver server --scheduler tcp://HOST:7000       # one per server machine
    paramserver worker --scheduler tcp://HOST:7000 --fn mypkg.train:main
    paramserver demo --servers 2 --workers 2             # a whole local cluster
    paramserver cluster add-server --scheduler tcp://HOST:7000   # grow a running ring
    paramserver cluster remove-server --id 3 --scheduler ...     # shrink it, live
    paramserver cluster status --scheduler ...
    paramserver chaos --seeds 500 --json                 # fault-injection campaign (simulated)

Every flag of a node also reads a ``PARAMSERVER_*`` variable (see config.ENV).
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
from typing import Any

from paramserver._runtime import collector
from paramserver.config import DMLC_ENV, ENV, NODE_ENV, load_config, node_role
from paramserver.errors import ConfigError, ParamServerError, WorkerError


def _widths(text: str) -> tuple[int, ...]:
    """``--hidden 256,128``: layer widths."""
    try:
        widths = tuple(int(w) for w in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not comma-separated whole numbers; try 256,128") from None
    if min(widths) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: every width must be >= 1; try 256,128")
    return widths


def _node_flags(p: argparse.ArgumentParser, *, bind: bool, scheduler: bool) -> None:
    if scheduler:
        p.add_argument("--scheduler", help="scheduler address tcp://HOST:PORT [PARAMSERVER_SCHEDULER]")
    p.add_argument("--metrics-port", type=int, help="serve this node's Prometheus metrics on this port, 0 = any "
                                                    "free one (the scheduler's: the cluster's) "
                                                    "[PARAMSERVER_METRICS_PORT, off]")
    p.add_argument("--http-host", help="interface metrics and the dashboard bind [PARAMSERVER_HTTP_HOST, 127.0.0.1]")
    p.add_argument("--secret-file", help="the cluster's keys (paramserver keygen): every link is CurveZMQ, "
                                         "authenticated and encrypted [PARAMSERVER_SECRET_FILE]")
    p.add_argument("--checkpoint-root", help="a server writes and reads checkpoints only under this folder or URL "
                                             "[PARAMSERVER_CHECKPOINT_ROOT, anywhere; '..' always refused]")
    if bind:
        p.add_argument("--host", help="interface to bind [PARAMSERVER_HOST, 127.0.0.1]")
        p.add_argument("--port", type=int, help="port to bind, 0 = any [PARAMSERVER_PORT]")
        p.add_argument("--advertise-host", help="the host peers reach this node at (NAT, containers; default: "
                                                 "the bound host, or for 0.0.0.0 the interface that reaches the "
                                                 "scheduler) [PARAMSERVER_ADVERTISE_HOST]")
    p.add_argument("--heartbeat-interval-s", type=float, help="[PARAMSERVER_HEARTBEAT_INTERVAL_S, 0.5]")
    p.add_argument("--heartbeat-timeout-s", type=float, help="[PARAMSERVER_HEARTBEAT_TIMEOUT_S, 5]")
    p.add_argument("--connect-timeout-s", type=float, help="[PARAMSERVER_CONNECT_TIMEOUT_S, 30]")
    p.add_argument("--last-copy-timeout-s", type=float,
                   help="silence after which a server holding the last complete copy of some vnodes is declared "
                        "dead (until then it is fenced and waited for) [PARAMSERVER_LAST_COPY_TIMEOUT_S, 30]")
    p.add_argument("--log-level", default=os.environ.get("PARAMSERVER_LOG_LEVEL", "INFO"),
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="[PARAMSERVER_LOG_LEVEL]")
    p.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)  # LocalCluster's: exit with it


class _Help(argparse.HelpFormatter):
    """Every flag's help shows its default (where it has one and the text does not say it)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if ("default" in text or default is None or default is False or default is argparse.SUPPRESS
                or (isinstance(default, (str, list)) and not default) or not action.option_strings):
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"


def _cluster_flag(p: argparse.ArgumentParser) -> None:
    from paramserver.cluster.launch import CLUSTER_HELP

    p.add_argument("--cluster", default="local", metavar="local|ray[:ADDRESS]", help=CLUSTER_HELP)


def _loss_flags(p: argparse.ArgumentParser) -> None:
    """What a server's death may cost: the same two flags on every command that trains."""
    p.add_argument("--replicas", type=int, default=1,
                   help="copies of every vnode, on distinct servers (2 or 3 survive a server's death)")
    p.add_argument("--allow-loss", action="store_true",
                   help="when a server dies holding vnodes with no backup (replicas 1), finish and report "
                        "the loss instead of failing")


def _round_checkpoint_flags(p: argparse.ArgumentParser, unit: str, default: int) -> None:
    """The checkpoint flags of a scheduled app (``schedule.CheckpointOptions``)."""
    p.add_argument("--checkpoint-dir", metavar="URL", help="checkpoint the model and every worker's state here "
                   "(a folder or fsspec URL) at round boundaries; an existing checkpoint there needs --resume")
    p.add_argument("--checkpoint-every", type=int, default=default, metavar="N",
                   help=f"{unit} between two checkpoints (default {default}; the last one is always checkpointed)")
    p.add_argument("--keep-checkpoints", type=int, default=3, metavar="N",
                   help="keep the newest N complete checkpoints under --checkpoint-dir, remove older ones (0: all)")
    p.add_argument("--resume", metavar="URL", help="go on from the newest complete checkpoint in this folder (or "
                   "this step): same data and layout settings; it checks them")
    _unverified_flag(p)


def _unverified_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-unverified-checkpoint", action="store_true",
                   help="read a checkpoint (--resume, or a training checkpoint as --model) of the first format, "
                        "whose files have no sha256 to verify (refused otherwise: an edited file would be read "
                        "unnoticed)")


class _Skipped:
    """The parser of a subcommand that is not running: whatever is asked of it is ignored."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: self


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; with ``command``, only that subcommand's is built (each
    parser argparse makes looks for translations on disk: 21 of them took 0.02 s of every
    command's start-up, and of every node's)."""
    from paramserver import __version__

    parser = argparse.ArgumentParser(
        prog="paramserver", description="A parameter server for large-scale machine learning.",
        epilog="environment: " + ", ".join([*ENV, *NODE_ENV, *DMLC_ENV]), formatter_class=_Help)
    parser.add_argument("--version", action="version", version=f"paramserver {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                parser_class=lambda **kw: argparse.ArgumentParser(formatter_class=_Help, **kw))  # type: ignore[call-overload]
    if command is not None:
        add = sub.add_parser
        sub.add_parser = lambda name, **kw: add(name, **kw) if name == command else _Skipped()

    p = sub.add_parser("scheduler", help="run the scheduler (membership, ring, tables, barriers)")
    _node_flags(p, bind=True, scheduler=False)
    p.add_argument("--servers", type=int, help="servers to wait for [PARAMSERVER_NUM_SERVERS, 1]")
    p.add_argument("--workers", type=int, help="workers a barrier waits for [PARAMSERVER_NUM_WORKERS]")
    p.add_argument("--vnodes-per-server", type=int, help="[PARAMSERVER_VNODES_PER_SERVER, 64]")
    p.add_argument("--address-file", help="write the bound address here once listening")
    p.add_argument("--http-port", type=int, help="serve the dashboard (/) and the cluster's metrics (/metrics) on "
                                                 "this port, 0 = any free one [PARAMSERVER_HTTP_PORT, off]")

    p = sub.add_parser("server", help="run a server (holds vnodes of every table)")
    _node_flags(p, bind=True, scheduler=True)

    p = sub.add_parser("worker", help="run a worker function against a cluster")
    _node_flags(p, bind=False, scheduler=True)
    p.add_argument("--fn", help="package.module:function, called as function(client)")
    p.add_argument("--control-fds", help=argparse.SUPPRESS)

    p = sub.add_parser("node", help="run the role the environment names (PARAMSERVER_ROLE or DMLC_ROLE): the one "
                                     "command of a launcher's pods (docs/deploy.md)")
    p.add_argument("--role", choices=("scheduler", "server", "worker"),
                   help="[PARAMSERVER_ROLE, DMLC_ROLE]")
    p.add_argument("--fn", help="a worker's package.module:function [PARAMSERVER_FN]")
    p.add_argument("--log-level", default=os.environ.get("PARAMSERVER_LOG_LEVEL", "INFO"),
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="[PARAMSERVER_LOG_LEVEL]")

    p = sub.add_parser("cluster", help="change a running cluster: add-server, remove-server, status")
    ops = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    q = ops.add_parser("add-server", help="run a server here that joins the running ring (foreground)")
    _node_flags(q, bind=True, scheduler=True)
    q = ops.add_parser("remove-server", help="move a server's vnodes to the others, then stop it")
    _node_flags(q, bind=False, scheduler=True)
    q.add_argument("--id", type=int, required=True, help="the server's node id (see cluster status)")
    q = ops.add_parser("status", help="print the ring: servers, ring version, vnodes moving")
    _node_flags(q, bind=False, scheduler=True)

    p = sub.add_parser("keygen", help="write a cluster's CurveZMQ keys (then --secret-file on every node)")
    p.add_argument("path", nargs="?", help="the key file to write (or --out)")
    p.add_argument("--out", help="the key file to write (it is not overwritten; mode 600; default cluster.key)")
    p.add_argument("--role", default="cluster", choices=("cluster", "worker", "driver"),
                   help="cluster: a new cluster's keys; worker or driver: a file for that role only, --from the "
                        "cluster's (it cannot run a scheduler or a server)")
    p.add_argument("--from", dest="base", metavar="CLUSTER_KEY_FILE", help="the cluster's key file (--role worker|"
                                                                         "driver)")

    p = sub.add_parser("top", help="a live terminal view of a running cluster (the dashboard's numbers)")
    p.add_argument("--scheduler", help="scheduler address tcp://HOST:PORT [PARAMSERVER_SCHEDULER]")
    p.add_argument("--secret-file", help="the cluster's keys, if it has them [PARAMSERVER_SECRET_FILE]")
    p.add_argument("--once", action="store_true", help="print one view and exit")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")

    p = sub.add_parser("train", help="train lr, fm, deepfm or wdl on a local cluster and report test metrics")
    _data_flags(p, training=True)
    p.add_argument("--dashboard", nargs="?", type=int, const=0, metavar="PORT",
                   help="serve a live dashboard and the cluster's Prometheus metrics on 127.0.0.1:PORT while it "
                        "trains (no PORT: any free one); the URL is printed")
    p.add_argument("--model", default="lr",
                   help="lr (default), fm (factorization machine), deepfm (DeepFM) or wdl (Wide & Deep)")
    p.add_argument("--k", "--embedding-dim", dest="k", type=int, default=8,
                   help="FM factor width, a deep model's embedding width (default 8)")
    p.add_argument("--hidden", type=_widths, default=(256, 128),
                   help="deepfm/wdl: the MLP's hidden layer widths, comma separated (default 256,128)")
    p.add_argument("--fm-l2", type=float, default=1e-2,
                   help="L2 penalty on FM factors and deep models' embeddings (default 0.01)")
    p.add_argument("--optimizer", help="NAME[:key=value,...], e.g. ftrl:alpha=0.1,l1=1 (default: ftrl for lr, "
                                       "ftrl_adagrad for fm); or your own rule, MODULE:FUNCTION[:key=value,...] "
                                       "(docs/write-your-own.md)")
    p.add_argument("--servers", type=int, default=1, help="server processes of the cluster")
    p.add_argument("--workers", type=int, default=1, help="worker processes of the cluster")
    _cluster_flag(p)
    p.add_argument("--epochs", type=int, default=1, help="passes over the training data")
    p.add_argument("--batch-size", type=int, default=4000,
                   help="the largest mini-batch, in examples (default 4000, reached after 65 536 examples: see "
                        "--batch-ramp)")
    p.add_argument("--batch-ramp", type=float, default=1.0,
                   help="batches start at 1 example and grow to --batch-size, at most R * sqrt(examples the "
                        "worker has trained on), at least 1/16 of them past 65 536 (default 1: 100 after 10^4 "
                        "examples, 256 after 65 535, then 4096; 0: no ramp)")
    p.add_argument("--pipeline", type=int, default=2,
                   help="mini-batches in flight per worker (1: each sees every earlier push)")
    p.add_argument("--seed", type=int, default=0, help="seed of the tables' initial values")
    _loss_flags(p)
    p.add_argument("--consistency", default="asp",
                   help="bsp, ssp:S (readers at most S clocks ahead of the slowest worker) or asp (default)")
    p.add_argument("--table-layout", default="auto", choices=("auto", "hash", "dense"),
                   help="how servers store the model: hash tables (any key), dense arrays over the 2^B keys "
                        "of --hash-bits B (one memory access a key), or auto (default): dense when 2^B rows "
                        "take at most 1 GiB")
    p.add_argument("--feature-partition", type=int, metavar="P",
                   help="vertical training (lr, LIBSVM): the features cut into P column blocks by hash, one worker "
                        "a block, no process holding a whole example; --data and --test are LIBSVM files (split "
                        "now) or folders from split-columns; needs --workers P")
    p.add_argument("--shard-mb", type=float, default=16, help="split inputs into shards of this size")
    p.add_argument("--save", metavar="DIR", help="write the trained model here")
    p.add_argument("--checkpoint-dir", metavar="URL",
                   help="checkpoint the model and the job's progress here (a folder or fsspec URL)")
    p.add_argument("--keep-checkpoints", type=int, default=3, metavar="N",
                   help="keep the newest N complete checkpoints under --checkpoint-dir, remove older ones (0: all)")
    p.add_argument("--checkpoint-every", type=int, metavar="N",
                   help="data shards done between two checkpoints (default: one checkpoint an epoch)")
    p.add_argument("--resume", metavar="URL",
                   help="go on from the newest complete checkpoint in this folder (or this step), "
                        "onto any number of servers; same --data, --shard-mb and model flags")
    _unverified_flag(p)
    p.add_argument("--metrics-out", metavar="FILE", help="write the final report as JSON here")
    p.add_argument("--log-dir", metavar="DIR", help="keep the nodes' logs here (default: a temporary folder, "
                                                    "removed unless the job fails)")
    p.add_argument("--quiet", action="store_true", help="no live progress")

    p = sub.add_parser("predict", help="write one probability a line for DATA (no cluster needed)")
    p.add_argument("--model", required=True, metavar="DIR", help="a directory written by train --save")
    p.add_argument("--data", nargs="+", required=True, help="files to score (labels optional; globs ok)")
    p.add_argument("--out", required=True, help="one probability a line, in the order of --data's lines")
    _scoring_flags(p)

    p = sub.add_parser("eval", help="log loss and AUC of a saved model on DATA (no cluster needed)")
    p.add_argument("--model", required=True, metavar="DIR", help="a directory written by train --save")
    p.add_argument("--data", nargs="+", required=True, help="labelled files (globs ok)")
    p.add_argument("--metrics-out", metavar="FILE", help="write the metrics as JSON here")
    _scoring_flags(p)

    p = sub.add_parser("split-columns", help="cut a LIBSVM file into P column files by feature hash "
                                              "(for train --feature-partition P)")
    p.add_argument("--data", required=True, help="the LIBSVM file (local or fsspec URL; .gz read as such)")
    p.add_argument("--format", default="libsvm", help="libsvm (the only one for now)")
    p.add_argument("--parts", type=int, required=True, metavar="P", help="column blocks to write")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for block-<p>.libsvm and columns.json")
    p = sub.add_parser("lasso", help="least-squares Lasso by coordinate descent scheduled over the workers "
                                      "(STRADS style) on a local cluster")
    p.add_argument("--data", required=True, help="LIBSVM file: 'target index:value ...' (target a real number; "
                                                 ".gz ok; local or fsspec URL)")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--lambda", dest="lam", type=float, metavar="L", help="the L1 weight λ of "
                     "1/(2n)·‖y − Xw‖² + λ‖w‖₁")
    how.add_argument("--lambda-ratio", type=float, metavar="R", help="λ = λ_max / R (λ_max = ‖Xᵀy‖∞ / n: the "
                     "smallest λ with w = 0)")
    p.add_argument("--tol", type=float, default=1e-4, help="stop when the duality gap is below TOL times the "
                   "objective: then the objective is within TOL of the optimum, relatively (default 1e-4)")
    p.add_argument("--schedule", default="priority", choices=("priority", "cyclic", "random"),
                   help="which coordinates a round updates: priority (default; by recent change, STRADS), "
                        "cyclic or random (for comparison)")
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--servers", type=int, default=1, help="server processes (default 1)")
    _cluster_flag(p)
    _loss_flags(p)
    p.add_argument("--max-rounds", type=int, default=1_000_000, help="stop after this many rounds even if the "
                   "gap is not below --tol (it is said)")
    p.add_argument("--save", metavar="DIR", help="write DIR/coef.npy: float64, entry i is feature i + 1")
    p.add_argument("--metrics-out", metavar="FILE", help="write objective, duality gap, non-zeros, seconds and "
                   "coordinate updates as JSON")
    _round_checkpoint_flags(p, "rounds", 100)

    p = sub.add_parser("mf", help="biased matrix factorisation trained model-parallel by block rotation "
                                   "(DSGD) on a local cluster")
    p.add_argument("--data", required=True, help="training ratings: 'user item rating [timestamp]' lines (MovieLens "
                   "u.data TSV, ratings.csv with its header, or ratings.dat '::'); .gz ok; local or fsspec URL")
    p.add_argument("--test", help="ratings to predict and score (same formats): test RMSE in the report")
    p.add_argument("--rank", type=int, default=64, help="factors a user and an item (default 64)")
    p.add_argument("--epochs", type=int, default=40, help="passes over the training ratings (default 40)")
    p.add_argument("--lr", type=float, default=0.007, help="SGD step (default 0.007)")
    p.add_argument("--reg", type=float, default=0.06, help="L2 weight on the factors (default 0.06; 0.01 on "
                   "the biases)")
    p.add_argument("--seed", type=int, default=0, help="seed of the initial factors and the rating order")
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--servers", type=int, default=1, help="server processes (default 1)")
    _cluster_flag(p)
    _loss_flags(p)
    p.add_argument("--predictions-out", metavar="FILE", help="one predicted rating per --test line, in order")
    p.add_argument("--save", metavar="DIR", help="write DIR/mf.npz: ids, factors, biases, global mean")
    p.add_argument("--metrics-out", metavar="FILE", help="write test RMSE, seconds and rating updates/s as JSON")
    _round_checkpoint_flags(p, "epochs", 5)

    p = sub.add_parser("lda", help="topic model (LDA) by collapsed Gibbs sampling, word blocks scheduled over the "
                                    "workers (STRADS/LightLDA style) on a local cluster")
    p.add_argument("--data", required=True, help="corpus: UCI docword (D, V, NNZ lines, then 'doc word count', "
                   "1-based) or LDA-C ('N word:count ...', 0-based); .gz ok; local or fsspec URL")
    p.add_argument("--topics", type=int, default=50, metavar="K", help="topics (default 50)")
    p.add_argument("--iterations", type=int, default=200, help="Gibbs sweeps over every token (default 200)")
    p.add_argument("--alpha", type=float, default=0.1, help="document-topic prior (default 0.1)")
    p.add_argument("--beta", type=float, default=0.01, help="topic-word prior (default 0.01)")
    p.add_argument("--seed", type=int, default=0, help="seed of the initial topics and the sampler")
    p.add_argument("--schedule", default="rotate", choices=("rotate", "none"), help="rotate (default): word blocks "
                   "go round the workers, no word sampled by two at once; none: every worker samples every word "
                   "from counts a round stale (AD-LDA; for comparison)")
    p.add_argument("--staleness", type=int, default=0, metavar="S", help="SSP between rounds: a worker may run up "
                   "to S rounds ahead of the slowest, reading counts up to S rounds stale (default 0: BSP rounds; with "
                   "rotate, S > 0 gives up that no word is sampled by two workers at once)")
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--servers", type=int, default=1, help="server processes (default 1)")
    _cluster_flag(p)
    _loss_flags(p)
    p.add_argument("--save", metavar="DIR", help="write DIR/topic_word.npy: K x V counts n_kw, column j = word j "
                   "in the input's numbering from 0")
    p.add_argument("--vocabulary", metavar="FILE", help="LDA-C only: the vocabulary, one word a line, so V covers "
                   "words no document uses (default: <name>.tokens, <name>.vocab, vocab.txt or vocabulary.txt beside "
                   "the corpus if there, else the largest word + 1)")
    p.add_argument("--metrics-out", metavar="FILE", help="write log-likelihood per token, tokens and "
                   "token-iterations/s as JSON")
    _round_checkpoint_flags(p, "iterations", 20)

    p = sub.add_parser("synth", help="write synthetic Criteo-format data")
    p.add_argument("--rows", type=int, required=True, help="rows to write")
    p.add_argument("--out", required=True, help="output path (.gz to compress)")
    p.add_argument("--seed", type=int, default=0, help="seed of the data (another seed: other rows, same shape)")
    p.add_argument("--shape", default="simple", choices=("simple", "heavy"),
                   help="simple (default) or heavy: Criteo's own cardinalities (to 10^7 values a field), "
                        "Zipf(1.15) values, millions of keys (see paramserver.apps.ctr.synth)")

    p = sub.add_parser("demo", help="synthesise 300k rows and train on a local cluster (make demo)")
    p.add_argument("--rows", type=int, default=300_000, help="synthetic training rows")
    p.add_argument("--servers", type=int, default=2, help="server processes")
    p.add_argument("--workers", type=int, default=2, help="worker processes")

    from paramserver.testing import campaign

    campaign.add_parser(sub)
    return parser


def _subcommands(parser: argparse.ArgumentParser) -> set[str]:
    return {name for action in parser._actions if isinstance(action, argparse._SubParsersAction)
            for name in action.choices}


def _scoring_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--skip-bad-lines", action="store_true", help="skip and count malformed lines")
    p.add_argument("--format", help="the data's format, if not the one the model was trained on (the features "
                                    "must be the same: e.g. Avazu rows as csv)")
    p.add_argument("--label-format", help="libsvm labels: 01, pm1 or 12 (default: the model's)")
    _unverified_flag(p)


def _data_flags(p: argparse.ArgumentParser, training: bool) -> None:
    p.add_argument("--data", nargs="+", required=True, help="training files (local or fsspec URLs, .gz ok)")
    p.add_argument("--test", nargs="+", default=[], help="test files, scored after training")
    p.add_argument("--format", default="criteo",
                   help="criteo (default: label, 13 integers, 26 categorical, tab-separated), libsvm, avazu (the "
                        "Avazu CTR CSV: label click, id ignored, hour split into hour of day and weekday) or csv "
                        "(a header line; every column a categorical field named by the header; needs --label)")
    p.add_argument("--label", default="", metavar="COLUMN", help="csv: the column holding the 0/1 label")
    p.add_argument("--ignore-columns", nargs="*", default=[], metavar="COLUMN",
                   help="csv/avazu: columns that are not features (ids, free text)")
    p.add_argument("--label-format", help="libsvm labels: 01, pm1 (-1/+1) or 12 (default: sniffed)")
    p.add_argument("--hash-bits", type=int, default=24,
                   help="fold feature keys into 2^B buckets, as Vowpal Wabbit's -b does (default 24: the model "
                        "is then a dense array, one memory access a key; 0: no folding, hash tables)")
    p.add_argument("--skip-bad-lines", action="store_true", help="skip and count malformed lines")
    p.add_argument("--max-bad-fraction", type=float, default=0.01,
                   help="with --skip-bad-lines: fail when more than this fraction of the lines are malformed "
                        "(a wrong --format, not a few damaged lines)")
    p.add_argument("--cache", metavar="DIR", default="",
                   help="keep parsed shards in DIR; later epochs (and runs) skip parsing")


def _optimizer(text: str | None):
    """``--optimizer NAME[:key=value,...]`` or ``MODULE:FUNCTION[:key=value,...]`` (one
    syntax with ``create_table``'s), checked whole now: a rule that does not import is
    refused before any process starts."""
    if not text:
        return None
    from paramserver.tables.optim import Optimizer

    return Optimizer.parse(text).to_wire()


def _config(args: argparse.Namespace, role: str | None = None):
    keys = ("scheduler", "host", "port", "advertise_host", "servers", "workers", "vnodes_per_server",
            "heartbeat_interval_s", "heartbeat_timeout_s", "connect_timeout_s", "last_copy_timeout_s",
            "metrics_port", "http_port",
            "http_host", "secret_file", "checkpoint_root")
    role = role or (args.command if args.command in ("scheduler", "server", "worker") else None)
    return load_config(role, **{k: getattr(args, k) for k in keys if hasattr(args, k)})


def _node(args: argparse.Namespace) -> int:
    """``paramserver node``: the role the environment names, configured from it alone."""
    role = node_role(args.role)
    config = _config(args, role)
    if role == "scheduler":
        from paramserver.dashboard.observer import run_scheduler

        run_scheduler(config)
        return 0
    if role == "server":
        from paramserver.server.node import ServerNode

        ServerNode(config).run()
        return 0
    from paramserver.apps.ctr.warmup import warm_worker
    from paramserver.cluster.worker import main as worker_main

    fn = args.fn or os.environ.get("PARAMSERVER_FN")
    if not fn:
        raise ConfigError("a worker started by paramserver node needs its function: --fn or PARAMSERVER_FN "
                          "(package.module:function)")
    return worker_main(config, fn, None, warm_worker)


def _cluster(args: argparse.Namespace) -> int:
    """``paramserver cluster ACTION``: membership changes of a running cluster."""
    if args.action == "add-server":  # a server started after the ring formed joins it
        from paramserver.server.node import ServerNode

        ServerNode(_config(args)).run()
        return 0
    from paramserver.client.client import Client

    with Client(config=_config(args)) as client:
        if args.action == "remove-server":
            version = client.remove_server(args.id)
            print(f"server {args.id} removed; ring version {version}")
        else:
            _status(client)
    return 0


def _status(client) -> None:
    """``cluster status``: the ring, each server's tables, keys, memory and vnodes held,
    the tables, the workers and the job's progress."""
    info = client.cluster_info()
    ring = client.ring
    stats = {s["node_id"]: s for s in client.server_stats()}
    moving = ", vnodes moving" if info.get("migrating") else ""
    print(f"ring version {info.get('ring_version')}, {ring.n_vnodes} vnodes{moving}")
    for sid in info.get("ring_servers", []):
        st = stats.get(sid, {})
        tables = st.get("tables", {})
        held = max((t.get("vnodes", 0) for t in tables.values()), default=0)
        keys = sum(t.get("keys", 0) for t in tables.values())
        print(f"  server {sid} at {info['servers'][str(sid)]}: primary of {int((ring.owners == sid).sum())} vnodes, "
              f"holds {held} (copies included), {keys:,} keys, {sum(t.get('bytes', 0) for t in tables.values()):,} "
              f"table bytes, RSS {st.get('rss_bytes', 0) / 2**20:,.0f} MiB")
    for name, spec in client.tables().items():
        keys = sum(s["tables"].get(name, {}).get("primary_keys", 0) for s in stats.values())
        print(f"  table {name}: dim {spec.dim}, {spec.optimizer.name}, replicas {spec.replicas}, "
              f"{'dense' if spec.key_bits else 'hash'}, {keys:,} keys")
    for name, ns in client.namespaces().items():
        if name:
            limits = ", ".join(f"{k} {ns[k]:,}" for k in ("max_keys", "max_bytes") if ns[k]) or "no quota"
            print(f"  namespace {name}: {len(ns['tables'])} table(s), {ns['keys']:,} keys, {ns['bytes']:,} bytes "
                  f"({limits})")
    workers = info.get("workers", {})
    print(f"  workers: {len(workers)}" + (f" (node: rank {', '.join(f'{k}: {v}' for k, v in workers.items())})"
                                          if workers else ""))
    if info.get("http"):
        print(f"  dashboard {info['http']}, the cluster's metrics at {info['http']}metrics")
    for node, url in sorted(info.get("metrics", {}).items()):
        print(f"  node {node} metrics at {url}")
    job = client.job.status()
    if "epoch" in job:
        print(f"  job: epoch {job['epoch'] + 1}/{job['epochs']}, shards {job['shards_done']}/{job['shards']}, "
              f"{int(job.get('examples', 0)):,} examples done{', finished' if job.get('finished') else ''}; "
              f"servers lost {len(job.get('failovers', []))}")


def _write_atomically(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


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
    parser = build_parser(command)
    if command not in _subcommands(parser):  # a mistyped command, or none: the whole parser says which exist
        parser = build_parser()
    args = parser.parse_args(argv)
    level = getattr(args, "log_level", "WARNING" if args.command in ("train", "demo", "predict", "eval", "synth",
                                                                      "chaos")
                    else "INFO")
    logging.basicConfig(level=level, stream=sys.stderr,
                        format=f"%(asctime)s {args.command} %(levelname)s %(name)s: %(message)s")
    if args.command in ("scheduler", "server", "worker", "node") or getattr(args, "action", "") == "add-server":
        from paramserver._runtime.malloc import tune_allocator

        tune_allocator()
    if args.command not in ("train", "demo"):  # a job turns it back on once its nodes are up
        collector.resume()
    if getattr(args, "parent_pid", None):
        from paramserver.cluster.local import exit_with_parent

        exit_with_parent(args.parent_pid)
    try:
        if args.command == "node":
            return _node(args)
        if args.command == "scheduler":
            from paramserver.dashboard.observer import run_scheduler

            on_ready = (lambda addr: _write_atomically(args.address_file, addr)) if args.address_file else None
            run_scheduler(_config(args), on_ready=on_ready)
        elif args.command == "server":
            from paramserver.server.node import ServerNode

            ServerNode(_config(args)).run()
        elif args.command == "worker":
            from paramserver.apps.ctr.warmup import warm_worker
            from paramserver.cluster.worker import main as worker_main

            return worker_main(_config(args), args.fn, args.control_fds, warm_worker)
        elif args.command == "cluster":
            return _cluster(args)
        elif args.command == "top":
            from paramserver.dashboard.top import main as top

            top_config = load_config(scheduler=args.scheduler, secret_file=args.secret_file)
            scheduler = top_config.scheduler
            if not scheduler:
                raise ConfigError("paramserver top needs the scheduler: --scheduler tcp://HOST:PORT or "
                                  "PARAMSERVER_SCHEDULER")
            if not args.interval > 0:
                raise ConfigError(f"--interval must be > 0 seconds, got {args.interval}")
            return top(scheduler, once=args.once, interval_s=args.interval, secret_file=top_config.secret_file)
        elif args.command == "keygen":
            from paramserver.wire.security import keygen

            if args.path and args.out and args.path != args.out:
                raise ConfigError(f"keygen: two files named ({args.path} and --out {args.out}); name one")
            out = args.out or args.path or "cluster.key"
            keygen(out, args.role, args.base)
            print(f"wrote {args.role} keys to {out}: give it to every node as --secret-file "
                  "(PARAMSERVER_SECRET_FILE)")
        elif args.command == "chaos":
            from paramserver.testing import campaign

            return campaign.main(args)
        elif args.command in ("train", "demo", "predict", "eval", "synth", "split-columns", "lasso", "mf", "lda"):
            from paramserver.cli import ctr as commands

            return getattr(commands, args.command.replace("-", "_"))(args, _optimizer)
        return 0
    except WorkerError as exc:  # a worker's own error: its message, not the traceback
        print(f"paramserver {args.command}: error: {exc.summary}", file=sys.stderr)
        logging.getLogger("paramserver").debug("%s", exc)
        return 2
    except ParamServerError as exc:
        print(f"paramserver {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"paramserver {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
