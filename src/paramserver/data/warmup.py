"""The readers' warm-up: the parsing and deduplication kernels of the formats a job reads,
loaded (or compiled) on three tiny lines before a worker registers (``_runtime/warm.py``)."""

from __future__ import annotations

import os
import tempfile

from paramserver.data.reader import Batch, DataFormat, read_all

_LINES = {"criteo": "1\t" + "\t".join(["1"] * 13 + ["a1b2c3d4"] * 26) + "\n", "libsvm": "1 3:1 7:0.5\n"}


def sample_batches(formats: tuple[str, ...] = ("criteo", "libsvm")) -> list[Batch]:
    """A batch of three lines of each of ``formats`` with a sample (csv and avazu have none:
    their kernels load on the first batch), parsed and deduplicated once."""
    batches = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in formats:
            if name not in _LINES:
                continue
            path = os.path.join(tmp, name)
            with open(path, "w") as f:
                f.write(_LINES[name] * 3)
            batch = read_all([path], DataFormat(name))
            batch.unique()
            batches.append(batch)
    return batches
