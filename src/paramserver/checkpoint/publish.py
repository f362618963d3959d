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
be made (the cluster's servers changed); the chain before it is then removed.  Each
part's sha256 is in the index and checked when it is read.
"""

from __future__ import annotations

import hashlib
import io
import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from paramserver.errors import CheckpointError

INDEX = "PUBLISH.json"
FORMAT = "paramserver-publish-1"

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
    return index


def _write_index(url: str, index: dict[str, Any]) -> None:
    fs, root = _fs(url)
    body = json.dumps({**index, "format": FORMAT, "written_at": time.time()}, indent=1).encode()
    with fs.open(f"{root}/{INDEX}.tmp", "wb") as f:
        f.write(body)
    fs.mv(f"{root}/{INDEX}.tmp", f"{root}/{INDEX}")


def _digest(fs: Any, path: str) -> str:
    with fs.open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


class Publisher:
    """Publishes one table under ``url``: ``publish(delta)`` with what ``export_delta``
    returned (``Client.export_delta``), ``write_base`` writing a whole model folder."""

    def __init__(self, url: str, table: str, write_base: WriteBase) -> None:
        self.url, self.table, self.write_base = url.rstrip("/"), table, write_base
        index = read_index(url)
        if index is not None and index.get("table") != table:
            raise CheckpointError(f"{url} publishes table {index.get('table')!r}, not {table!r}: publish "
                                  "elsewhere, or empty it")
        self.index: dict[str, Any] = index or {"table": table, "parts": [], "token": None, "seq": 0}

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
            entry = {"seq": seq, "kind": "base", "path": path, "keys": int(delta.keys.size),
                     "sha256": _digest(fs, f"{root}/{path}/table.npz")}
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
            entry = {"seq": seq, "kind": "delta", "path": path, "keys": int(delta.keys.size),
                     "deleted": int(delta.deleted.size), "bytes": len(body),
                     "sha256": hashlib.sha256(body).hexdigest()}
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
    """A base folder's table spec (``table.json``, or a model's ``model.json``), keys and values."""
    fs, root = _fs(url)
    meta_file = f"{root}/table.json" if fs.exists(f"{root}/table.json") else f"{root}/model.json"
    try:
        with fs.open(meta_file, "rb") as f:
            meta = json.loads(f.read())
        with fs.open(f"{root}/table.npz", "rb") as f:
            arrays = np.load(io.BytesIO(f.read()))
        return meta, arrays["keys"], arrays["values"], arrays["dense"] if "dense" in arrays.files else None
    except (OSError, ValueError, KeyError) as exc:
        raise CheckpointError(f"{url}: the published table is damaged or missing ({exc})") from None


def load_table(url: str) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    """A table published under ``url`` (``paramserver export``, ``train --publish``): its
    spec (as ``TableSpec.to_wire``), keys and values, the deltas applied in order."""
    meta, keys, values, _ = read_chain(url, read_table_folder)
    return meta["table"], keys, values


def read_chain(url: str, read_base: Callable[[str], tuple[Any, np.ndarray, np.ndarray, np.ndarray | None]]
               ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray | None]:
    """The model published under ``url``: its base (``read_base`` of the base folder:
    meta, keys, values, MLP) with every delta of the chain applied in order."""
    index = read_index(url)
    if index is None or not index["parts"]:
        raise CheckpointError(f"nothing is published under {url} (no {INDEX})")
    fs, root = _fs(url)
    base, *deltas = index["parts"]
    if _digest(fs, f"{root}/{base['path']}/table.npz") != base["sha256"]:
        raise CheckpointError(f"{url}/{base['path']}/table.npz does not match its sha256 in {INDEX}: damaged")
    meta, keys, values, dense = read_base(f"{url.rstrip('/')}/{base['path']}")
    for part in deltas:
        with fs.open(f"{root}/{part['path']}/delta.npz", "rb") as f:
            body = f.read()
        if hashlib.sha256(body).hexdigest() != part["sha256"]:
            raise CheckpointError(f"{url}/{part['path']}/delta.npz does not match its sha256 in {INDEX}: damaged")
        d = np.load(io.BytesIO(body))
        keys, values = apply_delta(keys, values, d["keys"], d["values"], d["deleted"])
        dense = d["dense"] if "dense" in d.files else dense
    return meta, keys, values, dense


def apply_delta(keys: np.ndarray, values: np.ndarray, set_keys: np.ndarray, set_values: np.ndarray,
                deleted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``keys``/``values`` with ``deleted`` dropped and ``set_keys`` set (added or replaced)."""
    gone = np.isin(keys, np.concatenate([deleted.astype(np.uint64), set_keys.astype(np.uint64)]))
    return (np.concatenate([keys[~gone], set_keys]),
            np.concatenate([values[~gone], set_values.reshape(-1, values.shape[1])]))
