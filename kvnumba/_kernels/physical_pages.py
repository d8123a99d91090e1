"""Kernels over the physical page pool (:class:`kvnumba.PagePool`).

The pool lives in one uint8 arena (a private numpy buffer, or a ``SharedMemory`` segment shared by
several processes) carved into three int64 arrays:

``head`` int64[HEAD_SIZE]
    Magic, geometry, the free-stack top, a logical clock, the next client token, counters and the
    byte offsets of the other two fields (see the ``H_*`` constants).
``free`` int64[num_pages]
    Stack of free physical page ids; the first ``head[H_FREE_TOP]`` entries are live and the last
    live one is popped first. A new pool pops ``0, 1, 2, ...``.
``owner`` int64[num_pages, OWNER_COLS]
    One record per physical page: owner client token, owner pid, owner process start time (clock
    ticks since boot, ``/proc/<pid>/stat`` field 22, so that a reused pid is not mistaken for the
    dead owner) and the virtual page it backs. A free page holds the canonical free record
    ``FREE_RECORD`` = (-1, 0, 0, -1); a record is one 32-byte row, so a take or a give touches one
    cache line of it.

Helpers (``pool_*``) are compiled without NRT and inline: the block manager's kernels call them
with the views returned by :func:`pool_views`. They never raise and never validate (the caller
owns the page it gives back). ``pool_take`` / ``pool_give`` are exact inverses when undone in
reverse order: a take pops the stack without clearing the popped slot and fills a canonical
record; a give pushes into that same slot and writes the canonical record back, so taking ``k``
pages and giving them back last-taken-first restores the arrays byte for byte (no undo log needed
for the pool). Workers (``map_pages``, ``unmap_pages``, ``reclaim_pages``) are compiled without
NRT too; the facade allocates their output arrays. Every mutation runs under the facade's
cross-process lock.
"""

import numpy as np
from numba import int64, njit, void

from kvnumba._kernels.carve import carve
from kvnumba._kernels.jit import inlined
from kvnumba._kernels.views import array_type
from kvnumba.errors import ST_OK, ST_POOL_EXHAUSTED

# --- head slots (int64) ----------------------------------------------------------------------------
H_MAGIC = 0  # POOL_MAGIC once the creator has initialised the arena
H_NUM_PAGES = 1
H_FREE_TOP = 2  # pages on the free stack
H_CLOCK = 3  # pool-wide logical clock (pool_tick), e.g. for least-recently-used page choices
H_NEXT_CLIENT = 4  # next client token to hand out; tokens are 1, 2, ... and never reused
H_MAPS = 5  # pages mapped by committed map calls of the facade
H_UNMAPS = 6  # pages unmapped by committed unmap calls of the facade
H_RECLAIMED = 7  # pages freed by reclaim_dead
H_FREE_OFFSET = 8  # byte offset of ``free`` in the arena
H_OWNER_OFFSET = 9  # byte offset of ``owner`` in the arena
# A shared pool's lock holder writes its pid here while it holds the lock and 0 before it lets
# go, so a pid found here by the next holder is a process that died holding it (maybe inside a
# kernel, with a page half-written): that pid is then kept in H_TORN until a repair.
H_HOLDER = 10
H_TORN = 11
HEAD_SIZE = 16
HEAD_BYTES = 8 * HEAD_SIZE
POOL_MAGIC = 0x6B766E756D626150  # "kvnumbaP"
ALIGN = 64

# --- owner record columns --------------------------------------------------------------------------
O_CLIENT = 0  # client token, -1 when free
O_PID = 1  # pid of the owning process, 0 when free
O_START = 2  # start time of the owning process, 0 when free
O_VIRTUAL = 3  # virtual page backed, -1 when free
OWNER_COLS = 4
NO_CLIENT = -1

# --- identity array (``me``) of the calling client: what pool_take writes into a record ----------
ME_CLIENT = 0
ME_PID = 1
ME_START = 2
ME_SIZE = 3

# --- status codes of the pool workers (0 and 1 shared with kvnumba.errors) -----------------------
ST_BAD_CLIENT = 20  # a client token this pool never handed out
ST_BAD_VIRTUAL = 21  # a negative virtual page id
ST_BAD_PAGE = 22  # a physical page id out of range
ST_NOT_OWNER = 23  # a physical page the client does not hold
ST_DUPLICATE_PAGE = 24  # the same physical page twice in one unmap call


def arena_layout(num_pages: int) -> tuple[int, int, int]:
    """Byte offsets of ``free`` and ``owner`` and the arena size for ``num_pages`` pages.

    Every field starts 64-byte aligned (the arena itself is aligned by its allocator).
    """

    def up(n: int) -> int:
        return -(-n // ALIGN) * ALIGN

    free_offset = up(HEAD_BYTES)
    owner_offset = free_offset + up(8 * num_pages)
    size = owner_offset + up(8 * OWNER_COLS * num_pages)
    return free_offset, owner_offset, size


def init_arena(arena: np.ndarray, num_pages: int) -> None:
    """Write an empty pool of ``num_pages`` pages into a zeroed arena (magic last)."""
    free_offset, owner_offset, _ = arena_layout(num_pages)
    head = arena[:HEAD_BYTES].view(np.int64)
    head[H_NUM_PAGES] = num_pages
    head[H_FREE_TOP] = num_pages
    head[H_NEXT_CLIENT] = 1
    head[H_FREE_OFFSET] = free_offset
    head[H_OWNER_OFFSET] = owner_offset
    _, free, owner = views_of(arena)
    free[:] = np.arange(num_pages - 1, -1, -1)  # reversed: page 0 is popped first
    owner[:, O_CLIENT] = NO_CLIENT
    owner[:, O_PID] = 0
    owner[:, O_START] = 0
    owner[:, O_VIRTUAL] = -1
    head[H_MAGIC] = POOL_MAGIC


def views_of(arena: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(head, free, owner)`` numpy views for Python code (the kernels use :func:`pool_views`)."""
    head = arena[:HEAD_BYTES].view(np.int64)
    n, fo, oo = int(head[H_NUM_PAGES]), int(head[H_FREE_OFFSET]), int(head[H_OWNER_OFFSET])
    free = arena[fo : fo + 8 * n].view(np.int64)
    owner = arena[oo : oo + 8 * OWNER_COLS * n].view(np.int64).reshape(n, OWNER_COLS)
    return head, free, owner


# Inlined at numba's IR level (not by LLVM like the other helpers): returning arrays from a
# function compiled without NRT to one compiled with it would hand over references never taken.
@njit(cache=True, inline="always")
def pool_views(arena):
    """``(head, free, owner)`` views of a pool arena, for kernels (no copies). Python code uses
    :func:`views_of`."""
    head = carve(arena, 0, (HEAD_BYTES // 8,), np.int64)
    n = head[H_NUM_PAGES]
    free = carve(arena, head[H_FREE_OFFSET], (n,), np.int64)
    owner = carve(arena, head[H_OWNER_OFFSET], (n, OWNER_COLS), np.int64)
    return head, free, owner


@inlined
def pool_take(head, free, owner, me, virtual):
    """Map one free physical page to ``virtual`` for the client ``me``; O(1).

    Parameters
    ----------
    head, free, owner : int64 arrays
        Views from :func:`pool_views`.
    me : int64[ME_SIZE]
        ``(client token, pid, process start time)`` of the caller, written into the record.
    virtual : int
        Virtual page the physical page will back (recorded only).

    Returns
    -------
    int
        The physical page id, or -1 if the free stack is empty (nothing changed then).

    Notes
    -----
    The popped stack slot is left as it is, so :func:`pool_give` of the same page right after
    writes the same value back: takes undone by gives in reverse order restore every byte.
    """
    top = head[H_FREE_TOP]
    if top == 0:
        return -1
    top -= 1
    p = free[top]
    head[H_FREE_TOP] = top
    owner[p, O_CLIENT] = me[ME_CLIENT]
    owner[p, O_PID] = me[ME_PID]
    owner[p, O_START] = me[ME_START]
    owner[p, O_VIRTUAL] = virtual
    return p


@inlined
def pool_give_record(owner, p):
    """Write the free record (-1, 0, 0, -1) into row ``p`` of ``owner``."""
    owner[p, O_CLIENT] = NO_CLIENT
    owner[p, O_PID] = 0
    owner[p, O_START] = 0
    owner[p, O_VIRTUAL] = -1


@inlined(void(array_type("int64"), array_type("int64"), array_type("int64", 2), int64))
def pool_give(head, free, owner, p):
    """Return physical page ``p`` to the free stack and reset its record; O(1).

    The caller guarantees that ``p`` is owned (no check here). Pushed pages are popped first, so
    a page just given back is the next one taken. The exact inverse of the last
    :func:`pool_take` that returned ``p``.
    """
    top = head[H_FREE_TOP]
    free[top] = p
    head[H_FREE_TOP] = top + 1
    pool_give_record(owner, p)


@inlined
def pool_tick(head):
    """Advance the pool-wide logical clock and return its new value.

    Not undone by :func:`pool_give`: a call that ticks and may roll back saves
    ``head[H_CLOCK]`` first (or ticks only once it has committed).
    """
    t = head[H_CLOCK] + 1
    head[H_CLOCK] = t
    return t


@inlined
def pool_valid_client(head, client):
    """Whether ``client`` is a token this pool handed out."""
    return client >= 1 and client < head[H_NEXT_CLIENT]


@njit(cache=True, _nrt=False)  # called by the facade
def map_pages(arena, me, virtual_ids, out):
    """Map ``len(virtual_ids)`` pages for the client ``me``, all or nothing.

    Returns ``(status, bad, available)``: ``ST_OK``; ``ST_BAD_CLIENT``; ``ST_BAD_VIRTUAL`` with the
    index of the first negative virtual id; ``ST_POOL_EXHAUSTED`` when fewer pages are free than
    requested. ``available`` is the number of free pages at call start. On any failure the arena
    is untouched. ``out[i]`` receives the physical page of ``virtual_ids[i]``.
    """
    head, free, owner = pool_views(arena)
    available = head[H_FREE_TOP]
    if not pool_valid_client(head, me[ME_CLIENT]):
        return ST_BAD_CLIENT, -1, available
    n = virtual_ids.shape[0]
    for i in range(n):
        if virtual_ids[i] < 0:
            return ST_BAD_VIRTUAL, i, available
    if n > available:
        return ST_POOL_EXHAUSTED, -1, available
    for i in range(n):
        out[i] = pool_take(head, free, owner, me, virtual_ids[i])
    head[H_MAPS] += n
    return ST_OK, -1, available


@njit(cache=True, _nrt=False)  # called by the facade
def unmap_pages(arena, client, physical_ids, out_virtual):
    """Give back ``physical_ids``, which ``client`` must all hold, all or nothing.

    Returns ``(status, bad)``: ``ST_OK``; ``ST_BAD_CLIENT``; ``ST_BAD_PAGE``, ``ST_NOT_OWNER`` or
    ``ST_DUPLICATE_PAGE`` with the index of the offending element. ``out_virtual[i]`` receives
    the virtual page ``physical_ids[i]`` backed. Pages are pushed in input order (the last one is
    the next to be taken).
    """
    head, free, owner = pool_views(arena)
    if not pool_valid_client(head, client):
        return ST_BAD_CLIENT, -1
    n = physical_ids.shape[0]
    num_pages = owner.shape[0]
    marked = ~client  # a negative value no live record holds (client >= 1, free is -1)
    status = ST_OK
    bad = -1
    # Validation pass: mark each page as seen by flipping its owner token, so a duplicate is
    # found in O(1) per page without scratch memory; the marks are undone on failure and
    # overwritten by pool_give on success.
    for i in range(n):
        p = physical_ids[i]
        if p < 0 or p >= num_pages:
            status = ST_BAD_PAGE
        elif owner[p, O_CLIENT] == marked:
            status = ST_DUPLICATE_PAGE
        elif owner[p, O_CLIENT] != client:
            status = ST_NOT_OWNER
        if status != ST_OK:
            bad = i
            break
        owner[p, O_CLIENT] = marked
    if status != ST_OK:
        for i in range(bad):
            owner[physical_ids[i], O_CLIENT] = client
        return status, bad
    for i in range(n):
        p = physical_ids[i]
        out_virtual[i] = owner[p, O_VIRTUAL]
        pool_give(head, free, owner, p)
    head[H_UNMAPS] += n
    return ST_OK, -1


@njit(cache=True, _nrt=False)  # called by the facade
def repair_pages(arena, seen):
    """Repair what a process killed inside a pool kernel left half-written.

    A kernel writes in program order: a take pops the free stack, then fills the owner record
    (client, pid, start time, virtual page); a give pushes the page, then writes the free
    record; an unmap first flips the client token of each page it validates (``~client``).
    Interrupted, they leave a page on the stack with a non-free record (the give meant it free:
    the record is reset), a page off the stack with an incomplete record (its take died with
    its process: the page is pushed back) or a flipped token (restored: the page's owner then
    decides its fate as for any page). Out-of-range ids and second copies on the stack are
    dropped. ``seen`` is a zeroed uint8 scratch of ``num_pages``.

    Returns ``(freed, fixed)``: pages made free, and other repairs. On a sound pool it writes
    nothing, so it may run at the start of any call (but never between a sibling's give-up and
    its rollback, which restore stack slots by position). With the free-stack top itself out of
    range it changes nothing and returns ``(0, -1)``.
    """
    head, free, owner = pool_views(arena)
    n = owner.shape[0]
    top = head[H_FREE_TOP]
    if top < 0 or top > n:
        return 0, -1
    freed = 0
    fixed = 0
    kept = 0
    for i in range(top):
        p = free[i]
        if p < 0 or p >= n or seen[p]:
            fixed += 1
            continue
        seen[p] = 1
        if kept != i:
            free[kept] = p
        kept += 1
    next_client = head[H_NEXT_CLIENT]
    for p in range(n):
        if seen[p]:
            if (
                owner[p, O_CLIENT] != NO_CLIENT
                or owner[p, O_PID] != 0
                or owner[p, O_START] != 0
                or owner[p, O_VIRTUAL] != -1
            ):
                pool_give_record(owner, p)
                freed += 1
            continue
        client = owner[p, O_CLIENT]
        if client < NO_CLIENT:
            client = ~client
            owner[p, O_CLIENT] = client
            fixed += 1
        if client < 1 or client >= next_client or owner[p, O_PID] <= 0 or owner[p, O_VIRTUAL] < 0:
            free[kept] = p
            kept += 1
            pool_give_record(owner, p)
            freed += 1
    if kept != top:
        head[H_FREE_TOP] = kept
    return freed, fixed


@njit(cache=True, _nrt=False)  # called by the facade
def reclaim_pages(arena, dead_pids, dead_starts, out_physical, out_virtual):
    """Free every page whose owner ``(pid, start)`` is listed as dead; returns how many.

    A scan of the owner table (a recovery operation, not a hot path), with a linear search over
    the short list of dead processes per owned page. Pages are pushed in ascending id order.
    """
    head, free, owner = pool_views(arena)
    count = 0
    num_dead = dead_pids.shape[0]
    for p in range(owner.shape[0]):
        if owner[p, O_CLIENT] == NO_CLIENT:
            continue
        pid = owner[p, O_PID]
        start = owner[p, O_START]
        for j in range(num_dead):
            if dead_pids[j] == pid and dead_starts[j] == start:
                out_physical[count] = p
                out_virtual[count] = owner[p, O_VIRTUAL]
                count += 1
                pool_give(head, free, owner, p)
                break
    head[H_RECLAIMED] += count
    return count
