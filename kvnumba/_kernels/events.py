"""Block events (``block_events=True``): registrations and removals, in the order they happen.

Events are rows ``(kind, block, key words 0-3)`` in the scratch arena, appended as a call
registers or removes blocks; the facade collects them after the call committed (a failed call's
rows are dropped with it). In token mode the key of an event is the chained hash and three
zero words. A leaf module: the prefix table and the block steps both record events.
"""

import numpy as np
from numba import int64, void

from kvnumba._kernels.jit import inlined, out_of_line
from kvnumba._kernels.views import VIEWS
from kvnumba._layout import EVT_BLOCK, EVT_KEY0, EVT_KIND, M_EVENTS, M_KEYED, S_EVT_N

EVENT_STORED = 1
EVENT_REMOVED = 2


@out_of_line(void(VIEWS, int64, int64))
def record_event(v, kind, b):
    """Append an event row for block ``b`` (its key as it is now); once per event at most."""
    n = v.scr[S_EVT_N]
    v.evt[n, EVT_KIND] = kind
    v.evt[n, EVT_BLOCK] = b
    if v.meta[M_KEYED] != 0:
        for w in range(4):
            v.evt[n, EVT_KEY0 + w] = np.int64(v.block_key[b, w])
    else:
        v.evt[n, EVT_KEY0] = np.int64(v.block_hash[b])
        for w in range(1, 4):
            v.evt[n, EVT_KEY0 + w] = 0
    v.scr[S_EVT_N] = n + 1


# Explicit signatures: call sites pass literal kinds and int32 or int64 blocks, which would
# otherwise compile a version per combination.
@inlined(void(VIEWS, int64, int64))
def note_event(v, kind, b):
    """:func:`record_event` when the manager records events (tested inline: most do not)."""
    if v.meta[M_EVENTS] != 0:
        record_event(v, kind, b)
