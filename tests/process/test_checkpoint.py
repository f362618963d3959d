"""Cold backup: checkpoint, stop everything, restore onto another number of servers."""

import hashlib
import json
import os
import time

import numpy as np
import pytest

from paramserver import CheckpointError, ConfigError, LocalCluster


def fill(client):
    rng = np.random.default_rng(0)
    client.create_table("ftrl", dim=1, optimizer={"name": "ftrl", "alpha": 0.2, "l1": 0.5})
    client.create_table("emb", dim=4, optimizer="adam", initializer={"name": "normal", "std": 0.1}, seed=3)
    keys = np.concatenate([rng.integers(0, 2**64 - 1, 20_000, dtype=np.uint64, endpoint=True),
                           np.array([0, 2**64 - 1], np.uint64)])
    client.create_table("dense", dim=2, optimizer="adagrad", key_bits=18)  # vnodes are arrays
    for _ in range(3):
        client.push("ftrl", keys, rng.standard_normal((keys.size, 1)).astype(np.float32)).result(timeout=60)
        client.push("emb", keys[::2], rng.standard_normal((keys[::2].size, 4)).astype(np.float32)).result(timeout=60)
        client.push("dense", keys[:5000] >> np.uint64(46),
                    rng.standard_normal((5000, 2)).astype(np.float32)).result(timeout=60)
    return keys


def full_rows(client, table):
    """Every server's vnodes: key -> value and optimiser state, read through the stats-free path."""
    keys, values = client.export_table(table)
    order = np.argsort(keys)
    return keys[order], values[order]


def test_restore_onto_a_different_number_of_servers_is_bitwise_equal(tmp_path):
    url = str(tmp_path / "ckpt")
    with LocalCluster(servers=2, log_level="WARNING") as cluster:
        keys = fill(cluster.client)
        with pytest.raises(ConfigError, match=r"dense with key_bits=18: keys must be < 2\*\*18, got 262144"):
            cluster.client.pull("dense", [5, 1 << 18])
        step = cluster.client.checkpoint(url)
        before = {t: full_rows(cluster.client, t) for t in ("ftrl", "emb", "dense")}
        pulled = cluster.client.pull("emb", keys[:100]).result(timeout=30)
    assert os.path.exists(os.path.join(step, "MANIFEST.json"))
    with LocalCluster(servers=3, log_level="WARNING") as cluster:
        restored = cluster.client.restore(url)
        assert restored == {"ftrl": keys.size, "emb": keys[::2].size,
                            "dense": np.unique(keys[:5000] >> np.uint64(46)).size}
        for table, (k, v) in before.items():
            k2, v2 = full_rows(cluster.client, table)
            np.testing.assert_array_equal(k2, k)
            np.testing.assert_array_equal(v2, v)  # bitwise
        np.testing.assert_array_equal(cluster.client.pull("emb", keys[:100]).result(timeout=30), pulled)
        # optimiser state came back too: the same next step gives the same values
        g = np.full((keys.size, 1), 0.5, np.float32)
        cluster.client.push("ftrl", keys, g).result(timeout=60)
        after_restored = cluster.client.pull("ftrl", keys).result(timeout=60)
    with LocalCluster(servers=1, log_level="WARNING") as cluster:
        cluster.client.restore(step)
        cluster.client.push("ftrl", keys, g).result(timeout=60)
        np.testing.assert_array_equal(cluster.client.pull("ftrl", keys).result(timeout=60), after_restored)


def test_missing_or_corrupt_manifests_are_refused(tmp_path):
    url = str(tmp_path / "ckpt")
    with LocalCluster(servers=1, log_level="WARNING") as cluster:
        cluster.client.create_table("t", dim=2)
        cluster.client.push("t", [1, 2], np.ones((2, 2), np.float32)).result(timeout=30)
        step = cluster.client.checkpoint(url)
        manifest = os.path.join(step, "MANIFEST.json")
        os.rename(manifest, manifest + ".gone")  # as if the writer died before the manifest
        with pytest.raises(CheckpointError, match="no complete checkpoint"):
            cluster.client.restore(url)
        with pytest.raises(CheckpointError, match="is missing: the checkpoint is incomplete"):
            cluster.client.restore(step)
        with open(manifest, "w") as f:
            f.write("{not json")
        with pytest.raises(CheckpointError, match="is corrupt"):
            cluster.client.restore(step)
        with open(manifest, "w") as f:
            json.dump({"format": "something-else"}, f)
        with pytest.raises(CheckpointError, match="not a paramserver checkpoint manifest"):
            cluster.client.restore(step)
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        from paramserver.checkpoint.store import latest_step
        latest_step(str(tmp_path / "nothing-here"))


# ---- checkpoints coordinated by the scheduler during training, and resume -------------

ROWS, EPOCHS, EVERY, SHARD_BYTES = 12_000, 2, 3, 300_000


def rows_per_shard(path, shards):
    """Lines starting in each shard's byte range (the reader's rule)."""
    data = np.fromfile(path, np.uint8)
    starts = np.concatenate([[0], np.flatnonzero(data == ord("\n")) + 1])
    starts = starts[starts < data.size]
    return [int(((starts >= s.start) & (starts < (s.end if s.end >= 0 else data.size))).sum()) for s in shards]


def manifests(url):
    steps = sorted(os.listdir(url))
    return [(os.path.join(url, s), json.load(open(os.path.join(url, s, "MANIFEST.json")))) for s in steps
            if os.path.exists(os.path.join(url, s, "MANIFEST.json"))]


@pytest.fixture(scope="module")
def checkpointed_job(tmp_path_factory):
    from paramserver.apps.ctr.models import Model
    from paramserver.apps.ctr.synth import write_synth
    from paramserver.apps.ctr.train import TrainConfig, run_training

    tmp = tmp_path_factory.mktemp("ckpt-train")
    path, url = str(tmp / "synth.tsv"), str(tmp / "ckpt")
    write_synth(path, ROWS, seed=8)
    cfg = TrainConfig(Model("lr"), epochs=EPOCHS, batch_size=500)
    report = run_training(cfg, [path], [], servers=2, workers=2, shard_bytes=SHARD_BYTES,
                          checkpoint_dir=url, checkpoint_every=EVERY, keep_checkpoints=0)  # every step inspected
    return path, url, cfg, report


def test_training_checkpoints_every_n_shards_with_consistent_job_progress(checkpointed_job):
    from paramserver.checkpoint.store import resolve_step
    from paramserver.data.reader import make_shards

    path, url, _, report = checkpointed_job
    shards = make_shards([path], SHARD_BYTES)
    per_shard = rows_per_shard(path, shards)
    assert sum(per_shard) == ROWS and len(shards) >= 6
    assert report["examples"] == ROWS * EPOCHS and report["checkpoints_abandoned"] == 0
    written = manifests(url)
    assert [s for s, _ in written] == report["checkpoints"]
    # at least EVERY more shards between two checkpoints (a few more finish while the others drain)
    assert len(shards) * EPOCHS // (EVERY + 2) <= len(written) <= len(shards) * EPOCHS // EVERY
    progress = []
    for step, m in written:
        job = m["job"]
        assert job["shards"] == [s.to_wire() for s in shards] and job["epochs"] == EPOCHS
        assert 0 <= job["epoch"] < EPOCHS and len(set(job["done"])) == len(job["done"])
        # the totals are exactly the examples of the shards done: a clock boundary, none half-done
        expected = job["epoch"] * ROWS + sum(per_shard[s] for s in job["done"])
        assert job["totals"]["examples"] == expected == sum(job["epoch_examples"])
        assert job["epoch_examples"][:job["epoch"]] == [ROWS] * job["epoch"]
        progress.append(job["epoch"] * len(shards) + len(job["done"]))
        for table, vnodes in m["files"].items():
            assert table in m["tables"]
            for rel, n_keys, sha, size in vnodes.values():  # inside the step, with its hash and size
                file = os.path.join(step, rel)
                with open(file, "rb") as f:
                    body = f.read()
                assert len(body) == size and hashlib.sha256(body).hexdigest() == sha
                assert not rel.startswith("/") and np.load(file)["keys"].size == n_keys
        assert set(m["ring"]) >= {"version", "chains"} and m["clocks"]
    assert all(b - a >= EVERY for a, b in zip(progress, progress[1:])) and progress[0] >= EVERY
    # a newer step without a manifest (a checkpoint cut short) is never used
    os.makedirs(os.path.join(url, "999999999999999", "model", "lr"))
    assert resolve_step(url) == written[-1][0]


def test_resume_from_a_mid_job_checkpoint_onto_more_servers_counts_each_example_once(checkpointed_job):
    from paramserver.apps.ctr.train import run_training

    path, url, cfg, _ = checkpointed_job
    step, manifest = manifests(url)[len(manifests(url)) // 2 - 1]  # mid-job
    job = manifest["job"]
    assert 0 < job["totals"]["examples"] < ROWS * EPOCHS
    files = [os.path.join(step, entry[0]) for entry in manifest["files"]["model/lr"].values()]
    saved = [np.load(f) for f in files]
    keys = np.concatenate([s["keys"] for s in saved])
    values = np.concatenate([s["rows"][:, :1] for s in saved])  # value, then optimiser state
    pulled = {}

    def right_after_restore(cluster):
        pulled["values"] = cluster.client.pull("model/lr", keys).result(timeout=30)
        pulled["servers"] = len(cluster.client.stats.server_stats())

    report = run_training(cfg, [path], [], servers=3, workers=1, shard_bytes=SHARD_BYTES, resume=step,
                          setup=right_after_restore)
    assert pulled["servers"] == 3
    np.testing.assert_array_equal(pulled["values"], values)  # bitwise: the table starts where it stopped
    assert report["resumed_from"] == step and report["resumed_examples"] == job["totals"]["examples"]
    assert report["examples"] == ROWS * EPOCHS  # every example once over the two runs
    assert report["failed_workers"] == []


def test_eval_of_a_first_format_training_checkpoint_needs_the_opt_in(checkpointed_job, tmp_path):
    """The same flag, the same meaning: eval and predict read a training checkpoint as
    --model, and a manifest rewritten as the first format (no hashes) is refused there too,
    unless --allow-unverified-checkpoint."""
    import shutil
    import subprocess
    import sys

    from paramserver.checkpoint.store import resolve_step

    path, url, _, _ = checkpointed_job
    source = resolve_step(url)
    step = shutil.copytree(source, str(tmp_path / "ckpt" / os.path.basename(source.rstrip("/"))))
    with open(os.path.join(step, "MANIFEST.json")) as f:
        manifest = json.load(f)
    manifest["format"] = "paramserver-checkpoint-1"
    manifest["files"] = {t: {v: [f"{step}/{e[0]}", e[1]] for v, e in vnodes.items()}
                         for t, vnodes in manifest["files"].items()}
    with open(os.path.join(step, "MANIFEST.json"), "w") as f:
        json.dump(manifest, f)
    command = [sys.executable, "-m", "paramserver", "eval", "--model", step, "--data", path]
    refused = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "--allow-unverified-checkpoint" in refused.stderr, refused.stderr[-2000:]
    assert "Traceback" not in refused.stderr
    allowed = subprocess.run([*command, "--allow-unverified-checkpoint"], capture_output=True, text=True, timeout=120)
    assert allowed.returncode == 0, allowed.stderr[-2000:]
    assert "log" in allowed.stdout.lower()


def test_resume_refuses_other_shards_or_another_model_in_one_line(checkpointed_job):
    import subprocess
    import sys

    path, url, _, _ = checkpointed_job
    n_shards = len(manifests(url)[0][1]["job"]["shards"])
    for flags, message in ((["--shard-mb", "1"], f"the checkpointed job has {n_shards} shard(s), but --data "
                                                 f"{path} with --shard-mb 1 gives 3 (shard 0: "),
                           (["--shard-mb", str(SHARD_BYTES / (1 << 20)), "--model", "fm"],
                            "the checkpoint has table(s) ['model/lr'], not 'model/fm' that these flags train"),
                           (["--shard-mb", str(SHARD_BYTES / (1 << 20)), "--optimizer", "sgd"],
                            "the checkpoint's table 'model/lr' was made with other settings than this command's: "
                            "--optimizer: the checkpoint has ftrl:alpha=")):
        proc = subprocess.run([sys.executable, "-m", "paramserver", "train", "--data", path, "--resume", url,
                               "--quiet", *flags], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_a_server_lost_during_a_checkpoint_abandons_it_and_the_job_goes_on(tmp_path):
    from paramserver.data.reader import Shard

    url = str(tmp_path / "ckpt")
    with LocalCluster(servers=2, heartbeat_interval_s=0.2, heartbeat_timeout_s=1.5, log_level="WARNING",
                      log_dir=str(tmp_path / "logs")) as cluster:
        client = cluster.client  # takes the shards itself: no worker needs the lost server's data
        client.create_table("w")
        client.push("w", np.arange(100), np.ones((100, 1), np.float32)).result(timeout=30)
        cluster.kill("server-1")  # still registered: the first checkpoint waits for it until it is declared dead
        cluster.procs["server-1"].popen.wait(10)
        client.job.start([Shard("s", i, i + 1) for i in range(3)], 1, checkpoint={"url": url, "every": 1})
        t0 = time.monotonic()
        done = 0
        while (task := client.job.next_shard(timeout_s=30)) is not None:
            client.job.shard_done(task, examples=1)
            done += 1
        status = client.job.status()
        assert time.monotonic() - t0 < 15
    assert done == 3 and status["finished"] and status["examples"] == 3
    # the first is given up when the server is declared dead; after the failover the ring
    # has one server, which owns every vnode, and the next ones are written whole
    checkpoints = status["checkpoints"]
    assert checkpoints["abandoned"] >= 1 and len(checkpoints["written"]) == 3 - checkpoints["abandoned"]
    manifests_written = sum(f == "MANIFEST.json" for _, _, names in os.walk(url) for f in names)
    assert manifests_written == len(checkpoints["written"])
    log = (tmp_path / "logs" / "scheduler.log").read_text()
    assert log.count("abandoned and removed, training goes on") == checkpoints["abandoned"]
    assert "lost servers [" in log


# ---- restore trusts nothing it reads (issue 12, bug 12) -------------------------------

@pytest.fixture(scope="module")
def saved_step(tmp_path_factory):
    """A checkpoint of a 20 000-key table and of a dense one, and the keys' values."""
    from paramserver import LocalCluster
    url = str(tmp_path_factory.mktemp("trust") / "ckpt")
    keys = np.arange(20_000, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    with LocalCluster(servers=2, workers=0, log_level="WARNING") as cluster:
        c = cluster.client
        c.create_table("t", dim=2, optimizer="adagrad")
        c.push("t", keys, np.ones((keys.size, 2), np.float32)).result(timeout=60)
        c.create_table("d", dim=1, optimizer="sgd", key_bits=16)
        c.push("d", np.arange(1000, dtype=np.uint64), -np.ones((1000, 1), np.float32)).result(timeout=60)
        step = c.checkpoint(url)
        values = c.pull("t", keys).result(timeout=60)
    return step, keys, values


def _copy(step, tmp_path):
    import shutil
    dst = str(tmp_path / os.path.basename(step))
    shutil.copytree(step, dst)
    return dst


def _restore_fails(step, match):
    from paramserver import CheckpointError, LocalCluster
    with LocalCluster(servers=2, workers=0, log_level="WARNING") as cluster:
        with pytest.raises(CheckpointError, match=match):
            cluster.client.restore(step)
        assert cluster.client.tables() == {}  # nothing was created, nothing changed


def _a_file(step, table="t"):
    with open(os.path.join(step, "MANIFEST.json")) as f:
        manifest = json.load(f)
    rel = next(iter(manifest["files"][table].values()))[0]
    return manifest, os.path.join(step, rel)


def test_restore_round_trips_values_and_the_dense_layout(saved_step):
    from paramserver import LocalCluster
    step, keys, values = saved_step
    with LocalCluster(servers=3, workers=0, log_level="WARNING") as cluster:
        restored = cluster.client.restore(step)
        assert restored["t"] == keys.size
        np.testing.assert_array_equal(cluster.client.pull("t", keys).result(timeout=60), values)
        assert cluster.client.tables()["d"].key_bits == 16  # a dense table comes back dense


@pytest.mark.parametrize("damage", ["truncate", "empty", "edit", "grow"])
def test_a_damaged_vnode_file_fails_the_restore_and_changes_nothing(saved_step, tmp_path, damage):
    step = _copy(saved_step[0], tmp_path)
    _, path = _a_file(step)
    body = open(path, "rb").read()
    if damage == "truncate":
        body = body[: len(body) // 2]
    elif damage == "empty":
        body = b""
    elif damage == "grow":
        body = body + bytes(1 << 20)
    else:  # a valid npz whose values were edited
        import io
        data = np.load(io.BytesIO(body))
        out = io.BytesIO()
        np.savez(out, keys=data["keys"], rows=data["rows"] + 1)
        body = out.getvalue()
    with open(path, "wb") as f:
        f.write(body)
    _restore_fails(step, r"(bytes, the manifest says|does not match the sha256)")


def test_a_vnode_file_from_another_step_is_refused(saved_step, tmp_path):
    step = _copy(saved_step[0], tmp_path)
    manifest, path = _a_file(step)
    entries = list(manifest["files"]["t"].values())
    other = os.path.join(step, entries[1][0])
    with open(other, "rb") as src, open(path, "wb") as dst:
        dst.write(src.read())  # a file of the right format, but not this one
    _restore_fails(step, "does not match the sha256|bytes, the manifest says")


def test_a_manifest_rewritten_as_the_first_format_is_refused_unless_allowed(saved_step, tmp_path):
    """The attack: format 1 has no sha256, so an edited file loaded with only a warning."""
    from paramserver import LocalCluster
    step = _copy(saved_step[0], tmp_path)
    manifest, path = _a_file(step)
    with np.load(path) as data:
        keys, rows = data["keys"], data["rows"]
    with open(path, "wb") as f:
        np.savez(f, keys=keys, rows=rows + 1)  # a valid file, with other values
    manifest["format"] = "paramserver-checkpoint-1"
    manifest["files"] = {t: {v: [f"{step}/{e[0]}", e[1]] for v, e in vnodes.items()}
                         for t, vnodes in manifest["files"].items()}
    with open(os.path.join(step, "MANIFEST.json"), "w") as f:
        json.dump(manifest, f)
    _restore_fails(step, "paramserver-checkpoint-1 manifest: its files have no sha256.*--allow-unverified-checkpoint")
    with LocalCluster(servers=2, workers=0, log_level="WARNING") as cluster:  # the user's explicit choice
        assert cluster.client.restore(step, allow_unverified=True)["t"] == saved_step[1].size


@pytest.mark.parametrize("where", ["../../elsewhere.npz", "/etc/passwd", "file:///dev/zero"])
def test_a_manifest_entry_outside_its_step_is_refused(saved_step, tmp_path, where):
    step = _copy(saved_step[0], tmp_path)
    manifest, _ = _a_file(step)
    vnode = next(iter(manifest["files"]["t"]))
    manifest["files"]["t"][vnode][0] = where
    with open(os.path.join(step, "MANIFEST.json"), "w") as f:
        json.dump(manifest, f)
    _restore_fails(step, "outside its step: refused")


def test_keep_checkpoints_leaves_the_newest_steps(tmp_path):
    from paramserver.apps.ctr.models import Model
    from paramserver.apps.ctr.synth import write_synth
    from paramserver.apps.ctr.train import TrainConfig, run_training
    from paramserver.checkpoint.store import MANIFEST
    data, url = str(tmp_path / "d.tsv"), str(tmp_path / "ckpt")
    write_synth(data, 6000, seed=2)
    report = run_training(TrainConfig(Model("lr"), epochs=2), [data], [], servers=1, workers=1,
                          shard_bytes=300_000, checkpoint_dir=url, checkpoint_every=1, keep_checkpoints=2)
    assert len(report["checkpoints"]) >= 4  # written ...
    steps = sorted(os.listdir(url))
    assert len(steps) == 2 and all(os.path.exists(os.path.join(url, s, MANIFEST)) for s in steps)  # ... 2 kept
    assert os.path.join(url, steps[-1]) == report["checkpoints"][-1]


def test_a_checkpoint_that_fails_mid_job_says_why(tmp_path):
    """Issue 12, bug 5: it was counted as '1 abandoned' and nothing more."""
    import threading

    from support import wait_for

    from paramserver.apps.ctr.models import Model
    from paramserver.apps.ctr.synth import write_synth
    from paramserver.apps.ctr.train import TrainConfig, run_training
    data, url = str(tmp_path / "d.tsv"), str(tmp_path / "ckpt")
    write_synth(data, 6000, seed=2)

    def break_the_folder_after_the_first(cluster):
        def swap():
            wait_for(lambda: cluster.client.job.status().get("checkpoints", {}).get("written"), 60, "a checkpoint")
            # moved aside at once, not removed: a removal raced the server writing the next
            # checkpoint into the folder ("Directory not empty") and left it in place
            os.rename(url, url + ".gone")
            open(url, "w").close()  # the folder is now a file: the next checkpoints cannot be written
        threading.Thread(target=swap, daemon=True).start()

    report = run_training(TrainConfig(Model("lr"), epochs=3), [data], [], servers=1, workers=1,
                          shard_bytes=300_000, checkpoint_dir=url, checkpoint_every=2, keep_checkpoints=0,
                          setup=break_the_folder_after_the_first)
    assert report["examples"] == 3 * 6000  # training went on
    assert report["checkpoints_abandoned"] >= 1 and report["checkpoint_failures"]
    assert all(url in why for why in report["checkpoint_failures"]), report["checkpoint_failures"]


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs of the test's own (root only), removed after it."""
    import subprocess

    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("a full disk needs a tmpfs of the test's own: mounting one takes root")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True,
                          text=True, timeout=30)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({made.stderr.strip()}): no full disk to test with")
    try:
        yield str(mount)
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, timeout=30)


def test_a_full_disk_during_checkpoints_is_named_cleaned_up_and_training_goes_on(tmp_path, small_disk):
    """Issue 28.7: a full disk arrived as an "internal" error and its partial files stayed;
    it is now named, each failed step is removed, and the job finishes."""
    from paramserver.apps.ctr.models import Model
    from paramserver.apps.ctr.synth import write_synth
    from paramserver.apps.ctr.train import TrainConfig, run_training

    data, url = str(tmp_path / "d.tsv"), os.path.join(small_disk, "ckpt")
    write_synth(data, 6000, seed=2)
    report = run_training(TrainConfig(Model("lr"), epochs=2), [data], [], servers=1, workers=1,
                          shard_bytes=300_000, checkpoint_dir=url, checkpoint_every=2, keep_checkpoints=0)
    assert report["examples"] == 2 * 6000  # training went on
    assert report["checkpoints_abandoned"] >= 1
    assert all("the disk is full" in why for why in report["checkpoint_failures"]), report["checkpoint_failures"]
    assert "internal" not in " ".join(report["checkpoint_failures"])
    steps = os.listdir(url)  # what is left: complete steps only (those that fitted), no partial one
    partial = [s for s in steps if not os.path.exists(os.path.join(url, s, "MANIFEST.json"))]
    assert not partial, f"partial checkpoint steps stay: {partial}"
    assert sorted(steps) == sorted(os.path.basename(s) for s in report["checkpoints"])
