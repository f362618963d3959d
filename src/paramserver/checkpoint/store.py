"""Cold backup: checkpoints of every vnode and a manifest written last, through fsspec.

Layout under a checkpoint URL (local path, ``s3://...``, ``gs://...``):

    <url>/<step>/<table>/<vnode>.npz    keys uint64[n], rows float32[n, dim + state]
    <url>/<step>/MANIFEST.json          written last, atomically (temporary name, then move)

A step without a valid ``MANIFEST.json`` is incomplete and never used.  The manifest
holds the ring, every table spec, the files and the vector clock; each file is listed as
``[path relative to the step, keys, sha256, bytes]``, and a restore checks every one
(inside the step, its size, its hash, its key count) before it installs anything, so a
damaged, swapped or edited file fails the restore and changes nothing.  Manifests of the
first format (absolute paths, no hashes) cannot be verified, so they are refused unless the
caller opts in (``allow_unverified=True``, ``--allow-unverified-checkpoint``): otherwise
rewriting a manifest as format 1 would let an edited file through.  A local path is made
absolute by the process that asks for a checkpoint or a restore (``local_url``), so every
server writes and reads the same folder, whatever its working directory.
One written during a training job (by the scheduler) also holds the job's progress:
``"job": {"shards", "epochs", "epoch", "done", "totals", "epoch_examples"}``.
A restore may use any number of servers: each server reads the files and keeps the keys
whose vnode it owns under the new ring (a key's initial value and state go with it, so
values and optimiser state come back bitwise equal).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import time
from dataclasses import replace
from typing import Any

import numpy as np

from paramserver.errors import CheckpointError

# fsspec is imported where it is used: a job that writes no checkpoint does not load it (0.05 s)

logger = logging.getLogger(__name__)

MANIFEST = "MANIFEST.json"
FORMAT = "paramserver-checkpoint-2"
FORMATS = ("paramserver-checkpoint-1", FORMAT)  # readable; 1 has no hashes


def step_url(url: str, step: int) -> str:
    return f"{url.rstrip('/')}/{step:015d}"


def new_step_url(url: str) -> str:
    """A fresh step under ``url``: the time in ms, after every step already there (so
    the newest step is the last written, and no step is ever written over)."""
    import fsspec

    step = int(time.time() * 1000)
    fs, _, (root,) = fsspec.get_fs_token_paths(url)
    try:
        names = [p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(root, detail=False)]
    except FileNotFoundError:
        names = []
    steps = [int(n) for n in names if len(n) == 15 and n.isdigit()]
    _remove_abandoned(fs, root, steps)
    return step_url(url, max([step, *[s + 1 for s in steps]]))


def _remove_abandoned(fs: Any, root: str, steps: list[int]) -> None:
    """Remove the partial steps (no manifest) older than the newest complete one: they were
    cut short (a crash, a failed checkpoint), and nothing will ever use them; a step being
    written now is always newer than every complete step, so it is never touched."""
    complete = [s for s in steps if fs.exists(f"{root}/{s:015d}/{MANIFEST}")]
    if not complete:
        return
    for s in steps:
        if s < max(complete) and s not in complete:
            try:
                fs.rm(f"{root}/{s:015d}", recursive=True)
            except OSError:  # someone else removed it, or it cannot be: it stays, harmless
                pass


def assemble_manifest(replies: list[dict[str, Any]], ring: dict[str, Any], tables: dict[str, Any],
                      **extra: Any) -> dict[str, Any]:
    """The manifest of a step from every server's ``checkpoint`` reply (``files``,
    ``clocks``), the ring and the table specs (wire forms); ``extra`` is added as is."""
    files: dict[str, dict[str, list[Any]]] = {}
    clocks: dict[str, int] = {}
    epochs: dict[str, dict[str, int]] = {}  # tables with a lifecycle: server -> its epoch after this step
    deleted: dict[str, list[Any]] = {}  # an incremental step: per table, each server's file of keys evicted
    for header in replies:
        for table, vnodes in header["files"].items():
            files.setdefault(table, {}).update(vnodes)
        clocks.update(header.get("clocks", {}))
        for table, epoch in (header.get("epochs") or {}).items():
            epochs.setdefault(table, {})[str(header.get("node_id"))] = epoch
        for table, entry in (header.get("deleted") or {}).items():
            deleted.setdefault(table, []).append(entry)
    return {"ring": ring, "tables": tables, "files": files, "clocks": clocks, "epochs": epochs,
            **({"deleted": deleted} if deleted else {}), **extra}


def incremental_since(url: str, ring_version: int, servers: set[int]) -> tuple[str, dict[str, Any]] | None:
    """For an incremental step under ``url``: the newest complete step there (its name)
    and its epochs (table -> server -> epoch), if the ring and its servers are still the
    ones it was written under (else None: the step must be whole)."""
    try:
        step = latest_step(url)
    except CheckpointError:
        return None
    manifest = read_manifest(step)
    epochs = manifest.get("epochs")
    if manifest.get("ring", {}).get("version") != ring_version or not isinstance(epochs, dict) or not epochs \
            or any({int(s) for s in e} != servers for e in epochs.values()):
        return None
    return step.rstrip("/").rsplit("/", 1)[-1], epochs


def step_chain(step: str, allow_unverified: bool = False) -> list[tuple[str, dict[str, Any]]]:
    """An incremental step and the steps it builds on (``base``), oldest (a whole step) first."""
    chain = [(step, read_manifest(step, allow_unverified))]
    while isinstance(base := chain[0][1].get("base"), str):
        if len(chain) > 10_000 or "/" in base or base in ("", ".", ".."):
            raise CheckpointError(f"{chain[0][0]}: its base {base!r} is not a step of its folder")
        parent = f"{step.rstrip('/').rsplit('/', 1)[0]}/{base}"
        chain.insert(0, (parent, read_manifest(parent, allow_unverified)))
    return chain


def write_vnode(url: str, table: str, vnode: int | str, keys: np.ndarray, rows: np.ndarray) -> list[Any]:
    """Write one vnode's file under step ``url``; return its manifest entry
    ``[relative path, keys, sha256, bytes]``."""
    import fsspec

    rel = f"{table}/{vnode}.npz"
    buf = io.BytesIO()
    np.savez(buf, keys=keys, rows=rows)
    body = buf.getvalue()
    with fsspec.open(f"{url}/{rel}", "wb", auto_mkdir=True) as f:
        f.write(body)
    return [rel, int(keys.size), hashlib.sha256(body).hexdigest(), len(body)]


def remove_files(url: str, rels: list[str]) -> int:
    """Remove the files ``rels`` (relative paths) of step ``url``, as far as possible (a
    failed checkpoint's partial files, which would fill the disk again); how many went."""
    import fsspec

    removed = 0
    for rel in rels:
        try:
            fs, _, (path,) = fsspec.get_fs_token_paths(f"{url}/{rel}")
            fs.rm(path)
            removed += 1
        except (OSError, ValueError):  # gone already, or cannot be: nothing more to do here
            pass
    return removed


def remove_step(url: str) -> bool:
    """Remove the whole step ``url`` (a checkpoint given up: it has no manifest, nothing
    will ever read it, and its files take the room the next one needs); False if it could
    not be removed."""
    import fsspec

    try:
        fs, _, (path,) = fsspec.get_fs_token_paths(url)
        if fs.exists(path):
            fs.rm(path, recursive=True)
        return True
    except (OSError, ValueError) as exc:
        logger.warning("could not remove the abandoned checkpoint %s: %s", url, exc)
        return False


def local_url(url: Any, what: str = "checkpoint URL") -> str:
    """``url`` as every server must see it: a local path made absolute here (a relative one
    would name another folder on each server, under its own working directory); a URL with
    a scheme (``s3://``, ``memory://``, ``file://``) as it is.  An empty one is refused (it
    would name the servers' filesystem root)."""
    if not isinstance(url, str) or not url.strip():
        raise CheckpointError(f"{what} {url!r} is empty: refused (it would write at the filesystem root of "
                              "every server); give a folder or URL, e.g. /data/ckpt or s3://bucket/ckpt")
    if "://" in url or os.path.isabs(url):
        return url
    path = os.path.join(os.getcwd(), url)
    # normalised unless it has a '..', which stays for ``confine`` to refuse as it would a server's
    return path if ".." in url.replace("\\", "/").split("/") else os.path.normpath(path)


def _real(path: str) -> str:
    """``path`` with every symlink resolved, though its end may not exist yet (a checkpoint
    about to be written): the nearest existing parent resolved, the rest joined to it."""
    path = os.path.abspath(path)
    rest: list[str] = []
    while not os.path.lexists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        rest.append(os.path.basename(path))
        path = parent
    return os.path.join(os.path.realpath(path), *reversed(rest))


def confine(url: str, root: str) -> str:
    """``url`` if a server may write or read a checkpoint there: not empty, no ``..`` in it,
    and under ``root`` (the cluster's ``--checkpoint-root``) when one is set, once every
    symlink is resolved (a link inside the root to a folder outside it is outside); else
    CheckpointError."""
    if not url:
        raise CheckpointError("checkpoint URL '' is empty: refused (it would write at this server's filesystem "
                              "root); give a folder or URL, e.g. /data/ckpt or s3://bucket/ckpt")
    path = url.split("://", 1)[-1]
    if ".." in path.replace("\\", "/").split("/"):
        raise CheckpointError(f"checkpoint URL {url[:200]!r} has a '..' in it: refused; name the folder directly")
    if root:
        local = "://" not in url and "://" not in root
        here, top = (_real(url), _real(root)) if local else (url.rstrip("/"), root.rstrip("/"))
        if here != top and not here.startswith(top.rstrip("/") + "/"):
            real = f" (it resolves to {here!r} through a symlink)" if local and here != os.path.abspath(url) else ""
            raise CheckpointError(f"checkpoint URL {url[:200]!r}{real} is outside the cluster's checkpoint root "
                                  f"{root!r}: refused; write checkpoints under it (--checkpoint-root, "
                                  "PARAMSERVER_CHECKPOINT_ROOT), with no symlink out of it")
    return url


def entry_path(step: str, entry: Any, allow_unverified: bool = False) -> str:
    """The file of a manifest entry, refused unless it lies inside ``step`` (a relative
    path without '..'; a first-format absolute path must start with the step).  A
    first-format entry ``[path, keys]`` (no sha256 to check the file against) only with
    ``allow_unverified``: in any manifest, it would let an edited file through."""
    if not isinstance(entry, list) or len(entry) not in (2, 4) or not isinstance(entry[0], str):
        raise CheckpointError(f"{step}/{MANIFEST}: a file entry must be [path, keys, sha256, bytes], got "
                              f"{str(entry)[:200]}; restore another step")
    if len(entry) == 2 and not allow_unverified:
        raise CheckpointError(f"{step}/{MANIFEST} lists {entry[0][:200]!r} without its sha256 and size (a "
                              "first-format entry): the file cannot be verified, and unverified checkpoints are "
                              "refused; restore a step written by this version, or, if you trust this one, pass "
                              "allow_unverified=True (Client.restore) or --allow-unverified-checkpoint")
    path = entry[0]
    if len(entry) == 2:  # first format: absolute, under the step
        inside = path.startswith(step.rstrip("/") + "/") and ".." not in path.split("/")
    else:
        inside = not path.startswith("/") and "://" not in path and ".." not in path.split("/") and bool(path)
        path = f"{step.rstrip('/')}/{path}"
    if not inside:
        raise CheckpointError(f"{step}/{MANIFEST} names {entry[0]!r}, outside its step: refused; restore "
                              "another step")
    return path


def read_vnode(path: str, entry: list[Any] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Keys and rows of a vnode file, checked against its manifest ``entry`` (size and
    sha256 before it is parsed, never reading more than its size; then its key count)."""
    import fsspec

    expect_bytes = int(entry[3]) if entry is not None and len(entry) == 4 else None
    try:
        with fsspec.open(path, "rb") as f:
            if expect_bytes is None:  # a first-format entry: bounded by the file's own size (a device says 0)
                fs, inner = fsspec.core.url_to_fs(path)
                body = f.read(int(fs.size(inner) or 0) + 1)
            else:
                body = f.read(expect_bytes + 1)
        if expect_bytes is not None:
            if len(body) != expect_bytes:
                raise CheckpointError(f"checkpoint file {path} has {'more than ' if len(body) > expect_bytes else ''}"
                                      f"{len(body):,} bytes, the manifest says {expect_bytes:,}: it is damaged or "
                                      "was replaced; restore another step")
            if hashlib.sha256(body).hexdigest() != entry[2]:  # type: ignore[index]
                raise CheckpointError(f"checkpoint file {path} does not match the sha256 in the manifest: it was "
                                      "changed or comes from another step; restore another step")
        data = np.load(io.BytesIO(body))
        keys, rows = data["keys"], data["rows"]
    except CheckpointError:
        raise
    except (OSError, ValueError, KeyError, EOFError) as exc:
        raise CheckpointError(f"checkpoint file {path} cannot be read ({exc}); "
                              "the checkpoint is damaged: restore an earlier step") from None
    if entry is not None and keys.shape[:1] != (int(entry[1]),):
        raise CheckpointError(f"checkpoint file {path} holds {keys.shape[0] if keys.ndim else 0} keys, the manifest "
                              f"says {entry[1]}; restore another step")
    return keys, rows


def write_manifest(url: str, manifest: dict[str, Any]) -> None:
    """Write ``MANIFEST.json`` last and atomically: to a temporary name, then moved."""
    import fsspec

    fs, _, (root,) = fsspec.get_fs_token_paths(url)
    body = json.dumps({"format": FORMAT, "written_at": time.time(), **manifest}, indent=1).encode()
    tmp = f"{root}/{MANIFEST}.tmp"
    fs.makedirs(root, exist_ok=True)  # a step of empty tables has no vnode file that made it
    with fs.open(tmp, "wb") as f:
        f.write(body)
    fs.mv(tmp, f"{root}/{MANIFEST}")


def prune(url: str, keep: int) -> list[str]:
    """Remove all but the newest ``keep`` complete steps under ``url`` (``keep`` >= 1: the
    newest complete step always stays; a step still being written has no manifest and is
    never touched).  Returns the steps removed."""
    import fsspec

    fs, _, (root,) = fsspec.get_fs_token_paths(url)
    try:
        steps = sorted(p.rstrip("/") for p in fs.ls(root, detail=False) if fs.exists(f"{p}/{MANIFEST}"))
    except FileNotFoundError:
        return []
    needed = _bases(url, [p.rsplit("/", 1)[-1] for p in steps[-max(1, keep):]])
    removed = []
    for path in steps[:-max(1, keep)]:
        if path.rsplit("/", 1)[-1] in needed:
            continue
        try:
            fs.rm(path, recursive=True)
            removed.append(path)
        except OSError as exc:  # someone else's, or read-only: it stays
            logger.warning("could not remove the old checkpoint %s: %s", path, exc)
    return removed


def _bases(url: str, names: list[str]) -> set[str]:
    """The steps ``names`` (under ``url``) build on, themselves included (a step whose
    manifest cannot be read builds on nothing here)."""
    needed: set[str] = set()
    for name in names:
        try:
            needed.update(p.rstrip("/").rsplit("/", 1)[-1] for p, _ in step_chain(f"{url.rstrip('/')}/{name}", True))
        except CheckpointError:
            needed.add(name)
    return needed


def latest_step(url: str) -> str:
    """The newest complete step under ``url`` (one with a manifest)."""
    import fsspec

    fs, _, (root,) = fsspec.get_fs_token_paths(url)
    if not fs.exists(root):
        raise CheckpointError(f"no checkpoint at {url}")
    steps = sorted(p for p in fs.ls(root, detail=False) if fs.exists(f"{p}/{MANIFEST}"))
    if not steps:
        raise CheckpointError(f"no complete checkpoint under {url} (no step has a {MANIFEST}); "
                              "a checkpoint interrupted before its manifest is never used")
    latest: str = steps[-1]
    return url.rstrip("/") + "/" + latest.rstrip("/").rsplit("/", 1)[-1]


def resolve_step(url: str) -> str:
    """``url`` itself if it names a step (``<15 digits>``), else its newest complete step."""
    name = url.rstrip("/").rsplit("/", 1)[-1]
    return url if len(name) == 15 and name.isdigit() else latest_step(url)


def read_manifest(step: str, allow_unverified: bool = False) -> dict[str, Any]:
    """The manifest of ``step``, checked; a first-format one (no sha256 of its files, so an
    edited file would be restored unnoticed) only with ``allow_unverified``."""
    import fsspec

    path = f"{step.rstrip('/')}/{MANIFEST}"
    try:
        with fsspec.open(path, "rb") as f:
            manifest = json.loads(f.read())
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing: the checkpoint is incomplete and cannot be used") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is corrupt ({exc}); restore another step") from None
    if not isinstance(manifest, dict) or manifest.get("format") not in FORMATS or \
            not isinstance(manifest.get("tables"), dict) or not isinstance(manifest.get("files"), dict):
        raise CheckpointError(f"{path} is not a paramserver checkpoint manifest ({' or '.join(FORMATS)}); "
                              "restore another step")
    if manifest["format"] != FORMAT:
        if not allow_unverified:
            raise CheckpointError(f"{path} is a {manifest['format']} manifest: its files have no sha256, so an "
                                  "edited or swapped file cannot be detected, and unverified checkpoints are "
                                  "refused; restore a step written by this version, or, if you trust this one, "
                                  "pass allow_unverified=True (Client.restore) or --allow-unverified-checkpoint")
        logger.warning("%s was written by an older version (%s): its files have no checksums to verify; "
                       "restored unverified, as allow_unverified asks", step, manifest["format"])
    return manifest


def restore_tables(client: Any, url: str, allow_unverified: bool = False) -> dict[str, int]:
    """``Client.restore``: every file of the step (and, for an incremental step, of the
    steps it builds on) checked (``read_vnode``) before any table is created; then each
    table created with its whole spec and loaded by every server, step after step (an
    incremental step's rows set, its evicted keys dropped); a failure drops the tables
    this restore created.  A first-format step (no sha256 to check its files against)
    only with ``allow_unverified``."""
    from paramserver.tables.spec import TableSpec

    chain = step_chain(resolve_step(url), allow_unverified)
    for step, manifest in chain:  # every file checked before anything is created
        for name in manifest["tables"]:
            for entry in [*manifest["files"].get(name, {}).values(), *manifest.get("deleted", {}).get(name, [])]:
                read_vnode(entry_path(step, entry, allow_unverified), entry)
    existing = set(client.tables())  # never dropped by a failed restore
    restored: dict[str, int] = {}
    try:
        for name, wire in chain[-1][1]["tables"].items():
            spec = TableSpec.from_wire(wire)
            client.admin.create_table_spec(replace(spec, replicas=min(spec.replicas, len(client.admin.ring.servers))))
            restored[name] = 0
            for step, manifest in chain:
                if name in manifest["tables"]:
                    restored[name] = _load(client, name, step, manifest, allow_unverified)
        if len(chain) > 1:  # steps on a base: the keys held at the end, not the last step's
            stats = client.stats.server_stats()
            restored = {n: sum(int(s["tables"].get(n, {}).get("primary_keys", 0)) for s in stats) for n in restored}
    except BaseException:
        for name in set(restored) - existing:  # a failed restore leaves nothing: the tables it created go
            try:
                client.drop_table(name)
            except Exception as exc:  # reported, but the restore's own error is the one raised
                logger.error("could not drop %r after a failed restore: %s", name, exc)
        raise
    return restored


def _load(client: Any, name: str, step: str, manifest: dict[str, Any], allow_unverified: bool) -> int:
    """Have every server load table ``name``'s keys of one step (and drop the keys it
    evicted, for an incremental step); the keys loaded."""
    from paramserver.wire.message import Op

    entries = list(manifest["files"].get(name, {}).values())
    # the scheduler has every server of the ring load its keys, holding joins and
    # removals meanwhile, and loads again if a server dies (``scheduler/restores.py``)
    request: dict[str, Any] = {"op": Op.RESTORE.value, "table": name, "step": step, "entries": entries}
    if manifest.get("deleted", {}).get(name):
        request["deleted"] = manifest["deleted"][name]
    if allow_unverified:  # the servers refuse first-format entries unless told
        request["allow_unverified"] = True
    loaded = int(client._call(client.config.scheduler, request)["loaded"])
    expected = sum(int(entry[1]) for entry in entries)
    if loaded != expected:
        raise CheckpointError(f"restoring {name!r} from {step} loaded {loaded} keys, the manifest lists {expected}")
    return loaded
