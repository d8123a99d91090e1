"""Giving cache-only pages back to the pool: ``trim()`` and the sibling reclaim of a call.

A cache-only page holds cached blocks and free blocks but no referenced block. Giving it up
evicts its cached blocks (in ascending id, each exactly like an eviction for allocation) and
unmaps it. ``trim`` commits at once; a sibling giving pages to a failing call keeps its undo
log open until that call has either committed (``commit_give_up``) or failed
(``rollback_give_up``).
"""

from numba import njit

from kvnumba._kernels.blocks import evict_block
from kvnumba._kernels.paging import cache_only_unlink, unmap_page
from kvnumba._kernels.prefix import table_purge_evicted
from kvnumba._kernels.undo import U_FLAGS, log_write, rollback
from kvnumba._kernels.views import unpack, unpack_pages
from kvnumba._state import (
    F_REGISTERED,
    M_CO_HEAD,
    M_PAGE_K,
    NIL,
    S_EV_N,
    S_EV_PAYLOAD,
    S_LOG_N,
    S_LOG_ON,
    S_MAP_N,
    S_SAVED_PAYLOAD,
    S_UNMAP_N,
)


@njit(cache=True, _nrt=False)
def run_give_up(max_pages, logged, arena, scratch, pool):
    """Give up to ``max_pages`` cache-only pages back to the pool, oldest first.

    Returns the number of pages unmapped. The facade has sized the eviction records (and, if
    ``logged``, the undo log) for ``max_pages`` whole pages.
    """
    (ref, lru_prev, lru_next, _, block_hash, _, block_flags, tokens, htab, _, _, _, _, _, _,
     meta, ulog, ev_ids, ev_hash, ev_tok, _, scr, meta_save) = unpack(arena, scratch)  # fmt: skip
    pages, _, _, buckets, _, unmap_rec = unpack_pages(arena, scratch)
    k = meta[M_PAGE_K]
    if logged:
        for j in range(meta.shape[0]):
            meta_save[j] = meta[j]
        scr[S_LOG_N] = 0
        scr[S_LOG_ON] = 1
        scr[S_SAVED_PAYLOAD] = scr[S_EV_PAYLOAD]
        scr[S_EV_PAYLOAD] = 1
    scr[S_EV_N] = 0
    scr[S_MAP_N] = 0
    scr[S_UNMAP_N] = 0
    done = 0
    while done < max_pages and meta[M_CO_HEAD] != NIL:
        v = meta[M_CO_HEAD]
        cache_only_unlink(v, pages, meta, ulog, scr)
        for b in range(v * k, v * k + k):
            if ref[b] == 0 and block_flags[b] & F_REGISTERED:
                evict_block(
                    b,
                    lru_prev,
                    lru_next,
                    block_hash,
                    tokens,
                    htab,
                    meta,
                    ulog,
                    scr,
                    ev_ids,
                    ev_hash,
                    ev_tok,
                )
                log_write(ulog, scr, U_FLAGS, b, block_flags[b])
                block_flags[b] = 0
        unmap_page(v, pages, buckets, unmap_rec, meta, pool, ulog, scr)
        done += 1
    if not logged:
        table_purge_evicted(htab, block_hash, ev_hash, scr[S_EV_N])
    return done


@njit(cache=True, _nrt=False)
def commit_give_up(arena, scratch):
    """End a logged give-up whose pages the failing call used: drop the table marks."""
    (_, _, _, _, block_hash, _, _, _, htab, _, _, _, _, _, _, _, _, _, ev_hash, _, _, scr,
     _) = unpack(arena, scratch)  # fmt: skip
    table_purge_evicted(htab, block_hash, ev_hash, scr[S_EV_N])
    scr[S_LOG_ON] = 0
    scr[S_EV_PAYLOAD] = scr[S_SAVED_PAYLOAD]


@njit(cache=True, _nrt=False)
def rollback_give_up(arena, scratch, pool):
    """Undo a logged give-up: the pages are mapped again and their blocks cached as before."""
    rollback(arena, scratch, pool)
    (_, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, _, scr, _) = unpack(arena, scratch)
    scr[S_EV_PAYLOAD] = scr[S_SAVED_PAYLOAD]
