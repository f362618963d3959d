"""``train --stream``: a real redis-server (Debian's, started and stopped here) and a folder
whose files arrive; exactly once across whole-job SIGKILLs, counted with a table whose
update rule adds each example's gradient to a counter and keeps the weight at 0 (so every
example's gradient is exactly 0.5: the counter is half the examples a key was in)."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest
from tests.process.support import COUNTING_RULE, killed_on_exit, user_module, wait_for


@pytest.fixture
def rules(tmp_path, monkeypatch):
    yield from user_module(tmp_path, monkeypatch, "stream_rules", COUNTING_RULE)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def redis_url(tmp_path):
    """A redis-server of its own on a free port, with its data in tmp_path; stopped after."""
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed: make test installs Debian's redis-server")
    redis = pytest.importorskip("redis", reason="the redis extra (make test installs it)")
    port = _free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(tmp_path)], stdout=subprocess.DEVNULL)
    client = redis.Redis(port=port)

    def up():
        try:
            return client.ping()
        except redis.ConnectionError:
            return False

    try:
        wait_for(up, 20, "redis-server to answer")
        yield f"redis://127.0.0.1:{port}"
    finally:
        client.close()
        proc.terminate()
        proc.wait(timeout=20)


def _feed(url: str, stream: str, rows: list[bytes]) -> None:
    import redis

    client = redis.Redis.from_url(url)
    pipe = client.pipeline(transaction=False)
    for i, row in enumerate(rows):
        pipe.xadd(stream, {"line": row})
        if i % 2000 == 1999:
            pipe.execute()
    pipe.execute()
    client.close()


def _train(args: list[str], tmp_path, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    return subprocess.Popen([sys.executable, "-m", "paramserver", "train", "--quiet", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **kw)


def _running(args: list[str], tmp_path):
    """``paramserver train ARGS`` in a session of its own, killed whole if still running
    when the block ends."""
    return killed_on_exit(_train(args, tmp_path))


def _counted_once(checkpoint_dir: str, n: int) -> None:
    """Every one of the ``n`` examples applied exactly once: each id's counter 1, the bias's n."""
    _, counts = _counts(checkpoint_dir)
    ids = counts[counts != n]
    assert counts.max() == n and ids.size == n and np.all(ids == 1), (
        f"bias {counts.max()}, {np.sum(ids > 1)} ids applied twice, {n - np.sum(ids == 1)} missing")


def _counts(checkpoint_dir: str) -> tuple[np.ndarray, np.ndarray]:
    from paramserver.apps.ctr.modelfile import _from_checkpoint

    _, keys, rows, _ = _from_checkpoint(checkpoint_dir)
    return keys, rows[:, 1] * 2  # the rule's counter: 0.5 an example


def test_redis_stream_exactly_once_over_sigkills(tmp_path, rules, redis_url):
    """Whole-job SIGKILLs at random moments after a checkpoint, then --resume: every example
    applied exactly once (each id's counter 1, the bias's N), the report's examples N, the
    group caught up.  A quarter of the rows is fed before each killed run, the last after: a
    killed job has new rows to checkpoint and cannot have ended before its kill, however fast
    the machine."""
    import redis

    n = 24_000
    rows = [f"0 {i + 1}:1".encode() for i in range(n)]
    quarter = n // 4
    ckpt = str(tmp_path / "ckpt")
    args = ["--stream", f"{redis_url}/clicks", "--format", "libsvm", "--label-format", "01", "--hash-bits", "64",
            "--optimizer", "stream_rules:count", "--batch-size", "200", "--shard-mb", "0.02",  # ~12 shards
            "--checkpoint-dir", ckpt, "--checkpoint-seconds", "0.2", "--max-examples", str(n),
            "--metrics-out", str(tmp_path / "report.json")]
    rng = random.Random(7)

    def steps() -> int:
        return sum(os.path.exists(os.path.join(ckpt, s, "MANIFEST.json")) for s in os.listdir(ckpt)) \
            if os.path.isdir(ckpt) else 0

    for part in range(3):  # killed whole once it checkpointed anew, at a random moment after
        _feed(redis_url, "clicks", rows[part * quarter:(part + 1) * quarter])
        before = steps()
        with _running(args + (["--resume", ckpt] if before else []), tmp_path) as proc:
            # (a condition, not a time: the job's speed depends on whether numba's cache holds the rule)
            wait_for(lambda p=proc, b=before: p.poll() is not None or steps() > b, timeout_s=120,
                     what="a new checkpoint")
            assert proc.poll() is None, f"the job ended short of its rows: {proc.communicate()[1][-3000:]}"
            with pytest.raises(subprocess.TimeoutExpired):  # still running at a random moment after it
                proc.wait(timeout=rng.uniform(0.0, 0.4))
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    _feed(redis_url, "clicks", rows[3 * quarter:])
    proc = _train(args + ["--resume", ckpt], tmp_path)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["examples"] == n
    _counted_once(ckpt, n)
    group = redis.Redis.from_url(redis_url).xinfo_groups("clicks")[0]
    assert group["lag"] == 0 and group["pending"] == 0


def test_folder_stream_takes_files_as_they_arrive_once(tmp_path, rules):
    """Files arriving in a folder are each read once, in name order, half-written ones
    (a temporary name, then a rename) never; Ctrl-C (SIGINT) ends the job with its report."""
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.txt").write_text("".join(f"0 {i + 1}:1\n" for i in range(3000)))
    with _running(["--stream", str(folder), "--format", "libsvm", "--label-format", "01", "--hash-bits", "64",
                   "--optimizer", "stream_rules:count", "--save", str(tmp_path / "model"),
                   "--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-seconds", "0.3",
                   "--metrics-out", str(tmp_path / "r.json")], tmp_path) as proc:
        wait_for(lambda: _examples(tmp_path / "ckpt") >= 3000, 120, "the first file trained")
        tmp = folder / ".b.txt.tmp"
        tmp.write_text("".join(f"0 {i + 1}:1\n" for i in range(3000, 5000)))
        tmp.rename(folder / "b.txt")
        wait_for(lambda: _examples(tmp_path / "ckpt") >= 5000, 120, "both files trained")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert json.loads((tmp_path / "r.json").read_text())["examples"] == 5000
    _counted_once(str(tmp_path / "ckpt"), 5000)


def _examples(ckpt) -> int:
    """Examples in the newest complete checkpoint under ``ckpt`` (0 before the first)."""
    from paramserver.checkpoint import store

    try:
        step = store.resolve_step(str(ckpt))
        return int(store.read_manifest(step)["job"]["totals"]["examples"])
    except Exception:
        return 0


def test_bad_input_on_a_stream_is_said_clearly_and_loses_nothing_committed(tmp_path, rules, redis_url):
    """A malformed entry fails the job naming the stream, the entry's id and its row (the
    fix: XDEL it), a deleted stream fails it saying so; the group keeps what the last checkpoint
    committed, and --skip-bad-lines skips and counts, under --max-bad-fraction."""
    import redis

    client = redis.Redis.from_url(redis_url)
    _feed(redis_url, "bad", [b"0 1:1", b"0 2:1", b"zero 3:1", b"0 4:1"])
    base = ["--format", "libsvm", "--label-format", "01", "--hash-bits", "64"]
    proc = _train(["--stream", f"{redis_url}/bad", *base, "--max-examples", "4"], tmp_path)
    _, err = proc.communicate(timeout=120)
    bad = client.xrange("bad")[2][0].decode()  # named by its entry id and row, to XDEL it
    assert proc.returncode != 0 and f"{redis_url}/bad entry {bad}, row 1: " in err and "'zero 3:1'" in err, err[-2000:]
    assert f"XDEL bad {bad}" in err
    assert "Traceback" not in err
    proc = _train(["--stream", f"{redis_url}/bad?group=skip", *base, "--max-examples", "4", "--skip-bad-lines",
                   "--metrics-out", str(tmp_path / "r.json")], tmp_path)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["examples"] == 3 and report["bad_lines"] == 1

    _feed(redis_url, "gone", [f"0 {i + 1}:1".encode() for i in range(1000)])
    ckpt = str(tmp_path / "ckpt")
    with _running(["--stream", f"{redis_url}/gone", *base, "--checkpoint-dir", ckpt, "--checkpoint-seconds", "0.2"],
                  tmp_path) as proc:
        wait_for(lambda: _examples(ckpt) >= 1000, 120, "the stream trained and checkpointed")
        committed = wait_for(lambda: client.xinfo_groups("gone")[0]["last-delivered-id"] != b"0-0" and
                             client.xinfo_groups("gone")[0]["last-delivered-id"], 30, "the checkpoint committed")
        client.delete("gone")
        _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "the stream is gone" in err and "Traceback" not in err, err[-2000:]
    assert committed != b"0-0" and _examples(ckpt) == 1000  # what was committed stays committed
    client.close()


def test_a_stream_fed_while_the_job_runs_stops_exactly_at_max_examples(tmp_path, redis_url):
    """A job started on an empty stream (its group new: Redis does not know how many entries
    it read) counts what arrives, and stops at --max-examples exactly, not before."""
    import redis

    client = redis.Redis.from_url(redis_url)
    with _running(["--stream", f"{redis_url}/later", "--format", "libsvm", "--label-format", "01",
                   "--max-examples", "3000", "--metrics-out", str(tmp_path / "r.json")], tmp_path) as proc:
        wait_for(lambda: client.exists("later") and client.xinfo_groups("later"), 60, "the job's group")
        for part in range(4):  # 4 x 1000 rows, while it runs: it takes the first 3000
            _feed_more(client, "later", [f"0 {part * 1000 + i + 1}:1".encode() for i in range(1000)])
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    assert json.loads((tmp_path / "r.json").read_text())["examples"] == 3000


def _feed_more(client, stream: str, rows: list[bytes]) -> None:
    pipe = client.pipeline(transaction=False)
    for row in rows:
        pipe.xadd(stream, {"line": row})
    pipe.execute()


def _workers_of(driver: int) -> list[int]:
    """The pids of a job's training workers: the driver's children named for ps as workers."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                title = f.read()
            with open(f"/proc/{pid}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if title.startswith(b"paramserver: worker") and parent == driver:
            found.append(int(pid))
    return found


def test_a_worker_that_dies_mid_stream_has_its_shard_read_again_by_another(tmp_path, rules, redis_url):
    """SIGKILL one of the two workers while the stream is read: the shard it held goes back
    to the queue and the other worker reads it; every example still counts once."""
    n = 40_000
    _feed(redis_url, "one", [f"0 {i + 1}:1".encode() for i in range(n)])
    ckpt = str(tmp_path / "ckpt")
    import redis

    client = redis.Redis.from_url(redis_url)
    with _running(["--stream", f"{redis_url}/one", "--format", "libsvm", "--label-format", "01", "--hash-bits", "64",
                   "--optimizer", "stream_rules:count", "--batch-size", "100", "--shard-mb", "0.25", "--workers", "2",
                   "--checkpoint-dir", ckpt, "--max-examples", str(n), "--metrics-out", str(tmp_path / "r.json")],
                  tmp_path) as proc:
        workers = wait_for(lambda: len(w := _workers_of(proc.pid)) == 2 and w, 60, "two named workers")
        wait_for(lambda: client.info("commandstats").get("cmdstat_xrange", {}).get("calls", 0) >= 4, 60,
                 "the workers reading the stream")
        os.kill(workers[0], signal.SIGKILL)  # mid-stream: the shard it holds is not done
        _, err = proc.communicate(timeout=180)
    client.close()
    assert proc.returncode == 0, err[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["examples"] == n and report["failed_workers"], report.get("failed_workers")
    _counted_once(ckpt, n)



def test_max_examples_is_rows_exactly_from_a_folder_and_a_resumed_job_reads_the_rest(tmp_path, rules):
    """--max-examples N trains exactly N rows from a folder (issue 43, item 15): the file
    that reaches N is cut after its N-th row, blank lines are not rows, and a job resumed
    with a larger N reads the rest of that file and the next, each row once."""
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.txt").write_text("".join(f"0 {i + 1}:1\n" for i in range(3000)))
    (folder / "b.txt").write_text("".join(f"0 {i + 1}:1\n\n" for i in range(3000, 5000)))
    (folder / "c.txt").write_text("".join(f"0 {i + 1}:1\n" for i in range(5000, 6000)))
    common = ["--stream", str(folder), "--format", "libsvm", "--label-format", "01", "--hash-bits", "64",
              "--optimizer", "stream_rules:count", "--shard-mb", "0.01", "--checkpoint-dir", str(tmp_path / "ckpt"),
              "--metrics-out", str(tmp_path / "r.json")]
    for flags, n in ((["--max-examples", "4321"], 4321), (["--max-examples", "5500", "--resume",
                                                          str(tmp_path / "ckpt")], 5500)):
        with _running([*common, *flags], tmp_path) as proc:
            out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err[-3000:]
        assert json.loads((tmp_path / "r.json").read_text())["examples"] == n
        _counted_once(str(tmp_path / "ckpt"), n)


def test_max_examples_is_rows_exactly_from_standard_input(tmp_path, rules):
    rows = "".join(f"0 {i + 1}:1\n" for i in range(3000))
    proc = _train(["--stream", "-", "--format", "libsvm", "--label-format", "01", "--hash-bits", "64",
                   "--optimizer", "stream_rules:count", "--max-examples", "1777", "--metrics-out",
                   str(tmp_path / "r.json")], tmp_path, stdin=subprocess.PIPE)
    try:
        _, err = proc.communicate(rows, timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    assert proc.returncode == 0, err[-3000:]
    assert json.loads((tmp_path / "r.json").read_text())["examples"] == 1777
