"""What a Redis shard's entries are (``Span``), what a row of an entry is, and what the log
says while Redis is unreachable (a fake clock: nothing sleeps)."""

from __future__ import annotations

import logging

import pytest

from paramserver.data import redis_outage
from paramserver.data.batch import DataError
from paramserver.data.redis_rows import Span, before, rows_of


def test_a_span_says_its_entries_and_the_rows_cut_inside_and_reads_back():
    for span in (Span((5, 0), (9, 3)), Span((5, 2), (9, 3), skip=4), Span((5, 0), (9, 3), take=2),
                 Span((7, 1), (7, 1), skip=1, take=3)):
        assert Span.parse(span.text()) == span
        assert span.text().count("(") == 0  # named in errors as "URL (entries SPAN)": balanced
    assert Span.parse("after 5-0 to 9-3:2").take == 2
    assert Span.parse("(5-0 9-3") == Span((5, 0), (9, 3))  # a checkpoint's shard of the first format
    with pytest.raises(ValueError, match="not a Redis shard"):
        Span.parse("5-0 9-3")


def test_a_row_is_a_line_but_a_blank_one_and_before_is_the_id_just_before():
    assert rows_of(b"a\n\nb\r\n\r\nc\n") == [b"a", b"b\r", b"c"]
    assert before((7, 3)) == (7, 2) and before((7, 0)) == (6, (1 << 64) - 1)


class _Down:
    """A Redis call failing ``times`` times, on a clock that moves ``step_s`` a try."""

    def __init__(self, times: int, step_s: float) -> None:
        self.times, self.step_s, self.now = times, step_s, 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += self.step_s

    def call(self) -> str:
        import redis

        if self.times:
            self.times -= 1
            raise redis.ConnectionError("Connection refused")
        return "ok"


def test_an_outage_is_said_once_reminded_every_30_s_and_its_end_said_with_its_length(caplog):
    pytest.importorskip("redis")
    down = _Down(times=100, step_s=0.5)  # 50 s down, 100 tries
    with caplog.at_level(logging.INFO, logger=redis_outage.__name__):
        got = redis_outage.retrying("redis://h:1/s", "XRANGE", down.call, clock=down.clock, sleep=down.sleep)
    assert got == "ok"
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in lines] == ["WARNING", "WARNING", "INFO"], lines
    assert "keeps trying for 60 s, then stops" in lines[0][1] and "--resume" in lines[0][1]
    assert "still unreachable after 30 s" in lines[1][1] and "30 s left" in lines[1][1]
    assert "is back, after 50.0 s unreachable" in lines[2][1]


def test_an_outage_longer_than_the_retries_fails_the_job_saying_so(caplog):
    pytest.importorskip("redis")
    down = _Down(times=10_000, step_s=0.5)
    with caplog.at_level(logging.INFO, logger=redis_outage.__name__), pytest.raises(DataError, match="60 s"):
        redis_outage.retrying("redis://h:2/s", "XRANGE", down.call, clock=down.clock, sleep=down.sleep)
    assert len(caplog.records) == 2  # the first line and one reminder, not one a try


def test_feed_cuts_a_chunk_into_entries_of_n_rows_as_train_counts_them():
    from paramserver.data.redis_feed import chunks, entries_of

    chunk = b"a\n\nb\r\n\r\nc\nd\ne\n"  # blank lines (empty, or only \r) are no rows
    values, counts = entries_of(chunk, 2)
    assert values == [b"a\n\nb\r", b"c\nd", b"e"] and counts == [2, 2, 1]
    assert [len(rows_of(v)) for v in values] == counts  # as the driver's script counts them
    assert entries_of(b"\n\n", 3) == ([], []) and entries_of(b"", 3) == ([], [])
    import io

    assert list(chunks(io.BytesIO(b"x\ny"))) == [b"x\n", b"y\n"]  # the last line given its newline
