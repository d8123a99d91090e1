"""Callbacks: a callback that raises does not undo the call (its result rides on
:class:`~kvnumba.CallbackError`, every callback still runs, the first error is the cause), and a
page pool refuses callbacks that are not callable."""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest

import kvnumba
from kvnumba import BlockManager, CallbackError, PagePool


class Boom(Exception):
    """The exception the test callbacks raise."""


def raiser(calls: list, tag: str):
    """A callback that records its call and raises ``Boom(tag)``."""

    def callback(*args):
        calls.append(tag)
        raise Boom(tag)

    return callback


def fill_cache(mgr: BlockManager) -> None:
    """Leave every block of ``mgr`` cached (released full blocks with known content)."""
    block_size = mgr.block_size
    n = mgr.num_blocks * block_size
    (seq,) = mgr.admit(np.arange(n), [n]).ids
    mgr.release([seq])
    assert mgr.stats().cached == mgr.num_blocks


def test_callback_error_is_a_kvnumba_error():
    assert issubclass(CallbackError, kvnumba.KVNumbaError)
    assert "CallbackError" in kvnumba.__all__


def test_on_evict_raising_in_admit_keeps_the_new_ids():
    calls: list = []
    mgr = BlockManager(4, 2, max_seqs=4, on_evict=raiser(calls, "evict"))
    fill_cache(mgr)
    with pytest.raises(CallbackError) as info:
        mgr.admit([100, 101, 102, 103, 104], [3, 2])
    assert calls == ["evict"]
    assert isinstance(info.value.__cause__, Boom)
    result = info.value.result
    assert isinstance(result, kvnumba.AdmitResult)
    assert result.ids.shape == (2,) and (result.ids >= 0).all()
    assert mgr.seq_lens(result.ids).tolist() == [3, 2]
    mgr.check()
    mgr.release(result.ids)
    mgr.check()


def test_on_evict_raising_in_append_keeps_the_result():
    calls: list = []
    mgr = BlockManager(2, 2, max_seqs=4, on_evict=raiser(calls, "evict"))
    fill_cache(mgr)
    (seq,) = mgr.new_sequences(1)
    with pytest.raises(CallbackError) as info:
        mgr.append([seq], [3], [7, 8, 9])
    assert calls == ["evict"]
    assert isinstance(info.value.result, kvnumba.AppendResult)
    assert info.value.result.slot_mapping.shape == (3,)
    assert mgr.seq_lens([seq]).tolist() == [3]
    mgr.check()


def test_on_map_raising_in_a_paged_append():
    calls: list = []
    pool = PagePool(4, on_map=raiser(calls, "map"))
    mgr = BlockManager(8, 1, page_pool=pool, blocks_per_page=2, max_seqs=4)
    (seq,) = mgr.new_sequences(1)
    with pytest.raises(CallbackError) as info:
        mgr.append([seq], [3], [1, 2, 3])
    assert calls == ["map"]
    assert isinstance(info.value.__cause__, Boom)
    assert isinstance(info.value.result, kvnumba.AppendResult)
    assert mgr.seq_lens([seq]).tolist() == [3]
    assert len(mgr.mapped_pages()) == 2
    mgr.check()
    pool.check()


def test_every_callback_runs_and_the_first_is_the_cause():
    calls: list = []
    pool = PagePool(2, on_unmap=raiser(calls, "unmap"))
    mgr = BlockManager(4, 1, page_pool=pool, blocks_per_page=2, on_evict=raiser(calls, "evict"))
    (seq,) = mgr.admit([1, 2], [2]).ids
    mgr.release([seq])  # the page stays mapped, its two blocks cached
    assert calls == []
    with pytest.raises(CallbackError) as info:
        mgr.trim()
    assert calls == ["evict", "unmap"]
    assert str(info.value.__cause__) == "evict"
    assert info.value.result == 1  # trim's own result: pages unmapped
    assert len(mgr.mapped_pages()) == 0
    mgr.check()
    pool.check()


def test_sibling_give_up_and_own_map_callbacks_all_run():
    calls: list = []
    pool = PagePool(1, on_map=raiser(calls, "map"), on_unmap=raiser(calls, "unmap"))
    a = BlockManager(2, 1, page_pool=pool, blocks_per_page=2, on_evict=raiser(calls, "a-evict"))
    b = BlockManager(2, 1, page_pool=pool, blocks_per_page=2, max_seqs=4)
    with pytest.raises(CallbackError) as first:
        a.admit([1, 2], [2])  # maps the pool's only page: on_map raises
    assert calls == ["map"]
    calls.clear()
    a.release(first.value.result.ids)
    assert calls == []  # a's page stays mapped: its blocks are cached
    (fresh,) = b.new_sequences(1)
    with pytest.raises(CallbackError) as info:
        b.append([fresh], [1], [9])  # takes a's cache-only page
    assert calls == ["a-evict", "unmap", "map"]
    assert str(info.value.__cause__) == "a-evict"
    assert b.seq_lens([fresh]).tolist() == [1]
    a.check()
    b.check()
    pool.check()


def test_release_callback_error_has_no_result():
    calls: list = []
    pool = PagePool(2, on_unmap=raiser(calls, "unmap"))
    mgr = BlockManager(4, 1, page_pool=pool, blocks_per_page=2)
    (seq,) = mgr.new_sequences(1)
    mgr.append([seq], [2])  # no token ids: nothing is cached, the page is unmapped on release
    with pytest.raises(CallbackError) as info:
        mgr.release([seq])
    assert calls == ["unmap"]
    assert info.value.result is None
    assert not mgr.is_live(seq)
    assert len(mgr.mapped_pages()) == 0
    mgr.check()
    pool.check()


def test_pool_map_pages_callback_error_carries_the_pages():
    pool = PagePool(2, on_map=raiser([], "map"))
    me = pool.register_client()
    with pytest.raises(CallbackError) as info:
        pool.map_pages(me, [5])
    assert info.value.result.tolist() == pool.pages_of(me).tolist()
    pool.check()


@pytest.mark.parametrize("kwargs", [{"on_map": 5}, {"on_unmap": "f"}], ids=repr)
def test_pool_callbacks_must_be_callable(kwargs):
    with pytest.raises(TypeError, match="callable"):
        PagePool(4, **kwargs)
    name = f"kvn-t-{uuid.uuid4().hex[:12]}"
    with pytest.raises(TypeError, match="callable"):
        PagePool.shared(name, 4, **kwargs)
    assert not os.path.exists(f"/dev/shm/{name}")
