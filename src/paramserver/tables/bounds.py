"""The rules a spec's hyper-parameters are declared with, and the error that names one
broken: ``{spec} {field} must be {rule} and finite, got {value}; {fix}``.

An optimiser or initialiser (``tables/optim.py``) declares each field's rule once, in its
``bounds``; the fix is ``try <field>=<its default>`` unless its ``fixes`` says better.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import fields
from typing import Any

from paramserver.errors import ConfigError

#: the rules a hyper-parameter may be declared with
RULES: dict[str, Callable[[float], bool]] = {
    "a number": lambda v: True,
    "> 0": lambda v: v > 0,
    ">= 0": lambda v: v >= 0,
    "in [0, 1)": lambda v: 0 <= v < 1,
    "a whole number >= 0": lambda v: v >= 0 and v % 1 == 0,
}


def check(name: str, value: float, ok: bool, rule: str, fix: str) -> None:
    """Raise ``ConfigError`` unless ``ok`` and ``value`` is finite."""
    if not ok or not math.isfinite(value):
        raise ConfigError(f"{name} must be {rule} and finite, got {value!r}; {fix}")


def check_bounds(spec: Any, bounds: dict[str, str], fixes: dict[str, str]) -> None:
    """Check each field of the dataclass ``spec`` named in ``bounds`` against its rule, in order."""
    defaults = {f.name: f.default for f in fields(spec)}
    for field, rule in bounds.items():
        value = getattr(spec, field)
        fix = fixes.get(field, f"try {field}={defaults[field]!r}")
        check(f"{spec.name} {field}", value, RULES[rule](value), rule, fix)
