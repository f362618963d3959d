"""The README's commands run as written: its "Train a CTR model" shell block and its "Use"
Python block, taken from README.md itself (not copies), in a fresh folder."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
pytestmark = pytest.mark.timeout(300)


def _block(heading: str, lang: str = "") -> str:
    """The first fenced block (``lang``) after ``heading`` in README.md."""
    text = README.read_text()
    start = text.index(f"\n{heading}\n")
    m = re.compile(rf"^```{lang}\n(.*?)^```$", re.S | re.M).search(text, start)
    assert m, f"no ```{lang} block after {heading!r} in README.md"
    return m.group(1)


def test_the_train_commands_run_as_written(tmp_path):
    script = _block("## Train a CTR model")
    assert "paramserver train" in script and "paramserver predict" in script
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "CI": "1"}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "model" / "model.json").exists() and (tmp_path / "report.json").exists()
    assert len((tmp_path / "preds.txt").read_text().splitlines()) == 100_000


def test_the_use_example_runs_and_prints_what_it_says(tmp_path):
    code = _block("## Use", "python")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[0, 1]"  # the README's comment
