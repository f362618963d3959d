"""Checkpoint integrity: first-format manifests (no sha256) need an explicit opt-in, the
checkpoint root is judged with symlinks resolved, and checkpoint URLs are made absolute
(or refused when empty) by the process that asks, not by each server."""

import io
import json
import os
from types import SimpleNamespace

import numpy as np
import pytest

from paramserver import CheckpointError
from paramserver.checkpoint import store as ckpt
from paramserver.tables.spec import TableSpec

KEYS = np.arange(50, dtype=np.uint64)


def _write_step(step: str, *, first_format: bool = False) -> dict:
    """A step of one table ``t`` (dim 1, sgd: 1 column), written as the servers and the
    client would, or rewritten as format 1 (absolute paths, no sha256)."""
    spec = TableSpec("t", dim=1, optimizer="sgd")
    entry = ckpt.write_vnode(step, "t", 0, KEYS, np.ones((KEYS.size, 1), np.float32))
    if first_format:
        entry = [f"{step}/{entry[0]}", entry[1]]
    ckpt.write_manifest(step, {"ring": {}, "tables": {"t": spec.to_wire()}, "files": {"t": {"0": entry}},
                               "clocks": {}})
    if first_format:
        path = os.path.join(step, ckpt.MANIFEST)
        manifest = json.load(open(path))
        manifest["format"] = "paramserver-checkpoint-1"
        with open(path, "w") as f:
            json.dump(manifest, f)
    return json.load(open(os.path.join(step, ckpt.MANIFEST)))


def _edit(step: str, entry: list) -> None:
    """The vnode file of ``entry`` rewritten with other values: a valid npz, not the one saved."""
    path = entry[0] if entry[0].startswith("/") else os.path.join(step, entry[0])
    out = io.BytesIO()
    np.savez(out, keys=KEYS, rows=np.full((KEYS.size, 1), 7, np.float32))
    with open(path, "wb") as f:
        f.write(out.getvalue())


class _Client:
    """What ``restore_tables`` uses of a Client; records what it would have done."""

    def __init__(self) -> None:
        self.created: list[str] = []
        self.requests: list[dict] = []
        self.config = SimpleNamespace(scheduler="tcp://scheduler")
        self.admin = SimpleNamespace(ring=SimpleNamespace(servers=[0, 1]),
                                     create_table_spec=lambda spec: self.created.append(spec.name))

    def tables(self) -> dict:
        return {}

    def drop_table(self, name: str) -> None:
        self.created.remove(name)

    def _call(self, address: str, header: dict) -> dict:
        self.requests.append(header)
        return {"loaded": sum(int(e[1]) for e in header["entries"])}


# ---- (a) first-format manifests need allow_unverified --------------------------------------

def test_a_first_format_manifest_is_refused_naming_the_file_the_rule_and_the_fix(tmp_path):
    step = ckpt.step_url(str(tmp_path / "ckpt"), 1)
    manifest = _write_step(step, first_format=True)
    _edit(step, manifest["files"]["t"]["0"])  # undetectable: format 1 has no sha256
    client = _Client()
    with pytest.raises(CheckpointError) as err:
        ckpt.restore_tables(client, step)
    text = str(err.value)
    assert f"{step}/{ckpt.MANIFEST}" in text and "paramserver-checkpoint-1" in text  # the file
    assert "no sha256" in text and "refused" in text  # the rule
    assert "allow_unverified=True" in text and "--allow-unverified-checkpoint" in text  # the fix
    assert client.created == [] and client.requests == []  # nothing created, nothing sent
    with pytest.raises(CheckpointError, match="allow-unverified-checkpoint"):
        ckpt.read_manifest(step)


def test_a_first_format_manifest_restores_when_the_caller_opts_in(tmp_path, caplog):
    step = ckpt.step_url(str(tmp_path / "ckpt"), 1)
    _write_step(step, first_format=True)
    client = _Client()
    assert ckpt.restore_tables(client, step, allow_unverified=True) == {"t": KEYS.size}
    assert client.created == ["t"]
    assert client.requests[0]["allow_unverified"] is True  # the servers are told, or they refuse
    assert "no checksums to verify" in caplog.text
    assert ckpt.read_manifest(step, allow_unverified=True)["format"] == "paramserver-checkpoint-1"


def test_a_current_manifest_restores_as_before_and_sends_no_opt_in(tmp_path):
    step = ckpt.step_url(str(tmp_path / "ckpt"), 1)
    _write_step(step)
    client = _Client()
    assert ckpt.restore_tables(client, step) == {"t": KEYS.size}
    assert "allow_unverified" not in client.requests[0]


def test_a_first_format_entry_in_a_current_manifest_is_refused_too(tmp_path):
    """Keeping format 2 but listing a file as [path, keys] would skip its hash as well."""
    step = ckpt.step_url(str(tmp_path / "ckpt"), 1)
    manifest = _write_step(step)
    entry = manifest["files"]["t"]["0"]
    manifest["files"]["t"]["0"] = [f"{step}/{entry[0]}", entry[1]]
    with open(os.path.join(step, ckpt.MANIFEST), "w") as f:
        json.dump(manifest, f)
    _edit(step, manifest["files"]["t"]["0"])
    client = _Client()
    with pytest.raises(CheckpointError, match=r"without its sha256.*allow_unverified=True"):
        ckpt.restore_tables(client, step)
    assert client.created == []
    with pytest.raises(CheckpointError, match="without its sha256"):
        ckpt.entry_path(step, manifest["files"]["t"]["0"])
    assert ckpt.entry_path(step, manifest["files"]["t"]["0"], allow_unverified=True).endswith("t/0.npz")


def test_a_server_refuses_first_format_entries_unless_the_restore_opts_in(tmp_path):
    from paramserver.server import storage

    step = ckpt.step_url(str(tmp_path / "ckpt"), 1)
    entry = _write_step(step, first_format=True)["files"]["t"]["0"]
    with pytest.raises(CheckpointError, match="without its sha256"):  # before the table is even looked at
        storage.restore_rows({"t": object()}, np.zeros(1, bool), None, "t", step, [entry])


def test_the_scheduler_passes_the_opt_in_on_to_the_servers():
    from paramserver.scheduler.restores import Restores
    from paramserver.wire.message import Message

    host = SimpleNamespace(tables={"t": None}, ring=None, moving=False)
    for opt_in in (False, True):
        restores = Restores(host)
        header = {"op": "restore", "id": 1, "table": "t", "step": "/c/000000000000001", "entries": []}
        if opt_in:
            header["allow_unverified"] = True
        restores.request(b"client", Message(header, []))
        assert restores.current is not None
        assert restores.current.header.get("allow_unverified") is (True if opt_in else None)


@pytest.mark.parametrize("command", ["train", "lasso", "mf", "lda"])
def test_the_commands_that_resume_take_allow_unverified_checkpoint(command):
    import argparse

    from paramserver.cli.main import build_parser

    sub = next(a for a in build_parser(command)._actions if isinstance(a, argparse._SubParsersAction))
    options = sub.choices[command]._option_string_actions
    assert "--resume" in options
    flag = options["--allow-unverified-checkpoint"]
    assert flag.dest == "allow_unverified_checkpoint" and flag.default is False and flag.nargs == 0


def test_a_round_app_resume_refuses_a_first_format_step(tmp_path):
    from paramserver.apps.rounds.program import CheckpointOptions

    step = ckpt.step_url(str(tmp_path / "ckpt"), 1)
    _write_step(step, first_format=True)
    with pytest.raises(CheckpointError, match="--allow-unverified-checkpoint"):
        CheckpointOptions(resume=step).plan({}, 1)


# ---- (b) the checkpoint root, with symlinks resolved -----------------------------------------

@pytest.fixture
def rooted(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "link").symlink_to(outside)  # a link inside the root, to a folder outside it
    (root / "inner").mkdir()
    (root / "inside").symlink_to(root / "inner")  # a link that stays inside
    return str(root), str(outside)


def test_a_symlink_out_of_the_checkpoint_root_is_outside_it_for_reads(rooted):
    root, outside = rooted
    step = ckpt.step_url(f"{root}/link/ckpt", 1)
    os.makedirs(step)  # an existing step, reached through the link
    with pytest.raises(CheckpointError) as err:
        ckpt.confine(step, root)
    assert "outside the cluster's checkpoint root" in str(err.value)
    assert f"resolves to '{outside}" in str(err.value) and "symlink" in str(err.value)


@pytest.mark.parametrize("rest", ["", "/ckpt", "/new/deeper/000000000000001"])
def test_a_symlink_out_of_the_checkpoint_root_is_outside_it_for_writes(rooted, rest):
    root, outside = rooted  # the path is not there yet: its nearest existing parent is resolved
    with pytest.raises(CheckpointError, match="outside the cluster's checkpoint root"):
        ckpt.confine(f"{root}/link{rest}", root)


def test_paths_inside_the_checkpoint_root_are_still_accepted(rooted, tmp_path):
    root, _ = rooted
    for url in (root, f"{root}/ckpt", f"{root}/a/b/000000000000001", f"{root}/inside/ckpt", f"{root}/inner"):
        assert ckpt.confine(url, root) == url
    alias = tmp_path / "alias"
    alias.symlink_to(root)  # the root named through a link: the same folder
    assert ckpt.confine(f"{alias}/ckpt", root) == f"{alias}/ckpt"
    assert ckpt.confine(f"{root}/ckpt", str(alias)) == f"{root}/ckpt"
    assert ckpt.confine("memory://r/ckpt", "memory://r") == "memory://r/ckpt"  # URLs: as before
    with pytest.raises(CheckpointError, match="outside"):
        ckpt.confine("memory://elsewhere/ckpt", "memory://r")


# ---- (c) empty and relative checkpoint URLs --------------------------------------------------

def test_an_empty_checkpoint_url_is_refused(tmp_path):
    for url in ("", "  ", None):
        with pytest.raises(CheckpointError, match="is empty: refused .*filesystem root.*give a folder or URL"):
            ckpt.local_url(url)
    with pytest.raises(CheckpointError, match="is empty: refused"):
        ckpt.confine("", "")  # a server refuses it too
    with pytest.raises(CheckpointError, match="is empty: refused"):
        ckpt.confine("", str(tmp_path))


def test_a_relative_checkpoint_path_is_made_absolute_where_it_is_asked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert ckpt.local_url("ckpt") == f"{tmp_path}/ckpt"
    assert ckpt.local_url("./a/b/") == f"{tmp_path}/a/b"
    assert ckpt.local_url("/abs/ckpt") == "/abs/ckpt"
    for url in ("s3://bucket/ckpt", "memory://ckpt", "file:///data/ckpt", "gs://b/c"):
        assert ckpt.local_url(url) == url  # a URL with a scheme goes as it is
    with pytest.raises(CheckpointError, match="has a '..' in it"):
        ckpt.confine(ckpt.local_url("../escape"), "")  # a '..' stays for the servers to refuse


def test_client_checkpoint_and_restore_send_absolute_paths(tmp_path, monkeypatch):
    from paramserver.client.client import Client
    from paramserver.client.losses import Losses

    monkeypatch.chdir(tmp_path)
    sent: list = []
    with pytest.raises(CheckpointError, match="is empty"):
        Client.checkpoint(SimpleNamespace(), "")  # refused before anything is sent
    monkeypatch.setattr(ckpt, "restore_tables", lambda client, url, allow: sent.append((url, allow)) or {})
    Client.restore(SimpleNamespace(), "ckpt")
    Client.restore(SimpleNamespace(), "memory://ckpt", allow_unverified=True)
    assert sent == [(f"{tmp_path}/ckpt", False), ("memory://ckpt", True)]
    with pytest.raises(CheckpointError, match="is empty"):
        Client.restore(SimpleNamespace(), "")

    class Fake:
        _losses = Losses(allow=False)  # no server died

        def _on_every_server(self, header):
            sent.append(header["url"])
            return []

        def _call(self, address, header):
            return {"tables": {}}

        config = SimpleNamespace(scheduler="s")
        _ring = SimpleNamespace(to_wire=lambda: {})

    sent.clear()
    step = Client.checkpoint(Fake(), "ckpt")
    assert step.startswith(f"{tmp_path}/ckpt/") and sent == [step]
    assert os.path.exists(os.path.join(step, ckpt.MANIFEST))
    step = Client.checkpoint(Fake(), "ckpt", step="ckpt/000000000000007")
    assert step == f"{tmp_path}/ckpt/000000000000007" and sent[-1] == step


def test_a_job_checkpoint_url_is_made_absolute_before_the_scheduler_sees_it(tmp_path, monkeypatch):
    from paramserver.client.job import Job

    monkeypatch.chdir(tmp_path)
    sent: list = []
    caller = SimpleNamespace(rpc=SimpleNamespace(call=lambda address, header: sent.append(header)),
                             config=SimpleNamespace(scheduler="s"), role="driver")
    job = Job(caller, SimpleNamespace())
    job.start([], 1, checkpoint={"url": "ckpt", "every": 2})
    assert sent[-1]["checkpoint"] == {"url": f"{tmp_path}/ckpt", "every": 2}
    with pytest.raises(CheckpointError, match="is empty"):
        job.start([], 1, checkpoint={"url": "", "every": 2})


def test_a_full_disk_is_named_and_the_partial_files_are_removed(tmp_path, monkeypatch):
    """Issue 28.7: a full disk during a checkpoint arrived as an "internal" error, and the
    files written before it stayed (and took the room the next checkpoint needed)."""
    import errno

    from paramserver.server import storage
    from paramserver.store.vnodes import VnodeSet
    from paramserver.tables.optim import SGD

    table = VnodeSet(TableSpec("t", optimizer=SGD()), 4, [0, 1, 2, 3])
    vnodes = np.repeat(np.arange(4, dtype=np.int32), [100, 100, 100, 99])
    keys = np.concatenate([np.arange(v * 1000 + 1, v * 1000 + n + 1, dtype=np.uint64)
                           for v, n in zip(range(4), [100, 100, 100, 99])])
    table.apply(vnodes[np.r_[0, 100, 200, 300]], np.array([100, 100, 100, 99]), keys, np.ones((399, 1), np.float32))
    real, calls = ckpt.write_vnode, []

    def fills_up(url, name, v, k, rows):
        calls.append(v)
        if len(calls) > 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(url, name, v, k, rows)

    monkeypatch.setattr(ckpt, "write_vnode", fills_up)
    step = str(tmp_path / "step")
    with pytest.raises(CheckpointError, match=r"No space left on device \(the disk is full: free space there, or "
                                              r"checkpoint elsewhere\); the 2 file\(s\) this server had written"):
        storage.write_checkpoint({"t": table}, np.ones(4, bool), step)
    assert not [f for _, _, fs in os.walk(step) for f in fs], "partial files stay"
