"""Intrusive doubly linked LRU list of cached (refcount-0, registered) blocks.

The head is the least recently released block, reclaimed first. An unlinked block keeps its own
``prev``/``next`` ("dancing links"): only the neighbours change, so a logged unlink costs two
entries and the block's links are restored for free.
"""

from numba import njit

from kvnumba._kernels.undo import U_NEXT, U_PREV, log_write
from kvnumba._state import M_CACHED, M_LRU_HEAD, M_LRU_TAIL, NIL


@njit(cache=True, _nrt=False, inline="always")
def lru_unlink(b, lru_prev, lru_next, meta, ulog, scr):
    """Remove cached block ``b`` from the list (O(1))."""
    p = lru_prev[b]
    n = lru_next[b]
    if p == NIL:
        meta[M_LRU_HEAD] = n
    else:
        log_write(ulog, scr, U_NEXT, p, lru_next[p])
        lru_next[p] = n
    if n == NIL:
        meta[M_LRU_TAIL] = p
    else:
        log_write(ulog, scr, U_PREV, n, lru_prev[n])
        lru_prev[n] = p
    meta[M_CACHED] -= 1


@njit(cache=True, _nrt=False, inline="always")
def lru_push_tail(b, lru_prev, lru_next, meta, ulog, scr):
    """Append block ``b`` as the most recently released cached block (O(1))."""
    t = meta[M_LRU_TAIL]
    log_write(ulog, scr, U_PREV, b, lru_prev[b])
    log_write(ulog, scr, U_NEXT, b, lru_next[b])
    lru_prev[b] = t
    lru_next[b] = NIL
    if t == NIL:
        meta[M_LRU_HEAD] = b
    else:
        log_write(ulog, scr, U_NEXT, t, lru_next[t])
        lru_next[t] = b
    meta[M_LRU_TAIL] = b
    meta[M_CACHED] += 1
