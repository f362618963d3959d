"""A redis-server of a test's own (Debian's), on a free port of 127.0.0.1, stopped after."""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Iterator

import pytest
from tests.process.support import wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_redis(folder: str, port: int) -> subprocess.Popen:
    return subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", folder], stdout=subprocess.DEVNULL)


def stop_redis(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        proc.wait(timeout=20)


def answering(port: int) -> bool:
    import redis

    client = redis.Redis(port=port, socket_connect_timeout=1)
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False
    finally:
        client.close()


@pytest.fixture
def redis_url(tmp_path) -> Iterator[str]:
    """``redis://127.0.0.1:PORT`` of a redis-server of its own, with its data in tmp_path."""
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed: make test installs Debian's redis-server")
    pytest.importorskip("redis", reason="the redis extra (make test installs it)")
    port = free_port()
    proc = start_redis(str(tmp_path), port)
    try:
        wait_for(lambda: answering(port), 20, "redis-server to answer")
        yield f"redis://127.0.0.1:{port}"
    finally:
        stop_redis(proc)
