"""Several steps in one request (``Op.STEP`` with ``steps``: N): a worker's N consecutive
mini-batches to the one server that holds all their keys, applied there one after the
other, each on the rows the one before it left: what N steps sent in turn would do, the
same rows read, the same updates, the same answers, for one request's costs.

A step's fixed costs are a request's: building, encoding and sending it, a turn of the
server's loop to decode, check and answer it, the answer's decoding and its future on the
worker.  The default ``paramserver train`` job takes 2 016 steps for 10^6 rows (the √n ramp
starts at one example a batch): those fixed costs were ~0.7 ms of CPU a step on the two
sides together, a third of the job's CPU (``docs/benchmarks.md``).

On the wire the group is one step's seven arrays, each the N batches' own arrays end to end
(as narrow as the widest batch allows: ``step_arrays``), and an eighth, ``sizes <i8[3N]``:
batch k's distinct keys, vnode segments and examples.  Batch k's ``inverse`` indexes its own
keys and its ``indptr`` starts at 0 (its occurrences are ``indptr[-1]``; sent as the rows'
lengths, the batches' rows end to end, each batch's offsets from 0 again once read); ``vals`` is empty
when every value of every batch is 1.  Batch k is numbered ``seq + k`` (a group takes N
consecutive numbers), so that a batch applied before a failure is skipped when the worker
trains it again the classic way, as a step's is.  The answer: ``preds <f4[n]`` (every
example of every batch, in order) and ``losses`` (each batch's summed log loss).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from paramserver.errors import ProtocolError
from paramserver.wire.step_arrays import sizes_fault, step_arrays

#: the most batches one request carries (a worker groups the steps its depth has room for)
MAX_STEPS = 256


def group_arrays(keys: np.ndarray, vnodes: np.ndarray, counts: np.ndarray, inverse: np.ndarray, indptr: np.ndarray,
                 vals: np.ndarray, labels: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
    """The eight arrays of a step of several batches: each of a step's seven arrays, the
    batches' own end to end (``routing/steps.route_steps`` makes the keys and the places,
    the places as narrow as the widest batch allows), each as narrow as it goes
    (``step_arrays``), and their ``sizes``."""
    return [*step_arrays(keys, vnodes, counts, inverse, indptr, vals, labels, index=inverse.dtype,
                         examples=sizes[2::3]), sizes]


def split_group(arrays: Sequence[np.ndarray], steps: int) -> list[list[np.ndarray]]:
    """Each batch's seven arrays (views) of a step of ``steps`` batches whose arrays
    (``read_step_arrays``'s, ``sizes`` last) are ``arrays``.

    Raises:
        ProtocolError: ``sizes`` does not cut the arrays into ``steps`` batches exactly."""
    keys, vnodes, counts, inverse, indptr, vals, labels, sizes = arrays
    sizes_fault(sizes, steps)
    per = sizes.reshape(steps, 3)
    if (per < 0).any() or per[:, 0].sum() != keys.shape[0] or per[:, 1].sum() != vnodes.shape[0] \
            or per[:, 2].sum() != labels.shape[0] or indptr.shape[0] != labels.shape[0] + steps:
        raise ProtocolError(f"a step of {steps} batches: its sizes ({per[:, 0].sum()} keys, {per[:, 1].sum()} "
                            f"segments, {per[:, 2].sum()} examples) must add up to its arrays' ({keys.shape[0]} "
                            f"keys, {vnodes.shape[0]} segments, {labels.shape[0]} labels, and one offset more a "
                            f"batch: {indptr.shape[0]} offsets)")
    out: list[list[np.ndarray]] = []
    k, s, r, j = 0, 0, 0, 0
    for m, segs, n in per.tolist():
        offsets = indptr[r + len(out):r + len(out) + n + 1]
        nnz = int(offsets[-1])
        if not 0 <= nnz <= inverse.shape[0] - j:
            raise ProtocolError(f"a step of {steps} batches: batch {len(out)}'s offsets end at {nnz}, past the "
                                f"{inverse.shape[0] - j} occurrences left")
        out.append([keys[k:k + m], vnodes[s:s + segs], counts[s:s + segs], inverse[j:j + nnz], offsets,
                    vals[j:j + nnz] if vals.shape[0] else vals, labels[r:r + n]])
        k, s, r, j = k + m, s + segs, r + n, j + nnz
    if j != inverse.shape[0] or vals.shape[0] not in (0, j):
        raise ProtocolError(f"a step of {steps} batches: its batches' offsets cover {j} occurrences, the request "
                            f"has {inverse.shape[0]} (and {vals.shape[0]} values: as many, or none)")
    return out
