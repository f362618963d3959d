"""Nothing compiles in a server's serving loop: after the warm-up, failovers, repairs,
retries, joins, BSP aggregation, checkpoints and restores add no kernel specialisation.

On a fresh install (a cold numba cache) a specialisation the warm-up missed compiles
inside the loop for 10-25 s, long enough to be declared dead mid-repair (issue 28).  The
check runs in a fresh interpreter: this one has run other tests' kernels already."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = r"""
import json, logging, sys
logging.disable(logging.CRITICAL)
from numba.core.registry import CPUDispatcher
from paramserver.apps.ctr import warmup as warm

warm.warm_all()

def overloads():  # by the kernel's own name: one imported into several modules counts once
    return {f"{obj.py_func.__module__}.{obj.py_func.__qualname__}": {str(sig) for sig in obj.overloads}
            for name, mod in list(sys.modules.items()) if name.startswith("paramserver")
            for attr, obj in list(vars(mod).items()) if isinstance(obj, CPUDispatcher)}

before = overloads()
from paramserver.testing.chaos import run
runs = [(s, seed) for s in ("counters-r2", "counters-r1", "repair-pause", "ssp", "job", "restore", "membership",
                             "filters")
        for seed in (0, 1)]
violations = sum(len(run(s, seed).violations) for s, seed in runs)
new = {k: sorted(v - before.get(k, set())) for k, v in overloads().items() if v - before.get(k, set())}
print(json.dumps({"new": new, "violations": violations}))
"""


def test_no_kernel_is_specialised_after_the_warm_up():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["violations"] == 0
    assert result["new"] == {}, f"compiled after the warm-up (in the serving loop): {result['new']}"
