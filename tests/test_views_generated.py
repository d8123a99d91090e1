"""The generated view-carving kernel matches the field tables it is generated from, and
``carve`` (the intrinsic it is made of) makes the same views as numpy slicing."""

from __future__ import annotations

import gc
import sys

import numpy as np
import pytest
from numba import njit

from kvnumba import BlockManager
from kvnumba._kernels import views
from kvnumba._kernels.carve import carve, carve_py
from kvnumba._layout import SCRATCH_FIELDS, STATE_FIELDS


def test_generated_module_is_current():
    # Regenerate with ``python -m kvnumba._kernels.views`` after changing a field table.
    assert views.GENERATED.read_text() == views.generate()


def test_views_name_every_field_in_table_order():
    # Every field but the eviction policies' and the window anchors (carved where used).
    names = [f.name for f in (*STATE_FIELDS, *SCRATCH_FIELDS) if f.viewed]
    assert list(views.Views._fields) == [*names, "arena", "scratch", "pool"]
    assert {f.name for f in STATE_FIELDS if not f.viewed} == {
        "pol_words",
        "pol_links",
        "seq_anchor",
    }


def test_carved_views_are_the_state_arrays():
    mgr = BlockManager(32, 4, max_seqs=4)
    (s,) = mgr.new_sequences(1)
    mgr.append([s], [6], np.arange(6))
    # The generated source compiled with numba's runtime, so that the views can come back to
    # Python (the kernel itself runs without it).
    carve_all = njit(getattr(views.views, "py_func", views.views))
    carved = carve_all(mgr._arenas.arena, mgr._arenas.scratch, mgr._arenas.scratch)
    for f in STATE_FIELDS:
        if not f.viewed:
            continue
        got = getattr(carved, f.name)
        want = getattr(mgr.state, f.name)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(got, want), f.name
        assert want.size == 0 or np.shares_memory(got, want), f.name


def test_the_policy_code_carves_the_policy_fields():
    from kvnumba._kernels.eviction import pol_links, pol_words

    mgr = BlockManager(32, 4, max_seqs=4, eviction="leaf-lru")
    (s,) = mgr.new_sequences(1)
    mgr.append([s], [8], np.arange(8))
    mgr.release([s])  # two cached blocks: the policy fields hold something
    carve_views = njit(getattr(views.views, "py_func", views.views))
    both = njit(lambda a, x: (pol_links(carve_views(a, x, x)), pol_words(carve_views(a, x, x))))
    links, words = both(mgr._arenas.arena, mgr._arenas.scratch)
    for got, want in ((links, mgr.state.pol_links), (words, mgr.state.pol_words)):
        assert got.shape == want.shape and np.array_equal(got, want)
        assert np.shares_memory(got, want)


def test_the_window_code_carves_the_anchors():
    from kvnumba._kernels.anchors import seq_anchors

    mgr = BlockManager(32, 4, max_seqs=4, sliding_window=3)
    (s,) = mgr.new_sequences(1)
    mgr.append([s], [8], np.arange(8))
    mgr.append([s], [1], [8])  # block 0 leaves the window: its hash is the anchor
    carve_views = njit(getattr(views.views, "py_func", views.views))
    anchors = njit(lambda a, x: seq_anchors(carve_views(a, x, x)))(
        mgr._arenas.arena, mgr._arenas.scratch
    )
    want = mgr.state.seq_anchor
    assert anchors.shape == want.shape and np.array_equal(anchors, want)
    assert np.shares_memory(anchors, want) and want[:, 1].sum() == 1


@njit
def _carve_both(arena, offset, rows, cols):
    return (
        carve(arena, offset, (rows * cols,), np.int32),
        carve(arena, offset, (rows, cols), np.int64),
        carve(arena, offset, (rows,), np.uint8),
    )


@pytest.mark.parametrize(("offset", "rows", "cols"), [(0, 1, 1), (8, 3, 5), (64, 2, 4), (8, 0, 3)])
def test_carve_matches_numpy_views(offset, rows, cols):
    arena = np.arange(256, dtype=np.uint8)
    flat, table, raw = _carve_both(arena, offset, rows, cols)
    assert np.array_equal(flat, carve_py(arena, offset, (rows * cols,), np.int32))
    assert np.array_equal(table, carve_py(arena, offset, (rows, cols), np.int64))
    assert np.array_equal(raw, carve_py(arena, offset, (rows,), np.uint8))
    assert table.shape == (rows, cols) and table.flags.c_contiguous
    # Views, not copies: a write through one shows in the arena.
    if rows:
        table[0, 0] = -1
        assert (arena[offset : offset + 8] == 255).all()


def test_carved_view_holds_a_reference_to_its_arena():
    # A view borrows the arena's memory: while it lives the arena cannot go, and once it is
    # gone no reference is left behind (numba's runtime counts them).
    arena = np.zeros(64, dtype=np.uint8)
    alone = sys.getrefcount(arena)
    view = _carve_both(arena, 8, 1, 1)[1]
    assert sys.getrefcount(arena) > alone
    view[0, 0] = 5
    del view
    gc.collect()
    assert sys.getrefcount(arena) == alone
    assert arena[8] == 5


def test_carve_takes_only_a_byte_arena():
    import numba

    @njit
    def carve_int_arena(arena):
        return carve(arena, 0, (1,), np.int64)

    # A typing error when compiled, a TypeError in Python (NUMBA_DISABLE_JIT).
    with pytest.raises((numba.TypingError, TypeError)):
        carve_int_arena(np.zeros(8, dtype=np.int64))
