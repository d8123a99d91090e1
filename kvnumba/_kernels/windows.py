"""Windowed attention in the kernels: blocks leaving a sequence's window, what a call's window
releases, and the hit rule of a windowed prompt.

The rules themselves are the plain functions of :mod:`kvnumba.windows`, compiled here as
inlined helpers, so the kernels and the reference model run one statement of each.

A windowed manager runs the kernels' extended version, the one managers with an eviction
policy other than LRU run (its state arena typed as ``versions.POLICY_ARENA``). The
workers reach the window code through the hooks at the end of this module (``windowed``,
``drop_window``, ``window_gain_of``, ``window_hits_of``, ``anchor_of``): for a plain manager's
views each is a constant or does nothing, so the plain kernels never compile the window code
(compile time is part of the product), and for the extended views each tests the manager's
window at run time.
"""

import numpy as np
from numba.core.extending import overload

from kvnumba._kernels.anchors import seq_anchors
from kvnumba._kernels.blocks import drop_ref, releasing
from kvnumba._kernels.jit import inlined, out_of_line
from kvnumba._kernels.outcomes import PromptHits
from kvnumba._kernels.prefix import chain_hash, root_hash
from kvnumba._kernels.undo import log_write
from kvnumba._kernels.versions import is_policy_arena
from kvnumba._kernels.views import views
from kvnumba._layout import (
    F_HASHED,
    FIELD,
    M_EXPLICIT_RELEASE,
    M_GROUP_CHUNK,
    M_GROUP_WINDOW,
    M_GROUPS,
    M_HASH_BITS,
    M_KEYED,
    M_WINDOWS,
    NULL_BLOCK,
)
from kvnumba.windows import first_needed_block, group_hit, window_hit

first_needed_kernel = inlined(first_needed_block)
window_hit_kernel = inlined(window_hit)


# ``group_hit`` calls ``window_hit`` by its Python name: this overload is what that call
# compiles to, so the two rules stay plain functions the reference model runs as they are.
@overload(window_hit, jit_options={"_nrt": False})
def _window_hit_impl(hits, limit, block_size, window, chunk):
    return lambda hits, limit, block_size, window, chunk: window_hit_kernel(
        hits, limit, block_size, window, chunk
    )


group_hit_kernel = inlined(group_hit)


@inlined
def windowed(v):
    """Whether the window code runs: a sliding-window or chunked group, or several groups."""
    return v.meta[M_WINDOWS] != 0


@inlined
def group_salt(v, salt, group):
    """The salt a prompt of salt ``salt`` has in KV cache group ``group``: the group is the
    salt modulo the number of groups, so that no block is shared across groups (the salt
    itself for a manager of one group)."""
    return salt * v.meta[M_GROUPS] + group


@inlined
def first_needed(v, slot, length):
    """The lowest table position the next tokens of sequence ``slot`` would reach at
    ``length`` tokens, by the rule of the slot's group."""
    g = v.seq_salt[slot] % v.meta[M_GROUPS]
    window, chunk = v.meta[M_GROUP_WINDOW + g], v.meta[M_GROUP_CHUNK + g]
    return first_needed_kernel(length, v.tokens.shape[1], window, chunk)


@inlined
def drops_on_append(v):
    """Whether an append releases the out-of-window blocks of the sequences it grows (a
    windowed manager but with ``window_release="explicit"``)."""
    return v.meta[M_WINDOWS] != 0 and v.meta[M_EXPLICIT_RELEASE] == 0


@inlined
def has_drops(v, slot, length):
    """Whether sequence ``slot`` holds a block below the first position its tokens from
    ``length`` on reach (inline: on a decode step most sequences hold none, and skip the call
    to :func:`drop_window`)."""
    pos = first_needed(v, slot, length) - 1
    return pos >= 0 and v.seq_table[slot, pos] != NULL_BLOCK


@inlined
def set_anchor(v, slot, h, known):
    """The sequence's anchor: the hash a block filling after a ``NULL_BLOCK`` entry chains on
    (``known`` 0: none, the block stays unhashed). Logged: an atomic admit may roll it back."""
    anchors = seq_anchors(v)
    words = anchors.view(np.int64)
    log_write(v, FIELD.seq_anchor, 2 * slot, words[slot, 0])
    log_write(v, FIELD.seq_anchor, 2 * slot + 1, words[slot, 1])
    anchors[slot, 0] = h
    anchors[slot, 1] = known


@out_of_line
def drop_out_of_window(arena, scratch, pool, slot, length):
    """Release the blocks of sequence ``slot`` that its tokens from position ``length`` on
    cannot reach, highest position first, their entries set to ``NULL_BLOCK``; the highest one
    becomes the anchor. Returns how many.

    The released positions are a prefix of the table, so the walk stops at the first
    ``NULL_BLOCK``: each block is released once, O(1) amortized per block. (The out-of-line
    helpers here take the arenas, not the views: a call passing forty views costs far more
    compile time than these helpers' bodies.)
    """
    v = views(arena, scratch, pool)
    if not has_drops(v, slot, length):
        return 0
    releasing(v, slot, length)
    seq_table = v.seq_table
    width = seq_table.shape[1]
    pos = first_needed(v, slot, length) - 1
    top = seq_table[slot, pos]
    if v.block_flags[top] & F_HASHED:
        set_anchor(v, slot, v.block_hash[top], 1)
    else:
        set_anchor(v, slot, 0, 0)
    released = 0
    while pos >= 0:
        b = seq_table[slot, pos]
        if b == NULL_BLOCK:
            break
        log_write(v, FIELD.seq_table, slot * width + pos, b)
        seq_table[slot, pos] = NULL_BLOCK
        drop_ref(v, b)
        released += 1
        pos -= 1
    return released


@inlined
def _walk(v, slot, delta):
    """Add ``delta`` to the refcount of every block :func:`drop_out_of_window` would release
    now; returns how many of them then have refcount 0."""
    seq_table = v.seq_table
    zero = 0
    pos = first_needed(v, slot, v.seq_len[slot]) - 1
    while pos >= 0:
        b = seq_table[slot, pos]
        if b == NULL_BLOCK:
            break
        v.ref[b] += delta
        if v.ref[b] == 0:
            zero += 1
        pos -= 1
    return zero


@out_of_line
def window_gain(arena, scratch, pool, slots, counts):
    """Blocks whose last reference the windows of the sequences ``slots`` grown by ``counts``
    release (only those grown by a token or more): what the call adds to what is available.
    The refcount drops are simulated and undone; nothing changes."""
    v = views(arena, scratch, pool)
    gain = 0
    for i in range(slots.shape[0]):
        if counts[i] > 0:
            gain += _walk(v, slots[i], -1)
    for i in range(slots.shape[0]):
        if counts[i] > 0:
            _walk(v, slots[i], 1)
    return gain


@out_of_line
def windowed_prompt_hits(arena, scratch, pool, hits, limit):
    """The :class:`.PromptHits` of a prompt whose lookups wrote every position's registered
    block (or -1) to ``hits[g, :limit]``, one row per KV cache group: the groups' rules decide
    together the ``k`` blocks that count as cached (``kvnumba.windows.group_hit``); in each
    row the positions below the group's first needed one become ``NULL_BLOCK``, and only the
    blocks to claim count as cached hits."""
    v = views(arena, scratch, pool)
    groups = v.meta[M_GROUPS]
    block_size = v.tokens.shape[1]
    windows = v.meta[M_GROUP_WINDOW : M_GROUP_WINDOW + groups]
    chunks = v.meta[M_GROUP_CHUNK : M_GROUP_CHUNK + groups]
    k = group_hit_kernel(hits, limit, block_size, windows, chunks, groups)
    num_cached = 0
    for g in range(groups):
        first = window_hit_kernel(hits[g], k, block_size, windows[g], chunks[g])[1]
        for pos in range(k):
            if pos < first:
                hits[g, pos] = NULL_BLOCK
            elif v.ref[hits[g, pos]] == 0:
                num_cached += 1
    return PromptHits(k, num_cached, limit)


@out_of_line
def admit_anchor(arena, scratch, pool, tokens, has_tokens, slot, first):
    """The anchor of a windowed sequence just admitted with ``first`` leading ``NULL_BLOCK``
    entries: the chained hash of its prompt's block ``first - 1`` (``tokens`` from the
    prompt's first token; token ids and token hashes only, else none)."""
    v = views(arena, scratch, pool)
    block_size = v.tokens.shape[1]
    known = first > 0 and has_tokens and v.meta[M_KEYED] == 0
    h = root_hash()
    if known:
        salt = v.seq_salt[slot]
        for pos in range(first):
            chunk = tokens[pos * block_size : (pos + 1) * block_size]
            h = chain_hash(h, salt, chunk, v.meta[M_HASH_BITS])
    set_anchor(v, slot, h if known else np.uint64(0), 1 if known else 0)


@inlined
def window_gap(v, slot, length):
    """The table position that sequence ``slot`` cut to ``length`` tokens would need although
    its block already left the window, or -1 (``truncate`` refuses such a cut)."""
    pos = first_needed(v, slot, length)
    if pos < v.seq_table.shape[1] and v.seq_table[slot, pos] == NULL_BLOCK:
        return pos
    return -1


# --- the hooks: what a worker calls (nothing, or a constant, for a plain manager's arenas) -----
# Each is an ``@overload`` chosen by the state arena's type (``versions.is_policy_arena``: the
# policy version's). A plain manager's version is a trivial function, compiled
# once and never called (``windowed`` is False for it). Not inlined at numba's IR level: such
# an inlined stub in ``run_admit`` was seen to break the rollback of a failed logged admit.
_HOOK = {"_nrt": False}


def drop_window(arena, scratch, pool, slot, length):
    """:func:`drop_out_of_window` of sequence ``slot`` of a windowed manager."""
    return drop_out_of_window(arena, scratch, pool, slot, length)


@overload(drop_window, jit_options=_HOOK)
def _drop_window_impl(arena, scratch, pool, slot, length):
    if is_policy_arena(arena):
        return lambda arena, scratch, pool, slot, length: drop_out_of_window(
            arena, scratch, pool, slot, length
        )
    return lambda arena, scratch, pool, slot, length: 0


def window_gain_of(arena, scratch, pool, slots, counts):
    """:func:`window_gain` of a windowed manager's call."""
    return window_gain(arena, scratch, pool, slots, counts)


@overload(window_gain_of, jit_options=_HOOK)
def _window_gain_of_impl(arena, scratch, pool, slots, counts):
    if is_policy_arena(arena):
        return lambda arena, scratch, pool, slots, counts: window_gain(
            arena, scratch, pool, slots, counts
        )
    return lambda arena, scratch, pool, slots, counts: 0


def window_hits_of(arena, scratch, pool, hits, limit):
    """:func:`windowed_prompt_hits` of a windowed manager's prompt."""
    return windowed_prompt_hits(arena, scratch, pool, hits, limit)


@overload(window_hits_of, jit_options=_HOOK)
def _window_hits_of_impl(arena, scratch, pool, hits, limit):
    if is_policy_arena(arena):
        return lambda arena, scratch, pool, hits, limit: windowed_prompt_hits(
            arena, scratch, pool, hits, limit
        )
    return lambda arena, scratch, pool, hits, limit: PromptHits(0, 0, limit)


def anchor_of(arena, scratch, pool, tokens, has_tokens, slot, first):
    """:func:`admit_anchor` of a sequence a windowed manager just admitted."""
    admit_anchor(arena, scratch, pool, tokens, has_tokens, slot, first)


@overload(anchor_of, jit_options=_HOOK)
def _anchor_of_impl(arena, scratch, pool, tokens, has_tokens, slot, first):
    if is_policy_arena(arena):
        return lambda arena, scratch, pool, tokens, has_tokens, slot, first: admit_anchor(
            arena, scratch, pool, tokens, has_tokens, slot, first
        )
    return lambda arena, scratch, pool, tokens, has_tokens, slot, first: None
