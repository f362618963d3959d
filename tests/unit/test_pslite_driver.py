"""bench/pslite/driver.py's logic, with no ps-lite built: where it looks for the driver, each
node's environment, what it reads of the driver's output, and the ratios it forms (issue 44.3)."""

import json
from pathlib import Path

import pytest
from scripts import load_script

driver = load_script("bench/pslite/driver.py", "pslite_driver")
PINNED, NotBuilt, PsliteError = driver.PINNED, driver.NotBuilt, driver.PsliteError
driver_args, driver_path, find_driver = driver.driver_args, driver.driver_path, driver.find_driver
node_env, parse_output, ratios = driver.node_env, driver.parse_output, driver.ratios


def test_the_driver_is_looked_for_where_build_sh_puts_it():
    assert driver_path({"HOME": "/h"}) == Path("/h/.cache/paramserver/pslite") / PINNED[:7] / "bin/pushpull"
    assert driver_path({"HOME": "/h", "XDG_CACHE_HOME": "/x"}) == Path("/x/paramserver/pslite/15b8adf/bin/pushpull")
    assert driver_path({"PSLITE_CACHE": "/c", "PSLITE_COMMIT": "abcdef0123"}) == Path("/c/abcdef0/bin/pushpull")
    assert driver_path({"PSLITE_DRIVER": "/d/pp", "PSLITE_CACHE": "/c"}) == Path("/d/pp")


def test_an_absent_driver_says_how_to_build_it(tmp_path):
    with pytest.raises(NotBuilt, match=r"not built: no driver at .*pushpull; build it with make pslite"):
        find_driver({"PSLITE_CACHE": str(tmp_path)})
    exe = tmp_path / "pp"
    exe.write_text("#!/bin/sh\n")
    with pytest.raises(NotBuilt):  # there, but not executable
        find_driver({"PSLITE_DRIVER": str(exe)})
    exe.chmod(0o755)
    assert find_driver({"PSLITE_DRIVER": str(exe)}) == exe


def test_each_node_gets_one_server_one_worker_on_loopback_and_no_inherited_ps_lite_variables():
    base = {"PATH": "/bin", "DMLC_NUM_SERVER": "4", "DMLC_INTERFACE": "eth0", "PS_VERBOSE": "2"}
    env = node_env("server", 4242, base)
    assert env == {"PATH": "/bin", "DMLC_ROLE": "server", "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "1",
                   "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "4242", "DMLC_NODE_HOST": "127.0.0.1"}
    assert base["DMLC_NUM_SERVER"] == "4"  # the caller's mapping is left as it was
    with pytest.raises(ValueError, match="scheduler, server or worker, not 'master'"):
        node_env("master", 1, base)


def test_driver_args_carry_the_same_budget_as_ours_and_refuse_nonsense():
    assert driver_args([1_000, 100_000], 2e7, 10, window=2) == [
        "--batches", "1000,100000", "--min-keys", "20000000.0", "--max-s", "10.0", "--window", "2", "--seed", "0"]
    with pytest.raises(ValueError, match="positive key counts"):
        driver_args([0], 1, 1)
    with pytest.raises(ValueError, match="at least 1 request in flight"):
        driver_args([10], 1, 1, window=0)


def _row(op="pull", batch=1000, kps=5e6):
    return {"op": op, "batch": batch, "keys": batch, "dim": 1, "servers": 1, "requests": 10, "seconds": 0.2,
            "keys_per_s": kps}


def test_the_last_json_line_is_read_and_its_rows_checked():
    good = {"server": "ps-lite", "pslite_commit": "15b8adf", "rows": [_row(), _row("push")]}
    text = "[12:00:00] some ps-lite log\n" + json.dumps(good) + "\n"
    assert parse_output(text) == good
    with pytest.raises(PsliteError, match="printed no JSON object"):
        parse_output("Segmentation fault\n")
    with pytest.raises(PsliteError, match="not JSON"):
        parse_output('{"rows": [\n')
    with pytest.raises(PsliteError, match="printed no rows"):
        parse_output(json.dumps({"rows": []}))
    bad = _row()
    del bad["keys_per_s"]
    with pytest.raises(PsliteError, match=r"without \['keys_per_s'\]"):
        parse_output(json.dumps({"rows": [bad]}))
    with pytest.raises(PsliteError, match="keys/s > 0"):
        parse_output(json.dumps({"rows": [_row(kps=0.0)]}))


def test_ratios_pair_each_direction_and_batch_and_skip_what_ps_lite_did_not_run():
    ours = [{"op": "pull", "keys": 1000, "dim": 1, "servers": 1, "replicas": 1, "keys_per_s": 1e7},
            {"op": "push", "keys": 1000, "dim": 1, "servers": 1, "replicas": 1, "keys_per_s": 3e6},
            {"op": "pull", "keys": 1000, "dim": 16, "servers": 1, "replicas": 1, "keys_per_s": 2e6},  # dim 16
            {"op": "pull", "keys": 1000, "dim": 1, "servers": 2, "replicas": 1, "keys_per_s": 2e7},  # 2 servers
            {"op": "pull", "keys": 5000, "dim": 1, "servers": 1, "replicas": 1, "keys_per_s": 2e7}]  # no peer row
    peer = [_row("pull", 1000, 5e6), _row("push", 1000, 6e6)]
    assert ratios(ours, peer) == [
        {"op": "pull", "keys": 1000, "paramserver_keys_per_s": 1e7, "pslite_keys_per_s": 5e6, "ratio": 2.0},
        {"op": "push", "keys": 1000, "paramserver_keys_per_s": 3e6, "pslite_keys_per_s": 6e6, "ratio": 0.5}]
