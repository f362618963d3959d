"""The filters (issue 30): each built-in round-trips (bit for bit, or exactly as its
``roundtrip`` says), a malformed filtered message is refused with a reason, a key list a
server does not hold is a miss (nothing applied), the specs parse and travel, and the
worker's residuals owe exactly what was not sent."""

from __future__ import annotations

import re

import numpy as np
import pytest

from paramserver.errors import ConfigError, KeyCacheMissError, ProtocolError
from paramserver.filters.base import Context, KeyStore, Link
from paramserver.filters.chain import FilterSpec, chains, pack, unpack
from paramserver.filters.kernels import int8_decode, int8_encode, varint_decode, varint_encode
from paramserver.filters.residual import Owed, Residuals, after_routing, before_routing
from paramserver.tables.spec import TableSpec


def _push(n=3000, dim=4, seed=0, segments=(1000, 0, 2000)):
    rng = np.random.default_rng(seed)
    keys = np.unique(rng.integers(0, 1 << 24, n * 2).astype(np.uint64))[:n]
    values = (rng.standard_normal((n, dim)) * np.logspace(-6, 2, n)[:, None]).astype(np.float32)
    counts = np.array(segments, np.int64)
    vnodes = np.arange(len(segments), dtype=np.int32)
    return [keys, values, vnodes, counts]


def _through(direction, spec, arrays, link=None, store=None, whole=False):
    chain = chains(FilterSpec.parse(spec))[direction]
    header, sent = pack(direction, chain, list(arrays), Context(link=link or Link(), whole=whole))
    got = unpack(direction, chain, header, sent, Context(store=store or KeyStore()))
    return header, sent, got, chain


@pytest.mark.parametrize("spec", ["push=keycache", "push=delta", "push=zstd:min_bytes=0", "push=keycache,delta,zstd",
                                  "lossless"])
def test_lossless_chains_give_the_message_back_bit_for_bit(spec):
    arrays = _push()
    header, sent, got, _ = _through("push", spec, arrays)
    assert "filters" in header
    for a, b in zip(arrays, got):
        assert a.dtype == b.dtype and np.array_equal(a, b)
        assert not b.flags.writeable  # as wire.message.decode gives arrays: one numba signature


@pytest.mark.parametrize("codec,bound", [("fp16", 1e-3), ("bf16", 8e-3), ("int8", 1e-2)])
def test_value_codecs_decode_to_what_roundtrip_says(codec, bound):
    arrays = _push()
    arrays[1] = (arrays[1] / np.abs(arrays[1]).max(axis=1, keepdims=True)).astype(np.float32)  # rows of one scale
    _, sent, got, chain = _through("push", f"push={codec},zstd", arrays)
    expected = chain.roundtrip(arrays[1], arrays[3])
    assert np.array_equal(got[1], expected)
    assert 0 < np.abs(got[1] - arrays[1]).max() <= bound
    assert sum(a.nbytes for a in sent) < sum(a.nbytes for a in arrays)


def test_int8_encodes_its_own_output_to_the_same_bytes_in_any_routing_of_whole_segments():
    """What makes a piece routed again after a ring change carry the values its first
    encoding did: blocks never span segments, and a decoded block encodes to itself."""
    _, values, _, counts = _push(segments=(700, 1300, 1000))
    q, e = int8_encode(values, counts, 64)
    once, status = int8_decode(q, e, counts, 64, 4)
    assert status == 0
    q2, e2 = int8_encode(once, counts, 64)
    assert np.array_equal(q, q2) and np.array_equal(e, e2)
    # the middle segment alone (another server took the others)
    alone, _ = int8_decode(*int8_encode(once[700:2000], np.array([1300]), 64), np.array([1300]), 64, 4)
    assert np.array_equal(alone, once[700:2000])


def test_delta_keys_round_trip_in_any_order_and_sorted_keys_take_few_bytes():
    rng = np.random.default_rng(1)
    scattered = rng.integers(0, 2**64 - 1, 5000, dtype=np.uint64)
    coded = varint_encode(scattered)
    back, status = varint_decode(coded, scattered.shape[0])
    assert status == 0 and np.array_equal(back, scattered)
    dense = np.unique(rng.integers(0, 1 << 24, 50_000).astype(np.uint64))
    assert varint_encode(dense).nbytes < 2.5 * dense.shape[0]


def test_malformed_filtered_messages_are_refused_with_the_reason():
    arrays = _push()
    chain = chains(FilterSpec.parse("push=delta,zstd:min_bytes=0"))["push"]
    header, sent = pack("push", chain, arrays, Context(link=Link()))
    keys_at = header["parts"].index("keys")
    cut = list(sent)
    cut[keys_at] = cut[keys_at][:-3]
    with pytest.raises(ProtocolError, match="zstd: part 'keys'"):
        unpack("push", chain, header, cut, Context(store=KeyStore()))
    with pytest.raises(ProtocolError, match="not one of this table's push filters"):
        unpack("push", chains(FilterSpec.parse("push=zstd"))["push"], header, sent, Context(store=KeyStore()))
    with pytest.raises(ProtocolError, match="'parts' must name"):
        unpack("push", chain, {**header, "parts": ["keys"]}, sent, Context(store=KeyStore()))
    raw = chains(FilterSpec.parse("push=delta"))["push"]
    h2, s2 = pack("push", raw, arrays, Context())
    s2[0] = s2[0][:-1]
    with pytest.raises(ProtocolError, match="delta: the key code is truncated"):
        unpack("push", raw, h2, s2, Context())


def test_a_key_list_is_named_by_signature_once_sent_and_a_miss_applies_nothing():
    arrays = _push()
    link, store = Link(), KeyStore()
    first, _, _, _ = _through("push", "push=keycache", arrays, link, store)
    assert first["filters"][0][1].get("keep")
    header, sent, got, _ = _through("push", "push=keycache", arrays, link, store)
    assert "keys" not in header["parts"] and np.array_equal(got[0], arrays[0])
    chain = chains(FilterSpec.parse("push=keycache"))["push"]
    with pytest.raises(KeyCacheMissError, match="not held here"):  # a restarted server: an empty store
        unpack("push", chain, header, sent, Context(store=KeyStore()))
    again, _, _, _ = _through("push", "push=keycache", arrays, link, KeyStore(), whole=True)
    assert "keys" in again["parts"]  # a resend always carries its keys: that is how a miss heals
    forged = [header["filters"][0][0], {**header["filters"][0][1], "keep": True}]
    with pytest.raises(ProtocolError, match="do not have the signature"):
        unpack("push", chain, {**first, "filters": [forged]}, [arrays[0][::-1].copy(), *arrays[1:]],
               Context(store=store))


def test_the_key_store_keeps_the_newest_lists_within_its_bytes():
    store = KeyStore(max_bytes=3 * 800)
    lists = [np.arange(i * 100, i * 100 + 100, dtype=np.uint64) for i in range(5)]
    for i, keys in enumerate(lists):
        store.put(bytes([i]) * 16, (keys,))
    assert store.get(bytes([0]) * 16) is None and store.get(bytes([1]) * 16) is None
    assert np.array_equal(store.get(bytes([4]) * 16)[0], lists[4])
    assert store.bytes <= store.max_bytes


def test_filter_specs_parse_travel_and_refuse_with_the_fix():
    spec = FilterSpec.parse("compact")
    assert FilterSpec.parse(spec.to_wire()) == spec and FilterSpec.parse(str(spec)) == spec
    t = TableSpec("w", 4, filters="push=int8:block=64,keycache;pull=keycache")
    assert TableSpec.from_wire(t.to_wire()) == t
    assert "filters" not in TableSpec("w").to_wire()  # no filters: the spec on the wire is as before
    for bad, match in [("push=zstd,int8", "list them in the order"), ("pull=fp16", "serves push, reply"),
                       ("push=nope", "built-ins are"), ("push=int8:block=0", "block must be"),
                       ("up=zstd", "DIRECTION=FILTER"), ("push=os:path", "not a subclass"),
                       ("push=no_such_module_x:F", "does not import here")]:
        with pytest.raises(ConfigError, match=match):
            TableSpec("w", filters=bad)


def test_residuals_owe_what_sigmod_held_back_and_what_rounding_took():
    spec = FilterSpec.parse("push=sigmod:threshold=0.5,int8")
    chain = chains(spec)["push"]
    store, counts = Owed(1), {}
    keys = np.arange(6, dtype=np.uint64)
    grads = np.array([[0.1], [0.9], [0.3], [-0.7], [0.0], [0.2]], np.float32)
    sent_keys, sent = before_routing(chain, store, keys, grads, counts)
    assert sent_keys.tolist() == [1, 3] and counts == {"sigmod_in": 6, "sigmod_out": 2}
    rounded = after_routing(chain, store, sent_keys, sent, np.array([2]))
    sent_keys2, sent2 = before_routing(chain, store, keys, grads, counts)  # the same again: small ones add up
    assert sent_keys2.tolist() == [1, 2, 3]
    held_keys, _ = Owed(1).drain(held_only=True)
    assert held_keys.size == 0
    owed_keys, owed = store.drain(held_only=False)
    total = {int(k): float(v) for k, v in zip(sent_keys, rounded[:, 0])}
    for k, v in zip(sent_keys2.tolist(), sent2[:, 0].tolist()):
        total[k] = total.get(k, 0.0) + v
    for k, v in zip(owed_keys.tolist(), owed[:, 0].tolist()):
        total[k] = total.get(k, 0.0) + v
    assert np.allclose([total.get(k, 0.0) for k in range(6)], 2 * grads[:, 0], atol=1e-6)  # nothing lost, none twice


def test_residuals_grow_and_keep_every_key():
    store = Residuals(2, capacity=16)
    keys = np.arange(1000, dtype=np.uint64) * 977
    store.add(keys, np.ones((1000, 2), np.float32))
    store.add(keys[:10], np.ones((10, 2), np.float32))
    got = np.zeros((3, 2), np.float32)
    store.take(keys[[0, 500, 999]], got)
    assert got.tolist() == [[2, 2], [1, 1], [1, 1]]
    assert store.pending() == (997, 2 * 1000 + 2 * 10 - 8)


def test_rounding_owed_is_bounded_and_what_it_lets_go_is_counted():
    chain = chains(FilterSpec.parse("push=int8"))["push"]
    owed = Owed(1, max_bytes=1024 * 2 * 13)  # room for 1024 keys
    rng = np.random.default_rng(5)
    for i in range(5):
        keys = np.arange(i * 600, i * 600 + 600, dtype=np.uint64)
        after_routing(chain, owed, keys, rng.standard_normal((600, 1)).astype(np.float32), np.array([600]))
        assert owed.rounding.size <= owed.rounding.max_rows
    assert owed.rounding.dropped_keys > 0 and owed.rounding.dropped > 0
    assert not owed.must_flush()


def test_a_dense_tables_keys_go_as_positions_routed_in_order_and_come_back_as_keys():
    from paramserver.client.core import route
    from paramserver.routing.hashing import layout_code
    from paramserver.routing.ring import Ring
    from paramserver.wire.message import Op

    layout = layout_code(24)
    ring = Ring.create([1, 2], 32)
    rng = np.random.default_rng(2)  # first-seen order, as a batch's distinct keys come
    keys = rng.permutation(np.unique(rng.integers(0, 1 << 24, 20_000).astype(np.uint64)))
    chain = chains(FilterSpec.parse("pull=delta"))["pull"]
    sizes = {}
    for ordered in (False, True):
        for piece in route(ring, Op.PULL, keys, None, layout, ordered=ordered):
            assert sorted(keys[piece.extra].tolist()) == sorted(piece.keys.tolist())  # rows follow their keys
            arrays = [piece.keys, piece.vnodes, piece.counts]
            header, sent = pack("pull", chain, arrays, Context(layout=layout))
            assert header["filters"][0][1]["pos"]
            got = unpack("pull", chain, header, sent, Context(layout=layout))
            assert np.array_equal(got[0], piece.keys)
            sizes[ordered] = sizes.get(ordered, 0) + sent[0].nbytes
    assert sizes[True] < 0.75 * sizes[False]  # positions in order lie close together
    with pytest.raises(ProtocolError, match="dense positions to a table without them"):
        unpack("pull", chain, header, sent, Context(layout=0))


def test_a_claimed_size_is_checked_before_anything_is_allocated():
    arrays = _push()
    chain = chains(FilterSpec.parse("push=delta,zstd:min_bytes=0"))["push"]
    header, sent = pack("push", chain, arrays, Context())
    huge = [list(e) for e in header["filters"]]
    zstd_at = [e[0] for e in huge].index("zstd")
    huge[zstd_at] = ["zstd", {"parts": {"values": ["<f4", [1 << 39, 1 << 39]]}}]
    with pytest.raises(ProtocolError, match="over the limit"):
        unpack("push", chain, {**header, "filters": huge}, sent, Context())
    raw = chains(FilterSpec.parse("push=delta"))["push"]
    h2, s2 = pack("push", raw, arrays, Context())
    h2["filters"][0][1]["n"] = 1 << 39
    with pytest.raises(ProtocolError, match="must be the count of keys"):
        unpack("push", raw, h2, s2, Context())


def _mostly_zero(n=1500, dim=300, seed=3, share=0.03):
    """Rows as a topic model's counts are: a few non-zero a row, and the odd -0.0, NaN and inf."""
    rng = np.random.default_rng(seed)
    values = np.where(rng.random((n, dim)) < share, rng.integers(1, 90, (n, dim)), 0).astype(np.float32)
    values.reshape(-1)[:5] = [-0.0, np.nan, np.inf, -np.inf, 1e-45]  # bits, not values: -0.0 == 0 yet travels
    values[7] = 0.0  # an empty row
    return values


@pytest.mark.parametrize("dim", [1, 7, 8, 300, 1001])
def test_sparse_gives_mostly_zero_values_back_bit_for_bit_in_fewer_bytes(dim):
    values = _mostly_zero(n=1500, dim=dim)
    for direction, arrays in (("reply", [values]), ("push", [*_push(n=1500, dim=dim, segments=(1500,))[:1], values,
                                                              np.zeros(1, np.int32), np.array([1500], np.int64)])):
        header, sent, got, _ = _through(direction, f"{direction}=sparse", arrays)
        assert header["filters"][0][0] == "sparse"
        back = got[PARTS_AT[direction]]
        assert back.shape == values.shape and np.array_equal(back.view(np.uint32), values.view(np.uint32))
        packed = sum(a.nbytes for name, a in zip(header["parts"], sent) if name.startswith("values"))
        assert packed < values.nbytes * 0.2  # a bit a value and the 3 % that are not zero
        assert not back.flags.writeable


PARTS_AT = {"reply": 0, "push": 1}


def test_sparse_leaves_dense_values_as_they_are_and_refuses_what_does_not_decode():
    dense = _push(n=400, segments=(400,))[1]
    header, sent, got, _ = _through("reply", "reply=sparse", [dense])
    assert "filters" not in header and sent[0] is dense  # nothing gained: not packed
    assert _through("reply", "reply=sparse:keep=1", [np.ones((3, 3), np.float32)])[0] == {}
    values = _mostly_zero(n=50, dim=13)  # 650 bits: the mask's last byte has 6 bits past the values
    chain = chains(FilterSpec.parse("reply=sparse"))["reply"]
    header, sent = pack("reply", chain, [values], Context())
    words_at, mask_at = header["parts"].index("values"), header["parts"].index("values.mask")

    def refused(frames, match, h=header):
        with pytest.raises(ProtocolError, match=match):
            unpack("reply", chain, h, frames, Context())

    def changed(at, a):
        frames = list(sent)
        frames[at] = a
        return frames

    mask = sent[mask_at].copy()
    mask[-1] |= 0x80  # a bit past the values
    refused(changed(mask_at, mask), "sparse: a mask of")
    mask = sent[mask_at].copy()
    mask[0] ^= 0x01 if not mask[0] & 1 else 0x02  # one more (or other) value marked than sent
    refused(changed(mask_at, mask), "sparse: a mask of")
    refused(changed(mask_at, sent[mask_at][:-1]), "sparse: a mask of")
    refused(changed(words_at, sent[words_at][:-4]), "sparse: a mask of")
    refused(changed(words_at, sent[words_at][:-1]), "not whole float32s")
    refused(sent, "over the limit", {**header, "filters": [["sparse", {"shape": [1 << 39, 1 << 20]}]]})
    refused(sent, "must be 2-d", {**header, "filters": [["sparse", {"shape": [650]}]]})
    odd = changed(words_at, np.r_[np.zeros(1, np.uint8), sent[words_at]][1:])  # a frame at an odd address
    assert np.array_equal(unpack("reply", chain, header, odd, Context())[0].view(np.uint32), values.view(np.uint32))
    rng = np.random.default_rng(5)
    outcomes = set()
    for _ in range(200):  # flipped bytes: refused by name, or values of the promised shape, never a crash
        at = int(rng.integers(2))
        a = sent[at].copy()
        a[rng.integers(a.size, size=2)] ^= rng.integers(1, 256, dtype=np.uint8)
        try:
            got = unpack("reply", chain, header, changed(at, a), Context())
        except ProtocolError as err:
            assert str(err).startswith("sparse: ")
            outcomes.add("refused")
            continue
        assert got[0].shape == values.shape and got[0].dtype == np.float32
        outcomes.add("decoded")
    assert outcomes == {"refused", "decoded"}


@pytest.mark.parametrize("spec", ["compact", "push=int8,keycache,delta,zstd:min_bytes=0", "push=bf16,delta"])
def test_a_corrupted_filtered_push_is_refused_with_a_protocol_error_never_a_crash(spec):
    """Each corrupted message is refused with a ProtocolError that names the filter that
    found the fault (what a server answers), or decodes to parts of the shapes the header
    promises (a flipped value byte is still values); the message as sent round-trips."""
    rng = np.random.default_rng(11)
    arrays = _push(n=500, segments=(200, 300))
    chain = chains(FilterSpec.parse(spec))["push"]
    header, sent = pack("push", chain, arrays, Context(link=Link()))
    names = "|".join(entry[0] for entry in header["filters"])
    refused, accepted = 0, 0
    for _ in range(300):
        frames = [a.copy() for a in sent]
        a = frames[rng.integers(len(frames))]
        if a.size and a.dtype == np.uint8:
            a[rng.integers(a.size, size=rng.integers(1, 4))] ^= rng.integers(1, 256, dtype=np.uint8)
        elif rng.random() < 0.5:
            frames[rng.integers(len(frames))] = a[: a.size // 2]
        try:
            got = unpack("push", chain, header, frames, Context(store=KeyStore()))  # any other error fails the test
        except ProtocolError as err:
            refused += 1
            assert re.match(rf"({names}): \S", str(err)), f"{err!r} does not name the filter that refused it"
            continue
        accepted += 1
        keys, values = got[0], got[1]
        assert keys.dtype == np.uint64 and keys.shape == arrays[0].shape  # the filters' parts: as the header says
        assert values.dtype == np.float32 and values.shape == arrays[1].shape
        untouched = dict(zip(header["parts"], frames))  # no filter encodes the segments: they pass as sent
        assert np.array_equal(got[2], untouched["vnodes"]) and np.array_equal(got[3], untouched["counts"])
        assert not any(g.flags.writeable for g in got)
    assert refused > 30 and accepted > 30  # both ways exercised
    got = unpack("push", chain, header, [a.copy() for a in sent], Context(store=KeyStore()))
    expected = [arrays[0], chain.roundtrip(arrays[1], arrays[3]), arrays[2], arrays[3]]
    assert all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(got, expected, strict=True))
