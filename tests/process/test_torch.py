"""``paramserver.torch`` (issue 16): a small DeepFM whose embedding tables live on the
servers trains step by step to the same losses (within 1e-5) as plain PyTorch with
``nn.Embedding``/``nn.EmbeddingBag`` and the same optimiser, synchronously with one
worker: with the dense layers local, with them on the servers (``DenseParameters``),
with the next batch prefetched, and through ``fit`` with a checkpoint that restores."""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the torch extra: CI installs it

from torch import nn  # noqa: E402

from paramserver.cluster.local import LocalCluster  # noqa: E402
from paramserver.torch import DenseParameters, ShardedEmbedding, ShardedEmbeddingBag, fit  # noqa: E402

pytestmark = pytest.mark.timeout(240)
V, FIELDS, DIM, LR = 500, 4, 8, 0.05


class DeepFM(nn.Module):
    """First order (a bag of 1-d weights), the FM's pairwise term and an MLP, over the
    same embeddings: the model CTR engineers train."""

    def __init__(self, emb: nn.Module, first: nn.Module):
        super().__init__()
        self.emb, self.first = emb, first
        self.mlp = nn.Sequential(nn.Linear(FIELDS * DIM, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, ids):
        e = self.emb(ids)  # [B, F, D]
        s = e.sum(1)
        fm = 0.5 * (s * s - (e * e).sum(1)).sum(1)
        return self.first(ids).squeeze(1) + fm + self.mlp(e.flatten(1)).squeeze(1)


def _reference():
    torch.manual_seed(0)
    return DeepFM(nn.Embedding(V, DIM), nn.EmbeddingBag(V, 1, mode="sum"))


def _batches(steps=15, batch=32, seed=1):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        ids = np.minimum(rng.zipf(1.3, (batch, FIELDS)) - 1, V - 1)  # heavy-tailed: hot ids in most batches
        y = (rng.random(batch) < 0.3).astype(np.float32)
        out.append((torch.from_numpy(ids.astype(np.int64)), torch.from_numpy(y)))
    return out


def _reference_losses(ref, batches, dense_rule="sgd"):
    ref = copy.deepcopy(ref)
    sparse = torch.optim.Adagrad([ref.emb.weight, ref.first.weight], lr=LR)
    dense = (torch.optim.SGD(ref.mlp.parameters(), lr=0.1) if dense_rule == "sgd"
             else torch.optim.Adagrad(ref.mlp.parameters(), lr=LR))
    losses = []
    for ids, y in batches:
        loss = nn.functional.binary_cross_entropy_with_logits(ref(ids), y)
        sparse.zero_grad()
        dense.zero_grad()
        loss.backward()
        sparse.step()
        dense.step()
        losses.append(float(loss.detach()))
    return losses, ref


def _sharded(client, ref, prefix):
    emb = ShardedEmbedding(client, f"{prefix}/emb", V, DIM, optimizer={"name": "adagrad", "lr": LR})
    first = ShardedEmbeddingBag(client, f"{prefix}/first", V, 1, mode="sum",
                                optimizer={"name": "adagrad", "lr": LR})
    keys = np.arange(V, dtype=np.uint64)  # the reference's initial weights, exactly
    client.push(emb.table, keys, ref.emb.weight.detach().numpy(), op="assign").result(timeout=30)
    client.push(first.table, keys, ref.first.weight.detach().numpy(), op="assign").result(timeout=30)
    model = DeepFM(emb, first)
    model.mlp.load_state_dict(ref.mlp.state_dict())
    return model


def test_sharded_deepfm_matches_plain_pytorch_step_by_step():
    ref, batches = _reference(), _batches()
    want, trained = _reference_losses(ref, batches)
    with LocalCluster(servers=2, workers=0, log_level="WARNING") as cluster:
        client = cluster.client
        model = _sharded(client, ref, "a")
        dense = torch.optim.SGD(model.mlp.parameters(), lr=0.1)
        got = []
        for ids, y in batches:
            loss = nn.functional.binary_cross_entropy_with_logits(model(ids), y)
            dense.zero_grad()
            loss.backward()
            dense.step()
            got.append(float(loss.detach()))
        model.emb.flush()
        model.first.flush()
        rows = client.pull("a/emb", np.arange(V, dtype=np.uint64)).result(timeout=30)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    np.testing.assert_allclose(rows, trained.emb.weight.detach().numpy(), atol=1e-5, rtol=0)


def test_prefetching_the_next_batch_changes_nothing_and_the_dense_layers_train_on_the_servers():
    """The next batch's rows are pulled before this batch's backward (the rows it then
    changes are pulled again); the MLP is a DenseParameters table with the AdaGrad rule."""
    ref, batches = _reference(), _batches(seed=2)
    want, _ = _reference_losses(ref, batches, dense_rule="adagrad")
    with LocalCluster(servers=1, workers=0, log_level="WARNING") as cluster:
        client = cluster.client
        model = _sharded(client, ref, "b")
        dense = DenseParameters(client, "b/mlp", model.mlp, optimizer={"name": "adagrad", "lr": LR})
        got = []
        for t, (ids, y) in enumerate(batches):
            loss = nn.functional.binary_cross_entropy_with_logits(model(ids), y)
            if t + 1 < len(batches):
                model.emb.prefetch(batches[t + 1][0])
                model.first.prefetch(batches[t + 1][0])
            loss.backward()
            dense.step()
            got.append(float(loss.detach()))
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_fit_trains_and_checkpoints_tables_a_new_cluster_restores(tmp_path):
    ref, batches = _reference(), _batches(seed=3)
    want, trained = _reference_losses(ref, batches)
    url = str(tmp_path / "ckpt")
    with LocalCluster(servers=2, workers=0, log_level="WARNING") as cluster:
        model = _sharded(cluster.client, ref, "c")
        got = fit(model, batches, nn.functional.binary_cross_entropy_with_logits,
                  dense=torch.optim.SGD(model.mlp.parameters(), lr=0.1), checkpoint_url=url, checkpoint_every=5,
                  client=cluster.client)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    with LocalCluster(servers=1, workers=0, log_level="WARNING") as cluster:
        assert cluster.client.restore(url) == {"c/emb": V, "c/first": V}
        rows = cluster.client.pull("c/emb", np.arange(V, dtype=np.uint64)).result(timeout=30)
    np.testing.assert_allclose(rows, trained.emb.weight.detach().numpy(), atol=1e-5, rtol=0)


def test_ids_outside_the_table_are_named():
    with LocalCluster(servers=1, workers=0, log_level="WARNING") as cluster:
        emb = ShardedEmbedding(cluster.client, "d/emb", 10, 4)
        with pytest.raises(Exception, match=r"embedding id 10 is outside \[0, 10\)"):
            emb(torch.tensor([[1, 10]]))
        with pytest.raises(Exception, match="int64 or int32"):
            emb(torch.tensor([[1.0, 2.0]]))


def _sync_worker(client, state, batches, workers):
    """One of ``workers`` data-parallel workers: its share of every batch, its loss scaled
    by 1/workers, every table synchronous (BSP, the servers sum each step's pushes)."""
    torch.manual_seed(0)
    emb = ShardedEmbedding(client, "s/emb", V, DIM, create=False, sync=True)
    first = ShardedEmbeddingBag(client, "s/first", V, 1, mode="sum", create=False, sync=True)
    model = DeepFM(emb, first)
    model.mlp.load_state_dict(state)
    dense = DenseParameters(client, "s/mlp", model.mlp, create=False, sync=True)
    losses = []
    for ids, y in batches:
        share = slice(client.rank, None, workers)
        loss = nn.functional.binary_cross_entropy_with_logits(model(ids[share]), y[share])
        (loss / workers).backward()
        dense.step()
        losses.append(float(loss.detach()))
    return losses


def test_two_synchronous_workers_train_as_one_process_on_the_whole_batch():
    """sync=True: the servers sum both workers' gradients of each step and apply AdaGrad
    once (embeddings and the MLP alike), so two workers with half a batch each match one
    process on the whole batch, step by step.  The tables start from their initializers
    (a synchronous table sums what is pushed to it), which the reference takes too."""
    ref, batches = _reference(), _batches(seed=4)
    rule = {"name": "adagrad", "lr": LR}
    with LocalCluster(servers=2, workers=2, log_level="WARNING") as cluster:
        client = cluster.client
        keys = np.arange(V, dtype=np.uint64)
        for module, name in ((ShardedEmbedding(client, "s/emb", V, DIM, optimizer=rule, sync=True), "emb"),
                             (ShardedEmbeddingBag(client, "s/first", V, 1, mode="sum", optimizer=rule, sync=True),
                              "first")):
            with torch.no_grad():
                getattr(ref, name).weight.copy_(torch.from_numpy(client.pull(module.table, keys).result(timeout=30)))
        DenseParameters(client, "s/mlp", ref.mlp, optimizer=rule, sync=True)  # ref.mlp takes the table's values
        want, trained = _reference_losses(ref, batches, dense_rule="adagrad")
        state = {k: v.clone() for k, v in ref.mlp.state_dict().items()}
        per_worker = cluster.run(_sync_worker, state, batches, 2)
        rows = client.pull("s/emb", keys).result(timeout=30)
    got = np.mean(per_worker, axis=0)  # halves of equal size: the whole batch's mean loss
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    np.testing.assert_allclose(rows, trained.emb.weight.detach().numpy(), atol=1e-5, rtol=0)


def _trains_a_2_26_row_table(client, steps, batch):
    """On a worker capped below the table's size: a 2**26 x 16 embedding table (4 GiB of
    values) trains, since only the rows a batch touches ever come here."""
    from paramserver.torch import ShardedEmbeddingBag

    try:  # the cap holds: this process cannot hold the table whole
        np.ones((1 << 26, 16), np.float32)
        capped = False
    except MemoryError:
        capped = True
    torch.manual_seed(0)
    emb = ShardedEmbeddingBag(client, "big/emb", 1 << 26, 16, mode="sum", optimizer={"name": "adagrad", "lr": 0.1})
    head = nn.Linear(16, 1)
    opt = torch.optim.SGD(head.parameters(), lr=0.1)
    rng = np.random.default_rng(client.rank)
    losses = []
    for _ in range(steps):
        ids = torch.from_numpy(rng.integers(0, 1 << 26, (batch, 8)))  # over the whole id space
        y = (ids[:, 0] % 2).float()
        loss = nn.functional.binary_cross_entropy_with_logits(head(emb(ids)).squeeze(1), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    emb.flush()
    with open("/proc/self/status") as f:
        peak = next(int(line.split()[1]) // 1024 for line in f if line.startswith("VmHWM:"))
    return {"capped": capped, "losses": losses, "peak_rss_mb": peak}


def test_a_table_larger_than_any_process_trains_with_every_process_capped():
    cap = 1536  # MiB of data a process may hold; the table's values alone are 4096
    with LocalCluster(servers=2, workers=1, log_level="WARNING", memory_limit_mb=cap) as cluster:
        (result,) = cluster.run(_trains_a_2_26_row_table, 40, 256)
        servers = cluster.client.stats.server_stats()
    assert result["capped"]  # the worker could not have held the table whole
    assert result["peak_rss_mb"] < 4096 and np.isfinite(result["losses"]).all()
    held = [s["tables"]["big/emb"]["primary_keys"] for s in servers]
    assert len(held) == 2 and all(h > 0 for h in held)  # spread over both servers ...
    assert sum(held) <= 40 * 256 * 8  # ... the rows batches touched, never 2**26
    assert all(s["rss_bytes"] < cap << 20 for s in servers)
