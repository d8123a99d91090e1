"""Focused tests of the pure-Python model ``kvnumba.reference`` (the oracle of the kernels).

Every test asserts concrete numbers derived by hand from ``docs/design.md``.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvnumba.errors import (
    InvalidGeometry,
    InvalidSequence,
    InvariantViolation,
    PoolExhausted,
    SequenceReleased,
    SequenceTooLong,
    TooManySequences,
)
from kvnumba.ids import make_id
from kvnumba.reference import ReferenceBlockManager


def sid(mgr, slot, generation=1):
    """The id of ``slot`` at ``generation`` in ``mgr`` (``docs/design.md``, sequence ids)."""
    return make_id(mgr.id_tag, generation, slot, mgr.max_seqs)


def make(num_blocks=16, block_size=4, **kw):
    return ReferenceBlockManager(num_blocks, block_size, **kw)


class Evictions:
    """Records every ``on_evict`` call."""

    def __init__(self):
        self.calls = []

    def __call__(self, ids, hashes, tokens):
        assert ids.dtype == np.int64 and hashes.dtype == np.uint64 and tokens.dtype == np.int64
        self.calls.append((ids.tolist(), hashes.tolist(), tokens.tolist()))


def fill(mgr, n_tokens, first=0):
    """A new sequence holding tokens ``first .. first + n_tokens - 1``."""
    (sid,) = mgr.new_sequences(1)
    mgr.append([sid], [n_tokens], np.arange(first, first + n_tokens))
    return int(sid)


# ---------------------------------------------------------------- construction and ids


def test_geometry_defaults_and_errors():
    mgr = make(16, 4)
    assert (mgr.num_blocks, mgr.block_size, mgr.max_seqs, mgr.max_seq_len) == (16, 4, 1024, 64)
    assert make(10_000, 16).max_seq_len == 32768
    for kw in ({"num_blocks": 0}, {"block_size": 0}, {"max_seqs": 0}, {"max_seq_len": 0}):
        args = {"num_blocks": 4, "block_size": 4, **kw}
        with pytest.raises(InvalidGeometry):
            ReferenceBlockManager(args.pop("num_blocks"), args.pop("block_size"), **args)
    assert issubclass(InvalidGeometry, ValueError)


def test_ids_are_generation_and_slot_and_never_reused():
    mgr = make(max_seqs=2)
    ids = mgr.new_sequences(2)
    assert ids.dtype == np.int64 and ids.tolist() == [sid(mgr, 0), sid(mgr, 1)]
    mgr.release([ids[0]])
    (again,) = mgr.new_sequences(1)
    assert again == sid(mgr, 0, 2)  # slot 0 popped again, generation 2
    with pytest.raises(SequenceReleased):
        mgr.seq_lens([ids[0]])
    with pytest.raises(InvalidSequence) as err:
        mgr.seq_lens([sid(mgr, 0, 3)])  # a generation not issued yet: unknown
    assert not isinstance(err.value, SequenceReleased)
    another = make_id(mgr.id_tag % 65535 + 1, 1, 0, mgr.max_seqs)  # another manager's tag
    for bad in (5, another, -1):
        with pytest.raises(InvalidSequence):
            mgr.seq_lens([bad])
    with pytest.raises(TooManySequences) as err:
        mgr.new_sequences(1)
    assert (err.value.requested, err.value.available, err.value.max_seqs) == (1, 0, 2)


# ---------------------------------------------------------------- append, fork, COW


def test_append_slot_mapping_and_fresh_pool_order():
    mgr = make(8, 4)
    a, b = mgr.new_sequences(2).tolist()
    res = mgr.append([a, b], [5, 3], np.arange(8))
    # a takes blocks 0, 1; b takes block 2
    assert res.slot_mapping.tolist() == [0, 1, 2, 3, 4, 8, 9, 10]
    assert res.ok.tolist() == [True, True] and res.cow_src.size == 0
    assert mgr.block_tables([a, b]).tolist() == [[0, 1], [2, -1]]
    assert mgr.block_tables([a, b]).dtype == np.int32
    assert mgr.seq_lens([a, b]).tolist() == [5, 3]
    assert mgr.seq_tokens(a).tolist() == [0, 1, 2, 3, 4]
    assert mgr.free_blocks() == [7, 6, 5, 4, 3]
    res = mgr.append([a], [4], [9, 9, 9, 9])  # 1 token fills block 1 in place, then block 3
    assert res.slot_mapping.tolist() == [5, 6, 7, 12]
    mgr.check()


def test_fork_shares_blocks_three_allocations_instead_of_fifteen():
    forked = make(32, 4)
    parent = fill(forked, 10)
    children = forked.fork([parent], n=4)
    assert children.shape == (1, 4)
    assert children.tolist() == [[sid(forked, 1), sid(forked, 2), sid(forked, 3), sid(forked, 4)]]
    every = [parent, *children.ravel().tolist()]
    assert forked.block_tables(every).tolist() == [[0, 1, 2]] * 5
    assert forked.seq_lens(every).tolist() == [10] * 5
    assert [forked.ref_count(b) for b in range(3)] == [5, 5, 5]
    assert forked.stats().allocations == 3 and forked.stats().used == 3

    separate = make(32, 4)
    for _ in range(5):
        fill(separate, 10)
    assert separate.stats().allocations == 15 and separate.stats().used == 15
    forked.check()
    separate.check()


def test_cow_of_shared_partial_tail():
    mgr = make(8, 4)
    parent = fill(mgr, 10)  # blocks 0, 1, 2; block 2 holds [8, 9]
    (child,) = mgr.fork([parent])[0]
    res = mgr.append([child], [1], [99])
    assert res.cow_src.tolist() == [2] and res.cow_dst.tolist() == [3]
    assert res.cow_src.dtype == np.int32 and res.cow_dst.dtype == np.int32
    assert res.slot_mapping.tolist() == [3 * 4 + 2]
    assert mgr.block_payload(2).tolist() == [8, 9, -1, -1]  # parent's payload untouched
    assert mgr.block_payload(3).tolist() == [8, 9, 99, -1]
    assert mgr.block_tables([parent, child]).tolist() == [[0, 1, 2], [0, 1, 3]]
    assert [mgr.ref_count(b) for b in range(4)] == [2, 2, 1, 1]
    # the last holder of the old tail writes in place
    res = mgr.append([parent], [1], [7])
    assert res.cow_src.size == 0 and res.slot_mapping.tolist() == [2 * 4 + 2]
    assert mgr.stats().cow_copies == 1 and mgr.stats().allocations == 4
    mgr.check()


def test_full_shared_tail_is_never_copied():
    mgr = make(8, 4)
    parent = fill(mgr, 8)
    (child,) = mgr.fork([parent])[0]
    res = mgr.append([child], [1], [5])
    assert res.cow_src.size == 0 and res.slot_mapping.tolist() == [2 * 4]
    assert mgr.block_tables([child]).tolist() == [[0, 1, 2]]


def test_atomic_append_need_counts_cow_once_per_extra_holder():
    # parent and child share a partial tail (ref 2): the first appender copies, the second
    # is then the last holder and writes in place, so the call needs exactly 1 block.
    mgr = make(4, 4)
    parent = fill(mgr, 10)
    (child,) = mgr.fork([parent])[0]
    assert mgr.can_append([parent, child], [1, 1])
    res = mgr.append([parent, child], [1, 1], [1, 2])
    assert res.cow_src.tolist() == [2] and res.cow_dst.tolist() == [3]
    assert res.slot_mapping.tolist() == [3 * 4 + 2, 2 * 4 + 2]
    assert mgr.stats().free == 0
    with pytest.raises(PoolExhausted) as err:
        mgr.append([parent, child], [2, 3], [1, 1, 1, 1, 1])  # 1 + 1 new blocks, none left
    assert (err.value.needed, err.value.available) == (2, 0)
    assert mgr.stats().failed_calls == 1


def test_non_atomic_append_serves_input_order():
    def run(order):
        mgr = make(4, 4)
        seqs = dict(zip("abc", mgr.new_sequences(3).tolist(), strict=True))
        counts = {"a": 8, "b": 4, "c": 8}
        res = mgr.append([seqs[k] for k in order], [counts[k] for k in order], atomic=False)
        return mgr, res

    mgr, res = run("abc")  # a: blocks 0,1; b: block 2; c needs 2, 1 left
    assert res.ok.tolist() == [True, True, False]
    assert res.slot_mapping.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11] + [-1] * 8
    assert mgr.stats().failed_calls == 1 and mgr.stats().allocations == 3
    assert mgr.seq_lens(mgr.new_sequences(0)).size == 0

    mgr, res = run("cba")  # c: blocks 0,1; b: block 2; a fails
    assert res.ok.tolist() == [True, True, False]
    assert res.slot_mapping[:12].tolist() == list(range(12))
    mgr.check()

    mgr, res = run("acb")  # a: 0,1; c: 2,3; b fails although it is smaller
    assert res.ok.tolist() == [True, True, False]
    assert res.slot_mapping.tolist() == list(range(16)) + [-1] * 4


def test_atomic_append_failure_changes_nothing():
    mgr = make(2, 4, max_seq_len=100)
    a = fill(mgr, 5)
    before = (mgr.free_blocks(), mgr.lru_blocks(), mgr.stats().allocations)
    assert not mgr.can_append([a], [4])
    with pytest.raises(PoolExhausted) as err:
        mgr.append([a], [4], [1, 2, 3, 4])
    assert (err.value.needed, err.value.available) == (1, 0)
    assert (mgr.free_blocks(), mgr.lru_blocks(), mgr.stats().allocations) == before
    assert mgr.seq_lens([a]).tolist() == [5]
    assert mgr.stats().failed_calls == 1


# ---------------------------------------------------------------- release, LRU, eviction


def test_release_tail_first_so_lru_evicts_tail_before_prefix():
    ev = Evictions()
    mgr = make(3, 4, on_evict=ev)
    a = fill(mgr, 12)  # blocks 0, 1, 2, all full and registered
    mgr.release([a])
    assert mgr.lru_blocks() == [2, 1, 0] and mgr.free_blocks() == []
    assert mgr.stats() == mgr.stats().__class__(
        used=0,
        cached=3,
        free=0,
        allocations=3,
        evictions=0,
        cow_copies=0,
        prefix_queries=0,
        prefix_hits=0,
        mapped_pages=0,
        failed_calls=0,
    )
    b = fill(mgr, 4, first=100)
    assert mgr.block_tables([b]).tolist() == [[2]]  # the tail block went first
    assert len(ev.calls) == 1 and ev.calls[0][0] == [2] and ev.calls[0][2] == [[8, 9, 10, 11]]
    assert mgr.lru_blocks() == [1, 0] and mgr.stats().evictions == 1
    mgr.release([b])
    assert mgr.lru_blocks() == [1, 0, 2]
    # the prefix survived: a prompt sharing it hits blocks 0 and 1, then evicts block 2
    res = mgr.admit(np.arange(9), [9])
    assert res.num_cached_tokens.tolist() == [8] and res.slot_mapping.tolist() == [2 * 4]
    assert mgr.block_tables(res.ids).tolist() == [[0, 1, 2]]
    assert [c[0] for c in ev.calls] == [[2], [2]] and ev.calls[1][2] == [[100, 101, 102, 103]]
    mgr.check()


def test_release_frees_partial_blocks_on_top_of_the_stack():
    mgr = make(8, 4)
    a = fill(mgr, 6)  # block 0 full (registered), block 1 partial
    b = fill(mgr, 2)  # block 2 partial
    mgr.release([b, a])
    assert mgr.free_blocks() == [7, 6, 5, 4, 3, 2, 1] and mgr.lru_blocks() == [0]
    assert mgr.block_payload(1).tolist() == [-1] * 4
    (c,) = mgr.new_sequences(1)
    assert mgr.append([c], [1]).slot_mapping.tolist() == [1 * 4]  # last freed, first reused


def test_on_evict_once_per_call_with_every_eviction():
    ev = Evictions()
    mgr = make(4, 2, on_evict=ev)
    a = fill(mgr, 8)
    mgr.release([a])
    assert mgr.lru_blocks() == [3, 2, 1, 0]
    fill(mgr, 5, first=50)  # 3 blocks: evicts 3, 2, 1 in one call
    assert len(ev.calls) == 1
    ids, hashes, tokens = ev.calls[0]
    assert ids == [3, 2, 1] and tokens == [[6, 7], [4, 5], [2, 3]]
    assert len(set(hashes)) == 3
    assert mgr.stats().evictions == 3 and mgr.stats().allocations == 7


# ---------------------------------------------------------------- admit and the prefix cache


def test_admit_reuses_longest_cached_prefix_and_never_across_salts():
    mgr = make(32, 4)
    first = mgr.admit(np.arange(12), [12])  # blocks 0, 1, 2, nothing cached yet
    assert first.num_cached_tokens.tolist() == [0]
    assert first.slot_mapping.tolist() == list(range(12))
    prompt = [*range(8), 50, 51, 52, 53, 54]  # shares blocks 0 and 1, diverges in block 2
    res = mgr.admit(prompt, [13])
    assert res.num_cached_tokens.tolist() == [8]
    assert res.slot_mapping.tolist() == [12, 13, 14, 15, 16]  # tokens 8.. in blocks 3, 4
    assert mgr.block_tables(res.ids).tolist() == [[0, 1, 3, 4]]
    assert [mgr.ref_count(b) for b in range(5)] == [2, 2, 1, 1, 1]
    s = mgr.stats()
    assert (s.prefix_queries, s.prefix_hits, s.allocations) == (2 + 3, 0 + 2, 5)

    salted = mgr.admit(prompt, [13], salts=[7])
    assert salted.num_cached_tokens.tolist() == [0]
    assert mgr.block_tables(salted.ids).tolist() == [[5, 6, 7, 8]]
    again = mgr.admit(prompt, [13], salts=[7])  # same salt: shares the salted blocks
    assert again.num_cached_tokens.tolist() == [12]
    assert mgr.block_tables(again.ids).tolist() == [[5, 6, 7, 9]]
    mgr.check()


def test_admit_leaves_the_last_token_uncached():
    mgr = make(16, 4)
    mgr.admit(np.arange(12), [12])
    res = mgr.admit(np.arange(12), [12])  # at most (12 - 1) // 4 = 2 blocks reused
    assert res.num_cached_tokens.tolist() == [8]
    assert res.slot_mapping.tolist() == [12, 13, 14, 15]  # block 3 duplicates block 2
    mgr.release(res.ids)  # block 3 was not registered (block 2 was first): freed
    assert mgr.free_blocks()[-1] == 3 and mgr.lru_blocks() == []
    one = mgr.admit([0], [1])
    assert one.num_cached_tokens.tolist() == [0] and one.slot_mapping.tolist() == [12]


def test_admit_hits_cached_blocks_and_claims_them_before_allocating():
    mgr = make(3, 4)
    a = fill(mgr, 12)
    mgr.release([a])  # LRU: 2, 1, 0
    # 2 hits (blocks 0, 1, cached), 1 new block: fits since 3 cached - 2 hits >= 1
    res = mgr.admit(np.arange(12), [12])
    assert res.num_cached_tokens.tolist() == [8]
    assert mgr.block_tables(res.ids).tolist() == [[0, 1, 2]]  # evicted block 2, not a hit
    assert mgr.stats().evictions == 1 and mgr.lru_blocks() == []


def test_admit_serves_prompts_in_order_later_reuse_earlier():
    mgr = make(16, 4)
    res = mgr.admit(list(range(9)) * 2, [9, 9])
    assert res.ids.tolist() == [sid(mgr, 0), sid(mgr, 1)]
    assert res.num_cached_tokens.tolist() == [0, 8]
    assert res.slot_mapping.tolist() == list(range(9)) + [12]
    assert mgr.block_tables(res.ids).tolist() == [[0, 1, 2], [0, 1, 3]]


def test_prefix_caching_off_caches_nothing():
    mgr = make(8, 4, prefix_caching=False)
    a = fill(mgr, 8)
    mgr.release([a])
    assert mgr.lru_blocks() == [] and mgr.free_blocks()[-2:] == [1, 0]
    res = mgr.admit(np.arange(9), [9])
    assert res.num_cached_tokens.tolist() == [0]
    assert (mgr.stats().prefix_queries, mgr.stats().prefix_hits) == (0, 0)


def test_content_less_blocks_are_never_cached():
    mgr = make(8, 4)
    (a,) = mgr.new_sequences(1)
    mgr.append([a], [4])  # block 0 without token ids
    mgr.append([a], [4], [1, 2, 3, 4])  # block 1 known, but its parent has no hash
    assert mgr.seq_tokens(a).tolist() == [-1] * 4 + [1, 2, 3, 4]
    mgr.release([a])
    assert mgr.lru_blocks() == [] and mgr.free_blocks()[-2:] == [1, 0]
    assert mgr.stats().cached == 0 and mgr.stats().free == 8
    # a partly content-less block is not cached either
    (b,) = mgr.new_sequences(1)
    mgr.append([b], [2], [1, 2])
    mgr.append([b], [2])
    mgr.release([b])
    assert mgr.lru_blocks() == []


def test_duplicate_full_block_keeps_first_registration():
    mgr = make(8, 4)
    a = fill(mgr, 4)  # block 0 registered
    b = fill(mgr, 4)  # block 1, same content: not registered
    mgr.release([a, b])
    assert mgr.lru_blocks() == [0] and mgr.free_blocks()[-1] == 1
    mgr.check()


def test_atomic_failed_admit_changes_nothing():
    ev = Evictions()
    mgr = make(6, 4, on_evict=ev)
    a = fill(mgr, 8)
    mgr.release([a])  # LRU: 1, 0
    keep = fill(mgr, 8, first=100)  # blocks 2, 3
    before = (mgr.free_blocks(), mgr.lru_blocks(), mgr.stats())
    assert before[:2] == ([5, 4], [1, 0])
    # prompt 1 (9 tokens, 2 hits) takes 1 block; prompt 2 (16 new tokens) needs 4 with 3 left:
    # prompt 1 ran and is rolled back
    with pytest.raises(PoolExhausted) as err:
        mgr.admit([*range(9), *range(200, 216)], [9, 16])
    assert (err.value.needed, err.value.available) == (1 + 4, 4)
    after = (mgr.free_blocks(), mgr.lru_blocks(), mgr.stats())
    assert after[:2] == before[:2]
    assert after[2] == before[2].__class__(**{**vars(before[2]), "failed_calls": 1})
    assert ev.calls == []
    assert mgr.seq_lens([keep]).tolist() == [8]
    assert mgr.new_sequences(1).tolist() == [sid(mgr, 1)]  # the rolled-back slot is untouched
    mgr.check()


def test_atomic_failed_admit_after_evictions_restores_cache():
    ev = Evictions()
    mgr = make(4, 4, on_evict=ev)
    a = fill(mgr, 16)
    mgr.release([a])  # LRU: 3, 2, 1, 0
    with pytest.raises(PoolExhausted) as err:
        mgr.admit(np.arange(100, 124), [8, 16])  # 2 blocks (evicts 3, 2), then 4 > 2
    assert (err.value.needed, err.value.available) == (6, 4)
    assert mgr.lru_blocks() == [3, 2, 1, 0] and ev.calls == []
    assert [mgr.block_payload(b).tolist() for b in (3, 2)] == [[12, 13, 14, 15], [8, 9, 10, 11]]
    assert mgr.stats().evictions == 0 and mgr.stats().allocations == 4
    mgr.check()
    # the same prompts one by one, non-atomic: the first fits, the second does not
    res = mgr.admit(np.arange(100, 124), [8, 16], atomic=False)
    assert res.ok.tolist() == [True, False] and res.ids[1] == -1
    assert res.num_cached_tokens.tolist() == [0, 0]
    assert res.slot_mapping.tolist() == [12, 13, 14, 15, 8, 9, 10, 11] + [-1] * 16
    assert ev.calls == [([3, 2], ev.calls[0][1], [[12, 13, 14, 15], [8, 9, 10, 11]])]
    assert mgr.stats().failed_calls == 2


def test_atomic_admit_snapshots_only_when_the_pool_is_tight(monkeypatch):
    mgr = make(8, 4)
    calls = []
    real = mgr._snapshot
    monkeypatch.setattr(mgr, "_snapshot", lambda: calls.append(1) or real())
    mgr.admit(np.arange(16), [8, 8])  # 4 blocks <= 8 available: cannot fail
    assert calls == []
    mgr.admit(np.arange(16), [8, 8])  # 4 blocks <= 4 available; takes 2 (2 hits)
    assert calls == [] and mgr.stats().free == 2
    res = mgr.admit(np.arange(16), [8, 8])  # 4 blocks > 2 available: snapshot; takes 2
    assert calls == [1] and res.num_cached_tokens.tolist() == [4, 4]
    assert res.slot_mapping.tolist() == list(range(24, 32))  # blocks 6, 7
    assert mgr.stats().free == 0


def test_single_prompt_pool_exhausted_numbers():
    mgr = make(4, 4, max_seq_len=64)
    mgr.admit(np.arange(8), [8])  # blocks 0, 1 live
    with pytest.raises(PoolExhausted) as err:
        mgr.admit(np.arange(17), [17])  # 5 blocks, 2 hits: 3 needed, 2 free
    assert (err.value.needed, err.value.available) == (3, 2)
    assert mgr.stats().prefix_queries == 1  # only the committed first admit counted
    res = mgr.admit(np.arange(13), [13])  # 4 blocks, 2 hits: 2 needed, 2 free
    assert res.num_cached_tokens.tolist() == [8] and mgr.stats().free == 0


# ---------------------------------------------------------------- input validation


def test_bad_input_raises_before_anything_changes():
    mgr = make(4, 4, max_seq_len=8, max_seqs=3)
    a, b, gone = mgr.new_sequences(3).tolist()
    mgr.release([gone])
    bad_calls = [
        (TypeError, lambda: mgr.append([a], [1.0])),
        (TypeError, lambda: mgr.append([a], [True])),
        (TypeError, lambda: mgr.append(np.array([a], dtype=float), [1])),
        (ValueError, lambda: mgr.append([[a]], [[1]])),
        (ValueError, lambda: mgr.append([a], [-1])),
        (ValueError, lambda: mgr.append([a, b], [1])),
        (ValueError, lambda: mgr.append([a, a], [1, 1])),
        (ValueError, lambda: mgr.append([a], [2], [1])),
        (ValueError, lambda: mgr.append([a], [1], [-3])),
        (SequenceTooLong, lambda: mgr.append([a], [9])),
        (ValueError, lambda: mgr.admit([1, 2], [2, 0])),
        (ValueError, lambda: mgr.admit([1, 2], [3])),
        (ValueError, lambda: mgr.admit([1, -2], [2])),
        (ValueError, lambda: mgr.admit([1, 2], [1, 1], salts=[0])),
        (SequenceTooLong, lambda: mgr.admit(np.arange(9), [9])),
        (TooManySequences, lambda: mgr.admit(np.arange(3), [1] * 3, atomic=False)),
        (ValueError, lambda: mgr.fork([a], n=0)),
        (TypeError, lambda: mgr.fork([a], n=1.5)),
        (ValueError, lambda: mgr.release([a, a])),
        (SequenceReleased, lambda: mgr.release([a, gone])),
        (InvalidSequence, lambda: mgr.release([a, sid(mgr, 2, 2)])),
        (InvalidSequence, lambda: mgr.can_append([12345], [1])),
        (TypeError, lambda: mgr.new_sequences(True)),
    ]
    before = (mgr.free_blocks(), mgr.lru_blocks(), mgr.stats(), mgr.seq_lens([a, b]).tolist())
    for exc, call in bad_calls:
        with pytest.raises(exc):
            call()
    assert (mgr.free_blocks(), mgr.lru_blocks(), mgr.stats(), mgr.seq_lens([a, b]).tolist()) == (
        before
    )
    mgr.check()


def test_validation_takes_precedence_over_pool_exhaustion():
    mgr = make(1, 4, max_seq_len=100)
    (a,) = mgr.new_sequences(1)
    with pytest.raises(ValueError):
        mgr.append([a, a], [50, 50])
    with pytest.raises(InvalidSequence):
        mgr.append([a, 99], [50, 1])
    with pytest.raises(SequenceTooLong):
        mgr.append([a], [101])
    with pytest.raises(SequenceTooLong):
        mgr.append([a], [101], atomic=False)
    assert mgr.stats().failed_calls == 0
    with pytest.raises(PoolExhausted) as err:
        mgr.append([a], [50])
    assert (err.value.needed, err.value.available) == (13, 1)


def test_empty_calls_and_lists():
    mgr = make(4, 4)
    assert mgr.new_sequences(0).shape == (0,)
    res = mgr.append([], [])
    assert res.slot_mapping.shape == (0,) and res.ok.shape == (0,)
    assert mgr.block_tables([]).shape == (0, 0)
    assert mgr.fork([], n=3).shape == (0, 3)
    assert mgr.admit([], []).ids.shape == (0,)
    (a,) = mgr.new_sequences(1)
    assert mgr.block_tables([a]).shape == (1, 0)
    assert mgr.append([a], [0]).slot_mapping.size == 0


# ---------------------------------------------------------------- check()


def test_check_names_the_first_inconsistency():
    mgr = make(4, 4)
    a = fill(mgr, 6)
    mgr.check()
    mgr._ref[1] += 1
    with pytest.raises(InvariantViolation, match="block 1"):
        mgr.check()
    mgr._ref[1] -= 1
    mgr._tokens[3][0] = 5  # a free block with stale payload
    with pytest.raises(InvariantViolation, match="free block 3"):
        mgr.check()
    mgr._tokens[3][0] = -1
    mgr.release([a])
    mgr.check()


# ---------------------------------------------------------------- randomized self-consistency


def full_state(mgr):
    """Every piece of model state, deep-copied, LRU order included."""
    return (
        list(mgr._ref),
        [list(row) for row in mgr._tokens],
        list(mgr._key),
        dict(mgr._prefix),
        list(mgr._lru),
        list(mgr._free),
        list(mgr._gen),
        list(mgr._live),
        [list(t) for t in mgr._table],
        list(mgr._len),
        list(mgr._salt),
        list(mgr._slots),
        dict(mgr._counters),
    )


def test_random_operations_keep_invariants_and_failed_calls_change_nothing():
    rng = np.random.default_rng(1234)
    ev = Evictions()
    mgr = make(12, 3, max_seqs=8, max_seq_len=30, on_evict=ev)
    live: list[int] = []
    failures = 0
    for _ in range(600):
        op = rng.integers(5)
        before = full_state(mgr)
        calls_before = len(ev.calls)
        try:
            if op == 0 and len(live) < 8:
                p = int(rng.integers(1, 4))
                lengths = rng.integers(1, 10, size=p)
                toks = rng.integers(0, 3, size=int(lengths.sum()))  # tiny vocabulary: many hits
                res = mgr.admit(
                    toks, lengths, salts=rng.integers(0, 2, size=p), atomic=bool(rng.integers(2))
                )
                live += [int(i) for i in res.ids if i >= 0]
            elif op == 1 and live:
                pick = rng.choice(live, size=min(len(live), 3), replace=False)
                counts = rng.integers(0, 5, size=len(pick))
                with_ids = bool(rng.integers(4))
                toks = rng.integers(0, 3, size=int(counts.sum())) if with_ids else None
                mgr.append(pick, counts, toks, atomic=bool(rng.integers(2)))
            elif op == 2 and live:
                live += mgr.fork([rng.choice(live)], n=1).ravel().tolist()
            elif op == 3 and live:
                victim = int(rng.choice(live))
                mgr.release([victim])
                live.remove(victim)
        except PoolExhausted:
            failures += 1
            assert full_state(mgr) == before
            assert len(ev.calls) == calls_before
        except (SequenceTooLong, TooManySequences):
            assert full_state(mgr) == before
        mgr.check()
        s = mgr.stats()
        assert s.used + s.cached + s.free == 12
        for sid in live:
            assert mgr.seq_lens([sid])[0] == len(mgr.seq_tokens(sid))
    assert failures > 0 and mgr.stats().evictions > 0 and mgr.stats().prefix_hits > 0
    assert mgr.stats().cow_copies > 0
