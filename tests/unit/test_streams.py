"""Streams in process: the scheduler's stream queue, the sources' cutting and positions, a
plug-in's shards read as files are, ``--until``, and progressive validation's windows."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from paramserver import ConfigError
from paramserver.apps.ctr.models import auc as exact_auc
from paramserver.apps.ctr.streaming import parse_until, stream_limits
from paramserver.data import streams
from paramserver.data.batch import DataError, DataFormat, Shard
from paramserver.data.reader import read_batches
from paramserver.data.redis_source import RedisSource
from paramserver.observe.progressive import Scoreboard, Scores, auc_of, bins_of
from paramserver.scheduler.jobs import JobCheckpoints
from paramserver.scheduler.tasks import StreamQueue

# ---- the stream queue ----------------------------------------------------------------


def test_a_stream_queue_hands_shards_out_as_they_are_added_and_ends_once_closed_and_done():
    q = StreamQueue(source="redis://x/s")
    assert q.next_shard(1) is None  # nothing yet: wait
    q.add([["a", 0, -1], ["b", 0, -1]], {"at": 2})
    first, second = q.next_shard(1), q.next_shard(2)
    assert [first["shard"], second["shard"]] == [["a", 0, -1], ["b", 0, -1]]
    q.shard_done(1, first["shard_id"], 0, {"examples": 5})
    q.add([], {"at": 2}, close=True)
    assert not q.finished and q.next_shard(1) is None  # b still runs
    q.shard_done(2, second["shard_id"], 0, {"examples": 7})
    assert q.finished and q.next_shard(1) == {"done": True}
    assert q.status()["examples"] == 12 and q.status()["stream"]["pending"] == []
    with pytest.raises(ConfigError, match="closed"):
        q.add([["c", 0, -1]], None)


def test_a_stream_snapshot_keeps_the_position_and_the_shards_not_done_and_resumes_from_them():
    q = StreamQueue(source="s")
    q.add([["a", 0, -1], ["b", 0, -1], ["c", 0, -1]], {"id": "3-0"})
    a, b = q.next_shard(1), q.next_shard(2)
    q.shard_done(2, b["shard_id"], 0, {"examples": 4, "loss_sum": 1.0})
    assert q.release(1) == [a["shard_id"]]  # a worker died: its shard goes back first
    snap = q.snapshot()
    assert snap["stream"] == {"source": "s", "position": {"id": "3-0"}, "pending": [["a", 0, -1], ["c", 0, -1]]}
    r = StreamQueue.resume("s", snap)
    assert [r.next_shard(9)["shard"], r.next_shard(9)["shard"]] == [["a", 0, -1], ["c", 0, -1]]
    assert r.totals["examples"] == 4 and r.resumed_examples == 4 and r.position == {"id": "3-0"}
    with pytest.raises(ConfigError, match="not 'other'"):
        StreamQueue.resume("other", snap)
    with pytest.raises(ConfigError, match="pending shards"):
        StreamQueue.resume("s", {"totals": {}})


def test_checkpoints_by_time_are_due_once_a_shard_was_done_and_the_seconds_passed():
    ckpt = JobCheckpoints.from_wire({"url": "/tmp/x", "every": None, "seconds": 0.05})
    assert not ckpt.due()  # nothing done yet
    ckpt.since = 1
    assert not ckpt.due()
    ckpt.last_at -= 1.0
    assert ckpt.due()
    with pytest.raises(ConfigError, match="seconds"):
        JobCheckpoints.from_wire({"url": "/tmp/x", "every": 3, "seconds": -1})


# ---- sources --------------------------------------------------------------------------


def test_a_redis_stream_of_csv_rows_is_refused_before_any_connection():
    with pytest.raises(ConfigError, match="no CSV header"):
        RedisSource("redis://127.0.0.1:1/s", 1 << 20, "csv")
    with pytest.raises(ConfigError, match="redis://HOST:PORT/STREAM"):
        RedisSource("redis://127.0.0.1:1", 1 << 20, "criteo")


def test_a_folder_source_takes_each_complete_file_once_in_name_order(tmp_path, monkeypatch):
    monkeypatch.setattr(streams, "SETTLE_S", 0.0)
    (tmp_path / "b.txt").write_text("1 1:1\n")
    (tmp_path / "a.txt").write_text("0 2:1\n")
    (tmp_path / ".c.txt.tmp").write_text("being written\n")
    (tmp_path / "_SUCCESS").write_text("")
    source = streams.open_source(str(tmp_path), 1 << 20, "libsvm")
    source.start(None)
    assert source.poll(None)[0] == []  # first seen: not yet known to be complete
    shards, position, rows, ended = source.poll(None)
    assert [os.path.basename(s.path) for s in shards] == ["a.txt", "b.txt"] and rows is None and not ended
    assert position["taken"] == ["a.txt", "b.txt"] and sorted(position["stamps"]) == ["a.txt", "b.txt"]
    assert [s.stamp.size for s in shards] == [6, 6] and [s.end for s in shards] == [6, 6]  # as taken
    assert source.poll(None)[0] == []  # each once
    (tmp_path / "c.txt").write_text("1 3:1\n")
    again = streams.open_source(str(tmp_path), 1 << 20, "libsvm")
    again.start(position)  # resumed: what the position took is not taken again
    again.poll(None)
    assert [os.path.basename(s.path) for s in again.poll(None)[0]] == ["c.txt"]


def test_sources_are_named_clearly(tmp_path):
    assert isinstance(streams.open_source("-", 1, "criteo"), streams.StdinSource)
    with pytest.raises(ConfigError, match="no such folder"):
        streams.open_source(str(tmp_path / "nope"), 1, "criteo")
    with pytest.raises(ConfigError, match="module .nomodule_here. does not import here"):
        streams.open_source("nomodule_here:Source=x://y", 1, "criteo")
    with pytest.raises(ConfigError, match="cannot be resumed"):
        streams.StdinSource(1).start({"any": 1})


class Lines:
    """A user's source (the protocol in streams.py): its shards name lines of ROWS."""

    ROWS = [b"1 1:1", b"0 2:1 3:0.5", b"1 bad", b"0 4:1"]
    resumable = True

    def __init__(self, url: str, shard_bytes: int) -> None:
        self.url, self.cut = url, 0

    def start(self, position):
        self.cut = position or 0

    def poll(self, max_rows):
        if self.cut >= len(self.ROWS):
            return [], self.cut, 0, True
        shard = Shard(self.url, 0, -1, f"{self.cut} {len(self.ROWS)}", f"{__name__}:Lines")
        n, self.cut = len(self.ROWS) - self.cut, len(self.ROWS)
        return [shard], self.cut, n, False

    def commit(self, position, pending):
        pass

    def close(self):
        pass

    @classmethod
    def open_shard(cls, shard):
        lo, hi = map(int, shard.span.split())
        return streams.ChunkFile(iter([b"\n".join(cls.ROWS[lo:hi]) + b"\n"]))


def test_a_plugins_shards_are_read_as_files_are_and_a_bad_row_names_its_entries():
    source = streams.open_source(f"{__name__}:Lines=mem://rows", 1 << 20, "libsvm")
    assert isinstance(source, streams.StreamSource)
    (shard,), position, rows, ended = source.poll(None)
    assert rows == 4 and position == 4 and not ended
    fmt = DataFormat("libsvm", label_format="01", skip_bad=True)
    stats: dict = {}
    batches = list(read_batches(shard, fmt, 10, stats))
    assert sum(len(b) for b in batches) == 3 and stats["bad_lines"] == 1
    with pytest.raises(DataError, match=r"mem://rows \(entries 0 4\):byte 18"):
        list(read_batches(shard, DataFormat("libsvm", label_format="01"), 10))


def test_chunks_read_as_a_file_whole_lines_and_all():
    f = streams.ChunkFile(iter([b"ab\ncd", b"\nef\n"]))
    assert f.readline() == b"ab\n" and f.readline() == b"cd\n"
    buf = bytearray(10)
    assert f.readinto(memoryview(buf)) == 3 and bytes(buf[:3]) == b"ef\n"
    assert f.readinto(memoryview(buf)) == 0 and f.readline() == b""


def test_until_reads_durations_and_times_and_refuses_the_rest():
    assert parse_until("90s", now=100.0) == 190.0 and parse_until("2h", now=0.0) == 7200.0
    assert parse_until("2026-11-27T06:00") == time.mktime((2026, 11, 27, 6, 0, 0, 0, 0, -1))
    assert parse_until(None) is None
    with pytest.raises(ConfigError, match="duration"):
        parse_until("soon")
    with pytest.raises(ConfigError, match="--max-examples"):
        stream_limits(0, None)


# ---- progressive validation -------------------------------------------------------------


def test_the_histograms_auc_is_the_exact_auc_within_a_thousandth():
    rng = np.random.default_rng(3)
    y = (rng.random(50_000) < 0.25).astype(np.float32)
    p = 1 / (1 + np.exp(-(rng.normal(size=y.size) + 1.2 * y - 1.3)))
    scores = Scores()
    scores.add(p, y, 0.0)
    assert abs(auc_of(scores.pos, scores.neg) - exact_auc(y, p)) < 1e-3
    assert bins_of(np.array([0.0, 1.0, 0.5])).tolist() == [0, 4095, 2048]


def test_the_scoreboard_windows_by_examples_and_seconds_and_the_trend():
    board = Scoreboard(window_examples=150, window_seconds=10.0)

    def report(n, loss, at):
        s = Scores()
        y = np.arange(n) % 2
        s.add(np.where(y > 0, 0.9, 0.2), y, loss)
        board.add(s.take(), now=at)

    report(100, 80.0, at=0.0)  # an early, worse stretch
    report(100, 20.0, at=15.0)
    report(100, 10.0, at=18.0)
    out = board.summary(now=19.0)
    assert out["all"]["examples"] == 300 and out["all"]["logloss"] == pytest.approx(110 / 300)
    assert out["window_examples"]["examples"] == 200  # whole reports: at least 150
    assert out["window_seconds"]["examples"] == 200 and out["window_seconds"]["logloss"] == pytest.approx(0.15)
    assert out["trend"]["logloss"] == pytest.approx(0.15 - 0.8) and out["window_seconds"]["auc"] == 1.0
    assert board.summary(now=100.0)["trend"]["logloss"] is None  # both windows empty: no trend
    with pytest.raises(ValueError):
        board.add({"n": 3, "loss": 1.0, "pos": [[5000], [1]], "neg": [[], []]})
    with pytest.raises(ValueError):
        board.add({"n": 0, "loss": 1.0, "pos": [[], []], "neg": [[], []]})
    assert Scores().take() is None


def test_standard_input_is_spooled_into_whole_line_files_as_it_arrives():
    read, write = os.pipe()
    source = streams.StdinSource(shard_bytes=16, fd=read)
    source.start(None)
    os.write(write, b"1 1:1\n0 2:1\n1 3")  # the last line comes in two parts
    os.write(write, b":1\n0 4:1")  # and the last has no newline
    os.close(write)
    shards, ended = [], False
    deadline = time.monotonic() + 10
    while not ended:
        assert time.monotonic() < deadline
        got, _, _, ended = source.poll(None)
        shards += got
    text = b"".join(open(s.path, "rb").read() for s in shards)
    assert text == b"1 1:1\n0 2:1\n1 3:1\n0 4:1\n" and all(open(s.path, "rb").read().endswith(b"\n") for s in shards)
    source.commit(None, shards[-1:])
    assert [os.path.exists(s.path) for s in shards] == [False] * (len(shards) - 1) + [True]
    source.close()
    os.close(read)
    assert not os.path.exists(source.folder)


def _resp(entries) -> bytes:
    """An XRANGE reply in RESP2: entries of (id, [(field, value), ...])."""
    def bulk(b):
        return b"$%d\r\n%s\r\n" % (len(b), b)
    out = b"*%d\r\n" % len(entries)
    for ident, fields in entries:
        out += b"*2\r\n" + bulk(ident) + b"*%d\r\n" % (2 * len(fields))
        out += b"".join(bulk(k) + bulk(v) for k, v in fields)
    return out


class _Sock:
    """A socket that hands out a reply a few bytes at a time (the worst case of a read)."""

    def __init__(self, data: bytes, step: int) -> None:
        self.data, self.step = data, step

    def recv_into(self, view) -> int:
        n = min(self.step, len(view), len(self.data))
        view[:n] = self.data[:n]
        self.data = self.data[n:]
        return n


@pytest.mark.parametrize("step", [1, 7, 1 << 20])
def test_an_xrange_page_is_read_off_the_socket_whole_in_any_pieces(step):
    from types import SimpleNamespace

    from paramserver.data.resp import _read_page

    entries = [(b"1-0", [(b"line", b"0 1:1")]), (b"1-1", [(b"other", b"x"), (b"line", b"1 2:1 3:1")]),
               (b"2-0", [(b"first", b"0 4:1"), (b"second", b"no")]), (b"3-7", [(b"line", b"")])]
    rows, last, n = _read_page(SimpleNamespace(_sock=_Sock(_resp(entries), step)))
    assert (rows, last, n) == (b"0 1:1\n1 2:1 3:1\n0 4:1\n\n", b"3-7", 4)
    assert _read_page(SimpleNamespace(_sock=_Sock(b"*0\r\n", step))) == (b"", b"", 0)
    with pytest.raises(DataError, match="Redis refused XRANGE: WRONGTYPE"):
        _read_page(SimpleNamespace(_sock=_Sock(b"-WRONGTYPE not a stream\r\n", step)))
