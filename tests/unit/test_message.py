"""The wire format: round trips, and every malformed message is a ProtocolError."""

import re

import msgpack
import numpy as np
import pytest

from paramserver import ProtocolError
from paramserver.wire.message import PACK_BELOW, Op, decode, encode


def _bytes(frames):
    return [bytes(f) for f in frames]


def test_round_trip_keeps_header_and_arrays():
    keys = np.array([0, 5, 2**64 - 1], np.uint64)
    grads = np.arange(6, dtype=np.float32).reshape(3, 2)
    msg = decode(_bytes(encode({"op": "push", "id": 7, "table": "t"}, [keys, grads])))
    assert msg.op is Op.PUSH and msg.id == 7 and msg.header["table"] == "t"
    np.testing.assert_array_equal(msg.arrays[0], keys)
    np.testing.assert_array_equal(msg.arrays[1], grads)


@pytest.mark.parametrize("frames,match", [
    ([], "empty"),
    ([b"\xc1"], "not valid msgpack"),
    ([msgpack.packb([1, 2])], "must be a msgpack map"),
    ([msgpack.packb({"op": "launch_missiles"})], "unknown op"),
    ([msgpack.packb({"op": "pull", "arrays": [["<u8", [2]]]})], "lists 1 arrays but 0"),
    ([msgpack.packb({"op": "pull", "arrays": [["O", [2]]]}), b"x" * 16], "dtype"),
    ([msgpack.packb({"op": "pull", "arrays": [["<u8", [3]]]}), b"x" * 16], "needs 24"),
    ([msgpack.packb({"op": "pull", "arrays": [["<u8", [-2]]]}), b""], "non-negative"),
])
def test_malformed_messages_are_protocol_errors(frames, match):
    with pytest.raises(ProtocolError, match=match):
        decode(frames)


def test_oversized_message_is_refused():
    frames = _bytes(encode({"op": "pull", "id": 1}, [np.zeros(1000, np.uint64)]))
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        decode(frames, max_bytes=4000)


# every fault decode names (its docstring's list, and the catch-all that carries the cause)
FAULTS = re.compile(r"empty message|header frame larger than 1 MiB|header is not valid msgpack: .|header must be a "
                    r"msgpack map, got \w+|exceeds the limit of \d+|unknown op .+ \(known: |header lists .+ arrays but "
                    r"\d+ array frames follow|array \d+: (spec must be \[dtype, shape\]|shape must be non-negative "
                    r"ints|frame has \d+ bytes but .+ needs \d+)|"
                    r"the arrays' frame has \d+ bytes but the \d+ arrays it packs need \d+|malformed message: \w+\(.")


def test_fuzzed_frames_raise_a_protocol_error_naming_the_fault_or_decode_to_what_they_say():
    rng = np.random.default_rng(0)
    good = _bytes(encode({"op": "push", "id": 3, "table": "t", "ring_version": 1},
                         [np.arange(4, dtype=np.uint64), np.ones((4, 2), np.float32)]))
    refused, accepted = 0, 0
    for _ in range(3000):
        frames = [bytearray(f) for f in good]
        i = rng.integers(len(frames))
        if len(frames[i]) and rng.random() < 0.7:
            for _ in range(rng.integers(1, 4)):
                frames[i][rng.integers(len(frames[i]))] = rng.integers(256)
        else:
            frames[i] = frames[i][: rng.integers(len(frames[i]) + 1)]
        sent = [bytes(f) for f in frames]
        try:
            msg = decode(sent)  # anything but a ProtocolError fails the test
        except ProtocolError as err:
            refused += 1
            assert FAULTS.search(str(err)), f"{err} does not name its fault (frames {sent!r})"
            continue
        accepted += 1  # a flipped value byte, or a header still valid: it must say what was sent
        assert _bytes(encode({"op": "push"}, msg.arrays))[1:] == sent[1:] and isinstance(msg.op, Op)
        again = decode(_bytes(encode({k: v for k, v in msg.header.items() if k != "arrays"}, msg.arrays)))
        assert again.header == msg.header
        assert all(a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
                   for a, b in zip(again.arrays, msg.arrays, strict=True))
    assert refused > 1000 and accepted > 1000  # both ways exercised: the fuzzing is not all one kind


def test_a_messages_arrays_go_as_one_frame_each_aligned_and_come_back_as_they_were():
    arrays = [np.arange(5, dtype=np.uint64), np.zeros(0, np.float32), np.array([1, 2, 3], np.uint16),
              np.arange(6, dtype=np.float32).reshape(2, 3), np.array([7], np.uint8), np.array([-1, 2], np.int64)]
    frames = _bytes(encode({"op": "push", "id": 1}, arrays))
    assert len(frames) == 2 and len(frames[1]) == 40 + 0 + 8 + 24 + 8 + 16  # each padded to 8 bytes
    got = decode(frames).arrays
    for sent, back in zip(arrays, got, strict=True):
        assert back.dtype == sent.dtype and back.shape == sent.shape and np.array_equal(back, sent)
        assert back.flags.aligned and not back.flags.writeable
    one = _bytes(encode({"op": "pull", "id": 2}, [np.arange(3, dtype=np.uint64)]))
    assert len(one) == 2 and len(one[1]) == 24  # one array: its own bytes, as ever


def test_arrays_of_a_mebibyte_or_more_go_a_frame_each_and_the_frame_a_piece_form_still_decodes():
    big = [np.zeros(PACK_BELOW // 8, np.uint64), np.ones(3, np.float32)]
    frames = _bytes(encode({"op": "push", "id": 1}, big))
    assert [len(f) for f in frames[1:]] == [PACK_BELOW, 12]
    assert [a.shape for a in decode(frames).arrays] == [(PACK_BELOW // 8,), (3,)]
    small = [np.arange(3, dtype=np.uint64), np.ones(2, np.float32)]
    header = msgpack.packb({"op": "push", "id": 1, "arrays": [["<u8", [3]], ["<f4", [2]]]})
    back = decode([header, small[0].tobytes(), small[1].tobytes()]).arrays  # a sender that never packs
    assert all(np.array_equal(a, b) for a, b in zip(back, small, strict=True))
    with pytest.raises(ProtocolError, match="the arrays' frame has 24 bytes but the 2 arrays it packs need 32"):
        decode([header, small[0].tobytes()])


@pytest.mark.parametrize("header", [
    {"op": ["pull"], "id": 9},
    {"op": "pull", "id": 9, "arrays": [[["<u8"], [1]]]},
    {"op": "pull", "id": 9, "arrays": [["<u8", [2**32, 2**32]]]},
])
def test_odd_headers_are_protocol_errors_that_keep_the_request_id(header):
    frames = [msgpack.packb(header)] + [b""] * len(header.get("arrays", []))
    with pytest.raises(ProtocolError) as err:
        decode(frames)
    assert err.value.request_id == 9


def test_an_oversized_message_keeps_its_request_id():
    frames = _bytes(encode({"op": "pull", "id": 11}, [np.zeros(1000, np.uint64)]))
    with pytest.raises(ProtocolError) as err:
        decode(frames, max_bytes=4000)
    assert err.value.request_id == 11
