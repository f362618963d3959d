"""``--max-examples N`` is N rows, exactly, from a folder and from standard input too (issue
43, item 15): rows counted as files are taken, the file that reaches N cut after its N-th
row, the rest of it taken by a job resumed with a larger limit; blank lines and a CSV
header are not rows; a compressed file cannot be cut and is taken whole."""

from __future__ import annotations

import gzip
import os

import pytest

import paramserver.data.row_count as row_count
from paramserver.data import streams
from paramserver.data.batch import DataFormat, Shard
from paramserver.data.reader import read_batches
from paramserver.data.row_count import count_lines, rows_until

FMT = DataFormat("libsvm", 64, "01")


@pytest.fixture(autouse=True)
def _settled(monkeypatch):
    monkeypatch.setattr(streams, "SETTLE_S", 0.0)


def _rows(path, count, first=0, blank_every=0):
    with open(path, "w") as f:
        for i in range(first, first + count):
            f.write(f"0 {i + 1}:1\n")
            if blank_every and i % blank_every == 0:
                f.write("\n\r\n")


def _trained(shards, fmt=FMT):
    """The keys of the shards' rows, in order (one a row)."""
    out = []
    for shard in shards:
        for batch in read_batches(shard, fmt, 1000, {}):
            out += [int(k) for k in batch.keys]
    return out


def _ids(tmp_path, ids):
    """The keys of rows ``0 i:1`` for ``ids``, as ``_trained`` gives them."""
    path = tmp_path / "expected.txt"
    path.write_text("".join(f"0 {i}:1\n" for i in ids))
    return _trained([Shard(str(path), 0, -1)])


def _polled(source, max_rows):
    source.poll(max_rows)  # the first look: files not yet settled
    return source.poll(max_rows)


@pytest.mark.parametrize("piece", [5, 1 << 20])
def test_rows_are_counted_and_cut_after_the_nth_whatever_the_pieces(tmp_path, monkeypatch, piece):
    monkeypatch.setattr(row_count, "PIECE", piece)
    path = tmp_path / "a.txt"
    _rows(path, 50, blank_every=7)
    size = path.stat().st_size
    assert rows_until(str(path), 0, None, False) == (50, size)
    for limit in (0, 1, 17, 49, 50, 80):
        rows, stop = rows_until(str(path), 0, limit, False)
        assert rows == min(limit, 50)
        head = path.read_bytes()[:stop]
        assert sum(1 for line in head.split(b"\n") if line not in (b"", b"\r")) == rows
        if stop < size:
            assert rows_until(str(path), stop, None, False)[0] == 50 - rows
    assert count_lines(b"a\n\n\r\nb", None) == (2, 6) and count_lines(b"a\nb\nc\n", 2) == (2, 4)


def test_a_folder_stream_cuts_the_file_that_reaches_the_limit_and_a_resumed_job_reads_its_rest(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    _rows(folder / "a.txt", 40)
    _rows(folder / "b.txt", 40, first=40, blank_every=5)
    _rows(folder / "c.txt", 40, first=80)
    source = streams.FolderSource(str(folder), 64, "libsvm")
    source.start(None)
    shards, position, rows, _ = _polled(source, 55)
    assert rows == 55 and _trained(shards) == _ids(tmp_path, range(1, 56))
    assert "c.txt" not in position["taken"] and position["cut_at"] == {"b.txt": position["cut_at"]["b.txt"]}
    resumed = streams.FolderSource(str(folder), 64, "libsvm")  # a job resumed with --max-examples 100
    resumed.start(position)
    first, _, counted, _ = resumed.poll(45)  # as the feeder asks: the rows still to train
    shards, position, rows, _ = resumed.poll(45 - counted)
    shards, rows = first + shards, counted + rows
    assert counted == 25 and rows == 45 and _trained(shards) == _ids(tmp_path, range(56, 101))
    assert position["cut_at"] == {"c.txt": position["cut_at"]["c.txt"]}
    shards, position, rows, _ = resumed.poll(None)  # no limit: the rest, uncounted
    assert rows is None and _trained(shards) == _ids(tmp_path, range(101, 121)) and "cut_at" not in position


def test_a_csv_header_is_not_a_row_and_a_compressed_file_is_taken_whole(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.csv").write_text("y,f\n" + "".join(f"1,{i}\n" for i in range(10)))
    source = streams.FolderSource(str(folder), 1 << 20, "csv")
    source.start(None)
    assert _polled(source, 4)[2] == 4 and source.cut_at["a.csv"] == len("y,f\n1,0\n1,1\n1,2\n1,3\n")
    gz = tmp_path / "gz"
    gz.mkdir()
    with gzip.open(gz / "a.txt.gz", "wt") as f:
        f.write("".join(f"0 {i + 1}:1\n" for i in range(30)))
    source = streams.FolderSource(str(gz), 1 << 20, "libsvm")
    source.start(None)
    shards, position, rows, _ = _polled(source, 10)
    assert rows == 30 and "cut_at" not in position and _trained(shards) == _ids(tmp_path, range(1, 31))


def test_standard_input_is_cut_at_the_limit(tmp_path):
    read, write = os.pipe()
    source = streams.StdinSource(1 << 20, fd=read)
    source.start(None)
    os.write(write, b"".join(b"0 %d:1\n\n" % (i + 1) for i in range(25)))
    os.close(write)
    source.thread.join(10)
    try:
        shards, _, rows, ended = source.poll(7)
        assert rows == 7 and ended and _trained(shards) == _ids(tmp_path, range(1, 8))
    finally:
        source.close()
        os.close(read)
