"""The command of a userspace link (a one-way delay and a rate cap a direction, issue 47):
``delayrelay.c`` where a C compiler is, else ``delayproxy.py``.

Both relay the same way (``delayproxy.py``'s docstring).  The Python relay takes its share
of the cores it measures on: a quarter to a third of one at 1 Gbit/s on this project's
2-core VM (asyncio's work for each chunk, and the holds slept in threads), which a job
beside it on two cores loses (a real link costs the hosts nothing of the kind).  The C one,
an epoll loop with a timerfd, takes 8-13 % of a core at 1 Gbit/s with the same round trips
(``docs/benchmarks.md``, "Links through a relay in C").  It is compiled once (``cc -O2``)
into ``~/.cache/paramserver/bench/``, named by its source's digest.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "delayrelay.c")
PROXY = os.path.join(HERE, "delayproxy.py")


def _built() -> str | None:
    """The compiled relay (built now if needed), or None where it cannot be built."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    with open(SOURCE, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    folder = os.path.join(xdg, "paramserver", "bench")
    binary = os.path.join(folder, f"delayrelay-{digest}")
    if os.path.exists(binary):
        return binary
    os.makedirs(folder, exist_ok=True)
    tmp = f"{binary}.{os.getpid()}.tmp"
    done = subprocess.run([cc, "-O2", "-o", tmp, SOURCE], capture_output=True, text=True)
    if done.returncode:
        print(f"delayrelay.c did not compile ({cc}): {done.stderr.strip()[-500:]}; the Python relay instead",
              file=sys.stderr)
        return None
    os.replace(tmp, binary)
    return binary


def relay_command(delay_ms: float, rate_mbit: float, pairs: list[str], kind: str | None = None) -> list[str]:
    """The command of a relay holding each direction ``delay_ms`` and capping it at
    ``rate_mbit`` (0: no cap), for ``pairs`` (``LISTEN=TARGET``); it prints ``ready`` once
    every pair listens.  ``kind``: ``python`` asks for the Python relay, else the C one
    where it builds (default: ``$PARAMSERVER_RELAY``)."""
    kind = kind or os.environ.get("PARAMSERVER_RELAY")
    binary = None if kind == "python" else _built()
    if binary is None:
        return [sys.executable, PROXY, "--delay-ms", str(delay_ms), "--rate-mbit", str(rate_mbit), *pairs]
    return [binary, str(delay_ms * 1000.0), str(rate_mbit * 1e6 / 8), *pairs]


def is_python(command: list[str]) -> bool:
    """Whether ``relay_command`` gave the Python relay (no C compiler, or asked for)."""
    return command[0] == sys.executable
