"""Entry points of the facade: one kernel per public call, each taking two arenas.

Every entry kernel takes its call's inputs, then the state arena and the scratch arena of
:mod:`kvnumba._state`, carves the named views out of them (:func:`unpack`, no copy, no
allocation) and runs the implementation, which takes explicit arrays.
"""

import numpy as np
from numba import njit

from kvnumba._kernels.admit import admit_batch
from kvnumba._kernels.append import append_batch, can_append_batch
from kvnumba._kernels.check import check_state
from kvnumba._kernels.sequences import (
    block_tables_batch,
    fork_batch,
    new_sequences_batch,
    release_batch,
    seq_lens_batch,
)
from kvnumba._state import HEADER_BYTES, HEADER_SLOTS


@njit(cache=True, inline="always")
def _field(arena, header, i):
    """The bytes of field ``i`` of an arena."""
    offset = header[HEADER_SLOTS * i]
    return arena[offset : offset + header[HEADER_SLOTS * i + 1]]


@njit(cache=True, inline="always")
def _shape(header, i):
    return header[HEADER_SLOTS * i + 2], header[HEADER_SLOTS * i + 3]


# Inlined so that the views never travel through a returned tuple: that would cost an atomic
# reference-count update per view per call.
@njit(cache=True, inline="always")
def unpack(arena, scratch):
    """Named views of both arenas, in ``State`` then ``SCRATCH_FIELDS`` order."""
    h = arena[:HEADER_BYTES].view(np.int64)
    g = scratch[:HEADER_BYTES].view(np.int64)
    return (
        _field(arena, h, 0).view(np.int32),  # ref
        _field(arena, h, 1).view(np.int32),  # lru_prev
        _field(arena, h, 2).view(np.int32),  # lru_next
        _field(arena, h, 3).view(np.int32),  # free_stack
        _field(arena, h, 4).view(np.uint64),  # block_hash
        _field(arena, h, 5).view(np.int64),  # block_salt
        _field(arena, h, 6).view(np.uint8),  # block_flags
        _field(arena, h, 7).view(np.int64).reshape(_shape(h, 7)),  # tokens
        _field(arena, h, 8).view(np.int32),  # htab
        _field(arena, h, 9).view(np.int32).reshape(_shape(h, 9)),  # seq_table
        _field(arena, h, 10).view(np.int64),  # seq_len
        _field(arena, h, 11).view(np.int64),  # seq_gen
        _field(arena, h, 12).view(np.int64),  # seq_salt
        _field(arena, h, 13).view(np.uint8),  # seq_live
        _field(arena, h, 14).view(np.int32),  # slot_stack
        _field(arena, h, 15).view(np.int64),  # meta
        _field(scratch, g, 0).view(np.int64).reshape(_shape(g, 0)),  # ulog
        _field(scratch, g, 1).view(np.int64),  # ev_ids
        _field(scratch, g, 2).view(np.uint64),  # ev_hash
        _field(scratch, g, 3).view(np.int64).reshape(_shape(g, 3)),  # ev_tok
        _field(scratch, g, 4).view(np.int64),  # seq_mark
        _field(scratch, g, 5).view(np.int64),  # scr
        _field(scratch, g, 6).view(np.int64),  # meta_save
    )


@njit(cache=True)
def k_admit(tokens_in, lengths, salts, atomic, arena, scratch):
    """Entry kernel of ``admit_batch``."""
    (
        ref,
        lru_prev,
        lru_next,
        free_stack,
        block_hash,
        block_salt,
        block_flags,
        tokens,
        htab,
        seq_table,
        seq_len,
        seq_gen,
        seq_salt,
        seq_live,
        slot_stack,
        meta,
        ulog,
        ev_ids,
        ev_hash,
        ev_tok,
        seq_mark,
        scr,
        meta_save,
    ) = unpack(arena, scratch)
    return admit_batch(
        tokens_in,
        lengths,
        salts,
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
        slot_stack,
        meta,
        ulog,
        scr,
        meta_save,
        ev_ids,
        ev_hash,
        ev_tok,
    )


@njit(cache=True)
def k_can_append(ids, counts, arena, scratch):
    """Entry kernel of ``can_append_batch``."""
    (
        ref,
        lru_prev,
        lru_next,
        free_stack,
        block_hash,
        block_salt,
        block_flags,
        tokens,
        htab,
        seq_table,
        seq_len,
        seq_gen,
        seq_salt,
        seq_live,
        slot_stack,
        meta,
        ulog,
        ev_ids,
        ev_hash,
        ev_tok,
        seq_mark,
        scr,
        meta_save,
    ) = unpack(arena, scratch)
    block_size = tokens.shape[1]
    return can_append_batch(
        ids, counts, ref, block_size, seq_table, seq_len, seq_gen, seq_live, meta, scr, seq_mark
    )


@njit(cache=True)
def k_append(ids, counts, tokens_in, has_tokens, atomic, arena, scratch):
    """Entry kernel of ``append_batch``."""
    (
        ref,
        lru_prev,
        lru_next,
        free_stack,
        block_hash,
        block_salt,
        block_flags,
        tokens,
        htab,
        seq_table,
        seq_len,
        seq_gen,
        seq_salt,
        seq_live,
        slot_stack,
        meta,
        ulog,
        ev_ids,
        ev_hash,
        ev_tok,
        seq_mark,
        scr,
        meta_save,
    ) = unpack(arena, scratch)
    return append_batch(
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
    )


@njit(cache=True)
def k_check(arena, scratch):
    """Entry kernel of ``check_state``."""
    (
        ref,
        lru_prev,
        lru_next,
        free_stack,
        block_hash,
        block_salt,
        block_flags,
        tokens,
        htab,
        seq_table,
        seq_len,
        seq_gen,
        seq_salt,
        seq_live,
        slot_stack,
        meta,
        ulog,
        ev_ids,
        ev_hash,
        ev_tok,
        seq_mark,
        scr,
        meta_save,
    ) = unpack(arena, scratch)
    return check_state(
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
        slot_stack,
        meta,
    )


@njit(cache=True)
def k_new_sequences(count, arena, scratch):
    """Entry kernel of ``new_sequences_batch``."""
    (
        ref,
        lru_prev,
        lru_next,
        free_stack,
        block_hash,
        block_salt,
        block_flags,
        tokens,
        htab,
        seq_table,
        seq_len,
        seq_gen,
        seq_salt,
        seq_live,
        slot_stack,
        meta,
        ulog,
        ev_ids,
        ev_hash,
        ev_tok,
        seq_mark,
        scr,
        meta_save,
    ) = unpack(arena, scratch)
    return new_sequences_batch(
        count, seq_len, seq_gen, seq_salt, seq_live, slot_stack, meta, ulog, scr
    )


@njit(cache=True)
def k_release(ids, arena, scratch):
    """Entry kernel of ``release_batch``."""
    (
        ref,
        lru_prev,
        lru_next,
        free_stack,
        block_hash,
        block_salt,
        block_flags,
        tokens,
        htab,
        seq_table,
        seq_len,
        seq_gen,
        seq_salt,
        seq_live,
        slot_stack,
        meta,
        ulog,
        ev_ids,
        ev_hash,
        ev_tok,
        seq_mark,
        scr,
        meta_save,
    ) = unpack(arena, scratch)
    return release_batch(
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
    )


@njit(cache=True)
def k_fork(ids, n, arena, scratch):
    """Entry kernel of ``fork_batch``."""
    (
        ref,
        lru_prev,
        lru_next,
        free_stack,
        block_hash,
        block_salt,
        block_flags,
        tokens,
        htab,
        seq_table,
        seq_len,
        seq_gen,
        seq_salt,
        seq_live,
        slot_stack,
        meta,
        ulog,
        ev_ids,
        ev_hash,
        ev_tok,
        seq_mark,
        scr,
        meta_save,
    ) = unpack(arena, scratch)
    block_size = tokens.shape[1]
    return fork_batch(
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
    )


@njit(cache=True)
def k_block_tables(ids, arena, scratch):
    """Entry kernel of ``block_tables_batch``."""
    (
        ref,
        lru_prev,
        lru_next,
        free_stack,
        block_hash,
        block_salt,
        block_flags,
        tokens,
        htab,
        seq_table,
        seq_len,
        seq_gen,
        seq_salt,
        seq_live,
        slot_stack,
        meta,
        ulog,
        ev_ids,
        ev_hash,
        ev_tok,
        seq_mark,
        scr,
        meta_save,
    ) = unpack(arena, scratch)
    block_size = tokens.shape[1]
    return block_tables_batch(ids, block_size, seq_table, seq_len, seq_gen, seq_live, seq_mark, scr)


@njit(cache=True)
def k_seq_lens(ids, arena, scratch):
    """Entry kernel of ``seq_lens_batch``."""
    (
        ref,
        lru_prev,
        lru_next,
        free_stack,
        block_hash,
        block_salt,
        block_flags,
        tokens,
        htab,
        seq_table,
        seq_len,
        seq_gen,
        seq_salt,
        seq_live,
        slot_stack,
        meta,
        ulog,
        ev_ids,
        ev_hash,
        ev_tok,
        seq_mark,
        scr,
        meta_save,
    ) = unpack(arena, scratch)
    return seq_lens_batch(ids, seq_len, seq_gen, seq_live, seq_mark, scr)
