"""A pull's answer written straight into the caller's rows (``client.core.rows_into``,
``filters.chain.unpack_rows``): a sparse reply decoded there bit for bit or converted to
int32 counts, other replies decoded and copied over, and corrupt replies refused by name."""

from __future__ import annotations

import numpy as np
import pytest

from paramserver.client.core import Piece, rows_into
from paramserver.errors import ProtocolError
from paramserver.filters.base import Context
from paramserver.filters.builtin import ROWS_IN_PLACE
from paramserver.filters.chain import FilterSpec, chains, pack, unpack_rows
from paramserver.wire.message import Message


def _counts(n, dim, seed=0, share=0.04):
    """Rows as a topic model's counts are: a few non-zero a row, one row empty."""
    rng = np.random.default_rng(seed)
    values = np.where(rng.random((n, dim)) < share, rng.integers(1, 5000, (n, dim)), 0).astype(np.float32)
    values[n // 2] = 0.0
    return values


def _reply(spec, values):
    chain = chains(FilterSpec.parse(spec))["reply"]
    header, sent = pack("reply", chain, [values], Context())
    return chain, header, sent


@pytest.mark.parametrize("dim", [1, 7, 8, 13, 127, ROWS_IN_PLACE, 300, 1001])
@pytest.mark.parametrize("spec", ["reply=sparse", "reply=sparse,zstd:min_bytes=0"])
def test_a_sparse_reply_lands_in_the_rows_it_answers_bit_for_bit_or_as_int32_counts(dim, spec):
    """From ``ROWS_IN_PLACE`` values a row decoded in place; below, decoded and copied over:
    the same rows either way, and no other row of ``out`` touched."""
    values = _counts(257, dim, seed=dim)
    values.reshape(-1)[:3] = [-0.0, np.inf, 1e-45]  # bits travel, not values
    chain, header, sent = _reply(spec, values)
    assert header["filters"][0][0] == "sparse"
    index = np.random.default_rng(1).permutation(300)[:257]  # the caller's rows: any order, some not answered
    untouched = np.setdiff1d(np.arange(300), index)
    out = np.full((300, dim), 7.0, np.float32)
    left = unpack_rows(chain, header, sent, index, out)
    if dim >= ROWS_IN_PLACE:
        assert left is None
        assert np.array_equal(out[index].view(np.uint32), values.view(np.uint32))
    else:
        assert np.array_equal(left[0].view(np.uint32), values.view(np.uint32)) and (out == 7.0).all()
    piece = Piece(0, 1, np.zeros(257, np.uint64), index, np.zeros(1, np.int32), np.array([257], np.int64))
    counts = _counts(257, dim, seed=dim)
    chain, header, sent = _reply(spec, counts)
    for out in (np.full((300, dim), 7.0, np.float32), np.full((300, dim), -1, np.int32)):
        rows_into(out, dim, chain)(piece, Message(header, sent))
        assert np.array_equal(out[index], counts.astype(out.dtype))
        assert (out[untouched] == out.dtype.type(7 if out.dtype == np.float32 else -1)).all()


def test_rows_into_copies_a_reply_no_filter_packed_converting_to_int32():
    dense = np.random.default_rng(2).integers(0, 9, (40, 6)).astype(np.float32)  # too dense to pack
    chain, header, sent = _reply("reply=sparse", dense)
    assert "filters" not in header
    keys, where = np.arange(40, dtype=np.uint64), np.arange(40)[::-1].copy()
    piece = Piece(0, 1, keys, where, np.zeros(1, np.int32), np.array([40], np.int64))
    for out in (np.zeros((40, 6), np.float32), np.zeros((40, 6), np.int32)):
        rows_into(out, 6, chain)(piece, Message(header, sent))
        assert np.array_equal(out[where], dense.astype(out.dtype))
        rows_into(out, 6, None)(piece, Message({}, [dense[::-1].copy()]))
        assert np.array_equal(out, dense.astype(out.dtype))


def test_a_corrupt_or_misshapen_sparse_reply_is_refused_by_name_and_never_crashes():
    dim = ROWS_IN_PLACE + 3
    values = _counts(50, dim)
    chain, header, sent = _reply("reply=sparse", values)
    index, out = np.arange(50), np.zeros((50, dim), np.float32)
    with pytest.raises(ProtocolError, match=rf"sparse: values of shape \(50, {dim}\) answer 49 rows"):
        unpack_rows(chain, header, sent, index[:49], out)
    with pytest.raises(ProtocolError, match=f"answer 50 rows of {dim + 1} values"):
        unpack_rows(chain, header, sent, index, np.zeros((50, dim + 1), np.float32))
    with pytest.raises(ProtocolError, match="not one of this table's reply filters"):
        unpack_rows(chain, {**header, "filters": [["int8", {}]]}, sent, index, out)
    rng = np.random.default_rng(5)
    outcomes = set()
    for _ in range(300):  # flipped bytes: refused by name, or rows of the promised shape, never a crash
        at = int(rng.integers(2))
        frames = list(sent)
        frames[at] = frames[at].copy()
        frames[at][rng.integers(frames[at].size, size=2)] ^= rng.integers(1, 256, dtype=np.uint8)
        try:
            assert unpack_rows(chain, header, frames, index, out) is None
        except ProtocolError as err:
            assert str(err).startswith("sparse: ")
            outcomes.add("refused")
            continue
        outcomes.add("decoded")
    assert outcomes == {"refused", "decoded"}
