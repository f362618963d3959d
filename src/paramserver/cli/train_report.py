"""How ``paramserver train`` shows a job: its live progress line (``progress_line``, on stderr)
and its final report as a table (``report_table``, on stdout), a group of lines for each part
of the report that is there (the model and data, progressive validation, filters, the table's
storage and lifecycle, row caches, streams, checkpoints, failures, consistency).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from paramserver.apps.ctr.stream_files import stream_file_lines

if TYPE_CHECKING:
    from rich.table import Table


def progress_line(status: dict[str, Any], seconds: float) -> str:
    if "epoch" not in status:
        return "starting..."
    live = status.get("live", {})
    examples = int(live.get("examples", 0))
    loss = live.get("loss_sum", 0.0) / examples if examples else float("nan")
    rate = (examples - int(status.get("resumed_examples", 0))) / seconds if seconds > 0 else 0.0  # this run's
    failovers = len(status.get("failovers") or [])
    where = (f"stream shards {status['shards_done']}/{status['shards']}" if "stream" in status else
             f"epoch {status['epoch'] + 1}/{status['epochs']}  shards {status['shards_done']}/{status['shards']}")
    pv = (status.get("progressive") or {}).get("window_seconds") or {}
    scored = f"  progressive AUC {pv['auc']:.4f} (last {pv['size']:g} s)" if pv.get("auc") is not None else ""
    return (f"{where}  examples {examples:,}  {rate:,.0f}/s  train logloss {loss:.4f}{scored}"
            + (f"  servers lost {failovers} (failed over)" if failovers else ""))


def filter_lines(report: dict[str, Any]) -> list[tuple[str, str]]:
    """The report's lines on the filters: per direction, bytes of the requests' keys and
    values before and after the chain (``filter_bytes``), and what sigmod held back."""
    if "filters" not in report:
        return []
    lines = [("filters", report["filters"])]
    for table, by_direction in report.get("filter_bytes", {}).items():
        for direction, by_filter in by_direction.items():
            sizes = [v for v in by_filter.values() if isinstance(v, dict)]
            if direction == "owed":
                if by_filter.get("sigmod_in"):
                    lines.append((f"{table} sigmod", f"{by_filter['sigmod_out']:,} of {by_filter['sigmod_in']:,} "
                                                      "key updates sent at once, the rest later"))
            elif sizes:
                before, after = sizes[0]["bytes_in"], sizes[-1]["bytes_out"]
                lines.append((f"{table} {direction} bytes", f"{before:,} -> {after:,} ({before / max(after, 1):.1f}x)"))
    return lines


def staleness_line(histogram: dict[str, int]) -> str:
    """The clocks pulls' readers were ahead of the slowest worker, in one short line (the
    histogram itself, up to eight "clocks:pulls" pairs, wrapped the report's table)."""
    counts = {int(k): int(v) for k, v in histogram.items()}
    total = sum(counts.values())
    if not total:
        return "-"
    at0 = counts.get(0, 0) / total
    within1 = (counts.get(0, 0) + counts.get(1, 0)) / total
    return f"{at0:.0%} at 0, {within1:.0%} ≤ 1, max {max(counts)} ({total:,} pulls)"


def run_lines(report: dict[str, Any]) -> list[tuple[str, str]]:
    """The report's lines on what ran: the model, its rows' format and hashing, the files, and
    the batches a worker kept in flight (``--pipeline``)."""
    if "model" not in report:
        return []
    bits = report["hash_bits"]
    hashing = "no folding" if bits in (0, 64) else f"{bits} hash bits"
    files = report.get("data", [])
    shown = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
    lines = [("model", f"{report['model']} (a key's row: {report['table_dim']} values), {report['format']} rows, "
                       f"{hashing}"), ("data", shown)]
    if report.get("pipeline_depth"):  # a training job's
        floor = report.get("round_trip_floor_ms")  # --pipeline link's measure, when it took one
        steps = report.get("steps")  # each batch a step: its gradient computed by the server
        lines.append(("batches in flight a worker", f"{report['pipeline_depth']}" + (" as steps" if steps else "") + (
            "" if floor is None else f" (the link's round trip, timed by pings: {floor:.2f} ms)")))
    return lines


def progressive_lines(report: dict[str, Any]) -> list[tuple[str, str]]:
    """The report's lines on progressive validation: each example scored before the model
    trained on it, over the whole run, the last examples, the last seconds and the trend."""
    pv = report.get("progressive")
    if not pv:
        return []

    def pair(w: dict[str, Any]) -> str:
        def num(x: float | None) -> str:
            return "-" if x is None else f"{x:.4f}"

        return f"logloss {num(w['logloss'])}, AUC {num(w['auc'])} ({w['examples']:,} examples)"

    ws, trend = pv["window_seconds"], pv["trend"]
    lines = [("progressive (scored before training)", pair(pv["all"])),
             (f"  last {pv['window_examples']['size']:,} examples", pair(pv["window_examples"]))]
    if ws["examples"]:
        lines.append((f"  last {ws['size']:g} s", pair(ws)))
    if trend["logloss"] is not None and trend["auc"] is not None:
        lines.append(("  trend", f"logloss {trend['logloss']:+.4f}, AUC {trend['auc']:+.4f} against the "
                                 f"{trend['over_seconds']:g} s before"))
    return lines


def lifecycle_lines(report: dict[str, Any]) -> list[tuple[str, str]]:
    """The report's lines on the model table (its rows' storage, keys held and bytes a
    key, always), its lifecycle and publications."""
    lines = []
    if "storage" in report:
        layout = f"{report['table_layout']} table, " if "table_layout" in report else ""
        whole = f": arrays of all 2^{report['hash_bits']} keys" if report.get("table_layout") == "dense" else ""
        narrow = ", 4-byte keys" if report.get("key_bytes") == 4 else ""
        lines += [("table storage", f"{layout}{report['storage']} rows{narrow}"),
                  ("keys held", f"{report['keys']:,} ({report['bytes_per_key']:.1f} bytes a key, all copies{whole})")]
    if "tiers" in report:
        t = report["tiers"]
        lines.append(("memory tiers", f"{t['hot_bytes'] / 2**20:,.1f} MiB in memory (budget "
                                      f"{t['budget_bytes'] / 2**20:,.1f} MiB), {t['cold_keys']:,.0f} keys on disk "
                                      f"({t['cold_bytes'] / 2**20:,.1f} MiB); hit rate {t['hit_rate']:.2%} "
                                      f"({t['promoted']:,.0f} rows read back, {t['demoted']:,.0f} moved out; "
                                      f"{t.get('prefetched', 0):,.0f} named a batch ahead)"))
        if len(report.get("tier_passes", [])) > 1:
            lines.append(("hit rate per pass", ", ".join(f"{p['hit_rate']:.2%}" for p in report["tier_passes"])))
    if "lifecycle" in report:
        lines += [("lifecycle", report["lifecycle"]),
                  ("updates refused (not admitted)", f"{report['updates_refused']:,}"),
                  ("keys evicted", f"{report['keys_evicted']:,}")]
    if "publish" in report:
        p = report["publish"]
        lines.append(("published", f"{p['bases']} base(s), {p['deltas']} delta(s) to {p['url']} (longest export "
                                   f"{p['export_s_max'] * 1000:.0f} ms)"))
    return lines


def cache_lines(report: dict[str, Any]) -> list[tuple[str, str]]:
    """The workers' row caches (``--row-cache``): reads served, how old, sums held."""
    c = report.get("row_cache")
    if not c:
        return []
    trained = "rows trained here, their changes merged" if c.get("apply") == "local" else "gradients summed"
    return [("row cache", f"s={c['s']}, {c['rows']:,} rows a worker ({trained}): {c['hit_rate']:.1%} of "
                          f"{c['hits'] + c['misses']:,} reads from it, {c['lag_p50']} / {c['lag_p99']} versions "
                          f"behind (p50 / p99), {c['stale']:,} found too old and pulled again"),
            ("row cache sums", f"{c['grads_gathered']:,} gradients gathered, {c['sums_pushed']:,} rows pushed "
                               f"({c.get('rows_read_back', 0):,} read back, while other workers wrote), "
                               f"{c['sums_held']:,} held at the end, {c.get('sums_lost', 0):,} lost with workers "
                               "that died")]


def report_table(report: dict[str, Any]) -> Table:
    from rich.table import Table

    table = Table(title="paramserver train", show_header=False)
    rows = [("test logloss", "logloss", "{:.4f}"), ("test AUC", "auc", "{:.4f}"),
            ("test examples", "test_examples", "{:,}"), ("train logloss", "train_logloss", "{:.4f}"),
            ("examples", "examples", "{:,}"), ("examples/s", "examples_per_s", "{:,.0f}"),
            ("training seconds", "seconds", "{:.1f}"), ("start-up to first example (s)", "first_example_s", "{:.2f}"),
            ("bytes sent", "bytes_sent", "{:,}"),
            ("bytes received", "bytes_received", "{:,}"), ("bad lines skipped", "bad_lines", "{:,}"),
            ("server key-operations / example", "key_ops_per_example", "{:.2f}")]
    for label, key, fmt in rows:
        if key in report and not (isinstance(report[key], float) and math.isnan(report[key])):
            table.add_row(label, fmt.format(report[key]))
    if "step_size" in report:  # --optimizer ftrl:alpha=auto, logistic regression's default
        table.add_row("step size (FTRL α, β)", report["step_size"]["said"])
    if "examples_per_s_wall" in report:  # a stream job: it may have waited for rows
        table.add_row("examples/s over wall time",
                      f"{report['examples_per_s_wall']:,.0f} over {report['seconds']:.1f} s, of which "
                      f"{report['idle_seconds']:.1f} s waiting for rows (examples/s above: over the "
                      f"{report['busy_seconds']:.1f} s with rows in hand)")
    for line in progressive_lines(report) + run_lines(report) + filter_lines(report) + lifecycle_lines(report) \
            + cache_lines(report) + stream_file_lines(report):
        table.add_row(*line)
    if "checkpoints" in report:
        table.add_row("checkpoints written", f"{len(report['checkpoints'])} "
                                             f"({report['checkpoints_abandoned']} abandoned)")
        for why in report.get("checkpoint_failures", [])[:3]:
            table.add_row("checkpoint failed", why)
    if "resumed_from" in report:
        table.add_row("resumed from", f"{report['resumed_from']} ({report['resumed_examples']:,} examples)")
    if report.get("failed_workers"):
        table.add_row("workers lost", "; ".join(report["failed_workers"]))
    if report.get("failovers"):
        table.add_row("servers lost", f"{len(report['failovers'])} (failed over; longest stall between two batches "
                                      f"{report.get('stalled_s', 0):.2f} s)")
    for loss in report.get("data_loss") or []:
        table.add_row("DATA LOST", f"server {loss['server']}: {loss['vnodes']} vnode(s) of {', '.join(loss['tables'])} "
                                   "restarted from initial values (--allow-loss)")
    c = report.get("consistency")
    if c:
        table.add_row("staleness seen (clocks)", staleness_line(c["staleness_histogram"]))
        table.add_row("pulls parked", f"{c['parked_pulls']:,} ({c['parked_seconds']:.2f} s)")
    return table
