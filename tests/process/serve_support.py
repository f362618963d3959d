"""``paramserver serve`` as a process for the process tests: started on a free port (read
from its first line, bounded), asked over HTTP, stopped by SIGTERM (then killed) on exit."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request


def http(url, data=None, content_type="text/plain", timeout_s=10.0):
    """(status, headers, body, seconds) of a request; an HTTP error's too; status 0 where
    nothing answered."""
    request = urllib.request.Request(url, data=data, headers={"Content-Type": content_type} if data else {})
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as r:
            return r.status, dict(r.headers), r.read(), time.monotonic() - t0
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read(), time.monotonic() - t0
    except OSError:
        return 0, {}, b"", time.monotonic() - t0


class Served:
    """``paramserver serve --port 0 FLAGS...``; ``stderr`` once it has stopped."""

    def __init__(self, *flags, timeout_s=60.0):
        self.proc = subprocess.Popen([sys.executable, "-m", "paramserver", "serve", "--port", "0", *flags],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "CI": "1"})
        self.stderr = ""
        try:
            self.port = self._port(timeout_s)
        except BaseException:
            self.close()
            raise
        self.base = f"http://127.0.0.1:{self.port}"

    def _port(self, timeout_s):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if select.select([self.proc.stdout], [], [], 0.1)[0]:
                line = self.proc.stdout.readline()
                assert line, f"serve exited: {self.proc.stderr.read()}"
                if line.startswith("serving on http://"):
                    return int(line.split()[2].rsplit(":", 1)[1])
            assert self.proc.poll() is None, f"serve exited: {self.proc.stderr.read()}"
        raise AssertionError("serve did not say its port in time")

    def get(self, path):
        """(status, headers, body) of ``GET path``."""
        return http(f"{self.base}{path}")[:3]

    def post(self, body, timeout_s=30.0, content_type="text/plain"):
        """(status, headers, answer, seconds) of a ``POST /predict``."""
        return http(f"{self.base}/predict", body, content_type, timeout_s)

    def metrics(self):
        return self.get("/metrics")[2].decode()

    def metric(self, name):
        """The value of the first sample of ``name`` in /metrics (None: not there)."""
        for line in self.metrics().splitlines():
            if line.startswith((name + " ", name + "{")):
                return float(line.rsplit(" ", 1)[1])
        return None

    def version(self):
        """The model version /readyz says (None before one is loaded, or when nothing answers)."""
        return self.get("/readyz")[1].get("X-Model-Version")

    def memory_mb(self, key):
        """VmRSS or VmHWM (the peak) of the serving process, in MB."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            return next(int(line.split()[1]) / 1024 for line in f if line.startswith(key))

    def close(self):
        """Stop it (SIGTERM, then SIGKILL after 10 s); its standard error."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if not self.proc.stderr.closed:
            self.stderr = self.proc.stderr.read()
            self.proc.stdout.close()
            self.proc.stderr.close()
        return self.stderr

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
