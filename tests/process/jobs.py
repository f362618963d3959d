"""Worker functions the CLI test starts with ``paramserver worker --fn jobs:...``."""

import numpy as np


def push_ones(client):
    client.create_table("by-hand", dim=2, optimizer={"name": "sgd", "lr": 1.0})
    keys = np.arange(100, dtype=np.uint64)
    client.push("by-hand", keys, -np.ones((100, 2), np.float32)).result(timeout=30)
    client.barrier(timeout_s=30)
    return "pushed"
