"""bench/pslite/driver.py's processes, with a stand-in for ps-lite's driver (a shell script, so no
ps-lite need be built): the three nodes run and their figures are read, a node that fails is
named with its stderr, and a driver that hangs is killed, its whole group, within the bound."""

import importlib.util
import json
import os
import time
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "pslite_driver", Path(__file__).resolve().parents[2] / "bench" / "pslite" / "driver.py")
assert _spec is not None and _spec.loader is not None
driver = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(driver)

ROW = {"op": "pull", "batch": 10, "keys": 10, "dim": 1, "servers": 1, "requests": 3, "seconds": 0.2,
       "keys_per_s": 150.0}


def fake_driver(tmp_path: Path, body: str) -> dict[str, str]:
    """An executable standing in for ps-lite's driver; each node writes its role's pid to tmp_path."""
    exe = tmp_path / "pushpull"
    exe.write_text(f'#!/bin/bash\necho $$ > "{tmp_path}/$DMLC_ROLE.pid"\n{body}\n')
    exe.chmod(0o755)
    return {**os.environ, "PSLITE_DRIVER": str(exe)}


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_the_worker_s_json_is_read_and_every_node_saw_one_server_one_worker_on_loopback(tmp_path):
    out = json.dumps({"pslite_commit": "15b8adf", "rows": [ROW, {**ROW, "op": "push"}]})
    env = fake_driver(tmp_path, f"""
echo "$DMLC_NUM_SERVER $DMLC_NUM_WORKER $DMLC_PS_ROOT_URI $DMLC_NODE_HOST $*" > "{tmp_path}/$DMLC_ROLE.env"
[ "$DMLC_ROLE" = worker ] && echo '{out}'
exit 0""")
    rows = driver.run([10], min_keys=30, max_s=0.5, environ=env)
    assert [(r["op"], r["keys_per_s"], r["system"], r["pslite_commit"]) for r in rows] == [
        ("pull", 150.0, "ps-lite", "15b8adf"), ("push", 150.0, "ps-lite", "15b8adf")]
    for role in ("scheduler", "server", "worker"):
        seen = (tmp_path / f"{role}.env").read_text().split()
        assert seen[:4] == ["1", "1", "127.0.0.1", "127.0.0.1"]
        assert seen[4:] == ["--batches", "10", "--min-keys", "30.0", "--max-s", "0.5", "--window", "1", "--seed", "0"]


def test_a_node_that_fails_is_named_with_its_stderr(tmp_path):
    env = fake_driver(tmp_path, """
if [ "$DMLC_ROLE" = server ]; then echo "Check failed: bind" >&2; exit 3; fi
exit 0""")
    with pytest.raises(driver.PsliteError, match=r"server exited 3(.|\n)*Check failed: bind"):
        driver.run([10], min_keys=30, max_s=0.5, environ=env)


def test_a_driver_that_hangs_is_killed_with_all_it_started_within_the_bound(tmp_path):
    env = fake_driver(tmp_path, f"""
sleep 60 & echo $! > "{tmp_path}/$DMLC_ROLE.child.pid"
wait""")
    t0 = time.monotonic()
    with pytest.raises(driver.PsliteError, match="ran past its 2 s bound"):
        driver.run([10], min_keys=30, max_s=0.5, timeout_s=2.0, environ=env)
    assert time.monotonic() - t0 < 10
    pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
    assert len(pids) == 6  # three nodes and the child each started
    deadline = time.monotonic() + 10  # an orphaned child is reaped by init, a moment later
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if alive(p)]
