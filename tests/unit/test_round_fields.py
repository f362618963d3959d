"""The line splitting the round apps' readers (ratings, UCI docword) share (apps/rounds/fields.py)."""

from __future__ import annotations

import numpy as np
import pytest

from paramserver.apps.rounds.fields import line_end, separators, split_fields


def _split(text: bytes, seps: bytes, most: int) -> list[bytes]:
    buf = np.frombuffer(text + b"\n", np.uint8)
    bounds = np.full(2 * most, -1, np.int64)
    end = line_end(buf, 0)
    assert end == len(text)
    n = split_fields(buf, 0, end, separators(seps), bounds, most)
    return [bytes(buf[bounds[2 * f]:bounds[2 * f + 1]]) for f in range(n)]


@pytest.mark.parametrize("text,seps,most,fields", [
    (b"196\t242\t3\t881250949", b"\t, :\r", 3, [b"196", b"242", b"3"]),  # the rest is not looked at
    (b"1::1193::5::978300760", b"\t, :\r", 4, [b"1", b"1193", b"5", b"978300760"]),
    (b"  7 , 8,9.5\r", b"\t, :\r", 3, [b"7", b"8", b"9.5"]),
    (b" \t \r", b" \t\r", 4, []),
    (b"1 2", b" \t\r", 4, [b"1", b"2"]),
    (b"1 2 3 4 5", b" \t\r", 4, [b"1", b"2", b"3", b"4"]),  # the fourth says: one too many
    (b"1,2 3", b" \t\r", 4, [b"1,2", b"3"]),  # a comma is no separator of a docword line
])
def test_a_line_splits_into_its_first_fields(text, seps, most, fields):
    assert _split(text, seps, most) == fields


def test_a_separator_table_marks_only_its_bytes():
    table = separators(b"\t:")
    assert table.shape == (256,) and set(np.flatnonzero(table)) == {9, 58}
