"""Saved models and the files a job writes: checked before the job, written through fsspec.

A saved model is a folder (a local path or any fsspec URL: ``s3://``, ``gs://``,
``memory://``) holding

    table.npz      keys (uint64) and values (float32 [n, dim]); a deep model's MLP as
                   ``dense`` (float32, flat)
    model.json     model, table spec, data format; written last, so a folder that has
                   it is whole

``predict`` and ``eval`` load it into a ``VnodeTable`` in this process and need no
cluster.  Every output a command will write (``--save``, ``--metrics-out``, ``--out``,
``--checkpoint-dir``) is checked with ``check_output`` *before* the work starts, so that a
bad path costs a second, not a trained model.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import zipfile
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

import numpy as np
from numba import njit

from paramserver.apps.ctr.deep import DENSE_BLOCK
from paramserver.apps.ctr.models import Model, auc, logloss
from paramserver.checkpoint.publish import INDEX as PUBLISHED
from paramserver.checkpoint.publish import read_chain
from paramserver.data.batch import STDIN
from paramserver.data.files import check_output, filesystem, write_text
from paramserver.data.parse import feature_key
from paramserver.data.reader import (
    Batch,
    DataError,
    DataFormat,
    Shard,
    check_inputs,
    expand,
    read_all,
    read_batches,
    sniff_unlabeled,
)
from paramserver.errors import DIVERGED, ConfigError
from paramserver.store.table import VnodeTable
from paramserver.tables.optim import SGD, Initializer
from paramserver.tables.spec import TableSpec

if TYPE_CHECKING:
    from paramserver.client.client import Client

#: what model.json's "format" says of a --save folder this version writes and reads
FORMAT = "paramserver-model-1"


def save_model(url: str, model: Model, data: DataFormat, spec: TableSpec, keys: np.ndarray,
               values: np.ndarray, dense: np.ndarray | None = None) -> None:
    fs, path = filesystem(url, "--save")
    fs.makedirs(path, exist_ok=True)
    buf = io.BytesIO()
    arrays: dict[str, Any] = {"keys": keys, "values": values} | ({} if dense is None else {"dense": dense})
    np.savez(buf, **arrays)
    with fs.open(f"{path.rstrip('/')}/table.npz", "wb") as f:
        f.write(buf.getbuffer())
    meta = {"format": FORMAT, **model_meta(model, data), "table": spec.to_wire()}
    write_text(f"{url.rstrip('/')}/model.json", json.dumps(meta, indent=1))  # last: a model folder is whole


def model_meta(model: Model, data: DataFormat) -> dict[str, Any]:
    """What predict and eval need besides the table: the model and the data format."""
    reading = {"skip_bad": False, "cache_dir": "", "changed_files": "fail"}  # how a job read, not what a model is
    return {"model": asdict(model), "data": asdict(data) | reading}


def dense_vector(model: Model, keys: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """A deep model's MLP, flat, from its table's keys and rows (in any order)."""
    if model.deep is None:
        raise ValueError(f"a {model.name} model has no dense part")
    keys = np.asarray(keys, np.uint64)
    ours = np.flatnonzero(keys < np.uint64(model.dense_rows))  # a dense layout may list its whole key space
    order = ours[np.argsort(keys[ours], kind="stable")]
    if not np.array_equal(keys[order], np.arange(model.dense_rows, dtype=np.uint64)):
        raise DataError(f"the {model.name} model's MLP table has {order.size} of its {model.dense_rows} row(s) "
                        f"(--hidden {','.join(map(str, model.hidden))}, width {model.k}): the model files are "
                        "damaged")
    return np.ascontiguousarray(rows[order][:, :DENSE_BLOCK], np.float32).reshape(-1)[:model.deep.mlp.size]


def pull_dense(client: Client, model: Model) -> np.ndarray | None:
    """A deep model's MLP, flat, pulled from the cluster (``None`` for lr and fm): what a saved
    model (``train``) and a published one (``publishing``) both carry."""
    if model.deep is None:
        return None
    keys = np.arange(model.dense_rows, dtype=np.uint64)
    return dense_vector(model, keys, client.pull(model.dense_table, keys).result(timeout=600))


def _read_saved(url: str) -> tuple[dict[str, Any], np.ndarray, np.ndarray, np.ndarray | None]:
    """A model folder (``--save``): its meta, keys, values and a deep model's MLP."""
    fs, path = filesystem(url, "--model")
    try:
        with fs.open(f"{path.rstrip('/')}/model.json", "r") as f:
            meta = json.load(f)
        with fs.open(f"{path.rstrip('/')}/table.npz", "rb") as f:
            arrays = np.load(io.BytesIO(f.read()))
        return meta, arrays["keys"], arrays["values"], arrays["dense"] if "dense" in arrays.files else None
    except FileNotFoundError as exc:
        raise DataError(f"{url} is not a saved model ({exc.filename or exc} is missing); "
                        "save one with paramserver train --save DIR") from None
    except NotADirectoryError:
        raise DataError(f"{url} is a file, not a saved model: --model takes the folder paramserver train --save "
                        "DIR wrote (model.json and table.npz)") from None
    except (ValueError, KeyError, OSError, EOFError, zipfile.BadZipFile) as exc:  # a truncated table.npz: BadZipFile
        raise DataError(f"{url}: the model files are damaged ({exc}); save the model again") from None


def _from_checkpoint(url: str, allow_unverified: bool = False) -> tuple[dict[str, Any], np.ndarray, np.ndarray,
                                                                         np.ndarray | None]:
    """A training checkpoint (a folder of steps, or one step) as a saved model: its meta,
    the model table's keys and rows and a deep model's MLP (every file checked against its
    manifest; a first-format one, with no hashes, only with ``allow_unverified``)."""
    from paramserver.checkpoint import store as ckpt

    step = ckpt.resolve_step(url)
    manifest = ckpt.read_manifest(step, allow_unverified)
    meta = manifest.get("train")
    if not isinstance(meta, dict):
        raise DataError(f"{step} was not written by paramserver train --checkpoint-dir (no model or data "
                        "format in its manifest); restore it with Client.restore")
    model = Model(**meta["model"])

    def table(name: str) -> tuple[np.ndarray, np.ndarray]:
        parts = [ckpt.read_vnode(ckpt.entry_path(step, e, allow_unverified), e)
                 for e in manifest["files"].get(name, {}).values()]
        keys = np.concatenate([k for k, _ in parts]) if parts else np.zeros(0, np.uint64)
        return keys, np.concatenate([r for _, r in parts]) if parts else np.zeros((0, 1), np.float32)

    dense = None if model.deep is None else dense_vector(model, *table(model.dense_table))
    return {**meta, "table": manifest["tables"][model.table]}, *table(model.table), dense


@njit(nogil=True, cache=True)
def _feature_keys(indices, mask):  # type: ignore[no-untyped-def]
    out = np.empty(indices.shape[0], np.uint64)
    for i in range(indices.shape[0]):
        out[i] = feature_key(1, indices[i], mask)
    return out


def rows_to_batch(X: Any, hash_bits: int) -> Batch:
    """A dense or scipy sparse ``X`` as a ``Batch`` of LIBSVM features (column j -> index j+1),
    a bias key first, as the LIBSVM reader makes them."""
    import scipy.sparse as sp  # scikit-learn's dependency: only a matrix input needs it

    csr = sp.csr_matrix(X, dtype=np.float32)
    csr.eliminate_zeros()
    mask = np.uint64(0 if hash_bits in (0, 64) else (1 << hash_bits) - 1)
    indptr = np.concatenate([[0], np.cumsum(np.diff(csr.indptr) + 1)]).astype(np.int64)
    keys = np.empty(indptr[-1], np.uint64)
    vals = np.ones(indptr[-1], np.float32)
    first = np.zeros(indptr[-1], bool)
    first[indptr[:-1]] = True
    keys[first] = feature_key(0, np.uint64(0), mask)
    keys[~first] = _feature_keys(csr.indices.astype(np.uint64) + np.uint64(1), mask)
    vals[~first] = csr.data
    return Batch(np.zeros(csr.shape[0], np.float32), indptr, keys, vals)


class LocalModel:
    """A saved model (or a training checkpoint), loaded in this process (no cluster):
    ``paramserver.load_model(path)``.

    ``predict_proba(X)``: X is a file or a list of files (in the model's data format, labels
    optional), a ``Batch``, or, for a LIBSVM model, a dense or scipy sparse matrix whose
    column j is feature j + 1.  ``predict(X)``: 0/1 at probability 0.5.  ``proba(batch)``: the
probabilities of a parsed ``Batch``."""

    def __init__(self, url: str, allow_unverified: bool = False):
        self.url = url
        fs, path = filesystem(url, "--model")
        if fs.exists(f"{path.rstrip('/')}/{PUBLISHED}"):  # a base and its deltas (train --publish)
            self._load(*read_chain(url))
            return
        if not fs.exists(f"{path.rstrip('/')}/model.json"):  # a training checkpoint, maybe
            from paramserver.checkpoint.store import MANIFEST
            if fs.exists(f"{path.rstrip('/')}/{MANIFEST}") or any(
                    fs.exists(f"{p.rstrip('/')}/{MANIFEST}") for p in (fs.ls(path, detail=False)
                                                                       if fs.isdir(path) else [])):
                self._load(*_from_checkpoint(url, allow_unverified))
                return
        self._load(*_read_saved(url), saved=True)

    def _load(self, meta: dict[str, Any], keys: np.ndarray, values: np.ndarray, dense: np.ndarray | None,
              saved: bool = False) -> None:
        """The model from its meta and arrays; ``saved``: a ``--save`` folder's, whose rows
        are the weights alone (a checkpoint's carry the optimiser's state after them)."""
        if saved and meta.get("format", FORMAT) != FORMAT:
            raise DataError(f"{self.url}: its model.json says format {meta.get('format')!r}, and this paramserver "
                            f"reads {FORMAT!r}; load it with the version that saved it, or save the model again")
        try:
            self._read_meta(meta)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:  # a model.json of another shape
            raise DataError(f"{self.url}: its model.json is not one train --save writes ({type(exc).__name__}: "
                            f"{exc}): the model files are damaged; save the model again") from None
        if self.model.deep is not None and (dense is None or dense.size != self.model.deep.mlp.size):
            raise DataError(f"the {self.model.name} model's MLP is missing or has the wrong size "
                            f"({None if dense is None else dense.size} values, {self.model.deep.mlp.size} expected): "
                            "the model files are damaged; save the model again")
        self.dense = dense
        self.features, self.unseen = 0, 0  # features scored, and of them the model never saw (proba)
        spec = self.spec
        if (keys.ndim != 1 or values.ndim != 2 or values.shape[0] != keys.shape[0] or values.shape[1] < spec.dim
                or (saved and values.shape[1] != spec.dim)):
            raise DataError(f"{self.url}: the model's table.npz holds {keys.shape} keys and {values.shape} values for "
                            f"rows of {spec.dim} (its model.json's {self.model.name}): the model files are damaged or "
                            "of two models; save the model again")
        for what, array in (("table", values[:, :spec.dim]), ("MLP", dense)):
            if array is not None and not (finite := np.isfinite(array)).all():
                raise DataError(f"{self.url}: the model's {what} holds {int(finite.size - finite.sum()):,} NaN or "
                                f"infinite weights: its files are damaged, or {DIVERGED}; train or save it again")
        self.table = VnodeTable(spec.dim, SGD(), Initializer.parse(spec.initializer), spec.seed)
        self.table.load(keys, np.ascontiguousarray(values[:, :spec.dim]))  # a checkpoint's rows carry state too

    def _read_meta(self, meta: dict[str, Any]) -> None:
        """The model, its data format and its table's spec, as ``model.json`` says them."""
        self.model = Model(**meta["model"])
        self.data = DataFormat(**meta["data"])
        self.spec = TableSpec.from_wire(meta["table"])

    def scoring_format(self, skip_bad: bool = False, overrides: dict[str, Any] | None = None) -> DataFormat:
        """How predict and eval read data for this model: its training data's format, with
        ``overrides`` (``--format``, ``--label-format``) over it.  A CSV override needs the
        label column a CSV or Avazu model names; another model's has none to give."""
        fmt = DataFormat(**(asdict(self.data) | {"skip_bad": skip_bad} | (overrides or {})))
        if fmt.name == "csv" and not fmt.label_column:
            raise ConfigError(f"--format csv: the model was trained on {self.data.name} rows, which name no label "
                              "column, and a CSV's features are its columns' names and values; score rows of the "
                              "format it was trained on")
        return fmt

    @property
    def unseen_share(self) -> float:
        """The share of the features scored so far that the model never saw in training
        (their weights are the initial ones): near 1, the data is not what it learned from."""
        return self.unseen / self.features if self.features else 0.0

    def predict_proba(self, X: Any) -> np.ndarray:
        """The probability of label 1 for every row of ``X`` (see the class)."""
        if isinstance(X, Batch):
            return self.proba(X)
        if isinstance(X, (str, os.PathLike)) or (isinstance(X, (list, tuple)) and X and isinstance(X[0], str)):
            files = [os.fspath(X)] if isinstance(X, (str, os.PathLike)) else list(X)
            parts = [self.proba(b) for f in expand(files)
                     for b in read_batches(Shard(f, 0, -1), replace(self.data, unlabeled=sniff_unlabeled(f, self.data)),
                                           1 << 16)]
            return np.concatenate(parts) if parts else np.zeros(0)
        if self.data.name != "libsvm":
            raise DataError(f"this model reads {self.data.name} rows: pass files (or a Batch), not a matrix; a "
                            "matrix's columns are LIBSVM features")
        return self.proba(rows_to_batch(X, self.data.hash_bits))

    def predict(self, X: Any) -> np.ndarray:
        """0/1 for every row of ``X``: probability above 0.5."""
        return (self.predict_proba(X) > 0.5).astype(np.int8)

    def proba(self, batch: Batch) -> np.ndarray:
        """Probabilities of a parsed ``Batch`` (its features the model never saw are
        counted: ``unseen_share``)."""
        uniq, inverse = batch.unique()
        rows = np.empty((uniq.shape[0], self.model.dim), np.float32)
        self.table.lookup(uniq, rows)
        self.features += int(inverse.shape[0])
        self.unseen += int((~self.table.stored(uniq))[inverse].sum())
        return self.model.predict(batch, inverse, rows, self.dense)


def load_model(path: str, allow_unverified: bool = False) -> LocalModel:
    """A model saved by ``paramserver train --save DIR``, published by ``--publish URL``
    (its base and deltas, applied in order) or a training checkpoint, to score with
    ``predict_proba``; no cluster needed (``allow_unverified``: a checkpoint of
    the first format, whose files have no hashes, is read anyway)."""
    return LocalModel(path, allow_unverified)


def metrics(labels: np.ndarray, preds: np.ndarray) -> dict[str, float]:
    return {"logloss": logloss(labels, preds), "auc": auc(labels, preds), "examples": int(labels.size)}


def predict_file(model_dir: str, data: list[str], out: str, skip_bad: bool = False,
                 overrides: dict[str, Any] | None = None, allow_unverified: bool = False,
                 seen: dict[str, Any] | None = None) -> int:
    """Write one probability a line for every line of ``data`` (labelled or not) to ``out``
    (``-``: standard output); the lines written.  ``seen`` gets ``unseen_feature_share``:
    the share of the rows' features the model never saw in training."""
    if out != STDIN:
        check_output(out, "--out", folder=False)
    model = LocalModel(model_dir, allow_unverified)
    fmt = model.scoring_format(skip_bad, overrides)
    files = check_inputs(data)
    with contextlib.ExitStack() as stack:
        if out == STDIN:
            f: Any = sys.stdout
        else:
            fs, path = filesystem(out, "--out")
            f = stack.enter_context(fs.open(path, "w"))
        n = _write_predictions(model, fmt, files, f)
    if n == 0:
        raise DataError(f"no examples in {', '.join(data)}")
    if seen is not None:
        seen["unseen_feature_share"] = model.unseen_share
    return n


def _write_predictions(model: LocalModel, fmt: DataFormat, files: list[str], f: Any) -> int:
    n = 0
    for file in files:
        file_fmt = replace(fmt, unlabeled=sniff_unlabeled(file, fmt))  # test files often have no label
        for batch in read_batches(Shard(file, 0, -1), file_fmt, 1 << 16):
            np.savetxt(f, model.proba(batch), fmt="%.6f")
            n += len(batch)
    return n


def evaluate(model_dir: str, data: list[str], skip_bad: bool = False,
             overrides: dict[str, Any] | None = None, allow_unverified: bool = False) -> dict[str, float]:
    """Log loss and AUC of the saved model on labelled ``data``."""
    model = LocalModel(model_dir, allow_unverified)
    fmt = model.scoring_format(skip_bad, overrides)
    stats: dict[str, Any] = {}
    batch = read_all(data, fmt, stats=stats)
    report = metrics(batch.labels, model.proba(batch))
    return report | {"unseen_feature_share": model.unseen_share, "bad_lines": int(stats.get("bad_lines", 0))}
