"""Server-side optimisers and initialisers: validated specs and the initialisers' kernels
(the rules' arithmetic: ``tables/update_rules.py``).

Sorted by increasing complexity: SGD → AdaGrad → FTRL-Proximal → Adam, then
FTRL+AdaGrad (a factorization machine's row: FTRL on the linear weight, AdaGrad on the
factors).  A table row is
``[value (dim) | optimiser state (state_width(dim))]`` in one float32 row, so an update
touches one cache line for small ``dim``.  Arithmetic is done in float64, stored float32
(or 16 bits a column, ``TableSpec.storage``: the rules then run on a float32 copy of the row).

Each spec is a frozen dataclass checked when it is built; it travels on the wire as a
plain dict (``to_wire``/``from_wire``), never pickled.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

import numpy as np
from numba import njit

from paramserver.errors import ConfigError
from paramserver.routing.hashing import hash64
from paramserver.tables.bounds import check, check_bounds

SGD_KIND, ADAGRAD_KIND, FTRL_KIND, ADAM_KIND, FTRL_ADAGRAD_KIND, RMSPROP_KIND = 0, 1, 2, 3, 4, 5
#: where FTRL's and FTRL+AdaGrad's ``params()`` keep ``1 / alpha``, after their fields
FTRL_INV_ALPHA, FTRL_ADAGRAD_INV_ALPHA = 4, 7
CUSTOM_KIND = -1  # a user's rule (``paramserver.tables.rules``): its table has kernels of its own
ZEROS_KIND, NORMAL_KIND, UNIFORM_KIND = 0, 1, 2


class _Spec:
    """Common wire form for optimiser and initialiser specs.

    Each hyper-parameter's rule is declared once, in ``bounds`` (field -> a rule of
    ``tables/bounds.py``), and checked when the spec is built; ``fixes`` overrides the
    fix its error gives (``try <field>=<its default>``)."""

    name: ClassVar[str]
    kind: ClassVar[int]
    registry: ClassVar[dict[str, type[_Spec]]]
    bounds: ClassVar[dict[str, str]] = {}
    fixes: ClassVar[dict[str, str]] = {}

    def __post_init__(self) -> None:
        check_bounds(self, self.bounds, self.fixes)

    def params(self) -> np.ndarray:
        return np.array([getattr(self, f.name) for f in fields(self)], np.float64)  # type: ignore[arg-type]

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name, **asdict(self)}  # type: ignore[call-overload]

    @classmethod
    def parse(cls, spec: Any) -> Any:
        """Accept an instance, a name (defaults), or a wire dict ``{"name": ..., **params}``."""
        if isinstance(spec, cls):
            return spec
        if isinstance(spec, str):
            module, _, rest = spec.partition(":")
            function, _, text = rest.partition(":")
            if cls is Optimizer and module.strip().lower() not in cls.registry and function and "=" not in function:
                spec = {**parse_text(f"rule:{text}"), "name": f"{module.strip()}:{function.strip()}"}
            else:
                spec = parse_text(spec)
        if not isinstance(spec, dict) or "name" not in spec:
            raise ConfigError(f"expected one of {sorted(cls.registry)} or a spec object, got {spec!r}")
        params: dict[str, Any] = dict(spec)
        if cls is Optimizer and ":" in str(params["name"]):  # a user's rule, "module:function"
            return CustomRule.named(str(params.pop("name")), params)
        name = str(params.pop("name")).lower()
        if name not in cls.registry:
            raise ConfigError(f"unknown {cls.__name__.lower()} {name!r} (known: {sorted(cls.registry)})")
        sub = cls.registry[name]
        known = {f.name for f in fields(sub)}  # type: ignore[arg-type]
        extra = set(params) - known
        if extra:
            raise ConfigError(f"{name} takes {sorted(known)}, got unknown {sorted(extra)}")
        try:
            return sub(**{k: float(v) for k, v in params.items()})
        except (TypeError, ValueError) as exc:
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(f"{name}: hyper-parameters must be numbers, got {params}") from exc


def parse_text(text: str, words: tuple[str, ...] = ()) -> dict[str, Any]:
    """``"NAME[:key=value,...]"`` (the CLI's ``--optimizer`` syntax) as a wire dict; a value
    that is one of ``words`` (``train``'s ``auto``) is kept as that word, every other a number."""
    name, _, params = text.partition(":")
    spec: dict[str, Any] = {"name": name.strip()}
    for item in filter(None, (p.strip() for p in params.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise ConfigError(f"parameters are key=value, got {item!r} in {text!r} (e.g. ftrl:alpha=0.1,l1=1)")
        if key.strip() in spec:
            raise ConfigError(f"{key.strip()} is given twice in {text!r}: give each parameter once")
        if value.strip() in words:
            spec[key.strip()] = value.strip()
            continue
        try:
            spec[key.strip()] = float(value)
        except ValueError:
            raise ConfigError(f"{key.strip()}={value!r} in {text!r} is not a number") from None
    return spec


class Optimizer(_Spec):
    """Base of the server-side optimisers."""

    registry: ClassVar[dict[str, type[_Spec]]] = {}

    def state_width(self, dim: int) -> int:
        raise NotImplementedError


@dataclass(frozen=True)
class SGD(Optimizer):
    """``w -= lr * g``."""

    lr: float = 0.01
    name: ClassVar[str] = "sgd"
    kind: ClassVar[int] = SGD_KIND

    bounds: ClassVar[dict[str, str]] = {"lr": "> 0"}

    def state_width(self, dim: int) -> int:
        return 0


@dataclass(frozen=True)
class AdaGrad(Optimizer):
    """``a += g²; w -= lr * g / (sqrt(a) + eps)``; ``a`` starts at ``initial_accumulator``."""

    lr: float = 0.05
    eps: float = 1e-10
    initial_accumulator: float = 0.0
    name: ClassVar[str] = "adagrad"
    kind: ClassVar[int] = ADAGRAD_KIND

    bounds: ClassVar[dict[str, str]] = {"lr": "> 0", "eps": ">= 0", "initial_accumulator": ">= 0"}
    fixes: ClassVar[dict[str, str]] = {"initial_accumulator": "try 0.0 or 0.1"}

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.eps == 0 and self.initial_accumulator == 0:
            raise ConfigError("adagrad needs eps > 0 or initial_accumulator > 0 to avoid 0/0")

    def state_width(self, dim: int) -> int:
        return dim


@dataclass(frozen=True)
class FTRL(Optimizer):
    """FTRL-Proximal (McMahan et al. 2013, algorithm 1), per coordinate.

    State ``z, n``; the weight is ``0`` when ``|z| <= l1`` (exact sparsity), else
    ``-(z - sign(z) l1) / ((beta + sqrt(n)) / alpha + l2)``.
    """

    alpha: float = 0.05
    beta: float = 1.0
    l1: float = 1.0
    l2: float = 0.0
    name: ClassVar[str] = "ftrl"
    kind: ClassVar[int] = FTRL_KIND

    bounds: ClassVar[dict[str, str]] = {"alpha": "> 0", "beta": ">= 0", "l1": ">= 0", "l2": ">= 0"}
    fixes: ClassVar[dict[str, str]] = {"l1": "use l1=0 for no L1", "l2": "use l2=0 for no L2"}

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.beta == 0 and self.l2 == 0:
            raise ConfigError("ftrl needs beta > 0 or l2 > 0 (else the first step divides by 0)")

    def state_width(self, dim: int) -> int:
        return 2 * dim

    def params(self) -> np.ndarray:
        return np.append(super().params(), 1.0 / self.alpha)  # hp[FTRL_INV_ALPHA]


@dataclass(frozen=True)
class Adam(Optimizer):
    """Adam with a per-row step count (lazy/sparse Adam: rows step when pushed)."""

    lr: float = 0.001
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    name: ClassVar[str] = "adam"
    kind: ClassVar[int] = ADAM_KIND

    bounds: ClassVar[dict[str, str]] = {"lr": "> 0", "beta1": "in [0, 1)", "beta2": "in [0, 1)", "eps": "> 0"}

    def state_width(self, dim: int) -> int:
        return 2 * dim + 1


@dataclass(frozen=True)
class FtrlAdagrad(Optimizer):
    """A factorization machine's row ``[w, v_1..v_k]``: FTRL-Proximal on column 0 (the
    linear weight: ``alpha, beta, l1, l2``, sparse like a linear model's) and AdaGrad on the
    others (the factors: ``lr, eps, initial_accumulator``), which FTRL would pull back
    to zero from their random start.  State ``[z, n, a_1..a_k]``."""

    alpha: float = 0.05
    beta: float = 1.0
    l1: float = 0.0
    l2: float = 0.0
    lr: float = 0.005
    eps: float = 1e-10
    initial_accumulator: float = 1.0
    name: ClassVar[str] = "ftrl_adagrad"
    kind: ClassVar[int] = FTRL_ADAGRAD_KIND

    def __post_init__(self) -> None:
        FTRL(self.alpha, self.beta, self.l1, self.l2)  # the same rules, the same messages
        AdaGrad(self.lr, self.eps, self.initial_accumulator)

    def state_width(self, dim: int) -> int:
        return 2 + (dim - 1)

    def params(self) -> np.ndarray:
        return np.append(super().params(), 1.0 / self.alpha)  # hp[FTRL_ADAGRAD_INV_ALPHA]


@dataclass(frozen=True)
class RMSProp(Optimizer):
    """``s = rho * s + (1 - rho) * g²; w -= lr * g / (sqrt(s) + eps)`` (Tieleman and
    Hinton's, which the source documents name)."""

    lr: float = 0.001
    rho: float = 0.9
    eps: float = 1e-8
    name: ClassVar[str] = "rmsprop"
    kind: ClassVar[int] = RMSPROP_KIND

    bounds: ClassVar[dict[str, str]] = {"lr": "> 0", "rho": "in [0, 1)", "eps": "> 0"}

    def state_width(self, dim: int) -> int:
        return dim


@dataclass(frozen=True)
class CustomRule(Optimizer):
    """A user's update rule (``paramserver.tables.rules``), named ``"module:function"`` and
    imported where the table is created; ``values`` are its hyper-parameters in the
    order it declares them."""

    rule_name: str
    values: tuple[float, ...] = ()
    kind: ClassVar[int] = CUSTOM_KIND

    @classmethod
    def named(cls, name: str, params: dict[str, Any]) -> CustomRule:
        from paramserver.tables.rules import load_rule

        return cls(name, load_rule(name).values(params))

    @property
    def rule(self) -> Any:
        from paramserver.tables.rules import load_rule

        return load_rule(self.rule_name)

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.rule_name

    def params(self) -> np.ndarray:
        return np.array(self.values, np.float32)  # the rule's hp: float32, in its declared order

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.rule_name, **dict(zip(self.rule.params, self.values))}

    def state_width(self, dim: int) -> int:
        return int(self.rule.state_width(dim))


class Initializer(_Spec):
    """Base of the per-key initialisers: a key's initial row depends only on (seed, key)."""

    registry: ClassVar[dict[str, type[_Spec]]] = {}


@dataclass(frozen=True)
class Zeros(Initializer):
    name: ClassVar[str] = "zeros"
    kind: ClassVar[int] = ZEROS_KIND

    def params(self) -> np.ndarray:
        return np.zeros(2, np.float64)


@dataclass(frozen=True)
class Normal(Initializer):
    """N(mean, std²) per column; the first ``zero_columns`` columns start at 0 instead (an
    FM row's linear weight, which FTRL starts at 0, beside random factors)."""

    mean: float = 0.0
    std: float = 0.01
    zero_columns: float = 0.0
    name: ClassVar[str] = "normal"
    kind: ClassVar[int] = NORMAL_KIND

    bounds: ClassVar[dict[str, str]] = {"mean": "a number", "std": ">= 0", "zero_columns": "a whole number >= 0"}
    fixes: ClassVar[dict[str, str]] = {"zero_columns": "try zero_columns=1"}


@dataclass(frozen=True)
class Uniform(Initializer):
    low: float = -0.01
    high: float = 0.01
    name: ClassVar[str] = "uniform"
    kind: ClassVar[int] = UNIFORM_KIND

    bounds: ClassVar[dict[str, str]] = {"low": "a number"}

    def __post_init__(self) -> None:
        super().__post_init__()
        check("uniform high", self.high, self.high >= self.low, ">= low", "swap low and high")


for _cls in (SGD, AdaGrad, FTRL, Adam, FtrlAdagrad, RMSProp):
    Optimizer.registry[_cls.name] = _cls
for _init in (Zeros, Normal, Uniform):
    Initializer.registry[_init.name] = _init


# ---- numba kernels ---------------------------------------------------------------------

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_S11 = np.uint64(11)


@njit(inline="always", nogil=True, cache=True)
def _unit(key, seed, j):  # type: ignore[no-untyped-def]
    """A uniform in [0, 1) that depends only on (seed, key, j)."""
    h = hash64(hash64(key ^ seed) + np.uint64(j + 1) * _GOLDEN)
    return np.float64(h >> _S11) * (1.0 / 9007199254740992.0)


@njit(inline="always", nogil=True, cache=True)
def init_value(key, j, ikind, ihp, seed):  # type: ignore[no-untyped-def]
    """Initial value of column ``j`` of ``key``'s row."""
    if ikind == NORMAL_KIND:
        if j < ihp[2]:
            return 0.0
        u1 = _unit(key, seed, 2 * j)
        u2 = _unit(key, seed, 2 * j + 1)
        return ihp[0] + ihp[1] * math.sqrt(-2.0 * math.log(1.0 - u1)) * math.cos(2.0 * math.pi * u2)
    if ikind == UNIFORM_KIND:
        return ihp[0] + (ihp[1] - ihp[0]) * _unit(key, seed, j)
    return 0.0


@njit(inline="always", nogil=True, cache=True)
def init_row(rows, s, key, dim, width, okind, ohp, ikind, ihp, seed):  # type: ignore[no-untyped-def]
    """Fill row ``s`` for a key seen for the first time: initial value, fresh state."""
    for j in range(dim):
        rows[s, j] = init_value(key, j, ikind, ihp, seed)
    fill = ohp[2] if okind == ADAGRAD_KIND else 0.0
    for j in range(dim, width):
        rows[s, j] = fill
    if okind == FTRL_ADAGRAD_KIND:  # [z, n] of the linear weight, then the factors' accumulators
        for j in range(dim + 2, width):
            rows[s, j] = ohp[6]
