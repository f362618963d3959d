"""``paramserver mf``: biased matrix factorisation, ``r̂ = μ + b_u + b_i + p_u·q_i``,
trained model-parallel by block rotation (DSGD, Gemulla et al. 2011; STRADS' MF).

Users are cut into W groups and items into W blocks, both balanced by their number of
ratings (the largest first, each to the lightest group).  Worker q owns user group q: its rows
``[p_u, b_u]`` stay in its memory and go to the servers' ``mf/users`` table every
``--user-sync`` epochs, at a checkpoint and at the end (``MFProgram.users_due``).
The item rows ``[q_i, b_i]`` live on the servers' ``mf/items`` table.  An epoch is W
rounds; in round s worker q pulls item block ``(q + s) mod W``, runs SGD over the ratings
of (its users × that block), and pushes the block back (``assign``).  No two workers hold
the same block in a round, so the updates never conflict: the result is that of a serial
SGD over the strata in that order, whatever the number of workers.

The driver reads the ratings once, maps ids to dense indices and writes each worker's
strata (its ratings, shuffled, grouped by item block) to a scratch folder; a worker reads
only its own part.  Defaults (rank 64, 40 epochs, learning rate 0.007, L2 0.06 on factors
and 0.01 on biases) were chosen on MovieLens (``docs/model-parallel.md``).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from numba import njit

from paramserver._runtime import intrinsics
from paramserver._runtime.threads import on_two
from paramserver.apps.rounds.job import RoundsJob, Watch, check_outputs, write_metrics
from paramserver.apps.rounds.mf_strata import PREFETCH_RATINGS, Layout, drawn_order, layout, save_strata, strata
from paramserver.apps.rounds.program import (
    NO_CHECKPOINTS,
    CheckpointOptions,
    RoundCheckpoints,
    RoundResume,
    adopt,
    joined_midway,
    run_rounds,
)
from paramserver.apps.rounds.ratings import Ratings, read_ratings
from paramserver.apps.rounds.settings import MFConfig as MFConfig  # its old home
from paramserver.errors import ConfigError, check_flags

USERS, ITEMS = "mf/users", "mf/items"
_prefetch: Any = intrinsics.prefetch_address  # (mypy reads an intrinsic's signature wrongly)


@njit(inline="always", nogil=True, cache=True)
def _fetch_rows(P, Q, a, b):  # type: ignore[no-untyped-def]
    """Fetch every line of user row ``a`` and item row ``b`` into cache (-1: none)."""
    if a >= 0:
        for line in range(0, P.strides[0], 64):
            _prefetch(P.ctypes.data + a * P.strides[0] + line)
    if b >= 0:
        for line in range(0, Q.strides[0], 64):
            _prefetch(Q.ctypes.data + b * Q.strides[0] + line)


@njit(nogil=True, fastmath=True, cache=True)
def _sgd(users, items, ratings, P, Q, mu, lr, reg, reg_bias):  # type: ignore[no-untyped-def]
    """One pass of SGD over the ratings (in order) on factor rows ``P`` (users) and ``Q``
    (items), each ``[factors..., bias]``, float32.  Returns the sum of squared errors
    seen before each update.

    A rating's two rows are random in tables larger than the caches (a worker's users at
    rank 64: 13 MB for 4 M ratings), so every line of the rows ``PREFETCH_RATINGS`` ratings
    on is fetched ahead: without it the loop waited on them, 50-63 ns a rating alone on a
    core against 25-32 with it (the same bits: fetching changes no arithmetic)."""
    k = P.shape[1] - 1
    lr32, reg32, regb32 = np.float32(lr), np.float32(reg), np.float32(reg_bias)
    sse = 0.0
    n = ratings.shape[0]
    for t in range(n):
        if t + PREFETCH_RATINGS < n:
            _fetch_rows(P, Q, users[t + PREFETCH_RATINGS], items[t + PREFETCH_RATINGS])
        a, b = users[t], items[t]
        p, q = P[a], Q[b]
        pred = np.float32(mu) + p[k] + q[k]
        for f in range(k):
            pred += p[f] * q[f]
        e = ratings[t] - pred
        sse += e * e
        p[k] += lr32 * (e - regb32 * p[k])
        q[k] += lr32 * (e - regb32 * q[k])
        for f in range(k):
            pf, qf = p[f], q[f]
            p[f] = pf + lr32 * (e * qf - reg32 * pf)
            q[f] = qf + lr32 * (e * pf - reg32 * qf)
    return sse


@njit(nogil=True, cache=True)
def _predict(users, items, P, Q, mu, lo, hi):  # type: ignore[no-untyped-def]
    """Clipped predictions; a user or item index of -1 (not in the training data)
    contributes nothing.  The rows ``PREFETCH_RATINGS`` on are fetched ahead, as ``_sgd``
    does (0.65 s -> 0.17 s for the train RMSE of 3.6 M ratings at rank 64)."""
    k = P.shape[1] - 1
    n = users.shape[0]
    out = np.empty(n, np.float64)
    for t in range(n):
        if t + PREFETCH_RATINGS < n:
            _fetch_rows(P, Q, users[t + PREFETCH_RATINGS], items[t + PREFETCH_RATINGS])
        a, b = users[t], items[t]
        v = mu
        if a >= 0:
            v += P[a, k]
        if b >= 0:
            v += Q[b, k]
        if a >= 0 and b >= 0:
            for f in range(k):
                v += P[a, f] * Q[b, f]
        out[t] = min(max(v, lo), hi)
    return out


@dataclass
class _Part:
    """One user group: its ratings by item block (``start``) and its user rows."""

    users: np.ndarray
    items: np.ndarray
    ratings: np.ndarray
    start: np.ndarray
    keys: np.ndarray  # uint64: its rows of mf/users
    P: np.ndarray  # float32[users, rank + 1]


class MFProgram:
    """One worker's side of the block rotation (see the module's doc).  Part (user group)
    p is held by worker ``owner[p]`` (p itself until workers die) and takes item block
    ``(p + round) mod W`` in a round: two parts never share a block."""

    def __init__(self, client: Any, paths: list[str], cfg: MFConfig, mu: float, user_start: np.ndarray,
                 item_start: np.ndarray, rank: int, checkpoint_every: int = 0):
        self.client, self.cfg, self.mu, self.rank = client, cfg, mu, rank
        self.checkpoint_every = checkpoint_every  # rounds (0: none)
        self.paths, self.W = paths, len(paths)
        self.user_start, self.item_start = user_start, item_start
        self.live, self.owner = list(range(self.W)), list(range(self.W))
        self.rounds = cfg.epochs * self.W
        self.held = {rank: self._load(rank, None)}
        self.sse, self.seen, self.train_rmse = 0.0, 0, math.nan

    def _load(self, part: int, P: np.ndarray | None) -> _Part:
        with np.load(self.paths[part]) as z:
            users, items, ratings, start = z["users"], z["items"], z["ratings"], z["start"]
        lo, hi = int(self.user_start[part]), int(self.user_start[part + 1])
        if P is None or not P.any():  # never trained (or never pushed): the part's own initial draw
            P = np.zeros((hi - lo, self.cfg.rank + 1), np.float32)
            P[:, :self.cfg.rank] = np.random.default_rng([self.cfg.seed, part]).normal(
                0.0, self.cfg.init_std, (hi - lo, self.cfg.rank))
        return _Part(users, items, ratings, start, np.arange(lo, hi, dtype=np.uint64), P)

    def _parts_of(self, rank: int) -> list[int]:
        return [p for p in range(self.W) if self.owner[p] == rank]

    def converged(self, round_: int) -> bool:
        return round_ >= self.rounds

    def schedule(self, round_: int, workers: int) -> list[np.ndarray]:
        return [np.array([(p + round_) % self.W for p in self._parts_of(r)], np.int64) for r in self.live]

    def update(self, round_: int, mine: np.ndarray) -> list[tuple[str, np.ndarray, np.ndarray, str]]:
        parts = self._parts_of(self.rank)
        keys = [np.arange(self.item_start[b], self.item_start[b + 1], dtype=np.uint64) for b in mine.tolist()]
        pulls = [self.client.pull(ITEMS, k) for k in keys]
        pushes = []
        for p, b, k, future in zip(parts, mine.tolist(), keys, pulls):
            part, Q = self.held[p], future.result(timeout=600)
            lo, hi = part.start[b], part.start[b + 1]
            self.sse += _sgd(part.users[lo:hi], part.items[lo:hi], part.ratings[lo:hi], part.P, Q, self.mu,
                             self.cfg.lr, self.cfg.reg, self.cfg.reg_bias)
            self.seen += int(hi - lo)
            pushes.append((ITEMS, k, Q, "assign"))
            if self.users_due(round_):
                pushes.append((USERS, part.keys, part.P, "assign"))
        return pushes

    def users_due(self, round_: int) -> bool:
        """Whether round ``round_`` ends an epoch whose user rows go to the servers too:
        every ``user_sync`` epochs, where a checkpoint is taken, and at the end.  They
        train nothing there (a worker keeps its own): a dead worker's part is taken over
        from them (``regroup``), a resumed job starts from them, and the driver reads the
        model from them.  Each push is every user row (1 GB over 40 epochs of 4 M ratings
        at rank 64), so they are not pushed every epoch."""
        done = round_ + 1
        if done % self.W:
            return False
        return ((done // self.W) % self.cfg.user_sync == 0 or done >= self.rounds
                or bool(self.checkpoint_every and done % self.checkpoint_every == 0))

    def observe(self, round_: int, assignment: Sequence[np.ndarray]) -> None:
        if (round_ + 1) % self.W == 0:
            self.train_rmse = math.sqrt(self.sse / max(self.seen, 1))
            self.sse, self.seen = 0.0, 0

    def regroup(self, round_: int, live: list[int]) -> None:
        """Workers died: take over their user groups, with the user rows they last pushed
        (``users_due``: up to ``user_sync`` epochs old; their own initial draw if none yet).  The item rows on the
        servers are whatever the dead pushed last: SGD carries on from there."""
        self.live, self.owner = live, adopt(self.owner, live)
        for p in self._parts_of(self.rank):
            if p not in self.held:
                self.held[p] = self._load(p, self._pushed_rows(p))
        self.observe(round_, [])

    def resume(self, round_: int, step: str) -> None:
        """Go on from a checkpoint (taken at an epoch's end, the tables restored): the
        user rows are those pushed then, so the rounds go on exactly as if never stopped."""
        self.held = {p: self._load(p, self._pushed_rows(p)) for p in self._parts_of(self.rank)}

    def _pushed_rows(self, part: int) -> np.ndarray:
        lo, hi = int(self.user_start[part]), int(self.user_start[part + 1])
        return np.asarray(self.client.pull(USERS, np.arange(lo, hi, dtype=np.uint64)).result(timeout=600))

    @property
    def ratings_held(self) -> int:
        return sum(int(p.ratings.size) for p in self.held.values())


def mf_worker(client: Any, paths: list[str], cfg: MFConfig, mu: float, user_start: np.ndarray,
              item_start: np.ndarray, checkpoints: RoundCheckpoints | None = None,
              resume: RoundResume | None = None) -> dict[str, Any]:
    if joined_midway(client):
        return {"rank": client.rank, "joined_midway": True}
    program = MFProgram(client, paths, cfg, mu, user_start, item_start, client.rank,
                        checkpoints.every if checkpoints is not None else 0)
    stats = run_rounds(client, program, rank=client.rank, workers=len(paths), max_rounds=program.rounds,
                       checkpoints=checkpoints, resume=resume)
    return {"rank": client.rank, "rounds": stats.rounds, "regroups": stats.regroups,
            "checkpoints": stats.checkpoints,
            "ratings": program.ratings_held, "train_rmse": program.train_rmse,
            "phase_seconds": {k: round(v, 3) for k, v in stats.seconds.items()}}


def _dense(ids: np.ndarray, known: np.ndarray) -> np.ndarray:
    """The dense index of each id in ``known`` (sorted, distinct), -1 if absent: by a table as
    long as the largest where the ids are small whole numbers, as ``distinct_ids`` numbers them
    (0.001 s for 0.4 M test ratings' users against 0.035 s by ``searchsorted``), else searched."""
    if known.size and known[0] >= 0 and known[-1] < max(4 * known.size, 1 << 20):
        return _looked_up(ids, known)  # type: ignore[no-any-return]
    pos = np.searchsorted(known, ids)
    pos = np.minimum(pos, max(known.size - 1, 0))
    return np.where(known[pos] == ids, pos, -1) if known.size else np.full(ids.size, -1)


@njit(nogil=True, cache=True)
def _looked_up(ids, known):  # type: ignore[no-untyped-def]
    """``_dense`` by a table of ``known[-1] + 1`` entries (``known`` sorted, from 0 up)."""
    hi = known[-1]
    index = np.full(hi + 1, -1, np.int64)
    for k in range(known.shape[0]):
        index[known[k]] = k
    out = np.empty(ids.shape[0], np.int64)
    for j in range(ids.shape[0]):
        x = ids[j]
        out[j] = index[x] if 0 <= x <= hi else -1
    return out


def check_config(cfg: MFConfig, workers: int, servers: int) -> None:
    check_flags([
        ("--rank", cfg.rank, cfg.rank >= 1 and cfg.rank <= 4096, "a whole number in [1, 4096]"),
        ("--epochs", cfg.epochs, cfg.epochs >= 1, "a whole number >= 1"),
        ("--user-sync", cfg.user_sync, cfg.user_sync >= 1, "a whole number of epochs >= 1"),
        ("--lr", cfg.lr, math.isfinite(cfg.lr) and 0 < cfg.lr < 1, "in (0, 1)"),
        ("--reg", cfg.reg, math.isfinite(cfg.reg) and cfg.reg >= 0, "a number >= 0"),
        ("--seed", cfg.seed, isinstance(cfg.seed, int) and 0 <= cfg.seed < 1 << 63, "a whole number in [0, 2^63)"),
        ("--workers", workers, workers >= 1, "a whole number >= 1"),
        ("--servers", servers, servers >= 1, "a whole number >= 1"),
    ])


def run_mf(data: str, *, test: str | None, cfg: MFConfig, workers: int, servers: int,
           predictions_out: str | None = None, save: str | None = None, metrics_out: str | None = None,
           checkpoints: CheckpointOptions = NO_CHECKPOINTS,
           cluster_options: dict[str, Any] | None = None, replicas: int = 1,
           allow_loss: bool = False, filters: Any = None, watch: Watch | None = None) -> dict[str, Any]:
    """``paramserver mf``: train, then predict ``test`` and write what was asked; the report.
    ``checkpoints.every`` counts epochs.  ``replicas``: copies of every vnode; a server's death
    that loses data fails the run (``DataLossError``) unless ``allow_loss``."""
    check_config(cfg, workers, servers)
    check_outputs(save, metrics_out, (predictions_out, "--predictions-out"))
    if predictions_out and not test:
        raise ConfigError("--predictions-out needs --test (the ratings to predict, one prediction a line)")
    checkpoints.check()
    t0 = time.perf_counter()
    got = _prepared(data, test, workers, cfg.seed)
    train, lay, (user_ids, u), (item_ids, i) = got.train, got.lay, got.users, got.items
    r = train.ratings
    mu = float(r.astype(np.float64).mean())
    # what the layout and the tables depend on; --epochs, --lr and --reg may change on a resume
    meta = {"app": "mf", "workers": workers, "rank": cfg.rank, "seed": cfg.seed, "ratings": int(r.size),
            "users": int(user_ids.size), "items": int(item_ids.size)}
    cps, resume = checkpoints.plan(meta, rounds_a_unit=workers)
    # before the nodes are forked, as the rows' gather below comes after they exited: while
    # they run, this VM makes the driver's fresh pages far dearer to fault in (26 MB of new
    # rows: 100-140 ms, ~0.2 ms a fault, against ~1 ms before or after); here 0.37 -> 0.20 s
    shuffled = strata(u, i, r, lay, workers, cfg.seed, got.drawn)
    with RoundsJob(servers=servers, workers=workers, cluster_options=cluster_options, allow_loss=allow_loss,
                   replicas=replicas, filters=filters, watch=watch,
                   scratch_prefix="paramserver-mf-") as job:
        paths = save_strata(job.scratch, shuffled)
        job.tables(resume, lambda client: _create_tables(client, cfg, user_ids.size, item_ids.size,
                                                         job.table_options))
        ran = job.run(mf_worker, paths, cfg, mu, lay.user_start, lay.item_start, cps, resume)
        users, items = job.client.export_table(USERS), job.client.export_table(ITEMS)
    # gathered once the nodes are gone (above): 0.30-0.47 s -> 0.012 s for 100 000 users
    P, Q = _rows(users, lay.user_key), _rows(items, lay.item_key)
    lo, hi = float(r.min()), float(r.max())
    train_rmse, tested = _fitted(got, P, Q, mu, (lo, hi), predictions_out)
    report: dict[str, Any] = {"train_ratings": int(r.size), "users": int(user_ids.size), "items": int(item_ids.size),
                              "global_mean": mu, "train_rmse": train_rmse}
    report.update(job.losses.report())
    report.update(job.wire(ran))
    report.update(tested)
    if save:
        _save(save, _named(user_ids, train.user_names), _named(item_ids, train.item_names), P, Q, mu, (lo, hi))
    seconds = time.perf_counter() - t0
    updates = int(r.size) * max(cfg.epochs - (resume.round // workers if resume else 0), 0)
    report.update({"seconds": seconds, "train_seconds": ran.seconds, "rating_updates": updates,
                   "rating_updates_per_s": updates / max(ran.seconds, 1e-9), "workers": workers, "servers": servers,
                   "workers_lost": ran.lost, "workers_joined_midway": ran.joined,
                   "resumed_at_epoch": resume.round // workers if resume else None,
                   "checkpoints": ran.per_worker[0]["checkpoints"],
                   **asdict(cfg), "phase_seconds": ran.per_worker[0]["phase_seconds"]})
    write_metrics(metrics_out, report)
    return report


@dataclass(frozen=True)
class _Prepared:
    """The driver's part before the nodes start: the ratings read (and the test file's), each
    column's distinct ids and every rating's index among them, the layout, and the order the
    strata draw the ratings in."""

    train: Ratings
    held: Ratings | None
    users: tuple[np.ndarray, np.ndarray]
    items: tuple[np.ndarray, np.ndarray]
    lay: Layout
    drawn: np.ndarray


def _prepared(data: str, test: str | None, workers: int, seed: int) -> _Prepared:
    """``_Prepared``, the draw's permutation (0.1 s for 3.6 M ratings, numpy's, without the GIL)
    on a thread of its own while the test file is read and the ids numbered: joined here, as no
    thread may be left when the nodes are forked."""
    train = read_ratings(data)

    def numbered() -> tuple[Ratings | None, tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray], Layout]:
        held = read_ratings(test, train.named) if test else None
        (user_ids, u), (item_ids, i) = train.distinct(0), train.distinct(1)
        return held, (user_ids, u), (item_ids, i), _layout(data, u, i, user_ids.size, item_ids.size, workers)

    (held, users, items, lay), drawn = on_two(numbered, lambda: drawn_order(train.ratings.size, seed),
                                              "paramserver-mf-draw")
    return _Prepared(train, held, users, items, lay, drawn)


def _fitted(got: _Prepared, P: np.ndarray, Q: np.ndarray, mu: float, bounds: tuple[float, float],
            predictions_out: str | None) -> tuple[float, dict[str, Any]]:
    """The training ratings' RMSE, and the test file's report (``_test``; none without one):
    the 3.6 M training predictions (compiled, without the GIL) on a thread of their own while
    the test's are made and written, most of that Python's formatting of each."""
    (user_ids, u), (item_ids, i), (lo, hi), held = got.users, got.items, bounds, got.held
    tested, fitted = on_two(
        lambda: {} if held is None else _test(held, user_ids, item_ids, P, Q, mu, lo, hi, predictions_out),
        lambda: _predict(u, i, P, Q, mu, lo, hi), "paramserver-mf-fit")
    return float(np.sqrt(np.mean((fitted - got.train.ratings) ** 2))), tested


def _layout(data: str, u: np.ndarray, i: np.ndarray, n_users: int, n_items: int, workers: int) -> Layout:
    """``layout`` of the ratings' users and items over ``workers``, each a part of the users
    and, in turn, a block of the items: refused where there are fewer of either than workers."""
    if workers > min(n_users, n_items):
        raise ConfigError(f"--workers {workers}: {data} has {n_users:,} users and {n_items:,} items, and each worker "
                          f"holds a part of the users and, in turn, a block of the items; give at most "
                          f"{min(n_users, n_items):,}")
    return layout(np.bincount(u, minlength=n_users), np.bincount(i, minlength=n_items), workers)


def _named(ids: np.ndarray, names: np.ndarray | None) -> np.ndarray:
    """What ``--save`` writes for ``ids`` (``distinct_ids``' sorted hashes): their names, if they are."""
    return ids if names is None else names


def _save(folder: str, user_ids: np.ndarray, item_ids: np.ndarray, P: np.ndarray, Q: np.ndarray, mu: float,
          rating_range: tuple[float, float]) -> None:
    """``--save``: FOLDER/mf.npz, the ids, factors and biases, the global mean and the ratings' range."""
    k = P.shape[1] - 1
    os.makedirs(folder, exist_ok=True)
    np.savez(os.path.join(folder, "mf.npz"), user_ids=user_ids, item_ids=item_ids, user_factors=P[:, :k],
             item_factors=Q[:, :k], user_bias=P[:, k], item_bias=Q[:, k], global_mean=mu,
             rating_range=np.array(rating_range))


def _create_tables(client: Any, cfg: MFConfig, users: int, items: int, options: dict[str, Any]) -> None:
    """A fresh job's tables: user rows (pushed by their workers, ``users_due``) and item
    rows, the factors drawn from the seed and the biases zero."""
    k = cfg.rank
    for table, n in ((USERS, users), (ITEMS, items)):
        client.create_table(table, dim=k + 1, optimizer="sgd", key_bits=max(int(n - 1).bit_length(), 1),
                            **options)
    init = np.zeros((items, k + 1), np.float32)
    init[:, :k] = np.random.default_rng([cfg.seed, 1 << 20]).normal(0.0, cfg.init_std, (items, k))
    client.push(ITEMS, np.arange(items, dtype=np.uint64), init, op="assign", distinct=True).result(timeout=600)


def _test(held: Ratings, user_ids: np.ndarray, item_ids: np.ndarray, P: np.ndarray, Q: np.ndarray, mu: float,
          lo: float, hi: float, predictions_out: str | None) -> dict[str, Any]:
    """The held-out ratings predicted (users and items never trained on get the global
    mean and their known bias): their RMSE, and each prediction to ``predictions_out``."""
    from paramserver.data.files import write_text

    u, i = _dense(held.users, user_ids), _dense(held.items, item_ids)
    pred = _predict(u, i, P, Q, mu, lo, hi)
    if predictions_out:
        write_text(predictions_out, "".join(f"{p:.6g}\n" for p in pred.tolist()))
    # near 1: not this training file's test file (names against numbers, another release)
    return {"test_ratings": int(len(held)), "test_rmse": float(np.sqrt(np.mean((pred - held.ratings) ** 2))),
            "test_unseen_share": float(np.mean((u < 0) | (i < 0))) if len(held) else 0.0}


def _rows(exported: tuple[np.ndarray, np.ndarray], key_of: np.ndarray) -> np.ndarray:
    """The exported rows by dense index (``key_of``: each index's key); a key never
    stored reads as zeros.  Where every key is stored (an export holds each key once),
    one gather straight into the result."""
    keys, values = exported
    n = key_of.size
    inside = keys < n
    if keys.size == n and inside.all():
        where = np.empty(n, np.int64)
        where[keys.astype(np.int64)] = np.arange(n)
        rows: np.ndarray = values[where[key_of]]
        return rows
    out = np.zeros((n, values.shape[1]), np.float32)
    out[keys[inside].astype(np.int64)] = values[inside]
    rows = out[key_of]
    return rows
