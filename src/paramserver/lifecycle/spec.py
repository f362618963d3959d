"""``Lifecycle``: what a table does with keys over time (admission, eviction, change tracking).

Written as text (the CLI's ``--lifecycle``, ``create_table(lifecycle=...)``), items joined
by ``;``::

    admit=after:2                  # store a key once it was seen in 2 pushes (a sketch counts)
    admit=prob:0.25                # store it with probability 0.25 at each sighting (Monolith)
    admit=score:10                 # store it once 0.1 a show + 1 a click reach 10 (Paddle's)
    admit=mypkg.policies:Mine:k=3  # a user's policy (``lifecycle.policies.AdmissionPolicy``)
    ttl=5e6                        # drop a key not pushed for 5e6 time units
    half_life=1e6;min_score=0.5    # a key's score: sightings, halved every 1e6 units; drop below 0.5
    cap_keys=1000000               # at most 1e6 keys in the table (all its servers, one copy)
    cap_bytes=256M                 # at most 256 MiB of rows (one copy)
    victim=lru                     # over a cap, drop the least recently (lru) or frequently (lfu) pushed
    track                          # only record what changed (delta export): no admission, no eviction

or as a map with the same names.  Time is what the pushing clients say it is (the push's
``time``: ``paramserver train`` sends the examples its job has trained; a program sets
``Client.set_time``, e.g. to its data's timestamps); a key's stamp is the latest time of a
push that carried it.  Any of these also tracks changes, for ``Client.export_delta``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields
from typing import Any

from paramserver.errors import ConfigError

VICTIMS = ("lru", "lfu")
STATS = 2  # columns a push of a table whose admission wants stats carries after its values: shows, clicks
_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


@dataclass(frozen=True)
class Lifecycle:
    """A table's key lifecycle (all off by default: ``bool(Lifecycle())`` is False)."""

    admit: str = ""  # "", "after:N", "prob:P" or "module:Class[:k=v,...]"
    ttl: float = 0.0  # drop keys unseen for this long (0: never)
    half_life: float = 0.0  # a key's score halves in this much time (0: no score kept)
    min_score: float = 0.0  # drop keys whose decayed score falls below (needs half_life)
    cap_keys: int = 0  # at most this many keys, one copy, whole table (0: no cap)
    cap_bytes: int = 0  # at most this many bytes of keys and rows, one copy (0: no cap)
    victim: str = "lru"  # who goes over a cap: least recently or least frequently pushed
    track: bool = False  # change tracking alone (on whenever anything else is)

    def __post_init__(self) -> None:
        for name in ("ttl", "half_life", "min_score"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value < 0:
                raise ConfigError(f"lifecycle {name} must be a finite number >= 0 (0: off), got {value!r}")
        for name in ("cap_keys", "cap_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"lifecycle {name} must be an int >= 0 (0: no cap), got {value!r}")
        if self.victim not in VICTIMS:
            raise ConfigError(f"lifecycle victim must be one of {VICTIMS}, got {self.victim!r}")
        if self.min_score and not self.half_life:
            raise ConfigError(f"lifecycle min_score={self.min_score} needs half_life (the time a score halves "
                              "in), e.g. 'half_life=1e6;min_score=0.5'")
        if self.victim == "lfu" and not self.half_life:
            raise ConfigError("lifecycle victim=lfu needs half_life (keys are ranked by their decayed count of "
                              "sightings), e.g. 'cap_keys=1000000;victim=lfu;half_life=1e7'")
        if not isinstance(self.admit, str):
            raise ConfigError(f"lifecycle admit must be text like 'after:2' or 'prob:0.25', got {self.admit!r}")
        if self.admit:
            from paramserver.lifecycle.policies import load_policy

            load_policy(self.admit)  # refused here, with the reason, if it cannot be built

    def __bool__(self) -> bool:
        return bool(self.track or self.admit or self.evicts)

    @property
    def evicts(self) -> bool:
        return bool(self.ttl or self.min_score or self.cap_keys or self.cap_bytes)

    @property
    def stats(self) -> bool:
        """Whether pushes carry each key's shows and clicks (the admission policy asks for
        them: two columns after the values, ``STATS``)."""
        return bool(self.admit) and _wants_stats(self.admit)

    @property
    def scored(self) -> bool:
        """Whether a key keeps a decayed count of its sightings (a third life column)."""
        return bool(self.half_life)

    def to_wire(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != f.default}

    def __str__(self) -> str:
        wire = self.to_wire()
        return ";".join("track" if k == "track" else f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                        for k, v in wire.items()) or "none"

    @classmethod
    def parse(cls, spec: Any) -> Lifecycle:
        """A lifecycle from text, a map (the wire's or a user's), ``None`` (off) or a
        ``Lifecycle``; ``ConfigError`` naming the value, the rule and the fix."""
        if isinstance(spec, Lifecycle):
            return spec
        if spec is None or spec == "" or spec == "none":
            return cls()
        if isinstance(spec, str):
            spec = _parse_text(spec)
        if not isinstance(spec, dict):
            raise ConfigError(f"lifecycle must be text like 'admit=after:2;ttl=1e6' or a map, got {str(spec)[:100]!r}")
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(str(k) for k in spec if k not in known)
        if unknown:
            raise ConfigError(f"lifecycle: unknown setting(s) {unknown} (known: {sorted(known)})")
        values: dict[str, Any] = {}
        for key, value in spec.items():
            default = known[key].default
            values[key] = _coerce(key, value, type(default))
        return cls(**values)


@functools.lru_cache(maxsize=64)
def _wants_stats(admit: str) -> bool:
    from paramserver.lifecycle.policies import load_policy

    return load_policy(admit).wants_stats


def _coerce(key: str, value: Any, kind: type) -> Any:
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"lifecycle {key} must be true or false, got {value!r}")
        return value
    if kind is str:
        return value if isinstance(value, str) else str(value)
    if isinstance(value, str):
        value = _number(key, value)
    if kind is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _number(key: str, text: str) -> float:
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    scale = 1
    if t and t[-1] in _UNITS:
        t, scale = t[:-1], _UNITS[t[-1]]
    try:
        return float(t) * scale
    except ValueError:
        raise ConfigError(f"lifecycle {key}={text!r} is not a number (e.g. {key}=1e6, or 256M for bytes)") from None


def _parse_text(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in text.split(";"))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if key in out:  # a second one would silently replace the first
            given = "track and track" if key == "track" else f"{key}={out[key]} and {key}={value.strip()}"
            raise ConfigError(f"lifecycle: {key} is given twice ({given}) in {text!r}; give each setting once, "
                              "e.g. 'admit=after:2;ttl=1e6'")
        if not eq:
            if key != "track":
                raise ConfigError(f"lifecycle items are name=value (or 'track'), got {item!r} in {text!r}; "
                                  "e.g. 'admit=after:2;ttl=1e6;cap_keys=1000000'")
            out["track"] = True
            continue
        out[key] = value.strip()
    return out
