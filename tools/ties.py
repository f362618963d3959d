"""The ties between the package's files, checked by ``make lint``: no circle of imports inside a
room, and no private name taken across rooms.

    python tools/ties.py           # exits 1 naming every circle and every private import across rooms

A **room** is a folder of the package (``client``, ``data``, ``apps/ctr``); the top-level modules
are one room.  Rooms are ordered by import-linter's layers contract (pyproject.toml); this check
looks inside and between them, at every ``import`` the code holds, lazy ones inside functions
included (they run too, only later), and those under ``if TYPE_CHECKING:`` (a type names the
file it comes from as surely as a call does).

- **Circles.**  Files of one room that import each other in a loop (``a`` imports ``b``, which
  imports ``a``, directly or through others of the room) are one concept cut in the wrong place:
  move what both need into a module both import.  A room may be listed in ``allowed_circles``
  of ``[tool.paramserver.ties]`` with the reason; an entry whose room has no circle any more
  fails the check too: the list only shrinks.
- **Private names.**  A name with a leading underscore, a module (``data/_x.py``) or an attribute
  (``from ..data.parse import _parse_int``), is its room's own.  Another room that needs it gets
  it public: rename it in its module (keeping the private spelling as an alias where the room
  itself uses it).  Inside a room, private imports stay allowed.  The check reads import
  statements: a private attribute reached through an imported module (``parse._x``) is not seen.  The package-wide
  ``_runtime`` folder is a room like any other: its name says it is not for users, not that its
  modules are private to itself.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Tie:
    """One import: ``source`` (a module) names ``target`` (a module), taking ``names`` from it."""

    source: str
    line: int
    target: str
    names: tuple[str, ...]


def modules(package: Path, name: str) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (a folder's ``__init__`` is the folder)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join([name, *parts])] = path
    return out


def room(module: str, known: dict[str, Path]) -> str:
    """The folder a module lives in, as ``apps.ctr`` (``""`` for the package's top-level modules)."""
    path_is_package = known[module].name == "__init__.py"
    parts = module.split(".")[1:]
    return ".".join(parts if path_is_package else parts[:-1])


def ties(module: str, tree: ast.AST, known: dict[str, Path]) -> list[Tie]:
    """Every import of ``module`` that names a module of the package, each resolved to its file."""
    package_name = module.split(".")[0]
    here = module if known[module].name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == package_name and alias.name in known:
                    out.append(Tie(module, node.lineno, alias.name, ()))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here.split(".")[: len(here.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if base.split(".")[0] != package_name:
                continue
            plain = []
            for alias in node.names:
                if f"{base}.{alias.name}" in known:  # a submodule: a tie of its own
                    out.append(Tie(module, node.lineno, f"{base}.{alias.name}", ()))
                else:
                    plain.append(alias.name)
            if plain and base in known:
                out.append(Tie(module, node.lineno, base, tuple(plain)))
    return out


def graph(package: Path, name: str) -> tuple[dict[str, Path], list[Tie]]:
    """The package's modules and every import between them."""
    known = modules(package, name)
    found: list[Tie] = []
    for module, path in known.items():
        found.extend(ties(module, ast.parse(path.read_text(), str(path)), known))
    return known, found


def circles(known: dict[str, Path], found: list[Tie]) -> dict[str, list[list[str]]]:
    """Room -> its circles: the groups of two or more of its files that reach each other by its own imports."""
    edges: dict[str, set[str]] = {m: set() for m in known}
    for tie in found:
        if tie.target != tie.source and room(tie.source, known) == room(tie.target, known):
            edges[tie.source].add(tie.target)

    def reach(start: str) -> set[str]:
        seen: set[str] = set()
        todo = [start]
        while todo:
            for after in edges[todo.pop()] - seen:
                seen.add(after)
                todo.append(after)
        return seen

    reachable = {m: reach(m) for m in known}  # a room holds tens of files: a walk from each is cheap
    groups = {frozenset({m} | {o for o in reachable[m] if m in reachable[o]}) for m in known if m in reachable[m]}
    out: dict[str, list[list[str]]] = {}
    for group in sorted(sorted(g) for g in groups):
        out.setdefault(room(group[0], known), []).append(group)
    return out


def _private(name: str) -> bool:
    """A leading underscore, but not a dunder (``__version__`` is public by convention)."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_ties(known: dict[str, Path], found: list[Tie]) -> tuple[list[Tie], list[Tie]]:
    """(across rooms, inside a room): the imports that take a private module or name from another file."""
    across, inside = [], []
    for tie in found:
        if tie.source == tie.target:
            continue
        leaf = tie.target.rpartition(".")[2] if known[tie.target].name != "__init__.py" else ""
        if _private(leaf) or any(_private(n) for n in tie.names):
            (inside if room(tie.source, known) == room(tie.target, known) else across).append(tie)
    return across, inside


def check(package: Path, name: str, allowed: dict[str, str]) -> list[str]:
    """Every problem, one line each: circles in rooms not allowed, stale allowances, private imports across rooms."""
    known, found = graph(package, name)
    problems = []
    by_room = circles(known, found)
    for where, groups in by_room.items():
        if where in allowed:
            continue
        for group in groups:
            problems.append(f"{where or '(top level)'}: a circle of imports between {', '.join(group)}: move what "
                            "they share into a module they all import")
    for where in sorted(set(allowed) - set(by_room)):
        problems.append(f"{where} has no circle any more: remove it from allowed_circles in [tool.paramserver.ties]")
    across, _ = private_ties(known, found)
    for tie in across:
        what = ", ".join(n for n in tie.names if _private(n)) or tie.target
        where = known[tie.source].relative_to(package.parent)
        problems.append(f"{where}:{tie.line}: {tie.source} imports the private {what} from another room "
                        f"({tie.target}): make it public in its module")
    return problems


def main() -> int:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["paramserver"]["ties"]
    package = ROOT / cfg["package"]
    allowed = {e["room"]: e["reason"] for e in cfg["allowed_circles"]}
    problems = check(package, package.name, allowed)
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
