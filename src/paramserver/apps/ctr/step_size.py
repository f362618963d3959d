"""FTRL's step size chosen from the data (``--optimizer ftrl:alpha=auto,beta=auto``: the default
of logistic regression, and of the linear weights of FM, DeepFM and Wide & Deep): the job's first rows
are replayed in the driver under each (α, β) of ``ALPHAS`` × ``BETAS``, and the pair whose
progressive log loss is lowest trains the job.

Why: no fixed α holds on every data set.  One pass over 10^6 heavy-tailed Criteo-shape rows
(``synth --shape heavy``) wants α ≈ 0.115-0.14; a second generator of that shape, whose
categories carry small effects, wants α ≤ 0.045, and at the fixed 0.115 its test log loss
was 2e-4 above Vowpal Wabbit's; the Criteo and Avazu samples want 0.045-0.08, mushrooms 0.27;
and β, which damps a key's first steps, wants 0.1 on the small sets' rare keys (Avazu,
mushrooms, w8a), 0.5 on the long files.  Vowpal Wabbit's normalised, importance-aware update
holds on all of them with its one rate; FTRL's α is about the size of the weights it reaches,
which the data sets (docs/benchmarks.md, "FTRL's step size from the data").

How: progressive validation (each example scored before its batch's update, what the job's
report calls its training log loss) estimates a one-pass learner's test loss honestly.  The
replay is the job's learner: FTRL-Proximal on each batch's summed gradient, the batches grown
by the job's ramp (``ramp_size``), every pair side by side in one pass.  Only the second half
of the replayed rows is scored: the first examples reward the biggest steps (a model still far
from its end), the test loss the model at its end.  ``PREFIX_ROWS`` rows: a prefix leans to
smaller steps than the whole file would (see ``ALPHAS``), which the grid's floor bounds.  What
``--optimizer`` gives as a number stays that number; only ``auto`` is chosen.

The rows are read and replayed in a thread of the driver once the nodes are forked
(``Choosing``), while the servers warm up and the driver waits for them: ~30 ms of one core
alone, taken from the nodes' warm-up, which delays the job's first example by 35-50 ms
(docs/benchmarks.md).  Where it cannot run (a stream, standard input: their rows cannot be read
twice) the fixed α and β of before stand in (``FALLBACK``, ``BETA_FALLBACK``), and ``--resume``
goes on with the checkpoint's; the report says which the job took and why (``StepSize``)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numba import njit

from paramserver.data.batch import Batch, DataFormat, concat_batches, slice_batch
from paramserver.data.reader import STDIN, expand, make_shards, read_batches
from paramserver.routing.dedup import unique_inverse
from paramserver.tables.steps import logloss, sigmoid

#: what ``alpha=auto`` tries: a geometric grid from the noisiest data sets' step to the cleanest's.
#: Not below 0.065: a prefix's progressive loss leans to small steps where the file is much longer
#: than it (planted pairs c, 10^5 rows: 0.03 from 16 384 rows, 0.065 from all of them, whose test
#: loss is best at 0.065-0.09), and with 0.03 and 0.045 in the grid that set lost 0.003 of log loss
#: against the fixed default, where 0.065 gains 0.0016 (docs/benchmarks.md, "FTRL's step size")
ALPHAS = (0.065, 0.115, 0.16, 0.27)
#: what ``beta=auto`` tries: β damps a key's first steps (α / (β + |g|)); the small sets' rare
#: keys want them big (Avazu, mushrooms, w8a: 0.1), the long files' keep 0.5
BETAS = (0.1, 0.5)
#: the α and β an ``auto`` that cannot run takes: the fixed defaults of before
FALLBACK, BETA_FALLBACK = 0.115, 0.5
#: the rows replayed at most (~4 MB of Criteo text): the grid's ranking settles there on every set above
#: (16 384 rows and 32 768 pick the same α; the whole file too on the two 10^6-row generators)
PREFIX_ROWS = 1 << 14
#: ... and their features at most (2^19: 13 107 Criteo rows of 40; LIBSVM rows of news20's ~80, ~6 500:
#: 2^20 of those took 0.45 s, a replay's state growing with the distinct features it meets)
PREFIX_OCCURRENCES = 1 << 19
#: the rows a replay needs to be worth trusting; fewer and the fallback holds
MIN_ROWS = 64
AUTO = "auto"


def lanes(optimizer: dict[str, Any]) -> list[tuple[float, float]]:
    """The (α, β) a replay tries: each one ``auto`` over its grid, each one given as given."""
    alphas = ALPHAS if optimizer.get("alpha") == AUTO else (float(optimizer["alpha"]),)
    betas = BETAS if optimizer.get("beta") == AUTO else (float(optimizer["beta"]),)
    return [(a, b) for b in betas for a in alphas]


@dataclass(frozen=True)
class StepSize:
    """The α and β a job trains with and how they were found: ``how`` is ``auto`` (chosen from
    ``losses``, each of ``tried``'s progressive log loss over the scored half of ``rows``
    replayed), ``resumed`` (the checkpoint's), or ``fallback`` (``why``: the data cannot be
    replayed)."""

    alpha: float
    how: str
    rows: int = 0
    losses: tuple[float, ...] = ()
    seconds: float = 0.0
    why: str = ""
    beta: float = BETA_FALLBACK
    tried: tuple[tuple[float, float], ...] = ()

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {"alpha": self.alpha, "beta": self.beta, "how": self.how, "said": self.said()}
        if self.how == "auto":
            out.update(rows=self.rows, seconds=round(self.seconds, 4),
                       progressive={f"alpha={a:g},beta={b:g}": round(x, 6)
                                    for (a, b), x in zip(self.tried, self.losses, strict=True)})
        if self.why:
            out["why"] = self.why
        return out

    def said(self) -> str:
        """One line for the report: ``α 0.065, β 0.5 (auto: ... of 8 on 13,107 rows)``."""
        both = f"α {self.alpha:g}, β {self.beta:g}"
        if self.how == "auto":
            return f"{both} (auto: the lowest progressive log loss of {len(self.tried)} on {self.rows:,} rows)"
        return f"{both} ({self.how}: {self.why})" if self.why else f"{both} ({self.how})"


def stand_in(optimizer: dict[str, Any]) -> dict[str, Any]:
    """``optimizer`` (a wire dict) with each ``auto`` α or β at the fixed default of before: what
    stands where no replay chose them (a spec checked before the job, a stream's job)."""
    fixed = {"alpha": FALLBACK, "beta": BETA_FALLBACK}
    return {**optimizer, **{key: value for key, value in fixed.items() if optimizer.get(key) == AUTO}}


def fallback(optimizer: dict[str, Any], how: str, why: str) -> StepSize:
    """``how`` a job's α and β stand where no replay chose them (``stand_in``; a resume's are
    filled in from its checkpoint)."""
    standing = stand_in(optimizer)
    return StepSize(standing["alpha"], how, why=why, beta=standing["beta"])


def is_auto(optimizer: dict[str, Any] | None) -> bool:
    """Whether ``optimizer`` (a wire dict) asks for its α or β from the data."""
    return isinstance(optimizer, dict) and AUTO in (optimizer.get("alpha"), optimizer.get("beta"))


class Replay:
    """A job's first rows (``rows`` of ``paths``, in its order), read as its workers read them (its
    parser, its bad-line rule, a bad line said as they would say it), to be replayed under each
    (α, β) of ``lanes(optimizer)`` (``run``) with ``optimizer``'s L1 and L2 and the job's batches."""

    def __init__(self, paths: list[str], fmt: DataFormat, optimizer: dict[str, Any], ramp: float, batch_size: int,
                 rows: int = PREFIX_ROWS):
        self._read = (expand(paths), replace(fmt, cache_dir=""), rows)  # read, not kept: --cache holds shards
        self.optimizer, self.ramp, self.batch_size = optimizer, ramp, batch_size
        self.head: Batch | None = None
        self.seconds = 0.0

    def read(self) -> None:
        """The rows read (once)."""
        if self.head is None:
            started = time.perf_counter()
            self.head = _head(*self._read)
            self.seconds = time.perf_counter() - started

    def run(self) -> StepSize:
        """The (α, β) whose replay's progressive log loss is lowest (the fallback where there are too few rows)."""
        self.read()
        head, started = self.head, time.perf_counter()
        if head is None or len(head) < MIN_ROWS:
            n = 0 if head is None else len(head)
            return fallback(self.optimizer, "fallback", f"{n} rows, fewer than the {MIN_ROWS} a choice needs")
        ids, n_ids = _ids(head.keys)
        vals = head.held_vals if head.held_vals is not None and not head.ones else np.zeros(0, np.float32)
        o, tried = self.optimizer, lanes(self.optimizer)
        padded = tried + tried[-1:] * (-len(tried) % 8)  # whole vectors of 8 lanes; the first of equals wins
        losses = progressive(head.labels.astype(np.float64), head.indptr.astype(np.int64), ids,
                             np.ascontiguousarray(vals, np.float64), n_ids, np.array([a for a, _ in padded]),
                             np.array([b for _, b in padded]), float(o["l1"]), float(o["l2"]), self.ramp,
                             self.batch_size, len(head) // 2)[:len(tried)]
        alpha, beta = tried[int(np.argmin(losses))]
        return StepSize(alpha, "auto", len(head), tuple(float(x) for x in losses),
                        self.seconds + time.perf_counter() - started, beta=beta, tried=tuple(tried))


class Choosing:
    """A ``Replay`` run in a thread of its own, started once the job's nodes are forked
    (``start``: a fork while it ran would copy its locks into the children), so that it runs
    while the driver waits for the servers' warm-up rather than on the command's path (the
    whole choice before the fork took 0.10-0.15 s of the default job's 1.7-1.9 s at 32 768
    rows; its rows read there and replayed here, 16 384 of them, the job's first example came
    65 ms later than without it, all in the thread 48-52 ms).  ``result`` starts it if nothing
    did (a cluster that forks nothing) and waits for it."""

    def __init__(self, replay: Replay):
        self._replay = replay
        self._got: StepSize | BaseException | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="paramserver-step-size", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        try:
            self._got = self._replay.run()
        except BaseException as exc:  # noqa: BLE001 - said where the job waits for it (result)
            self._got = exc

    def result(self) -> StepSize:
        """The α and β chosen (what stopped the replay is raised here)."""
        self.start()
        assert self._thread is not None
        self._thread.join()
        if isinstance(self._got, BaseException):
            raise self._got
        assert self._got is not None
        return self._got


class JobStepSize:
    """A training job's α and β where its rule asks for ``auto`` (nothing where it gives numbers):
    ``for_job``'s way, the replay run once the job's nodes are forked (``forked``), and the
    job's config and plan given them as they go to the tables (``settled``) and its report."""

    def __init__(self, cfg: Any, paths: list[str], *, stream: bool, resume: bool):
        wire = cfg.optimizer_wire()
        self.step = for_job(wire, paths, cfg.data, cfg.batch_ramp, cfg.batch_size, stream=stream, resume=resume)
        self._choosing = Choosing(Replay(paths, cfg.data, wire, cfg.batch_ramp, cfg.batch_size)) \
            if self.step is not None and self.step.how == AUTO else None

    def forked(self, then: Callable[[], None]) -> Callable[[], None]:
        """What to call once the nodes are forked: ``then``, and the replay started."""
        def both() -> None:
            if self._choosing is not None:  # first: the table waits for it, not for ``then``
                self._choosing.start()
            then()
        return both

    def settled(self, cfg: Any, plan: Any) -> tuple[Any, Any]:
        """``cfg`` and ``plan`` (its model table's ``spec``) with the job's α and β: those chosen
        (waited for), else those the plan's table has (the checkpoint's, or the fallback)."""
        if self.step is None:
            return cfg, plan
        if self._choosing is not None:
            self.step = self._choosing.result()
        else:
            self.step = replace(self.step, alpha=float(plan.spec.optimizer.alpha), beta=float(plan.spec.optimizer.beta))
        alpha, beta = self.step.alpha, self.step.beta
        spec = replace(plan.spec, optimizer=replace(plan.spec.optimizer, alpha=alpha, beta=beta))
        return cfg.with_step(alpha, beta), replace(plan, spec=spec)

    def report(self) -> dict[str, Any]:
        """The report's ``step_size`` (none where the rule gives its α and β)."""
        return {} if self.step is None else {"step_size": self.step.report()}


def for_job(optimizer: dict[str, Any], paths: list[str], fmt: DataFormat, ramp: float, batch_size: int, *,
            stream: bool, resume: bool) -> StepSize | None:
    """How a job's α and β are found where its rule asks for ``auto`` (None: it gives numbers):
    ``auto``, to be chosen from its files' first rows (``choose``, ``Choosing``; the values here
    only stand in); on ``--resume``, the checkpoint's (filled in by the resume's check,
    ``resume._check_tables``); for a stream or standard input, the fallback."""
    if not is_auto(optimizer):
        return None
    if resume:
        return fallback(optimizer, "resumed", "the checkpoint's")
    if stream or STDIN in paths:
        return fallback(optimizer, "fallback", "a stream's rows cannot be read ahead of the job")
    return fallback(optimizer, "auto", "")


def choose(paths: list[str], fmt: DataFormat, optimizer: dict[str, Any], ramp: float, batch_size: int,
           rows: int = PREFIX_ROWS) -> StepSize:
    """The (α, β) of ``lanes(optimizer)`` whose replay of the first ``rows`` rows of ``paths`` (in
    the job's order) has the lowest progressive log loss, with ``optimizer``'s L1 and L2."""
    return Replay(paths, fmt, optimizer, ramp, batch_size, rows).run()


def warm() -> None:
    """``progressive`` compiled (or loaded from numba's cache) for the types ``choose`` calls it with."""
    progressive(np.zeros(2), np.arange(3, dtype=np.int64), np.zeros(2, np.int64), np.zeros(0), 1, np.full(8, FALLBACK),
                np.full(8, BETA_FALLBACK), 0.0, 0.0, 1.0, 4000, 1)


def _head(paths: list[str], fmt: DataFormat, rows: int) -> Batch | None:
    """The first ``rows`` rows of ``paths`` as one batch (fewer where their features would pass
    ``PREFIX_OCCURRENCES``), read as the job reads them (its parser, its bad-line rule); None
    where there are none."""
    parts: list[Batch] = []
    have, features = 0, 0
    for shard in make_shards(paths, 1 << 62):  # a file a shard, in the job's order
        for batch in read_batches(shard, fmt, rows):
            room = int(np.searchsorted(batch.indptr, PREFIX_OCCURRENCES - features, side="right")) - 1
            parts.append(slice_batch(batch, 0, max(0, min(len(batch), rows - have, room))))
            have, features = have + len(parts[-1]), features + int(parts[-1].indptr[-1])
            if have >= rows or len(parts[-1]) < len(batch):
                return concat_batches(parts)
    return concat_batches(parts) if parts else None


def _ids(keys: np.ndarray) -> tuple[np.ndarray, int]:
    """Each occurrence's key as a dense id and the ids' count: ids in the order the keys first
    come, so that a batch's new keys sit side by side in the replay's state (numbered by their
    sorted order, they were scattered over it: 0.28 s against ... on 65 536 heavy rows)."""
    uniq, inverse = unique_inverse(np.ascontiguousarray(keys, np.uint64))
    return inverse, int(uniq.shape[0])


@njit(nogil=True, cache=True)
def progressive(labels, indptr, ids, vals, n_ids, alphas, betas, l1, l2, ramp, largest, first):  # type: ignore[no-untyped-def]  # noqa: C901
    """Each lane's (α ``alphas[c]``, β ``betas[c]``): the mean log loss of examples ``first`` on,
    each scored before its batch's update, in one pass of FTRL-Proximal (``tables/update_rules.py``'s
    rule) over the examples in batches of ``ramp * sqrt(seen)`` (at most ``largest``, as the job
    cuts them); occurrence j is id ``ids[j]`` with value ``vals[j]`` (``vals`` empty: every value 1).

    Every lane runs in the same pass, side by side in a key's state: its ``z`` and the root of its
    summed squared gradients under each lane (float32, one cache line a key at 8 lanes), its weight
    worked out once a batch, where the batch first reads it.  A replay pays for fresh memory
    on this VM (a page's first touch ~1.4 ms a MB): a key's ``[w, z, n, g]`` in float64 a lane
    took 256 bytes, and 65 536 heavy-tailed rows (196 691 keys) 0.17-0.28 s; now 16 384 rows
    (73 303 keys) take ~16 ms on one core.
    """
    n, K = labels.shape[0], alphas.shape[0]
    state = np.zeros((n_ids, 2, K), np.float32)  # a key's z and root under every lane
    local = np.full(n_ids, -1, np.int32)  # a key's row in the batch's scratch (-1: not in the batch yet)
    touched = np.empty(n_ids, np.int64)
    rows = _widest(indptr, ramp, largest) + 1  # a batch's keys, at most its occurrences
    grads, weights = np.zeros((rows, K)), np.empty((rows, K))  # a batch's keys' gradients and weights
    inv = 1.0 / alphas
    m, e, loss = np.empty(K), np.empty(K), np.zeros(K)
    ones = vals.shape[0] == 0
    seen = 0
    while seen < n:
        b = max(1, min(largest, int(ramp * math.sqrt(seen)))) if ramp > 0 else largest
        hi, nt = min(n, seen + b), 0
        for i in range(seen, hi):
            m[:] = 0.0
            for j in range(indptr[i], indptr[i + 1]):
                k = ids[j]
                r = local[k]
                if r < 0:  # the key's first read in the batch: its weights, once (they hold until its end)
                    r = nt
                    local[k] = r
                    touched[nt] = k
                    nt += 1
                    _weights(state, k, inv, betas, l1, l2, weights, r)
                x = 1.0 if ones else vals[j]
                for c in range(K):
                    m[c] += weights[r, c] * x
            for c in range(K):
                p = sigmoid(m[c])
                if i >= first:
                    loss[c] += logloss(p, labels[i])
                e[c] = p - labels[i]
            for j in range(indptr[i], indptr[i + 1]):
                r = local[ids[j]]
                x = 1.0 if ones else vals[j]
                for c in range(K):
                    grads[r, c] += e[c] * x
        _apply(state, grads, weights, touched, nt, local, inv)
        seen = hi
    return loss / max(1, n - first)


@njit(inline="always", nogil=True, cache=True)
def _apply(state, grads, weights, touched, nt, local, inv):  # type: ignore[no-untyped-def]
    """A batch's FTRL step on each of its ``nt`` keys (``touched``) under every α: the summed
    gradient ``grads[t]`` into the key's ``z`` and root (``weights[t]``: its weights the batch
    read), then its scratch cleared for the next batch."""
    for t in range(nt):
        k = touched[t]
        for c in range(inv.shape[0]):
            grad = grads[t, c]
            old = np.float64(state[k, 1, c])
            root = math.sqrt(old * old + grad * grad)
            state[k, 0, c] += grad - (root - old) * inv[c] * weights[t, c]
            state[k, 1, c] = root
            grads[t, c] = 0.0
        local[k] = -1


@njit(inline="always", nogil=True, cache=True)
def _widest(indptr, ramp, largest):  # type: ignore[no-untyped-def]
    """The most occurrences any batch of ``progressive``'s holds."""
    n, seen, most = indptr.shape[0] - 1, 0, 0
    while seen < n:
        hi = min(n, seen + (max(1, min(largest, int(ramp * math.sqrt(seen)))) if ramp > 0 else largest))
        most = max(most, indptr[hi] - indptr[seen])
        seen = hi
    return most


@njit(inline="always", nogil=True, cache=True)
def _weights(state, k, inv, betas, l1, l2, w, r):  # type: ignore[no-untyped-def]
    """Key ``k``'s FTRL weight under every α into row ``r`` of ``w``, from its state ``[z,
    root]`` (``inv``: 1/α), without a branch (``max(|z| - l1, 0)``): the α run as one vector.
    Indexed, not sliced: a view cost its reference counts."""
    for c in range(inv.shape[0]):
        z = np.float64(state[k, 0, c])
        w[r, c] = -math.copysign(max(abs(z) - l1, 0.0), z) / ((betas[c] + state[k, 1, c]) * inv[c] + l2)
