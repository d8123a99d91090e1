"""``check()``: recompute every refcount, list, table entry and counter from scratch.

The only kernel that scans the whole pool. It returns the first inconsistency as
``(code, a, b)``; :data:`MESSAGES` turns the code into words.
"""

import numpy as np
from numba import njit

from kvnumba._kernels.geometry import blocks_of
from kvnumba._kernels.pool import O_CLIENT, O_VIRTUAL, pool_views
from kvnumba._kernels.prefix import chain_hash, root_hash
from kvnumba._kernels.views import unpack, unpack_pages
from kvnumba._state import (
    EMPTY,
    F_HASHED,
    F_KNOWN,
    F_REGISTERED,
    M_BUCKET_MIN,
    M_CACHED,
    M_CLIENT,
    M_CO_COUNT,
    M_CO_HEAD,
    M_CO_TAIL,
    M_FREE_MAPPED,
    M_FREE_TOP,
    M_HASH_BITS,
    M_LIVE_SEQS,
    M_LRU_HEAD,
    M_LRU_TAIL,
    M_MAPPED,
    M_MAX_SEQ_LEN,
    M_PAGE_K,
    M_REGISTERED,
    M_SLOT_TOP,
    M_USED,
    M_VTOP,
    NIL,
    PG_BNEXT,
    PG_BPREV,
    PG_CNEXT,
    PG_CPREV,
    PG_FREE,
    PG_HEAD,
    PG_PHYS,
    PG_USED,
    PG_VSTACK,
)

MESSAGES = {
    1: "sequence slot {a}: length {b} is negative or beyond max_seq_len",
    2: "sequence slot {a}: table entry {b} holds an out-of-range block",
    3: "sequence slot {a}: table entry {b} is set beyond the sequence's blocks",
    4: "free sequence slot {a} has a non-empty table or length",
    5: "block {a}: refcount {b} differs from the references in the block tables",
    6: "free stack position {a}: block {b} is out of range, referenced, or listed twice",
    7: "free block {a} still has a non -1 payload or flags",
    8: "LRU list: block {a} is out of range, referenced, unregistered or visited twice",
    9: "LRU list: broken back link at block {a}",
    10: "LRU list: tail is {a} but the walk ended at {b}",
    11: "counter {a} is {b}, recomputed differently",
    12: "block {a} is neither referenced, free nor cached",
    13: "prefix table slot {a}: entry {b} is not a registered block or is a stale mark",
    14: "prefix table: block {a} is registered but unreachable from its hash's home slot",
    15: "block {a}: registered {b} times in the prefix table",
    16: "sequence slot {a}: partial tail block {b} is hashed or has payload past its fill",
    17: "sequence slot {a}: block at position {b} has a hash that does not match its content",
    18: "slot stack position {a}: slot {b} is live, out of range or listed twice",
    19: "block {a}: hashed without known content, or registered without a hash",
    20: "unmapped-page stack position {a}: page {b} is out of range, mapped or listed twice",
    21: "virtual page {a}: unmapped but not on the unmapped-page stack, or with counts or "
    "blocks in use (block {b})",
    22: "virtual page {a}: physical page {b} is not recorded as this manager's page for it",
    23: "virtual page {a}: its free list is broken or holds a foreign, used or dirty block {b}",
    24: "virtual page {a}: free count {b} differs from its free list, or the page is empty",
    25: "virtual page {a}: referenced-block count {b} differs from the refcounts",
    26: "bucket {a}: page {b} is unmapped, has another free count, has a broken link or "
    "is listed twice",
    27: "page buckets hold {a} pages but {b} mapped pages have free blocks",
    28: "cache-only list: page {a} is unmapped, has referenced blocks, a broken link or an "
    "older stamp than its predecessor",
    29: "cache-only list holds {a} pages but {b} mapped pages have no referenced block",
}


@njit(cache=True)
def check_pages(ref, block_flags, tokens, meta, seen, arena, scratch, pool):
    """Check the page structures of a manager on a page pool; mark its free blocks ``seen``."""
    pages, page_stamp, block_next, buckets, _, _ = unpack_pages(arena, scratch)
    head, _, owner = pool_views(pool)
    k = meta[M_PAGE_K]
    num_pages = pages.shape[0]
    top = meta[M_VTOP]
    if top < 0 or top > num_pages:
        return 11, M_VTOP, top
    on_stack = np.zeros(num_pages, dtype=np.uint8)
    for i in range(top):
        v = pages[i, PG_VSTACK]
        if v < 0 or v >= num_pages or on_stack[v] != 0 or pages[v, PG_PHYS] != NIL:
            return 20, i, v
        on_stack[v] = 1
    mapped = 0
    free_mapped = 0
    with_free = 0
    without_refs = 0
    for v in range(num_pages):
        first = v * k
        if pages[v, PG_PHYS] == NIL:
            if on_stack[v] == 0 or pages[v, PG_FREE] != 0 or pages[v, PG_USED] != 0:
                return 21, v, -1
            for b in range(first, first + k):
                if ref[b] != 0 or block_flags[b] != 0 or seen[b] != 0:
                    return 21, v, b
                for j in range(tokens.shape[1]):
                    if tokens[b, j] != -1:
                        return 21, v, b
                seen[b] = 1
            continue
        mapped += 1
        phys = pages[v, PG_PHYS]
        if (
            phys < 0
            or phys >= owner.shape[0]
            or owner[phys, O_CLIENT] != meta[M_CLIENT]
            or owner[phys, O_VIRTUAL] != v
        ):
            return 22, v, phys
        count = 0
        b = pages[v, PG_HEAD]
        while b != NIL:
            if count >= k or b < first or b >= first + k or seen[b] != 0:
                return 23, v, b
            if ref[b] != 0 or block_flags[b] != 0:
                return 23, v, b
            for j in range(tokens.shape[1]):
                if tokens[b, j] != -1:
                    return 23, v, b
            seen[b] = 1
            count += 1
            b = block_next[b]
        if count != pages[v, PG_FREE] or count >= k:
            return 24, v, pages[v, PG_FREE]
        free_mapped += count
        if count > 0:
            with_free += 1
        used = 0
        for b in range(first, first + k):
            if ref[b] > 0:
                used += 1
        if used != pages[v, PG_USED]:
            return 25, v, pages[v, PG_USED]
        if used == 0:
            without_refs += 1
    if mapped != meta[M_MAPPED] or mapped + top != num_pages:
        return 11, M_MAPPED, meta[M_MAPPED]
    if free_mapped != meta[M_FREE_MAPPED]:
        return 11, M_FREE_MAPPED, meta[M_FREE_MAPPED]
    listed = np.zeros(num_pages, dtype=np.uint8)
    in_buckets = 0
    for c in range(1, k):
        prev = NIL
        v = buckets[c]
        while v != NIL:
            if (
                v < 0
                or v >= num_pages
                or listed[v] != 0
                or pages[v, PG_PHYS] == NIL
                or pages[v, PG_FREE] != c
                or pages[v, PG_BPREV] != prev
            ):
                return 26, c, v
            if c < meta[M_BUCKET_MIN]:
                return 11, M_BUCKET_MIN, meta[M_BUCKET_MIN]
            listed[v] = 1
            in_buckets += 1
            prev = v
            v = pages[v, PG_BNEXT]
    if in_buckets != with_free:
        return 27, in_buckets, with_free
    count = 0
    prev = NIL
    v = meta[M_CO_HEAD]
    while v != NIL:
        if (
            v < 0
            or v >= num_pages
            or count >= num_pages
            or pages[v, PG_PHYS] == NIL
            or pages[v, PG_USED] != 0
            or pages[v, PG_CPREV] != prev
            or (prev != NIL and page_stamp[v] <= page_stamp[prev])
        ):
            return 28, v, 0
        count += 1
        prev = v
        v = pages[v, PG_CNEXT]
    if prev != meta[M_CO_TAIL]:
        return 11, M_CO_TAIL, meta[M_CO_TAIL]
    if count != without_refs or count != meta[M_CO_COUNT]:
        return 29, count, without_refs
    return 0, 0, 0


@njit(cache=True)
def check_state(arena, scratch, pool):
    """Return ``(0, 0, 0)`` if the state is consistent, else the first violation.

    ``pool`` is the page pool's arena of a manager on a page pool (read only then).
    """
    (ref, lru_prev, lru_next, free_stack, block_hash, block_salt, block_flags, tokens, htab,
     seq_table, seq_len, seq_gen, seq_salt, seq_live, slot_stack, meta, _, _, _, _, _, _,
     _) = unpack(arena, scratch)  # fmt: skip
    num_blocks, block_size = tokens.shape
    max_seqs, width = seq_table.shape
    counted = np.zeros(num_blocks, dtype=np.int64)
    live = 0
    for s in range(max_seqs):
        length = seq_len[s]
        if seq_live[s] == 0:
            if length != 0:
                return 4, s, 0
            for pos in range(width):
                if seq_table[s, pos] != NIL:
                    return 4, s, pos
            continue
        live += 1
        if length < 0 or length > meta[M_MAX_SEQ_LEN]:
            return 1, s, length
        nblocks = blocks_of(length, block_size)
        for pos in range(width):
            b = seq_table[s, pos]
            if pos < nblocks:
                if b < 0 or b >= num_blocks:
                    return 2, s, pos
                counted[b] += 1
            elif b != NIL:
                return 3, s, pos
        fill = length % block_size
        if fill != 0:
            tail = seq_table[s, nblocks - 1]
            if block_flags[tail] & (F_HASHED | F_REGISTERED):
                return 16, s, tail
            for j in range(fill, block_size):
                if tokens[tail, j] != -1:
                    return 16, s, tail
        # Recompute the chained hash along the sequence's hashed full blocks.
        parent = root_hash()
        for pos in range(length // block_size):
            b = seq_table[s, pos]
            if (block_flags[b] & F_HASHED) == 0:
                break
            h = chain_hash(parent, seq_salt[s], tokens[b], meta[M_HASH_BITS])
            if h != block_hash[b] or block_salt[b] != seq_salt[s]:
                return 17, s, pos
            parent = h
    if live != meta[M_LIVE_SEQS]:
        return 11, M_LIVE_SEQS, meta[M_LIVE_SEQS]
    used = 0
    for b in range(num_blocks):
        if counted[b] != ref[b]:
            return 5, b, ref[b]
        if ref[b] > 0:
            used += 1
        flags = block_flags[b]
        if (flags & F_HASHED and not flags & F_KNOWN) or (
            flags & F_REGISTERED and not flags & F_HASHED
        ):
            return 19, b, flags
    if used != meta[M_USED]:
        return 11, M_USED, meta[M_USED]
    # Every block is in exactly one place: referenced, on the free stack, or on the LRU list.
    seen = np.zeros(num_blocks, dtype=np.uint8)
    for b in range(num_blocks):
        if ref[b] > 0:
            seen[b] = 1
    free_top = meta[M_FREE_TOP]
    if free_top < 0 or free_top > num_blocks:
        return 11, M_FREE_TOP, free_top
    for i in range(free_top):
        b = free_stack[i]
        if b < 0 or b >= num_blocks or seen[b] != 0:
            return 6, i, b
        seen[b] = 1
        if block_flags[b] != 0:
            return 7, b, 0
        for j in range(block_size):
            if tokens[b, j] != -1:
                return 7, b, j
    if meta[M_PAGE_K] != 0:
        if free_top != 0:
            return 11, M_FREE_TOP, free_top
        code, a, c = check_pages(ref, block_flags, tokens, meta, seen, arena, scratch, pool)
        if code != 0:
            return code, a, c
    cached = 0
    prev = NIL
    b = meta[M_LRU_HEAD]
    while b != NIL:
        if b < 0 or b >= num_blocks or seen[b] != 0 or not block_flags[b] & F_REGISTERED:
            return 8, b, 0
        if lru_prev[b] != prev:
            return 9, b, 0
        seen[b] = 1
        cached += 1
        prev = b
        b = lru_next[b]
    if prev != meta[M_LRU_TAIL]:
        return 10, meta[M_LRU_TAIL], prev
    if cached != meta[M_CACHED]:
        return 11, M_CACHED, meta[M_CACHED]
    for b in range(num_blocks):
        if seen[b] == 0:
            return 12, b, 0
    # Prefix table: every entry a registered block reachable from its home slot, each once.
    mask = htab.shape[0] - 1
    occurrences = np.zeros(num_blocks, dtype=np.int64)
    registered = 0
    for i in range(htab.shape[0]):
        e = htab[i]
        if e == EMPTY:
            continue
        if e < 0 or e >= num_blocks or not block_flags[e] & F_REGISTERED:
            return 13, i, e
        occurrences[e] += 1
        registered += 1
        j = np.int64(block_hash[e] & np.uint64(mask))
        while j != i:
            if htab[j] == EMPTY:
                return 14, e, 0
            j = (j + 1) & mask
    for b in range(num_blocks):
        expected = 1 if block_flags[b] & F_REGISTERED else 0
        if occurrences[b] != expected:
            return 15, b, occurrences[b]
    if registered != meta[M_REGISTERED]:
        return 11, M_REGISTERED, meta[M_REGISTERED]
    # Sequence slots: the stack holds exactly the free ones.
    slot_top = meta[M_SLOT_TOP]
    if slot_top + live != max_seqs:
        return 11, M_SLOT_TOP, slot_top
    marks = np.zeros(max_seqs, dtype=np.uint8)
    for i in range(slot_top):
        s = slot_stack[i]
        if s < 0 or s >= max_seqs or seq_live[s] != 0 or marks[s] != 0:
            return 18, i, s
        marks[s] = 1
    return 0, 0, 0
