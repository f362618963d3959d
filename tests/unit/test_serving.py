"""paramserver serve in process: /predict answers what load_model(dir).predict_proba does
(text and JSON bodies, LIBSVM and Criteo models), --follow swaps in each published delta
whole and keeps the old model when a part is damaged, bad rows are a 400 naming the row,
a secret asks for the token, and readiness waits for a model."""

import asyncio
import json
import time
from types import SimpleNamespace

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from paramserver import load_model
from paramserver.apps.ctr.modelfile import save_model
from paramserver.apps.ctr.models import Model
from paramserver.apps.ctr.synth import write_synth
from paramserver.checkpoint.publish import Publisher
from paramserver.data.reader import DataFormat
from paramserver.errors import CheckpointError
from paramserver.serving.app import make_app
from paramserver.serving.follow import Follower
from paramserver.serving.loading import load_once
from paramserver.serving.model import Holder
from paramserver.serving.rows import text_batch
from paramserver.serving.stats import Stats
from paramserver.tables.spec import TableSpec
from paramserver.wire.security import http_token, keygen, load_keys

LIBSVM_ROWS = ["1 3:1.0 17:0.5", "0 2:0.25 3:-1 40:2", "1 17:1", "0 5:3.5 6:1 7:1 99:0.1", "1 1:1 2:1 3:1"]


def _criteo_rows(tmp_path, n=40, seed=3):
    path = tmp_path / "criteo.tsv"
    write_synth(str(path), n, seed=seed)
    return path.read_text().splitlines()


def _spec(model):
    return TableSpec(model.table, model.dim, initializer=model.initializer(), seed=7)


def _table(rows, model, fmt, seed):
    """Keys of ``rows`` (a few left out: the model never saw them) and random rows for them."""
    keys = np.unique(text_batch(("\n".join(rows) + "\n").encode(), fmt).keys)[::-1][:-2].copy()
    values = np.random.default_rng(seed).normal(0, 0.5, (keys.size, model.dim)).astype(np.float32)
    return keys, values


def _saved(tmp_path, name, rows, model, fmt, seed=0):
    url = str(tmp_path / name)
    save_model(url, model, fmt, _spec(model), *_table(rows, model, fmt, seed))
    return url


def _client_call(app, fn):
    async def main():
        async with TestClient(TestServer(app)) as client:
            return await fn(client)

    return asyncio.run(main())


async def _post(client, body, json_body=None, **kw):
    if json_body is not None:
        r = await client.post("/predict", json=json_body, **kw)
    else:
        r = await client.post("/predict", data=body, headers={"Content-Type": "text/plain"}, **kw)
    return r.status, dict(r.headers), await r.json()


def _serve_once(url):
    holder = Holder()
    holder.swap(load_once(url))
    return make_app(holder, Stats())


def test_predictions_equal_load_model_for_libsvm_text_and_json_bodies(tmp_path):
    model, fmt = Model("lr"), DataFormat("libsvm")
    url = _saved(tmp_path, "m", LIBSVM_ROWS, model, fmt)
    data = tmp_path / "rows.libsvm"
    data.write_text("\n".join(LIBSVM_ROWS) + "\n")
    want = load_model(url).predict_proba(str(data))
    unlabeled = [r.split(" ", 1)[1] for r in LIBSVM_ROWS]

    async def calls(client):
        out = [await _post(client, "\n".join(LIBSVM_ROWS).encode()),
               await _post(client, ("\n".join(unlabeled) + "\n").encode()),
               # svmlight's comments: a line of one is no row, a row's tail is not read
               await _post(client, ("# rows to score\n" + "\n".join(unlabeled) + "\n").encode()),
               await _post(client, ("# labelled\n" + "\n".join(r + " # a note" for r in LIBSVM_ROWS)).encode()),
               await _post(client, None, {"rows": unlabeled}),
               await _post(client, None, {"rows": [r.split() for r in unlabeled]}),
               await _post(client, None, {"rows": [[[int(t.split(":")[0]), float(t.split(":")[1])]
                                                    for t in r.split()] for r in unlabeled]})]
        return out

    for status, headers, body in _client_call(_serve_once(url), calls):
        assert status == 200, body
        assert np.array_equal(np.array(body["probabilities"]), want)
        assert headers["X-Model-Version"] == "m" and body["model_version"] == "m"
        assert float(headers["X-Model-Age"]) >= 0 and body["model_age_s"] >= 0


def test_predictions_equal_load_model_for_criteo_text_and_json_bodies(tmp_path):
    model, fmt = Model("fm", k=4), DataFormat("criteo")
    rows = _criteo_rows(tmp_path)
    url = _saved(tmp_path, "m", rows, model, fmt)
    want = load_model(url).predict_proba(str(tmp_path / "criteo.tsv"))
    unlabeled = [r.split("\t", 1)[1] for r in rows]

    async def calls(client):
        return [await _post(client, "\n".join(rows).encode()),
                await _post(client, "\n".join(unlabeled).encode()),
                await _post(client, None, {"rows": rows}),
                await _post(client, None, {"rows": [r.split("\t") for r in unlabeled]})]

    for status, _, body in _client_call(_serve_once(url), calls):
        assert status == 200, body
        assert np.array_equal(np.array(body["probabilities"]), want)


def test_bad_rows_are_a_400_naming_the_row_and_the_rule_and_the_server_goes_on(tmp_path):
    model, fmt = Model("lr"), DataFormat("libsvm")
    url = _saved(tmp_path, "m", LIBSVM_ROWS, model, fmt)

    async def calls(client):
        return [await _post(client, b"1 3:1\n0 2:x\n"),
                await _post(client, b""),
                await _post(client, None, {"rows": ["3:1", "4:1 4:2"]}),
                await _post(client, None, {"rows": ["3:1", {"a": 1}]}),
                await _post(client, None, {"nope": []}),
                await _post(client, b"1 3:1\n"),
                await _post(client, None, {"rows": ["3:1", " ", "4:1"]}),
                await _post(client, None, {"rows": [["3:1"], ["4:1", "x"]]})]

    bad_value, empty, duplicate, not_a_row, no_rows, ok, blank, token = _client_call(_serve_once(url), calls)
    assert blank[0] == 400 and "row 2: an empty row" in blank[2]["error"]
    assert token[0] == 400 and "row 2:" in token[2]["error"] and "index:value" in token[2]["error"]
    assert bad_value[0] == 400 and "line 2:" in bad_value[2]["error"] and "not a finite number" in bad_value[2]["error"]
    assert empty[0] == 400 and "no rows" in empty[2]["error"]
    assert duplicate[0] == 400 and "row 2:" in duplicate[2]["error"] and "appears twice" in duplicate[2]["error"]
    assert not_a_row[0] == 400 and "row 2:" in not_a_row[2]["error"]
    assert no_rows[0] == 400 and '"rows"' in no_rows[2]["error"]
    assert ok[0] == 200 and len(ok[2]["probabilities"]) == 1


def test_a_criteo_row_with_too_few_fields_is_named(tmp_path):
    model, fmt = Model("lr"), DataFormat("criteo")
    rows = _criteo_rows(tmp_path, n=5)
    url = _saved(tmp_path, "m", rows, model, fmt)

    async def calls(client):
        return await _post(client, None, {"rows": [rows[0], "1\t2\t3"]})

    status, _, body = _client_call(_serve_once(url), calls)
    assert status == 400 and "row 2:" in body["error"] and "tab-separated fields" in body["error"]


def _publisher(url, model, fmt):
    spec = _spec(model)
    return Publisher(url, spec.name, lambda u, k, v, d: save_model(u, model, fmt, spec, k, v, d))


def _delta(keys, values, deleted=None, base=False):
    deleted = np.zeros(0, np.uint64) if deleted is None else deleted
    return SimpleNamespace(keys=keys, values=values, deleted=deleted, token="t", base=base)


def test_follow_serves_each_delta_exactly_as_load_model_reads_the_folder(tmp_path):
    model, fmt = Model("fm", k=4), DataFormat("criteo")
    rows = _criteo_rows(tmp_path)
    data = str(tmp_path / "criteo.tsv")
    url = str(tmp_path / "pub")
    keys, values = _table(rows, model, fmt, 1)
    pub = _publisher(url, model, fmt)
    holder, stats = Holder(), Stats()
    follower = Follower(url, holder, stats)
    app = make_app(holder, stats)
    rng = np.random.default_rng(2)

    async def check(client):
        seen = []
        for step in range(4):
            if step == 0:
                pub.publish(_delta(keys, values, base=True))
            else:  # some keys changed, some new ones (the rows' keys the base left out), some evicted
                changed = rng.choice(keys, 20, replace=False)
                if step == 1:
                    changed[:2] = np.setdiff1d(text_batch(("\n".join(rows) + "\n").encode(), fmt).keys, keys)
                deleted = np.setdiff1d(rng.choice(keys, 5, replace=False), changed)
                pub.publish(_delta(changed, rng.normal(0, 1, (20, model.dim)).astype(np.float32), deleted))
            assert follower.poll_once()
            status, headers, body = await _post(client, "\n".join(rows).encode())
            assert status == 200
            assert np.array_equal(np.array(body["probabilities"]), load_model(url).predict_proba(data)), step
            assert headers["X-Model-Version"] == pub.index["parts"][-1]["path"]
            seen.append(body["probabilities"])
        metrics = await (await client.get("/metrics")).text()
        return seen, metrics

    seen, metrics = _client_call(app, check)
    assert all(a != b for a, b in zip(seen, seen[1:]))
    assert stats.deltas_applied == 3 and stats.bases_loaded == 1
    assert "paramserver_serve_deltas_applied_total 3.0" in metrics
    assert 'paramserver_serve_model_version{version="00000004-delta"} 4.0' in metrics
    assert "paramserver_serve_rows_total 160.0" in metrics
    for name in ("requests_total", "request_seconds_bucket", "model_age_seconds", "last_swap_seconds",
                 "unseen_feature_share"):
        assert f"paramserver_serve_{name}" in metrics
    # both replicas hold the same table after the swaps
    a, b = (dict(zip(*r.table.items())) for r in follower.replicas)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_a_damaged_delta_keeps_the_old_model_and_is_applied_once_whole(tmp_path):
    model, fmt = Model("lr"), DataFormat("libsvm")
    url = str(tmp_path / "pub")
    keys, values = _table(LIBSVM_ROWS, model, fmt, 1)
    pub = _publisher(url, model, fmt)
    pub.publish(_delta(keys, values, base=True))
    holder, stats = Holder(), Stats()
    follower = Follower(url, holder, stats)
    assert follower.poll_once()
    before = holder.current
    entry = pub.publish(_delta(keys[:3], values[:3] + 1))
    part = tmp_path / "pub" / entry["path"] / "delta.npz"
    whole = part.read_bytes()
    part.write_bytes(whole[: len(whole) // 2])  # half written
    with pytest.raises(CheckpointError, match="sha256"):
        follower.poll_once()
    assert holder.current is before and stats.deltas_applied == 0
    fresh = Holder()  # a server started now serves the base, aged by its file's time, and says what is wrong
    with pytest.raises(CheckpointError, match="sha256"):
        Follower(url, fresh, Stats()).poll_once()
    assert fresh.current.version == "00000001-base"
    base_written = (tmp_path / "pub" / "00000001-base" / "table.npz").stat().st_mtime
    assert fresh.current.published_at == pytest.approx(base_written)
    part.unlink()
    with pytest.raises(CheckpointError, match="missing"):
        follower.poll_once()
    assert holder.current is before
    part.write_bytes(whole)
    assert follower.poll_once()
    assert holder.current is not before and holder.current.version == entry["path"]
    batch = text_batch(("\n".join(LIBSVM_ROWS) + "\n").encode(), fmt)
    from paramserver.serving.model import score

    assert np.array_equal(score(holder.current.replica, batch).probabilities, load_model(url).predict_proba(batch))


def test_follow_is_not_ready_until_something_is_published(tmp_path):
    model, fmt = Model("lr"), DataFormat("libsvm")
    url = str(tmp_path / "pub")
    holder, stats = Holder(), Stats()
    follower = Follower(url, holder, stats)
    app = make_app(holder, stats)

    async def check(client):
        assert not follower.poll_once()
        early = (await client.get("/readyz")).status, (await client.post("/predict", data=b"3:1\n")).status
        health = (await client.get("/healthz")).status
        keys, values = _table(LIBSVM_ROWS, model, fmt, 1)
        _publisher(url, model, fmt).publish(_delta(keys, values, base=True))
        assert follower.poll_once()
        ready = await client.get("/readyz")
        return early, health, ready.status, (await ready.json())["model_version"]

    early, health, ready, version = _client_call(app, check)
    assert early == (503, 503) and health == 200 and ready == 200 and version == "00000001-base"


def test_a_secret_asks_every_endpoint_but_healthz_for_the_token(tmp_path):
    model, fmt = Model("lr"), DataFormat("libsvm")
    url = _saved(tmp_path, "m", LIBSVM_ROWS, model, fmt)
    keygen(str(tmp_path / "cluster.key"))
    token = http_token(load_keys(str(tmp_path / "cluster.key")))
    holder = Holder()
    holder.swap(load_once(url))
    app = make_app(holder, Stats(), token)

    async def check(client):
        out = {}
        for path in ("/readyz", "/metrics", "/healthz"):
            out[path] = (await client.get(path)).status
        refused = await client.post("/predict", data=b"3:1\n")
        out["predict"] = refused.status, (await refused.json())["error"]
        out["query"] = (await client.post(f"/predict?token={token}", data=b"3:1\n")).status
        out["bearer"] = (await client.post("/predict", data=b"3:1\n",
                                           headers={"Authorization": f"Bearer {token}"})).status
        out["wrong"] = (await client.get("/metrics", headers={"Authorization": "Bearer nope"})).status
        return out

    out = _client_call(app, check)
    assert out["/readyz"] == 401 and out["/metrics"] == 401 and out["/healthz"] == 200
    assert out["predict"][0] == 401 and "Authorization: Bearer" in out["predict"][1]
    assert out["query"] == 200 and out["bearer"] == 200 and out["wrong"] == 401


def test_the_answer_reads_back_as_the_same_floats():
    from paramserver.serving.app import _answer

    rng = np.random.default_rng(0)
    edges = [0.0, 1.0, 0.5, 0.1, 1e-6, 1e-7, 0.3, np.nextafter(1.0, 0), np.nextafter(0.1, 0), np.nextafter(1e-6, 1)]
    for p in (rng.random(50_000), 10 ** rng.uniform(-6, 0, 50_000), np.array(edges)):
        doc = json.loads(_answer(p, "v", 1.5))
        assert np.array_equal(np.array(doc["probabilities"]), p) and doc["model_version"] == "v"


def test_serve_without_aiohttp_says_which_extra_to_install(monkeypatch):
    import argparse
    import sys

    from paramserver.cli.serve import serve
    from paramserver.errors import ConfigError

    monkeypatch.setitem(sys.modules, "aiohttp", None)  # an import of it raises ImportError
    with pytest.raises(ConfigError, match=r"paramserver serve needs aiohttp: pip install 'paramserver\[serve\]'"):
        serve(argparse.Namespace(model="m", follow=None, host="127.0.0.1", port=0, secret_file=None, poll=1.0))


def test_every_request_during_swaps_is_answered_by_one_whole_model_version(tmp_path):
    """Deltas land while requests go on: each answer is exactly what load_model gives at
    the version the request was served by, never a mix of two."""
    import shutil
    import threading

    from paramserver.serving.model import score

    model, fmt = Model("fm", k=4), DataFormat("criteo")
    rows = _criteo_rows(tmp_path, n=200)
    batch = text_batch(("\n".join(rows) + "\n").encode(), fmt)
    url, index = tmp_path / "pub", tmp_path / "pub" / "PUBLISH.json"
    keys, values = _table(rows, model, fmt, 1)
    pub, rng = _publisher(str(url), model, fmt), np.random.default_rng(4)
    expected, stages = {}, []
    for step in range(8):  # every version's parts written first; the index then shows them one by one
        if step == 0:
            entry = pub.publish(_delta(keys, values, base=True))
        else:
            changed = rng.choice(keys, keys.size // 2, replace=False)
            entry = pub.publish(_delta(changed, rng.normal(0, 1, (changed.size, model.dim)).astype(np.float32),
                                       rng.choice(keys, 10, replace=False)))
        expected[entry["path"]] = load_model(str(url)).predict_proba(batch)
        stages.append(tmp_path / f"index-{step}.json")
        shutil.copy(index, stages[-1])
    shutil.copy(stages[0], index)
    holder, stats = Holder(), Stats()
    follower = Follower(str(url), holder, stats, poll_s=0.001)
    assert follower.poll_once()
    follower.start()

    versions = list(expected)  # each stage's newest part, in order

    def reveal():  # the next stage once the one before has answered a request (not on a clock: a cold
        for version, stage in zip(versions, stages[1:]):  # first call may take longer than a stage)
            deadline = time.monotonic() + 30
            while version not in served and time.monotonic() < deadline:
                time.sleep(0.002)
            time.sleep(0.01)
            shutil.copy(stage, tmp_path / "next.json")
            (tmp_path / "next.json").replace(index)

    served = set()
    revealer = threading.Thread(target=reveal)
    revealer.start()
    try:
        while revealer.is_alive() or holder.current.version != entry["path"]:
            snap = holder.acquire()
            try:
                got = score(snap.replica, batch).probabilities
            finally:
                holder.release(snap)
            assert np.array_equal(got, expected[snap.version]), snap.version
            served.add(snap.version)
    finally:
        revealer.join(10)
        follower.stop()
    assert holder.current.version == entry["path"] and len(served) >= 3 and stats.deltas_applied >= 2


def test_a_csv_model_reads_a_body_that_starts_with_its_header(tmp_path):
    model, fmt = Model("lr"), DataFormat("csv", label_column="y")
    lines = ["y,site,hour_of_day,device", "1,a.com,3,phone", "0,b.org,7,tablet", "1,a.com,9,desktop"]
    url = str(tmp_path / "m")
    keys = np.unique(text_batch(("\n".join(lines) + "\n").encode(), fmt).keys)
    save_model(url, model, fmt, _spec(model), keys, np.linspace(-1, 1, keys.size, dtype=np.float32)[:, None])
    (tmp_path / "rows.csv").write_text("\n".join(lines) + "\n")
    want = load_model(url).predict_proba(str(tmp_path / "rows.csv"))

    async def calls(client):
        return [await _post(client, ("\n".join(lines)).encode()),
                await _post(client, None, {"header": lines[0], "rows": lines[1:]}),
                await _post(client, None, {"header": lines[0].split(","), "rows": [r.split(",") for r in lines[1:]]}),
                await _post(client, None, {"rows": lines[1:]}),
                await _post(client, b"y,site,hour_of_day,device\n1,a.com,3\n")]

    text, joined, tokens, no_header, short = _client_call(_serve_once(url), calls)
    for status, _, body in (text, joined, tokens):
        assert status == 200, body
        assert np.array_equal(np.array(body["probabilities"]), want)
    assert no_header[0] == 400 and '"header"' in no_header[2]["error"]
    assert short[0] == 400 and "line 2:" in short[2]["error"] and "4 comma-separated fields" in short[2]["error"]


def test_a_deep_model_follows_its_mlp_through_the_deltas(tmp_path):
    model, fmt = Model("deepfm", k=4, hidden=(8,)), DataFormat("criteo")
    rows = _criteo_rows(tmp_path, n=30)
    batch = text_batch(("\n".join(rows) + "\n").encode(), fmt)
    url = str(tmp_path / "pub")
    keys, values = _table(rows, model, fmt, 1)
    pub, rng = _publisher(url, model, fmt), np.random.default_rng(5)
    holder = Holder()
    follower = Follower(url, holder, Stats())
    from paramserver.serving.model import score

    seen = []
    for step in range(3):
        mlp = rng.normal(0, 0.3, model.deep.mlp.size).astype(np.float32)
        delta = _delta(keys, values, base=True) if step == 0 else _delta(keys[:5], values[:5] * 2)
        pub.publish(delta, dense=mlp)
        assert follower.poll_once()
        got = score(holder.current.replica, batch).probabilities
        assert np.array_equal(got, load_model(url).predict_proba(batch)), step
        seen.append(got)
    assert not np.array_equal(seen[1], seen[2])


def test_an_lr_models_rows_by_key_score_as_its_table_does_through_deltas(tmp_path):
    """Within --hash-bits 24, an LR model's rows are also one array by key (one gather a
    request): its probabilities and unseen counts are the table's, before and after a delta
    that sets and deletes keys."""
    from paramserver.serving.model import Replica, apply_to, new_replica, score

    model, fmt = Model("lr"), DataFormat("criteo", hash_bits=24)
    rows = _criteo_rows(tmp_path, n=300)
    keys, values = _table(rows, model, fmt, seed=1)
    meta = {"model": {"name": "lr"}, "data": {"name": "criteo", "hash_bits": 24}, "table": _spec(model).to_wire()}
    flat = new_replica(meta, keys, values, None)
    assert flat.flat is not None and flat.seen is not None and int(flat.seen.sum()) == keys.size
    batch = text_batch(("\n".join(rows) + "\n").encode(), fmt)

    def same() -> None:
        table = Replica(flat.model, flat.data, flat.table, flat.dense)  # the same table, scored by probing it
        a, b = score(flat, batch), score(table, batch)
        np.testing.assert_array_equal(a.probabilities, b.probabilities)
        assert (a.features, a.unseen) == (b.features, b.unseen) and a.unseen > 0

    same()
    apply_to(flat, keys[:50], values[:50] + 1, keys[50:90], None)
    same()
    wide = dict(meta, data={"name": "criteo", "hash_bits": 30})
    assert new_replica(wide, keys, values, None).flat is None  # 2^30 rows: the table alone
    assert new_replica(dict(meta, model={"name": "fm"}, table=_spec(Model("fm")).to_wire()), keys,
                       np.zeros((keys.size, 9), np.float32), None).flat is None  # its factors start random
