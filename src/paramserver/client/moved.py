"""The client's names that moved into its groups (issue 45's curated client): ``Client``
keeps ≤ 25 public names of its own (the data plane, clocks and barriers, its tables,
``close``), and reaches the rest through ``client.admin`` (the cluster's administration)
and ``client.stats`` (what was measured).  The old spellings still work, each with a
one-time ``DeprecationWarning`` naming the new one."""

from __future__ import annotations

import warnings

#: old ``Client`` name -> the group that holds it now (under the same name)
MOVED = {
    **dict.fromkeys(("cluster_info", "ring", "remove_server", "server_joined", "servers_ready", "wait_for_servers",
                     "wait_for_workers", "shutdown_cluster", "create_table_spec", "create_namespace",
                     "drop_namespace", "namespaces"), "admin"),
    **dict.fromkeys(("server_stats", "consistency_stats", "filter_stats", "wire_totals", "bytes_sent",
                     "bytes_received", "counts", "losses", "allow_loss"), "stats"),
}

_said: set[str] = set()


def moved(name: str, group: str) -> str:
    """``name``, once it was said (once a process) that ``client.<name>`` is now ``client.<group>.<name>``."""
    if name not in _said:
        _said.add(name)
        warnings.warn(f"Client.{name} is now Client.{group}.{name}; the old name will go in a later release",
                      DeprecationWarning, stacklevel=3)
    return name
