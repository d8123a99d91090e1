"""A manager's parts hold no reference back to it: dropping the last reference frees its arenas
at once (no garbage-collector cycle), and a dropped manager on a page pool gives its pages back
at the pool's next call."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import kvnumba


@pytest.fixture
def no_gc():
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_a_dropped_manager_frees_its_arenas_without_the_collector(no_gc):
    mgr = kvnumba.BlockManager(
        64, 4, max_seqs=4, block_keys=True, block_events=True, on_evict=lambda *a: None
    )
    seq, _ = mgr.admit_one(None, length=9, keys=np.zeros((2, 4), np.uint64))
    mgr.append_one(seq, 1)
    mgr.lookup_one(length=9, keys=np.zeros((2, 4), np.uint64))
    mgr.take_events()
    arenas = weakref.ref(mgr._arenas)
    del mgr
    assert arenas() is None


def test_a_dropped_paged_manager_gives_its_pages_back_at_the_next_call(no_gc):
    pool = kvnumba.PagePool(4)
    mgr = kvnumba.BlockManager(16, 4, page_pool=pool, blocks_per_page=4)
    mgr.append(mgr.new_sequences(1), [5])
    assert pool.num_free == 3
    arenas = weakref.ref(mgr._arenas)
    del mgr
    assert arenas() is None
    other = kvnumba.BlockManager(16, 4, page_pool=pool, blocks_per_page=4)
    other.append(other.new_sequences(1), [64])  # every page, the dropped manager's too
    assert pool.num_free == 0
    other.check()
