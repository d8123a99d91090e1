"""State layout: the flat arrays that hold a manager's whole allocator state.

Every entry kernel takes the packed arrays of :data:`PACKED_FIELDS` followed by the per-call
scratch arrays of :data:`SCRATCH_FIELDS` as explicit arguments. Integer constants name the rows
of the packed arrays, the slots of ``meta`` and ``scr``, and the per-block flag bits.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

# --- sentinels -----------------------------------------------------------------------------------
NIL = -1  # no block / no link / padding in block tables
EMPTY = -1  # empty slot of the prefix hash table; values <= -2 mark entries of evicted blocks

# --- per-block flag bits (block_flags, uint8) ------------------------------------------------------
F_KNOWN = 1  # every token written to the block came with an id
F_HASHED = 2  # the block is full and has a chained hash (children may chain onto it)
F_REGISTERED = 4  # the block is the registered entry for its hash in the prefix table

# --- meta slots (int64) ---------------------------------------------------------------------------
M_FREE_TOP = 0  # number of blocks on the free stack
M_LRU_HEAD = 1  # least recently released cached block, or NIL
M_LRU_TAIL = 2  # most recently released cached block, or NIL
M_SLOT_TOP = 3  # number of free sequence slots on the slot stack
M_USED = 4  # blocks with refcount >= 1
M_CACHED = 5  # blocks with refcount 0 on the LRU list
M_ALLOCATIONS = 6
M_EVICTIONS = 7
M_COW_COPIES = 8
M_PREFIX_QUERIES = 9
M_PREFIX_HITS = 10
M_REGISTERED = 11  # entries in the prefix table
M_PREFIX_CACHING = 12  # 1 if full blocks are hashed and cached
M_HASH_BITS = 13  # bits kept of the 64-bit chained hash (fewer only to force collisions in tests)
M_LIVE_SEQS = 14
M_MAX_SEQ_LEN = 15
META_SIZE = 16

# --- scratch control slots (scr, int64) -----------------------------------------------------------
S_LOG_N = 0  # undo-log entries written in this call
S_LOG_ON = 1  # 1 while the current call records an undo log
S_EV_N = 2  # evictions recorded in this call
S_EV_PAYLOAD = 3  # 1 if evicted payloads are copied (on_evict set, or the call is logged)
S_STAMP = 4  # call counter for duplicate-id detection through seq_mark
S_FAILED = 5  # sequences or prompts of the current call that did not fit (non-atomic mode)
SCR_SIZE = 8

# Packed storage. Kernel dispatch costs about 75 ns per array argument, so the arrays of one
# shape and dtype are rows of one 2-D array; the kernels unpack them into named views for free
# (kernels/layout.py). Rows of blk32 (int32, 4 x num_blocks):
B_REF, B_PREV, B_NEXT, B_FREE = 0, 1, 2, 3
# Rows of blk64 (int64, 2 x num_blocks); the hash row is read as uint64:
B_HASH, B_SALT = 0, 1
# Rows of seq64 (int64, 6 x max_seqs); the mark row is per-call scratch, not state:
Q_LEN, Q_GEN, Q_SALT, Q_LIVE, Q_SLOTS, Q_MARK = 0, 1, 2, 3, 4, 5
# ctl (int64): meta, then the scratch control slots, then the copy of meta a logged call saves.
CTL_SIZE = 2 * META_SIZE + SCR_SIZE

PACKED_FIELDS = ("blk32", "blk64", "block_flags", "tokens", "htab", "seq_table", "seq64", "ctl")
SCRATCH_FIELDS = ("ulog", "ev", "ev_tok")


class State(NamedTuple):
    """The allocator state of one manager as named arrays.

    ``BlockManager.state`` holds read-only views, ``BlockManager.snapshot()`` copies. Compare two
    of them field by field with ``numpy.array_equal``.

    Attributes
    ----------
    ref : int32[num_blocks]
        Reference count of every block.
    lru_prev, lru_next : int32[num_blocks]
        Links of the intrusive LRU list of cached blocks (meaningful only for cached blocks).
    block_hash : uint64[num_blocks]
        Chained content hash of a full, hashed block.
    block_salt : int64[num_blocks]
        Salt of the sequence that filled the block (prefix reuse never crosses salts).
    block_flags : uint8[num_blocks]
        ``F_KNOWN | F_HASHED | F_REGISTERED`` bits.
    tokens : int64[num_blocks, block_size]
        Token payload; -1 where no token id is known.
    free_stack : int32[num_blocks]
        Free block ids; the first ``meta[M_FREE_TOP]`` entries are live, the last one is popped
        first.
    htab : int32[capacity]
        Open-addressing (linear probing) prefix table of registered block ids.
    seq_table : int32[max_seqs, max_blocks_per_seq]
        Block table of every sequence slot, padded with -1.
    seq_len : int64[max_seqs]
        Tokens held by every slot.
    seq_gen : int64[max_seqs]
        Generation of the slot's current or last occupant (the high bits of its id).
    seq_salt : int64[max_seqs]
        Prefix-cache salt of every slot.
    seq_live : int64[max_seqs]
        1 while the slot holds a live sequence.
    slot_stack : int64[max_seqs]
        Free sequence slots; the first ``meta[M_SLOT_TOP]`` entries are live.
    meta : int64[META_SIZE]
        Counters, stack tops and list ends (see the ``M_*`` constants).
    """

    ref: np.ndarray
    lru_prev: np.ndarray
    lru_next: np.ndarray
    block_hash: np.ndarray
    block_salt: np.ndarray
    block_flags: np.ndarray
    tokens: np.ndarray
    free_stack: np.ndarray
    htab: np.ndarray
    seq_table: np.ndarray
    seq_len: np.ndarray
    seq_gen: np.ndarray
    seq_salt: np.ndarray
    seq_live: np.ndarray
    slot_stack: np.ndarray
    meta: np.ndarray


def table_capacity(num_blocks: int) -> int:
    """Size of the prefix hash table: the power of two at least ``3 * num_blocks``.

    Registered entries plus the transient marks of blocks evicted during one call never exceed
    ``2 * num_blocks``, so the load stays below 2/3 even at the worst moment.
    """
    return 1 << max(4, int(3 * num_blocks - 1).bit_length())


def new_state(
    num_blocks: int,
    block_size: int,
    max_seqs: int,
    max_blocks_per_seq: int,
    max_seq_len: int,
    prefix_caching: bool,
    hash_bits: int = 64,
) -> tuple:
    """Allocate the packed arrays of an empty manager.

    Parameters
    ----------
    num_blocks, block_size, max_seqs, max_blocks_per_seq, max_seq_len : int
        Pool and table geometry (validated by the caller).
    prefix_caching : bool
        Whether full blocks are hashed and kept cached at refcount 0.
    hash_bits : int
        Bits of the chained hash to keep; 64 except in collision tests.

    Returns
    -------
    tuple
        The arrays of :data:`PACKED_FIELDS`: every block free (popped in id order), every
        sequence slot free (popped in slot order).
    """
    blk32 = np.full((4, num_blocks), NIL, dtype=np.int32)
    blk32[B_REF] = 0
    blk32[B_FREE] = np.arange(num_blocks - 1, -1, -1)  # reversed: block 0 is popped first
    blk64 = np.zeros((2, num_blocks), dtype=np.int64)
    seq64 = np.zeros((6, max_seqs), dtype=np.int64)
    seq64[Q_SLOTS] = np.arange(max_seqs - 1, -1, -1)
    ctl = np.zeros(CTL_SIZE, dtype=np.int64)
    meta = ctl[:META_SIZE]
    meta[M_FREE_TOP] = num_blocks
    meta[M_LRU_HEAD] = NIL
    meta[M_LRU_TAIL] = NIL
    meta[M_SLOT_TOP] = max_seqs
    meta[M_PREFIX_CACHING] = 1 if prefix_caching else 0
    meta[M_HASH_BITS] = hash_bits
    meta[M_MAX_SEQ_LEN] = max_seq_len
    return (
        blk32,
        blk64,
        np.zeros(num_blocks, dtype=np.uint8),
        np.full((num_blocks, block_size), -1, dtype=np.int64),
        np.full(table_capacity(num_blocks), EMPTY, dtype=np.int32),
        np.full((max_seqs, max_blocks_per_seq), NIL, dtype=np.int32),
        seq64,
        ctl,
    )


def state_views(packed: tuple) -> State:
    """The :class:`State` views of a manager's packed arrays."""
    blk32, blk64, block_flags, tokens, htab, seq_table, seq64, ctl = packed
    return State(
        ref=blk32[B_REF],
        lru_prev=blk32[B_PREV],
        lru_next=blk32[B_NEXT],
        block_hash=blk64[B_HASH].view(np.uint64),
        block_salt=blk64[B_SALT],
        block_flags=block_flags,
        tokens=tokens,
        free_stack=blk32[B_FREE],
        htab=htab,
        seq_table=seq_table,
        seq_len=seq64[Q_LEN],
        seq_gen=seq64[Q_GEN],
        seq_salt=seq64[Q_SALT],
        seq_live=seq64[Q_LIVE],
        slot_stack=seq64[Q_SLOTS],
        meta=ctl[:META_SIZE],
    )


def new_scratch(block_size: int, rows: int = 64, payload: bool = False) -> tuple:
    """Allocate the per-call scratch arrays (the facade grows them when a call needs more).

    Returns
    -------
    tuple
        ``(ulog, ev, ev_tok)``: the undo log ``(rows, 3)``, the eviction records ``(2, rows)``
        (block ids, hash bits) and their payload copies ``(rows or 0, block_size)``.
    """
    return (
        np.zeros((rows, 3), dtype=np.int64),
        np.zeros((2, rows), dtype=np.int64),
        np.zeros((rows if payload else 0, block_size), dtype=np.int64),
    )
