"""The cyclic garbage collector during start-up.

Start-up makes ~175 000 objects that live as long as the process (numba's kernels and
types, the package's modules): collecting over them found nothing and took 0.03-0.08 s,
whenever it struck.  The collector is paused while they are made (``paused``: the
package's import, a launcher's warm-up, the command until its nodes are up), then they
are frozen out of it and it runs again (``resume``).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused() -> Iterator[None]:
    """No cyclic collection inside; the collector as it was after."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def resume() -> None:
    """Freeze what start-up made out of the cyclic collector, and turn it back on."""
    gc.freeze()
    gc.enable()
