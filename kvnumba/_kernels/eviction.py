"""Eviction policies other than LRU (``docs/eviction.md``), as the block steps call them.

The block steps (:mod:`.blocks`, the admission's hit loop, registration) call six hooks:
:func:`policy_enter` (a block was released into the cache), :func:`policy_leave` (a cached
block is claimed by a hit or evicted), :func:`policy_victim` (the block an allocation
evicts), :func:`policy_hit`, :func:`policy_registered` and :func:`policy_unregistered`.

For an LRU manager each hook is nothing (the victim is the LRU head): which version a call
site gets is decided when numba types it, by the type of the views (:func:`.versions.is_policy`:
a policy manager's kernels take the state arena typed as ``versions.POLICY_ARENA``). The LRU kernels are
therefore compiled without any of this code. A policy manager's kernels
call the out-of-line functions below, which switch on ``meta[M_POLICY]`` at run time: all four
policies compile together, once, the first time any of them is chosen.

Every policy keeps the LRU list as the cached blocks in release order (``trim`` and
``reset_prefix_cache`` walk it); what it adds: ``lfu``, ``leaf-lru`` and ``oracle`` a binary
min-heap of evictable blocks ordered by ``(key, stamp)`` (a priority policy also keeps
release-order runs beside it, see ``_layout.M_RUN_HAND``); ``sieve`` a hand on the list
and a visited bit per block (the flag ``F_VISITED``: sieve has no per-block fields); the leaf
policies, and a priority policy that reads it, a forest of cached blocks (a parent link with the
parent's generation, intrusive lists of cached children). A policy's rows hold only the columns it reads
(``_layout.policy_columns``). In a logged call every write to the per-block fields
(``pol_words`` and ``pol_links``, columns ``W_*`` and ``L_*``, and the flags) is logged, so a
failed logged call rolls them back; the ``meta`` slots are saved whole by such a call. Outside
one, the heap's loops write their links plainly.
"""

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import config, types
from numba.extending import intrinsic, overload

from kvnumba._kernels.carve import carve
from kvnumba._kernels.jit import inlined, out_of_line
from kvnumba._kernels.prefix import table_find
from kvnumba._kernels.undo import log_write, set_logged
from kvnumba._kernels.versions import is_policy
from kvnumba._kernels.views import Views, header_entry, views
from kvnumba._layout import (
    F_FLOOR,
    F_ORPHAN,
    F_REGISTERED,
    F_RUN1,
    F_VISITED,
    FIELD,
    FT_DEPTH,
    FT_HINT,
    FT_HITS,
    FT_LENGTH,
    FT_TAG,
    H_DIM0,
    H_DIM1,
    H_OFFSET,
    L_GEN,
    L_HEAP,
    L_KID,
    L_PARENT,
    L_PGEN,
    L_POS,
    L_SIB_NEXT,
    L_SIB_PREV,
    M_FEATURE_COL,
    M_HAND,
    M_HEAP_N,
    M_LRU_HEAD,
    M_POL_AGE,
    M_POL_CLOCK,
    M_POLICY,
    M_POLICY_FAULTS,
    M_PRIORITY_FOREST,
    M_PRIORITY_LEAVES,
    M_RUN_HAND,
    M_RUN_KEY,
    NIL,
    NUM_RUNS,
    REKEY_CHILDREN,
    REKEY_NEXT_USE,
    REKEY_ORPHAN,
    REKEY_TAG,
    S_FEATURES,
    S_LOG_ON,
    S_PRIORITY_FN,
    S_PRIORITY_REKEY,
    S_RELEASE_LEN,
    S_RELEASE_TAG,
    W_KEY,
    W_STAMP,
    W_VALUE,
)
from kvnumba.eviction import POLICY_CODES, PRIORITY_CODE
from kvnumba.priority import NUM_FEATURES

P_LFU = POLICY_CODES["lfu"]
P_SIEVE = POLICY_CODES["sieve"]
P_LEAF = POLICY_CODES["leaf-lru"]
P_ORACLE = POLICY_CODES["oracle"]
P_PRIORITY = PRIORITY_CODE
#: The parent (``L_PARENT``) of a block registered under a parent hash that no block holds any
#: more: an orphan as soon as it is cached. A root (a sequence's first block) has NIL.
ORPHAN_AT_BIRTH = -2
#: How a cached block leaves the cache (:func:`leave_cache`): a prefix hit claims it, or it is
#: evicted on request (``evict``, ``trim``, ``reset_prefix_cache``), or as the policy's victim.
CLAIMED, EVICTED, EVICTED_VICTIM = 0, 1, 2
#: ``oracle`` keys: a block never used again, and an orphan (evicted before anything else).
NEVER_KEY = -(1 << 62)
ORPHAN_KEY = NEVER_KEY - 1


# --- the per-block policy fields: carved here, not part of the views ------------------------
# Inlined at numba's IR level: a helper compiled without NRT may not return an array it made.
@njit(cache=True, inline="always")
def pol_links(v):
    """The ``pol_links`` field (int32, ``L_*`` columns) of views ``v``'s state arena: the heap's
    2 columns under ``lfu`` and a priority policy without the forest, 8 with the prefix forest,
    none under ``sieve``."""
    arena = v.arena
    shape = (
        header_entry(arena, FIELD.pol_links, H_DIM0),
        header_entry(arena, FIELD.pol_links, H_DIM1),
    )
    return carve(arena, header_entry(arena, FIELD.pol_links, H_OFFSET), shape, np.int32)


@njit(cache=True, inline="always")
def pol_words(v):
    """The ``pol_words`` field (int64, ``W_*`` columns) of views ``v``'s state arena: none under
    ``lru`` and ``sieve``, 2 under ``leaf-lru``, 3 under ``lfu`` and ``oracle``, 2 to 7 under a
    priority policy (``_layout.policy_columns``)."""
    arena = v.arena
    shape = (
        header_entry(arena, FIELD.pol_words, H_DIM0),
        header_entry(arena, FIELD.pol_words, H_DIM1),
    )
    return carve(arena, header_entry(arena, FIELD.pol_words, H_OFFSET), shape, np.int64)


@inlined
def _set_link(v, b, column, value):
    """``pol_links[b, column] = value``, logged (the field's flat index, as ``seq_table``)."""
    links = pol_links(v)
    log_write(v, FIELD.pol_links, b * links.shape[1] + column, links[b, column])
    links[b, column] = value


@inlined
def _set_word(v, b, column, value):
    """``pol_words[b, column] = value``, logged."""
    words = pol_words(v)
    log_write(v, FIELD.pol_words, b * words.shape[1] + column, words[b, column])
    words[b, column] = value


@inlined
def feature(v, b, ft, default):
    """Stored feature ``ft`` (``FT_*``) of block ``b`` under a priority policy; ``default``
    where its function does not read it (no column)."""
    column = v.meta[M_FEATURE_COL + ft]
    return pol_words(v)[b, column] if column >= 0 else np.int64(default)


@inlined
def set_feature(v, b, ft, value):
    """Store feature ``ft`` of block ``b`` under a priority policy (logged); nothing where
    its function does not read it."""
    column = v.meta[M_FEATURE_COL + ft]
    if column >= 0:
        _set_word(v, b, column, value)


# --- the heap: a min-heap of blocks on (key, stamp) --------------------------------------------
# Stamps are unique among cached blocks, so (key, stamp) orders them totally: any valid heap
# has the same top, and the victims do not depend on how the heap is arranged.
@inlined
def _less(ka, sa, kb, sb):
    return ka < kb or (ka == kb and sa < sb)


@inlined
def _place(v, links, logged, i, b):
    """Block ``b`` at heap position ``i``: logged writes in a logged call, else plain ones to
    the ``links`` the loop carved once (each logged write carves the field again, since the
    compiler cannot know that the arena's header stays put)."""
    if logged:
        _set_link(v, i, L_HEAP, b)
        _set_link(v, b, L_POS, i)
    else:
        links[i, L_HEAP] = b
        links[b, L_POS] = i


# The loops stay out of line, taking the three arenas rather than the views: an out-of-line
# call passes every argument flattened, and the views are forty arrays. They keep the moving
# block's key and stamp in locals: the heap's writes go to the same arena as the keys, so the
# compiler could not keep them itself.
@inlined
def _rise(v, links, words, i, b):
    """Put block ``b`` at heap position ``i`` or above it: past every parent it comes first."""
    logged = v.scr[S_LOG_ON] != 0
    kb, sb = words[b, W_KEY], words[b, W_STAMP]
    while i > 0:
        p = (i - 1) >> 1
        q = links[p, L_HEAP]
        if not _less(kb, sb, words[q, W_KEY], words[q, W_STAMP]):
            break
        _place(v, links, logged, i, q)
        i = p
    _place(v, links, logged, i, b)


@out_of_line
def _sift_up_at(arena, scratch, pool, i):
    v = views(arena, scratch, pool)
    links, words = pol_links(v), pol_words(v)
    _rise(v, links, words, i, links[i, L_HEAP])


@inlined
def _smaller_child(links, words, c, n):
    """Of the children ``c`` and ``c + 1`` (if below ``n``): position, block, key, stamp of the
    one that comes first."""
    bc = links[c, L_HEAP]
    kc, sc = words[bc, W_KEY], words[bc, W_STAMP]
    if c + 1 < n:
        bd = links[c + 1, L_HEAP]
        kd, sd = words[bd, W_KEY], words[bd, W_STAMP]
        if _less(kd, sd, kc, sc):
            return c + 1, bd, kd, sd
    return c, bc, kc, sc


@out_of_line
def _sift_down_at(arena, scratch, pool, i):
    v = views(arena, scratch, pool)
    links, words = pol_links(v), pol_words(v)
    n = v.meta[M_HEAP_N]
    logged = v.scr[S_LOG_ON] != 0
    b = links[i, L_HEAP]
    kb, sb = words[b, W_KEY], words[b, W_STAMP]
    while 2 * i + 1 < n:
        c, bc, kc, sc = _smaller_child(links, words, 2 * i + 1, n)
        if not _less(kc, sc, kb, sb):
            break
        _place(v, links, logged, i, bc)
        i = c
    _place(v, links, logged, i, b)


@out_of_line
def _pop_top_at(arena, scratch, pool, last):
    """Fill the heap's empty top with block ``last`` (taken from its end): the hole goes down
    along the smaller children to a leaf, one comparison a level, then ``last`` rises from
    there. The block from the end belongs near the bottom, so this compares about half as
    often as sifting it down from the top."""
    v = views(arena, scratch, pool)
    links, words = pol_links(v), pol_words(v)
    n = v.meta[M_HEAP_N]
    logged = v.scr[S_LOG_ON] != 0
    i = np.int64(0)
    while 2 * i + 1 < n:
        c, bc, _, _ = _smaller_child(links, words, 2 * i + 1, n)
        _place(v, links, logged, i, bc)
        i = c
    _rise(v, links, words, i, last)


@inlined
def _sift_up(v, i):
    _sift_up_at(v.arena, v.scratch, v.pool, i)


@inlined
def _sift_down(v, i):
    _sift_down_at(v.arena, v.scratch, v.pool, i)


@inlined
def heap_push(v, b):
    """Add block ``b`` (its key and stamp set) to the heap."""
    n = v.meta[M_HEAP_N]
    v.meta[M_HEAP_N] = n + 1
    _place(v, pol_links(v), v.scr[S_LOG_ON] != 0, n, b)
    _sift_up(v, n)


@inlined
def heap_remove(v, b):
    """Take block ``b`` out of the heap."""
    i = np.int64(pol_links(v)[b, L_POS])
    n = v.meta[M_HEAP_N] - 1
    v.meta[M_HEAP_N] = n
    _set_link(v, b, L_POS, NIL)
    if i != n:
        last = pol_links(v)[n, L_HEAP]
        if i == 0:  # the victim, mostly
            _pop_top_at(v.arena, v.scratch, v.pool, last)
        else:
            _place(v, pol_links(v), v.scr[S_LOG_ON] != 0, i, last)
            _sift_up(v, i)
            _sift_down(v, np.int64(pol_links(v)[last, L_POS]))


@inlined
def heap_fix(v, b):
    """Restore the heap order after block ``b``'s key changed."""
    _sift_up(v, np.int64(pol_links(v)[b, L_POS]))
    _sift_down(v, np.int64(pol_links(v)[b, L_POS]))


# --- a priority policy's release-order runs (``_layout.M_RUN_HAND``) ---------------------------
# A block joins a run only when it is released, so it is the newest block on the LRU list and
# the run's order is its order there: when a run's oldest block leaves, the next one is found
# by walking the list forward from it, as lfu's floor does (a hand passes each block once).
@inlined
def in_run(v, b):
    """Whether cached block ``b`` is in a run of a priority policy."""
    return v.meta[M_POLICY] == P_PRIORITY and (v.block_flags[b] & (F_FLOOR | F_RUN1)) != 0


@inlined
def run_next(v, b, flag):
    """The next block after ``b`` in release order marked ``flag``, or NIL."""
    c = v.lru_next[b]
    while c != NIL and not v.block_flags[c] & flag:
        c = v.lru_next[c]
    return np.int64(c)


@inlined
def add_candidate(v, b):
    """Cached block ``b``, just released with its key set, becomes a candidate: under a priority
    policy in the first run whose newest key is at most its own (or that is empty), else in
    the heap."""
    meta = v.meta
    if meta[M_POLICY] == P_PRIORITY:
        key = pol_words(v)[b, W_KEY]
        for r in range(NUM_RUNS):
            if meta[M_RUN_HAND + r] == NIL or key >= meta[M_RUN_KEY + r]:
                _set_flags(v, b, v.block_flags[b] | (F_FLOOR << r))
                if meta[M_RUN_HAND + r] == NIL:
                    meta[M_RUN_HAND + r] = b
                meta[M_RUN_KEY + r] = key
                return
    heap_push(v, b)


@inlined
def is_candidate(v, b):
    """Whether block ``b`` is a candidate for eviction: in the heap or in a run."""
    return pol_links(v)[b, L_POS] != NIL or in_run(v, b)


@inlined
def drop_candidate(v, b):
    """Candidate ``b`` stops being one (it leaves the cache, gains a child or is re-keyed)."""
    flags = v.block_flags[b]
    if in_run(v, b):
        r = 0 if flags & F_FLOOR else 1
        flag = F_FLOOR << r
        if v.meta[M_RUN_HAND + r] == b:
            v.meta[M_RUN_HAND + r] = run_next(v, b, flag)
        _set_flags(v, b, flags ^ flag)
    else:
        heap_remove(v, b)


# --- a priority policy's priority (``kvnumba.priority``) --------------------------------------
def _call_priority_python(scr, address):
    """:func:`call_priority` run as Python: the policy is found by its registry key."""
    from kvnumba.priority import call_python

    return call_python(address, scr[S_FEATURES : S_FEATURES + NUM_FEATURES])


def _call_priority_intrinsic(typingctx, scr, address):
    """Call the C function at ``address`` on the feature record at ``scr[S_FEATURES:]``."""

    def codegen(context, builder, signature, args):
        record = context.make_array(signature.args[0])(context, builder, args[0])
        i64 = ir.IntType(64)
        first = builder.gep(record.data, [ir.Constant(i64, S_FEATURES)])
        function = ir.FunctionType(i64, [i64.as_pointer()])
        target = builder.inttoptr(args[1], function.as_pointer())
        return builder.call(target, [first])

    return types.int64(scr, types.int64), codegen


call_priority = _call_priority_python if config.DISABLE_JIT else intrinsic(_call_priority_intrinsic)


@inlined
def priority_of(v, b):
    """The priority of cached block ``b`` under a priority policy: its features written to the
    record (``kvnumba.priority.BlockFeatures``, in order), the policy's function called."""
    words = pol_words(v)
    links = pol_links(v)
    scr = v.scr
    children = 0
    if scr[S_PRIORITY_REKEY] & REKEY_CHILDREN:  # else the function does not read it
        c = links[b, L_KID]
        while c != NIL:
            children += 1
            c = links[c, L_SIB_NEXT]
    meta = v.meta
    f = S_FEATURES
    scr[f] = b
    scr[f + 1] = feature(v, b, FT_HITS, 0)
    scr[f + 2] = words[b, W_STAMP]
    scr[f + 3] = meta[M_POL_CLOCK]
    scr[f + 4] = meta[M_POL_AGE]
    scr[f + 5] = feature(v, b, FT_DEPTH, 0)
    scr[f + 6] = children
    scr[f + 7] = 1 if v.block_flags[b] & F_ORPHAN else 0
    scr[f + 8] = feature(v, b, FT_HINT, -1)
    scr[f + 9] = feature(v, b, FT_TAG, 0)
    scr[f + 10] = feature(v, b, FT_LENGTH, 0)
    scr[f + 11] = v.tokens.shape[1]
    return np.int64(call_priority(scr, scr[S_PRIORITY_FN]))


# --- the cached prefix forest of the leaf and priority policies --------------------------------
@inlined
def keeps_forest(v):
    """Whether the manager's policy keeps the cached prefix forest: ``leaf-lru``, ``oracle``,
    and a priority policy that reads what depends on it (``M_PRIORITY_FOREST``)."""
    policy = v.meta[M_POLICY]
    if policy == P_PRIORITY:
        return v.meta[M_PRIORITY_FOREST] != 0
    return policy == P_LEAF or policy == P_ORACLE


@inlined
def leaves_only(v):
    """Whether only leaves of the cached prefix forest are candidates (in the heap)."""
    policy = v.meta[M_POLICY]
    if policy == P_PRIORITY:
        return v.meta[M_PRIORITY_LEAVES] != 0
    return policy == P_LEAF or policy == P_ORACLE


@inlined
def leaf_key(v, b):
    """The heap key of cached block ``b`` under ``leaf-lru``, ``oracle`` or a priority policy."""
    if v.meta[M_POLICY] == P_PRIORITY:
        return priority_of(v, b)
    orphan = (v.block_flags[b] & F_ORPHAN) != 0
    if v.meta[M_POLICY] == P_LEAF:
        return np.int64(-1) if orphan else np.int64(0)
    if orphan:
        return np.int64(ORPHAN_KEY)
    next_use = pol_words(v)[b, W_VALUE]
    return np.int64(NEVER_KEY) if next_use < 0 else -next_use


@inlined
def rekey(v, b):
    """Cached block ``b``'s features changed: its key again, the heap order restored (a block
    of a run goes to the heap: its new key may not fit the run's order)."""
    _set_word(v, b, W_KEY, leaf_key(v, b))
    if in_run(v, b):
        drop_candidate(v, b)
        heap_push(v, b)
    elif pol_links(v)[b, L_POS] != NIL:
        heap_fix(v, b)


@inlined
def rekeys_on(v, trigger):
    """Whether the change of a feature (a ``REKEY_*`` bit) can change a cached block's key:
    always under the built-in policies; under a priority policy if its function reads the
    feature, or the clocks (``kvnumba.priority.PriorityPolicy.rekey_triggers``)."""
    return v.meta[M_POLICY] != P_PRIORITY or (v.scr[S_PRIORITY_REKEY] & trigger) != 0


@inlined
def is_cached(v, b):
    """Whether block ``b`` is cached: registered, with refcount 0 (on the LRU list)."""
    return v.ref[b] == 0 and (v.block_flags[b] & F_REGISTERED) != 0


@inlined
def _link_kid(v, b, p):
    first = pol_links(v)[p, L_KID]
    _set_link(v, b, L_SIB_PREV, NIL)
    _set_link(v, b, L_SIB_NEXT, first)
    if first != NIL:
        _set_link(v, first, L_SIB_PREV, b)
    _set_link(v, p, L_KID, b)


@inlined
def _unlink_kid(v, b, p):
    before = pol_links(v)[b, L_SIB_PREV]
    after = pol_links(v)[b, L_SIB_NEXT]
    if before == NIL:
        _set_link(v, p, L_KID, after)
    else:
        _set_link(v, before, L_SIB_NEXT, after)
    if after != NIL:
        _set_link(v, after, L_SIB_PREV, before)
    _set_link(v, b, L_SIB_PREV, NIL)
    _set_link(v, b, L_SIB_NEXT, NIL)


@inlined
def _set_flags(v, b, flags):
    set_logged(v, v.block_flags, FIELD.block_flags, b, flags)


@inlined
def orphan_kids(v, p):
    """Block ``p`` lost its registration: its cached children become orphans (evicted first
    under the leaf policies; a priority policy sees ``orphan``)."""
    _set_link(v, p, L_GEN, pol_links(v)[p, L_GEN] + 1)
    c = pol_links(v)[p, L_KID]
    while c != NIL:
        after = pol_links(v)[c, L_SIB_NEXT]
        _unlink_kid(v, c, p)
        _set_flags(v, c, v.block_flags[c] | F_ORPHAN)
        if rekeys_on(v, REKEY_ORPHAN):
            rekey(v, c)
        c = after


# --- the hooks' policy versions -----------------------------------------------------------------
@inlined
def enter_cache(v, b):
    """Block ``b`` was just appended to the LRU list (released into the cache)."""
    meta = v.meta
    policy = meta[M_POLICY]
    if policy == 0 or policy == P_SIEVE:
        return  # LRU (a windowed manager runs the extended kernels too); sieve: the list only
    clock = meta[M_POL_CLOCK]
    meta[M_POL_CLOCK] = clock + 1
    if policy == P_LFU and pol_words(v)[b, W_VALUE] == 0:
        # Priority = age: the lowest any cached block has, and the newest such block. The
        # floor keeps these in release order, without the heap (:func:`floor_next`).
        _set_flags(v, b, v.block_flags[b] | F_FLOOR)
        if meta[M_HAND] == NIL:
            meta[M_HAND] = b
        return
    _set_word(v, b, W_STAMP, clock)
    if policy == P_LFU:
        _set_word(v, b, W_KEY, meta[M_POL_AGE] + pol_words(v)[b, W_VALUE])
        heap_push(v, b)
    else:
        leaves = leaves_only(v)
        if policy == P_PRIORITY:
            set_feature(v, b, FT_LENGTH, v.scr[S_RELEASE_LEN])
            if v.scr[S_RELEASE_TAG] != 0:  # a tagged sequence's release tags what it caches
                set_feature(v, b, FT_TAG, v.scr[S_RELEASE_TAG])
        if keeps_forest(v):
            link_cached(v, b, leaves)
        _set_word(v, b, W_KEY, leaf_key(v, b))
        if not leaves or pol_links(v)[b, L_KID] == NIL:
            add_candidate(v, b)


@inlined
def link_cached(v, b, leaves):
    """Block ``b``, just cached, joins its parent's cached children (or becomes an orphan)."""
    p = np.int64(pol_links(v)[b, L_PARENT])
    if p >= 0 and pol_links(v)[p, L_GEN] == pol_links(v)[b, L_PGEN]:
        if leaves and pol_links(v)[p, L_KID] == NIL and is_candidate(v, p):
            drop_candidate(v, p)  # no longer a leaf
        _link_kid(v, b, p)
        if v.meta[M_POLICY] == P_PRIORITY and not leaves and rekeys_on(v, REKEY_CHILDREN):
            if is_cached(v, p):
                rekey(v, p)  # one child more
    elif p != NIL:
        _set_flags(v, b, v.block_flags[b] | F_ORPHAN)


@inlined
def floor_next(v, b):
    """``lfu``: the next block of the floor after ``b`` in release order, or NIL. The blocks it
    passes are in the heap; it passes each at most once per release (the floor only grows at
    the newest end), so the walk is O(1) amortized."""
    return run_next(v, b, F_FLOOR)


@inlined
def leave_cache(v, b, how):
    """Cached block ``b`` is about to leave the LRU list: ``how`` is :data:`CLAIMED`,
    :data:`EVICTED` or :data:`EVICTED_VICTIM`. A victim that the policy must never choose (a
    referenced block; when only leaves are candidates, one with cached children) is counted as
    a fault, which ``check()`` reports."""
    meta = v.meta
    policy = meta[M_POLICY]
    if policy == 0:
        return
    if how == EVICTED_VICTIM and (
        v.ref[b] != 0 or (leaves_only(v) and pol_links(v)[b, L_KID] != NIL)
    ):
        meta[M_POLICY_FAULTS] += 1
    if policy == P_SIEVE:
        if meta[M_HAND] == b:
            meta[M_HAND] = v.lru_next[b]
        return
    if policy == P_LFU and v.block_flags[b] & F_FLOOR:
        _set_flags(v, b, v.block_flags[b] ^ F_FLOOR)
        if meta[M_HAND] == b:
            meta[M_HAND] = floor_next(v, b)
        return
    if is_candidate(v, b):
        drop_candidate(v, b)
    if policy == P_LFU or not keeps_forest(v):
        return
    flags = v.block_flags[b]
    if flags & F_ORPHAN:
        _set_flags(v, b, flags ^ F_ORPHAN)  # xor: ~F_ORPHAN overflows uint8 as Python
    elif pol_links(v)[b, L_PARENT] >= 0:
        p = np.int64(pol_links(v)[b, L_PARENT])
        _unlink_kid(v, b, p)
        if is_cached(v, p):
            if policy == P_PRIORITY and not leaves_only(v) and rekeys_on(v, REKEY_CHILDREN):
                rekey(v, p)  # one child less
            if leaves_only(v) and pol_links(v)[p, L_KID] == NIL:
                heap_push(v, p)  # a leaf now
    if how != CLAIMED:
        orphan_kids(v, b)


@inlined
def choose_victim(v):
    """The cached block an allocation evicts (at least one is cached)."""
    meta = v.meta
    policy = meta[M_POLICY]
    if policy == 0:
        return np.int64(meta[M_LRU_HEAD])
    if policy == P_SIEVE:
        b = meta[M_HAND]
        if b == NIL:
            b = meta[M_LRU_HEAD]
        while v.block_flags[b] & F_VISITED:
            _set_flags(v, b, v.block_flags[b] ^ F_VISITED)
            b = v.lru_next[b]
            if b == NIL:
                b = meta[M_LRU_HEAD]
        meta[M_HAND] = b  # leave_cache moves it on to the victim's successor
        return np.int64(b)
    if policy == P_LFU:
        # Every cached priority is at least the age, and the heap's blocks at the age were
        # released before it rose to its value, so before every block of the floor.
        floor = meta[M_HAND]
        if meta[M_HEAP_N] == 0 or (
            floor != NIL and pol_words(v)[pol_links(v)[0, L_HEAP], W_KEY] > meta[M_POL_AGE]
        ):
            return np.int64(floor)
    b = np.int64(pol_links(v)[0, L_HEAP]) if meta[M_HEAP_N] != 0 else np.int64(NIL)
    if policy == P_LFU:
        meta[M_POL_AGE] = pol_words(v)[b, W_KEY]
    elif policy == P_PRIORITY:
        words = pol_words(v)
        for r in range(NUM_RUNS):  # the oldest block of a run may come first
            c = meta[M_RUN_HAND + r]
            if c != NIL and (
                b == NIL
                or _less(words[c, W_KEY], words[c, W_STAMP], words[b, W_KEY], words[b, W_STAMP])
            ):
                b = np.int64(c)
        meta[M_POL_AGE] = max(meta[M_POL_AGE], words[b, W_KEY])
    return b


@inlined
def note_hit(v, b):
    """Block ``b`` is a prefix hit of an admitted prompt."""
    policy = v.meta[M_POLICY]
    if policy == P_SIEVE:
        if not v.block_flags[b] & F_VISITED:
            _set_flags(v, b, v.block_flags[b] | F_VISITED)
    elif policy == P_LFU:
        _set_word(v, b, W_VALUE, pol_words(v)[b, W_VALUE] + 1)
    elif policy == P_PRIORITY:
        set_feature(v, b, FT_HITS, feature(v, b, FT_HITS, 0) + 1)


@inlined
def note_registered(v, b, prev, by_content, pos):
    """Block ``b`` was just registered at position ``pos`` of its sequence; ``prev`` is the
    previous block of its sequence (NIL for the first). ``by_content``: registered by its
    chained hash (else under an engine key)."""
    policy = v.meta[M_POLICY]
    if policy == 0:
        return
    if policy == P_SIEVE:
        return  # unregistered blocks never have the bit (every unregistration clears flags)
    if policy == P_LFU or policy == P_ORACLE:
        _set_word(v, b, W_VALUE, -1 if policy == P_ORACLE else 0)
    elif policy == P_PRIORITY:
        set_feature(v, b, FT_HITS, 0)
        set_feature(v, b, FT_HINT, -1)
        set_feature(v, b, FT_TAG, 0)
        set_feature(v, b, FT_DEPTH, pos)
    if not keeps_forest(v):
        return
    _set_link(v, b, L_GEN, pol_links(v)[b, L_GEN] + 1)
    p = np.int64(NIL)
    if prev >= 0:
        if v.block_flags[prev] & F_REGISTERED:
            p = prev
        elif by_content:
            # The previous block is a copy: the parent is the registered block of its content.
            found = table_find(v, v.block_hash[prev], v.block_salt[prev], v.tokens[prev])
            p = found if found >= 0 else np.int64(ORPHAN_AT_BIRTH)
    _set_link(v, b, L_PARENT, p)
    _set_link(v, b, L_PGEN, pol_links(v)[p, L_GEN] if p >= 0 else 0)


@inlined
def note_unregistered(v, b):
    """Block ``b`` (referenced) lost its registration: its cached children are orphans."""
    if keeps_forest(v):
        orphan_kids(v, b)


@inlined
def set_next_use(v, b, next_use):
    """``oracle``, a priority policy: the trace position of the next use of block ``b``'s
    content (-1: never; a priority policy's ``next_use`` hint)."""
    if v.meta[M_POLICY] == P_PRIORITY:
        set_feature(v, b, FT_HINT, next_use)
    else:
        _set_word(v, b, W_VALUE, next_use)
    if is_cached(v, b) and rekeys_on(v, REKEY_NEXT_USE):
        rekey(v, b)


@inlined
def set_tag(v, b, tag):
    """A priority policy: block ``b``'s tag (``kvnumba.priority.BlockFeatures.tag``)."""
    set_feature(v, b, FT_TAG, tag)
    if is_cached(v, b) and rekeys_on(v, REKEY_TAG):
        rekey(v, b)


# --- the hooks' policy versions as called: out of line, taking the three arenas ---------------
# An out-of-line call passes its arguments flattened, and the views are forty arrays: passing
# them cost more than most hooks' work. Each version rebuilds the views it reads from the
# arenas (a few header loads; the views it does not read are never built).
@out_of_line
def enter_cache_at(arena, scratch, pool, b):
    """:func:`enter_cache` on the views of these arenas."""
    enter_cache(views(arena, scratch, pool), b)


@out_of_line
def leave_cache_at(arena, scratch, pool, b, how):
    """:func:`leave_cache` on the views of these arenas."""
    leave_cache(views(arena, scratch, pool), b, how)


@out_of_line
def choose_victim_at(arena, scratch, pool):
    """:func:`choose_victim` on the views of these arenas."""
    return choose_victim(views(arena, scratch, pool))


@out_of_line
def note_hit_at(arena, scratch, pool, b):
    """:func:`note_hit` on the views of these arenas."""
    note_hit(views(arena, scratch, pool), b)


@out_of_line
def note_registered_at(arena, scratch, pool, b, prev, by_content, pos):
    """:func:`note_registered` on the views of these arenas."""
    note_registered(views(arena, scratch, pool), b, prev, by_content, pos)


@out_of_line
def note_unregistered_at(arena, scratch, pool, b):
    """:func:`note_unregistered` on the views of these arenas."""
    note_unregistered(views(arena, scratch, pool), b)


# --- the hooks: nothing (or the LRU head) for an LRU manager's views -------------------------
# The hooks that return nothing are intrinsics: for an LRU manager's views numba types one and
# emits no code (an ``@overload`` would compile its implementation once per kind of call site,
# which cost the LRU kernels' compile time); for a policy manager's views the intrinsic tests
# ``meta[M_POLICY]`` against the policies the hook acts for and only then calls the policy's
# compiled function (out of line, compiled once) on the views' three arenas, integers as
# int64. Run as Python (``NUMBA_DISABLE_JIT``), each is a function that tests the policy at
# run time instead.
def _policies(*codes):
    """The bit mask of policy codes ``codes``."""
    return sum(1 << code for code in codes)


_FOREST = (P_LEAF, P_ORACLE, P_PRIORITY)
#: Per hook, the policies it has work for (sieve: nothing on entering the cache, nor on a
#: registration, since an unregistered block never has the visited bit).
ENTER_POLICIES = _policies(P_LFU, *_FOREST)
LEAVE_POLICIES = _policies(P_LFU, P_SIEVE, *_FOREST)
HIT_POLICIES = _policies(P_LFU, P_SIEVE, P_PRIORITY)
REGISTERED_POLICIES = _policies(P_LFU, *_FOREST)
UNREGISTERED_POLICIES = _policies(*_FOREST)
_META = Views._fields.index("meta")


def _hook_codegen(policy_call, policies):
    """The code of a hook calling ``policy_call`` under the policies of mask ``policies``:
    nothing for an LRU manager's views."""

    def codegen(context, builder, signature, values):
        views_type = signature.args[0]
        if is_policy(views_type):
            i64 = ir.IntType(64)
            meta = context.make_array(views_type.types[_META])(
                context, builder, builder.extract_value(values[0], _META)
            )
            policy = builder.load(builder.gep(meta.data, [ir.Constant(i64, M_POLICY)]))
            acts = builder.and_(builder.lshr(ir.Constant(i64, policies), policy), i64(1))
            with builder.if_then(builder.icmp_unsigned("!=", acts, i64(0))):
                _call_policy(context, builder, signature, values, policy_call)
        return context.get_dummy_value()

    return codegen


def _call_policy(context, builder, signature, values, policy_call):
    """Call ``policy_call`` on the arenas of the views ``values[0]`` and the other values."""
    views_type = signature.args[0]
    last = len(views_type.types)
    arenas = [builder.extract_value(values[0], i) for i in range(last - 3, last)]
    ints = [
        context.cast(builder, value, ty, types.int64)
        for value, ty in zip(values[1:], signature.args[1:], strict=True)
    ]
    # The policy's own compiled function (without NRT, as every helper), called.
    args = (*views_type.types[last - 3 :], *(types.int64,) * len(ints))
    policy_call.compile(args)
    compiled = policy_call.overloads[args]
    context.active_code_library.add_linking_library(compiled.library)
    context.call_internal(builder, compiled.fndesc, types.none(*args), [*arenas, *ints])


def _enter(pv, pb):
    """:func:`enter_cache` (nothing under LRU)."""
    if pv.meta[M_POLICY]:
        enter_cache(pv, pb)


def _leave(pv, pb, phow):
    """:func:`leave_cache` (nothing under LRU)."""
    if pv.meta[M_POLICY]:
        leave_cache(pv, pb, phow)


def _hit(pv, pb):
    """:func:`note_hit` (nothing under LRU)."""
    if pv.meta[M_POLICY]:
        note_hit(pv, pb)


def _registered(pv, pb, pprev, pcontent, ppos):
    """:func:`note_registered` (nothing under LRU); ``pcontent`` 1 or 0."""
    if pv.meta[M_POLICY]:
        note_registered(pv, pb, pprev, pcontent, ppos)


def _unregistered(pv, pb):
    """:func:`note_unregistered` (nothing under LRU)."""
    if pv.meta[M_POLICY]:
        note_unregistered(pv, pb)


# numba's intrinsics take named parameters: one typing function per hook.
def _enter_typer(typingctx, pv, pb):
    return types.none(pv, pb), _hook_codegen(enter_cache_at, ENTER_POLICIES)


def _leave_typer(typingctx, pv, pb, phow):
    return types.none(pv, pb, phow), _hook_codegen(leave_cache_at, LEAVE_POLICIES)


def _hit_typer(typingctx, pv, pb):
    return types.none(pv, pb), _hook_codegen(note_hit_at, HIT_POLICIES)


def _registered_typer(typingctx, pv, pb, pprev, pcontent, ppos):
    return types.none(pv, pb, pprev, pcontent, ppos), _hook_codegen(
        note_registered_at, REGISTERED_POLICIES
    )


def _unregistered_typer(typingctx, pv, pb):
    return types.none(pv, pb), _hook_codegen(note_unregistered_at, UNREGISTERED_POLICIES)


def _hook(python_hook, typer):
    """``python_hook`` under ``NUMBA_DISABLE_JIT``, else the intrinsic typed by ``typer``."""
    if config.DISABLE_JIT:
        return python_hook
    hook = intrinsic(typer)
    hook.__doc__ = python_hook.__doc__
    return hook


policy_enter = _hook(_enter, _enter_typer)
policy_leave = _hook(_leave, _leave_typer)
policy_hit = _hook(_hit, _hit_typer)
policy_registered = _hook(_registered, _registered_typer)
policy_unregistered = _hook(_unregistered, _unregistered_typer)


def policy_victim(pv):
    """:func:`choose_victim`; the LRU head under LRU."""
    return choose_victim(pv) if pv.meta[M_POLICY] else pv.meta[M_LRU_HEAD]


@overload(policy_victim, inline="always")
def _policy_victim_impl(pv):
    if is_policy(pv):
        return lambda pv: choose_victim_at(pv.arena, pv.scratch, pv.pool)
    return lambda pv: pv.meta[M_LRU_HEAD]


@out_of_line
def run_set_next_use(blocks, next_use, arena, scratch):
    """``set_next_use`` of validated blocks and next uses (``oracle``, priority policies)."""
    v = views(arena, scratch, scratch)
    for i in range(blocks.shape[0]):
        set_next_use(v, blocks[i], next_use[i])


@out_of_line
def run_set_tags(blocks, tags, arena, scratch):
    """``set_tags`` of validated blocks (priority policies only)."""
    v = views(arena, scratch, scratch)
    for i in range(blocks.shape[0]):
        set_tag(v, blocks[i], tags[i])


@out_of_line
def run_set_sequence_tags(slots, tags, arena, scratch):
    """``set_sequence_tags`` of resolved slots (priority policies only), in order."""
    v = views(arena, scratch, scratch)
    for i in range(slots.shape[0]):
        v.seq_tag[slots[i]] = tags[i]
