"""The scheduled Lasso (issue 15) without a cluster: its solution against scikit-learn's
objective, its duality gap against the textbook formula, workers in lockstep agreeing on
every schedule, and the LIBSVM matrix reader's errors."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import numpy as np
import pytest

from paramserver.apps.rounds.lasso import LassoConfig, LassoProgram
from paramserver.apps.rounds.lasso_math import duality_gap, lambda_max, objective
from paramserver.apps.rounds.matrix import read_libsvm_matrix
from paramserver.data.reader import DataError

sklearn = pytest.importorskip("sklearn.linear_model")


def _problem(tmp_path, n=300, d=120, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)) * (rng.random((n, d)) < 0.2)
    X[:, 5] = X[:, 4] + 0.1 * X[:, 5]  # two strongly correlated columns
    w = np.zeros(d)
    w[:10] = rng.standard_normal(10)
    y = X @ w + 0.1 * rng.standard_normal(n)
    path = tmp_path / "p.svm"
    with open(path, "w") as f:
        for i in range(n):
            nz = np.flatnonzero(X[i])
            f.write(f"{float(y[i])!r} " + " ".join(f"{j + 1}:{float(X[i, j])!r}" for j in nz) + "\n")
    return X, y, str(path)


class _Cluster:
    """The servers' coefficient table (float32 rows hi, lo, as on the servers) and a
    barrier, for workers in threads: each runs the real ``run_rounds``."""

    def __init__(self, d, workers):
        self.w = np.zeros((3 * d, 2), np.float32)  # latest values, and the two rounds' halves
        self.lock = threading.Lock()
        self.gate = threading.Barrier(workers, timeout=60)
        self.workers = workers

    def push(self, table, keys, values, op="update", distinct=False):
        assert op == "assign" and distinct and values.dtype == np.float32 and values.shape[1] == 2
        with self.lock:
            self.w[keys.astype(np.int64)] = values
        f: Future = Future()
        f.set_result(None)
        return f

    def pull(self, table, keys):
        f: Future = Future()
        with self.lock:
            f.set_result(self.w[keys.astype(np.int64)].copy())
        return f

    def barrier(self, timeout_s=None):
        self.gate.wait()
        return list(range(self.workers))


def _solve(m, lam, workers, schedule="priority", tol=1e-6, rounds=5000, program=LassoProgram, **options):
    """``program`` (a ``ScheduledCD``: LassoProgram, L1LRProgram) on ``workers`` threads, to ``tol``."""
    from paramserver.apps.rounds.program import run_rounds

    cluster = _Cluster(m.shape[1], workers)
    cfg = LassoConfig(lam=lam, tol=tol, schedule=schedule, **{"per_round": 16, **options})
    programs = [program(cluster, m, cfg, q, workers) for q in range(workers)]
    plans: list[list] = [[] for _ in range(workers)]
    for q, p in enumerate(programs):  # record every schedule each worker computes
        p.schedule = (lambda f, out: lambda r, w: out.append(f(r, w)) or out[-1])(p.schedule, plans[q])
    stats: list = [None] * workers
    errors: list = []

    def work(q):
        try:
            stats[q] = run_rounds(cluster, programs[q], rank=q, workers=workers, max_rounds=rounds)
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)
            cluster.gate.abort()

    threads = [threading.Thread(target=work, args=(q,)) for q in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert len({s.rounds for s in stats}) == 1  # every worker stopped at the same round
    for q in range(1, workers):  # the schedule is computed alike everywhere, and gives each coordinate once
        assert all(all(np.array_equal(a, b) for a, b in zip(x, y)) for x, y in zip(plans[q], plans[0]))
    for plan in plans[0]:
        every = np.concatenate(plan)
        assert np.unique(every).size == every.size
    assert all(np.array_equal(p.w, programs[0].w) for p in programs)
    assert all([h["objective"] for h in p.history] == [h["objective"] for h in programs[0].history]
               for p in programs)  # every check saw the same point
    return programs[0], stats[0].rounds


@pytest.mark.parametrize("workers,schedule", [(1, "priority"), (2, "priority"), (3, "cyclic"), (2, "random")])
def test_the_scheduled_solution_matches_scikit_learns_objective(tmp_path, workers, schedule):
    X, y, path = _problem(tmp_path)
    m = read_libsvm_matrix(path, X.shape[1])
    lam = lambda_max(m) / 20
    program, rounds = _solve(m, lam, workers, schedule)
    assert program.solved and rounds < 5000
    ref = sklearn.Lasso(alpha=lam, fit_intercept=False, tol=1e-12, max_iter=100_000).fit(X, y).coef_
    best = objective(m, ref, lam)
    assert objective(m, program.w, lam) <= best * (1 + 1e-6)
    assert program.gap <= 1e-6 * program.primal
    np.testing.assert_allclose(program.w, ref, atol=1e-3)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_coordinate_descent_wakes_the_zeros_it_rests_and_reaches_the_optimum(tmp_path, seed):
    """``_cd`` skips a coordinate a sweep left at zero until its next waking sweep: one call of
    many sweeps from zero must still reach the optimality conditions, including for the
    coordinates at zero after its first sweeps that the optimum needs (a version that never
    woke them would leave those at zero)."""
    from paramserver.apps.rounds.lasso_math import _cd, _xtr

    X, y, path = _problem(tmp_path, seed=seed)
    m = read_libsvm_matrix(path, X.shape[1])
    n, lam = m.shape[0], lambda_max(m) / 1000  # many non-zeros, some found late
    col_sq = np.array([float(m.values[a:b] @ m.values[a:b]) for a, b in zip(m.colptr[:-1], m.colptr[1:])])
    coords = np.arange(m.shape[1], dtype=np.int64)

    def run(sweeps):
        w, r = np.zeros(m.shape[1]), m.y.astype(np.float64).copy()
        _cd(m.colptr, m.rows, m.values, coords, w, r, col_sq, n, lam, sweeps)
        return w, r

    ref = sklearn.Lasso(alpha=lam, fit_intercept=False, tol=1e-12, max_iter=100_000).fit(X, y).coef_
    early, _ = run(2)
    late = np.flatnonzero((early == 0) & (np.abs(ref) > 1e-6))
    assert late.size, "the problem has no coordinate that the optimum moves after its first sweeps"
    w, r = run(2000)
    assert np.all(w[late] != 0)
    g = _xtr(m.colptr, m.rows, m.values, r) / n  # the optimality conditions: |x_jᵀr|/n <= λ, = λ where w_j != 0
    assert np.all(np.abs(g[w == 0]) <= lam * (1 + 1e-4))
    np.testing.assert_allclose(g[w != 0], lam * np.sign(w[w != 0]), rtol=1e-4)
    assert objective(m, w, lam) <= objective(m, ref, lam) * (1 + 1e-9)


def test_interfering_workers_are_reined_in_when_the_objective_goes_up(tmp_path, monkeypatch):
    import paramserver.apps.rounds.coordinate as coordinate

    monkeypatch.setattr(coordinate.ScheduledCD, "polish", 0)  # the serial polish at each check would clear it up
    rng = np.random.default_rng(3)
    n, d = 200, 40
    base = rng.standard_normal((n, 4))
    X = np.repeat(base, 10, axis=1) + 0.05 * rng.standard_normal((n, d))  # ten near-copies of each column
    y = base @ rng.standard_normal(4)
    path = tmp_path / "copies.svm"
    path.write_text("".join(f"{float(y[i])!r} " + " ".join(f"{j + 1}:{float(X[i, j])!r}" for j in range(d)) + "\n"
                            for i in range(n)))
    m = read_libsvm_matrix(str(path), d)
    lam = lambda_max(m) / 50
    # no interference check to start with: the workers move copies of one column at once
    program, rounds = _solve(m, lam, 2, "random", tol=1e-5, per_round=20, sweeps=8, rho=1e9)
    assert program.solved and program.rho < 1e9, (rounds, program.stalled, program.gap, program.primal, program.rho)
    ref = sklearn.Lasso(alpha=lam, fit_intercept=False, tol=1e-12, max_iter=100_000).fit(X, y).coef_
    assert objective(m, program.w, lam) <= objective(m, ref, lam) * (1 + 1e-5)


def test_the_duality_gap_is_the_textbook_one_and_lambda_max_gives_zero(tmp_path):
    X, y, path = _problem(tmp_path, seed=1)
    m = read_libsvm_matrix(path, X.shape[1])
    n = X.shape[0]
    lmax = lambda_max(m)
    assert lmax == pytest.approx(np.abs(X.T @ y).max() / n)
    program, _ = _solve(m, lmax * 1.0001, 2)
    assert not program.w.any() and program.primal == pytest.approx(y @ y / (2 * n))
    lam = lmax / 5
    w = np.random.default_rng(2).standard_normal(X.shape[1]) * 0.01
    r = y - X @ w
    g = X.T @ r
    primal, gap = duality_gap(m, w, r, g, lam)
    theta = r / max(n * lam, np.abs(g).max())  # a feasible dual point: ‖Xᵀθ‖∞ <= 1
    dual = (y @ y) / (2 * n) - (n * lam**2 / 2) * np.sum((y / (n * lam) - theta) ** 2)
    assert primal == pytest.approx(r @ r / (2 * n) + lam * np.abs(w).sum())
    assert gap == pytest.approx(primal - dual, rel=1e-9)


@pytest.mark.parametrize("text,what", [
    ("1 1:2\nx 2:1\n", r":2: the target \(first token\) is not a number: 'x 2:1'"),
    ("1 1:2\n1 3\n", ":2: a feature is not index:value"),
    ("1 -1:2\n", ":1: a feature index is not a whole number from 0 to 10\\^18 - 1"),
    ("1 1:2 qid:3\n", ":1: a feature index is not a whole number from 0 to 10\\^18 - 1"),
    ("1 1:2\n2 qid:1 0:1 0:2 # x\n", "data line 2 has feature 0 twice"),
    ("1 1:2 2:zz\n", ":1: a feature value is not a number"),
    ("1 1:2\n\n2 4:1 4:2\n", "data line 2 has feature 4 twice"),
    ("1 1:nan\n", ":1: a feature value is not a number"),
])
def test_a_malformed_line_is_named_with_the_fix(tmp_path, text, what):
    path = tmp_path / "bad.svm"
    path.write_text(text)
    with pytest.raises(DataError, match=what):
        read_libsvm_matrix(str(path))


def test_the_matrix_reader_takes_svmlight_files_as_scikit_learn_reads_them(tmp_path):
    """Comments and ``qid:`` skipped; indices from 0 once an index 0 appears (what
    ``dump_svmlight_file`` writes by default), else from 1: the same matrix as scikit-learn's
    ``load_svmlight_file``."""
    load_svmlight_file = pytest.importorskip("sklearn.datasets").load_svmlight_file
    texts = {"one": "# header\n1.5 qid:2 1:1 3:2 # tail\n\n-2 2:4e-1\n0\n",
             "zero": "# Column indices are zero-based\n1.5 0:1 2:2\n-2 qid:9 1:4e-1#x\n0\n"}
    for name, text in texts.items():
        path = tmp_path / f"{name}.svm"
        path.write_text(text)
        m = read_libsvm_matrix(str(path))
        X, y = load_svmlight_file(str(path), zero_based="auto")
        assert m.base == (1 if name == "one" else 0)
        assert m.shape == X.shape and m.y.tolist() == y.tolist()
        dense = np.zeros(m.shape)
        for j in range(m.shape[1]):
            dense[m.rows[m.colptr[j]:m.colptr[j + 1]], j] = m.values[m.colptr[j]:m.colptr[j + 1]]
        np.testing.assert_array_equal(dense, X.toarray())
        np.testing.assert_array_equal(dense, [[1, 0, 2], [0, 0.4, 0], [0, 0, 0]])


def test_the_matrix_reader_reads_columns_and_checks_the_width(tmp_path):
    path = tmp_path / "ok.svm"
    path.write_text("1.5 3:2 1:1\n\n-2 2:4e-1\n0\n")
    m = read_libsvm_matrix(str(path))
    assert m.shape == (3, 3) and m.y.tolist() == [1.5, -2.0, 0.0]
    dense = np.zeros(m.shape)
    for j in range(m.shape[1]):
        dense[m.rows[m.colptr[j]:m.colptr[j + 1]], j] = m.values[m.colptr[j]:m.colptr[j + 1]]
    np.testing.assert_array_equal(dense, [[1, 0, 2], [0, 0.4, 0], [0, 0, 0]])
    assert read_libsvm_matrix(str(path), 5).shape == (3, 5)
    with pytest.raises(DataError, match="data line 1 has feature index 3, above the 2 features expected"):
        read_libsvm_matrix(str(path), 2)
    (tmp_path / "empty.svm").write_text("\n\n")
    with pytest.raises(DataError, match="no data lines"):
        read_libsvm_matrix(str(tmp_path / "empty.svm"))
    (tmp_path / "targets.svm").write_text("1\n-1\n")  # was a bare "zero-size array" ValueError in lambda_max
    with pytest.raises(DataError, match=r"targets.svm: none of its 2 lines has a feature \(only targets\)"):
        read_libsvm_matrix(str(tmp_path / "targets.svm"))
    (tmp_path / "hashed.svm").write_text("1 2:1\n-1 99999999999:1\n")  # was a MemoryError
    with pytest.raises(DataError, match=r"hashed.svm: data line 2 has feature index 99,999,999,999, and every "
                                        r"feature up to it gets a coefficient: that takes about [\d,.]+ GiB"):
        read_libsvm_matrix(str(tmp_path / "hashed.svm"))


def test_coefficients_travel_as_float64_to_two_to_the_minus_48():
    from paramserver.apps.rounds.lasso import join64, split64

    w = np.random.default_rng(0).standard_normal(10_000) * np.logspace(-8, 3, 10_000)
    rows = split64(w)
    assert rows.dtype == np.float32 and rows.shape == (w.size, 2)
    np.testing.assert_allclose(join64(rows), w, rtol=2.0 ** -46, atol=0)
    assert (np.abs(join64(rows) - w) <= np.abs(w) * 2.0 ** -46).all()
    assert (np.abs(rows[:, 0].astype(np.float64) - w) > np.abs(w) * 2.0 ** -30).any()  # one float32 would not do


def _dealt_by_hand(colptr, rows, values, norm, cand, workers, cap, rho):
    """``_deal``'s rule written out plainly: each candidate to the worker it correlates with
    most, under ``cap``, unless its correlation with the others' passes ``rho`` a coordinate."""
    mine: list[list[int]] = [[] for _ in range(workers)]
    owner = []
    for j in cand:
        if norm[j] == 0:  # an empty column: nothing to deal
            owner.append(-1)
            continue
        col = {int(rows[k]): abs(values[k]) / norm[j] for k in range(colptr[j], colptr[j + 1])}
        c = [sum(v * sum(abs(values[k]) / norm[i] for i in mine[q] for k in range(colptr[i], colptr[i + 1])
                         if rows[k] == r) for r, v in col.items()) for q in range(workers)]
        placed = sum(len(m) for m in mine)
        ok = [q for q in range(workers) if len(mine[q]) < cap
              and sum(c) - c[q] <= rho * max(placed - len(mine[q]), 1) + 1e-12]
        best = max(ok, key=lambda q: (c[q], -len(mine[q]), -q), default=-1)
        owner.append(best)
        if best >= 0:
            mine[best].append(int(j))
    return owner


@pytest.mark.parametrize("workers", [2, 3])
def test_the_dealing_follows_its_rule_and_leaves_its_scratch_clear(workers):
    from paramserver.apps.rounds.lasso_math import _deal

    rng = np.random.default_rng(7)
    X = rng.random((30, 40)) * (rng.random((30, 40)) < 0.15)
    colptr = np.r_[0, np.cumsum((X != 0).sum(axis=0))].astype(np.int64)
    rows = np.concatenate([np.flatnonzero(X[:, j]) for j in range(40)]).astype(np.int64)
    values = np.concatenate([X[X[:, j] != 0, j] for j in range(40)])
    norm = np.sqrt((X ** 2).sum(axis=0))
    cand = rng.permutation(40).astype(np.int64)
    acc = np.zeros((30, workers))
    owner = _deal(colptr, rows, values, norm, cand, workers, 12, 0.05, acc)
    assert owner.tolist() == _dealt_by_hand(colptr, rows, values, norm, cand, workers, 12, 0.05)
    assert (owner >= 0).sum() > workers and not acc.any()  # some dealt, some left; the scratch left as it came
    assert (owner < 0).any()


def test_a_value_whose_square_overflows_is_refused_by_its_line(tmp_path):
    """A target of 1e200 made the objective inf and its gap NaN, after the whole job."""
    for line, what in (("1e200 3:1", r"the target 1e\+200"), ("1 3:-1e151", r"the feature value -1e\+151")):
        path = tmp_path / "big.svm"
        path.write_text(f"1 1:1 2:1\n0.5 2:1\n{line}\n")
        with pytest.raises(DataError, match=f"data line 3 has {what}, above 1e\\+150 in magnitude"):
            read_libsvm_matrix(str(path))
    path.write_text("1e149 1:1\n1 2:1e149\n")
    assert read_libsvm_matrix(str(path)).shape == (2, 2)  # taken


def test_a_job_whose_columns_would_not_fit_is_refused_before_its_cluster(monkeypatch):
    """A sparse index of 10^8 passed the reader's check (one process's columns) and had a
    worker killed by the kernel, the other going on: every worker and the table count."""
    from paramserver.apps.rounds import matrix
    from paramserver.data import whole

    monkeypatch.setattr(whole, "available_memory", lambda: 20 << 30)
    matrix.check_job_fits("a.svm", 10**7, 2, 1 << 30)  # ~4 GB: taken
    with pytest.raises(DataError, match=r"a.svm: the feature index 100,000,000 .* 2 workers .* or run fewer --workers"):
        matrix.check_job_fits("a.svm", 10**8, 2, 8 << 30)


def test_converged_is_what_the_certificate_proves():
    from paramserver.apps.rounds.lasso import proven

    assert proven(1.0, 1e-5, 1e-4) and not proven(1.0, 0.7, 1e-4)
    assert not proven(float("inf"), float("nan"), 1e-4) and not proven(1.0, float("nan"), 1e-4)
