"""``train --test``'s rows read once the job is done: each file in byte ranges parsed at once,
handed over in the file's order with each part's distinct keys, the same rows as one reader;
and the first of them read while the cluster starts (``TestSet.begin``), then the rest."""

import gzip
import threading

import numpy as np
import pytest

from paramserver.apps.ctr import test_set
from paramserver.apps.ctr.synth import write_synth
from paramserver.data.reader import DataError, DataFormat, read_all


def _read(paths, fmt, monkeypatch, readers, part_rows, early=None):
    """The test set's parts; ``early``: rows read before the job (``EARLY_ROWS``), all of them
    read before ``hold`` (the thread joined), where None: none read before."""
    monkeypatch.setattr(test_set, "READERS", readers)
    monkeypatch.setattr(test_set, "PART_ROWS", part_rows)
    if early is not None:
        monkeypatch.setattr(test_set, "EARLY_ROWS", early)
    with test_set.TestSet(paths, fmt, while_training=False) as tests:
        if early is not None:
            tests.begin()
            tests._early._thread.join(30)
            read = sum(len(part) for parts in tests._early._read for part, _ in parts)
            assert read >= min(early, 1) and read < early + part_rows  # its budget, then one part at most
            tests.hold()
        parts = list(tests.parts())
    for part, (uniq, inverse) in parts:  # each part's distinct keys are its own
        assert np.array_equal(uniq[inverse], part.keys)
        assert np.unique(uniq).size == uniq.size
    return parts


def _same_rows(parts, whole):
    labels = np.concatenate([p.labels for p, _ in parts])
    keys = np.concatenate([p.keys for p, _ in parts])
    lengths = np.concatenate([np.diff(p.indptr) for p, _ in parts])
    assert np.array_equal(labels, whole.labels)
    assert np.array_equal(keys, whole.keys)
    assert np.array_equal(lengths, np.diff(whole.indptr))


@pytest.mark.parametrize("readers,early", [(1, None), (2, None), (3, None), (7, None),
                                           (2, 1), (2, 700), (3, 2_000), (2, 10_000)])
def test_ranges_read_at_once_give_the_files_rows_in_order(tmp_path, monkeypatch, readers, early):
    a, b = str(tmp_path / "a.tsv"), str(tmp_path / "b.tsv.gz")
    write_synth(a, 3_001, seed=1, shape="heavy")
    write_synth(b, 1_000, seed=2)  # compressed: read whole, after a's ranges
    fmt = DataFormat()
    parts = _read([a, b], fmt, monkeypatch, readers, part_rows=256, early=early)
    _same_rows(parts, read_all([a, b], fmt))
    assert len(parts) > readers  # parts of the ranges, not one a range


def test_a_csv_files_later_ranges_know_its_header(tmp_path, monkeypatch):
    path = tmp_path / "t.csv"
    rng = np.random.default_rng(0)
    rows = [f"{rng.integers(2)},{rng.integers(50)},c{rng.integers(9)}" for _ in range(2_000)]
    path.write_text("y,a,b\n" + "\n".join(rows) + "\n")
    fmt = DataFormat("csv", label_column="y")
    parts = _read([str(path)], fmt, monkeypatch, 3, part_rows=100)
    _same_rows(parts, read_all([str(path)], fmt))


def test_a_file_smaller_than_its_ranges_and_one_with_no_rows(tmp_path, monkeypatch):
    small = tmp_path / "small.tsv"
    write_synth(str(small), 2, seed=3)
    fmt = DataFormat()
    _same_rows(_read([str(small)], fmt, monkeypatch, 16, part_rows=8), read_all([str(small)], fmt))
    blank = tmp_path / "blank.tsv.gz"
    with gzip.open(blank, "wt") as f:
        f.write("\n\n")
    with pytest.raises(DataError, match="no examples in"):
        _read([str(blank)], fmt, monkeypatch, 2, part_rows=8)


@pytest.mark.parametrize("early", [None, 5_000, 300])  # after the job; before it; the rest after it
def test_a_bad_line_in_a_later_range_is_named_with_its_line(tmp_path, monkeypatch, early):
    path = tmp_path / "t.tsv"
    write_synth(str(path), 1_000, seed=4)
    lines = path.read_text().splitlines()
    lines[900] = "x\t" + lines[900].split("\t", 1)[1]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"t\.tsv:901: the label"):
        _read([str(path)], DataFormat(), monkeypatch, 2, part_rows=64, early=early)


def test_reading_before_the_job_stops_at_hold_after_the_part_at_hand(tmp_path, monkeypatch):
    path = str(tmp_path / "t.tsv")
    write_synth(path, 50, seed=5)
    gate, given, closed = threading.Event(), [], []

    def parts(shard, fmt):  # a range's parts, each given once the test lets it
        try:
            for i in range(100):
                gate.wait(30)
                given.append(i)
                yield [0] * 10, None
        finally:
            closed.append(shard)

    monkeypatch.setattr(test_set, "_deduplicated_range", parts)
    with test_set.TestSet([path], DataFormat(), while_training=False) as tests:
        tests.begin()
        early = tests._early
        tests.begin()  # twice: one reader
        assert tests._early is early
        tests.hold()
        gate.set()
        early._thread.join(30)
        assert not early._thread.is_alive()
        assert len(given) <= 1  # the part it waited on, and no other
    assert len(early._sources) == test_set.READERS
    assert all(parts.gi_frame is None for parts in early._sources)  # each range closed with the block,
    assert len(closed) == len(given)  # its file too where it was opened


def test_no_test_set_and_one_read_while_training_start_no_early_reader(tmp_path):
    path = str(tmp_path / "t.tsv")
    write_synth(path, 300, seed=6)
    with test_set.TestSet([], DataFormat(), while_training=False) as none:
        none.begin()
        assert none._early is None and none.parts() is None
    with test_set.TestSet([path], DataFormat(), while_training=True) as alongside:
        alongside.begin()
        assert alongside._early is None and alongside.reading is not None
        assert sum(len(p) for p, _ in alongside.parts()) == 300
