"""tools/ties.py (``make lint``): a circle of imports inside a room, or a private name taken
across rooms, fails; each check on a small package of its own, and on the real one."""

from __future__ import annotations

import pathlib
import re
import textwrap

import pytest
from scripts import load_script

ROOT = pathlib.Path(__file__).resolve().parents[2]
ties = load_script("tools/ties.py", "ties")


def _package(tmp_path: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    """A package ``pkg`` under tmp_path with ``files`` (path -> source); every folder gets an ``__init__``."""
    root = tmp_path / "pkg"
    for rel, text in {"__init__.py": "", **files}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(root).parents:
            (root / parent / "__init__.py").touch()
        path.write_text(textwrap.dedent(text))
    return root


def _problems(root: pathlib.Path, allowed: dict[str, str] | None = None) -> list[str]:
    return ties.check(root, "pkg", allowed or {})


def test_a_clean_package_passes(tmp_path):
    root = _package(tmp_path, {
        "room/a.py": "from pkg.room.b import thing\n",
        "room/b.py": "from pkg.other.c import helper\nthing = 1\n",
        "other/c.py": "def helper(): ...\n",
    })
    assert _problems(root) == []


def test_a_circle_inside_a_room_fails_naming_its_files(tmp_path):
    root = _package(tmp_path, {
        "room/a.py": "from pkg.room.b import thing\n",
        "room/b.py": "from pkg.room.c import other\nthing = 1\n",
        "room/c.py": "from pkg.room import a\nother = 2\n",
    })
    problems = _problems(root)
    assert len(problems) == 1
    assert "room: a circle of imports between pkg.room.a, pkg.room.b, pkg.room.c" in problems[0]


def test_a_lazy_import_inside_a_function_closes_a_circle_too(tmp_path):
    root = _package(tmp_path, {
        "room/a.py": "from pkg.room.b import thing\n",
        "room/b.py": "thing = 1\n\ndef later():\n    from pkg.room.a import x\n    return x\n",
    })
    assert any("pkg.room.a, pkg.room.b" in p for p in _problems(root))


def test_a_relative_import_and_a_type_checking_import_count(tmp_path):
    root = _package(tmp_path, {
        "room/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import Thing\n",
        "room/b.py": "from . import a\nclass Thing: ...\n",
    })
    assert any("pkg.room.a, pkg.room.b" in p for p in _problems(root))


def test_the_top_level_modules_are_one_room(tmp_path):
    root = _package(tmp_path, {"one.py": "from pkg import two\n", "two.py": "import pkg.one\n"})
    assert any(p.startswith("(top level): a circle") for p in _problems(root))


def test_files_of_two_rooms_importing_each_other_are_not_this_checks_business(tmp_path):
    """Between rooms the layers contract (import-linter) rules: it forbids the upward half."""
    root = _package(tmp_path, {"up/a.py": "from pkg.down.b import y\nx = 1\n",
                               "down/b.py": "def f():\n    from pkg.up.a import x\n"})
    assert _problems(root) == []


def test_an_allowed_room_may_keep_its_circle_but_a_stale_allowance_fails(tmp_path):
    root = _package(tmp_path, {"server/a.py": "from pkg.server import b\n",
                               "server/b.py": "from pkg.server import a\n"})
    assert _problems(root, {"server": "the engine issue's"}) == []
    problems = _problems(root, {"server": "the engine issue's", "client": "was cut"})
    assert problems == ["client has no circle any more: remove it from allowed_circles in [tool.paramserver.ties]"]


@pytest.mark.parametrize("source", [
    "from pkg.data.parse import _parse_int\n",
    "from ..data.parse import public, _parse_int\n",
    "from pkg.data import _private_module\n",
    "import pkg.data._private_module\n",
    "def later():\n    from pkg.data.parse import _parse_int\n",
])
def test_a_private_name_taken_across_rooms_fails(tmp_path, source):
    root = _package(tmp_path, {
        "data/parse.py": "public = 1\n_parse_int = 2\n",
        "data/_private_module.py": "x = 1\n",
        "apps/rounds.py": source,
    })
    problems = _problems(root)
    assert len(problems) == 1 and "apps/rounds.py:" in problems[0]
    assert "imports the private" in problems[0] and "make it public in its module" in problems[0]


def test_a_private_name_inside_its_room_and_a_dunder_across_rooms_pass(tmp_path):
    root = _package(tmp_path, {
        "data/parse.py": "_parse_int = 2\n",
        "data/csv.py": "from pkg.data.parse import _parse_int\n",
        "cli/parser.py": "from pkg import __version__\n",
        "__init__.py": "__version__ = '1'\n",
    })
    assert _problems(root) == []


def test_the_package_has_no_circle_outside_its_allowances_and_no_private_tie_across_rooms():
    cfg = ties.tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["paramserver"]["ties"]
    allowed = {e["room"]: e["reason"] for e in cfg["allowed_circles"]}
    assert ties.check(ROOT / "src" / "paramserver", "paramserver", allowed) == []


def test_no_launcher_names_the_command_line_that_sits_above_it():
    """Issue 45.5: the CLI hands ``cluster/process.py`` its command (``use_command``);
    nothing below ``cli/`` loads ``paramserver.cli`` by name."""
    package = ROOT / "src" / "paramserver"
    below = [p for p in package.rglob("*.py")
             if p.parent.name != "cli" and p.relative_to(package).as_posix() not in ("__init__.py", "__main__.py")]
    names = re.compile(r"""(["']|import |from )paramserver\.cli\b""")  # by import, or by a string to load
    naming = [str(p.relative_to(ROOT)) for p in below if names.search(p.read_text())]
    assert naming == []
