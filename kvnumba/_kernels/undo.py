"""Undo log: record every state write of a call so that a failure restores the arrays exactly.

Only calls whose later steps depend on what earlier steps did (atomic ``admit`` of several
prompts) switch the log on; every other call checks its whole need before it writes anything.
``meta`` is saved whole at the start of a logged call, so counters, stack tops and list ends
need no entries.
"""

import numpy as np
from numba import njit

from kvnumba._kernels.pool import pool_give, pool_take, pool_views
from kvnumba._kernels.views import unpack, unpack_pages
from kvnumba._state import (
    M_CLIENT,
    PG_COLS,
    S_EV_N,
    S_LOG_N,
    S_LOG_ON,
    S_MAP_N,
    S_UNMAP_N,
)

# Field codes of log entries: (code, index, old value).
U_REF = 0
U_PREV = 1
U_NEXT = 2
U_HASH = 3  # high 32 bits of the old uint64 hash (U_HASH_LOW holds the low ones): each half
# fits an int64 in compiled and in pure-Python mode alike
U_SALT = 4
U_FLAGS = 5
U_TOKROW = 6  # index = block; old = eviction record row holding the payload, or -1 (row was -1)
U_HTAB = 7
U_SEQTAB = 8  # index = slot * width + position
U_SEQLEN = 9
U_SEQGEN = 10
U_SEQSALT = 11
U_SEQLIVE = 12
U_HASH_LOW = 13
U_PAGE = 14  # index = virtual page * PG_COLS + column of ``pages``
U_BNEXT = 15  # block_next
U_BUCKET = 16  # buckets
U_POOL_TAKE = 17  # index = physical page taken from the pool: undone by giving it back
U_POOL_GIVE = 18  # index = physical page given back, old = its virtual page: undone by a take
U_POOLHEAD = 19  # a counter slot of the pool's head
U_STAMP = 20  # page_stamp
U_POOLFREE = 21  # a slot of the pool's free stack, overwritten when a page is given back
_LOW = np.uint64(0xFFFFFFFF)
_HIGH = np.uint64(0xFFFFFFFF00000000)
_HALF = np.uint64(32)

# Upper bounds of log entries a logged call writes, used to size the log before the call.
LOG_PER_BLOCK = 14  # take 3 + evict 3 + table entry 1 + registration 6, with room to spare
LOG_PER_SEQUENCE = 8
# With a page pool a take also moves its page between buckets, pops the page's free list and
# may leave the cache-only list (at most 16 more), and a mapped page initialises its free list.
LOG_PER_BLOCK_PAGED = LOG_PER_BLOCK + 20
LOG_PER_PAGE = 16


@njit(cache=True, _nrt=False, inline="always")
def log_write(ulog, scr, code, index, old):
    """Append one entry to the undo log if the current call is logged."""
    if scr[S_LOG_ON] != 0:
        n = scr[S_LOG_N]
        ulog[n, 0] = code
        ulog[n, 1] = index
        ulog[n, 2] = old
        scr[S_LOG_N] = n + 1


@njit(cache=True, _nrt=False, inline="always")
def rollback(arena, scratch, pool):
    """Replay the undo log backwards and restore ``meta``; ends the logged call.

    Pool entries are replayed in reverse order too, so the pool's free stack and owner records
    come back byte for byte (``pool`` is only read when the log holds pool entries). A failure
    path only, so it carves its own views.
    """
    (ref, lru_prev, lru_next, _, block_hash, block_salt, block_flags, tokens, htab, seq_table,
     seq_len, seq_gen, seq_salt, seq_live, _, meta, ulog, _, _, ev_tok, _, scr,
     meta_save) = unpack(arena, scratch)  # fmt: skip
    pages, page_stamp, block_next, buckets, _, _ = unpack_pages(arena, scratch)
    width = seq_table.shape[1]
    for k in range(scr[S_LOG_N] - 1, -1, -1):
        code = ulog[k, 0]
        i = ulog[k, 1]
        old = ulog[k, 2]
        if code == U_REF:
            ref[i] = old
        elif code == U_PREV:
            lru_prev[i] = old
        elif code == U_NEXT:
            lru_next[i] = old
        elif code == U_HASH:
            block_hash[i] = (block_hash[i] & _LOW) | (np.uint64(old) << _HALF)
        elif code == U_HASH_LOW:
            block_hash[i] = (block_hash[i] & _HIGH) | np.uint64(old)
        elif code == U_SALT:
            block_salt[i] = old
        elif code == U_FLAGS:
            block_flags[i] = old
        elif code == U_TOKROW:
            if old < 0:
                tokens[i, :] = -1
            else:
                for j in range(tokens.shape[1]):
                    tokens[i, j] = ev_tok[old, j]
        elif code == U_HTAB:
            htab[i] = old
        elif code == U_SEQTAB:
            seq_table[i // width, i % width] = old
        elif code == U_SEQLEN:
            seq_len[i] = old
        elif code == U_SEQGEN:
            seq_gen[i] = old
        elif code == U_SEQSALT:
            seq_salt[i] = old
        elif code == U_SEQLIVE:
            seq_live[i] = old
        elif code == U_PAGE:
            pages[i // PG_COLS, i % PG_COLS] = old
        elif code == U_BNEXT:
            block_next[i] = old
        elif code == U_BUCKET:
            buckets[i] = old
        elif code == U_STAMP:
            page_stamp[i] = old
        else:
            head, free, owner = pool_views(pool)
            if code == U_POOL_TAKE:
                pool_give(head, free, owner, i)
            elif code == U_POOL_GIVE:
                # The page went on top of the free stack and everything above it was undone.
                pool_take(head, free, owner, meta_save[M_CLIENT : M_CLIENT + 3], old)
            elif code == U_POOLFREE:
                free[i] = old
            else:
                head[i] = old
    for j in range(meta.shape[0]):
        meta[j] = meta_save[j]
    scr[S_LOG_N] = 0
    scr[S_LOG_ON] = 0
    scr[S_EV_N] = 0
    scr[S_MAP_N] = 0
    scr[S_UNMAP_N] = 0
