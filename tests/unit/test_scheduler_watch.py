"""A client's view of a silent scheduler (``client/scheduler_watch.py``): lost at the heartbeat
timeout, waited for up to ``last_copy_timeout_s``, dead past it (at once if its process is gone)."""

from __future__ import annotations

from paramserver.client.scheduler_watch import SchedulerWatch
from paramserver.config import load_config


def _watch(**cfg: float) -> tuple[SchedulerWatch, dict[str, float]]:
    t = {"now": 100.0}
    config = load_config(**{"heartbeat_interval_s": 0.5, "heartbeat_timeout_s": 5.0, "last_copy_timeout_s": 30.0,
                            **cfg})
    return SchedulerWatch("tcp://s:1", config, lambda: t["now"]), t


def test_a_silent_scheduler_is_lost_then_waited_for_then_dead_once():
    watch, t = _watch()
    t["now"] += 4.9
    assert not watch.check() and not watch.lost
    t["now"] += 0.2  # past the heartbeat timeout: lost, not dead
    assert not watch.check() and watch.lost and not watch.dead
    t["now"] += 24.0  # 29.1 s: still waited for
    assert not watch.check() and not watch.dead
    t["now"] += 1.0  # past last_copy_timeout_s
    assert watch.check() and watch.dead
    assert not watch.check()  # declared once


def test_a_scheduler_that_answers_again_is_neither_lost_nor_dead():
    watch, t = _watch()
    t["now"] += 40.0
    watch.check()
    assert watch.dead and watch.heard() and not watch.lost
    assert not watch.heard()  # it was not lost this time


def test_a_scheduler_whose_process_is_gone_is_dead_at_the_heartbeat_timeout(monkeypatch):
    import paramserver.client.scheduler_watch as module

    watch, t = _watch()
    watch.process = "linux:this-machine:123:456"
    monkeypatch.setattr(module, "process_alive", lambda token: False if token == watch.process else None)
    assert watch.grace_s == 5.0
    t["now"] += 5.1
    assert watch.check() and watch.dead


def test_a_grace_shorter_than_the_heartbeat_timeout_is_the_timeout():
    watch, _ = _watch(last_copy_timeout_s=1.0)
    assert watch.grace_s == 5.0
