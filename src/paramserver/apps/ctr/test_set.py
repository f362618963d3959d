"""A ``train`` job's test set (``--test``): its first rows checked before the job, its rows
read while the job trains, on the cores the job leaves idle (``reads_alongside``), else once
it is done, and scored a part at a time.

Read after the job, each file is cut into ``READERS`` byte ranges whose parts are parsed
and deduplicated at once, in threads of their own, and handed over in the file's order
while the part before is pulled and scored, a part's pull in flight while the one before it
is scored: the driver's end of a 10^6-row job went from 0.25 s to 0.13 s for its 10^5 test
rows with one such thread, and from ~0.11 s to ~0.09 s with two (below, ``READERS``).  Read
while the job trains, at the idle scheduling class (Linux ``SCHED_IDLE``: a core nothing
else wants), the rows are parsed and deduplicated by the end, and the driver's end is their
pulls and scores alone.
"""

from __future__ import annotations

import os
import sys
import threading
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


def reads_alongside(servers: int, workers: int) -> bool:
    """Whether the test rows are read while the job trains: where this machine has a core to
    spare for them (``core_to_spare``), or where a thread can take the idle scheduling class
    (Linux's ``SCHED_IDLE``), which runs it only on a core the nodes leave idle.  At nice 19
    instead, reading 10^5 rows alongside a 1 + 1 job on 2 cores cost it ~5 % of its
    examples/s; read after it, the rows cost the command's end ~0.1 s."""
    return core_to_spare(servers, workers) or (sys.platform.startswith("linux") and hasattr(os, "SCHED_IDLE"))


def _idle_priority() -> None:
    """This thread at the idle scheduling class (Linux ``SCHED_IDLE``), where it can be; else
    as nice as it can be (``lower_priority``)."""
    try:
        os.sched_setscheduler(threading.get_native_id(), os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):  # not Linux, or not allowed here
        lower_priority(19)


def check_head(paths: list[str], fmt: DataFormat) -> None:
    """Parse the first rows of every test file (up to 1 MiB of a plain one): a wrong format
    or a malformed first line is said before the job, even when the rest is read after it."""
    load_numba()  # numba's target as the nodes get it (a first kernel call loads it with a 0.15 s BLAS probe)
    for path in expand(paths):
        end = min(os.path.getsize(path), 1 << 20) if is_plain_local(path) else -1
        next(read_batches(Shard(path, 0, end), fmt, 4096), None)  # dropped at once: its file is closed


def _read_idle(paths: list[str], fmt: DataFormat) -> list[tuple[Batch, Distinct]]:
    """``read_parts``, each part with its distinct keys, at the lowest CPU priority there is
    (``_idle_priority``): the test rows read while the job starts and trains give way to the nodes."""
    _idle_priority()
    return list(_deduplicated(read_parts(paths, fmt, PART_ROWS)))


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
        while_training: read them while the job trains (``reads_alongside``), else after.
    """

    def __init__(self, paths: list[str], fmt: DataFormat, while_training: bool):
        self.paths, self.fmt, self.while_training = paths, fmt, while_training
        self._scope = ExitStack()
        self.reading: Future[list[tuple[Batch, Distinct]]] | None = None

    def start(self) -> None:
        """Start reading the rows while the job trains (where ``while_training``): called once
        the job has started, not before.  A thread that runs only on an idle core still holds
        the GIL now and then, and preempted then, it kept the driver's own start of the job
        waiting (the first example 0.05-0.3 s late in some runs)."""
        if self.paths and self.while_training and self.reading is None:
            # a thread only now: the nodes were forked
            reader = self._scope.enter_context(ThreadPoolExecutor(1, thread_name_prefix="paramserver-test-reader"))
            self.reading = reader.submit(_read_idle, self.paths, self.fmt)

    def parts(self) -> Iterator[tuple[Batch, Distinct]] | None:
        """The parts and their distinct keys, once the job is done: those read meanwhile, or
        read now, a part at a time, each deduplicated while the one before is scored."""
        if self.reading is not None:
            return iter(self.reading.result())
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
