"""The built-in update rules' arithmetic (``optim.py`` has their specs): what a push of a
gradient does to a stored row, compiled into every table kernel through ``update_row``.

A row is ``[value (dim) | state]``, float32, the arithmetic float64.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import njit

from paramserver._runtime.intrinsics import sqrt_pair
from paramserver.tables.optim import (
    ADAGRAD_KIND,
    ADAM_KIND,
    FTRL_ADAGRAD_INV_ALPHA,
    FTRL_ADAGRAD_KIND,
    FTRL_INV_ALPHA,
    FTRL_KIND,
    SGD_KIND,
)

# Each is a rule of the kind users write (``paramserver.tables.rules``): ``f(value, state, grad,
# hp)`` over one row's views, ``hp`` the hyper-parameters in their spec's field order.
# The table kernels call them through ``update_row``'s switch, compiled and cached with
# the kernels; a user's rule gets kernels of its own (``paramserver.tables.rules.kernels_for``).
#
# Each rule's arithmetic is written once, over a row with offsets (``*_at(v, s, so, dim, grad,
# hp)``: value column j at ``v[j]``, state column j at ``s[so + j]``): the rule calls it with
# its two views (``so`` 0), ``update_row`` with the stored row as both (``so`` = ``dim``, the
# width the loops were compiled for).  Views cut from a row (``rows[s, :dim]``,
# ``rows[s, dim:]``) cost the request loops ~2 ns a key, their lengths known only at run time:
# an FTRL update took 20.3 ns against 18.4 on a table that stays in cache
# (``docs/benchmarks.md``, "The storage engine alone").


@njit(inline="always", nogil=True, cache=True)
def sgd_at(v, s, so, dim, grad, hp):  # type: ignore[no-untyped-def]
    lr = hp[0]
    for j in range(dim):
        v[j] = v[j] - lr * grad[j]


@njit(inline="always", nogil=True, cache=True)
def adagrad_at(v, s, so, dim, grad, hp):  # type: ignore[no-untyped-def]
    lr, eps = hp[0], hp[1]
    for j in range(dim):
        g = np.float64(grad[j])
        s[so + j] = s[so + j] + g * g
        v[j] = v[j] - lr * g / (math.sqrt(np.float64(s[so + j])) + eps)


@njit(inline="always", nogil=True, cache=True)
def _ftrl(value, state, j, zj, nj, g, inv_alpha, beta, l1, l2):  # type: ignore[no-untyped-def]
    """One FTRL-Proximal step of ``value[j]`` whose state is ``state[zj]``, ``state[nj]``.
    ``inv_alpha`` is ``1 / alpha``, computed once with the table's parameters (its
    ``params()``): two divisions a key became multiplications; the two square roots are
    one vector instruction.  The divider and the square-root unit bound this rule: the
    two cut its arithmetic from 9.3 to 5.6 ns a key (``docs/benchmarks.md``)."""
    w = np.float64(value[j])
    n = np.float64(state[nj])
    n_new = n + g * g
    root_new, root = sqrt_pair(n_new, n)
    z = np.float64(state[zj]) + g - (root_new - root) * inv_alpha * w
    state[zj] = z
    state[nj] = n_new
    if abs(z) <= l1:
        value[j] = 0.0
    else:
        sign = 1.0 if z > 0 else -1.0
        value[j] = -(z - sign * l1) / ((beta + root_new) * inv_alpha + l2)


@njit(inline="always", nogil=True, cache=True)
def ftrl_at(v, s, so, dim, grad, hp):  # type: ignore[no-untyped-def]
    for j in range(dim):
        _ftrl(v, s, j, so + j, so + dim + j, np.float64(grad[j]), hp[FTRL_INV_ALPHA], hp[1], hp[2], hp[3])


@njit(inline="always", nogil=True, cache=True)
def ftrl_adagrad_at(v, s, so, dim, grad, hp):  # type: ignore[no-untyped-def]
    _ftrl(v, s, 0, so, so + 1, np.float64(grad[0]), hp[FTRL_ADAGRAD_INV_ALPHA], hp[1], hp[2], hp[3])
    lr, eps = hp[4], hp[5]
    for j in range(1, dim):
        g = np.float64(grad[j])
        s[so + 1 + j] = s[so + 1 + j] + g * g
        v[j] = v[j] - lr * g / (math.sqrt(np.float64(s[so + 1 + j])) + eps)


@njit(inline="always", nogil=True, cache=True)
def adam_at(v, s, so, dim, grad, hp):  # type: ignore[no-untyped-def]
    lr, b1, b2, eps = hp[0], hp[1], hp[2], hp[3]
    t = np.float64(s[so + 2 * dim]) + 1.0
    s[so + 2 * dim] = t
    c1 = 1.0 - b1**t
    c2 = 1.0 - b2**t
    for j in range(dim):
        g = np.float64(grad[j])
        m = b1 * s[so + j] + (1.0 - b1) * g
        w = b2 * s[so + dim + j] + (1.0 - b2) * g * g
        s[so + j] = m
        s[so + dim + j] = w
        v[j] = v[j] - lr * (m / c1) / (math.sqrt(w / c2) + eps)


@njit(inline="always", nogil=True, cache=True)
def rmsprop_at(v, s, so, dim, grad, hp):  # type: ignore[no-untyped-def]
    lr, rho, eps = hp[0], hp[1], hp[2]
    for j in range(dim):
        g = np.float64(grad[j])
        ms = rho * s[so + j] + (1.0 - rho) * g * g
        s[so + j] = ms
        v[j] = v[j] - lr * g / (math.sqrt(ms) + eps)


def _user_form(at: Any) -> Any:
    """The rule of the kind users write (``value, state, grad, hp``) whose arithmetic is ``at``."""
    def rule(value, state, grad, hp):  # type: ignore[no-untyped-def]
        at(value, state, 0, value.shape[0], grad, hp)

    rule.__name__ = rule.__qualname__ = at.__name__.replace("_at", "_rule")
    return njit(inline="always", nogil=True)(rule)


sgd_rule, adagrad_rule, ftrl_rule, ftrl_adagrad_rule, adam_rule, rmsprop_rule = (
    _user_form(at) for at in (sgd_at, adagrad_at, ftrl_at, ftrl_adagrad_at, adam_at, rmsprop_at))


@njit(inline="always", nogil=True, cache=True)
def update_row(rows, s, grads, i, dim, okind, ohp):  # type: ignore[no-untyped-def]
    """Apply gradient ``grads[i]`` to row ``s`` with the table's (built-in) rule: the
    rule's arithmetic on the row itself, its state from column ``dim`` on."""
    row, grad = rows[s], grads[i]
    if okind == SGD_KIND:
        sgd_at(row, row, dim, dim, grad, ohp)
    elif okind == ADAGRAD_KIND:
        adagrad_at(row, row, dim, dim, grad, ohp)
    elif okind == FTRL_KIND:
        ftrl_at(row, row, dim, dim, grad, ohp)
    elif okind == FTRL_ADAGRAD_KIND:
        ftrl_adagrad_at(row, row, dim, dim, grad, ohp)
    elif okind == ADAM_KIND:
        adam_at(row, row, dim, dim, grad, ohp)
    else:  # RMSPROP_KIND
        rmsprop_at(row, row, dim, dim, grad, ohp)

