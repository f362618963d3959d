"""paramserver serve's HTTP bounds in process (issue 43): a token that is not ASCII is a 401,
a 401 says nothing of the model, JSON is told from text without its Content-Type, JSON
nested too deep is a 400, rows and bodies over their bounds are a 413 (503 while the
bodies held are at their bound), a client that hangs up mid-body is counted and not an
error, a large body is scored a piece at a time as it would be whole, and /readyz and
/metrics say when a follower cannot follow."""

import asyncio
import json
import logging
import time

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer

from paramserver import ConfigError, load_model
from paramserver.apps.ctr.modelfile import save_model
from paramserver.apps.ctr.models import Model
from paramserver.apps.ctr.synth import write_synth
from paramserver.data.reader import DataFormat
from paramserver.serving import rows as rows_module
from paramserver.serving.app import make_app
from paramserver.serving.body import MAX_JSON_DEPTH, is_json
from paramserver.serving.limits import MIB, Limits
from paramserver.serving.loading import load_once
from paramserver.serving.model import Holder, Snapshot
from paramserver.serving.rows import text_batch
from paramserver.serving.run import open_http
from paramserver.serving.stats import Stats, readiness
from paramserver.tables.spec import TableSpec
from paramserver.wire.security import authorized, http_token, keygen, load_keys

TOKEN = "0123456789abcdef0123456789abcdef"


@pytest.fixture(scope="module")
def criteo(tmp_path_factory):
    """A saved Criteo LR model and its rows (labelled, as a file holds them)."""
    tmp = tmp_path_factory.mktemp("bounds")
    path = tmp / "rows.tsv"
    write_synth(str(path), 300, seed=5)
    model, fmt = Model("lr"), DataFormat("criteo")
    keys = np.unique(text_batch(path.read_bytes(), fmt).keys)
    values = np.random.default_rng(1).normal(0, 0.5, (keys.size, model.dim)).astype(np.float32)
    url = str(tmp / "m")
    save_model(url, model, fmt, TableSpec(model.table, model.dim, initializer=model.initializer(), seed=7), keys,
               values)
    return url, path


def _app(url, stats=None, **kw):
    holder = Holder()
    holder.swap(load_once(url))
    return make_app(holder, stats or Stats(), **kw)


def _call(app, fn):
    async def main():
        async with TestClient(TestServer(app)) as client:
            return await fn(client)

    return asyncio.run(main())


async def _raw(client, data, read=True):
    """What the server answers raw bytes with (its status line and headers, then the body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", client.server.port)
    writer.write(data)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 10) if read else b""
    writer.close()
    return answer


# ---- item 2: a token that is not ASCII ---------------------------------------------------------------------------

def test_a_token_that_is_not_ascii_is_refused_not_an_error():
    for query, header in [("token=%C3%A9", ""), ("", "Bearer é"), ("", "Bearer \udcc3\udca9"),
                          ("token=%FF%FE", ""), ("", "Bearer " + "é" * 32)]:
        assert authorized(query, {"Authorization": header} if header else {}, TOKEN) is False
    assert authorized(f"token={TOKEN}", {}, TOKEN) and authorized("", {"Authorization": f"Bearer {TOKEN}"}, TOKEN)


def test_the_service_answers_a_token_that_is_not_ascii_with_401(criteo, tmp_path):
    keygen(str(tmp_path / "k"))
    token = http_token(load_keys(str(tmp_path / "k")))
    app = _app(criteo[0], token=token)

    async def calls(client):
        by_query = await client.get("/metrics?token=%C3%A9")
        raw = await _raw(client, b"GET /readyz HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xc3\xa9\r\n"
                                 b"Connection: close\r\n\r\n")
        good = await client.get(f"/readyz?token={token}")
        return by_query.status, dict(by_query.headers), raw, good.status

    status, headers, raw, good = _call(app, calls)
    assert status == 401 and raw.startswith(b"HTTP/1.1 401") and good == 200
    # item 3: a 401 tells nothing of the model
    assert "X-Model-Version" not in headers and "X-Model-Age" not in headers
    assert b"X-Model-Version" not in raw and b"X-Model-Age" not in raw


def test_a_401_carries_no_model_version_or_age_and_an_answer_after_the_token_does(criteo, tmp_path):
    app = _app(criteo[0], token=TOKEN)

    async def calls(client):
        out = []
        for path, kw in [("/predict", {"data": b"x"}), ("/readyz", {}), ("/nowhere", {}), ("/healthz", {})]:
            r = await (client.post(path, **kw) if path == "/predict" else client.get(path))
            out.append((r.status, dict(r.headers)))
        r = await client.get("/readyz", headers={"Authorization": f"Bearer {TOKEN}"})
        return out, (r.status, dict(r.headers))

    refused, allowed = _call(app, calls)
    for status, headers in refused:  # /healthz asks for no token, and says nothing of the model either
        assert status in (401, 200) and not {"X-Model-Version", "X-Model-Age"} & set(headers), headers
    assert [s for s, _ in refused] == [401, 401, 401, 200]
    assert allowed[0] == 200 and allowed[1]["X-Model-Version"] == "m"


# ---- item 7: JSON nested too deep --------------------------------------------------------------------------------

def test_json_nested_100000_levels_deep_is_a_400_naming_the_nesting(criteo):
    async def calls(client):
        out = []
        for body in [b'{"rows": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", b"[" * 100_000,
                     b'{"rows": ["' + b"[" * 100_000 + b'"]}']:  # brackets in a string do not nest
            r = await client.post("/predict", data=body, headers={"Content-Type": "application/json"})
            out.append((r.status, (await r.json())["error"]))
        return out

    (deep, deep_status), (open_only, _), (in_string, _) = [(e, s) for s, e in _call(_app(criteo[0]), calls)]
    assert deep_status == 400 and f"nests more than {MAX_JSON_DEPTH} levels" in deep and "{\"rows\"" in deep
    assert f"more than {MAX_JSON_DEPTH} levels" in open_only
    assert "levels" not in in_string and "row 1" in in_string  # parsed, and the row refused by the parser


# ---- item 23: JSON without its Content-Type ----------------------------------------------------------------------

def test_a_json_body_is_recognised_without_its_content_type(criteo):
    url, path = criteo
    lines = path.read_text().splitlines()[:20]
    want = load_model(url).predict_proba(str(path))[:20]
    body = json.dumps({"rows": lines}).encode()

    async def calls(client):
        out = []
        for ctype in ["application/x-www-form-urlencoded", "application/octet-stream", None, "application/json"]:
            r = await client.post("/predict", data=b"\n  " + body, headers={"Content-Type": ctype} if ctype else {})
            out.append((r.status, await r.json()))
        r = await client.post("/predict", data=body, headers={"Content-Type": "text/plain"})  # text, as it says
        out.append((r.status, await r.json()))
        r = await client.post("/predict", data=("\n".join(lines) + "\n").encode(),
                              headers={"Content-Type": "application/x-www-form-urlencoded"})
        out.append((r.status, await r.json()))
        return out

    *as_json, as_text, rows = _call(_app(url), calls)
    for status, answer in [*as_json, rows]:
        assert status == 200, answer
        assert np.array_equal(np.array(answer["probabilities"]), want)
    assert as_text[0] == 400 and "line 1" in as_text[1]["error"]


def test_the_rule_for_json():
    assert is_json("application/json", b"1 2:3") and is_json("application/problem+json", b"")
    assert not is_json("text/plain", b'{"rows": []}') and not is_json("text/csv", b"[1]")
    assert is_json("application/x-www-form-urlencoded", b' \r\n\t{"rows": []}') and is_json("", bytearray(b"[1]"))
    assert not is_json("application/octet-stream", b"1 3:1\n") and not is_json("", b"0\t1\t\t\n")


# ---- item 5: rows and bytes a request, and held at once --------------------------------------------------------------

def test_rows_over_max_rows_are_a_413_naming_the_bound_and_the_fix(criteo):
    url, path = criteo
    text = path.read_bytes()  # 300 rows
    limits = Limits(max_rows=100)

    async def calls(client):
        out = []
        for body, ctype in [(text, "text/plain"), (json.dumps({"rows": text.decode().splitlines()}).encode(), None),
                            (b"\n".join(text.splitlines()[:100]) + b"\n", "text/plain")]:
            r = await client.post("/predict", data=body, headers={"Content-Type": ctype} if ctype else {})
            out.append((r.status, await r.json()))
        return out

    (text_status, text_answer), (json_status, json_answer), (ok, _) = _call(_app(url, limits=limits), calls)
    for status, answer in [(text_status, text_answer), (json_status, json_answer)]:
        assert status == 413
        assert "over the service's bound (--max-rows 100)" in answer["error"] and "larger --max-rows" in \
            answer["error"], answer
    assert "300 rows" in json_answer["error"] and ok == 200


def test_a_body_over_max_body_is_a_413_and_over_the_bytes_held_a_503_with_retry_after(criteo):
    url, path = criteo
    stats = Stats()
    limits = Limits(max_body_bytes=MIB, max_held_bytes=2 * MIB)

    async def calls(client):
        big = await client.post("/predict", data=b"0\t" * MIB, headers={"Content-Type": "text/plain"})
        chunked = await client.post("/predict", data=_chunks(b"0\t" * MIB), headers={"Content-Type": "text/plain"})
        stats.body_bytes_held = 2 * MIB - 10  # other requests hold nearly all
        busy = await client.post("/predict", data=path.read_bytes(), headers={"Content-Type": "text/plain"})
        stats.body_bytes_held = 0
        ok = await client.post("/predict", data=path.read_bytes(), headers={"Content-Type": "text/plain"})
        return [(r.status, dict(r.headers), await r.json()) for r in (big, chunked, busy, ok)]

    big, chunked, busy, ok = _call(_app(url, stats, limits=limits), calls)
    for status, _, answer in (big, chunked):
        assert status == 413 and "--max-body-mb 1" in answer["error"], answer
    assert busy[0] == 503 and busy[1]["Retry-After"] == "1" and "--max-held-mb 2" in busy[2]["error"]
    assert ok[0] == 200 and stats.body_bytes_held == 0


async def _until(condition, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


async def _chunks(data):
    for i in range(0, len(data), 1 << 16):
        yield data[i:i + 1 << 16]


def test_a_large_body_scored_a_piece_at_a_time_answers_as_it_would_whole(criteo, monkeypatch):
    url, path = criteo
    want = load_model(url).predict_proba(str(path))
    text = path.read_bytes()
    lines = text.decode().splitlines()
    bad = "\n".join(lines[:250] + ["x\ty"] + lines[250:]).encode()

    async def calls(client):
        out = []
        for body, ctype in [(text, "text/plain"), (json.dumps({"rows": lines}).encode(), "application/json"),
                            (bad, "text/plain"), (json.dumps({"rows": bad.decode().splitlines()}).encode(), None)]:
            r = await client.post("/predict", data=body, headers={"Content-Type": ctype} if ctype else {})
            out.append((r.status, await r.json()))
        return out

    monkeypatch.setattr(rows_module, "PIECE_BYTES", 2000)  # some 8 rows a piece
    monkeypatch.setattr(rows_module, "PIECE_ROWS", 7)
    (s1, a1), (s2, a2), (s3, a3), (s4, a4) = _call(_app(url), calls)
    assert s1 == s2 == 200 and np.array_equal(a1["probabilities"], want) and np.array_equal(a2["probabilities"], want)
    assert s3 == s4 == 400 and a3["error"].startswith("line 251:") and a4["error"].startswith("row 251:"), (a3, a4)


# ---- item 6: a client that hangs up mid-body -------------------------------------------------------------------------

def _served(app, fn):
    """``fn(port)`` against ``app`` served as ``paramserver serve`` serves it (its Guard, its
    aiohttp settings: a handler is not cancelled when its client goes)."""
    async def main():
        runner, server = await open_http(app, "127.0.0.1", 0)
        try:
            return await fn(server.sockets[0].getsockname()[1])
        finally:
            server.close()
            await runner.cleanup()

    return asyncio.run(main())


async def _get(port, path):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return answer


def test_a_client_that_hangs_up_mid_body_is_counted_not_an_error(criteo, caplog):
    stats = Stats()
    caplog.set_level(logging.DEBUG)

    async def calls(port):
        for _ in range(3):  # headers and part of the body, then gone while the server reads it
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
                         b"Content-Length: 100000\r\n\r\n" + b"0\t" * 500)
            await _until(lambda: stats.body_bytes_held > 0)
            writer.close()
            await _until(lambda: stats.body_bytes_held == 0)
        await _until(lambda: stats.client_disconnects == 3)
        return (await _get(port, "/metrics")).decode()

    metrics = _served(_app(criteo[0], stats), calls)
    assert "paramserver_serve_client_disconnects_total 3.0" in metrics and 'status="500"' not in metrics
    assert ('/predict' not in metrics.split("requests_total")[1]), "a request never answered is not counted as one"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert "Traceback" not in caplog.text


# ---- item 4: headers and bodies that do not arrive, connections over the bound ---------------------------------

def test_slow_headers_and_slow_bodies_are_closed_and_connections_are_bounded(criteo):
    stats = Stats()
    limits = Limits(header_timeout_s=0.5, body_timeout_s=0.5, max_connections=6)

    async def calls(port):
        t0 = time.monotonic()
        slow = []
        for first in [b"", b"GET /readyz HTTP/1.1\r\nHost:", b"POST /predict HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Length: 1000\r\n\r\n1"]:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(first)
            slow.append((reader, writer))
        await _until(lambda: stats.connections_open == 3)
        more = [await asyncio.open_connection("127.0.0.1", port) for _ in range(4)]  # the 7th is one too many
        refused = await asyncio.wait_for(more[-1][0].read(), 5)
        answers = [await asyncio.wait_for(r.read(), 5) for r, _ in slow]  # the server closes each: EOF
        took = time.monotonic() - t0
        for _, w in more + slow:
            w.close()
        return refused, answers, took, await _get(port, "/readyz")

    refused, (idle, header, body), took, ready = _served(_app(criteo[0], stats, limits=limits), calls)
    assert refused.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in refused and b"--max-connections" in refused
    assert idle.startswith(b"HTTP/1.1 408") and header.startswith(b"HTTP/1.1 408") and b"--header-timeout" in header
    assert body.startswith(b"HTTP/1.1 408") and b"--body-timeout 0.5" in body, body
    assert took < 5 and ready.startswith(b"HTTP/1.1 200")
    assert stats.timeouts == {"header": 5, "body": 1} and stats.connections_refused == 1  # 3 idle ones too


# ---- /readyz and /metrics of a follower --------------------------------------------------------------------------

def _snap(url, age_s):
    snap = load_once(url)
    return Snapshot(snap.replica, "00000007-delta", 7, time.time() - age_s)


def test_readyz_says_when_a_follower_cannot_follow(criteo):
    url = criteo[0]
    following = dict(follow_url="file:///pub", follow_alive=True, follow_last_ok_at=time.time())
    fresh, old = _snap(url, 5), _snap(url, 7200)
    assert readiness(fresh, Stats(**following))[0] == 200
    assert readiness(old, Stats())[1]["status"] == "ready"  # --model: not followed, no bound
    status, doc = readiness(fresh, Stats(**(following | {"follow_alive": False,
                                                         "follow_last_error": "IndexError: index 99 is out"})))
    assert status == 503 and "follow loop of file:///pub has stopped" in doc["reason"] and "IndexError" in doc["reason"]
    status, doc = readiness(fresh, Stats(**(following | {"follow_last_error": "PUBLISH.json: damaged"})))
    assert status == 200 and doc["status"] == "degraded" and "PUBLISH.json: damaged" in doc["reason"]
    assert readiness(old, Stats(**following), max_age_s=0)[0] == 200  # no bound by default
    status, doc = readiness(old, Stats(**following), max_age_s=3600)
    assert status == 503 and "over --max-age 3600" in doc["reason"]
    status, doc = readiness(None, Stats(**following))
    assert status == 503 and "no model loaded yet" in doc["reason"]


def test_the_service_answers_readyz_and_metrics_from_the_followers_fields(criteo):
    url = criteo[0]
    holder, stats = Holder(), Stats(follow_url="file:///pub", follow_alive=True, follow_last_ok_at=time.time() - 30,
                                    follow_errors=4)
    holder.swap(_snap(url, 10))
    app = make_app(holder, stats, max_age_s=600)

    async def calls(client):
        ready = await client.get("/readyz")
        out = [(ready.status, await ready.json())]
        stats.follow_alive, stats.follow_last_error = False, "IndexError: keys outside the model"
        dead = await client.get("/readyz")
        out.append((dead.status, await dead.json()))
        return out, await (await client.get("/metrics")).text()

    (ready, dead), metrics = _call(app, calls)
    assert ready[0] == 200 and ready[1]["status"] == "ready"
    assert dead[0] == 503 and "IndexError" in dead[1]["reason"]
    assert "paramserver_serve_follow_alive 0.0" in metrics and "paramserver_serve_follow_errors_total 4.0" in metrics
    age = float(metrics.split("\nparamserver_serve_follow_last_ok_age_seconds ")[1].split()[0])
    assert 29 <= age < 120 and "paramserver_serve_follow_failing 1.0" in metrics


# ---- the flags ---------------------------------------------------------------------------------------------------

def test_the_bounds_are_flags_of_serve_checked_with_the_flag_named(monkeypatch):
    from paramserver.cli import serve as cli_serve
    from paramserver.cli.main import build_parser
    from paramserver.errors import ConfigError
    from paramserver.serving import run

    seen = []
    monkeypatch.setattr(run, "serve", seen.append)
    args = build_parser("serve").parse_args(
        ["serve", "--follow", "pub", "--header-timeout", "3", "--body-timeout", "4", "--max-connections", "50",
         "--max-rows", "7", "--max-body-mb", "2", "--max-held-mb", "8", "--max-age", "600"])
    cli_serve.serve(args)
    assert seen[0].limits == Limits(3, 4, 50, 7, 2 * MIB, 8 * MIB) and seen[0].max_age_s == 600
    defaults = build_parser("serve").parse_args(["serve", "--model", "m"])
    assert (defaults.header_timeout, defaults.body_timeout, defaults.max_connections, defaults.max_rows,
            defaults.max_age) == (10, 60, 1000, 100_000, 0)
    helptext = _help()
    assert "first byte that is not blank is { or [" in helptext and "--max-rows" in helptext
    for bad, flag in [(dict(header_timeout_s=0), "--header-timeout"), (dict(max_rows=0), "--max-rows"),
                      (dict(max_body_bytes=4 * MIB, max_held_bytes=2 * MIB), "--max-held-mb")]:
        with pytest.raises(ConfigError, match=flag):
            Limits(**bad)
    with pytest.raises(ConfigError, match="--max-age bounds the age of a followed model"):
        run.ServeConfig(model="m", max_age_s=60)


def _help():
    import contextlib
    import io

    from paramserver.cli.main import build_parser

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        build_parser("serve").parse_args(["serve", "--help"])
    return " ".join(out.getvalue().split())


# ---- Expect: 100-continue: a request the service would refuse is refused before its body is sent ----------------

async def _expecting(port, head, body=b""):
    """The server's first answer to a request with ``Expect: 100-continue`` (before any body),
    and, when that is ``100 Continue``, its answer once ``body`` is sent."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head + b"Expect: 100-continue\r\n\r\n")
        await writer.drain()
        first = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        if not first.startswith(b"HTTP/1.1 100"):
            return first, b""
        writer.write(body)
        await writer.drain()
        return first, await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    finally:
        writer.close()


def test_an_oversized_or_unauthorized_body_is_refused_before_it_is_sent(criteo, tmp_path):
    keygen(str(tmp_path / "k"))
    token = http_token(load_keys(str(tmp_path / "k")))
    stats = Stats()
    app = _app(criteo[0], stats, token=token, limits=Limits(max_body_bytes=1 << 20, max_held_bytes=1 << 20))
    rows = b"".join(line.split(b"\t", 1)[1] for line in criteo[1].read_bytes().splitlines(True)[:20])

    async def calls(client):
        port = client.server.port
        big = await _expecting(port, b"POST /predict?token=%s HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
                                     b"Content-Length: 999999999\r\n" % token.encode())
        anonymous = await _expecting(port, b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n" % len(rows))
        fine = await _expecting(port, b"POST /predict?token=%s HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
                                      b"Content-Length: %d\r\n" % (token.encode(), len(rows)), rows)
        return big, anonymous, fine

    big, anonymous, fine = _call(app, calls)
    assert big[0].startswith(b"HTTP/1.1 413") and anonymous[0].startswith(b"HTTP/1.1 401")
    assert b"X-Model-Version" not in anonymous[0]
    assert fine[0].startswith(b"HTTP/1.1 100 Continue") and fine[1].startswith(b"HTTP/1.1 200")
    assert stats.requests[("/predict", 413)] == 1 and stats.requests[("/predict", 401)] == 1


def test_a_bound_given_wrong_is_said_as_given_and_a_host_that_is_no_address_is_blamed_on_host(criteo):
    with pytest.raises(ConfigError, match=r"--max-held-mb must be >= 1, got -1$"):  # not -1048576 (bytes)
        Limits(max_held_bytes=-MIB)
    with pytest.raises(ConfigError, match="--body-timeout must be a finite number of seconds > 0, got inf"):
        Limits(body_timeout_s=float("inf"))

    async def main():
        return await open_http(_app(criteo[0]), "no.such.host.invalid", 0)

    with pytest.raises(ConfigError, match=r"--host no\.such\.host\.invalid: not an address to listen on"):
        asyncio.run(main())
