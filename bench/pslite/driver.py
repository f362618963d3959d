"""Run ps-lite's stock server with our driver (``pushpull.cc``) and read its keys/s.

    from pslite.driver import NotBuilt, ratios, run
    peer = run([1_000, 100_000], min_keys=2e7, max_s=10.0)   # NotBuilt: say "make pslite"
    for r in ratios(ours, peer): ...

One scheduler, one server and one worker, as local processes on 127.0.0.1 with ps-lite's DMLC_*
variables (ps-lite's ``tests/local.sh``), all three in one process group of their own: past the
time bound, or on any error, the group is killed, so nothing outlives the call.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

PINNED = "15b8adf17e9871ff6112c80e4b290fa38c2b4656"
HOW_TO_BUILD = ("make pslite (bench/pslite/build.sh: ps-lite from its source against Debian's libzmq and "
                "protobuf, under ~/.cache/paramserver/pslite)")
ROW_FIELDS = ("op", "keys", "batch", "requests", "seconds", "keys_per_s")


class PsliteError(RuntimeError):
    """ps-lite's driver failed, printed what we cannot read, or ran past its time bound."""


class NotBuilt(PsliteError):
    """The driver is not where ``build.sh`` puts it."""


def driver_path(environ: Mapping[str, str] = os.environ) -> Path:
    """Where ``build.sh`` puts the driver: ``$PSLITE_DRIVER``, else under ``$PSLITE_CACHE`` (default
    ``~/.cache/paramserver/pslite``) by the first 7 digits of ``$PSLITE_COMMIT`` (default the pinned one)."""
    if environ.get("PSLITE_DRIVER"):
        return Path(environ["PSLITE_DRIVER"])
    xdg = environ.get("XDG_CACHE_HOME") or os.path.join(environ.get("HOME") or os.path.expanduser("~"), ".cache")
    cache = environ.get("PSLITE_CACHE") or os.path.join(xdg, "paramserver", "pslite")
    return Path(cache) / environ.get("PSLITE_COMMIT", PINNED)[:7] / "bin" / "pushpull"


def find_driver(environ: Mapping[str, str] = os.environ) -> Path:
    path = driver_path(environ)
    if not os.access(path, os.X_OK):
        raise NotBuilt(f"ps-lite is not built: no driver at {path}; build it with {HOW_TO_BUILD}")
    return path


def node_env(role: str, port: int, base: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment of one node: ``base`` without any DMLC_* or PS_* of its own (a stray
    PS_VERBOSE or DMLC_NUM_SERVER would change what is measured), then 1 server and 1 worker whose
    scheduler listens on 127.0.0.1:``port``, every node bound to 127.0.0.1."""
    if role not in ("scheduler", "server", "worker"):
        raise ValueError(f"a ps-lite node's role is scheduler, server or worker, not {role!r}")
    env = {k: v for k, v in base.items() if not k.startswith(("DMLC_", "PS_"))}
    env.update(DMLC_ROLE=role, DMLC_NUM_SERVER="1", DMLC_NUM_WORKER="1", DMLC_PS_ROOT_URI="127.0.0.1",
               DMLC_PS_ROOT_PORT=str(port), DMLC_NODE_HOST="127.0.0.1")
    return env


def driver_args(batches: list[int], min_keys: float, max_s: float, window: int = 1, seed: int = 0) -> list[str]:
    if not batches or any(n < 1 for n in batches):
        raise ValueError(f"batches must be positive key counts, got {batches}")
    if window < 1:
        raise ValueError(f"window must be at least 1 request in flight, got {window}")
    return ["--batches", ",".join(str(n) for n in batches), "--min-keys", repr(float(min_keys)),
            "--max-s", repr(float(max_s)), "--window", str(window), "--seed", str(seed)]


def time_limit(batches: list[int], max_s: float) -> float:
    """Seconds the three processes may take: start-up and the final barrier (30 s), then for each
    batch size the first push and two warm-ups (20 s) and two timed directions of ``max_s`` each.
    The driver stops each direction by itself at ``max_s``: the bound is for a driver that hangs."""
    return 30.0 + len(batches) * (20.0 + 2 * max_s)


def parse_output(stdout: str) -> dict:
    """The driver's one JSON object (its last line that starts with ``{``), its rows checked."""
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise PsliteError(f"ps-lite's driver printed no JSON object; its stdout was: {stdout[-500:]!r}")
    try:
        out = json.loads(lines[-1])
    except json.JSONDecodeError as exc:
        raise PsliteError(f"ps-lite's driver printed a line that is not JSON ({exc}): {lines[-1][:500]!r}") from None
    rows = out.get("rows") if isinstance(out, dict) else None
    if not isinstance(rows, list) or not rows:
        raise PsliteError(f"ps-lite's driver printed no rows: {lines[-1][:500]!r}")
    for row in rows:
        missing = [f for f in ROW_FIELDS if f not in row]
        if missing or row["op"] not in ("pull", "push") or not row["keys_per_s"] > 0:
            raise PsliteError(f"ps-lite's driver printed a row without {missing or 'a pull/push op and keys/s > 0'}: "
                              f"{row}")
    return out


def free_port() -> int:
    """A port nothing listens on now (the scheduler binds it once, without retrying)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: Path, lines: int = 15) -> str:
    text = path.read_text(errors="replace").strip() if path.exists() else ""
    return "\n".join(text.splitlines()[-lines:]) or "(nothing)"


def run(batches: list[int], min_keys: float, max_s: float, window: int = 1,
        timeout_s: float | None = None, environ: Mapping[str, str] = os.environ) -> list[dict]:
    """ps-lite's rows, one per direction and batch size (as bench/pushpull.py's, plus ``system``,
    ``batch`` and ``requests``); ``NotBuilt`` when the driver is absent, ``PsliteError`` when it fails
    or outlasts ``timeout_s`` (default ``time_limit``), its processes killed either way."""
    exe = find_driver(environ)
    args = driver_args(batches, min_keys, max_s, window)
    bound = time_limit(batches, max_s) if timeout_s is None else timeout_s
    port = free_port()
    procs: dict[str, subprocess.Popen] = {}
    with tempfile.TemporaryDirectory(prefix="paramserver-pslite-") as tmp:
        logs = {role: Path(tmp, f"{role}.err") for role in ("scheduler", "server", "worker")}
        out = Path(tmp, "worker.out")
        try:
            for role in ("scheduler", "server", "worker"):
                group = procs["scheduler"].pid if procs else 0  # the scheduler leads the group
                with open(logs[role], "wb") as err, open(out if role == "worker" else os.devnull, "wb") as so:
                    procs[role] = subprocess.Popen([str(exe), *args], env=node_env(role, port, environ),
                                                   stdin=subprocess.DEVNULL, stdout=so, stderr=err,
                                                   process_group=group)
            _wait_all(procs, bound)
            failed = {role: p.returncode for role, p in procs.items() if p.returncode != 0}
            if failed:
                raise PsliteError(f"ps-lite's {', '.join(f'{r} exited {c}' for r, c in failed.items())}; "
                                  + "; ".join(f"{r}'s stderr:\n{_tail(logs[r])}" for r in failed))
            parsed = parse_output(out.read_text(errors="replace"))
        except subprocess.TimeoutExpired:
            raise PsliteError(f"ps-lite's driver ran past its {bound:.0f} s bound, so its processes were killed; "
                              f"worker's stderr:\n{_tail(logs['worker'])}\nscheduler's stderr:\n"
                              f"{_tail(logs['scheduler'])}") from None
        finally:
            _kill_group(procs)
    return [{**row, "system": "ps-lite", "dim": 1, "servers": 1, "window": window,
             "mb_per_s": row["keys_per_s"] * (8 + 4) / 1e6, "pslite_commit": parsed.get("pslite_commit", "unknown")}
            for row in parsed["rows"]]


def _wait_all(procs: dict[str, subprocess.Popen], bound: float) -> None:
    """Wait for the worker, then the others (they leave at the worker's final barrier), all by one deadline."""
    deadline = time.monotonic() + bound
    for role in ("worker", "server", "scheduler"):
        procs[role].wait(timeout=max(0.0, deadline - time.monotonic()))


def _kill_group(procs: dict[str, subprocess.Popen]) -> None:
    """Kill the group the scheduler leads, where any of its processes is still there, then reap them all."""
    if "scheduler" in procs and any(p.poll() is None for p in procs.values()):
        try:
            os.killpg(procs["scheduler"].pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for p in procs.values():
        p.wait()


def ratios(ours: list[dict], peer: list[dict]) -> list[dict]:
    """Ours ÷ ps-lite's keys/s for each direction and batch size both measured (1 server, dim 1)."""
    theirs = {(r["op"], r["batch"]): r for r in peer}
    out = []
    for r in ours:
        match = theirs.get((r["op"], r["keys"]))
        if match is None or r.get("dim") != 1 or r.get("servers") != 1 or r.get("replicas", 1) != 1:
            continue
        out.append({"op": r["op"], "keys": r["keys"], "paramserver_keys_per_s": r["keys_per_s"],
                    "pslite_keys_per_s": match["keys_per_s"], "ratio": r["keys_per_s"] / match["keys_per_s"]})
    return out
