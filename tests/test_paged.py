"""Two-level allocation: managers on a page pool (the policy of docs/design.md, kernels only).

The reference model is compared with the kernels in ``test_stateful_pages.py``; these tests pin
the contract's scenarios with concrete block and page ids.
"""

import numpy as np
import pytest

import kvnumba
from kvnumba import BlockManager, PagePool, PoolExhausted


def same_state(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


class Hooks:
    """Records every callback in order."""

    def __init__(self):
        self.calls = []

    def on_map(self, physical, virtual):
        self.calls.append(("map", physical.tolist(), virtual.tolist()))

    def on_unmap(self, physical, virtual):
        self.calls.append(("unmap", physical.tolist(), virtual.tolist()))

    def on_evict(self, ids, hashes, tokens):
        self.calls.append(("evict", ids.tolist()))


def make(pool, num_blocks=16, k=4, hooks=None, **kwargs):
    on_evict = hooks.on_evict if hooks is not None else None
    return BlockManager(
        num_blocks, 1, page_pool=pool, blocks_per_page=k, max_seqs=16, on_evict=on_evict, **kwargs
    )


def grow(mgr, counts, tokens=False):
    ids = mgr.new_sequences(len(counts))
    toks = np.arange(sum(counts)) if tokens else None
    mgr.append(ids, counts, toks)
    return ids


def test_geometry_is_validated():
    pool = PagePool(4)
    with pytest.raises(kvnumba.InvalidGeometry):
        BlockManager(10, 1, page_pool=pool, blocks_per_page=4)
    with pytest.raises(kvnumba.InvalidGeometry):
        BlockManager(8, 1, page_pool=pool)
    with pytest.raises(kvnumba.InvalidGeometry):
        BlockManager(8, 1, blocks_per_page=4)
    with pytest.raises(TypeError):
        BlockManager(8, 1, page_pool="pool", blocks_per_page=4)
    assert pool.num_free == 4  # nothing was registered or mapped


def test_pages_are_mapped_on_demand_and_fullest_page_first():
    hooks = Hooks()
    pool = PagePool(4, on_map=hooks.on_map, on_unmap=hooks.on_unmap)
    mgr = make(pool)
    assert mgr.mapped_pages().tolist() == [] and mgr.stats().free == 16
    a = grow(mgr, [3])  # page 0: blocks 0, 1, 2
    assert hooks.calls == [("map", [0], [0])]
    b = grow(mgr, [6])  # block 3 fills page 0, then page 1 gives 4..8
    assert mgr.block_tables(b).tolist() == [[3, 4, 5, 6, 7, 8]]
    assert mgr.mapped_pages().tolist() == [0, 1, 2]
    c = grow(mgr, [1])  # page 2 has 3 free blocks: taken from its free list top
    assert mgr.block_tables(c).tolist() == [[9]]
    mgr.release(a)  # page 0 now has 3 free blocks, page 2 has 2: page 2 is fuller
    d = grow(mgr, [3])
    # Page 2 gives its last two blocks, then page 0 the top of its free list: the block
    # released last (release runs tail first).
    assert mgr.block_tables(d).tolist() == [[10, 11, 0]]
    assert mgr.stats().mapped_pages == 3 and pool.num_free == 1
    mgr.check()
    pool.check()


def test_an_empty_page_is_unmapped_and_reused_first():
    hooks = Hooks()
    pool = PagePool(4, on_map=hooks.on_map, on_unmap=hooks.on_unmap)
    mgr = make(pool)
    a, b = grow(mgr, [4, 4])  # pages 0 and 1
    hooks.calls.clear()
    mgr.release([a])  # not cached (no token ids): page 0 empties
    assert hooks.calls == [("unmap", [0], [0])]
    assert mgr.mapped_pages().tolist() == [1] and pool.num_free == 3
    assert mgr.stats().free == 12 and mgr.stats().used == 4
    hooks.calls.clear()
    grow(mgr, [1])  # virtual page 0 and physical page 0 were pushed back on top
    assert hooks.calls == [("map", [0], [0])]
    mgr.check()


def test_cached_blocks_keep_their_page_mapped_until_trim():
    hooks = Hooks()
    pool = PagePool(4, on_map=hooks.on_map, on_unmap=hooks.on_unmap)
    mgr = make(pool, hooks=hooks)
    (a,) = grow(mgr, [6], tokens=True)  # full blocks with token ids: cached on release
    hooks.calls.clear()
    mgr.release([a])
    assert hooks.calls == []  # every block is cached: both pages stay mapped
    assert mgr.stats().cached == 6 and mgr.mapped_pages().tolist() == [0, 1]
    mgr.check()
    assert mgr.trim() == 2
    # Release runs tail first, so page 1 became cache-only first: the oldest page goes first,
    # each page's cached blocks in ascending id; one callback of each kind, on_evict first.
    assert hooks.calls == [("evict", [4, 5, 0, 1, 2, 3]), ("unmap", [1, 0], [1, 0])]
    assert mgr.stats().cached == 0 and mgr.stats().evictions == 6
    assert pool.num_free == 4 and mgr.mapped_pages().tolist() == []
    assert mgr.trim() == 0
    mgr.check()
    pool.check()


def test_a_page_with_a_referenced_block_is_not_trimmed():
    pool = PagePool(4)
    mgr = make(pool)
    (a,) = grow(mgr, [4], tokens=True)
    (b,) = grow(mgr, [1])
    mgr.release([a])  # page 0 cache-only; page 1 holds b's block
    assert mgr.trim() == 1
    assert mgr.mapped_pages().tolist() == [1]
    assert mgr.stats().used == 1
    mgr.check()


def test_trim_without_a_pool_is_a_no_op():
    mgr = BlockManager(8, 1)
    assert mgr.trim() == 0 and mgr.mapped_pages().tolist() == []


def test_prefix_hit_revives_a_cache_only_page():
    pool = PagePool(4)
    mgr = make(pool, k=2, num_blocks=8)
    prompt = [5, 6, 7]
    (a,) = mgr.admit(prompt, [3]).ids
    mgr.release([a])  # blocks 0, 1, 2 cached: pages 0 and 1 are cache-only
    assert mgr.mapped_pages().tolist() == [0, 1] and mgr.stats().cached == 3
    r = mgr.admit(prompt, [3])
    assert r.num_cached_tokens.tolist() == [2]
    assert mgr.block_tables(r.ids).tolist() == [[0, 1, 3]]  # block 3: page 1's free block
    assert mgr.trim() == 0  # both pages hold a referenced block again
    mgr.check()


def two_managers(pages=3, hooks=None):
    hooks = hooks or Hooks()
    pool = PagePool(pages, on_map=hooks.on_map, on_unmap=hooks.on_unmap)
    return pool, make(pool, hooks=hooks), make(pool), hooks


def snapshots(pool, *managers):
    return [pool.snapshot(), *(m.snapshot() for m in managers)]


def assert_unchanged(before, pool, *managers):
    after = snapshots(pool, *managers)
    for x, y in zip(before, after, strict=True):
        assert same_state(x, y)


def test_miss_before_anything_was_taken():
    pool, m1, m2, hooks = two_managers()
    (hog,) = grow(m2, [12])  # the sibling holds every physical page
    (s,) = m1.new_sequences(1)
    before = snapshots(pool, m1, m2)
    hooks.calls.clear()
    with pytest.raises(PoolExhausted) as info:
        m1.append([s], [1])
    assert (info.value.needed, info.value.available) == (1, 0)
    assert_unchanged(before, pool, m1, m2)
    assert hooks.calls == [] and m1.stats().failed_calls == 1
    m2.release([hog])
    m1.append([s], [1])
    # The sibling's pages went back tail first, so its first physical page is on top.
    assert m1.mapped_pages().tolist() == [0]
    m1.check()
    m2.check()


def test_miss_after_blocks_of_a_mapped_page():
    pool, m1, m2, hooks = two_managers()
    (s,) = grow(m1, [2])  # page 0 of m1 keeps 2 free blocks
    (hog,) = grow(m2, [8])  # the two other physical pages
    before = snapshots(pool, m1, m2)
    hooks.calls.clear()
    with pytest.raises(PoolExhausted) as info:
        # Two blocks of page 0 would do, then no page for the third. The exact capacity check
        # (under the pool lock) fails the call before it takes anything; the logged-admit
        # tests below show blocks and pages really taken, then given back.
        m1.append([s], [3])
    assert (info.value.needed, info.value.available) == (3, 2)
    assert_unchanged(before, pool, m1, m2)
    assert hooks.calls == []
    m2.release([hog])
    m1.append([s], [3])
    assert m1.block_tables([s]).tolist() == [[0, 1, 2, 3, 4]]
    m1.check()


def test_miss_after_a_newly_mapped_page():
    pool, m1, m2, hooks = two_managers()
    (s,) = grow(m1, [3])  # page 0 of m1 keeps 1 free block
    (hog,) = grow(m2, [4])  # one physical page left in the pool
    before = snapshots(pool, m1, m2)
    hooks.calls.clear()
    with pytest.raises(PoolExhausted) as info:
        # One block of page 0 and a newly mapped page would do, then a miss: failed up front.
        m1.append([s], [6])
    assert (info.value.needed, info.value.available) == (6, 5)
    assert_unchanged(before, pool, m1, m2)
    assert hooks.calls == []
    m2.release([hog])
    m1.append([s], [6])
    assert m1.stats().mapped_pages == 3
    m1.check()
    m2.check()


def test_logged_admit_gives_back_pages_mapped_by_earlier_prompts():
    pool, m1, m2, hooks = two_managers(pages=4)
    (s,) = grow(m1, [3])  # m1 page 0: one free block
    (hog,) = grow(m2, [8])  # one physical page left
    before = snapshots(pool, m1, m2)
    hooks.calls.clear()
    with pytest.raises(PoolExhausted):
        # prompt 0 takes block 3 and maps a page; prompt 1 does not fit: undo log rollback
        m1.admit(np.arange(9), [4, 5])
    assert_unchanged(before, pool, m1, m2)
    assert hooks.calls == []
    m2.release([hog])
    r = m1.admit(np.arange(9), [4, 5])
    assert r.ok.all() and m1.stats().mapped_pages == 3
    m1.check()
    pool.check()


def test_logged_admit_gives_back_blocks_taken_from_a_mapped_page():
    pool, m1, m2, hooks = two_managers()
    (s,) = grow(m1, [2])  # m1 page 0: blocks 2 and 3 free
    (hog,) = grow(m2, [8])  # the pool is empty
    before = snapshots(pool, m1, m2)
    hooks.calls.clear()
    with pytest.raises(PoolExhausted):
        # prompt 0 really takes blocks 2 and 3, then prompt 1 misses: the undo log restores
        m1.admit(np.arange(5), [2, 3])
    assert_unchanged(before, pool, m1, m2)
    assert hooks.calls == []
    m2.release([hog])
    r = m1.admit(np.arange(5), [2, 3])
    assert m1.block_tables(r.ids).tolist() == [[2, 3, -1], [4, 5, 6]]
    m1.check()


def test_sibling_gives_up_its_oldest_cache_only_pages():
    hooks = Hooks()
    pool = PagePool(3, on_map=hooks.on_map, on_unmap=hooks.on_unmap)
    m1 = make(pool)
    m2 = make(pool, hooks=hooks)
    old, new = grow(m2, [4, 4], tokens=True)  # m2 holds pages 0 and 1 (physical 0 and 1)
    m2.release([old])  # page 0 becomes cache-only first (older stamp)
    m2.release([new])
    (hog,) = grow(m1, [4])  # the last physical page
    hooks.calls.clear()
    (s,) = m1.new_sequences(1)
    m1.append([s], [3])  # needs one page: m2 gives up its oldest cache-only page only
    assert m2.mapped_pages().tolist() == [1]
    assert m2.stats().evictions == 4 and m2.stats().cached == 4
    assert hooks.calls == [("evict", [0, 1, 2, 3]), ("unmap", [0], [0]), ("map", [0], [1])]
    m1.check()
    m2.check()
    pool.check()


def test_sibling_reclaim_is_not_attempted_when_it_cannot_cover_the_call():
    pool = PagePool(2)
    m1, m2 = make(pool), make(pool)
    (c,) = grow(m2, [4], tokens=True)
    m2.release([c])  # one cache-only page
    (hog,) = grow(m1, [4])
    before = snapshots(pool, m1, m2)
    with pytest.raises(PoolExhausted):
        m1.append([hog], [8])  # needs two pages; the sibling has one to give
    assert_unchanged(before, pool, m1, m2)


def test_a_sibling_give_up_rolls_back_byte_for_byte():
    pool = PagePool(3)
    m1, m2 = make(pool), make(pool)
    a, b = grow(m2, [4, 3], tokens=True)
    m2.release([a, b])
    before = snapshots(pool, m1, m2)
    givers = []
    # Five blocks lacking: two pages wanted. The coordinator talks to the managers' page sides.
    pool._coordinator.ask_siblings(m1._pages, 5, givers)
    assert givers == [m2._pages] and m2.mapped_pages().tolist() == [] and pool.num_free == 3
    m2._pages.rollback_give_up()
    assert_unchanged(before, pool, m1, m2)
    m2.check()


def test_can_append_counts_what_siblings_can_give():
    pool = PagePool(2)
    m1, m2 = make(pool), make(pool)
    (c,) = grow(m2, [4], tokens=True)
    (hog,) = grow(m1, [4])
    assert not m1.can_append([hog], [1])
    m2.release([c])
    assert m1.can_append([hog], [4]) and not m1.can_append([hog], [5])


def test_available_counts_free_pool_pages():
    pool = PagePool(2)
    mgr = make(pool)
    (s,) = grow(mgr, [1])
    with pytest.raises(PoolExhausted) as info:
        mgr.append([s], [9])
    # 3 free blocks in page 0 + 1 free pool page of 4 blocks
    assert (info.value.needed, info.value.available) == (9, 7)


def test_non_atomic_append_serves_what_the_pool_allows():
    pool = PagePool(1)
    mgr = make(pool)
    ids = mgr.new_sequences(3)
    r = mgr.append(ids, [2, 3, 2], atomic=False)
    assert r.ok.tolist() == [True, False, True]
    assert mgr.block_tables(ids[[0, 2]]).tolist() == [[0, 1], [2, 3]]
    mgr.check()


def test_repr_and_stats_show_pages():
    pool = PagePool(2)
    mgr = make(pool)
    grow(mgr, [5])
    assert "mapped_pages=2" in repr(mgr)
    stats = mgr.stats()
    assert stats.used + stats.cached + stats.free == mgr.num_blocks
    assert mgr.page_pool is pool and mgr.blocks_per_page == 4


def test_a_collected_manager_gives_its_pages_back():
    import gc

    hooks = Hooks()
    pool = PagePool(4, on_map=hooks.on_map, on_unmap=hooks.on_unmap)
    mgr = make(pool)
    grow(mgr, [5])
    (cached,) = grow(mgr, [4], tokens=True)
    mgr.release([cached])  # a cache-only page goes back too
    hooks.calls.clear()
    del mgr
    gc.collect()
    assert pool.num_free == 1  # queued: given back at the pool's next call from a manager
    other = make(pool)
    other.trim()
    assert pool.num_free == 4 and hooks.calls == [("unmap", [0, 1, 2], [0, 1, 2])]
    pool.check()
    other.check()


def test_close_gives_the_pages_back_and_retires_the_manager():
    pool = PagePool(4)
    mgr = make(pool)
    ids = grow(mgr, [5])
    mgr.close()
    assert pool.num_free == 4
    pool.check()
    with pytest.raises(ValueError, match="closed"):
        mgr.append(ids, [1])
    with pytest.raises(ValueError, match="closed"):
        mgr.block_tables(ids)
    mgr.close()  # idempotent
    plain = BlockManager(8, 1)
    plain.close()
    assert plain.new_sequences(1).shape == (1,)


def test_siblings_with_other_page_sizes_give_up_whole_pages():
    pool = PagePool(2)
    big = BlockManager(64, 1, page_pool=pool, blocks_per_page=32, max_seqs=8)
    small = BlockManager(8, 1, page_pool=pool, blocks_per_page=1, max_seqs=8)
    (s,) = big.new_sequences(1)
    big.append([s], [32], np.arange(32))
    big.release([s])  # one cache-only page of 32 cached blocks
    (h,) = big.new_sequences(1)
    big.append([h], [1])  # the pool is empty
    (t,) = small.new_sequences(1)
    small.append([t], [1])  # the big sibling evicts 32 blocks to give up its page
    assert big.stats().evictions == 32 and small.mapped_pages().tolist() == [0]
    big.check()
    small.check()
    pool.check()


def test_sibling_reclaim_counts_the_cached_hits_an_admit_claims():
    pool = PagePool(3)
    m1, m2 = make(pool), make(pool)
    r = m1.admit(np.arange(5), [5])
    m1.release(r.ids)  # blocks 0..3 cached in m1, block 4 freed
    a, b = m2.new_sequences(2)
    m2.append([a, b], [4, 4], np.arange(100, 108))
    m2.release([a, b])  # two cache-only pages in m2; the pool is empty
    # 9 blocks: 4 cached hits plus 5 new; m1 has 4 cached, 0 free: it lacks 5 blocks, 2 pages
    r = m1.admit(np.arange(9), [9])
    assert r.num_cached_tokens.tolist() == [4] and m2.mapped_pages().tolist() == []
    m1.check()
    m2.check()


def test_a_closed_sibling_is_never_asked():
    pool = PagePool(2)
    m1, m2, m3 = make(pool), make(pool), make(pool)
    for m in (m2, m3):
        (s,) = m.new_sequences(1)
        m.append([s], [4], np.arange(4))
        m.release([s])
    m2.close()  # its page went back to the pool
    assert pool.num_free == 1 and m2.mapped_pages().tolist() == []
    (h,) = m1.new_sequences(1)
    m1.append([h], [8])  # the free page, then m3's cache-only page
    assert m3.mapped_pages().tolist() == [] and m1.stats().mapped_pages == 2
    m1.check()
    m3.check()


def test_every_callback_runs_when_one_raises():
    calls = []
    failing = []

    def on_map(physical, virtual):
        calls.append("map")
        if failing:
            raise RuntimeError("engine hook failed")

    def on_unmap(physical, virtual):
        calls.append("unmap")

    pool = PagePool(1, on_map=on_map, on_unmap=on_unmap)
    m1, m2 = make(pool), make(pool)
    (c,) = grow(m2, [4], tokens=True)
    m2.release([c])
    calls.clear()
    failing.append(True)
    (s,) = m1.new_sequences(1)
    with pytest.raises(kvnumba.CallbackError) as info:
        m1.append([s], [1])  # the sibling's page is unmapped, then mapped for m1
    assert isinstance(info.value.__cause__, RuntimeError)
    assert "engine hook" in str(info.value.__cause__)
    assert info.value.result.slot_mapping.shape == (1,)
    assert calls == ["unmap", "map"]
    assert m1.seq_lens([s]).tolist() == [1]  # the call committed before its callbacks
    m1.check()
    m2.check()
