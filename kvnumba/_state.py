"""State layout: the flat arrays that hold a manager's whole allocator state.

Every kernel takes these arrays as explicit arguments, always in the order of :data:`STATE_FIELDS`
followed by the per-call scratch arrays of :data:`SCRATCH_FIELDS`. Integer constants name the
slots of ``meta`` and ``scr`` and the per-block flag bits.
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
SCR_SIZE = 8

STATE_FIELDS = (
    "ref",
    "lru_prev",
    "lru_next",
    "block_hash",
    "block_salt",
    "block_flags",
    "tokens",
    "free_stack",
    "htab",
    "seq_table",
    "seq_len",
    "seq_gen",
    "seq_salt",
    "seq_live",
    "slot_stack",
    "meta",
)

SCRATCH_FIELDS = ("ulog", "scr", "meta_save", "ev_ids", "ev_hash", "ev_tok", "seq_mark")


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
    seq_live : uint8[max_seqs]
        1 while the slot holds a live sequence.
    slot_stack : int32[max_seqs]
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
    prefix_caching: bool,
    hash_bits: int = 64,
) -> State:
    """Allocate the arrays of an empty manager.

    Parameters
    ----------
    num_blocks, block_size, max_seqs, max_blocks_per_seq : int
        Pool and table geometry (validated by the caller).
    prefix_caching : bool
        Whether full blocks are hashed and kept cached at refcount 0.
    hash_bits : int
        Bits of the chained hash to keep; 64 except in collision tests.

    Returns
    -------
    State
        Fresh arrays: every block free (popped in id order), every slot free.
    """
    meta = np.zeros(META_SIZE, dtype=np.int64)
    meta[M_FREE_TOP] = num_blocks
    meta[M_LRU_HEAD] = NIL
    meta[M_LRU_TAIL] = NIL
    meta[M_SLOT_TOP] = max_seqs
    meta[M_PREFIX_CACHING] = 1 if prefix_caching else 0
    meta[M_HASH_BITS] = hash_bits
    return State(
        ref=np.zeros(num_blocks, dtype=np.int32),
        lru_prev=np.full(num_blocks, NIL, dtype=np.int32),
        lru_next=np.full(num_blocks, NIL, dtype=np.int32),
        block_hash=np.zeros(num_blocks, dtype=np.uint64),
        block_salt=np.zeros(num_blocks, dtype=np.int64),
        block_flags=np.zeros(num_blocks, dtype=np.uint8),
        tokens=np.full((num_blocks, block_size), -1, dtype=np.int64),
        # reversed so that the stack pops block 0 first
        free_stack=np.arange(num_blocks - 1, -1, -1, dtype=np.int32),
        htab=np.full(table_capacity(num_blocks), EMPTY, dtype=np.int32),
        seq_table=np.full((max_seqs, max_blocks_per_seq), NIL, dtype=np.int32),
        seq_len=np.zeros(max_seqs, dtype=np.int64),
        seq_gen=np.zeros(max_seqs, dtype=np.int64),
        seq_salt=np.zeros(max_seqs, dtype=np.int64),
        seq_live=np.zeros(max_seqs, dtype=np.uint8),
        slot_stack=np.arange(max_seqs - 1, -1, -1, dtype=np.int32),
        meta=meta,
    )


def new_scratch(num_blocks: int, block_size: int, max_seqs: int) -> tuple:
    """Allocate the per-call scratch arrays (grown by the facade when a call needs more).

    Returns
    -------
    tuple
        ``(ulog, scr, meta_save, ev_ids, ev_hash, ev_tok, seq_mark)`` in
        :data:`SCRATCH_FIELDS` order.
    """
    cap = 64
    return (
        np.zeros((cap, 3), dtype=np.int64),
        np.zeros(SCR_SIZE, dtype=np.int64),
        np.zeros(META_SIZE, dtype=np.int64),
        np.zeros(cap, dtype=np.int64),
        np.zeros(cap, dtype=np.uint64),
        np.zeros((0, block_size), dtype=np.int64),
        np.zeros(max_seqs, dtype=np.int64),
    )
