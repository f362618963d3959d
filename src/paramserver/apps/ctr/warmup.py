"""The CTR app's warm-up: what a training worker runs (parsing, deduplication, the models'
steps and predictions, routing), and what one job needs (``warm_job``), handed to the
launcher (``_runtime/warm.py`` says why)."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from paramserver._runtime.intrinsics import frozen
from paramserver._runtime.warm import Warmup, is_inherited, load_numba
from paramserver.apps.ctr.models import Model
from paramserver.client.warmup import warm_client
from paramserver.data.warmup import sample_batches
from paramserver.filters.warmup import warm_filters
from paramserver.observe.progressive import Scores
from paramserver.server.warmup import warm_server
from paramserver.tables.spec import TableSpec


def warm_worker(formats: tuple[str, ...] = ("criteo", "libsvm"), models: tuple[Any, ...] | None = None,
                combine: bool = True, filters: bool = True) -> None:
    """Load (or compile) the training kernels on tiny inputs: parsing ``formats``,
    deduplication, ``models``' steps and predictions (default: lr, fm and deepfm) and their
    progressive scores, routing
    (``combine``: a push whose duplicate keys are merged too) and scattering a pull's reply;
    with ``filters``, the filters' kernels."""
    if is_inherited():
        return
    load_numba()
    if models is None:
        models = (Model("lr"), Model("fm", k=2), Model("deepfm", k=2, hidden=(2,)))
    for batch in sample_batches(formats):
        uniq, inverse = batch.unique()
        for model in models:
            rows = np.zeros((uniq.size, model.dim), np.float32)
            dense = model.dense_initial(0) if model.deep else None
            grads, _, _ = model.step(batch, inverse, rows, dense)
            preds = model.predict(batch, inverse, rows, dense)
            Scores().add(preds, batch.labels, 0.0)  # progressive validation
            if not model.deep:  # a step's answer: the server's probabilities, read-only float32 as frames arrive
                Scores().add(frozen(preds.astype(np.float32)), batch.labels, 0.0)
            warm_client(uniq, grads, combine, filters=False)
    if filters:
        warm_filters()


def warm_all() -> None:
    """Every kernel a worker, a server or the driver's scoring uses."""
    warm_worker()
    warm_server()


def default_warmup() -> Warmup:
    """What a cluster started for CTR training loads: every table layout, every format and model."""
    return Warmup(servers=warm_server, workers=warm_worker)


def warm_job(fmt: str, model: Any, table: TableSpec) -> Warmup:
    """What one training job uses: the server kernels of its ``table``'s layout (hash or
    dense), row storage (a deep model's MLP is float32) and request loops, then parsing
    ``fmt`` and ``model``'s step and prediction; the filters' kernels if the table has
    filters.  The other row formats' kernels are left out."""
    storages = tuple(dict.fromkeys(("float32", table.storage)))
    layout, filters = "dense" if table.key_bits else "hash", bool(table.filters)
    return Warmup(servers=functools.partial(warm_server, (layout,), filters, storages, (table,)),
                  workers=functools.partial(warm_worker, (fmt,), (model,), combine=False, filters=filters))
