"""``--pipeline``: a fixed depth, or ``auto``, grown while the worker keeps waiting on its pulls."""

import re

import pytest

from paramserver.apps.ctr.depth import AUTO_MAX, WINDOW, Depth, parse_pipeline
from paramserver.errors import ConfigError


def test_the_values_parse_and_bad_ones_name_the_rule():
    assert parse_pipeline(2) == (2, 2) and parse_pipeline("5") == (5, 5)
    assert parse_pipeline("auto") == (2, AUTO_MAX) and parse_pipeline("auto:6") == (2, 6)
    for bad, said in (("0", "in [1, 64]"), ("65", "in [1, 64]"), ("fast", "'auto' or 'auto:N'"),
                      ("auto:1", "N in [2, 64]"), ("auto:x", "'auto' or 'auto:N'")):
        with pytest.raises(ConfigError, match=re.escape(said)):
            parse_pipeline(bad)


def _window(d, share, each=1.0):
    for _ in range(WINDOW):
        d.waited(share * each, each)


def test_auto_grows_while_each_step_shortens_an_iteration_and_stops_where_one_does_not():
    d = Depth("auto:8")
    _window(d, 0.9, 3.0)  # waiting most of the time on a distant server
    assert d.now == 3
    _window(d, 0.9, 2.0)  # one more in flight: iterations a third shorter, kept, and one more
    assert d.now == 4
    _window(d, 0.9, 1.9)  # this one hardly helped: the wait is the server's; taken back, and the depth stays
    assert d.now == 3 and d.frozen
    _window(d, 0.9, 5.0)
    assert d.now == 3


def test_auto_stops_at_its_cap_and_does_not_grow_when_the_worker_hardly_waits():
    d = Depth("auto:3")
    _window(d, 0.05)
    assert d.now == 2
    _window(d, 0.8, 2.0)
    _window(d, 0.8, 1.0)
    _window(d, 0.8, 0.5)
    assert d.now == 3
    fixed = Depth(2)
    _window(fixed, 0.9)
    assert fixed.now == 2
