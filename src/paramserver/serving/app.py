"""The HTTP service: ``POST /predict``, ``GET /healthz``, ``/readyz`` and ``/metrics``.

``/predict`` reads its body whole under the service's bounds (``body.py``), then takes the
model's snapshot and scores the body with it a piece at a time (``rows.py``), letting
other requests in between two pieces of a large body: a request is answered by one model
version, and a request of 1 000 rows takes about a millisecond.  An answer given once the
token is checked says the model's version and age (``X-Model-Version``,
``X-Model-Age``); a 401 says nothing of the model.  With a secret, every endpoint but
``/healthz`` asks for the cluster's HTTP token (``?token=`` or ``Authorization: Bearer``).
A malformed request is a 400 that says what is wrong and where, never a 500; a request
over a bound is a 413, 408 or 503 that names the bound and its flag; a client that hangs up
mid-body is counted (``client_disconnects_total``) and logged at DEBUG, not answered.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from aiohttp import web

from paramserver.data.reader import DataError
from paramserver.serving.body import (
    ClientGone,
    Refused,
    check_json_shape,
    has_rows,
    is_json,
    read_body,
    too_large,
    too_many_rows,
)
from paramserver.serving.encode import floats_json_view
from paramserver.serving.json_body import json_rows
from paramserver.serving.limits import Guard, Limits
from paramserver.serving.model import Holder, Snapshot, score
from paramserver.serving.rows import PIECE_BYTES, json_batches, text_batches
from paramserver.serving.stats import Stats, readiness, renderer
from paramserver.wire.security import authorized

logger = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ENDPOINTS = frozenset({"/predict", "/healthz", "/readyz", "/metrics"})
SMALL = 64  # rows: a request this small always counts its unseen features

HOLDER: web.AppKey[Holder] = web.AppKey("holder", Holder)
STATS: web.AppKey[Stats] = web.AppKey("stats", Stats)
LIMITS: web.AppKey[Limits] = web.AppKey("limits", Limits)
GUARDS: web.AppKey[dict[Any, Guard]] = web.AppKey("guards", dict)  # aiohttp protocol -> its connection's guard


def _json(doc: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(doc).encode(), status=status, content_type="application/json")


def _error(status: int, message: str) -> web.Response:
    return _json({"error": message}, status)


UNAUTHORIZED = ("this service has a secret (--secret-file): pass the cluster's HTTP token as ?token=T or the "
                "header Authorization: Bearer T")


def _expect(token: str, limits: Limits, stats: Stats) -> Any:
    """``/predict``'s answer to ``Expect: 100-continue``: a request the service would refuse
    (no token, a body over ``--max-body-mb``) is answered at once, before the client sends
    its body; any other is told to go on."""

    async def expect(request: web.Request) -> web.StreamResponse | None:
        refusal = None
        if token and not authorized(request.query_string, request.headers, token):
            refusal = _error(401, UNAUTHORIZED)
        elif request.content_length is not None and request.content_length > limits.max_body_bytes:
            refusal = _error(413, too_large(f"{request.content_length} bytes", limits.max_body_bytes))
        elif request.headers.get("Expect", "").lower() != "100-continue":
            refusal = _error(417, f"Expect: {request.headers.get('Expect', '')[:100]} is not one this service "
                                  "meets (only 100-continue)")
        if refusal is not None:
            refusal.force_close()  # the body, if the client sends it anyway, is not read
            stats.request("/predict", refusal.status, 0.0)
            return refusal
        if request.version >= (1, 1):
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            request.writer.output_size = 0  # the answer proper starts after it
        return None

    return expect


def _model_headers(response: web.StreamResponse, snap: Snapshot | None) -> None:
    if snap is None:
        response.headers["X-Model-Version"] = "none"
        response.headers["X-Model-Age"] = "nan"
    else:
        response.headers["X-Model-Version"] = snap.version
        response.headers["X-Model-Age"] = f"{snap.age_s:.3f}"


def _middleware(token: str, holder: Holder, stats: Stats, guards: dict[Any, Guard]) -> Any:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        t0 = time.perf_counter()
        guard = guards.get(request.protocol)
        if guard is not None:
            guard.request_started()
        try:
            if token and request.path != "/healthz" and not authorized(request.query_string, request.headers, token):
                response: web.StreamResponse = _error(401, UNAUTHORIZED)
            else:  # /healthz asks for no token: with a secret, it says nothing of the model either
                response = await _answer_of(request, handler, holder if not token or request.path != "/healthz"
                                            else None)
        except ClientGone as exc:
            stats.client_disconnects += 1
            logger.debug("%s %s: the client hung up mid-body (%s)", request.method, request.path, exc)
            return web.Response(status=400)  # never sent: the connection is gone
        finally:
            if guard is not None:
                guard.request_ended()
        endpoint = request.path if request.path in ENDPOINTS else "other"
        stats.request(endpoint, response.status, time.perf_counter() - t0)
        return response

    return middleware


async def _answer_of(request: web.Request, handler: Handler, holder: Holder | None) -> web.StreamResponse:
    """The handler's answer, an error's as JSON, with ``holder``'s model's headers (None: none)."""
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        response = _error(exc.status, exc.reason if exc.status != 404 else
                          f"no {request.path}: the endpoints are POST /predict, GET /healthz, /readyz, /metrics")
    except ClientGone:
        raise
    except Exception:  # a bug must not take the service down: logged, answered 500
        logger.exception("%s %s failed", request.method, request.path)
        response = _error(500, "internal error (logged by the server)")
    if holder is not None and "X-Model-Version" not in response.headers:
        _model_headers(response, holder.current)
    return response


def make_app(holder: Holder, stats: Stats, token: str = "", limits: Limits | None = None,
             max_age_s: float = 0.0) -> web.Application:
    """The service over ``holder``'s model (``token``: the HTTP token asked for, "" for none;
    ``max_age_s``: how old a followed model may be and still be ready, 0 for no bound)."""
    limits = limits or Limits()
    guards: dict[Any, Guard] = {}
    app = web.Application(middlewares=[_middleware(token, holder, stats, guards)],
                          client_max_size=limits.max_body_bytes)
    app[HOLDER], app[STATS], app[LIMITS], app[GUARDS] = holder, stats, limits, guards
    render = renderer(lambda: stats.families(holder.current))

    async def healthz(request: web.Request) -> web.Response:
        return _json({"status": "up"})

    async def readyz(request: web.Request) -> web.Response:
        status, doc = readiness(holder.current, stats, max_age_s)
        return _json(doc, status)

    async def metrics(request: web.Request) -> web.Response:
        body, content_type = render()
        return web.Response(body=body, headers={"Content-Type": content_type})

    app.router.add_post("/predict", _predict, expect_handler=_expect(token, limits, stats))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


async def _predict(request: web.Request) -> web.Response:
    holder, stats, limits = request.app[HOLDER], request.app[STATS], request.app[LIMITS]
    try:
        async with read_body(request, limits, stats) as body:
            return await _scored(request, body, holder, stats, limits)
    except Refused as exc:
        response = _error(exc.status, exc.message)
        if exc.retry_after_s:
            response.headers["Retry-After"] = str(exc.retry_after_s)
        response.force_close()  # the rest of the body is not read
        return response


async def _scored(request: web.Request, body: bytearray, holder: Holder, stats: Stats, limits: Limits) -> web.Response:
    """``body``'s probabilities, scored with one snapshot, a piece at a time."""
    if not has_rows(body):
        return _error(400, "the request has no rows: POST lines in the model's format, or JSON {\"rows\": [...]} "
                           "(see --help: a body starting with { or [ is JSON unless its type is text/...)")
    as_json = is_json(request.content_type, body)
    if as_json:
        try:
            check_json_shape(body, limits.max_rows)
        except DataError as exc:
            return _error(400, str(exc))
    elif (lines := body.count(b"\n")) > limits.max_rows + 2:  # a header and a blank last line may come with them
        raise Refused(413, too_many_rows(lines, limits.max_rows))
    large = len(body) > PIECE_BYTES
    snap = holder.acquire()  # from here to release: one model version
    if snap is None:
        return _error(503, "no model loaded yet: see /readyz")
    try:
        fmt = snap.replica.data
        pieces = json_batches(json_rows(body, limits.max_rows), fmt) if as_json else text_batches(body, fmt)
        probabilities: list[np.ndarray] = []
        rows = features = unseen = 0
        stats.scored += 1  # the unseen share from every request of a few rows, and one large request in 8
        sample = stats.scored % 8 == 0
        for batch in pieces:
            rows += len(batch)
            if rows > limits.max_rows:
                raise Refused(413, too_many_rows(rows, limits.max_rows))
            scored = score(snap.replica, batch, count_unseen=sample or (rows <= SMALL and not probabilities))
            probabilities.append(scored.probabilities)
            features, unseen = features + scored.features, unseen + scored.unseen
            if large:
                await asyncio.sleep(0)  # other requests, between two pieces of a large body
    except DataError as exc:
        response = _error(400, str(exc))
        _model_headers(response, snap)
        return response
    finally:
        holder.release(snap)
    if not probabilities:
        return _error(400, "the request has no rows: POST lines in the model's format, or JSON {\"rows\": [...]}")
    stats.rows += rows
    stats.features += features
    stats.unseen += unseen
    age = snap.age_s
    out = web.Response(body=_answer(np.concatenate(probabilities) if len(probabilities) > 1 else probabilities[0],
                                    snap.version, age), content_type="application/json")
    out.headers["X-Model-Version"] = snap.version
    out.headers["X-Model-Age"] = f"{age:.3f}"
    return out


def _answer(probabilities: np.ndarray, version: str, age: float) -> bytes:
    """The answer's JSON: the probabilities exactly (each reads back as the same float64),
    written once into the answer (a large request's answer is tens of MB)."""
    return b"".join((b'{"probabilities": ', floats_json_view(probabilities), b', "model_version": ',
                     json.dumps(version).encode(), f', "model_age_s": {age:.3f}}}'.encode()))
