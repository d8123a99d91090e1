"""Engine conveniences: ``truncate``, ``evict`` and ``reset_prefix_cache``.

None of them runs on a hot path or is ever rolled back: each validates its whole input before
it writes anything, so no undo log is needed (``docs/design.md``, "Shrinking and engine
conveniences"). Every worker is compiled once, out of line, and loaded only when first used.
"""

from kvnumba._kernels.anchors import seq_anchors
from kvnumba._kernels.blocks import drop_ref, evict_to_free, reclaim_tail, releasing
from kvnumba._kernels.eviction import policy_unregistered
from kvnumba._kernels.geometry import blocks_of
from kvnumba._kernels.jit import out_of_line
from kvnumba._kernels.outcomes import Outcome, Status
from kvnumba._kernels.prefix import table_purge_evicted, table_remove
from kvnumba._kernels.sequences import resolve_ids
from kvnumba._kernels.undo import clear_call_records
from kvnumba._kernels.views import views
from kvnumba._kernels.windows import drop_window, window_gap, windowed
from kvnumba._layout import (
    F_REGISTERED,
    F_TRIMMED,
    M_CACHED,
    M_LRU_HEAD,
    NIL,
    NULL_BLOCK,
    S_EV_N,
    S_EV_PAYLOAD,
)
from kvnumba.errors import (
    ST_BAD_BLOCK,
    ST_BAD_NEW_LEN,
    ST_BLOCK_IN_USE,
    ST_NEED_BUFFERS,
    ST_OK,
    ST_TOKEN_MISMATCH,
    ST_WINDOW_GAP,
)


@out_of_line
def run_release_window(ids, lengths, slots, arena, scratch, pool):
    """Release, for each sequence ``ids[i]``, the blocks its tokens from position
    ``lengths[i]`` on cannot reach (``release_window``); returns an :class:`.Outcome` whose
    ``count`` is the number of blocks released. Validated as :func:`run_truncate` (lengths of
    both arrays, negative lengths, ids, lengths beyond the sequence's) before any write. A
    manager without a window (its hook does nothing) releases none.
    """
    if lengths.shape[0] != ids.shape[0]:
        return Outcome(ST_TOKEN_MISMATCH, -1, 0, 0, 0)
    for i in range(lengths.shape[0]):
        if lengths[i] < 0:
            return Outcome(ST_BAD_NEW_LEN, i, 0, 0, 0)
    resolved = resolve_ids(ids, True, slots, arena, scratch)
    if resolved.status != ST_OK:
        return Outcome(resolved.status, resolved.bad, 0, 0, 0)
    v = views(arena, scratch, pool)
    for i in range(ids.shape[0]):
        if lengths[i] > v.seq_len[slots[i]]:
            return Outcome(ST_BAD_NEW_LEN, i, 0, 0, 0)
    clear_call_records(v.scr)
    released = 0
    for i in range(ids.shape[0]):
        released += drop_window(arena, scratch, pool, slots[i], lengths[i])
    return Outcome(ST_OK, -1, 0, 0, released)


@out_of_line
def run_truncate(ids, new_lens, slots, arena, scratch, pool):
    """Shorten each sequence ``ids[i]`` to ``new_lens[i]`` tokens; returns a :class:`.Status`.

    Validation order: lengths of both arrays, negative lengths, then each id in input order
    (unknown or released, duplicate), then lengths beyond the sequence's, then (windowed
    managers) cuts that would need a block that left the window.
    """
    if new_lens.shape[0] != ids.shape[0]:
        return Status(ST_TOKEN_MISMATCH, -1)
    for i in range(new_lens.shape[0]):
        if new_lens[i] < 0:
            return Status(ST_BAD_NEW_LEN, i)
    resolved = resolve_ids(ids, True, slots, arena, scratch)
    if resolved.status != ST_OK:
        return resolved
    v = views(arena, scratch, pool)
    seq_table, seq_len, ref = v.seq_table, v.seq_len, v.ref
    for i in range(ids.shape[0]):
        if new_lens[i] > seq_len[slots[i]]:
            return Status(ST_BAD_NEW_LEN, i)
    if windowed(v):
        for i in range(ids.shape[0]):
            if new_lens[i] < seq_len[slots[i]] and window_gap(v, slots[i], new_lens[i]) >= 0:
                return Status(ST_WINDOW_GAP, i)
    clear_call_records(v.scr)
    block_size = v.tokens.shape[1]
    for i in range(ids.shape[0]):
        slot = slots[i]
        length = seq_len[slot]
        new = new_lens[i]
        if new == length:
            continue
        keep = blocks_of(new, block_size)
        releasing(v, slot, new)
        for pos in range(blocks_of(length, block_size) - 1, keep - 1, -1):
            drop_ref(v, seq_table[slot, pos])
            seq_table[slot, pos] = NIL
        seq_len[slot] = new
        fill = new - (keep - 1) * block_size
        if fill == block_size or keep == 0:
            continue  # cut at a block boundary: no block holds tokens past the new end
        cut = seq_table[slot, keep - 1]
        if ref[cut] == 1:
            # Held by this sequence alone: a later append writes into it in place.
            reclaim_tail(v, cut, fill)
        else:
            # Shared: the other holders keep its content (and its prefix-cache entry). The
            # flag sends this sequence's next append to the general path: a copy while the
            # block is still shared, else a reclaim in place (``reclaim_tail``).
            v.block_flags[cut] |= F_TRIMMED
    return Status(ST_OK, -1)


@out_of_line
def run_evict(blocks, arena, scratch, pool):
    """Evict the cached blocks among ``blocks``; returns an :class:`.Outcome` whose ``count``
    is the blocks evicted.

    A block out of range or referenced is refused (nothing changed); a free one is skipped.
    Its ``needed`` is the eviction records the call needs when it returns ``ST_NEED_BUFFERS``.
    """
    v = views(arena, scratch, pool)
    ref, block_flags = v.ref, v.block_flags
    num_blocks = ref.shape[0]
    for i in range(blocks.shape[0]):
        b = blocks[i]
        if b < 0 or b >= num_blocks:
            return Outcome(ST_BAD_BLOCK, i, 0, 0, 0)
        if ref[b] > 0:
            return Outcome(ST_BLOCK_IN_USE, i, 0, 0, 0)
    rows = min(blocks.shape[0], v.meta[M_CACHED])
    if _records_short(v, rows):
        return Outcome(ST_NEED_BUFFERS, -1, rows, 0, 0)
    clear_call_records(v.scr)
    count = 0
    for i in range(blocks.shape[0]):
        b = blocks[i]
        # Cached = unreferenced and registered (then it is on the LRU list). A block given
        # twice is free by its second occurrence.
        if ref[b] == 0 and block_flags[b] & F_REGISTERED:
            evict_to_free(v, b)
            count += 1
    if v.scr[S_EV_N] > 0:
        table_purge_evicted(v)
    return Outcome(ST_OK, -1, 0, 0, count)


@out_of_line
def run_reset_prefix_cache(arena, scratch, pool):
    """Evict every cached block (LRU head first), then unhash every block of every live
    sequence and mark it of unknown content; returns an :class:`.Outcome` (``needed``: the
    eviction records it needs, ``count``: the blocks evicted)."""
    v = views(arena, scratch, pool)
    meta, block_flags, seq_table = v.meta, v.block_flags, v.seq_table
    rows = meta[M_CACHED]
    if _records_short(v, rows):
        return Outcome(ST_NEED_BUFFERS, -1, rows, 0, 0)
    clear_call_records(v.scr)
    count = 0
    while meta[M_LRU_HEAD] != NIL:
        evict_to_free(v, meta[M_LRU_HEAD])
        count += 1
    if v.scr[S_EV_N] > 0:
        table_purge_evicted(v)  # before table_remove: no eviction marks left in the table
    # Every referenced block is in a live sequence's table. Clearing the known-content flag
    # too keeps whatever these sequences fill later out of the cache: its KV was computed
    # from context that predates the reset. Walking the tables costs O(max_seqs + blocks
    # held), not a scan of the pool.
    block_size = v.tokens.shape[1]
    for s in range(seq_table.shape[0]):
        if v.seq_live[s] == 0:
            continue
        if windowed(v):
            seq_anchors(v)[s, 1] = 0  # nothing chains on content computed before the reset
        for pos in range(blocks_of(v.seq_len[s], block_size)):
            b = seq_table[s, pos]
            if b == NULL_BLOCK:
                continue
            if block_flags[b] & F_REGISTERED:
                table_remove(v, b)
                policy_unregistered(v, b)
            # A truncated tail keeps its mark: its payload past the fill is still stale.
            block_flags[b] &= F_TRIMMED
    return Outcome(ST_OK, -1, 0, 0, count)


@out_of_line
def _records_short(v, rows):
    """Whether the eviction records (and payload rows, with ``on_evict``) hold fewer than
    ``rows`` evictions."""
    if rows > v.ev_ids.shape[0]:
        return True
    return v.scr[S_EV_PAYLOAD] != 0 and rows > v.ev_tok.shape[0]
