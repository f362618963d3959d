"""Worker functions the CLI test starts with ``paramserver worker --fn jobs:...``."""

import numpy as np


def push_ones(client):
    client.create_table("by-hand", dim=2, optimizer={"name": "sgd", "lr": 1.0})
    keys = np.arange(100, dtype=np.uint64)
    client.push("by-hand", keys, -np.ones((100, 2), np.float32)).result(timeout=30)
    client.barrier(timeout_s=30)
    return "pushed"


def train_a9a(client):
    """One worker trains a9a end to end (table, job, pass, test log loss): the multi-host test."""
    import os

    from paramserver.apps.ctr.modelfile import metrics
    from paramserver.apps.ctr.models import Model
    from paramserver.apps.ctr.test_set import score
    from paramserver.apps.ctr.train import TrainConfig
    from paramserver.apps.ctr.train_loop import train_worker
    from paramserver.data.reader import DataFormat, make_shards, read_all

    cfg = TrainConfig(Model("lr"), DataFormat("libsvm", label_format="pm1"))
    spec = cfg.table_spec()
    client.create_table(spec)  # the spec train itself creates, whole
    client.job.start(make_shards([os.environ["A9A_TRAIN"]]), 1)
    done = train_worker(client, cfg)
    batch = read_all([os.environ["A9A_TEST"]], cfg.data)
    logloss = metrics(batch.labels, score(client, cfg.model, batch))["logloss"]
    servers = sorted(client.admin.cluster_info()["servers"].values())
    return f"examples={done['examples']} logloss={logloss:.4f} servers={','.join(servers)}"
