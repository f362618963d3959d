"""Server-side optimisers and initialisers: validated specs and the numba update rule.

Sorted by increasing complexity: SGD → AdaGrad → FTRL-Proximal → Adam, then
FTRL+AdaGrad (a factorization machine's row: FTRL on the linear weight, AdaGrad on the
factors).  A table row is
``[value (dim) | optimiser state (state_width(dim))]`` in one float32 row, so an update
touches one cache line for small ``dim``.  Arithmetic is done in float64, stored float32.

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

SGD_KIND, ADAGRAD_KIND, FTRL_KIND, ADAM_KIND, FTRL_ADAGRAD_KIND = 0, 1, 2, 3, 4
ZEROS_KIND, NORMAL_KIND, UNIFORM_KIND = 0, 1, 2


def _check(name: str, value: float, ok: bool, rule: str, fix: str) -> None:
    if not ok or not math.isfinite(value):
        raise ConfigError(f"{name} must be {rule} and finite, got {value!r}; {fix}")


class _Spec:
    """Common wire form for optimiser and initialiser specs."""

    name: ClassVar[str]
    kind: ClassVar[int]
    registry: ClassVar[dict[str, type[_Spec]]]

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
            spec = parse_text(spec)
        if not isinstance(spec, dict) or "name" not in spec:
            raise ConfigError(f"expected one of {sorted(cls.registry)} or a spec object, got {spec!r}")
        params = dict(spec)
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


def parse_text(text: str) -> dict[str, Any]:
    """``"NAME[:key=value,...]"`` (the CLI's ``--optimizer`` syntax) as a wire dict."""
    name, _, params = text.partition(":")
    spec: dict[str, Any] = {"name": name.strip()}
    for item in filter(None, (p.strip() for p in params.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise ConfigError(f"parameters are key=value, got {item!r} in {text!r} (e.g. ftrl:alpha=0.1,l1=1)")
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

    def __post_init__(self) -> None:
        _check("sgd lr", self.lr, self.lr > 0, "> 0", "try lr=0.01")

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

    def __post_init__(self) -> None:
        _check("adagrad lr", self.lr, self.lr > 0, "> 0", "try lr=0.05")
        _check("adagrad eps", self.eps, self.eps >= 0, ">= 0", "try eps=1e-10")
        _check("adagrad initial_accumulator", self.initial_accumulator,
               self.initial_accumulator >= 0, ">= 0", "try 0.0 or 0.1")
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

    def __post_init__(self) -> None:
        _check("ftrl alpha", self.alpha, self.alpha > 0, "> 0", "try alpha=0.05")
        _check("ftrl beta", self.beta, self.beta >= 0, ">= 0", "try beta=1.0")
        _check("ftrl l1", self.l1, self.l1 >= 0, ">= 0", "use l1=0 for no L1")
        _check("ftrl l2", self.l2, self.l2 >= 0, ">= 0", "use l2=0 for no L2")
        if self.beta == 0 and self.l2 == 0:
            raise ConfigError("ftrl needs beta > 0 or l2 > 0 (else the first step divides by 0)")

    def state_width(self, dim: int) -> int:
        return 2 * dim


@dataclass(frozen=True)
class Adam(Optimizer):
    """Adam with a per-row step count (lazy/sparse Adam: rows step when pushed)."""

    lr: float = 0.001
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    name: ClassVar[str] = "adam"
    kind: ClassVar[int] = ADAM_KIND

    def __post_init__(self) -> None:
        _check("adam lr", self.lr, self.lr > 0, "> 0", "try lr=0.001")
        _check("adam beta1", self.beta1, 0 <= self.beta1 < 1, "in [0, 1)", "try beta1=0.9")
        _check("adam beta2", self.beta2, 0 <= self.beta2 < 1, "in [0, 1)", "try beta2=0.999")
        _check("adam eps", self.eps, self.eps > 0, "> 0", "try eps=1e-8")

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

    def __post_init__(self) -> None:
        _check("normal mean", self.mean, True, "a number", "")
        _check("normal std", self.std, self.std >= 0, ">= 0", "try std=0.01")
        _check("normal zero_columns", self.zero_columns, self.zero_columns >= 0 and self.zero_columns % 1 == 0,
               "a whole number >= 0", "try zero_columns=1")


@dataclass(frozen=True)
class Uniform(Initializer):
    low: float = -0.01
    high: float = 0.01
    name: ClassVar[str] = "uniform"
    kind: ClassVar[int] = UNIFORM_KIND

    def __post_init__(self) -> None:
        _check("uniform low", self.low, True, "a number", "")
        _check("uniform high", self.high, self.high >= self.low, ">= low", "swap low and high")


for _cls in (SGD, AdaGrad, FTRL, Adam, FtrlAdagrad):
    Optimizer.registry[_cls.name] = _cls
for _init in (Zeros, Normal, Uniform):
    Initializer.registry[_init.name] = _init


# ---- numba kernels ---------------------------------------------------------------------

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_S11 = np.uint64(11)


@njit(inline="always", nogil=True, cache=True)
def _unit(key, seed, j):
    """A uniform in [0, 1) that depends only on (seed, key, j)."""
    h = hash64(hash64(key ^ seed) + np.uint64(j + 1) * _GOLDEN)
    return np.float64(h >> _S11) * (1.0 / 9007199254740992.0)


@njit(inline="always", nogil=True, cache=True)
def init_value(key, j, ikind, ihp, seed):
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
def init_row(rows, s, key, dim, width, okind, ohp, ikind, ihp, seed):
    """Fill row ``s`` for a key seen for the first time: initial value, fresh state."""
    for j in range(dim):
        rows[s, j] = init_value(key, j, ikind, ihp, seed)
    fill = ohp[2] if okind == ADAGRAD_KIND else 0.0
    for j in range(dim, width):
        rows[s, j] = fill
    if okind == FTRL_ADAGRAD_KIND:  # [z, n] of the linear weight, then the factors' accumulators
        for j in range(dim + 2, width):
            rows[s, j] = ohp[6]


@njit(inline="always", nogil=True, cache=True)
def _ftrl(rows, s, j, zj, nj, g, alpha, beta, l1, l2):
    """One FTRL-Proximal step of column ``j`` whose state is in columns ``zj`` and ``nj``."""
    w = np.float64(rows[s, j])
    n = np.float64(rows[s, nj])
    n_new = n + g * g
    z = np.float64(rows[s, zj]) + g - (math.sqrt(n_new) - math.sqrt(n)) / alpha * w
    rows[s, zj] = z
    rows[s, nj] = n_new
    if abs(z) <= l1:
        rows[s, j] = 0.0
    else:
        sign = 1.0 if z > 0 else -1.0
        rows[s, j] = -(z - sign * l1) / ((beta + math.sqrt(n_new)) / alpha + l2)


@njit(inline="always", nogil=True, cache=True)
def update_row(rows, s, grads, i, dim, okind, ohp):
    """Apply gradient ``grads[i]`` to row ``s`` with the table's optimiser."""
    if okind == SGD_KIND:
        lr = ohp[0]
        for j in range(dim):
            rows[s, j] = rows[s, j] - lr * grads[i, j]
    elif okind == ADAGRAD_KIND:
        lr, eps = ohp[0], ohp[1]
        for j in range(dim):
            g = np.float64(grads[i, j])
            a = rows[s, dim + j] + g * g
            rows[s, dim + j] = a
            rows[s, j] = rows[s, j] - lr * g / (math.sqrt(np.float64(rows[s, dim + j])) + eps)
    elif okind == FTRL_KIND:
        for j in range(dim):
            _ftrl(rows, s, j, dim + j, 2 * dim + j, np.float64(grads[i, j]), ohp[0], ohp[1], ohp[2], ohp[3])
    elif okind == FTRL_ADAGRAD_KIND:
        _ftrl(rows, s, 0, dim, dim + 1, np.float64(grads[i, 0]), ohp[0], ohp[1], ohp[2], ohp[3])
        lr, eps = ohp[4], ohp[5]
        for j in range(1, dim):
            g = np.float64(grads[i, j])
            a = rows[s, dim + 1 + j] + g * g
            rows[s, dim + 1 + j] = a
            rows[s, j] = rows[s, j] - lr * g / (math.sqrt(np.float64(rows[s, dim + 1 + j])) + eps)
    else:  # ADAM_KIND
        lr, b1, b2, eps = ohp[0], ohp[1], ohp[2], ohp[3]
        t = np.float64(rows[s, 3 * dim]) + 1.0
        rows[s, 3 * dim] = t
        c1 = 1.0 - b1**t
        c2 = 1.0 - b2**t
        for j in range(dim):
            g = np.float64(grads[i, j])
            m = b1 * rows[s, dim + j] + (1.0 - b1) * g
            v = b2 * rows[s, 2 * dim + j] + (1.0 - b2) * g * g
            rows[s, dim + j] = m
            rows[s, 2 * dim + j] = v
            rows[s, j] = rows[s, j] - lr * (m / c1) / (math.sqrt(v / c2) + eps)
