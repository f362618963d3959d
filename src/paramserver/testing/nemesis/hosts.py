"""Emulated hosts: network namespaces on one bridge, and the faults a real network has.

Host ``i`` is the namespace ``{tag}{i}`` with the address ``{net}.{i + 1}``; its veth's other end
is a port of the bridge ``nbr`` in the namespace ``{tag}x``, so every pair of hosts has its own
path and a fault can be put on one pair, one direction, without touching the others.

The faults, each undone by what it returns (``undo``), or all at once by ``heal()``:
- ``cut(src, dst)``: what ``src`` sends to ``dst`` is dropped (nftables, the output hook of
  ``src``): a one-way partition; both directions make a two-way one;
- ``lose(src, dst, percent)``: a random share of it is dropped (nftables' ``numgen random``);
- ``slow(host, rate)``: the host's link in both directions is capped by a token bucket (``tc tbf``);
- ``delay(host, ms, jitter_ms)``: every link of the host holds what it carries ``ms`` each way, give
  or take the jitter.  This kernel has no ``netem``, so hosts made with ``relays=True`` send every
  TCP connection they open through a relay of their own (``relay.py``: an nftables redirect, then
  a userspace copy that holds each chunk), which is where the delay is put; a host pair's delay
  is the larger of its two hosts'.

Without root or ``nft`` nothing can be made, and ``Unavailable`` says which of the two is missing
and how to get it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Sequence

from paramserver.testing.nemesis.relay import MARK, PORT

Undo = list[tuple[str, int, str]]  # (rule | rate, host, nft handle)

NFT_TABLE = "table inet nemesis {\n  chain out {\n    type filter hook output priority 0; policy accept;\n  }\n}\n"
#: a host's TCP connections to the others go to its relay (the relay's own, marked, go out as they are)
NFT_RELAY = ("table ip nemesis_relay {{\n  chain out {{\n    type nat hook output priority -100; policy accept;\n"
             "    ip daddr {net}.0/24 meta mark != {mark} tcp dport != {port} redirect to :{port}\n  }}\n}}\n")


class Unavailable(RuntimeError):
    """Emulated hosts cannot be made on this machine (the message says why and the fix)."""


def missing() -> str | None:
    """What this machine lacks for emulated hosts, or None."""
    if os.geteuid() != 0:
        return "emulated hosts need root (network namespaces): run as root, or in a container with CAP_NET_ADMIN"
    for tool, package in (("ip", "iproute2"), ("tc", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            return f"emulated hosts need '{tool}' (Debian: apt-get install {package})"
    return None


def sh(*args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(args), input=stdin, capture_output=True, text=True, timeout=30)
    if check and done.returncode:
        raise Unavailable(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


class Emulated(ABC):
    """What a run asks of its emulated hosts, whichever way they are made: network namespaces
    (``Hosts``), or loopback addresses with a userspace proxy between them
    (``proxied.ProxyHosts``, where namespaces cannot be made).  A context manager that removes
    them, and what runs on them, on any exit."""

    kind = ""  # "namespaces" | "proxy": what a run's report says it ran on
    n = 0

    @abstractmethod
    def address(self, host: int) -> str:
        """The address peers reach ``host`` at."""
        ...

    @abstractmethod
    def exec(self, host: int) -> list[str]:
        """The command prefix that runs a program on ``host``."""
        ...

    @abstractmethod
    def listen(self, host: int, port: int = 0) -> list[str]:
        """The flags that make a scheduler or a server on ``host`` listen where its peers reach
        it (``port``: 0 for any)."""
        ...

    def __enter__(self) -> Emulated:
        return self

    @abstractmethod
    def __exit__(self, *exc: object) -> None:
        ...

    @abstractmethod
    def cut(self, src: int, dst: int) -> Undo:
        """What ``src`` sends to ``dst`` is dropped: a one-way partition."""
        ...

    @abstractmethod
    def lose(self, src: int, dst: int, percent: int) -> Undo:
        """A random ``percent`` of what ``src`` sends to ``dst`` is dropped."""
        ...

    @abstractmethod
    def slow(self, host: int, rate: str) -> Undo:
        """Cap the host's link to ``rate`` (tc syntax: '200kbit'), both directions."""
        ...

    @abstractmethod
    def delay(self, host: int, ms: float, jitter_ms: float) -> Undo:
        """Every link of ``host`` holds what it carries ``ms`` (± ``jitter_ms``) each way."""
        ...

    @abstractmethod
    def undo(self, undo: Undo) -> None:
        ...

    @abstractmethod
    def heal(self) -> None:
        """Undo every fault."""
        ...

    def partition(self, side: Sequence[int], other: Sequence[int], both: bool = True) -> Undo:
        """Cut every link from ``side`` to ``other`` (and back, if ``both``)."""
        undo: Undo = []
        for a in side:
            for b in other:
                undo += self.cut(a, b)
                if both:
                    undo += self.cut(b, a)
        return undo


class Hosts(Emulated):
    """``n`` hosts on a bridge; a context manager that removes them (and kills what runs in them)
    on any exit.  ``tag`` and ``net`` come from this process's id, so two runs never collide."""

    kind = "namespaces"

    def __init__(self, n: int, prefix: str = "nm", relays: bool = False) -> None:
        pid = os.getpid()
        self.n, self.prefix, self.relays = n, prefix, relays
        self.delayed: dict[int, tuple[float, float]] = {}  # host -> (ms, jitter ms) while a delay lasts
        self.control = ""  # the relays' control files' folder
        self.tag = f"{prefix}{pid}"
        self.net = f"10.{200 + pid % 50}.{(pid // 50) % 250}"
        self.bridge_ns = f"{self.tag}x"

    def ns(self, host: int) -> str:
        return f"{self.tag}{host}"

    def address(self, host: int) -> str:
        return f"{self.net}.{host + 1}"

    def exec(self, host: int) -> list[str]:
        return ["ip", "netns", "exec", self.ns(host)]

    def listen(self, host: int, port: int = 0) -> list[str]:
        return ["--host", "0.0.0.0", *(["--port", str(port)] if port else [])]  # a host has one address

    def __enter__(self) -> Hosts:
        why = missing()
        if why:
            raise Unavailable(why)
        try:
            self._build()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _sweep(self) -> None:
        """Remove the hosts of runs whose process is gone (killed before it could clean up)."""
        for line in sh("ip", "netns", "list", check=False).stdout.splitlines():
            name = line.split()[0] if line.split() else ""
            found = re.fullmatch(rf"{self.prefix}(\d+)(x|\d+)", name)
            if found and not os.path.exists(f"/proc/{found.group(1)}"):
                for pid in sh("ip", "netns", "pids", name, check=False).stdout.split():
                    sh("kill", "-9", pid, check=False)
                sh("ip", "netns", "del", name, check=False)

    def _build(self) -> None:
        self._sweep()
        sh("ip", "netns", "add", self.bridge_ns)
        sh("ip", "-n", self.bridge_ns, "link", "add", "name", "nbr", "type", "bridge")
        sh("ip", "-n", self.bridge_ns, "link", "set", "nbr", "up")
        for h in range(self.n):
            ns, inner, outer = self.ns(h), f"{self.tag}e{h}", f"{self.tag}p{h}"
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", "name", inner, "netns", ns, "type", "veth", "peer", "name", outer,
               "netns", self.bridge_ns)
            sh("ip", "-n", self.bridge_ns, "link", "set", outer, "master", "nbr")
            sh("ip", "-n", self.bridge_ns, "link", "set", outer, "up")
            sh("ip", "-n", ns, "addr", "add", f"{self.address(h)}/24", "dev", inner)
            sh("ip", "-n", ns, "link", "set", inner, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh(*self.exec(h), "nft", "-f", "-", stdin=NFT_TABLE)
        if self.relays:
            self._start_relays()

    def _start_relays(self) -> None:
        """A relay on each host, every TCP connection it opens to another host redirected to it."""
        self.control = tempfile.mkdtemp(prefix=f"{self.tag}-relays-")
        for h in range(self.n):
            sh(*self.exec(h), "nft", "-f", "-", stdin=NFT_RELAY.format(net=self.net, mark=MARK, port=PORT))
            relay = subprocess.Popen([*self.exec(h), sys.executable, "-m", "paramserver.testing.nemesis.relay",
                                      str(PORT), self._control(h)], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
            assert relay.stdout is not None
            ready = relay.stdout.readline().strip()  # bounded: the relay prints it at once, or exits (EOF)
            if ready != b"ready":
                raise Unavailable(f"the relay of host {h} did not start (exit {relay.wait(timeout=10)})")

    def _control(self, host: int) -> str:
        return os.path.join(self.control, f"delays-{host}.json")

    def __exit__(self, *exc: object) -> None:
        for ns in [self.ns(h) for h in range(self.n)] + [self.bridge_ns]:
            for pid in sh("ip", "netns", "pids", ns, check=False).stdout.split():
                sh("kill", "-9", pid, check=False)
            sh("ip", "netns", "del", ns, check=False)
        if self.control:
            shutil.rmtree(self.control, ignore_errors=True)

    # -- faults: each returns what undoes it (``undo``); ``heal`` undoes them all ------------
    def _rule(self, src: int, rule: str) -> Undo:
        out = sh(*self.exec(src), "nft", "--echo", "--handle", "add", "rule", "inet", "nemesis", "out", *rule.split())
        handle = re.search(r"# handle (\d+)", out.stdout)
        if handle is None:
            raise Unavailable(f"nft did not say the handle of the rule it added: {out.stdout.strip()!r}")
        return [("rule", src, handle.group(1))]

    def cut(self, src: int, dst: int) -> Undo:
        return self._rule(src, f"ip daddr {self.address(dst)} drop")

    def lose(self, src: int, dst: int, percent: int) -> Undo:
        if not 0 < percent < 100:
            raise ValueError(f"loss percent={percent}: must be in 1..99")
        return self._rule(src, f"ip daddr {self.address(dst)} numgen random mod 100 < {percent} drop")

    def _links(self, host: int) -> tuple[tuple[str, str], ...]:
        return (self.ns(host), f"{self.tag}e{host}"), (self.bridge_ns, f"{self.tag}p{host}")

    def slow(self, host: int, rate: str) -> Undo:
        for ns, dev in self._links(host):
            sh("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
               "burst", "16kb", "latency", "400ms")
        return [("rate", host, "")]

    def delay(self, host: int, ms: float, jitter_ms: float) -> Undo:
        if not self.relays:
            raise Unavailable("a delay needs the hosts' relays: Hosts(n, relays=True)")
        self.delayed[host] = (ms, jitter_ms)
        self._write_delays()
        return [("delay", host, "")]

    def _write_delays(self) -> None:
        """Each relay's control file: a peer's delay is the larger of its host's and the relay's."""
        for h in range(self.n):
            table = {}
            for o in range(self.n):
                worst = max((self.delayed[x] for x in (h, o) if x in self.delayed and o != h), default=None)
                if worst is not None:
                    table[self.address(o)] = list(worst)
            path = self._control(h)
            with open(path + ".tmp", "w") as f:
                json.dump(table, f)
            os.replace(path + ".tmp", path)

    def undo(self, undo: Undo) -> None:
        for kind, host, handle in undo:
            if kind == "rule":
                sh(*self.exec(host), "nft", "delete", "rule", "inet", "nemesis", "out", "handle", handle, check=False)
            elif kind == "delay":
                self.delayed.pop(host, None)
                self._write_delays()
            else:
                for ns, dev in self._links(host):
                    sh("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root", check=False)

    def heal(self) -> None:  # rules flushed, rates restored, delays lifted
        for h in range(self.n):
            sh(*self.exec(h), "nft", "flush", "chain", "inet", "nemesis", "out")
            for ns, dev in self._links(h):
                sh("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root", check=False)
        if self.relays:
            self.delayed.clear()
            self._write_delays()
