"""The commands an operator runs against a running cluster: ``cluster`` (add a server to its
ring, remove one, print its status), ``top`` (a live view of it) and ``keygen`` (the keys its
links are authenticated and encrypted with)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING, Any

from paramserver.cli.nodes import node_config, node_flags
from paramserver.config import load_config
from paramserver.errors import ConfigError

if TYPE_CHECKING:
    from paramserver.cli.parser import Subparsers


def add_cluster(sub: Subparsers) -> None:
    p = sub.add_parser("cluster", help="change a running cluster: add-server, remove-server, drop-table, status")
    ops = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    q = ops.add_parser("add-server", help="run a server here that joins the running ring (foreground)")
    node_flags(q, bind=True, scheduler=True)
    q = ops.add_parser("remove-server", help="move a server's vnodes to the others, then stop it")
    node_flags(q, bind=False, scheduler=True)
    q.add_argument("--id", type=int, required=True, help="the server's node id (see cluster status)")
    q = ops.add_parser("drop-table", help="drop a table and its rows on every server (a job on the cluster "
                                          "then makes it new)")
    node_flags(q, bind=False, scheduler=True)
    q.add_argument("name", help="the table (cluster status lists them)")
    q = ops.add_parser("status", help="print the ring: servers, ring version, vnodes moving")
    node_flags(q, bind=False, scheduler=True)


def cluster(args: argparse.Namespace) -> int:
    """``paramserver cluster ACTION``: membership changes of a running cluster."""
    if args.action == "add-server":  # a server started after the ring formed joins it
        from paramserver.server.node import ServerNode

        ServerNode(node_config(args)).run()
        return 0
    from paramserver.client.client import Client

    config = node_config(args)
    if args.action == "status":  # a question about a running cluster: said in seconds, not the start-up's 30
        config = dataclasses.replace(config, connect_timeout_s=min(config.connect_timeout_s, 5.0))
    with Client(config=config) as client:
        if args.action == "remove-server":
            version = client.admin.remove_server(args.id)
            print(f"server {args.id} removed; ring version {version}")
        elif args.action == "drop-table":
            if args.name not in client.tables():
                raise ConfigError(f"the cluster at {config.scheduler} has no table {args.name!r} (it has: "
                                  f"{', '.join(sorted(client.tables())) or 'none'})")
            client.drop_table(args.name)
            print(f"table {args.name} dropped")
        else:
            _status(client)
    return 0


def _status(client: Any) -> None:
    """``cluster status``: the ring, each server's tables, keys, memory and vnodes held,
    the tables, the workers and the job's progress."""
    from paramserver.apps.ctr.tier_report import tier_figures

    info = client.admin.cluster_info()
    ring = client.admin.ring
    stats = {s["node_id"]: s for s in client.stats.server_stats()}
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
        per = [s["tables"].get(name, {}) for s in stats.values()]
        keys = sum(t.get("primary_keys", 0) for t in per)
        held, nbytes = sum(t.get("keys", 0) for t in per), sum(t.get("bytes", 0) for t in per)
        print(f"  table {name}: dim {spec.dim}, {spec.optimizer.name}, replicas {spec.replicas}, "
              f"{'dense' if spec.key_bits else 'hash'}, {keys:,} keys, "
              f"{nbytes / held if held else 0:,.1f} bytes a key stored")
        if spec.lifecycle:
            life = [t.get("lifecycle", {}) for t in per]
            print(f"    lifecycle {spec.lifecycle}: {sum(x.get('refused', 0) for x in life):,} updates refused, "
                  f"{sum(x.get('evicted', 0) for x in life) // spec.replicas:,} keys evicted")
        if t := tier_figures(list(stats.values()), name):
            budget = max(s["tables"][name]["tiers"]["budget_bytes"] for s in stats.values()
                         if "tiers" in s["tables"].get(name, {}))
            print(f"    memory budget {budget / 2**20:,.1f} MiB a server: {t['hot_bytes'] / 2**20:,.1f} MiB in "
                  f"memory, {t['cold_keys']:,.0f} keys on disk ({t['cold_bytes'] / 2**20:,.1f} MiB), hit rate "
                  f"{t['hit_rate']:.2%}")
    for name, ns in client.admin.namespaces().items():
        if name:
            limits = ", ".join(f"{k} {ns[k]:,}" for k in ("max_keys", "max_bytes") if ns[k]) or "no quota"
            print(f"  namespace {name}: {len(ns['tables'])} table(s), {ns['keys']:,} keys, {ns['bytes']:,} bytes "
                  f"({limits})")
    workers = info.get("workers", {})
    print(f"  workers: {len(workers)}" + (" (" + ", ".join(f"node {k} rank {v}" for k, v in workers.items()) + ")"
                                          if workers else ""))
    if info.get("http"):  # a URL never has punctuation glued to it: a terminal would take it into the link
        print(f"  dashboard {info['http']}")
        print(f"  the cluster's metrics {info['http']}metrics")
    for node, url in sorted(info.get("metrics", {}).items()):
        print(f"  node {node} metrics at {url}")
    job = client.job.status()
    if "epoch" in job:
        print(f"  job: epoch {job['epoch'] + 1}/{job['epochs']}, shards {job['shards_done']}/{job['shards']}, "
              f"{int(job.get('examples', 0)):,} examples done{', finished' if job.get('finished') else ''}; "
              f"servers lost {len(job.get('failovers', []))}")


def add_keygen(sub: Subparsers) -> None:
    p = sub.add_parser("keygen", help="write a cluster's CurveZMQ keys (then --secret-file on every node)")
    p.add_argument("path", nargs="?", help="the key file to write (or --out)")
    p.add_argument("--out", help="the key file to write (it is not overwritten; mode 600; default cluster.key)")
    p.add_argument("--role", default="cluster", choices=("cluster", "worker", "driver"),
                   help="cluster: a new cluster's keys; worker or driver: a file for that role only, --from the "
                        "cluster's (it cannot run a scheduler or a server)")
    p.add_argument("--from", dest="base", metavar="CLUSTER_KEY_FILE", help="the cluster's key file (--role worker|"
                                                                         "driver)")


def keygen(args: argparse.Namespace) -> int:
    from paramserver.wire.security import keygen as write_keys

    if args.path and args.out and args.path != args.out:
        raise ConfigError(f"keygen: two files named ({args.path} and --out {args.out}); name one")
    out = args.out or args.path or "cluster.key"
    write_keys(out, args.role, args.base)
    who = {"worker": "the workers only (the scheduler and the servers take the cluster's key file)",
           "driver": "the drivers only (the scheduler and the servers take the cluster's key file)"}.get(
        args.role, "the scheduler, every server and every client")
    print(f"wrote {args.role} keys to {out}: give them to {who}, as --secret-file (PARAMSERVER_SECRET_FILE)")
    return 0


def add_top(sub: Subparsers) -> None:
    p = sub.add_parser("top", help="a live terminal view of a running cluster (the dashboard's numbers)")
    p.add_argument("--scheduler", help="scheduler address tcp://HOST:PORT [PARAMSERVER_SCHEDULER]")
    p.add_argument("--secret-file", help="the cluster's keys, if it has them [PARAMSERVER_SECRET_FILE]")
    p.add_argument("--once", action="store_true", help="print one view and exit")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")


def top(args: argparse.Namespace) -> int:
    from paramserver.dashboard.top import main as show

    top_config = load_config(scheduler=args.scheduler, secret_file=args.secret_file)
    scheduler = top_config.scheduler
    if not scheduler:
        raise ConfigError("paramserver top needs the scheduler: --scheduler tcp://HOST:PORT or "
                          "PARAMSERVER_SCHEDULER")
    if not args.interval > 0:
        raise ConfigError(f"--interval must be > 0 seconds, got {args.interval}")
    return show(scheduler, once=args.once, interval_s=args.interval, secret_file=top_config.secret_file)
