"""Replaying the undo log of :mod:`.undo` backwards: a failed logged call leaves every array
it wrote (the manager's arena and the page pool's) byte-identical to before the call.

Above every module that writes state: it restores any field by its index in ``STATE_FIELDS``
through the arena's header, without knowing what the field means.
"""

import numpy as np

from kvnumba._kernels.carve import carve
from kvnumba._kernels.jit import inlined, out_of_line
from kvnumba._kernels.physical_pages import pool_give, pool_take, pool_views
from kvnumba._kernels.undo import (
    U_POOL_FREE,
    U_POOL_GIVE,
    U_POOL_HEAD,
    U_POOL_TAKE,
    U_TOKROW,
    clear_call_records,
)
from kvnumba._kernels.views import header_entry, views
from kvnumba._layout import (
    H_ITEMSIZE,
    H_OFFSET,
    M_CLIENT,
    S_EV_PAYLOAD,
    S_LOG_N,
    S_LOG_ON,
    S_SAVED_PAYLOAD,
)


@inlined
def restore_element(arena, code, i, old):
    """Write ``old`` back into element ``i`` (flat index) of state field ``code``."""
    offset = header_entry(arena, code, H_OFFSET)
    itemsize = header_entry(arena, code, H_ITEMSIZE)
    if itemsize == 8:
        carve(arena, offset + 8 * i, (1,), np.int64)[0] = old
    elif itemsize == 4:
        carve(arena, offset + 4 * i, (1,), np.int32)[0] = old
    else:
        arena[offset + i] = old


@out_of_line
def rollback(arena, scratch, pool):
    """Replay the undo log backwards and restore ``meta``; ends the logged call.

    Pool entries are replayed in reverse order too, so the pool's free stack and owner records
    come back byte for byte (``pool`` is only read when the log holds pool entries).
    """
    v = views(arena, scratch, pool)
    ulog, scr = v.ulog, v.scr
    for k in range(scr[S_LOG_N] - 1, -1, -1):
        code = ulog[k, 0]
        i = ulog[k, 1]
        old = ulog[k, 2]
        if code >= 0:
            restore_element(arena, code, i, old)
        elif code == U_TOKROW:
            if old < 0:
                v.tokens[i, :] = -1
            else:
                for j in range(v.tokens.shape[1]):
                    v.tokens[i, j] = v.ev_tok[old, j]
        else:
            head, free, owner = pool_views(pool)
            if code == U_POOL_TAKE:
                pool_give(head, free, owner, i)
            elif code == U_POOL_GIVE:
                # The page went on top of the free stack and everything above it was undone.
                pool_take(head, free, owner, v.meta_save[M_CLIENT : M_CLIENT + 3], old)
            elif code == U_POOL_FREE:
                free[i] = old
            elif code == U_POOL_HEAD:
                head[i] = old
    for j in range(v.meta.shape[0]):
        v.meta[j] = v.meta_save[j]
    scr[S_LOG_N] = 0
    scr[S_LOG_ON] = 0
    clear_call_records(scr)


@out_of_line
def undo_failed_call(arena, scratch, pool):
    """End a logged call that failed (an atomic ``admit`` of several prompts) or a give-up
    that is taken back: the log replayed (:func:`rollback`), and the payload switch as it was
    before the call (``S_SAVED_PAYLOAD``).

    Its own entry kernel (``k_rollback``), called by the facade, not by the failing worker:
    the quick start never fails a logged call, so it never compiles the replay.
    """
    rollback(arena, scratch, pool)
    scr = views(arena, scratch, pool).scr
    scr[S_EV_PAYLOAD] = scr[S_SAVED_PAYLOAD]
