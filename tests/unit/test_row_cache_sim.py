"""The row cache (issue 46) in the chaos campaign: the simulated workers read and push a
table through the client's own ``CachedCalls``, under drops, duplicates, reordering,
crashes, restarts, joins, leaves and a worker's death; no read misses more than ``s`` of
a key's acknowledged pushes, every gradient is applied once, and a cache that reads past
its bound is caught."""

from __future__ import annotations

import logging

import pytest

from paramserver.testing.chaos import Run, run


@pytest.fixture(autouse=True)
def quiet():
    logging.disable(logging.CRITICAL)
    yield
    logging.disable(logging.NOTSET)


def test_the_row_cache_scenario_runs_clean_and_exercises_the_cache():
    hits = stale = reads = died_holding = 0
    for seed in range(6):
        r = Run("row-cache", seed)
        result = r.go()
        assert not result.violations, f"seed {seed}: {[v.line() for v in result.violations]}"
        ledger = r.ledger
        assert ledger is not None and r.plan.row_cache.startswith("s=")
        reads += ledger.reads
        for w in r.cluster.workers:
            stats = w.row_caches["counts"].stats() if "counts" in w.row_caches else {"hits": 0, "stale": 0}
            hits, stale = hits + stats["hits"], stale + stats["stale"]
            handed, sent = ledger.handed.get(w.name), ledger.sent.get(w.name)
            if handed is not None and sent is not None:
                assert (sent <= handed).all()
                died_holding += int((handed - sent).sum())
    assert reads > 100 and hits > 50 and stale > 10, (reads, hits, stale)
    assert died_holding > 0  # seed 3's crashed worker died with sums, allowed and counted


def test_a_cache_that_reads_past_its_bound_is_caught():
    kinds = set()
    for seed in range(12):
        kinds |= {v.kind for v in run("row-cache", seed, "cache-reads-past-bound").violations}
    assert "cache-past-bound" in kinds


def test_sums_a_cache_drops_are_caught(monkeypatch):
    """A cache whose ``take`` (flush, the end) forgets the sums it held: the gradients the
    workers handed were never all sent, and the stored values fall short."""
    from paramserver.client.row_cache import RowCache

    take = RowCache.take

    def forgetful(self):
        take(self)
        return []

    monkeypatch.setattr(RowCache, "take", forgetful)
    kinds = set()
    for seed in range(3):
        kinds |= {v.kind for v in run("row-cache", seed).violations}
    assert "cache-sums" in kinds
