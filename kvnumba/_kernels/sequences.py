"""Sequence slots and ids; the kernels of new_sequences, fork, release and the read-only queries.

A sequence id is ``generation << 32 | slot``; the slot's generation grows every time the slot is
handed out, so ids are never reused and a stale id is told apart from an unknown one.
"""

import numpy as np
from numba import njit

from kvnumba._kernels.blocks import drop_ref
from kvnumba._kernels.undo import U_SEQGEN, U_SEQLEN, U_SEQLIVE, U_SEQSALT, log_write
from kvnumba._state import M_LIVE_SEQS, M_SLOT_TOP, NIL, S_STAMP
from kvnumba.errors import (
    ST_DUPLICATE_ID,
    ST_OK,
    ST_RELEASED_SEQ,
    ST_TOO_MANY_SEQS,
    ST_UNKNOWN_SEQ,
)

SLOT_BITS = 32
SLOT_MASK = (1 << SLOT_BITS) - 1


@njit(cache=True, _nrt=False)
def resolve(seq_id, seq_gen, seq_live):
    """Status and slot of a sequence id (status ST_OK only for a live sequence)."""
    if seq_id < 0:
        return ST_UNKNOWN_SEQ, -1
    slot = seq_id & SLOT_MASK
    gen = seq_id >> SLOT_BITS
    if slot >= seq_gen.shape[0] or gen < 1:
        return ST_UNKNOWN_SEQ, -1
    current = seq_gen[slot]
    if gen == current and seq_live[slot] != 0:
        return ST_OK, slot
    if gen <= current:
        return ST_RELEASED_SEQ, -1
    return ST_UNKNOWN_SEQ, -1


@njit(cache=True)
def resolve_all(ids, seq_gen, seq_live, seq_mark, scr, reject_duplicates):
    """Slots of all ``ids``; returns (status, index of the first bad id, slots)."""
    n = ids.shape[0]
    slots = np.empty(n, dtype=np.int64)
    stamp = scr[S_STAMP] + 1
    scr[S_STAMP] = stamp
    for i in range(n):
        status, slot = resolve(ids[i], seq_gen, seq_live)
        if status != ST_OK:
            return status, i, slots
        if reject_duplicates:
            if seq_mark[slot] == stamp:
                return ST_DUPLICATE_ID, i, slots
            seq_mark[slot] = stamp
        slots[i] = slot
    return ST_OK, -1, slots


@njit(cache=True, _nrt=False)
def open_slot(salt, seq_len, seq_gen, seq_salt, seq_live, slot_stack, meta, ulog, scr):
    """Take a free slot for a new empty sequence; returns (slot, id)."""
    top = meta[M_SLOT_TOP] - 1
    slot = slot_stack[top]
    meta[M_SLOT_TOP] = top
    log_write(ulog, scr, U_SEQGEN, slot, seq_gen[slot])
    log_write(ulog, scr, U_SEQLIVE, slot, seq_live[slot])
    log_write(ulog, scr, U_SEQSALT, slot, seq_salt[slot])
    log_write(ulog, scr, U_SEQLEN, slot, seq_len[slot])
    gen = seq_gen[slot] + 1
    seq_gen[slot] = gen
    seq_live[slot] = 1
    seq_salt[slot] = salt
    seq_len[slot] = 0
    meta[M_LIVE_SEQS] += 1
    return slot, (gen << SLOT_BITS) | slot


@njit(cache=True, _nrt=False)
def blocks_of(length, block_size):
    """Blocks that hold ``length`` tokens."""
    return (length + block_size - 1) // block_size


@njit(cache=True)
def new_sequences_batch(count, seq_len, seq_gen, seq_salt, seq_live, slot_stack, meta, ulog, scr):
    """Create ``count`` empty sequences; returns (status, ids)."""
    ids = np.empty(count, dtype=np.int64)
    if count > meta[M_SLOT_TOP]:
        return ST_TOO_MANY_SEQS, ids
    for i in range(count):
        _, new_id = open_slot(0, seq_len, seq_gen, seq_salt, seq_live, slot_stack, meta, ulog, scr)
        ids[i] = new_id
    return ST_OK, ids


@njit(cache=True)
def release_batch(
    ids,
    ref,
    lru_prev,
    lru_next,
    block_flags,
    tokens,
    free_stack,
    seq_table,
    seq_len,
    seq_gen,
    seq_salt,
    seq_live,
    slot_stack,
    meta,
    ulog,
    scr,
    seq_mark,
):
    """Release every sequence of ``ids``, tail block first; returns (status, bad index)."""
    status, bad, slots = resolve_all(ids, seq_gen, seq_live, seq_mark, scr, True)
    if status != ST_OK:
        return status, bad
    block_size = tokens.shape[1]
    for i in range(ids.shape[0]):
        slot = slots[i]
        for pos in range(blocks_of(seq_len[slot], block_size) - 1, -1, -1):
            drop_ref(
                seq_table[slot, pos],
                ref,
                lru_prev,
                lru_next,
                block_flags,
                tokens,
                free_stack,
                meta,
                ulog,
                scr,
            )
            seq_table[slot, pos] = NIL
        seq_len[slot] = 0
        seq_salt[slot] = 0
        seq_live[slot] = 0
        top = meta[M_SLOT_TOP]
        slot_stack[top] = slot
        meta[M_SLOT_TOP] = top + 1
        meta[M_LIVE_SEQS] -= 1
    return ST_OK, -1


@njit(cache=True)
def fork_batch(
    ids,
    n,
    ref,
    block_size,
    seq_table,
    seq_len,
    seq_gen,
    seq_salt,
    seq_live,
    slot_stack,
    meta,
    ulog,
    scr,
    seq_mark,
):
    """Give each parent ``n`` children sharing all its blocks; returns (status, bad, ids)."""
    children = np.empty((ids.shape[0], n), dtype=np.int64)
    status, bad, slots = resolve_all(ids, seq_gen, seq_live, seq_mark, scr, False)
    if status != ST_OK:
        return status, bad, children
    if ids.shape[0] * n > meta[M_SLOT_TOP]:
        return ST_TOO_MANY_SEQS, -1, children
    for i in range(ids.shape[0]):
        parent = slots[i]
        length = seq_len[parent]
        nblocks = blocks_of(length, block_size)
        for c in range(n):
            slot, child = open_slot(
                seq_salt[parent], seq_len, seq_gen, seq_salt, seq_live, slot_stack, meta, ulog, scr
            )
            children[i, c] = child
            seq_len[slot] = length
            seq_table[slot, :nblocks] = seq_table[parent, :nblocks]
        for pos in range(nblocks):
            ref[seq_table[parent, pos]] += n
    return ST_OK, -1, children


@njit(cache=True)
def block_tables_batch(ids, block_size, seq_table, seq_len, seq_gen, seq_live, seq_mark, scr):
    """Padded block tables of ``ids``; returns (status, bad index, int32 table)."""
    status, bad, slots = resolve_all(ids, seq_gen, seq_live, seq_mark, scr, False)
    if status != ST_OK:
        return status, bad, np.empty((0, 0), dtype=np.int32)
    width = 0
    for i in range(ids.shape[0]):
        width = max(width, blocks_of(seq_len[slots[i]], block_size))
    out = np.full((ids.shape[0], width), NIL, dtype=np.int32)
    for i in range(ids.shape[0]):
        nblocks = blocks_of(seq_len[slots[i]], block_size)
        out[i, :nblocks] = seq_table[slots[i], :nblocks]
    return ST_OK, -1, out


@njit(cache=True)
def seq_lens_batch(ids, seq_len, seq_gen, seq_live, seq_mark, scr):
    """Lengths of ``ids``; returns (status, bad index, int64 lengths)."""
    status, bad, slots = resolve_all(ids, seq_gen, seq_live, seq_mark, scr, False)
    out = np.empty(ids.shape[0], dtype=np.int64)
    if status != ST_OK:
        return status, bad, out
    for i in range(ids.shape[0]):
        out[i] = seq_len[slots[i]]
    return ST_OK, -1, out
