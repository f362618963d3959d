"""The simulated cluster and its fault-injection campaign (issue 13): the campaign passes
on the real code, fails on each mutation, and a seed replays bit for bit."""

from __future__ import annotations

import logging

import pytest

from paramserver.errors import ConfigError
from paramserver.testing.campaign import SCENARIO_NAMES
from paramserver.testing.chaos import SCENARIOS, run
from paramserver.testing.mutations import MUTATIONS, mutated
from paramserver.testing.sim import Faults, SimNetwork
from paramserver.wire.transport import ZmqTransport, scheme_of, transport_for


@pytest.fixture(autouse=True)
def quiet():
    logging.disable(logging.CRITICAL)
    yield
    logging.disable(logging.NOTSET)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_scenario_runs_clean_on_the_real_code(scenario):
    for seed in range(3):
        r = run(scenario, seed)
        assert r.calls > 20, f"{scenario} seed {seed} did almost nothing ({r.calls} calls)"
        assert not r.violations, f"{scenario} seed {seed}: {[v.line() for v in r.violations]}"


# where each mutation shows: the scenarios whose faults it matters under
CATCHERS = {"no-dedup": "counters-r2", "ack-before-backups": "partition", "ignore-ring-version": "membership",
            "no-staleness-gate": "ssp", "no-lease": "counters-r2", "restore-unheld": "restore",
            "write-off-last-copy": "repair-pause", "rejoin-at-the-minimum": "job-ssp",
            "client-retry-fresh-seq": "counters-r1", "client-forgets-in-flight": "ssp",
            "client-ignores-cache-miss": "filters", "evict-on-primary-only": "lifecycle",
            "cache-reads-past-bound": "row-cache", "forwards-wait-forever": "lossy-peers",
            "dead-together": "scheduler-cut", "trust-silent-copies": "pause-crash",
            "accept-stale-forwards": "zombie-forwards", "count-unconfirmed-copies": "pause-crash"}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_each_mutation_is_caught(mutation):
    """A campaign that cannot fail checks nothing: with one safety mechanism off, some of
    the first 25 seeds of the scenario that exercises it report a violation."""
    for seed in range(25):
        if run(CATCHERS[mutation], seed, mutation).violations:
            return
    pytest.fail(f"mutation {mutation} went unnoticed in 25 seeds of {CATCHERS[mutation]}")


def test_mutations_are_undone_after_the_run():
    from paramserver.server.dedup import Dedup

    fresh = Dedup.fresh
    with mutated("no-dedup"):
        assert Dedup.fresh is not fresh
    assert Dedup.fresh is fresh
    with pytest.raises(ConfigError, match="known: no-dedup"):
        with mutated("nonsense"):
            pass


def test_a_replayed_seed_gives_the_same_trace():
    a = run("partition", 5, trace=True)
    b = run("partition", 5, trace=True)
    assert a.trace and len(a.trace) > 1000
    assert a.trace == b.trace
    assert run("partition", 6, trace=True).trace != a.trace


def test_a_violation_names_its_replay_command(capsys):
    from paramserver.testing import campaign

    parser = __import__("argparse").ArgumentParser()
    campaign.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["chaos", "--seed", "0", "--scenario", "ssp", "--mutate", "no-staleness-gate",
                              "--json", "--jobs", "1"])
    import os
    os.environ["PYTHONHASHSEED"] = "0"  # no re-exec inside the test process
    try:
        assert campaign.main(args) == 1
    finally:
        del os.environ["PYTHONHASHSEED"]
    report = __import__("json").loads(capsys.readouterr().out)
    assert report["runs"] == 1 and report["violations"]
    v = report["violations"][0]
    assert v["kind"] == "stale-read" and v["seed"] == 0
    assert v["replay"] == "paramserver chaos --seed 0 --scenario ssp --trace --mutate no-staleness-gate"


def test_the_scenario_list_for_help_is_the_real_one():
    assert sorted(SCENARIO_NAMES) == sorted(SCENARIOS)


def test_addresses_name_the_known_schemes():
    assert scheme_of("tcp://h:1") == "tcp" and scheme_of("sim://server-1") == "sim"
    with pytest.raises(ConfigError, match="unknown transport scheme 'udp'; known: tcp://, ipc://, inproc://, sim://"):
        scheme_of("udp://h:1")
    with pytest.raises(ConfigError, match="has no scheme"):
        scheme_of("h:1")
    assert isinstance(transport_for("ipc:///tmp/x"), ZmqTransport)
    with pytest.raises(ConfigError, match="only paramserver.testing"):
        transport_for("sim://scheduler")
    from paramserver.errors import ProtocolError  # a registering server's address: what its transport reaches
    with pytest.raises(ProtocolError, match="is not tcp://HOST:PORT"):
        ZmqTransport().check("sim://server-1")
    with pytest.raises(ProtocolError, match="is not a simulated one"):
        SimNetwork(0).host("scheduler").transport().check("tcp://127.0.0.1:7000")


def test_the_network_keeps_a_connections_order_and_drops_what_a_cut_link_carries():
    net = SimNetwork(1, Faults(latency_s=(0.001, 0.05)))
    a, b = net.host("a"), net.host("b")
    listener, address = b.transport().bind("", 0, 1 << 20)
    sock = a.transport().connect(address, 1 << 20)
    for i in range(50):
        sock.send([bytes([i])])
    net.run_until(1.0)
    got = [listener.recv()[1][0] for _ in range(50)]
    assert got == list(range(50)) and not listener.poll(0)
    net.faults.cut.add(("a", "b"))
    sock.send([b"x"])
    net.run_until(2.0)
    assert not listener.poll(0)
    b.pause()
    net.faults.cut.clear()
    sock.send([b"y"])
    net.run_until(3.0)
    assert not listener.poll(0)  # a paused process reads nothing ...
    b.resume()
    assert listener.recv()[1] == b"y"  # ... and finds it queued when it resumes


@pytest.mark.parametrize("scenario,seed,bug", [
    ("membership", 491, "a join's re-broadcast ring reached the joiner after a vnode copy (from another server) "
                        "did, and dropped it: the flip then started the vnode empty, losing acknowledged pushes"),
    ("membership", 55, "both replicas of a vnode died before the repair copied it, and no loss was reported "
                       "(losses named only replicas=1 tables)"),
    ("restore", 5, "a server joined while a client restored a table: it was sent copies taken before their "
                   "sources had loaded, and the restored rows were lost without a word (the scheduler now runs "
                   "restores, holding joins, and loads again after a ring change)"),
    ("restore", 13, "the same race, the joiner a backup of the vnodes it got empty"),
    ("restore", 256, "a push delivered twice, the second time after its table was dropped and created again: "
                     "the server had dropped the exactly-once record with the table, and applied it again"),
    ("restore", 1273, "a server died while a restore loaded: its fan-out ended, and the restore loaded again at "
                      "once, on a ring that still named the dead server; sending to it raised in the scheduler's "
                      "loop and the restore never returned (the ring is now updated first)"),
])
def test_regression_seeds(scenario, seed, bug):
    """Bugs the campaign found (issue 13), each kept as the seed that found it."""
    r = run(scenario, seed)
    assert not r.violations, f"{bug}: {[v.line() for v in r.violations]}"


def test_a_replay_prints_the_trace_up_to_the_failure(capsys, monkeypatch):
    from paramserver.testing import campaign

    parser = __import__("argparse").ArgumentParser()
    campaign.add_parser(parser.add_subparsers(dest="command"))
    monkeypatch.setenv("PYTHONHASHSEED", "0")  # no re-exec inside the test process
    args = parser.parse_args(["chaos", "--seed", "0", "--scenario", "ssp", "--mutate", "no-staleness-gate",
                              "--trace", "--jobs", "1"])
    assert campaign.main(args) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) > 100 and "VIOLATION stale-read" in lines[-1]
    assert sum("VIOLATION" in line for line in lines) == 1
