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


WORKER_SCRIPT = r"""
import json
import numpy as np
from paramserver.apps.ctr.models import Model
from paramserver.apps.ctr.warmup import warm_job
from paramserver.client.step_calls import _stepped_group
from paramserver.observe.progressive import Scores, _count_bins
from paramserver.tables.optim import FTRL
from paramserver.tables.spec import TableSpec
from paramserver.wire.message import Op, decode, encode

warm_job("criteo", Model("lr"), TableSpec("t", 1, optimizer=FTRL())).workers()
before = {str(sig) for sig in _count_bins.overloads}
# a step of two batches answered as a server answers it: the probabilities in one frame
frames = encode({"op": Op.OK.value, "losses": [0.5, 0.25]}, [np.array([0.1, 0.9, 0.4], np.float32)])
preds, _ = _stepped_group(decode([bytes(f) for f in frames]), [2, 1])
scores = Scores()
for p, labels in zip(preds, [np.array([0, 1], np.float32), np.array([1], np.float32)]):
    scores.add(p, labels, 0.0)
# a step refused (the ring moved, a server without steps) is taken here: a CTR batch's values as
# ``Batch.values`` hands them (none: all 1), with the same kernel the warm-up compiled
from paramserver.tables import steps
kernels = (steps.logistic_step, steps.fm_step)
had = [{str(sig) for sig in k.overloads} for k in kernels]
from paramserver.data.batch import Batch
ones = Batch(np.ones(2, np.float32), np.array([0, 2, 3], np.int64), np.arange(3, dtype=np.uint64),
             np.ones(3, np.float32), ones=True)
steps.step("lr", ones.indptr, ones.values(), ones.labels, np.array([0, 1, 2]), np.zeros((3, 1), np.float32), 0.0)
classic = sorted(str(sig) for k, seen in zip(kernels, had) for sig in k.overloads if str(sig) not in seen)
print(json.dumps({"new": sorted({str(sig) for sig in _count_bins.overloads} - before) + classic, "n": scores.n}))
"""


def test_a_steps_answer_is_scored_with_a_kernel_the_worker_warmed():
    """A training worker scores each step's answer (progressive validation) as it arrives:
    its probabilities are a read-only float32 frame, another argument type than the
    worker's own float64 predictions.  Left out of the warm-up, that specialisation loaded
    from the disk cache in the worker's main thread at the job's first answer (~10 ms while
    the pipeline stood empty), or compiled there on a fresh install.  A step refused and
    taken here instead (the classic way) runs the step kernels on a CTR batch's values as
    ``Batch.values`` hands them: the warm-up's specialisation too."""
    out = subprocess.run([sys.executable, "-c", WORKER_SCRIPT], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["n"] == 3
    assert result["new"] == [], f"specialised after the warm-up (in the worker's main thread): {result['new']}"


CSV_SCRIPT = r"""
import json, os, sys, tempfile
from numba.core.registry import CPUDispatcher
from paramserver.apps.ctr.models import Model
from paramserver.apps.ctr.warmup import warm_job
from paramserver.data.reader import DataFormat, read_all
from paramserver.tables.spec import TableSpec

def overloads():
    return {f"{obj.py_func.__module__}.{obj.py_func.__qualname__}": {str(sig) for sig in obj.overloads}
            for name, mod in list(sys.modules.items()) if name.startswith("paramserver.data")
            for attr, obj in list(vars(mod).items()) if isinstance(obj, CPUDispatcher)}

for fmt in ("avazu", "csv"):
    warm_job(fmt, Model("lr"), TableSpec("t", 1)).workers()
before = overloads()
with tempfile.TemporaryDirectory() as tmp:
    avazu, csv = os.path.join(tmp, "a.csv"), os.path.join(tmp, "c.csv")
    with open(avazu, "w") as f:
        f.write("id,click,hour,C1,banner_pos,site_id,device_type,C14\n")
        f.writelines(f"{i},{i % 2},1410210{i % 10},100{i % 3},0,{i * 7919:08x},,{i * 3}\n" for i in range(500))
    with open(csv, "w") as f:
        f.write("label,n,city\n")
        f.writelines(f"{i % 2},{i},c{i % 17}\n" for i in range(500))
    batches = [read_all([avazu], DataFormat("avazu")), read_all([csv], DataFormat("csv", label_column="label"))]
    for batch in batches:
        batch.unique()
    rows = sum(len(batch.labels) for batch in batches)
new = {k: sorted(v - before.get(k, set())) for k, v in overloads().items() if v - before.get(k, set())}
print(json.dumps({"new": new, "rows": rows}))
"""


def test_a_csv_jobs_worker_warms_the_kernels_its_rows_are_parsed_with():
    """An Avazu or CSV job's workers parse a sample of their format before they register
    (``data/warmup.py``), as Criteo and LIBSVM ones do: left to the first batch, a fresh
    install's first Avazu job compiled its parser while its cluster waited (2 s)."""
    out = subprocess.run([sys.executable, "-c", CSV_SCRIPT], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["rows"] == 1000
    assert result["new"] == {}, f"compiled at the first batch, not in the warm-up: {result['new']}"
