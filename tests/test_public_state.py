"""What integrations read of a manager is public: ``kvnumba.state`` names ``mgr.state``'s
fields, and the parts of the facade keep to their declared interfaces."""

from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest

import kvnumba
from kvnumba import errors as E
from kvnumba.state import NIL, BlockFlag, Meta, free_blocks, seq_slot, slot_mask

PACKAGE = pathlib.Path(kvnumba.__file__).parent


def _cached_lru_order(state) -> list[int]:
    out, b = [], int(state.meta[Meta.LRU_HEAD])
    while b != NIL:
        out.append(b)
        b = int(state.lru_next[b])
    return out


def test_meta_and_flags_describe_the_state_as_stats_do():
    mgr = kvnumba.BlockManager(32, 4, max_seqs=8, reserved_blocks=1)
    first = mgr.admit(np.arange(12), [12])  # 3 full blocks
    second = mgr.admit(np.arange(100, 109), [9])  # 2 full blocks and a partial one
    mgr.release(first.ids)
    mgr.release(second.ids)
    state, stats = mgr.state, mgr.stats()
    assert int(state.meta[Meta.USED]) + mgr.reserved_blocks == stats.used
    assert int(state.meta[Meta.CACHED]) == stats.cached == 5
    assert int(state.meta[Meta.FREE_TOP]) == stats.free
    assert int(state.meta[Meta.LIVE_SEQS]) == 0
    # Released tail first: the least recently used cached block is the second prompt's tail.
    order = _cached_lru_order(state)
    assert len(order) == 5 and int(state.meta[Meta.LRU_TAIL]) == order[-1]
    for block in order:
        assert state.block_flags[block] & BlockFlag.REGISTERED
        assert state.block_flags[block] & BlockFlag.HASHED
        assert state.block_flags[block] & BlockFlag.KNOWN
        assert state.ref[block] == 0
    free = free_blocks(state)
    assert len(free) == stats.free and not set(free.tolist()) & set(order)


def test_free_blocks_lists_the_empty_blocks_in_the_order_allocations_take_them():
    mgr = kvnumba.BlockManager(16, 2, max_seqs=4, reserved_blocks=2)
    assert free_blocks(mgr.state).tolist() == list(range(2, 16))  # lowest unreserved first
    a = mgr.admit(np.arange(5), [5])  # takes three blocks
    b = mgr.admit(np.arange(50, 53), [3])  # two more
    mgr.release(a.ids)  # three blocks: the tail (partial) freed first, the two full ones cached
    expected = free_blocks(mgr.state).tolist()
    assert len(expected) == mgr.stats().free == 16 - 2 - 2 - 2
    # The next allocations take exactly these blocks, in this order.
    seq = mgr.new_sequences(1)
    mgr.append(seq, [2 * len(expected)])
    row = mgr.state.seq_table[seq_slot(int(seq[0]), mgr.max_seqs)]
    assert row[: len(expected)].tolist() == expected
    assert free_blocks(mgr.state).tolist() == [] and mgr.stats().cached == 2
    mgr.release(np.concatenate([b.ids, seq]))
    mgr.check()


def test_seq_slot_and_slot_mask_name_the_table_row():
    mgr = kvnumba.BlockManager(64, 4, max_seqs=5)
    ids = mgr.new_sequences(3)
    mgr.release(ids[:1])
    ids = np.concatenate([ids[1:], mgr.new_sequences(2)])  # slots reused, new generations
    mgr.append(ids, [5, 1, 9, 2])
    mask = slot_mask(mgr.max_seqs)
    for seq_id in ids.tolist():
        slot = seq_slot(seq_id, mgr.max_seqs)
        assert slot == seq_id & mask
        assert np.array_equal(mgr.state.seq_table[slot], mgr.table_row(seq_id))
        assert mgr.state.seq_len[slot] == mgr.seq_lens([seq_id])[0]


def test_meta_names_are_plain_ints_for_indexing():
    names = [v for k, v in vars(Meta).items() if k.isupper()]
    flags = [v for k, v in vars(BlockFlag).items() if k.isupper()]
    assert names and all(type(v) is int for v in names)
    assert len(set(names)) == len(names)
    assert all(type(v) is int and v & (v - 1) == 0 for v in flags)  # one bit each


def _imports(path: pathlib.Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append(node.module)
            found += [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
    return found


@pytest.mark.parametrize("outside", ["integrations", "sim", "bench", "reference", "cli.py"])
def test_no_module_outside_the_core_imports_a_private_core_module(outside):
    paths = [PACKAGE / outside] if outside.endswith(".py") else (PACKAGE / outside).rglob("*.py")
    offenders = []
    for path in paths:
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] == "kvnumba" and len(parts) > 1 and parts[1].startswith("_"):
                offenders.append(f"{path.relative_to(PACKAGE)}: {name}")
    assert not offenders


def test_every_failure_status_has_its_typed_exception():
    statuses = {v for k, v in vars(E).items() if k.startswith("ST_")}
    # Success, and the retry the pipeline handles itself, are no failures.
    assert statuses - set(E.STATUS_ERRORS) == {E.ST_OK, E.ST_NEED_BUFFERS}


def test_the_page_side_implements_the_pool_member_protocol():
    from kvnumba.pages.coordinator import PoolMember
    from kvnumba.pages.member import PageSide

    wanted = {name for name in vars(PoolMember) if not name.startswith("_")}
    wanted |= set(PoolMember.__annotations__)
    pool = kvnumba.PagePool(4)
    mgr = kvnumba.BlockManager(16, 4, page_pool=pool, blocks_per_page=4)
    side = mgr._pages
    assert isinstance(side, PageSide)
    missing = {name for name in wanted if not hasattr(side, name)}
    assert not missing
    assert side.alive and side.unmapped_pages() == 4 and side.cache_only_count() == 0
    mgr.close()
    assert not side.alive
