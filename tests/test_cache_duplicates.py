"""``cache_duplicates``: a full block equal to a registered one is registered and cached too.

A copy arises when a prompt recomputes a block whose content is cached (here: the last-token
rule leaves a prompt's last full block out of its hit). Without the switch the copy keeps its
hash, stays unregistered and is freed on release; with it the copy is registered after the
first block of its key, cached on release, evicted with a removed event, and found by lookups
once the first block is gone, as vLLM's block pool does. Kernels and the reference model
agree on every step (``test_differential``, ``test_stateful`` draw the switch too).
"""

from __future__ import annotations

import numpy as np
import pytest

from kvnumba import EVICTION_POLICIES, BlockManager
from kvnumba.reference import ReferenceBlockManager
from kvnumba.results import BlockEvents

BS = 4
PROMPT = np.arange(2 * BS)  # two full blocks; an admit may hit only the first


def _copy_made(cls, cache_duplicates, **kwargs):
    """A manager whose cache holds PROMPT's two blocks, and a live sequence that hit the first
    and recomputed the second (the copy). Returns the manager, the sequence, the first blocks
    and the copy."""
    mgr = cls(8, BS, block_events=True, cache_duplicates=cache_duplicates, **kwargs)
    seq = mgr.admit(np.concatenate([PROMPT, [99]]), [2 * BS + 1]).ids[0]
    first = [int(b) for b in mgr.block_tables([seq])[0][:2]]
    mgr.release([seq])
    out = mgr.admit(PROMPT, [2 * BS])  # the hit stops before the block of the last token
    assert int(out.num_cached_tokens[0]) == BS
    table = [int(b) for b in mgr.block_tables(out.ids)[0][:2]]
    assert table[0] == first[0]
    mgr.check()
    return mgr, int(out.ids[0]), first, table[1]


@pytest.mark.parametrize("cls", [BlockManager, ReferenceBlockManager])
def test_without_the_switch_a_copy_is_freed_on_release(cls):
    mgr, seq, first, copy = _copy_made(cls, False)
    events = mgr.take_events()
    assert [(int(k), int(b)) for k, b in zip(events.kind, events.block, strict=True)] == [
        (BlockEvents.STORED, first[0]),
        (BlockEvents.STORED, first[1]),
    ]
    mgr.release([seq])
    assert mgr.stats().cached == 2  # the first two; the copy went back to the free list
    mgr.check()


@pytest.mark.parametrize("cls", [BlockManager, ReferenceBlockManager])
def test_a_copy_is_registered_cached_and_evicted_with_its_event(cls):
    mgr, seq, first, copy = _copy_made(cls, True)
    events = mgr.take_events()
    assert events.kind.tolist() == [BlockEvents.STORED] * 3
    assert events.block.tolist() == [*first, copy]
    assert events.key[2].tolist() == events.key[1].tolist()  # the copy's key is the first's
    mgr.release([seq])
    assert mgr.stats().cached == 3
    # Lookups find the first block of the key while it stays.
    hits = mgr.lookup(np.concatenate([PROMPT, [7]]), [2 * BS + 1]).block_ids[0]
    assert hits.tolist() == first
    assert mgr.evict([copy]) == 1
    events = mgr.take_events()
    assert (events.kind.tolist(), events.block.tolist()) == ([BlockEvents.REMOVED], [copy])
    assert mgr.stats().cached == 2
    mgr.check()


@pytest.mark.parametrize("cls", [BlockManager, ReferenceBlockManager])
def test_the_copy_takes_the_first_blocks_place_when_it_leaves(cls):
    mgr, seq, first, copy = _copy_made(cls, True)
    mgr.release([seq])
    assert mgr.evict([first[1]]) == 1
    hits = mgr.lookup(np.concatenate([PROMPT, [7]]), [2 * BS + 1]).block_ids[0]
    assert hits.tolist() == [first[0], copy]
    again = mgr.admit(np.concatenate([PROMPT, [7]]), [2 * BS + 1])
    assert mgr.block_tables(again.ids)[0][:2].tolist() == [first[0], copy]
    mgr.check()


@pytest.mark.parametrize("eviction", EVICTION_POLICIES)
def test_allocation_evicts_copies_under_every_policy(eviction):
    """Fill the pool past its free blocks: the cached copy is evicted like any cached block,
    and kernels and model pick the same victims and report the same events."""
    sides = []
    for cls in (BlockManager, ReferenceBlockManager):
        mgr, seq, first, copy = _copy_made(cls, True, eviction=eviction)
        mgr.release([seq])
        mgr.take_events()
        big = mgr.admit(1000 + np.arange(8 * BS), [8 * BS])  # every block of the pool
        events = mgr.take_events()
        mgr.check()
        sides.append(
            (mgr.block_tables(big.ids).tolist(), events.kind.tolist(), events.block.tolist())
        )
        assert sorted(events.block[events.kind == BlockEvents.REMOVED].tolist()) == sorted(
            [*first, copy]
        )
    assert sides[0] == sides[1]


@pytest.mark.parametrize("cls", [BlockManager, ReferenceBlockManager])
def test_keyed_copies_are_registered_and_promoted(cls):
    """Engine keys: a block given a key that is registered already is a copy."""
    mgr = cls(8, BS, block_keys=True, block_events=True, cache_duplicates=True)
    keys = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], dtype=np.uint64)
    a, b = mgr.new_sequences(2)
    mgr.append([a, b], [2 * BS, 2 * BS])
    assert mgr.set_keys([a, b], [0, 0], [2, 2], np.concatenate([keys, keys])) == 4
    ta, tb = (mgr.block_tables([x])[0][:2].tolist() for x in (a, b))
    hits = mgr.lookup(None, [2 * BS + 1], keys=keys, key_counts=[2]).block_ids[0]
    assert hits.tolist() == ta
    mgr.release([a])
    assert mgr.evict(ta) == 2
    hits = mgr.lookup(None, [2 * BS + 1], keys=keys, key_counts=[2]).block_ids[0]
    assert hits.tolist() == tb
    events = mgr.take_events()
    assert events.kind.tolist() == [1, 1, 1, 1, 2, 2]
    assert events.block.tolist() == [*ta, *tb, *ta]
    mgr.check()


def test_the_switch_must_be_a_bool():
    with pytest.raises(TypeError, match="cache_duplicates"):
        BlockManager(8, BS, cache_duplicates="yes")


def test_registered_blocks_lists_copies_in_lookup_order():
    """``kvnumba.state.registered_blocks``: the copies of one key in the order lookups try
    them, the reference model's ``_prefix`` then ``_twins``, after every eviction."""
    from kvnumba.state import registered_blocks

    sides = [cls(16, BS, cache_duplicates=True) for cls in (BlockManager, ReferenceBlockManager)]
    for mgr in sides:
        ids = mgr.new_sequences(4)
        mgr.append(ids, [BS] * 4, np.tile(np.arange(BS), 4))  # four copies of one block
        mgr.release(ids[::-1])
    kv, ref = sides
    while kv.stats().cached:
        key = next(iter(ref._prefix))
        want = [ref._prefix[key], *ref._twins.get(key, ())]
        assert registered_blocks(kv.state).tolist() == want
        assert kv.lookup(np.arange(BS + 1), [BS + 1]).block_ids[0].tolist() == [want[0]]
        victim = want[0] if len(want) % 2 == 0 else want[-1]  # the first, or the last copy
        assert kv.evict([victim]) == ref.evict([victim]) == 1
        kv.check()
    assert registered_blocks(kv.state).size == 0
