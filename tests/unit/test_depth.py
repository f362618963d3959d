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


def test_link_is_four_on_a_short_round_trip_and_two_and_one_more_for_each_whole_ms_of_a_long_one():
    from paramserver.apps.ctr.depth import LINK_BASE, LINK_MAX

    assert LINK_BASE == 4 and parse_pipeline("link") == (2, LINK_MAX)
    for floor_s, want in ((0.0002, 4), (0.00099, 4), (0.0016, 4), (0.0021, 4), (0.0031, 5), (0.010, 12),
                          (0.5, LINK_MAX)):
        d = Depth("link")
        assert d.now == LINK_BASE and d.floor_ms is None  # until the link is timed, nothing is known
        d.measured(floor_s)
        assert d.now == want and d.floor_ms == pytest.approx(1000 * floor_s), (floor_s, d.now)
        assert d.settles()  # deeper than 2: the last batches settle
        for _ in range(3 * WINDOW):  # and the depth stays for the job: no waiting moves it
            d.waited(0.9, 1.0)
        assert d.now == want


def test_link_keeps_a_factor_model_at_two_and_a_link_it_could_not_time_where_it_starts():
    d = Depth("link", deepens=False)
    d.measured(0.020)
    for _ in range(3 * WINDOW):
        d.waited(0.5, 1.0)
    assert d.now == 2 and d.floor_ms == pytest.approx(20.0) and not d.settles()
    unknown, steps = Depth("link"), Depth("link", stale=False)
    unknown.measured(None)
    steps.measured(None)
    assert (unknown.now, unknown.floor_ms, steps.now, steps.floor_ms) == (4, None, 64, None)
    fixed = Depth(3)
    fixed.measured(0.020)  # only link reads the link
    assert fixed.now == 3 and fixed.floor_ms is None
    assert Depth(2).settles() is False and Depth(3).settles() and Depth("auto:4").settles()


def test_steps_keep_the_most_in_flight_on_any_link_and_never_settle():
    from paramserver.apps.ctr.depth import STEP_DEPTH, link_depth

    assert STEP_DEPTH == 64
    # one machine's pings (0.3-0.45 ms), a 1 ms link, a long one: the most --pipeline takes
    for floor_s in (0.0001, 0.00074, 0.00075, 0.0011, 0.003, 0.5):
        d = Depth("link", stale=False)
        assert d.now == STEP_DEPTH
        d.measured(floor_s)
        assert d.now == STEP_DEPTH == link_depth(1000 * floor_s, stale=False) and not d.settles(), (floor_s, d.now)
    assert Depth(3, stale=False).now == 3 and not Depth(3, stale=False).settles()  # a fixed depth is as given


def test_link_times_a_floor_that_would_deepen_again_and_keeps_the_least():
    asked = []

    def floors(*answers):
        it = iter(answers)
        return lambda: asked.append(1) or next(it)

    stall = Depth("link")  # one machine whose first pings met a stall: timed again, stays at 4
    stall.time_link(floors(0.0043, 0.0003))
    assert (stall.now, stall.floor_ms, len(asked)) == (4, pytest.approx(0.3), 2)
    asked.clear()
    far = Depth("link")  # a real link: the second look agrees
    far.time_link(floors(0.0031, 0.0034))
    assert (far.now, far.floor_ms, len(asked)) == (5, pytest.approx(3.1), 2)
    asked.clear()
    steps = Depth("link", stale=False)  # steps keep the most in flight: no second look
    steps.time_link(floors(0.0021))
    assert (steps.now, steps.floor_ms, len(asked)) == (64, pytest.approx(2.1), 1)
    asked.clear()
    near = Depth("link")  # a floor that keeps the depth is not asked twice: one machine's, or a 2 ms link's
    near.time_link(floors(0.0003))
    assert (near.now, len(asked)) == (4, 1)
    asked.clear()
    near = Depth("link")
    near.time_link(floors(0.0021))
    assert (near.now, len(asked)) == (4, 1)
    asked.clear()
    Depth(4).time_link(floors())  # only link times the link
    Depth("link", deepens=False).time_link(floors(0.02))  # a factor model: once, it stays at 2
    assert len(asked) == 1
