"""A model table's settings said as the ``paramserver train`` flags that make them: how a
job resumed with other settings than its checkpoint's is told which flags differ (each
with the checkpoint's value and this command's) and the command line that resumes it.

    --storage: the checkpoint has fp16, this command asks float32
    resume with the checkpoint's settings: paramserver train --data d.tsv --resume ck --storage fp16
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass
from typing import Any

from paramserver.filters.chain import FilterSpec
from paramserver.lifecycle.spec import Lifecycle
from paramserver.tables.spec import TableSpec


@dataclass(frozen=True)
class Setting:
    """One setting of a table as its flags: the flag named in messages, the value shown,
    the words that give it on a command line, and every flag those words replace."""

    flag: str
    shown: str
    words: tuple[str, ...]
    replaces: tuple[str, ...]


def _number(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _optimizer(wire: dict[str, Any]) -> str:
    params = ",".join(f"{k}={_number(v)}" for k, v in wire.items() if k != "name")
    return f"{wire['name']}:{params}" if params else str(wire["name"])


def _consistency(staleness: Any) -> str:
    return "asp" if staleness is None else "bsp" if staleness == 0 else f"ssp:{staleness}"


def settings(spec: TableSpec, model: dict[str, Any] | None = None) -> dict[str, Setting]:
    """``spec``'s settings by the flag that gives each (``model``: the job's model as its
    checkpoint records it, whose ``k`` the embedding's width comes from)."""
    wire = spec.to_wire()
    found = [("--optimizer", _optimizer(wire["optimizer"])), ("--seed", str(spec.seed)),
             ("--consistency", _consistency(wire["consistency"])), ("--replicas", str(spec.replicas)),
             ("--filters", str(FilterSpec.parse(spec.filters))), ("--lifecycle", str(Lifecycle.parse(spec.lifecycle))),
             ("--storage", spec.storage)]
    out = {flag: Setting(flag, value, (flag, value), (flag,)) for flag, value in found}
    if spec.key_bits:
        out["--table-layout"] = Setting("--table-layout", f"dense (--hash-bits {spec.key_bits})",
                                        ("--table-layout", "dense", "--hash-bits", str(spec.key_bits)),
                                        ("--table-layout", "--hash-bits"))
    else:
        out["--table-layout"] = Setting("--table-layout", "hash", ("--table-layout", "hash"), ("--table-layout",))
    k = (model or {}).get("k")
    out["--embedding-dim"] = Setting("--embedding-dim", f"{spec.dim} values a row",
                                     ("--embedding-dim", str(k)) if k is not None else (),
                                     ("--embedding-dim", "--k"))
    return out


def differences(theirs: TableSpec, mine: TableSpec, model: dict[str, Any] | None = None) -> list[tuple[Setting, str]]:
    """The checkpoint's settings (``theirs``) that differ from this command's, each with
    this command's value shown; a difference no flag gives is said by its field."""
    ours, checkpoint = settings(mine), settings(theirs, model)
    out = [(s, ours[flag].shown) for flag, s in checkpoint.items() if s.shown != ours[flag].shown]
    if not out:  # a field no train flag sets (aggregate, block_size, the initialiser)
        a, b = theirs.to_wire(), mine.to_wire()
        out = [(Setting(field, str(a.get(field)), (), ()), str(b.get(field)))
               for field in sorted(set(a) | set(b)) if a.get(field) != b.get(field)]
    return out


def said(diffs: list[tuple[Setting, str]]) -> str:
    """``--storage: the checkpoint has fp16, this command asks float32; ...``"""
    def quoted(value: str) -> str:  # a spec's own ';' apart from the list's
        return shlex.quote(value) if ";" in value else value

    return "; ".join(f"{s.flag}: the checkpoint has {quoted(s.shown)}, this command asks {quoted(mine)}"
                     for s, mine in diffs)


def fix(diffs: list[tuple[Setting, str]], argv: list[str] | None = None) -> str:
    """The command line that resumes with the checkpoint's settings: this command's (when
    it is the ``paramserver`` command) with the differing flags replaced, else the flags."""
    words = [w for s, _ in diffs for w in s.words]
    argv = sys.argv if argv is None else argv
    name = os.path.basename(argv[0]) if argv else ""
    if name != "paramserver" and not argv[0].endswith(os.path.join("paramserver", "__main__.py")):
        return f"pass the checkpoint's {shlex.join(words)}"
    replaced = {flag for s, _ in diffs for flag in s.replaces}
    kept: list[str] = []
    skip = False
    for word in argv[1:]:
        if skip:
            skip = False
        elif word in replaced:
            skip = True  # the flag's value goes with it
        elif not any(word.startswith(f"{flag}=") for flag in replaced):
            kept.append(word)
    return f"resume with the checkpoint's settings: {shlex.join(['paramserver', *kept, *words])}"
