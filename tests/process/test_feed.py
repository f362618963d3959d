"""``paramserver feed`` then ``train --stream redis://...``: a gzip file fed in entries of many
rows trains exactly --max-examples rows, each once, also when the job stops inside an
entry and a second one resumes from its checkpoint; standard input feeds too."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from tests.process.redis_support import redis_url  # noqa: F401  (a fixture)
from tests.process.support import COUNTING_RULE, killed_on_exit, user_module, wait_for


@pytest.fixture
def rules(tmp_path, monkeypatch):
    yield from user_module(tmp_path, monkeypatch, "feed_rules", COUNTING_RULE)


def _paramserver(args: list[str], tmp_path, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    return subprocess.run([sys.executable, "-m", "paramserver", *args], env=env, capture_output=True, text=True,
                          timeout=240, **kw)


def _counts(checkpoint_dir: str) -> dict[int, float]:
    """Each key's counter in the newest checkpoint: the examples it was in (the bias: all)."""
    from paramserver.apps.ctr.modelfile import _from_checkpoint

    _, keys, rows, _ = _from_checkpoint(checkpoint_dir)
    return dict(zip(keys.tolist(), (rows[:, 1] * 2).tolist()))


def _once(checkpoint_dir: str, n: int) -> None:
    """Rows 1..n applied once each, no other row: n + 1 keys (the bias counts n)."""
    counts = np.array(sorted(_counts(checkpoint_dir).values()))
    assert counts.size == n + 1 and counts[-1] == n and np.all(counts[:-1] == 1), (
        f"{counts.size - 1} keys for {n} rows; counts {np.unique(counts, return_counts=True)}")


def test_a_fed_file_trains_exactly_max_examples_rows_once_across_a_resume_inside_an_entry(
        tmp_path, rules, redis_url):  # noqa: F811
    import redis

    n = 5000
    path = tmp_path / "rows.txt.gz"
    with gzip.open(path, "wt") as f:  # a blank line now and then: not a row
        f.write("".join(f"0 {i + 1}:1\n" + ("\n" if i % 997 == 0 else "") for i in range(n)))
    fed = _paramserver(["feed", str(path), "--stream", f"{redis_url}/clicks", "--rows-per-entry", "64",
                        "--pipeline", "8"], tmp_path)
    assert fed.returncode == 0, fed.stderr[-2000:]
    entries = -(-n // 64)
    assert f"fed {n:,} rows in {entries:,} entries" in fed.stdout and "rows/s" in fed.stdout, fed.stdout
    client = redis.Redis.from_url(redis_url)
    assert client.xlen("clicks") == entries
    ckpt = str(tmp_path / "ckpt")
    train = ["train", "--quiet", "--stream", f"{redis_url}/clicks", "--format", "libsvm", "--label-format", "01",
             "--hash-bits", "64", "--optimizer", "feed_rules:count", "--shard-mb", "0.05",
             "--checkpoint-dir", ckpt, "--metrics-out", str(tmp_path / "r.json")]
    first = 1000  # inside the 16th entry (rows 961..1024)
    run = _paramserver([*train, "--max-examples", str(first)], tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads((tmp_path / "r.json").read_text())["examples"] == first
    _once(ckpt, first)
    run = _paramserver([*train, "--max-examples", "3000", "--resume", ckpt], tmp_path)  # counted over resumes
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads((tmp_path / "r.json").read_text())["examples"] == 3000
    _once(ckpt, 3000)
    inside = client.xrange("clicks")[46][0]  # row 3000 is the 56th of the 47th entry (rows 2945..3008)
    assert client.get("paramserver:clicks:paramserver:row") == inside + b" 56"
    assert client.xinfo_groups("clicks")[0]["last-delivered-id"] < inside  # the group: just before it
    client.close()


def test_standard_input_is_fed_and_a_bad_stream_url_is_refused(tmp_path, redis_url):  # noqa: F811
    import redis

    rows = "".join(f"1 {i + 1}:1\n" for i in range(250))
    fed = _paramserver(["feed", "-", "--stream", f"{redis_url}/in?field=row", "--rows-per-entry", "100",
                        "--maxlen", "1000"], tmp_path, input=rows)
    assert fed.returncode == 0, fed.stderr[-2000:]
    client = redis.Redis.from_url(redis_url)
    got = client.xrange("in")
    assert [sorted(fields) for _, fields in got] == [[b"row"]] * 3
    assert b"\n".join(v for _, fields in got for v in fields.values()).decode() + "\n" == rows
    client.close()
    bad = _paramserver(["feed", "-", "--stream", "redis://127.0.0.1:1/x"], tmp_path, input=rows)
    assert bad.returncode == 2 and "cannot reach Redis" in bad.stderr and "Traceback" not in bad.stderr
    csv = _paramserver(["feed", str(tmp_path / "a.csv"), "--stream", f"{redis_url}/x"], tmp_path)
    assert csv.returncode == 2 and "no CSV header" in csv.stderr
    helped = _paramserver(["feed", "--help"], tmp_path)
    assert "train --stream redis://" in helped.stdout and "--rows-per-entry" in helped.stdout


def test_entries_of_many_rows_are_applied_once_over_limits_inside_entries_and_sigkills(
        tmp_path, rules, redis_url):  # noqa: F811
    """Jobs stopped at limits inside entries (37 rows an entry), and killed whole at random
    moments after a checkpoint while they wait for rows short of their limit (so the kill
    cannot miss a job that ended first), each resumed: every row applied exactly once."""
    import random
    import signal

    n = 12_000
    rows = [f"0 {i + 1}:1\n" for i in range(n)]
    fed = [0]

    def feed(upto: int) -> None:  # rows fed[0]..upto, 37 an entry
        path = tmp_path / f"rows{upto}.txt"
        path.write_text("".join(rows[fed[0]:upto]))
        done = _paramserver(["feed", str(path), "--stream", f"{redis_url}/k", "--rows-per-entry", "37"], tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
        fed[0] = upto

    ckpt = str(tmp_path / "ckpt")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    base = [sys.executable, "-m", "paramserver", "train", "--quiet", "--stream", f"{redis_url}/k", "--format", "libsvm",
            "--label-format", "01", "--hash-bits", "64", "--optimizer", "feed_rules:count", "--batch-size", "100",
            "--shard-mb", "0.01", "--checkpoint-dir", ckpt, "--checkpoint-seconds", "0.2"]
    rng = random.Random(11)

    def steps() -> int:
        return sum(os.path.exists(os.path.join(ckpt, s, "MANIFEST.json")) for s in os.listdir(ckpt)) \
            if os.path.isdir(ckpt) else 0

    def run(limit: int) -> subprocess.Popen:
        return subprocess.Popen([*base, "--max-examples", str(limit), *(["--resume", ckpt] if steps() else [])],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)

    # each limit inside an entry: 2000 of the feed from 0, 5003 of the one from 4600 (403 = 37 * 10 + 33), ...
    for short, limit, more in ((None, 2_000, 2_400), (4_600, 5_003, 5_400), (7_700, 8_111, 8_500),
                               (11_600, n, n)):
        if short is not None:  # the job trains what is there, waits for the rest, and is killed
            feed(short)
            before = steps()
            with killed_on_exit(run(limit)) as proc:
                wait_for(lambda p=proc, b=before: p.poll() is not None or steps() > b, 120, "a new checkpoint")
                assert proc.poll() is None, f"the job ended short of its limit: {proc.communicate()[1][-3000:]}"
                with pytest.raises(subprocess.TimeoutExpired):  # still waiting at a random moment after it
                    proc.wait(timeout=rng.uniform(0.0, 0.05))
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        feed(more)
        proc = run(limit)
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-3000:]
        _once(ckpt, limit)


def test_rows_trickling_in_on_standard_input_reach_the_stream_as_they_come(tmp_path, redis_url):  # noqa: F811
    import redis

    proc = subprocess.Popen([sys.executable, "-m", "paramserver", "feed", "-", "--stream", f"{redis_url}/live"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    client = redis.Redis.from_url(redis_url)
    try:
        assert proc.stdin is not None
        proc.stdin.write(b"0 1:1\n0 2:1\n")
        proc.stdin.flush()  # the pipe stays open: the rows must not wait for 4 MiB or 100 entries
        wait_for(lambda: client.exists("live") and client.xlen("live") == 1, 60, "the first rows in the stream")
        out, err = proc.communicate(b"0 3:1\n", timeout=60)  # then standard input ends
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == 0, err[-2000:]
    assert b"fed 3 rows in 2 entries" in out and [v[b"line"] for _, v in client.xrange("live")] == \
        [b"0 1:1\n0 2:1", b"0 3:1"]
    client.close()


def test_a_damaged_gz_is_refused_by_name_not_with_an_eof_traceback(tmp_path, redis_url):  # noqa: F811
    whole = gzip.compress("".join(f"1 {i + 1}:1\n" for i in range(5000)).encode())
    (tmp_path / "cut.gz").write_bytes(whole[:len(whole) // 2])
    fed = _paramserver(["feed", str(tmp_path / "cut.gz"), "--stream", f"{redis_url}/cut"], tmp_path)
    assert fed.returncode == 2, fed.stderr[-2000:]
    assert "cut.gz: cannot decompress it" in fed.stderr and "Traceback" not in fed.stderr


@pytest.mark.parametrize("url, said", [
    ("http://127.0.0.1:{port}/x", "a Redis stream is redis://HOST:PORT/STREAM"),
    ("redis://127.0.0.1:99999/x", "the port must be a number in 1-65535"),
    ("redis://127.0.0.1:{port}/99/x", "check the URL's /DB"),
])
def test_a_wrong_redis_url_is_refused_naming_the_url_and_the_fix(tmp_path, redis_url, url, said):  # noqa: F811
    fed = _paramserver(["feed", "-", "--stream", url.format(port=redis_url.rsplit(":", 1)[1])], tmp_path,
                       input="1 1:1\n")
    assert fed.returncode == 2 and said in fed.stderr and "Traceback" not in fed.stderr, fed.stderr[-2000:]
