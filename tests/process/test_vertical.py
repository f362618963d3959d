"""Level 3 (issue 14): vertical training with the features cut into column blocks, one
worker a block, reaches the log loss of ordinary training on a9a."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
from support import shared

from paramserver.apps.ctr import vertical
from paramserver.apps.ctr.models import Model
from paramserver.apps.ctr.train import TrainConfig, run_training
from paramserver.apps.ctr.vertical import run_vertical, split_columns
from paramserver.data.reader import DataError, DataFormat
from paramserver.errors import ConfigError

pytestmark = pytest.mark.timeout(300)


def test_feature_partitioned_lr_matches_row_partitioned_on_a9a():
    train, test = shared("libsvm/a9a.libsvm.gz"), shared("libsvm/a9a.t.libsvm.gz")
    cfg = TrainConfig(Model("lr"), DataFormat("libsvm", label_format="pm1"))  # the CLI's defaults
    rows = run_training(cfg, [train], [test], servers=1, workers=2)
    cols = run_vertical(cfg, [train], [test], 2, servers=1, workers=2)
    assert cols["examples"] == rows["examples"] == 32_561 and cols["test_examples"] == 16_281
    assert abs(cols["logloss"] - rows["logloss"]) <= 0.003, (cols["logloss"], rows["logloss"])
    assert cols["auc"] > 0.89


def test_split_columns_keeps_every_line_and_every_feature(tmp_path):
    src = tmp_path / "d.libsvm"
    src.write_text("1 1:0.5 3:1 7:2\n-1 2:1\n\n1 4:1 5:1 6:1 8:1 9:1\n")
    m = split_columns(str(src), 3, str(tmp_path / "out"))
    assert m["parts"] == 3 and m["lines"] == 4
    blocks = [(tmp_path / "out" / f"block-{p}.libsvm").read_text().splitlines() for p in range(3)]
    assert all(len(b) == 3 for b in blocks)  # the blank line is no example
    for i, want in enumerate(["1 1:0.5 3:1 7:2", "-1 2:1", "1 4:1 5:1 6:1 8:1 9:1"]):
        label, *feats = want.split()
        got = [b[i].split() for b in blocks]
        assert all(g[0] == label for g in got)
        assert sorted(t for g in got for t in g[1:]) == sorted(feats)
    (tmp_path / "bad.libsvm").write_text("1 1:2\n1 x:1\n")
    with pytest.raises(DataError, match=r"bad.libsvm:2: not a LIBSVM line"):
        split_columns(str(tmp_path / "bad.libsvm"), 2, str(tmp_path / "o2"))
    gz = tmp_path / "d.libsvm.gz"
    gz.write_bytes(gzip.compress(src.read_bytes()))
    assert split_columns(str(gz), 2, str(tmp_path / "o3"))["lines"] == 4
    # svmlight's syntax, as the parsers read it: comments and qid: dropped, an index 0 kept
    (tmp_path / "svmlight.libsvm").write_text("# written by a tool\n1 qid:7 0:0.5 3:1 # note\n-1 2:1#x\n")
    split_columns(str(tmp_path / "svmlight.libsvm"), 2, str(tmp_path / "o4"))
    blocks = [(tmp_path / "o4" / f"block-{p}.libsvm").read_text().splitlines() for p in range(2)]
    assert all(len(b) == 2 for b in blocks)
    assert sorted(t for b in blocks for t in b[0].split()[1:]) == ["0:0.5", "3:1"]
    assert sorted(t for b in blocks for t in b[1].split()[1:]) == ["2:1"]


def test_split_columns_reads_in_pieces_as_it_reads_whole(tmp_path, monkeypatch):
    """The file is split a piece at a time: lines cut by a piece's end, a last line with no
    newline, and a bad line's number counted across pieces, as when read whole."""
    rng = np.random.default_rng(5)
    lines = [" ".join([str(rng.integers(0, 2))] + [f"{j}:{rng.integers(1, 9)}" for j in
                                                    np.sort(rng.choice(50, rng.integers(0, 8), replace=False))])
             for _ in range(300)]
    src = tmp_path / "d.libsvm"
    src.write_text("\n".join(lines))  # no final newline
    whole = split_columns(str(src), 3, str(tmp_path / "whole"))
    monkeypatch.setattr(vertical, "CHUNK_BYTES", 97)
    pieces = split_columns(str(src), 3, str(tmp_path / "pieces"))
    assert whole["lines"] == pieces["lines"] == 300
    for p in range(3):
        got = (tmp_path / "pieces" / f"block-{p}.libsvm").read_bytes()
        assert got == (tmp_path / "whole" / f"block-{p}.libsvm").read_bytes() and got.count(b"\n") == 300
    lines[250] = "1 3:1 x:2"
    src.write_text("\n".join(lines))
    with pytest.raises(DataError, match=r"d.libsvm:251: not a LIBSVM line"):
        split_columns(str(src), 3, str(tmp_path / "bad"))


def test_feature_partition_refuses_what_it_cannot_do(tmp_path):
    cfg = TrainConfig(Model("lr"), DataFormat("libsvm"))
    with pytest.raises(ConfigError, match="pass --workers 2"):
        run_vertical(cfg, ["x"], [], 2, servers=1, workers=1)
    with pytest.raises(ConfigError, match="--model lr"):
        run_vertical(TrainConfig(Model("fm"), DataFormat("libsvm")), ["x"], [], 2, servers=1, workers=2)


def test_split_columns_refuses_a_folder_an_empty_file_and_more_blocks_than_files(tmp_path, monkeypatch):
    """--parts 100000 failed with 'Too many open files' after writing 20 000 blocks; a folder
    was a raw errno; an empty file 'split' into empty blocks."""
    monkeypatch.setattr(vertical, "_most_parts", lambda: 8)
    data = tmp_path / "d.svm"
    data.write_text("1 1:1 2:1\n")
    with pytest.raises(ConfigError, match=r"--parts must be a whole number in \[1, 8\] .* got 9"):
        split_columns(str(data), 9, str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match="a folder; give the LIBSVM file to split"):
        split_columns(str(tmp_path), 2, str(tmp_path / "out"))
    (tmp_path / "e.svm").write_text("")
    with pytest.raises(ConfigError, match="e.svm: empty; give the LIBSVM file to split"):
        split_columns(str(tmp_path / "e.svm"), 2, str(tmp_path / "out"))
    assert split_columns(str(data), 8, str(tmp_path / "out"))["lines"] == 1
