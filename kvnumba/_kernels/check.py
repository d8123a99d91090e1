"""``check()``: recompute every refcount, list, table entry and counter from scratch.

The only kernel that scans the whole pool. It returns the first inconsistency as
``(code, a, b)``; :data:`MESSAGES` turns the code into words.
"""

import numpy as np
from numba import njit

from kvnumba._kernels.anchors import seq_anchors
from kvnumba._kernels.eviction_check import POLICY_MESSAGES, policy_check
from kvnumba._kernels.geometry import blocks_of
from kvnumba._kernels.jit import out_of_line
from kvnumba._kernels.keys import key_hash, table_find_key
from kvnumba._kernels.physical_pages import O_CLIENT, O_VIRTUAL, pool_views
from kvnumba._kernels.prefix import chain_hash, root_hash, table_find
from kvnumba._kernels.views import header_entry, views
from kvnumba._kernels.windows import first_needed
from kvnumba._layout import (
    EMPTY,
    F_HASHED,
    F_KNOWN,
    F_REGISTERED,
    F_TRIMMED,
    FIELD,
    H_DIM0,
    M_BUCKET_MIN,
    M_CACHE_DUPLICATES,
    M_CACHED,
    M_CLIENT,
    M_CO_COUNT,
    M_CO_HEAD,
    M_CO_TAIL,
    M_FREE_MAPPED,
    M_FREE_TOP,
    M_HASH_BITS,
    M_KEYED,
    M_LIVE_SEQS,
    M_LRU_HEAD,
    M_LRU_TAIL,
    M_MAPPED,
    M_MAX_SEQ_LEN,
    M_PAGE_K,
    M_POLICY,
    M_REGISTERED,
    M_RESERVED,
    M_SLOT_TOP,
    M_USED,
    M_VTOP,
    NIL,
    NULL_BLOCK,
)
from kvnumba.eviction import PRIORITY_CODE

# Codes of the violations check_state reports (0: consistent).
C_BAD_LENGTH = 1
C_TABLE_OUT_OF_RANGE = 2
C_TABLE_PAST_END = 3
C_FREE_SLOT_NOT_EMPTY = 4
C_REFCOUNT = 5
C_FREE_STACK = 6
C_FREE_BLOCK_DIRTY = 7
C_LRU_NODE = 8
C_LRU_BACK_LINK = 9
C_LRU_TAIL = 10
C_COUNTER = 11
C_BLOCK_LOST = 12
C_TABLE_ENTRY = 13
C_TABLE_UNREACHABLE = 14
C_TABLE_DUPLICATE = 15
C_PARTIAL_TAIL = 16
C_HASH_MISMATCH = 17
C_SLOT_STACK = 18
C_FLAGS = 19
C_VSTACK = 20
C_UNMAPPED_PAGE = 21
C_PAGE_OWNER = 22
C_PAGE_FREE_LIST = 23
C_PAGE_FREE_COUNT = 24
C_PAGE_USED_COUNT = 25
C_BUCKET = 26
C_BUCKET_COUNT = 27
C_CACHE_ONLY = 28
C_CACHE_ONLY_COUNT = 29
C_RESERVED = 30
C_WINDOW = 31
C_TABLE_TWIN = 32
C_SEQ_TAG = 33

MESSAGES = {
    C_BAD_LENGTH: "sequence slot {a}: length {b} is negative or beyond max_seq_len",
    C_TABLE_OUT_OF_RANGE: "sequence slot {a}: table entry {b} holds an out-of-range block",
    C_TABLE_PAST_END: "sequence slot {a}: table entry {b} is set beyond the sequence's blocks",
    C_FREE_SLOT_NOT_EMPTY: "free sequence slot {a} has a non-empty table or length",
    C_SEQ_TAG: "sequence slot {a}: tag {b} on a free slot or under a policy that reads no tags",
    C_REFCOUNT: "block {a}: refcount {b} differs from the references in the block tables",
    C_FREE_STACK: "free stack position {a}: block {b} is out of range, referenced, or listed twice",
    C_FREE_BLOCK_DIRTY: "free block {a} still has a non -1 payload or flags",
    C_LRU_NODE: "LRU list: block {a} is out of range, referenced, unregistered or visited twice",
    C_LRU_BACK_LINK: "LRU list: broken back link at block {a}",
    C_LRU_TAIL: "LRU list: tail is {a} but the walk ended at {b}",
    C_COUNTER: "counter {a} is {b}, recomputed differently",
    C_BLOCK_LOST: "block {a} is neither referenced, free nor cached",
    C_TABLE_ENTRY: "prefix table slot {a}: entry {b} is not a registered block or is a stale mark",
    C_TABLE_UNREACHABLE: "prefix table: block {a} is registered but unreachable from its hash's home slot",
    C_TABLE_DUPLICATE: "block {a}: registered {b} times in the prefix table",
    C_PARTIAL_TAIL: "sequence slot {a}: partial tail block {b} is hashed or has payload past its fill",
    C_HASH_MISMATCH: "sequence slot {a}: block at position {b} has a hash that does not match its content",
    C_SLOT_STACK: "slot stack position {a}: slot {b} is live, out of range or listed twice",
    C_FLAGS: "block {a}: hashed without known content, or registered without a hash",
    C_VSTACK: "unmapped-page stack position {a}: page {b} is out of range, mapped or listed twice",
    C_UNMAPPED_PAGE: "virtual page {a}: unmapped but not on the unmapped-page stack, or with counts or "
    "blocks in use (block {b})",
    C_PAGE_OWNER: "virtual page {a}: physical page {b} is not recorded as this manager's page for it",
    C_PAGE_FREE_LIST: "virtual page {a}: its free list is broken or holds a foreign, used or dirty block {b}",
    C_PAGE_FREE_COUNT: "virtual page {a}: free count {b} differs from its free list, or the page is empty",
    C_PAGE_USED_COUNT: "virtual page {a}: referenced-block count {b} differs from the refcounts",
    C_BUCKET: "bucket {a}: page {b} is unmapped, has another free count, has a broken link or "
    "is listed twice",
    C_BUCKET_COUNT: "page buckets hold {a} pages but {b} mapped pages have free blocks",
    C_CACHE_ONLY: "cache-only list: page {a} is unmapped, has referenced blocks, a broken link or an "
    "older stamp than its predecessor",
    C_CACHE_ONLY_COUNT: "cache-only list holds {a} pages but {b} mapped pages have no referenced block",
    C_RESERVED: "reserved block {a} is referenced, flagged, listed or has a payload",
    C_WINDOW: "sequence slot {a}: {b} leading table entries left the window, more than its "
    "length allows (or a full-attention manager released some)",
    C_TABLE_TWIN: "prefix table: block {a} is registered with the key of block {b}, registered "
    "before it, without cache_duplicates",
    **POLICY_MESSAGES,
}


@out_of_line
def _first_with_key(st, b, keyed):
    """The registered block a lookup of registered block ``b``'s key finds: by the lookup's
    own rule (hash, salt and key words, or tokens), so ``b`` itself unless a block registered
    before it holds the same key."""
    if keyed:
        return table_find_key(
            st, st.block_hash[b], st.block_salt[b], st.block_key, b, st.tokens[b], False
        )
    return table_find(st, st.block_hash[b], st.block_salt[b], st.tokens[b])


@out_of_line
def check_pages(seen, marks, arena, scratch, pool):
    """Check the page structures of a manager on a page pool; mark its free blocks ``seen``."""
    st = views(arena, scratch, pool)
    ref, block_flags, tokens, meta = st.ref, st.block_flags, st.tokens, st.meta
    page_stamp, lru_next, buckets = st.page_stamp, st.lru_next, st.buckets
    phys_of, free_of, used_of, head_of = st.page_phys, st.page_free, st.page_used, st.page_head
    _, _, owner = pool_views(pool)
    k = meta[M_PAGE_K]
    num_pages = phys_of.shape[0]
    top = meta[M_VTOP]
    if top < 0 or top > num_pages:
        return C_COUNTER, M_VTOP, top
    on_stack = marks
    on_stack[:] = 0
    for i in range(top):
        v = st.vstack[i]
        if v < 0 or v >= num_pages or on_stack[v] != 0 or phys_of[v] != NIL:
            return C_VSTACK, i, v
        on_stack[v] = 1
    mapped = 0
    free_mapped = 0
    with_free = 0
    without_refs = 0
    for v in range(num_pages):
        first = v * k
        if phys_of[v] == NIL:
            if on_stack[v] == 0 or free_of[v] != 0 or used_of[v] != 0:
                return C_UNMAPPED_PAGE, v, -1
            for b in range(first, first + k):
                if ref[b] != 0 or block_flags[b] != 0 or seen[b] != 0:
                    return C_UNMAPPED_PAGE, v, b
                for j in range(tokens.shape[1]):
                    if tokens[b, j] != -1:
                        return C_UNMAPPED_PAGE, v, b
                seen[b] = 1
            continue
        mapped += 1
        phys = phys_of[v]
        if (
            phys < 0
            or phys >= owner.shape[0]
            or owner[phys, O_CLIENT] != meta[M_CLIENT]
            or owner[phys, O_VIRTUAL] != v
        ):
            return C_PAGE_OWNER, v, phys
        count = 0
        b = head_of[v]
        while b != NIL:
            if count >= k or b < first or b >= first + k or seen[b] != 0:
                return C_PAGE_FREE_LIST, v, b
            if ref[b] != 0 or block_flags[b] != 0:
                return C_PAGE_FREE_LIST, v, b
            for j in range(tokens.shape[1]):
                if tokens[b, j] != -1:
                    return C_PAGE_FREE_LIST, v, b
            seen[b] = 1
            count += 1
            b = lru_next[b]
        if count != free_of[v] or count >= k:
            return C_PAGE_FREE_COUNT, v, free_of[v]
        free_mapped += count
        if count > 0:
            with_free += 1
        used = 0
        for b in range(first, first + k):
            if ref[b] > 0:
                used += 1
        if used != used_of[v]:
            return C_PAGE_USED_COUNT, v, used_of[v]
        if used == 0:
            without_refs += 1
    if mapped != meta[M_MAPPED] or mapped + top != num_pages:
        return C_COUNTER, M_MAPPED, meta[M_MAPPED]
    if free_mapped != meta[M_FREE_MAPPED]:
        return C_COUNTER, M_FREE_MAPPED, meta[M_FREE_MAPPED]
    listed = marks
    listed[:] = 0
    in_buckets = 0
    for c in range(1, k):
        prev = NIL
        v = buckets[c]
        while v != NIL:
            if (
                v < 0
                or v >= num_pages
                or listed[v] != 0
                or phys_of[v] == NIL
                or free_of[v] != c
                or st.bucket_prev[v] != prev
            ):
                return C_BUCKET, c, v
            if c < meta[M_BUCKET_MIN]:
                return C_COUNTER, M_BUCKET_MIN, meta[M_BUCKET_MIN]
            listed[v] = 1
            in_buckets += 1
            prev = v
            v = st.bucket_next[v]
    if in_buckets != with_free:
        return C_BUCKET_COUNT, in_buckets, with_free
    count = 0
    prev = NIL
    v = meta[M_CO_HEAD]
    while v != NIL:
        if (
            v < 0
            or v >= num_pages
            or count >= num_pages
            or phys_of[v] == NIL
            or used_of[v] != 0
            or st.co_prev[v] != prev
            or (prev != NIL and page_stamp[v] <= page_stamp[prev])
        ):
            return C_CACHE_ONLY, v, 0
        count += 1
        prev = v
        v = st.co_next[v]
    if prev != meta[M_CO_TAIL]:
        return C_COUNTER, M_CO_TAIL, meta[M_CO_TAIL]
    if count != without_refs or count != meta[M_CO_COUNT]:
        return C_CACHE_ONLY_COUNT, count, without_refs
    return 0, 0, 0


@out_of_line
def check_state(arena, scratch, pool, counts, seen, marks):
    """Return ``(0, 0, 0)`` if the state is consistent, else the first violation.

    ``pool`` is the page pool's arena of a manager on a page pool (read only then). The work
    arrays come from the entry kernel (this worker runs without NRT, so it cannot allocate):
    ``counts`` int64 and ``seen`` uint8 per block, ``marks`` uint8 per sequence slot and per
    virtual page.
    """
    st = views(arena, scratch, pool)
    ref, lru_prev, lru_next, free_stack = st.ref, st.lru_prev, st.lru_next, st.free_stack
    block_hash, block_salt, block_flags = st.block_hash, st.block_salt, st.block_flags
    tokens, htab = st.tokens, st.htab
    seq_table, seq_len, seq_salt, seq_live = st.seq_table, st.seq_len, st.seq_salt, st.seq_live
    slot_stack, meta = st.slot_stack, st.meta
    num_blocks, block_size = tokens.shape
    max_seqs, width = seq_table.shape
    keyed = meta[M_KEYED] != 0
    counted = counts
    counted[:] = 0
    live = 0
    tags_read = meta[M_POLICY] == PRIORITY_CODE
    for s in range(max_seqs):
        length = seq_len[s]
        if st.seq_tag[s] != 0 and (seq_live[s] == 0 or not tags_read):
            return C_SEQ_TAG, s, st.seq_tag[s]
        if seq_live[s] == 0:
            if length != 0:
                return C_FREE_SLOT_NOT_EMPTY, s, 0
            for pos in range(width):
                if seq_table[s, pos] != NIL:
                    return C_FREE_SLOT_NOT_EMPTY, s, pos
            continue
        live += 1
        if length < 0 or length > meta[M_MAX_SEQ_LEN]:
            return C_BAD_LENGTH, s, length
        nblocks = blocks_of(length, block_size)
        gone = 0  # leading entries whose blocks left the window
        for pos in range(width):
            b = seq_table[s, pos]
            if pos < nblocks:
                if b == NULL_BLOCK and pos == gone:
                    gone += 1
                    continue
                if b < 0 or b >= num_blocks:
                    return C_TABLE_OUT_OF_RANGE, s, pos
                counted[b] += 1
            elif b != NIL:
                return C_TABLE_PAST_END, s, pos
        # A block is released only once no token the sequence computes next can reach it.
        if gone > first_needed(st, s, length):
            return C_WINDOW, s, gone
        fill = length % block_size
        # A tail a truncation cut while it was shared (F_TRIMMED) may end inside content and a
        # hash that are another holder's, or were: the next append into it reclaims it.
        tail = seq_table[s, nblocks - 1] if fill != 0 else NIL
        if tail != NIL and not block_flags[tail] & F_TRIMMED:
            if block_flags[tail] & (F_HASHED | F_REGISTERED):
                return C_PARTIAL_TAIL, s, tail
            for j in range(fill, block_size):
                if tokens[tail, j] != -1:
                    return C_PARTIAL_TAIL, s, tail
        if keyed:
            # Engine keys: a hashed block's table hash is its key's, and its salt the
            # sequence's (keys may be given in any order, so no walk stops early).
            for pos in range(gone, length // block_size):
                b = seq_table[s, pos]
                if (block_flags[b] & F_HASHED) != 0 and (
                    block_hash[b] != key_hash(st.block_key, b, meta[M_HASH_BITS])
                    or block_salt[b] != seq_salt[s]
                ):
                    return C_HASH_MISMATCH, s, pos
            continue
        # Recompute the chained hash along the sequence's hashed full blocks (from the anchor
        # after the blocks that left the window).
        parent = root_hash()
        if gone > 0:
            if seq_anchors(st)[s, 1] == 0:
                continue
            parent = seq_anchors(st)[s, 0]
        for pos in range(gone, length // block_size):
            b = seq_table[s, pos]
            if (block_flags[b] & F_HASHED) == 0:
                break
            h = chain_hash(parent, seq_salt[s], tokens[b], meta[M_HASH_BITS])
            if h != block_hash[b] or block_salt[b] != seq_salt[s]:
                return C_HASH_MISMATCH, s, pos
            parent = h
    if live != meta[M_LIVE_SEQS]:
        return C_COUNTER, M_LIVE_SEQS, meta[M_LIVE_SEQS]
    used = 0
    for b in range(num_blocks):
        if counted[b] != ref[b]:
            return C_REFCOUNT, b, ref[b]
        if ref[b] > 0:
            used += 1
        flags = block_flags[b]
        # Engine keys register blocks of unknown content too.
        if (flags & F_HASHED and not flags & F_KNOWN and not keyed) or (
            flags & F_REGISTERED and not flags & F_HASHED
        ):
            return C_FLAGS, b, flags
    if used != meta[M_USED]:
        return C_COUNTER, M_USED, meta[M_USED]
    # Every block is in exactly one place: referenced, on the free stack, or on the LRU list.
    seen[:] = 0
    for b in range(num_blocks):
        if ref[b] > 0:
            seen[b] = 1
    # Reserved blocks: never referenced (their refcounts were checked against the tables
    # above), flagged or written, and on no list (marked seen, so a listing fails below).
    reserved = meta[M_RESERVED]
    if reserved < 0 or reserved >= num_blocks or (reserved > 0 and meta[M_PAGE_K] != 0):
        return C_COUNTER, M_RESERVED, reserved
    for b in range(reserved):
        if seen[b] != 0 or block_flags[b] != 0:
            return C_RESERVED, b, 0
        for j in range(block_size):
            if tokens[b, j] != -1:
                return C_RESERVED, b, j
        seen[b] = 1
    free_top = meta[M_FREE_TOP]
    if free_top < 0 or free_top > num_blocks:
        return C_COUNTER, M_FREE_TOP, free_top
    # With a page pool the free stack has no rows: a page's free blocks are on its own list.
    if free_top > free_stack.shape[0]:
        return C_COUNTER, M_FREE_TOP, free_top
    for i in range(free_top):
        b = free_stack[i]
        if b < 0 or b >= num_blocks or seen[b] != 0:
            return C_FREE_STACK, i, b
        seen[b] = 1
        if block_flags[b] != 0:
            return C_FREE_BLOCK_DIRTY, b, 0
        for j in range(block_size):
            if tokens[b, j] != -1:
                return C_FREE_BLOCK_DIRTY, b, j
    if meta[M_PAGE_K] != 0:
        code, a, c = check_pages(seen, marks, arena, scratch, pool)
        if code != 0:
            return code, a, c
    cached = 0
    prev = NIL
    b = meta[M_LRU_HEAD]
    while b != NIL:
        if b < 0 or b >= num_blocks or seen[b] != 0 or not block_flags[b] & F_REGISTERED:
            return C_LRU_NODE, b, 0
        if lru_prev[b] != prev:
            return C_LRU_BACK_LINK, b, 0
        seen[b] = 1
        cached += 1
        prev = b
        b = lru_next[b]
    if prev != meta[M_LRU_TAIL]:
        return C_LRU_TAIL, meta[M_LRU_TAIL], prev
    if cached != meta[M_CACHED]:
        return C_COUNTER, M_CACHED, meta[M_CACHED]
    for b in range(num_blocks):
        if seen[b] == 0:
            return C_BLOCK_LOST, b, 0
    code, a, c = policy_check(st, seen)
    if code != 0:
        return code, a, c
    # Prefix table: every entry a registered block reachable from its home slot, each once;
    # without cache_duplicates, each the block a lookup of its key finds.
    single = meta[M_CACHE_DUPLICATES] == 0
    mask = htab.shape[0] - 1
    occurrences = counts
    occurrences[:] = 0
    registered = 0
    for i in range(htab.shape[0]):
        e = htab[i]
        if e == EMPTY:
            continue
        if e < 0 or e >= num_blocks or not block_flags[e] & F_REGISTERED:
            return C_TABLE_ENTRY, i, e
        occurrences[e] += 1
        registered += 1
        j = np.int64(block_hash[e] & np.uint64(mask))
        while j != i:
            if htab[j] == EMPTY:
                return C_TABLE_UNREACHABLE, e, 0
            j = (j + 1) & mask
    for b in range(num_blocks):
        expected = 1 if block_flags[b] & F_REGISTERED else 0
        if occurrences[b] != expected:
            return C_TABLE_DUPLICATE, b, occurrences[b]
        if single and expected:
            first = _first_with_key(st, np.int64(b), keyed)
            if first != b:
                return C_TABLE_TWIN, b, first
    if registered != meta[M_REGISTERED]:
        return C_COUNTER, M_REGISTERED, meta[M_REGISTERED]
    # Sequence slots: the stack holds exactly the free ones.
    slot_top = meta[M_SLOT_TOP]
    if slot_top + live != max_seqs:
        return C_COUNTER, M_SLOT_TOP, slot_top
    marks[:] = 0
    for i in range(slot_top):
        s = slot_stack[i]
        if s < 0 or s >= max_seqs or seq_live[s] != 0 or marks[s] != 0:
            return C_SLOT_STACK, i, s
        marks[s] = 1
    return 0, 0, 0


@njit(cache=True)
def check(arena, scratch, pool):
    """Allocate the work arrays of :func:`check_state` and run it."""
    blocks = header_entry(arena, FIELD.ref, H_DIM0)
    rows = max(
        header_entry(arena, FIELD.seq_len, H_DIM0), header_entry(arena, FIELD.page_phys, H_DIM0)
    )
    counts = np.empty(blocks, dtype=np.int64)
    seen = np.empty(blocks, dtype=np.uint8)
    marks = np.empty(rows, dtype=np.uint8)
    return check_state(arena, scratch, pool, counts, seen, marks)
