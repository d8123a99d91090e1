"""Virtual pages of a model manager on a :class:`ReferencePagePool` (the page policy).

Buckets of mapped pages by free count, mapping and unmapping, taking a block from pages and
giving a freed one back, the cache-only list, sibling reclaim and ``trim``'s give-up, the page
introspection and the page part of ``check()``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import numpy as np

from kvnumba.reference._common import _as_int
from kvnumba.reference._parts import ModelState

if TYPE_CHECKING:
    from kvnumba.reference.manager import ReferenceBlockManager
    from kvnumba.reference.pool import ReferencePagePool


class PagesMixin(ModelState):
    """Virtual-page helpers of :class:`ReferenceBlockManager` (``_pool``, ``_k``, ``_unmapped``,
    ``_phys``, ``_page_free``, ``_buckets``, ``_cache_only``, ``_mapped_log``, ``_unmapped_log``)."""

    # ------------------------------------------------------------------ page helpers

    def _the_pool(self) -> ReferencePagePool:
        """The page pool (only a manager on one calls the page helpers)."""
        assert self._pool is not None, "not on a page pool"
        return self._pool

    def _page_blocks(self, v: int) -> range:
        return range(v * self._k, (v + 1) * self._k)

    def _page_used(self, v: int) -> int:
        """Blocks of page ``v`` referenced by a sequence."""
        return sum(1 for b in self._page_blocks(v) if self._ref[b])

    def _page_cached(self, v: int) -> int:
        """Blocks of page ``v`` on the LRU list."""
        return sum(1 for b in self._page_blocks(v) if b in self._lru)

    def _enter_bucket(self, v: int) -> None:
        """Put mapped page ``v`` at the front of the bucket of its free count (none if 0)."""
        c = len(self._page_free[v])
        if c:
            self._buckets[c].insert(0, v)

    def _leave_bucket(self, v: int) -> None:
        c = len(self._page_free[v])
        if c:
            self._buckets[c].remove(v)

    def _map_page(self) -> int:
        """Map the top unmapped virtual page to the pool's top page; return the virtual page.

        Its free list holds its blocks with ``v*k`` on top (popped first), then ``v*k+1``, ...
        The caller checked that the pool has a free page and an unmapped page is left.
        """
        v = self._unmapped.pop()
        # The pool records the manager, which every part is a part of.
        physical = self._the_pool()._take(cast("ReferenceBlockManager", self), v)
        self._phys[v] = physical
        self._page_free[v] = list(reversed(self._page_blocks(v)))
        self._mapped_log.append((physical, v))
        return v

    def _unmap_page(self, v: int) -> None:
        """Give page ``v`` (all blocks free, in no bucket) back: physical page, then virtual."""
        physical = self._phys[v]
        self._the_pool()._give(physical)
        self._phys[v] = -1
        self._page_free[v] = []
        self._unmapped.append(v)
        self._unmapped_log.append((physical, v))

    def _take_paged(self) -> int:
        """Take a block under the page policy (refcount still 0; the caller sets it).

        The front page of the lowest non-empty bucket (the fullest mapped page with a free
        block) gives the top of its free list; else a new page is mapped if the pool has a free
        page and a virtual page is left; else the policy's victim (the LRU head with ``lru``)
        is evicted.
        """
        for c in range(1, self._k):
            if self._buckets[c]:
                v = self._buckets[c].pop(0)
                block = self._page_free[v].pop()
                self._enter_bucket(v)  # front of bucket c - 1 (none when that is 0)
                break
        else:
            if self._the_pool().num_free and self._unmapped:
                v = self._map_page()
                block = self._page_free[v].pop()
                self._enter_bucket(v)  # bucket k - 1 (none when k == 1)
            else:
                block = self._policy.victim(self._lru)
                self._evict(block)
                v = block // self._k
        # The page now holds a referenced block, so it is no longer cache-only (a page is on
        # that list exactly when it holds cached blocks but no referenced one).
        self._cache_only.pop(v, None)
        return block

    def _drop_last_paged(self, block: int) -> None:
        """A block's refcount just reached 0 on a manager with a page pool."""
        v = block // self._k
        if self._is_registered(block):
            self._cache(block)  # most recently released at the tail
        else:
            self._scrub(block)
            self._leave_bucket(v)
            self._page_free[v].append(block)
            if len(self._page_free[v]) == self._k:
                self._unmap_page(v)
                return
            self._enter_bucket(v)
        if self._page_used(v) == 0:  # cached blocks but no referenced one left
            self._cache_only[v] = self._the_pool().tick()

    def _give_up_pages(self, count: int) -> int:
        """Trim the first ``count`` pages of the cache-only list (head first); return count.

        Per page: evict its cached blocks in ascending block id (as an eviction for
        allocation does), then unmap it.
        """
        for _ in range(count):
            v, _ = self._cache_only.popitem(last=False)
            for block in self._page_blocks(v):
                if block in self._lru:
                    self._evict(block)
            self._leave_bucket(v)
            self._unmap_page(v)
        return count

    def _cache_only_pages_of_siblings(self) -> int:
        return sum(len(m._cache_only) for m in self._the_pool()._managers if m is not self)

    def _ask_siblings(self, shortfall: int) -> list | None:
        """Sibling reclaim for an atomic call that failed with ``PoolExhausted``.

        Asks the other managers registered on the pool for ``wanted = ceil(shortfall / k)``
        cache-only pages (``shortfall``: the blocks the call lacked where it failed), chosen one at a time by smallest stamp among the
        siblings' next list heads, and makes each sibling (in registration order) give up its
        chosen pages as :meth:`trim` does.

        Returns
        -------
        list of (manager, snapshot) or None
            The siblings that gave up pages, with their state (pool included) from before;
            ``None`` (nothing changed) when no pool, ``wanted < 1``, too few cache-only pages
            among the siblings, or fewer than ``pool.num_free + wanted`` unmapped virtual pages
            here.
        """
        if self._pool is None:
            return None
        wanted = -(-shortfall // self._k)
        if wanted < 1 or self._the_pool().num_free + wanted > len(self._unmapped):
            return None
        if self._cache_only_pages_of_siblings() < wanted:
            return None
        siblings = [m for m in self._the_pool()._managers if m is not self]
        chosen = [0] * len(siblings)  # a prefix of each sibling's cache-only list
        stamps = [list(m._cache_only.values()) for m in siblings]
        for _ in range(wanted):
            best = min(
                (i for i in range(len(siblings)) if chosen[i] < len(stamps[i])),
                key=lambda i: stamps[i][chosen[i]],
            )
            chosen[best] += 1
        # Snapshots first (each includes the pool as it is now), then the work.
        reclaimed = [(m, m._snapshot()) for m, n in zip(siblings, chosen, strict=True) if n]
        for (m, _), n in zip(reclaimed, [n for n in chosen if n], strict=True):
            m._begin_call()
            m._give_up_pages(n)
        return reclaimed

    # ------------------------------------------------------------------ page introspection

    def mapped_pages(self) -> np.ndarray:
        """Physical pages this manager holds, in ascending virtual page order.

        Returns
        -------
        numpy.ndarray of int64
            Empty without a page pool.
        """
        return np.array([p for p in self._phys if p >= 0], dtype=np.int64)

    def _check_page(self, v) -> int:
        v = _as_int(v, "v")
        if not 0 <= v < len(self._phys):
            raise IndexError(f"virtual page {v} out of range 0..{len(self._phys) - 1}")
        return v

    def page_of_virtual(self, v: int) -> int:
        """Physical page backing virtual page ``v``, -1 if it is unmapped."""
        return self._phys[self._check_page(v)]

    def page_free_list(self, v: int) -> list[int]:
        """Free list of virtual page ``v``, bottom to top (``[]`` if unmapped or full)."""
        return list(self._page_free[self._check_page(v)])

    def unmapped_pages(self) -> list[int]:
        """Unmapped virtual pages in stack order, bottom to top (the last one is mapped next)."""
        return list(self._unmapped)

    def bucket_pages(self, free_count: int) -> list[int]:
        """Mapped virtual pages with ``free_count`` free blocks (1..k-1), front first."""
        free_count = _as_int(free_count, "free_count")
        if not 1 <= free_count < self._k:
            raise IndexError(f"no bucket {free_count}; buckets are 1..{self._k - 1}")
        return list(self._buckets[free_count])

    def cache_only_pages(self) -> list[tuple[int, int]]:
        """``(virtual page, stamp)`` of the cache-only pages, head (given up first) to tail."""
        return list(self._cache_only.items())

    # ------------------------------------------------------------------ page invariants

    def _check_pages(self, fail: Callable) -> None:
        """Page invariants (the blocks themselves were checked by :meth:`check`)."""
        k, pool = self._k, self._the_pool()
        num_pages = len(self._phys)
        if len(set(self._unmapped)) != len(self._unmapped):
            fail("a virtual page is on the unmapped stack twice")
        if not set(self._unmapped) <= set(range(num_pages)):
            fail("the unmapped stack holds a page out of range")
        if self not in pool._managers:
            fail("manager is not registered on its pool")
        pool.check()
        in_bucket: dict[int, int] = {}
        for c in range(1, k):
            for v in self._buckets[c]:
                if v in in_bucket:
                    fail(f"page {v} is in buckets {in_bucket[v]} and {c}")
                in_bucket[v] = c
        stamps = list(self._cache_only.values())
        if stamps != sorted(set(stamps)) or (stamps and stamps[-1] > pool.clock):
            fail(f"cache-only stamps {stamps} are not increasing up to the pool clock")
        for v in range(num_pages):
            physical, free = self._phys[v], self._page_free[v]
            if v in self._unmapped:
                if physical != -1 or free or v in in_bucket or v in self._cache_only:
                    fail(f"unmapped page {v} is backed, has a free list or is listed")
                if any(self._ref[b] or b in self._lru for b in self._page_blocks(v)):
                    fail(f"unmapped page {v} holds a referenced or cached block")
                continue
            if physical < 0 or pool._owner.get(physical) != (self, v):
                fail(f"page {v}: physical page {physical} is not owned by it in the pool")
            used, cached = self._page_used(v), self._page_cached(v)
            if sorted(free) != [
                b for b in self._page_blocks(v) if not self._ref[b] and b not in self._lru
            ]:
                fail(f"page {v}: free list {free} does not hold exactly its free blocks")
            if len(free) == k:
                fail(f"page {v} is mapped with all {k} blocks free")
            if in_bucket.get(v, 0) != len(free):
                fail(f"page {v} with {len(free)} free blocks is in bucket {in_bucket.get(v)}")
            if (v in self._cache_only) != (used == 0 and cached > 0):
                fail(f"page {v} ({used} used, {cached} cached): wrong cache-only membership")
        mine = sum(1 for manager, _ in pool._owner.values() if manager is self)
        if mine != num_pages - len(self._unmapped):
            fail(f"the pool records {mine} pages of this manager")
