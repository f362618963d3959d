"""Two network namespaces joined by a veth pair (``10.x.y.1`` in the first, ``.2`` in the
second), each end optionally shaped to a rate (``tc`` tbf); on exit whatever still runs in
them is killed and they are removed.  Needs root (``ip netns``).  ``bench/netns.py`` and
``bench/filters.py`` run a cluster across one.
"""

from __future__ import annotations

import os
import subprocess


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), check=check, capture_output=True, text=True, timeout=60)


class VethPair:
    """Namespaces ``{tag}a`` and ``{tag}b``, joined by ``{tag}va`` (in a) and ``{tag}vb`` (in b)
    on ``{net}.0/24``; ``tag`` and ``net`` are made from a prefix and this process's id, so
    that two runs do not collide."""

    def __init__(self, prefix: str, second_octet: int, rate: str | None = None) -> None:
        pid = os.getpid()
        self.tag, self.net = f"{prefix}{pid % 10000}", f"10.{second_octet + pid % 200}.{(pid // 200) % 250}"
        self.a, self.b, self.va, self.vb = f"{self.tag}a", f"{self.tag}b", f"{self.tag}va", f"{self.tag}vb"
        self.rate = rate

    def __enter__(self) -> VethPair:
        try:
            for step in (("netns", "add", self.a), ("netns", "add", self.b),
                         ("link", "add", self.va, "type", "veth", "peer", "name", self.vb),
                         ("link", "set", self.va, "netns", self.a), ("link", "set", self.vb, "netns", self.b),
                         ("-n", self.a, "addr", "add", f"{self.net}.1/24", "dev", self.va),
                         ("-n", self.b, "addr", "add", f"{self.net}.2/24", "dev", self.vb),
                         ("-n", self.a, "link", "set", self.va, "up"), ("-n", self.b, "link", "set", self.vb, "up"),
                         ("-n", self.a, "link", "set", "lo", "up"), ("-n", self.b, "link", "set", "lo", "up")):
                sh("ip", *step)
            if self.rate:
                for ns, dev in ((self.a, self.va), (self.b, self.vb)):
                    burst = "1mb" if self.rate == "1gbit" else "128kb"
                    sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", self.rate,
                       "burst", burst, "latency", "50ms")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for ns in (self.a, self.b):  # whatever still runs in them first, then the namespaces
            for pid in sh("ip", "netns", "pids", ns, check=False).stdout.split():
                sh("kill", "-9", pid, check=False)
            sh("ip", "netns", "del", ns, check=False)

    def counters(self) -> tuple[int, int]:
        """Bytes the kernel counted on the second namespace's end: sent, received."""
        read = [int(sh("ip", "netns", "exec", self.b, "cat", f"/sys/class/net/{self.vb}/statistics/{w}_bytes")
                    .stdout) for w in ("tx", "rx")]
        return read[0], read[1]
