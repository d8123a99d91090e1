"""Two-level allocation: the virtual pages of a manager and the physical pages behind them.

With a page pool, block ``b`` lives in virtual page ``b // k``. Free blocks of mapped pages sit
on per-page LIFO free lists (linked through ``block_next``); mapped pages with ``c`` free blocks
(``1 <= c < k``) sit in bucket ``c``, a LIFO list, so the fullest page with a free block is the
front of the lowest non-empty bucket. Unmapped virtual pages sit on a LIFO stack. Pages whose
blocks are all free or cached, at least one cached, form the cache-only list, oldest first.
``docs/design.md`` states the policy these helpers implement.

Every write goes through the undo log (a no-op unless the call is logged), and pool pages are
taken and given back through ``pool_take`` / ``pool_give`` so that a rollback restores the pool
byte for byte as well.
"""

from numba import njit

from kvnumba._kernels.pool import (
    H_FREE_TOP,
    H_MAPS,
    H_UNMAPS,
    pool_give,
    pool_take,
    pool_tick,
    pool_views,
)
from kvnumba._kernels.undo import (
    U_BNEXT,
    U_BUCKET,
    U_PAGE,
    U_POOL_GIVE,
    U_POOL_TAKE,
    U_POOLFREE,
    U_POOLHEAD,
    U_STAMP,
    log_write,
)
from kvnumba._state import (
    M_BUCKET_MIN,
    M_CLIENT,
    M_CO_COUNT,
    M_CO_HEAD,
    M_CO_TAIL,
    M_FREE_MAPPED,
    M_FREE_TOP,
    M_MAPPED,
    M_PAGE_K,
    M_VTOP,
    NIL,
    PG_BNEXT,
    PG_BPREV,
    PG_CNEXT,
    PG_COLS,
    PG_CPREV,
    PG_FREE,
    PG_HEAD,
    PG_PHYS,
    PG_USED,
    PG_VSTACK,
    S_MAP_N,
    S_UNMAP_N,
)


@njit(cache=True, _nrt=False, inline="always")
def set_page(pages, v, column, value, ulog, scr):
    """``pages[v, column] = value``, logged."""
    log_write(ulog, scr, U_PAGE, v * PG_COLS + column, pages[v, column])
    pages[v, column] = value


@njit(cache=True, _nrt=False, inline="always")
def bucket_unlink(v, c, pages, buckets, ulog, scr):
    """Remove page ``v`` from bucket ``c``."""
    prev = pages[v, PG_BPREV]
    nxt = pages[v, PG_BNEXT]
    if prev == NIL:
        log_write(ulog, scr, U_BUCKET, c, buckets[c])
        buckets[c] = nxt
    else:
        set_page(pages, prev, PG_BNEXT, nxt, ulog, scr)
    if nxt != NIL:
        set_page(pages, nxt, PG_BPREV, prev, ulog, scr)
    set_page(pages, v, PG_BPREV, NIL, ulog, scr)
    set_page(pages, v, PG_BNEXT, NIL, ulog, scr)


@njit(cache=True, _nrt=False, inline="always")
def bucket_push(v, c, pages, buckets, meta, ulog, scr):
    """Put page ``v`` at the front of bucket ``c``."""
    front = buckets[c]
    set_page(pages, v, PG_BNEXT, front, ulog, scr)
    if front != NIL:
        set_page(pages, front, PG_BPREV, v, ulog, scr)
    log_write(ulog, scr, U_BUCKET, c, front)
    buckets[c] = v
    if c < meta[M_BUCKET_MIN]:
        meta[M_BUCKET_MIN] = c


@njit(cache=True, _nrt=False, inline="always")
def cache_only_unlink(v, pages, meta, ulog, scr):
    """Remove page ``v`` from the cache-only list."""
    prev = pages[v, PG_CPREV]
    nxt = pages[v, PG_CNEXT]
    if prev == NIL:
        meta[M_CO_HEAD] = nxt
    else:
        set_page(pages, prev, PG_CNEXT, nxt, ulog, scr)
    if nxt == NIL:
        meta[M_CO_TAIL] = prev
    else:
        set_page(pages, nxt, PG_CPREV, prev, ulog, scr)
    set_page(pages, v, PG_CPREV, NIL, ulog, scr)
    set_page(pages, v, PG_CNEXT, NIL, ulog, scr)
    meta[M_CO_COUNT] -= 1


@njit(cache=True, _nrt=False, inline="always")
def cache_only_push(v, pages, page_stamp, meta, pool, ulog, scr):
    """Append page ``v`` to the cache-only list, stamped with a tick of the pool clock."""
    head, _, _ = pool_views(pool)
    log_write(ulog, scr, U_STAMP, v, page_stamp[v])
    page_stamp[v] = pool_tick(head)
    tail = meta[M_CO_TAIL]
    set_page(pages, v, PG_CPREV, tail, ulog, scr)
    set_page(pages, v, PG_CNEXT, NIL, ulog, scr)
    if tail == NIL:
        meta[M_CO_HEAD] = v
    else:
        set_page(pages, tail, PG_CNEXT, v, ulog, scr)
    meta[M_CO_TAIL] = v
    meta[M_CO_COUNT] += 1


@njit(cache=True, _nrt=False, inline="always")
def page_gain_ref(v, pages, meta, ulog, scr):
    """A block of page ``v`` went from refcount 0 to 1."""
    used = pages[v, PG_USED]
    if used == 0 and pages[v, PG_FREE] < meta[M_PAGE_K]:
        # A mapped page without referenced blocks holds cached ones: it was cache-only.
        cache_only_unlink(v, pages, meta, ulog, scr)
    set_page(pages, v, PG_USED, used + 1, ulog, scr)


@njit(cache=True, _nrt=False, inline="always")
def take_from_pages(pages, block_next, buckets, map_rec, meta, pool, ulog, scr):
    """A free block of the fullest mapped page, else the first block of a newly mapped page.

    Returns the block (refcount bookkeeping of its page done), or NIL when no mapped page has a
    free block and no page can be mapped; the caller then evicts a cached block.
    """
    k = meta[M_PAGE_K]
    c = meta[M_BUCKET_MIN]
    while c < k and buckets[c] == NIL:
        c += 1
    meta[M_BUCKET_MIN] = c
    if c < k:
        v = buckets[c]
        bucket_unlink(v, c, pages, buckets, ulog, scr)
        b = pages[v, PG_HEAD]
        set_page(pages, v, PG_HEAD, block_next[b], ulog, scr)
        set_page(pages, v, PG_FREE, c - 1, ulog, scr)
        if c > 1:
            bucket_push(v, c - 1, pages, buckets, meta, ulog, scr)
        meta[M_FREE_MAPPED] -= 1
        page_gain_ref(v, pages, meta, ulog, scr)
        return b
    head, free, owner = pool_views(pool)
    top = meta[M_VTOP]
    if top == 0 or head[H_FREE_TOP] == 0:
        return NIL
    v = pages[top - 1, PG_VSTACK]
    meta[M_VTOP] = top - 1
    phys = pool_take(head, free, owner, meta[M_CLIENT : M_CLIENT + 3], v)
    log_write(ulog, scr, U_POOL_TAKE, phys, 0)
    log_write(ulog, scr, U_POOLHEAD, H_MAPS, head[H_MAPS])
    head[H_MAPS] += 1
    set_page(pages, v, PG_PHYS, phys, ulog, scr)
    # The page's free list holds its other blocks, lowest id on top.
    first = v * k
    for j in range(1, k):
        log_write(ulog, scr, U_BNEXT, first + j, block_next[first + j])
        block_next[first + j] = first + j + 1 if j + 1 < k else NIL
    set_page(pages, v, PG_HEAD, first + 1 if k > 1 else NIL, ulog, scr)
    set_page(pages, v, PG_FREE, k - 1, ulog, scr)
    set_page(pages, v, PG_USED, 1, ulog, scr)
    if k > 1:
        bucket_push(v, k - 1, pages, buckets, meta, ulog, scr)
    meta[M_FREE_MAPPED] += k - 1
    meta[M_MAPPED] += 1
    n = scr[S_MAP_N]
    map_rec[n, 0] = phys
    map_rec[n, 1] = v
    scr[S_MAP_N] = n + 1
    return first


@njit(cache=True, _nrt=False, inline="always")
def unmap_page(v, pages, buckets, unmap_rec, meta, pool, ulog, scr):
    """Give page ``v`` (no referenced and no cached block left) back to the pool."""
    k = meta[M_PAGE_K]
    c = pages[v, PG_FREE]
    if 0 < c < k:
        bucket_unlink(v, c, pages, buckets, ulog, scr)
    phys = pages[v, PG_PHYS]
    head, free, owner = pool_views(pool)
    # A give overwrites the free-stack slot above the top, which a rollback must restore.
    log_write(ulog, scr, U_POOLFREE, head[H_FREE_TOP], free[head[H_FREE_TOP]])
    pool_give(head, free, owner, phys)
    log_write(ulog, scr, U_POOL_GIVE, phys, v)
    log_write(ulog, scr, U_POOLHEAD, H_UNMAPS, head[H_UNMAPS])
    head[H_UNMAPS] += 1
    set_page(pages, v, PG_PHYS, NIL, ulog, scr)
    set_page(pages, v, PG_FREE, 0, ulog, scr)
    set_page(pages, v, PG_HEAD, NIL, ulog, scr)
    top = meta[M_VTOP]
    set_page(pages, top, PG_VSTACK, v, ulog, scr)
    meta[M_VTOP] = top + 1
    meta[M_FREE_MAPPED] -= c
    meta[M_MAPPED] -= 1
    n = scr[S_UNMAP_N]
    unmap_rec[n, 0] = phys
    unmap_rec[n, 1] = v
    scr[S_UNMAP_N] = n + 1


@njit(cache=True, _nrt=False, inline="always")
def free_in_page(b, pages, page_stamp, block_next, buckets, unmap_rec, meta, pool, ulog, scr):
    """Block ``b`` (scrubbed, refcount now 0, not cached) goes back to its page's free list.

    The page is unmapped once all its blocks are free; a page left with cached blocks only
    becomes cache-only.
    """
    k = meta[M_PAGE_K]
    v = b // k
    used = pages[v, PG_USED] - 1
    set_page(pages, v, PG_USED, used, ulog, scr)
    c = pages[v, PG_FREE]
    if c > 0:
        bucket_unlink(v, c, pages, buckets, ulog, scr)
    c += 1
    set_page(pages, v, PG_FREE, c, ulog, scr)
    log_write(ulog, scr, U_BNEXT, b, block_next[b])
    block_next[b] = pages[v, PG_HEAD]
    set_page(pages, v, PG_HEAD, b, ulog, scr)
    meta[M_FREE_MAPPED] += 1
    if c == k:
        unmap_page(v, pages, buckets, unmap_rec, meta, pool, ulog, scr)
        return
    bucket_push(v, c, pages, buckets, meta, ulog, scr)
    if used == 0:
        cache_only_push(v, pages, page_stamp, meta, pool, ulog, scr)


@njit(cache=True, _nrt=False, inline="always")
def cache_in_page(b, pages, page_stamp, meta, pool, ulog, scr):
    """Block ``b`` went to the LRU list (cached): its page may become cache-only."""
    v = b // meta[M_PAGE_K]
    used = pages[v, PG_USED] - 1
    set_page(pages, v, PG_USED, used, ulog, scr)
    if used == 0:
        cache_only_push(v, pages, page_stamp, meta, pool, ulog, scr)


@njit(cache=True, _nrt=False, inline="always")
def free_now(meta, pool):
    """Blocks a call can take without evicting: the free stack, or with a page pool the free
    blocks of mapped pages plus whole pages the pool can still map."""
    k = meta[M_PAGE_K]
    if k == 0:
        return meta[M_FREE_TOP]
    head, _, _ = pool_views(pool)
    return meta[M_FREE_MAPPED] + min(head[H_FREE_TOP], meta[M_VTOP]) * k
