"""Exact outcomes of ``truncate``, ``reserved_blocks``, ``evict`` and ``reset_prefix_cache``.

The state machines (``test_stateful*.py``) compare these calls with the reference model under
random traffic; here each policy of ``docs/design.md`` ("Shrinking and engine conveniences")
is pinned down on a small example, block id for block id, and every kind of bad input is shown
to raise its typed error with the state arrays byte-identical.
"""

from __future__ import annotations

import numpy as np
import pytest

import kvnumba
from kvnumba._layout import F_HASHED, F_REGISTERED, M_LRU_HEAD, M_REGISTERED, NIL
from kvnumba.state import free_blocks


def lru(mgr) -> list[int]:
    order, b = [], int(mgr.state.meta[M_LRU_HEAD])
    while b != NIL:
        order.append(b)
        b = int(mgr.state.lru_next[b])
    return order


def free_stack(mgr) -> list[int]:
    return free_blocks(mgr.state)[::-1].tolist()  # bottom to top: the last is taken next


def registered(mgr) -> set[int]:
    htab = mgr.state.htab
    return set(htab[htab >= 0].tolist())


def assert_unchanged(before, mgr):
    for name, a, b in zip(before._fields, before, mgr.snapshot(), strict=True):
        assert np.array_equal(a, b), f"{name} changed by a failed call"


class Evictions:
    def __init__(self):
        self.calls = []

    def __call__(self, ids, hashes, tokens):
        self.calls.append((ids.tolist(), tokens.tolist()))


# ------------------------------------------------------------------------------------ truncate
def test_truncate_drops_whole_blocks_tail_first_and_scrubs_the_cut_block():
    mgr = kvnumba.BlockManager(8, 4, max_seqs=4)
    (a,) = mgr.admit(list(range(10)), [10]).ids  # blocks 0, 1 full and registered, 2 partial
    assert registered(mgr) == {0, 1}
    mgr.truncate([a], [3])
    mgr.check()
    assert mgr.seq_lens([a]).tolist() == [3]
    assert mgr.block_tables([a]).tolist() == [[0]]
    # Tail first: partial block 2 freed (on top of the stack), then registered block 1 cached.
    assert free_stack(mgr)[-1] == 2
    assert lru(mgr) == [1]
    # The cut block, held by a alone: scrubbed past the end and unregistered.
    assert mgr.state.tokens[0].tolist() == [0, 1, 2, -1]
    assert not mgr.state.block_flags[0] & (F_HASHED | F_REGISTERED)
    assert registered(mgr) == {1} and mgr.state.meta[M_REGISTERED] == 1
    # It is the partial tail again: the next append writes into it in place.
    result = mgr.append([a], [2], [7, 8])
    assert result.slot_mapping.tolist() == [3, 2 * 4]  # then block 2, the free stack's top
    assert result.cow_src.size == 0
    assert kvnumba.Sequence(mgr, int(a)).tokens.tolist() == [0, 1, 2, 7, 8]
    mgr.check()


def test_truncate_at_a_block_boundary_keeps_the_full_blocks_registered():
    mgr = kvnumba.BlockManager(8, 4, max_seqs=4)
    (a,) = mgr.admit(list(range(10)), [10]).ids
    mgr.truncate([a], [8])
    mgr.check()
    assert mgr.block_tables([a]).tolist() == [[0, 1]]
    assert registered(mgr) == {0, 1}
    assert mgr.state.tokens[1].tolist() == [4, 5, 6, 7]


def test_truncate_to_zero_keeps_the_sequence_live_and_unchanged_lengths_are_no_ops():
    mgr = kvnumba.BlockManager(8, 2, max_seqs=4, prefix_caching=False)
    a, b = mgr.new_sequences(2)
    mgr.append([a, b], [5, 3])
    before = mgr.snapshot()
    mgr.truncate([b], [3])
    assert_unchanged(before, mgr)
    mgr.truncate([a, b], [0, 2])
    mgr.check()
    assert mgr.seq_lens([a, b]).tolist() == [0, 2]
    assert mgr.stats().used == 1
    mgr.append([a], [1])
    mgr.check()


def test_truncate_into_a_shared_block_keeps_it_and_the_next_append_copies_it():
    mgr = kvnumba.BlockManager(8, 4, max_seqs=4)
    (a,) = mgr.admit(list(range(8)), [8]).ids  # blocks 0 and 1, both full and registered
    (child,) = mgr.fork([a])[0]
    mgr.truncate([child], [6])
    mgr.check()
    # Shared: intact (content, registration) for a; no extra reference.
    assert mgr.ref_count(1) == 2
    assert mgr.state.tokens[1].tolist() == [4, 5, 6, 7] and 1 in registered(mgr)
    result = mgr.append([child], [1], [9])
    mgr.check()
    assert result.cow_src.tolist() == [1]
    (copy,) = result.cow_dst.tolist()
    assert result.slot_mapping.tolist() == [copy * 4 + 2]
    assert kvnumba.Sequence(mgr, int(child)).tokens.tolist() == [0, 1, 2, 3, 4, 5, 9]
    assert kvnumba.Sequence(mgr, int(a)).tokens.tolist() == list(range(8))
    assert mgr.ref_count(1) == 1 and 1 in registered(mgr)
    mgr.release([a])
    assert lru(mgr) == [1]  # block 0 is still the child's
    assert mgr.admit(list(range(9)), [9]).num_cached_tokens.tolist() == [8]
    mgr.check()


def test_a_truncated_tail_left_alone_is_reclaimed_in_place_by_the_next_append():
    mgr = kvnumba.BlockManager(8, 4, max_seqs=4, block_events=True)
    (a,) = mgr.admit(list(range(8)), [8]).ids
    (child,) = mgr.fork([a])[0]
    mgr.truncate([child], [6])
    mgr.release([a])
    mgr.check()  # block 1 is the child's alone, still registered with a's content
    assert mgr.ref_count(1) == 1 and 1 in registered(mgr)
    assert mgr.state.tokens[1].tolist() == [4, 5, 6, 7]
    mgr.take_events()
    result = mgr.append([child], [1], [9])
    mgr.check()
    # Written in place: no copy, a's tail scrubbed and the registration dropped (an event).
    assert result.cow_src.tolist() == [] and result.slot_mapping.tolist() == [1 * 4 + 2]
    assert mgr.state.tokens[1].tolist() == [4, 5, 9, -1] and 1 not in registered(mgr)
    events = mgr.take_events()
    assert events.kind.tolist() == [kvnumba.BlockEvents.REMOVED]
    assert events.block.tolist() == [1]
    assert kvnumba.Sequence(mgr, int(child)).tokens.tolist() == [0, 1, 2, 3, 4, 5, 9]
    assert mgr.admit(list(range(8)), [8]).num_cached_tokens.tolist() == [4]
    mgr.check()


def test_a_truncated_shared_tail_forks_and_releases_with_plain_references():
    mgr = kvnumba.BlockManager(8, 2, max_seqs=8)
    (a,) = mgr.admit([1, 2, 3, 4], [4]).ids
    (b,) = mgr.fork([a])[0]
    mgr.truncate([b], [3])  # cuts into block 1, shared with a
    assert mgr.ref_count(1) == 2
    (c,) = mgr.fork([b])[0]
    assert mgr.ref_count(1) == 3
    mgr.check()
    result = mgr.append([c], [1], [7])  # still shared: c copies
    assert result.cow_src.tolist() == [1] and mgr.ref_count(1) == 2
    mgr.check()
    mgr.release([a])
    result = mgr.append([b], [1], [8])  # b's alone now: in place
    assert result.cow_src.tolist() == [] and result.slot_mapping.tolist() == [1 * 2 + 1]
    mgr.check()
    mgr.release([b, c])
    assert mgr.stats().used == 0
    mgr.check()


BAD_TRUNCATIONS = [
    ("negative", lambda a, b: ([a], [-1]), ValueError),
    ("longer", lambda a, b: ([a, b], [1, 4]), ValueError),
    ("duplicate", lambda a, b: ([a, a], [1, 1]), ValueError),
    ("mismatch", lambda a, b: ([a, b], [1]), ValueError),
    ("float", lambda a, b: ([a], [1.0]), TypeError),
    ("two-dimensional", lambda a, b: ([[a]], [[1]]), ValueError),
    ("unknown", lambda a, b: ([a + 12345], [0]), kvnumba.InvalidSequence),
]


@pytest.mark.parametrize(
    ("name", "make", "error"), BAD_TRUNCATIONS, ids=[t[0] for t in BAD_TRUNCATIONS]
)
def test_bad_truncations_raise_and_change_nothing(name, make, error):
    mgr = kvnumba.BlockManager(8, 2, max_seqs=4)
    (a,) = mgr.admit([1, 2, 3], [3]).ids
    (b,) = mgr.admit([4, 5, 6], [3]).ids
    before = mgr.snapshot()
    with pytest.raises(error):
        mgr.truncate(*make(int(a), int(b)))
    assert_unchanged(before, mgr)


def test_truncating_a_released_sequence_is_sequence_released():
    mgr = kvnumba.BlockManager(8, 2, max_seqs=4)
    a, b = mgr.new_sequences(2)
    mgr.release([a])
    before = mgr.snapshot()
    with pytest.raises(kvnumba.SequenceReleased):
        mgr.truncate([b, a], [0, 0])
    assert_unchanged(before, mgr)


def test_truncate_on_a_page_pool_unmaps_pages_it_empties():
    unmapped = []
    pool = kvnumba.PagePool(4, on_unmap=lambda p, v: unmapped.append((p.tolist(), v.tolist())))
    mgr = kvnumba.BlockManager(4, 2, page_pool=pool, blocks_per_page=2, prefix_caching=False)
    (a,) = mgr.new_sequences(1)
    mgr.append([a], [7])  # blocks 0..3: pages 0 and 1 mapped
    assert pool.num_free == 2
    mgr.truncate([a], [3])  # blocks 3 and 2 freed: page 1 is empty
    mgr.check()
    assert unmapped == [([1], [1])]
    assert pool.num_free == 3 and mgr.mapped_pages().tolist() == [0]


# ----------------------------------------------------------------------------- reserved_blocks
def test_reserved_blocks_are_never_handed_out():
    mgr = kvnumba.BlockManager(6, 1, max_seqs=8, reserved_blocks=2, prefix_caching=False)
    assert mgr.reserved_blocks == 2
    stats = mgr.stats()
    assert (stats.used, stats.cached, stats.free) == (2, 0, 4)  # reserved count as used
    assert free_stack(mgr) == [5, 4, 3, 2]  # the lowest unreserved block is popped first
    (a,) = mgr.new_sequences(1)
    mgr.append([a], [4])
    assert mgr.block_tables([a]).tolist() == [[2, 3, 4, 5]]
    with pytest.raises(kvnumba.PoolExhausted) as info:
        mgr.append([a], [1])
    assert info.value.available == 0
    stats = mgr.stats()
    assert (stats.used, stats.cached, stats.free) == (6, 0, 0)  # 4 held and 2 reserved
    mgr.release([a])
    assert sorted(free_stack(mgr)) == [2, 3, 4, 5]
    mgr.check()


def test_check_accounts_for_reserved_blocks():
    mgr = kvnumba.BlockManager(6, 2, reserved_blocks=1)
    mgr.check()
    mgr._arenas.s.tokens[0, 1] = 7  # a reserved block must never be written
    with pytest.raises(kvnumba.InvariantViolation, match="reserved block 0"):
        mgr.check()


@pytest.mark.parametrize(
    ("reserved", "error"),
    [
        (-1, kvnumba.InvalidGeometry),
        (6, kvnumba.InvalidGeometry),
        (True, TypeError),
        (1.0, TypeError),
    ],
)
def test_bad_reserved_blocks(reserved, error):
    with pytest.raises(error):
        kvnumba.BlockManager(6, 2, reserved_blocks=reserved)


def test_reserved_blocks_with_a_page_pool_is_invalid_geometry():
    pool = kvnumba.PagePool(2)
    with pytest.raises(kvnumba.InvalidGeometry, match="page pool"):
        kvnumba.BlockManager(4, 2, page_pool=pool, blocks_per_page=2, reserved_blocks=1)
    kvnumba.BlockManager(4, 2, page_pool=pool, blocks_per_page=2, reserved_blocks=0).check()


# --------------------------------------------------------------------------------------- evict
def cached_manager(on_evict=None):
    """Blocks 0, 1 cached (LRU order 1, 0: released tail first), 2 freed, 3.. free."""
    mgr = kvnumba.BlockManager(6, 2, max_seqs=4, on_evict=on_evict)
    (a,) = mgr.admit([1, 2, 3, 4, 5], [5]).ids
    mgr.release([a])
    assert lru(mgr) == [1, 0]
    return mgr


def test_evict_evicts_exactly_the_given_cached_blocks():
    hook = Evictions()
    mgr = cached_manager(hook)
    evictions = mgr.stats().evictions
    assert mgr.evict([0, 2, 0]) == 1  # 2 is free and the second 0 is free by then: skipped
    mgr.check()
    assert hook.calls == [([0], [[1, 2]])]
    assert lru(mgr) == [1]
    assert free_stack(mgr)[-1] == 0 and mgr.state.tokens[0].tolist() == [-1, -1]
    assert registered(mgr) == {1}
    assert mgr.stats().evictions == evictions + 1
    # The chain now misses at block 0, so nothing is reused.
    assert mgr.admit([1, 2, 3, 4, 5], [5]).num_cached_tokens.tolist() == [0]
    mgr.check()


def test_evict_refuses_referenced_and_out_of_range_blocks():
    hook = Evictions()
    mgr = cached_manager(hook)
    (a,) = mgr.admit([9, 9, 9], [3]).ids
    used = int(mgr.block_tables([a])[0, 0])
    before = mgr.snapshot()
    with pytest.raises(ValueError, match=f"block {used} "):
        mgr.evict([0, used])
    for bad in ([-1], [6], [0, 1, 99]):
        with pytest.raises(ValueError, match="outside the pool"):
            mgr.evict(bad)
    with pytest.raises(TypeError):
        mgr.evict([0.5])
    assert_unchanged(before, mgr)
    assert hook.calls == []


def test_evict_on_a_page_pool_unmaps_a_page_left_empty():
    unmapped = []
    pool = kvnumba.PagePool(4, on_unmap=lambda p, v: unmapped.append(v.tolist()))
    hook = Evictions()
    mgr = kvnumba.BlockManager(4, 1, page_pool=pool, blocks_per_page=2, on_evict=hook)
    (a,) = mgr.admit([5, 6, 7], [3]).ids  # blocks 0, 1, 2 (pages 0 and 1), all full
    mgr.release([a])
    assert lru(mgr) == [2, 1, 0] and pool.num_free == 2
    assert mgr.evict([2]) == 1  # page 1 held nothing else: unmapped
    assert unmapped == [[1]] and pool.num_free == 3
    assert mgr.evict([0]) == 1  # page 0 still holds cached block 1: stays mapped
    assert unmapped == [[1]] and mgr.mapped_pages().size == 1
    assert hook.calls == [([2], [[7]]), ([0], [[5]])]
    mgr.check()


# -------------------------------------------------------------------------- reset_prefix_cache
def test_reset_prefix_cache_forgets_every_prefix():
    hook = Evictions()
    mgr = kvnumba.BlockManager(8, 2, max_seqs=4, on_evict=hook)
    (a,) = mgr.admit([1, 2, 3, 4, 5], [5]).ids  # blocks 0, 1 registered, 2 partial
    (b,) = mgr.admit([7, 8, 9], [3]).ids  # block 3 registered, 4 partial
    mgr.release([b])  # 4 freed, 3 cached
    assert mgr.reset_prefix_cache() == 1
    mgr.check()
    assert hook.calls == [([3], [[7, 8]])]
    assert registered(mgr) == set() and mgr.state.meta[M_REGISTERED] == 0
    assert mgr.stats().cached == 0
    # a keeps its tokens, but its blocks are neither hashed nor reusable ...
    assert kvnumba.Sequence(mgr, int(a)).tokens.tolist() == [1, 2, 3, 4, 5]
    assert not mgr.state.block_flags[[0, 1, 2]].any()
    assert mgr.admit([1, 2, 3, 4, 5], [5]).num_cached_tokens.tolist() == [0]
    # ... and nor is what it fills later (its KV depends on context from before the reset).
    mgr.append([a], [1], [6])
    assert 2 not in registered(mgr)
    mgr.check()


def test_reset_prefix_cache_on_a_page_pool_unmaps_cache_only_pages():
    pool = kvnumba.PagePool(4)
    mgr = kvnumba.BlockManager(4, 1, page_pool=pool, blocks_per_page=2)
    (a,) = mgr.admit([5, 6, 7], [3]).ids
    mgr.release([a])
    assert mgr.reset_prefix_cache() == 3
    mgr.check()
    assert pool.num_free == 4 and mgr.stats().mapped_pages == 0
    assert mgr.reset_prefix_cache() == 0
