"""The rows of ``bench/seeds.py``'s table (one system with its settings on one data set, its
runs), the table printed from them, and the issue's goals checked on them.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench_harness.memory import Run


@dataclass
class Row:
    section: str
    dataset: str
    system: str
    settings: str
    runs: list[dict[str, Any]] = field(default_factory=list)

    def add(self, run: Run, result: dict[str, Any]) -> None:
        result = dict(result)
        result.update(wall=run.wall, rss=run.rss, pss=run.pss)
        self.runs.append(result)
        brief = result.get("error") or ", ".join(f"{k} {v:.4f}" for k, v in result.items()
                                                  if k in ("logloss", "auc", "rmse", "perplexity"))
        print(f"  {self.dataset:8} {self.system:34} {run.wall:8.1f} s  {run.rss / 2**30:5.2f} GB  {brief}",
              flush=True)

    def ok(self) -> list[dict[str, Any]]:
        return [r for r in self.runs if "error" not in r]

    def median(self, key: str) -> float:
        vals = [float(r[key]) for r in self.ok() if r.get(key) is not None]
        return float(np.median(vals)) if vals else math.nan

    def worst(self, key: str, higher_is_worse: bool = True) -> float:
        vals = [float(r[key]) for r in self.ok() if r.get(key) is not None]
        if not vals:
            return math.nan
        return max(vals) if higher_is_worse else min(vals)

    def error(self) -> str:
        errs = [r["error"] for r in self.runs if "error" in r]
        if not errs:
            return ""
        for cause in ("java.lang.OutOfMemoryError: Java heap space", "SparkContext was shut down"):
            if cause in errs[0]:
                return cause  # the JVM's own reason, not py4j's wrapping of it
        return str(errs[0])


def chosen(args: argparse.Namespace, row: Row) -> bool:
    return not args.only or any(o.lower() in row.system.lower() for o in args.only)


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def _metric(r: Row) -> str:
    if r.section == "lr":
        return f"log loss {r.worst('logloss'):.4f}, AUC {r.worst('auc', False):.4f}"
    if r.section == "mf":
        missing = r.median("unpredicted")
        return f"RMSE {r.worst('rmse'):.4f}" + (f" ({int(missing)} unpredicted)" if missing else "")
    return f"perplexity {r.worst('perplexity'):.1f}"


def table(rows: list[Row]) -> None:
    head = ("| data | system | settings | metric | command s | train s | examples/s | peak RSS GB | peak PSS GB |\n"
            "|---|---|---|---|---|---|---|---|---|")
    print(head)
    for r in rows:
        if not r.runs:
            continue
        if not r.ok():
            print(f"| {r.dataset} | {r.system} | {r.settings} | failed: {r.error()} | "
                  f"{_fmt(r.runs[0]['wall'] if r.runs else None, '.1f')} | - | - | - | - |")
            continue
        metric = _metric(r)
        train_s = r.median("train_seconds")
        speed = r.median("examples") / train_s if train_s else math.nan
        print(f"| {r.dataset} | {r.system} | {r.settings} | {metric} | {r.median('wall'):.1f} | {_fmt(train_s, '.1f')} "
              f"| {_fmt(speed, ',.0f')} | {r.median('rss') / 2**30:.2f} | {r.median('pss') / 2**30:.2f} |")


def _best(rows: list[Row], prefix: str, key: str, low: bool = True) -> tuple[float, Row | None]:
    found = [(r.worst(key, low) if key != "wall" and key != "rss" else r.median(key), r)
             for r in rows if r.system.startswith(prefix) and r.ok()]
    if not found:
        return math.nan, None
    return (min if low else max)(found, key=lambda x: x[0])


def goals(rows: list[Row]) -> list[tuple[str, str, bool]]:
    """The issue's goals, each (what, measured, met)."""
    out: list[tuple[str, str, bool]] = []
    for ds in dict.fromkeys(r.dataset for r in rows if r.section == "lr"):
        here = [r for r in rows if r.dataset == ds]
        me = next((r for r in here if r.system == "paramserver LR" and r.ok()), None)
        if me is None:
            out.append((f"LR {ds}", "paramserver failed", False))
            continue
        for peer, factor in (("TensorFlow PS", 5), ("Spark", 20)):
            wall, row = _best(here, peer, "wall")
            loss, _ = _best(here, peer, "logloss")
            if row is None:
                continue
            ratio = wall / me.median("wall")
            out.append((f"LR {ds}: ≥ {factor}× faster than {peer} (whole command)",
                        f"{ratio:.1f}× ({me.median('wall'):.1f} s against {wall:.1f} s)", ratio >= factor))
            out.append((f"LR {ds}: log loss ≤ {peer}'s best", f"{me.worst('logloss'):.4f} against {loss:.4f}",
                        me.worst("logloss") <= loss))
        if ds == "heavy":
            for peer in ("Spark", "TensorFlow PS", "Keras", "MXNet"):
                rss, row = _best(here, peer, "rss")
                if row is not None:
                    out.append((f"LR heavy: peak RSS ≤ 0.5× {peer}'s", f"{me.median('rss') / rss:.2f}× "
                                f"({me.median('rss') / 2**30:.2f} GB against {rss / 2**30:.2f} GB)",
                                me.median("rss") <= 0.5 * rss))
    out += _round_goals(rows, "mf", "paramserver mf", "rmse", 1.0, 3)
    out += _round_goals(rows, "lda", "paramserver lda", "perplexity", 1.02, 5)
    return out


def _round_goals(rows: list[Row], section: str, mine: str, key: str, slack: float,
                 factor: int) -> list[tuple[str, str, bool]]:
    """Each of paramserver's rows against Spark's best metric and its fastest run."""
    out = []
    for ds in dict.fromkeys(r.dataset for r in rows if r.section == section):
        here = [r for r in rows if r.dataset == ds]
        best, row = _best(here, "Spark", key)
        wall = _best(here, "Spark", "wall")[0]
        if row is None:
            continue  # no Spark row ran (--only), nothing to compare with
        for me in (r for r in here if r.system == mine):
            what = f"{section} {ds}, {me.settings}"
            if not me.ok():
                out.append((what, "a run failed", False))
                continue
            out.append((f"{what}: {key} ≤ {slack:g}× Spark's best", f"{me.worst(key):.4f} against {best:.4f}",
                        me.worst(key) <= slack * best))
            out.append((f"{what}: ≥ {factor}× faster than Spark's fastest", f"{wall / me.median('wall'):.1f}× "
                        f"({me.median('wall'):.1f} s against {wall:.1f} s)", wall >= factor * me.median("wall")))
    return out
