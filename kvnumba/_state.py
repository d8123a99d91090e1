"""State layout: the flat arrays that hold a manager's whole allocator state.

All state arrays are views into one uint8 arena, the per-call scratch arrays into another; every
entry kernel takes the two arenas. Integer constants name the slots of ``meta`` and ``scr`` and
the per-block flag bits.
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
# Two-level allocation (all 0 without a page pool).
M_PAGE_K = 16  # blocks per virtual page; 0 = no page pool (the free stack is used instead)
M_FREE_MAPPED = 17  # free blocks of mapped pages
M_VTOP = 18  # unmapped virtual pages on the page stack
M_MAPPED = 19  # mapped virtual pages
M_BUCKET_MIN = 20  # no bucket below this free count holds a page (a hint, may lag low)
M_CO_HEAD = 21  # cache-only page list: least recently stamped page, or NIL
M_CO_TAIL = 22
M_CO_COUNT = 23  # pages on the cache-only list
M_CLIENT = 24  # pool client token, pid and process start time: the owner record of a page
M_PID = 25
M_START = 26
META_SIZE = 32

# --- columns of ``pages`` (int32, one row per virtual page) ---------------------------------------
PG_PHYS = 0  # physical page backing the virtual page, or NIL when unmapped
PG_FREE = 1  # free blocks of a mapped page (0 when unmapped)
PG_USED = 2  # blocks of the page with refcount >= 1
PG_HEAD = 3  # top of the page's free-block list (linked through block_next), or NIL
PG_BPREV = 4  # links of the bucket list of pages with PG_FREE free blocks
PG_BNEXT = 5
PG_CPREV = 6  # links of the cache-only page list
PG_CNEXT = 7
PG_VSTACK = 8  # row i of this column is entry i of the stack of unmapped virtual pages
PG_COLS = 9

# --- scratch control slots (scr, int64) -----------------------------------------------------------
S_LOG_N = 0  # undo-log entries written in this call
S_LOG_ON = 1  # 1 while the current call records an undo log
S_EV_N = 2  # evictions recorded in this call
S_EV_PAYLOAD = 3  # 1 if evicted payloads are copied (on_evict set, or the call is logged)
S_STAMP = 4  # call counter for duplicate-id detection through seq_mark
S_FAILED = 5  # sequences or prompts of the current call that did not fit (non-atomic mode)
S_MAP_N = 6  # pages mapped in this call (records in map_rec)
S_UNMAP_N = 7  # pages unmapped in this call (records in unmap_rec)
S_SAVED_PAYLOAD = 8  # S_EV_PAYLOAD before a logged give-up switched it on
S_SHORT = 9  # blocks a failed call lacked at its failure point (what sibling reclaim must add)
SCR_SIZE = 16

# Storage: all state arrays are views into one uint8 arena, and all per-call scratch arrays into
# a second one. Kernel dispatch costs tens of nanoseconds per array argument, so every entry
# kernel takes just the two arenas and carves the named views out of them (kernels/entry.py)
# at the cost of a few pointer computations. The arena starts with a header of HEADER_SLOTS
# int64 per field: byte offset, byte size, first and second dimension (0 for 1-D fields).
HEADER_SLOTS = 4
MAX_FIELDS = 24
HEADER_BYTES = 8 * HEADER_SLOTS * MAX_FIELDS
_ALIGN = 64

# Scratch fields, in arena order.
SCRATCH_FIELDS = (
    "ulog",
    "ev_ids",
    "ev_hash",
    "ev_tok",
    "seq_mark",
    "scr",
    "meta_save",
    "map_rec",
    "unmap_rec",
    "slots",
)


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
    pages : int32[num_pages, PG_COLS]
        Per virtual page (with a page pool; 0 rows without): physical page, free and
        referenced block counts, free-list top, bucket and cache-only list links, and the
        stack of unmapped virtual pages (see the ``PG_*`` constants).
    page_stamp : int64[num_pages]
        Pool clock tick at which a page became cache-only.
    block_next : int32[num_blocks]
        Next block of the same page's free list (with a page pool; empty without).
    buckets : int32[blocks_per_page]
        Front page of the bucket of mapped pages with ``c`` free blocks (index ``c``), or -1.
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
    pages: np.ndarray
    page_stamp: np.ndarray
    block_next: np.ndarray
    buckets: np.ndarray


def table_capacity(num_blocks: int) -> int:
    """Size of the prefix hash table: the power of two at least ``3 * num_blocks``.

    Registered entries plus the transient marks of blocks evicted during one call never exceed
    ``2 * num_blocks``, so the load stays below 2/3 even at the worst moment.
    """
    return 1 << max(4, int(3 * num_blocks - 1).bit_length())


def _arena(fields: list[tuple[str, type, tuple[int, ...]]]) -> tuple[np.ndarray, dict]:
    """One 64-byte aligned uint8 buffer holding ``fields`` (name, dtype, shape) and its header."""
    assert len(fields) <= MAX_FIELDS
    layout, offset = [], HEADER_BYTES
    for name, dtype, shape in fields:
        nbytes = int(np.dtype(dtype).itemsize * np.prod(shape, dtype=np.int64))
        layout.append((name, dtype, shape, offset, nbytes))
        offset += -(-nbytes // _ALIGN) * _ALIGN
    raw = np.zeros(offset + _ALIGN, dtype=np.uint8)
    start = (-raw.ctypes.data) % _ALIGN  # so that every field starts 64-byte aligned
    arena = raw[start : start + offset]
    header = arena[:HEADER_BYTES].view(np.int64)
    views = {}
    for i, (name, dtype, shape, field_offset, nbytes) in enumerate(layout):
        dims = (*shape, 0) if len(shape) == 1 else shape
        header[HEADER_SLOTS * i : HEADER_SLOTS * (i + 1)] = (field_offset, nbytes, *dims)
        views[name] = arena[field_offset : field_offset + nbytes].view(dtype).reshape(shape)
    return arena, views


def new_state(
    num_blocks: int,
    block_size: int,
    max_seqs: int,
    max_blocks_per_seq: int,
    max_seq_len: int,
    prefix_caching: bool,
    hash_bits: int = 64,
    blocks_per_page: int = 0,
) -> tuple[np.ndarray, State]:
    """Allocate the state arena of an empty manager.

    Parameters
    ----------
    num_blocks, block_size, max_seqs, max_blocks_per_seq, max_seq_len : int
        Pool and table geometry (validated by the caller).
    prefix_caching : bool
        Whether full blocks are hashed and kept cached at refcount 0.
    hash_bits : int
        Bits of the chained hash to keep; 64 except in collision tests.
    blocks_per_page : int
        Blocks per virtual page with a page pool (dividing ``num_blocks``), 0 without one.

    Returns
    -------
    arena : numpy.ndarray of uint8
        The buffer the kernels take.
    state : State
        Writable views of its fields: every block free (popped in id order), every sequence
        slot free (popped in slot order).
    """
    n, m, k = num_blocks, max_seqs, blocks_per_page
    num_pages = n // k if k else 0
    arena, v = _arena(
        [
            ("ref", np.int32, (n,)),
            ("lru_prev", np.int32, (n,)),
            ("lru_next", np.int32, (n,)),
            ("free_stack", np.int32, (n,)),
            ("block_hash", np.uint64, (n,)),
            ("block_salt", np.int64, (n,)),
            ("block_flags", np.uint8, (n,)),
            ("tokens", np.int64, (n, block_size)),
            ("htab", np.int32, (table_capacity(n),)),
            ("seq_table", np.int32, (m, max_blocks_per_seq)),
            ("seq_len", np.int64, (m,)),
            ("seq_gen", np.int64, (m,)),
            ("seq_salt", np.int64, (m,)),
            ("seq_live", np.uint8, (m,)),
            ("slot_stack", np.int32, (m,)),
            ("meta", np.int64, (META_SIZE,)),
            ("pages", np.int32, (num_pages, PG_COLS)),
            ("page_stamp", np.int64, (num_pages,)),
            ("block_next", np.int32, (n if k else 0,)),
            ("buckets", np.int32, (k,)),
        ]
    )
    state = State(**v)
    state.lru_prev[:] = NIL
    state.lru_next[:] = NIL
    state.free_stack[:] = np.arange(n - 1, -1, -1)  # reversed: block 0 is popped first
    state.tokens[:] = -1
    state.htab[:] = EMPTY
    state.seq_table[:] = NIL
    state.slot_stack[:] = np.arange(m - 1, -1, -1)
    meta = state.meta
    meta[M_FREE_TOP] = n
    meta[M_LRU_HEAD] = NIL
    meta[M_LRU_TAIL] = NIL
    meta[M_SLOT_TOP] = m
    meta[M_PREFIX_CACHING] = 1 if prefix_caching else 0
    meta[M_HASH_BITS] = hash_bits
    meta[M_MAX_SEQ_LEN] = max_seq_len
    if k:
        # Every virtual page unmapped, popped in order 0, 1, ...; no block on the free stack.
        state.pages[:] = NIL
        state.pages[:, PG_FREE] = 0
        state.pages[:, PG_USED] = 0
        state.pages[:, PG_VSTACK] = np.arange(num_pages - 1, -1, -1)
        state.block_next[:] = NIL
        state.buckets[:] = NIL
        meta[M_PAGE_K] = k
        meta[M_FREE_TOP] = 0
        meta[M_VTOP] = num_pages
        meta[M_BUCKET_MIN] = k
        meta[M_CO_HEAD] = NIL
        meta[M_CO_TAIL] = NIL
    return arena, state


def new_scratch(
    block_size: int, max_seqs: int, rows: int, log_rows: int, payload: bool, num_pages: int = 0
):
    """Allocate the scratch arena (grown by the facade when a call needs more room).

    Parameters
    ----------
    block_size, max_seqs : int
        Geometry of the manager.
    rows : int
        Eviction records one call can hold.
    log_rows : int
        Undo-log entries one call can hold.
    payload : bool
        Whether evicted payloads are copied (``on_evict`` set, or room for a logged call).
    num_pages : int
        Virtual pages (with a page pool): room for the pages one call maps and unmaps.

    Returns
    -------
    arena : numpy.ndarray of uint8
    views : dict
        Views named as :data:`SCRATCH_FIELDS`.
    """
    return _arena(
        [
            ("ulog", np.int64, (log_rows, 3)),
            ("ev_ids", np.int64, (rows,)),
            ("ev_hash", np.uint64, (rows,)),
            ("ev_tok", np.int64, (rows if payload else 0, block_size)),
            ("seq_mark", np.int64, (max_seqs,)),
            ("scr", np.int64, (SCR_SIZE,)),
            ("meta_save", np.int64, (META_SIZE,)),
            ("map_rec", np.int64, (num_pages, 2)),
            ("unmap_rec", np.int64, (num_pages, 2)),
            ("slots", np.int64, (max_seqs,)),
        ]
    )
