"""Namespaces: several jobs on one server group, each with its own tables and quota.

A table named ``"job/w"`` lives in namespace ``"job"`` (a name without ``/`` is in the
default namespace ``""``, which has no quota).  ``client.admin.create_namespace("job",
max_keys=…, max_bytes=…)`` sets a quota; ``client.admin.drop_namespace("job")`` drops every
table of the job and nothing else; ``client.admin.namespaces()`` (and ``paramserver cluster
status``) lists them with their tables, keys and bytes.

A quota is enforced where keys are inserted, by the primary, before anything of a push
is applied: each server takes its share of the quota, in proportion to the vnodes it is
the primary of (keys are spread over vnodes by hash), and refuses a push that would take
its keys (or bytes: 8 a key plus 4 a float of the row, value and state) past that share.
So a namespace never holds more than its quota, and nothing stored is ever lost to it;
the first refusal may come a little before the quota, when a server's share fills first
(keys spread unevenly by chance: about ``√(share)`` keys).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from paramserver.errors import ConfigError

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def namespace_of(table: str) -> str:
    """The namespace of a table name: its first ``/`` part, or ``""``."""
    head, sep, _ = table.partition("/")
    return head if sep else ""


def check_name(name: Any) -> str:
    if not isinstance(name, str) or not _NAME.match(name) or name in (".", ".."):
        raise ConfigError(f"a namespace name is 1-64 characters of [A-Za-z0-9_.-], got {name!r}; its tables are "
                          "then named '<namespace>/<table>'")
    return name


@dataclass(frozen=True)
class Quota:
    max_keys: int | None = None
    max_bytes: int | None = None

    def __post_init__(self) -> None:
        for what, v in (("max_keys", self.max_keys), ("max_bytes", self.max_bytes)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ConfigError(f"{what} must be a whole number >= 1 (or None: no limit), got {v!r}")

    @property
    def unlimited(self) -> bool:
        return self.max_keys is None and self.max_bytes is None

    def to_wire(self) -> dict[str, Any]:
        return {"max_keys": self.max_keys, "max_bytes": self.max_bytes}

    @classmethod
    def from_wire(cls, d: Any) -> Quota:
        if d is None:
            return cls()
        if not isinstance(d, dict) or set(d) - {"max_keys", "max_bytes"}:
            raise ConfigError(f"a quota is {{max_keys, max_bytes}}, got {d!r}")
        return cls(d.get("max_keys"), d.get("max_bytes"))

    def refusal(self, fraction: float, used_keys: int, used_bytes: int, new_keys: int, new_bytes: int) -> str | None:
        """Why a server holding ``fraction`` of the vnodes must refuse a push adding
        ``new_keys`` (``new_bytes``) to ``used_keys`` (``used_bytes``); None if it may not."""
        for what, limit, used, new in (("keys", self.max_keys, used_keys, new_keys),
                                       ("bytes", self.max_bytes, used_bytes, new_bytes)):
            if limit is not None:
                share = math.floor(limit * fraction)
                if used + new > share:
                    return (f"this push adds {new:,} {what} to the {used:,} this server holds, past its share "
                            f"{share:,} of max_{what}={limit:,} ({fraction:.0%} of the vnodes)")
        return None


def summarize(tables: dict[str, Any], quotas: dict[str, Any], stats: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per namespace (those with tables or a quota): its tables, keys (primaries, summed
    over servers), bytes stored (replicas included) and quota."""
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(set(quotas) | {namespace_of(t) for t in tables}):
        mine = sorted(t for t in tables if namespace_of(t) == name)
        q = Quota.from_wire(quotas.get(name))
        out[name] = {"tables": mine, "max_keys": q.max_keys, "max_bytes": q.max_bytes,
                     "keys": sum(s["tables"].get(t, {}).get("primary_keys", 0) for s in stats for t in mine),
                     "bytes": sum(s["tables"].get(t, {}).get("bytes", 0) for s in stats for t in mine)}
    return out
