"""Bad input: every malformed or impossible call raises its typed error and changes nothing.

Every failing call goes through ``assert_unchanged(mgr, fn, exc)`` (see conftest.py), which
asserts that ``mgr.snapshot()`` is byte-identical before and after.
"""

from __future__ import annotations

import numpy as np
import pytest

import kvnumba
from kvnumba import (
    BlockManager,
    InvalidGeometry,
    InvalidPosition,
    InvalidSequence,
    PoolExhausted,
    SequenceReleased,
    SequenceTooLong,
    TooManySequences,
)
from kvnumba.ids import slot_bits


@pytest.fixture
def busy():
    """A small manager with cached blocks, a shared partial tail and a released id.

    Pool: 8 blocks of 4; max_seqs 4; max_seq_len 40. Blocks 0, 1 cached; a (6 tokens) and its
    child c share blocks 2 and 3 (3 partial); 4 blocks free, so 6 are available.
    """
    mgr = BlockManager(8, 4, max_seqs=4, max_seq_len=40)
    mgr.release(mgr.admit(list(range(100, 109)), [9]).ids)
    (a,) = mgr.admit([1, 2, 3, 4, 5, 6], [6]).ids
    (c,) = mgr.fork([a])[0]
    (gone,) = mgr.new_sequences(1)
    mgr.release([gone])
    s = mgr.stats()
    assert (s.used, s.cached, s.free) == (2, 2, 4)
    return mgr, int(a), int(c), int(gone)


# ---------------------------------------------------------------------- array-like arguments
BAD_ARRAYS = [
    ([1.0], TypeError),
    (np.array([1.0]), TypeError),
    ([True], TypeError),
    (np.array([True]), TypeError),
    (np.array([[1]]), ValueError),
    ([[1]], ValueError),
    (1, TypeError),
    (np.int64(1), TypeError),
    ("1", TypeError),
    (["a"], TypeError),
    ([None], TypeError),
    (np.array([2**64 - 1], dtype=np.uint64), ValueError),
]


@pytest.mark.parametrize(("bad", "exc"), BAD_ARRAYS)
def test_bad_array_arguments_raise_and_change_nothing(busy, assert_unchanged, bad, exc):
    mgr, a, c, _ = busy
    calls = [
        lambda: mgr.append(bad, [1]),
        lambda: mgr.append([a], bad),
        lambda: mgr.append([a], [1], bad),
        lambda: mgr.append(bad, [1], atomic=False),
        lambda: mgr.admit(bad, [1]),
        lambda: mgr.admit([1], bad),
        lambda: mgr.admit([1], [1], salts=bad),
        lambda: mgr.admit([1], [1], salts=bad, atomic=False),
        lambda: mgr.fork(bad),
        lambda: mgr.release(bad),
        lambda: mgr.block_tables(bad),
        lambda: mgr.seq_lens(bad),
        lambda: mgr.can_append(bad, [1]),
        lambda: mgr.can_append([a], bad),
    ]
    for call in calls:
        assert_unchanged(mgr, call, exc)


def test_array_likes_are_accepted(busy):
    mgr, a, c, _ = busy
    r = mgr.append((a,), (1,), (7,))  # a copies its shared partial tail 3 into block 4
    assert (r.cow_src.tolist(), r.cow_dst.tolist()) == ([3], [4])
    assert r.slot_mapping.tolist() == [4 * 4 + 2]
    mgr.check()


def test_lists_tuples_and_any_int_dtype_are_accepted():
    mgr = BlockManager(16, 4)
    ids = mgr.new_sequences(3)
    r = mgr.append(ids.tolist(), [1, 2, 3], [1, 2, 3, 4, 5, 6])
    assert r.slot_mapping.tolist() == [0, 4, 5, 8, 9, 10]
    r = mgr.append(tuple(ids), np.array([1, 1, 1], dtype=np.int32), np.array([7, 8, 9], np.uint8))
    assert r.slot_mapping.tolist() == [1, 6, 11]
    r = mgr.append(ids.astype(np.uint64), np.array([1, 0, 0], dtype=np.int16))
    assert r.slot_mapping.tolist() == [2]
    # Non-contiguous int64 input.
    r = mgr.append(np.repeat(ids, 2)[::2], np.array([1, 9, 1, 9, 1, 9], dtype=np.int64)[::2])
    assert r.slot_mapping.tolist() == [3, 7, 12]
    r = mgr.admit(np.array([1, 2, 3], dtype=np.int8), [3], salts=(0,))
    assert r.ok.tolist() == [True]
    assert mgr.seq_lens(list(ids)).tolist() == [4, 4, 5]
    assert mgr.block_tables(np.asarray(ids, dtype=np.int64)).shape == (3, 2)
    assert mgr.can_append([], []) is True
    assert mgr.append([], []).slot_mapping.shape == (0,)
    mgr.release([])
    assert mgr.fork([]).shape == (0, 1)
    mgr.check()


# ------------------------------------------------------------------------------------- append
def test_negative_counts(busy, assert_unchanged):
    mgr, a, c, _ = busy
    assert_unchanged(mgr, lambda: mgr.append([a], [-1]), ValueError)
    assert_unchanged(mgr, lambda: mgr.append([a, c], [1, -1], atomic=False), ValueError)
    assert_unchanged(mgr, lambda: mgr.can_append([a, c], [1, -1]), ValueError)


def test_duplicate_ids_in_append_and_release(busy, assert_unchanged):
    mgr, a, c, _ = busy
    assert_unchanged(mgr, lambda: mgr.append([a, a], [1, 1]), ValueError)
    assert_unchanged(mgr, lambda: mgr.append([a, c, a], [0, 0, 0], atomic=False), ValueError)
    assert_unchanged(mgr, lambda: mgr.release([a, a]), ValueError)
    assert_unchanged(mgr, lambda: mgr.release([c, a, c]), ValueError)
    assert_unchanged(mgr, lambda: mgr.can_append([a, a], [1, 1]), ValueError)


def test_token_count_mismatch(busy, assert_unchanged):
    mgr, a, c, _ = busy
    assert_unchanged(mgr, lambda: mgr.append([a], [2], [1]), ValueError)
    assert_unchanged(mgr, lambda: mgr.append([a], [2], [1, 2, 3]), ValueError)
    assert_unchanged(mgr, lambda: mgr.append([a, c], [1, 1], [1]), ValueError)
    assert_unchanged(mgr, lambda: mgr.append([a], [0], [1]), ValueError)
    assert_unchanged(mgr, lambda: mgr.append([a, c], [1]), ValueError)  # counts vs ids
    assert_unchanged(mgr, lambda: mgr.append([a], [1, 1]), ValueError)
    assert_unchanged(mgr, lambda: mgr.can_append([a, c], [1]), ValueError)
    assert_unchanged(mgr, lambda: mgr.admit([1, 2, 3], [2]), ValueError)
    assert_unchanged(mgr, lambda: mgr.admit([1, 2, 3], [2, 2]), ValueError)
    assert_unchanged(mgr, lambda: mgr.admit([1, 2], [1, 2], atomic=False), ValueError)


def test_negative_token_ids(busy, assert_unchanged):
    mgr, a, c, _ = busy
    assert_unchanged(mgr, lambda: mgr.append([a], [1], [-1]), ValueError)
    assert_unchanged(mgr, lambda: mgr.append([a, c], [1, 1], [5, -7]), ValueError)
    assert_unchanged(mgr, lambda: mgr.append([a, c], [1, 1], [5, -7], atomic=False), ValueError)
    assert_unchanged(mgr, lambda: mgr.admit([1, -1, 3], [3]), ValueError)
    assert_unchanged(mgr, lambda: mgr.admit([1, 2, -3], [2, 1], atomic=False), ValueError)


# -------------------------------------------------------------------------------------- admit
@pytest.mark.parametrize("lengths", [[0], [3, 0], [-1, 4], [0, 0]])
def test_zero_or_negative_prompt_length(busy, assert_unchanged, lengths):
    mgr, *_ = busy
    tokens = list(range(max(0, sum(lengths))))
    assert_unchanged(mgr, lambda: mgr.admit(tokens, lengths), ValueError)
    assert_unchanged(mgr, lambda: mgr.admit(tokens, lengths, atomic=False), ValueError)


def test_empty_admit_is_a_no_op(busy, same_state):
    mgr, *_ = busy
    before = mgr.snapshot()
    r = mgr.admit([], [])
    assert r.ids.shape == (0,) and r.slot_mapping.shape == (0,)
    same_state(before, mgr.snapshot())


@pytest.mark.parametrize("salts", [[0, 0], [], [[0]]])
def test_salts_length_mismatch(busy, assert_unchanged, salts):
    mgr, *_ = busy
    assert_unchanged(mgr, lambda: mgr.admit([1, 2, 3], [3], salts=salts), ValueError)
    assert_unchanged(mgr, lambda: mgr.admit([1, 2, 3], [3], salts=salts, atomic=False), ValueError)


# --------------------------------------------------------------------------------------- fork
BAD_N = [(0, ValueError), (-1, ValueError), (1.5, TypeError), (2.0, TypeError)]
BAD_N += [("2", TypeError), (None, TypeError), (True, TypeError)]


@pytest.mark.parametrize(("n", "exc"), BAD_N)
def test_fork_bad_n(busy, assert_unchanged, n, exc):
    mgr, a, c, _ = busy
    assert_unchanged(mgr, lambda: mgr.fork([a], n), exc)
    assert_unchanged(mgr, lambda: mgr.fork([a, c], n=n), exc)


def test_fork_accepts_numpy_integer_n(busy):
    mgr, a, c, _ = busy
    children = mgr.fork([a], np.int64(2))
    assert children.shape == (1, 2) and children.dtype == np.int64
    assert mgr.ref_count(3) == 4
    mgr.check()


# ------------------------------------------------------------------------ new_sequences count
BAD_COUNT = [(-1, ValueError), (1.0, TypeError), ("1", TypeError), (None, TypeError)]
BAD_COUNT += [([1], TypeError)]


@pytest.mark.parametrize(("count", "exc"), BAD_COUNT)
def test_new_sequences_bad_count(busy, assert_unchanged, count, exc):
    mgr, *_ = busy
    assert_unchanged(mgr, lambda: mgr.new_sequences(count), exc)


# --------------------------------------------------------------------------------- too long
def test_sequence_too_long(busy, assert_unchanged):
    mgr, a, c, _ = busy
    err = assert_unchanged(mgr, lambda: mgr.append([c, a], [0, 35]), SequenceTooLong)
    assert (err.seq_id, err.length, err.max_seq_len) == (a, 41, 40)
    assert_unchanged(mgr, lambda: mgr.append([a], [35], atomic=False), SequenceTooLong)
    assert_unchanged(mgr, lambda: mgr.can_append([a], [35]), SequenceTooLong)
    err = assert_unchanged(mgr, lambda: mgr.admit(list(range(41)), [41]), SequenceTooLong)
    assert (err.length, err.max_seq_len) == (41, 40)
    assert_unchanged(
        mgr, lambda: mgr.admit(list(range(42)), [1, 41], atomic=False), SequenceTooLong
    )
    assert_unchanged(mgr, lambda: kvnumba.Sequence(mgr, a).append(count=35), SequenceTooLong)
    # Exactly max_seq_len fits.
    big = BlockManager(32, 4, max_seq_len=40)
    (s,) = big.new_sequences(1)
    big.append([s], [40])
    assert big.seq_lens([s]).tolist() == [40]
    assert_unchanged(big, lambda: big.append([s], [1]), SequenceTooLong)
    assert big.admit(list(range(40)), [40]).ok.tolist() == [True]


# ------------------------------------------------------------------------------- too many seqs
def test_too_many_sequences(busy, assert_unchanged):
    mgr, a, c, _ = busy  # 2 of 4 slots live
    err = assert_unchanged(mgr, lambda: mgr.new_sequences(3), TooManySequences)
    assert (err.requested, err.available, err.max_seqs) == (3, 2, 4)
    assert_unchanged(mgr, lambda: mgr.fork([a], 3), TooManySequences)
    assert_unchanged(mgr, lambda: mgr.fork([a, c], 2), TooManySequences)
    assert_unchanged(mgr, lambda: mgr.admit([1, 2, 3], [1, 1, 1]), TooManySequences)
    # Non-atomic mode covers pool exhaustion only.
    assert_unchanged(mgr, lambda: mgr.admit([1, 2, 3], [1, 1, 1], atomic=False), TooManySequences)
    assert mgr.new_sequences(2).shape == (2,)
    assert_unchanged(mgr, lambda: mgr.sequence(), TooManySequences)
    assert_unchanged(mgr, lambda: kvnumba.Sequence(mgr, a).fork(), TooManySequences)


# ---------------------------------------------------------------------------------- geometry
@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_blocks": 0, "block_size": 4},
        {"num_blocks": -1, "block_size": 4},
        {"num_blocks": 8, "block_size": 0},
        {"num_blocks": 8, "block_size": -4},
        {"num_blocks": 8.0, "block_size": 4},
        {"num_blocks": 8, "block_size": 4.0},
        {"num_blocks": True, "block_size": 4},
        {"num_blocks": 8, "block_size": "4"},
        {"num_blocks": 8, "block_size": 4, "max_seqs": 0},
        {"num_blocks": 8, "block_size": 4, "max_seqs": 1.5},
        {"num_blocks": 8, "block_size": 4, "max_seq_len": 0},
        {"num_blocks": 8, "block_size": 4, "max_seq_len": -5},
        {"num_blocks": 2**31, "block_size": 1},
    ],
)
def test_invalid_geometry(kwargs):
    with pytest.raises(InvalidGeometry) as info:
        BlockManager(**kwargs)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, kvnumba.KVNumbaError)


def test_on_evict_must_be_callable():
    with pytest.raises(TypeError):
        BlockManager(8, 4, on_evict=42)


# --------------------------------------------------------------------------------- ref_count
@pytest.mark.parametrize("block", [-1, 8, 100, -9])
def test_ref_count_out_of_range(busy, assert_unchanged, block):
    mgr, *_ = busy
    err = assert_unchanged(mgr, lambda: mgr.ref_count(block), InvalidPosition)
    assert isinstance(err, IndexError)


def test_ref_count_in_range(busy):
    mgr, *_ = busy
    assert [mgr.ref_count(b) for b in range(8)] == [0, 0, 2, 2, 0, 0, 0, 0]
    assert mgr.ref_count(np.int32(3)) == 2
    with pytest.raises(TypeError):
        mgr.ref_count(3.0)


# ------------------------------------------------------------------------- stale / unknown ids
def test_released_and_unknown_ids(busy, assert_unchanged):
    mgr, a, c, gone = busy
    later = gone + (1 << slot_bits(mgr.max_seqs))  # the same slot, a generation not issued yet
    for bad, exc in [(gone, SequenceReleased), (-5, InvalidSequence), (later, None)]:
        expected = exc or InvalidSequence
        for call in (
            lambda b=bad: mgr.append([a, b], [1, 1]),
            lambda b=bad: mgr.append([a, b], [1, 1], atomic=False),
            lambda b=bad: mgr.release([a, b]),
            lambda b=bad: mgr.fork([a, b]),
            lambda b=bad: mgr.can_append([b], [0]),
        ):
            err = assert_unchanged(mgr, call, expected)
            if exc is None:
                assert not isinstance(err, SequenceReleased)
            assert err.seq_id == bad


# ------------------------------------------------------------------------------- precedence
def test_validation_takes_precedence_over_pool_exhausted(busy, assert_unchanged):
    mgr, a, c, gone = busy
    # Sanity: the first request alone exhausts the pool (needs 8 blocks, 6 available).
    err = assert_unchanged(mgr, lambda: mgr.append([a], [30]), PoolExhausted)
    assert (err.needed, err.available) == (8, 6)
    failed = mgr.stats().failed_calls
    cases = [
        (lambda: mgr.append([a, c], [30, -1]), ValueError),
        (lambda: mgr.append([a, c], [30, 1], [0] * 30 + [-1]), ValueError),
        (lambda: mgr.append([a, c], [30, 1], [0] * 30), ValueError),
        (lambda: mgr.append([a, c, a], [30, 1, 1]), ValueError),
        (lambda: mgr.append([a, gone], [30, 1]), SequenceReleased),
        (lambda: mgr.append([a, 12345], [30, 1]), InvalidSequence),
        (lambda: mgr.append([a, c], [30, 35]), SequenceTooLong),
        (lambda: mgr.append([a, c], [30.0, 1.0]), TypeError),
        (lambda: mgr.can_append([a, c], [30, -1]), ValueError),
        (lambda: mgr.admit(list(range(31)), [30, 0, 1]), ValueError),
        (lambda: mgr.admit(list(range(30)) + [-1], [30, 1]), ValueError),
        (lambda: mgr.admit(list(range(30)), [30, 1]), ValueError),
        (lambda: mgr.admit(list(range(71)), [30, 41]), SequenceTooLong),
        (lambda: mgr.admit(list(range(32)), [30, 1, 1]), TooManySequences),
        (lambda: mgr.admit(list(range(31)), [30, 1], salts=[0]), ValueError),
    ]
    for call, exc in cases:
        assert_unchanged(mgr, call, exc)
    assert mgr.stats().failed_calls == failed  # validation errors are not pool failures


# --- input at the edges of int64 and of memory: typed errors, nothing allocated or changed ---


def test_huge_counts_are_too_long_not_wrapped(assert_unchanged):
    mgr = BlockManager(8, 4, max_seqs=4, max_seq_len=16)
    ids = mgr.new_sequences(3)
    mgr.append(ids, [1, 1, 1])
    big = 2**63 - 1
    # A sum that wraps to a small number must not slip past the length check.
    err = assert_unchanged(mgr, lambda: mgr.append(ids, [big, big, 2]), SequenceTooLong)
    assert err.seq_id == ids[0] and err.max_seq_len == 16
    assert_unchanged(mgr, lambda: mgr.can_append(ids[:1], [big]), SequenceTooLong)
    assert_unchanged(mgr, lambda: mgr.append(ids[:1], [big], [1, 2]), ValueError)


def test_huge_prompt_lengths(assert_unchanged):
    mgr = BlockManager(8, 4, max_seqs=4, max_seq_len=16)
    err = assert_unchanged(mgr, lambda: mgr.admit([1, 2], [2**63 - 1, 2**63 - 1]), ValueError)
    assert "lengths sum to 18446744073709551614" in str(err)
    err = assert_unchanged(mgr, lambda: mgr.admit(list(range(20)), [20]), SequenceTooLong)
    assert "prompt 0 has 20 tokens" in str(err)


def test_huge_sequence_requests_raise_before_allocating(assert_unchanged):
    mgr = BlockManager(8, 4, max_seqs=4)
    ids = mgr.new_sequences(1)
    for call in (
        lambda: mgr.new_sequences(10**12),
        lambda: mgr.new_sequences(2**70),
        lambda: mgr.fork(ids, 10**12),
    ):
        assert_unchanged(mgr, call, TooManySequences)
    released = mgr.new_sequences(1)
    mgr.release(released)
    assert_unchanged(mgr, lambda: mgr.fork(released, 10**12), SequenceReleased)


def test_empty_unsigned_and_switch_types(assert_unchanged):
    mgr = BlockManager(8, 4)
    res = mgr.append(np.array([], np.int64), np.array([], np.uint8))
    assert res.slot_mapping.shape == (0,) and res.ok.shape == (0,)
    ids = mgr.new_sequences(1)
    assert_unchanged(mgr, lambda: mgr.append(ids, [1], atomic="no"), TypeError)
    assert_unchanged(mgr, lambda: mgr.admit([1], [1], atomic=1), TypeError)
    assert_unchanged(mgr, lambda: mgr.new_sequences(True), TypeError)
    assert mgr.append(ids, [1], atomic=np.bool_(False)).ok.tolist() == [True]
