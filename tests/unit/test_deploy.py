"""The environment contract a launcher starts a role with (docs/deploy.md, issue 17): the
``DMLC_*`` aliases of ps-lite, their precedence under ``PARAMSERVER_*`` and flags, the
errors for bad values; and the Kubernetes manifests, rendered and checked against that
contract (every variable they set is one paramserver reads, and each pod's environment
configures the role it runs to reach the scheduler's Service)."""

from __future__ import annotations

import os
import string

import pytest

from paramserver.config import DMLC_ENV, ENV, NODE_ENV, load_config, node_role
from paramserver.errors import ConfigError

yaml = pytest.importorskip("yaml")  # the dev extra installs it
MANIFEST = os.path.join(os.path.dirname(__file__), "..", "..", "deploy", "kubernetes", "paramserver.yaml")
CONTRACT = set(ENV) | set(NODE_ENV) | set(DMLC_ENV) | {"PARAMSERVER_LOG_LEVEL"}


@pytest.fixture
def clean_env(monkeypatch):
    for var in CONTRACT:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_dmlc_variables_configure_each_role(clean_env):
    for var, value in {"DMLC_PS_ROOT_URI": "ps-scheduler", "DMLC_PS_ROOT_PORT": "7000", "DMLC_NUM_SERVER": "3",
                       "DMLC_NUM_WORKER": "5"}.items():
        clean_env.setenv(var, value)
    scheduler = load_config("scheduler")
    assert (scheduler.port, scheduler.host, scheduler.servers, scheduler.workers) == (7000, "0.0.0.0", 3, 5)
    server = load_config("server")
    assert (server.scheduler, server.host, server.servers) == ("tcp://ps-scheduler:7000", "0.0.0.0", 3)
    worker = load_config("worker")
    assert (worker.scheduler, worker.host, worker.workers) == ("tcp://ps-scheduler:7000", "127.0.0.1", 5)


def test_paramserver_variables_win_over_dmlc_ones_and_flags_over_both(clean_env):
    for var, value in {"DMLC_PS_ROOT_URI": "a", "DMLC_PS_ROOT_PORT": "7000", "DMLC_NUM_WORKER": "5",
                       "PARAMSERVER_NUM_WORKERS": "2", "PARAMSERVER_SCHEDULER": "tcp://b:9",
                       "PARAMSERVER_HOST": "127.0.0.1"}.items():
        clean_env.setenv(var, value)
    config = load_config("server")
    assert (config.scheduler, config.workers, config.host) == ("tcp://b:9", 2, "127.0.0.1")
    assert load_config("server", workers=7, scheduler="tcp://c:1").workers == 7


def test_the_role_comes_from_the_flag_then_paramserver_then_dmlc(clean_env):
    with pytest.raises(ConfigError, match="needs its role"):
        node_role(None)
    clean_env.setenv("DMLC_ROLE", "server")
    assert node_role(None) == "server"
    clean_env.setenv("PARAMSERVER_ROLE", "worker")
    assert node_role(None) == "worker" and node_role("scheduler") == "scheduler"
    clean_env.setenv("PARAMSERVER_ROLE", "ps")
    with pytest.raises(ConfigError, match="PARAMSERVER_ROLE='ps' is not a role: use scheduler, server or worker"):
        node_role(None)


@pytest.mark.parametrize("env,message", [
    ({"DMLC_PS_ROOT_URI": "h"}, "DMLC_PS_ROOT_URI and DMLC_PS_ROOT_PORT go together"),
    ({"DMLC_PS_ROOT_PORT": "7000"}, "DMLC_PS_ROOT_URI and DMLC_PS_ROOT_PORT go together"),
    ({"DMLC_PS_ROOT_URI": "h", "DMLC_PS_ROOT_PORT": "x"}, "DMLC_PS_ROOT_PORT='x' is not a whole number"),
    ({"DMLC_NUM_SERVER": "two"}, "DMLC_NUM_SERVER='two' is not a whole number"),
    ({"DMLC_NUM_WORKER": "-1"}, "workers must be an int >= 0, got -1"),
])
def test_bad_dmlc_values_are_named(clean_env, env, message):
    for var, value in env.items():
        clean_env.setenv(var, value)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        load_config("worker")


def _render(**values):
    with open(MANIFEST) as f:
        text = string.Template(f.read()).substitute(values)  # every placeholder must be given
    return [doc for doc in yaml.safe_load_all(text) if doc]


def test_the_manifests_render_into_a_cluster_that_meets_the_contract(clean_env):
    values = {"NAME": "ctr", "IMAGE": "registry.example/paramserver:0.1", "PORT": "7123", "SERVERS": "3",
              "WORKERS": "4", "FN": "mypackage.train:main"}
    docs = _render(**values)
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    assert set(by) == {("Service", "ctr-scheduler"), ("Job", "ctr-scheduler"), ("Service", "ctr-servers"),
                       ("StatefulSet", "ctr-server"), ("Job", "ctr-worker")}
    service = by[("Service", "ctr-scheduler")]
    assert service["spec"]["ports"][0]["port"] == 7123 and service["spec"]["selector"]["role"] == "scheduler"
    assert by[("StatefulSet", "ctr-server")]["spec"]["replicas"] == 3
    assert by[("StatefulSet", "ctr-server")]["spec"]["serviceName"] == "ctr-servers"
    workers = by[("Job", "ctr-worker")]["spec"]
    assert workers["parallelism"] == workers["completions"] == 4
    roles = {}
    for kind, name in (("Job", "ctr-scheduler"), ("StatefulSet", "ctr-server"), ("Job", "ctr-worker")):
        pod = by[(kind, name)]["spec"]["template"]
        (container,) = pod["spec"]["containers"]
        assert container["command"] == ["paramserver", "node"] and container["image"] == values["IMAGE"]
        env = {e["name"]: e["value"] for e in container["env"]}
        assert all(isinstance(v, str) for v in env.values())  # Kubernetes takes strings only
        assert set(env) <= CONTRACT, set(env) - CONTRACT  # nothing paramserver would not read
        for var, value in env.items():  # the pod's environment, as the container sees it
            clean_env.setenv(var, value)
        role = node_role(None)
        assert pod["metadata"]["labels"]["role"] == role
        roles[role] = load_config(role)
        for var in env:
            clean_env.delenv(var)
    assert set(roles) == {"scheduler", "server", "worker"}
    assert roles["scheduler"].port == 7123 and roles["scheduler"].host == "0.0.0.0"
    assert roles["server"].scheduler == roles["worker"].scheduler == "tcp://ctr-scheduler:7123"
    assert roles["server"].host == "0.0.0.0"  # reachable from the other pods
    assert {c.servers for c in roles.values()} == {3} and {c.workers for c in roles.values()} == {4}
    worker_env = by[("Job", "ctr-worker")]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "PARAMSERVER_FN", "value": "mypackage.train:main"} in worker_env


def test_a_placeholder_left_unset_is_refused():
    with pytest.raises(KeyError, match="FN"):
        _render(NAME="x", IMAGE="i", PORT="1", SERVERS="1", WORKERS="1")


def test_the_deploy_guide_lists_every_variable_of_the_contract():
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "deploy.md")) as f:
        text = f.read()
    assert [v for v in sorted(CONTRACT) if f"`{v}`" not in text] == []
