"""A flood of bad requests logs a few lines, then one line counting the rest."""

import logging

from paramserver._runtime.logutil import Throttled


def test_a_flood_is_logged_in_a_few_lines(caplog, monkeypatch):
    now = [100.0]
    monkeypatch.setattr("paramserver._runtime.logutil.time.monotonic", lambda: now[0])
    log = Throttled(logging.getLogger("flood"), burst=5, window_s=10)
    with caplog.at_level(logging.WARNING, logger="flood"):
        for i in range(100_000):
            log.warning("bad request %d", i)
        assert len(caplog.records) == 5
        now[0] += 11  # the window is over: the next message reports what was held back
        log.warning("bad request again")
    assert len(caplog.records) == 7
    assert caplog.records[5].getMessage() == "99995 more such messages in the last 11 s were not logged"
    assert caplog.records[6].getMessage() == "bad request again"
