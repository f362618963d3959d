"""paramserver serve as a process: --follow a folder that train --publish fills, not ready
until the first part is there, then answering what load_model(folder) answers; SIGTERM
stops it with status 0."""

import json
import os
import signal
import subprocess
import sys

import numpy as np
from serve_support import Served
from support import wait_for

from paramserver import load_model
from paramserver.apps.ctr.synth import write_synth
from paramserver.checkpoint.publish import read_index


def test_serve_follows_a_training_jobs_publications_and_stops_on_sigterm(tmp_path):
    data, rows, pub = tmp_path / "d.tsv", tmp_path / "rows.tsv", tmp_path / "pub"
    write_synth(str(data), 20_000, seed=1)
    rows.write_text("".join(line.split("\t", 1)[1] for line in data.read_text().splitlines(True)[:200]))
    with Served("--follow", str(pub), "--poll", "0.1") as served:
        assert served.get("/healthz")[0] == 200
        assert served.get("/readyz")[0] == 503  # nothing published yet
        train = subprocess.run([sys.executable, "-m", "paramserver", "train", "--data", str(data), "--publish",
                                str(pub), "--publish-every", "0.2", "--batch-size", "500", "--quiet"],
                               capture_output=True, text=True, timeout=300, env={**os.environ, "CI": "1"})
        assert train.returncode == 0, train.stderr
        last = read_index(str(pub))["parts"][-1]["path"]
        wait_for(lambda: served.version() == last, 30, f"serve to load {last}")
        status, headers, body, _ = served.post(rows.read_bytes())
        assert status == 200, body
        answer = json.loads(body)
        assert answer["model_version"] == last and headers["X-Model-Version"] == last
        assert np.array_equal(np.array(answer["probabilities"]), load_model(str(pub)).predict_proba(str(rows)))
        assert float(headers["X-Model-Age"]) >= 0
        bad = served.post(b"1\t2\n")
        assert bad[0] == 400 and "line 1:" in json.loads(bad[2])["error"]
        assert served.metric("paramserver_serve_rows_total") == 200.0
        served.proc.send_signal(signal.SIGTERM)
        assert served.proc.wait(timeout=10) == 0
    assert "Traceback" not in served.stderr
