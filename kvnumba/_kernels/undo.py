"""Undo log: record every state write of a call so that a failure restores the arrays exactly.

Only calls whose later steps depend on what earlier steps did (atomic ``admit`` of several
prompts, a sibling's give-up of pages) switch the log on; every other call checks its whole
need before it writes anything. ``meta`` is saved whole at the start of a logged call, so
counters, stack tops and list ends need no entries.

An entry is ``(code, index, old value)``. A code ``>= 0`` is the index of a field of
``STATE_FIELDS`` (:data:`FIELD` names them) and ``index`` the flat element index in it: the
rollback writes ``old`` back through the arena's header, whatever the field. Negative codes
are the few writes that are not one element of the manager's own arena. This module is a
leaf: the kernels that write state import it; :mod:`.rollback` replays it.
"""

from numba import int64, void

from kvnumba._kernels.jit import inlined, out_of_line
from kvnumba._kernels.views import VIEWS, array_type
from kvnumba._layout import (
    S_EV_N,
    S_EV_PAYLOAD,
    S_EVT_N,
    S_FAILED,
    S_LOG_N,
    S_LOG_ON,
    S_MAP_N,
    S_SAVED_PAYLOAD,
    S_UNMAP_N,
)
from kvnumba.eviction import PRIORITY_CODE

# Writes that are not a single element of a state field:
U_TOKROW = -1  # index = block; old = eviction record row holding the payload, or -1 (row was -1)
U_POOL_TAKE = -2  # index = physical page taken from the pool: undone by giving it back
U_POOL_GIVE = -3  # index = physical page given back, old = its virtual page: undone by a take
U_POOL_HEAD = -4  # a counter slot of the pool's head
U_POOL_FREE = -5  # a slot of the pool's free stack, overwritten when a page is given back
NOT_LOGGED = -100  # list ends kept in ``meta``, which a logged call saves whole

# Upper bounds of the entries a logged call writes, used to size the log before the call:
# a block taken writes at most 3 entries (take) + 3 (eviction) + 1 (table) + 10 (registration, 8 with a key)
# and with a page pool up to 20 more (bucket moves, the page's free list, cache-only list);
# a sequence opened writes 8 (slot fields, length); a page mapped writes its free list.
_PER_BLOCK = 18
_PER_BLOCK_PAGED = _PER_BLOCK + 20
_PER_SEQUENCE = 8
_PER_PAGE = 16


@inlined
def clear_call_records(scr):
    """Start a call's records empty: evictions, events, pages mapped and unmapped, and the
    flag of a partial failure (what the facade reads once the call returned)."""
    scr[S_EV_N] = 0
    scr[S_EVT_N] = 0
    scr[S_MAP_N] = 0
    scr[S_UNMAP_N] = 0
    scr[S_FAILED] = 0


@inlined
def start_log(v):
    """Switch the undo log on for a call: ``meta`` saved whole, the log empty, and every
    eviction's payload kept (a rollback restores it); the payload switch is saved to be put
    back when the call ends."""
    for j in range(v.meta.shape[0]):
        v.meta_save[j] = v.meta[j]
    v.scr[S_LOG_N] = 0
    v.scr[S_LOG_ON] = 1
    v.scr[S_SAVED_PAYLOAD] = v.scr[S_EV_PAYLOAD]
    v.scr[S_EV_PAYLOAD] = 1


# Reached only in logged calls (log_write tests the switch inline), so out of line: every
# logged write site stays a test and a call.
@out_of_line(void(int64[:, ::1], int64[::1], int64, int64, int64))
def append_entry(ulog, scr, code, index, old):
    """Append ``(code, index, old)`` to the undo log (the caller checked it is on)."""
    n = scr[S_LOG_N]
    ulog[n, 0] = code
    ulog[n, 1] = index
    ulog[n, 2] = old
    scr[S_LOG_N] = n + 1


@inlined(void(VIEWS, int64, int64, int64))
def log_write(v, code, index, old):
    """Append ``(code, index, old)`` to the undo log of views ``v`` if the call is logged."""
    if v.scr[S_LOG_ON] != 0:  # tested inline: most calls are not logged
        append_entry(v.ulog, v.scr, code, index, old)


@inlined([void(VIEWS, array_type(t), int64, int64, int64) for t in ("int32", "int64", "uint8")])
def set_logged(v, array, code, index, value):
    """``array[index] = value`` for a 1-D state field, logged under ``code``."""
    log_write(v, code, index, array[index])
    array[index] = value


def undo_log_rows(blocks, prompts, blocks_per_page, num_pages):
    """Entries a logged call taking at most ``blocks`` blocks for ``prompts`` new sequences
    can write: the one bound, used by the facade (as Python) and the kernels (compiled, as
    :func:`undo_log_rows_kernel`)."""
    per_block = _PER_BLOCK_PAGED if blocks_per_page else _PER_BLOCK
    maps = min(num_pages, blocks)
    return per_block * blocks + _PER_SEQUENCE * prompts + (blocks_per_page + _PER_PAGE) * maps


undo_log_rows_kernel = inlined(undo_log_rows)


def policy_log_rows(policy, num_blocks, blocks, cached):
    """Entries an eviction policy other than LRU adds to a logged call that takes or claims
    at most ``blocks`` blocks while ``cached`` blocks are cached (0 for LRU).

    Per block, a heap removal and insertion (two entries per level each), a child unlinked
    and its parent made a leaf; per cached block at most once in a call, SIEVE's hand clearing
    its visited count, or an orphaned child re-keyed. A priority policy re-keys a block's parent
    when the block enters or leaves the cache, and writes four more words per registration.
    """
    if policy == 0:
        return 0
    levels = 1
    n = num_blocks
    while n > 1:
        n >>= 1
        levels += 1
    rows = (4 * levels + 24) * blocks + (2 * levels + 8) * cached
    if policy == PRIORITY_CODE:
        rows += (4 * levels + 8) * blocks
    return rows


policy_log_rows_kernel = inlined(policy_log_rows)


def give_up_log_rows(pages, blocks_per_page):
    """Entries a logged give-up of ``pages`` cache-only pages can write."""
    return pages * (_PER_PAGE + _PER_BLOCK * blocks_per_page)
