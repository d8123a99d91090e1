"""Two-level allocation: the virtual pages of a manager and the physical pages behind them.

With a page pool, block ``b`` lives in virtual page ``b // k``. Free blocks of mapped pages sit
on per-page LIFO free lists (linked through ``lru_next``: a free block is on no LRU list);
mapped pages with ``c`` free blocks (``1 <= c < k``) sit in bucket ``c`` (:mod:`.links`), so
the fullest page with a free block is the front of the lowest non-empty bucket. Unmapped virtual pages sit on a LIFO stack. Pages
whose blocks are all free or cached, at least one cached, form the cache-only list, oldest
first. ``docs/design.md`` states the policy these helpers implement.

Every write goes through the undo log (a no-op unless the call is logged), and pool pages are
taken and given back through ``pool_take`` / ``pool_give`` so that a rollback restores the pool
byte for byte as well. These helpers run once per page or per block taken from or returned to
a page, inside the out-of-line helpers of :mod:`.blocks` and :mod:`.give_up`.
"""

import numpy as np

from kvnumba._kernels.jit import inlined, out_of_line
from kvnumba._kernels.links import bucket_push, bucket_unlink, cache_only_push, cache_only_unlink
from kvnumba._kernels.physical_pages import (
    H_FREE_TOP,
    H_MAPS,
    H_UNMAPS,
    pool_give,
    pool_take,
    pool_tick,
    pool_views,
)
from kvnumba._kernels.undo import (
    U_POOL_FREE,
    U_POOL_GIVE,
    U_POOL_HEAD,
    U_POOL_TAKE,
    log_write,
    set_logged,
)
from kvnumba._layout import (
    FIELD,
    M_BUCKET_MIN,
    M_CLIENT,
    M_FREE_MAPPED,
    M_FREE_TOP,
    M_MAPPED,
    M_PAGE_K,
    M_VTOP,
    NIL,
    REC_PHYSICAL,
    REC_VIRTUAL,
    S_MAP_N,
    S_UNMAP_N,
)


@out_of_line
def page_gain_ref(v, page):
    """A block of ``page`` went from refcount 0 to 1."""
    used = v.page_used[page]
    if used == 0 and v.page_free[page] < v.meta[M_PAGE_K]:
        # A mapped page without referenced blocks holds cached ones: it was cache-only.
        cache_only_unlink(v, page)
    set_logged(v, v.page_used, FIELD.page_used, page, used + 1)


@out_of_line
def _make_cache_only(v, page):
    """``page`` has no referenced block left but cached ones: stamp it with the pool clock."""
    head, _, _ = pool_views(v.pool)
    set_logged(v, v.page_stamp, FIELD.page_stamp, page, pool_tick(head))
    cache_only_push(v, page)


@out_of_line
def take_from_pages(v):
    """A free block of the fullest mapped page, else the first block of a newly mapped page.

    Returns the block (refcount bookkeeping of its page done), or NIL when no mapped page has a
    free block and no page can be mapped; the caller then evicts a cached block.
    """
    meta = v.meta
    k = meta[M_PAGE_K]
    c = meta[M_BUCKET_MIN]
    while c < k and v.buckets[c] == NIL:
        c += 1
    meta[M_BUCKET_MIN] = c
    if c < k:
        page = np.int64(v.buckets[c])  # one compiled helper signature: int64 page ids
        bucket_unlink(v, page, c)
        b = np.int64(v.page_head[page])
        set_logged(v, v.page_head, FIELD.page_head, page, v.lru_next[b])
        set_logged(v, v.page_free, FIELD.page_free, page, c - 1)
        if c > 1:
            bucket_push(v, page, c - 1)
        meta[M_FREE_MAPPED] -= 1
        page_gain_ref(v, page)
        return b
    head, free, owner = pool_views(v.pool)
    top = meta[M_VTOP]
    if top == 0 or head[H_FREE_TOP] == 0:
        return NIL
    page = np.int64(v.vstack[top - 1])
    meta[M_VTOP] = top - 1
    phys = pool_take(head, free, owner, meta[M_CLIENT : M_CLIENT + 3], page)
    log_write(v, U_POOL_TAKE, phys, 0)
    log_write(v, U_POOL_HEAD, H_MAPS, head[H_MAPS])
    head[H_MAPS] += 1
    set_logged(v, v.page_phys, FIELD.page_phys, page, phys)
    # The page's free list holds its other blocks, lowest id on top.
    first = page * k
    for j in range(1, k):
        set_logged(v, v.lru_next, FIELD.lru_next, first + j, first + j + 1 if j + 1 < k else NIL)
    set_logged(v, v.page_head, FIELD.page_head, page, first + 1 if k > 1 else NIL)
    set_logged(v, v.page_free, FIELD.page_free, page, k - 1)
    set_logged(v, v.page_used, FIELD.page_used, page, 1)
    if k > 1:
        bucket_push(v, page, k - 1)
    meta[M_FREE_MAPPED] += k - 1
    meta[M_MAPPED] += 1
    n = v.scr[S_MAP_N]
    v.map_rec[n, REC_PHYSICAL] = phys
    v.map_rec[n, REC_VIRTUAL] = page
    v.scr[S_MAP_N] = n + 1
    return first


@out_of_line
def unmap_page(v, page):
    """Give ``page`` (no referenced and no cached block left) back to the pool."""
    meta = v.meta
    k = meta[M_PAGE_K]
    c = np.int64(v.page_free[page])
    if 0 < c < k:
        bucket_unlink(v, page, c)
    phys = v.page_phys[page]
    head, free, owner = pool_views(v.pool)
    # A give overwrites the free-stack slot above the top, which a rollback must restore.
    log_write(v, U_POOL_FREE, head[H_FREE_TOP], free[head[H_FREE_TOP]])
    pool_give(head, free, owner, phys)
    log_write(v, U_POOL_GIVE, phys, page)
    log_write(v, U_POOL_HEAD, H_UNMAPS, head[H_UNMAPS])
    head[H_UNMAPS] += 1
    set_logged(v, v.page_phys, FIELD.page_phys, page, NIL)
    set_logged(v, v.page_free, FIELD.page_free, page, 0)
    set_logged(v, v.page_head, FIELD.page_head, page, NIL)
    top = meta[M_VTOP]
    set_logged(v, v.vstack, FIELD.vstack, top, page)
    meta[M_VTOP] = top + 1
    meta[M_FREE_MAPPED] -= c
    meta[M_MAPPED] -= 1
    n = v.scr[S_UNMAP_N]
    v.unmap_rec[n, REC_PHYSICAL] = phys
    v.unmap_rec[n, REC_VIRTUAL] = page
    v.scr[S_UNMAP_N] = n + 1


@out_of_line
def free_in_page(v, b):
    """Block ``b`` (scrubbed, refcount now 0, not cached) goes back to its page's free list.

    The page is unmapped once all its blocks are free; a page left with cached blocks only
    becomes cache-only.
    """
    k = v.meta[M_PAGE_K]
    page = b // k
    used = v.page_used[page] - 1
    set_logged(v, v.page_used, FIELD.page_used, page, used)
    c = np.int64(v.page_free[page])
    if c > 0:
        bucket_unlink(v, page, c)
    c += 1
    set_logged(v, v.page_free, FIELD.page_free, page, c)
    set_logged(v, v.lru_next, FIELD.lru_next, b, v.page_head[page])
    set_logged(v, v.page_head, FIELD.page_head, page, b)
    v.meta[M_FREE_MAPPED] += 1
    if c == k:
        unmap_page(v, page)
        return
    bucket_push(v, page, c)
    if used == 0:
        _make_cache_only(v, page)


@out_of_line
def evicted_to_page(v, b):
    """Cached block ``b``, just evicted (scrubbed, unflagged), goes back to its page's free
    list; ``evict`` and ``reset_prefix_cache`` only (an eviction for allocation hands the
    block out instead). A cached block's page counts no reference for it, so ``page_used``
    stays; a page left with neither referenced nor cached blocks is unmapped, and one that
    still holds cached blocks stays cache-only with its stamp.
    """
    k = v.meta[M_PAGE_K]
    page = b // k
    c = np.int64(v.page_free[page])
    if c + 1 == k:
        # The page was cache-only (no referenced block) and this was its last cached block.
        cache_only_unlink(v, page)
        unmap_page(v, page)  # takes the page out of its bucket
        return
    if c > 0:
        bucket_unlink(v, page, c)
    set_logged(v, v.page_free, FIELD.page_free, page, c + 1)
    set_logged(v, v.lru_next, FIELD.lru_next, b, v.page_head[page])
    set_logged(v, v.page_head, FIELD.page_head, page, b)
    v.meta[M_FREE_MAPPED] += 1
    bucket_push(v, page, c + 1)


@out_of_line
def cache_in_page(v, b):
    """Block ``b`` went to the LRU list (cached): its page may become cache-only."""
    page = b // v.meta[M_PAGE_K]
    used = v.page_used[page] - 1
    set_logged(v, v.page_used, FIELD.page_used, page, used)
    if used == 0:
        _make_cache_only(v, page)


@inlined
def free_now(v):
    """Blocks a call can take without evicting: the free stack, or with a page pool the free
    blocks of mapped pages plus whole pages the pool can still map."""
    meta = v.meta
    k = meta[M_PAGE_K]
    if k == 0:
        return meta[M_FREE_TOP]
    head, _, _ = pool_views(v.pool)
    return meta[M_FREE_MAPPED] + min(head[H_FREE_TOP], meta[M_VTOP]) * k
