"""Windowed attention in the kernels: blocks leaving a sequence's window, what a call's window
releases, and the hit rule of a windowed prompt.

The rules themselves are the plain functions of :mod:`kvnumba.windows`, compiled here as
inlined helpers, so the kernels and the reference model run one statement of each. A manager
without a window (``M_WINDOW == M_CHUNK == 0``) never reaches the out-of-line code below: its
calls pay one test of two ``meta`` slots.
"""

import numpy as np

from kvnumba._kernels.blocks import drop_ref
from kvnumba._kernels.jit import inlined, out_of_line
from kvnumba._kernels.outcomes import PromptHits
from kvnumba._kernels.prefix import chain_hash, root_hash
from kvnumba._kernels.undo import log_write
from kvnumba._state import F_HASHED, FIELD, M_CHUNK, M_HASH_BITS, M_WINDOW, NULL_BLOCK
from kvnumba.windows import first_needed_block, window_hit

first_needed_kernel = inlined(first_needed_block)
window_hit_kernel = inlined(window_hit)


@inlined
def windowed(v):
    """Whether the manager serves a sliding window or chunked local attention."""
    return (v.meta[M_WINDOW] | v.meta[M_CHUNK]) != 0


@inlined
def first_needed(v, length):
    """The lowest table position the next tokens of a sequence of ``length`` tokens reach."""
    return first_needed_kernel(length, v.tokens.shape[1], v.meta[M_WINDOW], v.meta[M_CHUNK])


@inlined
def set_anchor(v, slot, h, known):
    """The sequence's anchor: the hash a block filling after a ``NULL_BLOCK`` entry chains on
    (``known`` 0: none, the block stays unhashed). Logged: an atomic admit may roll it back."""
    words = v.seq_anchor.view(np.int64)
    log_write(v, FIELD.seq_anchor, 2 * slot, words[slot, 0])
    log_write(v, FIELD.seq_anchor, 2 * slot + 1, words[slot, 1])
    v.seq_anchor[slot, 0] = h
    v.seq_anchor[slot, 1] = known


@out_of_line
def drop_out_of_window(v, slot):
    """Release the blocks of sequence ``slot`` that its next tokens cannot reach, highest
    position first, their entries set to ``NULL_BLOCK``; the highest one becomes the anchor.

    The released positions are a prefix of the table, so the walk stops at the first
    ``NULL_BLOCK``: each block is released once, O(1) amortized per block.
    """
    seq_table = v.seq_table
    width = seq_table.shape[1]
    pos = first_needed(v, v.seq_len[slot]) - 1
    if pos < 0 or seq_table[slot, pos] == NULL_BLOCK:
        return
    top = seq_table[slot, pos]
    if v.block_flags[top] & F_HASHED:
        set_anchor(v, slot, v.block_hash[top], 1)
    else:
        set_anchor(v, slot, 0, 0)
    while pos >= 0:
        b = seq_table[slot, pos]
        if b == NULL_BLOCK:
            break
        log_write(v, FIELD.seq_table, slot * width + pos, b)
        seq_table[slot, pos] = NULL_BLOCK
        drop_ref(v, b)
        pos -= 1


@inlined
def _walk(v, slot, delta):
    """Add ``delta`` to the refcount of every block :func:`drop_out_of_window` would release
    now; returns how many of them then have refcount 0."""
    seq_table = v.seq_table
    zero = 0
    pos = first_needed(v, v.seq_len[slot]) - 1
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
def window_gain(v, slots, counts):
    """Blocks whose last reference the windows of the sequences ``slots`` grown by ``counts``
    release (only those grown by a token or more): what the call adds to what is available.
    The refcount drops are simulated and undone; nothing changes."""
    gain = 0
    for i in range(slots.shape[0]):
        if counts[i] > 0:
            gain += _walk(v, slots[i], -1)
    for i in range(slots.shape[0]):
        if counts[i] > 0:
            _walk(v, slots[i], 1)
    return gain


@out_of_line
def windowed_prompt_hits(v, hits, limit, length):
    """The :class:`.PromptHits` of a windowed prompt of ``length`` tokens whose lookup wrote
    every position's registered block (or -1) to ``hits[:limit]``: the window's rule decides
    the ``k`` blocks that count as cached; positions below the first needed one become
    ``NULL_BLOCK``, and only the blocks to claim count as cached hits."""
    k, first = window_hit_kernel(
        hits, limit, length, v.tokens.shape[1], v.meta[M_WINDOW], v.meta[M_CHUNK]
    )
    num_cached = 0
    for pos in range(k):
        if pos < first:
            hits[pos] = NULL_BLOCK
        elif v.ref[hits[pos]] == 0:
            num_cached += 1
    return PromptHits(k, num_cached, limit)


@out_of_line
def prompt_anchor(v, prompt, salt, first):
    """The chained hash of block ``first - 1`` of a prompt with token ids: the anchor of a
    windowed sequence admitted with ``first`` leading ``NULL_BLOCK`` entries."""
    block_size = v.tokens.shape[1]
    h = root_hash()
    for pos in range(first):
        h = chain_hash(
            h, salt, prompt[pos * block_size : (pos + 1) * block_size], v.meta[M_HASH_BITS]
        )
    return h


@inlined
def window_gap(v, slot, length):
    """The table position that sequence ``slot`` cut to ``length`` tokens would need although
    its block already left the window, or -1 (``truncate`` refuses such a cut)."""
    pos = first_needed(v, length)
    if pos < v.seq_table.shape[1] and v.seq_table[slot, pos] == NULL_BLOCK:
        return pos
    return -1
