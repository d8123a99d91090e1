"""Entry points of the facade: one kernel per public call, all with the same array arguments.

Every entry kernel takes its call's inputs, then the packed state arrays and the scratch arrays
(``PACKED_FIELDS + SCRATCH_FIELDS`` of :mod:`kvnumba._state`), unpacks them into named views
and runs the implementation, which takes explicit arrays.
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
from kvnumba._state import META_SIZE, SCR_SIZE


@njit(cache=True)
def unpack(blk32, blk64, seq64, ctl, ev):
    """Named views of the packed arrays (rows are contiguous; no copy is made)."""
    return (
        blk32[0],  # ref
        blk32[1],  # lru_prev
        blk32[2],  # lru_next
        blk32[3],  # free_stack
        blk64[0].view(np.uint64),  # block_hash
        blk64[1],  # block_salt
        seq64[0],  # seq_len
        seq64[1],  # seq_gen
        seq64[2],  # seq_salt
        seq64[3],  # seq_live
        seq64[4],  # slot_stack
        seq64[5],  # seq_mark
        ctl[:META_SIZE],  # meta
        ctl[META_SIZE : META_SIZE + SCR_SIZE],  # scr
        ctl[META_SIZE + SCR_SIZE :],  # meta_save
        ev[0],  # ev_ids
        ev[1].view(np.uint64),  # ev_hash
    )


@njit(cache=True)
def k_admit(
    tokens_in,
    lengths,
    salts,
    atomic,
    blk32,
    blk64,
    block_flags,
    tokens,
    htab,
    seq_table,
    seq64,
    ctl,
    ulog,
    ev,
    ev_tok,
):
    """Entry kernel of ``admit_batch``."""
    (
        ref,
        lru_prev,
        lru_next,
        free_stack,
        block_hash,
        block_salt,
        seq_len,
        seq_gen,
        seq_salt,
        seq_live,
        slot_stack,
        seq_mark,
        meta,
        scr,
        meta_save,
        ev_ids,
        ev_hash,
    ) = unpack(blk32, blk64, seq64, ctl, ev)
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
def k_can_append(
    ids, counts, blk32, blk64, block_flags, tokens, htab, seq_table, seq64, ctl, ulog, ev, ev_tok
):
    """Entry kernel of ``can_append_batch``."""
    (
        ref,
        lru_prev,
        lru_next,
        free_stack,
        block_hash,
        block_salt,
        seq_len,
        seq_gen,
        seq_salt,
        seq_live,
        slot_stack,
        seq_mark,
        meta,
        scr,
        meta_save,
        ev_ids,
        ev_hash,
    ) = unpack(blk32, blk64, seq64, ctl, ev)
    block_size = tokens.shape[1]
    return can_append_batch(
        ids, counts, ref, block_size, seq_table, seq_len, seq_gen, seq_live, meta, scr, seq_mark
    )


@njit(cache=True)
def k_append(
    ids,
    counts,
    tokens_in,
    has_tokens,
    atomic,
    blk32,
    blk64,
    block_flags,
    tokens,
    htab,
    seq_table,
    seq64,
    ctl,
    ulog,
    ev,
    ev_tok,
):
    """Entry kernel of ``append_batch``."""
    (
        ref,
        lru_prev,
        lru_next,
        free_stack,
        block_hash,
        block_salt,
        seq_len,
        seq_gen,
        seq_salt,
        seq_live,
        slot_stack,
        seq_mark,
        meta,
        scr,
        meta_save,
        ev_ids,
        ev_hash,
    ) = unpack(blk32, blk64, seq64, ctl, ev)
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
def k_check(blk32, blk64, block_flags, tokens, htab, seq_table, seq64, ctl, ulog, ev, ev_tok):
    """Entry kernel of ``check_state``."""
    (
        ref,
        lru_prev,
        lru_next,
        free_stack,
        block_hash,
        block_salt,
        seq_len,
        seq_gen,
        seq_salt,
        seq_live,
        slot_stack,
        seq_mark,
        meta,
        scr,
        meta_save,
        ev_ids,
        ev_hash,
    ) = unpack(blk32, blk64, seq64, ctl, ev)
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
def k_new_sequences(
    count, blk32, blk64, block_flags, tokens, htab, seq_table, seq64, ctl, ulog, ev, ev_tok
):
    """Entry kernel of ``new_sequences_batch``."""
    (
        ref,
        lru_prev,
        lru_next,
        free_stack,
        block_hash,
        block_salt,
        seq_len,
        seq_gen,
        seq_salt,
        seq_live,
        slot_stack,
        seq_mark,
        meta,
        scr,
        meta_save,
        ev_ids,
        ev_hash,
    ) = unpack(blk32, blk64, seq64, ctl, ev)
    return new_sequences_batch(
        count, seq_len, seq_gen, seq_salt, seq_live, slot_stack, meta, ulog, scr
    )


@njit(cache=True)
def k_release(
    ids, blk32, blk64, block_flags, tokens, htab, seq_table, seq64, ctl, ulog, ev, ev_tok
):
    """Entry kernel of ``release_batch``."""
    (
        ref,
        lru_prev,
        lru_next,
        free_stack,
        block_hash,
        block_salt,
        seq_len,
        seq_gen,
        seq_salt,
        seq_live,
        slot_stack,
        seq_mark,
        meta,
        scr,
        meta_save,
        ev_ids,
        ev_hash,
    ) = unpack(blk32, blk64, seq64, ctl, ev)
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
def k_fork(
    ids, n, blk32, blk64, block_flags, tokens, htab, seq_table, seq64, ctl, ulog, ev, ev_tok
):
    """Entry kernel of ``fork_batch``."""
    (
        ref,
        lru_prev,
        lru_next,
        free_stack,
        block_hash,
        block_salt,
        seq_len,
        seq_gen,
        seq_salt,
        seq_live,
        slot_stack,
        seq_mark,
        meta,
        scr,
        meta_save,
        ev_ids,
        ev_hash,
    ) = unpack(blk32, blk64, seq64, ctl, ev)
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
def k_block_tables(
    ids, blk32, blk64, block_flags, tokens, htab, seq_table, seq64, ctl, ulog, ev, ev_tok
):
    """Entry kernel of ``block_tables_batch``."""
    (
        ref,
        lru_prev,
        lru_next,
        free_stack,
        block_hash,
        block_salt,
        seq_len,
        seq_gen,
        seq_salt,
        seq_live,
        slot_stack,
        seq_mark,
        meta,
        scr,
        meta_save,
        ev_ids,
        ev_hash,
    ) = unpack(blk32, blk64, seq64, ctl, ev)
    block_size = tokens.shape[1]
    return block_tables_batch(ids, block_size, seq_table, seq_len, seq_gen, seq_live, seq_mark, scr)


@njit(cache=True)
def k_seq_lens(
    ids, blk32, blk64, block_flags, tokens, htab, seq_table, seq64, ctl, ulog, ev, ev_tok
):
    """Entry kernel of ``seq_lens_batch``."""
    (
        ref,
        lru_prev,
        lru_next,
        free_stack,
        block_hash,
        block_salt,
        seq_len,
        seq_gen,
        seq_salt,
        seq_live,
        slot_stack,
        seq_mark,
        meta,
        scr,
        meta_save,
        ev_ids,
        ev_hash,
    ) = unpack(blk32, blk64, seq64, ctl, ev)
    return seq_lens_batch(ids, seq_len, seq_gen, seq_live, seq_mark, scr)
