"""A table's filters: how they are written (``FilterSpec``), built (``Chain``), and put
on and taken off a message (``pack``, ``unpack``).

Written as text (the CLI's ``--filters``, ``create_table(filters=...)``)::

    push=int8,keycache,delta,zstd;pull=keycache,delta,zstd;reply=fp16
    lossless                       # a preset (PRESETS)
    push=mypkg.filters:Mine:level=3,window=8

or as a map ``{"push": ["int8:block=128", "keycache"], "pull": [...], "reply": [...]}``.
A filter is a plug-in of kind ``filter`` (``paramserver.plugins``, ``docs/plugins.md``):
a built-in's name (``filters/builtin.py``) or ``"module:Class"``, a subclass of
``Filter``, imported by name where the table is created (scheduler, servers, clients):
it travels by its name, never as code.  Its settings follow as ``:key=value,...``
(``:key=value:key=value``, the old spelling, still loads).

On the wire a filtered message's header says which filters ran, each with its
parameters (``"filters": [[name, params], ...]``), and which part each array frame is
(``"parts"``).  A receiver decodes only with filters its table lists for that direction.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from paramserver.errors import ConfigError, ProtocolError
from paramserver.filters.base import PARTS, STAGES, Context, Filter, Parts
from paramserver.filters.builtin import BUILTIN
from paramserver.plugins import Kind, declare, load_object, number, register, split

DIRECTIONS = ("push", "pull", "reply")
PRESETS: dict[str, str] = {
    "none": "",
    "keys": "push=keycache,delta;pull=keycache,delta",
    "lossless": "push=keycache,delta,zstd;pull=keycache,delta,zstd;reply=zstd",
    "compact": "push=int8,keycache,delta,zstd;pull=keycache,delta,zstd;reply=fp16,zstd",
}

Entry = tuple[str, tuple[tuple[str, Any], ...]]  # a filter's name and its settings

FILTER = declare(Kind(
    "filter", "filter", "a subclass of Filter (paramserver.filters)",
    lambda obj: isinstance(obj, type) and issubclass(obj, Filter), "every node (scheduler, servers, clients)",
    "mypkg.filters:Mine:level=3"))
for _name, _cls in BUILTIN.items():
    register("filter", _name, _cls)


@dataclass(frozen=True)
class FilterSpec:
    """The filters of a table, per direction, in order (hashable, comparable)."""

    push: tuple[Entry, ...] = ()
    pull: tuple[Entry, ...] = ()
    reply: tuple[Entry, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.push or self.pull or self.reply)

    def to_wire(self) -> dict[str, list[list[Any]]]:
        return {d: [[name, dict(settings)] for name, settings in getattr(self, d)] for d in DIRECTIONS
                if getattr(self, d)}

    def __str__(self) -> str:
        def entry(name: str, settings: tuple[tuple[str, Any], ...]) -> str:
            return f"{name}:{','.join(f'{k}={v}' for k, v in settings)}" if settings else name
        return ";".join(f"{d}={','.join(entry(*e) for e in getattr(self, d))}" for d in DIRECTIONS
                        if getattr(self, d)) or "none"

    @classmethod
    def parse(cls, spec: Any) -> FilterSpec:
        """A spec from text, a map (the wire's or a user's), or a ``FilterSpec``; every
        filter imported and checked (``ConfigError`` naming the value, the rule and the fix)."""
        if isinstance(spec, FilterSpec):
            return spec
        if spec is None:
            return cls()
        if isinstance(spec, str):
            spec = _parse_text(spec)
        if not isinstance(spec, dict):
            raise ConfigError(f"filters must be text like 'push=keycache,zstd;pull=keycache' or a map "
                              f"{{'push': [...], 'pull': [...], 'reply': [...]}}, got {str(spec)[:100]!r}")
        unknown = [d for d in spec if d not in DIRECTIONS]
        if unknown:
            raise ConfigError(f"filters: unknown direction(s) {unknown} (directions: {', '.join(DIRECTIONS)})")
        made = cls(**{d: tuple(_entry(e, d) for e in _listed(spec[d], d)) for d in spec})
        for d in DIRECTIONS:
            _once(d, getattr(made, d))
        for d in DIRECTIONS:
            Chain(d, getattr(made, d))  # checks the order and the directions
        return made


def _once(direction: str, entries: tuple[Entry, ...]) -> None:
    """``ConfigError`` if a filter is listed twice in one direction (a message would go
    through it twice, and a receiver tells filters apart by name)."""
    names = [name for name, _ in entries]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"filters for {direction}: {', '.join(twice)} listed twice ({','.join(names)}); list each "
                          f"filter once (e.g. '{direction}={','.join(dict.fromkeys(names))}')")


def _listed(value: Any, direction: str) -> list[Any]:
    if isinstance(value, str):
        out: list[str] = []
        for e in filter(None, (p.strip() for p in value.split(","))):
            if out and "=" in e and ":" not in e and ":" in out[-1]:
                out[-1] += "," + e  # int8:block=128,scale=2: the filter's next setting, not a filter
            else:
                out.append(e)
        return out
    if isinstance(value, (list, tuple)):
        return list(value)
    raise ConfigError(f"filters for {direction!r} must be a list of filters, got {value!r}")


def _parse_text(text: str) -> dict[str, Any]:
    text = text.strip()
    if text.lower() in PRESETS:
        text = PRESETS[text.lower()]
    out: dict[str, Any] = {}
    for clause in filter(None, (c.strip() for c in text.split(";"))):
        direction, eq, chain = clause.partition("=")
        if not eq or direction.strip() not in DIRECTIONS:
            raise ConfigError(f"filters: {clause!r} must be DIRECTION=FILTER,FILTER,... with DIRECTION one of "
                              f"{', '.join(DIRECTIONS)} (e.g. 'push=int8,keycache;pull=keycache'), or a preset "
                              f"({', '.join(PRESETS)})")
        direction = direction.strip()
        if direction in out:  # a second clause would silently replace the first
            raise ConfigError(f"filters: the direction {direction!r} is given twice ({direction}={out[direction]} "
                              f"and {direction}={chain}) in {text!r}; give it once, with its whole chain: "
                              f"'{direction}={out[direction]}' or '{direction}={chain}', the one you mean (a "
                              "direction's filters are one comma-separated chain, e.g. 'push=int8,keycache,zstd')")
        out[direction] = chain
    return out


def _entry(value: Any, direction: str) -> Entry:
    """``"name[:key=value,...]"``, ``"module:Class[:key=value,...]"`` (the plug-in grammar;
    ``name:key=value:key=value``, the old spelling, too), ``[name, settings]`` or
    ``{"name": ..., **settings}`` as (name, settings)."""
    if isinstance(value, str):
        name, given, _ = split(FILTER, value)
        settings: dict[str, Any] = {key: number(raw) for key, raw in given}
    elif isinstance(value, (list, tuple)) and len(value) == 2 and isinstance(value[1], dict):
        name, settings = value[0], dict(value[1])
    elif isinstance(value, dict) and "name" in value:
        settings = dict(value)
        name = settings.pop("name")
    else:
        raise ConfigError(f"a filter is 'name[:key=value]' or [name, settings], got {value!r}")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"a filter's name must be text, got {name!r}")
    for key, setting in settings.items():
        if not isinstance(key, str) or isinstance(setting, bool) or not isinstance(setting, (int, float, str)):
            raise ConfigError(f"filter {name}: setting {key!r} must be a number or text, got {setting!r}")
    return name, tuple(sorted(settings.items()))


def filter_class(name: str) -> type[Filter]:
    """The class a filter's name stands for: a built-in's, or ``module:Class`` imported."""
    found: type[Filter] = load_object(FILTER, name)
    return found


@functools.lru_cache(maxsize=256)
def _build(name: str, settings: tuple[tuple[str, Any], ...]) -> Filter:
    try:
        made = filter_class(name)(**dict(settings))
    except TypeError as exc:
        raise ConfigError(f"filter {name}: {exc}") from None
    made.name = name
    return made


class Chain:
    """The filters of one direction of a table, built and checked: stages in order
    (``select``, then value codecs, then key codecs, then byte compressors), each listed
    for a direction it serves."""

    def __init__(self, direction: str, entries: tuple[Entry, ...]) -> None:
        self.direction, self.entries = direction, entries
        self.filters = [_build(name, settings) for name, settings in entries]
        self._exact: Chain | None = None
        last = 0
        for f in self.filters:
            if f.stage not in STAGES:
                raise ConfigError(f"filter {f.name}: stage must be one of {STAGES}, got {f.stage!r}")
            if direction not in f.directions:
                raise ConfigError(f"filter {f.name} serves {', '.join(f.directions)}, not {direction}")
            if STAGES.index(f.stage) < last:
                raise ConfigError(f"filters for {direction}: {f.name} ({f.stage}) is listed after a {STAGES[last]} "
                                  f"filter; list them in the order {' > '.join(STAGES)} (e.g. int8,keycache,zstd)")
            last = STAGES.index(f.stage)
        self.select = next((f for f in self.filters if f.stage == "select"), None)
        self.wire = [f for f in self.filters if f.stage != "select"]
        self.lossy = [f for f in self.wire if not f.lossless]
        self.ordered = any(f.ordered for f in self.wire)  # the client routes keys in dense-position order
        self.by_name = {f.name: f for f in self.wire}

    def __bool__(self) -> bool:
        return bool(self.filters)

    def exact(self) -> Chain:
        """This chain without its lossy filters (what a push that assigns goes through)."""
        if self._exact is None:
            self._exact = Chain(self.direction, tuple(e for e, f in zip(self.entries, self.filters) if f.lossless))
        return self._exact

    def encode(self, parts: Parts, ctx: Context, sizes: dict[str, list[int]] | None = None) -> list[list[Any]]:
        """Run the encoders in order; the header's entries (filters that changed nothing
        are left out).  ``sizes`` gathers each filter's bytes before and after."""
        entries: list[list[Any]] = []
        for f in self.wire:
            before = _nbytes(parts)
            params = f.encode(parts, ctx)
            if sizes is not None:
                seen = sizes.setdefault(f.name, [0, 0])
                seen[0] += before
                seen[1] += _nbytes(parts)
            if params:
                entries.append([f.name, params])
        return entries

    def decode(self, parts: Parts, entries: Any, ctx: Context) -> None:
        for f, params in reversed(self.named(entries)):
            f.decode(parts, params, ctx)

    def named(self, entries: Any) -> list[tuple[Filter, dict[str, Any]]]:
        """A header's filter entries (``[name, params]`` each, in encoding order) as this chain's
        filters and their parameters; ``ProtocolError`` for an entry that is not one."""
        if not isinstance(entries, list):
            raise ProtocolError(f"header field 'filters' must be a list, got {entries!r}")
        named = []
        for entry in entries:
            if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], dict)):
                raise ProtocolError(f"a filter entry is [name, params], got {str(entry)[:100]!r}")
            f = self.by_name.get(entry[0])
            if f is None:
                raise ProtocolError(f"filter {str(entry[0])[:80]!r} is not one of this table's {self.direction} "
                                    f"filters ({', '.join(self.by_name) or 'none'})")
            named.append((f, entry[1]))
        return named

    def roundtrip(self, values: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """What the receiver will decode for ``values`` (the lossy codecs' rounding)."""
        for f in self.lossy:
            values = f.roundtrip(values, counts)
        return values


def _nbytes(parts: Parts) -> int:
    return sum(a.nbytes for a in parts.values())


@functools.lru_cache(maxsize=256)
def chains(spec: FilterSpec) -> dict[str, Chain]:
    """The built chains of a table's spec, by direction."""
    return {d: Chain(d, getattr(spec, d)) for d in DIRECTIONS}


def pack(direction: str, chain: Chain, arrays: list[np.ndarray], ctx: Context,
         sizes: dict[str, list[int]] | None = None) -> tuple[dict[str, Any], list[np.ndarray]]:
    """A message's arrays through ``chain``: the header fields to add and the arrays to send."""
    parts = dict(zip(PARTS[direction], arrays))
    entries = chain.encode(parts, ctx, sizes)
    if not entries:  # as they were (rows packed by their producer that went as they are: made dense)
        return {}, list(parts.values())
    return {"filters": entries, "parts": list(parts)}, list(parts.values())


def unpack(direction: str, chain: Chain, header: dict[str, Any], arrays: list[np.ndarray],
           ctx: Context) -> list[np.ndarray]:
    """A filtered message's arrays as they were before ``pack`` (the same list when the
    header names no filters); ``ProtocolError`` for anything that does not decode."""
    entries = header.get("filters")
    if entries is None:
        return arrays
    parts = _named(header, arrays)
    chain.decode(parts, entries, ctx)
    return _unpacked(parts, direction)


def unpack_rows(chain: Chain, header: dict[str, Any], arrays: list[np.ndarray], index: np.ndarray,
                out: np.ndarray) -> list[np.ndarray] | None:
    """A pull reply's rows decoded straight into ``out``'s rows ``index`` (row ``i`` into
    ``out[index[i]]``) where the filter that encoded its values first can
    (``Filter.decode_rows``: ``sparse``): None then.  Else its arrays, as ``unpack`` gives
    them, for the caller to copy over.  ``ProtocolError`` for anything that does not decode."""
    entries = header.get("filters")
    if entries is None:
        return arrays
    named = chain.named(entries)
    parts = _named(header, arrays)
    for f, params in reversed(named[1:]):
        f.decode(parts, params, Context())
    if named:
        first, params = named[0]
        if first.decode_rows(parts, params, index, out):
            _decoded_to(parts, set(), "reply")
            return None
        first.decode(parts, params, Context())
    return _unpacked(parts, "reply")


def unpack_masked(chain: Chain, header: dict[str, Any], arrays: list[np.ndarray], ctx: Context,
                  dim: int) -> tuple[list[np.ndarray], np.ndarray, np.ndarray] | None:
    """A filtered push of rows of ``dim`` values, its values left as the filter that encoded
    them first packed them where it packs them as a mask of the non-zero values and those
    (``Filter.masked``: ``sparse``): ``(arrays, mask, words)``, the arrays as ``unpack`` gives
    them but for an empty values part.  None where not (``unpack`` then; the message's arrays
    are never changed).  ``ProtocolError`` for anything that does not decode."""
    entries = header.get("filters")
    if entries is None:
        return None
    named = chain.named(entries)
    if not named or type(named[0][0]).masked is Filter.masked:  # (asked before any filter decodes)
        return None
    parts = _named(header, arrays)
    for f, params in reversed(named[1:]):
        f.decode(parts, params, ctx)
    first, params = named[0]
    got = first.masked(parts, params)
    keys = parts.get("keys")
    if got is None or keys is None or got[0] != (keys.shape[0], dim):  # rows of the table's, a key each
        return None
    parts["values"] = np.empty((0, dim), np.float32)
    return _unpacked(parts, "push"), got[1], got[2]


def _unpacked(parts: Parts, direction: str) -> list[np.ndarray]:
    """Decoded parts as the arrays of a ``direction`` message: aligned and read-only, as
    ``wire.message.decode`` gives them (one numba signature)."""
    wanted = PARTS[direction]
    _decoded_to(parts, set(wanted), direction)
    out = []
    for name in wanted:
        a = parts[name]
        if not a.flags.aligned or not a.flags.c_contiguous:
            a = np.ascontiguousarray(a).copy()
        a.setflags(write=False)
        out.append(a)
    return out


def _named(header: dict[str, Any], arrays: list[np.ndarray]) -> Parts:
    """A filtered message's arrays by the names its header gives them."""
    names = header.get("parts")
    if (not isinstance(names, list) or len(names) != len(arrays) or len(set(map(str, names))) != len(names)
            or not all(isinstance(n, str) for n in names)):
        raise ProtocolError(f"header field 'parts' must name each of the {len(arrays)} arrays once, got {names!r}")
    return dict(zip(names, arrays))


def _decoded_to(parts: Parts, wanted: set[str], direction: str) -> None:
    if set(parts) != wanted:
        raise ProtocolError(f"a filtered {direction} decodes to parts {sorted(parts)}, not {sorted(wanted)}")
