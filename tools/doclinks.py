"""Every link to a heading in the docs lands on one, checked by ``make lint``.

    python tools/doclinks.py        # exits 1 naming every link whose heading is gone

The Markdown files are ``docs/*.md`` and the ``README.md``.  A link ``[text](#anchor)`` must
name a heading of its own file, and ``[text](other.md#anchor)`` one of ``other.md`` (a file of
that set); anchors are GitHub's: the heading in lower case, its punctuation dropped (letters,
digits, ``-`` and ``_`` kept, in any script), spaces as ``-``, and ``-1``, ``-2`` ... after a
heading's repeats.  A section that moves to another file (``benchmarks.md`` to
``benchmarks-history.md``) or is renamed breaks the links to it in the others; this says where.
Links to files outside the set, or to a file with no anchor, are not checked here.
"""

from __future__ import annotations

import collections
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEADING = re.compile(r"^#{1,6} (.+?)\s*#*\s*$", re.M)
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
LINK = re.compile(r"\]\(([\w\-./]*\.md)?#([^)\s]+)\)")


def anchors(text: str) -> set[str]:
    """The anchors GitHub makes of the headings of ``text`` (none inside code fences)."""
    seen: collections.Counter[str] = collections.Counter()
    found = set()
    for heading in HEADING.findall(FENCE.sub("", text)):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return found


def broken(files: dict[str, str]) -> list[str]:
    """``file: #anchor -> target`` for each link whose target file has no such heading."""
    known = {name: anchors(text) for name, text in files.items()}
    out = []
    for name, text in files.items():
        for line_no, line in enumerate(text.splitlines(), 1):
            for target, anchor in LINK.findall(line):
                into = Path(target).name if target else name
                if into in known and anchor not in known[into]:
                    out.append(f"{name}:{line_no}: #{anchor} -> {into} has no such heading")
    return out


def main() -> int:
    files = {p.name: p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md"))}
    files["README.md"] = (ROOT / "README.md").read_text(encoding="utf-8")
    bad = broken(files)
    for line in bad:
        print(line)
    if bad:
        print(f"{len(bad)} link(s) to a heading that is not there: fix the link, or the heading it meant")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
