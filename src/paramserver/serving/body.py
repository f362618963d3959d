"""A ``/predict`` request's body: read under the service's bounds, and told apart as JSON or text.

``read_body`` reads the body into one ``bytearray`` as it arrives (it grows by an eighth
at a time, so a body takes at most ~1.13 times its size), within ``--body-timeout`` for the
whole of it, and charges every byte to the service's budget of bodies held at once
(``--max-held-mb``).  What it refuses is a ``Refused`` the app answers: 413 over
``--max-body-mb``, 503 with ``Retry-After`` while the budget is spent, 408 when the body is
late; a client that hangs up mid-body is ``ClientGone``, counted, never a 500.

``is_json`` is the rule for telling a JSON body from rows of text: the ``Content-Type``
says, when it is ``application/json`` (or ``+json``: JSON) or ``text/...`` (text); any
other type (curl's ``--data-binary`` sends ``application/x-www-form-urlencoded``), or none,
is JSON exactly when its first byte that is not blank is ``{`` or ``[``, which no row of
LIBSVM or Criteo can start with.

``json_shape`` checks a JSON body in one pass over its bytes before ``json.loads`` builds
anything: how deep it nests (``{"rows": [[[3, 1.0]]]}`` is 4; deeper than
``MAX_JSON_DEPTH`` is refused, where ``json.loads`` would raise ``RecursionError``) and how
many items its longest list inside the top-level object has (its rows, against
``--max-rows``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from aiohttp import web
from numba import njit

from paramserver.data.reader import DataError
from paramserver.serving.limits import MIB, Limits
from paramserver.serving.stats import Stats

logger = logging.getLogger(__name__)

MAX_JSON_DEPTH = 32
_NOT_BLANK = re.compile(rb"[^ \t\r\n]")


class Refused(Exception):
    """A body the service will not take: its answer's status and message (the connection is
    closed after it: the rest of the body is not read)."""

    def __init__(self, status: int, message: str, retry_after_s: int = 0) -> None:
        super().__init__(message)
        self.status, self.message, self.retry_after_s = status, message, retry_after_s


class ClientGone(Exception):
    """The client hung up before its body was read whole."""


@contextlib.asynccontextmanager
async def read_body(request: web.Request, limits: Limits, stats: Stats) -> AsyncIterator[bytearray]:
    """The request's body, its bytes held against ``--max-held-mb`` until the block ends."""
    held = [0]
    try:
        yield await _read(request, limits, stats, held)
    finally:
        stats.body_bytes_held -= held[0]


async def _read(request: web.Request, limits: Limits, stats: Stats, held: list[int]) -> bytearray:
    length, cap = request.content_length, limits.max_body_bytes
    if length is not None and length > cap:
        raise Refused(413, too_large(f"{length} bytes", cap))
    body = bytearray()
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout_at(loop.time() + limits.body_timeout_s):
            while chunk := await request.content.readany():
                if len(body) + len(chunk) > cap:
                    raise Refused(413, too_large(f"over {cap} bytes", cap))
                if stats.body_bytes_held + len(chunk) > limits.max_held_bytes:
                    raise Refused(503, f"the server holds {stats.body_bytes_held / MIB:.0f} MiB of request bodies, "
                                       f"its bound (--max-held-mb {limits.max_held_bytes // MIB}): retry shortly",
                                  retry_after_s=1)
                stats.body_bytes_held += len(chunk)
                held[0] += len(chunk)
                body += chunk
    except TimeoutError:
        stats.timeouts["body"] = stats.timeouts.get("body", 0) + 1
        logger.debug("a body took over %g s (--body-timeout): %d bytes read", limits.body_timeout_s, len(body))
        raise Refused(408, f"the body did not arrive whole within --body-timeout {limits.body_timeout_s:g} s "
                           f"({len(body)} of {length if length is not None else '?'} bytes read)") from None
    except (ConnectionError, web.RequestPayloadError) as exc:  # aiohttp's own for a body cut short
        raise ClientGone(f"{len(body)} bytes of {length if length is not None else '?'} read: {exc}") from None
    return body


def too_large(size: str, cap: int) -> str:
    return (f"the body is {size}, over the service's bound (--max-body-mb {cap // MIB}): send fewer rows a "
            "request, or start serve with a larger --max-body-mb")


def is_json(content_type: str, body: Any) -> bool:
    """Whether a body is JSON (the module's rule)."""
    if content_type == "application/json" or content_type.endswith("+json"):
        return True
    if content_type.startswith("text/"):
        return False
    first = _NOT_BLANK.search(body)
    return first is not None and first.group() in (b"{", b"[")


def has_rows(body: Any) -> bool:
    """Whether the body has anything but blanks (without a copy of it, as ``strip`` makes)."""
    return _NOT_BLANK.search(body) is not None


def check_json_shape(body: Any, max_rows: int) -> None:
    """A ``DataError`` for a body nested deeper than ``MAX_JSON_DEPTH``; ``Refused`` (413) for
    one whose rows are over ``max_rows``."""
    depth, items = _json_shape(np.frombuffer(body, np.uint8), MAX_JSON_DEPTH)
    if depth > MAX_JSON_DEPTH:
        raise DataError(f"the JSON body nests more than {MAX_JSON_DEPTH} levels deep; a body is {{\"rows\": [...]}}, "
                        "each row a line or a list of tokens (4 levels at most: {\"rows\": [[[3, 1.0]]]})")
    if items > max_rows:
        raise Refused(413, too_many_rows(items, max_rows))


def too_many_rows(rows: int, max_rows: int) -> str:
    return (f"the request has {rows} rows, over the service's bound (--max-rows {max_rows}): send at most "
            f"{max_rows} rows a request, or start serve with a larger --max-rows")


@njit(inline="always", nogil=True, cache=True)
def _after_string(b, i):  # type: ignore[no-untyped-def]
    """Where the string whose opening quote is at ``i`` ends (past its closing quote)."""
    i += 1
    while i < b.shape[0]:
        if b[i] == 92:  # a backslash: the next byte is escaped
            i += 2
            continue
        if b[i] == 34:
            return i + 1
        i += 1
    return i


@njit(nogil=True, cache=True)
def _json_shape(b, limit):  # type: ignore[no-untyped-def]
    """(depth, items): how deep ``b`` nests (stopping past ``limit``), and the most items a
    list two levels down has (strings skipped, their escapes too)."""
    depth = deepest = items = most = 0
    filled = False
    i = 0
    while i < b.shape[0]:
        c = b[i]
        i += 1
        if c == 32 or c == 9 or c == 10 or c == 13:
            continue
        if depth == 2 and c == 44:  # a comma between two items of a list two levels down
            items += 1
            continue
        if depth == 2 and c == 93:  # its end
            most = max(most, items + 1 if filled else 0)
        elif depth >= 2:
            filled = True
        if c == 34:
            i = _after_string(b, i - 1)
        elif c == 91 or c == 123:  # [ {
            depth += 1
            deepest = max(deepest, depth)
            if depth > limit:
                return deepest, most
            if depth == 2:
                items, filled = 0, False
        elif c == 93 or c == 125:  # ] }
            depth -= 1
    return deepest, most
