"""One test (or a few) per rule of the block manager's semantics, against the real kernels.

Block ids follow the deterministic policies of docs/design.md: a new manager hands out blocks
0, 1, 2, ...; a freed block is pushed on the free stack and handed out next; the LRU list of
cached blocks is reclaimed from its head (least recently released).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import kvnumba
from kvnumba import BlockManager, PoolExhausted, Sequence
from kvnumba._layout import M_LRU_HEAD, NIL
from kvnumba.ids import make_id


# ----------------------------------------------------------------------------------- helpers
def invariants(mgr: BlockManager) -> kvnumba.Stats:
    """check() passes and the block counts add up; returns the stats."""
    mgr.check()
    s = mgr.stats()
    assert s.used + s.cached + s.free == mgr.num_blocks
    return s


def lru_order(mgr: BlockManager) -> list[int]:
    """Cached blocks from the LRU head (reclaimed first) to the tail."""
    st_ = mgr.state
    out = []
    b = int(st_.meta[M_LRU_HEAD])
    while b != NIL:
        out.append(b)
        b = int(st_.lru_next[b])
    return out


def table(mgr: BlockManager, seq_id) -> list[int]:
    return [int(b) for b in mgr.block_tables([seq_id])[0] if b >= 0]


def live_count(mgr: BlockManager) -> int:
    return int(np.count_nonzero(mgr.state.seq_live))


class Recorder:
    """An on_evict callback that records its calls (copies of what it received)."""

    def __init__(self):
        self.calls = []

    def __call__(self, ids, hashes, tokens):
        self.calls.append((ids, hashes, tokens))

    @property
    def ids(self) -> list[list[int]]:
        return [c[0].tolist() for c in self.calls]


# ------------------------------------------------------------------------------------ growth
def test_partial_tail_keeps_filling():
    mgr = BlockManager(8, 4)
    a, b = mgr.new_sequences(2)

    r = mgr.append([a, b], [2, 2])
    assert r.slot_mapping.tolist() == [0, 1, 4, 5]
    assert r.slot_mapping.dtype == np.int64
    assert table(mgr, a) == [0] and table(mgr, b) == [1]
    assert mgr.stats().allocations == 2

    # Each tail takes 2 more tokens in place; the 5th token starts a new block.
    r = mgr.append([a, b], [3, 3])
    assert r.slot_mapping.tolist() == [2, 3, 8, 6, 7, 12]
    assert table(mgr, a) == [0, 2] and table(mgr, b) == [1, 3]
    assert mgr.stats().allocations == 4

    # a's tail (block 2) holds 1 token: 3 more fill it, no new block.
    r = mgr.append([a], [3])
    assert r.slot_mapping.tolist() == [9, 10, 11]
    assert mgr.stats().allocations == 4
    assert table(mgr, a) == [0, 2]

    # The tail is full now: the next token takes a new block (block 4).
    r = mgr.append([a], [1])
    assert r.slot_mapping.tolist() == [16]
    assert table(mgr, a) == [0, 2, 4]
    assert mgr.stats().allocations == 5

    # count 0 takes nothing.
    r = mgr.append([a, b], [0, 0])
    assert r.slot_mapping.tolist() == [] and r.ok.tolist() == [True, True]
    assert mgr.stats().allocations == 5
    assert mgr.seq_lens([a, b]).tolist() == [9, 5]
    assert len(r.cow_src) == len(r.cow_dst) == 0
    invariants(mgr)


# ------------------------------------------------------------------------------ copy-on-write
def test_cow_of_shared_partial_tail():
    mgr = BlockManager(8, 4)
    (p,) = mgr.new_sequences(1)
    mgr.append([p], [6], [10, 11, 12, 13, 14, 15])
    (c,) = mgr.fork([p])[0]
    assert (mgr.ref_count(0), mgr.ref_count(1)) == (2, 2)
    parent_payload = mgr.snapshot().tokens[[0, 1]]

    r = mgr.append([c], [1], [99])
    assert r.cow_src.dtype == np.int32 and r.cow_dst.dtype == np.int32
    assert r.cow_src.tolist() == [1] and r.cow_dst.tolist() == [2]
    assert r.slot_mapping.tolist() == [2 * 4 + 2]
    # Parent untouched: same blocks, same payload; its tail is back to refcount 1.
    assert table(mgr, p) == [0, 1]
    assert table(mgr, c) == [0, 2]
    np.testing.assert_array_equal(mgr.state.tokens[[0, 1]], parent_payload)
    assert mgr.state.tokens[1].tolist() == [14, 15, -1, -1]
    # The copied prefix of the payload is in the new block, followed by the new token.
    assert mgr.state.tokens[2].tolist() == [14, 15, 99, -1]
    assert [mgr.ref_count(b) for b in range(3)] == [2, 1, 1]
    s = invariants(mgr)
    assert (s.cow_copies, s.allocations, s.used) == (1, 3, 3)

    # The parent is now the last holder of block 1: it writes in place.
    r = mgr.append([p], [1], [50])
    assert r.slot_mapping.tolist() == [1 * 4 + 2]
    assert r.cow_src.tolist() == [] and r.cow_dst.tolist() == []
    assert mgr.state.tokens[1].tolist() == [14, 15, 50, -1]
    assert Sequence(mgr, p).tokens.tolist() == [10, 11, 12, 13, 14, 15, 50]
    assert Sequence(mgr, c).tokens.tolist() == [10, 11, 12, 13, 14, 15, 99]
    s = invariants(mgr)
    assert (s.cow_copies, s.allocations) == (1, 3)


def test_full_shared_tail_is_never_copied():
    mgr = BlockManager(8, 4)
    (p,) = mgr.new_sequences(1)
    mgr.append([p], [8], list(range(8)))
    (c,) = mgr.fork([p])[0]
    r = mgr.append([c], [1], [42])
    assert r.cow_src.tolist() == [] and r.cow_dst.tolist() == []
    assert r.slot_mapping.tolist() == [2 * 4]
    assert table(mgr, p) == [0, 1] and table(mgr, c) == [0, 1, 2]
    assert [mgr.ref_count(b) for b in range(3)] == [2, 2, 1]
    assert mgr.state.tokens[1].tolist() == [4, 5, 6, 7]
    s = invariants(mgr)
    assert (s.cow_copies, s.allocations) == (0, 3)


def test_last_holder_writes_in_place_after_sibling_released():
    mgr = BlockManager(8, 4)
    (p,) = mgr.new_sequences(1)
    mgr.append([p], [6], list(range(6)))
    (c,) = mgr.fork([p])[0]
    mgr.release([c])
    assert mgr.ref_count(1) == 1
    r = mgr.append([p], [1], [6])
    assert r.slot_mapping.tolist() == [6]
    assert r.cow_src.tolist() == []
    s = invariants(mgr)
    assert (s.cow_copies, s.allocations) == (0, 2)


def test_three_holders_two_copies_then_in_place():
    mgr = BlockManager(8, 4)
    (p,) = mgr.new_sequences(1)
    mgr.append([p], [6], list(range(6)))
    c1, c2 = mgr.fork([p], 2)[0]
    assert mgr.ref_count(1) == 3
    r = mgr.append([c1], [1], [7])
    assert (r.cow_src.tolist(), r.cow_dst.tolist(), r.slot_mapping.tolist()) == ([1], [2], [10])
    assert mgr.ref_count(1) == 2
    r = mgr.append([c2], [1], [8])
    assert (r.cow_src.tolist(), r.cow_dst.tolist(), r.slot_mapping.tolist()) == ([1], [3], [14])
    assert mgr.ref_count(1) == 1
    r = mgr.append([p], [1], [9])
    assert (r.cow_src.tolist(), r.slot_mapping.tolist()) == ([], [6])
    assert [mgr.state.tokens[b].tolist() for b in (1, 2, 3)] == [
        [4, 5, 9, -1],
        [4, 5, 7, -1],
        [4, 5, 8, -1],
    ]
    assert invariants(mgr).cow_copies == 2


def test_two_holders_in_one_call_with_room():
    """Parent and child append to their shared partial tail in one call: one copy only."""
    mgr = BlockManager(8, 4)
    (p,) = mgr.new_sequences(1)
    mgr.append([p], [6], list(range(6)))
    (c,) = mgr.fork([p])[0]
    r = mgr.append([p, c], [1, 1], [100, 200])
    # p copies (1 -> 2); c is then the last holder of block 1 and writes in place.
    assert (r.cow_src.tolist(), r.cow_dst.tolist()) == ([1], [2])
    assert r.slot_mapping.tolist() == [10, 6]
    assert table(mgr, p) == [0, 2] and table(mgr, c) == [0, 1]
    s = invariants(mgr)
    assert (s.cow_copies, s.allocations, s.free) == (1, 3, 5)


@pytest.mark.parametrize("mode", ["atomic", "non_atomic", "can_append"])
def test_two_holders_in_one_call_need_one_block(mode):
    """Room for exactly the one copy the call takes: the call must succeed.

    Regression: the kernels used to count one copy per holder of the shared tail (needed 2).
    """
    mgr = BlockManager(3, 4)
    (p,) = mgr.new_sequences(1)
    mgr.append([p], [6], list(range(6)))
    (c,) = mgr.fork([p])[0]
    assert mgr.stats().free == 1
    if mode == "can_append":
        assert mgr.can_append([p, c], [1, 1])
        return
    r = mgr.append([p, c], [1, 1], [100, 200], atomic=(mode == "atomic"))
    assert r.ok.tolist() == [True, True]
    assert (r.cow_src.tolist(), r.cow_dst.tolist()) == ([1], [2])
    assert r.slot_mapping.tolist() == [10, 6]
    assert mgr.stats().failed_calls == 0


# ------------------------------------------------------------------------------------ release
def test_release_is_tail_first_lru_evicts_tail_before_prefix():
    rec = Recorder()
    mgr = BlockManager(4, 2, on_evict=rec)
    (s,) = mgr.new_sequences(1)
    mgr.append([s], [6], [1, 2, 3, 4, 5, 6])
    mgr.release([s])
    # Tail first: block 2 was released first, so it is the least recently used.
    assert lru_order(mgr) == [2, 1, 0]
    st_ = invariants(mgr)
    assert (st_.cached, st_.free) == (3, 1)

    (b,) = mgr.new_sequences(1)
    r = mgr.append([b], [2])  # the free block 3 first: nothing evicted
    assert r.slot_mapping.tolist() == [6, 7] and rec.calls == []
    r = mgr.append([b], [2])  # then the LRU head: the old tail block 2
    assert r.slot_mapping.tolist() == [4, 5]
    assert rec.ids == [[2]]
    assert rec.calls[0][2].tolist() == [[5, 6]]
    assert lru_order(mgr) == [1, 0]

    # The prefix (blocks 0, 1) survived and is reused.
    mgr.release([b])
    r = mgr.admit([1, 2, 3, 4, 9], [5])
    assert r.num_cached_tokens.tolist() == [4]
    assert table(mgr, r.ids[0]) == [0, 1, 3]
    assert r.slot_mapping.tolist() == [6]
    assert invariants(mgr).evictions == 1


def test_release_order_of_free_blocks_is_tail_first():
    mgr = BlockManager(4, 2, prefix_caching=False)
    (s,) = mgr.new_sequences(1)
    mgr.append([s], [6], [1, 2, 3, 4, 5, 6])
    mgr.release([s])
    # Blocks 2, 1, 0 pushed in that order: block 0 is on top, then 1, then 2, then 3.
    (t,) = mgr.new_sequences(1)
    r = mgr.append([t], [8])
    assert r.slot_mapping.tolist() == [0, 1, 2, 3, 4, 5, 6, 7]
    assert invariants(mgr).cached == 0


# ----------------------------------------------------------------------------------- on_evict
def test_on_evict_receives_int64_ids_uint64_hashes_and_payload_copies():
    calls = []
    mgr = None

    def on_evict(ids, hashes, tokens):
        # Called after commit: the state is consistent and the counters show the evictions.
        mgr.check()
        s = mgr.stats()
        before = mgr.snapshot()
        calls.append((ids.copy(), hashes.copy(), tokens.copy(), s))
        # The arrays are copies: mutating them changes nothing.
        ids[:] = 0
        hashes[:] = 0
        tokens[:] = 777
        after = mgr.snapshot()
        for name in before._fields:
            assert np.array_equal(getattr(before, name), getattr(after, name)), name

    mgr = BlockManager(4, 2, on_evict=on_evict)
    (s,) = mgr.new_sequences(1)
    mgr.append([s], [6], [1, 2, 3, 4, 5, 6])
    hashes_before = mgr.snapshot().block_hash[[2, 1, 0]]
    assert np.all(hashes_before != 0)
    mgr.release([s])

    (b,) = mgr.new_sequences(1)
    r = mgr.append([b], [8])  # block 3 (free), then evicts 2, 1, 0 in LRU order
    assert r.slot_mapping.tolist() == [6, 7, 4, 5, 2, 3, 0, 1]
    assert len(calls) == 1  # once per call, for all of its evictions
    ids, hashes, tokens, stats = calls[0]
    assert ids.dtype == np.int64 and hashes.dtype == np.uint64 and tokens.dtype == np.int64
    assert ids.tolist() == [2, 1, 0]
    np.testing.assert_array_equal(hashes, hashes_before)
    assert tokens.shape == (3, 2)
    assert tokens.tolist() == [[5, 6], [3, 4], [1, 2]]
    assert (stats.evictions, stats.cached, stats.used, stats.free) == (3, 0, 4, 0)
    # Evicted blocks were scrubbed, the mutation in the callback did not leak in.
    assert mgr.state.tokens.tolist() == [[-1, -1]] * 4
    assert table(mgr, b) == [3, 2, 1, 0]
    invariants(mgr)

    # A call that evicts nothing does not call the hook.
    mgr.release([b])
    mgr.append(mgr.new_sequences(1), [2])
    assert len(calls) == 1


# -------------------------------------------------------------------------- reclaim ordering
def test_free_blocks_are_used_before_cached_ones():
    rec = Recorder()
    mgr = BlockManager(6, 4, on_evict=rec)
    mgr.release(mgr.admit(list(range(1, 10)), [9]).ids)  # blocks 0, 1 cached; 2 freed
    s = invariants(mgr)
    assert (s.cached, s.free) == (2, 4)
    assert lru_order(mgr) == [1, 0]

    (b,) = mgr.new_sequences(1)
    r = mgr.append([b], [16])  # four free blocks: the cache survives
    assert table(mgr, b) == [2, 3, 4, 5]
    assert r.slot_mapping[::4].tolist() == [8, 12, 16, 20]
    s = invariants(mgr)
    assert (s.cached, s.free, s.evictions) == (2, 0, 0)
    assert rec.calls == []

    r = mgr.append([b], [1])  # no free block left: the LRU head goes
    assert r.slot_mapping.tolist() == [4]
    assert rec.ids == [[1]]
    s = invariants(mgr)
    assert (s.cached, s.free, s.evictions) == (1, 0, 1)


# ------------------------------------------------------------------------------- fail closed
def test_atomic_append_fails_closed(same_state):
    mgr = BlockManager(6, 4)
    (x,) = mgr.new_sequences(1)
    mgr.append([x], [8], list(range(8)))
    mgr.release([x])  # blocks 0, 1 cached
    a, b = mgr.new_sequences(2)
    mgr.append([a], [10])  # blocks 2, 3, 4; free: block 5
    s = invariants(mgr)
    assert (s.free, s.cached) == (1, 2)

    before = mgr.snapshot()
    with pytest.raises(PoolExhausted) as info:
        mgr.append([a, b], [3, 12], list(range(15)))
    assert (info.value.needed, info.value.available) == (4, 3)
    same_state(before, mgr.snapshot())
    s = invariants(mgr)
    assert (s.failed_calls, s.allocations, s.evictions) == (1, 5, 0)
    assert not mgr.can_append([a, b], [3, 12])

    # Exactly the available blocks: succeeds, evicting both cached blocks.
    assert mgr.can_append([a, b], [3, 8])
    r = mgr.append([a, b], [3, 8])
    assert r.ok.tolist() == [True, True]
    s = invariants(mgr)
    assert (s.free, s.cached, s.evictions, s.failed_calls) == (0, 0, 2, 1)


def test_atomic_admit_rolls_back_after_earlier_prompts_allocated_and_evicted(same_state):
    rec = Recorder()
    mgr = BlockManager(8, 2, on_evict=rec)
    (x,) = mgr.new_sequences(1)
    mgr.append([x], [8], list(range(100, 108)))
    mgr.release([x])  # blocks 0..3 cached (LRU 3, 2, 1, 0), blocks 4..7 free
    assert lru_order(mgr) == [3, 2, 1, 0]
    p1, p2, p3 = list(range(1, 7)), list(range(11, 15)), list(range(21, 29))
    tokens, lengths = p1 + p2 + p3, [6, 4, 8]

    before = mgr.snapshot()
    stats_before = mgr.stats()
    # p1 takes 4, 5, 6; p2 takes 7 and evicts 3; p3 needs 4 blocks, 3 are left.
    with pytest.raises(PoolExhausted) as info:
        mgr.admit(tokens, lengths)
    assert (info.value.needed, info.value.available) == (3 + 2 + 4, 8)
    same_state(before, mgr.snapshot())
    assert rec.calls == []  # no hook for rolled-back work
    s = invariants(mgr)
    assert s.failed_calls == stats_before.failed_calls + 1
    assert (s.allocations, s.evictions, s.prefix_queries) == (
        stats_before.allocations,
        stats_before.evictions,
        stats_before.prefix_queries,
    )
    assert live_count(mgr) == 0
    assert lru_order(mgr) == [3, 2, 1, 0]

    # The same call in non-atomic mode: the first two prompts get in, the third does not.
    r = mgr.admit(tokens, lengths, atomic=False)
    assert r.ok.tolist() == [True, True, False]
    assert r.ids[2] == -1 and np.all(r.ids[:2] >= 0)
    assert r.num_cached_tokens.tolist() == [0, 0, 0]
    assert r.slot_mapping.tolist() == [8, 9, 10, 11, 12, 13, 14, 15, 6, 7] + [-1] * 8
    assert table(mgr, r.ids[0]) == [4, 5, 6] and table(mgr, r.ids[1]) == [7, 3]
    assert rec.ids == [[3]]
    assert live_count(mgr) == 2
    s = invariants(mgr)
    assert (s.evictions, s.failed_calls) == (1, stats_before.failed_calls + 2)


def test_partial_reservation_cow_plus_new_block_rolled_back(same_state):
    mgr = BlockManager(3, 4)
    (p,) = mgr.new_sequences(1)
    mgr.append([p], [6], list(range(6)))
    (c,) = mgr.fork([p])[0]
    assert mgr.stats().free == 1
    # c: copy of the shared partial tail + one new block; room for one.
    assert not mgr.can_append([c], [3])
    before = mgr.snapshot()
    with pytest.raises(PoolExhausted) as info:
        mgr.append([c], [3], [7, 8, 9])
    assert (info.value.needed, info.value.available) == (2, 1)
    same_state(before, mgr.snapshot())
    r = mgr.append([c], [3], [7, 8, 9], atomic=False)
    assert r.ok.tolist() == [False] and r.slot_mapping.tolist() == [-1, -1, -1]
    same_state(before, mgr.snapshot())
    assert mgr.stats().failed_calls == 2
    # The copy alone fits.
    assert mgr.can_append([c], [2])
    r = mgr.append([c], [2], [7, 8])
    assert (r.cow_src.tolist(), r.cow_dst.tolist(), r.slot_mapping.tolist()) == ([1], [2], [10, 11])
    invariants(mgr)


# ---------------------------------------------------------------------------- non-atomic mode
def test_non_atomic_append_is_per_sequence_in_input_order():
    mgr = BlockManager(4, 4)
    a, b, c = mgr.new_sequences(3)
    r = mgr.append([a, b, c], [12, 8, 4], list(range(24)), atomic=False)
    assert r.ok.tolist() == [True, False, True]
    assert r.slot_mapping.tolist() == list(range(12)) + [-1] * 8 + [12, 13, 14, 15]
    assert mgr.seq_lens([a, b, c]).tolist() == [12, 0, 4]
    assert mgr.block_tables([a, b, c]).tolist() == [[0, 1, 2], [-1, -1, -1], [3, -1, -1]]
    # c got its own tokens (20..23), not b's.
    assert mgr.state.tokens[3].tolist() == [20, 21, 22, 23]
    s = invariants(mgr)
    assert (s.used, s.free, s.failed_calls) == (4, 0, 1)
    # A fully successful non-atomic call is not a failure.
    mgr.append([b], [0], atomic=False)
    assert mgr.stats().failed_calls == 1


def test_non_atomic_admit_gives_minus_one_and_creates_nothing():
    mgr = BlockManager(4, 4)
    tokens = list(range(9)) + list(range(100, 109)) + list(range(200, 204))
    r = mgr.admit(tokens, [9, 9, 4], atomic=False)
    assert r.ok.tolist() == [True, False, True]
    assert r.ids[1] == -1
    assert r.num_cached_tokens.tolist() == [0, 0, 0]
    assert r.slot_mapping.tolist() == list(range(9)) + [-1] * 9 + [12, 13, 14, 15]
    assert live_count(mgr) == 2
    assert table(mgr, r.ids[0]) == [0, 1, 2] and table(mgr, r.ids[2]) == [3]
    s = invariants(mgr)
    assert (s.used, s.failed_calls) == (4, 1)


# ----------------------------------------------------------------------------- prefix by fork
def test_fork_shares_prefix_with_strictly_fewer_allocations():
    forked = BlockManager(64, 4)
    (p,) = forked.new_sequences(1)
    forked.append([p], [10], list(range(10)))
    children = forked.fork([p], 4)[0]
    assert forked.seq_lens(children).tolist() == [10] * 4
    assert all(table(forked, c) == [0, 1, 2] for c in children)
    assert [forked.ref_count(b) for b in range(3)] == [5, 5, 5]
    s = invariants(forked)
    assert (s.allocations, s.used) == (3, 3)

    plain = BlockManager(64, 4)
    ids = plain.new_sequences(5)
    plain.append(ids, [10] * 5, list(range(10)) * 5)
    s_plain = invariants(plain)
    assert (s_plain.allocations, s_plain.used) == (15, 15)
    assert s.allocations < s_plain.allocations


# ------------------------------------------------------------------------ token -> block map
def assert_every_position_mapped(mgr: BlockManager, ids) -> None:
    for seq_id in ids:
        seq = Sequence(mgr, seq_id)
        n = len(seq)
        blocks = [seq.block_for(pos) for pos in range(n)]
        assert all(0 <= b < mgr.num_blocks for b in blocks)
        assert all(mgr.ref_count(b) >= 1 for b in blocks)
        assert blocks == [b for b in table(mgr, seq_id) for _ in range(mgr.block_size)][:n]


def test_every_token_index_maps_to_a_live_block_after_mixed_workload():
    mgr = BlockManager(16, 3, max_seqs=16)
    a, b = mgr.new_sequences(2)
    mgr.append([a, b], [7, 2], list(range(9)))
    (c,) = mgr.fork([a])[0]
    mgr.append([c, b], [4, 5], atomic=False)
    r = mgr.admit(list(range(7)) + [50, 51, 52, 53], [7, 4])
    d, e = r.ids
    mgr.release([b])
    f1, f2 = mgr.fork([d], 2)[0]
    mgr.append([f1, a, e], [1, 2, 3], [9, 9, 9, 9, 9, 9])
    live = [a, c, d, e, f1, f2]
    assert_every_position_mapped(mgr, live)
    # Refcounts equal the number of table entries that name each block.
    counts = np.zeros(mgr.num_blocks, dtype=np.int64)
    for seq_id in live:
        for blk in table(mgr, seq_id):
            counts[blk] += 1
    np.testing.assert_array_equal(counts, mgr.state.ref)
    invariants(mgr)


_ops = st.lists(
    st.tuples(
        st.sampled_from(["new", "append", "append_none", "fork", "release", "admit"]),
        st.integers(0, 15),
        st.integers(0, 7),
    ),
    max_size=25,
)


@given(_ops)
def test_every_token_index_maps_to_a_live_block_random(ops):
    mgr = BlockManager(10, 3, max_seqs=8, max_seq_len=30)
    live: list[int] = []
    for op, pick, k in ops:
        target = live[pick % len(live)] if live else None
        try:
            if op == "new":
                live += mgr.new_sequences(1).tolist()
            elif op == "admit":
                r = mgr.admit([pick % 3] * (k + 1), [k + 1], atomic=False)
                live += [int(i) for i in r.ids if i >= 0]
            elif target is None:
                continue
            elif op == "append":
                mgr.append([target], [k], [pick % 3] * k, atomic=False)
            elif op == "append_none":
                mgr.append([target], [k], atomic=False)
            elif op == "fork":
                live += mgr.fork([target], 1 + k % 2)[0].tolist()
            else:
                mgr.release([target])
                live.remove(target)
        except (kvnumba.TooManySequences, kvnumba.SequenceTooLong):
            pass
        invariants(mgr)
        assert_every_position_mapped(mgr, live)


# ---------------------------------------------------------------------------- ids never reused
def test_released_ids_are_rejected_and_never_reissued(assert_unchanged):
    mgr = BlockManager(8, 2, max_seqs=2)
    seen: list[int] = []
    for i in range(60):
        if i % 3 == 0:
            ids = mgr.new_sequences(2)
            mgr.append(ids, [1, 2])
        elif i % 3 == 1:
            seq = mgr.sequence()
            seq.append([i])
            ids = np.array([seq.id, seq.fork().id], dtype=np.int64)
        else:
            ids = mgr.admit([i, i, i], [3]).ids
        seen += ids.tolist()
        mgr.release(ids[::-1])
    assert len(seen) == len(set(seen))
    assert all(i > 0 for i in seen)
    invariants(mgr)
    for old in (seen[0], seen[17], seen[-1]):
        for call in (
            lambda o=old: mgr.append([o], [1]),
            lambda o=old: mgr.release([o]),
            lambda o=old: mgr.fork([o]),
            lambda o=old: mgr.block_tables([o]),
            lambda o=old: mgr.seq_lens([o]),
            lambda o=old: mgr.can_append([o], [1]),
        ):
            err = assert_unchanged(mgr, call, kvnumba.SequenceReleased)
            assert err.seq_id == old
    assert Sequence(mgr, seen[0]).released


@pytest.mark.parametrize(
    "bad",
    # (generation, slot) pairs are ids with the manager's own tag (slot 1 is never handed out).
    [-1, 0, 7, 12345, (1, 1), (99, 0), (2, 0), -(1 << 40), np.iinfo(np.int64).max],
)
def test_never_issued_ids_are_invalid_not_released(bad, assert_unchanged):
    mgr = BlockManager(8, 2, max_seqs=2)
    if isinstance(bad, tuple):
        bad = make_id(mgr.id_tag, *bad, mgr.max_seqs)
    (a,) = mgr.new_sequences(1)
    mgr.append([a], [3])
    for call in (
        lambda: mgr.append([bad], [1]),
        lambda: mgr.append([a, bad], [1, 1]),
        lambda: mgr.release([bad]),
        lambda: mgr.release([a, bad]),
        lambda: mgr.fork([bad]),
        lambda: mgr.block_tables([bad]),
        lambda: mgr.seq_lens([bad]),
        lambda: mgr.can_append([bad], [1]),
    ):
        err = assert_unchanged(mgr, call, kvnumba.InvalidSequence)
        assert not isinstance(err, kvnumba.SequenceReleased)
    assert mgr.seq_lens([a]).tolist() == [3]


# ------------------------------------------------------------------------------- prefix reuse
P = list(range(100, 114))  # 14 tokens: 3 full blocks of 4 + 2


def test_admit_reuses_longest_cached_prefix():
    mgr = BlockManager(16, 4)
    r1 = mgr.admit(P, [14])
    assert r1.num_cached_tokens.tolist() == [0]
    assert r1.slot_mapping.tolist() == list(range(14))
    assert table(mgr, r1.ids[0]) == [0, 1, 2, 3]
    s = mgr.stats()
    assert (s.prefix_queries, s.prefix_hits, s.allocations) == (3, 0, 4)
    mgr.release(r1.ids)
    s = invariants(mgr)
    assert (s.cached, s.free) == (3, 13)

    # Same prompt: all 3 full blocks come from the cache (refcount 0, on the LRU list).
    r2 = mgr.admit(P, [14])
    assert r2.num_cached_tokens.dtype == np.int64
    assert r2.num_cached_tokens.tolist() == [12]
    assert table(mgr, r2.ids[0]) == [0, 1, 2, 3]
    assert r2.slot_mapping.tolist() == [12, 13]
    s = invariants(mgr)
    assert (s.prefix_queries, s.prefix_hits, s.allocations, s.cached) == (6, 3, 5, 0)

    # 12 tokens: capped at (12 - 1) // 4 * 4 = 8, reusing blocks referenced by r2.
    r3 = mgr.admit(P[:12], [12])
    assert r3.num_cached_tokens.tolist() == [8]
    assert table(mgr, r3.ids[0]) == [0, 1, 4]
    assert r3.slot_mapping.tolist() == [16, 17, 18, 19]
    assert [mgr.ref_count(b) for b in (0, 1, 2)] == [2, 2, 1]

    # A prompt diverging in its third block reuses the two leading blocks only.
    q = P[:8] + [1, 2, 3, 4, 5]
    r4 = mgr.admit(q, [13])
    assert r4.num_cached_tokens.tolist() == [8]
    assert table(mgr, r4.ids[0]) == [0, 1, 5, 6]
    # Diverging in the first block: nothing reused, even though later blocks are equal.
    q = [0] + P[1:]
    r5 = mgr.admit(q, [14])
    assert r5.num_cached_tokens.tolist() == [0]
    assert not set(table(mgr, r5.ids[0])) & {0, 1, 2}
    # A prompt of one block or less has nothing to reuse.
    r6 = mgr.admit(P[:4], [4])
    assert r6.num_cached_tokens.tolist() == [0]
    s = invariants(mgr)
    assert (s.prefix_queries, s.prefix_hits) == (6 + 2 + 3 + 3 + 0, 3 + 2 + 2 + 0)


@pytest.mark.parametrize(
    ("length", "cached"), [(1, 0), (4, 0), (5, 4), (8, 4), (9, 8), (12, 8), (13, 12), (14, 12)]
)
def test_num_cached_tokens_leaves_one_token(length, cached):
    mgr = BlockManager(16, 4)
    mgr.release(mgr.admit(P[:13], [13]).ids)  # 3 full blocks cached
    r = mgr.admit(P[:length], [length])
    assert r.num_cached_tokens.tolist() == [cached]
    assert cached == min((length - 1) // 4, 3) * 4
    assert len(r.slot_mapping) == length - cached
    assert table(mgr, r.ids[0])[: cached // 4] == [0, 1, 2][: cached // 4]


def test_admit_never_shares_across_salts():
    mgr = BlockManager(16, 4)
    r0 = mgr.admit(P, [14])  # salt 0: blocks 0..3
    r1 = mgr.admit(P, [14], salts=[1])
    assert r1.num_cached_tokens.tolist() == [0]
    assert table(mgr, r1.ids[0]) == [4, 5, 6, 7]
    mgr.release(np.concatenate([r0.ids, r1.ids]))
    s = invariants(mgr)
    assert s.cached == 6

    r = mgr.admit(P + P + P, [14, 14, 14], salts=[1, 0, 2])
    assert r.num_cached_tokens.tolist() == [12, 12, 0]
    assert table(mgr, r.ids[0])[:3] == [4, 5, 6]
    assert table(mgr, r.ids[1])[:3] == [0, 1, 2]
    assert not set(table(mgr, r.ids[2])) & {0, 1, 2, 4, 5, 6}
    assert mgr.stats().prefix_hits == 6
    invariants(mgr)


def test_fork_inherits_salt_for_registration():
    mgr = BlockManager(16, 4)
    (p,) = mgr.admit(P[:5], [5], salts=[7]).ids  # block 0 full (salt 7), block 1 partial
    (c,) = mgr.fork([p])[0]
    r = mgr.append([c], [3], P[5:8])  # COW block 1 -> 2, filled: registered under salt 7
    assert (r.cow_src.tolist(), r.cow_dst.tolist()) == ([1], [2])
    assert mgr.state.block_salt[2] == 7
    assert mgr.admit(P[:9], [9]).num_cached_tokens.tolist() == [0]
    r = mgr.admit(P[:9], [9], salts=[7])
    assert r.num_cached_tokens.tolist() == [8]
    assert table(mgr, r.ids[0])[:2] == [0, 2]
    invariants(mgr)


def test_new_sequences_have_salt_zero():
    mgr = BlockManager(16, 4)
    (a,) = mgr.new_sequences(1)
    mgr.append([a], [8], P[:8])
    assert mgr.admit(P[:9], [9], salts=[3]).num_cached_tokens.tolist() == [0]
    r = mgr.admit(P[:9], [9])
    assert r.num_cached_tokens.tolist() == [8]
    assert table(mgr, r.ids[0])[:2] == [0, 1]


def test_hash_collision_never_reuses_different_tokens():
    mgr = BlockManager(8, 4, _hash_bits=0)  # every block hashes to 0
    (a,) = mgr.admit([1, 2, 3, 4, 5], [5]).ids
    assert int(mgr.state.block_hash[0]) == 0
    mgr.release([a])
    assert mgr.stats().cached == 1

    r = mgr.admit([1, 2, 3, 9, 5], [5])  # same hash, different tokens
    assert r.num_cached_tokens.tolist() == [0]
    assert 0 not in table(mgr, r.ids[0])
    assert mgr.ref_count(0) == 0
    assert mgr.state.tokens[0].tolist() == [1, 2, 3, 4]

    r = mgr.admit([1, 2, 3, 4, 7], [5])  # same hash, same tokens
    assert r.num_cached_tokens.tolist() == [4]
    assert table(mgr, r.ids[0])[0] == 0
    s = invariants(mgr)
    assert (s.prefix_queries, s.prefix_hits) == (3, 1)


def test_hash_collision_with_different_salt_is_no_hit():
    mgr = BlockManager(8, 4, _hash_bits=0)
    mgr.release(mgr.admit([1, 2, 3, 4, 5], [5]).ids)
    r = mgr.admit([1, 2, 3, 4, 5], [5], salts=[1])
    assert r.num_cached_tokens.tolist() == [0]
    assert mgr.ref_count(0) == 0
    invariants(mgr)


def test_first_equal_block_stays_registered():
    mgr = BlockManager(8, 4)
    a, b = mgr.new_sequences(2)
    mgr.append([a, b], [4, 4], [1, 2, 3, 4] * 2)  # blocks 0 and 1, equal content
    mgr.release([b, a])
    s = invariants(mgr)
    assert (s.cached, s.free) == (1, 7)  # the duplicate (block 1) was not registered
    r = mgr.admit([1, 2, 3, 4, 5], [5])
    assert table(mgr, r.ids[0])[0] == 0


def test_content_less_blocks_are_never_cached():
    mgr = BlockManager(8, 4)
    a, b, c = mgr.new_sequences(3)
    mgr.append([a], [8])  # no token ids at all
    mgr.append([b], [4])
    mgr.append([b], [4], [1, 2, 3, 4])  # known block after a content-less parent
    mgr.append([c], [2], [1, 2])
    mgr.append([c], [2])  # full block, half of it content-less
    assert mgr.state.tokens[4].tolist() == [1, 2, -1, -1]
    mgr.release([a, b, c])
    s = invariants(mgr)
    assert (s.cached, s.free, s.used) == (0, 8, 0)
    assert mgr.state.tokens.min() == -1 and mgr.state.tokens.max() == -1
    r = mgr.admit([1, 2, 3, 4, 5], [5])
    assert r.num_cached_tokens.tolist() == [0]


def test_payload_reads_minus_one_and_is_scrubbed_before_reuse():
    mgr = BlockManager(2, 4)
    seq = mgr.sequence()
    seq.append([7, 7, 7])
    seq.release()  # partial: straight back to the free list
    seq = mgr.sequence()
    r = seq.append(count=1)
    assert r.slot_mapping.tolist() == [0]
    assert mgr.state.tokens[0].tolist() == [-1, -1, -1, -1]
    assert seq.tokens.tolist() == [-1]
    seq.release()
    # Evicted cached block: scrubbed too.
    mgr.release(mgr.admit([1, 2, 3, 4, 5, 6, 7, 8], [8]).ids)
    assert mgr.stats().cached == 2
    seq = mgr.sequence()
    seq.append(count=5)
    assert mgr.state.tokens.tolist() == [[-1] * 4] * 2


def test_prefix_caching_off_caches_nothing():
    mgr = BlockManager(8, 4, prefix_caching=False)
    mgr.release(mgr.admit(P, [14]).ids)
    s = invariants(mgr)
    assert (s.cached, s.free) == (0, 8)
    r = mgr.admit(P, [14])
    assert r.num_cached_tokens.tolist() == [0]
    s = mgr.stats()
    assert (s.prefix_queries, s.prefix_hits) == (0, 0)


def test_later_prompt_reuses_blocks_of_earlier_prompt_in_same_call():
    mgr = BlockManager(16, 4)
    r = mgr.admit(P + P, [14, 14])
    assert r.num_cached_tokens.tolist() == [0, 12]
    assert table(mgr, r.ids[0]) == [0, 1, 2, 3]
    assert table(mgr, r.ids[1]) == [0, 1, 2, 4]
    assert r.slot_mapping.tolist() == list(range(14)) + [16, 17]
    s = invariants(mgr)
    assert (s.allocations, s.prefix_queries, s.prefix_hits) == (5, 6, 3)
    assert [mgr.ref_count(b) for b in range(5)] == [2, 2, 2, 1, 1]


def test_admit_never_evicts_its_own_hits():
    rec = Recorder()
    mgr = BlockManager(3, 4, on_evict=rec)
    x, y = mgr.new_sequences(2)
    mgr.append([x, y], [8, 4], list(range(1, 9)) + [50, 51, 52, 53])
    mgr.release([x, y])
    assert lru_order(mgr) == [1, 0, 2]  # the prompt's own block 1 is the LRU head
    r = mgr.admit(list(range(1, 10)), [9])
    assert r.num_cached_tokens.tolist() == [8]
    assert table(mgr, r.ids[0]) == [0, 1, 2]  # block 2 evicted, not the hit block 1
    assert rec.ids == [[2]]
    assert r.slot_mapping.tolist() == [8]
    invariants(mgr)


def test_admit_fails_rather_than_evict_its_own_hits(same_state):
    mgr = BlockManager(3, 4)
    prompt = list(range(1, 10))
    mgr.release(mgr.admit(prompt, [9]).ids)  # blocks 0, 1 cached, 2 free
    (x,) = mgr.new_sequences(1)
    mgr.append([x], [1])  # takes block 2: the only reclaimable blocks are the hits
    s = invariants(mgr)
    assert (s.free, s.cached) == (0, 2)
    before = mgr.snapshot()
    with pytest.raises(PoolExhausted) as info:
        mgr.admit(prompt, [9])
    assert (info.value.needed, info.value.available) == (1, 2)
    same_state(before, mgr.snapshot())
    r = mgr.admit(prompt, [9], atomic=False)
    assert (r.ok.tolist(), r.ids.tolist(), r.num_cached_tokens.tolist()) == ([False], [-1], [0])
    assert r.slot_mapping.tolist() == [-1] * 9
    same_state(before, mgr.snapshot())
    assert mgr.stats().failed_calls == 2
    mgr.release([x])
    r = mgr.admit(prompt, [9])
    assert r.num_cached_tokens.tolist() == [8]
    assert table(mgr, r.ids[0]) == [0, 1, 2]
    assert invariants(mgr).evictions == 0


# ------------------------------------------------------------------------------------- stats
def test_stats_through_a_scenario():
    mgr = BlockManager(6, 4, max_seq_len=100)
    history = []

    def step(fn):
        try:
            fn()
        except PoolExhausted:
            pass
        history.append(invariants(mgr))

    (p,) = mgr.admit(P[:6], [6]).ids  # 2 allocations
    history.append(invariants(mgr))
    (c,) = mgr.fork([p])[0]
    step(lambda: mgr.append([c], [1], [7]))  # COW: 1 allocation
    s = history[-1]
    assert (s.allocations, s.cow_copies, s.used, s.free) == (3, 1, 3, 3)
    step(lambda: mgr.release([p, c]))  # block 0 cached, 1 and 2 freed
    s = history[-1]
    assert (s.used, s.cached, s.free) == (0, 1, 5)
    step(lambda: mgr.admit(P[:6], [6]))  # 1 prefix hit (not an allocation) + 1 block
    s = history[-1]
    assert (s.allocations, s.prefix_queries, s.prefix_hits) == (4, 2, 1)
    (q,) = mgr.new_sequences(1)
    step(lambda: mgr.append([q], [40]))  # PoolExhausted
    s = history[-1]
    assert (s.failed_calls, s.allocations) == (1, 4)
    step(lambda: mgr.append([q], [20], atomic=False))  # needs 5 blocks, 4 free: ok False
    s = history[-1]
    assert s.failed_calls == 2
    step(lambda: mgr.append([q], [16], atomic=False))  # 4 free blocks exactly
    s = history[-1]
    assert (s.failed_calls, s.allocations, s.used, s.free, s.evictions) == (2, 8, 6, 0, 0)
    assert s.mapped_pages == 0
    for s in history:
        assert s.used + s.cached + s.free == 6


def test_validation_errors_are_not_failed_calls():
    mgr = BlockManager(4, 4)
    (a,) = mgr.new_sequences(1)
    with pytest.raises(ValueError):
        mgr.append([a], [-1])
    with pytest.raises(kvnumba.InvalidSequence):
        mgr.release([a + 1])
    assert mgr.stats().failed_calls == 0


def test_atomic_admit_of_several_prompts_reports_its_evictions_after_commit():
    rec = Recorder()
    mgr = BlockManager(8, 2, on_evict=rec)
    (x,) = mgr.new_sequences(1)
    mgr.append([x], [8], list(range(100, 108)))
    mgr.release([x])  # LRU 3, 2, 1, 0; blocks 4..7 free
    hashes = mgr.snapshot().block_hash[[3, 2]]
    r = mgr.admit(list(range(1, 7)) + list(range(11, 17)), [6, 6])
    assert r.ok.tolist() == [True, True]
    assert table(mgr, r.ids[0]) == [4, 5, 6] and table(mgr, r.ids[1]) == [7, 3, 2]
    assert rec.ids == [[3, 2]]
    np.testing.assert_array_equal(rec.calls[0][1], hashes)
    assert rec.calls[0][2].tolist() == [[106, 107], [104, 105]]
    s = invariants(mgr)
    assert (s.evictions, s.cached, s.allocations) == (2, 2, 10)
    # The surviving prefix is still served.
    mgr.release(r.ids)
    r = mgr.admit(list(range(100, 105)), [5])
    assert r.num_cached_tokens.tolist() == [4]
    assert table(mgr, r.ids[0])[:2] == [0, 1]
