"""Exact outcomes of the engine block keys: keyed ``admit``, ``lookup``, ``set_keys`` and block
events (``docs/design.md``, "Engine keys, lookups, events, one-request calls").

Every test runs against both implementations, the kernels (``kvnumba.BlockManager``) and the
pure-Python model (``kvnumba.reference.ReferenceBlockManager``), and asserts numbers derived by
hand from the deterministic policies of ``docs/design.md`` (LIFO free stack, release tail block
first, eviction from the LRU head). Only public calls and the documented introspection are
used, plus one small accessor per implementation for the LRU order, the free stack, the prefix
table and a state snapshot (``Probe``).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

import kvnumba
from kvnumba.reference import ReferenceBlockManager, ReferencePagePool
from kvnumba.reference._common import _STATE
from kvnumba.results import BlockEvents, LookupResult

STORED, REMOVED = BlockEvents.STORED, BlockEvents.REMOVED
# Words beyond int64 on purpose: a vLLM sha256 hash seen as uint64 words usually has some.
HIGH = 1 << 63


def K(*words0, w3=0):
    """Keys ``[[w0, 0, 0, w3], ...]`` as uint64 rows, one per ``w0``."""
    return np.array([[HIGH + w, 0, 0, w3] for w in words0], dtype=np.uint64).reshape(-1, 4)


class Probe:
    """Read-only access to what the API does not return, per implementation."""

    def __init__(self, mgr):
        self.mgr = mgr
        self.model = isinstance(mgr, ReferenceBlockManager)

    def lru(self) -> list[int]:
        if self.model:
            return self.mgr.lru_blocks()
        from kvnumba._layout import M_LRU_HEAD, NIL

        state, order = self.mgr.state, []
        b = int(state.meta[M_LRU_HEAD])
        while b != NIL:
            order.append(b)
            b = int(state.lru_next[b])
        return order

    def free(self) -> list[int]:
        if self.model:
            return self.mgr.free_blocks()
        from kvnumba.state import free_blocks

        return free_blocks(self.mgr.state)[::-1].tolist()  # bottom to top, as the model

    def payload(self, block: int) -> list[int]:
        if self.model:
            return self.mgr.block_payload(block).tolist()
        return self.mgr.state.tokens[block].tolist()

    def registered(self) -> set[int]:
        """Blocks that are in the prefix table."""
        if self.model:
            return set(self.mgr._prefix.values())
        htab = self.mgr.state.htab
        return set(htab[htab >= 0].tolist())

    def frozen(self):
        """The state a failed call must leave byte-identical (``failed_calls`` is outside it),
        as a comparable value."""
        if self.model:
            state = copy.deepcopy({name: getattr(self.mgr, name) for name in _STATE})
            return state, self.mgr.lru_blocks()  # the counters are in _STATE
        snap = self.mgr.snapshot()
        return [
            (name, a.dtype.str, a.shape, a.tobytes())
            for name, a in zip(snap._fields, snap, strict=True)
        ]


@pytest.fixture(params=["kernels", "model"])
def make(request):
    """``make(num_blocks, block_size, **kw)`` building a manager of the implementation."""
    if request.param == "kernels":
        cls, pool = kvnumba.BlockManager, kvnumba.PagePool
    else:
        cls, pool = ReferenceBlockManager, ReferencePagePool

    def build(num_blocks=8, block_size=2, **kw):
        kw.setdefault("max_seqs", 8)
        kw.setdefault("block_keys", True)
        kw.setdefault("block_events", True)
        return cls(num_blocks, block_size, **kw)

    build.pool = pool  # the page pool class of the same implementation
    return build


def events(mgr) -> list[tuple[int, int, int]]:
    """Drain the events as ``(kind, block, word 0 - HIGH)`` (the other words checked 0 or w3)."""
    ev = mgr.take_events()
    assert isinstance(ev, BlockEvents)
    assert ev.kind.dtype == np.uint8 and ev.block.dtype == np.int32 and ev.key.dtype == np.uint64
    assert ev.key.shape == (len(ev.kind), 4) and len(ev.block) == len(ev.kind)
    return [
        (int(k), int(b), int(key[0]) - HIGH if mgr.block_keys else -1)
        for k, b, key in zip(ev.kind, ev.block, ev.key, strict=True)
    ]


def hits(mgr, tokens, lengths, **kw) -> list[int]:
    result = mgr.lookup(tokens, lengths, **kw)
    assert isinstance(result, LookupResult)
    return result.num_cached_tokens.tolist()


def table(mgr, seq_id) -> list[int]:
    return [b for b in mgr.block_tables([seq_id])[0].tolist() if b >= 0]


# ------------------------------------------------------------------------------ keyed admit
def test_admit_registers_its_keyed_blocks_in_position_order(make):
    mgr = make()
    r = mgr.admit([1, 2, 3, 4, 5], [5], keys=K(10, 11))
    assert r.num_cached_tokens.tolist() == [0]
    assert table(mgr, r.ids[0]) == [0, 1, 2]
    assert events(mgr) == [(STORED, 0, 10), (STORED, 1, 11)]
    assert Probe(mgr).registered() == {0, 1}  # the partial tail has no key
    mgr.check()
    # A second prompt with the same keys hits both (5 tokens: the last one is computed).
    r = mgr.admit([1, 2, 3, 4, 9], [5], keys=K(10, 11))
    assert r.num_cached_tokens.tolist() == [4]
    assert table(mgr, r.ids[0]) == [0, 1, 3]
    assert r.slot_mapping.tolist() == [6]
    assert events(mgr) == []  # hits are not registered again
    s = mgr.stats()
    assert (s.prefix_queries, s.prefix_hits, s.used) == (4, 2, 4)
    mgr.check()


def test_no_token_chain_hashing_in_keyed_mode(make):
    mgr = make()
    (a,) = mgr.admit([1, 2, 3, 4, 5], [5]).ids  # no keys: nothing registered
    assert events(mgr) == [] and Probe(mgr).registered() == set()
    mgr.release([a])
    s = mgr.stats()
    assert (s.cached, s.free) == (0, 8)
    assert mgr.admit([1, 2, 3, 4, 5], [5]).num_cached_tokens.tolist() == [0]
    mgr.check()


def test_last_token_rule_caps_hits(make):
    mgr = make()
    mgr.admit([1, 2, 3, 4], [4], keys=K(1, 2))  # both full blocks keyed (key_counts = 2)
    assert events(mgr) == [(STORED, 0, 1), (STORED, 1, 2)]
    r = mgr.admit([1, 2, 3, 4], [4], keys=K(1, 2))
    assert r.num_cached_tokens.tolist() == [2]  # (4 - 1) // 2 = 1 block
    assert table(mgr, r.ids[0]) == [0, 2]
    # Its block 2 has key 2 too, registered already by block 1: it stays unregistered.
    assert events(mgr) == []
    assert Probe(mgr).registered() == {0, 1}
    mgr.check()


def test_max_hit_blocks_caps_hits_int_and_per_prompt(make):
    mgr = make(16, 2)
    (a,) = mgr.admit([1, 2, 3, 4, 5, 6, 7], [7], keys=K(1, 2, 3)).ids
    events(mgr)
    assert hits(mgr, [1, 2, 3, 4, 5, 6, 7], [7], keys=K(1, 2, 3)) == [6]
    assert hits(mgr, [1, 2, 3, 4, 5, 6, 7], [7], keys=K(1, 2, 3), max_hit_blocks=2) == [4]
    assert hits(mgr, [1, 2, 3, 4, 5, 6, 7], [7], keys=K(1, 2, 3), max_hit_blocks=0) == [0]
    tokens = [1, 2, 3, 4, 5, 6, 7] * 2
    assert hits(mgr, tokens, [7, 7], keys=K(1, 2, 3, 1, 2, 3), max_hit_blocks=[1, 5]) == [2, 6]
    queries = mgr.stats().prefix_queries
    r = mgr.admit(tokens, [7, 7], keys=K(1, 2, 3, 1, 2, 3), max_hit_blocks=[1, 5])
    assert r.num_cached_tokens.tolist() == [2, 6]
    # The capped prompt allocated fresh blocks for positions 1 and 2; their keys 2 and 3 are
    # registered (blocks 1, 2) already, so they stay unregistered: no event.
    assert events(mgr) == []
    assert table(mgr, r.ids[0])[0] == 0 and table(mgr, r.ids[1])[:3] == [0, 1, 2]
    s = mgr.stats()
    # Blocks that could hit: min((7 - 1) // 2, 3 keys, cap) = 1 and 3.
    assert s.prefix_queries - queries == 4
    mgr.release([a, *r.ids.tolist()])
    mgr.check()


def test_key_counts_key_only_the_leading_blocks(make):
    mgr = make(16, 2)
    r = mgr.admit(list(range(10)), [4, 6], keys=K(1, 7, 8), key_counts=[1, 2])
    assert events(mgr) == [(STORED, 0, 1), (STORED, 2, 7), (STORED, 3, 8)]
    assert [table(mgr, i) for i in r.ids] == [[0, 1], [2, 3, 4]]
    assert hits(mgr, [0, 1, 9, 9, 9], [5], keys=K(1, 5), key_counts=[2]) == [2]
    assert hits(mgr, [0, 1, 9, 9, 9], [5], keys=K(1), key_counts=[1]) == [2]
    assert hits(mgr, [0, 1, 9, 9, 9], [5], keys=K(), key_counts=[0]) == [0]
    mgr.check()


def test_a_later_prompt_of_one_admit_hits_an_earlier_ones_blocks(make):
    mgr = make()
    r = mgr.admit([1, 2, 3, 1, 2, 3], [3, 3], keys=K(5, 5), key_counts=[1, 1])
    assert r.num_cached_tokens.tolist() == [0, 2]
    assert [table(mgr, i) for i in r.ids] == [[0, 1], [0, 2]]
    assert events(mgr) == [(STORED, 0, 5)]
    mgr.check()


def test_tokens_none_admits_content_unknown(make):
    mgr = make()
    r = mgr.admit(None, [5], keys=K(1, 2))
    probe = Probe(mgr)
    assert [probe.payload(b) for b in table(mgr, r.ids[0])] == [[-1, -1]] * 3
    assert events(mgr) == [(STORED, 0, 1), (STORED, 1, 2)]
    # Unknown content is never compared: known tokens of any value hit, and so does None.
    assert hits(mgr, [7, 7, 7, 7, 7], [5], keys=K(1, 2)) == [4]
    assert hits(mgr, None, [5], keys=K(1, 2)) == [4]
    assert hits(mgr, None, [5], keys=K(1, 3)) == [2]
    mgr.check()


def test_known_tokens_must_match_when_both_sides_know_them(make):
    mgr = make()
    mgr.admit([1, 2, 3, 4, 5], [5], keys=K(1, 2))
    events(mgr)
    assert hits(mgr, [1, 2, 3, 9, 5], [5], keys=K(1, 2)) == [2]  # block 1 differs
    assert hits(mgr, [9, 2, 3, 4, 5], [5], keys=K(1, 2)) == [0]  # a miss ends the run
    assert hits(mgr, None, [5], keys=K(1, 2)) == [4]
    r = mgr.admit([1, 2, 3, 9, 5], [5], keys=K(1, 2))
    assert r.num_cached_tokens.tolist() == [2]
    # Its own block for position 1 gets key 2, which block 1 holds: not registered.
    assert events(mgr) == [] and Probe(mgr).registered() == {0, 1}
    mgr.check()


@pytest.mark.parametrize("hash_bits", [64, 1, 0])
def test_all_256_bits_are_compared(make, hash_bits):
    """Keys equal in word 0 but not in word 3 are different keys (``_hash_bits`` narrows the
    kernels' table hash, so with 0 or 1 bits every key collides there)."""
    mgr = make(16, 2, _hash_bits=hash_bits)
    mgr.admit([1, 2, 3], [3], keys=K(1, w3=1))
    assert events(mgr) == [(STORED, 0, 1)]
    assert hits(mgr, [1, 2, 3], [3], keys=K(1, w3=2)) == [0]
    assert hits(mgr, [1, 2, 3], [3], keys=K(1, w3=1)) == [2]
    r = mgr.admit([1, 2, 3], [3], keys=K(1, w3=2))
    assert r.num_cached_tokens.tolist() == [0]
    assert table(mgr, r.ids[0]) == [2, 3]
    ev = mgr.take_events()
    assert ev.block.tolist() == [2] and ev.key.tolist() == [[HIGH + 1, 0, 0, 2]]
    assert Probe(mgr).registered() == {0, 2}
    for w1 in range(1, 4):  # more colliding keys, differing in word 1 only
        key = np.array([[HIGH + 1, w1, 0, 2]], dtype=np.uint64)
        mgr.admit([5, 6, 7], [3], keys=key)
        assert hits(mgr, [5, 6, 7], [3], keys=key) == [2]
    assert hits(mgr, [1, 2, 3], [3], keys=K(1, w3=2)) == [2]
    assert hits(mgr, [1, 2, 3], [3], keys=K(1, w3=3)) == [0]
    mgr.check()


@pytest.mark.parametrize("hash_bits", [64, 0])
def test_salts_separate_equal_keys(make, hash_bits):
    mgr = make(_hash_bits=hash_bits)
    mgr.admit([1, 2, 3], [3], keys=K(1), salts=[7])
    assert hits(mgr, [1, 2, 3], [3], keys=K(1)) == [0]
    assert hits(mgr, [1, 2, 3], [3], keys=K(1), salts=[7]) == [2]
    r = mgr.admit([1, 2, 3], [3], keys=K(1))  # salt 0: its own registration
    assert r.num_cached_tokens.tolist() == [0]
    assert events(mgr) == [(STORED, 0, 1), (STORED, 2, 1)]
    assert hits(mgr, [1, 2, 3, 1, 2, 3], [3, 3], keys=K(1, 1), salts=[0, 7]) == [2, 2]
    assert mgr.lookup([1, 2, 3] * 2, [3, 3], keys=K(1, 1), salts=[0, 7]).block_ids.tolist() == [
        [2],
        [0],
    ]
    mgr.check()


def test_on_evict_reports_word_0_of_the_key(make):
    calls = []
    mgr = make(3, 2, on_evict=lambda ids, h, t: calls.append((ids.tolist(), h.tolist())))
    (a,) = mgr.admit([1, 2, 3], [3], keys=K(4)).ids
    mgr.release([a])  # block 1 freed (partial), block 0 cached
    assert Probe(mgr).lru() == [0]
    mgr.admit([5, 6, 7, 8, 9], [5])  # three blocks: free 1 and 2, then evicts block 0
    assert calls == [([0], [HIGH + 4])]
    assert events(mgr) == [(STORED, 0, 4), (REMOVED, 0, 4)]
    mgr.check()


# -------------------------------------------------------------------------------- lookup
def test_lookup_claims_nothing_and_changes_nothing(make):
    mgr = make(8, 2)
    (a,) = mgr.admit([1, 2, 3, 4, 5, 6, 7], [7], keys=K(1, 2, 3)).ids
    (b,) = mgr.admit([1, 2, 8, 8, 9], [5], keys=K(1, 9)).ids
    mgr.release([a])  # blocks 3 (partial) freed, then 2, 1 cached; 0 still held by b
    probe = Probe(mgr)
    assert probe.lru() == [2, 1] and mgr.ref_count(0) == 1
    events(mgr)
    before = probe.frozen()
    result = mgr.lookup([1, 2, 3, 4, 5, 6, 7, 1, 2, 8, 8, 9, 9], [7, 6], keys=K(1, 2, 3, 1, 9, 5))
    assert result.num_cached_tokens.tolist() == [6, 4]
    assert result.block_ids.dtype == np.int32
    assert result.block_ids.tolist() == [[0, 1, 2], [0, 4, -1]]
    assert probe.frozen() == before
    assert events(mgr) == []
    # admit claims exactly what lookup reported, the cached ones leaving the LRU list.
    r = mgr.admit([1, 2, 3, 4, 5, 6, 7], [7], keys=K(1, 2, 3))
    assert r.num_cached_tokens.tolist() == [6] and table(mgr, r.ids[0])[:3] == [0, 1, 2]
    assert probe.lru() == []
    mgr.check()


def test_lookup_of_no_prompts_and_without_hits(make):
    mgr = make()
    empty = mgr.lookup([], [], keys=K())
    assert empty.num_cached_tokens.shape == (0,) and empty.block_ids.shape == (0, 0)
    none = mgr.lookup([1, 2, 3], [3], keys=K(1))
    assert none.num_cached_tokens.tolist() == [0] and none.block_ids.shape == (1, 0)


def test_lookup_validates_as_admit_but_takes_no_slots(make):
    mgr = make(8, 2, max_seqs=2)
    mgr.admit([1, 2, 3], [3], keys=K(1))
    # Three prompts, two free slots: admit would refuse, lookup creates no sequence.
    assert hits(mgr, None, [3, 3, 3], keys=K(1, 1, 2)) == [2, 2, 0]
    assert hits(mgr, None, [3], key_counts=[0]) == [0]  # no keys: zero rows
    with pytest.raises(kvnumba.SequenceTooLong):
        mgr.lookup(None, [mgr.max_seq_len + 1], keys=K(), key_counts=[0])


def test_lookup_in_token_mode_matches_admits_chained_hashes(make):
    mgr = make(block_keys=False)
    (a,) = mgr.admit([1, 2, 3, 4, 5], [5]).ids
    assert hits(mgr, [1, 2, 3, 4, 5], [5]) == [4]
    assert hits(mgr, [1, 2, 3, 4, 5], [5], max_hit_blocks=1) == [2]
    assert hits(mgr, [1, 2, 3, 4, 5], [5], salts=[1]) == [0]
    assert hits(mgr, [1, 2, 9, 4, 5], [5]) == [2]
    assert hits(mgr, [9, 2, 3, 4, 5], [5]) == [0]
    r = mgr.admit([1, 2, 3, 4, 5], [5], max_hit_blocks=1)
    assert r.num_cached_tokens.tolist() == [2]
    mgr.release([a, *r.ids.tolist()])
    mgr.check()


def test_prefix_caching_off_ignores_keys(make):
    mgr = make(prefix_caching=False)
    (a,) = mgr.admit([1, 2, 3], [3], keys=K(1)).ids
    assert events(mgr) == [] and hits(mgr, [1, 2, 3], [3], keys=K(1)) == [0]
    mgr.set_keys([a], [0], [1], K(1))
    assert events(mgr) == []
    mgr.release([a])
    assert mgr.stats().cached == 0
    mgr.check()


# ------------------------------------------------------------------------------ set_keys
def test_set_keys_registers_blocks_filled_by_decode(make):
    mgr = make()
    (a,) = mgr.admit([1, 2, 3], [3], keys=K(1)).ids  # block 0 keyed, block 1 partial
    events(mgr)
    mgr.append([a], [3], [4, 5, 6])  # block 1 full, block 2 full: no keys yet
    assert events(mgr) == [] and hits(mgr, [1, 2, 3, 4, 5, 6, 7], [7], keys=K(1, 2, 3)) == [2]
    assert mgr.set_keys([a], [1], [2], K(2, 3)) == 2  # blocks newly registered
    assert events(mgr) == [(STORED, 1, 2), (STORED, 2, 3)]
    assert hits(mgr, [1, 2, 3, 4, 5, 6, 7], [7], keys=K(1, 2, 3)) == [6]
    assert mgr.set_keys([a], [0], [3], K(1, 2, 3)) == 0  # the same keys again: skipped
    assert events(mgr) == []
    assert mgr.set_keys([a], [3], [0], K()) == 0  # no positions, start at the end: fine
    mgr.release([a])
    assert Probe(mgr).lru() == [2, 1, 0]
    mgr.check()


def test_set_keys_duplicate_key_keeps_the_first_registered(make):
    mgr = make()
    a, b = mgr.new_sequences(2)
    mgr.append([a, b], [2, 2], [1, 2, 1, 2])  # blocks 0 and 1, equal content
    mgr.set_keys([a, b], [0, 0], [1, 1], K(1, 1))
    assert events(mgr) == [(STORED, 0, 1)]
    assert Probe(mgr).registered() == {0}
    # Block 1 holds key 1 unregistered: the same key is skipped, another one is refused.
    mgr.set_keys([b], [0], [1], K(1))
    with pytest.raises(ValueError):
        mgr.set_keys([b], [0], [1], K(2))
    mgr.release([b, a])
    s = mgr.stats()
    assert (s.cached, Probe(mgr).lru()) == (1, [0])
    assert Probe(mgr).free()[-1] == 1  # the unregistered duplicate was freed
    mgr.check()


def test_set_keys_on_a_block_shared_by_a_fork(make):
    mgr = make()
    (a,) = mgr.admit([1, 2, 3], [3]).ids
    (c,) = mgr.fork([a])[0]
    mgr.set_keys([a, c], [0, 0], [1, 1], K(1, 1))  # one block, the same key twice: once
    assert events(mgr) == [(STORED, 0, 1)]
    before = Probe(mgr).frozen()
    with pytest.raises(ValueError):  # one block, two keys in one call: refused as a whole
        mgr.set_keys([a, c], [0, 0], [1, 1], K(1, 2))
    assert Probe(mgr).frozen() == before
    mgr.check()


BAD_SET_KEYS = [
    ("partial-block", lambda a, b: ([a], [2], [1], K(1)), ValueError),
    ("past-the-end", lambda a, b: ([a], [0], [3], K(1, 2, 3)), ValueError),
    ("negative-start", lambda a, b: ([a], [-1], [1], K(1)), ValueError),
    ("negative-count", lambda a, b: ([a], [0], [-1], K()), ValueError),
    ("start-past-the-end", lambda a, b: ([a], [3], [0], K()), ValueError),
    ("rows-mismatch", lambda a, b: ([a], [0], [1], K(1, 2)), ValueError),
    ("lengths-mismatch", lambda a, b: ([a, b], [0], [1, 1], K(1, 2)), ValueError),
    ("duplicate-ids", lambda a, b: ([a, a], [0, 0], [1, 1], K(1, 1)), ValueError),
    ("keys-3-words", lambda a, b: ([a], [0], [1], [[1, 2, 3]]), ValueError),
    ("keys-1-d", lambda a, b: ([a], [0], [1], [1, 2, 3, 4]), ValueError),
    ("keys-float", lambda a, b: ([a], [0], [1], np.ones((1, 4))), TypeError),
    ("keys-bool", lambda a, b: ([a], [0], [1], np.ones((1, 4), bool)), TypeError),
    ("keys-negative", lambda a, b: ([a], [0], [1], [[-1, 0, 0, 0]]), ValueError),
    # An int beyond the range: ValueError in the model; TypeError is index_array's convention.
    (
        "keys-beyond-uint64",
        lambda a, b: ([a], [0], [1], [[1 << 64, 0, 0, 0]]),
        (TypeError, ValueError),
    ),
    ("starts-float", lambda a, b: ([a], [0.0], [1], K(1)), TypeError),
    ("other-key", lambda a, b: ([b], [0], [1], K(9)), ValueError),
    ("unknown-id", lambda a, b: ([a + 12345], [0], [1], K(1)), kvnumba.InvalidSequence),
]


@pytest.mark.parametrize(("name", "args", "error"), BAD_SET_KEYS, ids=[t[0] for t in BAD_SET_KEYS])
def test_bad_set_keys_raise_and_change_nothing(make, name, args, error):
    mgr = make()
    (a,) = mgr.admit([1, 2, 3, 4, 5], [5]).ids  # 2 full blocks, no keys
    (b,) = mgr.admit([6, 7, 8], [3], keys=K(8)).ids  # block 3 keyed
    events(mgr)
    probe = Probe(mgr)
    before = probe.frozen()
    with pytest.raises(error):
        mgr.set_keys(*args(int(a), int(b)))
    assert probe.frozen() == before
    assert events(mgr) == []
    mgr.check()


def test_set_keys_giving_one_block_two_keys_in_one_call_is_refused(make):
    """Rows are applied in order: the second finds the block keyed by the first, with another
    key: a ValueError, and the call as a whole changes nothing (validated before any write)."""
    mgr = make()
    (a,) = mgr.admit([1, 2, 3], [3]).ids
    (c,) = mgr.fork([a])[0]
    events(mgr)
    before = Probe(mgr).frozen()
    with pytest.raises(ValueError):
        mgr.set_keys([a, c], [0, 0], [1, 1], K(1, 2))
    assert Probe(mgr).frozen() == before
    assert events(mgr) == []
    mgr.check()


def test_set_keys_of_a_released_id_and_in_token_mode(make):
    mgr = make()
    a, b = mgr.new_sequences(2)
    mgr.release([a])
    with pytest.raises(kvnumba.SequenceReleased):
        mgr.set_keys([b, a], [0, 0], [0, 0], K())
    token_mode = make(block_keys=False)
    (c,) = token_mode.admit([1, 2, 3], [3]).ids
    with pytest.raises(ValueError):
        token_mode.set_keys([c], [0], [1], K(1))


def test_keys_may_be_python_ints_beyond_int64(make):
    mgr = make()
    mgr.admit([1, 2, 3], [3], keys=[[(1 << 64) - 1, 1 << 63, 5, 0]])
    ev = mgr.take_events()
    assert ev.key.tolist() == [[(1 << 64) - 1, 1 << 63, 5, 0]]
    assert hits(mgr, [1, 2, 3], [3], keys=np.array([[2**64 - 1, 2**63, 5, 0]], np.uint64)) == [2]
    assert hits(mgr, [1, 2, 3], [3], keys=np.array([[7, 0, 0, 0]], np.int64)) == [0]


# -------------------------------------------------------------------------------- events
def test_event_order_within_one_multi_prompt_admit(make):
    mgr = make(4, 2)
    (a,) = mgr.admit([1, 2, 3, 4], [4], keys=K(1, 2)).ids
    mgr.release([a])  # tail first: LRU 1, 0
    assert Probe(mgr).lru() == [1, 0] and Probe(mgr).free() == [3, 2]
    assert events(mgr) == [(STORED, 0, 1), (STORED, 1, 2)]
    # Prompt 1 takes free blocks 2, 3; prompt 2 hits block 0 (capped at 1 block), then needs
    # one block: evicts block 1 (LRU head) and registers it under key 7.
    r = mgr.admit([5, 6, 7, 8, 1, 2, 9, 9], [4, 4], keys=K(5, 6, 1, 7), key_counts=[2, 2])
    assert r.num_cached_tokens.tolist() == [0, 2]
    assert [table(mgr, i) for i in r.ids] == [[2, 3], [0, 1]]
    assert events(mgr) == [
        (STORED, 2, 5),
        (STORED, 3, 6),
        (REMOVED, 1, 2),
        (STORED, 1, 7),
    ]
    mgr.check()


def test_events_of_a_failed_admit_are_rolled_back(make):
    mgr = make(4, 2)
    (a,) = mgr.admit([1, 2, 3, 4], [4], keys=K(1, 2)).ids
    mgr.release([a])
    events(mgr)
    before = Probe(mgr).frozen()
    with pytest.raises(kvnumba.PoolExhausted):
        # Prompt 1 evicts and registers, prompt 2 does not fit: all undone.
        mgr.admit([5, 6, 7, 8, 9, 9, 9, 9, 9, 9], [6, 4], keys=K(5, 6, 7, 8, 9))
    assert Probe(mgr).frozen() == before
    assert events(mgr) == []
    r = mgr.admit([5, 6, 7, 8, 9, 9, 9, 9, 9, 9], [6, 4], keys=K(5, 6, 7, 8, 9), atomic=False)
    assert r.ok.tolist() == [True, False]
    # Prompt 1 allocates all its blocks (evicting block 1), then registers its keys.
    assert events(mgr) == [
        (REMOVED, 1, 2),
        (STORED, 2, 5),
        (STORED, 3, 6),
        (STORED, 1, 7),
    ]
    mgr.check()


def test_evict_and_truncate_emit_removals(make):
    mgr = make(8, 2)
    (a,) = mgr.admit([1, 2, 3, 4, 5], [5], keys=K(1, 2)).ids
    (b,) = mgr.admit([6, 7, 8, 9], [4], keys=K(3, 4)).ids
    events(mgr)
    mgr.release([a])  # 2 freed, 1 then 0 cached
    assert mgr.evict([0, 2]) == 1
    assert events(mgr) == [(REMOVED, 0, 1)]
    mgr.truncate([b], [3])  # block 4 (key 4), held by b alone, is cut: unregistered
    assert events(mgr) == [(REMOVED, 4, 4)]
    assert Probe(mgr).lru() == [1] and Probe(mgr).registered() == {1, 3}
    mgr.check()


def test_truncate_into_a_shared_keyed_block_keeps_it_registered(make):
    mgr = make(8, 2)
    (a,) = mgr.admit([1, 2, 3, 4], [4], keys=K(1, 2)).ids
    (c,) = mgr.fork([a])[0]
    events(mgr)
    mgr.truncate([c], [3])  # block 1 is shared: intact and registered
    assert events(mgr) == []
    assert hits(mgr, [1, 2, 3, 4, 5], [5], keys=K(1, 2)) == [4]
    mgr.check()


def test_reset_prefix_cache_emits_every_removal(make):
    mgr = make(8, 2)
    (a,) = mgr.admit([1, 2, 3, 4], [4], keys=K(1, 2)).ids
    (b,) = mgr.admit([5, 6, 7], [3], keys=K(3)).ids
    (c,) = mgr.admit([1, 2, 9, 9], [4], keys=K(1, 2), max_hit_blocks=0).ids  # duplicates
    assert table(mgr, c) == [4, 5]
    mgr.release([a])  # LRU 1, 0
    events(mgr)
    assert mgr.reset_prefix_cache() == 2
    # Cached blocks from the LRU head, then the registered blocks of live sequences by slot;
    # c's blocks hold keys but are not registered: no event.
    assert events(mgr) == [(REMOVED, 1, 2), (REMOVED, 0, 1), (REMOVED, 2, 3)]
    assert Probe(mgr).registered() == set()
    assert hits(mgr, [1, 2, 3, 4, 5, 6, 7], [7], keys=K(1, 2, 3)) == [0]
    assert hits(mgr, [5, 6, 7], [3], keys=K(3)) == [0]
    mgr.release([b, c])
    assert mgr.stats().cached == 0
    mgr.check()


def test_trim_and_sibling_reclaim_on_a_page_pool_emit_removals(make):
    pool = make.pool(2)
    mgr = make(4, 1, page_pool=pool, blocks_per_page=2)
    (a,) = mgr.admit([5, 6, 7], [3], keys=K(1, 2, 3)).ids  # blocks 0, 1 (page 0), 2 (page 1)
    mgr.release([a])  # LRU 2, 1, 0: page 1 cache-only first, then page 0
    assert events(mgr) == [(STORED, 0, 1), (STORED, 1, 2), (STORED, 2, 3)]
    assert mgr.trim() == 2  # page 1 first, then page 0's blocks in ascending order
    assert events(mgr) == [(REMOVED, 2, 3), (REMOVED, 0, 1), (REMOVED, 1, 2)]
    # A sibling's call takes a cache-only page: the owner records the removals.
    (b,) = mgr.admit([5, 6], [2], keys=K(1, 2)).ids
    mgr.release([b])  # page 0 cache-only again
    events(mgr)
    sibling = make(4, 1, page_pool=pool, blocks_per_page=2)
    sibling.admit([9, 9, 9], [3])  # needs both pages: reclaims page 0 from mgr
    assert events(mgr) == [(REMOVED, 0, 1), (REMOVED, 1, 2)]
    assert events(sibling) == []
    mgr.check()
    sibling.check()


def test_without_block_events_nothing_is_recorded(make):
    mgr = make(block_events=False)
    (a,) = mgr.admit([1, 2, 3], [3], keys=K(1)).ids
    mgr.release([a])
    mgr.reset_prefix_cache()
    ev = mgr.take_events()
    assert ev.kind.shape == (0,) and ev.block.shape == (0,) and ev.key.shape == (0, 4)


def test_events_in_token_mode_name_the_blocks(make):
    mgr = make(4, 2, block_keys=False)
    (a,) = mgr.admit([1, 2, 3, 4, 5], [5]).ids
    mgr.release([a])
    mgr.admit([9, 9, 9, 9, 9, 9, 9], [7])
    ev = mgr.take_events()
    # Token mode registers each block when it fills: 0, 1; then the second prompt fills free
    # blocks 2 and 3, evicts 1 (the LRU head) and fills it, and evicts 0 for its last token.
    assert ev.kind.tolist() == [STORED] * 4 + [REMOVED, STORED, REMOVED]
    assert ev.block.tolist() == [0, 1, 2, 3, 1, 1, 0]
    assert not ev.key[:, 1:].any()
    mgr.check()


# ---------------------------------------------------------------------------- bad input
BAD_ADMITS = [
    ("keys-float", dict(keys=np.ones((2, 4))), TypeError),
    ("keys-bool", dict(keys=np.ones((2, 4), bool)), TypeError),
    ("keys-3-words", dict(keys=np.ones((2, 3), np.uint64)), ValueError),
    ("keys-3-d", dict(keys=np.ones((1, 2, 4), np.uint64)), ValueError),
    ("keys-negative", dict(keys=np.full((2, 4), -1)), ValueError),
    ("keys-too-many", dict(keys=K(1, 2, 3)), ValueError),
    ("keys-too-few", dict(keys=K(1)), ValueError),
    ("key-counts-too-big", dict(keys=K(1, 2, 3), key_counts=[3]), ValueError),
    ("key-counts-negative", dict(keys=K(), key_counts=[-1]), ValueError),
    ("key-counts-sum", dict(keys=K(1, 2), key_counts=[1]), ValueError),
    ("key-counts-length", dict(keys=K(1, 2), key_counts=[1, 1]), ValueError),
    ("key-counts-float", dict(keys=K(1, 2), key_counts=[2.0]), TypeError),
    ("key-counts-without-keys", dict(key_counts=[1]), ValueError),
    ("max-hit-negative", dict(keys=K(1, 2), max_hit_blocks=-1), ValueError),
    ("max-hit-negative-entry", dict(keys=K(1, 2), max_hit_blocks=[-1]), ValueError),
    ("max-hit-length", dict(keys=K(1, 2), max_hit_blocks=[1, 1]), ValueError),
    ("max-hit-float", dict(keys=K(1, 2), max_hit_blocks=1.5), TypeError),
    ("max-hit-bool", dict(keys=K(1, 2), max_hit_blocks=True), TypeError),
]


@pytest.mark.parametrize("call", ["admit", "lookup"])
@pytest.mark.parametrize(("name", "kw", "error"), BAD_ADMITS, ids=[t[0] for t in BAD_ADMITS])
def test_bad_keyed_input_raises_and_changes_nothing(make, call, name, kw, error):
    mgr = make()
    (a,) = mgr.admit([1, 2, 3, 4], [4], keys=K(1, 2)).ids
    mgr.release([a])
    events(mgr)
    probe = Probe(mgr)
    before = probe.frozen()
    with pytest.raises(error):
        getattr(mgr, call)([1, 2, 3, 4, 5], [5], **kw)
    assert probe.frozen() == before
    assert events(mgr) == []
    mgr.check()


@pytest.mark.parametrize("call", ["admit", "lookup"])
def test_keys_and_tokens_none_need_block_keys(make, call):
    mgr = make(block_keys=False)
    (a,) = mgr.admit([1, 2, 3, 4], [4]).ids
    mgr.release([a])
    probe = Probe(mgr)
    before = probe.frozen()
    for kw in (dict(keys=K(1, 2)), dict(keys=K(), key_counts=[0])):
        with pytest.raises(ValueError):
            getattr(mgr, call)([1, 2, 3, 4, 5], [5], **kw)
    with pytest.raises(ValueError):
        getattr(mgr, call)(None, [5])
    assert probe.frozen() == before
    mgr.check()


def test_tokens_none_with_keys_still_validates_lengths(make):
    mgr = make()
    with pytest.raises(ValueError):
        mgr.admit(None, [0])
    with pytest.raises(ValueError):
        mgr.admit(None, [4, 3], keys=K(1, 2))  # 3 full blocks, 2 keys
    with pytest.raises(kvnumba.SequenceTooLong):
        mgr.admit(None, [mgr.max_seq_len + 1])
    mgr.check()


# ---------------------------------------------------------------------- one-request calls
# The one-request forms (``admit_one``, ``lookup_one``): the prompt's keys are its first
# ``len(keys)`` full blocks. The model answers them with its batched calls.
def admit_one(mgr, tokens=None, *, length=None, salt=0, keys=None, max_hit_blocks=None):
    return mgr.admit_one(tokens, length=length, salt=salt, keys=keys, max_hit_blocks=max_hit_blocks)


def lookup_one(mgr, *, length, salt=0, keys, max_hit_blocks=None) -> list[int]:
    return mgr.lookup_one(
        length=length, salt=salt, keys=keys, max_hit_blocks=max_hit_blocks
    ).tolist()


def test_admit_one_and_lookup_one_with_fewer_keys_than_blocks(make):
    mgr = make(8, 2)
    a, cached = admit_one(mgr, length=5, keys=K(1))  # 2 full blocks, 1 key
    assert cached == 0 and table(mgr, a) == [0, 1, 2]
    assert events(mgr) == [(STORED, 0, 1)]
    assert lookup_one(mgr, length=5, keys=K(1)) == [0]
    assert lookup_one(mgr, length=5, keys=K(1), max_hit_blocks=0) == []
    with pytest.raises(kvnumba.SequenceTooLong):
        lookup_one(mgr, length=mgr.max_seq_len + 1, keys=K(1))
    b, cached = admit_one(mgr, [7, 7, 7, 7, 7], keys=K(1))  # token ids in keyed mode
    assert cached == 2 and table(mgr, b) == [0, 3, 4]
    mgr.check()


def test_admit_one_with_fewer_keys_that_does_not_fit_is_pool_exhausted(make):
    mgr = make(2, 2, max_seq_len=8)
    probe = Probe(mgr)
    before = probe.frozen()
    with pytest.raises(kvnumba.PoolExhausted) as info:
        admit_one(mgr, length=5, keys=K(1))
    assert (info.value.needed, info.value.available) == (3, 2)
    assert probe.frozen() == before and events(mgr) == []


def test_admit_one_with_fewer_keys_on_a_page_pool(make):
    mgr = make(4, 2, page_pool=make.pool(4), blocks_per_page=2)
    a, cached = admit_one(mgr, length=5, keys=K(1))
    assert cached == 0 and table(mgr, a) == [0, 1, 2]
    b, cached = admit_one(mgr, length=3, keys=K(1))
    assert cached == 2 and table(mgr, b) == [0, 3]
    assert lookup_one(mgr, length=5, keys=K(1)) == [0]
    assert events(mgr) == [(STORED, 0, 1)]
    mgr.check()
