"""A ``train`` job's test set (``--test``): its first rows checked before the job, its rows
read while the job trains where a core is spare for them, else once it is done, and
scored a part at a time.

Read after the job (2 cores, a 1 + 1 job), each file is cut into ``READERS`` byte ranges
whose parts are parsed and deduplicated at once, in threads of their own, and handed over
in the file's order while the part before is pulled and scored, a part's pull in flight
while the one before it is scored: the driver's end of a 10^6-row job went from 0.25 s to
0.13 s for its 10^5 test rows with one such thread, and from ~0.11 s to ~0.09 s with two
(below, ``READERS``).
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from functools import partial
from typing import Any

import numpy as np

from paramserver._runtime.warm import load_numba
from paramserver.apps.ctr.modelfile import metrics, pull_dense
from paramserver.apps.ctr.models import Model
from paramserver.client.client import Client
from paramserver.data.files import is_plain_local
from paramserver.data.prefetch import lower_priority, read_ahead
from paramserver.data.reader import (
    STDIN,
    Batch,
    DataError,
    DataFormat,
    Shard,
    check_inputs,
    cut_file,
    expand,
    read_batches,
    read_parts,
)

#: rows a part of the test set is read and scored in once the job is done: a part's parsing
#: and deduplication (in a thread of their own) overlap the pull and scoring of the one before
PART_ROWS = 1 << 14

#: byte ranges of a test file parsed and deduplicated at once once the job is done (its cores
#: are free then; ``read_ahead``): 10^5 heavy rows alone on 2 cores, 0.057-0.112 s by one
#: thread, 0.032-0.054 s by two, 0.037-0.110 s by three (three runs each, in turn)
READERS = 2

Distinct = tuple[np.ndarray, np.ndarray]  # ``Batch.unique()``: the distinct keys, each occurrence's index


def core_to_spare(servers: int, workers: int) -> bool:
    """Whether this machine has a core for reading the test rows while the job runs, beside
    one for each local node and the driver.  Without one, they are read once the job is
    done: on 2 cores, reading 10^5 test rows alongside a 1 + 1 job cost it 5 % of its
    examples/s and 0.02 s of its first example (6 interleaved runs each), and the whole
    command 0.1 s when read after."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return cores > servers + workers + 1


def check_head(paths: list[str], fmt: DataFormat) -> None:
    """Parse the first rows of every test file (up to 1 MiB of a plain one): a wrong format
    or a malformed first line is said before the job, even when the rest is read after it."""
    load_numba()  # numba's target as the nodes get it (a first kernel call loads it with a 0.15 s BLAS probe)
    for path in expand(paths):
        end = min(os.path.getsize(path), 1 << 20) if is_plain_local(path) else -1
        next(read_batches(Shard(path, 0, end), fmt, 4096), None)  # dropped at once: its file is closed


def _read_niced(paths: list[str], fmt: DataFormat) -> list[Batch]:
    """``read_parts`` at the lowest CPU priority (``Prefetch``'s ``lower_priority``, by as
    much as there is): the test rows read while the job starts and trains give way to the nodes."""
    lower_priority(19)
    return read_parts(paths, fmt)


def _read_parts(paths: list[str], fmt: DataFormat) -> Generator[tuple[Batch, Distinct], None, None]:
    """``iter_parts``' rows in the files' order, each part with its distinct keys, each plain
    local file read as ``READERS`` byte ranges parsed and deduplicated at once (``read_ahead``)."""
    shards = [piece for path in check_inputs(paths) for piece in _ranges(path)]
    found = False
    for part in read_ahead([partial(_deduplicated_range, shard, fmt) for shard in shards], READERS):
        found = True
        yield part
    if not found:
        raise DataError(f"no examples in {', '.join(paths)}")


def _ranges(path: str) -> list[Shard]:
    """A test file as ``READERS`` byte ranges; a compressed or remote one, or standard input, whole."""
    if path == STDIN or not is_plain_local(path):
        return [Shard(path, 0, -1)]
    size = os.path.getsize(path)
    return cut_file(path, size, max(1, -(-size // READERS)))


def _deduplicated_range(shard: Shard, fmt: DataFormat) -> Iterator[tuple[Batch, Distinct]]:
    return _deduplicated(read_batches(shard, fmt, PART_ROWS))


def _deduplicated(parts: Iterable[Batch]) -> Iterator[tuple[Batch, Distinct]]:
    for part in parts:
        yield part, part.unique()


class TestSet:
    """The test rows of one job; a context manager (its threads end with the block).

    Args:
        paths: the ``--test`` files (none: no test set).
        fmt: their format, the training data's.
        while_training: read them while the job trains (``core_to_spare``), else after.
    """

    def __init__(self, paths: list[str], fmt: DataFormat, while_training: bool):
        self.paths, self.fmt = paths, fmt
        self._scope = ExitStack()
        # a thread only now: the nodes were forked
        reader = self._scope.enter_context(ThreadPoolExecutor(1, thread_name_prefix="paramserver-test-reader"))
        self.reading: Future[list[Batch]] | None = \
            reader.submit(_read_niced, paths, fmt) if paths and while_training else None

    def parts(self) -> Iterator[tuple[Batch, Distinct]] | None:
        """The parts and their distinct keys, once the job is done: those read meanwhile, or
        read now, a part at a time, each deduplicated while the one before is scored."""
        if self.reading is not None:
            return _deduplicated(self.reading.result())
        if not self.paths:
            return None
        parts = _read_parts(self.paths, self.fmt)
        self._scope.callback(parts.close)  # its readers stop with the block, even if scoring did not finish
        return parts

    def __enter__(self) -> TestSet:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._scope.close()


def score(client: Client, model: Model, batch: Batch, distinct: Distinct | None = None) -> np.ndarray:
    """The model's scores of ``batch`` (its distinct keys, when found already)."""
    uniq, inverse = distinct if distinct is not None else batch.unique()
    rows = client.pull(model.table, uniq).result(timeout=600)
    return model.predict(batch, inverse, rows, pull_dense(client, model))


def scored(client: Client, model: Model, parts: Iterable[tuple[Batch, Distinct]]) -> dict[str, Any]:
    """The test metrics (``test_examples``, log loss, AUC, ...) of ``parts``, scored a part at
    a time: the driver's peak memory stays small.  A part's rows are pulled while the part
    before it is scored (a pull in flight at a time)."""
    labels, scores = [], []
    dense = pull_dense(client, model)

    def predicted(part: Batch, inverse: np.ndarray, rows: Future[np.ndarray]) -> np.ndarray:
        return model.predict(part, inverse, rows.result(timeout=600), dense)

    pending: tuple[Batch, np.ndarray, Future[np.ndarray]] | None = None
    for part, (uniq, inverse) in parts:
        labels.append(part.labels)
        pulling = (part, inverse, client.pull(model.table, uniq))
        if pending is not None:
            scores.append(predicted(*pending))
        pending = pulling
    if pending is not None:
        scores.append(predicted(*pending))
    report = metrics(np.concatenate(labels), np.concatenate(scores))
    report["test_examples"] = report.pop("examples")
    return report
