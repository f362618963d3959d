"""The storage engine's floor (``store/``, issue 44): its loops sit below its classes, no
module reaches into another's private names, a server types against ``VnodeStore``, and
the lifecycle works on the rows it is given (``LifeRows``), not on a whole ``VnodeSet``."""

import ast
import pathlib
from collections.abc import Mapping

import numpy as np

from paramserver.store import specialize
from paramserver.store.life import TableLife, life_width, touched_life
from paramserver.store.table import VnodeTable
from paramserver.store.vnodes import VnodeSet
from paramserver.tables.spec import TableSpec

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "src" / "paramserver"


def _imports(path: pathlib.Path) -> list[tuple[str, list[str]]]:
    """Every ``from X import a, b`` (and ``import X``) of a module, at any depth."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out.extend((a.name, []) for a in node.names)
    return out


def test_the_loops_import_no_class_of_the_store():
    wrong = [f"{p.name}: {module}" for p in sorted((PACKAGE / "store" / "loops").glob("*.py"))
             for module, _ in _imports(p)
             if module.startswith("paramserver.store") and not module.startswith("paramserver.store.loops")]
    assert not wrong, f"store/loops/ must stay below store/*.py: {wrong}"


def test_no_module_imports_a_private_name_of_the_store():
    wrong = [f"{p.relative_to(PACKAGE)}: {module}.{name}" for p in sorted(PACKAGE.rglob("*.py"))
             for module, names in _imports(p) if module.startswith("paramserver.store")
             for name in names if name.startswith("_")]
    assert not wrong, f"private names imported across the engine's modules: {wrong}"


def test_a_server_builds_a_vnode_set_only_where_a_table_is_made_and_types_against_the_protocol():
    users = sorted(p.name for p in (PACKAGE / "server").glob("*.py")
                   if any(m == "paramserver.store.vnodes" for m, _ in _imports(p)))
    assert users == ["control.py", "warmup.py"]
    engine = {m for p in (PACKAGE / "server").glob("*.py") for m, _ in _imports(p) if m.startswith("paramserver.store")}
    assert engine <= {"paramserver.store.vnodes", "paramserver.store.protocol", "paramserver.store.life"}


def test_the_kernel_anchors_digest_every_source_of_the_loops():
    """A user rule's cached kernels are named by a digest of the sources they are compiled
    from: every folder holding a loop (or a class a loop's doc names) is in it."""
    digested = {PACKAGE / sub for sub in specialize.KERNEL_PACKAGES}
    assert {PACKAGE / "store", PACKAGE / "store" / "loops", PACKAGE / "tables"} <= digested
    assert not any((PACKAGE / sub).name == "server" for sub in specialize.KERNEL_PACKAGES)


class _Rows:
    """``LifeRows`` made by hand: two hash vnodes and per-vnode walks, no ``VnodeSet``."""

    def __init__(self, spec: TableSpec) -> None:
        self.n_vnodes = 2
        self.width = spec.width
        self.life_width = life_width(spec.lifecycle)
        self.vnodes = {v: VnodeTable(spec.dim, spec.optimizer, spec.initializer, spec.seed,
                                     life_width=self.life_width) for v in (0, 1)}
        self.kept: list[int] = []

    @property
    def hash_vnodes(self) -> Mapping[int, VnodeTable]:
        return self.vnodes

    @property
    def cold_vnodes(self) -> Mapping[int, VnodeTable]:
        return {}

    def stored(self, vnodes, counts, keys):
        ends = np.cumsum(counts)
        return np.concatenate([self.vnodes[int(v)].stored(keys[e - c:e]) for v, c, e in zip(vnodes, counts, ends)])

    def touch(self, vnodes, counts, keys, epoch, time, half_life):
        raise AssertionError("not called by a sweep")

    def keep(self, vnode, mask, room=0):
        self.kept.append(vnode)
        self.vnodes[vnode].keep(mask, room)


def test_a_table_life_sweeps_the_rows_it_is_given():
    spec = TableSpec("t", optimizer="adagrad", lifecycle="ttl=10")
    rows = _Rows(spec)
    keys = np.arange(1, 101, dtype=np.uint64)
    for v, part in ((0, keys[:50]), (1, keys[50:])):
        rows.vnodes[v].load(part, np.ones((part.size, spec.width), np.float32))
        life = np.zeros((part.size, rows.life_width), np.float32)
        touched_life(life, 1, 0.0 if v == 0 else 95.0, scored=False)  # vnode 0's keys last seen at 0, vnode 1's at 95
        rows.vnodes[v].set_life(part, life)
    life = TableLife(spec.lifecycle, spec.dim, rows)
    life.now = 100.0
    evicted = life.sweep(np.ones(2, bool))
    assert [v for v, _ in evicted] == [0] and np.array_equal(np.sort(evicted[0][1]), keys[:50])
    assert len(rows.vnodes[0]) == 0 and len(rows.vnodes[1]) == 50
    assert np.array_equal(rows.stored(np.array([0, 1]), np.array([50, 50]), keys), np.arange(100) >= 50)


def test_a_vnode_set_is_the_life_rows_of_its_table():
    spec = TableSpec("t", optimizer="adagrad", lifecycle="ttl=10")
    table = VnodeSet(spec, 4, range(4))
    assert table.life is not None and table.life.rows is table
    assert set(table.hash_vnodes) == {0, 1, 2, 3}
