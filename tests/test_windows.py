"""Windowed attention in the kernels: blocks leave a sliding window or a finished chunk while a
sequence grows, a windowed prompt reuses the longest prefix whose last window is cached, and
``check()`` catches a block released too early or a released block left in a table.

The rules are those of ``docs/windows.md``; the randomized comparison with the reference model
lives in ``test_differential.py`` and the stateful machines. Here every expectation is derived
by hand on tiny managers (block size 4).
"""

from __future__ import annotations

import numpy as np
import pytest

import kvnumba
from kvnumba import NULL_BLOCK, BlockManager, InvalidGeometry, InvariantViolation, PoolExhausted
from kvnumba.ids import split_id
from kvnumba.reference import ReferenceBlockManager
from kvnumba.state import BlockFlag

N = NULL_BLOCK


def table(mgr, seq_id):
    return mgr.block_tables([seq_id])[0].tolist()


def test_sliding_window_releases_blocks_no_later_token_reaches():
    mgr = BlockManager(32, 4, sliding_window=6)
    (s,) = mgr.admit(np.arange(10), [10]).ids
    assert table(mgr, s) == [0, 1, 2]
    # Length 10: the next token (position 10) reaches back to position 5, block 1.
    mgr.append([s], [1], [50])
    assert table(mgr, s) == [N, 1, 2]
    assert mgr.stats().cached == 1  # block 0 was full with known content: cached, evictable
    mgr.append([s], [1], [51])  # length 11 reaches position 6: still block 1
    assert table(mgr, s) == [N, 1, 2]
    mgr.append([s], [2], [52, 53])  # length 12: position 7, block 1 is still reached
    mgr.append([s], [1], [54])  # length 14: position 9, block 2; block 1 goes
    assert table(mgr, s) == [N, N, 2, 3]
    assert mgr.stats().used == 2 and mgr.stats().cached == 2
    mgr.check()
    seq = kvnumba.Sequence(mgr, int(s))
    assert seq.block_for(0) == N and seq.token_at(0) == -1
    assert seq.tokens.tolist() == [-1] * 8 + [8, 9, 50, 51, 52, 53, 54]


def test_chunked_local_releases_the_finished_chunks():
    mgr = BlockManager(32, 4, attention_chunk_size=8)
    (s,) = mgr.admit(np.arange(7), [7]).ids
    mgr.append([s], [2], [7, 8])  # length 7 -> 9: still the first chunk when it starts
    assert table(mgr, s) == [0, 1, 2]
    mgr.append([s], [1], [9])  # length 9: chunk [8, 16) needs block 2 on
    assert table(mgr, s) == [N, N, 2]
    mgr.check()


def test_full_attention_keeps_every_block():
    mgr = BlockManager(32, 4)
    (s,) = mgr.admit(np.arange(10), [10]).ids
    mgr.append([s], [7], np.arange(7))
    assert N not in table(mgr, s)
    assert mgr.sliding_window is None and mgr.attention_chunk_size is None


def test_a_windowed_prompt_hits_its_last_window_though_earlier_blocks_were_evicted():
    mgr = BlockManager(32, 4, sliding_window=5)  # w = ceil(4 / 4) = 1 block
    prompt = np.arange(20)
    (s,) = mgr.admit(prompt, [20]).ids
    mgr.release([s])  # five full blocks cached: 4, 3, 2, 1, 0 released tail first
    mgr.evict([0, 1])  # the front of the prompt is gone
    result = mgr.admit(prompt, [20])
    # At most (20 - 1) // 4 = 4 blocks; the last window before position 16 is block 3.
    assert result.num_cached_tokens.tolist() == [16]
    assert table(mgr, result.ids[0]) == [N, N, N, 3, 1]  # evicted 0, then 1: 1 on top
    assert mgr.stats().prefix_hits == 1
    # A full-attention manager stops at the first miss.
    full = BlockManager(32, 4)
    (s,) = full.admit(prompt, [20]).ids
    full.release([s])
    full.evict([0])
    assert full.admit(prompt, [20]).num_cached_tokens.tolist() == [0]


def test_a_window_hit_needs_the_whole_window_contiguous():
    mgr = BlockManager(32, 4, sliding_window=9)  # w = ceil(8 / 4) = 2 blocks
    prompt = np.arange(20)
    (s,) = mgr.admit(prompt, [20]).ids
    mgr.release([s])
    mgr.evict([2])  # blocks 0, 1, 3 cached: no two in a row end at 4 or 3; 0, 1 end at 2
    result = mgr.admit(prompt, [20])
    assert result.num_cached_tokens.tolist() == [8]
    assert table(mgr, result.ids[0])[:2] == [0, 1]


def test_chunked_local_prompt_skips_to_its_last_chunk():
    mgr = BlockManager(32, 4, attention_chunk_size=8)
    prompt = np.arange(21)  # last token 20: chunk [16, 24), block 4 on
    result = mgr.admit(prompt, [21])
    # Nothing is cached, yet the blocks before the chunk need not be computed.
    assert result.num_cached_tokens.tolist() == [16]
    assert table(mgr, result.ids[0]) == [N, N, N, N, 0, 1]
    assert mgr.stats().prefix_hits == 0
    mgr.check()


def test_registration_across_the_gap_matches_full_attention():
    """A block that fills after its parent left the window is registered under the same
    chained hash as the same tokens in a full-attention sequence: a full-attention lookup of
    the same manager's content finds it."""
    mgr = BlockManager(32, 4, sliding_window=3)  # w = 1 block: block p-1 leaves early
    (s,) = mgr.new_sequences(1)
    for t in range(16):
        mgr.append([s], [1], [t])
    hashes = mgr.state.block_hash[[b for b in table(mgr, s) if b >= 0]]
    full = BlockManager(32, 4)
    (f,) = full.new_sequences(1)
    full.append([f], [16], np.arange(16))
    assert hashes.tolist() == full.state.block_hash[table(full, f)][-len(hashes) :].tolist()
    mgr.check()


def test_an_append_that_fits_only_thanks_to_its_own_window_succeeds():
    # A windowed sequence may outgrow the pool: only its window needs blocks.
    mgr = BlockManager(3, 4, sliding_window=4, prefix_caching=False, max_seq_len=64)
    (s,) = mgr.admit(np.arange(12), [12]).ids  # all three blocks
    assert mgr.can_append([s], [1])  # the window releases blocks 0 and 1 first
    mgr.append([s], [1])
    assert table(mgr, s) == [N, N, 2, 0]  # released 1 then 0: block 0 is taken again
    mgr.check()


def test_a_failed_windowed_append_changes_nothing():
    mgr = BlockManager(4, 4, sliding_window=5, prefix_caching=False)
    a, b = mgr.admit(np.arange(16), [12, 4]).ids
    before = mgr.snapshot()
    with pytest.raises(PoolExhausted) as err:
        # a needs a block and its window frees blocks 0 and 1; b needs 3 blocks.
        mgr.append([a, b], [1, 9])
    assert (err.value.needed, err.value.available) == (4, 2)
    for field, old in zip(before._fields, before, strict=True):
        assert np.array_equal(getattr(mgr.state, field), old), field
    # Non-atomic: b does not fit and is untouched; a is served, its window applied.
    result = mgr.append([a, b], [1, 9], atomic=False)
    assert result.ok.tolist() == [True, False]
    assert table(mgr, a)[0] == N and N not in table(mgr, b)


def test_fork_shares_the_window_and_frees_a_block_with_its_last_holder():
    mgr = BlockManager(32, 4, sliding_window=4, prefix_caching=False)
    (a,) = mgr.admit(np.arange(9), [9]).ids
    (b,) = mgr.fork([a])[0]
    mgr.append([a], [1])  # a lets go of block 0 (b still holds it) and copies its tail
    assert table(mgr, a)[:2] == [N, 1] and mgr.ref_count(0) == 1
    free = mgr.stats().free
    mgr.append([b], [1])  # b writes in its tail, now its own, and lets go of block 0
    assert mgr.stats().free == free + 1 and mgr.ref_count(0) == 0
    mgr.check()
    (c,) = mgr.fork([a])[0]
    assert table(mgr, c) == table(mgr, a)
    mgr.release([a, b, c])
    assert mgr.stats().used == 0
    mgr.check()


def test_truncate_refuses_a_cut_the_window_can_no_longer_serve():
    mgr = BlockManager(32, 4, sliding_window=4)
    (s,) = mgr.admit(np.arange(9), [9]).ids
    mgr.append([s], [3], [1, 2, 3])  # length 9 reaches position 6: block 0 leaves
    assert table(mgr, s) == [N, 1, 2]
    before = mgr.snapshot()
    with pytest.raises(ValueError, match="left its attention window"):
        mgr.truncate([s], [5])  # length 5 reaches position 2: block 0
    for field, old in zip(before._fields, before, strict=True):
        assert np.array_equal(getattr(mgr.state, field), old), field
    mgr.truncate([s], [9])  # reaches position 6: block 1, still held
    assert table(mgr, s) == [N, 1, 2]
    mgr.check()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(sliding_window=0), "at least 1"),
        (dict(attention_chunk_size=6), "multiple of block_size"),
        (dict(sliding_window=8, attention_chunk_size=8), "exclude each other"),
    ],
)
def test_bad_windows_are_invalid_geometry(kwargs, message):
    for cls in (BlockManager, ReferenceBlockManager):
        with pytest.raises(InvalidGeometry, match=message):
            cls(16, 4, **kwargs)


def test_a_window_must_be_an_integer():
    with pytest.raises(TypeError):
        BlockManager(16, 4, sliding_window=4.0)


def _slot(mgr, seq_id):
    return split_id(int(seq_id), mgr.max_seqs)[2]


def test_check_catches_a_block_released_while_the_window_still_reaches_it():
    mgr = BlockManager(32, 4, sliding_window=6)
    (s,) = mgr.admit(np.arange(10), [10]).ids
    mgr.append([s], [1], [1])
    table_row = mgr._arenas.s.seq_table[_slot(mgr, s)]
    # Planted: block 1 (reached by position 5) released as well.
    mgr._arenas.s.ref[table_row[1]] -= 1
    table_row[1] = N
    with pytest.raises(InvariantViolation, match="left the window"):
        mgr.check()


def test_check_catches_a_released_block_left_in_the_table():
    mgr = BlockManager(32, 4, sliding_window=6)
    (s,) = mgr.admit(np.arange(10), [10]).ids
    mgr.append([s], [1], [1])
    # Planted: the entry of the released block 0 still names it.
    mgr._arenas.s.seq_table[_slot(mgr, s), 0] = 0
    with pytest.raises(InvariantViolation, match="refcount"):
        mgr.check()


def test_check_catches_a_gap_that_is_not_a_prefix():
    mgr = BlockManager(32, 4, sliding_window=6)
    (s,) = mgr.admit(np.arange(10), [10]).ids
    mgr.append([s], [1], [1])
    row = mgr._arenas.s.seq_table[_slot(mgr, s)]
    # Planted: position 0 holds a block again while position 1 left.
    row[0], row[1] = row[1], N
    with pytest.raises(InvariantViolation, match="out-of-range"):
        mgr.check()


def test_check_catches_a_full_attention_manager_with_a_null_entry():
    mgr = BlockManager(32, 4)
    (s,) = mgr.admit(np.arange(10), [10]).ids
    mgr._arenas.s.ref[0] -= 1
    mgr._arenas.s.seq_table[_slot(mgr, s), 0] = N
    with pytest.raises(InvariantViolation, match="left the window"):
        mgr.check()


def keys_for(n, offset=0):
    """``n`` distinct engine keys (uint64[n, 4])."""
    rows = np.arange(offset, offset + n, dtype=np.uint64)
    return np.stack([rows + 1, rows * 7 + 3, rows ^ 5, rows + 11], axis=1)


def test_engine_keys_of_a_windowed_prompt_hit_its_last_window():
    mgr = BlockManager(32, 4, block_keys=True, sliding_window=5)  # w = 1 block
    keys = keys_for(5)
    (s,) = mgr.admit(None, [20], keys=keys).ids
    mgr.release([s])
    mgr.evict([0, 1])
    hits = mgr.lookup_one(length=20, keys=keys)
    assert hits.tolist() == [N, N, N, 3]  # 4 blocks count as cached; one is reused
    seq_id, cached = mgr.admit_one(length=20, keys=keys)
    assert cached == 16 and table(mgr, seq_id)[:4] == [N, N, N, 3]
    mgr.check()


def test_keys_cannot_go_to_positions_that_left_the_window():
    mgr = BlockManager(32, 4, block_keys=True, sliding_window=4)
    (s,) = mgr.admit(None, [9]).ids  # no keys yet; L = 9
    mgr.append([s], [3])  # first needed (9 - 3) // 4 = 1: block 0 leaves
    with pytest.raises(ValueError, match="left its window"):
        mgr.set_keys([s], [0], [1], keys_for(1))
    before = mgr.snapshot()
    # Growing from 12 releases block 1 first (first needed (12 - 3) // 4 = 2): its key has no
    # block to go to, and nothing changes.
    with pytest.raises(ValueError, match="left its window"):
        mgr.append_one(s, 1, key_start=1, keys=keys_for(1))
    for field, old in zip(before._fields, before, strict=True):
        assert np.array_equal(getattr(mgr.state, field), old), field
    mgr.append_one(s, 1, key_start=2, keys=keys_for(1, 2))  # a held block takes its key
    assert mgr.state.block_flags[table(mgr, s)[2]] & BlockFlag.REGISTERED
    mgr.check()


def test_reset_prefix_cache_clears_the_anchor_of_a_windowed_sequence():
    mgr = BlockManager(32, 4, sliding_window=3)  # w = 1: the parent leaves before the fill
    (s,) = mgr.new_sequences(1)
    mgr.append([s], [6], np.arange(6))
    mgr.append([s], [1], [6])  # length 6: block 0 leaves, its hash becomes the anchor
    assert table(mgr, s)[0] == N
    mgr.reset_prefix_cache()
    mgr.append([s], [1], [7])  # block 1 fills after the gap: content computed before the reset
    assert not mgr.state.block_flags[table(mgr, s)[1]] & BlockFlag.HASHED
    mgr.check()


def test_a_windowed_manager_on_a_page_pool_gives_pages_back_as_blocks_leave():
    pool = kvnumba.PagePool(4)
    mgr = BlockManager(
        8, 4, page_pool=pool, blocks_per_page=2, sliding_window=4, prefix_caching=False
    )
    (s,) = mgr.admit(np.arange(16), [16]).ids  # four blocks, two pages
    assert pool.num_free == 2
    mgr.append([s], [1], [16])  # first needed (16 - 3) // 4 = 3: blocks 0, 1, 2 leave
    # Page 0 (blocks 0, 1) is empty and goes back to the pool; the new tail takes block 2,
    # free in page 1, which stays mapped: no page is mapped for it.
    assert table(mgr, s) == [N, N, N, 3, 2]
    assert pool.num_free == 3
    mgr.check()
    pool.check()


def test_non_atomic_windowed_append_counts_each_sequences_own_release_only():
    mgr = BlockManager(4, 4, sliding_window=4, prefix_caching=False, max_seq_len=64)
    a, b = mgr.admit(np.arange(16), [12, 4]).ids  # a: blocks 0-2, b: block 3; pool full
    # Atomic: b needs 2 blocks, a needs 1; a's window releases blocks 0 and 1: 3 > 2.
    with pytest.raises(PoolExhausted) as err:
        mgr.append([b, a], [5, 1])
    assert (err.value.needed, err.value.available) == (3, 2)
    # In order: b comes first and its own window releases nothing, so it fails untouched;
    # a fits with what its window releases.
    result = mgr.append([b, a], [5, 1], atomic=False)
    assert result.ok.tolist() == [False, True]
    assert table(mgr, b) == [3] and table(mgr, a) == [N, N, 2, 0]
    assert mgr.stats().failed_calls == 2
    mgr.check()


def test_window_hooks_do_nothing_for_a_plain_managers_arena():
    """The plain kernels never compile the window code: each hook's version for a plain
    manager's arena (layout 'C') is a stub, the extended arena's (layout 'A') calls the helper."""
    from numba import types

    from kvnumba._kernels import windows as w
    from kvnumba._kernels.outcomes import PromptHits

    plain, extended = (types.Array(types.uint8, 1, layout) for layout in "CA")
    vec, i64 = types.Array(types.int64, 1, "C"), types.int64
    rows = types.Array(types.int64, 2, "C")
    hooks = {
        w._drop_window_impl: ((i64, i64), 0, "drop_out_of_window"),
        w._window_gain_of_impl: ((vec, vec), 0, "window_gain"),
        w._window_hits_of_impl: ((rows, i64), PromptHits(0, 0, 3), "windowed_prompt_hits"),
        w._anchor_of_impl: ((vec, types.boolean, i64, i64), None, "admit_anchor"),
    }
    for impl, (rest, stub_result, helper) in hooks.items():
        stub = impl(plain, plain, plain, *rest)
        args = [None] * (3 + len(rest))
        if impl is w._window_hits_of_impl:
            args[4] = 3  # limit
        assert stub(*args) == stub_result
        assert helper not in stub.__code__.co_names
        assert helper in impl(extended, extended, extended, *rest).__code__.co_names


def test_a_capped_chunked_hit_keeps_the_start_of_the_cap_s_chunk():
    """Capped at 3 blocks, the first token computed (position 12) attends to its chunk
    [8, 16), so the cached block of positions 8 .. 11 must be claimed, not skipped."""
    for cls in (BlockManager, ReferenceBlockManager):
        mgr = cls(64, 4, attention_chunk_size=8)
        # 12 tokens: the last chunk starts at block 2, the only block this prompt needs.
        first = mgr.admit(np.arange(12), [12]).ids
        held = table(mgr, first[0])
        assert held == [N, N, held[2]] and held[2] >= 0
        mgr.release(first)
        result = mgr.admit(np.arange(30), [30], max_hit_blocks=3)
        assert result.num_cached_tokens.tolist() == [12]
        assert table(mgr, result.ids[0])[:3] == [N, N, held[2]]
        mgr.check()


# ------------------------------------------------------- window_release="explicit"
def test_explicit_release_keeps_blocks_until_the_engine_releases_them():
    for cls in (BlockManager, ReferenceBlockManager):
        mgr = cls(32, 4, sliding_window=6, window_release="explicit")
        (s,) = mgr.admit(np.arange(10), [10]).ids
        mgr.append([s], [5], np.arange(5))
        assert table(mgr, s) == [0, 1, 2, 3]  # the append released nothing
        # Processed 10 tokens: the next one reaches back to position 5, block 1.
        assert mgr.release_window([s], [10]) == 1
        assert table(mgr, s) == [N, 1, 2, 3]
        assert mgr.release_window([s], [15]) == 1  # position 10: block 2
        assert mgr.release_window([s], [12]) == 0  # below what is released already
        assert table(mgr, s) == [N, N, 2, 3] and mgr.stats().cached == 2
        mgr.check()
        plain = cls(32, 4)
        (t,) = plain.admit(np.arange(10), [10]).ids
        assert plain.release_window([t], [10]) == 0  # full attention releases nothing


def test_explicit_release_counts_no_window_gain_for_an_append():
    for cls in (BlockManager, ReferenceBlockManager):
        mgr = cls(4, 4, sliding_window=5, prefix_caching=False, window_release="explicit")
        a, _ = mgr.admit(np.arange(16), [12, 4]).ids
        assert not mgr.can_append([a], [1])
        with pytest.raises(PoolExhausted) as err:
            mgr.append([a], [1])
        assert (err.value.needed, err.value.available) == (1, 0)
        # Position 12 reaches back to position 8: blocks 0 and 1 go, both free.
        assert mgr.release_window([a], [12]) == 2
        mgr.append([a], [1])
        assert table(mgr, a)[:2] == [N, N]
        mgr.check()


def test_release_window_follows_each_groups_rule():
    groups = [
        kvnumba.KVCacheGroup(),
        kvnumba.KVCacheGroup(sliding_window=6),
        kvnumba.KVCacheGroup(attention_chunk_size=8),
    ]
    for cls in (BlockManager, ReferenceBlockManager):
        mgr = cls(64, 4, kv_cache_groups=groups, window_release="explicit")
        ids = mgr.admit(np.arange(10), [10]).ids.ravel()
        assert mgr.release_window(ids, [10, 10, 10]) == 3
        assert mgr.block_tables(ids).tolist() == [[0, 1, 2], [N, 4, 5], [N, N, 8]]
        mgr.check()


@pytest.mark.parametrize(
    ("lengths", "match"),
    [([11], "exceeds the 10 tokens"), ([-1], "negative"), ([1, 2], "entries")],
)
def test_a_bad_release_window_changes_nothing(lengths, match):
    mgr = BlockManager(32, 4, sliding_window=6)
    (s,) = mgr.admit(np.arange(10), [10]).ids
    before = mgr.snapshot()
    with pytest.raises(ValueError, match=match):
        mgr.release_window([s], lengths)
    with pytest.raises(ValueError):
        mgr.release_window([s, s], [10, 10])  # the same sequence twice
    for field, old in zip(before._fields, before, strict=True):
        assert np.array_equal(getattr(mgr.state, field), old), field
    with pytest.raises(ValueError, match="window_release"):
        BlockManager(32, 4, sliding_window=6, window_release="never")
