"""A scheduler process: its node, and its HTTP and metrics ports only where asked for.

``paramserver scheduler`` (and a local cluster's scheduler) starts here.  The observer
(``observer.py``: Prometheus' client, the standard library's HTTP server and statistics)
is imported only with ``--http-port`` or ``--metrics-port``: a ``paramserver train``'s
scheduler, forked with the package loaded, listened ~15 ms sooner without it (6 runs each,
in turn: 0.136 s against 0.151 s after the driver's imports, medians).  The job itself
started no sooner there: its server, loading its kernels beside it, was the later one.
"""

from __future__ import annotations

from typing import Any

from paramserver._runtime.proctitle import set_title
from paramserver.config import Config


def run_scheduler(config: Config, on_ready: Any = None) -> None:
    """A scheduler node, with its HTTP port (``--http-port``) and its ``--metrics-port``
    (the cluster's aggregate there too) when asked for."""
    from paramserver.scheduler.node import SchedulerNode

    node = SchedulerNode(config)
    observer = None
    if config.http_port >= 0 or config.metrics_port >= 0:
        from paramserver.dashboard.observer import Observer
        from paramserver.observe.metrics import serve as serve_metrics

        observer = Observer(node.address, config.http_host, config.http_port if config.http_port >= 0 else None,
                            config.secret_file)
        node.http_url = observer.url
        if config.metrics_port >= 0:
            node.metrics_url = serve_metrics(lambda: observer.snapshot().wire(), config.http_host,
                                             config.metrics_port, observer.token)
    if on_ready:
        on_ready(node.address)
    set_title(f"scheduler {node.address}")
    try:
        node.run()
    finally:
        if observer is not None:
            observer.close()
