"""The readers' warm-up: the parsing and deduplication kernels of the formats a job reads,
loaded (or compiled) on three tiny lines before a worker registers (``_runtime/warm.py``).
A CSV file's (``avazu``, ``csv``) too: left to the first batch, a fresh install's first
Avazu job compiled them while its cluster waited (2 s)."""

from __future__ import annotations

import os
import tempfile

from paramserver.data.reader import Batch, DataFormat, read_all

#: each format's sample file (its header, a line written three times) and its label's column (csv)
_SAMPLES = {
    "criteo": ("", "1\t" + "\t".join(["1"] * 13 + ["a1b2c3d4"] * 26) + "\n", ""),
    "libsvm": ("", "1 3:1 7:0.5\n", ""),
    "avazu": ("id,click,hour,C1,banner_pos,site_id,site_domain,site_category,app_id,app_domain,app_category,"
              "device_id,device_ip,device_model,device_type,device_conn_type,C14,C15,C16,C17,C18,C19,C20,C21\n",
              "1,0,14102100,1005,0,1fbe01fe,f3845767,28905ebd,ecad2386,7801e8d9,07d7df22,a99f214a,96809ac8,"
              "711ee120,1,0,15704,320,50,1722,0,35,100084,79\n", ""),
    "csv": ("y,n,c\n", "1,7,a1b2\n", "y"),
}


def sample_batches(formats: tuple[str, ...] = ("criteo", "libsvm")) -> list[Batch]:
    """A batch of three lines of each of ``formats``, parsed and deduplicated once."""
    batches = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in formats:
            header, line, label = _SAMPLES[name]
            path = os.path.join(tmp, name)
            with open(path, "w") as f:
                f.write(header + line * 3)
            batch = read_all([path], DataFormat(name, label_column=label))
            batch.unique()
            batches.append(batch)
    return batches
