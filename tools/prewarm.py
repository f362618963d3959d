"""Compile (into numba's disk cache) the kernels the tests and the nodes load: every
server table layout and row format, the filters, the training workers' parsers, models
and routing.  ``make test`` runs it on the second core while the first lints, so the
tests find the cache warm instead of compiling it on a fresh clone (about a minute and a
half of kernels); ``make demo``'s install runs it with ``--quick-start``: the kernels of
``paramserver demo`` and of the README's first commands (Criteo rows, LR and FM).
Run: ``.venv/bin/python tools/prewarm.py [--quick-start]``."""

from __future__ import annotations

import os
import sys
import tempfile
import time

from paramserver.apps.ctr.models import Model
from paramserver.apps.ctr.synth import write_synth
from paramserver.apps.ctr.warmup import warm_worker
from paramserver.server.warmup import warm_server


def main() -> int:
    t0 = time.perf_counter()
    if "--quick-start" in sys.argv[1:]:
        warm_server(("hash", "dense"))
        warm_worker(("criteo",), (Model("lr"), Model("fm")), combine=False, filters=False)
        with tempfile.TemporaryDirectory() as tmp:  # paramserver demo writes its rows first
            write_synth(os.path.join(tmp, "rows.tsv"), 10, seed=1)
    else:
        warm_server(storages=("float32", "fp16", "bf16"))
        warm_worker()
    print(f"prewarm: numba's cache filled in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
