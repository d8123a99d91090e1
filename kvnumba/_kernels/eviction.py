"""Eviction policies other than LRU (``docs/eviction.md``), as the block steps call them.

The block steps (:mod:`.blocks`, the admission's hit loop, registration) call six hooks:
:func:`policy_enter` (a block was released into the cache), :func:`policy_leave` (a cached
block is claimed by a hit or evicted), :func:`policy_victim` (the block an allocation
evicts), :func:`policy_hit`, :func:`policy_registered` and :func:`policy_unregistered`.

For an LRU manager each hook is nothing (the victim is the LRU head): which version a call
site gets is decided when numba types it, by the type of the views (:func:`.views.is_policy`:
a policy manager's kernels take the state arena typed with layout ``'A'``). The LRU kernels are
therefore compiled without any of this code, exactly as before. A policy manager's kernels
call the out-of-line functions below, which switch on ``meta[M_POLICY]`` at run time: all four
policies compile together, once, the first time any of them is chosen.

Every policy keeps the LRU list as the cached blocks in release order (``trim`` and
``reset_prefix_cache`` walk it); what it adds: ``lfu``, ``leaf-lru`` and ``oracle`` a binary
min-heap of evictable blocks ordered by ``(pol_key, pol_stamp)``; ``sieve`` a hand on the list
and a visited count per block; the leaf policies a forest of cached blocks (a parent link with
the parent's generation, intrusive lists of cached children). All writes to the per-block
fields are logged (``set_logged``), so a failed logged call rolls them back; the ``meta`` slots
are saved whole by such a call.
"""

import numpy as np
from numba.extending import overload

from kvnumba._kernels.jit import inlined, out_of_line
from kvnumba._kernels.prefix import table_find
from kvnumba._kernels.undo import set_logged
from kvnumba._kernels.views import is_policy, views
from kvnumba._state import (
    F_ORPHAN,
    F_REGISTERED,
    FIELD,
    M_HAND,
    M_HEAP_N,
    M_LRU_HEAD,
    M_POL_AGE,
    M_POL_CLOCK,
    M_POLICY,
    M_POLICY_FAULTS,
    NIL,
)
from kvnumba.eviction import POLICY_CODES

P_LFU = POLICY_CODES["lfu"]
P_SIEVE = POLICY_CODES["sieve"]
P_LEAF = POLICY_CODES["leaf-lru"]
P_ORACLE = POLICY_CODES["oracle"]
#: ``pol_parent`` of a block registered under a parent hash that no block holds any more: an
#: orphan as soon as it is cached. A root (a sequence's first block) has NIL.
ORPHAN_AT_BIRTH = -2
#: How a cached block leaves the cache (:func:`leave_cache`): a prefix hit claims it, or it is
#: evicted on request (``evict``, ``trim``, ``reset_prefix_cache``), or as the policy's victim.
CLAIMED, EVICTED, EVICTED_VICTIM = 0, 1, 2
#: ``oracle`` keys: a block never used again, and an orphan (evicted before anything else).
NEVER_KEY = -(1 << 62)
ORPHAN_KEY = NEVER_KEY - 1


# --- the heap: a min-heap of blocks on (pol_key, pol_stamp) ---------------------------------
@inlined
def _before(v, a, b):
    ka = v.pol_key[a]
    kb = v.pol_key[b]
    return ka < kb or (ka == kb and v.pol_stamp[a] < v.pol_stamp[b])


@inlined
def _place(v, i, b):
    set_logged(v, v.pol_heap, FIELD.pol_heap, i, b)
    set_logged(v, v.pol_pos, FIELD.pol_pos, b, i)


@out_of_line
def _sift_up(v, i):
    heap = v.pol_heap
    b = heap[i]
    while i > 0:
        p = (i - 1) >> 1
        q = heap[p]
        if not _before(v, b, q):
            break
        _place(v, i, q)
        i = p
    _place(v, i, b)


@out_of_line
def _sift_down(v, i):
    heap = v.pol_heap
    n = v.meta[M_HEAP_N]
    b = heap[i]
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and _before(v, heap[c + 1], heap[c]):
            c += 1
        if not _before(v, heap[c], b):
            break
        _place(v, i, heap[c])
        i = c
    _place(v, i, b)


@out_of_line
def heap_push(v, b):
    """Add block ``b`` (its key and stamp set) to the heap."""
    n = v.meta[M_HEAP_N]
    v.meta[M_HEAP_N] = n + 1
    _place(v, n, b)
    _sift_up(v, n)


@out_of_line
def heap_remove(v, b):
    """Take block ``b`` out of the heap."""
    i = np.int64(v.pol_pos[b])
    n = v.meta[M_HEAP_N] - 1
    v.meta[M_HEAP_N] = n
    set_logged(v, v.pol_pos, FIELD.pol_pos, b, NIL)
    if i != n:
        last = v.pol_heap[n]
        _place(v, i, last)
        _sift_up(v, i)
        _sift_down(v, np.int64(v.pol_pos[last]))


@out_of_line
def heap_fix(v, b):
    """Restore the heap order after block ``b``'s key changed."""
    _sift_up(v, np.int64(v.pol_pos[b]))
    _sift_down(v, np.int64(v.pol_pos[b]))


# --- the cached prefix forest of the leaf policies -------------------------------------------
@out_of_line
def leaf_key(v, b):
    """The heap key of cached block ``b`` under ``leaf-lru`` or ``oracle``."""
    orphan = (v.block_flags[b] & F_ORPHAN) != 0
    if v.meta[M_POLICY] == P_LEAF:
        return np.int64(-1) if orphan else np.int64(0)
    if orphan:
        return np.int64(ORPHAN_KEY)
    next_use = v.pol_value[b]
    return np.int64(NEVER_KEY) if next_use < 0 else -next_use


@inlined
def _is_cached(v, b):
    return v.ref[b] == 0 and (v.block_flags[b] & F_REGISTERED) != 0


@out_of_line
def _link_kid(v, b, p):
    first = v.pol_kid[p]
    set_logged(v, v.pol_sib_prev, FIELD.pol_sib_prev, b, NIL)
    set_logged(v, v.pol_sib_next, FIELD.pol_sib_next, b, first)
    if first != NIL:
        set_logged(v, v.pol_sib_prev, FIELD.pol_sib_prev, first, b)
    set_logged(v, v.pol_kid, FIELD.pol_kid, p, b)


@out_of_line
def _unlink_kid(v, b, p):
    before = v.pol_sib_prev[b]
    after = v.pol_sib_next[b]
    if before == NIL:
        set_logged(v, v.pol_kid, FIELD.pol_kid, p, after)
    else:
        set_logged(v, v.pol_sib_next, FIELD.pol_sib_next, before, after)
    if after != NIL:
        set_logged(v, v.pol_sib_prev, FIELD.pol_sib_prev, after, before)
    set_logged(v, v.pol_sib_prev, FIELD.pol_sib_prev, b, NIL)
    set_logged(v, v.pol_sib_next, FIELD.pol_sib_next, b, NIL)


@inlined
def _set_flags(v, b, flags):
    set_logged(v, v.block_flags, FIELD.block_flags, b, flags)


@out_of_line
def orphan_kids(v, p):
    """Block ``p`` lost its registration: its cached children become orphans (evicted first)."""
    set_logged(v, v.pol_gen, FIELD.pol_gen, p, v.pol_gen[p] + 1)
    c = v.pol_kid[p]
    while c != NIL:
        after = v.pol_sib_next[c]
        _unlink_kid(v, c, p)
        _set_flags(v, c, v.block_flags[c] | F_ORPHAN)
        set_logged(v, v.pol_key, FIELD.pol_key, c, leaf_key(v, c))
        if v.pol_pos[c] != NIL:
            heap_fix(v, c)
        c = after


# --- the hooks' policy versions -----------------------------------------------------------------
@out_of_line
def enter_cache(v, b):
    """Block ``b`` was just appended to the LRU list (released into the cache)."""
    meta = v.meta
    policy = meta[M_POLICY]
    clock = meta[M_POL_CLOCK]
    meta[M_POL_CLOCK] = clock + 1
    set_logged(v, v.pol_stamp, FIELD.pol_stamp, b, clock)
    if policy == P_LFU:
        set_logged(v, v.pol_key, FIELD.pol_key, b, meta[M_POL_AGE] + v.pol_value[b])
        heap_push(v, b)
    elif policy != P_SIEVE:
        p = np.int64(v.pol_parent[b])
        if p >= 0 and v.pol_gen[p] == v.pol_pgen[b]:
            if v.pol_kid[p] == NIL and v.pol_pos[p] != NIL:
                heap_remove(v, p)  # no longer a leaf
            _link_kid(v, b, p)
        elif p != NIL:
            _set_flags(v, b, v.block_flags[b] | F_ORPHAN)
        set_logged(v, v.pol_key, FIELD.pol_key, b, leaf_key(v, b))
        if v.pol_kid[b] == NIL:
            heap_push(v, b)


@out_of_line
def leave_cache(v, b, how):
    """Cached block ``b`` is about to leave the LRU list: ``how`` is :data:`CLAIMED`,
    :data:`EVICTED` or :data:`EVICTED_VICTIM`. A victim that the policy must never choose (a
    referenced block; under a leaf policy, one with cached children) is counted as a fault,
    which ``check()`` reports."""
    meta = v.meta
    policy = meta[M_POLICY]
    if how == EVICTED_VICTIM and (
        v.ref[b] != 0 or (policy != P_LFU and policy != P_SIEVE and v.pol_kid[b] != NIL)
    ):
        meta[M_POLICY_FAULTS] += 1
    if policy == P_SIEVE:
        if meta[M_HAND] == b:
            meta[M_HAND] = v.lru_next[b]
        return
    if v.pol_pos[b] != NIL:
        heap_remove(v, b)
    if policy == P_LFU:
        return
    flags = v.block_flags[b]
    if flags & F_ORPHAN:
        _set_flags(v, b, flags & ~F_ORPHAN)
    elif v.pol_parent[b] >= 0:
        p = np.int64(v.pol_parent[b])
        _unlink_kid(v, b, p)
        if v.pol_kid[p] == NIL and _is_cached(v, p):
            heap_push(v, p)  # a leaf now
    if how != CLAIMED:
        orphan_kids(v, b)


@out_of_line
def choose_victim(v):
    """The cached block an allocation evicts (at least one is cached)."""
    meta = v.meta
    policy = meta[M_POLICY]
    if policy == P_SIEVE:
        b = meta[M_HAND]
        if b == NIL:
            b = meta[M_LRU_HEAD]
        while v.pol_value[b] > 0:
            set_logged(v, v.pol_value, FIELD.pol_value, b, 0)
            b = v.lru_next[b]
            if b == NIL:
                b = meta[M_LRU_HEAD]
        meta[M_HAND] = b  # leave_cache moves it on to the victim's successor
        return np.int64(b)
    b = np.int64(v.pol_heap[0])
    if policy == P_LFU:
        meta[M_POL_AGE] = v.pol_key[b]
    return b


@out_of_line
def note_hit(v, b):
    """Block ``b`` is a prefix hit of an admitted prompt."""
    policy = v.meta[M_POLICY]
    if policy == P_LFU or policy == P_SIEVE:
        set_logged(v, v.pol_value, FIELD.pol_value, b, v.pol_value[b] + 1)


@out_of_line
def note_registered(v, b, prev, by_content):
    """Block ``b`` was just registered; ``prev`` is the previous block of its sequence (NIL for
    the first). ``by_content``: registered by its chained hash (else under an engine key)."""
    policy = v.meta[M_POLICY]
    set_logged(v, v.pol_value, FIELD.pol_value, b, -1 if policy == P_ORACLE else 0)
    if policy != P_LEAF and policy != P_ORACLE:
        return
    set_logged(v, v.pol_gen, FIELD.pol_gen, b, v.pol_gen[b] + 1)
    p = np.int64(NIL)
    if prev >= 0:
        if v.block_flags[prev] & F_REGISTERED:
            p = prev
        elif by_content:
            # The previous block is a copy: the parent is the registered block of its content.
            found = table_find(v, v.block_hash[prev], v.block_salt[prev], v.tokens[prev])
            p = found if found >= 0 else np.int64(ORPHAN_AT_BIRTH)
    set_logged(v, v.pol_parent, FIELD.pol_parent, b, p)
    set_logged(v, v.pol_pgen, FIELD.pol_pgen, b, v.pol_gen[p] if p >= 0 else 0)


@out_of_line
def note_unregistered(v, b):
    """Block ``b`` (referenced) lost its registration: its cached children are orphans."""
    policy = v.meta[M_POLICY]
    if policy == P_LEAF or policy == P_ORACLE:
        orphan_kids(v, b)


@out_of_line
def set_next_use(v, b, next_use):
    """``oracle``: the trace position of the next use of block ``b``'s content (-1: never)."""
    set_logged(v, v.pol_value, FIELD.pol_value, b, next_use)
    if _is_cached(v, b):
        set_logged(v, v.pol_key, FIELD.pol_key, b, leaf_key(v, b))
        if v.pol_pos[b] != NIL:
            heap_fix(v, b)


# --- the hooks: nothing (or the LRU head) for an LRU manager's views -------------------------
# Each is a Python function that numba resolves at every call site to the policy's call or to
# nothing, depending on the views; run as Python (``NUMBA_DISABLE_JIT``) it tests the policy at
# run time instead. The hooks returning nothing are not inlined at numba's IR level
# (``inline="never"``; LLVM still inlines the empty LRU versions): inlined there, a hook that
# returns nothing in the middle of a loop body was seen to lose the caller's later statements.
def policy_enter(pv, pb):
    """:func:`enter_cache` (nothing under LRU)."""
    if pv.meta[M_POLICY]:
        enter_cache(pv, pb)


def policy_leave(pv, pb, phow):
    """:func:`leave_cache` (nothing under LRU)."""
    if pv.meta[M_POLICY]:
        leave_cache(pv, pb, phow)


def policy_victim(pv):
    """:func:`choose_victim`; the LRU head under LRU."""
    return choose_victim(pv) if pv.meta[M_POLICY] else pv.meta[M_LRU_HEAD]


def policy_hit(pv, pb):
    """:func:`note_hit` (nothing under LRU)."""
    if pv.meta[M_POLICY]:
        note_hit(pv, pb)


def policy_registered(pv, pb, pprev, pcontent):
    """:func:`note_registered` (nothing under LRU)."""
    if pv.meta[M_POLICY]:
        note_registered(pv, pb, pprev, pcontent)


def policy_unregistered(pv, pb):
    """:func:`note_unregistered` (nothing under LRU)."""
    if pv.meta[M_POLICY]:
        note_unregistered(pv, pb)


@overload(policy_victim, inline="always")
def _policy_victim_impl(pv):
    if is_policy(pv):
        return lambda pv: choose_victim(pv)
    return lambda pv: pv.meta[M_LRU_HEAD]


@overload(policy_registered, inline="never")
def _policy_registered_impl(pv, pb, pprev, pcontent):
    if is_policy(pv):
        return lambda pv, pb, pprev, pcontent: note_registered(
            pv, np.int64(pb), np.int64(pprev), pcontent
        )
    return lambda pv, pb, pprev, pcontent: None


@overload(policy_leave, inline="never")
def _policy_leave_impl(pv, pb, phow):
    if is_policy(pv):
        return lambda pv, pb, phow: leave_cache(pv, np.int64(pb), np.int64(phow))
    return lambda pv, pb, phow: None


def _resolve_by_views(stub, policy_call):
    """Make numba resolve ``stub(v, b)`` to ``policy_call(v, b)`` for a policy manager's views
    and to nothing for an LRU manager's."""

    @overload(stub, inline="never")
    def _resolve(pv, pb):
        if is_policy(pv):
            return lambda pv, pb: policy_call(pv, np.int64(pb))
        return lambda pv, pb: None


for _stub, _call in [
    (policy_enter, enter_cache),
    (policy_hit, note_hit),
    (policy_unregistered, note_unregistered),
]:
    _resolve_by_views(_stub, _call)


@out_of_line
def run_set_next_use(blocks, next_use, arena, scratch):
    """``set_next_use`` of validated blocks and next uses (``oracle`` only)."""
    v = views(arena, scratch, scratch)
    for i in range(blocks.shape[0]):
        set_next_use(v, blocks[i], next_use[i])
