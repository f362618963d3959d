"""Issue 43's messages, as a user meets them on real commands: another cluster's key refused
in seconds with the file named (20), a resume with other settings refused flag by flag with
a command line that resumes (21), the report's storage and bytes a key (22)."""

import json
import os
import shlex
import subprocess
import sys
import time

import pytest

from paramserver import LocalCluster
from paramserver.apps.ctr.synth import write_synth
from paramserver.wire.security import keygen


def cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "paramserver", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "CI": "1"})


def _one_line_error(proc):
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    lines = [line for line in proc.stderr.splitlines() if " WARNING " not in line and " INFO " not in line]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return lines[0]


# ---- 20: another cluster's key ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def keyed_cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("keys")
    ours, other = str(tmp / "cluster.key"), str(tmp / "other.key")
    keygen(ours)
    keygen(other)
    with LocalCluster(servers=1, secret_file=ours, log_level="WARNING") as cluster:
        cluster.client.create_table("t", lifecycle="track")
        yield cluster, other, tmp


@pytest.mark.parametrize("command", [["export", "--table", "t", "--out", "{tmp}/out"], ["cluster", "status"],
                                     ["server"]])
def test_another_clusters_key_is_refused_in_seconds_naming_the_file_and_the_fix(keyed_cluster, command):
    cluster, other, tmp = keyed_cluster
    started = time.monotonic()
    proc = cli(*[a.replace("{tmp}", str(tmp)) for a in command], "--scheduler", cluster.address,
               "--secret-file", other, timeout=60)
    took = time.monotonic() - started
    said = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
    assert proc.returncode != 0, proc.stderr[-3000:]
    assert f"did not accept the key of --secret-file {other}" in said, proc.stderr[-3000:]
    assert "the key file the cluster was started with" in said and "is it running" not in said
    assert took < 15, took  # once 30 s (the connect timeout), then a question about the scheduler
    assert not os.path.exists(tmp / "out")


def test_a_key_given_to_a_cluster_without_keys_is_said_so(cluster, tmp_path):
    key = str(tmp_path / "stray.key")
    keygen(key)
    started = time.monotonic()
    said = _one_line_error(cli("cluster", "status", "--scheduler", cluster.address, "--secret-file", key, timeout=60))
    assert f"runs without keys (it does not speak CurveZMQ), but this driver has --secret-file {key}" in said
    assert time.monotonic() - started < 15


# ---- 21 and 22: a job on fp16 rows, its report, and a resume with another --storage ---------------------
def test_storage_is_reported_and_a_resume_with_another_is_refused_with_the_command_that_resumes(tmp_path):
    data, ckpt, metrics = str(tmp_path / "rows.tsv"), str(tmp_path / "ckpt"), str(tmp_path / "m.json")
    write_synth(data, 4000, seed=5)
    first = cli("train", "--data", data, "--storage", "fp16", "--table-layout", "hash", "--checkpoint-dir", ckpt,
                "--metrics-out", metrics, "--servers", "1", "--workers", "1")
    assert first.returncode == 0, first.stderr[-3000:]
    report = json.load(open(metrics))
    assert report["storage"] == "fp16" and report["keys"] > 0 and 0 < report["bytes_per_key"] < 100, report
    assert "fp16 rows" in first.stdout and "bytes a key" in first.stdout, first.stdout
    # resumed with the default storage (float32): refused, the flag named with both values, and a fix
    said = _one_line_error(cli("train", "--data", data, "--table-layout", "hash", "--resume", ckpt,
                               "--epochs", "2", "--servers", "1", "--workers", "1", "--quiet"))
    assert "--storage: the checkpoint has fp16, this command asks float32" in said, said
    assert "{" not in said, said  # no table dicts
    fix = said.split("resume with the checkpoint's settings: ", 1)[1]
    words = shlex.split(fix)
    assert words[0] == "paramserver" and words[-2:] == ["--storage", "fp16"], words
    resumed = cli(*words[1:])  # the fix, as given, resumes
    assert resumed.returncode == 0, resumed.stderr[-3000:]
