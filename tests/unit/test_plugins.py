"""The plug-in loader (``paramserver.plugins``): one grammar, one error text, built-ins by
name, and the package's one ``import_module`` for plug-ins (issue 45's goal, made a test)."""

import ast
import logging
import pathlib
import sys
import types

import pytest

from paramserver.errors import ConfigError
from paramserver.plugins import Kind, builtins, declare, kinds, load_object, load_plugin, loader, register, split

SRC = pathlib.Path(__file__).resolve().parents[2] / "src" / "paramserver"
#: imports by name that are not plug-ins: the forked node's command (issue 45.5 hands it down)
class Widget:
    pass


class Round(Widget):
    def __init__(self, size=1):
        self.size = size


@pytest.fixture
def widgets(monkeypatch):
    """A kind of the test's own, with one built-in, and a module ``widgetmod`` of plug-ins."""
    monkeypatch.setattr(loader, "_KINDS", dict(loader._KINDS))
    monkeypatch.setattr(loader, "_BUILTINS", {k: dict(v) for k, v in loader._BUILTINS.items()})
    monkeypatch.setattr(loader, "_NOTED", set())
    kind = declare(Kind("widget", "widget", "a subclass of Widget",
                        lambda o: isinstance(o, type) and issubclass(o, Widget), "every server",
                        "widgetmod:Square:size=3", fix="subclass Widget in {attr}",
                        moved={"oldwidgets": "widgetmod"}, positional=True))
    register("widget", "round", Round)
    module = types.ModuleType("widgetmod")
    module.Square = type("Square", (Widget,), {"__module__": "widgetmod"})
    module.Oval = type("Oval", (Widget,), {"__module__": "widgetmod"})
    module.Widget = Widget  # imported, not its own: not a candidate
    module.helper = len
    monkeypatch.setitem(sys.modules, "widgetmod", module)
    return kind


def _calls_by_name(path: pathlib.Path) -> int:
    """Calls of ``import_module`` or ``__import__`` in ``path``, anywhere in it."""
    n = 0
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            n += name in ("import_module", "__import__")
    return n


def test_the_package_imports_plug_ins_in_one_place():
    found = {p.relative_to(SRC).as_posix(): c for p in sorted(SRC.rglob("*.py")) if (c := _calls_by_name(p))}
    assert found.pop("plugins/loader.py", 0) == 1
    assert not found, (f"import by name outside paramserver.plugins: {found}; load a plug-in with "
                       "paramserver.plugins.load_plugin(kind, spec) (docs/plugins.md)")


def test_every_kind_is_declared_with_its_built_ins_in_one_table():
    import paramserver.cluster.worker  # noqa: F401  (each module declares its kind)
    import paramserver.data.streams  # noqa: F401
    import paramserver.lifecycle.policies  # noqa: F401
    import paramserver.tables.functions  # noqa: F401

    assert {"rule", "function", "filter", "policy", "source", "fn"} <= set(kinds())
    assert builtins("filter")[:3] == ["bf16", "delta", "fp16"] and "int8" in builtins("filter")
    assert builtins("policy") == ["after", "prob", "score"] and "top_k" in builtins("function")
    assert {"sgd", "ftrl"} <= set(builtins("rule")) and {"redis", "folder", "stdin"} <= set(builtins("source"))
    assert builtins("fn") == []


@pytest.mark.parametrize("spec, name, settings, args", [
    ("round", "round", (), ()),
    ("round:size=3", "round", (("size", "3"),), ()),
    (" round : size=3 , shape=oval ", "round", (("size", "3"), ("shape", "oval")), ()),
    ("widgetmod:Square", "widgetmod:Square", (), ()),
    ("widgetmod:Square:size=3,shape=x", "widgetmod:Square", (("size", "3"), ("shape", "x")), ()),
    ("round:3", "round", (), ("3",)),  # a built-in's bare value (positional kinds only)
    ("round:size=3:shape=x", "round", (("size", "3"), ("shape", "x")), ()),  # the old ':' between settings
])
def test_one_grammar(widgets, spec, name, settings, args):
    assert split(widgets, spec) == (name, settings, args)


def test_loading_gives_the_object_and_its_settings(widgets):
    plugin = load_plugin("widget", "widgetmod:Square:size=3")
    assert plugin.obj is sys.modules["widgetmod"].Square and plugin.settings == (("size", "3"),)
    assert load_plugin("widget", "round:size=2").obj is Round and load_object("widget", "round") is Round


def test_a_built_in_registered_by_its_module_name_is_imported_on_first_use(widgets):
    register("widget", "oval", "widgetmod:Oval")
    assert load_object("widget", "oval") is sys.modules["widgetmod"].Oval
    assert loader._BUILTINS["widget"]["oval"] is sys.modules["widgetmod"].Oval  # imported once


@pytest.mark.parametrize("spec, words", [
    ("nosuch_module_xyz:Thing", ["widget 'nosuch_module_xyz:Thing': module 'nosuch_module_xyz' does not import here",
                                 "ModuleNotFoundError", "importable on every server", "PYTHONPATH"]),
    ("widgetmod:Sqare", ["widget 'widgetmod:Sqare': module 'widgetmod' has no 'Sqare' (it has: Oval, Square)",
                         "check the spelling"]),
    ("widgetmod:helper", ["widget 'widgetmod:helper' is not one: widgetmod:helper is <built-in function len>, "
                          "not a subclass of Widget; subclass Widget in helper",
                          "(module 'widgetmod' has: Oval, Square)"]),
    ("squarish", ["unknown widget 'squarish': built-ins are round; one of your own is named 'module:attr', "
                  "a subclass of Widget (e.g. 'widgetmod:Square:size=3')"]),
    ("round:size=1,size=2", ["widget 'round:size=1,size=2': the setting 'size' is given twice; give it once"]),
    ("", ["widget '': name it one of round (a built-in) or 'module:attr[:key=value,...]', a subclass of Widget"]),
])
def test_one_error_text_names_the_kind_the_spec_what_the_module_holds_and_the_fix(widgets, spec, words):
    with pytest.raises(ConfigError) as info:
        load_plugin("widget", spec)
    for w in words:
        assert w in str(info.value)


def test_kinds_without_bare_values_or_settings_refuse_them(widgets):
    declare(Kind("gadget", "gadget", "callable", callable, "the worker", "mymod:run", settings=False))
    with pytest.raises(ConfigError, match="gadget 'mymod:run:x=1' takes no settings: name it 'mymod:run' alone"):
        load_plugin("gadget", "mymod:run:x=1")
    declare(Kind("doohickey", "doohickey", "callable", callable, "the worker", "mymod:run"))
    with pytest.raises(ConfigError, match="settings are key=value, got '3'"):
        load_plugin("doohickey", "widgetmod:helper:3")
    with pytest.raises(ConfigError, match="plug-in kind 'nokind' is not declared"):
        load_plugin("nokind", "x")


def test_old_spellings_load_with_a_one_line_note_of_the_new_once(widgets, caplog):
    with caplog.at_level(logging.INFO, logger="paramserver.plugins.loader"):
        assert load_plugin("widget", "round:3").args == ("3",)
        load_plugin("widget", "round:3")  # said once
        assert load_plugin("widget", "oldwidgets:Square").obj is sys.modules["widgetmod"].Square
        assert load_plugin("widget", "round:size=3:shape=x").settings == (("size", "3"), ("shape", "x"))
    assert [r.getMessage() for r in caplog.records] == [
        "widget 'round:3' is an old spelling, still accepted; write it 'round:size=3' (docs/plugins.md)",
        "widget 'oldwidgets:Square' is an old spelling, still accepted; write it 'widgetmod:Square' (docs/plugins.md)",
        "widget 'round:size=3:shape=x' is an old spelling, still accepted; write it 'round:size=3,shape=x' "
        "(docs/plugins.md)"]


def test_a_shipped_function_answers_to_its_name_and_its_old_name():
    from paramserver.tables.functions import load_function, top_k

    assert load_function("top_k") is top_k and load_function("paramserver.functions:top_k") is top_k
    assert load_function("paramserver.tables.functions:top_k") is top_k


def test_filters_take_the_new_settings_inside_a_chain_and_print_them_so():
    from paramserver.filters.chain import FilterSpec

    spec = FilterSpec.parse("push=int8:block=64,keycache,zstd:level=3,min_bytes=1024;pull=keycache")
    assert spec.push == (("int8", (("block", 64),)), ("keycache", ()), ("zstd", (("level", 3), ("min_bytes", 1024))))
    assert str(spec) == "push=int8:block=64,keycache,zstd:level=3,min_bytes=1024;pull=keycache"
    assert FilterSpec.parse(str(spec)) == spec == FilterSpec.parse("push=int8:block=64,keycache,zstd:level=3:"
                                                                   "min_bytes=1024;pull=keycache")


@pytest.mark.parametrize("kind, where", [
    ("rule", "the scheduler and every server"), ("function", "every server"),
    ("filter", "every node (scheduler, servers, clients)"), ("policy", "every server"),
    ("source", "the driver and every worker"), ("fn", "the worker (its package on PYTHONPATH, or installed)"),
])
def test_every_kind_says_a_module_that_does_not_import_in_the_same_words(kind, where):
    import paramserver.cluster.worker  # noqa: F401  (each module declares its kind)
    import paramserver.data.streams  # noqa: F401
    import paramserver.lifecycle.policies  # noqa: F401
    import paramserver.tables.functions  # noqa: F401

    label = kinds()[kind].label
    with pytest.raises(ConfigError) as info:
        load_plugin(kind, "no_such_module_xyz:thing")
    assert str(info.value).startswith(f"{label} 'no_such_module_xyz:thing': module 'no_such_module_xyz' does not "
                                      f"import here (ModuleNotFoundError: No module named 'no_such_module_xyz'); it "
                                      f"must be importable on {where}: put its folder on PYTHONPATH")


def test_a_worker_function_named_without_its_module_is_told_the_form():
    from paramserver.cluster.worker import load_function

    with pytest.raises(ConfigError, match=r"^--fn 'main': name it 'module:attr', a function called with the "
                                          r"connected Client \(e.g. 'mypkg.jobs:train'\)$"):
        load_function("main")
    assert load_function("paramserver.cluster.worker:load_function") is load_function
