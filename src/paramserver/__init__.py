"""paramserver: a parameter server for large-scale machine learning.

General layout:
    client/      Client (pull, push, clock, barrier) and its I/O thread
    server/      ServerNode, per-vnode hash tables, optimisers
    scheduler/   SchedulerNode: membership, ring, tables, barriers
    routing/     hash64, the Ring, batch partitioning
    wire/        the message format (msgpack header + raw array frames) and sockets
    cluster/     LocalCluster (processes on 127.0.0.1) and the worker runner
    apps/        jobs built on the API (the demo)
"""

import gc as _gc

# The package's import (numpy, numba, every kernel's dispatcher: ~175 000 objects) runs the
# cyclic collector a few dozen times for nothing, 0.03 s of every command's start-up: it is
# paused while the package imports and restored after.
_collecting = _gc.isenabled()
_gc.disable()

from paramserver.apps.ctr.modelfile import load_model
from paramserver.client.client import Client
from paramserver.cluster.local import LocalCluster, run
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

if _collecting:
    _gc.enable()
