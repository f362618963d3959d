"""Emulated hosts without root: loopback addresses, and a userspace proxy between them that
injects the faults (``proxy.py``), where network namespaces cannot be made.

Host ``i`` is the public address ``127.A.B.{i + 1}``, which its nodes advertise and their peers
dial, and the private one ``127.A.B.{i + 101}``, which they bind (``A.B`` from this process's
id, so two runs never collide).  The proxy listens on a node's public address and port and
connects on to the private one.  A program runs "on" host ``i`` with its connections leaving
from the host's public address (``PARAMSERVER_SOURCE_HOST``), which is how the proxy tells
the hosts of a connection apart; and with ``PARAMSERVER_NEMESIS_RUN`` set, which is how what
runs on the hosts is found and killed on the way out (or by the next run, if this one's
process was killed first).

The faults are those of ``Hosts`` (``cut``, ``lose``, ``slow``, ``delay``, ``partition``), each
undone by what it returns, or all at once by ``heal()``; ``proxy.py`` says how each is put on
a TCP stream.  What the proxy cannot do: drop a connection's bytes for good (a cut holds them,
as TCP's retransmissions would carry them over a healed link), or cut loopback traffic
that does not go through it (a node's own connections to itself).
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
from collections.abc import Callable

from paramserver.testing.nemesis.hosts import Emulated, Hosts, Unavailable, Undo, missing
from paramserver.wire.sockets import SOURCE_HOST_VAR

RUN_VAR = "PARAMSERVER_NEMESIS_RUN"
ANSWER_S = 10.0  # the proxy answers a command at once; this long without an answer, it is stuck
_RATE = re.compile(r"(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|bps|kbps|mbps|gbps)")
_SCALE = {"bit": 1 / 8, "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8, "bps": 1, "kbps": 1e3, "mbps": 1e6,
          "gbps": 1e9}
NETWORKS = ("auto", "namespaces", "proxy")


def rate_bytes(rate: str) -> float:
    """``tc``'s rate (``200kbit``, ``1mbit``, ``10kbps``: bytes) in bytes a second."""
    m = _RATE.fullmatch(rate.strip().lower())
    if not m:
        raise ValueError(f"rate {rate!r}: write it as tc does, a number and one of {', '.join(_SCALE)} (200kbit)")
    return float(m.group(1)) * _SCALE[m.group(2)]


class ProxyHosts(Emulated):
    kind = "proxy"

    def __init__(self, n: int, prefix: str = "nm") -> None:
        pid = os.getpid()
        self.n, self.prefix, self.run = n, prefix, f"{prefix}{pid}"
        self.net = f"127.{100 + pid % 100}.{(pid // 100) % 250}"
        self.faults: dict[int, tuple[str, int, int, float, float]] = {}  # id -> (kind, a, b, x, y)
        self.made = 0
        self.proxy: subprocess.Popen[bytes] | None = None

    def address(self, host: int) -> str:
        return f"{self.net}.{host + 1}"

    def private(self, host: int) -> str:
        return f"{self.net}.{host + 101}"

    def exec(self, host: int) -> list[str]:
        return ["env", f"{SOURCE_HOST_VAR}={self.address(host)}", f"{RUN_VAR}={self.run}"]

    def listen(self, host: int, port: int = 0) -> list[str]:
        if not port:  # a free one: the private address is this run's alone, so it stays free
            with socket.socket() as probe:
                probe.bind((self.private(host), 0))
                port = probe.getsockname()[1]
        self._ask({"listen": [self.address(host), port, self.private(host)]})
        return ["--host", self.private(host), "--advertise-host", self.address(host), "--port", str(port)]

    def __enter__(self) -> ProxyHosts:
        _sweep(self.prefix)
        self.proxy = subprocess.Popen([sys.executable, "-m", "paramserver.testing.nemesis.proxy"],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            self._ask({"hosts": {self.address(h): h for h in range(self.n)}})
        except BaseException:
            self.__exit__()
            raise
        return self

    def _ask(self, cmd: dict[str, object]) -> None:
        proxy = self.proxy
        if proxy is None or proxy.stdin is None or proxy.stdout is None:
            raise Unavailable("the proxy is not running: use ProxyHosts as a context manager")
        try:
            proxy.stdin.write(json.dumps(cmd).encode() + b"\n")
            proxy.stdin.flush()
        except BrokenPipeError:
            raise Unavailable(f"the nemesis proxy exited ({proxy.poll()})") from None
        ready, _, _ = select.select([proxy.stdout], [], [], ANSWER_S)
        answer = proxy.stdout.readline().decode().strip() if ready else ""
        if answer != "ok":
            raise Unavailable(f"the nemesis proxy did not do {cmd}: {answer or 'no answer'} (exit {proxy.poll()})")

    def __exit__(self, *exc: object) -> None:
        _kill(lambda run: run == self.run)
        if self.proxy is not None:
            if self.proxy.stdin is not None:
                self.proxy.stdin.close()  # the proxy exits when its commands end
            try:
                self.proxy.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proxy.kill()
                self.proxy.wait(timeout=5)
            if self.proxy.stdout is not None:
                self.proxy.stdout.close()

    # -- faults: each returns what undoes it (``undo``); ``heal`` undoes them all ------------
    def _fault(self, kind: str, a: int, b: int = -1, x: float = 0.0, y: float = 0.0) -> Undo:
        self.made += 1
        self.faults[self.made] = (kind, a, b, x, y)
        self._push()
        return [("proxy", a, str(self.made))]

    def _push(self) -> None:
        now = list(self.faults.values())
        self._ask({"faults": {"cut": sorted({(a, b) for k, a, b, _, _ in now if k == "cut"}),
                              "loss": [[a, b, x] for k, a, b, x, _ in now if k == "loss"],
                              "rate": [[a, x] for k, a, _, x, _ in now if k == "rate"],
                              "delay": [[a, x, y] for k, a, _, x, y in now if k == "delay"]}})

    def cut(self, src: int, dst: int) -> Undo:
        return self._fault("cut", src, dst)

    def lose(self, src: int, dst: int, percent: int) -> Undo:
        if not 0 < percent < 100:
            raise ValueError(f"loss percent={percent}: must be in 1..99")
        return self._fault("loss", src, dst, float(percent))

    def slow(self, host: int, rate: str) -> Undo:
        return self._fault("rate", host, x=rate_bytes(rate))

    def delay(self, host: int, ms: float, jitter_ms: float) -> Undo:
        return self._fault("delay", host, x=float(ms), y=float(jitter_ms))

    def undo(self, undo: Undo) -> None:
        for _, _, made in undo:
            self.faults.pop(int(made), None)
        self._push()

    def heal(self) -> None:
        self.faults.clear()
        self._push()


def _runs() -> dict[int, str]:
    """The processes of this user that run on a proxied host: pid -> the run's tag."""
    found: dict[int, str] = {}
    marker = f"{RUN_VAR}=".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read()
        except OSError:  # gone, or another user's
            continue
        for var in env.split(b"\0"):
            if var.startswith(marker):
                found[int(entry)] = var[len(marker):].decode(errors="replace")
    return found


def _kill(which: Callable[[str], bool]) -> None:
    """SIGKILL every process on the hosts of the runs ``which(tag)`` picks."""
    for pid, run in _runs().items():
        if which(run) and pid != os.getpid():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _sweep(prefix: str) -> None:
    """Kill what runs on the hosts of earlier runs whose process is gone (killed before it could
    clean up)."""
    def orphaned(run: str) -> bool:
        found = re.fullmatch(rf"{re.escape(prefix)}(\d+)", run)
        return found is not None and not os.path.exists(f"/proc/{found.group(1)}")

    _kill(orphaned)


def emulated(n: int, network: str = "auto", delays: bool = False) -> Emulated:
    """``n`` emulated hosts: network namespaces (``network`` "namespaces", or "auto" where this
    machine can make them: root, ``ip``, ``nft``), else loopback addresses and the proxy."""
    if network not in NETWORKS:
        raise ValueError(f"network {network!r}: one of {', '.join(NETWORKS)}")
    if network == "proxy" or (network == "auto" and missing() is not None):
        return ProxyHosts(n)
    return Hosts(n, relays=delays)
