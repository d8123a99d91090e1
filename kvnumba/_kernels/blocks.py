"""Taking, releasing and registering single blocks: the O(1) steps every call is made of."""

import numpy as np
from numba import njit

from kvnumba._kernels.lru import lru_push_tail, lru_unlink
from kvnumba._kernels.paging import cache_in_page, free_in_page, page_gain_ref, take_from_pages
from kvnumba._kernels.prefix import (
    chain_hash,
    root_hash,
    table_find,
    table_insert,
    table_mark_evicted,
)
from kvnumba._kernels.undo import (
    U_FLAGS,
    U_HASH,
    U_HASH_LOW,
    U_REF,
    U_SALT,
    U_TOKROW,
    log_write,
)
from kvnumba._kernels.views import unpack_pages
from kvnumba._state import (
    F_HASHED,
    F_KNOWN,
    F_REGISTERED,
    M_ALLOCATIONS,
    M_EVICTIONS,
    M_FREE_TOP,
    M_HASH_BITS,
    M_LRU_HEAD,
    M_PAGE_K,
    M_PREFIX_CACHING,
    M_USED,
    NIL,
    S_EV_N,
    S_EV_PAYLOAD,
    S_LOG_ON,
)


@njit(cache=True, _nrt=False, inline="always")
def evict_block(
    b, lru_prev, lru_next, block_hash, tokens, htab, meta, ulog, scr, ev_ids, ev_hash, ev_tok
):
    """Reclaim cached block ``b``: off the LRU list, its table entry marked, payload recorded
    for ``on_evict`` and scrubbed. The caller sets its refcount and flags."""
    lru_unlink(b, lru_prev, lru_next, meta, ulog, scr)
    record = scr[S_EV_N]
    ev_ids[record] = b
    ev_hash[record] = block_hash[b]
    if scr[S_EV_PAYLOAD] != 0:
        for j in range(tokens.shape[1]):
            ev_tok[record, j] = tokens[b, j]
        log_write(ulog, scr, U_TOKROW, b, record)
    scr[S_EV_N] = record + 1
    table_mark_evicted(htab, meta, b, block_hash[b], record, ulog, scr)
    tokens[b, :] = -1
    meta[M_EVICTIONS] += 1


@njit(cache=True, _nrt=False, inline="always")
def take_block(
    ref,
    lru_prev,
    lru_next,
    block_hash,
    block_flags,
    tokens,
    free_stack,
    htab,
    meta,
    ulog,
    scr,
    ev_ids,
    ev_hash,
    ev_tok,
    arena,
    scratch,
    pool,
):
    """Hand out one block with refcount 1: the free stack's top, else the LRU head (evicted).

    With a page pool: a free block of the fullest mapped page, else a newly mapped page, else
    the LRU head. The caller has checked that a block is available. Free blocks are always
    scrubbed, so the returned block's payload reads -1.
    """
    top = meta[M_FREE_TOP]
    # One test of the log switch instead of one per field: this runs once per block handed out.
    logging = scr[S_LOG_ON] != 0
    if top > 0:
        b = free_stack[top - 1]
        meta[M_FREE_TOP] = top - 1
        if logging:
            log_write(ulog, scr, U_TOKROW, b, -1)
    else:
        b = NIL
        paged = meta[M_PAGE_K] != 0
        if paged:
            pages, _, block_next, buckets, map_rec, _ = unpack_pages(arena, scratch)
            b = take_from_pages(pages, block_next, buckets, map_rec, meta, pool, ulog, scr)
            if b != NIL:
                log_write(ulog, scr, U_TOKROW, b, -1)
        if b == NIL:
            b = meta[M_LRU_HEAD]
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
            if paged:
                pages, _, _, _, _, _ = unpack_pages(arena, scratch)
                page_gain_ref(b // meta[M_PAGE_K], pages, meta, ulog, scr)
    if logging:
        log_write(ulog, scr, U_REF, b, ref[b])
        log_write(ulog, scr, U_FLAGS, b, block_flags[b])
    ref[b] = 1
    block_flags[b] = F_KNOWN
    meta[M_USED] += 1
    meta[M_ALLOCATIONS] += 1
    return b


@njit(cache=True, _nrt=False, inline="always")
def drop_ref(
    b,
    ref,
    lru_prev,
    lru_next,
    block_flags,
    tokens,
    free_stack,
    meta,
    ulog,
    scr,
    arena,
    scratch,
    pool,
):
    """Drop one reference; at zero a registered block is cached, any other block freed.

    With a page pool a freed block returns to its page, which is unmapped once empty.
    """
    r = ref[b] - 1
    log_write(ulog, scr, U_REF, b, ref[b])
    ref[b] = r
    if r == 0:
        meta[M_USED] -= 1
        paged = meta[M_PAGE_K] != 0
        if block_flags[b] & F_REGISTERED:
            lru_push_tail(b, lru_prev, lru_next, meta, ulog, scr)
            if paged:
                pages, page_stamp, _, _, _, _ = unpack_pages(arena, scratch)
                cache_in_page(b, pages, page_stamp, meta, pool, ulog, scr)
        else:
            tokens[b, :] = -1
            log_write(ulog, scr, U_FLAGS, b, block_flags[b])
            block_flags[b] = 0
            if paged:
                pages, page_stamp, block_next, buckets, _, unmap_rec = unpack_pages(arena, scratch)
                free_in_page(
                    b, pages, page_stamp, block_next, buckets, unmap_rec, meta, pool, ulog, scr
                )
            else:
                top = meta[M_FREE_TOP]
                free_stack[top] = b
                meta[M_FREE_TOP] = top + 1


@njit(cache=True, _nrt=False, inline="always")
def register_full_block(
    b,
    parent_block,
    salt,
    block_hash,
    block_salt,
    block_flags,
    tokens,
    htab,
    meta,
    ulog,
    scr,
):
    """Hash a block that just became full and register it unless an equal block is registered.

    ``parent_block`` is the previous block of the same sequence (NIL for the first block). A
    block whose content or whose parent's hash is unknown stays unhashed.
    """
    if meta[M_PREFIX_CACHING] == 0 or (block_flags[b] & F_KNOWN) == 0:
        return
    if parent_block < 0:
        parent = root_hash()
    elif block_flags[parent_block] & F_HASHED:
        parent = block_hash[parent_block]
    else:
        return
    h = chain_hash(parent, salt, tokens[b], meta[M_HASH_BITS])
    old_hash = block_hash[b]
    log_write(ulog, scr, U_HASH, b, np.int64(old_hash >> np.uint64(32)))
    log_write(ulog, scr, U_HASH_LOW, b, np.int64(old_hash & np.uint64(0xFFFFFFFF)))
    log_write(ulog, scr, U_SALT, b, block_salt[b])
    log_write(ulog, scr, U_FLAGS, b, block_flags[b])
    block_hash[b] = h
    block_salt[b] = salt
    flags = block_flags[b] | F_HASHED
    if table_find(htab, block_hash, block_salt, tokens, h, salt, tokens[b]) < 0:
        flags |= F_REGISTERED
        table_insert(htab, meta, b, h, ulog, scr)
    block_flags[b] = flags
