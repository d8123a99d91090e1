"""Taking, releasing and registering single blocks: the O(1) steps every call is made of.

Everything that can run once per block (pop the free stack, evict the LRU head, drop a
reference, hash and register a full block, claim a cached hit) is an :func:`.inlined` helper:
after LLVM inlines it, the views it takes are registers again (out of line, every call would
pass all forty views, once per block). The page bookkeeping these steps reach (taking from a page,
returning a block to it) runs once per page event at most and is compiled once, out of line
(:mod:`.virtual_pages`).
"""

import numpy as np
from numba import int64, void

from kvnumba._kernels.anchors import seq_anchors
from kvnumba._kernels.events import EVENT_REMOVED, EVENT_STORED, note_event
from kvnumba._kernels.eviction import (
    CLAIMED,
    EVICTED,
    EVICTED_VICTIM,
    policy_enter,
    policy_leave,
    policy_registered,
    policy_unregistered,
    policy_victim,
)
from kvnumba._kernels.jit import inlined, out_of_line
from kvnumba._kernels.links import lru_push_tail, lru_unlink
from kvnumba._kernels.page_calls import (
    cache_in_page,
    evicted_to_page,
    free_in_page,
    page_gain_ref,
    take_from_pages,
)
from kvnumba._kernels.prefix import (
    chain_hash,
    root_hash,
    table_find,
    table_insert,
    table_mark_evicted,
    table_remove,
)
from kvnumba._kernels.undo import U_TOKROW, log_write, set_logged
from kvnumba._kernels.views import VIEWS
from kvnumba._layout import (
    F_HASHED,
    F_KNOWN,
    F_REGISTERED,
    FIELD,
    M_ALLOCATIONS,
    M_CACHE_DUPLICATES,
    M_EVICTIONS,
    M_FREE_TOP,
    M_HASH_BITS,
    M_KEYED,
    M_PAGE_K,
    M_PREFIX_CACHING,
    M_USED,
    NIL,
    NULL_BLOCK,
    S_EV_N,
    S_EV_PAYLOAD,
    S_LOG_ON,
    S_RELEASE_LEN,
    S_RELEASE_TAG,
)


@inlined
def evict_block(v, b, victim):
    """Reclaim cached block ``b``: off the LRU list, its table entry marked, payload recorded
    for ``on_evict`` and scrubbed. The caller sets its refcount and flags. ``victim``: the
    eviction policy chose it (else the eviction was asked for)."""
    policy_leave(v, b, EVICTED_VICTIM if victim else EVICTED)
    lru_unlink(v, b)
    scr = v.scr
    record = scr[S_EV_N]
    v.ev_ids[record] = b
    v.ev_hash[record] = v.block_hash[b]
    if scr[S_EV_PAYLOAD] != 0:
        for j in range(v.tokens.shape[1]):
            v.ev_tok[record, j] = v.tokens[b, j]
        log_write(v, U_TOKROW, b, record)
    scr[S_EV_N] = record + 1
    note_event(v, EVENT_REMOVED, b)
    table_mark_evicted(v, b, v.block_hash[b], record)
    v.tokens[b, :] = -1
    v.meta[M_EVICTIONS] += 1


@out_of_line
def evict_to_free(v, b):
    """Evict cached block ``b`` on request (``evict``, ``reset_prefix_cache``): exactly as an
    eviction for allocation (``on_evict`` record, table entry marked, payload scrubbed,
    counted), then the block is free: on the free stack, or with a page pool back on its page,
    which is unmapped once it holds nothing. Out of line: not on any hot path."""
    evict_block(v, b, False)
    v.block_flags[b] = 0
    if v.meta[M_PAGE_K] != 0:
        evicted_to_page(v, np.int64(b))
    else:
        top = v.meta[M_FREE_TOP]
        v.free_stack[top] = b
        v.meta[M_FREE_TOP] = top + 1


@inlined
def take_reclaimed(v):
    """A block when the free stack is empty: from the pages (with a page pool), else the LRU
    head, evicted. The caller has checked that one is available.

    Inlined: it runs once per evicted block; the page code it reaches is out of line.
    """
    b = NIL
    paged = v.meta[M_PAGE_K] != 0
    if paged:
        b = take_from_pages(v)
        if b != NIL:
            log_write(v, U_TOKROW, b, -1)
            return b
    b = policy_victim(v)
    evict_block(v, b, True)
    if paged:
        page_gain_ref(v, b // v.meta[M_PAGE_K])
    return b


@inlined(void(VIEWS, int64, int64))
def hand_out(v, b, flags):
    """Block ``b``, just taken, gets its first reference and ``flags``; counted."""
    v.ref[b] = 1
    v.block_flags[b] = flags
    v.meta[M_USED] += 1
    v.meta[M_ALLOCATIONS] += 1


@inlined
def take_block(v):
    """Hand out one block with refcount 1: the free stack's top, else :func:`take_reclaimed`.

    Free blocks are always scrubbed, so the returned block's payload reads -1.
    """
    meta = v.meta
    top = meta[M_FREE_TOP]
    # One test of the log switch instead of one per field: this runs once per block handed out.
    logging = v.scr[S_LOG_ON] != 0
    if top > 0:
        b = v.free_stack[top - 1]
        meta[M_FREE_TOP] = top - 1
        if logging:
            log_write(v, U_TOKROW, b, -1)
    else:
        b = take_reclaimed(v)
    if logging:
        log_write(v, FIELD.ref, b, v.ref[b])
        log_write(v, FIELD.block_flags, b, v.block_flags[b])
    hand_out(v, b, F_KNOWN)
    return b


@out_of_line
def return_to_page(v, b, cached):
    """Page bookkeeping of block ``b`` that just lost its last reference: cached (on the LRU
    list already) or freed (scrubbed, back on its page's free list)."""
    if cached:
        cache_in_page(v, b)
    else:
        free_in_page(v, b)


@inlined
def releasing(v, slot, length):
    """Sequence ``slot`` is about to drop references (:func:`drop_ref`) at ``length`` tokens:
    what a priority policy sees of the blocks this caches, their ``length`` and the sequence's
    tag."""
    v.scr[S_RELEASE_LEN] = length
    v.scr[S_RELEASE_TAG] = v.seq_tag[slot]


@inlined
def drop_ref(v, b):
    """Drop one reference; at zero a registered block is cached, any other block freed.

    With a page pool a freed block returns to its page, which is unmapped once empty.
    """
    r = v.ref[b] - 1
    log_write(v, FIELD.ref, b, v.ref[b])
    v.ref[b] = r
    if r == 0:
        meta = v.meta
        meta[M_USED] -= 1
        cached = (v.block_flags[b] & F_REGISTERED) != 0
        if cached:
            lru_push_tail(v, b)
            policy_enter(v, b)
        else:
            v.tokens[b, :] = -1
            set_logged(v, v.block_flags, FIELD.block_flags, b, 0)
        if meta[M_PAGE_K] != 0:
            return_to_page(v, np.int64(b), cached)
        elif not cached:
            top = meta[M_FREE_TOP]
            v.free_stack[top] = b
            meta[M_FREE_TOP] = top + 1


@inlined
def register_full_block(v, b, parent_block, salt, slot, pos):
    """Hash a block that just became full and register it unless an equal block is registered
    (with ``cache_duplicates``, register it anyway, after the equal ones).

    ``parent_block`` is the previous block of sequence slot ``slot`` (NIL for the first block,
    ``NULL_BLOCK`` when it left a window: the sequence's anchor holds its hash); ``b`` is at
    position ``pos`` of the sequence. A block whose
    content or whose parent's hash is unknown stays unhashed.
    """
    flags = v.block_flags
    # With engine keys (``block_keys``) blocks are registered by their keys only.
    if v.meta[M_PREFIX_CACHING] == 0 or (flags[b] & F_KNOWN) == 0 or v.meta[M_KEYED] != 0:
        return
    if parent_block == NIL:
        parent = root_hash()
    elif parent_block == NULL_BLOCK:
        if seq_anchors(v)[slot, 1] == 0:
            return
        parent = seq_anchors(v)[slot, 0]
        parent_block = NIL  # a root of the cached prefix forest
    elif flags[parent_block] & F_HASHED:
        parent = v.block_hash[parent_block]
    else:
        return
    h = chain_hash(parent, salt, v.tokens[b], v.meta[M_HASH_BITS])
    # The hash is logged as the int64 with the same bits (the rollback writes bytes back).
    log_write(v, FIELD.block_hash, b, v.block_hash.view(np.int64)[b])
    v.block_hash[b] = h
    set_logged(v, v.block_salt, FIELD.block_salt, b, salt)
    new_flags = flags[b] | F_HASHED
    if v.meta[M_CACHE_DUPLICATES] != 0 or table_find(v, h, salt, v.tokens[b]) < 0:
        new_flags |= F_REGISTERED
        table_insert(v, b, h)
        note_event(v, EVENT_STORED, b)
        policy_registered(v, b, parent_block, 1, pos)
    set_logged(v, flags, FIELD.block_flags, b, new_flags)


@out_of_line(void(VIEWS, int64, int64))
def reclaim_tail(v, b, fill):
    """Make block ``b`` the unshared partial tail of the one sequence holding its first
    ``fill`` tokens: slots past ``fill`` scrubbed to -1, hash and registration dropped (the
    table entry deleted at once, with its removal event). The known-content flag stays: a
    block once marked unknown is never hashed again.

    For ``truncate`` cutting into a block it holds alone, and for the first in-place append
    into a tail that a truncation cut while it was shared (``F_TRIMMED``). Neither call is
    ever rolled back, so nothing is logged. Rare, so out of line.
    """
    for j in range(fill, v.tokens.shape[1]):
        v.tokens[b, j] = -1
    flags = v.block_flags[b]
    if flags & F_REGISTERED:
        table_remove(v, b)
        policy_unregistered(v, b)
    v.block_flags[b] = flags & F_KNOWN


@inlined
def claim_cached(v, b):
    """A prefix hit on cached block ``b`` (refcount 0): off the LRU list, in use again; the
    caller adds the reference."""
    policy_leave(v, b, CLAIMED)
    lru_unlink(v, b)
    v.meta[M_USED] += 1
    if v.meta[M_PAGE_K] != 0:
        page_gain_ref(v, b // v.meta[M_PAGE_K])
