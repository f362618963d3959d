"""Update rules as plug-ins: ``@paramserver.rule`` and how servers find one by name.

An update rule says what a push does to one row of a table::

    # mypackage/rules.py
    import paramserver

    @paramserver.rule(state_width=0, params={"lr": 0.1, "clip": 1.0})
    def clipped_sgd(value, state, grad, hp):
        lr, clip = hp[0], hp[1]
        for j in range(value.shape[0]):
            g = min(max(grad[j], -clip), clip)
            value[j] -= lr * g

    client.create_table("w", dim=8, optimizer="mypackage.rules:clipped_sgd")          # defaults
    client.create_table("v", dim=8, optimizer={"name": "mypackage.rules:clipped_sgd", "lr": 0.5})

* ``value`` (``dim`` floats), ``state`` (``state_width`` floats) and ``grad`` (``dim``)
  are float32 1-D views of one row; the rule changes ``value`` and ``state`` in place.
  ``hp`` is a float32 array of the hyper-parameters, in the order ``params`` declares.
* ``state_width`` is an int or a function of ``dim`` (``lambda dim: 2 * dim``); a key's
  state starts at zeros, or at what ``init(state, hp)`` sets (a function like the rule).
* The rule is compiled with numba (``nopython``): loops, ``math``, numpy on the views.
* A rule travels by its name, ``"module:function"``, never as code: the scheduler and
  every server import it when the table is created, so the module must be importable
  there (on ``PYTHONPATH``, or installed).  It is a plug-in of kind ``rule``
  (``paramserver.plugins``, ``docs/plugins.md``): a name that does not import is refused
  with the module, what it holds and the fix.

The built-in optimisers (``sgd``, ``adagrad``, ``ftrl``, ``adam``, ``rmsprop``,
``ftrl_adagrad``) are rules of this kind too (``tables/update_rules.py``); their kernels are
compiled ahead and cached; a user's rule's kernels are compiled the first time a table of
it is created (a few seconds) and cached on disk for later runs (``store/kernels.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from paramserver.errors import ConfigError
from paramserver.plugins import Kind, declare, load_plugin, register

StateWidth = int | Callable[[int], int]


class Rule:
    """An update rule: the Python function, its hyper-parameters and its state's width."""

    def __init__(self, fn: Callable[..., Any], state_width: StateWidth = 0,
                 params: Sequence[str] | Mapping[str, float] = (), init: Callable[..., Any] | None = None) -> None:
        if not callable(fn):
            raise ConfigError(f"@paramserver.rule decorates a function, got {fn!r}")
        self.fn, self.init = fn, init
        self.name = f"{fn.__module__}:{fn.__qualname__}"
        if isinstance(params, Mapping):
            self.params = tuple(str(k) for k in params)
            self.defaults = {str(k): float(v) for k, v in params.items()}
        else:
            self.params, self.defaults = tuple(str(p) for p in params), {}
        if len(set(self.params)) != len(self.params):
            raise ConfigError(f"rule {self.name}: params {self.params} repeat a name")
        if not (callable(state_width) or (isinstance(state_width, int) and state_width >= 0)):
            raise ConfigError(f"rule {self.name}: state_width must be an int >= 0 or a function of dim, "
                              f"got {state_width!r}")
        self._state_width = state_width
        self._jitted: tuple[Any, Any] | None = None
        self.__doc__ = fn.__doc__
        self.__name__ = fn.__name__

    def __call__(self, *args: Any) -> Any:
        """The rule itself, in Python (a reference for tests)."""
        return self.fn(*args)

    def __repr__(self) -> str:
        return f"Rule({self.name}, params={self.params})"

    def state_width(self, dim: int) -> int:
        width = self._state_width(dim) if callable(self._state_width) else self._state_width
        if isinstance(width, bool) or not isinstance(width, int) or width < 0:
            raise ConfigError(f"rule {self.name}: state_width({dim}) must be an int >= 0, got {width!r}")
        return width

    def values(self, given: Mapping[str, Any]) -> tuple[float, ...]:
        """The hyper-parameters in declared order, from ``given`` and the defaults."""
        unknown = set(given) - set(self.params)
        if unknown:
            raise ConfigError(f"rule {self.name} takes {list(self.params)}, got unknown {sorted(unknown)}")
        missing = [p for p in self.params if p not in given and p not in self.defaults]
        if missing:
            raise ConfigError(f"rule {self.name} needs {missing} (it declares no default for them): pass "
                              f"them with the optimizer, e.g. {{'name': '{self.name}', '{missing[0]}': 0.1}}")
        out = []
        for p in self.params:
            raw = given.get(p, self.defaults.get(p))
            try:
                v = float(raw)
            except (TypeError, ValueError):
                raise ConfigError(f"rule {self.name}: {p} must be a number, got {raw!r}") from None
            if not math.isfinite(v):
                raise ConfigError(f"rule {self.name}: {p} must be finite, got {v!r}")
            out.append(v)
        return tuple(out)

    def jitted(self) -> tuple[Any, Any]:
        """The rule and its ``init`` compiled with numba (``init`` None if none)."""
        if self._jitted is None:
            from numba import njit

            self._jitted = (njit(nogil=True)(self.fn), njit(nogil=True)(self.init) if self.init else None)
        return self._jitted


def rule(state_width: StateWidth = 0, params: Sequence[str] | Mapping[str, float] = (),
         init: Callable[..., Any] | None = None) -> Callable[[Callable[..., Any]], Rule]:
    """Declare an update rule ``f(value, state, grad, hp)`` (see the module's doc).

    Args:
        state_width: floats of state per row: an int, or a function of ``dim``.
        params: the hyper-parameters' names, in ``hp``'s order; a dict gives defaults.
        init: ``init(state, hp)`` sets a new key's state (zeros if None).
    """
    def wrap(fn: Callable[..., Any]) -> Rule:
        return Rule(fn, state_width, params, init)
    return wrap


#: the names the shipped plug-ins are known by (``"paramserver.functions:top_k"``), kept
#: when their modules moved into ``tables/``: a name is part of a table's spec and a call
#: (old spellings now: the built-ins are registered by name, ``"top_k"``)
SHIPPED = {"paramserver.functions": "paramserver.tables.functions", "paramserver.rules": "paramserver.tables.rules"}
_OPTIMIZERS = {"sgd": "SGD", "adagrad": "AdaGrad", "ftrl": "FTRL", "adam": "Adam", "rmsprop": "RMSProp",
               "ftrl_adagrad": "FtrlAdagrad"}

RULE = declare(Kind(
    "rule", "update rule", "a function decorated with @paramserver.rule(...)", lambda obj: isinstance(obj, Rule),
    "the scheduler and every server", "mypackage.rules:clipped_sgd", fix="decorate {attr} with @paramserver.rule(...)",
    moved=SHIPPED, settings=False))
for _name, _cls in _OPTIMIZERS.items():  # integer kinds, built by tables/optim.py (which imports this module)
    register("rule", _name, f"paramserver.tables.optim:{_cls}")


def load_rule(name: str) -> Rule:
    """The rule ``"module:function"`` names, imported (the server's way to find it)."""
    obj = load_plugin(RULE, name).obj
    if not isinstance(obj, Rule):  # a built-in optimiser's name: tables/optim.py builds those
        raise ConfigError(f"update rule {name!r} is a built-in optimiser, not a @paramserver.rule: pass it as the "
                          f"table's optimizer ({name!r}), which builds it")
    return obj
