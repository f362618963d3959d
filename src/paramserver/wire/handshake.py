"""Why a scheduler does not answer a node that has keys: a CurveZMQ handshake tried apart.

With CurveZMQ a wrong key gets no answer at all (``wire/security.py``: the handshake
fails and no message reaches the application), so a node that waited its whole connect
timeout could once only ask whether the scheduler was running.  ``handshake`` opens one
link of its own to the address with the node's keys and watches it (a ZeroMQ socket
monitor): the scheduler's end accepts the keys (``OK``), refuses them (``REFUSED``: the
file is another cluster's, or its client key is not listed), speaks no CurveZMQ at all
(``PLAIN``: a cluster without keys), or gives no verdict in time (``UNKNOWN``: nothing
there yet, or not a ZeroMQ peer).  ``unanswered`` words what a node tells its user.
"""

from __future__ import annotations

import time
from typing import Any

import zmq

from paramserver.wire.security import Keys, load_keys, secure_client
from paramserver.wire.sockets import leaving_from, source_host

OK, REFUSED, PLAIN, UNKNOWN = "ok", "refused", "plain", "unknown"
#: a link closed with no detail: a verdict ``handshake`` settles with a second link, without keys
_CLOSED = "closed"
RETRY_MS = 20
#: how long a node waits for the scheduler's first answer before it tries a handshake apart:
#: a scheduler answers a registration in milliseconds, so a second without one is worth a look
#: (the look costs one connection; a right key then waits the rest of its connect timeout)
CHECK_AFTER_S = 1.0


def handshake(address: str, keys: Keys, timeout_s: float = 2.0) -> str:
    """What the peer at ``address`` (``tcp://`` or ``ipc://``) makes of ``keys`` (see the
    module); ``UNKNOWN`` for an ``inproc://`` address, which another context cannot reach."""
    if not address.startswith(("tcp://", "ipc://")):
        return UNKNOWN
    ctx: zmq.Context[Any] = zmq.Context()  # its own: this process's sockets and ZAP handler stay out of it
    deadline = time.monotonic() + timeout_s
    try:
        verdict = _link(ctx, address, keys, deadline)
        if verdict == _CLOSED:  # a wrong key, or no CurveZMQ there: a link without keys tells them apart
            verdict = PLAIN if _link(ctx, address, None, deadline) == OK else REFUSED
        return verdict
    finally:
        ctx.term()


def _link(ctx: zmq.Context[Any], address: str, keys: Keys | None, deadline: float) -> str:
    """One link to ``address`` (with ``keys``' CurveZMQ, or none) watched until ``deadline``
    for its handshake's outcome (``_verdict``)."""
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.reconnect_ivl = RETRY_MS
    if keys is not None:
        secure_client(sock, keys)
    monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                                      | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
    try:
        sock.connect(leaving_from(address, source_host()))  # from where the node's own links leave
        return _verdict(monitor, deadline)
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)
        sock.close(linger=0)


def _verdict(monitor: zmq.Socket[Any], deadline: float) -> str:
    """The first handshake's outcome: success, a refusal by the scheduler's ZAP handler, a
    mechanism error (a peer without CurveZMQ), or a link closed with no detail (``_CLOSED``:
    a key the server cannot read, or a keyless peer whose mechanism error ZeroMQ did not
    report: it came at the first to the third try under load, or not within 2 s, so
    ``handshake`` asks again without keys rather than wait for it)."""
    from zmq.utils.monitor import recv_monitor_message

    while (left := deadline - time.monotonic()) > 0:
        if not monitor.poll(max(1, int(left * 1000))):
            continue
        event = recv_monitor_message(monitor)
        kind = event["event"]
        if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            return OK
        if kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            return PLAIN if event["value"] == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH else REFUSED
        if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return REFUSED
        if kind == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            return _CLOSED
    return UNKNOWN


def _fix(role: str) -> str:
    made = "" if role == "server" else (" or a file made from it (paramserver keygen --from CLUSTER_KEY_FILE "
                                        f"--role {'worker' if role == 'worker' else 'driver'} --out FILE)")
    return (f"give the key file the cluster was started with (the scheduler's --secret-file){made}, as "
            "--secret-file FILE or PARAMSERVER_SECRET_FILE")


def refusal(address: str, secret_file: str, role: str, timeout_s: float = 2.0) -> str:
    """Why the scheduler at ``address`` does not answer a ``role`` holding the keys of
    ``secret_file``, when a handshake apart says so now; "" when it does not (the keys are
    accepted, or there is no verdict: the caller goes on waiting)."""
    return _refused(handshake(address, load_keys(secret_file), timeout_s), address, secret_file, role)


def _refused(verdict: str, address: str, secret_file: str, role: str) -> str:
    if verdict == REFUSED:
        return (f"{role}: the scheduler at {address} answered but did not accept the key of --secret-file "
                f"{secret_file} (the CurveZMQ handshake was refused): that file is not this cluster's; {_fix(role)}")
    if verdict == PLAIN:
        return (f"{role}: the scheduler at {address} runs without keys (it does not speak CurveZMQ), but this {role} "
                f"has --secret-file {secret_file}: drop --secret-file (and unset PARAMSERVER_SECRET_FILE), or start "
                "the cluster with that file")
    return ""


def unanswered(address: str, secret_file: str | None, role: str, timeout_s: float, listening: bool) -> str:
    """What a ``role`` that got no answer from the scheduler at ``address`` within
    ``timeout_s`` tells its user: a key refused, a cluster that needs keys, a scheduler that
    accepted the keys and stayed silent, or nothing reached at all."""
    if secret_file and listening:
        verdict = handshake(address, load_keys(secret_file))
        if verdict == OK:
            return (f"{role}: the scheduler at {address} accepted the key of --secret-file {secret_file} but did not "
                    f"answer within {timeout_s:g} s: it may be overloaded or stopping (its log says)")
        return _refused(verdict, address, secret_file, role) or (
            f"{role}: something listens at {address} but no answer came that could be authenticated within "
            f"{timeout_s:g} s: the key of --secret-file {secret_file} may not be this cluster's ({_fix(role)}), "
            "or it is not a paramserver scheduler")
    if listening:
        return (f"{role}: something listens at {address} but did not answer within {timeout_s:g} s: a cluster "
                "started with keys answers only nodes that have them, so give --secret-file FILE "
                "(PARAMSERVER_SECRET_FILE); else the scheduler may be overloaded or not a paramserver scheduler")
    return (f"{role} could not reach the scheduler at {address} within {timeout_s:g} s: is it running, and is the "
            "address right? (--scheduler / PARAMSERVER_SCHEDULER)")
