"""A ``train`` job's test set (``--test``): its first rows checked before the job, its rows
read while the job trains where a core is spare for them, else while the cluster starts and
once the job is done, and scored a part at a time.

Where no core is spare, the driver reads the first parts (``EARLY_ROWS`` at most) in a
thread at the lowest priority from the moment its nodes are forked until the job starts
(``begin``, ``hold``): it only waits on them then, the servers loading their kernels on the
other core.  A 10^6-row job's 10^5 test rows, 5 of 8 parts read so (2 cores, a 1 + 1 job):
the driver's end 0.12-0.17 s -> 0.08-0.11 s, the start no later.

Read after the job (2 cores, a 1 + 1 job), each file is cut into ``READERS`` byte ranges
whose parts are parsed and deduplicated at once, in threads of their own, and handed over
in the file's order while the part before is pulled and scored, a part's pull in flight
while the one before it is scored: the driver's end of a 10^6-row job went from 0.25 s to
0.13 s for its 10^5 test rows with one such thread, and from ~0.11 s to ~0.09 s with two
(below, ``READERS``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
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

#: test rows read at most before the job starts (``TestSet.begin``), the rest after it: what the
#: driver holds while the job trains stays bounded whatever the cluster's start takes (a restore
#: of big tables: seconds) at ~90 MB for Criteo rows (~690 bytes a row: its keys, the distinct ones, their index)
EARLY_ROWS = 1 << 17

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
        if path == STDIN:  # a head read from a pipe is gone: its rows are checked as they are read
            continue
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
    return _in_order([partial(_deduplicated_range, shard, fmt) for shard in shards], paths)


def _in_order(ranges: Sequence[Callable[[], Iterator[tuple[Batch, Distinct]]]], paths: list[str]
              ) -> Generator[tuple[Batch, Distinct], None, None]:
    """The parts of ``ranges`` in their order, ``READERS`` ranges read at once; none: an error."""
    found = False
    for part in read_ahead(ranges, READERS):
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


def _deduplicated_range(shard: Shard, fmt: DataFormat) -> Generator[tuple[Batch, Distinct], None, None]:
    return _deduplicated(read_batches(shard, fmt, PART_ROWS))


def _deduplicated(parts: Iterable[Batch]) -> Generator[tuple[Batch, Distinct], None, None]:
    for part in parts:
        yield part, part.unique()


class TestSet:
    """The test rows of one job; a context manager (its threads end with the block).

    Args:
        paths: the ``--test`` files (none: no test set).
        fmt: their format, the training data's.
        while_training: read them while the job trains (``core_to_spare``), else before it
            starts and after it ends (``begin``, ``hold``).
    """

    def __init__(self, paths: list[str], fmt: DataFormat, while_training: bool):
        self.paths, self.fmt, self._while_training = paths, fmt, while_training
        self._scope = ExitStack()
        self.reading: Future[list[Batch]] | None = None
        self._early: EarlyParts | None = None

    def begin(self) -> None:
        """Start reading, in a thread (so only once the nodes are forked): the whole set at the
        lowest priority where a core is spare for it, else its first parts while the cluster
        starts (the driver waits on the servers' warm-up then, a core idle) until ``hold``."""
        if not self.paths or self.reading is not None or self._early is not None:
            return
        if self._while_training:
            reader = self._scope.enter_context(ThreadPoolExecutor(1, thread_name_prefix="paramserver-test-reader"))
            self.reading = reader.submit(_read_niced, self.paths, self.fmt)
        else:
            self._early = self._scope.enter_context(EarlyParts(self.paths, self.fmt))

    def hold(self) -> None:
        """The job starts: reading before it stops after the part at hand (the rest is read after the job)."""
        if self._early is not None:
            self._early.stop()

    def parts(self) -> Iterator[tuple[Batch, Distinct]] | None:
        """The parts and their distinct keys, once the job is done: those read meanwhile, or
        read now, a part at a time, each deduplicated while the one before is scored."""
        if self.reading is not None:
            return _deduplicated(self.reading.result())
        if not self.paths:
            return None
        parts = self._early.rest() if self._early is not None else _read_parts(self.paths, self.fmt)
        self._scope.callback(parts.close)  # its readers stop with the block, even if scoring did not finish
        return parts

    def __enter__(self) -> TestSet:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._scope.close()


class EarlyParts:
    """A test set's parts read in a thread before the job (``EARLY_ROWS`` at most, in the files'
    order, until ``stop``), and the rest after it as ``_read_parts`` reads them: the same parts
    in the same order, ``READERS`` ranges at once."""

    def __init__(self, paths: list[str], fmt: DataFormat):
        self.paths, self.fmt = paths, fmt
        self._sources: list[Generator[tuple[Batch, Distinct], None, None]] = []
        self._read: list[list[tuple[Batch, Distinct]]] = []
        self._ended: list[bool] = []
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="paramserver-test-early", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        lower_priority(19)  # the cluster's start (the nodes' warm-up, registration) goes first
        try:
            shards = [piece for path in check_inputs(self.paths) for piece in _ranges(path)]
            self._sources = [_deduplicated_range(shard, self.fmt) for shard in shards]
            self._read, self._ended = [[] for _ in shards], [False] * len(shards)
            rows = 0
            for i, parts in enumerate(self._sources):
                while not self._stop.is_set() and rows < EARLY_ROWS:
                    part = next(parts, None)
                    if part is None:
                        self._ended[i] = True
                        break
                    self._read[i].append(part)
                    rows += len(part[0])
        except BaseException as exc:  # said when the parts are asked for, after the job, as if read then
            self._error = exc

    def stop(self) -> None:
        self._stop.set()

    def rest(self) -> Generator[tuple[Batch, Distinct], None, None]:
        """Every part: those read before the job, then the rest."""
        self._stop.set()
        self._thread.join()
        if self._error is not None:
            raise self._error
        ranges = [partial(_then, read, () if ended else parts)
                  for read, ended, parts in zip(self._read, self._ended, self._sources, strict=True)]
        self._read = []  # handed over: scored parts are let go
        yield from _in_order(ranges, self.paths)

    def __enter__(self) -> EarlyParts:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(5)  # after the part at hand
        for parts in self._sources:
            try:
                parts.close()  # its file
            except ValueError:  # still read by a thread of ``rest`` that did not stop in time: it closes it
                pass


def _then(first: list[tuple[Batch, Distinct]], rest: Iterable[tuple[Batch, Distinct]]
          ) -> Iterator[tuple[Batch, Distinct]]:
    yield from first
    first.clear()
    yield from rest


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
