"""The ``seq_anchor`` field of windowed attention, carved where it is used.

It is not part of the views (``Field.viewed``): every kernel builds every view and every
out-of-line helper taking the views passes each of them, so a field that only windowed
managers write would cost every kernel's compile time. The few places that read or write it
carve it from the state arena here.
"""

import numpy as np
from numba import njit

from kvnumba._kernels.carve import carve
from kvnumba._kernels.views import header_entry
from kvnumba._layout import FIELD, H_DIM0, H_OFFSET


# Inlined at numba's IR level: a helper compiled without NRT may not return an array it made.
@njit(cache=True, inline="always")
def seq_anchors(v):
    """The ``seq_anchor`` field (uint64, ``(max_seqs, 2)``: hash, known) of views ``v``."""
    arena = v.arena
    shape = (header_entry(arena, FIELD.seq_anchor, H_DIM0), 2)
    return carve(arena, header_entry(arena, FIELD.seq_anchor, H_OFFSET), shape, np.uint64)
