"""bench/headline.py --markdown: the block that opens docs/benchmarks.md, rendered from fixed rows."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from scripts import load_script

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def headline():
    sys.path.insert(0, str(BENCH))  # as the script runs: its folder first (harness/)
    try:
        module = load_script("bench/headline.py", "headline_script")
    finally:
        sys.path.remove(str(BENCH))
    return module


def _rows(h):
    return [h.judged("train heavy 10^6", "examples/s ÷ VW's", h.TRAIN_SPEED, 0.903, "233,085 ex/s", "258,208 ex/s"),
            h.judged("pushpull 1 server", "pull keys/s ÷ ps-lite's", h.PUSHPULL, 4.0, "28.88 M keys/s",
                     "7.22 M keys/s"),
            h.not_run("lda", "tomotopy is not installed: pip install -e '.[bench]'")]


def test_the_block_is_dated_names_its_command_and_machine_and_judges_each_row(headline):
    text = headline.markdown_block(_rows(headline), when="2026-11-28 22:10 UTC", commit="3dde119",
                                   command="bench/headline.py --markdown", machine="2 cores (EPYC), 24 GiB",
                                   quick=False, load=(0.3, 2.5))
    lines = text.splitlines()
    assert lines[0] == "## Today's figures"
    assert lines[2].startswith("Measured 2026-11-28 22:10 UTC, commit 3dde119, with `bench/headline.py --markdown` "
                               "on 2 cores (EPYC), 24 GiB; load average 0.3 -> 2.5.")
    assert "(1 of 2 goals met)" in lines[2]
    assert lines[4:] == [
        "| comparison | ratio | goal | measured | paramserver | peer | result |",
        "|---|---|---|---|---|---|---|",
        "| train heavy 10^6 | examples/s ÷ VW's | ≥ 3 | 0.903 | 233,085 ex/s | 258,208 ex/s | **FAIL** |",
        "| pushpull 1 server | pull keys/s ÷ ps-lite's | ≥ 2 | 4 | 28.88 M keys/s | 7.22 M keys/s | PASS |",
        "| lda | - | - | - | - | - | not run: tomotopy is not installed: pip install -e '.[bench]' |",
    ]


def test_a_quick_run_says_it_is_not_the_headline(headline):
    text = headline.markdown_block([], when="w", commit="c", command="x", machine="m", quick=True, load=(0, 0))
    assert text.splitlines()[0] == "## Today's figures (quick: a smoke run, not the headline)"
    assert "(0 of 0 goals met)" in text


def test_the_markdown_flag_is_taken_and_off_by_default(headline):
    assert headline.parse_args(["--markdown", "--quick"]).markdown
    assert not headline.parse_args([]).markdown
