"""State layout: the flat arrays that hold a manager's whole allocator state.

All state arrays are views into one uint8 arena, the per-call scratch arrays into another; every
entry kernel takes the two arenas. Integer constants name the slots of ``meta`` and ``scr`` and
the per-block flag bits.
"""

from __future__ import annotations

import math
from collections import namedtuple
from typing import Any, NamedTuple

import numpy as np

from kvnumba.eviction import POLICY_CODES, PRIORITY_CODE
from kvnumba.ids import slot_bits

# --- sentinels -----------------------------------------------------------------------------------
NIL = -1  # no block / no link / padding in block tables
# A table entry whose block left a windowed sequence's attention window (vLLM's null block).
NULL_BLOCK = -2
EMPTY = -1  # empty slot of the prefix hash table; values <= -2 mark entries of evicted blocks

# --- per-block flag bits (block_flags, uint8) ------------------------------------------------------
F_KNOWN = 1  # every token written to the block came with an id
F_HASHED = 2  # the block is full and has a chained hash (children may chain onto it)
F_REGISTERED = 4  # the block is the registered entry for its hash in the prefix table
# A truncation cut into the block while it was shared: a holder's tail may end inside content
# (and a registration) that is not its own, so an append into it in place first reclaims it.
F_TRIMMED = 8
# Eviction policies ``leaf-lru`` and ``oracle``: a cached block whose parent in the cached prefix
# forest was evicted or unregistered (it cannot be hit until that prefix is cached again).
F_ORPHAN = 16
# Eviction policy ``sieve``: a registered block hit since the hand last passed it (SIEVE's
# visited bit). A flag, not a column: under sieve a block costs no policy bytes at all.
F_VISITED = 32
# Eviction policy ``lfu``: a cached block released without hits since the age last rose, so
# its priority is the age: the *floor*, kept in release order on the LRU list (``M_HAND`` is
# its oldest) instead of in the heap.
F_FLOOR = 64
# A priority policy: a cached block in one of its release-order runs (``M_RUN_HAND``): run 0
# is marked ``F_FLOOR``, run 1 ``F_RUN1`` (``F_FLOOR << r`` for run ``r``).
F_RUN1 = 128

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
M_ID_TAG = 27  # the manager's id tag (kvnumba.ids): the top bits of every id it hands out
M_SLOT_BITS = 28  # bits of an id that hold the slot
M_RESERVED = 29  # blocks 0 .. M_RESERVED-1 are never handed out (``reserved_blocks``)
M_KEYED = 30  # 1: blocks are registered under engine keys (``block_keys``), never token hashes
M_EVENTS = 31  # 1: registrations and removals are recorded as block events (``block_events``)
# Eviction policies other than LRU (``kvnumba.eviction``; ``_kernels/eviction.py``).
M_POLICY = 32  # the policy's code (``kvnumba.eviction.POLICY_CODES``); 0 = LRU
M_HEAP_N = 33  # blocks in the policy's heap (lfu, leaf-lru, oracle)
M_POL_CLOCK = 34  # releases into the cache so far: the next stamp
M_POL_AGE = 35  # lfu: the age L (priority of the latest victim)
M_HAND = 36  # sieve: the hand (a cached block); lfu: the oldest block of the floor; or NIL
# Victims a policy chose that it must never choose: a referenced block, or under the leaf
# policies one with cached children (``check()`` reports any; a correct policy keeps it 0).
M_POLICY_FAULTS = 37
# Windowed attention and KV cache groups (``kvnumba.windows``). A sequence's group is its
# slot's salt modulo M_GROUPS (the kernels fold a prompt's group into its salt); group ``g``'s
# sliding window and attention chunk in tokens are at M_GROUP_WINDOW + g and M_GROUP_CHUNK + g
# (0 for full attention, at most one of the two set).
M_WINDOWS = 38  # 1: some group is windowed or there are several: the window code runs
M_GROUPS = 39  # KV cache groups (1 but for a manager made with ``kv_cache_groups``)
MAX_GROUPS = 8
M_GROUP_WINDOW = 40
M_GROUP_CHUNK = M_GROUP_WINDOW + MAX_GROUPS
# 1: ``window_release="explicit"``: appends release no out-of-window block, the engine calls
# ``release_window`` with the lengths it has processed.
M_EXPLICIT_RELEASE = M_GROUP_CHUNK + MAX_GROUPS
# 1: ``cache_duplicates``: a full block whose key is registered already is registered too (after
# the first, which lookups find while it stays), so it is cached when released, as vLLM does.
M_CACHE_DUPLICATES = M_EXPLICIT_RELEASE + 1
# A priority policy (``kvnumba.priority``): 1 if only leaves of the cached prefix forest are
# candidates (the heap holds leaves only), 0 if every cached block is.
M_PRIORITY_LEAVES = M_CACHE_DUPLICATES + 1
# A priority policy: 1 if it keeps the cached prefix forest (leaves only, or its function reads
# ``orphan``, ``children`` or the clocks); 0 if nothing it reads depends on the forest, and
# its blocks' rows end with the heap links (``policy_columns``).
M_PRIORITY_FOREST = M_PRIORITY_LEAVES + 1

# --- columns of the eviction policies' per-block fields (``pol_words``, ``pol_links``) ------------
W_KEY = 0  # heap priority of a cached block
W_STAMP = 1  # release stamp of a cached block
# ``leaf-lru``'s rows end here (its key is the orphan mark, its order the stamps).
HEAP_WORDS = 2
W_VALUE = 2  # lfu: hits since registration; oracle: the next use (-1: never)
POL_WORDS = 3
# A priority policy's rows hold, after the key and the stamp, one column for each of these
# features that its function reads, in this order (``policy_columns``); ``meta[M_FEATURE_COL +
# i]`` is the column of feature ``i`` (``FT_*``), or -1 where the function does not read it.
PRIORITY_STORED = ("hits", "next_use", "tag", "length", "depth")
FT_HITS = 0  # prefix hits since registration
FT_HINT = 1  # the next-use hint (``set_next_use``; -1: none)
FT_TAG = 2  # the caller's tag (``set_tags``, ``set_sequence_tags``; 0 when registered)
FT_LENGTH = 3  # tokens of the sequence whose release cached the block, at that release
FT_DEPTH = 4  # the block's position in its sequence when it was registered
L_HEAP = 0  # the heap of evictable blocks, by position
L_POS = 1  # a block's position in the heap, or -1
# ``lfu`` and a priority policy without the forest keep the heap only: their rows end here. The
# forest policies' rows go on.
HEAP_LINKS = 2
L_PARENT = 2  # parent in the cached prefix forest (-1: a root; -2: its parent was gone)
L_PGEN = 3  # the parent's generation when the block registered
L_GEN = 4  # registrations and unregistrations of the block so far
L_KID = 5  # first listed cached child, or -1
L_SIB_PREV = 6  # back link among a parent's cached children
L_SIB_NEXT = 7  # forward link among them
POL_LINKS = 8
# A priority policy's release-order runs: candidates kept in release order on the LRU list
# instead of in the heap, each run's keys never decreasing along it (a key that grows with the
# release stamp would otherwise make every eviction walk the heap's depth). A block released
# with a key at least the newest key of a run (``M_RUN_KEY + r``) joins the first such run;
# ``M_RUN_HAND + r`` is run ``r``'s oldest block, or NIL when it is empty.
NUM_RUNS = 2
M_RUN_HAND = M_PRIORITY_FOREST + 1
M_RUN_KEY = M_RUN_HAND + NUM_RUNS
# A priority policy: the column of each stored feature (``FT_*``) in its blocks' rows, or -1.
M_FEATURE_COL = M_RUN_KEY + NUM_RUNS
META_SIZE = M_FEATURE_COL + len(PRIORITY_STORED)

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
S_EVT_N = 10  # block events recorded and not yet collected by the facade (rows of ``evt``)
# A priority policy's compiled priority: its address in this process (set by the facade, never
# part of the state), and the tokens of the sequence being released (the ``length`` feature);
# its tag is ``S_RELEASE_TAG``.
S_PRIORITY_FN = 11
S_RELEASE_LEN = 12
# Which feature changes make a priority policy's cached block be keyed again (``REKEY_*`` bits,
# set by the facade with the address): those whose feature its function reads.
S_PRIORITY_REKEY = 13
REKEY_CHILDREN = 1
REKEY_ORPHAN = 2
REKEY_NEXT_USE = 4
REKEY_TAG = 8
S_RELEASE_TAG = 14  # the tag of the sequence being released, given to what it caches (0: none)
# The feature record a priority is called with (``kvnumba.priority.BlockFeatures``, in order).
S_FEATURES = 16
SCR_SIZE = 32

# --- columns of the scratch records ----------------------------------------------------------------
REC_PHYSICAL, REC_VIRTUAL = 0, 1  # map_rec / unmap_rec rows: (physical page, virtual page)
EVT_KIND, EVT_BLOCK, EVT_KEY0 = 0, 1, 2  # evt rows: (kind, block, key words 0-3)

#: int64 words at the start of the scratch ``slots`` field (the "call room") for the buffers of
#: ``admit_one`` (:data:`ADMIT_ONE_ROOM`); its hits, a sequence's worth, follow.
CALL_ROOM_INPUTS = 8
#: int64 words at the start of the call room for the buffers of ``append_one``
#: (:data:`APPEND_ONE_ROOM`); its slots (up to a block's) follow. The room is at least
#: ``block_size + CALL_ROOM_INPUTS`` words.
APPEND_ONE_INPUTS = 6
#: Most hits the call room holds: a longer prompt's ``admit_one`` takes the batched path, so
#: that absurd sequence lengths do not double the scratch arena.
CALL_ROOM_MAX_HITS = 1 << 16


# --- the call room: the one-request calls' buffers at the start of the scratch ``slots`` field ---
class RoomBuffer(NamedTuple):
    """One buffer of a one-request call in the call room: its name, dtype and length (0: an
    empty vector, for an input or output the call does not have)."""

    name: str
    dtype: type
    length: int


def _record(typename: str, values: dict[str, int]) -> Any:
    """``values`` as a NamedTuple of ints named ``typename`` (its fields known only at run time)."""
    return namedtuple(typename, list(values))(**values)


def room_layout(typename: str, buffers: tuple[RoomBuffer, ...], words: int, rest: str):
    """Byte offsets of ``buffers``, laid out in order from the start of the call room (each at
    the next multiple of its item size), as a NamedTuple by buffer name. They must fit in
    ``words`` int64 words, where the call's variable-size buffer ``rest`` starts."""
    offsets = {}
    at = 0
    for buffer in buffers:
        size = np.dtype(buffer.dtype).itemsize
        at = -(-at // size) * size
        offsets[buffer.name] = at
        at += size * buffer.length
    if at > 8 * words:
        raise ValueError(f"{typename}: {at} bytes do not fit in {words} words")
    offsets[rest] = 8 * words
    return _record(typename, offsets)


#: The buffers of ``append_one`` (one sequence of an append without token ids).
APPEND_ONE_ROOM = (
    RoomBuffer("slots", np.int64, 1),  # the sequence's slot, written by the validation
    RoomBuffer("ids", np.int64, 1),
    RoomBuffer("counts", np.int64, 1),
    RoomBuffer("cow_src", np.int32, 1),
    RoomBuffer("cow_dst", np.int32, 1),
    RoomBuffer("ok", np.bool_, 1),
    RoomBuffer("no_tokens", np.int64, 0),
)
#: Byte offset of each buffer of :data:`APPEND_ONE_ROOM` in the call room, by name
#: (``APPEND_ONE_AT.ids``), and of the slot mapping that follows them.
APPEND_ONE_AT = room_layout("AppendOneAt", APPEND_ONE_ROOM, APPEND_ONE_INPUTS, "slot_mapping")

#: The buffers of ``admit_one`` (one prompt), and the empty inputs of the kind it lacks (the
#: keys of a prompt with token ids, the token ids of one with keys only).
ADMIT_ONE_ROOM = (
    RoomBuffer("lengths", np.int64, 1),
    RoomBuffer("salts", np.int64, 1),
    RoomBuffer("caps", np.int64, 1),
    RoomBuffer("ids", np.int64, 1),
    RoomBuffer("cached", np.int64, 1),
    RoomBuffer("key_counts", np.int64, 1),
    RoomBuffer("ok", np.bool_, 1),
    RoomBuffer("no_slots", np.int64, 0),  # the facade reads no slot mapping
    RoomBuffer("no_tokens", np.int64, 0),
    RoomBuffer("no_keys", np.uint64, 0),
)
#: Byte offset of each buffer of :data:`ADMIT_ONE_ROOM` in the call room, by name, and of the
#: hits that follow them.
ADMIT_ONE_AT = room_layout("AdmitOneAt", ADMIT_ONE_ROOM, CALL_ROOM_INPUTS, "hits")

# --- the field tables: the one description of the arenas' layout ---------------------------------
# Every state array is a view into one 64-byte aligned uint8 arena, and every per-call scratch
# array into a second one. Kernel dispatch pays for every array argument, so entry kernels
# take just the arenas; the kernels carve named views out of them (``kvnumba/_kernels/views.py``
# generates that code from these tables). The arena starts with a header of HEADER_SLOTS int64
# per field: byte offset, byte size, item size, first and second dimension (0 for 1-D fields).
# A shape names its dimensions; ``new_state`` / ``new_scratch`` give them values.
HEADER_SLOTS = 5
H_OFFSET, H_NBYTES, H_ITEMSIZE, H_DIM0, H_DIM1 = range(HEADER_SLOTS)  # a field's header slots
MAX_FIELDS = 48
HEADER_BYTES = 8 * HEADER_SLOTS * MAX_FIELDS
_ALIGN = 64


class Field(NamedTuple):
    """One array of an arena: its name, dtype, named dimensions and meaning; ``viewed``: a
    field of the kernels' views (else the code that uses it carves it itself)."""

    name: str
    dtype: type
    dims: tuple[str, ...]
    doc: str
    viewed: bool = True


STATE_FIELDS = (
    Field("ref", np.int32, ("blocks",), "Reference count of every block."),
    Field("lru_prev", np.int32, ("blocks",), "Back link of the LRU list of cached blocks."),
    Field(
        "lru_next",
        np.int32,
        ("blocks",),
        "Forward link of the LRU list (head: least recent); with a page pool, of a free "
        "block, the next one on its page's free list.",
    ),
    Field(
        "free_stack",
        np.int32,
        ("unpaged_blocks",),
        "Free block ids; the first ``meta[M_FREE_TOP]`` are live, the last is popped first "
        "(no rows with a page pool, whose pages keep their own free lists).",
    ),
    Field("block_hash", np.uint64, ("blocks",), "Chained content hash of a full, hashed block."),
    Field("block_salt", np.int64, ("blocks",), "Salt of the sequence that filled the block."),
    Field(
        "block_flags",
        np.uint8,
        ("blocks",),
        "``F_KNOWN | F_HASHED | F_REGISTERED | F_TRIMMED | F_ORPHAN | F_VISITED | F_FLOOR | "
        "F_RUN1`` bits.",
    ),
    Field("tokens", np.int64, ("blocks", "block_size"), "Token payload; -1 where no id is known."),
    Field(
        "block_key",
        np.uint64,
        ("key_blocks", "four"),
        "Engine key (256 bits) of a hashed block with ``block_keys``; no rows without.",
    ),
    Field("htab", np.int32, ("table",), "Open-addressing prefix table of registered block ids."),
    Field(
        "seq_table",
        np.int32,
        ("seqs", "blocks_per_seq"),
        "Block table of every sequence slot, padded with -1.",
    ),
    Field("seq_len", np.int64, ("seqs",), "Tokens held by every slot."),
    Field("seq_gen", np.int64, ("seqs",), "Generation of the slot's current or last occupant."),
    Field("seq_salt", np.int64, ("seqs",), "Prefix-cache salt of every slot."),
    Field("seq_live", np.uint8, ("seqs",), "1 while the slot holds a live sequence."),
    Field(
        "seq_tag",
        np.int64,
        ("seqs",),
        "Tag of the slot's sequence (``set_sequence_tags``; 0: none), given to the blocks its "
        "release caches.",
    ),
    Field(
        "seq_anchor",
        np.uint64,
        ("seqs", "two"),
        "Windowed attention: (hash, 1 if known) of the last block that left the window.",
        False,
    ),
    Field(
        "slot_stack",
        np.int32,
        ("seqs",),
        "Free sequence slots; the first ``meta[M_SLOT_TOP]`` are live.",
    ),
    Field("meta", np.int64, ("meta",), "Counters, stack tops and list ends (``M_*``)."),
    # Two-level allocation: one entry per virtual page (none without a page pool).
    Field("page_phys", np.int32, ("pages",), "Physical page backing a virtual page, or -1."),
    Field("page_free", np.int32, ("pages",), "Free blocks of a mapped page (0 when unmapped)."),
    Field("page_used", np.int32, ("pages",), "Blocks of the page with refcount >= 1."),
    Field("page_head", np.int32, ("pages",), "Top of the page's free-block list, or -1."),
    Field("bucket_prev", np.int32, ("pages",), "Back link of the page's bucket list."),
    Field("bucket_next", np.int32, ("pages",), "Forward link of the page's bucket list."),
    Field("co_prev", np.int32, ("pages",), "Back link of the cache-only page list."),
    Field("co_next", np.int32, ("pages",), "Forward link of the cache-only page list."),
    Field(
        "vstack",
        np.int32,
        ("pages",),
        "Unmapped virtual pages; the first ``meta[M_VTOP]`` are live, the last is popped first.",
    ),
    Field("page_stamp", np.int64, ("pages",), "Pool clock tick at which a page became cache-only."),
    Field(
        "buckets",
        np.int32,
        ("blocks_per_page",),
        "Front page of the bucket of mapped pages with ``c`` free blocks (index ``c``), or -1.",
    ),
    # Eviction policies other than LRU: one row per block (none for an LRU manager; ``W_*`` and
    # ``L_*`` name the columns). Not in the kernels' views: every kernel builds every view, and
    # only the policy code reads these (``_kernels/eviction.py`` carves them).
    Field("pol_words", np.int64, ("policy_blocks", "pol_words"), "Per block: ``W_*``.", False),
    Field("pol_links", np.int32, ("policy_blocks", "pol_links"), "Per block: ``L_*``.", False),
)

SCRATCH_FIELDS = (
    Field("ulog", np.int64, ("log_rows", "three"), "Undo log: (code, index, old value) rows."),
    Field("ev_ids", np.int64, ("records",), "Blocks evicted by the current call."),
    Field("ev_hash", np.uint64, ("records",), "Their hashes."),
    Field("ev_tok", np.int64, ("payload_rows", "block_size"), "Their payloads (when kept)."),
    Field("seq_mark", np.int64, ("seqs",), "Call stamp per slot, for duplicate-id detection."),
    Field("scr", np.int64, ("scr",), "Control slots of the current call (``S_*``)."),
    Field("meta_save", np.int64, ("meta",), "``meta`` at the start of a logged call."),
    Field("map_rec", np.int64, ("pages", "two"), "(physical, virtual) of each page mapped."),
    Field("unmap_rec", np.int64, ("pages", "two"), "(physical, virtual) of each page unmapped."),
    Field(
        "slots",
        np.int64,
        ("call_room",),
        "Room for the slots of a call's ids, or a one-request call's inputs and cache hits.",
    ),
    Field(
        "evt",
        np.int64,
        ("event_rows", "six"),
        "Block events not yet collected: (kind, block, key words 0-3); rows only with events.",
    ),
)

assert len(STATE_FIELDS) + len(SCRATCH_FIELDS) <= MAX_FIELDS


def _state_doc() -> str:
    lines = [
        "The allocator state of one manager as named arrays (generated from ``STATE_FIELDS``).",
        "",
        "``BlockManager.state`` holds read-only views, ``BlockManager.snapshot()`` copies.",
        "Compare two of them field by field with ``numpy.array_equal``.",
        "",
        "Attributes",
        "----------",
    ]
    for f in STATE_FIELDS:
        shape = f"{np.dtype(f.dtype).name}[{', '.join(f.dims)}]"
        lines += [f"{f.name} : numpy.ndarray", f"    ``{shape}``: {f.doc}"]
    return "\n".join(lines)


class State(NamedTuple):
    # The fields of STATE_FIELDS, in order, declared for readers and type checkers (checked
    # below); the docstring is generated from STATE_FIELDS.
    ref: np.ndarray
    lru_prev: np.ndarray
    lru_next: np.ndarray
    free_stack: np.ndarray
    block_hash: np.ndarray
    block_salt: np.ndarray
    block_flags: np.ndarray
    tokens: np.ndarray
    block_key: np.ndarray
    htab: np.ndarray
    seq_table: np.ndarray
    seq_len: np.ndarray
    seq_gen: np.ndarray
    seq_salt: np.ndarray
    seq_live: np.ndarray
    seq_tag: np.ndarray
    seq_anchor: np.ndarray
    slot_stack: np.ndarray
    meta: np.ndarray
    page_phys: np.ndarray
    page_free: np.ndarray
    page_used: np.ndarray
    page_head: np.ndarray
    bucket_prev: np.ndarray
    bucket_next: np.ndarray
    co_prev: np.ndarray
    co_next: np.ndarray
    vstack: np.ndarray
    page_stamp: np.ndarray
    buckets: np.ndarray
    pol_words: np.ndarray
    pol_links: np.ndarray


State.__doc__ = _state_doc()
if State._fields != tuple(f.name for f in STATE_FIELDS):
    raise ImportError("State's declared fields differ from STATE_FIELDS")


class Geometry(NamedTuple):
    """The validated shape of one manager: what sizes its arenas and what its kernels assume.

    Attributes
    ----------
    num_blocks, block_size, max_seqs, max_seq_len : int
        As given to :class:`kvnumba.BlockManager`.
    blocks_per_seq : int
        Block table width, ``ceil(max_seq_len / block_size)``.
    blocks_per_page : int
        Blocks per virtual page with a page pool, 0 without one.
    reserved_blocks : int
        Blocks ``0 .. reserved_blocks - 1`` never handed out.
    prefix_caching, block_keys, block_events : bool
        The manager's switches.
    hash_bits : int
        Bits kept of the chained hash (64 but in collision tests).
    eviction : int
        The eviction policy's code (``kvnumba.eviction.POLICY_CODES``); 0 = LRU.
    groups : tuple of (int, int)
        Every KV cache group's sliding window and attention chunk in tokens
        (``kvnumba.windows``); 0 = unset. One group but for ``kv_cache_groups``.
    explicit_release : bool
        ``window_release="explicit"``: only ``release_window`` releases out-of-window blocks.
    cache_duplicates : bool
        Register a full block even when an equal block is registered (``cache_duplicates``).
    priority_leaves : bool
        A priority policy whose candidates are the leaves of the cached prefix forest.
    priority_forest : bool
        A priority policy that keeps the cached prefix forest (what it reads depends on it).
    priority_features : int
        A priority policy: bit ``i`` set when its function reads feature
        ``PRIORITY_STORED[i]``, which its blocks' rows then hold.
    """

    num_blocks: int
    block_size: int
    max_seqs: int
    max_seq_len: int
    blocks_per_seq: int
    blocks_per_page: int = 0
    reserved_blocks: int = 0
    prefix_caching: bool = True
    block_keys: bool = False
    block_events: bool = False
    hash_bits: int = 64
    eviction: int = 0
    groups: tuple = ((0, 0),)
    explicit_release: bool = False
    cache_duplicates: bool = False
    priority_leaves: bool = False
    priority_forest: bool = False
    priority_features: int = 0

    @property
    def windowed(self) -> bool:
        """Whether the window code runs: a windowed group, or several groups."""
        return len(self.groups) > 1 or any(map(any, self.groups))

    @property
    def num_pages(self) -> int:
        """Virtual pages (0 without a page pool)."""
        k = self.blocks_per_page
        return self.num_blocks // k if k else 0

    @property
    def event_rows(self) -> int:
        """Block events one call can record: a call registers and removes at most
        ``2 * num_blocks`` (no rows without ``block_events``)."""
        return 2 * self.num_blocks + 8 if self.block_events else 0


def table_capacity(num_blocks: int) -> int:
    """Size of the prefix hash table: the power of two at least ``3 * num_blocks``.

    Registered entries plus the transient marks of blocks evicted during one call never exceed
    ``2 * num_blocks``, so the load stays below 2/3 even at the worst moment.
    """
    return 1 << max(4, int(3 * num_blocks - 1).bit_length())


def arena_bytes(fields: tuple[Field, ...], dims: dict[str, int]) -> int:
    """Bytes of the arena holding ``fields`` with dimension values ``dims`` (header included)."""
    total = HEADER_BYTES
    for f in fields:
        # math.prod on Python ints: np.prod would wrap around in int64 for absurd geometries.
        nbytes = np.dtype(f.dtype).itemsize * math.prod(dims[d] for d in f.dims)
        total += -(-nbytes // _ALIGN) * _ALIGN
    return total


def _arena(fields: tuple[Field, ...], dims: dict[str, int]) -> tuple[np.ndarray, dict]:
    """One 64-byte aligned uint8 buffer holding ``fields`` and its header."""
    size = arena_bytes(fields, dims)
    raw = np.zeros(size + _ALIGN, dtype=np.uint8)
    start = (-raw.ctypes.data) % _ALIGN  # so that every field starts 64-byte aligned
    arena = raw[start : start + size]
    header = arena[:HEADER_BYTES].view(np.int64)
    views: dict[str, np.ndarray] = {}
    offset = HEADER_BYTES
    for i, f in enumerate(fields):
        shape = tuple(dims[d] for d in f.dims)
        itemsize = np.dtype(f.dtype).itemsize
        nbytes = itemsize * math.prod(shape)
        entry = header[HEADER_SLOTS * i : HEADER_SLOTS * (i + 1)]
        entry[H_OFFSET], entry[H_NBYTES], entry[H_ITEMSIZE] = offset, nbytes, itemsize
        entry[H_DIM0] = shape[0]
        entry[H_DIM1] = shape[1] if len(shape) == 2 else 0
        views[f.name] = arena[offset : offset + nbytes].view(f.dtype).reshape(shape)
        offset += -(-nbytes // _ALIGN) * _ALIGN
    return arena, views


def state_dims(g: Geometry) -> dict[str, int]:
    """Values of the dimensions named in :data:`STATE_FIELDS`."""
    k = g.blocks_per_page
    words, links = policy_columns(g.eviction, g.priority_forest, g.priority_features)
    return {
        "blocks": g.num_blocks,
        "unpaged_blocks": 0 if k else g.num_blocks,
        "block_size": g.block_size,
        "key_blocks": g.num_blocks if g.block_keys else 0,
        "four": 4,
        "table": table_capacity(g.num_blocks),
        "seqs": g.max_seqs,
        "two": 2,
        "blocks_per_seq": g.blocks_per_seq,
        "meta": META_SIZE,
        "pages": g.num_pages,
        "blocks_per_page": k,
        "policy_blocks": g.num_blocks if links else 0,
        "pol_words": words,
        "pol_links": links,
    }


def policy_columns(
    eviction: int, priority_forest: bool = True, priority_features: int = 0
) -> tuple[int, int]:
    """Columns of ``pol_words`` and of ``pol_links`` under policy code ``eviction``.

    A policy pays only for the columns it reads: none under ``lru`` and ``sieve`` (whose hand
    lives in ``meta`` and whose visited bit is :data:`F_VISITED`), key, stamp and hits and the
    heap under ``lfu``, key and stamp (and ``oracle`` its next uses), the heap and the prefix
    forest under the leaf policies; under a priority policy key and stamp, a column per stored
    feature its function reads (bits of ``priority_features``, :data:`PRIORITY_STORED`, as
    :attr:`Geometry.priority_features`), the heap, and the forest with ``priority_forest``.
    """
    if eviction in (0, POLICY_CODES["sieve"]):
        return 0, 0
    if eviction == POLICY_CODES["lfu"]:
        return POL_WORDS, HEAP_LINKS
    if eviction == PRIORITY_CODE:
        stored = priority_features & ((1 << len(PRIORITY_STORED)) - 1)
        words = HEAP_WORDS + bin(stored).count("1")
        return words, POL_LINKS if priority_forest else HEAP_LINKS
    if eviction == POLICY_CODES["leaf-lru"]:
        return HEAP_WORDS, POL_LINKS
    return POL_WORDS, POL_LINKS


def new_state(g: Geometry, id_tag: int = 0) -> tuple[np.ndarray, State]:
    """Allocate the state arena of an empty manager.

    Parameters
    ----------
    g : Geometry
        The manager's validated geometry and switches.
    id_tag : int
        The manager's id tag (:mod:`kvnumba.ids`).

    Returns
    -------
    arena : numpy.ndarray of uint8
        The buffer the kernels take.
    state : State
        Writable views of its fields: every block free (popped in id order), every sequence
        slot free (popped in slot order).
    """
    n, m, k = g.num_blocks, g.max_seqs, g.blocks_per_page
    dims = state_dims(g)
    arena, v = _arena(STATE_FIELDS, dims)
    state = State(**v)
    state.lru_prev[:] = NIL
    state.lru_next[:] = NIL
    r = g.reserved_blocks
    if not k:
        # Reversed: the lowest unreserved block is popped first; reserved blocks never listed.
        state.free_stack[: n - r] = np.arange(n - 1, r - 1, -1)
    state.tokens[:] = -1
    state.htab[:] = EMPTY
    state.seq_table[:] = NIL
    state.slot_stack[:] = np.arange(m - 1, -1, -1)
    meta = state.meta
    meta[M_FREE_TOP] = n - r
    meta[M_RESERVED] = r
    meta[M_LRU_HEAD] = NIL
    meta[M_LRU_TAIL] = NIL
    meta[M_SLOT_TOP] = m
    meta[M_PREFIX_CACHING] = 1 if g.prefix_caching else 0
    meta[M_HASH_BITS] = g.hash_bits
    meta[M_MAX_SEQ_LEN] = g.max_seq_len
    meta[M_ID_TAG] = id_tag
    meta[M_SLOT_BITS] = slot_bits(m)
    meta[M_KEYED] = 1 if g.block_keys else 0
    meta[M_EVENTS] = 1 if g.block_events else 0
    meta[M_POLICY] = g.eviction
    meta[M_HAND] = NIL
    for r in range(NUM_RUNS):
        meta[M_RUN_HAND + r] = NIL
    meta[M_GROUPS] = len(g.groups)
    for i, (window, chunk) in enumerate(g.groups):
        meta[M_GROUP_WINDOW + i] = window
        meta[M_GROUP_CHUNK + i] = chunk
    meta[M_WINDOWS] = 1 if len(g.groups) > 1 or any(map(any, g.groups)) else 0
    meta[M_EXPLICIT_RELEASE] = 1 if g.explicit_release else 0
    meta[M_CACHE_DUPLICATES] = 1 if g.cache_duplicates else 0
    meta[M_PRIORITY_LEAVES] = 1 if g.priority_leaves else 0
    meta[M_PRIORITY_FOREST] = 1 if g.priority_forest else 0
    column = HEAP_WORDS
    for i in range(len(PRIORITY_STORED)):
        meta[M_FEATURE_COL + i] = NIL
        if g.eviction == PRIORITY_CODE and g.priority_features >> i & 1:
            meta[M_FEATURE_COL + i] = column
            column += 1
    for column in (L_POS, L_PARENT, L_KID, L_SIB_PREV, L_SIB_NEXT):
        if column < state.pol_links.shape[1]:
            state.pol_links[:, column] = NIL
    if k:
        # Every virtual page unmapped, popped in order 0, 1, ...; no block on the free stack.
        num_pages = dims["pages"]
        for name in ("page_phys", "page_head", "bucket_prev", "bucket_next", "co_prev", "co_next"):
            v[name][:] = NIL
        state.vstack[:] = np.arange(num_pages - 1, -1, -1)
        state.buckets[:] = NIL
        meta[M_PAGE_K] = k
        meta[M_FREE_TOP] = 0
        meta[M_VTOP] = num_pages
        meta[M_BUCKET_MIN] = k
        meta[M_CO_HEAD] = NIL
        meta[M_CO_TAIL] = NIL
    return arena, state


def scratch_dims(g: Geometry, rows: int, log_rows: int, payload: bool) -> dict[str, int]:
    """Values of the dimensions named in :data:`SCRATCH_FIELDS` (see :func:`new_scratch`)."""
    return {
        "event_rows": g.event_rows,
        "six": 6,
        "log_rows": log_rows,
        "three": 3,
        "records": rows,
        "payload_rows": rows if payload else 0,
        "block_size": g.block_size,
        "seqs": g.max_seqs,
        "call_room": max(
            g.max_seqs,
            min(g.blocks_per_seq, CALL_ROOM_MAX_HITS) + CALL_ROOM_INPUTS,
            g.block_size + CALL_ROOM_INPUTS,
        ),
        "scr": SCR_SIZE,
        "meta": META_SIZE,
        "pages": g.num_pages,
        "two": 2,
    }


def new_scratch(g: Geometry, rows: int, log_rows: int, payload: bool):
    """Allocate the scratch arena (grown by the facade when a call needs more room).

    Parameters
    ----------
    g : Geometry
        The manager's geometry: the call room, the page records (with a page pool) and the
        block events (with ``block_events``) follow from it.
    rows : int
        Eviction records one call can hold.
    log_rows : int
        Undo-log entries one call can hold.
    payload : bool
        Whether evicted payloads are copied (``on_evict`` set, or room for a logged call).

    Returns
    -------
    arena : numpy.ndarray of uint8
    views : dict
        Views named as in :data:`SCRATCH_FIELDS`.
    """
    return _arena(SCRATCH_FIELDS, scratch_dims(g, rows, log_rows, payload))


#: Index of every state field in :data:`STATE_FIELDS`, by name (``FIELD.ref``, ...): the code
#: of an undo-log entry that writes one element of that field.
FIELD = _record("FieldIds", {f.name: i for i, f in enumerate(STATE_FIELDS)})
