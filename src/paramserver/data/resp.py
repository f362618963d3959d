"""A page of ``XRANGE`` read off the socket by a numba kernel: the entries' rows, joined
by newlines, with no Python object an entry.

redis-py (with hiredis) makes five Python objects an entry, under the GIL; at a CTR job's
pace that cost each worker a third of a core and the job half its examples a second
against reading the same rows from a file.  Here the reply's bytes go straight from the
socket into a buffer, and ``_page`` (nogil) copies each entry's row out of them: its field
``line`` (or the one the URL names, ``?field=``), or its first field.  The command goes
through the client's own connection (authenticated, on the right database, TLS or not),
and the reply is read on its socket; a connection left mid-reply by an error is closed,
not reused.

RESP2 only (what a connection speaks unless it said HELLO 3): an XRANGE reply is an array
of entries, each ``[id, [field, value, ...]]``; an error reply (``-ERR ...``) is raised.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from paramserver.data.batch import DataError

CR, NL, STAR, DOLLAR, MINUS = 13, 10, 42, 36, 45
NEED, DONE, BAD, ERROR = 0, 1, -1, -2
_LINE = np.frombuffer(b"line", np.uint8)


@njit(inline="always", nogil=True, cache=True)
def _int_line(buf, pos, n):  # type: ignore[no-untyped-def]
    """``(value, position after the \\r\\n)`` of the integer after ``buf[pos]``'s type byte,
    or ``(0, -1)`` if the line is not all there."""
    i, v, neg = pos + 1, 0, False
    if i < n and buf[i] == MINUS:
        neg, i = True, i + 1
    while i < n and buf[i] != CR:
        v = v * 10 + (buf[i] - 48)
        i += 1
    if i + 1 >= n:
        return 0, -1
    return (-v if neg else v), i + 2


@njit(nogil=True, cache=True)
def _bulk(buf, pos, n):  # type: ignore[no-untyped-def]
    """``(start, end, position after)`` of the bulk string at ``pos``; end -1: not all there."""
    if pos >= n:
        return 0, -1, -1
    if buf[pos] != DOLLAR:
        return 0, -2, -2
    length, at = _int_line(buf, pos, n)
    if at < 0 or at + length + 2 > n:
        return 0, -1, -1
    return at, at + length, at + length + 2


@njit(nogil=True, cache=True)
def _entry(buf, pos, n, out, out_len, line):  # type: ignore[no-untyped-def]  # noqa: C901
    """One entry ``[id, [field, value, ...]]`` at ``pos``: its row copied to ``out`` with a
    newline.  ``(status, position after, out_len, id start, id end)``."""
    if pos >= n:
        return NEED, pos, out_len, 0, 0
    if buf[pos] != STAR:
        return BAD, pos, out_len, 0, 0
    two, at = _int_line(buf, pos, n)
    if at < 0:
        return NEED, pos, out_len, 0, 0
    a, b, at = _bulk(buf, at, n)
    if b == -1:
        return NEED, pos, out_len, 0, 0
    if two != 2 or b < 0 or at >= n or buf[at] != STAR:
        return NEED if at >= n else BAD, pos, out_len, 0, 0
    fields, at = _int_line(buf, at, n)
    if at < 0:
        return NEED, pos, out_len, 0, 0
    vs, ve, first = 0, -1, True
    for _ in range(fields // 2):
        ks, ke, at = _bulk(buf, at, n)
        if ke == -1:
            return NEED, pos, out_len, 0, 0
        s, e, at = _bulk(buf, at, n)
        if ke < 0 or e == -2:
            return BAD, pos, out_len, 0, 0
        if e == -1:
            return NEED, pos, out_len, 0, 0
        named = ke - ks == line.shape[0]
        for j in range(line.shape[0]):
            if named and buf[ks + j] != line[j]:
                named = False
        if first or named:  # the first field's value, unless one is named line
            vs, ve, first = s, e, False
    for j in range(vs, ve):
        out[out_len] = buf[j]
        out_len += 1
    out[out_len] = NL
    return DONE, at, out_len + 1, a, b


@njit(nogil=True, cache=True)
def _page(buf, n, pos, remaining, out, out_len, line):  # type: ignore[no-untyped-def]
    """The whole entries of an XRANGE reply in ``buf[pos:n]`` (``remaining`` of them; -1:
    the reply's header not read yet).  ``(status, pos, remaining, out_len, last id start,
    last id end)``: DONE once every entry is read, NEED for more bytes."""
    ida, idb = 0, 0
    if remaining < 0:
        if pos >= n:
            return NEED, pos, remaining, out_len, 0, 0
        if buf[pos] == MINUS:
            return ERROR, pos, remaining, out_len, 0, 0
        if buf[pos] != STAR:
            return BAD, pos, remaining, out_len, 0, 0
        count, at = _int_line(buf, pos, n)
        if at < 0:
            return NEED, pos, remaining, out_len, 0, 0
        pos, remaining = at, max(count, 0)
    while remaining > 0:
        status, at, out_len, a, b = _entry(buf, pos, n, out, out_len, line)
        if status != DONE:
            return status, pos, remaining, out_len, ida, idb
        pos, remaining, ida, idb = at, remaining - 1, a, b
    return DONE, pos, 0, out_len, ida, idb


def xrange_page(client: Any, stream: str, start: bytes | str, end: bytes | str, count: int,
                field: str = "line") -> tuple[bytes, bytes, int]:
    """``XRANGE stream start end COUNT count`` on ``client`` (redis-py): the entries' rows
    (their ``field``, else their first field) joined by newlines (each ending in one), the
    last entry's id (b"" if none), and how many entries there were."""
    try:
        conn = client.connection_pool.get_connection()
    except TypeError:  # redis-py before 5.3 asks for the command's name
        conn = client.connection_pool.get_connection("XRANGE")
    try:
        conn.send_command("XRANGE", stream, start, end, "COUNT", count)
        rows, last, n = _read_page(conn, _LINE if field == "line" else np.frombuffer(field.encode(), np.uint8))
    except BaseException:
        conn.disconnect()  # mid-reply: the next command must not read this one's rest
        raise
    finally:
        client.connection_pool.release(conn)
    return rows, last, n


def _read_page(conn: Any, field: np.ndarray = _LINE) -> tuple[bytes, bytes, int]:
    import redis

    sock = conn._sock
    buf = bytearray(1 << 20)
    out = np.empty(len(buf), np.uint8)
    have, pos, remaining, out_len = 0, 0, -1, 0
    last = b""
    while True:
        if have == len(buf):
            buf.extend(bytes(len(buf)))
            out = np.concatenate([out, np.empty(len(buf) - out.shape[0], np.uint8)])
        got = sock.recv_into(memoryview(buf)[have:])
        if not got:
            raise redis.ConnectionError("Redis closed the connection mid-reply")
        have += got
        view = np.frombuffer(buf, np.uint8, count=have)
        status, pos, remaining, out_len, a, b = _page(view, have, pos, remaining, out, out_len, field)
        del view  # no view of buf may outlive a read: the buffer may grow
        if b > a:
            last = bytes(buf[a:b])
        if status == DONE:
            return out[:out_len].tobytes(), last, _count(buf)
        if status == ERROR and b"\r\n" in buf[:have]:  # the whole error line is in
            line = bytes(buf[1:have]).split(b"\r\n", 1)[0].decode(errors="replace")
            raise DataError(f"Redis refused XRANGE: {line}")
        if status == BAD:
            raise redis.ConnectionError("an XRANGE reply not in RESP2 (is the connection speaking RESP3?)")


def _count(buf: bytearray) -> int:
    """The entries of a whole reply: its header's count."""
    return max(0, int(bytes(buf[1:buf.index(b"\r\n")])))


def warm() -> None:
    """Load (or compile) the kernel on a sample reply: a driver does it before it forks the
    workers that read the stream, which then inherit it."""
    reply = np.frombuffer(b"*1\r\n*2\r\n$3\r\n1-0\r\n*2\r\n$4\r\nline\r\n$1\r\nx\r\n", np.uint8)
    _page(reply, reply.shape[0], 0, -1, np.empty(reply.shape[0], np.uint8), 0, _LINE)
