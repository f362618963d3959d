"""``paramserver feed``: a file's rows (or standard input's) written into a Redis stream, in
the layout ``train --stream redis://...`` reads (``data/redis_feed.py``).

    paramserver feed day1.tsv.gz --stream redis://127.0.0.1:6379/clicks
    zcat day*.gz | paramserver feed - --stream redis://127.0.0.1:6379/clicks --maxlen 10000000
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

from paramserver.cli.parser import Help
from paramserver.errors import ConfigError

if TYPE_CHECKING:
    from paramserver.cli.parser import Subparsers
    from paramserver.data.redis_feed import Fed

DESCRIPTION = """\
Write rows into a Redis stream, in the layout train --stream redis://HOST:PORT/STREAM reads:
each entry holds up to --rows-per-entry rows (criteo or libsvm lines, copied as they are:
a stream has no CSV header) joined by newlines, in its one field (--field, default line).
Entries are added with XADD, --pipeline of them a round trip.  A blank line is not a row.
A progress line (rows, entries, rows/s) goes to standard error; the total to standard output.

train --max-examples N then trains exactly N rows, whatever the entries hold.

  paramserver feed day1.tsv.gz --stream redis://127.0.0.1:6379/clicks
  paramserver train --stream redis://127.0.0.1:6379/clicks --checkpoint-dir ckpt
"""


def add_feed(sub: Subparsers) -> None:
    p = sub.add_parser("feed", help="write a file's rows (or standard input's) into a Redis stream, as train "
                                    "--stream redis://... reads them", description=DESCRIPTION)
    p.formatter_class = _Help  # the description's examples keep their lines
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="files of rows, fed in order (local paths or fsspec URLs, .gz and the like decompressed, as "
                        "train's --data), or - for standard input")
    p.add_argument("--stream", required=True, metavar="redis://HOST:PORT[/DB]/STREAM",
                   help="the stream, as train's --stream names it (created if missing)")
    p.add_argument("--field", default=None, metavar="NAME",
                   help="the entries' field (default: the URL's ?field=, else line; train --stream reads the field "
                        "its URL's ?field= names, default line, else an entry's first field)")
    p.add_argument("--rows-per-entry", type=int, default=100, metavar="N",
                   help="rows an entry holds (1: an entry a row, for consumers that expect that)")
    p.add_argument("--pipeline", type=int, default=100, metavar="N", help="entries added a round trip to Redis")
    p.add_argument("--maxlen", type=int, default=None, metavar="N",
                   help="trim the stream to about N entries as it grows (XADD MAXLEN ~ N); entries trimmed before a "
                        "job read them are never trained: size N for the job's lag (default: no trimming)")
    p.add_argument("--quiet", action="store_true", help="no progress line (the total is still printed)")


class _Help(argparse.RawDescriptionHelpFormatter, Help):
    """The flags' help as every command's (defaults shown), the description as written."""


def feed(args: argparse.Namespace) -> int:
    from paramserver.data.redis_feed import check_feed, feed_files

    check_feed(args.rows_per_entry, args.pipeline, args.maxlen)
    for path in args.files:
        if path.lower().removesuffix(".gz").endswith(".csv"):
            raise ConfigError(f"{path}: a stream's rows have no CSV header, so train --stream reads criteo or libsvm "
                              "rows; feed such rows, or train on the CSV file with --data")
    if args.files.count("-") > 1:
        raise ConfigError("- (standard input) can be fed once")
    progress = None if args.quiet else _Progress(sys.stderr.isatty())
    done = feed_files(args.files, args.stream, field=args.field, rows_per_entry=args.rows_per_entry,
                      pipeline=args.pipeline, maxlen=args.maxlen, on_progress=progress)
    if progress is not None:
        progress.end()
    print(f"fed {done.line()} to {args.stream}")
    return 0


class _Progress:
    """The progress line: rewritten in place on a terminal, else a line every 10 s."""

    def __init__(self, tty: bool) -> None:
        self.tty, self.said, self.shown = tty, time.monotonic(), False

    def __call__(self, done: Fed) -> None:
        if self.tty:
            print(f"\rfeeding: {done.line()}   ", end="", file=sys.stderr, flush=True)
            self.shown = True
        elif time.monotonic() - self.said >= 10:
            print(f"feeding: {done.line()}", file=sys.stderr, flush=True)
            self.said = time.monotonic()

    def end(self) -> None:
        if self.shown:
            print(file=sys.stderr)
