"""Admission policies: which keys a table stores, of those a push carries that it does not
hold yet.  A policy is a plug-in of kind ``policy`` (``paramserver.plugins``,
``docs/plugins.md``): a built-in's name with settings (``after:n=2``, ``prob:p=0.25``;
``after:2``, the old spelling, still loads) or a user's class by
``"module:Class[:key=value,...]"``, a subclass of ``AdmissionPolicy``, imported by name
on the servers.

A key not admitted is not stored: a pull reads the table's initial value, and the update
is counted (``LifeStats.refused``) but not applied.  Only a vnode's primary decides; its
backups store what it stored (the forwarded push carries only those keys), so a failover
never finds a key on one copy and not the other.  A new primary starts counting afresh:
the sightings of keys not yet admitted are the one thing a failover forgets.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from paramserver.errors import ConfigError
from paramserver.lifecycle.sketch import Sightings
from paramserver.plugins import Kind, declare, load_plugin, register
from paramserver.routing.hashing import hash64_array


class AdmissionPolicy:
    """Base of admission policies: ``admit(keys, time)`` says which of ``keys`` (distinct,
    none of them stored yet on this server) to store now.  Settings come as keyword
    arguments (numbers), from the spec's ``:key=value`` part.  A policy that sets
    ``wants_stats`` is called ``admit(keys, time, stats)``, ``stats`` being
    ``float32[len(keys), 2]``: each key's shows and clicks in the push
    (``Client.push(..., stats=)``; one show and no click a key where the pusher gave none)."""

    name: ClassVar[str] = "policy"
    wants_stats: ClassVar[bool] = False

    def admit(self, keys: np.ndarray, time: float, stats: np.ndarray | None = None) -> np.ndarray:
        raise NotImplementedError

    @property
    def nbytes(self) -> int:
        """Memory the policy holds (reported with the table's)."""
        return 0


class AfterN(AdmissionPolicy):
    """Store a key at its ``n``-th sighting (a push that carries it), counted in a sketch
    of about 2 bytes a key (``lifecycle/sketch.py``, whose docstring gives the rate of
    false admissions).  ``max_mb``: the most the sketch may take on a server."""

    name = "after"

    def __init__(self, n: float = 2, max_mb: float = 64) -> None:
        if not float(n).is_integer() or not 1 <= n <= 255:
            raise ConfigError(f"admission after:N needs an integer N in [1, 255] (sightings), got {n!r}")
        if not 0 < max_mb <= 1 << 20:
            raise ConfigError(f"admission after: max_mb must be in (0, 2**20], got {max_mb!r}")
        self.n = int(n)
        self.sketch = Sightings(self.n, int(max_mb * (1 << 20))) if self.n > 1 else None

    def admit(self, keys: np.ndarray, time: float, stats: np.ndarray | None = None) -> np.ndarray:
        if self.sketch is None:
            return np.ones(keys.shape[0], bool)
        return self.sketch.see(keys)

    @property
    def nbytes(self) -> int:
        return self.sketch.nbytes if self.sketch is not None else 0


class Probabilistic(AdmissionPolicy):
    """Store a key with probability ``p`` at each sighting, keeping no count (Monolith's:
    a key seen c times is stored with probability 1 - (1 - p)**c)."""

    name = "prob"

    def __init__(self, p: float = 0.25, seed: float = 0) -> None:
        if not 0 < p <= 1:
            raise ConfigError(f"admission prob:P needs P in (0, 1], got {p!r}")
        self.p = float(p)
        self._draws = int(seed)

    def admit(self, keys: np.ndarray, time: float, stats: np.ndarray | None = None) -> np.ndarray:
        self._draws += 1  # another draw for each call: a key seen again gets another chance
        u = hash64_array(keys ^ np.uint64((self._draws * 0x9E3779B97F4A7C15) % (1 << 64)))
        admitted: np.ndarray = u < np.uint64(min(int(self.p * 2.0**64), 2**64 - 1))
        return admitted


class Score(AdmissionPolicy):
    """Store a key once its score, ``show`` a show plus ``click`` a click summed over the
    pushes that carried it, reaches ``threshold`` (Paddle's CTR accessor: 0.1, 1 and 10
    by default).  Pushes carry each key's shows and clicks (``Client.push(stats=...)``;
    ``paramserver train`` sends them); the score is counted in units of the smaller
    weight, in the sketch of ``after:N`` (8-bit counters: ``threshold`` at most 255 units)."""

    name = "score"
    wants_stats = True

    def __init__(self, threshold: float = 10.0, show: float = 0.1, click: float = 1.0, max_mb: float = 64) -> None:
        if not (show > 0 and click > 0 and threshold > 0):
            raise ConfigError(f"admission score needs threshold, show and click > 0, got {threshold!r}, {show!r}, "
                              f"{click!r}")
        self.unit = min(show, click)
        units = round(threshold / self.unit)
        if not 1 <= units <= 255:
            raise ConfigError(f"admission score: threshold/min(show, click) must be in [1, 255] (it is counted in "
                              f"8-bit units of {self.unit:g}), got {threshold / self.unit:g}; e.g. score:10")
        self.show, self.click = show, click
        self.sketch = Sightings(units, int(max_mb * (1 << 20)), bits=8)

    def admit(self, keys: np.ndarray, time: float, stats: np.ndarray | None = None) -> np.ndarray:
        shows = stats[:, 0] if stats is not None else np.ones(keys.shape[0])
        clicks = stats[:, 1] if stats is not None else np.zeros(keys.shape[0])
        units = np.rint((self.show * shows + self.click * clicks) / self.unit)
        return self.sketch.see(keys, np.clip(units, 0, 255))

    @property
    def nbytes(self) -> int:
        return self.sketch.nbytes


BUILTIN: dict[str, type[AdmissionPolicy]] = {"after": AfterN, "prob": Probabilistic, "score": Score}
POLICY = declare(Kind(
    "policy", "admission policy", "a subclass of AdmissionPolicy (paramserver.lifecycle)",
    lambda obj: isinstance(obj, type) and issubclass(obj, AdmissionPolicy), "every server",
    "mypkg.policies:Mine:n=3", positional=True))
for _name, _cls in BUILTIN.items():
    register("policy", _name, _cls)


def load_policy(text: str) -> AdmissionPolicy:
    """The policy ``text`` names, built: ``after:n=3,max_mb=16``, ``prob:p=0.25``,
    ``score:threshold=10,show=0.1,click=1`` or ``module:Class[:key=value,...]``; a bare
    value (``after:2``, ``prob:0.25``, ``score:10``: the old spelling) is the first setting."""
    plugin = load_plugin(POLICY, text)
    args = [_float(text, v, v) for v in plugin.args]
    kwargs = {key: _float(text, f"{key}={v}", v) for key, v in plugin.settings}
    try:
        made: AdmissionPolicy = plugin.obj(*args, **kwargs)
    except TypeError as exc:
        raise ConfigError(f"admission policy {text!r}: {exc}") from None
    return made


def _float(text: str, item: str, value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ConfigError(f"admission policy {text!r}: {item!r} is not a number (e.g. after:n=2, "
                          "prob:p=0.25)") from None
