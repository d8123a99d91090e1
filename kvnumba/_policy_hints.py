"""``PolicyHints``: a manager's eviction policy, the part that names it and takes hints.

The policy itself lives in the kernels (``_kernels/eviction.py``) and in the state arena; a
manager built with a policy other than LRU binds the kernels' policy versions
(:class:`~kvnumba._kernel_set.KernelSet`). This part answers ``mgr.eviction``, serves
``set_next_use`` (the hints of the simulator's hindsight policy and of priority policies) and
``set_tags`` and ``set_sequence_tags``, and gives a priority policy's compiled function to this
process's kernels.
"""

from __future__ import annotations

from kvnumba._layout import S_PRIORITY_FN, S_PRIORITY_REKEY
from kvnumba._pipeline import failure
from kvnumba.eviction import BUILTIN_POLICIES, HINDSIGHT_POLICIES, check_next_use, check_tags
from kvnumba.inputs import index_array
from kvnumba.kernels import resolved_of


class PolicyHints:
    """The eviction policy of one manager.

    Parameters
    ----------
    geometry : Geometry
        The manager's geometry (its ``eviction`` code and pool size).
    arenas : Arenas
        The manager's arenas.
    kernels : KernelSet
        The manager's kernels.
    facts : Facts
        What an error message needs to know of the manager.
    priority : PriorityPolicy or None
        The manager's priority policy, if it has one.
    """

    __slots__ = ("name", "num_blocks", "arenas", "kernels", "facts", "priority")

    def __init__(self, geometry, arenas, kernels, facts, priority=None):
        self.priority = priority
        if priority is not None:
            self.name = priority.name
            # The kernels call the priority through its address in this process.
            arenas.scr[S_PRIORITY_FN] = priority.address()
            arenas.scr[S_PRIORITY_REKEY] = priority.rekey_triggers()
        else:
            self.name = (BUILTIN_POLICIES + HINDSIGHT_POLICIES)[geometry.eviction]
        self.num_blocks, self.arenas, self.kernels = geometry.num_blocks, arenas, kernels
        self.facts = facts

    def set_next_use(self, block_ids, next_use) -> None:
        """Hints of the next use of each block's content: the trace position of the next request
        that uses it (-1: never). For the simulator's ``oracle`` policy and for priority
        policies (their ``next_use`` feature); ``ValueError`` on a manager with another policy.

        Parameters
        ----------
        block_ids, next_use : integer array-likes of equal length
            Blocks of the pool, and the position of the next request that uses each one.
        """
        blocks, uses = index_array(block_ids, "block_ids"), index_array(next_use, "next_use")
        check_next_use(self.name, self.num_blocks, blocks, uses, priority=self.priority is not None)
        self.kernels.k_set_next_use(blocks, uses, *self.arenas.args)

    def set_tags(self, block_ids, tags) -> None:
        """Tag blocks for a priority policy (its ``tag`` feature): a conversation, a tenant, a
        priority class; a block's tag is 0 when it is registered. ``ValueError`` on a manager
        with another policy.

        Parameters
        ----------
        block_ids, tags : integer array-likes of equal length
            Blocks of the pool, and the tag of each.
        """
        blocks, values = index_array(block_ids, "block_ids"), index_array(tags, "tags")
        check_tags(self.name, self.num_blocks, blocks, values, priority=self.priority is not None)
        self.kernels.k_set_tags(blocks, values, *self.arenas.args)

    def set_sequence_tags(self, seq_ids, tags) -> None:
        """Tag live sequences for a priority policy: when a tagged sequence's release
        (``release``, ``truncate``, a window's drop) caches a block, the block's ``tag``
        feature becomes the sequence's tag, so a request's tenant, conversation or priority
        class reaches the blocks it leaves behind. 0 clears it (the blocks keep theirs); a
        later entry for the same sequence wins; fork's children inherit the parent's tag.
        ``ValueError`` on a manager with another policy.

        Parameters
        ----------
        seq_ids, tags : integer array-likes of equal length
            Live sequences, and the tag of each.

        Raises
        ------
        ValueError
            Another policy, or unequal lengths.
        InvalidSequence, SequenceReleased
            An id that is not one of this manager's, or one already released (nothing is
            changed).
        """
        ids, values = index_array(seq_ids, "seq_ids"), index_array(tags, "tags")
        check_tags(self.name, None, ids, values, priority=self.priority is not None)
        status, bad = resolved_of(self.kernels.k_set_sequence_tags(ids, values, *self.arenas.args))
        if status:
            raise failure(self.facts, status, bad, ids=ids)
