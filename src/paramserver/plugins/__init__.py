"""Plug-ins found by name: the kinds, their built-ins, one grammar and one loader
(``plugins/loader.py``; the kinds are listed in ``docs/plugins.md``)."""

from paramserver.plugins.loader import (
    Kind,
    Plugin,
    builtins,
    declare,
    kinds,
    load_object,
    load_plugin,
    number,
    old_spelling,
    register,
    split,
)

__all__ = ["Kind", "Plugin", "builtins", "declare", "kinds", "load_object", "load_plugin", "number", "old_spelling",
           "register", "split"]
