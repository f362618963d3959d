"""A publication is trusted only whole (issue 43, items 1 and 8-11), with real processes:

* ``serve --follow`` meets a delta that does not fit its model (keys outside the hash
  space): it keeps serving the last whole model, says so, and follows the next base;
* a part path that leaves the folder, or a base's ``model.json`` edited, is refused by
  every reader (``serve``, ``eval``) with the file and the reason;
* an older ``PUBLISH.json`` does not roll the served model back;
* a delta token naming an epoch its server never reached is refused by ``export``, and
  one from another run of the servers gets a base: no key is left out.
"""

import json
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from serve_support import Served
from support import wait_for

from paramserver import LocalCluster
from paramserver.apps.ctr.synth import write_synth
from paramserver.checkpoint.publish import Publisher, load_table, read_index

ENV = {**os.environ, "CI": "1"}


def cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "paramserver", *args], capture_output=True, text=True,
                          timeout=timeout, env=ENV)


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """A folder ``train --publish`` wrote (a base and deltas), and the data it learnt."""
    root = tmp_path_factory.mktemp("published")
    data = root / "d.tsv"
    write_synth(str(data), 20_000, seed=1)
    out = cli("train", "--data", str(data), "--publish", str(root / "pub"), "--publish-every", "0.2",
              "--batch-size", "500", "--quiet")
    assert out.returncode == 0, out.stderr
    for step in range(2):  # deltas of the model's own shape after it (a short job's chain is often a base alone)
        _append_delta(root / "pub", np.arange(100 * step + 1, 100 * step + 51))
    kinds = [p["kind"] for p in read_index(str(root / "pub"))["parts"]]
    # a base first; the job itself may have published a delta after it, as timing has it
    assert kinds[0] == "base" and kinds[-2:] == ["delta", "delta"] and "base" not in kinds[1:], kinds
    return root


def _copy(published, tmp_path):
    shutil.copytree(published / "pub", tmp_path / "pub")
    return tmp_path / "pub"


def _append_delta(pub, keys):
    """A delta part of ``keys`` written after the folder's chain, as a publisher writes one."""
    index = read_index(str(pub))
    publisher = Publisher(str(pub), index["table"], lambda *a: None)
    delta = SimpleNamespace(base=False, keys=np.asarray(keys, np.uint64), values=np.ones((len(keys), 1), np.float32),
                            deleted=np.zeros(0, np.uint64), token=index.get("token") or "")
    return publisher.publish(delta)


def test_a_delta_that_does_not_fit_keeps_the_model_whole_and_the_follower_following(published, tmp_path):
    pub = _copy(published, tmp_path)
    last = read_index(str(pub))["parts"][-1]["path"]
    serve = Served("--follow", str(pub), "--poll", "0.1")
    try:
        wait_for(lambda: serve.version() == last, 30, f"serve to load {last}")
        assert serve.metric("paramserver_serve_follow_errors_total") == 0
        bad = _append_delta(pub, [5, 1 << 24, (1 << 24) + 7])  # outside the model's 2^24 buckets
        wait_for(lambda: (serve.metric("paramserver_serve_follow_errors_total") or 0) >= 2, 30,
                 "the follower to count the bad part, poll after poll")
        assert serve.version() == last  # the last whole model, not the bad part
        status, _, body = serve.get("/readyz")
        ready = json.loads(body)
        assert status == 200 and ready["status"] == "degraded" and "outside the model's hash space" in ready["reason"]
        assert serve.metric("paramserver_serve_follow_alive") == 1.0
        assert serve.metric("paramserver_serve_follow_failing") == 1.0
        # the loop lives: a new job's base (a fresh publisher starts with one) is followed
        again = cli("train", "--data", str(published / "d.tsv"), "--publish", str(pub), "--publish-every", "60",
                    "--batch-size", "500", "--quiet")
        assert again.returncode == 0, again.stderr
        newest = read_index(str(pub))["parts"][-1]
        assert newest["seq"] > bad["seq"] and read_index(str(pub))["parts"][0]["kind"] == "base"
        wait_for(lambda: serve.version() == newest["path"], 30, f"serve to follow on to {newest['path']}")
        assert json.loads(serve.get("/readyz")[2])["status"] == "ready"
    finally:
        err = serve.close()
    assert "Traceback" not in err, err
    assert f"key {(1 << 24) + 7} lies outside the model's hash space (2^24" in err, err


def test_a_part_path_outside_the_folder_is_refused_by_every_reader(published, tmp_path):
    pub = _copy(published, tmp_path)
    live = tmp_path / "live"
    index = read_index(str(pub))
    shutil.copytree(pub / index["parts"][0]["path"], live / index["parts"][0]["path"])
    index["parts"][0]["path"] = f"../live/{index['parts'][0]['path']}"
    (pub / "PUBLISH.json").write_text(json.dumps(index))
    scored = cli("eval", "--model", str(pub), "--data", str(published / "d.tsv"))
    assert scored.returncode != 0 and "one plain name inside the published folder" in scored.stderr, scored.stderr
    assert "../live/" in scored.stderr and "Traceback" not in scored.stderr
    once = subprocess.run([sys.executable, "-m", "paramserver", "serve", "--model", str(pub), "--port", "0"],
                          capture_output=True, text=True, timeout=60, env=ENV)
    assert once.returncode != 0 and "one plain name" in once.stderr, once.stderr
    serve = Served("--follow", str(pub), "--poll", "0.1")
    try:
        wait_for(lambda: (serve.metric("paramserver_serve_follow_errors_total") or 0) >= 1, 30,
                 "the follower to refuse the index")
        assert serve.version() in (None, "none") and serve.get("/readyz")[0] == 503
    finally:
        serve.close()


def test_an_edited_model_json_is_refused(published, tmp_path):
    pub = _copy(published, tmp_path)
    meta_file = pub / read_index(str(pub))["parts"][0]["path"] / "model.json"
    meta = json.loads(meta_file.read_text())
    assert meta["data"]["hash_bits"] == 24
    meta["data"]["hash_bits"] = 22
    meta_file.write_text(json.dumps(meta))
    scored = cli("eval", "--model", str(pub), "--data", str(published / "d.tsv"))
    assert scored.returncode != 0, scored.stdout
    assert "model.json does not match its sha256" in scored.stderr and "Traceback" not in scored.stderr
    once = subprocess.run([sys.executable, "-m", "paramserver", "serve", "--model", str(pub), "--port", "0"],
                          capture_output=True, text=True, timeout=60, env=ENV)
    assert once.returncode != 0 and "model.json does not match its sha256" in once.stderr, once.stderr


def test_an_older_index_does_not_roll_the_served_model_back(published, tmp_path):
    pub = _copy(published, tmp_path)
    index = read_index(str(pub))
    newest = index["parts"][-1]
    older = {**index, "parts": index["parts"][:2]}  # a stale copy of the index: the chain as it was earlier
    serve = Served("--follow", str(pub), "--poll", "0.1")
    try:
        wait_for(lambda: serve.version() == newest["path"], 30, f"serve to load {newest['path']}")
        (pub / "next.json").write_text(json.dumps(older))
        (pub / "next.json").replace(pub / "PUBLISH.json")
        wait_for(lambda: (serve.metric("paramserver_serve_follow_errors_total") or 0) >= 2, 30,
                 "the follower to refuse the older index")
        assert serve.version() == newest["path"]
        assert serve.metric("paramserver_serve_model_version") == newest["seq"]
    finally:
        err = serve.close()
    assert f"now ends at seq {index['parts'][1]['seq']}" in err and "--allow-rollback" in err, err
    (pub / "PUBLISH.json").write_text(json.dumps(index))
    back = Served("--follow", str(pub), "--poll", "0.1", "--allow-rollback")  # asked for: it follows the index back
    try:
        wait_for(lambda: back.version() == newest["path"], 30, f"serve to load {newest['path']}")
        (pub / "next.json").write_text(json.dumps(older))
        (pub / "next.json").replace(pub / "PUBLISH.json")
        wait_for(lambda: back.version() == index["parts"][1]["path"], 30, "serve to roll back, as allowed")
    finally:
        back.close()


def test_a_token_naming_an_epoch_never_reached_is_refused_and_another_runs_gets_a_base(tmp_path):
    out = str(tmp_path / "exported")
    with LocalCluster(servers=2) as c:
        client = c.client
        client.create_table("w", optimizer="adagrad", lifecycle="track")
        client.push("w", np.arange(1, 301, dtype=np.uint64), np.ones(300, np.float32)).result()
        first = cli("export", "--scheduler", c.address, "--table", "w", "--out", out, "--delta")
        assert first.returncode == 0 and "a base of 300 keys" in first.stdout, first.stderr
        client.push("w", np.arange(250, 551, dtype=np.uint64), np.ones(301, np.float32)).result()
        index = read_index(out)
        ring, _, rest = index["token"].partition(":")
        servers = [item.partition("=") for item in rest.split(",")]
        for forged in (f"{ring}:" + ",".join(f"{s}=999999@{v.partition('@')[2]}" for s, _, v in servers),
                       f"{ring}:" + ",".join(f"{s}=999999" for s, _, _ in servers)):  # an older token's shape
            (tmp_path / "exported" / "PUBLISH.json").write_text(json.dumps({**index, "token": forged}))
            refused = cli("export", "--scheduler", c.address, "--table", "w", "--out", out, "--delta")
            assert refused.returncode != 0, refused.stdout
            assert "reached epoch" in refused.stderr and "refused" in refused.stderr, refused.stderr
            assert read_index(out)["parts"] == index["parts"]  # nothing written
        # a token of another run of the servers (a restart, another cluster): a base, nothing left out
        other = f"{ring}:" + ",".join(f"{s}=1@12345" for s, _, _ in servers)
        (tmp_path / "exported" / "PUBLISH.json").write_text(json.dumps({**index, "token": other}))
        rebased = cli("export", "--scheduler", c.address, "--table", "w", "--out", out, "--delta")
        assert rebased.returncode == 0 and "a base of 550 keys" in rebased.stdout, rebased.stderr
        _, keys, values = load_table(out)
        want_keys, want_values = client.export_table("w")
        order, want = np.argsort(keys), np.argsort(want_keys)
        assert np.array_equal(keys[order], want_keys[want]) and np.array_equal(values[order], want_values[want])
