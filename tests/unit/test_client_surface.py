"""The curated client (issue 45.3): ``Client`` has at most 25 public names of its own; the
cluster's administration is ``client.admin``, what was measured ``client.stats``; the
names that moved still answer, each with a note of its new spelling."""

import warnings
from types import SimpleNamespace

import pytest

from paramserver.client import moved as moved_module
from paramserver.client.admin import Admin
from paramserver.client.client import Client
from paramserver.client.moved import MOVED
from paramserver.client.stats import Stats


def test_the_client_has_at_most_25_public_names_of_its_own() -> None:
    names = [n for n in dir(Client) if not n.startswith("_")]
    assert len(names) <= 25, names
    assert not set(names) & set(MOVED), "a moved name is still the client's own"


@pytest.mark.parametrize("name", sorted(MOVED))
def test_every_moved_name_lives_in_its_group(name: str) -> None:
    group = {"admin": Admin, "stats": Stats}[MOVED[name]]
    assert hasattr(group, name), f"client.{MOVED[name]}.{name} does not exist"


def test_an_old_name_answers_from_its_group_with_a_note_of_the_new_spelling(monkeypatch) -> None:
    monkeypatch.setattr(moved_module, "_said", set())
    client = object.__new__(Client)  # no cluster: only the attribute plumbing is under test
    object.__setattr__(client, "admin", SimpleNamespace(ring="the ring", cluster_info=lambda: {"ring_version": 3}))
    object.__setattr__(client, "stats", SimpleNamespace(allow_loss=False))
    with pytest.warns(DeprecationWarning, match=r"Client\.ring is now Client\.admin\.ring"):
        assert client.ring == "the ring"
    with pytest.warns(DeprecationWarning, match=r"Client\.cluster_info is now Client\.admin\.cluster_info"):
        assert client.cluster_info() == {"ring_version": 3}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once a process, not on every call
        assert client.ring == "the ring"
    with pytest.warns(DeprecationWarning, match=r"Client\.allow_loss is now Client\.stats\.allow_loss"):
        client.allow_loss = True  # set where it lives now, not as a new attribute of the client
    assert client.stats.allow_loss is True and "allow_loss" not in vars(client)
    with pytest.raises(AttributeError, match="no attribute 'no_such_call'"):
        client.no_such_call  # noqa: B018
