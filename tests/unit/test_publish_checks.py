"""A publication verified as a whole, and a follower that cannot follow says so (issue 43):
the index's chain is checked before any part is read, every file of a part against its
sha256, a delta against the model it would change; a failed apply never leaves a replica
half written in service, and the follow loop outlives any error."""

import json
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from paramserver.apps.ctr.modelfile import save_model
from paramserver.apps.ctr.models import Model
from paramserver.checkpoint.publish import Publisher, check_chain, read_chain, read_index
from paramserver.client.life_calls import parse_token
from paramserver.data.reader import DataFormat
from paramserver.errors import CheckpointError, ConfigError
from paramserver.serving import follow as follow_module
from paramserver.serving.follow import Follower
from paramserver.serving.model import Holder
from paramserver.serving.stats import Stats
from paramserver.tables.spec import TableSpec

MODEL, FMT = Model("lr"), DataFormat("libsvm")


def _publisher(url):
    spec = TableSpec(MODEL.table, MODEL.dim, initializer=MODEL.initializer(), seed=7)
    return Publisher(url, spec.name, lambda u, k, v, d: save_model(u, MODEL, FMT, spec, k, v, d))


def _delta(keys, values=None, deleted=(), base=False):
    keys = np.asarray(keys, np.uint64)
    values = np.ones((keys.size, 1), np.float32) if values is None else values
    return SimpleNamespace(keys=keys, values=values, deleted=np.asarray(deleted, np.uint64), token="t", base=base)


@pytest.fixture
def chain(tmp_path):
    """A base of keys 1..100 and one delta, published under tmp_path/pub."""
    url = str(tmp_path / "pub")
    pub = _publisher(url)
    pub.publish(_delta(np.arange(1, 101), np.linspace(-1, 1, 100, dtype=np.float32).reshape(-1, 1), base=True))
    pub.publish(_delta([3, 4], np.full((2, 1), 2.0, np.float32)))
    return url, pub


def _part(path="00000001-base", kind="base", seq=1, files=None):
    return {"path": path, "kind": kind, "seq": seq, "sha256": "x",
            "files": files or {"table.npz" if kind == "base" else "delta.npz": "x"}}


@pytest.mark.parametrize("parts, match", [
    ([_part(path="../live/00000001-base")], "one plain name inside the published folder"),
    ([_part(path="/etc")], "one plain name"),
    ([_part(path="a/b")], "one plain name"),
    ([_part(path="..")], "one plain name"),
    ([_part(kind="delta")], "a chain is a base, then deltas"),
    ([_part(), _part("00000002-base", "base", 2)], "a chain is a base, then deltas"),
    ([_part(seq=3), _part("00000002-delta", "delta", 2)], "not a whole number above the part before it"),
    ([_part(seq="1")], "not a whole number"),
    ([_part(files={"../model.json": "x", "table.npz": "x"})], "each a plain name"),
    ([_part(files={"model.json": "x"})], "table.npz among them"),
    (["00000001-base"], "not an entry"),
])
def test_an_index_whose_chain_is_not_well_formed_is_refused_whole(parts, match):
    with pytest.raises(CheckpointError, match=match):
        check_chain("pub", parts)


def test_every_file_of_a_base_is_hashed_and_an_edited_one_refused(chain, tmp_path):
    url, _ = chain
    base = read_index(url)["parts"][0]
    assert set(base["files"]) == {"table.npz", "model.json"} and base["files"]["table.npz"] == base["sha256"]
    meta_file = tmp_path / "pub" / base["path"] / "model.json"
    meta = json.loads(meta_file.read_text())
    meta["data"]["hash_bits"] = 22
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="model.json does not match its sha256"):
        read_chain(url)
    holder = Holder()
    with pytest.raises(CheckpointError, match="model.json does not match its sha256"):
        Follower(url, holder, Stats()).poll_once()
    assert holder.current is None


def test_an_index_written_before_files_were_listed_still_reads(chain, tmp_path):
    url, _ = chain
    index = read_index(url)
    for part in index["parts"]:
        del part["files"]
    (tmp_path / "pub" / "PUBLISH.json").write_text(json.dumps(index))
    meta, keys, values, _ = read_chain(url)
    assert keys.size == 100 and values[np.flatnonzero(keys == 3)[0], 0] == 2.0


@pytest.mark.parametrize("delta, match", [
    (_delta([500, 1 << 24]), r"key 16777216 lies outside the model's hash space \(2\^24"),
    (_delta([500], deleted=[1 << 30]), "outside the model's hash space"),
    (_delta([500, 501], np.ones((2, 1), np.int32)), "not 2 rows of at least 1 numbers"),
    (_delta([500, 501], np.ones((3, 1), np.float32)), "not 2 rows"),
])
def test_a_delta_that_does_not_fit_the_model_is_not_applied_at_all(chain, delta, match):
    url, pub = chain
    holder, stats = Holder(), Stats()
    follower = Follower(url, holder, stats)
    assert follower.poll_once()
    before, replicas = holder.current, [dict(zip(*r.table.items())) for r in follower.replicas]
    pub.publish(delta)
    with pytest.raises(CheckpointError, match=match):
        follower.poll_once()
    assert holder.current is before  # still the last whole model, both replicas untouched
    for replica, was in zip(follower.replicas, replicas):
        now = dict(zip(*replica.table.items()))
        assert now.keys() == was.keys() and all(np.array_equal(now[k], was[k]) for k in was)
        assert replica.flat is None or not replica.seen[500]


def test_an_apply_that_fails_midway_drops_the_replicas_and_the_next_poll_loads_the_chain_whole(chain, monkeypatch):
    url, pub = chain
    holder = Holder()
    follower = Follower(url, holder, Stats())
    assert follower.poll_once()
    before = holder.current
    pub.publish(_delta([7, 8], np.full((2, 1), 5.0, np.float32)))
    real, calls = follow_module.apply_to, []

    def failing(replica, *args):
        calls.append(replica)
        real(replica, *args)  # written, then a failure: the replica is now half way through
        raise MemoryError("no room")

    monkeypatch.setattr(follow_module, "apply_to", failing)
    with pytest.raises(MemoryError):
        follower.poll_once()
    assert holder.current is before and follower.replicas == []
    monkeypatch.setattr(follow_module, "apply_to", real)
    assert follower.poll_once()
    assert holder.current.version == "00000003-delta" and calls[0] not in follower.replicas
    rows = dict(zip(*holder.current.replica.table.items()))
    assert rows[np.uint64(7)][0] == 5.0 and rows[np.uint64(3)][0] == 2.0


def test_the_follow_loop_outlives_any_error_and_says_so(chain, monkeypatch):
    url, _ = chain
    stats = Stats()
    follower = Follower(url, Holder(), stats, poll_s=0.01)
    failures = threading.Event()

    def broken():
        if stats.follow_errors >= 3:
            failures.set()
        raise RuntimeError("a bug")

    monkeypatch.setattr(follower, "poll_once", broken)
    follower.start()
    try:
        assert failures.wait(10)
        assert stats.follow_alive and stats.follow_last_error == "RuntimeError: a bug" and stats.follow_url
        monkeypatch.setattr(follower, "poll_once", lambda: True)
        deadline = time.monotonic() + 10
        while stats.follow_last_error or not stats.follow_last_ok_at:
            assert time.monotonic() < deadline, "the loop did not recover"
            time.sleep(0.01)
    finally:
        follower.stop()
    assert not stats.follow_alive


def test_an_older_index_is_refused_unless_a_rollback_is_allowed(chain, tmp_path):
    url, pub = chain
    older = read_index(url)
    pub.publish(_delta([9], np.full((1, 1), 3.0, np.float32)))
    newer = read_index(url)
    holder = Holder()
    follower = Follower(url, holder, Stats())
    assert follower.poll_once() and holder.current.seq == 3
    (tmp_path / "pub" / "PUBLISH.json").write_text(json.dumps(older))
    with pytest.raises(CheckpointError, match=r"now ends at seq 2 \(00000002-delta\), not after the seq 3 served"):
        follower.poll_once()
    assert holder.current.seq == 3
    back = Follower(url, Holder(), Stats(), allow_rollback=True)
    (tmp_path / "pub" / "PUBLISH.json").write_text(json.dumps(newer))
    assert back.poll_once() and back.holder.current.seq == 3
    (tmp_path / "pub" / "PUBLISH.json").write_text(json.dumps(older))
    assert back.poll_once() and back.holder.current.seq == 2


def test_a_token_carries_each_servers_epoch_and_origin_and_an_older_one_reads():
    assert parse_token("3:1=5@81,2=6@93") == (3, {1: 5, 2: 6}, {1: 81, 2: 93})
    assert parse_token("3:1=5,2=6") == (3, {1: 5, 2: 6}, {})
    for bad in ("x:1=5", "3:1=-4", "3:1=5@y", "3:1"):
        with pytest.raises(ConfigError, match="is not a delta token"):
            parse_token(bad)


def test_follow_refuses_what_is_never_published_into_and_waits_for_a_folder_to_come(tmp_path):
    """``serve --follow`` of a file or of a model ``train --save`` wrote waited for ever ("nothing is
    published ... yet"); it is refused before binding, naming --model.  A folder not there yet, a
    published one and another scheme's URL are followed."""
    data = tmp_path / "rows.tsv"
    data.write_text("1\t2\n")
    with pytest.raises(ConfigError, match="a file, not a folder.*--model DIR"):
        follow_module.followable(str(data))
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "model.json").write_text("{}")
    for url in (str(saved), f"file://{saved}"):
        with pytest.raises(ConfigError, match=f"train --save wrote.*--model {url}"):
            follow_module.followable(url)
    (saved / "PUBLISH.json").write_text("{}")  # a folder published into that also holds a model.json
    for url in (str(saved), str(tmp_path / "not-yet"), "memory://bucket/published"):
        assert follow_module.followable(url) is None


def test_a_poll_that_ends_a_failure_swaps_its_model_in_with_the_failure_cleared(chain):
    """/readyz reads the model and the last poll's error apart: a poll that loads a chain or
    applies deltas after a failed one clears the error before its model is swapped in, not
    after it returns (a reader between the two saw the new model "degraded")."""
    url, pub = chain
    stats = Stats()
    seen = []

    class Spy(Holder):
        def swap(self, snap, timeout_s=30.0):
            seen.append((snap.version, stats.follow_last_error))
            return super().swap(snap, timeout_s)

    follower = Follower(url, Spy(), stats)
    stats.follow_last_error = "OSError: the last poll failed"  # as the loop's _failed leaves it
    assert follower.poll_once()  # the chain loaded
    stats.follow_last_error = "OSError: and the next"
    pub.publish(_delta([7, 8], np.full((2, 1), 5.0, np.float32)))
    assert follower.poll_once()  # a delta applied
    pub.publish(_delta([9], np.full((1, 1), 6.0, np.float32)))
    pub.publish(_delta([500, 1 << 24]))  # a whole delta, then one that does not fit: applied up to it
    with pytest.raises(CheckpointError, match="outside the model's hash space"):
        follower.poll_once()
    assert [v for v, _ in seen] == ["00000002-delta", "00000003-delta", "00000004-delta"]
    assert [e for _, e in seen[:2]] == ["", ""]
    assert "outside the model's hash space" in seen[2][1]  # said with the swap, not cleared
