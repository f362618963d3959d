"""docs/architecture.md's layout names every module of the package, in its folder: a
module added, moved or removed without the layout following fails here."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "paramserver"


def _layout() -> dict[str, set[str]]:
    """Folder (``""`` for the package root) -> the module names its entry in the layout lists."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    block = next(b for b in section.split("```")[1::2] if b.lstrip().startswith("src/paramserver/"))
    entries: dict[str, set[str]] = {}
    folder = ""
    for line in block.splitlines()[1:]:
        head = re.match(r"^  ([\w/]+/)\s", line + " ")
        if head:
            folder = head.group(1).rstrip("/")
        elif re.match(r"^  [\w]+\.py\s", line + " "):
            folder = ""
        entries.setdefault(folder, set()).update(re.findall(r"(?<![/\w])(\w+)\.py\b", line))
    return entries


def test_the_layout_names_every_module_in_its_folder():
    entries = _layout()
    missing, stale = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if path.name == "__init__.py" and rel.parent != pathlib.Path("."):
            continue  # a folder's (empty) marker
        folder = rel.parent.as_posix() if rel.parent != pathlib.Path(".") else ""
        if path.stem not in entries.get(folder, set()):
            missing.append(rel.as_posix())
    for folder, names in entries.items():
        for name in names:
            if not (PACKAGE / folder / f"{name}.py").exists():
                stale.append(f"{folder}/{name}.py" if folder else f"{name}.py")
    assert not missing, f"docs/architecture.md's layout does not name: {missing}"
    assert not stale, f"docs/architecture.md's layout names modules that do not exist: {stale}"


def test_every_module_the_docs_name_exists():
    """A path like `server/dedup.py` in the docs names a module that is there."""
    names = {p.name for p in PACKAGE.rglob("*.py")}
    rels = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")}
    wrong = []
    for doc in [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            for token in re.findall(r"`([\w/.]+\.py)\b", line):
                path = token.removeprefix("src/").removeprefix("paramserver/")
                if path.startswith(("bench/", "tests/", "tools/", "deploy/")) or path.startswith("test_"):
                    continue
                if not (path in rels if "/" in path else path in names):
                    wrong.append(f"{doc.relative_to(ROOT)}:{number}: {token}")
    assert not wrong, f"the docs name modules that do not exist: {wrong}"


def test_the_package_docstring_names_every_folder():
    import paramserver

    folders = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    missing = [f for f in folders if f"{f}/" not in (paramserver.__doc__ or "")]
    assert not missing, f"paramserver/__init__.py's layout note does not name: {missing}"
