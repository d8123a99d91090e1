"""Sequence slots and ids; the kernels of new_sequences, fork, release and the read-only queries.

A sequence id is ``tag << ID_TAG_SHIFT | generation << slot_bits | slot`` (:mod:`kvnumba.ids`):
the slot's generation grows every time the slot is handed out, so a stale id is told apart from
an unknown one, and the manager's tag makes another manager's id unknown here.
"""

from typing import NamedTuple

import numpy as np
from numba import int64, types

from kvnumba._kernels.anchors import seq_anchors
from kvnumba._kernels.blocks import drop_ref, releasing
from kvnumba._kernels.geometry import blocks_of
from kvnumba._kernels.jit import inlined, out_of_line
from kvnumba._kernels.outcomes import Status
from kvnumba._kernels.undo import clear_call_records, log_write
from kvnumba._kernels.views import VIEWS, views
from kvnumba._layout import (
    FIELD,
    M_GROUPS,
    M_ID_TAG,
    M_LIVE_SEQS,
    M_SLOT_BITS,
    M_SLOT_TOP,
    NIL,
    NULL_BLOCK,
    S_STAMP,
)
from kvnumba.errors import (
    ST_DUPLICATE_ID,
    ST_OK,
    ST_RELEASED_SEQ,
    ST_TOO_MANY_SEQS,
    ST_UNKNOWN_SEQ,
)
from kvnumba.ids import ID_TAG_SHIFT, compose_id, generation_mask

# The id layout is written once, in kvnumba.ids; the kernels compile the same functions.
_generation_mask = inlined(generation_mask)
_compose_id = inlined(compose_id)


class Resolved(NamedTuple):
    """What :func:`resolve` makes of a sequence id: a status, and the slot when it is ST_OK."""

    status: int
    slot: int


class NewSequence(NamedTuple):
    """A sequence :func:`open_slot` opened: its slot and its id."""

    slot: int
    seq_id: int


class SequenceSize(NamedTuple):
    """Tokens held by a sequence, and the block size."""

    length: int
    block_size: int


@inlined
def resolve(v, seq_id):
    """Status and slot of a sequence id (status ST_OK only for a live sequence): a
    :class:`Resolved`."""
    if seq_id < 0 or (seq_id >> ID_TAG_SHIFT) != v.meta[M_ID_TAG]:
        return Resolved(ST_UNKNOWN_SEQ, -1)
    bits = v.meta[M_SLOT_BITS]
    slot = seq_id & ((1 << bits) - 1)
    gen = (seq_id >> bits) & _generation_mask(bits)
    if slot >= v.seq_gen.shape[0] or gen < 1:
        return Resolved(ST_UNKNOWN_SEQ, -1)
    current = v.seq_gen[slot]
    if gen == current and v.seq_live[slot] != 0:
        return Resolved(ST_OK, slot)
    if gen <= current:
        return Resolved(ST_RELEASED_SEQ, -1)
    return Resolved(ST_UNKNOWN_SEQ, -1)


@inlined(types.NamedUniTuple(int64, 2, NewSequence)(VIEWS, int64))
def open_slot(v, salt):
    """Take a free slot for a new empty sequence; returns a :class:`NewSequence`."""
    meta = v.meta
    top = meta[M_SLOT_TOP] - 1
    slot = np.int64(v.slot_stack[top])  # int64 like the slots of ids: one compiled callee
    meta[M_SLOT_TOP] = top
    log_write(v, FIELD.seq_gen, slot, v.seq_gen[slot])
    log_write(v, FIELD.seq_live, slot, v.seq_live[slot])
    log_write(v, FIELD.seq_salt, slot, v.seq_salt[slot])
    log_write(v, FIELD.seq_len, slot, v.seq_len[slot])
    bits = meta[M_SLOT_BITS]
    gen = v.seq_gen[slot] % _generation_mask(bits) + 1  # wraps to 1 (kvnumba.ids)
    v.seq_gen[slot] = gen
    v.seq_live[slot] = 1
    v.seq_salt[slot] = salt
    v.seq_len[slot] = 0
    meta[M_LIVE_SEQS] += 1
    return NewSequence(slot, _compose_id(meta[M_ID_TAG], gen, slot, bits))


@out_of_line
def resolve_ids(ids, reject_duplicates, slots, arena, scratch):
    """Write the slot of every id to ``slots``; returns a :class:`.Status` (``bad``: the index of
    the first bad id)."""
    v = views(arena, scratch, scratch)
    stamp = v.scr[S_STAMP] + 1
    v.scr[S_STAMP] = stamp
    for i in range(ids.shape[0]):
        found = resolve(v, ids[i])
        if found.status != ST_OK:
            return Status(found.status, i)
        slot = found.slot
        if reject_duplicates:
            if v.seq_mark[slot] == stamp:
                return Status(ST_DUPLICATE_ID, i)
            v.seq_mark[slot] = stamp
        slots[i] = slot
    return Status(ST_OK, -1)


@out_of_line
def run_new_sequences(ids, arena, scratch):
    """Fill ``ids`` with new empty sequences; returns a status."""
    v = views(arena, scratch, scratch)
    if ids.shape[0] > v.meta[M_SLOT_TOP]:
        return ST_TOO_MANY_SEQS
    for i in range(ids.shape[0]):
        ids[i] = open_slot(v, i % v.meta[M_GROUPS]).seq_id
    return ST_OK


@out_of_line
def run_release(slots, arena, scratch, pool):
    """Release the sequences of ``slots`` (validated), each tail block first."""
    v = views(arena, scratch, pool)
    meta, seq_table = v.meta, v.seq_table
    block_size = v.tokens.shape[1]
    # A release unmaps pages but never evicts, maps or fails part-way: the facade delivers
    # this call's records like any other call's.
    clear_call_records(v.scr)
    for i in range(slots.shape[0]):
        slot = slots[i]
        releasing(v, slot, v.seq_len[slot])
        for pos in range(blocks_of(v.seq_len[slot], block_size) - 1, -1, -1):
            b = seq_table[slot, pos]
            seq_table[slot, pos] = NIL
            if b == NULL_BLOCK:
                # Left a window, and so did every position below (a prefix): NIL them all.
                for below in range(pos):
                    seq_table[slot, below] = NIL
                break
            drop_ref(v, b)
        v.seq_len[slot] = 0
        v.seq_salt[slot] = 0
        v.seq_tag[slot] = 0
        v.seq_live[slot] = 0
        top = meta[M_SLOT_TOP]
        v.slot_stack[top] = slot
        meta[M_SLOT_TOP] = top + 1
        meta[M_LIVE_SEQS] -= 1


@out_of_line
def run_fork(slots, children, arena, scratch):
    """Give each parent slot ``children.shape[1]`` children; returns a status."""
    v = views(arena, scratch, scratch)
    seq_table, seq_len = v.seq_table, v.seq_len
    n = children.shape[1]
    if slots.shape[0] * n > v.meta[M_SLOT_TOP]:
        return ST_TOO_MANY_SEQS
    block_size = v.tokens.shape[1]
    for i in range(slots.shape[0]):
        parent = slots[i]
        length = seq_len[parent]
        nblocks = blocks_of(length, block_size)
        for c in range(n):
            child = open_slot(v, v.seq_salt[parent])
            slot = child.slot
            children[i, c] = child.seq_id
            seq_len[slot] = length
            v.seq_tag[slot] = v.seq_tag[parent]
            for pos in range(nblocks):
                seq_table[slot, pos] = seq_table[parent, pos]
            anchors = seq_anchors(v)
            anchors[slot, 0] = anchors[parent, 0]
            anchors[slot, 1] = anchors[parent, 1]
        for pos in range(nblocks):
            b = seq_table[parent, pos]
            if b != NULL_BLOCK:
                v.ref[b] += n
    return ST_OK


@out_of_line
def table_width(slots, arena, scratch):
    """Most blocks held by any of ``slots``."""
    v = views(arena, scratch, scratch)
    width = 0
    for i in range(slots.shape[0]):
        width = max(width, blocks_of(v.seq_len[slots[i]], v.tokens.shape[1]))
    return width


@out_of_line
def fill_tables(slots, out, arena, scratch):
    """Copy the block tables of ``slots`` into ``out`` (pre-filled with -1)."""
    v = views(arena, scratch, scratch)
    for i in range(slots.shape[0]):
        for pos in range(blocks_of(v.seq_len[slots[i]], v.tokens.shape[1])):
            out[i, pos] = v.seq_table[slots[i], pos]


@out_of_line
def fill_lens(slots, out, arena, scratch):
    """Copy the lengths of ``slots`` into ``out``."""
    v = views(arena, scratch, scratch)
    for i in range(slots.shape[0]):
        out[i] = v.seq_len[slots[i]]


@out_of_line
def length_and_block_size(slot, arena, scratch):
    """The :class:`SequenceSize` of sequence slot ``slot`` (for NRT entry kernels)."""
    v = views(arena, scratch, scratch)
    return SequenceSize(v.seq_len[slot], np.int64(v.tokens.shape[1]))
