"""Giving cache-only pages back to the pool: ``trim()`` and the sibling reclaim of a call.

A cache-only page holds cached blocks and free blocks but no referenced block. Giving it up
evicts its cached blocks (in ascending id, each exactly like an eviction for allocation) and
unmaps it. ``trim`` commits at once; a sibling giving pages to a failing call keeps its undo
log open until that call has either committed (``commit_give_up``) or failed
(``rollback.undo_failed_call``: the pages are mapped again and their blocks cached as before).
"""

from kvnumba._kernels.blocks import evict_block
from kvnumba._kernels.jit import out_of_line
from kvnumba._kernels.links import cache_only_unlink
from kvnumba._kernels.prefix import table_purge_evicted
from kvnumba._kernels.undo import clear_call_records, set_logged, start_log
from kvnumba._kernels.views import views
from kvnumba._kernels.virtual_pages import unmap_page
from kvnumba._layout import (
    F_REGISTERED,
    FIELD,
    M_CO_HEAD,
    M_PAGE_K,
    NIL,
    S_EV_N,
    S_EV_PAYLOAD,
    S_LOG_ON,
    S_SAVED_PAYLOAD,
)


@out_of_line
def run_give_up(max_pages, logged, arena, scratch, pool):
    """Give up to ``max_pages`` cache-only pages back to the pool, oldest first.

    Returns the number of pages unmapped. The facade has sized the eviction records (and, if
    ``logged``, the undo log) for ``max_pages`` whole pages.
    """
    v = views(arena, scratch, pool)
    meta, scr = v.meta, v.scr
    k = meta[M_PAGE_K]
    if logged:
        start_log(v)
    clear_call_records(scr)
    done = 0
    while done < max_pages and meta[M_CO_HEAD] != NIL:
        page = meta[M_CO_HEAD]
        cache_only_unlink(v, page)
        for b in range(page * k, page * k + k):
            if v.ref[b] == 0 and v.block_flags[b] & F_REGISTERED:
                evict_block(v, b, False)
                set_logged(v, v.block_flags, FIELD.block_flags, b, 0)
        unmap_page(v, page)
        done += 1
    if not logged and scr[S_EV_N] > 0:
        table_purge_evicted(v)
    return done


@out_of_line
def commit_give_up(arena, scratch, pool):
    """End a logged give-up whose pages the failing call used: drop the table marks."""
    scr = views(arena, scratch, pool).scr
    if scr[S_EV_N] > 0:
        table_purge_evicted(views(arena, scratch, pool))
    scr[S_LOG_ON] = 0
    scr[S_EV_PAYLOAD] = scr[S_SAVED_PAYLOAD]
