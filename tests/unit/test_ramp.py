"""The batch ramp: mini-batches grow from 1 example like sqrt(examples seen), and the
training loop applies exactly the rule it documents (per-example while batches are 1)."""

import contextlib
import math
import types
from concurrent.futures import Future

import numpy as np
import pytest

from paramserver.apps.ctr import train_loop
from paramserver.apps.ctr.depth import SETTLE_BATCHES
from paramserver.apps.ctr.models import Model
from paramserver.apps.ctr.ramp import ramp_size, ramped
from paramserver.apps.ctr.train import TrainConfig
from paramserver.apps.ctr.train_loop import _train_stream
from paramserver.client.prefetch import Prefetched
from paramserver.data.reader import DataFormat, Shard, read_all, read_batches
from paramserver.store.table import VnodeTable
from paramserver.tables.optim import FTRL, Zeros
from paramserver.tables.steps import step


def test_ramp_grows_like_the_square_root_of_the_examples_seen():
    assert [ramp_size(s, 1000, 1.0) for s in (0, 1, 3, 4, 8, 9)] == [1, 1, 1, 2, 2, 3]
    assert ramp_size(10_000, 1000, 1.0) == 100
    assert ramp_size(65_536, 10**6, 1.0) == 256 and ramp_size(10**6, 10**6, 1.0) == 1000  # no jump, ever
    assert ramp_size(16 * 10**6, 4000, 1.0) == 4000 and ramp_size(10**8, 4000, 1.0) == 4000  # capped by --batch-size
    assert ramp_size(400, 1000, 2.0) == 40
    assert ramp_size(0, 1000, 0.0) == 1000  # no ramp


def _write_rows(path, n, seed=0):
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for _ in range(n):
            feats = sorted(rng.choice(40, size=rng.integers(1, 6), replace=False) + 1)
            f.write(f"{rng.integers(0, 2)} " + " ".join(f"{i}:{rng.uniform(0.5, 2):.3f}" for i in feats) + "\n")


@pytest.mark.parametrize("reader_batch", [7, 64, 1000])
def test_ramped_sizes_depend_on_the_examples_seen_alone(tmp_path, reader_batch):
    """Every example once, in order; each piece ``ramp_size`` long whatever the reader's
    batch size (a piece may span two of them); past the ramp the reader's batches pass
    unchanged (no copy)."""
    path = str(tmp_path / "rows.libsvm")
    _write_rows(path, 5000)
    fmt = DataFormat("libsvm")
    whole = read_all([path], fmt)
    cap = 64
    reader = list(read_batches(Shard(path, 0, -1), fmt, reader_batch))
    pieces = list(ramped(iter(reader), cap, 1.0))
    seen = 0
    for piece in pieces[:-1]:
        assert len(piece) == ramp_size(seen, cap, 1.0)
        seen += len(piece)
    assert seen + len(pieces[-1]) == 5000
    np.testing.assert_array_equal(np.concatenate([p.keys for p in pieces]), whole.keys)
    np.testing.assert_array_equal(np.concatenate([p.labels for p in pieces]), whole.labels)
    if reader_batch == cap:
        assert any(p is r for p in pieces for r in reader)  # past the ramp: the reader's own batches


class _Done:
    def __init__(self, value=None):
        self.value = value

    def result(self, timeout=None):
        return self.value

    def done(self):
        return True


class _InProcessClient:
    """The client calls the training loop makes, served by one table in this process."""

    rank = 0

    def __init__(self, table, shards):
        self.table, self.tasks, self.current_clock, self.done = table, list(shards), 0, []
        self.job = self.stats = self  # client.job: the shard queue; client.stats: the wire's totals

    def next_shard(self):
        return {"shard": self.tasks.pop(0).to_wire(), "id": 0} if self.tasks else None

    def pull(self, name, keys):
        out = np.empty((keys.size, 1), np.float32)
        self.table.lookup(keys, out)
        return _Done(out)

    def push(self, name, keys, grads, distinct=False, stats=None):
        assert stats is None, "this job's table counts no shows and clicks"
        self.table.apply(keys, grads)
        return _Done()

    def push_held(self):  # no row cache here: it holds nothing
        return 0

    def prefetch(self, name, keys):  # a table in memory: it answers that it has no tiers
        done = Future()
        done.set_result(Prefetched(tiered=False))
        return done

    def clock(self, clocks=1):
        self.current_clock += clocks

    def together(self):  # requests here are served at once: nothing to hold back
        return contextlib.nullcontext()

    def report_progress(self, **kw):
        pass

    def wire_totals(self):  # no filters here: nothing before or after them
        return 0, 0

    def sums_held(self):  # no row cache
        return None

    def flush(self):
        return 0

    def shard_done(self, task, **kw):
        self.done.append(kw)


def _sigmoid(z):
    return 1.0 / (1.0 + math.exp(-z))


def _ftrl_reference(path, alpha, beta, batch_sizes):
    """FTRL-Proximal logistic regression in plain Python: each batch's gradients are
    computed on the weights at its start, summed per key, and applied as one step."""
    rows = read_all([path], DataFormat("libsvm"))
    z, n, w = {}, {}, {}
    lo = 0
    for size in batch_sizes:
        grads = {}
        for i in range(lo, lo + size):
            a, b = rows.indptr[i], rows.indptr[i + 1]
            keys, vals = rows.keys[a:b].tolist(), rows.vals[a:b].astype(np.float64)
            e = _sigmoid(sum(w.get(k, 0.0) * v for k, v in zip(keys, vals))) - rows.labels[i]
            for k, v in zip(keys, vals):
                grads[k] = grads.get(k, 0.0) + np.float32(e * v)
        for k, g in grads.items():
            g = float(np.float32(g))
            n0 = n.get(k, 0.0)
            z[k] = z.get(k, 0.0) + g - (math.sqrt(n0 + g * g) - math.sqrt(n0)) / alpha * w.get(k, 0.0)
            n[k] = n0 + g * g
            w[k] = -z[k] / ((beta + math.sqrt(n[k])) / alpha)
        lo += size
    return w


@pytest.mark.parametrize("rows", [4, 300])
def test_the_loop_applies_per_example_steps_first_then_the_documented_batches(tmp_path, rows):
    """While the ramp is at 1 (the first 4 examples) the table holds exactly what a
    per-example FTRL learner holds; after, exactly the batch rule with the ramp's sizes."""
    path = str(tmp_path / "rows.libsvm")
    _write_rows(path, rows, seed=1)
    cfg = TrainConfig(Model("lr"), DataFormat("libsvm"), batch_size=1000, pipeline=1, steps="off")
    opt = FTRL(alpha=0.115, beta=0.5, l1=0.0, l2=0.0)
    table = VnodeTable(1, opt, Zeros(), 0)
    client = _InProcessClient(table, [Shard(path, 0, -1)])
    done = _train_stream(client, cfg)
    assert done["examples"] == rows

    sizes, seen = [], 0
    while seen < rows:
        sizes.append(min(ramp_size(seen, 1000, 1.0), rows - seen))
        seen += sizes[-1]
    assert sizes[:4] == [1, 1, 1, 1]
    ref = _ftrl_reference(path, 0.115, 0.5, sizes)
    keys = np.array(sorted(ref), np.uint64)
    got = np.empty((keys.size, 1), np.float32)
    table.lookup(keys, got)
    np.testing.assert_allclose(got[:, 0], [ref[int(k)] for k in keys], rtol=2e-4, atol=1e-6)


class _Ordered(_InProcessClient):
    """The in-process client with each pull and push written down in order, and each shard
    marked ``last`` as the scheduler marks the last one it hands out."""

    def __init__(self, table, shards):
        super().__init__(table, shards)
        self.events = []

    def next_shard(self):
        task = super().next_shard()
        return None if task is None else {**task, "last": not self.tasks}

    def pull(self, name, keys):
        self.events.append("pull")
        return super().pull(name, keys)

    def push(self, name, keys, grads, distinct=False, stats=None):
        self.events.append("push")
        return super().push(name, keys, grads, distinct, stats)


@pytest.mark.parametrize("pipeline,depths,settled", [(5, (5, 5), 32), ("auto:8", (2, 8), 32), (2, (2, 2), 0)])
def test_the_jobs_last_batches_go_one_at_a_time_where_the_pipeline_may_pass_2(tmp_path, pipeline, depths, settled):
    """Where ``--pipeline`` may run deeper than 2, the last ``SETTLE_BATCHES`` batches of the
    job (of the last shard handed out, not of the others) are each pulled with no other in
    flight, so each sees every push before it; at the default 2, none is.  ``auto`` starts at
    2 and deepens where its worker waits (timing: 1 run in 10-20 deepened to 3 here), up to 8."""
    path = str(tmp_path / "rows.libsvm")
    _write_rows(path, 3000, seed=2)
    cfg = TrainConfig(Model("lr"), DataFormat("libsvm"), batch_size=1000, pipeline=pipeline, steps="off")
    client = _Ordered(VnodeTable(1, FTRL(), Zeros(), 0), [Shard(path, 0, 40_000), Shard(path, 40_000, -1)])
    assert _train_stream(client, cfg)["examples"] == 3000
    in_flight, pulls, pushes = [], 0, 0  # at each pull, the batches pulled and not yet pushed
    for event in client.events:
        pulls += event == "pull"
        pushes += event == "push"
        if event == "pull":
            in_flight.append(pulls - pushes)
    assert pulls == pushes > 2 * SETTLE_BATCHES
    head, tail = in_flight[:pulls - settled], in_flight[pulls - settled:]
    assert depths[0] <= max(head) <= depths[1] and all(n == 1 for n in tail)
    assert settled or in_flight[-1] == depths[0]  # at 2, the last pulls go as every other


class _Answers:
    """A step's answer that comes in when the loop first waits on one: then every step sent
    before it is answered at once (a burst), as a server's answers come back together."""

    def __init__(self, client, value):
        self.client, self.value, self.answered = client, value, False

    def done(self):
        return self.answered

    def result(self, timeout=None):
        for answer in self.client.unanswered:
            answer.answered = True
        self.client.unanswered.clear()
        return self.value

    def add_done_callback(self, fn):  # only ``link`` asks, and these jobs run at a fixed depth
        raise AssertionError("no callback expected at a fixed depth")


class _Stepping(_InProcessClient):
    """The in-process client taking the loop's batches as steps, each applied as it is taken
    (in order, as a server takes them), and each ``together`` block's steps written down."""

    def __init__(self, table, shards):
        super().__init__(table, shards)
        self.steps, self.admin = self, self
        self.ring = types.SimpleNamespace(owners=np.array([1]))
        self.unanswered, self.envelopes, self.open = [], [], None

    @contextlib.contextmanager
    def together(self):
        self.open = 0
        yield
        self.envelopes.append(self.open)
        self.open = None

    def take(self, name, keys, inverse, indptr, vals, labels, model="lr", l2=0.0):
        assert self.open is not None, "a step goes out in a together block"
        self.open += 1
        rows = np.empty((keys.size, 1), np.float32)
        self.table.lookup(keys, rows)
        grads, loss, preds = step(model, indptr, vals, labels, inverse, rows, l2)
        self.table.apply(keys, grads)
        answer = _Answers(self, (preds.astype(np.float32), loss))
        self.unanswered.append(answer)
        return answer

    def take_many(self, name, batches, model="lr", l2=0.0):
        """A step of several batches: each applied in turn, as a server takes them."""
        return [self.take(name, *batch, model=model, l2=l2) for batch in batches]


def test_steps_answered_together_go_out_together_a_quarter_of_the_depth_at_most(tmp_path, monkeypatch):
    """Steps whose answers came back in a burst free room in a burst: the batches ready go to
    the server in one request (a step of several batches), up to a quarter of the depth, each
    once and in order, so the model is the one a step a request makes, to the bit."""
    path = str(tmp_path / "rows.libsvm")
    _write_rows(path, 4000, seed=3)
    cfg = TrainConfig(Model("lr"), DataFormat("libsvm"), batch_size=1000, pipeline=16, steps="auto")
    models, sizes, default = [], [], train_loop.ENVELOPES
    for envelopes, most in ((default, train_loop.GROUP_OCCURRENCES), (10**6, 1 << 20), (default, 1)):
        # the default; one step a request; requests of at most one occurrence: each batch alone
        monkeypatch.setattr(train_loop, "ENVELOPES", envelopes)
        monkeypatch.setattr(train_loop, "GROUP_OCCURRENCES", most)
        client = _Stepping(VnodeTable(1, FTRL(), Zeros(), 0), [Shard(path, 0, -1)])
        assert _train_stream(client, cfg)["examples"] == 4000
        keys, rows = client.table.items()
        models.append(rows[np.argsort(keys)])
        sizes.append(client.envelopes)
    assert max(sizes[0]) == 16 // default and sum(sizes[0]) == len(sizes[1])  # each batch once
    assert set(sizes[1]) == set(sizes[2]) == {1}
    np.testing.assert_array_equal(models[0], models[1])
    np.testing.assert_array_equal(models[0], models[2])
