"""paramserver serve as a process: --follow a folder that train --publish fills, not ready
until the first part is there, then answering what load_model(folder) answers; SIGTERM
stops it with status 0."""

import json
import os
import select
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
from support import wait_for

from paramserver import load_model
from paramserver.apps.ctr.synth import write_synth
from paramserver.checkpoint.publish import read_index


def _get(url, data=None):
    """(status, headers, body) of a request; an HTTP error's too."""
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "text/plain"} if data else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()
    except OSError:
        return 0, {}, b""


def _port(proc, timeout_s=60.0):
    """The port the server says it listens on (its first line of output)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.1)
        if ready:
            line = proc.stdout.readline()
            assert line, f"serve exited: {proc.stderr.read()}"
            if line.startswith("serving on http://"):
                return int(line.split()[2].rsplit(":", 1)[1])
        assert proc.poll() is None, f"serve exited: {proc.stderr.read()}"
    raise AssertionError("serve did not say its port in time")


def test_serve_follows_a_training_jobs_publications_and_stops_on_sigterm(tmp_path):
    data, rows, pub = tmp_path / "d.tsv", tmp_path / "rows.tsv", tmp_path / "pub"
    write_synth(str(data), 20_000, seed=1)
    rows.write_text("".join(line.split("\t", 1)[1] for line in data.read_text().splitlines(True)[:200]))
    env = {**os.environ, "CI": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "paramserver", "serve", "--follow", str(pub), "--port", "0",
                             "--poll", "0.1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        base = f"http://127.0.0.1:{_port(proc)}"
        assert _get(f"{base}/healthz")[0] == 200
        assert _get(f"{base}/readyz")[0] == 503  # nothing published yet
        train = subprocess.run([sys.executable, "-m", "paramserver", "train", "--data", str(data), "--publish",
                                str(pub), "--publish-every", "0.2", "--batch-size", "500", "--quiet"],
                               capture_output=True, text=True, timeout=300, env=env)
        assert train.returncode == 0, train.stderr
        last = read_index(str(pub))["parts"][-1]["path"]
        wait_for(lambda: _get(f"{base}/readyz")[1].get("X-Model-Version") == last, 30, f"serve to load {last}")
        status, headers, body = _get(f"{base}/predict", rows.read_bytes())
        assert status == 200, body
        answer = json.loads(body)
        assert answer["model_version"] == last and headers["X-Model-Version"] == last
        assert np.array_equal(np.array(answer["probabilities"]), load_model(str(pub)).predict_proba(str(rows)))
        assert float(headers["X-Model-Age"]) >= 0
        bad = _get(f"{base}/predict", b"1\t2\n")
        assert bad[0] == 400 and "line 1:" in json.loads(bad[2])["error"]
        assert b"paramserver_serve_rows_total 200.0" in _get(f"{base}/metrics")[2]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        proc.stdout.close()
        proc.stderr.close()
