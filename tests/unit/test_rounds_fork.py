"""The scheduled apps' drivers start their cluster with no second thread alive: a local
cluster forks its nodes only then (``cluster.process.fork_safe``), and spawning four fresh
interpreters instead cost ``paramserver lasso`` ~2 s of a ~10 s run on news20."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from paramserver.apps.rounds import lasso, lda, mf
from paramserver.apps.rounds.settings import LDAConfig, MFConfig


class _Started(Exception):
    """Raised by the fake job once it has seen how many threads were alive."""


def _fake_job(seen: list[int]):
    class FakeJob:
        def __init__(self, **_options):
            pass

        def __enter__(self):
            seen.append(threading.active_count())
            raise _Started

        def __exit__(self, *exc):
            return False

    return FakeJob


@pytest.fixture
def threads_at_start(monkeypatch):
    seen: list[int] = []
    for module in (lasso, lda, mf):
        monkeypatch.setattr(module, "RoundsJob", _fake_job(seen))
    return seen


def test_lasso_reads_its_data_before_the_cluster_starts(tmp_path, threads_at_start):
    rng = np.random.default_rng(0)
    path = tmp_path / "d.svm"
    path.write_text("".join(f"{rng.standard_normal():.4f} 1:{rng.random():.3f} 3:{rng.random():.3f}\n"
                            for _ in range(40)))
    before = threading.active_count()
    with pytest.raises(_Started):
        lasso.run_lasso(str(path), lam=None, lambda_ratio=10.0, tol=1e-4, schedule="priority", workers=2,
                        servers=1, save=None, metrics_out=None)
    assert threads_at_start == [before]


def test_mf_and_lda_start_their_cluster_with_no_thread_of_their_own(tmp_path, threads_at_start):
    ratings = tmp_path / "r.tsv"
    ratings.write_text("".join(f"{u}\t{i}\t{1 + (u * i) % 5}\n" for u in range(20) for i in range(10)))
    docs = tmp_path / "c.ldac"
    docs.write_text("".join(f"3 {d % 7}:2 {(d + 1) % 7}:1 {(d + 3) % 7}:4\n" for d in range(30)))
    before = threading.active_count()
    with pytest.raises(_Started):
        mf.run_mf(str(ratings), test=None, cfg=MFConfig(rank=4, epochs=1), workers=2, servers=1)
    with pytest.raises(_Started):
        lda.run_lda(str(docs), cfg=LDAConfig(topics=3, iterations=1), workers=2, servers=1)
    assert threads_at_start == [before, before]
