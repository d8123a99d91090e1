"""Several KV cache groups over one pool (``BlockManager(kv_cache_groups=...)``): every prompt
becomes one sequence per group, all groups draw on one free list and one prefix cache, the hit
of a prompt is the one prefix every group's rule allows, every group claims its hits before any
grows, a failed call rolls every group back, and no block is shared across groups.

The rules are those of ``docs/windows.md``; each expectation here is derived by hand on tiny
managers (block size 4), and each scenario is replayed on the reference model, which must
agree. The randomized comparison lives in ``test_differential.py`` and the stateful machines.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvnumba import (
    NULL_BLOCK,
    BlockManager,
    InvalidGeometry,
    InvariantViolation,
    KVCacheGroup,
    PoolExhausted,
    TooManySequences,
)
from kvnumba.ids import split_id
from kvnumba.reference import ReferenceBlockManager

N = NULL_BLOCK
FULL = KVCacheGroup()


def both(*args, **kwargs):
    """The kernels' manager and the reference model, built alike."""
    return BlockManager(*args, **kwargs), ReferenceBlockManager(*args, **kwargs)


def tables(mgr, ids):
    return mgr.block_tables(np.ravel(ids)).tolist()


def test_one_sequence_per_group_from_one_free_list():
    for mgr in both(64, 4, kv_cache_groups=[FULL, KVCacheGroup(sliding_window=6)]):
        result = mgr.admit(np.arange(10), [10])
        assert result.ids.shape == (1, 2)
        assert result.num_cached_tokens.tolist() == [0]
        # Group 0's blocks first, then group 1's, both from the one free list.
        assert tables(mgr, result.ids) == [[0, 1, 2], [3, 4, 5]]
        # Each group's uncached tokens in turn.
        assert result.slot_mapping.tolist() == list(range(10)) + list(range(12, 22))
        assert mgr.stats().used == 6
        assert mgr.new_sequences(2).shape == (2, 2)
        assert len(mgr.kv_cache_groups) == 2 and mgr.sliding_window is None
        mgr.check()


def test_each_group_releases_by_its_own_rule():
    groups = [FULL, KVCacheGroup(sliding_window=6), KVCacheGroup(attention_chunk_size=8)]
    for mgr in both(64, 4, kv_cache_groups=groups):
        ids = mgr.admit(np.arange(10), [10]).ids.ravel()
        mgr.append(ids, [1, 1, 1], [10, 10, 10])
        # Length 10: a sliding window of 6 reaches back to position 5 (block 1), the chunk
        # [8, 16) starts at block 2; full attention keeps everything.
        assert tables(mgr, ids) == [[0, 1, 2], [N, 4, 5], [N, N, 8]]
        mgr.check()


def _cached_prompt(mgr, prompt):
    """Admit ``prompt`` and release it: its full blocks stay cached in every group; returns
    the groups' tables as they were."""
    ids = mgr.admit(prompt, [len(prompt)]).ids.ravel()
    held = tables(mgr, ids)
    mgr.release(ids)
    return held


def test_a_window_missing_in_one_group_caps_the_hit_of_all():
    prompt = np.arange(33)  # 9 blocks, 8 of them full: the hit looks at 8
    for mgr in both(64, 4, kv_cache_groups=[FULL, KVCacheGroup(sliding_window=5)]):
        full, window = _cached_prompt(mgr, prompt)
        mgr.evict(window[5:8])  # the sliding group loses positions 5, 6 and 7
        # A window of 5 tokens needs one block before the next token: the last hit of the
        # sliding group is position 4, so both groups reuse 5 blocks.
        assert mgr.lookup(prompt, [33]).num_cached_tokens.tolist() == [20]
        result = mgr.admit(prompt, [33])
        assert result.num_cached_tokens.tolist() == [20]
        got = tables(mgr, result.ids)
        assert got[0][:5] == full[:5] and got[1][:5] == [N, N, N, N, window[4]]
        assert mgr.stats().prefix_hits == 6  # five blocks of group 0, one of group 1
        mgr.check()


def test_a_short_full_attention_hit_moves_the_window_to_its_end():
    prompt = np.arange(33)
    for mgr in both(64, 4, kv_cache_groups=[FULL, KVCacheGroup(sliding_window=5)]):
        full, window = _cached_prompt(mgr, prompt)
        mgr.evict([full[6]])  # full attention now hits positions 0 .. 5 only
        result = mgr.admit(prompt, [33])
        # The sliding group had its last window at position 7, and finds it again at 5.
        assert result.num_cached_tokens.tolist() == [24]
        got = tables(mgr, result.ids)
        assert got[0][:6] == full[:6] and got[1][:6] == [N] * 5 + [window[5]]
        assert full[7] not in got[0]  # cached, not claimed: past the common hit
        mgr.check()


def test_no_block_is_shared_across_groups():
    prompt = np.arange(12)
    for mgr in both(64, 4, kv_cache_groups=[FULL, FULL]):
        first, second = _cached_prompt(mgr, prompt)
        assert not set(first) & set(second)
        mgr.evict(second)
        # Group 0's blocks are still cached, but group 1 has nothing: no hit for either.
        result = mgr.admit(prompt, [12])
        assert result.num_cached_tokens.tolist() == [0]
        assert not set(tables(mgr, result.ids)[1]) & set(first)
        mgr.check()


def test_every_group_claims_its_hits_before_any_grows():
    """Group 0 grows past the free blocks and must evict: the least recent cached blocks are
    group 1's hits, which it has already claimed, so another prompt's blocks go instead."""
    hit, junk = np.arange(9), np.arange(100, 117)
    for mgr in both(16, 4, kv_cache_groups=[FULL, FULL]):
        old = _cached_prompt(mgr, hit)  # groups 0 and 1: two full blocks each, oldest
        _cached_prompt(mgr, junk)  # four full blocks per group, newer
        assert mgr.stats().free == 4 and mgr.stats().cached == 12
        prompt = np.concatenate([hit[:8], np.arange(200, 220)])  # 28 tokens, 7 blocks
        result = mgr.admit(prompt, [28])
        assert result.num_cached_tokens.tolist() == [8]
        got = tables(mgr, result.ids)
        assert got[0][:2] == old[0][:2] and got[1][:2] == old[1][:2]
        assert mgr.stats().evictions == 6  # 10 new blocks: 4 free, 6 of the junk
        mgr.check()


def test_a_failed_admit_or_append_changes_no_group():
    groups = [FULL, KVCacheGroup(sliding_window=5)]
    managers = both(12, 4, kv_cache_groups=groups, prefix_caching=False)
    ids = [m.admit(np.arange(8), [8]).ids.ravel() for m in managers]  # two blocks per group
    mgr = managers[0]
    before = mgr.snapshot()
    for m, held in zip(managers, ids, strict=True):
        with pytest.raises(PoolExhausted) as err:
            # The first prompt fits (2 + 2 blocks of the 8 free), the second would take 3 + 3.
            m.admit(np.arange(20), [8, 12])
        assert (err.value.needed, err.value.available) == (10, 8)
        with pytest.raises(PoolExhausted) as err:
            # 25 tokens: 5 new blocks per group; the window of group 1 releases one.
            m.append(held, [17, 17])
        assert (err.value.needed, err.value.available) == (10, 9)
        m.check()
    for field, old in zip(before._fields, before, strict=True):
        assert np.array_equal(getattr(mgr.state, field), old), field


def test_one_request_calls_answer_for_every_group():
    prompt = np.arange(13)
    mgr = BlockManager(64, 4, kv_cache_groups=[FULL, KVCacheGroup(sliding_window=5)])
    _cached_prompt(mgr, prompt)
    ids, cached = mgr.admit_one(prompt)
    assert isinstance(ids, tuple) and len(ids) == 2 and cached == 12
    assert [row[:3] for row in tables(mgr, ids)] == [[0, 1, 2], [N, N, 6]]
    keyed = BlockManager(64, 4, kv_cache_groups=[FULL, FULL], block_keys=True)
    keys = np.arange(12, dtype=np.uint64).reshape(3, 4)
    seq_ids = keyed.admit(None, [13], keys=keys).ids.ravel()
    keyed.release(seq_ids)
    hits = keyed.lookup_one(length=13, keys=keys)
    assert hits.shape == (2, 3) and not set(hits[0]) & set(hits[1])
    keyed.check()


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"kv_cache_groups": []}, InvalidGeometry),
        ({"kv_cache_groups": [FULL] * 9}, InvalidGeometry),
        ({"kv_cache_groups": [FULL, KVCacheGroup(attention_chunk_size=6)]}, InvalidGeometry),
        ({"kv_cache_groups": [FULL], "sliding_window": 8}, InvalidGeometry),
        ({"kv_cache_groups": [{"sliding_window": 8}]}, TypeError),
        ({"kv_cache_groups": "full"}, TypeError),
    ],
)
def test_bad_groups_are_refused(kwargs, error):
    for cls in (BlockManager, ReferenceBlockManager):
        with pytest.raises(error):
            cls(16, 4, **kwargs)


def test_bad_salts_and_too_many_sequences_change_nothing():
    for mgr in both(16, 4, max_seqs=3, kv_cache_groups=[FULL, FULL]):
        with pytest.raises(ValueError, match="KV cache groups"):
            mgr.admit(np.arange(4), [4], salts=[2**62])
        with pytest.raises(TooManySequences):
            mgr.admit(np.arange(4), [2, 2])  # four sequences for three slots
        with pytest.raises(TooManySequences):
            mgr.new_sequences(2)
        assert mgr.stats().used == 0
        mgr.check()


def test_check_catches_a_sequence_moved_to_another_group():
    mgr = BlockManager(32, 4, kv_cache_groups=[FULL, KVCacheGroup(sliding_window=6)])
    ids = mgr.admit(np.arange(10), [10]).ids.ravel()
    mgr.check()
    # Planted: group 1's sequence given group 0's salt; its blocks were hashed as group 1's.
    mgr._arenas.s.seq_salt[split_id(int(ids[1]), mgr.max_seqs)[2]] = 0
    with pytest.raises(InvariantViolation):
        mgr.check()


def test_check_catches_a_window_released_by_another_groups_rule():
    mgr = BlockManager(32, 4, kv_cache_groups=[FULL, KVCacheGroup(sliding_window=6)])
    ids = mgr.admit(np.arange(10), [10]).ids.ravel()
    mgr.append(ids, [1, 1], [10, 10])
    # Planted: the full-attention group's first block released as the sliding one's was.
    row = mgr._arenas.s.seq_table[split_id(int(ids[0]), mgr.max_seqs)[2]]
    mgr._arenas.s.ref[row[0]] -= 1
    row[0] = N
    with pytest.raises(InvariantViolation, match="left the window"):
        mgr.check()
