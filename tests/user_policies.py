"""Eviction policies a user writes (``kvnumba.priority``), defined outside ``kvnumba/``.

The differential run and the stateful machines draw them next to the built-in policies: the
kernels call their compiled priority, the reference model the same function as Python.
"""

from kvnumba.priority import PriorityPolicy, priority_policy


@priority_policy("every-feature")
def every_feature(f):
    """A user's policy reading every feature (all cached blocks are candidates): it makes the
    two sides agree on each feature's value at each evaluation, not only on the order."""
    score = f.stamp * 7 - f.hits * 5 + f.children * 3 - f.orphan * 1000 + f.depth
    score += (f.next_use % 5) + (f.tag % 3) * 2 + f.length + f.block_size - f.clock // 3
    return score + f.age // 2 + f.block % 2


def _aging_leaves(f):
    if f.orphan:
        return -5
    return f.age + f.hits * 2 + (f.tag & 1) + (f.length // (f.block_size * 2))


#: A leaves-only one, GreedyDual-like (its keys read the age), made from a plain function.
AGING_LEAVES = PriorityPolicy(_aging_leaves, name="aging-leaves", leaves_only=True)


@priority_policy("parents-last")
def parents_last(f):
    """Reads ``children`` and no clock: the kernels key a block again when a child of it enters
    or leaves the cache, and skip the other feature changes (``rekey_triggers``), which the
    reference model never skips."""
    return f.stamp + (f.children << 40)


#: The three, for the tests that draw a policy.
USER_POLICIES = (every_feature, AGING_LEAVES, parents_last)
