"""The command line of the CTR commands: ``train``, ``predict``, ``eval``, ``split-columns``,
``synth`` and ``demo``, their flags and the checks of their values that argparse runs.

What the commands do is cli/ctr.py, imported only when one of them runs: it imports the apps
(0.04 s), which ``paramserver train --help`` need not.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from paramserver.cli.parser import (
    cluster_flag,
    filters_flag,
    lifecycle_flag,
    loss_flags,
    secret_flag,
    storage_flag,
    table_memory_flag,
    unverified_flag,
    watch_flags,
)

if TYPE_CHECKING:
    from paramserver.cli.parser import Subparsers


def _widths(text: str) -> tuple[int, ...]:
    """``--hidden 256,128``: layer widths."""
    try:
        widths = tuple(int(w) for w in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not comma-separated whole numbers; try 256,128") from None
    if min(widths) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: every width must be >= 1; try 256,128")
    return widths


def parse_optimizer(text: str | None) -> Any:
    """``--optimizer NAME[:key=value,...]`` or ``MODULE:FUNCTION[:key=value,...]`` (one
    syntax with ``create_table``'s), checked now: a rule that does not import is refused
    before any process starts (``TrainConfig.given_rule``)."""
    if not text:
        return None
    from paramserver.apps.ctr.train_config import given_rule

    return given_rule(text)


def _data_flags(p: argparse.ArgumentParser) -> None:
    """What ``train`` reads and how: the files, their format, the feature hashing, bad lines."""
    p.add_argument("--data", nargs="+", default=[], help="training files (local or fsspec URLs, .gz ok)")
    p.add_argument("--stream", metavar="SOURCE",
                   help="train on rows as they arrive, instead of --data, until --max-examples, --until or Ctrl-C "
                        "(the first Ctrl-C or SIGTERM stops cutting and finishes what was cut): a folder whose files "
                        "arrive (any fsspec URL; a file is taken once its size has not changed for 1 s, in name "
                        "order, and read once as it was then: --changed-files), redis://HOST:PORT/STREAM[?group=G] "
                        "(Redis Streams; needs the redis extra), - (standard input), or module:Class=URL (your "
                        "source; docs/streaming.md)")
    p.add_argument("--max-examples", type=int, metavar="N",
                   help="with --stream: stop after exactly N rows (lines that are not blank; a CSV header is not "
                        "one), counted over resumes: the Redis entry, folder file or spooled standard input that "
                        "holds the N-th row is cut after it, and a resumed job reads the rest (a compressed file "
                        "cannot be cut: it is taken whole)")
    p.add_argument("--changed-files", choices=("fail", "skip"), default="fail",
                   help="with --stream FOLDER: a file changed after it was taken (its size, modification time and "
                        "inode are recorded when taken, checked when each of its shards is read): replaced, "
                        "appended to, truncated or deleted before all of it was read. fail (default): the job "
                        "stops, naming the file, what was taken and what is there now (also on --resume); skip: "
                        "its shards not yet read are skipped, and the file, shards, bytes and about how many rows "
                        "are counted in the report and --metrics-out. A file changed after it was read is never "
                        "read again (each file once): a WARNING says how many bytes were not trained")
    p.add_argument("--until", metavar="WHEN",
                   help="with --stream: stop cutting new rows at this time: a duration (90s, 10m, 2h, 1d) or a "
                        "local time (2026-11-27T06:00)")
    p.add_argument("--test", nargs="+", default=[], help="test files, scored after training")
    p.add_argument("--format", default="criteo",
                   help="criteo (default: label, 13 integers, 26 categorical, tab-separated), libsvm, avazu (the "
                        "Avazu CTR CSV: label click, id ignored, hour split into hour of day and weekday) or csv "
                        "(a header line; every column a categorical field named by the header; needs --label)")
    p.add_argument("--label", default="", metavar="COLUMN", help="csv: the column holding the 0/1 label")
    p.add_argument("--ignore-columns", nargs="*", default=[], metavar="COLUMN",
                   help="csv/avazu: columns that are not features (ids, free text)")
    p.add_argument("--numeric-columns", nargs="*", default=[], metavar="COLUMN",
                   help="csv/avazu: columns of numbers, bucketed by size as Criteo's integer fields are (17 and 18 "
                        "share a key), instead of hashed as strings (every value its own key)")
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


def _model_flags(p: argparse.ArgumentParser) -> None:
    """``train``'s model and its optimizer."""
    p.add_argument("--model", default="lr",
                   help="lr (default), fm (factorization machine), deepfm (DeepFM) or wdl (Wide & Deep)")
    p.add_argument("--k", "--embedding-dim", dest="k", type=int, default=8,
                   help="FM factor width, a deep model's embedding width (default 8)")
    p.add_argument("--hidden", type=_widths, default=(256, 128),
                   help="deepfm/wdl: the MLP's hidden layer widths, comma separated (default 256,128)")
    p.add_argument("--fm-l2", type=float, default=1e-2,
                   help="L2 penalty on FM factors and deep models' embeddings (default 0.01)")
    p.add_argument("--optimizer", help="NAME[:key=value,...], e.g. ftrl:alpha=0.1,l1=1 (default for lr: "
                                       "ftrl:alpha=auto,beta=auto,l1=0,l2=0, alpha of 0.065, 0.115, 0.16, 0.27 and "
                                       "beta of 0.1, 0.5 the pair whose replay of the data's first 16,384 rows (2^19 "
                                       "features at most) learns best; for fm, deepfm, wdl: ftrl_adagrad, the linear "
                                       "weights' alpha and beta found as lr's, lr=0.06,initial_accumulator=20 on the "
                                       "factors); parameters not given keep the default's where NAME is the "
                                       "default's rule; or your own rule, MODULE:FUNCTION[:key=value,...] "
                                       "(docs/write-your-own.md)")


def _job_flags(p: argparse.ArgumentParser) -> None:
    """``train``'s cluster and how it goes over the data."""
    p.add_argument("--servers", type=int, default=1, help="server processes of the cluster")
    p.add_argument("--workers", type=int, default=1, help="worker processes of the cluster")
    cluster_flag(p)
    p.add_argument("--epochs", type=int, default=1, help="passes over the training data")
    p.add_argument("--batch-size", type=int, default=4000,
                   help="the largest mini-batch, in examples (default 4000, reached after 1.6 * 10^7 examples: "
                        "see --batch-ramp)")
    p.add_argument("--batch-ramp", type=float, default=1.0,
                   help="batches start at 1 example and grow to --batch-size, at most R * sqrt(examples the "
                        "worker has trained on) (default 1: 100 after 10^4 examples, 1 000 after 10^6; 0: no "
                        "ramp, every batch --batch-size)")
    p.add_argument("--pipeline", default="link", metavar="link|N|auto[:N]",
                   help="mini-batches in flight per worker.  link (default): for an LR 4, or on a link whose "
                        "round trip is 3 ms or more, 2 + one for each whole ms of it, up to 16 (a factor model, or "
                        "--consistency bsp|ssp:S, keeps 2; the round trip timed by pings to each server before the "
                        "first batch); where batches "
                        "go as steps (--steps), 64 on any link, a quarter of them a request; N: that many (1: "
                        "each sees every earlier push); auto: from 2, one more each time the worker keeps waiting "
                        "on its pulls, up to N (default 16).  Deeper than 2, the job's last 32 batches go one at a "
                        "time, so that the model ends calibrated (docs/consistency.md)")
    p.add_argument("--steps", default="auto", choices=("auto", "off"),
                   help="auto (default): an LR or an FM on one server sends each mini-batch as one step, its "
                        "gradient computed and applied by the server, with no read older than the batch before it "
                        "(64 in flight under link, the ones ready together as one request); off: pull the rows, "
                        "compute the gradient here, push it")
    p.add_argument("--row-cache", default="off", metavar="SPEC",
                   help="each worker caches the model's rows it reads often: a row is read while at most S of "
                        "its server's updates behind, trained here by the table's rule (apply=local; the default "
                        "auto where the rule's state adds: sgd, adagrad, ftrl, an FM's) or its gradients summed "
                        "(apply=server), and what it gathered pushed every S uses (while other workers write, "
                        "a trained row's push brings back the row it left): 's=8,rows=262144', "
                        "'s=100,apply=server', the preset 'hot' (s=8,rows=262144), or 'off' (default)")
    p.add_argument("--seed", type=int, default=0, help="seed of the tables' initial values")
    loss_flags(p)
    p.add_argument("--consistency", default="asp",
                   help="bsp, ssp:S (readers at most S clocks ahead of the slowest worker) or asp (default)")
    p.add_argument("--table-layout", default="auto", choices=("auto", "hash", "dense"),
                   help="how servers store the model: hash tables (any key), dense arrays over the 2^B keys "
                        "of --hash-bits B (one memory access a key, ~15%% more examples/s), or auto (default): "
                        "dense when 2^B rows take at most 1 GiB and the training data can fill them (64 bytes of "
                        "input a row: 1 GiB for 2^24; a stream counts as large), else hash (memory that follows "
                        "the keys)")
    p.add_argument("--feature-partition", type=int, metavar="P",
                   help="vertical training (lr, LIBSVM): the features cut into P column blocks by hash, one worker "
                        "a block, no process holding a whole example; --data and --test are LIBSVM files (split "
                        "now) or folders from split-columns; needs --workers P")
    p.add_argument("--shard-mb", type=float, default=16, help="split inputs into shards of this size")
    filters_flag(p)
    lifecycle_flag(p)
    storage_flag(p)
    table_memory_flag(p)
    secret_flag(p)


def _output_flags(p: argparse.ArgumentParser) -> None:
    """What ``train`` leaves behind: the model, checkpoints (and the one to resume from), reports, logs."""
    p.add_argument("--save", metavar="DIR", help="write the trained model here")
    p.add_argument("--checkpoint-dir", metavar="URL",
                   help="checkpoint the model and the job's progress here (a folder or fsspec URL)")
    p.add_argument("--keep-checkpoints", type=int, default=3, metavar="N",
                   help="keep the newest N complete checkpoints under --checkpoint-dir, remove older ones (0: all)")
    p.add_argument("--checkpoint-every", type=int, metavar="N",
                   help="data shards done between two checkpoints (default: one checkpoint an epoch; with --stream "
                        "every 30 s)")
    p.add_argument("--checkpoint-seconds", type=float, metavar="S",
                   help="checkpoint (also) every S seconds of training; with --stream the default is 30, and the "
                        "stream's position is committed with each checkpoint (exactly once on --resume)")
    p.add_argument("--resume", metavar="URL",
                   help="go on from the newest complete checkpoint in this folder (or this step), "
                        "onto any number of servers; same --data (or --stream), --shard-mb and model flags "
                        "(a table flag that differs, such as --storage or --lifecycle, is named with the "
                        "checkpoint's value and the command line that resumes)")
    unverified_flag(p)
    p.add_argument("--publish", metavar="URL",
                   help="publish the model here while it trains: a base, then what changed (keys set and evicted) "
                        "every --publish-every seconds and at the end; paramserver.load_model(URL) and predict "
                        "--model URL read it (docs/lifecycle.md)")
    p.add_argument("--publish-every", type=float, default=10.0, metavar="S",
                   help="seconds between two publications under --publish (default 10)")
    p.add_argument("--metrics-out", metavar="FILE",
                   help="write the final report as JSON here (also when the job fails: the error, and the "
                        "examples, seconds and stream position it reached)")


def add_train(sub: Subparsers) -> None:
    p = sub.add_parser("train", help="train lr, fm, deepfm or wdl on a local cluster and report test metrics")
    _data_flags(p)
    watch_flags(p)
    p.add_argument("--keep-dashboard", action="store_true",
                   help="once the job is done and reported, keep its dashboard (and cluster) up for a last look "
                        "until Ctrl-C (implies --dashboard)")
    _model_flags(p)
    _job_flags(p)
    _output_flags(p)


def _scoring_flags(p: argparse.ArgumentParser) -> None:
    """``predict`` and ``eval``: how to read the data, where it differs from the model's training data."""
    p.add_argument("--skip-bad-lines", action="store_true", help="skip and count malformed lines")
    p.add_argument("--format", help="the data's format, if not the one the model was trained on (the features "
                                    "must be the same: e.g. Avazu rows as csv)")
    p.add_argument("--label-format", help="libsvm labels: 01, pm1 or 12 (default: the model's)")
    unverified_flag(p)


def add_predict(sub: Subparsers) -> None:
    p = sub.add_parser("predict", help="write one probability a line for DATA (no cluster needed)")
    p.add_argument("--model", required=True, metavar="DIR", help="a directory written by train --save")
    p.add_argument("--data", nargs="+", required=True, help="files to score (labels optional; globs ok)")
    p.add_argument("--out", required=True, help="one probability a line, in the order of --data's lines "
                                                "(- for standard output)")
    _scoring_flags(p)


def add_eval(sub: Subparsers) -> None:
    p = sub.add_parser("eval", help="log loss and AUC of a saved model on DATA (no cluster needed)")
    p.add_argument("--model", required=True, metavar="DIR", help="a directory written by train --save")
    p.add_argument("--data", nargs="+", required=True, help="labelled files (globs ok)")
    p.add_argument("--metrics-out", metavar="FILE", help="write the metrics as JSON here")
    _scoring_flags(p)


def add_split_columns(sub: Subparsers) -> None:
    p = sub.add_parser("split-columns", help="cut a LIBSVM file into P column files by feature hash "
                                              "(for train --feature-partition P)")
    p.add_argument("--data", required=True, help="the LIBSVM file (local or fsspec URL; .gz read as such)")
    p.add_argument("--format", default="libsvm", help="libsvm (the only one for now)")
    p.add_argument("--parts", type=int, required=True, metavar="P", help="column blocks to write")
    p.add_argument("--out", required=True, metavar="DIR", help="folder for block-<p>.libsvm and columns.json")


def add_synth(sub: Subparsers) -> None:
    p = sub.add_parser("synth", help="write synthetic Criteo-format data")
    p.add_argument("--rows", type=int, required=True, help="rows to write (with --shape drift: rows a day)")
    p.add_argument("--out", required=True, help="output file (.gz, .bz2 or .xz to compress; - for standard output); "
                   "with --shape drift a folder")
    p.add_argument("--seed", type=int, default=0, help="seed of the data (another seed: other rows, same shape)")
    p.add_argument("--shape", default="simple", choices=("simple", "heavy", "drift"),
                   help="simple (default) or heavy: Criteo's own cardinalities (to 10^7 values a field), "
                        "Zipf(1.15) values, millions of keys (see paramserver.apps.ctr.synth); drift: "
                        "--days files OUT/day-DD.tsv whose ids retire and are born day to day and whose click "
                        "rate moves (see paramserver.apps.ctr.drift)")
    p.add_argument("--days", type=int, default=None,
                   help="with --shape drift: days to write, one file each (default 7)")


def add_demo(sub: Subparsers) -> None:
    p = sub.add_parser("demo", help="synthesise 300k rows and train on a local cluster (make demo)")
    p.add_argument("--rows", type=int, default=300_000, help="synthetic training rows")
    p.add_argument("--servers", type=int, default=2, help="server processes")
    p.add_argument("--workers", type=int, default=2, help="worker processes")


def run_ctr(args: argparse.Namespace) -> int:
    """Any command of cli/ctr.py (the CTR commands): the function of the command's name
    there, given the parser of ``--optimizer``."""
    from paramserver.cli import ctr

    run: Callable[[argparse.Namespace, Callable[[str | None], Any]], int] = getattr(ctr, args.command.replace("-", "_"))
    return run(args, parse_optimizer)
