"""``paramserver synth --shape drift``: day files of Criteo TSV whose ids retire and are born
day to day, with a long tail and a moving click rate (paramserver.apps.ctr.drift)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from paramserver.apps.ctr.drift import day_ctr, day_path, write_day, write_drift
from paramserver.cli.main import main
from paramserver.data.batch import DataFormat
from paramserver.data.reader import read_all
from paramserver.errors import ConfigError

ROWS = 5_000


@pytest.fixture(scope="module")
def week(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = str(tmp_path_factory.mktemp("drift") / "days")
    write_drift(out, ROWS, 7, seed=3)
    return out


def _lines(path: str) -> list[list[bytes]]:
    with open(path, "rb") as f:
        return [line.split(b"\t") for line in f.read().split(b"\n")[:-1]]


def _ids(path: str) -> tuple[set[bytes], np.ndarray]:
    """The day's distinct (field, id) keys and how many times each occurs."""
    keys = [bytes([f]) + v for row in _lines(path) for f, v in enumerate(row[14:]) if v]
    _, counts = np.unique(np.array(keys), return_counts=True)
    return set(keys), counts


def _ctr(path: str) -> float:
    return float(np.mean([int(row[0]) for row in _lines(path)]))


def test_writes_criteo_day_files(week: str) -> None:
    assert sorted(os.listdir(week)) == [f"day-{d:02d}.tsv" for d in range(7)]
    rows = _lines(day_path(week, 4))
    assert len(rows) == ROWS
    assert {len(row) for row in rows} == {40}
    assert {row[0] for row in rows} == {b"0", b"1"}
    assert all(len(v) == 8 and int(v, 16) >= 0 for row in rows[:200] for v in row[14:])
    batch = read_all([day_path(week, 4)], DataFormat("criteo"))
    assert len(batch) == ROWS


def test_deterministic_and_each_day_alone(week: str, tmp_path: Path) -> None:
    again = str(tmp_path / "again")
    write_drift(again, ROWS, 2, seed=3)
    for d in range(2):
        assert Path(day_path(again, d)).read_bytes() == Path(day_path(week, d)).read_bytes()
    alone = str(tmp_path / "day5.tsv")
    write_day(alone, ROWS, 5, seed=3)
    assert Path(alone).read_bytes() == Path(day_path(week, 5)).read_bytes()
    other = str(tmp_path / "other.tsv")
    write_day(other, ROWS, 5, seed=4)
    assert Path(other).read_bytes() != Path(alone).read_bytes()


def test_ids_drift(week: str) -> None:
    day0, day1, day6 = (_ids(day_path(week, d))[0] for d in (0, 1, 6))
    near, far = len(day0 & day1) / len(day0), len(day0 & day6) / len(day0)
    assert far < 0.5 * near
    # ids seen on day 0 and again on day 6 are the head that survived six retirements (0.75^6)
    assert far > 0


def test_click_rate_moves(week: str) -> None:
    ctrs = [_ctr(day_path(week, d)) for d in range(7)]
    assert all(0.15 < c < 0.35 for c in ctrs)
    assert max(ctrs) - min(ctrs) > 0.02
    targets = [day_ctr(3, d) for d in range(7)]
    assert np.corrcoef(ctrs, targets)[0, 1] > 0.8


def test_heavy_tail(week: str) -> None:
    keys, counts = _ids(day_path(week, 2))
    assert np.mean(counts == 1) > 0.5  # most of a day's distinct ids are seen once
    assert counts.max() > ROWS // 20  # and a few are everywhere


def test_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "d")
    assert main(["synth", "--shape", "heavy", "--days", "3", "--rows", "10", "--out", out]) == 2
    assert "--days is for --shape drift only" in capsys.readouterr().err
    assert main(["synth", "--days", "3", "--rows", "10", "--out", out]) == 2
    assert "--days is for --shape drift only" in capsys.readouterr().err
    assert main(["synth", "--shape", "drift", "--days", "0", "--rows", "10", "--out", out]) == 2
    assert "--days must be an int >= 1" in capsys.readouterr().err
    assert not os.path.exists(out)
    with pytest.raises(ConfigError, match="--rows"):
        write_drift(out, 0, 2)
    for shape in ("heavy", "drift"):  # numpy's bare "expected non-negative integer" before
        assert main(["synth", "--shape", shape, "--rows", "10", "--seed", "-1", "--out", out]) == 2
        assert "--seed must be a whole number in [0, 2^63), got -1" in capsys.readouterr().err


def test_cli_defaults_to_seven_days(tmp_path: Path) -> None:
    out = str(tmp_path / "d")
    assert main(["synth", "--shape", "drift", "--rows", "20", "--out", out, "--seed", "1"]) == 0
    assert sorted(os.listdir(out)) == [f"day-{d:02d}.tsv" for d in range(7)]


@pytest.mark.parametrize("v", [0, 7, 10, -1, -1234, 2**40 + 3])
def test_a_criteo_integer_column_is_written_in_decimal(v: int) -> None:
    from paramserver.apps.ctr.synth import _put_int

    out, digits = np.zeros(32, np.uint8), np.empty(24, np.uint8)
    end = _put_int(out, 3, np.int64(v), digits)
    assert bytes(out[3:end]) == str(v).encode()


@pytest.mark.parametrize("t", [0, 0xDEADBEEF, 0x1234_0000_000A])
def test_a_criteo_categorical_column_is_eight_hex_digits(t: int) -> None:
    from paramserver.apps.ctr.synth import _HEX, _put_hex

    out = np.zeros(16, np.uint8)
    assert _put_hex(out, 2, np.uint64(t), _HEX) == 10
    assert bytes(out[2:10]) == f"{t & 0xFFFFFFFF:08x}".encode()


def test_synth_compresses_by_the_names_that_data_reads_and_refuses_others(tmp_path, capfd):
    """A .bz2 or .zip name got plain text, which --data then refused as not bz2 or zip data;
    --out - made a file named '-'."""
    from paramserver.apps.ctr.synth import write_synth

    plain = tmp_path / "p.tsv"
    write_synth(str(plain), 50, seed=3)
    want = read_all([str(plain)], DataFormat("criteo"))
    for name in ("s.gz", "s.bz2", "s.xz"):
        write_synth(str(tmp_path / name), 50, seed=3)
        np.testing.assert_array_equal(read_all([str(tmp_path / name)], DataFormat("criteo")).keys, want.keys)
    for bad, says in (("s.zip", "not .zip"), ("", "is a folder")):
        with pytest.raises(ConfigError, match=says):
            write_synth(str(tmp_path / bad), 50, seed=3)
    capfd.readouterr()
    write_synth("-", 50, seed=3)
    assert capfd.readouterr().out.encode() == plain.read_bytes() and not os.path.exists("-")
