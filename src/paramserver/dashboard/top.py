"""``paramserver top``: the dashboard's numbers in a terminal, for a cluster reached over ssh.

    paramserver top --scheduler tcp://HOST:7000          # refreshes every second; Ctrl-C ends it
    paramserver top --scheduler tcp://HOST:7000 --once   # one table, then exit

It reads the cluster as the dashboard does (``observe.Observer``'s snapshot, from the
servers' replies), as a driver client of the scheduler: no HTTP port is needed.
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from paramserver.dashboard.observer import Observer, Snapshot


def _n(x: float) -> str:
    for cut, suffix in ((1e9, "G"), (1e6, "M"), (1e4, "k")):
        if x >= cut:
            return f"{x / cut:.1f}{suffix}"
    return f"{x:,.0f}"


def render(snap: Snapshot) -> Group:
    """One screen: the cluster's line, servers, workers, staleness and the last events."""
    if snap.state != "running":
        return Group(Text(f"paramserver top: the cluster is {snap.state} (no ring yet)"))
    t = snap.totals
    ring = snap.ring
    head = Text(f"ring v{ring.get('version')}  {len(snap.servers)} server(s)  {len(snap.workers)} worker(s)  "
                f"examples {_n(t.get('examples', 0))} ({_n(t.get('examples_per_s', 0))}/s)  push keys "
                f"{_n(t.get('push_keys_per_s', 0))}/s  pull keys {_n(t.get('pull_keys_per_s', 0))}/s"
                + ("  vnodes moving" if ring.get("migrating") else ""), style="bold")
    servers = Table("server", "address", "keys", "memory MB", "keys/s", "vnodes", title="servers", title_justify="left")
    for s in snap.servers:
        servers.add_row(str(s["id"]), s["address"], _n(s["keys"]), f"{s['rss_bytes'] / 2**20:,.0f}",
                        _n(s.get("keys_per_s", 0.0)), str(s["vnodes"]), style="bold red" if s.get("hot") else None)
    workers = Table("worker", "rank", "examples", "examples/s", "shards done", "state", title="workers",
                    title_justify="left")
    for w in snap.workers:
        workers.add_row(str(w["id"]), str(w["rank"]), _n(w["examples"]), _n(w.get("examples_per_s", 0.0)),
                        str(w["shards_done"]),
                        "straggler" if w.get("straggler") else "running" if w["alive"] else "gone",
                        style="bold red" if w.get("straggler") else None)
    stale = Text("staleness (clocks: pulls)  " + "  ".join(f"{b['label']}: {b['count']}" for b in snap.staleness))
    events = [Text(time.strftime("%H:%M:%S ", time.localtime(e["at"])) + e["what"],
                   style="red" if e.get("failure") else "") for e in list(snap.events)[-5:]]
    job = snap.job
    parts: list[Any] = [head, servers, workers, stale]
    if job.get("shards") is not None:
        parts.append(Text(f"job: epoch {job['epoch'] + 1}/{job['epochs']}, shards {job['shards_done']}/{job['shards']}"
                          f" done, {job['running']} running, {job.get('shards_queued', 0)} queued"
                          + (", finished" if job.get("finished") else "")))
    return Group(*parts, *events)


def main(scheduler: str, once: bool = False, interval_s: float = 1.0, secret_file: str = "") -> int:
    observer = Observer(scheduler, port=None, secret_file=secret_file)
    try:
        observer.client()  # a scheduler that cannot be reached is said now, in one line
        if once:
            from rich.console import Console

            observer.snapshot()  # rates need two looks
            time.sleep(min(interval_s, 1.0))
            Console().print(render(observer.snapshot()))
            return 0
        with Live(render(observer.snapshot()), refresh_per_second=4) as live:
            while True:
                time.sleep(interval_s)
                live.update(render(observer.snapshot()))
    except KeyboardInterrupt:
        return 0
    finally:
        observer.close()
