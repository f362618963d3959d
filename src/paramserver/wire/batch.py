"""Envelopes: several requests to one server, or their answers, as one ZeroMQ message.

A training worker sends each mini-batch's push and the pull of a batch further on one
after the other to the same server.  As two messages they cost every hop twice: a wake-up
of the client's I/O thread, a send through each side's ZeroMQ I/O thread, a receive, a
decode and a reply on the server.  As one envelope they cost each hop once, and the server
answers the parts it answers at once in one envelope too.

    frame 0   msgpack map {"op": "batch", "parts": [k1, k2, ...]}
    frames    part 1's k1 frames (a message as ``wire/message.py`` frames it), then part 2's, ...

A part is a whole message with its own ``id``: it is decoded, checked and answered as if it
had come alone, in order, so an envelope means nothing the same messages sent one by one
would not.  An answer the server gives later (a pull parked by the staleness gate, a push
waiting on its backups) goes alone.  An envelope is never a part of another.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack

from paramserver.errors import ProtocolError

OP = "batch"
MAX_PARTS = 1024  # an envelope of more parts is refused whole: no sender of ours makes one
HEADER_ROOM = 1 << 12  # bytes an envelope's own header frame may take, at MAX_PARTS counts


def envelope(parts: Sequence[Sequence[Any]]) -> list[Any]:
    """The frames of one envelope holding ``parts`` (each a message's frames), in order."""
    frames: list[Any] = [msgpack.packb({"op": OP, "parts": [len(p) for p in parts]}, use_bin_type=True)]
    for part in parts:
        frames.extend(part)
    return frames


def packed(messages: list[list[Any]], max_bytes: int) -> list[list[Any]]:
    """``messages`` (each a message's frames) as few messages as go, in order: runs of them
    in envelopes of at most ``MAX_PARTS`` parts and ``max_bytes`` in all (what a receiver's
    ``decode`` takes), a run of one alone.  The answers to an envelope of small requests may
    be far larger than it (a pull's rows against its keys): they are packed again here."""
    if len(messages) < 2:  # a request's answer: nothing to pack
        return messages
    out: list[list[Any]] = []
    run: list[list[Any]] = []
    size = 0
    for message in messages:
        nbytes = sum(memoryview(f).nbytes for f in message)
        if run and (len(run) == MAX_PARTS or size + nbytes + HEADER_ROOM > max_bytes):
            out.append(run[0] if len(run) == 1 else envelope(run))
            run, size = [], 0
        run.append(message)
        size += nbytes
    if run:
        out.append(run[0] if len(run) == 1 else envelope(run))
    return out


def split(header: dict[str, Any], frames: Sequence[Any]) -> list[Sequence[Any]]:
    """The parts of the envelope whose header frame (``frames[0]``) ``decode`` read as
    ``header``: each a message's frames.

    Raises:
        ProtocolError: ``parts`` is not a list of positive counts that add up to the
            frames that follow, or there are more than ``MAX_PARTS``.
    """
    counts = header.get("parts")
    if (not isinstance(counts, list) or not 0 < len(counts) <= MAX_PARTS
            or not all(isinstance(k, int) and not isinstance(k, bool) and k > 0 for k in counts)
            or sum(counts) != len(frames) - 1):
        raise ProtocolError(f"a batch's parts must be 1 to {MAX_PARTS} positive frame counts adding up to the "
                            f"{len(frames) - 1} frames that follow its header, got {counts!r}")
    parts, at = [], 1
    for k in counts:
        parts.append(frames[at:at + k])
        at += k
    return parts
