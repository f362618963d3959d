"""Level 3 of the source documents: vertical (feature-partitioned) training of logistic
regression, where no process ever holds a whole example.

``split_columns`` cuts a LIBSVM file into P column files by feature hash: block p keeps,
of every line, the label and the features whose hash falls in p (every block has every
line, in order; a line can be left with its label alone), in one numba pass a piece of
the file (``_split``).  Worker p of a
``--feature-partition P`` job then reads block p only, and for each mini-batch:

1. pulls the weights of its features and computes its partial margins ``X_p w_p``;
2. adds them, one key per example, to a margins table on the servers (push ``add``);
3. waits at the barrier for the other blocks' partial margins;
4. pulls the examples' full margins ``Σ_p X_p w_p``, and pushes the logistic gradient of
   its own features, which no other worker touches.

The bias is block 0's (the reader gives every example a bias key: the other blocks
zero it).  The margins of every batch have keys of their own (an example counter), so a
batch never waits for the previous one's to be cleared; that table grows by 24 bytes an
example a pass.  Test examples are scored the same way, and only their margins, never
their features, meet in one place.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import fsspec
import numpy as np
from numba import njit

from paramserver.data.files import reading
from paramserver.data.parse import BAD_INDEX, LINE_END, NL, NOT_PAIR, QID, SPACE, next_pair, parse_float, svm_line
from paramserver.data.reader import BOM, DataError, check_flag_file, no_examples
from paramserver.errors import ConfigError
from paramserver.routing.hashing import hash64

MANIFEST = "columns.json"
_SALT = np.uint64(0x5851F42D4C957F2D)
CHUNK_BYTES = 8 << 20  # read and split this much of the file at a time
_BAD = 1  # ``_split``'s answer for a line that is not LIBSVM


#: files the process keeps open besides the blocks' (its own, fsspec's, the source)
FILES_KEPT = 64


def _most_parts() -> int:
    """The most blocks a split can write at once: the open files this process may have, less
    ``FILES_KEPT`` (--parts 100000 failed with 'Too many open files' after 20 000 of them)."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return max(1, (soft if soft != resource.RLIM_INFINITY else 1 << 20) - FILES_KEPT)


def split_columns(path: str, parts: int, out_dir: str, fmt: str = "libsvm") -> dict[str, Any]:
    """Write ``out_dir/block-<p>.libsvm`` for p < ``parts`` and a manifest; return it.

    Raises:
        DataError: a malformed line (file and line named): every block must have every
            line, so none is skipped.
    """
    if fmt != "libsvm":
        raise ConfigError(f"split-columns reads LIBSVM files (--format libsvm); got --format {fmt}: convert the "
                          "data to LIBSVM first")
    most = _most_parts()
    if isinstance(parts, bool) or not isinstance(parts, int) or not 1 <= parts <= most:
        raise ConfigError(f"--parts must be a whole number in [1, {most:,}] (a file a block, written at once: this "
                          f"process may open {most + FILES_KEPT:,}), got {parts!r}")
    check_flag_file(path, "--data", "give the LIBSVM file to split")
    os.makedirs(out_dir, exist_ok=True)
    outs = [open(os.path.join(out_dir, f"block-{p}.libsvm"), "wb") for p in range(parts)]
    lines = 0
    try:
        with fsspec.open(path, "rb", compression="infer") as f, reading(path):
            rest, first = b"", True
            while True:
                data = f.read(CHUNK_BYTES)
                if first:  # a UTF-8 byte-order mark is no part of the first line's label
                    data, first = data.removeprefix(BOM), False
                text = rest + data
                cut = text.rfind(b"\n") + 1 if data else len(text)
                if cut == 0 and data:  # no line ends in it yet: read on
                    rest = text
                    continue
                rest = text[cut:]
                if cut:
                    lines = _split_text(text[:cut], lines, parts, outs, path)
                if not data:
                    break
    finally:
        for o in outs:
            o.close()
    if not lines:
        raise DataError(f"{path} has no lines to split; give a LIBSVM file")
    manifest = {"source": path, "parts": parts, "lines": lines, "format": "libsvm",
                "blocks": [f"block-{p}.libsvm" for p in range(parts)]}
    with open(os.path.join(out_dir, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)
    return manifest


def _split_text(text: bytes, first: int, parts: int, outs: list[Any], path: str) -> int:
    """Split ``text`` (whole lines; its first is line ``first + 1`` of ``path``) into the
    blocks' files; returns the lines read so far."""
    buf = np.frombuffer(text if text.endswith(b"\n") else text + b"\n", np.uint8)
    # a block's line is the label, its own tokens each after one space, a newline: never longer than the line
    out = np.empty((parts, buf.size), np.uint8)
    fill = np.zeros(parts, np.int64)
    err, at = _split(buf, parts, out, fill)
    if err:
        n = first + int(np.count_nonzero(buf[:at] == NL)) + 1
        line = bytes(buf[at:at + int(np.argmax(buf[at:] == NL))]).decode("utf-8", "replace").strip()
        raise DataError(f"{path}:{n}: not a LIBSVM line (label idx:value ..., each index a whole number >= 0): "
                        f"{line[:120]!r}; fix or remove it (every column block needs every line)")
    for p in range(parts):
        outs[p].write(out[p, :fill[p]].tobytes())
    return first + int(np.count_nonzero(buf == NL))


@njit(nogil=True, cache=True)
def _split(buf, parts, out, fill):  # type: ignore[no-untyped-def]  # noqa: C901  (one numba kernel: a byte loop)
    """Each line of ``buf`` → a line of every block of ``out``: its label, then the
    ``idx:value`` tokens whose index hashes to the block (``fill``: each block's bytes);
    a blank line or a comment's gives none, svmlight's ``qid:`` is dropped.  Returns
    ``(0, 0)``, or ``_BAD`` and the offset of a line that is not LIBSVM."""
    pos, size, mod = 0, buf.shape[0], np.uint64(parts)
    while pos < size:
        a, b, stop, end = svm_line(buf, pos)
        if a == stop:
            pos = end + 1
            continue
        ok, _ = parse_float(buf, a, b)
        if not ok:
            return _BAD, pos
        for p in range(parts):
            for k in range(a, b):
                out[p, fill[p] + k - a] = buf[k]
            fill[p] += b - a
        first = True
        while True:
            what, a, b, colon, idx = next_pair(buf, b, stop, first)
            first = False
            if what == LINE_END:
                break
            if what == NOT_PAIR or what == BAD_INDEX:
                return _BAD, pos
            if what == QID:
                continue
            ok, _ = parse_float(buf, colon + 1, b)
            if not ok:
                return _BAD, pos
            p = hash64(np.uint64(idx) ^ _SALT) % mod
            out[p, fill[p]] = SPACE
            for k in range(a, b):
                out[p, fill[p] + 1 + k - a] = buf[k]
            fill[p] += 1 + b - a
        for p in range(parts):
            out[p, fill[p]] = NL
            fill[p] += 1
        pos = end + 1
    return 0, 0


def column_blocks(paths: list[str], parts: int, work_dir: str, what: str) -> list[str]:
    """The P block files of ``paths``: a folder ``split-columns`` wrote (with ``parts``
    blocks), or one LIBSVM file, split into ``work_dir`` now."""
    if len(paths) != 1:
        raise ConfigError(f"--feature-partition takes one {what} file (or one folder from split-columns), "
                          f"got {len(paths)}")
    path = paths[0]
    manifest_path = os.path.join(path, MANIFEST)
    if os.path.isdir(path):
        if not os.path.exists(manifest_path):
            raise ConfigError(f"{path} is a folder without {MANIFEST}: give a LIBSVM file, or a folder that "
                              "paramserver split-columns wrote")
        with open(manifest_path) as f:
            manifest = json.load(f)
        if manifest.get("parts") != parts:
            raise ConfigError(f"{path} holds {manifest.get('parts')} column blocks, --feature-partition is {parts}: "
                              "split it again with --parts " + str(parts))
        return [os.path.join(path, b) for b in manifest["blocks"]]
    out = os.path.join(work_dir, what)
    split_columns(path, parts, out)
    return [os.path.join(out, f"block-{p}.libsvm") for p in range(parts)]


def vertical_worker(client: Any, cfg: Any, train_blocks: list[str], test_blocks: list[str]) -> dict[str, Any]:
    """Worker ``client.rank`` trains on its column block (see the module's doc)."""
    from paramserver.apps.ctr.ramp import ramped
    from paramserver.data.parse import feature_key
    from paramserver.data.reader import Shard, read_batches

    p = client.rank
    table = cfg.model.table
    mask = np.uint64((1 << cfg.data.hash_bits) - 1) if 0 < cfg.data.hash_bits < 64 else np.uint64(0)
    bias = feature_key(0, np.uint64(0), mask)
    counter = 0  # the next example's key in the margins table (the same on every worker)
    examples, loss_sum, first_at = 0, 0.0, 0.0

    def margins(batch: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Full margins of ``batch``: this block's part added on the servers, then all of it.
        Returns them with what the gradient needs: the batch's distinct keys, each
        occurrence's key (``inverse``) and example (``row_of``), and the values."""
        nonlocal counter
        uniq, inverse = batch.unique()
        rows = client.pull(table, uniq).result(timeout=600)
        vals = batch.vals.astype(np.float64)
        if p != 0:
            vals[batch.keys == bias] = 0.0  # block 0's bias only
        n = len(batch)
        row_of = np.repeat(np.arange(n), np.diff(batch.indptr))
        partial = np.bincount(row_of, weights=vals * rows[inverse, 0], minlength=n)
        keys = np.arange(counter, counter + n, dtype=np.uint64)
        counter += n
        client.push("margins", keys, partial.astype(np.float32), op="add").result(timeout=600)
        client.barrier(timeout_s=600)
        z = client.pull("margins", keys).result(timeout=600)[:, 0].astype(np.float64)
        return z, uniq, inverse, row_of, vals

    seen = 0
    for _ in range(cfg.epochs):  # batches grow as run_training's do (the same on every block: they
        # depend on the examples seen only), so both runs make the same number of updates
        for batch in ramped(read_batches(Shard(train_blocks[p], 0, -1), cfg.data, cfg.batch_size),
                            cfg.batch_size, cfg.batch_ramp, seen):
            seen += len(batch)
            z, uniq, inverse, row_of, vals = margins(batch)
            prob = 1.0 / (1.0 + np.exp(-z))
            err = prob - batch.labels
            grads = np.bincount(inverse, weights=err[row_of] * vals, minlength=uniq.size)
            client.push(table, uniq, grads.astype(np.float32).reshape(-1, 1), distinct=True).result(timeout=600)
            if not first_at:
                first_at = time.time()
            examples += len(batch)
            pc = np.clip(prob, 1e-15, 1 - 1e-15)
            loss_sum += float(-(batch.labels * np.log(pc) + (1 - batch.labels) * np.log(1 - pc)).sum())
    scores: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    if test_blocks:
        for batch in read_batches(Shard(test_blocks[p], 0, -1), cfg.data, 1 << 14):
            z, *_ = margins(batch)
            scores.append(1.0 / (1.0 + np.exp(-z)))
            labels.append(batch.labels)
    return {"rank": p, "examples": examples, "loss_sum": loss_sum, "first_batch_at": first_at,
            "bytes_sent": client.stats.bytes_sent, "bytes_received": client.stats.bytes_received,
            "test_p": np.concatenate(scores) if scores and p == 0 else None,
            "test_y": np.concatenate(labels) if labels and p == 0 else None}


def run_vertical(cfg: Any, data: list[str], test: list[str], parts: int, *, servers: int, workers: int,
                 save: str | None = None, cluster_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """``paramserver train --feature-partition P``: the report ``run_training`` gives."""
    import tempfile

    from paramserver.apps.ctr import step_size
    from paramserver.apps.ctr.modelfile import save_model
    from paramserver.apps.ctr.models import auc, logloss
    from paramserver.cluster.launch import open_cluster
    from paramserver.data.files import check_output

    if cfg.model.name != "lr":
        raise ConfigError(f"--feature-partition trains logistic regression (--model lr), not --model {cfg.model.name}")
    if cfg.data.name != "libsvm":
        raise ConfigError(f"--feature-partition reads LIBSVM data (--format libsvm), not --format {cfg.data.name}")
    if workers != parts:
        raise ConfigError(f"--feature-partition {parts} trains with one worker a column block: pass --workers {parts} "
                          f"(got --workers {workers})")
    check_output(save, "--save", folder=True)
    step = step_size.for_job(cfg.optimizer_wire(), data, cfg.data, cfg.batch_ramp, cfg.batch_size, stream=False,
                             resume=False)
    if step is not None and step.how == "auto":  # the rows whole, before they are cut into column blocks
        step = step_size.choose(data, cfg.data, cfg.optimizer_wire(), cfg.batch_ramp, cfg.batch_size)
        cfg = cfg.with_step(step.alpha, step.beta)
    spec = cfg.table_spec()
    with tempfile.TemporaryDirectory(prefix="paramserver-columns-") as tmp:
        train_blocks = column_blocks(data, parts, tmp, "train")
        test_blocks = column_blocks(test, parts, tmp, "test") if test else []
        with open_cluster(servers=servers, workers=workers, **{"log_level": "WARNING", **(cluster_options or {})}) \
                as cluster:
            client = cluster.client
            client.admin.create_table_spec(spec)
            client.create_table("margins", dim=1, optimizer="sgd")
            t0 = time.perf_counter()
            per_worker = cluster.run(vertical_worker, cfg, train_blocks, test_blocks)
            seconds = time.perf_counter() - t0
            if save:
                save_model(save, cfg.model, cfg.data, spec, *client.export_table(spec.name))
    head = per_worker[0]
    examples = int(head["examples"])
    if not examples:
        raise no_examples(data)
    report: dict[str, Any] = {
        "examples": examples, "seconds": seconds, "examples_per_s": examples / seconds if seconds else 0.0,
        "train_logloss": head["loss_sum"] / examples if examples else float("nan"),
        "bytes_sent": sum(r["bytes_sent"] for r in per_worker),
        "bytes_received": sum(r["bytes_received"] for r in per_worker),
        "epochs": cfg.epochs, "servers": servers, "workers": workers, "feature_partition": parts,
        "optimizer": spec.to_wire()["optimizer"], "batch_size": cfg.batch_size, "bad_lines": 0,
    }
    if step is not None:
        report["step_size"] = step.report()
    if head.get("test_p") is not None:
        y, prob = head["test_y"], head["test_p"]
        report.update({"logloss": logloss(y, prob), "auc": auc(y, prob), "test_examples": int(y.shape[0])})
    return report
