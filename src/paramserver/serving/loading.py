"""A model made ready to serve: every kernel a request and a delta call, run once
(``warm``), and a saved model loaded once (``load_once``, ``--model``).

Apart from ``model.py``: warming runs the request path (rows, bodies, the encoder), and
that path imports the model; here both are imported, and neither imports this.
"""

from __future__ import annotations

import os
import time

import numpy as np

from paramserver.serving.body import check_json_shape
from paramserver.serving.encode import floats_json
from paramserver.serving.json_body import json_rows
from paramserver.serving.model import Replica, Snapshot, flattened, score, written_at
from paramserver.serving.rows import text_batch

WARM_ROWS = {"criteo": b"0" + b"\t" * 38 + b"\n", "libsvm": b"1:1\n"}  # a row of each format the kernels can compile on


def warm(replica: Replica) -> None:
    """Run every kernel a request and a delta call, once, before the replica serves: their
    first call loads them from numba's cache (tens of milliseconds, the interpreter held),
    which must not fall on a request or on a delta applied while requests go on."""
    row = WARM_ROWS.get(replica.data.name)
    if row is not None:
        floats_json(score(replica, text_batch(row, replica.data)).probabilities)
    check_json_shape(b'{"rows": ["0"]}', 1)  # a JSON body's kernels: its shape, then where its rows are
    json_rows(bytearray(b'{"rows": ["0"]}'), 1)
    empty = np.zeros(0, np.uint64)
    if replica.table.life is not None:  # a followed model's: deltas remove keys
        replica.table.remove(empty)
    replica.table.load(empty, np.zeros((0, replica.table.dim), np.float32))


def load_once(url: str) -> Snapshot:
    """A saved model, a training checkpoint or a published folder, loaded once (``--model``):
    its version is the last part of the chain or the folder's name, its time the index's or
    the folder's mtime."""
    from paramserver.apps.ctr.modelfile import LocalModel
    from paramserver.checkpoint.publish import read_index

    local = LocalModel(url)
    replica = flattened(Replica(local.model, local.data, local.table, local.dense), *local.table.items())
    warm(replica)
    index = read_index(url) if _is_published(url) else None
    if index is not None and index["parts"]:
        last = index["parts"][-1]
        return Snapshot(replica, str(last["path"]), int(last["seq"]), float(index.get("at", time.time())))
    return Snapshot(replica, os.path.basename(url.rstrip("/")) or url, 0, _mtime(url))


def _is_published(url: str) -> bool:
    from paramserver.checkpoint.publish import INDEX
    from paramserver.data.files import filesystem

    fs, path = filesystem(url, "--model")
    return bool(fs.exists(f"{path.rstrip('/')}/{INDEX}"))


def _mtime(url: str) -> float:
    """When the model at ``url`` was written: its ``model.json``'s time, else the folder's."""
    for p in (f"{url.rstrip('/')}/model.json", url):
        if (at := written_at(p)) is not None:
            return at
    return time.time()
