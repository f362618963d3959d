"""tools/shape.py: the package's sizes, and the same file and function sizes for the folders
in ``also`` (bench/), on a small fake tree."""

from __future__ import annotations

from pathlib import Path

import pytest
from scripts import load_script

TOOL = Path(__file__).resolve().parents[2] / "tools" / "shape.py"
CONFIG = """[tool.paramserver.shape]
package = "src/pkg"
{also}
max_file_lines = 20
max_function_lines = 5
max_top_level_modules = 5
max_exceptions = 5
exceptions = []
"""


@pytest.fixture(scope="module")
def shape():
    return load_script("tools/shape.py", "shape_tool")


def _tree(root: Path, also: str) -> Path:
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "src" / "pkg" / "__init__.py").write_text("")
    (root / "bench" / "harness").mkdir(parents=True)
    (root / "bench" / "long.py").write_text("x = 1\n" * 21)
    (root / "bench" / "harness" / "fn.py").write_text("def f():\n" + "    y = 1\n" * 5)
    (root / "pyproject.toml").write_text(CONFIG.format(also=also))
    return root


def test_the_folders_in_also_keep_the_file_and_function_sizes(shape, tmp_path):
    problems = shape.check(_tree(tmp_path, 'also = ["bench"]'))
    assert problems == ["bench/harness/fn.py:1: f is 6 lines, over 5: give its steps names of their own",
                        "bench/long.py: 21 lines, over 20: split it by concept"]


def test_without_also_only_the_package_is_checked(shape, tmp_path):
    assert shape.check(_tree(tmp_path, "")) == []


def test_the_repository_s_shape_holds_for_bench_too(shape):
    cfg_also = shape.tomllib.loads((TOOL.parents[1] / "pyproject.toml").read_text())["tool"]["paramserver"]["shape"]
    assert "bench" in cfg_also["also"]
    assert shape.check() == []
