"""A stream job's report: its rate over the time it had rows, beside the wall time's; its
--metrics-out also when it fails; and an outage of Redis said in three lines, not one a
retry (a redis-server stopped and started again on the same port, its data kept)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from tests.process.redis_support import answering, free_port, redis_url, start_redis, stop_redis  # noqa: F401
from tests.process.support import wait_for

LIBSVM = ["--format", "libsvm", "--label-format", "01"]


def _train(args: list[str], tmp_path, stderr=subprocess.PIPE) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "paramserver", "train", "--quiet", *args], stdout=subprocess.PIPE,
                            stderr=stderr, text=True, start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def _add(url: str, stream: str, rows: int, first: int = 0) -> None:
    import redis

    client = redis.Redis.from_url(url)
    client.xadd(stream, {"line": "\n".join(f"0 {first + i + 1}:1" for i in range(rows)).encode()})
    client.close()


def _polls(url: str) -> int:
    import redis

    client = redis.Redis.from_url(url)
    try:
        return int(client.info("commandstats").get("cmdstat_xinfo|stream", {}).get("calls", 0))
    finally:
        client.close()


def test_a_stream_jobs_rate_does_not_count_the_time_it_waited_for_rows(tmp_path, redis_url):  # noqa: F811
    out = tmp_path / "r.json"
    proc = _train(["--stream", f"{redis_url}/later", *LIBSVM, "--max-examples", "2000", "--metrics-out", str(out)],
                  tmp_path)
    try:
        wait_for(lambda: _polls(redis_url) >= 15, 120, "the job polling an empty stream for 3 s")  # 0.2 s a poll
        _add(redis_url, "later", 2000)
        _, err = proc.communicate(timeout=120)
    finally:
        _stop(proc)
    assert proc.returncode == 0, err[-2000:]
    report = json.loads(out.read_text())
    assert report["examples"] == 2000 and report["idle_seconds"] >= 2.5, report
    assert abs(report["busy_seconds"] + report["idle_seconds"] - report["seconds"]) < 1e-6
    assert report["examples_per_s"] > 2 * report["examples_per_s_wall"], report  # the trainer's rate, not the wait's
    assert abs(report["examples_per_s_wall"] * report["seconds"] - 2000) < 1e-3


def test_metrics_out_is_written_when_a_stream_job_fails(tmp_path, redis_url):  # noqa: F811
    _add(redis_url, "bad", 3)
    _add(redis_url, "bad", 1, first=3)
    import redis

    client = redis.Redis.from_url(redis_url)
    ident = client.xadd("bad", {"line": b"0 9:1\nzero 10:1"}).decode()
    client.close()
    out = tmp_path / "r.json"
    proc = _train(["--stream", f"{redis_url}/bad", *LIBSVM, "--max-examples", "6", "--metrics-out", str(out)],
                  tmp_path)
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        _stop(proc)
    assert proc.returncode == 2 and f"entry {ident}, row 2" in err, err[-2000:]
    report = json.loads(out.read_text())
    assert report["failed"] is True and f"XDEL bad {ident}" in report["error"], report
    assert report["data"] == [f"{redis_url}/bad"] and "examples" in report and "stream_position" in report


def test_an_outage_is_said_once_with_the_time_the_job_keeps_trying_and_its_end_once(tmp_path):
    import redis

    port = free_port()
    folder = tmp_path / "redis"
    folder.mkdir()
    url = f"redis://127.0.0.1:{port}"

    def start() -> subprocess.Popen:
        proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                 "--appendonly", "yes", "--dir", str(folder)], stdout=subprocess.DEVNULL)
        wait_for(lambda: answering(port), 20, "redis-server to answer")
        return proc

    server = start()
    log = tmp_path / "err.txt"
    with open(log, "w") as err:
        proc = _train(["--stream", f"{url}/s", *LIBSVM, "--max-examples", "10"], tmp_path, stderr=err)
    try:
        wait_for(lambda: redis.Redis(port=port).exists("s"), 120, "the job's group")
        stop_redis(server)  # its data is in its append-only file: started again, the stream is there
        wait_for(lambda: "Redis is unreachable" in log.read_text(), 60, "the job saying Redis is unreachable")
        server = start()
        _add(url, "s", 10)
        proc.wait(timeout=120)
    finally:
        _stop(proc)
        stop_redis(server)
    text = log.read_text()
    assert proc.returncode == 0, text[-3000:]
    lines = [line for line in text.splitlines() if "redis_outage" in line]
    assert len(lines) == 2, lines  # not one a retry (every 0.5 s)
    assert "WARNING" in lines[0] and "keeps trying for 60 s, then stops" in lines[0], lines
    assert "INFO" in lines[1] and "Redis is back, after" in lines[1], lines
