"""``paramserver export``: a table of a running cluster written under a URL, whole (a new
base) or, with ``--delta``, only what changed since the last export there (keys set, keys
evicted), in the format ``train --publish`` writes (``checkpoint/publish.py``)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from paramserver.cli.nodes import node_config, node_flags
from paramserver.errors import ConfigError

if TYPE_CHECKING:
    from paramserver.cli.parser import Subparsers


def add_export(sub: Subparsers) -> None:
    p = sub.add_parser("export", help="write a table of a running cluster (whole, or what changed) to a URL")
    node_flags(p, bind=False, scheduler=True)
    p.add_argument("--table", required=True, help="the table's name (see paramserver cluster status)")
    p.add_argument("--out", required=True, metavar="URL",
                   help="a folder or fsspec URL: a base, then deltas (paramserver.checkpoint.publish.load_table reads "
                        "it; for a model table trained by paramserver train, load_model)")
    p.add_argument("--delta", action="store_true",
                   help="write only what changed since the last export to --out (keys set and evicted); the first "
                        "time, or after the cluster's servers changed, a whole base.  Needs a table with a "
                        "lifecycle (create_table(lifecycle='track'), train --lifecycle or --publish)")


def export(args: argparse.Namespace) -> int:
    from paramserver.checkpoint.publish import Publisher, write_table
    from paramserver.client.client import Client
    from paramserver.client.life_calls import Delta

    with Client(config=node_config(args)) as client:
        tables = client.tables()
        if args.table not in tables:
            raise ConfigError(f"no table {args.table!r} in the cluster (tables: {', '.join(sorted(tables)) or 'none'})")
        spec = tables[args.table]
        publisher = Publisher(args.out, spec.name, lambda url, k, v, _: write_table(url, spec.to_wire(), k, v))
        if spec.lifecycle:  # a delta (a base the first time), or with no --delta a new base and its token
            delta = client.export_delta(spec.name, since=publisher.token if args.delta else None)
        elif args.delta:
            raise ConfigError(f"table {spec.name!r} tracks no changes, so --delta cannot say what changed: export "
                              "it whole (no --delta), or create it with a lifecycle (lifecycle='track')")
        else:
            keys, values = client.export_table(spec.name)
            delta = Delta(keys, values, keys[:0], "", True)
        entry = publisher.publish(delta)
    what = "base" if entry["kind"] == "base" else f"delta ({entry['deleted']:,} keys evicted)"
    print(f"wrote a {what} of {entry['keys']:,} keys of {spec.name!r} to {args.out}/{entry['path']}")
    return 0
