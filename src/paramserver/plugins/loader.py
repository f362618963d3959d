"""Plug-ins: one table of kinds and their built-ins, one grammar, one loader, one error.

A plug-in is code the package finds by name where it runs, never code sent on the wire:
an update rule, a server-side function, a filter, an admission policy, a stream source,
a worker's ``--fn``.  Each kind is declared once (``declare(Kind(...))``, in the module
that owns the kind) with what a plug-in of it must be, and its built-ins are registered
by name in the same table (``register``).  One grammar names any of them::

    name[:key=value,...]             a registered built-in      int8:block=128   after:n=3
    module:attr[:key=value,...]      a user's, imported here    mypkg.filters:Mine:level=3

``load_plugin(kind, spec)`` parses ``spec``, imports what it names (this module holds the
package's one import by name for plug-ins), checks it is what the kind needs and hands
back a ``Plugin``: its name, the object and its settings (text; the kind reads them).  A
spec that does not load fails with one ``ConfigError`` naming the kind, the spec, what
the module holds of that kind, and the fix.  The grammars that combine several plug-ins
(``push=a,b;pull=c``, ``admit=...;ttl=...``, ``module:Class=URL``) stay with their kinds;
old spellings a kind documented still load, with a one-line note of the new one
(``old_spelling``).  ``docs/plugins.md`` lists every kind.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from paramserver.errors import ConfigError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Kind:
    """A kind of plug-in: what one must be, and where it is imported.

    Args:
        key: the kind's name in the table (``"filter"``).
        label: how errors name it (``"filter"``, ``"update rule"``, ``"--fn"``).
        must: what a plug-in of it must be, said in errors and the docs.
        accepts: the check of an imported object.
        where: where it must import (the fix of a module that does not).
        example: a user's plug-in of this kind, in the grammar.
        fix: what to do with an object of the wrong type (``{attr}``: its name).
        moved: old module names still accepted (each with a note of the new name).
        positional: settings may be bare values (``after:2``; an old spelling, noted).
        settings: whether it takes ``:key=value`` settings (a rule's are the optimizer's).
    """

    key: str
    label: str
    must: str
    accepts: Callable[[Any], bool]
    where: str
    example: str
    fix: str = ""
    moved: Mapping[str, str] = field(default_factory=dict)
    positional: bool = False
    settings: bool = True


@dataclass(frozen=True)
class Plugin:
    """A plug-in loaded: its name (a built-in's, or ``module:attr``), the object, its
    ``key=value`` settings as text in the order given, and bare values (old spelling)."""

    kind: Kind
    name: str
    obj: Any
    settings: tuple[tuple[str, str], ...] = ()
    args: tuple[str, ...] = ()


_KINDS: dict[str, Kind] = {}
_BUILTINS: dict[str, dict[str, Any]] = {}
_NOTED: set[str] = set()


def declare(kind: Kind) -> Kind:
    """Add ``kind`` to the table (again: replaced, as a module reloaded)."""
    _KINDS[kind.key] = kind
    _BUILTINS.setdefault(kind.key, {})
    return kind


def register(kind: str, name: str, obj: Any) -> None:
    """Register a built-in of ``kind`` by ``name``: the object, or ``"module:attr"`` to
    import on first use (a built-in whose module is heavy, or above the kind's).  A
    built-in is the package's own: it is not checked against ``Kind.accepts`` (the
    built-in optimisers are update rules of another form, ``tables/optim.py``)."""
    if kind not in _KINDS:
        raise ConfigError(f"plug-in kind {kind!r} is not declared (kinds: {', '.join(sorted(_KINDS))})")
    if ":" in name or not name:
        raise ConfigError(f"a built-in {kind}'s name is one word without ':', got {name!r}")
    _BUILTINS[kind][name] = obj


def kinds() -> dict[str, Kind]:
    """Every kind declared so far (their modules imported), by key."""
    return dict(_KINDS)


def builtins(kind: str) -> list[str]:
    """The names of ``kind``'s built-ins, sorted."""
    return sorted(_BUILTINS.get(_kind(kind).key, {}))


def old_spelling(kind: Kind | str, old: str, new: str) -> None:
    """Say once per process that ``old`` still loads, and how it is written now."""
    if old in _NOTED:
        return
    _NOTED.add(old)
    logger.info("%s %r is an old spelling, still accepted; write it %r (docs/plugins.md)",
                _kind(kind).label, old, new)


def split(kind: Kind | str, spec: str) -> tuple[str, tuple[tuple[str, str], ...], tuple[str, ...]]:
    """``spec`` in the grammar: (name, settings, bare values), no import; ``ConfigError``
    for settings that are not ``key=value`` or repeat a key."""
    k = _kind(kind)
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"{k.label} {spec!r}: {_forms(k)}")
    segments = [s.strip() for s in spec.strip().split(":")]
    bare = k.positional and segments[0] in _BUILTINS.get(k.key, {})  # after:2: a built-in's value, not a module's attr
    cut = 2 if len(segments) > 1 and "=" not in segments[1] and not bare else 1
    name, rest = ":".join(segments[:cut]), segments[cut:]
    settings: dict[str, str] = {}
    args: list[str] = []
    for item in (p.strip() for seg in rest for p in seg.split(",")):
        if not item:
            continue
        key, eq, raw = item.partition("=")
        if not eq and not k.positional:
            raise ConfigError(f"{k.label} {spec!r}: settings are key=value, got {item!r} (e.g. {k.example!r})")
        if not eq:
            args.append(item)
        elif key.strip() in settings:
            raise ConfigError(f"{k.label} {spec!r}: the setting {key.strip()!r} is given twice; give it once "
                              f"(e.g. '{name}:{key.strip()}={raw.strip()}')")
        else:
            settings[key.strip()] = raw.strip()
    if len(rest) > 1 and not args:  # name:key=value:key=value
        old_spelling(k, spec, _spelled(name, list(settings.items())))
    return name, tuple(settings.items()), tuple(args)


def load_plugin(kind: Kind | str, spec: str) -> Plugin:
    """The plug-in ``spec`` names (see the module), loaded and checked."""
    k = _kind(kind)
    name, settings, args = split(k, spec)
    if (settings or args) and not k.settings:
        raise ConfigError(f"{k.label} {spec!r} takes no settings: name it {name!r} alone (e.g. {k.example!r})")
    obj = _resolve(k, name, spec)
    if args:  # after:2: the values of the first parameters, by position
        try:
            params = [p for p in inspect.signature(obj).parameters if p != "self"]
        except (TypeError, ValueError):
            params = []
        named = [(params[i] if i < len(params) else "KEY", v) for i, v in enumerate(args)]
        old_spelling(k, spec, _spelled(name, named + list(settings)))
    return Plugin(k, name, obj, settings, args)


def load_object(kind: Kind | str, name: str) -> Any:
    """The object a plug-in's bare name stands for (no settings): a built-in's, or
    ``module:attr`` imported and checked."""
    k = _kind(kind)
    return _resolve(k, name.strip(), name)


def number(raw: str) -> int | float | str:
    """A setting's text as an int, else a float, else the text."""
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw.strip()


def _spelled(name: str, settings: list[tuple[str, str]]) -> str:
    return f"{name}:{','.join(f'{key}={v}' for key, v in settings)}" if settings else name


def _kind(kind: Kind | str) -> Kind:
    if isinstance(kind, Kind):
        return _KINDS.get(kind.key, kind)
    if kind not in _KINDS:
        raise ConfigError(f"plug-in kind {kind!r} is not declared (kinds: {', '.join(sorted(_KINDS)) or 'none yet'}"
                          "; the module that owns a kind declares it when imported)")
    return _KINDS[kind]


def _forms(k: Kind) -> str:
    known = ", ".join(builtins(k.key))
    return (f"name it {'one of ' + known + ' (a built-in) or ' if known else ''}'module:attr[:key=value,...]', "
            f"{k.must} (e.g. {k.example!r})")


def _resolve(k: Kind, name: str, spec: str) -> Any:
    table = _BUILTINS.setdefault(k.key, {})
    if name in table:
        found = table[name]
        if isinstance(found, str):  # registered lazily: imported on first use
            found = table[name] = _imported(k, found, spec, check=False)
        return found
    module_name, colon, attr = name.partition(":")
    if not colon or not module_name or not attr:
        if not table:
            raise ConfigError(f"{k.label} {name!r}: name it 'module:attr', {k.must} (e.g. {k.example!r})")
        raise ConfigError(f"unknown {k.label} {name!r}: built-ins are {', '.join(builtins(k.key))}; one of your "
                          f"own is named 'module:attr', {k.must} (e.g. {k.example!r})")
    if module_name in k.moved:
        new = k.moved[module_name]
        old_spelling(k, spec, attr if attr in table else f"{new}:{attr}")
        if attr in table:
            return _resolve(k, attr, spec)
        name = f"{new}:{attr}"
    return _imported(k, name, spec)


def _imported(k: Kind, name: str, spec: str, check: bool = True) -> Any:
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ConfigError(f"{k.label} {spec!r}: module {module_name!r} does not import here "
                          f"({type(exc).__name__}: {exc}); it must be importable on {k.where}: put its folder on "
                          "PYTHONPATH, or install its package, where they run") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{k.label} {spec!r}: module {module_name!r} has no {attr!r} (it has: "
                              f"{_candidates(k, module)}); name one of those, or check the spelling")
        obj = getattr(obj, part)
    if check and not k.accepts(obj):
        fix = k.fix.format(attr=attr) if k.fix else f"make {attr} {k.must}"
        raise ConfigError(f"{k.label} {spec!r} is not one: {module_name}:{attr} is {_short(obj)}, not {k.must}; "
                          f"{fix} (module {module_name!r} has: {_candidates(k, module)})")
    return obj


def _candidates(k: Kind, module: Any) -> str:
    """What ``module`` holds that ``k`` accepts: the names the spec could have meant."""
    found = []
    for key, value in sorted(vars(module).items()):
        if isinstance(value, type) and value.__module__ != module.__name__:
            continue  # a class it imports (the kind's base, most often), not one it holds
        try:
            if not key.startswith("_") and k.accepts(value):
                found.append(key)
        except Exception:  # an object whose attributes raise is simply not one
            continue
    return ", ".join(found) or f"no {k.label}"


def _short(obj: Any) -> str:
    text = repr(obj)
    return text if len(text) <= 80 else text[:77] + "..."
