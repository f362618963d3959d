"""The code on docs/write-your-own.md runs as shown (its outputs in comments checked)."""

from __future__ import annotations

import io
import re
import sys
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.timeout(180)

PAGE = Path(__file__).resolve().parents[2] / "docs" / "write-your-own.md"


def test_write_your_own_runs_as_shown(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)
    rule_module, usage, push_ops, function_module, calls, steps, block_loop = blocks
    assert all(len(b.splitlines()) < 40 for b in blocks)
    (tmp_path / "my_rules.py").write_text("import numpy as np\n" + rule_module + "\n" + function_module)
    monkeypatch.syspath_prepend(str(tmp_path))  # the nodes get sys.path as PYTHONPATH
    # the cluster block, with the later blocks run inside it (they use the same client)
    body = usage.rstrip().splitlines()
    indent = "    "
    program = "\n".join(body + [indent + line for block in (push_ops, calls) for line in block.strip().splitlines()])
    program = program.replace("c.pull(\"topic_counts\"", "got = c.pull(\"topic_counts\"")
    out = io.StringIO()
    scope: dict = {}
    try:
        with redirect_stdout(out):
            exec(compile(program, str(PAGE), "exec"), scope)
    finally:
        sys.modules.pop("my_rules", None)
    first, hist = out.getvalue().strip().splitlines()
    np.testing.assert_allclose(np.array(first.strip("[]").split(), float), [-0.145] * 4, rtol=1e-5)
    np.testing.assert_array_equal(scope["got"], [[2.0], [1.0]])
    np.testing.assert_array_equal(scope["hist"], [0, 12, 0, 0])
    assert len(scope["top_keys"]) == 2

    out = io.StringIO()
    with redirect_stdout(out):  # the block-scheduled loop: its own cluster
        exec(compile(block_loop, str(PAGE), "exec"), {})
    where, solved = out.getvalue().strip().splitlines()
    assert len(set(where.strip("[]").split())) == 2  # the four blocks are spread over both servers
    assert solved == "True"

    out = io.StringIO()
    with redirect_stdout(out):  # a step: its own cluster of one server
        exec(compile(steps, str(PAGE), "exec"), {})
    first, second, rows = out.getvalue().strip().splitlines()
    assert (first, second) == ("[0.5 0.5] 1.386", "[0.562 0.438] 1.152")
    np.testing.assert_allclose(np.array(rows.strip("[]").split(), float), [0.0, 0.469, -0.469])
