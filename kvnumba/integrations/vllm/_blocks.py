"""vLLM ``KVCacheBlock`` stand-ins that read a kvnumba manager's state.

vLLM's scheduler and tests hold block objects: ``KVCacheBlocks.blocks[0]`` is a list of them,
and they read ``block_id``, ``is_null``, ``ref_cnt`` and ``block_hash``. Here there is one
stand-in per block id, made once with the pool (as vLLM makes its ``KVCacheBlock`` objects), so
handing blocks to the scheduler costs a list lookup per block and no allocation. A stand-in keeps
no state of its own: ``ref_cnt`` and ``block_hash`` are read from the kvnumba arrays whenever
asked, so they cannot drift from the allocator.
"""

from __future__ import annotations

from kvnumba.integrations.block_hashes import hash_from_key
from kvnumba.state import BlockFlag

# vLLM's BlockHashWithGroupId is the digest followed by the group id in 4 big-endian bytes.
GROUP_BYTES = tuple(g.to_bytes(4, "big") for g in range(8))


class KVNumbaBlock:
    """One kvnumba block as vLLM's scheduler sees a ``KVCacheBlock`` (read-only).

    Parameters
    ----------
    block_id : int
        The kvnumba block id (vLLM's block id: block 0 is the null block).
    pool : BlockPoolView
        The view that reads the manager's state.
    """

    __slots__ = ("block_id", "is_null", "pool")

    def __init__(self, block_id: int, pool) -> None:
        self.block_id = block_id
        # Block 0 is kvnumba's reserved block: vLLM's placeholder "null block".
        self.is_null = block_id == 0
        self.pool = pool

    @property
    def ref_cnt(self) -> int:
        """Sequences holding the block (kvnumba's refcount)."""
        return int(self.pool.state.ref[self.block_id])

    @property
    def block_hash(self) -> bytes | None:
        """vLLM's ``BlockHashWithGroupId`` of a hashed full block, else None."""
        return self.pool.block_hash_of(self.block_id)

    def __repr__(self) -> str:
        return f"KVNumbaBlock(block_id={self.block_id}, ref_cnt={self.ref_cnt})"


def block_hash_of(state, block_id: int, width: int, groups: int = 1) -> bytes | None:
    """vLLM's ``BlockHashWithGroupId`` of ``block_id`` from kvnumba's state, or None.

    Parameters
    ----------
    state : kvnumba State
        The manager's read-only state views.
    block_id : int
        Block id.
    width : int
        Digest length of the engine's hash function.
    groups : int, default 1
        KV cache groups of the manager: a block's group is its salt modulo ``groups``
        (kvnumba keeps ``salt * groups + group``, and the adapter admits with salt 0).

    Returns
    -------
    bytes or None
        Digest plus group id, when the block carries a key (``BlockFlag.HASHED``).
    """
    if not state.block_flags[block_id] & BlockFlag.HASHED:
        return None
    group = int(state.block_salt[block_id]) % groups
    return hash_from_key(state.block_key[block_id], width) + GROUP_BYTES[group]
