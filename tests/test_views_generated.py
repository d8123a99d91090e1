"""The generated view-carving kernel matches the field tables it is generated from."""

from __future__ import annotations

import numpy as np

from kvnumba import BlockManager
from kvnumba._kernels import views
from kvnumba._state import SCRATCH_FIELDS, STATE_FIELDS


def test_generated_module_is_current():
    # Regenerate with ``python -m kvnumba._kernels.views`` after changing a field table.
    assert views.GENERATED.read_text() == views.generate()


def test_views_name_every_field_in_table_order():
    names = [f.name for f in (*STATE_FIELDS, *SCRATCH_FIELDS)]
    assert list(views.Views._fields) == [*names, "arena", "scratch", "pool"]


def test_carved_views_are_the_state_arrays():
    mgr = BlockManager(32, 4, max_seqs=4)
    (s,) = mgr.new_sequences(1)
    mgr.append([s], [6], np.arange(6))
    carve = getattr(views.views, "py_func", views.views)  # the Python source of the kernel
    carved = carve(mgr._arena, mgr._scratch, mgr._scratch)
    for f in STATE_FIELDS:
        got = getattr(carved, f.name)
        want = getattr(mgr.state, f.name)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(got, want), f.name
        assert want.size == 0 or np.shares_memory(got, want), f.name
