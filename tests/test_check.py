"""``check()`` can fail: each corruption of the state arrays is named by the right invariant.

The public ``state`` views are read-only; the tests corrupt the manager's writable arrays
(``mgr._arenas.s``) directly, which no public call can do.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvnumba import BlockManager, InvariantViolation
from kvnumba._layout import M_CACHED, M_FREE_TOP, M_LIVE_SEQS, M_REGISTERED, M_SLOT_TOP, M_USED
from kvnumba.ids import split_id
from kvnumba.state import BlockFlag


def busy_manager():
    """Live, shared, cached and free blocks, a partial tail and registered hashes."""
    mgr = BlockManager(16, 4, max_seqs=8, max_seq_len=32)
    a, b = mgr.new_sequences(2)
    mgr.append([a, b], [9, 6], np.arange(15))
    mgr.fork([a])
    gone = mgr.admit(np.arange(100, 108), [8]).ids
    mgr.release(gone)  # two full blocks with content: cached
    mgr.check()
    return mgr, a


def first_free(mgr):
    return int(mgr._arenas.s.free_stack[mgr._arenas.s.meta[M_FREE_TOP] - 1])


def first_cached(mgr):
    from kvnumba._layout import M_LRU_HEAD

    return int(mgr._arenas.s.meta[M_LRU_HEAD])


def slot_of(seq_id):
    return split_id(seq_id, 8)[2]  # the fixture's max_seqs


CORRUPTIONS = {
    "refcount": (lambda m, a: m._arenas.s.ref.__setitem__(0, 5), "refcount 5 differs"),
    "table beyond length": (
        lambda m, a: m._arenas.s.seq_table.__setitem__((slot_of(a), 5), 0),
        "set beyond the sequence's blocks",
    ),
    "table out of range": (
        lambda m, a: m._arenas.s.seq_table.__setitem__((slot_of(a), 0), 99),
        "out-of-range block",
    ),
    "length beyond max": (
        lambda m, a: m._arenas.s.seq_len.__setitem__(slot_of(a), 40),
        "beyond max_seq_len",
    ),
    "free slot with table": (
        lambda m, a: m._arenas.s.seq_table.__setitem__((7, 0), 3),
        "free sequence slot 7",
    ),
    "free block payload": (
        lambda m, a: m._arenas.s.tokens.__setitem__((first_free(m), 0), 7),
        "payload or flags",
    ),
    "free stack duplicate": (
        lambda m, a: m._arenas.s.free_stack.__setitem__(0, m._arenas.s.free_stack[1]),
        "listed twice",
    ),
    "lru back link": (
        lambda m, a: m._arenas.s.lru_prev.__setitem__(first_cached(m), 3),
        "back link",
    ),
    "cached counter": (lambda m, a: m._arenas.s.meta.__setitem__(M_CACHED, 7), "counter"),
    "used counter": (lambda m, a: m._arenas.s.meta.__setitem__(M_USED, 1), "counter"),
    "live counter": (lambda m, a: m._arenas.s.meta.__setitem__(M_LIVE_SEQS, 9), "counter"),
    "registered counter": (lambda m, a: m._arenas.s.meta.__setitem__(M_REGISTERED, 0), "counter"),
    "lost block": (
        lambda m, a: m._arenas.s.meta.__setitem__(M_FREE_TOP, m._arenas.s.meta[M_FREE_TOP] - 1),
        "neither referenced",
    ),
    "cached block unregistered": (
        lambda m, a: m._arenas.s.block_flags.__setitem__(first_cached(m), 0),
        "LRU list: block",
    ),
    "table entry of an unregistered block": (
        lambda m, a: m._arenas.s.block_flags.__setitem__(m._arenas.s.seq_table[slot_of(a), 0], 1),
        "not a registered block",
    ),
    "hashed without content": (
        lambda m, a: m._arenas.s.block_flags.__setitem__(m._arenas.s.seq_table[slot_of(a), 0], 6),
        "hashed without known content",
    ),
    "partial tail payload": (
        lambda m, a: m._arenas.s.tokens.__setitem__((m._arenas.s.seq_table[slot_of(a), 2], 3), 5),
        "payload past its fill",
    ),
    "hash mismatch": (
        lambda m, a: m._arenas.s.tokens.__setitem__((m._arenas.s.seq_table[slot_of(a), 0], 0), 77),
        "does not match its content",
    ),
    "slot stack": (lambda m, a: m._arenas.s.slot_stack.__setitem__(0, slot_of(a)), "slot stack"),
    "slot counter": (lambda m, a: m._arenas.s.meta.__setitem__(M_SLOT_TOP, 2), "counter"),
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_check_names_the_corruption(name):
    mgr, a = busy_manager()
    corrupt, words = CORRUPTIONS[name]
    corrupt(mgr, a)
    with pytest.raises(InvariantViolation, match=words):
        mgr.check()


@pytest.mark.parametrize("cache_duplicates", [False, True])
def test_check_names_a_registered_copy_without_cache_duplicates(cache_duplicates):
    # Two sequences fill equal first blocks: the second is a copy (registered too only with
    # cache_duplicates). Registering the copy by hand is a corruption only without it.
    mgr = BlockManager(8, 4, max_seqs=4, cache_duplicates=cache_duplicates)
    a, b = mgr.new_sequences(2)
    mgr.append([a, b], [4, 4], np.concatenate([np.arange(4), np.arange(4)]))
    s = mgr._arenas.s
    first, copy = (int(s.seq_table[split_id(x, 4)[2], 0]) for x in (a, b))
    assert mgr.state.block_hash[first] == mgr.state.block_hash[copy]
    flags = s.block_flags
    assert bool(flags[copy] & BlockFlag.REGISTERED) == cache_duplicates
    if not cache_duplicates:
        mask = s.htab.shape[0] - 1
        i = int(s.block_hash[copy]) & mask
        while s.htab[i] != -1:
            i = (i + 1) & mask
        s.htab[i] = copy
        flags[copy] |= BlockFlag.REGISTERED
        s.meta[M_REGISTERED] += 1
        with pytest.raises(InvariantViolation, match=f"block {copy} is registered with the key"):
            mgr.check()
    else:
        mgr.check()
