"""Configuration precedence and validation."""

import pytest

from paramserver import ConfigError
from paramserver.config import load_config


def test_env_overrides_defaults_and_arguments_override_env(monkeypatch):
    monkeypatch.setenv("PARAMSERVER_SCHEDULER", "tcp://10.0.0.1:7000")
    monkeypatch.setenv("PARAMSERVER_HEARTBEAT_INTERVAL_S", "0.25")
    cfg = load_config(heartbeat_interval_s=None, connect_timeout_s=3)
    assert cfg.scheduler == "tcp://10.0.0.1:7000"
    assert cfg.heartbeat_interval_s == 0.25 and cfg.connect_timeout_s == 3
    assert load_config(scheduler="tcp://127.0.0.1:1").scheduler == "tcp://127.0.0.1:1"


@pytest.mark.parametrize("env,value,match", [
    ("PARAMSERVER_PORT", "seven", "not a valid int"),
    ("PARAMSERVER_PORT", "70000", "port must be <= 65535"),
    ("PARAMSERVER_HEARTBEAT_TIMEOUT_S", "0.5", "must exceed heartbeat_interval_s"),
    ("PARAMSERVER_SCHEDULER", "localhost:7000", "tcp://HOST:PORT"),
])
def test_bad_values_name_the_rule(monkeypatch, env, value, match):
    monkeypatch.setenv(env, value)
    with pytest.raises(ConfigError, match=match):
        load_config()
