"""The server's lease (server/lease.py): it runs from when an answered beat was sent, for
3/4 of the heartbeat timeout, so a server stops serving before the scheduler can have
declared it dead."""

from paramserver.server.lease import LEASE_FRACTION, Lease


class _Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_no_lease_before_the_first_grant_and_one_that_runs_from_the_send_time():
    clock = _Clock()
    lease = Lease(4.0, clock=clock)
    assert not lease.valid() and lease.length == 4.0 * LEASE_FRACTION == 3.0
    lease.granted(clock.t)  # registration answered
    clock.t += 2.9
    assert lease.valid()
    clock.t += 0.2  # 3.1 s after the registration was sent: the scheduler may declare it dead at 4
    assert not lease.valid() and abs(lease.expired_for() - 0.1) < 1e-9


def test_an_answered_beat_renews_from_when_it_was_sent_not_when_the_answer_came():
    clock = _Clock()
    lease = Lease(4.0, clock=clock)
    lease.granted(clock.t)
    first = lease.beat()
    clock.t += 0.5
    second = lease.beat()
    clock.t += 2.0  # both answers arrive late, in order
    lease.answered(first)
    lease.answered(second)
    assert lease.valid()
    clock.t = 100.5 + 3.0  # the second beat's send time + 3/4 of the timeout
    assert not lease.valid()


def test_answers_to_unknown_or_older_beats_do_not_extend_it():
    clock = _Clock()
    lease = Lease(4.0, clock=clock)
    old = lease.beat()
    clock.t += 1.0
    new = lease.beat()
    lease.answered(new)
    until = clock.t + 3.0
    lease.answered(old)  # forgotten once a newer beat was answered
    for junk in (None, "1", True, 10**9, -1):
        lease.answered(junk)
    clock.t = until - 1e-6
    assert lease.valid()
    clock.t = until
    assert not lease.valid()


def test_a_paused_server_finds_its_lease_gone_however_long_it_slept():
    clock = _Clock()
    lease = Lease(1.5, clock=clock)
    lease.granted(clock.t)
    lease.beat()
    clock.t += 60.0  # SIGSTOP for a minute: the beat's answer was never read
    assert not lease.valid() and lease.expired_for() > 58


def test_a_lease_that_ran_out_and_came_back_is_counted():
    """Answers that stopped past the lease (a cut link from the scheduler) mean its other
    messages of that time may be lost too: each lease regained is counted, and the beats
    say it, so the scheduler sends the ring again (``Membership.server_returned``)."""
    clock = _Clock()
    lease = Lease(4.0, clock=clock)
    lease.granted(clock.t)  # the first grant is no return
    assert lease.regained == 0
    beat = lease.beat()
    clock.t += 1.0
    lease.answered(beat)  # renewed in time: nothing to say
    assert lease.regained == 0
    lost = lease.beat()  # its answer is lost ...
    clock.t += 5.0  # ... and the lease runs out
    late = lease.beat()
    clock.t += 0.1
    lease.answered(lost)  # an answer too old to grant a lease: not back yet
    assert not lease.valid() and lease.regained == 0
    lease.answered(late)  # back
    assert lease.valid() and lease.regained == 1
