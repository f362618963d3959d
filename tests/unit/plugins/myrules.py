"""User update rules, imported by name ("tests.unit.plugins.myrules:clipped_sgd") as a
user's package would be."""

import math

import paramserver


@paramserver.rule(state_width=0, params={"lr": 0.1, "clip": 1.0})
def clipped_sgd(value, state, grad, hp):
    lr, clip = hp[0], hp[1]
    for j in range(value.shape[0]):
        g = min(max(grad[j], -clip), clip)
        value[j] -= lr * g


def _start_at_one(state, hp):
    for j in range(state.shape[0]):
        state[j] = hp[1]


@paramserver.rule(state_width=lambda dim: dim, params=("lr", "start"), init=_start_at_one)
def my_adagrad(value, state, grad, hp):
    for j in range(value.shape[0]):
        state[j] += grad[j] * grad[j]
        value[j] -= hp[0] * grad[j] / math.sqrt(state[j])


@paramserver.rule(params={"lr": 0.1})
def not_numba(value, state, grad, hp):
    plain_function(value, state, grad, hp)  # a plain Python function: numba cannot call it


def plain_function(value, state, grad, hp):
    pass
