"""A pull's and a push's keys on the wire: 4 bytes each where every key of the request is
below 2^32 (``client.core.narrow_keys``), widened back to 8 by the server's ``expect``
(``wire.message.KEY_TYPES``), so that a handler and a pull the gate parks read 8-byte keys."""

import numpy as np
import pytest

from paramserver.client.core import Piece, Sequencer, Wire, call_header, request
from paramserver.errors import ProtocolError
from paramserver.filters.chain import FilterSpec, chains
from paramserver.wire.message import KEY_TYPES, Message, Op, decode, encode, expect


def _piece(keys):
    keys = np.asarray(keys, np.uint64)
    return Piece(0, 1, keys, np.ones((keys.size, 1), np.float32), np.zeros(1, np.int32),
                 np.array([keys.size], np.int64))


@pytest.mark.parametrize("kind", [Op.PULL, Op.PUSH, Op.PREFETCH, Op.CALL])
def test_keys_that_fit_go_in_four_bytes_and_a_request_with_one_past_2_32_keeps_eight(kind):
    small, big = _piece([3, 1 << 24, (1 << 32) - 1]), _piece([3, 1 << 32])
    _, arrays = request(kind, call_header(kind, "t", node_id=1), small, 0, Sequencer())
    assert arrays[0].dtype == np.uint32 and arrays[0].tolist() == small.keys.tolist()
    _, arrays = request(kind, call_header(kind, "t", node_id=1), big, 0, Sequencer())
    assert arrays[0].dtype == np.uint64 and arrays[0].tolist() == big.keys.tolist()


def test_a_filtered_request_keeps_the_keys_its_chain_makes():
    wire = Wire(chains(FilterSpec.parse("push=fp16"))["push"], {}, {})
    piece = _piece([5, 9])
    _, arrays = request(Op.PUSH, call_header(Op.PUSH, "t", node_id=1), piece, 0, Sequencer(), wire)
    assert arrays[0].dtype == np.uint64 and arrays[0].tolist() == [5, 9]  # fp16 packs the values, not the keys


def test_the_server_reads_four_byte_keys_as_eight_in_the_message_too_and_refuses_other_types_by_name():
    keys = np.array([7, 1 << 20, 12], np.uint32)
    msg = decode(encode({"op": "pull", "table": "t"}, [keys, np.zeros(1, np.int32), np.array([3], np.int64)]))
    got, _, _ = expect(msg, ("keys", KEY_TYPES, 1), ("vnodes", "<i4", 1), ("counts", "<i8", 1))
    assert got.dtype == np.uint64 and got.tolist() == [7, 1 << 20, 12]
    assert msg.arrays[0].dtype == np.uint64  # a pull the gate parks is served from msg.arrays later
    wide = Message({"op": "pull"}, [keys.astype(np.uint64), np.zeros(1, np.int32), np.array([3], np.int64)])
    before = wide.arrays
    expect(wide, ("keys", KEY_TYPES, 1), ("vnodes", "<i4", 1), ("counts", "<i8", 1))
    assert wide.arrays is before  # nothing to widen: the message as it came
    bad = Message({"op": "pull"}, [keys.astype(np.int32), np.zeros(1, np.int32), np.array([3], np.int64)])
    with pytest.raises(ProtocolError, match="keys must be 1-d uint64 or uint32, got 1-d int32"):
        expect(bad, ("keys", KEY_TYPES, 1), ("vnodes", "<i4", 1), ("counts", "<i8", 1))
