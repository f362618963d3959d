"""Helpers the process tests share: real data paths, waiting on a condition, heavy rows and a
training job's report."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def shared(rel: str) -> str:
    """Path of a real data set under ../shared/data; the test is skipped where it is absent."""
    path = DATA / rel
    if not path.exists():
        pytest.skip(f"real data not found at {path} (the ../shared/data folder is absent)")
    return str(path)


def user_module(tmp_path, monkeypatch, name: str, text: str):
    """A module of the user's (rules, filters), importable by the cluster's nodes: written
    under ``tmp_path``, which goes on sys.path (LocalCluster hands it to its nodes as
    PYTHONPATH); a generator for a fixture, which forgets the module afterwards."""
    import sys

    (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def wait_for(condition, timeout_s=60.0, what="condition"):
    """Poll ``condition()`` until it is true (bounded): synchronisation on state, not on time."""
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)
    return value


#: an update rule that counts, in a key's state, the gradients pushed to it (the weight stays
#: 0, so a label-0 example's gradient is 0.5): what the stream tests read back to check that
#: every row was applied exactly once
COUNTING_RULE = """
import paramserver

@paramserver.rule(state_width=1)
def count(value, state, grad, hp):
    state[0] += grad[0]  # the weight stays 0: p = 0.5, a label-0 example's gradient 0.5
"""


@contextlib.contextmanager
def killed_on_exit(proc):
    """``proc`` (started with ``start_new_session=True``) killed whole, its process group,
    if still running when the block ends (a failed assertion, a timeout)."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def heavy_rows(folder, train: int, test: int):
    """``folder`` with ``train.tsv`` and ``test.tsv``: heavy-tailed rows of ``paramserver synth``
    (seeds 1 and 2)."""
    for name, n, seed in (("train.tsv", train, 1), ("test.tsv", test, 2)):
        subprocess.run([sys.executable, "-m", "paramserver", "synth", "--rows", str(n), "--shape", "heavy", "--seed",
                        str(seed), "--out", str(folder / name)], check=True, capture_output=True, timeout=120)
    return folder


def train_report(folder, name, *args, prefix=()):
    """``paramserver train`` on ``folder``'s rows (``heavy_rows``) with ``args``: its report."""
    report = folder / f"{name}.json"
    run = subprocess.run([*prefix, sys.executable, "-m", "paramserver", "train", "--data", str(folder / "train.tsv"),
                          "--test", str(folder / "test.tsv"), "--quiet", "--metrics-out", str(report), *args],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(report.read_text())

