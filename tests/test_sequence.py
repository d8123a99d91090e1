"""The ``Sequence`` handle: one sequence at a time over the same kernels as the batched calls."""

from __future__ import annotations

import numpy as np
import pytest

import kvnumba
from kvnumba import (
    BlockManager,
    InvalidPosition,
    InvalidSequence,
    PoolExhausted,
    Sequence,
    SequenceReleased,
)
from kvnumba.ids import make_id


def test_sequence_is_a_new_empty_sequence():
    mgr = BlockManager(8, 4)
    seq = mgr.sequence()
    assert isinstance(seq, Sequence)
    assert isinstance(seq.id, int)
    assert seq.id == make_id(mgr.id_tag, 1, 0, mgr.max_seqs)  # design.md: generation 1, slot 0
    assert len(seq) == 0
    assert not seq.released
    assert seq.table.tolist() == []
    assert seq.tokens.tolist() == []
    assert mgr.seq_lens([seq.id]).tolist() == [0]
    other = mgr.sequence()
    assert other.id != seq.id
    assert mgr.stats().used == 0


def test_append_tokens_and_count():
    mgr = BlockManager(8, 4)
    seq = mgr.sequence()
    r = seq.append([10, 11, 12])
    assert isinstance(r, kvnumba.AppendResult)
    assert r.slot_mapping.tolist() == [0, 1, 2]
    assert r.ok.tolist() == [True]
    r = seq.append(np.array([13, 14], dtype=np.int32))
    assert r.slot_mapping.tolist() == [3, 4]
    r = seq.append(count=2)
    assert r.slot_mapping.tolist() == [5, 6]
    assert len(seq) == 7
    assert seq.table.tolist() == [0, 1]
    assert seq.tokens.tolist() == [10, 11, 12, 13, 14, -1, -1]
    assert [seq.token_at(i) for i in range(7)] == [10, 11, 12, 13, 14, -1, -1]
    assert [seq.block_for(i) for i in range(7)] == [0, 0, 0, 0, 1, 1, 1]
    assert mgr.seq_lens([seq.id]).tolist() == [7]
    mgr.check()


def test_append_empty_token_list():
    mgr = BlockManager(8, 4)
    seq = mgr.sequence()
    seq.append([1])
    r = seq.append([])
    assert r.slot_mapping.tolist() == [] and r.ok.tolist() == [True]
    assert len(seq) == 1


def test_append_empty_token_list_batched():
    mgr = BlockManager(8, 4)
    seq = mgr.sequence()
    r = mgr.append([seq.id], [0], [])
    assert r.slot_mapping.tolist() == [] and r.ok.tolist() == [True]
    r = seq.append(np.array([], dtype=np.int64))
    assert r.slot_mapping.tolist() == []
    r = seq.append(count=0)
    assert r.slot_mapping.tolist() == []
    assert len(seq) == 0


def test_append_argument_errors_change_nothing(assert_unchanged):
    mgr = BlockManager(2, 4, max_seq_len=40)
    seq = mgr.sequence()
    seq.append([1, 2])
    assert_unchanged(mgr, lambda: seq.append(), ValueError)
    assert_unchanged(mgr, lambda: seq.append([1], count=1), ValueError)
    assert_unchanged(mgr, lambda: seq.append([[1, 2]]), ValueError)
    assert_unchanged(mgr, lambda: seq.append([1.5]), TypeError)
    assert_unchanged(mgr, lambda: seq.append([-1]), ValueError)
    assert_unchanged(mgr, lambda: seq.append(count=-1), ValueError)
    assert_unchanged(mgr, lambda: seq.append(count=1.0), TypeError)
    err = assert_unchanged(mgr, lambda: seq.append(count=7), PoolExhausted)
    assert (err.needed, err.available) == (2, 1)
    assert len(seq) == 2


def test_fork_shares_blocks_and_copies_on_write():
    mgr = BlockManager(8, 4)
    parent = mgr.sequence()
    parent.append([1, 2, 3, 4, 5, 6])
    child = parent.fork()
    assert isinstance(child, Sequence)
    assert child.id != parent.id
    assert len(child) == 6
    assert child.table.tolist() == parent.table.tolist() == [0, 1]
    assert child.tokens.tolist() == [1, 2, 3, 4, 5, 6]
    assert (mgr.ref_count(0), mgr.ref_count(1)) == (2, 2)

    r = child.append([7])
    assert (r.cow_src.tolist(), r.cow_dst.tolist()) == ([1], [2])
    assert child.table.tolist() == [0, 2]
    assert parent.table.tolist() == [0, 1]
    assert child.tokens.tolist() == [1, 2, 3, 4, 5, 6, 7]
    assert parent.tokens.tolist() == [1, 2, 3, 4, 5, 6]
    assert child.block_for(5) == 2 and parent.block_for(5) == 1
    assert child.token_at(6) == 7
    with pytest.raises(InvalidPosition):
        parent.token_at(6)
    mgr.check()


def test_table_and_tokens_are_copies():
    mgr = BlockManager(8, 4)
    seq = mgr.sequence()
    seq.append([1, 2, 3, 4, 5])
    before = mgr.snapshot()
    table = seq.table
    tokens = seq.tokens
    assert table.dtype == np.int32 and tokens.dtype == np.int64
    table[:] = 7
    tokens[:] = 99
    assert seq.table.tolist() == [0, 1]
    assert seq.tokens.tolist() == [1, 2, 3, 4, 5]
    after = mgr.snapshot()
    for name in before._fields:
        assert np.array_equal(getattr(before, name), getattr(after, name)), name


@pytest.mark.parametrize("pos", [-1, 5, 6, 100, -100])
def test_out_of_range_positions(pos, assert_unchanged):
    mgr = BlockManager(8, 4)
    seq = mgr.sequence()
    seq.append([1, 2, 3, 4, 5])
    err = assert_unchanged(mgr, lambda: seq.token_at(pos), InvalidPosition)
    assert isinstance(err, IndexError) and isinstance(err, kvnumba.KVNumbaError)
    err = assert_unchanged(mgr, lambda: seq.block_for(pos), InvalidPosition)
    assert isinstance(err, IndexError)


def test_positions_of_an_empty_sequence_are_invalid():
    mgr = BlockManager(8, 4)
    seq = mgr.sequence()
    with pytest.raises(InvalidPosition):
        seq.token_at(0)
    with pytest.raises(InvalidPosition):
        seq.block_for(0)


def test_non_integer_positions_raise_type_error():
    mgr = BlockManager(8, 4)
    seq = mgr.sequence()
    seq.append([1, 2])
    with pytest.raises(TypeError):
        seq.token_at(1.0)
    with pytest.raises(TypeError):
        seq.block_for("0")
    assert seq.token_at(np.int64(1)) == 2


def test_release_and_everything_after_it(assert_unchanged):
    mgr = BlockManager(8, 4)
    seq = mgr.sequence()
    seq.append([1, 2, 3, 4, 5])
    child = seq.fork()
    seq.release()
    assert seq.released and not child.released
    assert child.tokens.tolist() == [1, 2, 3, 4, 5]
    assert (mgr.ref_count(0), mgr.ref_count(1)) == (1, 1)
    for call in (
        lambda: seq.append([1]),
        lambda: seq.append(count=1),
        lambda: seq.fork(),
        lambda: seq.release(),
        lambda: len(seq),
        lambda: seq.table,
        lambda: seq.tokens,
        lambda: seq.token_at(0),
        lambda: seq.block_for(0),
    ):
        err = assert_unchanged(mgr, call, SequenceReleased)
        assert isinstance(err, InvalidSequence)
        assert err.seq_id == seq.id
    child.release()
    assert child.released
    s = mgr.stats()
    assert (s.used, s.cached, s.free) == (0, 1, 7)
    # The id is never reused.
    new_ids = {mgr.sequence().id for _ in range(5)}
    assert seq.id not in new_ids and child.id not in new_ids
    mgr.check()


def test_handle_over_a_batched_id_and_repr():
    mgr = BlockManager(8, 4)
    (sid,) = mgr.admit([5, 6, 7], [3]).ids
    seq = Sequence(mgr, sid)
    assert seq.id == sid and len(seq) == 3
    assert seq.tokens.tolist() == [5, 6, 7]
    assert "3 tokens" in repr(seq)
    mgr.release([sid])
    assert seq.released
    assert "released" in repr(seq)
    never = Sequence(mgr, 12345)
    assert never.released
    with pytest.raises(InvalidSequence) as info:
        len(never)
    assert not isinstance(info.value, SequenceReleased)


def test_handle_pool_exhausted_on_fork_child_append():
    mgr = BlockManager(2, 4)
    seq = mgr.sequence()
    seq.append([1, 2, 3, 4, 5])  # blocks 0, 1 (partial): pool full
    child = seq.fork()
    with pytest.raises(PoolExhausted) as info:
        child.append([6])  # needs a copy of block 1
    assert (info.value.needed, info.value.available) == (1, 0)
    assert child.tokens.tolist() == [1, 2, 3, 4, 5]
    assert mgr.stats().failed_calls == 1
    mgr.check()


def test_manager_repr_shows_the_census():
    mgr = BlockManager(8, 4)
    seq = mgr.sequence()
    seq.append([1, 2, 3, 4, 5])
    assert repr(mgr) == (
        "BlockManager(num_blocks=8, block_size=4, used=2, cached=0, free=6, live_seqs=1)"
    )
