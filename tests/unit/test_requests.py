"""What a server checks of a request's vnode segments before it touches a table."""

import numpy as np
import pytest

from paramserver import Ring, TableSpec
from paramserver.errors import ProtocolError, StaleRingError
from paramserver.server.requests import check_segments
from paramserver.store.vnodes import VnodeSet

RING = Ring.create([1, 2], 4)  # 8 vnodes, server 1 the primary of the even ones
HELD = [0, 2, 4, 6]


def _check(vnodes, counts, n_keys, primary=True, held=HELD):
    table = VnodeSet(TableSpec("t"), RING.n_vnodes, held)
    primary_of = RING.owners == 1 if primary else None
    check_segments(table, RING, np.zeros(n_keys, np.uint64), np.asarray(vnodes, np.int32),
                   np.asarray(counts, np.int64), primary_of, 1, RING.version)


@pytest.mark.parametrize("vnodes, counts, n_keys, primary, held", [
    ([0, 2, 6], [1, 0, 2], 3, True, HELD),
    ([], [], 0, True, HELD),
    ([1, 3], [2, 2], 4, False, [1, 3]),  # a backup's copy: any held vnode
])
def test_well_formed_segments_pass(vnodes, counts, n_keys, primary, held):
    _check(vnodes, counts, n_keys, primary, held)  # no error
    # and not because nothing is checked: the same segments with a key they do not cover are refused
    with pytest.raises(ProtocolError, match=f"counts do not cover the {n_keys + 1} keys"):
        _check(vnodes, counts, n_keys + 1, primary, held)


@pytest.mark.parametrize("vnodes, counts, n_keys, error, match", [
    ([0, 2], [1], 1, ProtocolError, "counts do not cover the 1 keys"),  # shapes differ
    ([0, 2], [2, 2], 3, ProtocolError, "counts do not cover the 3 keys"),
    ([0, 2], [-1, 4], 3, ProtocolError, "counts do not cover"),
    ([0, 2], [4, 0], 3, ProtocolError, "counts do not cover"),
    ([0, 0], [1, 1], 2, ProtocolError, "more than once"),
    ([-1, -1], [1, 1], 2, ProtocolError, "more than once"),  # said before the range
    ([0, 8], [1, 1], 2, ProtocolError, r"vnodes must be in \[0, 8\), got \[0, 8\]"),
    ([0, -3], [1, 1], 2, ProtocolError, r"must be in \[0, 8\)"),
    ([0, 1], [1, 1], 2, StaleRingError, "not the primary of all of vnodes"),  # 1 is server 2's
])
def test_each_fault_is_refused_with_its_own_message(vnodes, counts, n_keys, error, match):
    with pytest.raises(error, match=match):
        _check(vnodes, counts, n_keys)


def test_a_primary_that_does_not_hold_the_vnode_yet_is_stale():
    with pytest.raises(StaleRingError):
        _check([0, 2], [1, 1], 2, held=[0])
