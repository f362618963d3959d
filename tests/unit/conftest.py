"""Fixtures shared by the unit tests."""

import pytest
from harness import STEP_FTRL, Harness

from paramserver.routing.ring import Ring
from paramserver.tables.spec import TableSpec


@pytest.fixture
def h():
    harness = Harness()
    yield harness
    harness.close()


@pytest.fixture
def two():
    """Two harnesses, one server each, the same FTRL table ``w``: where steps go, and the reference."""
    out = []
    for _ in range(2):
        harness = Harness()
        harness.make(1)
        ring = Ring.create([1], 8)
        harness.ring(ring, [TableSpec("w", 1, optimizer=STEP_FTRL)])
        out.append((harness, ring))
    yield out
    for harness, _ in out:
        harness.close()
