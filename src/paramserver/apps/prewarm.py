"""``paramserver prewarm``: the kernels compiled into numba's disk cache once, so that no
command's first run compiles them.

By default (what ``make demo``'s install runs): the quick start's kernels (``paramserver
demo``, Criteo rows, LR and FM), ``train``'s own warm-up for each job it runs at its
default flags, a saved model's ``predict`` and ``eval`` (and ``serve``'s load, which the
command hands in where the ``serve`` extra is installed), and the round apps (each command
run once on small inputs).  With ``everything`` (``--all``, what ``make test`` runs on the second
core while the first lints): also every row storage, every built-in rule at the widths the
tests' tables use, and LIBSVM's column blocks.

It says what it does and about how long it takes before it starts (a fresh machine's
cold cache: about two minutes, during which nothing else would be printed), one line a
group of kernels as each is done, and the time in all at the end.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any, TextIO

import numpy as np

from paramserver.apps.ctr import step_size
from paramserver.apps.ctr.models import Model
from paramserver.apps.ctr.synth import write_synth
from paramserver.apps.ctr.train_config import TrainConfig
from paramserver.apps.ctr.vertical import split_columns
from paramserver.apps.ctr.warmup import warm_job, warm_worker
from paramserver.data.batch import DataFormat
from paramserver.filters.warmup import warm_filters
from paramserver.server.warmup import warm_server
from paramserver.tables.optim import Optimizer
from paramserver.tables.spec import TableSpec

Group = tuple[str, Callable[[], None]]  # what a group of kernels is, and what compiles it


def _synth_rows() -> None:
    with tempfile.TemporaryDirectory() as tmp:  # paramserver demo writes its rows first
        write_synth(os.path.join(tmp, "rows.tsv"), 10, seed=1)


def _column_blocks() -> None:
    with tempfile.TemporaryDirectory() as tmp:  # split-columns, and --feature-partition on a LIBSVM file
        with open(os.path.join(tmp, "rows.libsvm"), "w") as f:
            f.write("1 1:1 2:0.5\n")
        split_columns(os.path.join(tmp, "rows.libsvm"), 2, os.path.join(tmp, "blocks"))


#: a table's rule as ``TableSpec`` takes it, and its row's width
Row = tuple[Optimizer | str | dict[str, Any], int]


def _request_loops(rows: list[Row], dense: list[Row] | None = None, steps: bool = False) -> None:
    """The request loops of hash tables of these (optimiser, dim) rows, and of dense tables
    of the ``dense`` rows (default: the same): compiled for their row
    (``store/specialize.py``), each a kernel of its own; with ``steps``, the hash tables'
    steps too (a training job's)."""
    tables = [TableSpec("warm-up", dim, optimizer=opt) for opt, dim in rows]
    tables += [TableSpec("warm-up", dim, optimizer=opt, key_bits=8) for opt, dim in (rows if dense is None else dense)]
    warm_server((), filters=False, tables=tuple(tables), steps=steps)


def _job_rows() -> list[Row]:
    """The rows of the quick start's tables: LR's and FM's at their default flags."""
    return [(TrainConfig(model=m).table_spec().optimizer, m.dim) for m in (Model("lr"), Model("fm"))]


#: the jobs ``_train_jobs`` loads as ``train`` runs them at its default flags: a row format and a model
TRAIN_JOBS = (("criteo", "lr"), ("criteo", "fm"), ("criteo", "deepfm"), ("libsvm", "lr"), ("avazu", "lr"))


def _train_jobs() -> None:
    """What ``train`` loads at its default flags for each of ``TRAIN_JOBS``, in either layout
    (``auto`` takes one by the input's size): the job's own warm-up (``warm_job``), its servers'
    and its workers', with the table as the job makes it.  A hash table there keeps 4-byte keys
    (``TrainConfig.narrow_keys``), whose loops are others than the 8-byte keys' warmed above:
    without these, a fresh install's first ``train`` compiled five of them in its server (4.6 s
    to its first example instead of 0.6), a first ``--model fm`` three more, and a first LIBSVM
    job (a9a) took 4.8 s, a first Avazu one 2.9, a first DeepFM 2.2."""
    step_size.warm()  # the α an LR job replays its first rows for (alpha=auto, its default)
    for fmt, name in TRAIN_JOBS:
        for layout in ("hash", "dense"):
            cfg = TrainConfig(model=Model(name), data=DataFormat(fmt), layout=layout)
            warm = warm_job(cfg.data.name, cfg.model, cfg.table_spec())
            warm.servers()
            warm.workers()


#: the built-in rules and the widths the tests' tables use
RULES = ("sgd", "adagrad", "ftrl", "ftrl_adagrad", "adam", "rmsprop")
WIDTHS = (1, 2, 3, 4, 16)
#: a dense table's widths a rule is warmed for, where not dim 1 alone (``tests/unit/test_request_loops.py``)
DENSE_WIDTHS = {"adagrad": (1, 16), "ftrl": (1, 4)}


def _round_inputs(tmp: str) -> dict[str, str]:
    """Small inputs of the round apps' formats, seeded: LIBSVM rows with a real and with a ±1
    label, ratings (``user item rating``) and a UCI docword corpus."""
    rng = np.random.default_rng(0)
    paths = {name: os.path.join(tmp, name) for name in ("rows.svm", "labels.svm", "ratings.tsv", "docword.txt")}
    truth = rng.normal(size=300) * (rng.random(300) < 0.1)
    with open(paths["rows.svm"], "w") as rows, open(paths["labels.svm"], "w") as labels:
        for _ in range(400):
            cols = np.sort(rng.choice(300, 20, replace=False))
            vals = rng.random(20)
            feats = " ".join(f"{c + 1}:{v:.4f}" for c, v in zip(cols, vals, strict=True))
            y = float(vals @ truth[cols]) + rng.normal(scale=0.1)
            rows.write(f"{y:.5f} {feats}\n")
            labels.write(f"{1 if y > 0 else -1} {feats}\n")
    with open(paths["ratings.tsv"], "w") as f:
        f.writelines(f"{u}\t{i}\t{r}\t0\n" for u, i, r in zip(rng.integers(1, 200, 5000), rng.integers(1, 300, 5000),
                                                            rng.integers(1, 6, 5000), strict=True))
    docs = [(d, w, c) for d in range(1, 201) for w, c in zip(rng.choice(np.arange(1, 301), 30, replace=False),
                                                             rng.integers(1, 4, 30), strict=True)]
    with open(paths["docword.txt"], "w") as f:
        f.write(f"200\n300\n{len(docs)}\n")
        f.writelines(f"{d} {w} {c}\n" for d, w, c in docs)
    return paths


#: each round app's command once on ``_round_inputs``' files, as their defaults run them: the
#: Lasso at two λ and L1-regularised LR, MF, LDA at few topics (SparseLDA) and at many (MH first)
ROUND_COMMANDS = (["lasso", "--data", "rows.svm", "--lambda-ratio", "100"],
                  ["lasso", "--data", "rows.svm", "--lambda-ratio", "1000"],
                  ["lasso", "--loss", "logistic", "--data", "labels.svm", "--lambda-ratio", "100"],
                  ["mf", "--data", "ratings.tsv", "--test", "ratings.tsv", "--epochs", "2"],
                  ["lda", "--data", "docword.txt", "--topics", "20", "--iterations", "6"],
                  ["lda", "--data", "docword.txt", "--topics", "600", "--iterations", "6"])


def _run(commands: tuple[list[str], ...], paths: dict[str, str]) -> None:
    """Each of ``commands`` as ``paramserver`` runs it (a word naming one of ``paths`` becomes
    that path), one after the other; a failure stops the prewarm, with what it said."""
    for words in commands:
        args = [paths.get(w, w) for w in words]
        done = subprocess.run([sys.executable, "-m", "paramserver", *args], capture_output=True, text=True,
                              timeout=600)
        if done.returncode:
            raise SystemExit(f"prewarm: paramserver {' '.join(args)} failed ({done.returncode}):\n"
                             f"{done.stderr[-2000:]}")


def _round_apps() -> None:
    """The round apps' kernels (Lasso's, L1-LR's, MF's, LDA's samplers): each command run once
    on small inputs, its nodes compiling what they use.  Left to their first run, a fresh
    install's first ``paramserver lasso`` on news20 took 14.7 s instead of 1.1, MF on ml-100k
    5.1 instead of 1.0, LDA at 1 000 topics 7.4 instead of 3.3."""
    with tempfile.TemporaryDirectory() as tmp:
        _run(ROUND_COMMANDS, _round_inputs(tmp))


#: a saved model's commands, on ``_synth_rows``' kind of rows
MODEL_COMMANDS = (["train", "--data", "rows.tsv", "--save", "model", "--quiet"],
                  ["predict", "--model", "model", "--data", "rows.tsv", "--out", "preds.txt"],
                  ["eval", "--model", "model", "--data", "rows.tsv"])


def _saved_model(served: Callable[[str], object] | None = None) -> None:
    """A saved model read back: ``predict`` and ``eval`` load it into a table of their own,
    whose loops (a key's read, whether it is stored) a fresh install's first ``predict``
    compiled (1.3 s for 5 000 rows); and ``served`` given the model's folder (``serve
    --model``'s load and warm-up, from the serving layer above this one: a fresh install's
    first ``serve`` was ready after 3.7 s instead of 0.7)."""
    with tempfile.TemporaryDirectory() as tmp:
        paths = {name: os.path.join(tmp, name) for name in ("rows.tsv", "model", "preds.txt")}
        write_synth(paths["rows.tsv"], 2000, seed=1)
        _run(MODEL_COMMANDS, paths)
        if served is not None:
            served(paths["model"])


def groups(everything: bool = False, served: Callable[[str], object] | None = None) -> list[Group]:
    """The kernels to compile, in groups of a few to some tens of seconds on a cold cache:
    what the commands run at their default flags (``served``: what serves a saved model, given
    its folder); with ``everything``, also every row storage, every built-in rule at the tests'
    widths, and LIBSVM's column blocks."""
    commands = [("server tables, hash layout", lambda: warm_server(("hash",), filters=False)),
                ("server tables, dense layout", lambda: warm_server(("dense",), filters=False)),
                ("the filters", warm_filters),
                ("LR's and FM's request loops and steps", lambda: _request_loops(_job_rows(), steps=True)),
                ("train's jobs at its default flags: Criteo LR, FM, DeepFM; LIBSVM, Avazu LR", _train_jobs),
                ("the demo's synthetic rows", _synth_rows),
                ("a saved model: predict, eval" + (", serve" if served else ""), lambda: _saved_model(served)),
                ("the round apps: Lasso, L1-LR, MF, LDA", _round_apps)]
    if not everything:
        return commands
    storages = [(f"server tables, {storage} rows", lambda s=storage: warm_server(storages=(s,), filters=False))
                for storage in ("fp16", "bf16")]
    # dense tables' loops at the widths the tests' dense tables use (``DENSE_WIDTHS``)
    loops = [(f"request loops, {rule}", lambda r=rule: _request_loops([(r, d) for d in WIDTHS],
                                                                      [(r, d) for d in DENSE_WIDTHS.get(r, (1,))]))
             for rule in RULES]
    return [*commands, *storages, *loops,
            ("Criteo rows: LR, FM, DeepFM", lambda: warm_worker(("criteo",), filters=False)),
            ("LIBSVM rows: LR, FM, DeepFM", lambda: warm_worker(("libsvm",), filters=False)),
            ("LIBSVM column blocks", _column_blocks)]


def run(todo: list[Group], out: TextIO = sys.stderr, clock: Callable[[], float] = time.perf_counter) -> float:
    """Compile ``todo``, saying so: a first line (what, and how long once), a line a group
    as it is done, the time in all at the end; the seconds it took."""
    def say(text: str) -> None:
        print(f"prewarm: {text}", file=out, flush=True)

    say(f"compiling paramserver's numba kernels into their disk cache, {len(todo)} groups: about two minutes on a "
        "fresh machine, once (then seconds)")
    t0 = clock()
    for i, (what, compile_group) in enumerate(todo, 1):
        started = clock()
        compile_group()
        say(f"[{i}/{len(todo)}] {what}: {clock() - started:.0f} s")
    took = clock() - t0
    say(f"numba's cache filled in {took:.0f} s")
    return took
