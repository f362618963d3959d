"""A folder stream's files that change after they were taken (issue 43, items 12-14): the
stamp a shard carries, the check when a worker opens it, ``--changed-files skip``, the
folder source's warning for a file changed after it was read, a resumed job's pending
shards, and the report's lines."""

from __future__ import annotations

import logging
import os

import pytest

from paramserver import ConfigError
from paramserver.apps.ctr.stream_files import check_pending, stream_file_lines, stream_file_report
from paramserver.data import streams
from paramserver.data.batch import DataError, DataFormat, FileStamp, Shard
from paramserver.data.reader import read_batches
from paramserver.data.taken import FileChangedError, stamp_from_info, stamp_of
from paramserver.scheduler.tasks import StreamQueue

ROWS = "".join(f"0 {i + 1}:1\n" for i in range(100))
FMT = DataFormat("libsvm", 64, "01")


def _taken(folder, shard_bytes: int = 1 << 20) -> tuple[streams.FolderSource, list[Shard]]:
    """The folder's files, taken by a folder source (settled at once)."""
    source = streams.FolderSource(str(folder), shard_bytes)
    source.start(None)
    source.poll(None)
    shards, _, _, _ = source.poll(None)
    return source, shards


def _rows(shards: list[Shard], fmt: DataFormat = FMT, stats: dict | None = None) -> int:
    return sum(len(b) for s in shards for b in read_batches(s, fmt, 1000, stats if stats is not None else {}))


@pytest.fixture(autouse=True)
def _settled(monkeypatch):
    monkeypatch.setattr(streams, "SETTLE_S", 0.0)


def test_a_stamp_says_what_changed_and_only_compares_what_both_sides_know():
    taken = FileStamp(100, 1_700_000_000.5, ino=7, dev=1)
    assert taken.changes(FileStamp(100, 1_700_000_000.5, ino=7, dev=1)) == ""
    assert taken.changes(FileStamp(100, 1_700_000_000.5, ino=7)) == ""  # ls says no device: not compared
    assert "gone" in taken.changes(None)
    assert "replaced" in taken.changes(FileStamp(100, 1_700_000_000.5, ino=8, dev=1))
    assert "grew by 20 bytes" in taken.changes(FileStamp(120, 1_700_000_001.0, ino=7, dev=1))
    assert "shrank by 40 bytes" in taken.changes(FileStamp(60, 1_700_000_001.0, ino=7, dev=1))
    assert "rewritten in place" in taken.changes(FileStamp(100, 1_700_000_002.0, ino=7, dev=1))
    assert "replaced" in FileStamp(5, etag="a").changes(FileStamp(5, etag="b"))  # an object store's
    assert "100 bytes, modified 2023-11-14 22:13:20.500 UTC" == taken.describe()


def test_a_shard_carries_its_stamp_on_the_wire_and_old_shards_still_load():
    stamped = Shard("/f/a.txt", 0, 10, stamp=FileStamp(10, 1.5, 3, 4, "e"))
    assert Shard.from_wire(stamped.to_wire()) == stamped
    assert Shard("/f/a.txt", 0, -1).to_wire() == ["/f/a.txt", 0, -1]  # a --data file's: as before
    assert Shard.from_wire(["/f/a.txt", 0, -1]) == Shard("/f/a.txt", 0, -1)
    assert Shard.from_wire(["u", 0, -1, "(1 2", "m:C"]).source == "m:C"
    with pytest.raises(DataError, match="stamp"):
        Shard.from_wire(["/f/a.txt", 0, 10, "", "", "nonsense"])
    assert hash(stamped)  # still a value: hashable


def test_stamps_from_fsspec_info_read_the_fields_object_stores_give():
    import datetime as dt

    s3 = stamp_from_info({"size": 9, "LastModified": dt.datetime(2026, 1, 1, tzinfo=dt.UTC), "ETag": '"abc"'})
    assert s3 == FileStamp(9, dt.datetime(2026, 1, 1, tzinfo=dt.UTC).timestamp(), etag="abc")
    assert stamp_from_info({"size": 3, "updated": "2026-01-01T00:00:00Z"}).mtime == s3.mtime  # gcs's text


def test_a_taken_file_is_read_while_it_is_the_one_taken(tmp_path):
    (tmp_path / "a.txt").write_text(ROWS)
    _, shards = _taken(tmp_path, shard_bytes=200)
    assert len(shards) > 3 and all(s.stamp == stamp_of(str(tmp_path / "a.txt")) for s in shards)
    assert _rows(shards) == 100


@pytest.mark.parametrize("change, what", [
    ("replace", "replaced"), ("append", "grew by"), ("truncate", "shrank by"), ("delete", "gone")])
def test_a_taken_file_changed_before_it_is_read_fails_naming_it_or_is_skipped_and_counted(tmp_path, change, what):
    path = tmp_path / "a.txt"
    path.write_text(ROWS)
    _, shards = _taken(tmp_path, shard_bytes=200)
    if change == "replace":  # mv of another file onto its name
        (tmp_path / ".new").write_text(ROWS[:300])
        os.replace(tmp_path / ".new", path)
    elif change == "append":
        with open(path, "a") as f:
            f.write("1 999:1\n" * 50)
    elif change == "truncate":
        with open(path, "r+") as f:
            f.truncate(100)
    else:
        path.unlink()
    with pytest.raises(FileChangedError, match=what) as caught:
        _rows(shards)
    message = str(caught.value)
    assert str(path) in message and f"taken: {len(ROWS):,} bytes" in message and "--changed-files skip" in message
    stats: dict = {}
    assert _rows(shards, DataFormat("libsvm", 64, "01", changed_files="skip"), stats) == 0
    assert stats["skipped_bytes"] == len(ROWS) and stats["skipped"]["file"] == str(path)
    assert stats["skipped_shards"] == len(shards) and what in stats["skipped"]["what"]


def test_changed_files_must_be_fail_or_skip():
    with pytest.raises(ConfigError, match="--changed-files"):
        DataFormat(changed_files="ignore")


def test_the_scheduler_counts_skipped_shards_by_file_and_keeps_them_over_a_resume():
    q = StreamQueue(source="/f")
    q.add([["/f/a.txt", 0, 10], ["/f/a.txt", 10, 20]], {"taken": ["a.txt"]})
    for _ in range(2):
        task = q.next_shard(1)
        q.shard_done(1, task["shard_id"], 0, {"skipped_shards": 1, "skipped_bytes": 10,
                                              "skipped": {"file": "/f/a.txt", "what": "it is gone"}})
    status = q.status()
    assert status["skipped_files"] == {"/f/a.txt": {"what": "it is gone", "shards": 2, "bytes": 20}}
    assert status["skipped_bytes"] == 20 and status["skipped_shards"] == 2
    again = StreamQueue.resume("/f", q.snapshot())
    assert again.status()["skipped_files"] == status["skipped_files"] and again.totals["skipped_bytes"] == 20
    old = StreamQueue.resume("/f", {"totals": {"examples": 3}, "stream": {"source": "/f", "pending": []}})
    assert old.status()["skipped_files"] == {} and old.totals["skipped_bytes"] == 0  # an earlier version's


def _progress(shards: list[Shard], folder) -> dict:
    return {"totals": {"examples": 5, "bytes": 50}, "stream": {
        "source": str(folder), "position": {"taken": ["a.txt"]}, "pending": [s.to_wire() for s in shards]}}


def test_a_resumed_job_whose_pending_shards_name_a_changed_file_is_refused_or_skips_them(tmp_path):
    (tmp_path / "a.txt").write_text(ROWS)
    (tmp_path / "b.txt").write_text(ROWS)
    source, shards = _taken(tmp_path, shard_bytes=400)
    progress = _progress(shards, tmp_path)
    assert check_pending("ckpt/step-1", progress, source, skip=False) is progress  # nothing changed
    (tmp_path / "a.txt").unlink()
    with pytest.raises(FileChangedError, match=r"a\.txt changed .* it is gone .*--resume ckpt/step-1"):
        check_pending("ckpt/step-1", progress, source, skip=False)
    resumed = check_pending("ckpt/step-1", progress, source, skip=True)
    a = [s for s in shards if s.path.endswith("a.txt")]
    assert resumed["stream"]["pending"] == [s.to_wire() for s in shards if s.path.endswith("b.txt")]
    assert resumed["totals"]["skipped_bytes"] == len(ROWS) and resumed["totals"]["skipped_shards"] == len(a)
    assert resumed["skipped_files"] == {str(tmp_path / "a.txt"): {"what": "it is gone (deleted, or moved away)",
                                                                  "shards": len(a), "bytes": len(ROWS)}}
    old = _progress([Shard(s.path, s.start, s.end) for s in shards], tmp_path)  # no stamps: an earlier version's
    with pytest.raises(DataError, match=r"a\.txt, which the checkpoint has shards of still to read, it is gone"):
        check_pending("ckpt/step-1", old, source, skip=False)


def test_a_file_changed_after_it_was_read_is_said_once_with_the_bytes_not_trained(tmp_path, caplog):
    (tmp_path / "a.txt").write_text(ROWS)
    (tmp_path / "b.txt").write_text(ROWS)
    source, _ = _taken(tmp_path)
    with open(tmp_path / "a.txt", "a") as f:
        f.write("1 999:1\n" * 10)
    (tmp_path / ".b").write_text(ROWS[:40])
    os.replace(tmp_path / ".b", tmp_path / "b.txt")
    with caplog.at_level(logging.WARNING, logger="paramserver.data.streams"):
        assert source.poll(None)[0] == []  # seen changed: said once it settled
        assert source.poll(None)[0] == []  # not taken again: a folder's file is read once
        source.poll(None)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said
    assert "a.txt changed after the stream took it: it grew by 80 bytes" in said[0]
    assert "the 80 bytes appended" in said[0]
    assert "b.txt changed after the stream took it: it was replaced" in said[1] and "its 40 bytes now" in said[1]
    report = stream_file_report({"examples": 100, "bytes": len(ROWS)}, source)
    assert report["files_changed_after_taken"] == {
        str(tmp_path / "a.txt"): {"what": "it grew by 80 bytes (appended to, or rewritten)", "bytes_ignored": 80},
        str(tmp_path / "b.txt"): {"what": "it was replaced: another file has its name", "bytes_ignored": 40}}
    assert report["skipped_bytes"] == 0 and report["files_skipped"] == {}
    lines = dict(stream_file_lines(report))
    assert "120 bytes of them were not trained" in lines["changed after taken"]


def test_the_report_estimates_the_rows_skipped_at_the_jobs_bytes_a_row(tmp_path):
    status = {"examples": 1000, "bytes": 10_000, "skipped_bytes": 2_000, "skipped_shards": 2,
              "skipped_files": {"/f/a.txt": {"what": "it is gone", "shards": 2, "bytes": 2000}}}
    report = stream_file_report(status, None)
    assert report["skipped_rows_estimate"] == 200
    assert "about 200 rows" in dict(stream_file_lines(report))["NOT TRAINED (--changed-files skip)"]
    assert stream_file_report({"examples": 5}, None) == {}  # not a folder, nothing skipped: no lines


def test_a_position_of_an_earlier_version_stamps_its_files_as_they_are_on_resume(tmp_path):
    (tmp_path / "a.txt").write_text(ROWS)
    source = streams.FolderSource(str(tmp_path), 1 << 20)
    source.start({"taken": ["a.txt"]})
    assert source.stamps["a.txt"] == stamp_of(str(tmp_path / "a.txt"))
    assert source.poll(None)[0] == [] and source.poll(None)[0] == []


def test_a_folder_url_is_stamped_from_fsspec_and_checked_when_read(tmp_path):
    (tmp_path / "a.txt").write_text(ROWS)
    _, shards = _taken(f"file://{tmp_path}", shard_bytes=400)
    assert shards[0].path.startswith("file://") and shards[0].stamp.ino  # fsspec's local info has the inode
    assert _rows(shards) == 100
    (tmp_path / "a.txt").unlink()
    with pytest.raises(FileChangedError, match="gone"):
        _rows(shards)


def test_a_taken_files_shards_are_checked_with_cache_too_and_not_cached(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text(ROWS)
    _, shards = _taken(tmp_path / "in", shard_bytes=400)
    cached = DataFormat("libsvm", 64, "01", cache_dir=str(tmp_path / "cache"))
    assert _rows(shards, cached) == 100 and not (tmp_path / "cache").exists()  # read once: nothing to cache
    (tmp_path / "in" / "a.txt").unlink()
    with pytest.raises(FileChangedError, match="gone"):
        _rows(shards, cached)


def test_changed_files_is_refused_without_a_stream():
    import argparse

    from paramserver.cli.ctr import _changed_files

    assert _changed_files(argparse.Namespace(changed_files="skip", stream="in/")) == "skip"
    with pytest.raises(ConfigError, match="--changed-files skip applies to --stream FOLDER"):
        _changed_files(argparse.Namespace(changed_files="skip", stream=None))
