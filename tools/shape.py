"""The package's shape, checked by ``make lint``: file and function sizes, and the number of
top-level modules (the layers are import-linter's contract in pyproject.toml).  The folders
in ``also`` (the benchmarks) keep the same file and function sizes.

    python tools/shape.py          # exits 1 naming every file or function over its limit

Limits and the short list of exceptions are in pyproject.toml, ``[tool.paramserver.shape]``.
An exception that is back within its limit fails the check too: the list only shrinks.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def function_sizes(tree: ast.AST) -> list[tuple[str, int, int]]:
    """(qualified name, first line, lines) of every function and method, decorators included."""
    out: list[tuple[str, int, int]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                assert child.end_lineno is not None
                out.append((prefix + child.name, first, child.end_lineno - first + 1))
                walk(child, prefix + child.name + ".")
            elif isinstance(child, ast.ClassDef):
                walk(child, prefix + child.name + ".")
            else:
                walk(child, prefix)

    walk(tree, "")
    return out


def check(root: Path = ROOT) -> list[str]:
    cfg = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["paramserver"]["shape"]
    package = root / cfg["package"]
    excepted = {(e["path"], e.get("function", "")): e for e in cfg["exceptions"]}
    problems, used = [], set()
    if len(excepted) > cfg["max_exceptions"]:
        problems.append(f"{len(excepted)} exceptions in [tool.paramserver.shape]: at most {cfg['max_exceptions']}")
    top = sorted(p.name for p in package.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    if len(top) > cfg["max_top_level_modules"]:
        problems.append(f"{len(top)} top-level modules ({', '.join(top)}): at most {cfg['max_top_level_modules']};"
                        " put a module in the folder of its layer")
    paths = [*package.rglob("*.py"), *(p for folder in cfg.get("also", []) for p in (root / folder).rglob("*.py"))]
    for path in sorted(paths):
        rel = path.relative_to(root).as_posix()
        text = path.read_text()
        lines = text.count("\n") + (not text.endswith("\n") and bool(text))
        if lines > cfg["max_file_lines"]:
            if (rel, "") in excepted:
                used.add((rel, ""))
            else:
                problems.append(f"{rel}: {lines} lines, over {cfg['max_file_lines']}: split it by concept")
        for name, first, size in function_sizes(ast.parse(text, rel)):
            if size <= cfg["max_function_lines"]:
                continue
            if (rel, name) in excepted:
                used.add((rel, name))
            else:
                problems.append(f"{rel}:{first}: {name} is {size} lines, over {cfg['max_function_lines']}: "
                                "give its steps names of their own")
    for key in sorted(set(excepted) - used):
        problems.append(f"{key[0]}{':' + key[1] if key[1] else ''} is within its limit now: "
                        "remove its exception from [tool.paramserver.shape]")
    return problems


def main() -> int:
    problems = check()
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
