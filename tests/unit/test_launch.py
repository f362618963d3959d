"""``--cluster``: which launcher starts a command's cluster, and what a bad value says."""

from __future__ import annotations

import argparse
import inspect

import pytest

from paramserver.cli.main import main
from paramserver.cli.running import cluster_options
from paramserver.cluster.launch import open_cluster, parse_cluster
from paramserver.cluster.local import LocalCluster
from paramserver.cluster.protocol import Cluster
from paramserver.errors import ConfigError


@pytest.mark.parametrize("value, expected", [
    ("local", ("local", None)), ("ray", ("ray", None)), ("ray:auto", ("ray", "auto")),
    ("ray:ray://head:10001", ("ray", "ray://head:10001")), ("ray:10.0.0.1:6379", ("ray", "10.0.0.1:6379")),
    ("tcp://10.0.0.1:7000", ("running", "tcp://10.0.0.1:7000")), ("tcp://sched.example:1", ("running", "tcp://sched.example:1")),
])
def test_cluster_values_parse(value, expected):
    assert parse_cluster(value) == expected


@pytest.mark.parametrize("value", ["yarn", "ray:", "local:x", "", "RAY"])
def test_a_bad_cluster_value_is_named_with_the_fix(value):
    with pytest.raises(ConfigError, match=r"must be local, ray, ray:ADDRESS .* or tcp://HOST:PORT"):
        parse_cluster(value)


@pytest.mark.parametrize("value", ["tcp://", "tcp://host", "tcp://host:", "tcp://:7000", "tcp://h:70000", "tcp://h:x"])
def test_a_running_clusters_address_must_be_host_and_port(value):
    with pytest.raises(ConfigError, match=r"tcp://HOST:PORT \(the address `paramserver scheduler` prints\)"):
        parse_cluster(value)


def test_a_running_cluster_is_joined_not_started():
    """``--cluster tcp://...``: the job's workers start here; the servers are the cluster's."""
    from paramserver.cluster.standing import StandingCluster

    cluster = open_cluster(servers=3, workers=2, cluster="tcp://127.0.0.1:7000", log_level="WARNING")
    assert isinstance(cluster, StandingCluster)
    assert (cluster.address, cluster.n_workers) == ("tcp://127.0.0.1:7000", 2)
    with pytest.raises(ConfigError, match="paramserver cluster add-server --scheduler tcp://127.0.0.1:7000"):
        cluster.add_server()


def test_a_running_cluster_takes_the_secret_file_but_not_what_its_servers_own(tmp_path):
    from paramserver.wire.security import keygen

    keys = tmp_path / "cluster.keys"
    keygen(str(keys))
    ns = argparse.Namespace(cluster="tcp://10.0.0.1:7000", secret_file=str(keys))
    assert cluster_options(ns) == {"cluster": "tcp://10.0.0.1:7000", "secret_file": str(keys)}
    with pytest.raises(ConfigError, match="PARAMSERVER_COLD_DIR"):
        cluster_options(argparse.Namespace(cluster="tcp://10.0.0.1:7000", cold_dir=str(tmp_path)))
    worker_keys = tmp_path / "worker.keys"
    keygen(str(worker_keys), role="worker", base=str(keys))
    from paramserver.cluster.standing import StandingCluster

    with pytest.raises(ConfigError, match="is a worker key file: a job's driver creates tables"):
        StandingCluster("tcp://10.0.0.1:7000", workers=1, secret_file=str(worker_keys))


def test_local_is_the_default_launcher():
    cluster = open_cluster(servers=2, workers=1, log_level="WARNING")
    assert isinstance(cluster, LocalCluster) and (cluster.n_servers, cluster.n_workers) == (2, 1)


@pytest.mark.parametrize("command", [["train", "--data", "x.tsv"], ["mf", "--data", "x"], ["lda", "--data", "x"],
                                     ["lasso", "--data", "x", "--lambda", "1"]])
def test_every_cluster_command_refuses_a_bad_launcher_before_reading_data(command, capsys):
    assert main([*command, "--cluster", "mesos"]) == 2
    err = capsys.readouterr().err
    assert "--cluster 'mesos'" in err and "ray:auto" in err


def test_ray_cluster_options_are_checked_before_ray_starts():
    ray_module = pytest.importorskip("paramserver.ray", reason="the ray extra is not installed")
    with pytest.raises(ConfigError, match="strategy must be one of"):
        ray_module.RayCluster(servers=1, strategy="RANDOM")
    with pytest.raises(ConfigError, match="per role"):
        ray_module.RayCluster(servers=1, resources={"ps": {"num_cpus": 1}})
    with pytest.raises(ConfigError, match="not Ray actor resources"):
        ray_module.RayCluster(servers=1, resources={"server": {"cpus": 1}})
    with pytest.raises(ValueError, match="servers must be"):
        ray_module.RayCluster(servers=0)


def test_both_launchers_spell_every_cluster_method_alike():
    """Issue 29: one ``Cluster`` protocol, so a job runs on either launcher; ``kill(name, sig)``
    takes a signal under Ray too (mypy checks the types: ``launch.open_cluster``)."""
    ray_module = pytest.importorskip("paramserver.ray", reason="the ray extra is not installed")
    for name in ("start", "stop", "run", "run_elastic", "add_worker", "add_server", "remove_server", "kill",
                 "__exit__"):
        want = inspect.signature(getattr(Cluster, name))
        assert inspect.signature(getattr(LocalCluster, name)) == want, name
        assert inspect.signature(getattr(ray_module.RayCluster, name)) == want, name


def test_a_stopped_launchers_client_is_a_clear_error_whichever_launcher():
    """``client`` is the launchers' one property (``cluster/runs.py``): once stopped, it says so."""
    from paramserver.cluster.runs import RunsFunctions
    from paramserver.errors import ClosedError

    class Stopped(RunsFunctions):
        _client, _closed = None, True

    with pytest.raises(ClosedError, match="the cluster is stopped"):
        _ = Stopped().client


def test_cold_dir_goes_to_a_local_clusters_servers_and_a_bad_one_is_refused_before_any_data(tmp_path, capsys):
    cold = tmp_path / "cold"
    options = cluster_options(argparse.Namespace(cluster="local", cold_dir=str(cold)))
    assert options == {"cold_dir": str(cold)} and cold.is_dir()
    cluster = open_cluster(servers=1, workers=0, log_level="WARNING", **options)
    assert isinstance(cluster, LocalCluster) and cluster._env()["PARAMSERVER_COLD_DIR"] == str(cold)
    with pytest.raises(ConfigError, match="give the nodes PARAMSERVER_COLD_DIR"):
        cluster_options(argparse.Namespace(cluster="ray", cold_dir=str(cold)))
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert main(["train", "--data", "x.tsv", "--table-memory", "1M", "--cold-dir", str(blocked / "sub")]) == 2
    err = capsys.readouterr().err
    assert "cannot be created" in err and "--cold-dir" in err, err


def test_more_local_nodes_than_free_memory_holds_are_refused_before_any_starts(monkeypatch):
    """``--workers 100000`` forked until the machine ran out of memory, the command silent."""
    from paramserver.cluster import process

    monkeypatch.setattr(process, "available_memory", lambda: 1 << 30)  # 1 GiB free: 31 nodes of 32 MiB
    with pytest.raises(ConfigError, match=r"1 server\(s\) and 31 worker\(s\) on this machine: each node is a "
                                          r"process of 32 MiB at the least, 1.0 GiB together, and 1.0 GiB are "
                                          r"free; start fewer \(--workers, --servers\)"):
        LocalCluster(servers=1, workers=31)
    process.check_room(1, 30)  # 32 nodes of 32 MiB: 1 GiB exactly, room for them
    monkeypatch.setattr(process, "available_memory", lambda: 0)  # unknown: nothing refused
    process.check_room(1, 10 ** 6)
