"""paramserver: a parameter server for large-scale machine learning.

The layout, one folder a layer (top to bottom; a module imports only from the layers
below its own: docs/architecture.md draws them, `make lint` holds them):

    cli/            the ``paramserver`` command: a builder and a handler per command
    torch.py, sklearn.py, ray.py   the public import paths of the integrations (re-exports)
    integrations/   PyTorch (sharded embeddings, the 1F1B pipeline) and scikit-learn
    serving/        ``paramserver serve``: HTTP predictions from a saved or followed model
    apps/           ctr/ (training, models, the model file) and rounds/ (Lasso, MF, LDA)
    testing/        the simulated network and cluster, its workers, the chaos campaign
    dashboard/      the scheduler's HTTP page and ``paramserver top``
    cluster/        launchers: LocalCluster, RayCluster, the worker process
    server/         ServerNode: a loop over its state (tables, dedup, ring) and handlers
    scheduler/      SchedulerNode: registry, catalog, membership, jobs, barriers
    client/         Client and its sans-IO core (routing, push numbers, retries)
    checkpoint/     cold backup files and manifests
    data/           training data: shards, parsers, batches
    observe/        each node's metrics
    store/          the storage engine: vnode tables, their numba loops (loops/), life rows
    tables/         TableSpec, optimisers, update rules, server functions, namespaces
    filters/        what a message's keys and values go through on the wire (plug-ins)
    lifecycle/      what happens to a table's keys over time: admission, eviction (plug-ins)
    config.py       Config and the PARAMSERVER_* settings
    plugins/        plug-ins found by name: the kinds, their built-ins, one grammar, one loader
    routing/        the ring, hashing, batching keys per server
    wire/           the message format, sockets and transports, security
    consistency/    vector clocks, the staleness gate, BSP buffers
    _runtime/       start-up tuning: warm-up, the collector, malloc, intrinsics, logs
    errors.py       the exception tree and the error codes
"""

import gc as _gc
import os as _os
import sys as _sys

# The ``paramserver`` command's processes compute on one thread each, side by side on the
# machine's cores (a node a core): OpenBLAS's helper threads would only spin (0.1 s of a core
# in every process as numpy loads, measured with perf on 2 cores).  One BLAS thread is set
# before numpy loads, for the command alone (its nodes inherit it): a library user's BLAS
# is theirs.  OPENBLAS_NUM_THREADS set already is kept.
_COMMAND = _os.path.basename(_sys.argv[0] if _sys.argv else "") == "paramserver" or \
    list(getattr(_sys, "orig_argv", [])[1:3]) == ["-m", "paramserver"]
if _COMMAND:
    _os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

# The package's import (numpy, numba, every kernel's dispatcher: ~175 000 objects) runs the
# cyclic collector a few dozen times for nothing, 0.03 s of every command's start-up: it is
# paused while the package imports and restored after.
_collecting = _gc.isenabled()
_gc.disable()

from paramserver.apps.ctr.modelfile import load_model
from paramserver.client.client import Client
from paramserver.cluster.local import LocalCluster, run
from paramserver.cluster.process import use_command as _use_command
from paramserver.config import Config
from paramserver.errors import (
    CheckpointError,
    ClosedError,
    ConfigError,
    ConnectError,
    DataLossError,
    NodeLostError,
    ParamServerError,
    ProtocolError,
    QuotaError,
    RemoteError,
    StaleRingError,
    UnknownTableError,
    WorkerError,
)
from paramserver.routing.ring import Ring
from paramserver.tables.functions import server_function
from paramserver.tables.optim import FTRL, SGD, AdaGrad, Adam, FtrlAdagrad, Normal, RMSProp, Uniform, Zeros
from paramserver.tables.rules import Rule, rule
from paramserver.tables.spec import TableSpec

__all__ = [
    "Client", "LocalCluster", "run", "load_model", "Config", "TableSpec", "Ring",
    "SGD", "AdaGrad", "FTRL", "Adam", "FtrlAdagrad", "RMSProp", "Zeros", "Normal", "Uniform", "rule", "Rule",
    "server_function",
    "ParamServerError", "ConfigError", "UnknownTableError", "ClosedError", "ConnectError",
    "NodeLostError", "RemoteError", "ProtocolError", "StaleRingError", "WorkerError", "CheckpointError", "QuotaError",
    "DataLossError",
]
__version__ = "0.1.0"


def _node_command(argv: list[str]) -> int:
    """What a node a ``LocalCluster`` forks runs: the command line, loaded only then (a library
    user's import does not pay for it)."""
    from paramserver.cli.main import main

    return main(argv)


_use_command(_node_command)  # the command line hands the launchers its command: they sit below it

# The command keeps the collector off: its ``main`` turns it back on once start-up's objects are
# frozen out of it (``_runtime/collector.py``); on here, it scanned them all at the next imports
# (2 collections, 18 ms of every command's start).  A library user's is restored at once.
if _collecting and not _COMMAND:
    _gc.enable()
