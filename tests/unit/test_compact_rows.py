"""Compact rows (``TableSpec.storage``, ``store/compact.py``, ``store/loops/compact.py``): the 16-bit conversions
against numpy and a float64 reference, stochastic rounding, tables of every layout
against float32 ones, float32 items/load round trips, the spec on the wire."""

from __future__ import annotations

import numpy as np
import pytest

from paramserver import ConfigError, TableSpec
from paramserver.routing.partition import route_pull, route_push
from paramserver.routing.ring import Ring
from paramserver.store.compact import ROW_DTYPES, decode_rows, encode_rows
from paramserver.store.vnodes import VnodeSet

RULES = "tests.unit.plugins.myrules"
# relative precision of a value column (half a unit in the last place)
PRECISION = {"float32": 2.0**-24, "fp16": 2.0**-11, "bf16": 2.0**-8}


def _enc(x, dim, storage, keys=None):
    x = np.asarray(x, np.float32).reshape(x.shape[0] if np.ndim(x) == 2 else -1, -1 if np.ndim(x) == 2 else 1)
    keys = np.arange(x.shape[0], dtype=np.uint64) if keys is None else keys
    return encode_rows(x, dim, keys, ROW_DTYPES[storage])


def _bits32(x):
    return np.asarray(x, np.float32).view(np.uint32)


# ---- conversions -------------------------------------------------------------------------


def test_fp16_decodes_every_bit_pattern_as_numpy():
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    got = decode_rows(bits.view(np.int16).reshape(-1, 1), 1, 1)[:, 0]
    want = bits.view(np.float16).astype(np.float32)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(_bits32(got)[~nan], _bits32(want)[~nan])


def test_fp16_encodes_to_nearest_even_as_numpy():
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float64)
    finite = np.sort(halves[np.isfinite(halves)])
    mids = (finite[:-1] + finite[1:]) / 2  # exact in float32: the ties, subnormal ones included
    rng = np.random.default_rng(0)
    x = np.concatenate([finite, mids, np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf),
                        rng.standard_normal(20000) * 10.0 ** rng.integers(-9, 6, 20000),
                        [65504.0, 65519.99, 65520.0, 1e6, -1e6, 3e38, np.inf, -np.inf, 1e-9, -1e-9, 2.0**-25,
                         2.0**-25 * 1.0000001, 0.0, -0.0]]).astype(np.float32)
    got = _enc(x, 1, "fp16")[:, 0].view(np.uint16)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(got, x.astype(np.float16).view(np.uint16))
    assert got[-4] == 0 and got[-1] == 0x8000  # 2**-25 ties to 0; -0 keeps its sign
    nan = _enc(np.array([np.nan, -np.nan], np.float32), 1, "fp16")[:, 0].view(np.float16)
    assert np.isnan(nan).all()


def _bf16_reference(x: np.ndarray) -> np.ndarray:
    """Nearest bfloat16 (ties to even) by comparing both neighbours in float64."""
    u = _bits32(x).astype(np.int64)
    lo = u >> 16
    hi = lo + 1
    dec = lambda b: (b.astype(np.uint32) << 16).view(np.float32).astype(np.float64)  # noqa: E731
    top = np.where((hi & 0x7FFF) == 0x7F80, np.copysign(2.0**128, x.astype(np.float64)), dec(hi))  # inf: as 2**128
    dlo, dhi = np.abs(dec(lo) - x.astype(np.float64)), np.abs(top - x.astype(np.float64))
    up = (dhi < dlo) | ((dhi == dlo) & (lo & 1 == 1))
    with np.errstate(invalid="ignore"):
        return np.where(up, hi, lo).astype(np.uint16)


def test_bf16_encodes_to_nearest_even():
    rng = np.random.default_rng(1)
    with np.errstate(over="ignore", invalid="ignore"):
        x = np.concatenate([rng.standard_normal(50000) * 10.0 ** rng.integers(-30, 30, 50000),
                            (rng.integers(0, 1 << 16, 5000).astype(np.uint32) << 16 | 0x8000).view(np.float32),
                            [3.3895e38, 3.4e38, -3.4e38, 1e-40, -1e-45, 0.0, -0.0]]).astype(np.float32)
    x = x[np.isfinite(x)]
    got = _enc(x, 1, "bf16")[:, 0]
    np.testing.assert_array_equal(got, _bf16_reference(x))
    assert got[-7] == 0x7F7F and got[-6] == 0x7F80 and got[-5] == 0xFF80  # the largest finite; overflow to inf
    np.testing.assert_array_equal(decode_rows(got.reshape(-1, 1), 1, 1)[:, 0],
                                  (got.astype(np.uint32) << 16).view(np.float32))
    special = _enc(np.array([np.inf, -np.inf, np.nan], np.float32), 1, "bf16")[:, 0]
    assert special[0] == 0x7F80 and special[1] == 0xFF80 and (special[2] & 0x7F80) == 0x7F80 and special[2] & 0x7F


def test_state_is_rounded_stochastically_unbiased_and_deterministic():
    x = np.full(200_000, 1000.01, np.float32)  # bf16 neighbours 1000 and 1004
    keys = np.arange(x.size, dtype=np.uint64)
    got = decode_rows(_enc(x, 0, "bf16", keys), 0, 1)[:, 0]
    assert set(np.unique(got).tolist()) == {1000.0, 1004.0}
    assert abs(got.mean() - 1000.01) < 0.002  # 8 standard errors
    np.testing.assert_array_equal(_enc(x, 0, "bf16", keys), _enc(x, 0, "bf16", keys))  # deterministic
    exact = np.array([1000.0, -3.0, 0.0, 2.0**-130], np.float32)  # representable: never moved
    for seed in range(3):
        back = decode_rows(_enc(exact, 0, "fp16", keys[seed:seed + 4] + 7), 0, 1)[:, 0]
        np.testing.assert_array_equal(back, exact)


def test_rows_round_trip_exactly_through_encode():
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((1000, 5)) * 10.0 ** rng.integers(-6, 4, (1000, 1))).astype(np.float32)
    keys = rng.integers(0, 2**63, 1000).astype(np.uint64)
    for storage in ("fp16", "bf16"):
        enc = encode_rows(x, 2, keys, ROW_DTYPES[storage])
        dec = decode_rows(enc, 2, 5)
        np.testing.assert_array_equal(encode_rows(dec, 2, keys[::-1], ROW_DTYPES[storage]), enc)  # a fixed point
        np.testing.assert_allclose(dec, x, rtol=2 * PRECISION[storage] if storage == "bf16" else 2.0**-7,
                                   atol=1e-7)


# ---- tables ------------------------------------------------------------------------------


def _set(spec: TableSpec) -> tuple[VnodeSet, Ring]:
    ring = Ring.create([1], 8)
    return VnodeSet(spec, ring.n_vnodes, range(ring.n_vnodes)), ring


def _push(table: VnodeSet, ring: Ring, keys, grads) -> None:
    routed = route_push(ring, keys, np.asarray(grads, np.float32), table.layout, distinct=True)
    table.apply(routed.parts[0].vnodes, routed.parts[0].counts, routed.keys, routed.grads)


def _pull(table: VnodeSet, ring: Ring, keys) -> np.ndarray:
    routed = route_pull(ring, keys, table.layout)
    out = np.empty((keys.size, table.spec.dim), np.float32)
    table.lookup(routed.parts[0].vnodes, routed.parts[0].counts, routed.keys, out)
    back = np.empty_like(out)
    back[routed.order] = out
    return back


def _train(storage: str, key_bits: int, dim: int, optimizer, initializer="zeros", steps=20):
    spec = TableSpec("w", dim, optimizer=optimizer, initializer=initializer, key_bits=key_bits, storage=storage,
                     seed=3)
    table, ring = _set(spec)
    rng = np.random.default_rng(4)
    keys = np.unique(np.append(rng.integers(1, 1 << 12, 600), 0)).astype(np.uint64)  # key 0 has a row of its own
    for _ in range(steps):
        _push(table, ring, keys, rng.standard_normal((keys.size, dim)) * 0.5)
    return table, ring, keys


CASES = [(1, {"name": "ftrl", "alpha": 0.1, "l1": 0.5}, "zeros"),
         (4, {"name": "adagrad", "lr": 0.05}, {"name": "normal", "std": 0.1}),
         (16, {"name": "ftrl_adagrad", "lr": 0.02}, {"name": "normal", "std": 0.05, "zero_columns": 1})]


@pytest.mark.parametrize("key_bits", [0, 12])
@pytest.mark.parametrize("storage", ["fp16", "bf16"])
@pytest.mark.parametrize("dim,optimizer,initializer", CASES)
def test_tables_match_float32_ones_within_the_format(key_bits, storage, dim, optimizer, initializer):
    ref, ring, keys = _train("float32", key_bits, dim, optimizer, initializer)
    table, _, _ = _train(storage, key_bits, dim, optimizer, initializer)
    want, got = _pull(ref, ring, keys), _pull(table, ring, keys)
    scale = np.abs(want).max()
    # 20 updates, each rounding the value and state: within a few dozen units of the format
    assert np.abs(got - want).max() <= 40 * PRECISION[storage] * scale, (np.abs(got - want).max(), scale)
    assert np.abs(got - want).mean() <= 4 * PRECISION[storage] * scale
    assert table.row_bytes == 8 + 2 * table.width and ref.row_bytes == 8 + 4 * ref.width
    assert table.nbytes < ref.nbytes * (8 + 2.1 * table.width) / (8 + 4 * table.width)
    np.testing.assert_array_equal(got, _pull(table, ring, keys))  # pulls do not change rows


@pytest.mark.parametrize("key_bits", [0, 12])
@pytest.mark.parametrize("storage", ["fp16", "bf16"])
def test_items_and_load_round_trip_exactly(key_bits, storage):
    dim, optimizer, initializer = CASES[2]
    table, ring, keys = _train(storage, key_bits, dim, optimizer, initializer, steps=5)
    copy, _ = _set(table.spec)
    for v, vt in table.tables.items():
        k, rows = vt.items()
        assert rows.dtype == np.float32 and rows.shape == (k.size, table.width)
        copy.install(v, k, rows)
        _same(copy.tables[v], vt)
    np.testing.assert_array_equal(_pull(copy, ring, keys), _pull(table, ring, keys))
    g = np.random.default_rng(5).standard_normal((keys.size, dim))
    _push(copy, ring, keys, g)
    _push(table, ring, keys, g)  # replicas applying the same updates store the same bits
    for v, vt in table.tables.items():
        _same(copy.tables[v], vt)


def _same(a, b) -> None:
    """The same keys with the same rows (the same bits: a stored value decodes exactly)."""
    (ka, ra), (kb, rb) = a.items(), b.items()
    oa, ob = np.argsort(ka), np.argsort(kb)
    np.testing.assert_array_equal(ka[oa], kb[ob])
    np.testing.assert_array_equal(ra[oa].view(np.uint32), rb[ob].view(np.uint32))


def test_small_increments_to_a_big_accumulator_are_kept_on_average():
    # AdaGrad's accumulator starts at 256 (bf16 spacing there: 2): += 0.01 a step, 400 steps
    spec = TableSpec("w", 1, optimizer={"name": "adagrad", "lr": 1e-4, "initial_accumulator": 256.0}, storage="fp16")
    table, ring = _set(spec)
    keys = np.arange(1, 3001, dtype=np.uint64)
    for _ in range(400):
        _push(table, ring, keys, np.full((keys.size, 1), 0.1))
    acc = np.concatenate([vt.items()[1][:, 1] for vt in table.tables.values()])
    assert abs(acc.mean() - 260.0) < 0.3, acc.mean()  # round-to-nearest would keep 256


def test_ftrl_dim1_compact_row_is_14_bytes_a_slot():
    for storage, slot in (("float32", 20), ("fp16", 14), ("bf16", 14)):
        table, ring, keys = _train(storage, 0, 1, CASES[0][1], steps=1)
        vt = next(iter(table.tables.values()))
        assert vt.nbytes == (vt.capacity + 1) * slot + 4  # a key and its row a slot; 4 bytes to shift them by


# a user rule's kernels are compiled afresh (never cached, ~6-13 s each): one format a layout
@pytest.mark.parametrize("storage, key_bits", [("fp16", 0), ("bf16", 12)])
def test_a_user_rule_runs_on_compact_rows(storage, key_bits):
    opt = {"name": f"{RULES}:my_adagrad", "lr": 0.1, "start": 1.0}
    ref, ring, keys = _train("float32", key_bits, 2, opt, steps=5)
    table, _, _ = _train(storage, key_bits, 2, opt, steps=5)
    want = _pull(ref, ring, keys)
    np.testing.assert_allclose(_pull(table, ring, keys), want, atol=20 * PRECISION[storage] * np.abs(want).max())


# ---- the spec ----------------------------------------------------------------------------


def test_storage_on_the_wire():
    spec = TableSpec("w", 8, optimizer="adagrad", storage="bf16")
    assert spec.to_wire()["storage"] == "bf16"
    assert TableSpec.from_wire(spec.to_wire()) == spec
    plain = TableSpec("w", 8)
    assert plain.storage == "float32" and "storage" not in plain.to_wire()
    assert TableSpec.from_wire(plain.to_wire()) == plain


@pytest.mark.parametrize("bad", ["float16", "FP16", "", "int8"])
def test_bad_storage_is_refused(bad):
    with pytest.raises(ConfigError, match=r"storage must be one of \['float32', 'fp16', 'bf16'\].*storage='bf16'"):
        TableSpec("w", 1, storage=bad)


def test_storage_of_a_wrong_type_on_the_wire_is_refused():
    with pytest.raises(ConfigError, match="'storage' must be str"):
        TableSpec.from_wire({"name": "w", "storage": 16})


def test_a_primary_and_its_backup_store_the_same_bits(h):
    h.make(1, 2)
    spec = TableSpec("t", 4, optimizer={"name": "ftrl_adagrad", "lr": 0.05}, initializer="normal", replicas=2,
                     storage="bf16")
    ring = Ring.create([1, 2], 4)
    h.ring(ring, [spec])
    rng = np.random.default_rng(6)
    keys = np.unique(rng.integers(1, 2**40, 300)).astype(np.uint64)
    for _ in range(5):
        h.push(ring, "t", keys, (rng.standard_normal((keys.size, 4)) * 3).astype(np.float32))
        h.pump()
    a, b = h.by_id(1).tables["t"], h.by_id(2).tables["t"]
    assert a.row_bytes == 8 + 2 * spec.width
    assert set(a.tables) == set(b.tables) and len(a) == len(b) == keys.size
    for v in a.tables:
        _same(a.tables[v], b.tables[v])


@pytest.mark.parametrize("key_bits", [0, 12])
def test_a_checkpoint_holds_float32_rows_and_restores_exactly(tmp_path, key_bits):
    from dataclasses import replace

    from paramserver.server import storage

    dim, optimizer, initializer = CASES[1]
    table, ring, keys = _train("fp16", key_bits, dim, optimizer, initializer, steps=3)
    primary = np.ones(ring.n_vnodes, bool)
    step = str(tmp_path / "step")
    files = storage.write_checkpoint({"w": table}, primary, step)["files"]["w"]
    restored, _ = _set(table.spec)
    assert storage.restore_rows({"w": restored}, primary, ring, "w", step, list(files.values())) == keys.size
    for v, vt in table.tables.items():
        _same(restored.tables[v], vt)
    # the same checkpoint restores into a float32 table (a table's storage can change at a restore)
    wide, _ = _set(replace(table.spec, storage="float32"))
    storage.restore_rows({"w": wide}, primary, ring, "w", step, list(files.values()))
    np.testing.assert_array_equal(_pull(wide, ring, keys), _pull(table, ring, keys))
