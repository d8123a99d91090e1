"""``EvictionPolicy``: a manager's eviction policy, the part that names it and takes hints.

The policy itself lives in the kernels (``_kernels/eviction.py``) and in the state arena; a
manager built with a policy other than LRU binds the kernels' policy versions
(:class:`~kvnumba._kernel_set.KernelSet`). This part answers ``mgr.eviction`` and serves
``set_next_use``, the hints of the simulator's hindsight policy.
"""

from __future__ import annotations

from kvnumba.eviction import SIMULATOR_POLICIES, check_next_use
from kvnumba.inputs import index_array


class EvictionPolicy:
    """The eviction policy of one manager.

    Parameters
    ----------
    geometry : Geometry
        The manager's geometry (its ``eviction`` code and pool size).
    arenas : Arenas
        The manager's arenas.
    kernels : KernelSet
        The manager's kernels.
    """

    __slots__ = ("name", "num_blocks", "arenas", "kernels")

    def __init__(self, geometry, arenas, kernels):
        self.name = SIMULATOR_POLICIES[geometry.eviction]
        self.num_blocks, self.arenas, self.kernels = geometry.num_blocks, arenas, kernels

    def set_next_use(self, block_ids, next_use) -> None:
        """The simulator's ``oracle`` policy: the trace position of the next use of each
        block's content (-1: never). ``ValueError`` on a manager with another policy.

        Parameters
        ----------
        block_ids, next_use : integer array-likes of equal length
            Blocks of the pool, and the position of the next request that uses each one.
        """
        blocks, uses = index_array(block_ids, "block_ids"), index_array(next_use, "next_use")
        check_next_use(self.name, self.num_blocks, blocks, uses)
        self.kernels.k_set_next_use(blocks, uses, *self.arenas.args)
