"""Which version of the kernels a manager gets: plain, paged, policy, or paged and policy.

Every entry kernel, and the block steps under it, compiles in up to four versions. numba picks
one when it types a call, from the numba types of the arenas the call passes; this module names
those types, and it is the only place that reads an arena's layout to tell them apart:

==================  ======================  =====================  ======================  =================================
manager             state arena (``k_*``)   ``Views.pool``         views type              code compiled in
==================  ======================  =====================  ======================  =================================
plain               :data:`STATE_ARENA`     the scratch arena (C)  ``VIEWS``               neither of the two below
on a page pool      :data:`STATE_ARENA`     :data:`POOL_VIEW`      :data:`VIEWS_PAGED`     the page calls (``page_calls``)
policy or window    :data:`POLICY_ARENA`    the scratch arena (C)  :data:`VIEWS_POLICY`    the policy hooks (``eviction``),
                                                                                           the window hooks (``windows``)
both                :data:`POLICY_ARENA`    :data:`POOL_VIEW`      :data:`VIEWS_POLICY_    both
                                                                   PAGED`
==================  ======================  =====================  ======================  =================================

"policy or window": an eviction policy other than LRU, or a windowed manager (sliding window,
attention chunks, several KV cache groups), which the facade gives the policy version
(``kernels.compiled(..., policy=True)``). The one-request kernels have no policy version: they
take the arenas' addresses (``carve.arena_at``) and serve plain managers only.

The state arena and the pool arena are the same bytes in every version: a policy manager's
state arena is typed with any layout (``'A'``) instead of C-contiguous, and a paged kernel
hands its workers the pool's arena typed with any layout (``entry.with_pages``) where a plain
kernel passes its scratch arena. Types are all that differ, so each version compiles apart with
only its own code: a plain manager's kernels carry no page and no policy code.
"""

from __future__ import annotations

from numba import types

from kvnumba._kernels.views import VIEWS

#: The state arena of a plain or a paged manager, and every scratch arena: C-contiguous bytes.
STATE_ARENA = types.Array(types.uint8, 1, "C")
#: The state arena of a manager whose kernels run the policy version (any layout).
POLICY_ARENA = types.Array(types.uint8, 1, "A")
#: The page pool's arena as a paged kernel's workers see it (``Views.pool``; any layout).
POOL_VIEW = types.Array(types.uint8, 1, "A")

#: The views of a manager on a page pool.
VIEWS_PAGED = types.NamedTuple([*VIEWS.types[:-1], POOL_VIEW], VIEWS.instance_class)
#: The views of a manager running the policy version, without and with a page pool.
VIEWS_POLICY = types.NamedTuple(
    [*VIEWS.types[:-3], POLICY_ARENA, *VIEWS.types[-2:]], VIEWS.instance_class
)
VIEWS_POLICY_PAGED = types.NamedTuple([*VIEWS_POLICY.types[:-1], POOL_VIEW], VIEWS.instance_class)


def is_policy_arena(arena_type) -> bool:
    """Whether ``arena_type`` (numba's type of a state arena) is :data:`POLICY_ARENA`."""
    return arena_type.layout == POLICY_ARENA.layout


def is_paged(views_type) -> bool:
    """Whether ``views_type`` (numba's type of a ``Views`` tuple) is a paged manager's."""
    return views_type.types[-1].layout == POOL_VIEW.layout


def is_policy(views_type) -> bool:
    """Whether ``views_type`` is the views of the policy version (an eviction policy other
    than LRU, or a window)."""
    return is_policy_arena(views_type.types[-3])


def state_arena(policy: bool):
    """The state arena's type an entry kernel of the plain (``policy=False``) or the policy
    version takes."""
    return POLICY_ARENA if policy else STATE_ARENA
