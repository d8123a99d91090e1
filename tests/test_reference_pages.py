"""The page policy of the pure-Python model (``ReferencePagePool`` + ``page_pool=``).

Pure Python, no kernels. Every scenario is derived by hand from ``docs/design.md``, section
"Two-level allocation: the page policy", and asserts concrete block, virtual and physical page
ids, so that the kernels (compared with this model block id for block id) follow the same text.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from kvnumba.errors import InvalidGeometry, InvariantViolation, PoolExhausted
from kvnumba.reference import ReferenceBlockManager, ReferencePagePool


class Log:
    """Records the callbacks of one pool and its managers, in call order."""

    def __init__(self):
        self.calls = []

    def pool(self, num_pages):
        return ReferencePagePool(
            num_pages,
            on_map=lambda p, v: self._pages("map", p, v),
            on_unmap=lambda p, v: self._pages("unmap", p, v),
        )

    def _pages(self, what, physical, virtual):
        assert physical.dtype == np.int64 and virtual.dtype == np.int64
        self.calls.append((what, physical.tolist(), virtual.tolist()))

    def evict(self, name):
        def hook(ids, hashes, tokens):
            assert ids.dtype == np.int64 and hashes.dtype == np.uint64
            self.calls.append(("evict", name, ids.tolist()))

        return hook

    def take(self):
        calls, self.calls = self.calls, []
        return calls


def paged(pool, num_blocks, k, block_size=1, **kw):
    kw.setdefault("max_seq_len", 64)  # room to ask for more than the pool holds
    return ReferenceBlockManager(num_blocks, block_size, page_pool=pool, blocks_per_page=k, **kw)


def grow(mgr, n, tokens=None):
    """A new sequence of ``n`` tokens (no ids unless given); returns (id, its block ids)."""
    (sid,) = mgr.new_sequences(1)
    res = mgr.append([sid], [n], tokens)
    blocks = (res.slot_mapping // mgr.block_size).tolist()
    return int(sid), list(dict.fromkeys(blocks))  # in the order they were taken


def admit_and_release(mgr, tokens):
    """Admit one prompt and release it (its full blocks stay cached)."""
    res = mgr.admit(tokens, [len(tokens)])
    mgr.release(res.ids)
    return res


def state(*objects):
    """Deep copy of every piece of model state of managers and pools (for equality)."""
    out = []
    for obj in objects:
        if isinstance(obj, ReferencePagePool):
            out.append((obj.free_pages(), {p: (id(m), v) for p, (m, v) in obj._owner.items()}))
            out.append(obj.clock)
            continue
        names = [n for n in vars(obj) if n not in ("_pool", "_on_evict", "_failed_calls")]
        out.append({n: copy.deepcopy(getattr(obj, n)) for n in names})
    return out


def check_all(*managers):
    for mgr in managers:
        mgr.check()


# ---------------------------------------------------------------- construction


def test_geometry_errors_and_pool_basics():
    pool = ReferencePagePool(3)
    assert (pool.num_pages, pool.num_free, pool.clock, pool.free_pages()) == (3, 3, 0, [2, 1, 0])
    with pytest.raises(InvalidGeometry):
        ReferencePagePool(0)
    with pytest.raises(InvalidGeometry):
        ReferenceBlockManager(8, 1, page_pool=pool)
    with pytest.raises(InvalidGeometry):
        ReferenceBlockManager(8, 1, blocks_per_page=2)
    with pytest.raises(InvalidGeometry):
        paged(pool, 8, 3)  # 3 does not divide 8
    assert pool.managers == []  # failed constructions did not register
    mgr = paged(pool, 8, 4)
    assert pool.managers == [mgr] and mgr.blocks_per_page == 4 and mgr.page_pool is pool
    assert mgr.unmapped_pages() == [1, 0] and mgr.mapped_pages().tolist() == []
    assert mgr.mapped_pages().dtype == np.int64
    s = mgr.stats()
    assert (s.used, s.cached, s.free, s.mapped_pages) == (0, 0, 8, 0)
    plain = ReferenceBlockManager(8, 1)
    assert plain.mapped_pages().tolist() == [] and plain.trim() == 0
    assert plain.stats().mapped_pages == 0 and plain.blocks_per_page is None
    mgr.check()


# ---------------------------------------------------------------- taking blocks


def test_take_order_fullest_page_first_and_map_only_when_no_free_block():
    log = Log()
    pool = log.pool(4)
    mgr = paged(pool, 12, 4)  # virtual pages 0, 1, 2
    x, xb = grow(mgr, 1)
    assert xb == [0] and log.take() == [("map", [0], [0])]
    assert mgr.page_free_list(0) == [3, 2, 1] and mgr.bucket_pages(3) == [0]
    y, yb = grow(mgr, 3)
    assert yb == [1, 2, 3] and log.take() == []  # page 0 filled before any new page
    z, zb = grow(mgr, 3)
    assert zb == [4, 5, 6] and log.take() == [("map", [1], [1])]
    assert mgr.bucket_pages(1) == [1] and mgr.page_free_list(1) == [7]
    mgr.check()
    mgr.release([y])  # blocks 3, 2, 1 back on page 0's list, in that order
    assert mgr.page_free_list(0) == [3, 2, 1] and mgr.bucket_pages(3) == [0]
    assert log.take() == []  # page 0 still holds block 0
    w, wb = grow(mgr, 3)
    # bucket 1 (page 1, the fullest) first, then page 0 from its free-list top
    assert wb == [7, 1, 2]
    assert mgr.bucket_pages(1) == [0] and mgr.page_free_list(0) == [3]
    assert mgr.mapped_pages().tolist() == [0, 1] and mgr.unmapped_pages() == [2]
    assert pool.free_pages() == [3, 2] and log.take() == []
    s = mgr.stats()
    assert (s.used, s.cached, s.free, s.mapped_pages, s.allocations) == (7, 0, 5, 2, 10)
    mgr.check()


def test_bucket_is_lifo_among_pages_with_the_same_free_count():
    pool = ReferencePagePool(2)
    mgr = paged(pool, 8, 4)
    a, _ = grow(mgr, 2)  # blocks 0, 1
    b, _ = grow(mgr, 2)  # blocks 2, 3
    c, _ = grow(mgr, 2)  # page 1: blocks 4, 5
    d, _ = grow(mgr, 2)  # blocks 6, 7
    mgr.release([b])  # page 0: 2 free, bucket 2 front
    mgr.release([d])  # page 1: 2 free, enters bucket 2 at the front
    assert mgr.bucket_pages(2) == [1, 0]
    assert mgr.page_free_list(0) == [3, 2] and mgr.page_free_list(1) == [7, 6]
    _, eb = grow(mgr, 3)  # page 1 (front): 6, then page 1 again (bucket 1): 7, then page 0: 2
    assert eb == [6, 7, 2]
    assert mgr.bucket_pages(1) == [0] and mgr.bucket_pages(2) == []
    mgr.check()


def test_virtual_and_physical_page_order_with_two_managers():
    log = Log()
    pool = log.pool(4)
    m1 = paged(pool, 6, 2)  # virtual pages 0, 1, 2
    m2 = paged(pool, 4, 2)
    a, _ = grow(m1, 2)  # m1 v0 -> p0
    b, _ = grow(m2, 1)  # m2 v0 -> p1
    c, _ = grow(m1, 2)  # m1 v1 -> p2
    assert log.take() == [("map", [0], [0]), ("map", [1], [0]), ("map", [2], [1])]
    m2.release([b])  # m2 v0 empty: unmapped, p1 pushed on top of the pool
    assert log.take() == [("unmap", [1], [0])]
    assert pool.free_pages() == [3, 1] and m2.mapped_pages().tolist() == []
    m1.release([a])  # m1 v0 empty: unmapped, v0 on top of m1's unmapped stack
    assert log.take() == [("unmap", [0], [0])]
    assert m1.unmapped_pages() == [2, 0] and pool.free_pages() == [3, 1, 0]
    _, db = grow(m1, 3)  # v0 again (top of the stack) -> p0, then v2 -> p1
    assert db == [0, 1, 4]
    assert log.take() == [("map", [0, 1], [0, 2])]
    assert m1.mapped_pages().tolist() == [0, 2, 1]  # ascending virtual page order
    assert [m1.page_of_virtual(v) for v in range(3)] == [0, 2, 1]
    assert m1.page_of_virtual(0) == 0 and m2.page_of_virtual(0) == -1
    assert pool.owner_of(1) == (m1, 2) and pool.owner_of(3) is None
    check_all(m1, m2)


def test_release_unmaps_pages_in_drop_order_and_restores_the_pool():
    log = Log()
    pool = log.pool(4)
    mgr = paged(pool, 12, 2)
    before = state(mgr, pool)
    sid, blocks = grow(mgr, 4)  # v0 -> p0 (0, 1), v1 -> p1 (2, 3)
    assert blocks == [0, 1, 2, 3] and log.take() == [("map", [0, 1], [0, 1])]
    mgr.release([sid])  # tail first: page 1 empties first
    assert log.take() == [("unmap", [1, 0], [1, 0])]
    assert mgr.unmapped_pages() == [5, 4, 3, 2, 1, 0] and pool.free_pages() == [3, 2, 1, 0]
    after = state(mgr, pool)
    # the page state is back where it started (only counters, slots and generations moved)
    for key in ("_unmapped", "_phys", "_page_free", "_buckets", "_cache_only", "_free"):
        assert after[0][key] == before[0][key]
    assert after[1:] == before[1:]
    mgr.check()


def test_page_with_one_block_per_page():
    pool = ReferencePagePool(2)
    mgr = paged(pool, 3, 1)
    sid, blocks = grow(mgr, 2)
    assert blocks == [0, 1] and mgr.mapped_pages().tolist() == [0, 1]
    with pytest.raises(PoolExhausted) as err:
        mgr.append([sid], [1])  # v2 is left but the pool is empty
    assert (err.value.needed, err.value.available) == (1, 0)
    mgr.release([sid])
    assert mgr.unmapped_pages() == [2, 1, 0] and pool.free_pages() == [1, 0]
    mgr.check()


# ---------------------------------------------------------------- cached blocks and pages


def test_cached_blocks_keep_a_page_mapped_and_make_it_cache_only():
    log = Log()
    pool = log.pool(4)
    mgr = paged(pool, 8, 2, block_size=2)
    res = mgr.admit([0, 1, 2, 3, 4], [5])  # blocks 0 [0 1], 1 [2 3] (full, cached), 2 [4 -]
    assert res.slot_mapping.tolist() == [0, 1, 2, 3, 4]
    log.take()
    mgr.release(res.ids)  # block 2 freed (page 1 unmapped); 1 then 0 cached
    assert log.take() == [("unmap", [1], [1])]
    assert mgr.lru_blocks() == [1, 0] and mgr.mapped_pages().tolist() == [0]
    assert mgr.cache_only_pages() == [(0, 1)] and pool.clock == 1
    s = mgr.stats()
    assert (s.used, s.cached, s.free, s.mapped_pages) == (0, 2, 6, 1)
    mgr.check()
    # a prefix hit on the cached blocks claims them: page 0 is no longer cache-only
    res = mgr.admit([0, 1, 2, 3, 9], [5])
    assert res.num_cached_tokens.tolist() == [4] and res.slot_mapping.tolist() == [4]
    assert mgr.cache_only_pages() == [] and mgr.lru_blocks() == []
    assert log.take() == [("map", [1], [1])]  # block 2 again, page 1 from the pool top
    mgr.release(res.ids)
    assert mgr.cache_only_pages() == [(0, 2)] and pool.clock == 2
    mgr.check()


def test_cache_only_page_with_free_blocks_loses_its_status_when_taken_from():
    pool = ReferencePagePool(2)
    mgr = paged(pool, 8, 4)
    res = mgr.admit([5, 6], [2])  # blocks 0, 1 of page 0 (both full and registered)
    mgr.release(res.ids)  # 1 then 0 cached: page 0 cache-only, free [3, 2] in bucket 2
    assert mgr.cache_only_pages() == [(0, 1)] and mgr.bucket_pages(2) == [0]
    _, blocks = grow(mgr, 1)
    assert blocks == [2] and mgr.cache_only_pages() == [] and mgr.lru_blocks() == [1, 0]
    mgr.check()


def test_eviction_only_when_no_mapped_free_block_and_no_pool_page():
    log = Log()
    pool = log.pool(1)
    mgr = paged(pool, 4, 2, on_evict=log.evict("m"))  # v1 can never be mapped
    res = mgr.admit([5, 6], [2])
    mgr.release(res.ids)  # blocks 1, 0 cached; page 0 cache-only
    log.take()
    _, blocks = grow(mgr, 1)  # no free block, no pool page: evict the LRU head, block 1
    assert blocks == [1] and log.take() == [("evict", "m", [1])]
    assert mgr.cache_only_pages() == [] and mgr.lru_blocks() == [0]
    assert mgr.stats().evictions == 1
    mgr.check()


def test_callbacks_evict_then_map_in_one_call():
    log = Log()
    pool = log.pool(2)
    mgr = paged(pool, 8, 2, on_evict=log.evict("m"))
    res = mgr.admit([5, 6], [2])  # v0 -> p0
    mgr.release(res.ids)  # LRU [1, 0]; page 0 cache-only, no free block
    log.take()
    _, blocks = grow(mgr, 4)  # maps v1 -> p1 (2, 3) first, then the pool is empty: evict 1, 0
    assert blocks == [2, 3, 1, 0]
    assert log.take() == [("evict", "m", [1, 0]), ("map", [1], [1])]
    mgr.check()


def test_trim_evicts_ascending_and_unmaps_cache_only_pages_head_first():
    log = Log()
    pool = log.pool(4)
    mgr = paged(pool, 8, 2, on_evict=log.evict("m"))
    res = mgr.admit([0, 1, 2], [3])  # blocks 0, 1 (v0 -> p0), 2 (v1 -> p1); all registered
    log.take()
    mgr.release(res.ids)  # 2 cached: v1 cache-only (stamp 1); 1, 0 cached: v0 (stamp 2)
    assert mgr.cache_only_pages() == [(1, 1), (0, 2)] and mgr.lru_blocks() == [2, 1, 0]
    assert mgr.bucket_pages(1) == [1] and log.take() == []
    mgr.check()
    assert mgr.trim() == 2
    # v1 first (the head), then v0 with its blocks in ascending id (not in LRU order)
    assert log.take() == [("evict", "m", [2, 0, 1]), ("unmap", [1, 0], [1, 0])]
    assert mgr.lru_blocks() == [] and mgr.cache_only_pages() == []
    assert mgr.unmapped_pages() == [3, 2, 1, 0] and pool.free_pages() == [3, 2, 1, 0]
    s = mgr.stats()
    assert (s.used, s.cached, s.free, s.mapped_pages, s.evictions) == (0, 0, 8, 0, 3)
    assert mgr.admit([0, 1, 2], [3]).num_cached_tokens.tolist() == [0]  # hashes gone
    assert mgr.trim() == 0 and log.take() == [("map", [0, 1], [0, 1])]
    mgr.check()


def test_trim_keeps_pages_with_referenced_blocks():
    pool = ReferencePagePool(2)
    mgr = paged(pool, 4, 2)
    keep = mgr.admit([0, 1, 2], [3])  # blocks 0, 1, 2
    res = mgr.admit([0, 1, 7], [3])  # hits 0, 1; block 3
    mgr.release(res.ids)  # 3 cached (page 1 still holds 2); 1, 0 still referenced by keep
    assert mgr.trim() == 0 and mgr.mapped_pages().tolist() == [0, 1]
    mgr.release(keep.ids)  # 2 cached (v1 cache-only), 1, 0 cached (v0 cache-only)
    assert mgr.cache_only_pages() == [(1, 1), (0, 2)]
    assert mgr.trim() == 2 and pool.num_free == 2
    mgr.check()


# ---------------------------------------------------------------- capacity and rollback


def test_pool_exhausted_available_counts_mapped_free_cached_and_mappable_pages():
    pool = ReferencePagePool(3)
    mgr = paged(pool, 16, 4)  # 4 virtual pages
    other = paged(pool, 4, 4)
    x, xb = grow(mgr, 5)  # page 0 full, page 1: block 4
    assert xb == [0, 1, 2, 3, 4]
    res = mgr.admit([7, 8], [2])  # blocks 5, 6 (page 1), registered
    mgr.release(res.ids)  # cached; page 1 still holds block 4 (not cache-only)
    assert mgr.cache_only_pages() == [] and mgr.page_free_list(1) == [7]
    grow(other, 1)  # the pool's last page
    assert pool.num_free == 0
    with pytest.raises(PoolExhausted) as err:
        mgr.append([x], [10])
    assert (err.value.needed, err.value.available) == (10, 1 + 2 + 0)
    assert mgr.can_append([x], [3]) and not mgr.can_append([x], [4])
    assert mgr.stats().failed_calls == 1
    pool2 = ReferencePagePool(5)
    small = paged(pool2, 8, 4)  # 2 virtual pages, 5 free pool pages: min(5, 2) = 2
    (s,) = small.new_sequences(1)
    with pytest.raises(PoolExhausted) as err:
        small.append([s], [9])
    assert (err.value.needed, err.value.available) == (9, 8)
    check_all(mgr, other, small)


def test_non_atomic_append_checks_each_sequence_against_what_is_left():
    pool = ReferencePagePool(1)
    mgr = paged(pool, 8, 4)
    a, b = mgr.new_sequences(2)
    res = mgr.append([a, b], [3, 2], atomic=False)  # a: 3 of the 4 mappable; b: 2 > 1 left
    assert res.ok.tolist() == [True, False] and res.slot_mapping.tolist() == [0, 1, 2, -1, -1]
    assert mgr.stats().failed_calls == 1
    mgr.check()


def test_failed_multi_prompt_admit_gives_back_the_page_an_earlier_prompt_mapped():
    log = Log()
    pool = log.pool(3)
    mgr = paged(pool, 8, 4, on_evict=log.evict("m"))  # 2 virtual pages
    other = paged(pool, 4, 4)
    s, sb = grow(mgr, 2)  # page 0 (p0): blocks 0, 1
    grow(other, 1)  # p1; the pool has p2 left
    log.take()
    before = state(mgr, other, pool)
    with pytest.raises(PoolExhausted) as err:
        # prompt 1 takes 2, 3 (page 0) and maps page 1 (p2) for block 4; prompt 2 needs 4 > 3
        mgr.admit(np.arange(100, 107), [3, 4])
    assert (err.value.needed, err.value.available) == (7, 2 + 4)
    assert state(mgr, other, pool) == before
    assert pool.free_pages() == [2] and mgr.mapped_pages().tolist() == [0]
    assert log.take() == [] and mgr.stats().failed_calls == 1
    res = mgr.admit(np.arange(100, 106), [3, 3])  # fits: 6 blocks, exactly what is left
    assert res.slot_mapping.tolist() == [2, 3, 4, 5, 6, 7]
    assert log.take() == [("map", [2], [1])]
    check_all(mgr, other)


# ---------------------------------------------------------------- sibling reclaim


def three_managers(log):
    """Siblings a, b (registered first) with two cache-only pages each, and the caller c.

    Stamps: a v0 = 1, b v0 = 2, a v1 = 3, b v1 = 4; the pool (4 pages) is empty.
    """
    pool = log.pool(4)
    a = paged(pool, 4, 2, on_evict=log.evict("a"))
    b = paged(pool, 4, 2, on_evict=log.evict("b"))
    c = paged(pool, 8, 2, on_evict=log.evict("c"))
    admit_and_release(a, [0, 1])  # a v0 -> p0
    admit_and_release(b, [0, 1])  # b v0 -> p1
    admit_and_release(a, [5, 6])  # a v1 -> p2 (v0 has no free block)
    admit_and_release(b, [5, 6])  # b v1 -> p3
    assert a.cache_only_pages() == [(0, 1), (1, 3)] and b.cache_only_pages() == [(0, 2), (1, 4)]
    assert pool.num_free == 0 and pool.clock == 4
    log.take()
    return pool, a, b, c


def test_sibling_reclaim_takes_the_oldest_pages_across_siblings_and_only_as_many_as_wanted():
    log = Log()
    pool, a, b, c = three_managers(log)
    (sid,) = c.new_sequences(1)
    assert c.can_append([sid], [8]) and not c.can_append([sid], [9])  # min(0 + 4, 4) * 2
    res = c.append([sid], [5])  # needed 5, available 0: wanted ceil(5 / 2) = 3 pages
    # chosen by stamp: a v0 (1), b v0 (2), a v1 (3); a gives up first, then b
    assert log.take() == [
        ("evict", "a", [0, 1, 2, 3]),
        ("unmap", [0, 2], [0, 1]),
        ("evict", "b", [0, 1]),
        ("unmap", [1], [0]),
        ("map", [1, 2, 0], [0, 1, 2]),
    ]
    assert res.slot_mapping.tolist() == [0, 1, 2, 3, 4]
    assert c.mapped_pages().tolist() == [1, 2, 0]
    assert a.mapped_pages().tolist() == [] and a.stats().evictions == 4
    assert b.cache_only_pages() == [(1, 4)] and b.mapped_pages().tolist() == [3]
    assert c.stats().failed_calls == 0 and pool.num_free == 0 and pool.clock == 4
    check_all(a, b, c)


def test_sibling_reclaim_for_admit_and_the_callbacks_of_a_sibling_with_nothing_chosen():
    log = Log()
    pool, a, b, c = three_managers(log)
    res = c.admit([9, 9, 9], [3])  # needed 3: wanted 2 pages, a v0 (1) and b v0 (2)
    assert res.slot_mapping.tolist() == [0, 1, 2]
    assert log.take() == [
        ("evict", "a", [0, 1]),
        ("unmap", [0], [0]),
        ("evict", "b", [0, 1]),
        ("unmap", [1], [0]),
        ("map", [1, 0], [0, 1]),
    ]
    res = c.admit([8], [1])  # block 3 of c's page 1: no reclaim needed
    assert res.slot_mapping.tolist() == [3] and log.take() == []
    res = c.admit([7, 7], [2])  # wanted 1: a v1 (3) before b v1 (4); b is not touched
    assert log.take() == [("evict", "a", [2, 3]), ("unmap", [2], [1]), ("map", [2], [2])]
    assert b.cache_only_pages() == [(1, 4)]
    check_all(a, b, c)


def test_sibling_reclaim_is_rolled_back_when_the_retry_still_fails():
    log = Log()
    pool = log.pool(3)
    c = paged(pool, 4, 2, on_evict=log.evict("c"))  # registered first: still not a sibling
    a = paged(pool, 4, 2, on_evict=log.evict("a"))
    admit_and_release(c, [7, 8])  # c v0 -> p0, blocks 0, 1 cached (c's own cache-only page)
    admit_and_release(a, [0, 1])  # a v0 -> p1 (stamp 2)
    admit_and_release(a, [5, 6])  # a v1 -> p2 (stamp 3)
    log.take()
    before = state(a, c, pool)
    with pytest.raises(PoolExhausted) as err:
        # hits 0, 1 (cached), 3 new blocks: 3 > 2 - 2. wanted = ceil((3 - 2) / 2) = 1: a gives
        # up v0; the retry has 4 available, 2 of them the hits: 3 > 2 still
        c.admit([7, 8, 9, 10, 11], [5])
    assert (err.value.needed, err.value.available) == (3, 2)  # the first failure's numbers
    assert state(a, c, pool) == before
    assert pool.free_pages() == [] and a.cache_only_pages() == [(0, 2), (1, 3)]
    assert log.take() == [] and a.stats().evictions == 0
    assert c.stats().failed_calls == 1 and a.stats().failed_calls == 0
    check_all(a, c)


def test_no_sibling_reclaim_for_non_atomic_calls_or_without_virtual_pages():
    log = Log()
    pool, a, b, c = three_managers(log)
    before = state(a, b, pool)
    (sid,) = c.new_sequences(1)
    res = c.append([sid], [1], atomic=False)
    assert res.ok.tolist() == [False] and state(a, b, pool) == before
    res = c.admit([1, 2], [2], atomic=False)
    assert res.ok.tolist() == [False] and state(a, b, pool) == before
    with pytest.raises(PoolExhausted) as err:
        c.append([sid], [9])  # wanted 5 pages > 4 virtual pages of c
    assert (err.value.needed, err.value.available) == (9, 0)
    assert state(a, b, pool) == before and log.take() == []
    assert c.stats().failed_calls == 3
    tiny = paged(log.pool(1), 2, 2)  # a lone manager: no siblings to ask
    (t,) = tiny.new_sequences(1)
    tiny.append([t], [2])
    assert not tiny.can_append([t], [1])
    with pytest.raises(PoolExhausted):
        tiny.append([t], [1])
    check_all(a, b, c, tiny)


def test_can_append_with_siblings_is_bounded_by_virtual_pages():
    log = Log()
    pool, a, b, _ = three_managers(log)
    small = paged(pool, 4, 2)  # 2 virtual pages: min(0 + 4, 2) * 2 = 4
    (sid,) = small.new_sequences(1)
    assert small.can_append([sid], [4]) and not small.can_append([sid], [5])
    with pytest.raises(PoolExhausted):
        small.append([sid], [5])
    small.append([sid], [4])  # wanted 2: a v0 and b v0
    assert a.cache_only_pages() == [(1, 3)] and b.cache_only_pages() == [(1, 4)]
    assert small.mapped_pages().tolist() == [1, 0]
    check_all(a, b, small)


# ---------------------------------------------------------------- invariants


def test_check_catches_page_inconsistencies():
    pool = ReferencePagePool(2)
    mgr = paged(pool, 8, 4)
    sid, _ = grow(mgr, 2)
    mgr.check()
    mgr._buckets[2].remove(0)
    with pytest.raises(InvariantViolation, match="page 0"):
        mgr.check()
    mgr._buckets[2].insert(0, 0)
    mgr._page_free[0].pop()  # block 2 lost
    with pytest.raises(InvariantViolation, match="unreferenced"):
        mgr.check()
    mgr._page_free[0].append(2)
    mgr.check()
    del pool._owner[0]
    with pytest.raises(InvariantViolation):
        mgr.check()


def test_random_operations_keep_page_invariants_and_failed_calls_change_nothing():
    rng = np.random.default_rng(99)
    log = Log()
    pool = log.pool(5)
    mgrs = [paged(pool, 8, 2, on_evict=log.evict(i), max_seqs=6, max_seq_len=8) for i in range(3)]
    live: list[list[int]] = [[] for _ in mgrs]
    failures = reclaims = 0
    for _ in range(1500):
        i = int(rng.integers(len(mgrs)))
        mgr = mgrs[i]
        op = int(rng.integers(5))
        before = state(*mgrs, pool)
        log.take()
        try:
            if op == 0 and len(live[i]) < 5:
                p = int(rng.integers(1, 3))
                lengths = rng.integers(1, 5, size=p)
                toks = rng.integers(0, 2, size=int(lengths.sum()))
                res = mgr.admit(toks, lengths, atomic=bool(rng.integers(2)))
                live[i] += [int(s) for s in res.ids if s >= 0]
            elif op == 1 and live[i]:
                sid = int(rng.choice(live[i]))
                n = int(rng.integers(1, 4))
                if mgr.seq_lens([sid])[0] + n <= 8:
                    predicted = mgr.can_append([sid], [n])
                    try:
                        mgr.append([sid], [n], rng.integers(0, 2, size=n))
                        assert predicted
                    except PoolExhausted:
                        assert not predicted
                        raise
            elif op == 2 and live[i]:
                victim = int(rng.choice(live[i]))
                mgr.release([victim])
                live[i].remove(victim)
            elif op == 3:
                mgr.trim()
            elif op == 4 and live[i] and len(live[i]) < 6:
                live[i] += mgr.fork([int(rng.choice(live[i]))]).ravel().tolist()
        except PoolExhausted:
            failures += 1
            after = state(*mgrs, pool)
            assert after == before and log.calls == []
        if any(c[0] == "unmap" for c in log.calls) and op in (0, 1):
            reclaims += 1
        check_all(*mgrs)
        for m in mgrs:
            s = m.stats()
            assert s.used + s.cached + s.free == 8
        assert pool.num_free + sum(m.stats().mapped_pages for m in mgrs) == 5
    assert failures > 0 and reclaims > 0
