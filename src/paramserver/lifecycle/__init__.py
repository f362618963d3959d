"""What happens to a table's keys over time: admission (``policies.py``, counted in
``sketch.py``), eviction and change tracking (``spec.py``'s ``Lifecycle``; run on the
servers by ``store/life.py``), and docs/lifecycle.md.

    client.create_table("w", optimizer="ftrl", lifecycle="admit=after:2;ttl=5e6;cap_keys=10000000")
    paramserver train --lifecycle "admit=after:2;ttl=5e6" ...
"""

from paramserver.lifecycle.policies import AdmissionPolicy
from paramserver.lifecycle.spec import Lifecycle

__all__ = ["AdmissionPolicy", "Lifecycle"]
