"""``check()`` of an eviction policy's own state (``_kernels/eviction.py``), recomputed from
the LRU list, the heap and the forest links.

Called by :func:`.check.check_state` after the LRU list was verified (the cached blocks are
exactly those on it). For an LRU manager's views :func:`policy_check` is nothing.
"""

import numpy as np
from numba.extending import overload

from kvnumba._kernels.eviction import (
    ORPHAN_AT_BIRTH,
    P_LFU,
    P_PRIORITY,
    P_SIEVE,
    is_cached,
    keeps_forest,
    leaf_key,
    leaves_only,
    pol_links,
    pol_words,
    run_next,
)
from kvnumba._kernels.jit import out_of_line
from kvnumba._kernels.versions import is_policy
from kvnumba._layout import (
    F_FLOOR,
    F_ORPHAN,
    F_REGISTERED,
    F_RUN1,
    F_VISITED,
    L_GEN,
    L_HEAP,
    L_KID,
    L_PARENT,
    L_PGEN,
    L_POS,
    L_SIB_NEXT,
    L_SIB_PREV,
    M_CACHED,
    M_HAND,
    M_HEAP_N,
    M_LRU_HEAD,
    M_POL_AGE,
    M_POLICY,
    M_POLICY_FAULTS,
    M_RUN_HAND,
    M_RUN_KEY,
    NIL,
    NUM_RUNS,
    W_KEY,
    W_STAMP,
    W_VALUE,
)

C_POLICY_HEAP = 40
C_POLICY_HEAP_MEMBER = 41
C_POLICY_HEAP_ORDER = 42
C_POLICY_HAND = 43
C_POLICY_KIDS = 44
C_POLICY_UNLINKED = 45
C_POLICY_ORPHAN = 46
C_POLICY_KEY = 47
C_POLICY_FAULT = 48
C_POLICY_FLAG = 49
C_POLICY_FLOOR = 50
C_POLICY_AGE = 51
C_POLICY_RUN = 52

#: Words for the codes above (``check.MESSAGES`` includes them).
POLICY_MESSAGES = {
    C_POLICY_HEAP: "eviction heap: position {a} holds block {b}, out of range or not back-linked",
    C_POLICY_HEAP_MEMBER: "eviction heap: block {a} is in the heap but is referenced, not cached "
    "or not evictable under the policy ({b})",
    C_POLICY_HEAP_ORDER: "eviction heap: block {a} comes before its parent entry {b}",
    C_POLICY_HAND: "sieve: the hand is block {a}, which is not cached",
    C_POLICY_KIDS: "prefix forest: block {a} is listed as a cached child of {b} but is not "
    "cached, not its child, or its link is stale or broken",
    C_POLICY_UNLINKED: "prefix forest: cached block {a} has a live parent {b} but is neither "
    "listed under it nor marked an orphan (it cannot be hit)",
    C_POLICY_ORPHAN: "block {a} is marked an orphan but is not cached, or is listed under {b}",
    C_POLICY_KEY: "eviction heap: block {a} has key {b}, recomputed differently",
    C_POLICY_FAULT: "the eviction policy chose {a} victims it must never choose (a referenced "
    "block, or when only leaves are candidates a block with cached children)",
    C_POLICY_FLAG: "block {a} has policy flags {b} that its state does not allow (sieve's "
    "visited bit on an unregistered block or under another policy; an orphan mark without "
    "the prefix forest; lfu's floor mark on a block not cached, in the heap or with hits; a "
    "priority policy's run mark on a block not cached, in the heap, not a candidate or in two "
    "runs)",
    C_POLICY_FLOOR: "lfu: the floor's oldest block is {b}, but the first floor block in release "
    "order is {a}",
    C_POLICY_AGE: "lfu: block {a} in the heap has priority {b}, below the age",
    C_POLICY_RUN: "priority policy: run {a} is out of order at block {b} (its oldest block is "
    "not its hand, a key decreases along it, or one is above the run's newest key)",
}


@out_of_line
def check_policy_state(st, seen):
    """``(0, 0, 0)`` if the policy's state is consistent, else the first violation.

    ``seen`` is a work array of one byte per block.
    """
    meta = st.meta
    policy = meta[M_POLICY]
    if policy == 0:
        return 0, 0, 0  # LRU under the extended kernels (a windowed manager): no policy state
    num_blocks = st.ref.shape[0]
    n = meta[M_HEAP_N]
    if meta[M_POLICY_FAULTS] != 0:
        return C_POLICY_FAULT, meta[M_POLICY_FAULTS], 0
    # The flags only some policies use: the visited bit (sieve, registered blocks only), the
    # floor mark (lfu, cached blocks without hits outside the heap), the run marks (a priority
    # policy, candidates outside the heap) and the orphan mark (the forest policies; checked
    # with the forest below).
    forest = keeps_forest(st)
    listed = 0  # lfu's floor and a priority policy's runs: candidates outside the heap
    for b in range(num_blocks):
        flags = st.block_flags[b]
        if flags & F_VISITED and (policy != P_SIEVE or not flags & F_REGISTERED):
            return C_POLICY_FLAG, b, flags
        if flags & F_ORPHAN and not forest:
            return C_POLICY_FLAG, b, flags
        if flags & F_FLOOR and policy == P_LFU:
            if (
                not is_cached(st, b)
                or pol_links(st)[b, L_POS] != NIL
                or pol_words(st)[b, W_VALUE] != 0
            ):
                return C_POLICY_FLAG, b, flags
            listed += 1
        elif flags & (F_FLOOR | F_RUN1):  # a run of a priority policy
            if (
                policy != P_PRIORITY
                or (flags & F_FLOOR and flags & F_RUN1)
                or not is_cached(st, b)
                or pol_links(st)[b, L_POS] != NIL
                or (leaves_only(st) and pol_links(st)[b, L_KID] != NIL)
            ):
                return C_POLICY_FLAG, b, flags
            listed += 1
    if policy == P_SIEVE:
        hand = meta[M_HAND]
        if n != 0:
            return C_POLICY_HEAP, n, 0
        if hand != NIL and (hand < 0 or hand >= num_blocks or not is_cached(st, hand)):
            return C_POLICY_HAND, hand, 0
        return 0, 0, 0
    links, words = pol_links(st), pol_words(st)
    heap, pos = links[:, L_HEAP], links[:, L_POS]
    key, stamp = words[:, W_KEY], words[:, W_STAMP]
    leaf = leaves_only(st)
    # A priority depends on the clocks when it was computed: its keys cannot be recomputed.
    rekeyable = leaf and policy != P_PRIORITY
    # The heap: entries back-linked, members evictable under the policy, ordered.
    in_heap = 0
    for b in range(num_blocks):
        if pos[b] != NIL:
            in_heap += 1
    if n < 0 or n > num_blocks or in_heap != n:
        return C_POLICY_HEAP, n, in_heap
    for i in range(n):
        b = heap[i]
        if b < 0 or b >= num_blocks or pos[b] != i:
            return C_POLICY_HEAP, i, b
        if not is_cached(st, b) or (leaf and links[b, L_KID] != NIL):
            return C_POLICY_HEAP_MEMBER, b, policy
        if rekeyable and key[b] != leaf_key(st, np.int64(b)):
            return C_POLICY_KEY, b, key[b]
        if i > 0:
            p = heap[(i - 1) >> 1]
            if key[b] < key[p] or (key[b] == key[p] and stamp[b] < stamp[p]):
                return C_POLICY_HEAP_ORDER, b, p
    if policy == P_LFU:
        if n + listed != meta[M_CACHED]:
            return C_POLICY_HEAP, n, meta[M_CACHED]
        first = meta[M_LRU_HEAD]
        while first != NIL and not st.block_flags[first] & F_FLOOR:
            first = st.lru_next[first]
        if first != meta[M_HAND]:
            return C_POLICY_FLOOR, first, meta[M_HAND]
        for i in range(n):
            if key[heap[i]] < meta[M_POL_AGE]:
                return C_POLICY_AGE, heap[i], key[heap[i]]
        return 0, 0, 0
    # A priority policy's runs: each in release order from its hand, keys never decreasing,
    # none above the run's newest key (``listed`` counted their blocks).
    for r in range(NUM_RUNS):
        flag = F_FLOOR << r
        first = meta[M_LRU_HEAD]
        while first != NIL and not st.block_flags[first] & flag:
            first = st.lru_next[first]
        if first != meta[M_RUN_HAND + r]:
            return C_POLICY_RUN, r, first
        b = first
        while b != NIL:
            c = run_next(st, b, flag)
            if (c != NIL and key[c] < key[b]) or key[b] > meta[M_RUN_KEY + r]:
                return C_POLICY_RUN, r, b
            b = c
    if not forest:  # a priority policy without the forest: every cached block a candidate
        if n + listed != meta[M_CACHED]:
            return C_POLICY_HEAP, n + listed, meta[M_CACHED]
        return 0, 0, 0
    # The forest: every listed child cached, valid and listed once, under its own parent.
    seen[:] = 0
    kid = links[:, L_KID]
    parent, pgen, gen = links[:, L_PARENT], links[:, L_PGEN], links[:, L_GEN]
    sib_prev, sib_next = links[:, L_SIB_PREV], links[:, L_SIB_NEXT]
    for p in range(num_blocks):
        before = NIL
        c = kid[p]
        while c != NIL:
            if (
                c < 0
                or c >= num_blocks
                or seen[c] != 0
                or not is_cached(st, c)
                or parent[c] != p
                or gen[p] != pgen[c]
                or sib_prev[c] != before
                or st.block_flags[c] & F_ORPHAN
            ):
                return C_POLICY_KIDS, c, p
            seen[c] = 1
            before = c
            c = sib_next[c]
    leaves = 0
    for b in range(num_blocks):
        orphan = (st.block_flags[b] & F_ORPHAN) != 0
        if not is_cached(st, b):
            if orphan:
                return C_POLICY_ORPHAN, b, NIL
            continue
        if kid[b] == NIL:
            leaves += 1
        p = parent[b]
        if orphan:
            if seen[b] != 0:
                return C_POLICY_ORPHAN, b, p
        elif p == ORPHAN_AT_BIRTH or (p >= 0 and (gen[p] != pgen[b] or seen[b] == 0)):
            return C_POLICY_UNLINKED, b, p
    if leaves != n + listed and leaf:
        return C_POLICY_HEAP, n + listed, leaves
    if not leaf and n + listed != meta[M_CACHED]:
        return C_POLICY_HEAP, n + listed, meta[M_CACHED]
    return 0, 0, 0


def policy_check(pst, pseen):
    """:func:`check_policy_state`; ``(0, 0, 0)`` for an LRU manager."""
    if pst.meta[M_POLICY]:
        return check_policy_state(pst, pseen)
    return 0, 0, 0


@overload(policy_check, inline="always")
def _policy_check_impl(pst, pseen):
    if is_policy(pst):
        return lambda pst, pseen: check_policy_state(pst, pseen)
    return lambda pst, pseen: (0, 0, 0)
