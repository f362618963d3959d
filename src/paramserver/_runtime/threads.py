"""Two pieces of work at once on the machine's two cores: ``on_two``.

The calling thread runs the first, a thread of its own the second (compiled kernels that let go
of the GIL, or numpy's), and the helper is joined before ``on_two`` returns or raises: no thread
is left running, so a driver that uses it can still fork its nodes (``cluster/process.fork_safe``).
The routing of a big batch (``routing/partition.py``) and the MF driver's reading, numbering and
predicting (``apps/rounds/mf.py``, ``mf_strata.py``, ``ratings_lines.py``) go through it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

A = TypeVar("A")
B = TypeVar("B")


def on_two(first: Callable[[], A], second: Callable[[], B], name: str = "paramserver-two") -> tuple[A, B]:
    """``(first(), second())``, ``second`` on a thread named ``name`` (joined before this returns;
    what either raised is raised here, ``first``'s before ``second``'s)."""
    out: list[Any] = [None]
    failed: list[BaseException] = []

    def run() -> None:
        try:
            out[0] = second()
        except BaseException as exc:  # handed to the caller, below
            failed.append(exc)

    helper = threading.Thread(target=run, name=name)
    helper.start()
    try:
        result = first()
    finally:
        helper.join()
    if failed:
        raise failed[0]
    return result, out[0]
