"""The ratings reader's one-pass plain lines (``ratings._plain_line``) read what its general path
reads: on random files of every shape (tab, comma, space and '::' separators; signs, decimals
of up to 16 places, exponents, CR, runs of separators, long ids, blank lines; and bad lines:
empty fields, 19-digit ids, letters, ratings past float64) both give the same triples to the
bit, the same count, and stop at the same line with the same complaint."""

from __future__ import annotations

import numpy as np
import pytest

from paramserver.apps.rounds import ratings_lines
from paramserver.apps.rounds.ratings_lines import parse_names, parse_numbers


def _id(rng: np.random.Generator, odd: float, bad: float) -> str:
    """An id: a whole number mostly; with probability ``odd`` one the plain path leaves to the
    general one (a sign, 17 or 18 digits); with ``bad`` one no path takes (19 digits, a letter, a
    decimal, nothing)."""
    r = rng.random()
    if r < bad:
        return ["1" * int(rng.integers(19, 22)), "x1", "1.5", "", "0x10", "12a"][int(rng.integers(0, 6))]
    if r < bad + odd:
        return ["-" + str(int(rng.integers(1, 1000))), "+" + str(int(rng.integers(0, 99))),
                "1" * int(rng.integers(17, 19)), "0" * int(rng.integers(2, 18)) + "7"][int(rng.integers(0, 4))]
    return str(int(rng.integers(0, 10 ** int(rng.integers(1, 8)))))


def _rating(rng: np.random.Generator, odd: float, bad: float) -> str:
    """A rating: a whole number or a decimal mostly; odd: an exponent, a sign, '.5', '3.'; bad:
    past float64's range, 'nan', a letter, two points, nothing."""
    r = rng.random()
    if r < bad:
        return ["9" * int(rng.integers(310, 320)), "nan", "4a", "", "1e", "1.2.3"][int(rng.integers(0, 6))]
    if r < bad + odd:
        return [f"{rng.uniform(0, 5):.3e}", f"-{rng.uniform(0, 5):.2f}", "." + str(int(rng.integers(0, 100))),
                str(int(rng.integers(0, 6))) + ".", "+4"][int(rng.integers(0, 5))]
    if rng.random() < 0.4:
        return str(int(rng.integers(0, 6)))
    return f"{rng.uniform(0, 5):.{int(rng.integers(0, 17))}f}"


def _line(rng: np.random.Generator, odd: float, bad: float) -> str:
    """A line of one file's separator, its first three fields and maybe a timestamp; odd: a
    separator run (space then tab, say), a separator first, CR, a separator last, a blank
    line; bad: no separator at all, an empty field (two tabs)."""
    if rng.random() < odd / 4:
        return ["", "   ", "\r", " \r"][int(rng.integers(0, 4))]
    seps = ["\t", ",", " ", "::"]
    sep = seps[int(rng.integers(0, 4))] if rng.random() >= bad else ""
    fields = [_id(rng, odd, bad), _id(rng, odd, bad), _rating(rng, odd, bad)]
    if rng.random() < 0.5:
        fields.append(str(int(rng.integers(0, 2 ** 31))))  # a timestamp
    between = []
    for _ in fields[1:]:
        r = rng.random()
        between.append(sep + sep if r < bad else (" " + sep if r < bad + odd else sep))
    text = fields[0] + "".join(b + f for b, f in zip(between, fields[1:], strict=True))
    if rng.random() < odd:
        text = " " + text  # a space first: no empty field
    if rng.random() < odd:
        text += "\r"
    if rng.random() < odd:
        text += sep  # a separator last
    return text


def _read(parse, data: bytes, n: int):  # type: ignore[no-untyped-def]
    buf = np.frombuffer(data, np.uint8)
    users, items, ratings = np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.float32)
    got, err, at = parse(buf, users, items, ratings)
    return got, err, at, users[:got], items[:got], ratings[:got]


@pytest.mark.parametrize("seed", range(60))
def test_plain_lines_read_as_the_general_path_reads_them(seed):
    rng = np.random.default_rng(seed)
    odd, bad = [(0.0, 0.0), (0.01, 0.0), (0.1, 0.0), (0.3, 0.0), (0.05, 0.002), (0.1, 0.02)][seed % 6]
    lines = [_line(rng, odd, bad) for _ in range(int(rng.integers(1, 400)))]
    data = ("\n".join(lines) + "\n").encode()
    n = data.count(b"\n")
    plain = _read(lambda b, u, i, r: parse_numbers(b, 0, u, i, r), data, n)
    general = _read(lambda b, u, i, r: parse_names(b, 0, u, i, r, False, False), data, n)
    assert plain[:3] == general[:3], (plain[:3], general[:3], lines)
    for a, b in zip(plain[3:], general[3:], strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_movielens_shapes_take_the_plain_path_and_read_their_numbers():
    data = b"1\t2\t3\t881250949\n196,242,3.5,881250949\n22::377::1::878887116\r\n7 8 4.25\n"
    got, err, at, users, items, ratings = _read(lambda b, u, i, r: parse_numbers(b, 0, u, i, r), data, 4)
    assert (got, err, at) == (4, "", -1)
    assert users.tolist() == [1, 196, 22, 7] and items.tolist() == [2, 242, 377, 8]
    assert ratings.tolist() == [3.0, 3.5, 1.0, 4.25]


@pytest.mark.parametrize("case", ["clean", "blank first half", "bad second half", "bad both halves"])
def test_a_big_file_read_in_two_halves_reads_as_one_pass(case, monkeypatch):
    """A file past ``PARALLEL_BYTES`` is parsed in two halves on two threads: the same triples
    in the same order (blank lines in the first half leave no gap), and the first bad line's
    complaint and offset, in whichever half it is."""
    monkeypatch.setattr(ratings_lines, "PARALLEL_BYTES", 1 << 12)
    rng = np.random.default_rng(7)
    lines = [_line(rng, 0.1, 0.0) for _ in range(3000)]
    if case == "blank first half":
        lines[5:40] = [""] * 35
    if case in ("bad second half", "bad both halves"):
        lines[2600] = "1\t\t2\t3"  # an empty field
    if case == "bad both halves":
        lines[100] = "7,x,3"
    data = ("\n".join(lines) + "\n").encode()
    assert len(data) >= 2 * (1 << 12)
    n = data.count(b"\n")
    halves = _read(lambda b, u, i, r: parse_numbers(b, 0, u, i, r), data, n)
    one_pass = _read(lambda b, u, i, r: parse_names(b, 0, u, i, r, False, False), data, n)
    assert halves[:3] == one_pass[:3]
    assert bool(halves[1]) == (case != "clean" and case != "blank first half")
    for a, b in zip(halves[3:], one_pass[3:], strict=True):
        np.testing.assert_array_equal(a, b)
