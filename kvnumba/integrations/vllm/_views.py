"""Read-only stand-ins for the vLLM allocator objects the scheduler and tests reach into.

vLLM's scheduler reads ``kv_cache_manager.block_pool`` (free-block count, the null block) and
``kv_cache_manager.coordinator`` (block sizes, the block count a request still needs); vLLM's
tests also read ``block_pool.blocks[i]``, ``free_block_queue``, ``cached_block_hash_to_block``
and ``single_type_managers[0].req_to_blocks``. These views answer from kvnumba's state: the
counters are O(1) reads of the state arrays; the request's block lists are the adapter's own,
kept as vLLM keeps them; the whole-pool views (free queue, hash map) are built when asked, which
only tests do, never the scheduler's step. Nothing here
mutates the allocator: vLLM's mutating internals (``touch``, ``get_new_blocks``,
``cache_full_blocks``, linked-list surgery) are not offered.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from kvnumba.integrations.vllm._blocks import GROUP_BYTES, KVNumbaBlock, block_hash_of
from kvnumba.state import NIL, Meta, free_blocks, registered_blocks


class FreeQueueView:
    """vLLM's ``free_block_queue`` as kvnumba hands blocks out: free blocks, then cached.

    kvnumba takes an empty block from its free stack (top first) before it reclaims the least
    recently used cached block; vLLM's single queue holds both kinds in that same order.
    """

    def __init__(self, pool: BlockPoolView) -> None:
        self._pool = pool

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation may take: empty plus cached at refcount 0."""
        return self._pool.get_num_free_blocks()

    def get_all_free_blocks(self) -> list[KVNumbaBlock]:
        """Every allocatable block in the order kvnumba would hand them out (O(pool))."""
        state = self._pool.state
        order = free_blocks(state).tolist()
        b = int(state.meta[Meta.LRU_HEAD])
        nxt = state.lru_next
        while b != NIL:
            order.append(b)
            b = int(nxt[b])
        blocks = self._pool.blocks
        return [blocks[i] for i in order]


class CachedBlocksView(Mapping):
    """vLLM's ``cached_block_hash_to_block``: registered keys to their blocks (built on demand).

    As vLLM's ``BlockHashToBlockMap``, ``_cache`` maps a key to its block, or to a dict of
    block id to block, in registration order, when several blocks are registered with it
    (``cache_duplicates``); ``get_one_block`` returns the first, which lookups hit.
    """

    def __init__(self, pool: BlockPoolView) -> None:
        pool.flush_keys()
        state = pool.state
        width, groups = pool.width, pool.groups
        cache: dict = {}
        for b in registered_blocks(state).tolist():
            key, block = block_hash_of(state, b, width, groups), pool.blocks[b]
            held = cache.get(key)
            if held is None:
                cache[key] = block
            elif isinstance(held, dict):
                held[b] = block
            else:
                cache[key] = {held.block_id: held, b: block}
        self._cache = cache

    def __getitem__(self, key: bytes):
        return self._cache[key]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._cache)

    def __len__(self) -> int:
        return len(self._cache)

    def get_one_block(self, key: bytes) -> KVNumbaBlock | None:
        """The block a lookup of ``key`` (a ``BlockHashWithGroupId``) hits, or None."""
        held = self._cache.get(key)
        if isinstance(held, dict):
            return next(iter(held.values()))
        return held

    def contain(self, key: bytes, block_id: int) -> bool:
        """Whether block ``block_id`` is registered under ``key``."""
        held = self._cache.get(key)
        if isinstance(held, dict):
            return block_id in held
        return held is not None and held.block_id == block_id


class BlockPoolView:
    """vLLM's ``BlockPool`` as read from a kvnumba manager.

    Parameters
    ----------
    owner : KVNumbaKVCacheManager
        The adapter (for the operations the pool forwards: events, eviction, reset).
    """

    def __init__(self, owner) -> None:
        self._owner = owner
        self.state = owner.kvnumba.state
        self.groups = owner.num_kv_cache_groups
        self.num_gpu_blocks = owner.kvnumba.num_blocks
        self.enable_caching = owner.enable_caching
        self.hash_block_size = owner.block_size
        self.enable_kv_cache_events = owner.enable_kv_cache_events
        # One stand-in per block id, made once, as vLLM makes its KVCacheBlock objects.
        self.blocks = [KVNumbaBlock(i, self) for i in range(self.num_gpu_blocks)]
        self.null_block = self.blocks[0]
        self._usable = self.num_gpu_blocks - 1  # all but the null block

    @property
    def width(self) -> int:
        """Digest length of the engine's block hashes (learnt from the first one seen)."""
        return self._owner.hash_width

    def flush_keys(self) -> None:
        """Register the adapter's queued keys, so that the state read next is current."""
        self._owner.flush_keys()

    def block_hash_of(self, block_id: int) -> bytes | None:
        """``BlockHashWithGroupId`` of a hashed block, else None."""
        self._owner.flush_keys()
        return block_hash_of(self.state, block_id, self._owner.hash_width, self.groups)

    def free_blocks(self, ordered_blocks) -> None:
        """Return the blocks of a deferred free (``pop_blocks_for_free``) to the pool.

        Parameters
        ----------
        ordered_blocks : iterable of block stand-ins
            Exactly the blocks one ``pop_blocks_for_free`` returned, in any order.
        """
        self._owner.free_popped(ordered_blocks)

    def get_num_free_blocks(self) -> int:
        """Blocks not referenced by any request (empty or cached), as vLLM counts them."""
        return self._usable - int(self.state.meta[Meta.USED])

    def get_usage(self) -> float:
        """Fraction of the usable blocks that requests reference."""
        return 1.0 - self.get_num_free_blocks() / self._usable if self._usable else 0.0

    @property
    def free_block_queue(self) -> FreeQueueView:
        """The allocatable blocks in hand-out order (a view)."""
        return FreeQueueView(self)

    @property
    def cached_block_hash_to_block(self) -> CachedBlocksView:
        """The prefix cache's registered keys (a snapshot, built when asked)."""
        return CachedBlocksView(self)

    def get_cached_block(self, block_hash: bytes, kv_cache_group_ids: list[int]):
        """The registered blocks of ``block_hash``, one per group of ``kv_cache_group_ids``,
        or None unless every group has one."""
        cache = self.cached_block_hash_to_block
        blocks = []
        for group in kv_cache_group_ids:
            if not 0 <= group < self.groups:
                return None
            block = cache.get_one_block(block_hash + GROUP_BYTES[group])
            if block is None:
                return None
            blocks.append(block)
        return blocks

    @property
    def kv_event_queue(self) -> list:
        """KV events translated but not yet taken."""
        return self._owner.pending_events

    def take_events(self) -> list:
        """Take the pending KV events (see ``KVNumbaKVCacheManager.take_events``)."""
        return self._owner.take_events()

    def evict_blocks(self, block_ids) -> None:
        """Forwarded to ``KVNumbaKVCacheManager.evict_blocks``."""
        self._owner.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        """Forwarded to ``KVNumbaKVCacheManager.reset_prefix_cache``."""
        return self._owner.reset_prefix_cache()


class _RequestTables(Mapping):
    """``req_to_blocks``: each held request's block list in one group (the one ``get_blocks``
    wraps)."""

    def __init__(self, owner, group: int = 0) -> None:
        self._owner = owner
        self._group = group

    def __getitem__(self, request_id: str) -> list[KVNumbaBlock]:
        if request_id not in self._owner.held:
            raise KeyError(request_id)
        return self._owner.blocks_of(request_id, self._group)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._owner.held))

    def __len__(self) -> int:
        return len(self._owner.held)


class _CachedCounts(Mapping):
    """``num_cached_block``: blocks of each held request that carry their keys."""

    def __init__(self, owner) -> None:
        self._owner = owner

    def __getitem__(self, request_id: str) -> int:
        self._owner.flush_keys()
        return self._owner.held[request_id].ncached

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._owner.held))

    def __len__(self) -> int:
        return len(self._owner.held)


class SingleTypeManagerView:
    """vLLM's single-type manager of one KV cache group, read from the adapter."""

    retains_longer_hit = False

    def __init__(self, owner, kv_cache_spec, group: int = 0) -> None:
        self.kv_cache_spec = kv_cache_spec
        self.kv_cache_group_id = group
        self.block_size = owner.block_size
        self.block_pool = owner.block_pool
        self._null_block = owner.block_pool.null_block  # what vLLM's tests compare entries with
        self.enable_caching = owner.enable_caching
        self.req_to_blocks = _RequestTables(owner, group)
        self.num_cached_block = _CachedCounts(owner)


class CoordinatorView:
    """vLLM's ``KVCacheCoordinator`` for one group: what the scheduler asks of it."""

    enable_partial_hash_hits = False

    def __init__(self, owner, kv_cache_spec) -> None:
        self._owner = owner
        self.block_pool = owner.block_pool
        self.single_type_managers = (SingleTypeManagerView(owner, kv_cache_spec),)
        self.block_size = owner.block_size
        self.eagle_group_ids = {0} if owner.use_eagle else set()
        # Served only unset or 0 (which full attention ignores).
        self.retention_interval = owner.kv_cache_config.prefix_cache_retention_interval

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks,
        num_encoder_tokens: int = 0,
        total_computed_tokens: int = 0,
        num_local_computed_tokens: int = 0,
        num_tokens_main_model: int = 0,
        apply_admission_cap: bool = False,
        prefill_end: int = 0,
    ) -> int:
        """Blocks a request needs for ``num_tokens`` slots (see the adapter's counting)."""
        return self._owner.num_blocks_to_allocate(request_id, num_tokens, new_computed_blocks[0])

    def get_blocks(self, request_id: str) -> tuple[list[KVNumbaBlock]]:
        """The request's blocks, as a one-group tuple."""
        held = request_id in self._owner.held
        return (self._owner.blocks_of(request_id) if held else [],)


class GroupsCoordinatorView:
    """vLLM's ``KVCacheCoordinator`` for several KV cache groups (or one windowed group): what
    the scheduler and vLLM's tests ask of it, answered by
    :class:`~kvnumba.integrations.vllm.groups.KVNumbaGroupsKVCacheManager`."""

    enable_partial_hash_hits = False

    def __init__(self, owner, kv_cache_specs) -> None:
        self._owner = owner
        self.block_pool = owner.block_pool
        self.single_type_managers = tuple(
            SingleTypeManagerView(owner, spec, g) for g, spec in enumerate(kv_cache_specs)
        )
        self.block_size = owner.block_size
        self.eagle_group_ids: set[int] = set()
        self.retention_interval = owner.kv_cache_config.prefix_cache_retention_interval

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks,
        num_encoder_tokens: int = 0,
        total_computed_tokens: int = 0,
        num_local_computed_tokens: int = 0,
        num_tokens_main_model: int = 0,
        apply_admission_cap: bool = False,
        prefill_end: int = 0,
    ) -> int:
        """Blocks a request needs for ``num_tokens`` slots, summed over the groups."""
        return self._owner.num_blocks_to_allocate(
            request_id, num_tokens, new_computed_blocks, total_computed_tokens, apply_admission_cap
        )

    def get_blocks(self, request_id: str) -> tuple[list[KVNumbaBlock], ...]:
        """The request's blocks, one list per group."""
        return self._owner.get_blocks(request_id).blocks
