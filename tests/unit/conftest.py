"""Fixtures shared by the unit tests."""

import pytest
from harness import Harness


@pytest.fixture
def h(monkeypatch):
    harness = Harness(monkeypatch)
    yield harness
    harness.close()
