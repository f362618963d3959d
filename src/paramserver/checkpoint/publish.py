"""A published model: a base and the deltas after it, under one URL, for serving while
training goes on (``paramserver train --publish URL``, ``paramserver export --delta``),
read back by ``paramserver.load_model(URL)``.

Layout under the URL (a local path or any fsspec URL):

    <url>/PUBLISH.json           the chain: written last after each part, atomically
    <url>/<seq>-base/            a whole model (``table.npz`` and ``model.json``, as --save)
    <url>/<seq>-delta/delta.npz  keys, values (set them), deleted (drop them; applied first)

``PUBLISH.json`` lists the current chain (its base, then its deltas in order) with the
token to export the next delta from, and the table's name.  A part is written whole
before the index names it, so a reader never sees half a delta: it reads the index, then
the parts it names.  A new base is published when the deltas since the last one add up
to its keys (loading stays at most about twice a base's work), or when a delta could not
be made (the cluster's servers changed); the chain before it is then removed.

A publication is verified as a whole: every file of every part (a base's ``model.json``
or ``table.json`` as well as its ``table.npz``) has its sha256 in the index (``files``),
checked when it is read, from the very bytes then parsed.  A part's path is one plain
name inside the folder (no ``/``, no ``..``), the first part is a base and the sequence
numbers go up along the chain; an index that breaks any of these is refused whole.
(Indexes written before ``files`` existed name only ``table.npz``/``delta.npz`` by their
``sha256``: those are checked, and nothing else can be.)
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from paramserver.errors import CheckpointError

INDEX = "PUBLISH.json"
FORMAT = "paramserver-publish-1"
_PART_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")  # one plain name: no separator, never '.' or '..'
_MAIN_FILE = {"base": "table.npz", "delta": "delta.npz"}

#: writes a whole model (keys, values, a deep model's MLP or None) into a folder URL
WriteBase = Callable[[str, np.ndarray, np.ndarray, "np.ndarray | None"], None]


def _fs(url: str) -> tuple[Any, str]:
    import fsspec

    fs, _, (root,) = fsspec.get_fs_token_paths(url)
    return fs, root.rstrip("/")


def read_index(url: str) -> dict[str, Any] | None:
    """The chain published under ``url`` (None: nothing is)."""
    fs, root = _fs(url)
    if not fs.exists(f"{root}/{INDEX}"):
        return None
    try:
        with fs.open(f"{root}/{INDEX}", "rb") as f:
            index = json.loads(f.read())
    except (ValueError, OSError) as exc:
        raise CheckpointError(f"{url}/{INDEX} is damaged ({exc}): publish a new base there") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT or not isinstance(index.get("parts"), list):
        raise CheckpointError(f"{url}/{INDEX} is not a {FORMAT} index: was it written by paramserver train "
                              "--publish?")
    check_chain(url, index["parts"])
    return index


def check_chain(url: str, parts: list[Any]) -> None:
    """``CheckpointError`` naming the first part of an index's chain that is not well formed:
    a dict with a plain ``path`` inside the folder, a ``kind``, a ``seq`` above the one before
    and the sha256 of its files; a base first, deltas after it."""
    last = 0
    for i, part in enumerate(parts):
        where = f"{url}/{INDEX}: part {i + 1}"
        if not isinstance(part, dict):
            raise CheckpointError(f"{where} is {str(part)[:80]!r}, not an entry: the index is damaged")
        path, kind, seq = part.get("path"), part.get("kind"), part.get("seq")
        if not isinstance(path, str) or not _PART_NAME.fullmatch(path) or ".." in path:
            raise CheckpointError(f"{where} has the path {str(path)[:200]!r}; a part is one plain name inside the "
                                  f"published folder (no '/', no '..'): the index was altered, refusing it")
        if kind != ("base" if i == 0 else "delta"):
            raise CheckpointError(f"{where} ({path}) is a {kind!r}; a chain is a base, then deltas: the index is "
                                  "damaged")
        if isinstance(seq, bool) or not isinstance(seq, int) or seq <= last:
            raise CheckpointError(f"{where} ({path}) has seq {seq!r}, not a whole number above the part before "
                                  f"it ({last}): the index is damaged")
        files = part_files(part)
        if not all(isinstance(k, str) and _PART_NAME.fullmatch(k) and ".." not in k and isinstance(v, str)
                   for k, v in files.items()) or _MAIN_FILE[kind] not in files:
            raise CheckpointError(f"{where} ({path}) names its files as {str(files)[:200]!r}: each a plain name "
                                  f"with its sha256, {_MAIN_FILE[kind]} among them; the index was altered")
        last = seq


def part_files(part: dict[str, Any]) -> dict[str, Any]:
    """The files of a part with their sha256 (an older index's: its main file alone)."""
    files = part.get("files")
    if isinstance(files, dict):
        return files
    return {_MAIN_FILE.get(str(part.get("kind")), "table.npz"): part.get("sha256")}


def read_part(url: str, part: dict[str, Any]) -> dict[str, bytes]:
    """Every file of ``part`` (of the chain published under ``url``), read and checked
    against its sha256: a damaged, missing or swapped file is a ``CheckpointError`` that
    names it.  Parse these bytes, not the files again."""
    fs, root = _fs(url)
    out: dict[str, bytes] = {}
    for name, digest in part_files(part).items():
        path = f"{root}/{part['path']}/{name}"
        try:
            with fs.open(path, "rb") as f:
                body: bytes = f.read()
        except FileNotFoundError:
            raise CheckpointError(f"{url}/{part['path']}/{name} is missing (the chain was replaced, or a copy is "
                                  "partial)") from None
        except OSError as exc:
            raise CheckpointError(f"{url}/{part['path']}/{name} cannot be read ({exc})") from None
        if hashlib.sha256(body).hexdigest() != digest:
            raise CheckpointError(f"{url}/{part['path']}/{name} does not match its sha256 in {INDEX}: damaged, "
                                  "half written or altered")
        out[name] = body
    if part.get("kind") == "base" and not isinstance(part.get("files"), dict):  # an older index: meta unhashed
        meta = "table.json" if fs.exists(f"{root}/{part['path']}/table.json") else "model.json"
        try:
            with fs.open(f"{root}/{part['path']}/{meta}", "rb") as f:
                out[meta] = f.read()
        except OSError as exc:
            raise CheckpointError(f"{url}/{part['path']}/{meta} cannot be read ({exc})") from None
    return out


def _write_index(url: str, index: dict[str, Any]) -> None:
    fs, root = _fs(url)
    body = json.dumps({**index, "format": FORMAT, "written_at": time.time()}, indent=1).encode()
    with fs.open(f"{root}/{INDEX}.tmp", "wb") as f:
        f.write(body)
    fs.mv(f"{root}/{INDEX}.tmp", f"{root}/{INDEX}")


def _digests(fs: Any, folder: str) -> dict[str, str]:
    """The sha256 of every file in ``folder`` (a base just written), by name."""
    out = {}
    for path in sorted(fs.find(folder)):
        with fs.open(path, "rb") as f:
            out[path.rstrip("/").rsplit("/", 1)[-1]] = hashlib.sha256(f.read()).hexdigest()
    return out


class Publisher:
    """Publishes one table under ``url``: ``publish(delta)`` with what ``export_delta``
    returned (``Client.export_delta``), ``write_base`` writing a whole model folder.
    ``fresh``: the cluster is not the one whose token the folder holds (a new training
    job): its first part is a base, whatever the token says."""

    def __init__(self, url: str, table: str, write_base: WriteBase, fresh: bool = False) -> None:
        self.url, self.table, self.write_base = url.rstrip("/"), table, write_base
        index = read_index(url)
        if index is not None and index.get("table") != table:
            raise CheckpointError(f"{url} publishes table {index.get('table')!r}, not {table!r}: publish "
                                  "elsewhere, or empty it")
        self.index: dict[str, Any] = index or {"table": table, "parts": [], "token": None, "seq": 0}
        if fresh:
            self.index["token"] = None

    @property
    def token(self) -> str | None:
        """What to export the next delta from (None: a base is due)."""
        token: str | None = self.index.get("token")
        return token

    def publish(self, delta: Any, dense: np.ndarray | None = None) -> dict[str, Any]:
        """Write ``delta`` (a base when ``delta.base``, or when the deltas outgrew the base)
        and name it in the index; the part's entry."""
        fs, root = _fs(self.url)
        seq = int(self.index["seq"]) + 1
        parts = self.index["parts"]
        if delta.base:
            path = f"{seq:08d}-base"
            self.write_base(f"{self.url}/{path}", delta.keys, delta.values, dense)
            files = _digests(fs, f"{root}/{path}")
            entry = {"seq": seq, "kind": "base", "path": path, "keys": int(delta.keys.size),
                     "sha256": files["table.npz"], "files": files}
            old, parts = parts, [entry]
        else:
            path = f"{seq:08d}-delta"
            buf = io.BytesIO()
            arrays: dict[str, Any] = {"keys": delta.keys, "values": delta.values, "deleted": delta.deleted}
            if dense is not None:
                arrays["dense"] = dense
            np.savez(buf, **arrays)
            body = buf.getvalue()
            fs.makedirs(f"{root}/{path}", exist_ok=True)
            with fs.open(f"{root}/{path}/delta.npz", "wb") as f:
                f.write(body)
            digest = hashlib.sha256(body).hexdigest()
            entry = {"seq": seq, "kind": "delta", "path": path, "keys": int(delta.keys.size),
                     "deleted": int(delta.deleted.size), "bytes": len(body), "sha256": digest,
                     "files": {"delta.npz": digest}}
            old, parts = [], [*parts, entry]
        base_keys = parts[0]["keys"]
        since_base = sum(p["keys"] + p.get("deleted", 0) for p in parts[1:])
        self.index = {**self.index, "seq": seq, "parts": parts, "at": time.time(),
                      "token": None if since_base > max(base_keys, 1) else (delta.token or None)}
        _write_index(self.url, self.index)
        for part in old:  # the chain before the new base: nobody reads it any more
            fs.rm(f"{root}/{part['path']}", recursive=True)
        return entry


def write_table(url: str, spec: dict[str, Any], keys: np.ndarray, values: np.ndarray) -> None:
    """A base of any table (``paramserver export``): ``table.npz`` (keys, values) and
    ``table.json`` (its spec), the latter last."""
    fs, root = _fs(url)
    fs.makedirs(root, exist_ok=True)
    buf = io.BytesIO()
    np.savez(buf, keys=keys, values=values)
    with fs.open(f"{root}/table.npz", "wb") as f:
        f.write(buf.getvalue())
    with fs.open(f"{root}/table.json", "w") as f:
        f.write(json.dumps({"format": "paramserver-table-1", "table": spec}, indent=1))


def read_table_folder(url: str) -> tuple[dict[str, Any], np.ndarray, np.ndarray, np.ndarray | None]:
    """A base folder's table spec (``table.json``, or a model's ``model.json``), keys and
    values, read as they are (``read_part`` checks them against an index)."""
    fs, root = _fs(url)
    meta_file = "table.json" if fs.exists(f"{root}/table.json") else "model.json"
    files = {}
    for name in (meta_file, "table.npz"):
        try:
            with fs.open(f"{root}/{name}", "rb") as f:
                files[name] = f.read()
        except OSError as exc:
            raise CheckpointError(f"{url}: the published table is damaged or missing ({exc})") from None
    return parse_base(url, files)


def parse_base(url: str, files: dict[str, bytes]) -> tuple[dict[str, Any], np.ndarray, np.ndarray,
                                                              np.ndarray | None]:
    """A base's meta (its ``table.json`` or ``model.json``), keys, values and a deep model's
    MLP, from its files' bytes."""
    meta_file = "table.json" if "table.json" in files else "model.json"
    try:
        meta = json.loads(files[meta_file])
        arrays = np.load(io.BytesIO(files["table.npz"]))
        return meta, arrays["keys"], arrays["values"], arrays["dense"] if "dense" in arrays.files else None
    except (OSError, ValueError, KeyError) as exc:
        raise CheckpointError(f"{url}: the published table is damaged or missing ({exc})") from None


def parse_delta(url: str, files: dict[str, bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                               np.ndarray | None]:
    """A delta's keys, values, deleted keys and a deep model's MLP, from its files' bytes."""
    try:
        d = np.load(io.BytesIO(files["delta.npz"]))
        return d["keys"], d["values"], d["deleted"], d["dense"] if "dense" in d.files else None
    except (OSError, ValueError, KeyError) as exc:
        raise CheckpointError(f"{url}/delta.npz is damaged ({exc})") from None


def load_table(url: str) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    """A table published under ``url`` (``paramserver export``, ``train --publish``): its
    spec (as ``TableSpec.to_wire``), keys and values, the deltas applied in order."""
    meta, keys, values, _ = read_chain(url)
    return meta["table"], keys, values


def read_chain(url: str) -> tuple[dict[str, Any], np.ndarray, np.ndarray, np.ndarray | None]:
    """The model or table published under ``url``: its base's meta, keys, values and MLP,
    with every delta of the chain applied in order, every file checked (``read_part``)."""
    index = read_index(url)
    if index is None or not index["parts"]:
        raise CheckpointError(f"nothing is published under {url} (no {INDEX})")
    base, *deltas = index["parts"]
    url = url.rstrip("/")
    meta, keys, values, dense = parse_base(f"{url}/{base['path']}", read_part(url, base))
    for part in deltas:
        set_keys, set_values, deleted, delta_dense = parse_delta(f"{url}/{part['path']}", read_part(url, part))
        keys, values = apply_delta(keys, values, set_keys, set_values, deleted)
        dense = delta_dense if delta_dense is not None else dense
    return meta, keys, values, dense


def apply_delta(keys: np.ndarray, values: np.ndarray, set_keys: np.ndarray, set_values: np.ndarray,
                deleted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``keys``/``values`` with ``deleted`` dropped and ``set_keys`` set (added or replaced)."""
    gone = np.isin(keys, np.concatenate([deleted.astype(np.uint64), set_keys.astype(np.uint64)]))
    return (np.concatenate([keys[~gone], set_keys]),
            np.concatenate([values[~gone], set_values.reshape(-1, values.shape[1])]))
