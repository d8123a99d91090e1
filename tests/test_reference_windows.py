"""Windowed attention (sliding window, chunked local) in the pure-Python model.

Every expectation is derived by hand from ``docs/windows.md`` on tiny managers (block size 4,
a dozen blocks); the block ids follow ``docs/design.md`` (a fresh free stack hands out 0, 1,
2, ...; release goes tail first). ``check()`` runs after every public call (``Checked``).
"""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest

from kvnumba import NULL_BLOCK
from kvnumba.errors import InvalidGeometry, InvariantViolation, PoolExhausted
from kvnumba.reference import ReferenceBlockManager, ReferencePagePool
from kvnumba.reference._common import _STATE
from kvnumba.reference.eviction import ROOT

BS = 4
N = NULL_BLOCK  # -2 in a table: the position left the window


class Checked:
    """A model manager whose every public call is followed by ``check()``, failed calls too."""

    def __init__(self, mgr: ReferenceBlockManager):
        self.mgr = mgr

    def __getattr__(self, name):
        attr = getattr(self.mgr, name)
        if name.startswith("_") or not callable(attr):
            return attr

        def call(*args, **kwargs):
            try:
                return attr(*args, **kwargs)
            finally:
                self.mgr.check()

        return call


def make(num_blocks=12, **kw) -> Checked:
    return Checked(ReferenceBlockManager(num_blocks, BS, **kw))


def frozen(mgr):
    """The model's rollback state (anchors and the policy included) as a comparable value."""
    return copy.deepcopy({name: getattr(mgr.mgr, name) for name in _STATE})


def grow(mgr, n_tokens, first=0):
    """A new sequence holding tokens ``first .. first + n_tokens - 1`` (one append)."""
    (sid,) = mgr.new_sequences(1)
    mgr.append([sid], [n_tokens], np.arange(first, first + n_tokens))
    return int(sid)


def decode(mgr, sid, tokens):
    """Append ``tokens`` one at a time (one call each, as decoding does)."""
    for t in tokens:
        mgr.append([sid], [1], [t])


def table(mgr, sid):
    return mgr.block_tables([sid])[0].tolist()


def slot_of(mgr, sid):
    return mgr._resolve(sid)


# ---------------------------------------------------------------- geometry


def test_geometry_names_the_kind_and_refuses_bad_values():
    assert ReferenceBlockManager(12, BS).sliding_window is None
    assert ReferenceBlockManager(12, BS).attention_chunk_size is None
    sliding = ReferenceBlockManager(12, BS, sliding_window=5)
    assert (sliding.sliding_window, sliding.attention_chunk_size) == (5, None)
    chunked = ReferenceBlockManager(12, BS, attention_chunk_size=8)
    assert (chunked.sliding_window, chunked.attention_chunk_size) == (None, 8)
    bad = (
        {"sliding_window": 5, "attention_chunk_size": 8},  # one kind per manager
        {"attention_chunk_size": 6},  # not a multiple of block_size
        {"sliding_window": 0},
        {"sliding_window": -3},
        {"attention_chunk_size": 0},
    )
    for kw in bad:
        with pytest.raises(InvalidGeometry):
            ReferenceBlockManager(12, BS, **kw)
    with pytest.raises(TypeError):
        ReferenceBlockManager(12, BS, sliding_window=True)


# ---------------------------------------------------------------- drops during decode


def test_sliding_window_decode_caches_the_blocks_that_leave_the_window():
    # W = 5: the next token after L reaches back to block max(0, L - 4) // 4.
    mgr = make(sliding_window=5)
    a = grow(mgr, 8)  # blocks 0, 1
    assert table(mgr, a) == [0, 1]
    decode(mgr, a, [8])  # L = 8 before: first needed block 1, block 0 leaves (cached)
    assert table(mgr, a) == [N, 1, 2]
    assert mgr.lru_blocks() == [0] and mgr.ref_count(0) == 0
    assert mgr._anchor[slot_of(mgr, a)] == mgr._hash[0]
    decode(mgr, a, [9, 10, 11])  # L = 9 .. 11 before: first needed block 1, nothing leaves
    assert table(mgr, a) == [N, 1, 2]
    decode(mgr, a, [12])  # L = 12 before: block 1 leaves
    assert table(mgr, a) == [N, N, 2, 3]
    assert mgr.lru_blocks() == [0, 1]
    assert mgr._anchor[slot_of(mgr, a)] == mgr._hash[1]
    assert mgr.seq_tokens(a).tolist() == [-1] * 8 + [8, 9, 10, 11, 12]
    assert mgr.stats().used == 2 and mgr.stats().cached == 2
    mgr.release([a])  # the blocks still held, tail first: partial 3 freed, full 2 cached
    assert mgr.lru_blocks() == [0, 1, 2] and mgr.free_blocks()[-1] == 3
    assert mgr._anchor[slot_of(mgr, grow(mgr, 1))] is None  # a reused slot has no anchor


def test_sliding_window_without_prefix_caching_frees_and_reuses_the_dropped_block():
    mgr = make(sliding_window=5, prefix_caching=False)
    a = grow(mgr, 8)
    decode(mgr, a, [8])  # block 0 freed (top of the stack), then taken for position 2
    assert table(mgr, a) == [N, 1, 0]
    assert mgr.stats().used == 2 and mgr.stats().allocations == 3


def test_chunked_local_drops_the_whole_chunk_at_the_next_append_past_its_boundary():
    # C = 8: two blocks per chunk; the first needed block is (L // 8 * 8) // 4.
    mgr = make(attention_chunk_size=8)
    a = grow(mgr, 7)  # blocks 0, 1
    decode(mgr, a, [7])  # L = 7 before: still chunk 0, nothing leaves
    assert table(mgr, a) == [0, 1]
    decode(mgr, a, [8])  # L = 8 before: chunk 1 starts, blocks 1 then 0 leave
    assert table(mgr, a) == [N, N, 2]
    assert mgr.lru_blocks() == [1, 0]  # highest position first, as release goes
    assert mgr._anchor[slot_of(mgr, a)] == mgr._hash[1]
    mgr.append([a], [7], np.arange(9, 16))  # L = 9 .. 16: chunk 1 fills, nothing leaves
    assert table(mgr, a) == [N, N, 2, 3]
    decode(mgr, a, [16])
    assert table(mgr, a) == [N, N, N, N, 4]
    assert mgr.lru_blocks() == [1, 0, 3, 2]


def test_a_zero_count_append_drops_nothing():
    mgr = make(sliding_window=5)
    a = grow(mgr, 8)
    mgr.append([a], [0])
    assert table(mgr, a) == [0, 1]
    assert mgr.can_append([a], [0])


# ---------------------------------------------------------------- capacity


def test_atomic_append_fits_thanks_to_its_own_drop():
    mgr = make(sliding_window=5, prefix_caching=False)
    a = grow(mgr, 8)  # blocks 0, 1
    grow(mgr, 40, first=100)  # blocks 2 .. 11: nothing free, nothing cached
    assert mgr.stats().free == 0
    assert mgr.can_append([a], [1])
    result = mgr.append([a], [1], [8])  # block 0 leaves the window and is taken again
    assert table(mgr, a) == [N, 1, 0]
    assert result.slot_mapping.tolist() == [0 * BS + 0]


def test_atomic_append_that_does_not_fit_raises_with_the_gain_and_changes_nothing():
    mgr = make(sliding_window=5, prefix_caching=False)
    a = grow(mgr, 8)
    grow(mgr, 40, first=100)
    assert not mgr.can_append([a], [5])
    before = frozen(mgr)
    with pytest.raises(PoolExhausted) as err:
        mgr.append([a], [5], np.arange(8, 13))  # 2 new blocks; 0 free + 1 released
    assert (err.value.needed, err.value.available, err.value.shortfall) == (2, 1, 1)
    assert frozen(mgr) == before
    assert table(mgr, a) == [0, 1] and mgr.stats().failed_calls == 1


def test_a_block_two_sequences_of_one_call_drop_counts_once():
    mgr = make(sliding_window=5, prefix_caching=False)
    p = grow(mgr, 8)  # blocks 0, 1
    (c,) = mgr.fork([p])[0]
    filler = grow(mgr, 40, first=100)  # blocks 2 .. 11
    before = frozen(mgr)
    # Both drop block 0, which reaches refcount 0 once: available 0 + 1 for 2 new blocks.
    assert not mgr.can_append([p, c], [1, 1])
    with pytest.raises(PoolExhausted) as err:
        mgr.append([p, c], [1, 1])
    assert (err.value.needed, err.value.available) == (2, 1)
    assert frozen(mgr) == before
    mgr.truncate([filler], [36])  # block 11 freed: now 1 free + 1 released
    assert mgr.can_append([p, c], [1, 1])
    mgr.append([p, c], [1, 1])
    # Every drop first (block 0 freed on top of 11), then the growth in input order.
    assert table(mgr, p) == [N, 1, 0] and table(mgr, c) == [N, 1, 11]


def test_non_atomic_failed_sequence_keeps_its_out_of_window_blocks():
    mgr = make(sliding_window=5, prefix_caching=False)
    a = grow(mgr, 8)  # blocks 0, 1
    b = grow(mgr, 8, first=50)  # blocks 2, 3
    grow(mgr, 32, first=100)  # blocks 4 .. 11
    # a needs 2 blocks, its window gives 1: failed, untouched. b needs 1 and gets block 2 back.
    result = mgr.append([a, b], [5, 1], np.arange(8, 14), atomic=False)
    assert result.ok.tolist() == [False, True]
    assert result.slot_mapping.tolist() == [-1] * 5 + [2 * BS]
    assert table(mgr, a) == [0, 1] and mgr.ref_count(0) == 1
    assert table(mgr, b) == [N, 3, 2]
    assert mgr._anchor[slot_of(mgr, a)] is None


def test_page_pool_drop_returns_the_page_and_available_grows_by_the_gain():
    for caching in (False, True):
        pool = ReferencePagePool(3)
        mgr = Checked(
            ReferenceBlockManager(
                12,
                BS,
                page_pool=pool,
                blocks_per_page=4,
                sliding_window=5,
                prefix_caching=caching,
                max_seq_len=64,
            )
        )
        a, b = mgr.new_sequences(2)
        mgr.append([a], [4], np.arange(4))  # block 0, page 0 mapped
        mgr.append([b], [12], np.arange(50, 62))  # blocks 1, 2, 3: page 0 full
        mgr.append([a], [4], np.arange(4, 8))  # block 4, page 1 mapped
        mgr.release([b])  # block 0 is the only referenced block of page 0
        assert table(mgr, a) == [0, 4]
        before = mgr._available()
        gain = mgr._window_gain([slot_of(mgr, a)])
        assert (before, gain) == (10, 1)  # 6 free in pages 0 and 1, one mappable page
        mgr.append([a], [1], [8])  # block 0 leaves: page 0 unmapped (or cache-only)
        assert mgr._available() == before + gain - 1  # one block taken: 5, from page 1
        assert table(mgr, a) == [N, 4, 5]
        assert mgr.page_of_virtual(0) == (0 if caching else -1)
        # Everything but the two held blocks serves one more call: 10 new blocks.
        mgr.append([a], [43])
        assert mgr.stats().free == 0 and mgr.stats().cached == 0


# ---------------------------------------------------------------- admit and lookup


def test_sliding_window_prompt_whose_middle_was_evicted_still_hits_its_last_window():
    # W = 9: a hit needs its last w = ceil(8 / 4) = 2 blocks.
    mgr = make(sliding_window=9)
    prompt = list(range(21))  # 5 full blocks may hit, the 6th holds the last token
    first = mgr.admit(prompt, [21])
    assert first.num_cached_tokens.tolist() == [0]
    (a,) = first.ids
    assert table(mgr, a) == [0, 1, 2, 3, 4, 5]  # admit drops nothing
    anchor = mgr._hash[2]
    mgr.release([a])  # 5 freed; 4, 3, 2, 1, 0 cached
    assert mgr.evict([1, 2]) == 2  # the middle of the prompt is gone
    # Hits at positions 0, 3, 4: the rightmost 2 in a row end at k = 5, needed from 3.
    looked = mgr.lookup(prompt, [21])
    assert looked.num_cached_tokens.tolist() == [20]
    assert looked.block_ids.tolist() == [[N, N, N, 3, 4]]
    queries, hits = mgr.stats().prefix_queries, mgr.stats().prefix_hits
    again = mgr.admit(prompt, [21])
    (b,) = again.ids
    assert again.num_cached_tokens.tolist() == [20]
    assert table(mgr, b) == [N, N, N, 3, 4, 2]  # only the last token's block is new
    assert again.slot_mapping.tolist() == [2 * BS]
    assert mgr.ref_count(3) == mgr.ref_count(4) == 1 and mgr.lru_blocks() == [0]
    assert mgr.stats().prefix_queries - queries == 5 and mgr.stats().prefix_hits - hits == 2
    assert mgr._anchor[slot_of(mgr, b)] == anchor  # the chained hash of prompt block 2
    # A full-attention manager in the same state hits only block 0.
    full = make()
    (c,) = full.admit(prompt, [21]).ids
    full.release([c])
    full.evict([1, 2])
    assert full.lookup(prompt, [21]).block_ids.tolist() == [[0]]


def test_chunked_local_prompt_hit_skips_to_its_last_chunk():
    # C = 8: a 21-token prompt's last token is in the chunk that starts at block 4, so even a
    # cold cache gives k = s = 4 (16 tokens the layer never reads again), nothing claimed.
    prompt = list(range(21))
    cold = make(attention_chunk_size=8)
    result = cold.admit(prompt, [21])
    assert result.num_cached_tokens.tolist() == [16]
    assert table(cold, result.ids[0]) == [N, N, N, N, 0, 1]
    assert cold.stats().prefix_hits == 0 and cold.stats().allocations == 2
    mgr = make(attention_chunk_size=8)
    a = grow(mgr, 21)  # an append allocates all six blocks, 0 .. 4 registered
    mgr.release([a])
    mgr.evict([0, 1, 2, 3])  # blocks below the chunk: not needed, cached or not
    looked = mgr.lookup(prompt, [21])
    assert looked.num_cached_tokens.tolist() == [20]
    assert looked.block_ids.tolist() == [[N, N, N, N, 4]]
    result = mgr.admit(prompt, [21])
    (b,) = result.ids
    assert result.num_cached_tokens.tolist() == [20]
    assert table(mgr, b) == [N, N, N, N, 4, 3]
    assert mgr.stats().prefix_hits == 1


def test_chunked_local_prompt_with_a_cold_last_chunk_skips_its_earlier_chunks():
    mgr = make(attention_chunk_size=8)
    prompt = list(range(21))
    a = grow(mgr, 21)
    key_of_4 = mgr._key[4]
    mgr.release([a])
    mgr.evict([4])
    # Position 4 misses: k = s = 4, nothing to claim, yet 16 tokens need no computing.
    assert mgr.lookup(prompt, [21]).block_ids.tolist() == [[N, N, N, N]]
    result = mgr.admit(prompt, [21])
    (b,) = result.ids
    assert result.num_cached_tokens.tolist() == [16]
    assert table(mgr, b) == [N, N, N, N, 4, 5]
    assert mgr.stats().prefix_hits == 0 and mgr.lru_blocks() == [3, 2, 1, 0]
    # Block 4 filled after the gap: chained onto the anchor, it is registered as before.
    assert mgr._key[4] == key_of_4 and mgr._prefix[key_of_4] == 4


def test_windowed_admit_without_prefix_caching_hits_nothing():
    mgr = make(sliding_window=5, prefix_caching=False)
    (a,) = mgr.admit(list(range(21)), [21]).ids
    mgr.release([a])
    result = mgr.admit(list(range(21)), [21])
    assert result.num_cached_tokens.tolist() == [0]
    assert N not in table(mgr, result.ids[0])


def test_keyed_windowed_prompt_hits_its_last_window_by_key():
    keys = np.arange(1, 21, dtype=np.uint64).reshape(5, 4)
    mgr = make(sliding_window=9, block_keys=True)
    (a,) = mgr.admit(None, [21], keys=keys).ids
    mgr.release([a])
    mgr.evict([1])  # position 1 misses; 3 and 4 end the rightmost window
    assert mgr.lookup_one(length=21, keys=keys).tolist() == [N, N, N, 3, 4]
    seq, cached = mgr.admit_one(length=21, keys=keys)
    assert cached == 20 and table(mgr, seq) == [N, N, N, 3, 4, 1]
    assert mgr._anchor[slot_of(mgr, seq)] is None  # keyed: no chained hash


# ---------------------------------------------------------------- registration across the gap


def test_windowed_decode_registers_the_keys_full_attention_registers():
    # W = 3 <= block_size: when block j fills, block j - 1 has already left the window.
    windowed = make(sliding_window=3, eviction="leaf-lru")
    full = make(eviction="leaf-lru")
    a, f = grow(windowed, 1), grow(full, 1)
    decode(windowed, a, range(1, 24))
    decode(full, f, range(1, 24))
    assert table(windowed, a) == [N, N, N, N, N, 5]
    assert len(full._prefix) == 6 and set(windowed._prefix) == set(full._prefix)
    # Each block after a gap is a root of the cached prefix forest; full attention chains.
    assert [windowed._policy.parent[b] for b in range(1, 6)] == [ROOT] * 5
    assert [full._policy.parent[b] for b in range(1, 6)] == [0, 1, 2, 3, 4]
    # A full-attention walk of the chain (from the root, stopping at a miss) finds them all.
    windowed.release([a])
    assert windowed._lookup_prefix(list(range(25)), 0) == [0, 1, 2, 3, 4, 5]


def test_an_unhashed_block_leaving_the_window_leaves_the_next_unregistered():
    # As in full attention: a block whose parent has no hash is never registered.
    mgr = make(sliding_window=1)
    a = grow(mgr, 0)
    mgr.append([a], [4])  # no token ids: content unknown, never hashed
    decode(mgr, a, [4, 5, 6, 7])  # block 0 left (freed, taken again): anchor None
    assert table(mgr, a) == [N, 0] and mgr._anchor[slot_of(mgr, a)] is None
    assert mgr._prefix == {}
    decode(mgr, a, [8, 9, 10, 11])
    assert mgr._prefix == {}


def test_keyed_block_after_the_gap_is_a_root():
    mgr = make(sliding_window=1, block_keys=True, eviction="leaf-lru")
    (a,) = mgr.new_sequences(1)
    mgr.append_one(a, 4, key_start=0, keys=[[1, 1, 1, 1]])
    mgr.append_one(a, 4, key_start=1, keys=[[2, 2, 2, 2]])  # block 0 leaves first (cached)
    assert table(mgr, a) == [N, 1]
    assert mgr._policy.parent[1] == ROOT
    with pytest.raises(ValueError, match="left the window"):
        mgr.set_keys([a], [0], [1], [[9, 9, 9, 9]])
    before = frozen(mgr)
    with pytest.raises(ValueError, match="left the window"):  # the append would drop 1
        mgr.append_one(a, 4, key_start=1, keys=[[2, 2, 2, 2], [3, 3, 3, 3]])
    assert frozen(mgr) == before


# ---------------------------------------------------------------- fork, truncate, check


def test_fork_copies_the_gap_and_a_shared_block_leaves_with_its_last_holder():
    mgr = make(sliding_window=5)
    p = grow(mgr, 8)  # blocks 0, 1
    (c,) = mgr.fork([p])[0]
    decode(mgr, p, [8])  # p drops block 0; c still holds it
    assert table(mgr, p) == [N, 1, 2] and table(mgr, c) == [0, 1]
    assert mgr.ref_count(0) == 1 and mgr.lru_blocks() == []
    decode(mgr, c, [8])  # the last holder drops it: cached now
    assert table(mgr, c) == [N, 1, 3]
    assert mgr.ref_count(0) == 0 and mgr.lru_blocks() == [0]
    (d,) = mgr.fork([p])[0]
    assert table(mgr, d) == [N, 1, 2]
    assert mgr._anchor[slot_of(mgr, d)] == mgr._anchor[slot_of(mgr, p)] == mgr._hash[0]
    assert [mgr.ref_count(b) for b in (1, 2, 3)] == [3, 2, 1]  # no reference for the gap
    mgr.release([p, c, d])  # the blocks still held, tail first
    assert mgr.lru_blocks() == [0, 1] and mgr.stats().used == 0


def test_truncate_below_the_window_is_refused_and_changes_nothing():
    mgr = make(sliding_window=5)
    a = grow(mgr, 12)
    decode(mgr, a, [12])  # L = 12 before: blocks 1, 0 leave
    b = grow(mgr, 6, first=40)
    assert table(mgr, a) == [N, N, 2, 3]
    before = frozen(mgr)
    with pytest.raises(ValueError, match=r"ids\[1\]: length 11 needs table position 1"):
        mgr.truncate([b, a], [5, 11])
    assert frozen(mgr) == before
    with pytest.raises(ValueError, match="exceeds"):  # the existing checks come first
        mgr.truncate([a, b], [11, 99])
    mgr.truncate([a], [12])  # first needed block 2: allowed
    assert table(mgr, a) == [N, N, 2]
    with pytest.raises(ValueError, match="left the window"):
        mgr.truncate([a], [0])


def test_check_refuses_null_entries_outside_a_window_prefix():
    mgr = make(sliding_window=5)
    a = grow(mgr, 12)
    decode(mgr, a, [12])
    slot = slot_of(mgr, a)
    good = list(mgr._table[slot])  # [N, N, 2, 3], first needed block 2
    mgr._table[slot] = [N, 1, N, 3]
    with pytest.raises(InvariantViolation, match=f"slot {slot}: NULL_BLOCK entries are not a"):
        mgr.check()
    mgr._table[slot] = [N, N, N, 3]
    with pytest.raises(InvariantViolation, match=f"slot {slot}: 3 positions left the window"):
        mgr.check()
    mgr._table[slot] = good
    mgr.check()
    full = make()
    f = grow(full, 8)
    full._table[slot_of(full, f)][0] = N
    with pytest.raises(InvariantViolation, match="1 positions left the window"):
        full.check()


def test_a_truncation_to_the_gap_chains_the_next_block_onto_the_anchor_until_a_reset():
    # W = 1: after the append from L = 4, block 0 left; cut back to 4 tokens, the table is
    # all gap and the next block to fill chains onto the anchor (full attention: onto block 0).
    keys = []
    for reset in (False, True):
        mgr = make(sliding_window=1)
        a = grow(mgr, 4)
        decode(mgr, a, [4])
        mgr.truncate([a], [4])
        assert table(mgr, a) == [N] and mgr._anchor[slot_of(mgr, a)] == mgr._hash[0]
        if reset:  # block 0's hash is forgotten, as a held block's would be
            mgr.reset_prefix_cache()
            assert mgr._anchor[slot_of(mgr, a)] is None
        decode(mgr, a, [4, 5, 6, 7])
        keys.append(set(mgr._prefix))
    full = make()
    f = grow(full, 8)
    assert keys[0] == set(full._prefix) and len(keys[0]) == 2
    assert keys[1] == set()  # block 0 was evicted by the reset, block 1 has no parent hash
    assert table(full, f) == [0, 1]


# ---------------------------------------------------------------- randomized self-consistency


@pytest.mark.parametrize("kind", [{"sliding_window": 6}, {"attention_chunk_size": 8}])
def test_random_windowed_operations_keep_invariants_and_failed_calls_change_nothing(kind):
    rng = random.Random(20240611)
    mgr = make(max_seq_len=48, **kind)
    live: list[int] = []
    gaps = 0
    for _ in range(600):
        op = rng.random()
        before = frozen(mgr)
        try:
            if op < 0.45 and live:
                ids = rng.sample(live, rng.randint(1, len(live)))
                counts = [rng.choice([0, 1, 1, 3, 5]) for _ in ids]
                if all(mgr.seq_lens([s])[0] + c <= 48 for s, c in zip(ids, counts, strict=True)):
                    tokens = [rng.randrange(3) for _ in range(sum(counts))]
                    mgr.append(ids, counts, tokens, atomic=rng.random() < 0.7)
            elif op < 0.65:
                length = rng.randint(1, 24)
                prompt = [rng.randrange(3) for _ in range(length)]
                live.extend(int(s) for s in mgr.admit(prompt, [length]).ids)
            elif op < 0.75 and live:
                live.extend(int(s) for s in mgr.fork([rng.choice(live)])[0])
            elif op < 0.85 and live:
                s = rng.choice(live)
                mgr.truncate([s], [rng.randint(0, int(mgr.seq_lens([s])[0]))])
            elif live:
                s = live.pop(rng.randrange(len(live)))
                mgr.release([s])
        except PoolExhausted:
            assert frozen(mgr) == before
        except ValueError as err:
            assert "left the window" in str(err)
            assert frozen(mgr) == before
        gaps += sum(t.count(N) for t in mgr._table)
    assert gaps > 0  # the windows were exercised
