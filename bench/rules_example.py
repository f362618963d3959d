"""A user's update rule for ``bench/table.py --optimizers sgd,rules_example:user_sgd``:
plain SGD written as a plug-in, to time a user rule's kernels against the built-in one."""

import paramserver


@paramserver.rule(params={"lr": 0.05})
def user_sgd(value, state, grad, hp):
    for j in range(value.shape[0]):
        value[j] -= hp[0] * grad[j]
