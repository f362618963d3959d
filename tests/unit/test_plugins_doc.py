"""docs/plugins.md cannot drift: every kind the loader knows has a section, each
section's code is imported as the module it names (``# mypkg/filters.py``), each spec it
marks **Loads** loads (and is used as its kind uses it), and each old spelling of its table
loads as what it says is written now, with the note."""

import logging
import pathlib
import re
import sys
import types

import numpy as np
import pytest

import paramserver.cluster.worker
import paramserver.data.streams
import paramserver.filters.chain
import paramserver.lifecycle.policies
import paramserver.tables.functions
import paramserver.tables.rules
from paramserver.data.batch import DataFormat
from paramserver.data.reader import read_batches
from paramserver.filters.chain import FilterSpec, chains
from paramserver.plugins import kinds, load_plugin, loader

DOC = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "plugins.md").read_text()


def _sections() -> dict[str, str]:
    """Kind -> its section's text (``### `kind`: ...``)."""
    found = re.split(r"^### `(\w+)`[^\n]*\n", DOC.split("## The kinds", 1)[1].split("\n## ", 1)[0], flags=re.M)
    return dict(zip(found[1::2], found[2::2]))


@pytest.fixture
def mypkg(monkeypatch):
    """The page's code, imported as the package ``mypkg`` it names."""
    monkeypatch.setitem(sys.modules, "mypkg", types.ModuleType("mypkg"))
    for block in re.findall(r"```python\n(.*?)```", DOC, flags=re.S):
        head = re.match(r"# (mypkg/\w+)\.py\n", block)
        if head:
            name = head.group(1).replace("/", ".")
            module = types.ModuleType(name)
            exec(compile(block, f"docs/plugins.md:{name}", "exec"), module.__dict__)
            monkeypatch.setitem(sys.modules, name, module)
    return sys.modules["mypkg"]


def test_every_kind_has_a_section_with_code_and_specs_that_load():
    sections = _sections()
    assert set(sections) == set(kinds()) == {"rule", "function", "filter", "policy", "source", "fn"}
    for kind, text in sections.items():
        assert re.search(r"\*\*Loads\*\*: `", text), f"the {kind} section marks no spec it loads"
        assert "# mypkg/" in text, f"the {kind} section has no example plug-in"


def _loads(kind: str) -> list[str]:
    line = next(ln for ln in _sections()[kind].splitlines() if ln.startswith("**Loads**"))
    return re.findall(r"`([^`]+)`", line.split("(", 1)[0])


def test_each_documented_spec_loads_and_works_as_its_kind_uses_it(mypkg):
    for kind in kinds():
        for spec in _loads(kind):
            assert load_plugin(kind, spec).obj is not None, (kind, spec)
    rule = paramserver.tables.rules.load_rule("mypkg.rules:clipped_sgd")
    value = np.array([1.0, 1.0], np.float32)
    rule(value, np.zeros(0, np.float32), np.array([5.0, -0.5], np.float32), np.array([0.1, 1.0], np.float32))
    np.testing.assert_allclose(value, [0.9, 1.05])
    l1 = paramserver.tables.functions.load_function("mypkg.functions:l1_norm")
    assert l1(np.arange(2, dtype=np.uint64), -np.ones((2, 3), np.float32), {}) == 6.0
    assert paramserver.tables.functions.load_function("top_k").merge == "topk"
    push = chains(FilterSpec.parse("push=mypkg.filters:Scaled:factor=4,zstd"))["push"]
    assert [type(f).__name__ for f in push.filters] == ["Scaled", "Zstd"] and push.filters[0].factor == 4
    policy = paramserver.lifecycle.policies.load_policy("mypkg.policies:EveryNth:n=3")
    assert policy.admit(np.arange(7, dtype=np.uint64), 0.0).tolist() == [True, False, False, True, False, False, True]
    source = paramserver.data.streams.open_source("mypkg.sources:Lines=mem://rows", 1 << 20, "libsvm")
    (shard,), _, rows, _ = source.poll(None)
    assert rows == 2 and sum(len(b) for b in read_batches(shard, DataFormat("libsvm", label_format="01"), 10)) == 2
    fn = paramserver.cluster.worker.load_function("mypkg.jobs:report_rank")
    assert fn(types.SimpleNamespace(rank=3)) == "worker 3 ran"


def _old_spellings() -> list[tuple[str, str, str]]:
    table = DOC.split("## Old spellings", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| (\w+) \| `([^`]+)` \| `([^`]+)` \|$", table, flags=re.M)


@pytest.mark.parametrize("kind, old, new", _old_spellings())
def test_each_old_spelling_loads_as_it_is_written_now_and_says_so(kind, old, new, monkeypatch, caplog):
    monkeypatch.setattr(loader, "_NOTED", set())
    with caplog.at_level(logging.INFO, logger="paramserver.plugins.loader"):
        if kind == "policy":
            built = [paramserver.lifecycle.policies.load_policy(s) for s in (old, new)]
            assert [{k: v for k, v in vars(b).items() if isinstance(v, (int, float))} for b in built][0] == \
                [{k: v for k, v in vars(b).items() if isinstance(v, (int, float))} for b in built][1]
        elif kind == "filter":
            assert FilterSpec.parse(f"push={old}") == FilterSpec.parse(f"push={new}")
        else:
            assert load_plugin(kind, old).obj is load_plugin(kind, new).obj
    notes = [r.getMessage() for r in caplog.records if "old spelling" in r.getMessage()]
    assert notes == [f"{loader.kinds()[kind].label} {old!r} is an old spelling, still accepted; write it {new!r} "
                     "(docs/plugins.md)"]


def test_the_old_spellings_table_is_not_empty():
    assert len(_old_spellings()) >= 5
