"""The files of ``data/`` import each other without a loop, lazy imports included (issue 45:
reader, streams and redis_source imported each other; the source plug-in they share is
``data/sources.py`` now, and the fsspec filesystem of a URL is ``files.fsspec_filesystem``)."""

import ast
import pathlib

DATA = pathlib.Path(__file__).resolve().parents[2] / "src" / "paramserver" / "data"


def _imports(path: pathlib.Path, names: set[str]) -> set[str]:
    """The modules of ``data/`` that ``path`` imports, anywhere in it (inside functions too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "paramserver.data":
                found |= {a.name for a in node.names} & names
            elif node.module.startswith("paramserver.data."):
                found.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[2] for a in node.names if a.name.startswith("paramserver.data.")}
    return found & names


def _loop_through(start: str, graph: dict[str, set[str]]) -> list[str] | None:
    """A path of imports from ``start`` back to itself, or None."""
    stack, seen = [(start, [start])], set()
    while stack:
        node, path = stack.pop()
        for nxt in sorted(graph[node]):
            if nxt == start:
                return [*path, start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, [*path, nxt]))
    return None


def test_no_file_of_data_imports_itself_through_others():
    names = {p.stem for p in DATA.glob("*.py")}
    graph = {p.stem: _imports(p, names) - {p.stem} for p in DATA.glob("*.py")}
    assert "sources" in graph["reader"] and "streams" not in graph["reader"]  # the cut this test guards
    loops = [loop for name in sorted(graph) if (loop := _loop_through(name, graph))]
    assert not loops, f"files of data/ import each other in a loop: {[' -> '.join(loop) for loop in loops]}"
