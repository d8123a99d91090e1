"""Blocks and the LRU list of the model: take a block, drop a reference, evict, scrub, count.

Without a page pool free blocks sit on the LIFO free stack ``_free``; registered blocks at
refcount 0 sit on the LRU list ``_lru`` (least recently released first) until evicted. The
eviction policy ``_policy_hints`` (``reference.eviction``) picks the victim of an allocation; it
hears of every block entering and leaving ``_lru`` through :meth:`BlocksMixin._cache` and
:meth:`BlocksMixin._uncache`.
"""

from __future__ import annotations

from kvnumba.reference._parts import ModelState
from kvnumba.results import BlockEvents


class BlocksMixin(ModelState):
    """Block and LRU helpers of :class:`ReferenceBlockManager` (``_ref``, ``_tokens``, ``_key``,
    ``_hash``, ``_prefix``, ``_lru``, ``_policy_hints``, ``_free``, ``_counters``, ``_evicted``)."""

    # ------------------------------------------------------------------ block helpers

    def _available(self) -> int:
        """Blocks that can be taken now: free plus cached (plus mappable pages times ``k``)."""
        if self._pool is None:
            return len(self._free) + len(self._lru)
        free_mapped = sum(len(blocks) for blocks in self._page_free)
        mappable = min(self._pool.num_free, len(self._unmapped))
        return free_mapped + len(self._lru) + mappable * self._k

    def _is_registered(self, block: int) -> bool:
        key = self._key[block]
        return key is not None and (
            self._prefix.get(key) == block or block in self._twins.get(key, ())
        )

    def _register(self, block: int) -> bool:
        """Register ``block`` under its key unless the key is registered (with
        ``cache_duplicates``, after the blocks registered with it); whether it was."""
        key = self._key[block]
        assert key is not None  # a block is keyed before it is registered
        if key not in self._prefix:
            self._prefix[key] = block
        elif self._cache_duplicates:
            self._twins[key] = (*self._twins.get(key, ()), block)
        else:
            return False
        return True

    def _unregister(self, block: int) -> None:
        """Take registered ``block`` out of the prefix table; the oldest twin takes its place."""
        key = self._key[block]
        assert key is not None  # registered, so keyed
        twins = self._twins.pop(key, ())
        if self._prefix[key] == block:
            if twins:
                self._prefix[key], twins = twins[0], twins[1:]
            else:
                del self._prefix[key]
        else:
            twins = tuple(t for t in twins if t != block)
        if twins:
            self._twins[key] = twins

    def _registered_count(self) -> int:
        """Blocks registered in the prefix table."""
        return len(self._prefix) + sum(map(len, self._twins.values()))

    def _scrub(self, block: int) -> None:
        """Forget a block's content: fresh -1 payload row, no hash."""
        self._tokens[block] = [-1] * self._block_size
        self._key[block] = None
        self._hash[block] = None
        self._unknown.discard(block)
        self._trimmed.discard(block)

    def _cache(self, block: int) -> None:
        """Put ``block`` (registered, just released) in the cache, the newest on ``_lru``."""
        self._lru[block] = None
        self._policy.entered(block)

    def _uncache(self, block: int) -> None:
        """Take cached ``block`` off ``_lru`` (claimed by a hit, or evicted)."""
        self._policy.leaving(block, self._lru)
        del self._lru[block]

    def _evict(self, block: int) -> None:
        """Forget cached ``block``: off the LRU list and the prefix table, recorded, counted."""
        self._uncache(block)
        self._event(BlockEvents.REMOVED, block)
        self._unregister(block)
        self._policy.unregistered(block)
        self._evicted.append((block, self._hash[block], list(self._tokens[block])))
        self._counters["evictions"] += 1
        self._scrub(block)

    def _evict_to_free(self, block: int) -> None:
        """Evict cached ``block`` on request (``evict``, ``reset_prefix_cache``) and free it:
        onto the free stack, or back onto its page, which is unmapped once it holds nothing."""
        self._evict(block)
        if self._pool is None:
            self._free.append(block)
            return
        v = block // self._k
        self._leave_bucket(v)
        self._page_free[v].append(block)
        if len(self._page_free[v]) == self._k:  # no referenced and no cached block left
            self._cache_only.pop(v, None)
            self._unmap_page(v)
        else:
            self._enter_bucket(v)  # still cache-only (same stamp) if it was

    def _take_block(self) -> int:
        """Hand out one block (refcount set to 1).

        Without a pool: free stack top, else evict the policy's victim (the LRU head with
        ``lru``). With one: see :meth:`_take_paged`.
        """
        if self._pool is not None:
            block = self._take_paged()
        elif self._free:
            block = self._free.pop()
        else:
            block = self._policy.victim(self._lru)
            self._evict(block)
        self._scrub(block)
        self._ref[block] = 1
        self._counters["allocations"] += 1
        return block

    def _drop_ref(self, block: int) -> None:
        """Drop one reference; at 0 a registered block is cached, any other one freed."""
        self._ref[block] -= 1
        if self._ref[block] == 0:
            if self._pool is not None:
                self._drop_last_paged(block)
            elif self._is_registered(block):
                self._cache(block)  # most recently released at the tail
            else:
                self._scrub(block)
                self._free.append(block)
