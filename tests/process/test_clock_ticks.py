"""A worker's finished clock rides on its next pull or push to a server, in place of a
clock message of its own (a third of a training job's requests); one no request carries
goes on its own after ``TICK_RIDE_S``, or at once before a barrier."""

import time

import numpy as np
from support import wait_for

from paramserver import ConfigError, LocalCluster
from paramserver.client.sync_calls import TICK_RIDE_S

KEYS = np.arange(8, dtype=np.uint64)


def clock_messages(client) -> int:
    """Clock messages every server handled (the latency histogram's count for op clock)."""
    return int(sum(value for server in client.stats.server_stats(samples=True) for family in server["samples"]
                   for name, labels, value in family[3]
                   if name == "paramserver_request_seconds_count" and labels.get("op") == "clock"))


def steps(client, rounds):
    for _ in range(rounds):
        client.pull("t", KEYS).result(timeout=30)
        client.push("t", KEYS, np.ones((KEYS.size, 1), np.float32)).result(timeout=30)
        client.clock()
    return client.current_clock


def test_a_clock_rides_on_the_next_pull_and_no_clock_message_is_sent():
    with LocalCluster(servers=2, workers=1, log_level="WARNING") as cluster:
        cluster.client.create_table("t", optimizer={"name": "sgd", "lr": 1.0}, consistency="ssp:1")
        [clock] = cluster.run(steps, 40, timeout_s=60)
        assert clock == 40
        # every server hears every clock: 39 on the next pulls, the last on its own (no request follows it)
        wait_for(lambda: all(max(s["clocks"].values(), default=0) == 40 for s in cluster.client.stats.server_stats()),
                 timeout_s=10, what="the last clock at every server")
        sent = clock_messages(cluster.client)
    assert sent <= 2, f"{sent} clock messages for 40 clocks on 2 servers: the ticks did not ride on the pulls"


def straggler_then_idle(client):
    """Rank 1 finishes clock 1 and then makes no request for a while: its tick must reach
    the servers on its own, or rank 0's pull at clock 1 (SSP 0) would wait for ever."""
    if client.rank == 1:
        client.pull("t", KEYS).result(timeout=30)
        client.clock()
        time.sleep(3.0)  # no request follows: the tick goes after TICK_RIDE_S
        return None
    client.clock()
    t0 = time.monotonic()
    client.pull("t", KEYS).result(timeout=30)  # parked until rank 1's clock 1 is heard
    return time.monotonic() - t0


def test_a_clock_no_request_carries_goes_on_its_own():
    with LocalCluster(servers=1, workers=2, log_level="WARNING") as cluster:
        cluster.client.create_table("t", optimizer={"name": "sgd", "lr": 1.0}, consistency="ssp:0")
        waited = [w for w in cluster.run(straggler_then_idle, timeout_s=60) if w is not None]
    assert len(waited) == 1
    assert waited[0] < 2.0, f"rank 0's pull waited {waited[0]:.2f} s: rank 1's tick waited for its next request"
    assert TICK_RIDE_S < 0.5


def tick_in_flight_at_return(client):
    """The timer sends the last clock's ticks on their own, and they are slow to arrive: the
    first server's after 0.2 s in the timer's own thread, the second's 1 s after that.  The
    worker returns meanwhile (once the timer took the ticks, before it sent the second).
    ``cluster.run`` must not say it is done (and the driver read the model) before both
    servers have taken that clock."""
    import threading
    import time

    import paramserver.client.sync_calls as sync_calls

    real = sync_calls.send_tick
    sent = []

    def slow(port, address, header, on_done, on_ring):
        sent.append(address)
        if len(sent) == 1:
            time.sleep(0.2)
            real(port, address, header, on_done, on_ring)
        else:
            threading.Timer(1.0, real, (port, address, header, on_done, on_ring)).start()

    sync_calls.send_tick = slow
    client.push("b", KEYS, np.ones((KEYS.size, 1), np.float32)).result(timeout=30)  # held for the clock (BSP)
    client.clock()
    wait_for(lambda: not client._state.ticks, timeout_s=10, what="the timer taking the ticks")
    return True


def test_a_worker_is_done_only_once_its_last_clock_is_taken_even_sent_by_the_timer():
    with LocalCluster(servers=2, workers=1, log_level="WARNING") as cluster:
        cluster.client.create_table("b", optimizer={"name": "sgd", "lr": 1.0}, consistency="bsp", aggregate=True)
        assert cluster.run(tick_in_flight_at_return, timeout_s=60) == [True]
        rows = cluster.client.pull("b", KEYS).result(timeout=30)  # a driver's read: not gated
    np.testing.assert_array_equal(rows, -np.ones((KEYS.size, 1), np.float32))  # the clock's sum, applied


def steps_of_three(client, rounds):
    """A step of three batches finishes their three clocks at once (``clock(3)``)."""
    for _ in range(rounds):
        client.pull("t", KEYS).result(timeout=30)
        client.push("t", KEYS, np.ones((KEYS.size, 1), np.float32)).result(timeout=30)
        client.clock(3)
    refused = []
    for bad in (0, -1, True, 1.5):
        try:
            client.clock(bad)
        except ConfigError as exc:
            refused.append(str(exc))
    return client.current_clock, refused


def test_clocks_finished_together_count_each_and_reach_every_server():
    with LocalCluster(servers=2, workers=1, log_level="WARNING") as cluster:
        cluster.client.create_table("t", optimizer={"name": "sgd", "lr": 1.0}, consistency="ssp:1")
        [(clock, refused)] = cluster.run(steps_of_three, 10, timeout_s=60)
        assert clock == 30
        assert len(refused) == 4 and all("clocks must be an int of 1 or more" in r for r in refused)
        wait_for(lambda: all(max(s["clocks"].values(), default=0) == 30 for s in cluster.client.stats.server_stats()),
                 timeout_s=10, what="the last clock at every server")
