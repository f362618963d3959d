"""A headline row: a ratio of paramserver to its peer, judged against its goal (``bench/headline.py``
and the sections it imports), and the small helpers every section shares."""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class Goal:
    """A ratio's goal: ``op`` is ">=" or "<=", and ``why`` says where the bound comes from."""

    op: str
    bound: float
    why: str

    def met(self, value: float) -> bool:
        return value >= self.bound if self.op == ">=" else value <= self.bound

    def __str__(self) -> str:
        bound = f"{self.bound:.0e}" if self.bound < 0.01 else f"{self.bound:g}"
        return f"{'≥' if self.op == '>=' else '≤'} {bound}"


@dataclass(frozen=True, slots=True)
class Row:
    """One line of the table: a ratio, its goal, the figures it is made of, and the verdict."""

    section: str
    ratio: str
    goal: str
    value: float | None
    ours: str
    peer: str
    result: str  # PASS, FAIL, not run, not measured, error


def judged(section: str, ratio: str, goal: Goal, value: float, ours: str, peer: str) -> Row:
    return Row(section, ratio, str(goal), value, ours, peer, "PASS" if goal.met(value) else "FAIL")


def not_run(section: str, why: str, result: str = "not run") -> Row:
    return Row(section, "-", "-", None, "-", "-", f"{result}: {why}")


#: run untimed once before a section's timed runs: a fresh checkout's first command compiles
#: the kernels numba then caches (train's section warms every learner up)
WARM = ("paramserver",)


Section = Callable[[argparse.Namespace, str], tuple[list[Row], dict[str, Any]]]


def fresh(tmp: str) -> str:
    """A new folder in ``tmp``: each run writes its model and predictions apart from the last one's."""
    return tempfile.mkdtemp(dir=tmp)


def median(runs: list[dict], key: str) -> float:
    return float(np.median([r[key] for r in runs]))


def worst(runs: list[dict], key: str) -> float:
    return float(max(r[key] for r in runs))
