"""Fixtures shared by the unit tests."""

import pytest
from harness import Harness


@pytest.fixture
def h():
    harness = Harness()
    yield harness
    harness.close()
