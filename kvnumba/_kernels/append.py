"""Growing sequences: partial-tail filling, copy-on-write of a shared partial tail, new blocks."""

import numpy as np
from numba import njit

from kvnumba._kernels.blocks import register_full_block, take_block
from kvnumba._kernels.prefix import table_purge_evicted
from kvnumba._kernels.sequences import blocks_of, resolve
from kvnumba._kernels.undo import U_FLAGS, U_REF, U_SEQLEN, U_SEQTAB, log_write
from kvnumba._state import (
    F_KNOWN,
    M_CACHED,
    M_COW_COPIES,
    M_FREE_TOP,
    M_MAX_SEQ_LEN,
    S_EV_N,
    S_EV_PAYLOAD,
    S_FAILED,
    S_STAMP,
)
from kvnumba.errors import (
    ST_BAD_TOKEN,
    ST_DUPLICATE_ID,
    ST_NEED_BUFFERS,
    ST_NEGATIVE_COUNT,
    ST_OK,
    ST_POOL_EXHAUSTED,
    ST_TOKEN_MISMATCH,
    ST_TOO_LONG,
)


@njit(cache=True, _nrt=False)
def blocks_needed(slot, count, ref, block_size, seq_table, seq_len):
    """Blocks that appending ``count`` tokens to ``slot`` takes: new blocks plus a COW block."""
    if count == 0:
        return 0
    length = seq_len[slot]
    need = blocks_of(length + count, block_size) - blocks_of(length, block_size)
    if length % block_size != 0 and ref[seq_table[slot, length // block_size]] > 1:
        need += 1
    return need


@njit(cache=True, _nrt=False)
def append_tokens(
    slot,
    count,
    src,
    src_offset,
    has_tokens,
    slot_mapping,
    out_offset,
    cow_src,
    cow_dst,
    num_cow,
    ref,
    lru_prev,
    lru_next,
    block_hash,
    block_salt,
    block_flags,
    tokens,
    free_stack,
    htab,
    seq_table,
    seq_len,
    seq_salt,
    meta,
    ulog,
    scr,
    ev_ids,
    ev_hash,
    ev_tok,
):
    """Append ``count`` tokens to one sequence whose need the caller has checked.

    Writes the slots to ``slot_mapping[out_offset:]`` and a copy-on-write pair, if any, to
    ``cow_src/cow_dst[num_cow]``; returns the new number of COW pairs.
    """
    if count == 0:
        return num_cow
    block_size = tokens.shape[1]
    width = seq_table.shape[1]
    length = seq_len[slot]
    salt = seq_salt[slot]
    fill = length % block_size
    if fill != 0:
        pos = length // block_size
        tail = seq_table[slot, pos]
        if ref[tail] > 1:
            # NOTE: the other holders keep the old block, so its payload stays untouched.
            copy = take_block(
                ref,
                lru_prev,
                lru_next,
                block_hash,
                block_flags,
                tokens,
                free_stack,
                htab,
                meta,
                ulog,
                scr,
                ev_ids,
                ev_hash,
                ev_tok,
            )
            for j in range(fill):
                tokens[copy, j] = tokens[tail, j]
            if (block_flags[tail] & F_KNOWN) == 0:
                log_write(ulog, scr, U_FLAGS, copy, block_flags[copy])
                block_flags[copy] = 0
            log_write(ulog, scr, U_SEQTAB, slot * width + pos, tail)
            seq_table[slot, pos] = copy
            log_write(ulog, scr, U_REF, tail, ref[tail])
            ref[tail] -= 1
            cow_src[num_cow] = tail
            cow_dst[num_cow] = copy
            num_cow += 1
            meta[M_COW_COPIES] += 1
    # Fill block by block: one take per new block, then a tight loop over its new slots.
    done = 0
    while done < count:
        p = length + done
        pos = p // block_size
        offset = p - pos * block_size
        if offset == 0:
            b = take_block(
                ref,
                lru_prev,
                lru_next,
                block_hash,
                block_flags,
                tokens,
                free_stack,
                htab,
                meta,
                ulog,
                scr,
                ev_ids,
                ev_hash,
                ev_tok,
            )
            log_write(ulog, scr, U_SEQTAB, slot * width + pos, seq_table[slot, pos])
            seq_table[slot, pos] = b
        else:
            b = seq_table[slot, pos]
        n = min(count - done, block_size - offset)
        first_slot = b * block_size + offset
        for j in range(n):
            slot_mapping[out_offset + done + j] = first_slot + j
        if has_tokens:
            for j in range(n):
                tokens[b, offset + j] = src[src_offset + done + j]
        elif block_flags[b] & F_KNOWN:
            log_write(ulog, scr, U_FLAGS, b, block_flags[b])
            block_flags[b] = block_flags[b] & ~F_KNOWN
        done += n
        if offset + n == block_size:
            parent = seq_table[slot, pos - 1] if pos > 0 else -1
            register_full_block(
                b, parent, salt, block_hash, block_salt, block_flags, tokens, htab, meta, ulog, scr
            )
    log_write(ulog, scr, U_SEQLEN, slot, length)
    seq_len[slot] = length + count
    return num_cow


@njit(cache=True)
def validate_growth(
    ids, counts, tokens_in, has_tokens, seq_len, seq_gen, seq_live, seq_mark, meta, scr
):
    """Check an append request; returns (status, bad index, slots, total tokens).

    Whole-array checks come first (counts, token ids), then each id in input order (unknown or
    released, duplicate, too long), the same order as the reference model.
    """
    slots = np.empty(0, dtype=np.int64)
    if counts.shape[0] != ids.shape[0]:
        return ST_TOKEN_MISMATCH, -1, slots, 0
    total = 0
    for i in range(ids.shape[0]):
        if counts[i] < 0:
            return ST_NEGATIVE_COUNT, i, slots, 0
        total += counts[i]
    if has_tokens:
        if tokens_in.shape[0] != total:
            return ST_TOKEN_MISMATCH, -1, slots, total
        for j in range(total):
            if tokens_in[j] < 0:
                return ST_BAD_TOKEN, j, slots, total
    slots = np.empty(ids.shape[0], dtype=np.int64)
    stamp = scr[S_STAMP] + 1
    scr[S_STAMP] = stamp
    for i in range(ids.shape[0]):
        status, slot = resolve(ids[i], seq_gen, seq_live)
        if status != ST_OK:
            return status, i, slots, 0
        if seq_mark[slot] == stamp:
            return ST_DUPLICATE_ID, i, slots, 0
        seq_mark[slot] = stamp
        if seq_len[slot] + counts[i] > meta[M_MAX_SEQ_LEN]:
            return ST_TOO_LONG, i, slots, 0
        slots[i] = slot
    return ST_OK, -1, slots, total


@njit(cache=True)
def total_need(slots, counts, ref, block_size, seq_table, seq_len):
    """Blocks an append of all ``slots``, served in order, takes.

    A shared partial tail is copied only by holders that still find it shared: once the other
    holders appended earlier in the same call, the last one writes in place. The refcount drops
    of those copies are simulated and undone before returning.
    """
    needed = 0
    dropped = np.full(slots.shape[0], -1, dtype=np.int64)
    for i in range(slots.shape[0]):
        slot = slots[i]
        needed += blocks_needed(slot, counts[i], ref, block_size, seq_table, seq_len)
        length = seq_len[slot]
        if counts[i] > 0 and length % block_size != 0:
            tail = seq_table[slot, length // block_size]
            if ref[tail] > 1:
                ref[tail] -= 1
                dropped[i] = tail
    for i in range(slots.shape[0]):
        if dropped[i] >= 0:
            ref[dropped[i]] += 1
    return needed


@njit(cache=True)
def can_append_batch(
    ids, counts, ref, block_size, seq_table, seq_len, seq_gen, seq_live, meta, scr, seq_mark
):
    """Whether an atomic append would succeed now; returns (status, bad index, fits)."""
    dummy = np.empty(0, dtype=np.int64)
    status, bad, slots, _ = validate_growth(
        ids, counts, dummy, False, seq_len, seq_gen, seq_live, seq_mark, meta, scr
    )
    if status != ST_OK:
        return status, bad, False
    need = total_need(slots, counts, ref, block_size, seq_table, seq_len)
    return ST_OK, -1, need <= meta[M_FREE_TOP] + meta[M_CACHED]


@njit(cache=True)
def append_batch(
    ids,
    counts,
    tokens_in,
    has_tokens,
    atomic,
    ref,
    lru_prev,
    lru_next,
    block_hash,
    block_salt,
    block_flags,
    tokens,
    free_stack,
    htab,
    seq_table,
    seq_len,
    seq_gen,
    seq_salt,
    seq_live,
    meta,
    ulog,
    scr,
    ev_ids,
    ev_hash,
    ev_tok,
    seq_mark,
):
    """Batched append.

    Returns
    -------
    tuple
        ``(status, bad index, needed, available, slot_mapping, cow_src, cow_dst, ok)``.
    """
    n = ids.shape[0]
    block_size = tokens.shape[1]
    ok = np.zeros(n, dtype=np.bool_)
    no_cow = np.empty(0, dtype=np.int32)
    status, bad, slots, total = validate_growth(
        ids, counts, tokens_in, has_tokens, seq_len, seq_gen, seq_live, seq_mark, meta, scr
    )
    if status != ST_OK:
        return status, bad, 0, 0, np.empty(0, dtype=np.int64), no_cow, no_cow, ok
    available = meta[M_FREE_TOP] + meta[M_CACHED]
    needed = total_need(slots, counts, ref, block_size, seq_table, seq_len)
    if atomic and needed > available:
        return (
            ST_POOL_EXHAUSTED,
            -1,
            needed,
            available,
            np.empty(0, dtype=np.int64),
            no_cow,
            no_cow,
            ok,
        )
    # Evictions happen only once the free stack is empty; the facade grows the record buffers.
    evictions = min(needed, available) - meta[M_FREE_TOP]
    if evictions > ev_ids.shape[0] or (scr[S_EV_PAYLOAD] != 0 and evictions > ev_tok.shape[0]):
        return (
            ST_NEED_BUFFERS,
            -1,
            evictions,
            available,
            np.empty(0, dtype=np.int64),
            no_cow,
            no_cow,
            ok,
        )
    slot_mapping = np.full(total, -1, dtype=np.int64)
    cow_src = np.empty(n, dtype=np.int32)
    cow_dst = np.empty(n, dtype=np.int32)
    num_cow = 0
    scr[S_EV_N] = 0
    scr[S_FAILED] = 0
    remaining = available
    offset = 0
    for i in range(n):
        # Each sequence's need is exact when taken just before it is served.
        need = blocks_needed(slots[i], counts[i], ref, block_size, seq_table, seq_len)
        if need <= remaining:
            num_cow = append_tokens(
                slots[i],
                counts[i],
                tokens_in,
                offset,
                has_tokens,
                slot_mapping,
                offset,
                cow_src,
                cow_dst,
                num_cow,
                ref,
                lru_prev,
                lru_next,
                block_hash,
                block_salt,
                block_flags,
                tokens,
                free_stack,
                htab,
                seq_table,
                seq_len,
                seq_salt,
                meta,
                ulog,
                scr,
                ev_ids,
                ev_hash,
                ev_tok,
            )
            remaining -= need
            ok[i] = True
        else:
            scr[S_FAILED] += 1
        offset += counts[i]
    table_purge_evicted(htab, block_hash, ev_hash, scr[S_EV_N])
    return ST_OK, -1, needed, available, slot_mapping, cow_src[:num_cow], cow_dst[:num_cow], ok
