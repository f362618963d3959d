"""What a message's keys and values go through on the wire: one seam (``Filter``), the
built-in filters, and the chains a table's spec lists per direction (docs/filters.md).

    client.create_table("w", dim=16, optimizer="adagrad", filters="compact")
    client.create_table("v", filters="push=int8,keycache,delta,zstd;pull=keycache,delta,zstd;reply=fp16")
    paramserver train --filters lossless ...
"""

from paramserver.filters.base import Context, Filter, Parts
from paramserver.filters.chain import PRESETS, FilterSpec

__all__ = ["Context", "Filter", "FilterSpec", "PRESETS", "Parts"]
