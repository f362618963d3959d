"""The HTTP service: ``POST /predict``, ``GET /healthz``, ``/readyz`` and ``/metrics``.

``/predict`` scores on the event loop, start to end with no ``await`` between taking the
model's snapshot and giving it back, so a request is answered by one model version; a
request of 1 000 rows takes about a millisecond.  Every answer says the model's version
and age (``X-Model-Version``, ``X-Model-Age``); with a secret, every endpoint but
``/healthz`` asks for the cluster's HTTP token (``?token=`` or ``Authorization: Bearer``).
A malformed request is a 400 that says what is wrong and where, never a 500.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from aiohttp import web

from paramserver.data.reader import DataError
from paramserver.serving.encode import floats_json
from paramserver.serving.model import Holder, Snapshot, score
from paramserver.serving.rows import json_batch, text_batch
from paramserver.serving.stats import Stats, renderer
from paramserver.wire.security import authorized

logger = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ENDPOINTS = frozenset({"/predict", "/healthz", "/readyz", "/metrics"})
MAX_BODY = 256 << 20
SMALL = 64  # rows: a request this small always counts its unseen features

HOLDER: web.AppKey[Holder] = web.AppKey("holder", Holder)
STATS: web.AppKey[Stats] = web.AppKey("stats", Stats)


def _json(doc: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(doc).encode(), status=status, content_type="application/json")


def _error(status: int, message: str) -> web.Response:
    return _json({"error": message}, status)


def _model_headers(response: web.StreamResponse, snap: Snapshot | None) -> None:
    if snap is None:
        response.headers["X-Model-Version"] = "none"
        response.headers["X-Model-Age"] = "nan"
    else:
        response.headers["X-Model-Version"] = snap.version
        response.headers["X-Model-Age"] = f"{snap.age_s:.3f}"


def _middleware(token: str, holder: Holder, stats: Stats) -> Any:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        t0 = time.perf_counter()
        if token and request.path != "/healthz" and not authorized(request.query_string, request.headers, token):
            response: web.StreamResponse = _error(401, "this service has a secret (--secret-file): pass the cluster's "
                                                       "HTTP token as ?token=T or the header Authorization: Bearer T")
        else:
            try:
                response = await handler(request)
            except web.HTTPException as exc:
                response = _error(exc.status, exc.reason if exc.status != 404 else
                                  f"no {request.path}: the endpoints are POST /predict, GET /healthz, /readyz, "
                                  "/metrics")
            except Exception:  # a bug must not take the service down: logged, answered 500
                logger.exception("%s %s failed", request.method, request.path)
                response = _error(500, "internal error (logged by the server)")
        if "X-Model-Version" not in response.headers:
            _model_headers(response, holder.current)
        endpoint = request.path if request.path in ENDPOINTS else "other"
        stats.request(endpoint, response.status, time.perf_counter() - t0)
        return response

    return middleware


def make_app(holder: Holder, stats: Stats, token: str = "") -> web.Application:
    """The service over ``holder``'s model (``token``: the HTTP token asked for, "" for none)."""
    app = web.Application(middlewares=[_middleware(token, holder, stats)], client_max_size=MAX_BODY)
    app[HOLDER], app[STATS] = holder, stats
    render = renderer(lambda: stats.families(holder.current))

    async def healthz(request: web.Request) -> web.Response:
        return _json({"status": "up"})

    async def readyz(request: web.Request) -> web.Response:
        snap = holder.current
        if snap is None:
            return _json({"ready": False, "reason": "no model loaded yet (nothing published, or loading)"}, 503)
        return _json({"ready": True, "model_version": snap.version, "model_age_s": snap.age_s})

    async def metrics(request: web.Request) -> web.Response:
        body, content_type = render()
        return web.Response(body=body, headers={"Content-Type": content_type})

    app.router.add_post("/predict", _predict)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


async def _predict(request: web.Request) -> web.Response:
    body = await request.read()
    holder, stats = request.app[HOLDER], request.app[STATS]
    if not body.strip():
        return _error(400, "the request has no rows: POST lines in the model's format (text/plain), or JSON "
                           "{\"rows\": [...]}")
    snap = holder.acquire()  # from here to release: no await, one model version
    if snap is None:
        return _error(503, "no model loaded yet: see /readyz")
    try:
        fmt = snap.replica.data
        batch = json_batch(body, fmt) if request.content_type == "application/json" else text_batch(body, fmt)
        stats.scored += 1  # the unseen share from every request of a few rows, and one large request in 8
        scored = score(snap.replica, batch, count_unseen=len(batch) <= SMALL or stats.scored % 8 == 0)
    except DataError as exc:
        response = _error(400, str(exc))
        _model_headers(response, snap)
        return response
    finally:
        holder.release(snap)
    stats.rows += len(batch)
    stats.features += scored.features
    stats.unseen += scored.unseen
    age = snap.age_s
    out = web.Response(body=_answer(scored.probabilities, snap.version, age), content_type="application/json")
    out.headers["X-Model-Version"] = snap.version
    out.headers["X-Model-Age"] = f"{age:.3f}"
    return out


def _answer(probabilities: np.ndarray, version: str, age: float) -> bytes:
    """The answer's JSON: the probabilities exactly (each reads back as the same float64)."""
    return (b'{"probabilities": ' + floats_json(probabilities) + b', "model_version": '
            + json.dumps(version).encode() + f', "model_age_s": {age:.3f}}}'.encode())
