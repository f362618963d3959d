"""The peers' side of a comparison: a peer's runner (``seeds_spark.py``, ``seeds_tf.py``,
``seeds_mxnet.py``) prints ``RESULT {json}`` as its last such line, its figures or its error;
``peer_result`` reads it from a measured run (``bench_harness.memory.measure``).
"""

from __future__ import annotations

import json
from typing import Any

from bench_harness.memory import Run


def peer_result(run: Run) -> dict[str, Any]:
    """A peer runner's last ``RESULT {...}`` line; its error, or the timeout, otherwise."""
    for line in reversed(run.out.splitlines()):
        if line.startswith("RESULT "):
            return dict(json.loads(line[7:]))
    if run.timed_out:
        return {"error": f"did not finish in {run.wall:.0f} s (--timeout)"}
    tail = [x for x in run.err.strip().splitlines() if x.strip()][-1:] or [f"exit code {run.code}"]
    return {"error": tail[0][:200]}
