"""Inputs that look like integers but are not valid arguments (bytes, a huge fork count, a bool
count) are refused with a typed error and change nothing."""

from __future__ import annotations

import pytest

from kvnumba import BlockManager


def test_bytearray_is_not_an_integer_array():
    mgr = BlockManager(8, 2, max_seqs=4)
    (seq,) = mgr.new_sequences(1)
    before = mgr.snapshot()
    for bad in (bytearray(b"\x05"), b"\x05"):
        with pytest.raises(TypeError):
            mgr.append([seq], bad)
        with pytest.raises(TypeError):
            mgr.append(bad, [1])
        with pytest.raises(TypeError):
            mgr.admit(bad, [1])
    for name in before._fields:
        assert getattr(before, name).tobytes() == getattr(mgr.state, name).tobytes(), name
    assert mgr.seq_lens([seq]).tolist() == [0]


def test_fork_of_nothing_with_a_huge_n_is_a_value_error():
    mgr = BlockManager(8, 2, max_seqs=4)
    with pytest.raises(ValueError, match="2\\*\\*63"):
        mgr.fork([], n=2**63)
    with pytest.raises(ValueError):
        mgr.fork([], n=2**100)
    assert mgr.fork([], n=2).shape == (0, 2)
    mgr.check()


@pytest.mark.parametrize("count", [True, False])
def test_sequence_append_refuses_a_bool_count(count):
    seq = BlockManager(8, 2, max_seqs=4).sequence()
    with pytest.raises(TypeError, match="bool"):
        seq.append(count=count)
    assert len(seq) == 0
