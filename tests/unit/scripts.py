"""The repository's scripts (``tools/``, ``bench/``: files, not a package), loaded from
their files as modules for the tests of them, with nothing put on ``sys.path`` (bench/'s
names, table.py or filters.py, would shadow others in the test session)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load_script(relative: str, name: str) -> ModuleType:
    """The script at ``relative`` (to the repository's root) as module ``name``."""
    spec = importlib.util.spec_from_file_location(name, ROOT / relative)
    assert spec is not None and spec.loader is not None, f"{relative} is not a Python file"
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # a dataclass of it looks its module up
    spec.loader.exec_module(module)
    return module
